// Verification of proposed tokens: greedy keeps the longest prefix of the target's own choices;
// rejection sampling gives tokens distributed exactly as the target's (a statistical test with the
// power to refuse a wrong acceptance rule, shown on one).
#include "common/spec/verify.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(VerifyGreedyTest, KeepsTheLongestPrefixOfTheTargetsChoicesThenAddsItsNext) {
  // proposed 5 7 9 against the target's 5 7 8 | 4: two kept, then the target's 8.
  Verdict v = VerifyGreedy({5, 7, 9}, {5, 7, 8, 4}).value();
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next_token, 8);
  // All kept: the bonus token after them.
  v = VerifyGreedy({5, 7, 8}, {5, 7, 8, 4}).value();
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next_token, 4);
  // The first refused: one step of plain decoding.
  v = VerifyGreedy({1, 7}, {5, 7, 8}).value();
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next_token, 5);
  EXPECT_EQ(VerifyGreedy({1, 2}, {1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Target and draft distributions over a vocabulary of 5, two proposed positions; the target's rows
// do not depend on the tokens before them (a toy: only the rule is under test).
const std::vector<float> kTarget = {0.40f, 0.25f, 0.20f, 0.10f, 0.05f,   // after the sequence
                                    0.05f, 0.15f, 0.30f, 0.30f, 0.20f,   // after proposed[0]
                                    0.20f, 0.20f, 0.20f, 0.20f, 0.20f};  // after proposed[0..1]
const std::vector<float> kDraft = {0.10f, 0.50f, 0.10f, 0.25f, 0.05f,
                                   0.30f, 0.30f, 0.10f, 0.10f, 0.20f};
constexpr int64_t kVocab = 5;

int32_t Draw(const float* row, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double x = u(rng), sum = 0.0;
  for (int32_t i = 0; i < kVocab; ++i) {
    sum += row[i];
    if (x < sum) return i;
  }
  return kVocab - 1;
}

// Total variation distance between the empirical distribution of `counts` and `p`.
double TotalVariation(const std::vector<int64_t>& counts, const float* p) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  double tv = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) tv += std::fabs(double(counts[i]) / n - p[i]);
  return tv / 2;
}

// The first two output tokens of many verification steps, proposals drawn from the draft (or made
// without one): the first is distributed as target row 0, the second (when the first was kept) as
// row 1. `rule` verifies; the returned pair is the two distances.
template <typename Rule>
std::pair<double, double> Distances(bool with_draft, Rule rule) {
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> first(kVocab), second(kVocab);
  const std::vector<float> draft = with_draft ? kDraft : std::vector<float>{};
  for (int trial = 0; trial < 200000; ++trial) {
    std::vector<int32_t> proposed(2);
    for (int i = 0; i < 2; ++i) {
      // Without a draft, a fixed guess (an n-gram proposer's): token 1, then token 3.
      proposed[i] = with_draft ? Draw(kDraft.data() + i * kVocab, rng) : (i == 0 ? 1 : 3);
    }
    const Verdict v = rule(proposed, draft, [&] { return u(rng); });
    std::vector<int32_t> out(proposed.begin(), proposed.begin() + v.accepted);
    out.push_back(v.next_token);
    ++first[out[0]];
    if (out.size() >= 2) ++second[out[1]];
  }
  return {TotalVariation(first, kTarget.data()), TotalVariation(second, kTarget.data() + kVocab)};
}

// 200,000 draws of 5 outcomes: the empirical TV distance of a correct sampler stays near
// sqrt(5 / (2π · 200000)) ≈ 0.002; 0.01 is far beyond chance and far below what a wrong rule gives.
constexpr double kBound = 0.01;

TEST(VerifySampledTest, OutputsAreDistributedAsTheTargets) {
  for (bool with_draft : {true, false}) {
    const auto [d0, d1] = Distances(with_draft, [](auto& proposed, auto& draft, auto uniform) {
      return VerifySampled(proposed, draft, kTarget, kVocab, uniform).value();
    });
    std::printf("%s proposals: TV distance to the target %.4f (first token), %.4f (second)\n",
                with_draft ? "draft" : "n-gram", d0, d1);
    EXPECT_LT(d0, kBound) << (with_draft ? "draft" : "n-gram") << ": first token";
    EXPECT_LT(d1, kBound) << (with_draft ? "draft" : "n-gram") << ": second token";
  }
}

// The same test refuses a wrong rule: accepting with probability min(1, p/q) but drawing a refused
// position's token from the target's row instead of the residual (p - q)+ over-weights the tokens
// the draft already proposes often.
TEST(VerifySampledTest, TheTestRefusesAWrongAcceptanceRule) {
  const auto [d0, d1] = Distances(true, [](auto& proposed, auto& draft, auto uniform) {
    Verdict v;
    for (int64_t i = 0; i < 2; ++i) {
      const float* p = kTarget.data() + i * kVocab;
      const float* q = draft.data() + i * kVocab;
      if (uniform() * q[proposed[i]] < p[proposed[i]]) {
        ++v.accepted;
        continue;
      }
      double x = uniform(), sum = 0.0;  // wrong: from p, not from (p - q)+
      v.next_token = kVocab - 1;
      for (int32_t y = 0; y < kVocab; ++y) {
        sum += p[y];
        if (x < sum) {
          v.next_token = y;
          break;
        }
      }
      return v;
    }
    v.next_token = 0;
    return v;
  });
  std::printf("the wrong rule: TV distance %.4f (first token), %.4f (second)\n", d0, d1);
  EXPECT_GT(std::max(d0, d1), 3 * kBound) << "first " << d0 << ", second " << d1;
}

TEST(VerifySampledTest, RefusesRowsOfTheWrongShape) {
  auto u = [] { return 0.5; };
  EXPECT_EQ(VerifySampled({1}, {}, std::vector<float>(5), kVocab, u).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifySampled({1}, std::vector<float>(4), kTarget, kVocab, u).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifySampled({7, 1}, {}, kTarget, kVocab, u).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
