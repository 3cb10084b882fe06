#include "common/tokenizer/byte_fallback_tokenizer.h"

#include <filesystem>
#include <fstream>

#include "common/model/random_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string WriteTokenizer(const std::string& name, const std::string& json) {
  const std::string dir = ::testing::TempDir() + "/tandem_tok_" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << json;
  return dir;
}

TEST(ByteFallbackTokenizerTest, RoundTripsAnyBytesWithGeneratedByteLevelVocab) {
  const std::string dir = WriteTokenizer("bytelevel", MakeByteLevelTokenizerJson(512, 3));
  auto tok = ByteFallbackTokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "Hello, wörld! 日本語 \xF0\x9F\x98\x80\t\r\n\x01";
  const std::vector<int32_t> ids = (*tok)->Encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte
  auto back = (*tok)->Decode(ids, false);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  // The generated vocabulary lists the byte tokens in byte order: 'H' (72) is id 72.
  EXPECT_EQ(ids[0], 72);
}

TEST(ByteFallbackTokenizerTest, DecodesMergedAndSpecialTokens) {
  const std::string dir = WriteTokenizer("merged", MakeByteLevelTokenizerJson(512, 3));
  auto tok = ByteFallbackTokenizer::Load(dir).value();
  auto all = tok->Decode({510, 300, 511}, false);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, ::testing::StartsWith("<|begin_of_text|>"));
  EXPECT_THAT(*all, ::testing::EndsWith("<|end_of_text|>"));
  auto skipped = tok->Decode({510, 300, 511}, true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(all->size(), skipped->size() + strlen("<|begin_of_text|><|end_of_text|>"));
  EXPECT_FALSE(tok->Decode({512}, false).ok());
}

TEST(ByteFallbackTokenizerTest, SentencePieceByteFallbackVocab) {
  std::string vocab = R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "▁hi": 1)";
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    snprintf(buf, sizeof buf, R"(, "<0x%02X>": %d)", b, b + 2);
    vocab += buf;
  }
  vocab += "}}}";
  auto tok = ByteFallbackTokenizer::Load(WriteTokenizer("sp", vocab)).value();
  EXPECT_EQ(tok->Encode("A"), std::vector<int32_t>{0x41 + 2});
  EXPECT_EQ(tok->Decode({1, 0x41 + 2}, false).value(), " hiA");
}

TEST(ByteFallbackTokenizerTest, RefusesBadFiles) {
  EXPECT_EQ(ByteFallbackTokenizer::Load("/nonexistent").status().code(), absl::StatusCode::kNotFound);
  auto s = ByteFallbackTokenizer::Load(WriteTokenizer("badjson", "{\"model\": ")).status();
  EXPECT_THAT(s.message(), ::testing::HasSubstr("invalid JSON"));
  s = ByteFallbackTokenizer::Load(WriteTokenizer("novocab", R"({"model": {"vocab": {"a": 0}}})")).status();
  EXPECT_THAT(s.message(), ::testing::HasSubstr("byte"));
}

}  // namespace
}  // namespace tandem
