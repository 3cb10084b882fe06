// Speculative decoding in the engine (n-gram proposals) on the tiny presets: greedy output token
// for token what decoding without speculation gives, under preemption, prefix hits, chunked
// prefill, stops and max_tokens inside an accepted run, with every logits processor; sampled output
// distributed as the target's; rejected positions' blocks returned; the adaptive policy's rules;
// bad requests refused.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

class SpeculationTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    model_ = LlamaModel::Load(testing_util::TinyModel(GetParam(), 3), backend_.get()).value();
    // A draft: another random model of the preset (its vocabulary; its own guesses).
    draft_ = LlamaModel::Load(testing_util::TinyModel(GetParam(), 5), backend_.get()).value();
    // And the target itself as a draft: its greedy guesses are all kept.
    self_draft_ = LlamaModel::Load(testing_util::TinyModel(GetParam(), 3), backend_.get()).value();
  }

  EngineOptions Options(int64_t kv_blocks, int64_t budget, int64_t chunk, SpeculationMethod method,
                        int32_t k, LlamaModel* draft = nullptr) {
    if (draft == nullptr) draft = draft_.get();
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_dtype = DType::kF32;
    // Blocks hold the draft's KV too.
    o.kv_cache_memory =
        kv_blocks * (KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4)) +
                     (method == SpeculationMethod::kDraft
                          ? DraftModelProposer::BytesPerBlock(*draft, 4, DType::kF32)
                          : 0));
    o.scheduler.max_num_batched_tokens = budget;
    o.scheduler.max_prefill_chunk = chunk;
    o.scheduler.max_model_len = 256;
    o.scheduler.max_queued_requests = 4096;
    o.max_logprobs = 1024;
    o.speculation.method = method;
    o.speculation.num_tokens = k;
    o.speculation.adaptive = false;
    if (method == SpeculationMethod::kDraft) o.speculation.draft = draft;
    return o;
  }
  std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
    return Engine::Create(model_.get(), o).value();
  }

  struct Run {
    std::map<std::string, std::vector<int32_t>> tokens;
    std::map<std::string, std::vector<LogprobEntry>> logprobs;
    std::map<std::string, RequestOutput> last;
  };
  // Runs until idle; `late` requests join after a few steps (to hit the prefix cache).
  Run RunAll(Engine* e, const std::vector<EngineRequest>& late = {}) {
    Run run;
    for (int guard = 0; (e->HasWork() || guard <= 6) && guard < 100000; ++guard) {
      if (guard == 6) {
        for (const auto& r : late) EXPECT_TRUE(e->AddRequest(r).ok());
      }
      auto outs = e->Step();
      EXPECT_TRUE(outs.ok()) << outs.status();
      if (!outs.ok()) break;
      for (auto& o : *outs) {
        auto& t = run.tokens[o.id];
        t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        auto& l = run.logprobs[o.id];
        l.insert(l.end(), o.new_logprobs.begin(), o.new_logprobs.end());
        run.last[o.id] = o;
      }
    }
    return run;
  }

  std::vector<int32_t> Random(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = static_cast<int32_t>(rng() % model_->config().vocab_size);
    return p;
  }
  // A prompt that repeats itself, which n-gram proposals continue.
  std::vector<int32_t> Repeating(int period, int n, uint32_t seed) {
    const std::vector<int32_t> unit = Random(period, seed);
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = unit[i % period];
    return p;
  }

  // Greedy requests with every kind of ending and processor.
  std::vector<EngineRequest> GreedyRequests(uint32_t seed) {
    std::vector<EngineRequest> reqs;
    std::mt19937 rng(seed);
    for (int i = 0; i < 12; ++i) {
      EngineRequest r;
      r.id = "g" + std::to_string(i);
      // Repeating prompts (proposals often kept) and long random ones (where a token the output
      // takes recurs with a continuation the model does not choose: proposals refused).
      r.prompt_token_ids = i % 3 == 2
                               ? Random(60 + static_cast<int>(rng() % 60), seed + i)
                               : Repeating(2 + i % 5, 8 + static_cast<int>(rng() % 30), seed + i);
      r.params.temperature = 0;
      r.params.ignore_eos = true;
      r.params.max_tokens = 1 + static_cast<int32_t>(rng() % 40);
      switch (i % 6) {
        case 1: r.params.repetition_penalty = 1.3f; break;
        case 2: r.params.frequency_penalty = 0.5f, r.params.presence_penalty = 0.3f; break;
        case 3:
          r.params.logit_bias = {{r.prompt_token_ids[0], 2.f}};
          r.params.logprobs = 3;
          break;
        case 4:
          // A stop id that the unstopped output reaches, and min_tokens before it.
          r.params.min_tokens = 2;
          break;
        default: break;
      }
      reqs.push_back(r);
    }
    // A shared prefix (prefix-cache hits) and a request that asks for no speculation.
    EngineRequest shared = reqs[0];
    shared.id = "shared";
    shared.prompt_token_ids.push_back(7);
    reqs.push_back(shared);
    EngineRequest off = reqs[1];
    off.id = "off";
    off.speculation = SpeculationMethod::kOff;
    reqs.push_back(off);
    return reqs;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<LlamaModel> draft_;
  std::unique_ptr<LlamaModel> self_draft_;

  void ExpectDistributedAsTarget(SpeculationMethod method, const std::vector<int32_t>& prompt,
                                 float temperature, const std::vector<double>& p2);
};

TEST_P(SpeculationTest, GreedyOutputIsTokenIdenticalToDecodingWithout) {
  std::vector<EngineRequest> reqs = GreedyRequests(5);
  // The reference, without speculation, in a roomy engine.
  auto plain = MakeEngine(Options(512, 512, 0, SpeculationMethod::kOff, 4));
  for (const auto& r : reqs) ASSERT_TRUE(plain->AddRequest(r).ok());
  const Run expected = RunAll(plain.get());
  // Stop ids inside what the output reaches: a stop must end the run where it lands.
  for (auto& r : reqs) {
    const auto& t = expected.tokens.at(r.id);
    if (r.params.min_tokens > 0 && t.size() > 4) r.params.stop_token_ids = {t[3]};
  }
  plain = MakeEngine(Options(512, 512, 0, SpeculationMethod::kOff, 4));
  for (const auto& r : reqs) ASSERT_TRUE(plain->AddRequest(r).ok());
  const Run reference = RunAll(plain.get());

  struct Case {
    SpeculationMethod method;
    int32_t k;
    LlamaModel* draft;
  };
  for (const auto& [method, k, draft] :
       std::vector<Case>{{SpeculationMethod::kNgram, 1, nullptr},
                         {SpeculationMethod::kNgram, 2, nullptr},
                         {SpeculationMethod::kNgram, 3, nullptr},
                         {SpeculationMethod::kNgram, 5, nullptr},
                         {SpeculationMethod::kNgram, 8, nullptr},
                         {SpeculationMethod::kDraft, 1, draft_.get()},
                         {SpeculationMethod::kDraft, 4, draft_.get()},
                         {SpeculationMethod::kDraft, 3, self_draft_.get()},
                         {SpeculationMethod::kDraft, 7, self_draft_.get()}}) {
    // A small pool (preemption), a small budget and prompt chunks.
    auto e = MakeEngine(Options(48, 24, 8, method, k, draft));
    std::vector<EngineRequest> late;
    for (const auto& r : reqs) {
      if (r.id == "shared") {
        late.push_back(r);
      } else {
        ASSERT_TRUE(e->AddRequest(r).ok());
      }
    }
    const Run got = RunAll(e.get(), late);
    for (const auto& r : reqs) {
      ASSERT_EQ(got.tokens.at(r.id), reference.tokens.at(r.id))
          << r.id << " " << SpeculationMethodName(method) << " k=" << k;
      EXPECT_EQ(got.last.at(r.id).finish_reason, reference.last.at(r.id).finish_reason) << r.id;
      if (r.params.logprobs >= 0) {
        const auto& a = got.logprobs.at(r.id);
        const auto& b = reference.logprobs.at(r.id);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_EQ(a[i].token_id, b[i].token_id);
          EXPECT_NEAR(a[i].logprob, b[i].logprob, 1e-4) << r.id << " " << i;
          EXPECT_EQ(a[i].top.size(), 3u);
        }
      }
      // Counts over the request: present when it speculated, accepted <= proposed.
      const auto& spec = got.last.at(r.id).speculation;
      if (r.id == "off") {
        EXPECT_FALSE(spec.has_value());
      } else {
        ASSERT_TRUE(spec.has_value()) << r.id;
        EXPECT_LE(spec->accepted, spec->proposed);
      }
    }
    const EngineStats s = e->stats();
    // Some proposals kept, some refused (the target as its own draft: all it verifies kept).
    if (draft != draft_.get()) EXPECT_GT(s.speculation.counts.accepted, 0) << "k=" << k;
    if (draft != self_draft_.get()) {
      EXPECT_GT(s.speculation.counts.proposed, s.speculation.counts.accepted) << "k=" << k;
    } else {
      // (All but those past a stop id that ended the run: proposed, never verified.)
      EXPECT_GE(s.speculation.counts.accepted, s.speculation.counts.proposed * 9 / 10) << "k=" << k;
    }
    EXPECT_GT(s.preemptions, 0) << "the test should force preemption";
    EXPECT_GT(s.prefix_hits, 0);
    EXPECT_EQ(s.free_blocks, 48) << "every block back, rejected positions' included";
    // Fewer steps than tokens: proposals were kept.
    int64_t out = 0;
    for (const auto& [id, t] : got.tokens) out += static_cast<int64_t>(t.size());
    int64_t per_position = 0;
    for (int i = 0; i < kMaxSpeculativeTokens; ++i) {
      EXPECT_LE(s.speculation.accepted_at[i], s.speculation.proposed_at[i]);
      if (i >= k) EXPECT_EQ(s.speculation.proposed_at[i], 0);
      per_position += s.speculation.accepted_at[i];
    }
    EXPECT_EQ(per_position, s.speculation.counts.accepted);
  }
}

TEST_P(SpeculationTest, RejectedPositionsAreRolledBackOutOfThePoolAndThePrefixCache) {
  int64_t proposed = 0, accepted = 0;
  for (uint32_t prompt_seed : {9u, 10u, 11u}) {
    // One sequence that speculates in a pool that holds exactly its longest self. Its long random
    // prompt makes proposals that are often refused.
    EngineRequest r;
    r.id = "r";
    r.prompt_token_ids = Random(190, prompt_seed);
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = 30;
    auto e = MakeEngine(Options(55, 256, 0, SpeculationMethod::kNgram, 8));
    ASSERT_TRUE(e->AddRequest(r).ok());
    int64_t tokens = static_cast<int64_t>(r.prompt_token_ids.size());
    std::vector<int32_t> all = r.prompt_token_ids;
    while (e->HasWork()) {
      auto outs = e->Step();
      ASSERT_TRUE(outs.ok());
      for (const auto& o : *outs) {
        tokens += static_cast<int64_t>(o.new_token_ids.size());
        all.insert(all.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
      // After every step the request holds the blocks its tokens need and no more.
      if (!e->HasWork()) break;
      const int64_t held = e->stats().num_blocks - e->stats().free_blocks;
      EXPECT_LE(held, (tokens + 3) / 4);
      EXPECT_GE(held, (tokens + 2) / 4);
    }
    EXPECT_EQ(e->stats().free_blocks, 55);
    proposed += e->stats().speculation.counts.proposed;
    accepted += e->stats().speculation.counts.accepted;
    // The cache holds blocks of kept tokens only: a request whose prompt is the output so far
    // hits them and continues exactly as an engine without a cache does.
    EngineRequest again = r;
    again.id = "again";
    again.prompt_token_ids.assign(all.begin(), all.begin() + 209);
    again.params.max_tokens = 8;
    again.speculation = SpeculationMethod::kOff;
    ASSERT_TRUE(e->AddRequest(again).ok());
    const Run cached = RunAll(e.get());
    EXPECT_GE(e->stats().prefix_hits, 208);
    EngineOptions o = Options(64, 256, 0, SpeculationMethod::kOff, 4);
    o.enable_prefix_caching = false;
    auto fresh = MakeEngine(o);
    ASSERT_TRUE(fresh->AddRequest(again).ok());
    const Run uncached = RunAll(fresh.get());
    EXPECT_EQ(cached.tokens.at("again"), uncached.tokens.at("again"));
  }
  EXPECT_GT(proposed, accepted) << "the test needs refused proposals";
  EXPECT_GT(accepted, 0);
}

// Seeded draws of the second output token with speculation, against its exact distribution `p2`.
void SpeculationTest::ExpectDistributedAsTarget(SpeculationMethod method,
                                                const std::vector<int32_t>& prompt,
                                                float temperature, const std::vector<double>& p2) {
  const int64_t vocab = model_->config().vocab_size;
  constexpr int kDraws = 2000;
  // `n` seeded requests of 4 tokens, seeds 1000 onwards, run to the end.
  auto draws = [&](Engine* engine, int n) {
    for (int i = 0; i < n; ++i) {
      EngineRequest q;
      q.id = std::to_string(i);
      q.prompt_token_ids = prompt;
      q.params.temperature = temperature;
      q.params.ignore_eos = true;
      q.params.max_tokens = 4;
      q.params.seed = 1000 + i;
      EXPECT_TRUE(engine->AddRequest(q).ok());
    }
    return RunAll(engine);
  };
  auto e = MakeEngine(Options(2048, 8192, 0, method, 3));
  const Run got = draws(e.get(), kDraws);
  std::vector<double> counts(vocab, 0.0);
  for (const auto& [id, t] : got.tokens) {
    ASSERT_EQ(t.size(), 4u);
    counts[t[1]] += 1.0 / kDraws;
  }
  // Pearson's chi-square over the tokens expected at least 5 times, the rest pooled in one bin,
  // against the 0.1% critical value (Wilson-Hilferty).
  double chi2 = 0, rest_observed = 0, rest_expected = 0;
  int bins = 0;
  for (int64_t t = 0; t < vocab; ++t) {
    const double expected = p2[t] * kDraws, observed = counts[t] * kDraws;
    if (expected >= 5) {
      chi2 += (observed - expected) * (observed - expected) / expected;
      ++bins;
    } else {
      rest_observed += observed;
      rest_expected += expected;
    }
  }
  if (rest_expected > 0) {
    chi2 += (rest_observed - rest_expected) * (rest_observed - rest_expected) / rest_expected;
    ++bins;
  }
  const double df = bins - 1, z = 3.09;
  const double critical = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  const EngineStats s = e->stats();
  std::printf("chi-square %.1f over %d bins (0.1%% critical %.1f); %lld of %lld proposals kept\n",
              chi2, bins, critical, static_cast<long long>(s.speculation.counts.accepted),
              static_cast<long long>(s.speculation.counts.proposed));
  EXPECT_GT(s.speculation.counts.accepted, 50) << "proposals should be kept";
  EXPECT_GT(s.speculation.counts.proposed - s.speculation.counts.accepted, 10) << "and refused";
  EXPECT_LT(chi2, critical) << "the second token is not distributed as the target's";
  // Seeded: the same draws again give the same tokens.
  auto again = MakeEngine(Options(2048, 8192, 0, method, 3));
  const Run repeated = draws(again.get(), 50);
  for (const auto& [id, t] : repeated.tokens) EXPECT_EQ(t, got.tokens.at(id)) << id;
}

TEST_P(SpeculationTest, SampledOutputIsDistributedAsTheTargets) {
  // The prompt: a seed and its greedy continuation, which a sampled continuation at a low
  // temperature often repeats, so n-gram proposals are both kept and refused.
  auto plain = MakeEngine(Options(64, 512, 0, SpeculationMethod::kOff, 4));
  EngineRequest seed;
  seed.id = "seed";
  seed.prompt_token_ids = Repeating(3, 9, 21);
  seed.params.temperature = 0;
  seed.params.ignore_eos = true;
  seed.params.max_tokens = 12;
  ASSERT_TRUE(plain->AddRequest(seed).ok());
  std::vector<int32_t> prompt = seed.prompt_token_ids;
  const Run seeded = RunAll(plain.get());
  for (int32_t t : seeded.tokens.at("seed")) prompt.push_back(t);

  const int64_t vocab = model_->config().vocab_size;
  constexpr float kTemperature = 1.3f;
  // The target's exact distribution of the second output token: sum over the first of
  // p(first) · p(second | first), each from the model's full logprobs at this temperature.
  auto tempered = [&](const LogprobEntry& e) {
    std::vector<double> p(vocab, 0.0);
    double z = 0;
    for (const auto& t : e.top) z += p[t.token_id] = std::exp(t.logprob / kTemperature);
    for (auto& x : p) x /= z;
    return p;
  };
  auto full = MakeEngine(Options(2048, 8192, 0, SpeculationMethod::kOff, 4));
  EngineRequest first;
  first.id = "first";
  first.prompt_token_ids = prompt;
  first.params.max_tokens = 1;
  first.params.logprobs = static_cast<int32_t>(vocab);
  ASSERT_TRUE(full->AddRequest(first).ok()) << full->AddRequest(first);
  const Run firsts = RunAll(full.get());
  const std::vector<double> p1 = tempered(firsts.logprobs.at("first")[0]);
  std::vector<double> p2(vocab, 0.0);
  for (int32_t t1 = 0; t1 < vocab; ++t1) {
    if (p1[t1] < 1e-7) continue;
    EngineRequest q = first;
    q.id = std::to_string(t1);
    q.prompt_token_ids.push_back(t1);
    ASSERT_TRUE(full->AddRequest(q).ok());
  }
  const Run conditionals = RunAll(full.get());
  for (const auto& [id, lps] : conditionals.logprobs) {
    const std::vector<double> cond = tempered(lps[0]);
    for (int64_t t = 0; t < vocab; ++t) p2[t] += p1[std::stoi(id)] * cond[t];
  }

  for (SpeculationMethod method : {SpeculationMethod::kNgram, SpeculationMethod::kDraft}) {
    SCOPED_TRACE(std::string(SpeculationMethodName(method)));
    ExpectDistributedAsTarget(method, prompt, kTemperature, p2);
  }
}

TEST_P(SpeculationTest, BadSpeculationIsRefused) {
  auto e = MakeEngine(Options(64, 64, 0, SpeculationMethod::kNgram, 4));
  EngineRequest r;
  r.id = "x";
  r.prompt_token_ids = {1, 2, 3};
  r.num_speculative_tokens = 17;
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.num_speculative_tokens = -1;
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.num_speculative_tokens = 0;
  r.speculation = SpeculationMethod::kDraft;
  const absl::Status no_draft = e->AddRequest(r);
  EXPECT_EQ(no_draft.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_draft.message().find("--speculative-model"), std::string::npos) << no_draft;
  r.speculation = SpeculationMethod::kNgram;
  r.num_speculative_tokens = 16;
  EXPECT_TRUE(e->AddRequest(r).ok());

  EngineOptions o = Options(64, 64, 0, SpeculationMethod::kNgram, 0);
  EXPECT_EQ(Engine::Create(model_.get(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o.speculation.num_tokens = 4;
  o.speculation.ngram_min = 3;
  o.speculation.ngram_max = 2;
  EXPECT_EQ(Engine::Create(model_.get(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(64, 64, 0, SpeculationMethod::kDraft, 4);
  o.speculation.draft = nullptr;
  EXPECT_EQ(Engine::Create(model_.get(), o).status().code(), absl::StatusCode::kInvalidArgument);
  // A draft whose vocabulary differs from the target's.
  RandomModelOptions other;
  other.config = FindModelPreset(GetParam()).value().config;
  other.config.vocab_size += 8;
  other.out_dir = ::testing::TempDir() + "/tandem_other_vocab_" + GetParam();
  ASSERT_TRUE(WriteRandomModel(other).ok());
  auto wrong = LlamaModel::Load(other.out_dir, backend_.get()).value();
  o = Options(64, 64, 0, SpeculationMethod::kDraft, 4, wrong.get());
  const absl::Status refused = Engine::Create(model_.get(), o).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("vocabulary"), std::string::npos) << refused;
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, SpeculationTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

TEST(SpeculationPolicyTest, RowsAndAcceptanceDecideTheBudget) {
  SpeculationOptions o;
  o.step_rows = 10;
  SpeculationPolicy policy(o);
  SpecDecision d;
  // Rows: 4 decoding sequences leave 6 rows for proposals, taken in order.
  policy.BeginStep(4);
  SequenceSpeculation a, b, c;
  EXPECT_EQ(policy.Budget(&a, 4, &d), 4);
  EXPECT_EQ(d, SpecDecision::kFull);
  EXPECT_EQ(policy.Budget(&b, 4, &d), 2);
  EXPECT_EQ(d, SpecDecision::kShrunkBatch);
  EXPECT_EQ(policy.Budget(&c, 4, &d), 0);
  EXPECT_EQ(d, SpecDecision::kOffBatch);
  policy.BeginStep(10);
  EXPECT_EQ(policy.Budget(&a, 4, &d), 0);
  EXPECT_EQ(d, SpecDecision::kOffBatch);
  // Acceptance: the j-th token is kept with probability about a^j; none below kMinGain.
  policy.BeginStep(1);
  SequenceSpeculation half;
  half.acceptance = 0.5;  // 0.5^2 = 0.25 >= kMinGain, 0.5^3 is not
  EXPECT_EQ(policy.Budget(&half, 8, &d), 2);
  EXPECT_EQ(d, SpecDecision::kShrunkAcceptance);
  SequenceSpeculation low;
  for (int i = 0; i < 20; ++i) SpeculationPolicy::Record(&low, 4, 0);
  EXPECT_LT(low.acceptance, SpeculationPolicy::kMinGain);
  for (int step = 0; step <= SpeculationPolicy::kPauseSteps; ++step) {
    policy.BeginStep(1);
    EXPECT_EQ(policy.Budget(&low, 4, &d), 0) << step;
    EXPECT_EQ(d, SpecDecision::kOffAcceptance);
  }
  policy.BeginStep(1);
  EXPECT_EQ(policy.Budget(&low, 4, &d), 1) << "the pause over: one token probes";
  SpeculationPolicy::Record(&low, 1, 1);
  // Not adaptive: always what is wanted.
  o.adaptive = false;
  SpeculationPolicy fixed(o);
  fixed.BeginStep(100);
  EXPECT_EQ(fixed.Budget(&low, 7, &d), 7);
}

}  // namespace
}  // namespace tandem
