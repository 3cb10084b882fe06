// The n-gram (prompt lookup) proposer against hand-made sequences: which suffix, which occurrence,
// how much continuation, and what it refuses.
#include "common/spec/ngram_proposer.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::unique_ptr<NgramProposer> Make(int32_t min_n, int32_t max_n) {
  auto p = NgramProposer::Create({.min_n = min_n, .max_n = max_n});
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(p).value();
}

TEST(NgramProposerTest, ProposesWhatFollowedTheEarlierOccurrenceOfTheSuffix) {
  auto p = Make(1, 3);
  // ... 7 8 9 [4 5 6] ... 7 8 9 → 4 5 6
  EXPECT_THAT(p->ProposeOne({7, 8, 9, 4, 5, 6, 1, 2, 7, 8, 9}, 3), ElementsAre(4, 5, 6));
  // At most k, and no further than the sequence goes.
  EXPECT_THAT(p->ProposeOne({7, 8, 9, 4, 5, 6, 1, 2, 7, 8, 9}, 2), ElementsAre(4, 5));
  EXPECT_THAT(p->ProposeOne({7, 8, 9, 4, 7, 8, 9}, 5), ElementsAre(4, 7, 8, 9));
}

TEST(NgramProposerTest, NothingRepeatedProposesNothing) {
  auto p = Make(1, 4);
  EXPECT_THAT(p->ProposeOne({1, 2, 3, 4, 5}, 4), IsEmpty());
  EXPECT_THAT(p->ProposeOne({1}, 4), IsEmpty());
  // A suffix shorter than min_n does not count: 5 occurs before, but the pair (4, 5) never did.
  EXPECT_THAT(Make(2, 4)->ProposeOne({5, 9, 1, 4, 5}, 4), IsEmpty());
  EXPECT_THAT(Make(1, 4)->ProposeOne({5, 9, 1, 4, 5}, 4), ElementsAre(9, 1, 4, 5));
}

TEST(NgramProposerTest, TheLongestMatchWinsThenTheMostRecent) {
  auto p = Make(1, 3);
  // The suffix (2, 3) occurs at the start followed by 10; the single token 3 occurs more recently
  // followed by 20: the longer match wins.
  EXPECT_THAT(p->ProposeOne({2, 3, 10, 3, 20, 2, 3}, 1), ElementsAre(10));
  // Two earlier occurrences of the same suffix: the most recent one's continuation.
  EXPECT_THAT(p->ProposeOne({4, 5, 11, 4, 5, 12, 4, 5}, 1), ElementsAre(12));
  // max_n bounds the suffix: with max_n 1 the single token 3 most recently followed by 20.
  EXPECT_THAT(Make(1, 1)->ProposeOne({2, 3, 10, 3, 20, 2, 3}, 1), ElementsAre(20));
}

TEST(NgramProposerTest, ARepeatingPatternContinuesIntoItself) {
  auto p = Make(1, 4);
  // 6 6 6 6: the suffix (6 6 6 6) has no earlier occurrence; (6 6 6) occurs one token back.
  EXPECT_THAT(p->ProposeOne({6, 6, 6, 6}, 3), ElementsAre(6));
  EXPECT_THAT(p->ProposeOne({1, 2, 1, 2, 1, 2}, 4), ElementsAre(1, 2));
}

TEST(NgramProposerTest, ProposesForEveryRequestOfABatch) {
  auto p = Make(1, 2);
  const std::vector<int32_t> a = {1, 2, 3, 1, 2}, b = {4, 5, 6};
  std::vector<ProposalRequest> reqs = {{.seq_id = 1, .tokens = a, .k = 2},
                                       {.seq_id = 2, .tokens = b, .k = 4}};
  std::vector<Proposal> out;
  ASSERT_TRUE(p->Propose(reqs, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_THAT(out[0].tokens, ElementsAre(3, 1));
  EXPECT_THAT(out[0].probs, IsEmpty());
  EXPECT_THAT(out[1].tokens, IsEmpty());
  EXPECT_EQ(p->method(), SpeculationMethod::kNgram);
}

TEST(NgramProposerTest, RefusesBadOptionsAndRequests) {
  for (auto [lo, hi] : std::vector<std::pair<int32_t, int32_t>>{
           {0, 2}, {3, 2}, {1, NgramProposer::kMaxNgram + 1}}) {
    auto p = NgramProposer::Create({.min_n = lo, .max_n = hi});
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << lo << ".." << hi;
  }
  auto p = Make(1, 2);
  const std::vector<int32_t> a = {1, 2, 1}, empty;
  std::vector<Proposal> out = {{{9}, {}}};
  for (int32_t k : {0, kMaxSpeculativeTokens + 1}) {
    std::vector<ProposalRequest> reqs = {{.seq_id = 1, .tokens = a, .k = k}};
    EXPECT_EQ(p->Propose(reqs, &out).code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_THAT(out, IsEmpty());
  }
  std::vector<ProposalRequest> reqs = {{.seq_id = 1, .tokens = empty, .k = 2}};
  EXPECT_EQ(p->Propose(reqs, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NgramProposerTest, MethodNamesRoundTrip) {
  for (SpeculationMethod m :
       {SpeculationMethod::kOff, SpeculationMethod::kNgram, SpeculationMethod::kDraft}) {
    EXPECT_EQ(ParseSpeculationMethod(SpeculationMethodName(m)).value(), m);
  }
  const auto bad = ParseSpeculationMethod("eagle");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("off, ngram, draft"));
}

}  // namespace
}  // namespace tandem
