// Per-request KV block bookkeeping over a BlockPool, with prefix caching (vLLM v1's design).
//
// A request's block table only grows. Full blocks are identified by
// hash(parent hash, token ids, extra key); a new request reuses every leading full block already
// cached and computes only the rest. At least one prompt token is always recomputed, so the request
// gets logits for its next token. Host-only; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kv/block_pool.h"

namespace tandem {

// Cached leading blocks of a token sequence, and how many tokens they cover.
struct PrefixCacheHit {
  std::vector<int32_t> blocks;
  int64_t num_tokens = 0;
};

class KvCacheManager {
 public:
  struct Options {
    int32_t num_blocks = 0;
    int32_t block_size = 16;
    bool enable_prefix_caching = true;
    uint64_t cache_salt = 0;  // extra key of every block hash (e.g. a model fingerprint)
  };
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const Options& options);

  using CacheHit = PrefixCacheHit;
  // Leading blocks of `token_ids` found in the cache and the tokens they cover (a multiple of the
  // block size, at most token_ids.size() - 1). Counts a prefix-cache query (and hits) in tokens.
  CacheHit FindCachedPrefix(const std::vector<int32_t>& token_ids);

  // Extends request `id`'s table so it holds `total_tokens` tokens. On the request's first call,
  // `hit` (from FindCachedPrefix) is adopted first. Returns false and changes nothing when the pool
  // cannot provide the blocks: the caller preempts or waits.
  bool Allocate(const std::string& id, int64_t total_tokens, const CacheHit& hit = {});

  // Registers the full blocks among the first `num_computed_tokens` of `token_ids` in the prefix
  // cache (call after they are computed).
  void CacheComputedBlocks(const std::string& id, const std::vector<int32_t>& token_ids,
                           int64_t num_computed_tokens);

  // Rolls request `id`'s table back to the blocks that `num_tokens` tokens need, returning the rest
  // to the pool (tail first), with any prefix-cache identity they had in this request: speculative
  // decoding's rejected positions. Unknown ids are ignored.
  void Truncate(const std::string& id, int64_t num_tokens);

  // Returns every block of the request to the pool (tail first). Unknown ids are ignored.
  void Free(const std::string& id);

  const std::vector<int32_t>& BlockTable(const std::string& id) const;
  bool Has(const std::string& id) const { return requests_.contains(id); }
  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  double usage() const {
    return 1.0 - static_cast<double>(num_free_blocks()) / std::max(1, num_blocks());
  }
  int64_t BlocksFor(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  const BlockPool& pool() const { return pool_; }

  // Prefix cache statistics, in tokens.
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }

 private:
  KvCacheManager(const Options& options);
  struct RequestBlocks {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;  // of the leading full blocks already cached / hashed
  };
  // The identity of full block `block` of `tokens` under `parent`.
  BlockKey MakeKey(uint64_t parent, const std::vector<int32_t>& tokens, int64_t block) const;

  int32_t block_size_;
  uint64_t salt_;
  BlockPool pool_;
  absl::flat_hash_map<std::string, RequestBlocks> requests_;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace tandem
