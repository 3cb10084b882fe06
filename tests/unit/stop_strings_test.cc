#include "common/tokenizer/stop_strings.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// Feeds `deltas` and returns (emitted text, matched stop or "").
std::pair<std::string, std::string> Feed(StopStringMatcher& m,
                                         const std::vector<std::string>& deltas) {
  std::string out, matched;
  for (const auto& d : deltas) {
    auto r = m.Add(d);
    out += r.emit;
    if (r.stopped) {
      matched = r.matched;
      break;
    }
  }
  if (matched.empty()) out += m.Finish();
  return {out, matched};
}

TEST(StopStringsTest, MatchSplitAcrossDeltasIsCaughtAndNotLeaked) {
  StopStringMatcher m({"world"});
  auto r = m.Add("Hello wor");
  EXPECT_EQ(r.emit, "Hello ");  // "wor" held: it may begin "world"
  r = m.Add("ld and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(r.matched, "world");
  EXPECT_EQ(m.Add("ignored").emit, "");
}

TEST(StopStringsTest, HeldTextIsReleasedWhenTheMatchFails) {
  StopStringMatcher m({"world"});
  EXPECT_EQ(Feed(m, {"Hello wo", "nderful"}),
            std::make_pair(std::string("Hello wonderful"), std::string()));
}

TEST(StopStringsTest, EarliestStopWinsAndIncludeStop) {
  StopStringMatcher a({"END", "\n\n"});
  EXPECT_EQ(Feed(a, {"line one\n", "\nline END"}),
            std::make_pair(std::string("line one"), std::string("\n\n")));
  StopStringMatcher b({"END"}, /*include_stop=*/true);
  EXPECT_EQ(Feed(b, {"abc E", "ND tail"}).first, "abc END");
}

TEST(StopStringsTest, UnicodeStops) {
  StopStringMatcher m({"。"});
  EXPECT_EQ(Feed(m, {"日本語", "です", "。次"}).first, "日本語です");
}

TEST(StopStringsTest, RandomSplitsGiveTheSameResultAsWholeText) {
  const std::string text = "The quick brown fox jumps over the lazy dog. STOP here. More text.";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> deltas;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 6;
      deltas.push_back(text.substr(i, n));
      i += n;
    }
    StopStringMatcher m({"STOP", "lazy cat"});
    auto [out, matched] = Feed(m, deltas);
    ASSERT_EQ(out, "The quick brown fox jumps over the lazy dog. ");
    ASSERT_EQ(matched, "STOP");
  }
}

TEST(StopStringsTest, Validation) {
  EXPECT_TRUE(StopStringMatcher::Validate({"a", "bc"}).ok());
  EXPECT_FALSE(StopStringMatcher::Validate({""}).ok());
  EXPECT_FALSE(StopStringMatcher::Validate(std::vector<std::string>(17, "x")).ok());
  EXPECT_FALSE(StopStringMatcher::Validate({std::string(300, 'x')}).ok());
  EXPECT_FALSE(StopStringMatcher::Validate({"\xFF"}).ok());
}

}  // namespace
}  // namespace tandem
