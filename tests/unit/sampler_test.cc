// SamplingParams validation and SequenceSampler semantics on small hand-made logits, with exact
// expected tokens; the filters checked empirically over seeded draws; determinism and statistics.
#include "common/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/sampling/sampling_params.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
// ModelRunner::kMaxSampleTopK, without linking the model library.
constexpr int32_t LlamaTopKLimit() { return 256; }

// ---------------------------------------------------------------------------------------------
// Validation

SamplingLimits TestLimits() {
  SamplingLimits limits;
  limits.vocab_size = 100;
  limits.max_model_len = 64;
  limits.prompt_len = 8;
  limits.max_logprobs = 20;
  return limits;
}

struct InvalidCase {
  std::string name;
  std::function<void(SamplingParams&)> mutate;
  std::vector<std::string> needles;  // all must appear in the message
};

TEST(SamplingParamsTest, DefaultsAreValid) {
  EXPECT_TRUE(SamplingParams{}.Validate(TestLimits()).ok());
}

TEST(SamplingParamsTest, EachBadValueIsInvalidArgumentNamingTheField) {
  const std::vector<InvalidCase> cases = {
      {"nan temperature", [](auto& p) { p.temperature = kNaN; }, {"temperature", "nan"}},
      {"inf temperature", [](auto& p) { p.temperature = kInf; }, {"temperature", "inf"}},
      {"negative temperature", [](auto& p) { p.temperature = -0.5f; }, {"temperature", "-0.5"}},
      {"top_k -2", [](auto& p) { p.top_k = -2; }, {"top_k", "-2"}},
      {"inf top_p", [](auto& p) { p.top_p = kInf; }, {"top_p", "inf"}},
      {"nan top_p", [](auto& p) { p.top_p = kNaN; }, {"top_p", "nan"}},
      {"top_p 0", [](auto& p) { p.top_p = 0.f; }, {"top_p", "(0, 1]", "got 0"}},
      {"top_p 1.5", [](auto& p) { p.top_p = 1.5f; }, {"top_p", "1.5"}},
      {"min_p 1.5", [](auto& p) { p.min_p = 1.5f; }, {"min_p", "1.5"}},
      {"min_p negative", [](auto& p) { p.min_p = -0.1f; }, {"min_p", "-0.1"}},
      {"nan min_p", [](auto& p) { p.min_p = kNaN; }, {"min_p", "nan"}},
      {"repetition_penalty 0",
       [](auto& p) { p.repetition_penalty = 0.f; },
       {"repetition_penalty", "> 0", "got 0"}},
      {"repetition_penalty negative",
       [](auto& p) { p.repetition_penalty = -1.f; },
       {"repetition_penalty", "-1"}},
      {"inf repetition_penalty",
       [](auto& p) { p.repetition_penalty = kInf; },
       {"repetition_penalty", "inf"}},
      {"nan repetition_penalty",
       [](auto& p) { p.repetition_penalty = kNaN; },
       {"repetition_penalty", "nan"}},
      {"presence 3", [](auto& p) { p.presence_penalty = 3.f; }, {"presence_penalty", "3"}},
      {"nan presence", [](auto& p) { p.presence_penalty = kNaN; }, {"presence_penalty", "nan"}},
      {"frequency -2.5",
       [](auto& p) { p.frequency_penalty = -2.5f; },
       {"frequency_penalty", "-2.5"}},
      {"inf frequency",
       [](auto& p) { p.frequency_penalty = -kInf; },
       {"frequency_penalty", "-inf"}},
      {"logit_bias id beyond vocab",
       [](auto& p) {
         p.logit_bias = {{5, 1.f}, {100, 1.f}};
       },
       {"logit_bias[1]", "100", "vocabulary"}},
      {"logit_bias negative id",
       [](auto& p) {
         p.logit_bias = {{-1, 1.f}};
       },
       {"logit_bias[0]", "-1", "vocabulary"}},
      {"logit_bias nan",
       [](auto& p) {
         p.logit_bias = {{5, kNaN}};
       },
       {"logit_bias[0]", "nan"}},
      {"logit_bias inf",
       [](auto& p) {
         p.logit_bias = {{5, kInf}};
       },
       {"logit_bias[0]", "inf"}},
      {"logit_bias 101",
       [](auto& p) {
         p.logit_bias = {{5, 101.f}};
       },
       {"logit_bias[0]", "[-100, 100]", "101"}},
      {"logit_bias 2000 entries",
       [](auto& p) {
         p.logit_bias.assign(2000, LogitBias{1, 0.5f});
       },
       {"logit_bias", "2000", "1024"}},
      {"logit_bias duplicate id",
       [](auto& p) {
         p.logit_bias = {{7, 1.f}, {3, 1.f}, {7, 2.f}};
       },
       {"logit_bias", "7", "more than once"}},
      {"stop id negative",
       [](auto& p) {
         p.stop_token_ids = {4, -1};
       },
       {"stop_token_ids[1]", "-1", "vocabulary"}},
      {"stop id beyond vocab",
       [](auto& p) { p.stop_token_ids = {100}; },
       {"stop_token_ids[0]", "100", "vocabulary"}},
      {"stop ids 1025 entries",
       [](auto& p) { p.stop_token_ids.assign(1025, 1); },
       {"stop_token_ids", "1025", "1024"}},
      {"max_tokens negative", [](auto& p) { p.max_tokens = -1; }, {"max_tokens", "-1"}},
      {"max_tokens beyond context",
       [](auto& p) { p.max_tokens = 57; },
       {"max_tokens (57)", "prompt (8 tokens)", "context of 64"}},
      {"min_tokens above max_tokens",
       [](auto& p) { p.min_tokens = 17; },
       {"min_tokens", "17", "max_tokens=16"}},
      {"min_tokens negative", [](auto& p) { p.min_tokens = -1; }, {"min_tokens", "-1"}},
      {"logprobs above cap", [](auto& p) { p.logprobs = 21; }, {"logprobs", "[0, 20]", "21"}},
      {"logprobs -2", [](auto& p) { p.logprobs = -2; }, {"logprobs", "-2"}},
      {"prompt_logprobs above cap",
       [](auto& p) { p.prompt_logprobs = 21; },
       {"prompt_logprobs", "21"}},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams p;
    c.mutate(p);
    const absl::Status s = p.Validate(TestLimits());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (const std::string& needle : c.needles) EXPECT_THAT(s.message(), HasSubstr(needle));
  }
}

TEST(SamplingParamsTest, MessagesArePrecise) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_EQ(p.Validate(TestLimits()).message(), "top_p must be a finite number in (0, 1], got 1.5");
  p = {};
  p.max_tokens = 57;
  EXPECT_EQ(p.Validate(TestLimits()).message(),
            "prompt (8 tokens) + max_tokens (57) exceeds the model's context of 64 tokens");
  p = {};
  p.logit_bias = {{100, 1.f}};
  EXPECT_EQ(p.Validate(TestLimits()).message(),
            "logit_bias[0]: token id 100 is outside the vocabulary [0, 100)");
}

TEST(SamplingParamsTest, BoundaryValuesAreValid) {
  const std::vector<std::pair<std::string, std::function<void(SamplingParams&)>>> cases = {
      {"temperature 0", [](auto& p) { p.temperature = 0.f; }},
      {"top_k -1 (off)", [](auto& p) { p.top_k = -1; }},
      {"top_k above vocab", [](auto& p) { p.top_k = 1000; }},
      {"top_p tiny", [](auto& p) { p.top_p = 1e-6f; }},
      {"min_p 1", [](auto& p) { p.min_p = 1.f; }},
      {"repetition_penalty small", [](auto& p) { p.repetition_penalty = 0.01f; }},
      {"penalties at the bounds",
       [](auto& p) {
         p.presence_penalty = -2.f;
         p.frequency_penalty = 2.f;
       }},
      {"bias bounds",
       [](auto& p) {
         p.logit_bias = {{0, -100.f}, {99, 100.f}};
       }},
      {"1024 stop ids", [](auto& p) { p.stop_token_ids.assign(1024, 99); }},
      {"max_tokens fills the context", [](auto& p) { p.max_tokens = 56; }},
      {"max_tokens 0",
       [](auto& p) {
         p.max_tokens = 0;
         p.min_tokens = 0;
       }},
      {"min_tokens = max_tokens", [](auto& p) { p.min_tokens = 16; }},
      {"logprobs at cap",
       [](auto& p) {
         p.logprobs = 20;
         p.prompt_logprobs = 0;
       }},
  };
  for (const auto& [name, mutate] : cases) {
    SCOPED_TRACE(name);
    SamplingParams p;
    mutate(p);
    EXPECT_TRUE(p.Validate(TestLimits()).ok()) << p.Validate(TestLimits());
  }
}

TEST(SamplingParamsTest, ListsOfUpTo1024EntriesAreValid) {
  SamplingLimits limits = TestLimits();
  limits.vocab_size = 2000;
  SamplingParams p;
  for (int32_t i = 0; i < 1024; ++i) p.logit_bias.push_back({i, -1.f});
  p.stop_token_ids.assign(1024, 1999);
  EXPECT_TRUE(p.Validate(limits).ok()) << p.Validate(limits);
  p.logit_bias.push_back({1500, 1.f});
  EXPECT_THAT(p.Validate(limits).message(), HasSubstr("logit_bias has 1025 entries"));
}

TEST(SamplingParamsTest, LogprobsCapIsTheCallersUpToTheVocabulary) {
  SamplingLimits limits = TestLimits();
  limits.max_logprobs = static_cast<int32_t>(limits.vocab_size);
  SamplingParams p;
  p.logprobs = 100;
  p.prompt_logprobs = 100;
  EXPECT_TRUE(p.Validate(limits).ok());
  limits.max_logprobs = 1000;  // never beyond the vocabulary
  p.logprobs = 101;
  EXPECT_THAT(p.Validate(limits).message(), HasSubstr("logprobs must be -1 (none) or in [0, 100]"));
}

// ---------------------------------------------------------------------------------------------
// Logits processors, seen through greedy choices

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.f;
  return p;
}

int32_t SampleOnce(const SamplingParams& p, const std::vector<float>& logits,
                   const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& eos = {}) {
  SequenceSampler s(p, prompt, static_cast<int64_t>(logits.size()), eos);
  return s.Sample(logits);
}

TEST(SequenceSamplerTest, GreedyPicksTheMaxLowestIdOnTies) {
  EXPECT_EQ(SampleOnce(Greedy(), {1.f, 3.f, 2.f}), 1);
  EXPECT_EQ(SampleOnce(Greedy(), {1.f, 3.f, 2.f, 3.f}), 1);
  EXPECT_EQ(SampleOnce(Greedy(), {-5.f, -4.f, -6.f}), 1);
  SamplingParams nearly_zero;
  nearly_zero.temperature = 5e-6f;  // below 1e-5: greedy
  EXPECT_TRUE(nearly_zero.greedy());
  for (uint64_t seed = 0; seed < 20; ++seed) {
    nearly_zero.seed = seed;
    EXPECT_EQ(SampleOnce(nearly_zero, {1.f, 1.001f, 0.9f}), 1);
  }
}

TEST(SequenceSamplerTest, NanLogitsAreNeverChosen) {
  EXPECT_EQ(SampleOnce(Greedy(), {kNaN, 1.f, 2.f}), 2);
  SamplingParams p;
  p.seed = 3;
  p.temperature = 1.f;
  SequenceSampler s(p, {}, 3, {});
  const std::vector<float> logits = {kNaN, 0.f, kNaN};
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(logits), 1);
}

TEST(SequenceSamplerTest, LogitBiasCanFlipTheArgmax) {
  const std::vector<float> logits = {1.f, 3.f, 2.f};
  SamplingParams p = Greedy();
  p.logit_bias = {{0, 2.5f}};  // 3.5 > 3
  EXPECT_EQ(SampleOnce(p, logits), 0);
  p.logit_bias = {{0, 1.5f}};  // 2.5 < 3
  EXPECT_EQ(SampleOnce(p, logits), 1);
  p.logit_bias = {{1, -100.f}};
  EXPECT_EQ(SampleOnce(p, logits), 2);
}

TEST(SequenceSamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 2.f;
  // Positive: 2.0 / 2 = 1.0 < 1.5. (Multiplying would keep token 0 on top.)
  EXPECT_EQ(SampleOnce(p, {2.f, 1.5f, 0.f}, /*prompt=*/{0}), 1);
  EXPECT_EQ(SampleOnce(p, {2.f, 1.5f, 0.f}, /*prompt=*/{2}), 0);
  // Negative: -1.0 × 2 = -2.0 < -1.5. (Dividing would give -0.5 and keep token 0 on top.)
  EXPECT_EQ(SampleOnce(p, {-1.f, -1.5f, -3.f}, /*prompt=*/{0}), 1);
  // A penalty below 1 rewards repetition: 1.0 / 0.5 = 2.0 > 1.5.
  p.repetition_penalty = 0.5f;
  EXPECT_EQ(SampleOnce(p, {1.f, 1.5f, 0.f}, /*prompt=*/{0}), 0);
  // Generated tokens count too, and each token is penalised once however often it occurs.
  p.repetition_penalty = 1.5f;
  SequenceSampler s(p, /*prompt=*/{}, 3, {});
  const std::vector<float> close = {2.f, 1.4f, 0.f};
  const std::vector<float> far = {2.f, 1.2f, 0.f};
  EXPECT_EQ(s.Sample(close), 0);
  s.Accept(0);
  s.Accept(0);
  s.Accept(0);
  EXPECT_EQ(s.Sample(close), 1);  // 2 / 1.5 = 1.33 < 1.4
  EXPECT_EQ(s.Sample(far), 0);    // 1.33 > 1.2 (three divisions would give 0.59)
}

TEST(SequenceSamplerTest, PresenceAndFrequencyPenaltiesApplyToGeneratedTokensOnly) {
  const std::vector<float> logits = {2.f, 1.5f, 0.f};
  SamplingParams p = Greedy();
  p.presence_penalty = 0.6f;
  {
    const std::vector<int32_t> prompt = {0, 0, 0};
    SequenceSampler s(p, prompt, 3, {});
    EXPECT_EQ(s.Sample(logits), 0);  // the prompt does not count
    s.Accept(0);
    EXPECT_EQ(s.Sample(logits), 1);  // 2.0 - 0.6 = 1.4 < 1.5
  }
  p.presence_penalty = 0.4f;
  {
    SequenceSampler s(p, {}, 3, {});
    s.Accept(0);
    s.Accept(0);
    s.Accept(0);
    EXPECT_EQ(s.Sample(logits), 0);  // presence counts once: 1.6 > 1.5
  }
  p.presence_penalty = 0.f;
  p.frequency_penalty = 0.3f;
  {
    SequenceSampler s(p, {}, 3, {});
    s.Accept(0);
    EXPECT_EQ(s.Sample(logits), 0);  // 2.0 - 0.3 = 1.7
    s.Accept(0);
    EXPECT_EQ(s.Sample(logits), 1);  // 2.0 - 0.6 = 1.4
    s.Accept(1);
    EXPECT_EQ(s.Sample(logits), 0);  // 1.4 vs 1.5 - 0.3 = 1.2
  }
  p.frequency_penalty = 0.f;
  p.presence_penalty = -1.f;  // negative values encourage repetition
  {
    SequenceSampler s(p, {}, 3, {});
    const std::vector<float> logits2 = {0.f, 0.5f, -0.4f};
    EXPECT_EQ(s.Sample(logits2), 1);
    s.Accept(2);
    EXPECT_EQ(s.Sample(logits2), 2);  // -0.4 + 1 = 0.6 > 0.5
  }
}

TEST(SequenceSamplerTest, MinTokensMasksEosAndStopIdsUntilReached) {
  constexpr int32_t kEos = 3;
  const std::vector<float> logits = {0.f, 1.f, 0.5f, 5.f};  // EOS is the favourite
  SamplingParams p = Greedy();
  p.min_tokens = 2;
  SequenceSampler s(p, {}, 4, {kEos});
  EXPECT_EQ(s.Sample(logits), 1);
  EXPECT_FALSE(s.IsStop(kEos, 1));
  s.Accept(1);
  EXPECT_EQ(s.Sample(logits), 1);
  s.Accept(1);
  EXPECT_EQ(s.Sample(logits), kEos);
  EXPECT_TRUE(s.IsStop(kEos, 2));
  EXPECT_FALSE(s.IsStop(1, 3));

  // Stop ids are masked too.
  p.stop_token_ids = {1};
  p.min_tokens = 1;
  SequenceSampler t(p, {}, 4, {kEos});
  const std::vector<float> stop_favoured = {0.f, 5.f, 1.f, 6.f};
  EXPECT_EQ(t.Sample(stop_favoured), 2);
  EXPECT_FALSE(t.IsStop(1, 0));
  t.Accept(2);
  EXPECT_EQ(t.Sample(stop_favoured), kEos);
  EXPECT_TRUE(t.IsStop(1, 1));

  // Also when sampling: EOS never appears before min_tokens.
  SamplingParams hot;
  hot.seed = 5;
  hot.min_tokens = 1;
  SequenceSampler u(hot, {}, 4, {kEos});
  for (int i = 0; i < 500; ++i) EXPECT_NE(u.Sample(logits), kEos);
}

TEST(SequenceSamplerTest, IgnoreEosNeitherMasksNorStops) {
  constexpr int32_t kEos = 3;
  SamplingParams p = Greedy();
  p.min_tokens = 4;
  p.ignore_eos = true;
  p.stop_token_ids = {2};
  SequenceSampler s(p, {}, 4, {kEos});
  const std::vector<float> eos_favoured = {0.f, 1.f, 0.5f, 5.f};
  const std::vector<float> stop_favoured = {0.f, 1.f, 9.f, 5.f};
  EXPECT_EQ(s.Sample(eos_favoured), kEos);
  EXPECT_EQ(s.Sample(stop_favoured), kEos);  // the stop id is still masked
  EXPECT_FALSE(s.IsStop(kEos, 10));
  EXPECT_FALSE(s.IsStop(2, 3));
  EXPECT_TRUE(s.IsStop(2, 4));

  SamplingParams q = Greedy();
  SequenceSampler t(q, {}, 4, {kEos, 77 /* outside the vocabulary: ignored */});
  EXPECT_TRUE(t.IsStop(kEos, 1));
  EXPECT_FALSE(t.IsStop(2, 1));
  EXPECT_FALSE(t.IsStop(77, 1));
}

// ---------------------------------------------------------------------------------------------
// Filters, checked over many seeded draws

std::vector<float> LogProbs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Frequencies of each token over `n` draws (no Accept, so the state never changes).
std::vector<double> Frequencies(const SamplingParams& p, const std::vector<float>& logits, int n) {
  SequenceSampler s(p, {}, static_cast<int64_t>(logits.size()), {});
  std::vector<int> counts(logits.size());
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits)];
  std::vector<double> freq;
  for (int c : counts) freq.push_back(static_cast<double>(c) / n);
  return freq;
}

std::vector<float> RandomLogits(int64_t vocab, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

// Token ids most likely first, NaN as -inf, equal logits by id (a plain sort:
// DeviceSampler::TopKRows' order).
std::vector<int32_t> LikelihoodOrder(const std::vector<float>& row) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t t) { return std::isnan(row[t]) ? -kInf : row[t]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key(a) > key(b); });
  return order;
}

// A row of quantised logits (many ties: multiples of `scale` from `offset`), one NaN and one -inf.
std::vector<float> QuantisedRow(std::mt19937& rng, int64_t vocab, float scale, float offset) {
  std::vector<float> row(static_cast<size_t>(vocab));
  for (auto& x : row) x = static_cast<float>(static_cast<int>(rng() % 40)) * scale + offset;
  row[rng() % vocab] = kNaN;
  row[rng() % vocab] = -kInf;
  return row;
}

TEST(SequenceSamplerTest, TopKOneEqualsGreedy) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  for (uint64_t i = 0; i < 30; ++i) {
    const std::vector<float> logits = RandomLogits(1000, 1.f, i);
    p.seed = i;
    EXPECT_EQ(SampleOnce(p, logits), SampleOnce(Greedy(), logits));
  }
}

TEST(SequenceSamplerTest, TopKKeepsTheKMostLikely) {
  SamplingParams p;
  p.seed = 1;
  p.top_k = 2;
  const std::vector<double> f = Frequencies(p, LogProbs({0.2, 0.4, 0.1, 0.3}), 4000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_NEAR(f[1], 0.4 / 0.7, 0.03);
  EXPECT_NEAR(f[3], 0.3 / 0.7, 0.03);
}

TEST(SequenceSamplerTest, TinyTopPKeepsOnlyTheMax) {
  SamplingParams p;
  p.seed = 2;
  p.top_p = 1e-6f;
  const std::vector<double> f = Frequencies(p, {1.f, 1.2f, 0.9f, 1.19f}, 2000);
  EXPECT_EQ(f[1], 1.0);
}

TEST(SequenceSamplerTest, TopPKeepsTheSmallestSetReachingTheMass) {
  SamplingParams p;
  p.seed = 3;
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8: tokens 0 and 1
  std::vector<double> f = Frequencies(p, LogProbs({0.5, 0.3, 0.15, 0.05}), 4000);
  EXPECT_EQ(f[2] + f[3], 0.0);
  EXPECT_NEAR(f[0], 0.625, 0.03);
  p.top_p = 0.85f;  // 0.8 < 0.85 <= 0.95: tokens 0, 1, 2
  f = Frequencies(p, LogProbs({0.05, 0.15, 0.3, 0.5}), 4000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_GT(f[1], 0.1);
}

TEST(SequenceSamplerTest, MinPKeepsOnlyNearMaxTokens) {
  SamplingParams p;
  p.seed = 4;
  p.min_p = 0.4f;  // threshold 0.4 × 0.5 = 0.2: tokens 0 (0.5) and 1 (0.3)
  const std::vector<double> f = Frequencies(p, LogProbs({0.5, 0.3, 0.15, 0.05}), 5000);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_EQ(f[3], 0.0);
  EXPECT_NEAR(f[0], 0.625, 0.03);
  p.min_p = 1.f;  // only the max
  EXPECT_EQ(Frequencies(p, LogProbs({0.3, 0.5, 0.2}), 500)[1], 1.0);
}

TEST(SequenceSamplerTest, FiltersCombineOnALargeVocabulary) {
  constexpr int64_t kVocab = 150000;
  const std::vector<float> logits = RandomLogits(kVocab, 3.f, 99);
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  // Nucleus of mass 0.9 at temperature 0.8, computed in double over the full sort; a token at the
  // boundary may go either way under float rounding.
  const double t = 0.8;
  std::vector<double> probs(kVocab);
  double z = 0;
  for (int64_t i = 0; i < kVocab; ++i) z += probs[i] = std::exp((logits[i] - logits[order[0]]) / t);
  std::set<int32_t> nucleus;
  double before = 0;
  for (int32_t id : order) {
    if (before / z >= 0.9 + 1e-4) break;
    nucleus.insert(id);
    before += probs[id];
  }
  ASSERT_GT(nucleus.size(), 256u);  // beyond the first chunk the sampler sorts

  SamplingParams p;
  p.seed = 7;
  p.temperature = static_cast<float>(t);
  p.top_p = 0.9f;
  SequenceSampler s(p, {}, kVocab, {});
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) {
    const int32_t token = s.Sample(logits);
    EXPECT_TRUE(nucleus.count(token)) << token;
    seen.insert(token);
  }
  EXPECT_GT(seen.size(), 10u);

  p.top_k = 40;
  const std::set<int32_t> top40(order.begin(), order.begin() + 40);
  SequenceSampler k(p, {}, kVocab, {});
  for (int i = 0; i < 300; ++i) EXPECT_TRUE(top40.count(k.Sample(logits)));

  p.top_k = 0;
  p.top_p = 1.f;
  p.min_p = 0.2f;  // logit within 0.8 × ln(5) of the max
  SequenceSampler m(p, {}, kVocab, {});
  for (int i = 0; i < 300; ++i) {
    const int32_t token = m.Sample(logits);
    EXPECT_GE(std::exp((logits[token] - logits[order[0]]) / t), 0.2 - 1e-6) << token;
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism and statistics

std::vector<int32_t> Draw(SequenceSampler& s, int n, uint64_t logits_seed) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) {
    const int32_t token = s.Sample(RandomLogits(50, 1.f, logits_seed + i));
    s.Accept(token);
    tokens.push_back(token);
  }
  return tokens;
}

SamplingParams Seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  p.temperature = 1.2f;
  p.top_p = 0.95f;
  p.frequency_penalty = 0.1f;
  return p;
}

// Sampling from the row's top-k candidates alone (as a GPU selects them) gives the same tokens, and
// the same draws, as sampling the whole row: over vocabularies, k, top-p, min-p and temperatures,
// on rows with tied logits, NaN and -inf. The candidates come from a plain sort here, not from the
// sampler's own selection.
TEST(SequenceSamplerTest, SampleFromTopKMatchesTheWholeRow) {
  std::mt19937 rng(5);
  int configs = 0;
  for (int64_t vocab : {50, 300, 5000}) {
    for (int32_t k : {2, 5, 40, 256}) {
      if (k >= vocab) continue;
      for (float top_p : {1.f, 0.9f, 0.3f}) {
        for (float min_p : {0.f, 0.05f}) {
          for (float temperature : {0.5f, 1.f, 1.7f}) {
            SamplingParams p;
            p.seed = 1000 + configs++;
            p.temperature = temperature;
            p.top_k = k;
            p.top_p = top_p;
            p.min_p = min_p;
            SequenceSampler whole(p, {}, vocab, {});
            SequenceSampler from_top(p, {}, vocab, {});
            SamplingWorkspace ws;
            ASSERT_EQ(from_top.DevicePlan(LlamaTopKLimit()).kind, DeviceSamplingPlan::Kind::kTopK);
            ASSERT_EQ(from_top.DevicePlan(LlamaTopKLimit()).k, k);
            for (int step = 0; step < 20; ++step) {
              const std::vector<float> row = QuantisedRow(rng, vocab, 0.25f, -5.f);
              auto key = [&](int32_t t) { return std::isnan(row[t]) ? -kInf : row[t]; };
              const std::vector<int32_t> order = LikelihoodOrder(row);
              const size_t width =
                  std::min<size_t>(256, order.size());  // more than k, as a batch's widest row
              std::vector<int32_t> ids(order.begin(), order.begin() + width);
              std::vector<float> values;
              for (int32_t t : ids) values.push_back(key(t));
              const int32_t want = whole.Sample(row);
              const int32_t got = from_top.SampleFromTopK(ids, values, ws);
              ASSERT_EQ(got, want)
                  << "vocab " << vocab << " k " << k << " top_p " << top_p << " min_p " << min_p
                  << " temperature " << temperature << " step " << step;
              whole.Accept(want);
              from_top.Accept(got);
            }
          }
        }
      }
    }
  }
  // The plans of other steps.
  using Kind = DeviceSamplingPlan::Kind;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.top_k = 5;
  EXPECT_EQ(SequenceSampler(greedy, {}, 100, {}).DevicePlan(256).kind, Kind::kArgmax);
  SamplingParams no_k;
  no_k.temperature = 1;
  EXPECT_EQ(SequenceSampler(no_k, {}, 100, {}).DevicePlan(256).kind, Kind::kDraw);
  SamplingParams wide = no_k;
  wide.top_k = 300;
  EXPECT_EQ(SequenceSampler(wide, {}, 1000, {}).DevicePlan(256).kind, Kind::kHost);
  wide.top_k = 1000;  // the whole vocabulary: top-k off
  EXPECT_EQ(SequenceSampler(wide, {}, 1000, {}).DevicePlan(256).kind, Kind::kDraw);
  SamplingParams nucleus = no_k;
  nucleus.top_p = 0.9f;
  EXPECT_EQ(SequenceSampler(nucleus, {}, 1000, {}).DevicePlan(256).kind, Kind::kNucleus);
  EXPECT_EQ(SequenceSampler(nucleus, {}, 1000, {}).DevicePlan(256).k, 256);
  EXPECT_EQ(SequenceSampler(nucleus, {}, 100, {}).DevicePlan(256).k, 100);
  SamplingParams penalised = no_k;
  penalised.top_k = 5;
  penalised.repetition_penalty = 1.3f;
  const DeviceSamplingPlan p =
      SequenceSampler(penalised, std::vector<int32_t>{1, 2}, 100, {}).DevicePlan(256);
  EXPECT_EQ(p.kind, Kind::kTopK);
  EXPECT_TRUE(p.edits);
  EXPECT_FALSE(SequenceSampler(no_k, {}, 100, {}).DevicePlan(256).edits);
}

// A step's logits processors as LogitEdits, applied to the raw row, give bit for bit the row a
// plain implementation of vLLM's processors gives (min_tokens, bias, repetition, presence and
// frequency, in that order); sampling from it (SampleProcessed) gives Sample()'s token and draw.
TEST(SequenceSamplerTest, LogitEditsReproduceTheProcessors) {
  std::mt19937 rng(11);
  constexpr int64_t kVocab = 400;
  for (int config = 0; config < 24; ++config) {
    SamplingParams p;
    p.seed = 300 + config;
    p.temperature = config % 4 == 0 ? 0.f : 0.8f;
    p.top_k = config % 3 == 0 ? 20 : 0;
    p.top_p = config % 5 == 0 ? 0.7f : 1.f;
    p.repetition_penalty = config % 2 == 0 ? 1.4f : (config % 3 == 1 ? 0.8f : 1.f);
    p.presence_penalty = config % 3 == 2 ? 0.6f : 0.f;
    p.frequency_penalty = config % 4 == 1 ? -0.9f : 0.f;
    p.min_tokens = config % 5 == 3 ? 3 : 0;
    p.ignore_eos = config % 7 == 0;
    p.stop_token_ids = {9, 11};
    p.max_tokens = 12;
    if (config % 2 == 1) p.logit_bias = {{3, 5.f}, {9, -1.5f}, {17, 0.25f}};
    std::vector<int32_t> prompt;
    for (int i = 0; i < 30; ++i) prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    const std::vector<int32_t> eos = {2, 9};
    SequenceSampler whole(p, prompt, kVocab, eos), edited(p, prompt, kVocab, eos);
    std::set<int32_t> seen(prompt.begin(), prompt.end());
    std::map<int32_t, int> counts;
    SamplingWorkspace ws;
    for (int step = 0; step < 12; ++step) {
      std::vector<float> row(kVocab);
      for (auto& x : row) x = static_cast<float>(static_cast<int>(rng() % 64)) * 0.125f - 4.f;
      row[rng() % kVocab] = kNaN;
      // The reference: vLLM's processors in order, over a copy with NaN as -inf.
      std::vector<float> want = row;
      for (auto& x : want) x = std::isnan(x) ? -kInf : x;
      if (step < p.min_tokens) {
        if (!p.ignore_eos) want[2] = want[9] = -kInf;
        want[9] = want[11] = -kInf;
      }
      for (const LogitBias& b : p.logit_bias) want[b.token_id] += b.bias;
      if (p.repetition_penalty != 1.f) {
        for (int32_t t : seen)
          want[t] = want[t] > 0 ? want[t] / p.repetition_penalty : want[t] * p.repetition_penalty;
      }
      for (const auto& [t, c] : counts) {
        want[t] -= p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;
      }
      std::vector<LogitEdit> edits;
      edited.AppendLogitEdits(/*row=*/3, &edits);
      std::set<int32_t> tokens;
      std::vector<float> got = row;
      for (const LogitEdit& e : edits) {
        ASSERT_EQ(e.row, 3);
        ASSERT_TRUE(tokens.insert(e.token).second) << "two edits of token " << e.token;
        got[e.token] = ApplyLogitEdit(got[e.token], e);
      }
      EXPECT_EQ(edited.DevicePlan(256).edits, !edits.empty());
      for (int64_t t = 0; t < kVocab; ++t) {
        if (std::isnan(row[t]) && !tokens.count(static_cast<int32_t>(t)))
          continue;  // an unedited NaN stays NaN
        ASSERT_EQ(std::bit_cast<uint32_t>(got[t]), std::bit_cast<uint32_t>(want[t]))
            << "config " << config << " step " << step << " token " << t << ": " << got[t] << " vs "
            << want[t];
      }
      const int32_t token = whole.Sample(row, ws);
      ASSERT_EQ(edited.SampleProcessed(got, ws), token) << "config " << config << " step " << step;
      whole.Accept(token);
      edited.Accept(token);
      seen.insert(token);
      ++counts[token];
    }
  }
}

// Rows that sample over the whole vocabulary (temperature, min-p): the device's draw, as
// DrawFromRow defines it with the uniform DrawForDevice takes, is Sample()'s token, step after
// step.
TEST(SequenceSamplerTest, DrawFromRowIsTheWholeRowSample) {
  std::mt19937 rng(21);
  for (float min_p : {0.f, 0.02f, 0.3f}) {
    for (float temperature : {0.4f, 1.f, 2.5f}) {
      SamplingParams p;
      p.seed = 77;
      p.temperature = temperature;
      p.min_p = min_p;
      p.repetition_penalty = 1.2f;
      constexpr int64_t kVocab = 3000;
      SequenceSampler whole(p, {}, kVocab, {}), device(p, {}, kVocab, {});
      ASSERT_EQ(device.DevicePlan(256).kind, DeviceSamplingPlan::Kind::kDraw);
      std::vector<float> weights(kVocab);
      for (int step = 0; step < 30; ++step) {
        std::vector<float> row = RandomLogits(kVocab, 2.f, rng());
        row[rng() % kVocab] = kNaN;
        if (step == 7)
          std::fill(row.begin(), row.end(), -kInf);  // nothing to weigh: the argmax (0)
        const int32_t want = whole.Sample(row);
        std::vector<LogitEdit> edits;
        device.AppendLogitEdits(0, &edits);
        for (const LogitEdit& e : edits) row[e.token] = ApplyLogitEdit(row[e.token], e);
        const int32_t got = DrawFromRow(row.data(), kVocab, device.inv_temperature(), min_p,
                                        device.DrawForDevice(), weights.data());
        ASSERT_EQ(got, want) << "min_p " << min_p << " temperature " << temperature << " step "
                             << step;
        whole.Accept(want);
        device.Accept(got);
      }
    }
  }
}

// Top-p without top-k from 256 candidates and the row's weight total (RowWeightTotal, as the device
// sums it): Sample()'s token and draw whenever the nucleus fits the candidates, and nothing drawn
// (nullopt) when it does not, on rows with ties, NaN and -inf, over narrow and wide nuclei.
TEST(SequenceSamplerTest, SampleFromNucleusMatchesTheWholeRow) {
  std::mt19937 rng(9);
  int from_candidates = 0, wider = 0;
  for (int64_t vocab : {300, 5000, 150000}) {
    for (float top_p : {0.3f, 0.9f, 0.99f}) {
      for (float min_p : {0.f, 0.05f}) {
        for (float temperature : {0.3f, 1.f, 1.7f}) {
          SamplingParams p;
          p.seed = 500 + from_candidates + wider;
          p.temperature = temperature;
          p.top_p = top_p;
          p.min_p = min_p;
          SequenceSampler whole(p, {}, vocab, {}), device(p, {}, vocab, {});
          const DeviceSamplingPlan plan = device.DevicePlan(LlamaTopKLimit());
          ASSERT_EQ(plan.kind, DeviceSamplingPlan::Kind::kNucleus);
          ASSERT_EQ(plan.k, std::min<int64_t>(vocab, LlamaTopKLimit()));
          SamplingWorkspace ws;
          for (int step = 0; step < 6; ++step) {
            // Ties, spread widely or narrowly.
            const std::vector<float> row =
                QuantisedRow(rng, vocab, step % 2 == 0 ? 0.5f : 0.05f, 0.f);
            const std::vector<int32_t> order = LikelihoodOrder(row);
            std::vector<int32_t> ids(order.begin(), order.begin() + plan.k);
            std::vector<float> values;
            for (int32_t t : ids)
              values.push_back(row[t]);  // NaN given as is: the sampler reads it as -inf
            const double total = RowWeightTotal(row.data(), vocab, device.inv_temperature());
            const int32_t want = whole.Sample(row);
            std::optional<int32_t> got = device.SampleFromNucleus(ids, values, total, ws);
            if (got.has_value()) {
              ++from_candidates;
            } else {
              ++wider;
              got = device.SampleProcessed(row, ws);  // the step's row after all
            }
            ASSERT_EQ(*got, want) << "vocab " << vocab << " top_p " << top_p << " min_p " << min_p
                                  << " temperature " << temperature << " step " << step;
            whole.Accept(want);
            device.Accept(*got);
          }
        }
      }
    }
  }
  EXPECT_GT(from_candidates, 50);
  EXPECT_GT(wider, 50);
}

TEST(SequenceSamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SequenceSampler a(Seeded(42), {}, 50, {});
  SequenceSampler b(Seeded(42), {}, 50, {});
  SequenceSampler c(Seeded(43), {}, 50, {});
  const std::vector<int32_t> ta = Draw(a, 100, 0);
  EXPECT_EQ(ta, Draw(b, 100, 0));
  EXPECT_NE(ta, Draw(c, 100, 0));
  // Unseeded samplers draw their seeds at random.
  SamplingParams unseeded = Seeded(0);
  unseeded.seed.reset();
  SequenceSampler d(unseeded, {}, 50, {});
  SequenceSampler e(unseeded, {}, 50, {});
  EXPECT_NE(Draw(d, 100, 0), Draw(e, 100, 0));
}

TEST(SequenceSamplerTest, TokensDoNotDependOnTheRestOfTheBatch) {
  SequenceSampler alone(Seeded(42), {}, 50, {});
  const std::vector<int32_t> expected = Draw(alone, 100, 0);

  // The same request in a batch with two others, sampled in a varying order, sharing a workspace.
  SequenceSampler mine(Seeded(42), {}, 50, {});
  SequenceSampler other(Seeded(42), {}, 50, {});  // same seed, different logits
  SequenceSampler unseeded(
      [] {
        SamplingParams p;
        p.temperature = 0.7f;
        return p;
      }(),
      {}, 50, {});
  SamplingWorkspace workspace;
  std::vector<int32_t> got;
  for (int i = 0; i < 100; ++i) {
    const std::vector<float> logits = RandomLogits(50, 1.f, i);
    const std::vector<float> noise = RandomLogits(50, 1.f, 1000 + i);
    if (i % 2) other.Accept(other.Sample(noise, workspace));
    const int32_t token = mine.Sample(logits, workspace);
    mine.Accept(token);
    got.push_back(token);
    unseeded.Accept(unseeded.Sample(noise, workspace));
  }
  EXPECT_EQ(got, expected);
}

TEST(SequenceSamplerTest, FrequenciesMatchTheDistribution) {
  SamplingParams p;
  p.seed = 12345;
  const std::vector<double> f = Frequencies(p, LogProbs({0.5, 0.3, 0.2}), 20000);
  EXPECT_NEAR(f[0], 0.5, 0.02);
  EXPECT_NEAR(f[1], 0.3, 0.02);
  EXPECT_NEAR(f[2], 0.2, 0.02);
  // Temperature 2 flattens to p^(1/2), renormalised.
  p.temperature = 2.f;
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  const std::vector<double> g = Frequencies(p, LogProbs({0.5, 0.3, 0.2}), 20000);
  EXPECT_NEAR(g[0], std::sqrt(0.5) / z, 0.02);
  EXPECT_NEAR(g[1], std::sqrt(0.3) / z, 0.02);
  EXPECT_NEAR(g[2], std::sqrt(0.2) / z, 0.02);
}

TEST(SequenceSamplerTest, DistributionIsWhatSampleDrawsFrom) {
  // The probabilities speculative decoding verifies against (Distribution) against the frequencies
  // of Sample's draws, with each filter and processor on; the support must match exactly.
  constexpr int64_t kVocab = 40;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> logits(kVocab);
  for (float& l : logits) l = normal(rng);
  const std::vector<int32_t> prompt = {3, 4, 5};
  std::vector<SamplingParams> cases(6);
  cases[0].temperature = 0.8f;
  cases[1].top_k = 7;
  cases[2].top_p = 0.7f;
  cases[3].min_p = 0.1f, cases[3].temperature = 1.5f;
  cases[4].repetition_penalty = 1.5f, cases[4].presence_penalty = 0.5f,
  cases[4].logit_bias = {{9, 3.f}}, cases[4].top_k = 12, cases[4].top_p = 0.9f;
  cases[5].temperature = 0.f, cases[5].frequency_penalty = 1.f;
  for (size_t c = 0; c < cases.size(); ++c) {
    SamplingParams params = cases[c];
    params.seed = 5;
    SequenceSampler sampler(params, prompt, kVocab, {});
    for (int32_t t : {1, 1, 2}) sampler.Accept(t);  // penalties see generated tokens
    std::vector<float> probs;
    SamplingWorkspace ws;
    sampler.Distribution(logits, ws, &probs);
    ASSERT_EQ(probs.size(), static_cast<size_t>(kVocab));
    EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-5) << c;
    constexpr int kDraws = 40000;
    std::vector<double> freq(kVocab, 0.0);
    for (int i = 0; i < kDraws; ++i) freq[sampler.Sample(logits)] += 1.0 / kDraws;
    double tv = 0;
    for (int64_t t = 0; t < kVocab; ++t) {
      if (freq[t] > 0) EXPECT_GT(probs[t], 0.f) << "case " << c << " drew " << t;
      tv += 0.5 * std::abs(freq[t] - probs[t]);
    }
    EXPECT_LT(tv, 0.02) << "case " << c;
  }
}

TEST(SequenceSamplerTest, InputLogitsAreNotModified) {
  SamplingParams p;
  p.seed = 9;
  p.top_k = 10;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{3, 5.f}, {4, -5.f}};
  p.min_tokens = 5;
  p.stop_token_ids = {7};
  for (float temperature : {1.f, 0.f}) {
    p.temperature = temperature;
    const std::vector<int32_t> prompt = {1, 2, 3};
    SequenceSampler s(p, prompt, 50, /*eos=*/{0});
    std::vector<float> logits = RandomLogits(50, 2.f, 5);
    logits[11] = kNaN;
    const std::vector<float> original = logits;
    for (int i = 0; i < 10; ++i) {
      s.Accept(s.Sample(logits));
      ASSERT_EQ(std::memcmp(logits.data(), original.data(), logits.size() * sizeof(float)), 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Logprobs (raw model distribution)

TEST(ComputeLogprobsTest, RanksAndTopEntries) {
  const std::vector<float> logits = {1.f, 3.f, 2.f, 3.f};
  const LogprobEntry e = ComputeLogprobs(logits.data(), 4, 3, 2);
  double z = 0;
  for (float x : logits) z += std::exp(x);
  EXPECT_EQ(e.token_id, 3);
  EXPECT_EQ(e.rank, 2);  // tied with token 1, which ranks first
  EXPECT_NEAR(e.logprob, 3.0 - std::log(z), 1e-6);
  ASSERT_EQ(e.top.size(), 2u);
  EXPECT_EQ(e.top[0].token_id, 1);
  EXPECT_EQ(e.top[1].token_id, 3);
  EXPECT_EQ(ComputeLogprobs(logits.data(), 4, 0, 0).rank, 4);
  EXPECT_TRUE(ComputeLogprobs(logits.data(), 4, 0, 0).top.empty());
  EXPECT_EQ(ComputeLogprobs(logits.data(), 4, 0, 10).top.size(), 4u);
}

}  // namespace
}  // namespace tandem
