#include "common/structured/grammar_matcher.h"

#include <algorithm>
#include <chrono>

namespace tandem::structured {
namespace {

// Expansion deeper than this means a grammar Build() should have refused (it checks left
// recursion); the stacks found so far are kept.
constexpr int kMaxExpandDepth = 4096;

}  // namespace

GrammarAutomaton::GrammarAutomaton(Grammar grammar,
                                   std::shared_ptr<const TokenVocabulary> vocabulary,
                                   std::shared_ptr<MaskCounters> counters)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      counters_(std::move(counters)) {
  absl::MutexLock lock(&mu_);
  nodes_.push_back(Node{0, kNoParent});  // kAccepted; never looked up by value
  states_.emplace_back();                // kDead: no stacks
  state_ids_.emplace(std::vector<uint32_t>{}, kDead);
  transitions_.emplace_back();
  std::vector<uint32_t> stacks;
  for (uint32_t alt : grammar_.rule_alternatives()[grammar_.root()]) {
    Expand(alt, kNoParent, 0, &stacks);
  }
  start_ = InternState(std::move(stacks));
}

uint32_t GrammarAutomaton::InternNode(uint32_t pos, uint32_t parent) {
  const Node n{pos, parent};
  auto [it, inserted] = node_ids_.try_emplace(n, static_cast<uint32_t>(nodes_.size()));
  if (inserted) nodes_.push_back(n);
  return it->second;
}

uint32_t GrammarAutomaton::InternState(std::vector<uint32_t> nodes) {
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  auto it = state_ids_.find(nodes);
  if (it != state_ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(states_.size());
  state_ids_.emplace(nodes, id);
  states_.push_back(std::move(nodes));
  transitions_.emplace_back();
  return id;
}

void GrammarAutomaton::Expand(uint32_t pos, uint32_t parent, int depth,
                              std::vector<uint32_t>* out) {
  if (depth > kMaxExpandDepth) return;
  const std::vector<Grammar::Element>& elements = grammar_.elements();
  const Grammar::Element e = elements[pos];
  switch (e.kind) {
    case Grammar::Kind::kBytes: out->push_back(InternNode(pos, parent)); return;
    case Grammar::Kind::kEnd:
      if (parent == kNoParent) {
        out->push_back(kAccepted);
      } else {
        const Node p = nodes_[parent];
        Expand(p.pos, p.parent, depth + 1, out);
      }
      return;
    case Grammar::Kind::kRule: {
      // A rule in last position continues where its own rule would: no node for the return.
      const uint32_t cont =
          elements[pos + 1].kind == Grammar::Kind::kEnd ? parent : InternNode(pos + 1, parent);
      // Ending at the rule's end with no parent left is the sentence's end; a continuation node
      // whose element is kEnd is never made, so `cont` is a real place to continue.
      for (uint32_t alt : grammar_.rule_alternatives()[e.index]) {
        Expand(alt, cont, depth + 1, out);
      }
      return;
    }
  }
}

uint32_t GrammarAutomaton::NextLocked(uint32_t state, uint8_t byte) {
  if (state == kDead) return kDead;
  std::unique_ptr<std::array<uint32_t, 256>>& table = transitions_[state];
  if (table != nullptr && (*table)[byte] != kUnknown) return (*table)[byte];
  std::vector<uint32_t> next;
  const std::vector<Grammar::Element>& elements = grammar_.elements();
  const std::vector<ByteClass>& classes = grammar_.classes();
  // Copy: Expand may grow states_ (not this state's nodes, but the vector holding them).
  scratch_ = states_[state];
  for (uint32_t id : scratch_) {
    if (id == kAccepted) continue;
    const Node n = nodes_[id];
    if (!classes[elements[n.pos].index].Has(byte)) continue;
    Expand(n.pos + 1, n.parent, 0, &next);
  }
  const uint32_t to = next.empty() ? kDead : InternState(std::move(next));
  // transitions_ may have grown: look the table up again.
  std::unique_ptr<std::array<uint32_t, 256>>& t = transitions_[state];
  if (t == nullptr && transition_tables_ < kMaxTransitionTables) {
    t = std::make_unique<std::array<uint32_t, 256>>();
    t->fill(kUnknown);
    ++transition_tables_;
  }
  if (t != nullptr) (*t)[byte] = to;
  return to;
}

uint32_t GrammarAutomaton::Next(uint32_t state, uint8_t byte) {
  absl::MutexLock lock(&mu_);
  return NextLocked(state, byte);
}

uint32_t GrammarAutomaton::NextBytes(uint32_t state, std::string_view bytes) {
  absl::MutexLock lock(&mu_);
  for (char c : bytes) {
    state = NextLocked(state, static_cast<uint8_t>(c));
    if (state == kDead) break;
  }
  return state;
}

bool GrammarAutomaton::IsAccepting(uint32_t state) {
  absl::MutexLock lock(&mu_);
  const std::vector<uint32_t>& s = states_[state];
  return !s.empty() && s.front() == kAccepted;
}

void GrammarAutomaton::AllowedTokens(uint32_t state, std::vector<uint64_t>* bits) {
  const auto start = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  const bool hit = AllowedTokensLocked(state, bits);
  if (counters_ != nullptr) {
    (hit ? counters_->cached : counters_->computed).fetch_add(1, std::memory_order_relaxed);
    counters_->nanos.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count(),
                               std::memory_order_relaxed);
  }
}

bool GrammarAutomaton::AllowedTokensLocked(uint32_t state, std::vector<uint64_t>* bits) {
  const size_t words = static_cast<size_t>((vocabulary_->size() + 63) / 64);
  auto cached = masks_.find(state);
  if (cached != masks_.end()) {
    ++mask_cache_hits_;
    *bits = cached->second;
    return true;
  }
  ++masks_computed_;
  bits->assign(words, 0);
  if (state != kDead) {
    // The trie front to back: a node's state is its parent's (one depth up) after its byte; a
    // dead byte skips the node's whole subtree.
    const TokenVocabulary& v = *vocabulary_;
    const std::vector<int32_t>& ends = v.ends();
    std::vector<uint32_t>& at_depth = walk_states_;
    at_depth.assign(v.max_depth() + 1, kDead);
    at_depth[0] = state;
    const uint32_t n = static_cast<uint32_t>(v.num_nodes());
    for (uint32_t i = 1; i < n;) {
      const uint16_t d = v.depth(i);
      const uint32_t from = at_depth[d - 1];
      const uint8_t b = v.byte(i);
      const std::array<uint32_t, 256>* table = transitions_[from].get();
      uint32_t next = table != nullptr ? (*table)[b] : kUnknown;
      if (next == kUnknown) next = NextLocked(from, b);
      if (next == kDead) {
        i = v.subtree_end(i);
        continue;
      }
      at_depth[d] = next;
      for (uint32_t e = v.end_begin(i); e < v.end_begin(i + 1); ++e) {
        const int32_t id = ends[e];
        (*bits)[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      }
      ++i;
    }
  }
  const size_t bytes = words * sizeof(uint64_t);
  if (mask_cache_bytes_ + bytes > kMaxMaskCacheBytes) {
    masks_.clear();
    mask_cache_bytes_ = 0;
  }
  masks_.emplace(state, *bits);
  mask_cache_bytes_ += bytes;
  return false;
}

GrammarAutomaton::Stats GrammarAutomaton::stats() {
  absl::MutexLock lock(&mu_);
  return Stats{states_.size(), nodes_.size(), masks_computed_, mask_cache_hits_};
}

void GrammarConstraint::AllowedTokens(std::vector<uint64_t>* bits) {
  automaton_->AllowedTokens(state_, bits);
}

bool GrammarConstraint::Accept(int32_t token) {
  const TokenVocabulary& v = automaton_->vocabulary();
  if (token < 0 || token >= v.size() || !v.bytes(token).has_value() || v.bytes(token)->empty()) {
    state_ = GrammarAutomaton::kDead;
    return false;
  }
  state_ = automaton_->NextBytes(state_, *v.bytes(token));
  return state_ != GrammarAutomaton::kDead;
}

}  // namespace tandem::structured
