// Scheduler logic without a model: budgets, chunked prefill, preemption by recompute, admission
// control, prefix reuse, roles, and the KV pool returning to baseline.
#include "common/sched/scheduler.h"

#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<SchedRequest> Req(const std::string& id, int32_t first, int n) {
  auto r = std::make_unique<SchedRequest>();
  r->id = id;
  r->token_ids.resize(n);
  std::iota(r->token_ids.begin(), r->token_ids.end(), first);
  r->max_tokens = 4;
  return r;
}

struct Fixture {
  explicit Fixture(int32_t blocks, SchedulerConfig c = {}, int32_t block_size = 4,
                   bool caching = true) {
    kv = KvCacheManager::Create({blocks, block_size, caching, 0}).value();
    sched = Scheduler::Create(c, kv.get()).value();
  }
  // Runs one step, sampling token 1000 + step for every request that samples.
  SchedulerStep Step() {
    SchedulerStep s = sched->Schedule();
    std::vector<int32_t> sampled;
    for (const auto& c : s.chunks) {
      sampled.push_back(c.samples ? 1000 + static_cast<int32_t>(steps) : Scheduler::kNotSampled);
    }
    sched->Update(s, sampled);
    ++steps;
    return s;
  }
  std::vector<std::pair<std::string, int64_t>> Shape(const SchedulerStep& s) {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const auto& c : s.chunks) out.emplace_back(c.request->id, c.num_new_tokens);
    return out;
  }
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<Scheduler> sched;
  int64_t steps = 0;
};

using Shape = std::vector<std::pair<std::string, int64_t>>;

TEST(SchedulerTest, ChunkedPrefillNeverStallsDecodes) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 16;
  c.max_prefill_chunk = 8;
  Fixture f(64, c);
  ASSERT_TRUE(f.sched->AddRequest(Req("short", 0, 3)).ok());
  EXPECT_EQ(f.Shape(f.Step()), (Shape{{"short", 3}}));
  ASSERT_TRUE(f.sched->AddRequest(Req("long", 100, 20)).ok());
  // The running decode goes first, then 8-token chunks of the long prompt.
  EXPECT_EQ(f.Shape(f.Step()), (Shape{{"short", 1}, {"long", 8}}));
  EXPECT_EQ(f.Shape(f.Step()), (Shape{{"short", 1}, {"long", 8}}));
  auto last = f.Step();
  EXPECT_EQ(f.Shape(last), (Shape{{"short", 1}, {"long", 4}}));
  EXPECT_TRUE(last.chunks[1].samples);  // the prompt's last chunk samples its first token
  EXPECT_EQ(f.Shape(f.Step()), (Shape{{"short", 1}, {"long", 1}}));
  EXPECT_EQ(f.sched->Find("long")->num_output_tokens(), 2);
}

TEST(SchedulerTest, TokenBudgetAndSequenceCap) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 10;
  c.max_num_seqs = 2;
  c.max_prefill_chunk = 0;
  Fixture f(64, c);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(f.sched->AddRequest(Req(id, 0, 6)).ok());
  EXPECT_EQ(f.Shape(f.Step()), (Shape{{"a", 6}, {"b", 4}}));  // budget cuts b's prompt
  EXPECT_EQ(f.Shape(f.Step()), (Shape{{"a", 1}, {"b", 2}}));  // c waits: two sequences at most
  EXPECT_EQ(f.sched->num_waiting(), 1);
}

TEST(SchedulerTest, PreemptsMostRecentlyAdmittedAndResumesByRecompute) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 64;
  Fixture f(4, c);  // 16 token slots
  ASSERT_TRUE(f.sched->AddRequest(Req("old", 0, 7)).ok());
  ASSERT_TRUE(f.sched->AddRequest(Req("new", 50, 7)).ok());
  f.Step();  // both prefilled: 2 blocks each, pool full
  EXPECT_EQ(f.kv->num_free_blocks(), 0);
  f.Step();  // each now has 9 tokens known, 8 computed... still fits
  // Growing past 8 tokens needs a third block for "old": "new" is preempted.
  SchedulerStep s = f.Step();
  EXPECT_THAT(s.preempted, ElementsAre("new"));
  EXPECT_EQ(f.Shape(s), (Shape{{"old", 1}}));
  SchedRequest* victim = f.sched->Find("new");
  EXPECT_EQ(victim->state, RequestState::kPreempted);
  EXPECT_EQ(victim->num_computed_tokens, 0);
  EXPECT_EQ(victim->num_output_tokens(), 2);  // its output so far is kept and recomputed later
  EXPECT_EQ(f.sched->num_preemptions(), 1);
  f.sched->Finish("old");
  s = f.Step();
  // Prompt + 2 outputs = 9 tokens to recompute; its first full block is still in the prefix cache.
  EXPECT_EQ(f.Shape(s), (Shape{{"new", 5}}));
  EXPECT_EQ(f.sched->Find("new")->num_cached_tokens, 4);
  EXPECT_TRUE(s.chunks[0].samples);
}

TEST(SchedulerTest, AdmissionControl) {
  SchedulerConfig c;
  c.max_queued_requests = 2;
  c.max_model_len = 32;
  Fixture f(4, c);
  ASSERT_TRUE(f.sched->AddRequest(Req("a", 0, 4)).ok());
  ASSERT_TRUE(f.sched->AddRequest(Req("b", 0, 4)).ok());
  absl::Status s = f.sched->AddRequest(Req("c", 0, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("max-queued-requests"));
  f.Step();  // a and b start running: the queue has room again
  EXPECT_TRUE(f.sched->AddRequest(Req("c", 0, 4)).ok());
  EXPECT_EQ(f.sched->AddRequest(Req("d", 0, 32)).code(), absl::StatusCode::kInvalidArgument);
  s = f.sched->AddRequest(Req("e", 0, 20));  // fits the context but not the 4-block pool
  EXPECT_THAT(s.message(), HasSubstr("KV blocks"));
  EXPECT_EQ(f.sched->AddRequest(Req("a", 0, 4)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(f.sched->AddRequest(Req("empty", 0, 0)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, PrefixCacheHitComputesOnlyTheRest) {
  Fixture f(16);
  ASSERT_TRUE(f.sched->AddRequest(Req("first", 0, 13)).ok());
  f.Step();
  f.sched->Finish("first");
  ASSERT_TRUE(f.sched->AddRequest(Req("second", 0, 14)).ok());
  SchedulerStep s = f.Step();
  EXPECT_EQ(f.Shape(s), (Shape{{"second", 2}}));  // 3 cached blocks (12 tokens) reused
  EXPECT_EQ(f.sched->Find("second")->num_cached_tokens, 12);
}

TEST(SchedulerTest, PrefillRoleHandsOutAndDecodeRoleAdmits) {
  SchedulerConfig pc;
  pc.role = SchedulerRole::kPrefill;
  Fixture prefill(8, pc);
  ASSERT_TRUE(prefill.sched->AddRequest(Req("r", 0, 6)).ok());
  SchedulerStep s = prefill.Step();
  ASSERT_TRUE(s.chunks[0].samples);
  prefill.sched->HandOut("r");
  EXPECT_EQ(prefill.sched->Find("r")->state, RequestState::kHandedOut);
  EXPECT_EQ(prefill.kv->num_free_blocks(), 6);  // blocks kept for the transfer
  EXPECT_TRUE(prefill.Step().empty());
  prefill.sched->Release("r");
  EXPECT_EQ(prefill.kv->num_free_blocks(), 8);

  SchedulerConfig dc;
  dc.role = SchedulerRole::kDecode;
  Fixture decode(2, dc);
  auto table = decode.sched->Reserve("r", 6);
  ASSERT_TRUE(table.ok());
  EXPECT_THAT(*table, ElementsAre(0, 1));
  EXPECT_EQ(decode.sched->Reserve("other", 6).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto r = Req("r", 0, 7);  // prompt of 6 plus the first token
  r->prompt_len = 6;
  ASSERT_TRUE(decode.sched->AdmitPrefilled(std::move(r)).ok());
  EXPECT_EQ(decode.Shape(decode.Step()), (Shape{{"r", 1}}));
  decode.sched->Finish("r");
  EXPECT_EQ(decode.kv->num_free_blocks(), 2);
}

TEST(SchedulerTest, RandomAddsAbortsAndFinishesReturnThePoolToBaseline) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 24;
  c.max_prefill_chunk = 8;
  c.max_num_seqs = 6;
  c.max_model_len = 64;
  Fixture f(12, c);
  std::mt19937 rng(11);
  std::vector<std::string> ids;
  for (int i = 0; i < 600; ++i) {
    const int op = rng() % 4;
    if (op == 0) {
      const std::string id = "r" + std::to_string(i);
      if (f.sched->AddRequest(Req(id, static_cast<int32_t>(rng() % 2) * 40, 1 + rng() % 30)).ok())
        ids.push_back(id);
    } else if (op == 1 && !ids.empty()) {
      const size_t k = rng() % ids.size();
      f.sched->Finish(ids[k]);  // abort in whatever state it is
      ids.erase(ids.begin() + k);
    } else {
      f.Step();
      for (size_t k = 0; k < ids.size();) {  // finish requests that reached 8 outputs
        SchedRequest* r = f.sched->Find(ids[k]);
        if (r && r->num_output_tokens() >= 8) {
          f.sched->Finish(ids[k]);
          ids.erase(ids.begin() + k);
        } else {
          ++k;
        }
      }
    }
  }
  for (const auto& id : ids) f.sched->Finish(id);
  EXPECT_EQ(f.kv->num_free_blocks(), 12);
  EXPECT_FALSE(f.sched->has_work());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Room for speculative proposals comes from what every running request's own token left: it
// never preempts anyone, never pushes a later request's token out of the step, and rolls back.
TEST(SchedulerSpeculationTest, ProposalsTakeOnlyWhatIsLeftAndRollBack) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 6;
  Fixture f(5, c);  // 20 tokens of KV
  auto a = Req("a", 0, 3);
  a->max_tokens = 12;
  auto b = Req("b", 100, 3);
  b->max_tokens = 4;
  ASSERT_TRUE(f.sched->AddRequest(std::move(a)).ok());
  ASSERT_TRUE(f.sched->AddRequest(std::move(b)).ok());
  f.Step();  // both prompts, each samples its first token
  SchedRequest* ra = f.sched->Find("a");
  ra->spec_budget = 8;  // wants more than the budget and the pool have
  SchedulerStep s = f.sched->Schedule();
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_TRUE(s.preempted.empty());
  EXPECT_EQ(s.chunks[1].request->id, "b");
  EXPECT_EQ(s.chunks[1].num_new_tokens, 1) << "b's token comes first";
  // a: its token and 4 proposal slots (6 tokens of budget, one is b's).
  EXPECT_EQ(s.chunks[0].num_new_tokens, 5);
  EXPECT_EQ(s.chunks[0].num_draft_tokens, 4);
  EXPECT_EQ(f.kv->BlockTable("a").size(), 2u);  // 4 tokens + 4 proposals
  // Two of the proposals kept, then the sampled token: the rest roll back.
  ra->draft_tokens = {7, 8, 9, 10};
  f.sched->Update(s, {42, 43}, {2, 0});
  EXPECT_EQ(ra->num_computed_tokens, 6);
  EXPECT_THAT(ra->token_ids, ElementsAre(0, 1, 2, 1000, 7, 8, 42));
  EXPECT_TRUE(ra->draft_tokens.empty());
  EXPECT_EQ(f.kv->BlockTable("a").size(), 2u);  // 7 tokens
  EXPECT_EQ(f.sched->Find("b")->num_tokens(), 5);
}

}  // namespace
}  // namespace tandem
