#include "common/kv/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(const Options& options) {
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache needs at least one block, got ", options.num_blocks));
  }
  if (options.block_size <= 0 || options.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block size must be in [1, 1024], got ", options.block_size));
  }
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(options));
}

KvCacheManager::KvCacheManager(const Options& o)
    : block_size_(o.block_size),
      salt_(o.cache_salt),
      pool_(o.num_blocks, o.enable_prefix_caching) {}

BlockKey KvCacheManager::MakeKey(uint64_t parent, const std::vector<int32_t>& tokens,
                                 int64_t block) const {
  BlockKey key;
  key.hash = HashBlock(parent, tokens.data() + block * block_size_, block_size_, salt_);
  key.parent_hash = parent;
  key.token_ids.assign(tokens.begin() + block * block_size_,
                       tokens.begin() + (block + 1) * block_size_);
  return key;
}

KvCacheManager::CacheHit KvCacheManager::FindCachedPrefix(const std::vector<int32_t>& token_ids) {
  CacheHit hit;
  const int64_t n = static_cast<int64_t>(token_ids.size());
  prefix_queries_ += n;
  if (!pool_.caching() || n == 0) return hit;
  // The last token is always recomputed, so only blocks ending before it can be reused.
  const int64_t max_blocks = (n - 1) / block_size_;
  uint64_t parent = 0;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const BlockKey key = MakeKey(parent, token_ids, b);
    auto found = pool_.Lookup(key);
    if (!found) break;
    hit.blocks.push_back(*found);
    parent = key.hash;
  }
  hit.num_tokens = static_cast<int64_t>(hit.blocks.size()) * block_size_;
  prefix_hits_ += hit.num_tokens;
  return hit;
}

bool KvCacheManager::Allocate(const std::string& id, int64_t total_tokens, const CacheHit& hit) {
  auto it = requests_.find(id);
  const bool is_new = it == requests_.end();
  const int64_t have = is_new ? static_cast<int64_t>(hit.blocks.size())
                              : static_cast<int64_t>(it->second.blocks.size());
  const int64_t need = std::max<int64_t>(0, BlocksFor(total_tokens) - have);
  // Cache hits with no other reference are in the free queue: touching them uses up free blocks.
  int64_t hits_from_free = 0;
  if (is_new) {
    for (int32_t b : hit.blocks) hits_from_free += pool_.ref_count(b) == 0 ? 1 : 0;
  }
  if (need + hits_from_free > pool_.num_free_blocks()) return false;
  if (is_new) {
    pool_.Touch(hit.blocks);
    it = requests_.emplace(id, RequestBlocks{hit.blocks, {}}).first;
  }
  if (need > 0) {
    auto fresh = pool_.Allocate(static_cast<int32_t>(need));
    it->second.blocks.insert(it->second.blocks.end(), fresh->begin(), fresh->end());
  }
  return true;
}

void KvCacheManager::CacheComputedBlocks(const std::string& id,
                                         const std::vector<int32_t>& token_ids,
                                         int64_t num_computed_tokens) {
  if (!pool_.caching()) return;
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  RequestBlocks& r = it->second;
  const int64_t full =
      std::min<int64_t>(num_computed_tokens / block_size_, static_cast<int64_t>(r.blocks.size()));
  for (int64_t b = static_cast<int64_t>(r.hashes.size()); b < full; ++b) {
    const uint64_t parent = b == 0 ? 0 : r.hashes[b - 1];
    BlockKey key = MakeKey(parent, token_ids, b);
    r.hashes.push_back(key.hash);
    pool_.Cache(r.blocks[b], std::move(key));
  }
}

void KvCacheManager::Truncate(const std::string& id, int64_t num_tokens) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  RequestBlocks& r = it->second;
  const size_t keep = static_cast<size_t>(std::max<int64_t>(0, BlocksFor(num_tokens)));
  if (r.blocks.size() <= keep) return;
  std::vector<int32_t> reversed(r.blocks.rbegin(), r.blocks.rend() - keep);
  pool_.Free(reversed);
  r.blocks.resize(keep);
  if (r.hashes.size() > keep) r.hashes.resize(keep);
}

void KvCacheManager::Free(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::vector<int32_t> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.Free(reversed);
  requests_.erase(it);
}

const std::vector<int32_t>& KvCacheManager::BlockTable(const std::string& id) const {
  static const std::vector<int32_t> kEmpty;
  auto it = requests_.find(id);
  return it == requests_.end() ? kEmpty : it->second.blocks;
}

}  // namespace tandem
