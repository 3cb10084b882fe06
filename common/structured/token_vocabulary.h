// The bytes each token adds to generated text, in a trie: what a grammar's token mask walks.
//
// Tokens without bytes (special tokens, ids the tokenizer does not know, tokens whose text is
// empty) are never allowed by a grammar; end of sequence is the sampler's to allow.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::structured {

class TokenVocabulary {
 public:
  // token_bytes[id]: the token's bytes, or nullopt for a token a grammar never allows.
  static std::shared_ptr<const TokenVocabulary> Create(
      std::vector<std::optional<std::string>> token_bytes);
  // From a tokenizer (Tokenizer::TokenBytes), over `vocab_size` ids (the model's; ids past the
  // tokenizer's get no bytes).
  static std::shared_ptr<const TokenVocabulary> FromTokenizer(const Tokenizer& tokenizer,
                                                              int64_t vocab_size);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::optional<std::string>& bytes(int32_t id) const { return bytes_[id]; }

  // The trie in depth-first preorder, so that a walk reads it front to back and skips a subtree
  // by jumping to its end: node 0 is the root; node i > 0 adds byte(i) to its parent's bytes and
  // sits at depth(i) (the root's children at 1); its subtree is [i, subtree_end(i)); the tokens
  // whose bytes end at it are ends()[end_begin(i), end_begin(i + 1)).
  size_t num_nodes() const { return depth_.size(); }
  uint8_t byte(uint32_t node) const { return byte_[node]; }
  uint16_t depth(uint32_t node) const { return depth_[node]; }
  uint32_t subtree_end(uint32_t node) const { return subtree_end_[node]; }
  uint32_t end_begin(uint32_t node) const { return end_begin_[node]; }
  const std::vector<int32_t>& ends() const { return ends_; }
  size_t max_depth() const { return max_depth_; }

 private:
  TokenVocabulary() = default;
  std::vector<std::optional<std::string>> bytes_;
  std::vector<uint8_t> byte_;          // [nodes]
  std::vector<uint16_t> depth_;        // [nodes]
  std::vector<uint32_t> subtree_end_;  // [nodes]
  std::vector<uint32_t> end_begin_;    // [nodes + 1]
  std::vector<int32_t> ends_;
  size_t max_depth_ = 0;
};

}  // namespace tandem::structured
