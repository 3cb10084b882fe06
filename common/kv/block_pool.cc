#include "common/kv/block_pool.h"

#include <algorithm>

namespace tandem {

uint64_t HashBlock(uint64_t parent_hash, const int32_t* token_ids, int64_t n, uint64_t extra_key) {
  // 64-bit FNV-1a over (parent, extra, tokens) followed by a murmur-style finaliser. Hits are
  // verified against the stored tokens, so this only needs to spread well.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(parent_hash);
  mix(extra_key);
  for (int64_t i = 0; i < n; ++i) mix(static_cast<uint32_t>(token_ids[i]));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching), blocks_(std::max(num_blocks, 0)) {
  for (int32_t b = 0; b < num_blocks; ++b) QueuePushBack(b);
}

void BlockPool::QueueRemove(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.in_queue) return;
  if (blk.prev >= 0)
    blocks_[blk.prev].next = blk.next;
  else
    head_ = blk.next;
  if (blk.next >= 0)
    blocks_[blk.next].prev = blk.prev;
  else
    tail_ = blk.prev;
  blk.prev = blk.next = -1;
  blk.in_queue = false;
  --num_free_;
}

void BlockPool::QueuePushBack(int32_t b) {
  Block& blk = blocks_[b];
  blk.prev = tail_;
  blk.next = -1;
  if (tail_ >= 0)
    blocks_[tail_].next = b;
  else
    head_ = b;
  tail_ = b;
  blk.in_queue = true;
  ++num_free_;
}

void BlockPool::Evict(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.key) return;
  auto it = cache_.find(blk.key->hash);
  if (it != cache_.end()) {
    std::erase(it->second, b);
    if (it->second.empty()) cache_.erase(it);
  }
  blk.key.reset();
}

std::optional<std::vector<int32_t>> BlockPool::Allocate(int32_t n) {
  if (n < 0 || n > num_free_) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    QueueRemove(b);
    Evict(b);
    blocks_[b].ref_count = 1;
    out.push_back(b);
  }
  return out;
}

std::optional<int32_t> BlockPool::Lookup(const BlockKey& key) const {
  if (!enable_caching_) return std::nullopt;
  auto it = cache_.find(key.hash);
  if (it == cache_.end()) return std::nullopt;
  for (int32_t b : it->second) {
    if (blocks_[b].key && *blocks_[b].key == key) return b;
  }
  return std::nullopt;
}

void BlockPool::Touch(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    if (blocks_[b].ref_count == 0) QueueRemove(b);
    ++blocks_[b].ref_count;
  }
}

void BlockPool::Free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    Block& blk = blocks_[b];
    if (blk.ref_count <= 0) continue;  // double free: ignored (bookkeeping bug guard)
    if (--blk.ref_count == 0) QueuePushBack(b);
  }
}

void BlockPool::Cache(int32_t block, BlockKey key) {
  if (!enable_caching_ || blocks_[block].key) return;
  if (Lookup(key)) return;
  cache_[key.hash].push_back(block);
  blocks_[block].key = std::move(key);
}

std::vector<int32_t> BlockPool::FreeQueue() const {
  std::vector<int32_t> out;
  for (int32_t b = head_; b >= 0; b = blocks_[b].next) out.push_back(b);
  return out;
}

}  // namespace tandem
