// tokenizer.json "model" of type BPE: vocabulary, ranked merges ("a b" strings or [a, b] pairs),
// byte_fallback (<0xNN> tokens), ignore_merges, continuing_subword_prefix, end_of_word_suffix,
// unk_token with fuse_unk. Words are merged lowest rank first with a heap (O(n log n) per word)
// and cached. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> Parse(const nlohmann::json& j);

  // Appends the ids of one pre-tokenized piece to `out`.
  void Tokenize(std::string_view piece, std::vector<int32_t>* out) const;

  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }
  // Token string of an id of the model vocabulary, or nullptr.
  const std::string* IdToToken(int32_t id) const;
  int64_t max_id() const { return max_id_; }

 private:
  BpeModel() = default;
  void TokenizeUncached(std::string_view piece, std::vector<int32_t>* out) const;
  void TokenizeWord(std::string_view piece, std::vector<int32_t>* out) const;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xNN> ids when byte_fallback, else -1
  int64_t max_id_ = -1;
  // SentencePiece-style vocabularies (no pre-tokenizer: the whole text is one piece) mark word
  // starts with "▁". When no token has "▁" right after another character, no merge can cross such a
  // word start, so long pieces are cut there and the words tokenized (and cached) one by one — the
  // result is identical and the cost linear instead of one huge merge over the whole text.
  std::string word_start_marker_;

  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedPiece = 256;
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace tandem::tokenizer_internal
