// Prefix-caching bookkeeping in the style of vLLM's tests: tiny pools, exact block ids, exact free
// queue order, eviction order, sharing, and the pool returning to its baseline.
#include "common/kv/kv_cache_manager.h"

#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::unique_ptr<KvCacheManager> Manager(int32_t blocks, int32_t block_size = 4,
                                        bool caching = true) {
  return KvCacheManager::Create({blocks, block_size, caching, 0}).value();
}

TEST(BlockPoolTest, AllocateFreeAndQueueOrder) {
  BlockPool pool(5, true);
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(0, 1, 2, 3, 4));
  auto a = pool.Allocate(2).value();
  EXPECT_THAT(a, ElementsAre(0, 1));
  auto b = pool.Allocate(2).value();
  EXPECT_THAT(b, ElementsAre(2, 3));
  EXPECT_FALSE(pool.Allocate(2).has_value());  // only block 4 left
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.Free({1, 0});  // a request frees tail first
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(4, 1, 0));
  pool.Touch({1});
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(4, 0));
  EXPECT_EQ(pool.ref_count(1), 1);
  pool.Touch({2});  // shared
  EXPECT_EQ(pool.ref_count(2), 2);
  pool.Free({2});
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(4, 0));  // still referenced
  pool.Free({2, 3, 1});
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(4, 0, 2, 3, 1));
}

TEST(KvCacheManagerTest, PrefixReuseSharesBlocksWithoutCopies) {
  auto m = Manager(10);
  // Request A: 10 tokens → blocks 0,1,2 (two full).
  const auto a_tokens = Tokens(100, 10);
  auto hit = m->FindCachedPrefix(a_tokens);
  EXPECT_TRUE(hit.blocks.empty());
  ASSERT_TRUE(m->Allocate("a", 10, hit));
  EXPECT_THAT(m->BlockTable("a"), ElementsAre(0, 1, 2));
  m->CacheComputedBlocks("a", a_tokens, 10);
  EXPECT_EQ(m->pool().num_cached_blocks(), 2);

  // Request B shares the first 8 tokens: reuses blocks 0 and 1 (same physical blocks).
  auto b_tokens = Tokens(100, 8);
  for (int32_t t : Tokens(500, 5)) b_tokens.push_back(t);
  hit = m->FindCachedPrefix(b_tokens);
  EXPECT_THAT(hit.blocks, ElementsAre(0, 1));
  EXPECT_EQ(hit.num_tokens, 8);
  ASSERT_TRUE(m->Allocate("b", 13, hit));
  EXPECT_THAT(m->BlockTable("b"), ElementsAre(0, 1, 3, 4));
  EXPECT_EQ(m->pool().ref_count(0), 2);
  EXPECT_EQ(m->prefix_hits(), 8);
  EXPECT_EQ(m->prefix_queries(), 23);

  // A prompt entirely cached still recomputes its last token: 8 tokens → only block 0 reused.
  hit = m->FindCachedPrefix(Tokens(100, 8));
  EXPECT_THAT(hit.blocks, ElementsAre(0));
}

TEST(KvCacheManagerTest, EvictsLeastRecentlyFreedCachedBlocksFirst) {
  auto m = Manager(4);
  const auto a = Tokens(0, 8), b = Tokens(50, 8);
  ASSERT_TRUE(m->Allocate("a", 8));
  m->CacheComputedBlocks("a", a, 8);  // blocks 0,1 cached
  ASSERT_TRUE(m->Allocate("b", 8));
  m->CacheComputedBlocks("b", b, 8);  // blocks 2,3 cached
  m->Free("a");                       // queue: 1 0
  m->Free("b");                       // queue: 1 0 3 2
  EXPECT_THAT(m->pool().FreeQueue(), ElementsAre(1, 0, 3, 2));
  // A new 4-token request takes block 1, evicting a's second block; a's first block is still
  // cached.
  ASSERT_TRUE(m->Allocate("c", 4));
  EXPECT_THAT(m->BlockTable("c"), ElementsAre(1));
  EXPECT_FALSE(m->pool().is_cached(1));
  auto hit = m->FindCachedPrefix(Tokens(0, 9));
  EXPECT_THAT(hit.blocks, ElementsAre(0));  // block 1's content is gone
  hit = m->FindCachedPrefix(Tokens(50, 9));
  EXPECT_THAT(hit.blocks, ElementsAre(2, 3));
}

TEST(KvCacheManagerTest, AllocationFailureChangesNothing) {
  auto m = Manager(3);
  ASSERT_TRUE(m->Allocate("a", 8));
  EXPECT_FALSE(m->Allocate("b", 8));
  EXPECT_FALSE(m->Has("b"));
  EXPECT_EQ(m->num_free_blocks(), 1);
  // Growing a request one block at a time until the pool is empty.
  EXPECT_TRUE(m->Allocate("a", 12));
  EXPECT_FALSE(m->Allocate("a", 13));
  EXPECT_THAT(m->BlockTable("a"), ElementsAre(0, 1, 2));
  m->Free("a");
  EXPECT_EQ(m->num_free_blocks(), 3);
}

TEST(KvCacheManagerTest, CacheHitsCountAgainstFreeBlocks) {
  // A hit on a block nobody references takes it out of the free queue: it must be counted.
  auto m = Manager(3);
  const auto t = Tokens(0, 9);
  ASSERT_TRUE(m->Allocate("a", 9));
  m->CacheComputedBlocks("a", t, 9);
  m->Free("a");
  auto hit = m->FindCachedPrefix(t);
  EXPECT_THAT(hit.blocks, ElementsAre(0, 1));
  EXPECT_FALSE(m->Allocate("b", 16, hit));  // 2 hits + 2 new > 3 free
  EXPECT_TRUE(m->Allocate("b", 12, hit));   // 2 hits + 1 new
  EXPECT_EQ(m->num_free_blocks(), 0);
}

TEST(KvCacheManagerTest, NoCachingMeansNoHits) {
  auto m = Manager(4, 4, /*caching=*/false);
  const auto t = Tokens(0, 9);
  ASSERT_TRUE(m->Allocate("a", 9));
  m->CacheComputedBlocks("a", t, 9);
  m->Free("a");
  EXPECT_TRUE(m->FindCachedPrefix(t).blocks.empty());
}

TEST(KvCacheManagerTest, DifferentSaltsDoNotShare) {
  EXPECT_NE(HashBlock(0, Tokens(0, 4).data(), 4, 1), HashBlock(0, Tokens(0, 4).data(), 4, 2));
  EXPECT_NE(HashBlock(0, Tokens(0, 4).data(), 4, 1), HashBlock(7, Tokens(0, 4).data(), 4, 1));
}

TEST(KvCacheManagerTest, RandomOperationsReturnThePoolToBaseline) {
  auto m = Manager(16, 4);
  std::mt19937 rng(5);
  std::vector<std::string> live;
  for (int step = 0; step < 2000; ++step) {
    const int op = rng() % 3;
    if (op == 0 || live.empty()) {
      const std::string id = "r" + std::to_string(step);
      const auto tokens = Tokens(static_cast<int32_t>(rng() % 3) * 100, 1 + rng() % 20);
      auto hit = m->FindCachedPrefix(tokens);
      if (m->Allocate(id, static_cast<int64_t>(tokens.size()), hit)) {
        m->CacheComputedBlocks(id, tokens, static_cast<int64_t>(tokens.size()));
        live.push_back(id);
      }
    } else if (op == 1) {
      const size_t i = rng() % live.size();
      m->Free(live[i]);
      live.erase(live.begin() + i);
    } else {
      const std::string& id = live[rng() % live.size()];
      m->Allocate(id, static_cast<int64_t>(m->BlockTable(id).size()) * 4 + 1);
    }
  }
  for (const auto& id : live) m->Free(id);
  EXPECT_EQ(m->num_free_blocks(), 16);
  for (int32_t b = 0; b < 16; ++b) EXPECT_EQ(m->pool().ref_count(b), 0);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(KvCacheManagerTest, TruncateReturnsTheTailAndKeepsTheCachedPrefix) {
  auto m = Manager(8);
  const std::vector<int32_t> tokens = Tokens(100, 9);
  ASSERT_TRUE(m->Allocate("a", 9));
  m->CacheComputedBlocks("a", tokens, 8);  // two full blocks cached
  ASSERT_TRUE(m->Allocate("a", 20));       // room for proposals: 5 blocks
  EXPECT_EQ(m->num_free_blocks(), 3);
  m->Truncate("a", 10);  // 10 tokens kept: 3 blocks
  EXPECT_THAT(m->BlockTable("a"), ElementsAre(0, 1, 2));
  EXPECT_THAT(m->pool().FreeQueue(), ElementsAre(5, 6, 7, 4, 3));
  m->Truncate("a", 12);  // never grows
  EXPECT_EQ(m->BlockTable("a").size(), 3u);
  m->Truncate("unknown", 0);
  // The cached prefix still serves a new request.
  EXPECT_EQ(m->FindCachedPrefix(tokens).num_tokens, 8);
  m->Free("a");
  EXPECT_EQ(m->num_free_blocks(), 8);
}

}  // namespace
}  // namespace tandem
