// Routing policies: prefix affinity with bounded loads for prefill, KV room for decode.
#include <map>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/decode_policy.h"
#include "router/prefill_policy.h"

namespace tandem::router {
namespace {

std::vector<WorkerLoad> Workers(int n) {
  std::vector<WorkerLoad> w(n);
  for (int i = 0; i < n; ++i) w[i].id = "w" + std::to_string(i);
  return w;
}

std::vector<int32_t> Prompt(uint32_t seed, int len) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % 1000);
  return p;
}

TEST(PrefillPolicyTest, SharedPrefixesGoToTheSameWorker) {
  PrefillPolicy policy({64, 1.25, 4, 16});
  policy.SetWorkers(Workers(4));
  const auto prefix = Prompt(1, 64);
  auto a = prefix, b = prefix;
  for (int32_t t : Prompt(2, 20)) a.push_back(t);
  for (int32_t t : Prompt(3, 50)) b.push_back(t);
  EXPECT_EQ(policy.AffinityKey(a), policy.AffinityKey(b));  // only the leading 4 blocks count
  EXPECT_EQ(policy.Choose(a).value(), policy.Choose(b).value());
}

TEST(PrefillPolicyTest, DistinctPrefixesSpreadOverWorkers) {
  PrefillPolicy policy({64, 1.25, 4, 16});
  policy.SetWorkers(Workers(4));
  std::map<std::string, int> hits;
  for (uint32_t i = 0; i < 400; ++i) ++hits[policy.Choose(Prompt(100 + i, 64)).value()];
  ASSERT_EQ(hits.size(), 4u);
  for (const auto& [id, n] : hits) EXPECT_GT(n, 40) << id;  // roughly 100 each
}

TEST(PrefillPolicyTest, OverloadedAffinityWorkerIsSkipped) {
  PrefillPolicy policy({64, 1.25, 4, 16});
  auto workers = Workers(3);
  policy.SetWorkers(workers);
  const auto p = Prompt(7, 64);
  const std::string home = policy.Choose(p).value();
  for (auto& w : workers) {
    if (w.id == home) w.waiting = 30;  // far above 1.25 × the average
  }
  policy.SetWorkers(workers);
  EXPECT_NE(policy.Choose(p).value(), home);
  for (auto& w : workers)
    w.healthy = w.id == home;  // only the overloaded one left: it still serves
  policy.SetWorkers(workers);
  EXPECT_EQ(policy.Choose(p).value(), home);
  for (auto& w : workers) w.healthy = false;
  policy.SetWorkers(workers);
  EXPECT_EQ(policy.Choose(p).status().code(), absl::StatusCode::kUnavailable);
}

TEST(PrefillPolicyTest, RemovingAWorkerOnlyMovesItsKeys) {
  PrefillPolicy policy({64, 100.0, 4, 16});  // no load bound: pure consistent hashing
  auto workers = Workers(5);
  policy.SetWorkers(workers);
  std::vector<std::string> before;
  for (uint32_t i = 0; i < 500; ++i) before.push_back(policy.Choose(Prompt(1000 + i, 64)).value());
  workers.erase(workers.begin() + 2);  // w2 leaves
  policy.SetWorkers(workers);
  int moved = 0;
  for (uint32_t i = 0; i < 500; ++i) {
    const std::string now = policy.Choose(Prompt(1000 + i, 64)).value();
    if (before[i] != "w2") {
      EXPECT_EQ(now, before[i]);  // keys of the remaining workers stay put
    } else {
      ++moved;
      EXPECT_NE(now, "w2");
    }
  }
  EXPECT_GT(moved, 0);
}

TEST(DecodePolicyTest, WeighsKvUsageAgainstRunningSequences) {
  auto w = Workers(3);
  for (auto& x : w) x.total_blocks = 100;
  w[0].free_blocks = 10;  // 90% used
  w[1].free_blocks = 50;
  w[2].free_blocks = 50;
  w[1].running = 9;
  w[2].running = 3;
  // Same KV usage: the one with fewer sequences.
  EXPECT_EQ(ChooseDecodeWorker(w, {100, 64}).value(), "w2");
  w[2].healthy = false;
  // w0: 0.9 + 0/10; w1: 0.5 + 9/10 — the nearly full pool still wins against a busy one.
  EXPECT_EQ(ChooseDecodeWorker(w, {100, 64}).value(), "w0");
  w[0].running = 4;  // 0.9 + 4/14 > 0.5 + 9/14
  EXPECT_EQ(ChooseDecodeWorker(w, {100, 64}).value(), "w1");
}

TEST(DecodePolicyTest, IdleEqualWorkersTakeTurnsAsLoadIsCounted) {
  auto w = Workers(2);
  for (auto& x : w) {
    x.total_blocks = 100;
    x.free_blocks = 100;
  }
  std::map<std::string, int> count;
  for (int i = 0; i < 10; ++i) {
    const std::string chosen = ChooseDecodeWorker(w, {10, 10}).value();
    ++count[chosen];
    ++w[chosen == "w0" ? 0 : 1]
          .running;  // what the router's own accounting adds between heartbeats
  }
  EXPECT_EQ(count["w0"], 5);
  EXPECT_EQ(count["w1"], 5);
}

TEST(DecodePolicyTest, RefusesWhenNoWorkerHasRoom) {
  auto w = Workers(2);
  w[0].free_blocks = 4;  // 64 tokens
  w[1].free_blocks = 6;  // 96 tokens
  EXPECT_EQ(ChooseDecodeWorker(w, {90, 0}).value(), "w1");
  auto s = ChooseDecodeWorker(w, {90, 64});  // 90 + 16 headroom = 106 tokens
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  for (auto& x : w) x.healthy = false;
  EXPECT_EQ(ChooseDecodeWorker(w, {1, 1}).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::router
