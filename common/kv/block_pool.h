// The pool of KV cache blocks: reference counts, a free queue in eviction order, and the prefix
// cache (full blocks by content hash). Host-only bookkeeping: it never touches device memory.
//
// Eviction order (vLLM v1): freed blocks go to the tail of the free queue, new blocks are taken
// from the head, so the least recently freed block is evicted first; a request frees its blocks
// tail first, so a request's last blocks (least likely to be shared) are evicted before its first
// ones. A cached block whose reference count is zero stays in the free queue and in the cache until
// it is taken for new data, so a later request can still reuse it ("touch" takes it out of the
// queue). Not thread-safe: one engine step loop owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {

// Identity of a full block's content: hash(parent, token ids, extra keys) plus the exact token ids
// and parent hash, which a hit verifies (so a 64-bit collision can never return wrong KV).
struct BlockKey {
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  std::vector<int32_t> token_ids;

  bool operator==(const BlockKey& o) const {
    return hash == o.hash && parent_hash == o.parent_hash && token_ids == o.token_ids;
  }
};

// hash(parent hash, token ids, extra key) — extra_key separates caches that must not share
// blocks (e.g. a different model or adapter).
uint64_t HashBlock(uint64_t parent_hash, const int32_t* token_ids, int64_t n, uint64_t extra_key);

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, bool enable_caching);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free_blocks() const { return num_free_; }
  bool caching() const { return enable_caching_; }

  // Takes `n` blocks from the head of the free queue (evicting their cached content) with reference
  // count 1. Returns nullopt and changes nothing when fewer than `n` are free.
  std::optional<std::vector<int32_t>> Allocate(int32_t n);
  // The cached block holding exactly `key`, or nullopt.
  std::optional<int32_t> Lookup(const BlockKey& key) const;
  // Takes a reference on each block (cache hits); a block with no references leaves the free queue.
  void Touch(const std::vector<int32_t>& blocks);
  // Drops a reference on each block, in the order given; blocks reaching zero join the queue tail.
  void Free(const std::vector<int32_t>& blocks);
  // Records that `block` (full, referenced) holds `key`. A block already cached keeps its entry; a
  // key already cached in another block is left as is (the duplicate is simply not indexed).
  void Cache(int32_t block, BlockKey key);

  int32_t ref_count(int32_t block) const { return blocks_[block].ref_count; }
  bool is_cached(int32_t block) const { return blocks_[block].key.has_value(); }
  // Block ids in the free queue, head (next evicted) first. For tests and debugging.
  std::vector<int32_t> FreeQueue() const;
  int64_t num_cached_blocks() const { return static_cast<int64_t>(cache_.size()); }

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1, next = -1;  // free-queue links
    bool in_queue = false;
    std::optional<BlockKey> key;
  };
  void QueueRemove(int32_t b);
  void QueuePushBack(int32_t b);
  void Evict(int32_t b);

  bool enable_caching_;
  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1;
  int32_t num_free_ = 0;
  // Hash → blocks (collisions kept apart)
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> cache_;
};

}  // namespace tandem
