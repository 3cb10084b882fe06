#include "common/structured/token_vocabulary.h"

#include <algorithm>
#include <map>

namespace tandem::structured {

std::shared_ptr<const TokenVocabulary> TokenVocabulary::Create(
    std::vector<std::optional<std::string>> token_bytes) {
  std::shared_ptr<TokenVocabulary> v(new TokenVocabulary());
  v->bytes_ = std::move(token_bytes);
  // Build with ordered child maps, then lay the trie out in preorder.
  struct Building {
    std::map<uint8_t, uint32_t> children;
    std::vector<int32_t> ends;
  };
  std::vector<Building> nodes(1);
  size_t longest = 0;
  for (size_t id = 0; id < v->bytes_.size(); ++id) {
    const std::optional<std::string>& b = v->bytes_[id];
    if (!b.has_value() || b->empty()) continue;
    // Depth is 16 bits: longer tokens (none in real vocabularies) are never allowed.
    if (b->size() >= 0xFFFF) continue;
    longest = std::max(longest, b->size());
    uint32_t node = 0;
    for (char c : *b) {
      const uint8_t byte = static_cast<uint8_t>(c);
      auto it = nodes[node].children.find(byte);
      if (it == nodes[node].children.end()) {
        nodes.emplace_back();
        it = nodes[node].children.emplace(byte, static_cast<uint32_t>(nodes.size() - 1)).first;
      }
      node = it->second;
    }
    nodes[node].ends.push_back(static_cast<int32_t>(id));
  }
  v->max_depth_ = longest;
  const size_t n = nodes.size();
  v->byte_.reserve(n);
  v->depth_.reserve(n);
  v->subtree_end_.assign(n, 0);
  v->end_begin_.reserve(n + 1);
  // Iterative preorder: (building node, its byte, depth); a node's subtree ends where the walk
  // comes back above it.
  struct Visit {
    uint32_t node;
    uint8_t byte;
    uint16_t depth;
  };
  std::vector<Visit> stack{{0, 0, 0}};
  std::vector<uint32_t> open;  // preorder indices of the nodes on the current path, by depth
  while (!stack.empty()) {
    const Visit visit = stack.back();
    stack.pop_back();
    const uint32_t index = static_cast<uint32_t>(v->depth_.size());
    while (open.size() > visit.depth) {
      v->subtree_end_[open.back()] = index;
      open.pop_back();
    }
    open.push_back(index);
    v->byte_.push_back(visit.byte);
    v->depth_.push_back(visit.depth);
    v->end_begin_.push_back(static_cast<uint32_t>(v->ends_.size()));
    const Building& b = nodes[visit.node];
    v->ends_.insert(v->ends_.end(), b.ends.begin(), b.ends.end());
    for (auto it = b.children.rbegin(); it != b.children.rend(); ++it) {
      stack.push_back({it->second, it->first, static_cast<uint16_t>(visit.depth + 1)});
    }
  }
  for (uint32_t index : open) v->subtree_end_[index] = static_cast<uint32_t>(n);
  v->end_begin_.push_back(static_cast<uint32_t>(v->ends_.size()));
  return v;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::FromTokenizer(const Tokenizer& tokenizer,
                                                                      int64_t vocab_size) {
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(vocab_size));
  const int64_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int64_t id = 0; id < known; ++id) {
    bytes[id] = tokenizer.TokenBytes(static_cast<int32_t>(id));
  }
  return Create(std::move(bytes));
}

}  // namespace tandem::structured
