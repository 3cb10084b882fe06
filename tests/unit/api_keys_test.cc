// API keys (router/api_keys.h): the file's format and its errors, authentication, rate limits as
// token buckets, and reloading.
#include "router/api_keys.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

constexpr char kKeys[] = R"(# the service's keys
sk-alpha-0123456789abcdef name=alpha rpm=2 tpm=100
sk-beta-0123456789abcdef              # no name, no limits
)";

TEST(ApiKeysTest, AuthenticatesABearerKeyByName) {
  auto keys = ApiKeys::FromText(kKeys, "keys.txt").value();
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_EQ(keys->Authenticate("Bearer sk-alpha-0123456789abcdef").value(), "alpha");
  EXPECT_EQ(keys->Authenticate("bearer   sk-beta-0123456789abcdef ").value(), "key-3");
  for (const char* bad : {"", "sk-alpha-0123456789abcdef", "Bearer", "Bearer ",
                          "Bearer sk-alpha-0123456789abcdeF", "Bearer sk-alpha-0123456789abcde",
                          "Basic c2stYWxwaGE=", "Bearer sk-alpha-0123456789abcdef0"}) {
    const absl::Status s = keys->Authenticate(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(s.message().find("sk-"), std::string::npos) << "the key must not be echoed: " << bad;
  }
}

TEST(ApiKeysTest, BadFilesAreRefusedNamingTheLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "lists no key"},
      {"# only a comment\n", "lists no key"},
      {"short name=a\n", "keys.txt:1: a key must be at least 16 characters"},
      {"sk-0123456789abcdef rpm=-1\n", "keys.txt:1: rpm must be a number >= 0"},
      {"sk-0123456789abcdef tpm=lots\n", "tpm must be a number"},
      {"sk-0123456789abcdef colour=blue\n", "unknown field 'colour'"},
      {"sk-0123456789abcdef rpm\n", "is not name=value"},
      {"sk-0123456789abcdef name=\n", "empty name"},
      {"sk-0123456789abcdef name=a\nsk-0123456789abcdeg name=a\n", "keys.txt:2: the name 'a'"},
      {"sk-0123456789abcdef\n\nsk-0123456789abcdef\n", "keys.txt:3: the same key is listed twice"},
      {"sk-0123456789abcd\x01"
       "ef\n",
       "printable ASCII"},
  };
  for (const auto& [text, why] : cases) {
    const absl::Status s = ApiKeys::FromText(text, "keys.txt").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(why)) << text;
  }
}

TEST(ApiKeysTest, RequestsAMinuteRefillContinuously) {
  auto keys = ApiKeys::FromText(kKeys, "keys.txt").value();
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(keys->Admit("alpha", 1, t0).ok());
  EXPECT_TRUE(keys->Admit("alpha", 1, t0).ok());
  const absl::Status s = keys->Admit("alpha", 1, t0 + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 requests a minute; retry in 29.0 s"));
  // Half a minute later one request's worth has come back (rpm 2).
  EXPECT_TRUE(keys->Admit("alpha", 1, t0 + absl::Seconds(31)).ok());
  EXPECT_FALSE(keys->Admit("alpha", 1, t0 + absl::Seconds(32)).ok());
  // A key without limits is never refused.
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(keys->Admit("key-3", 100000, t0).ok());
}

TEST(ApiKeysTest, TokensAMinuteCountPromptsAndGeneratedTokens) {
  auto keys = ApiKeys::FromText("sk-0123456789abcdef name=t tpm=120\n", "k").value();
  const absl::Time t0 = absl::FromUnixSeconds(5000);
  EXPECT_TRUE(keys->Admit("t", 100, t0).ok());  // 20 left
  keys->Charge("t", 50, t0);                    // overdrawn: -30
  const absl::Status s = keys->Admit("t", 1, t0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("120 tokens a minute"));
  // 2 tokens a second: back above zero after 15.5 s.
  EXPECT_FALSE(keys->Admit("t", 1, t0 + absl::Seconds(14)).ok());
  EXPECT_TRUE(keys->Admit("t", 1, t0 + absl::Seconds(16)).ok());
  // The bucket holds at most a minute's worth, however long the key was idle.
  EXPECT_TRUE(keys->Admit("t", 200, t0 + absl::Hours(5)).ok());
  EXPECT_FALSE(keys->Admit("t", 1, t0 + absl::Hours(5)).ok());
}

TEST(ApiKeysTest, TheFileIsReloadedWhenItChangesAndABadEditKeepsTheOldKeys) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/api_keys_", ::getpid(), ".txt");
  auto write = [&](const std::string& text) {
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path);
  };
  write("sk-first-0123456789abcdef name=first\n");
  auto keys = ApiKeys::Load(path).value();
  EXPECT_TRUE(keys->Authenticate("Bearer sk-first-0123456789abcdef").ok());
  absl::SleepFor(absl::Milliseconds(20));
  write("sk-second-0123456789abcdef name=second\n");
  // Checked at most once a second.
  bool switched = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(5); !switched && absl::Now() < end;) {
    switched = keys->Authenticate("Bearer sk-second-0123456789abcdef").ok();
    if (!switched) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(switched);
  EXPECT_FALSE(keys->Authenticate("Bearer sk-first-0123456789abcdef").ok());
  write("not a valid key file line\n");
  absl::SleepFor(absl::Milliseconds(1200));
  EXPECT_TRUE(keys->Authenticate("Bearer sk-second-0123456789abcdef").ok());
  std::filesystem::remove(path);
}

TEST(ApiKeysTest, AMissingFileIsAClearError) {
  const absl::Status s = ApiKeys::Load("/nonexistent/keys.txt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/keys.txt"));
}

}  // namespace
}  // namespace tandem::router
