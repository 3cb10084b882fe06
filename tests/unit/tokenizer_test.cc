// Unit tests of the tokenizer.json pipeline's parts on small hand-written tokenizers. Conformance
// with the reference implementation on real tokenizers is tests/conformance/tokenizer.
#include "common/tokenizer/tokenizer.h"

#include "cli/random_model.h"

#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer_internal::Piece;
using tokenizer_internal::SplitBehavior;
using tokenizer_internal::SplitPiece;

std::vector<std::string> Texts(const std::vector<Piece>& pieces) {
  std::vector<std::string> out;
  for (const Piece& p : pieces) out.push_back(p.text);
  return out;
}

TEST(SplitPieceTest, Behaviors) {
  // "the-final--countdown" split on '-' (the reference's documented example).
  const Piece p{"the-final--countdown", true};
  const std::vector<std::pair<size_t, size_t>> dashes = {{3, 4}, {9, 10}, {10, 11}};
  EXPECT_THAT(Texts(SplitPiece(p, dashes, SplitBehavior::kRemoved, false)),
              ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(Texts(SplitPiece(p, dashes, SplitBehavior::kIsolated, false)),
              ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(Texts(SplitPiece(p, dashes, SplitBehavior::kMergedWithPrevious, false)),
              ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(Texts(SplitPiece(p, dashes, SplitBehavior::kMergedWithNext, false)),
              ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(Texts(SplitPiece(p, dashes, SplitBehavior::kContiguous, false)),
              ElementsAre("the", "-", "final", "--", "countdown"));
  // Inverted: the ranges are the content.
  EXPECT_THAT(Texts(SplitPiece(p, {{0, 3}, {4, 9}}, SplitBehavior::kRemoved, true)),
              ElementsAre("the", "final"));
}

TEST(UnicodeTest, LossyConversionUsesMaximalSubparts) {
  EXPECT_EQ(unicode::ToValidUtf8("a\xE6\x97"
                                 "b"),
            "a\xEF\xBF\xBD"
            "b");  // one U+FFFD for E6 97
  EXPECT_EQ(unicode::ToValidUtf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::ToValidUtf8("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(unicode::CompletePrefixLength("ab\xE6\x97"), 2u);
  EXPECT_EQ(unicode::CompletePrefixLength("ab\xE6\x97\xA5"), 5u);
  EXPECT_EQ(unicode::Normalize("e\xCC\x81", unicode::Form::kNfc), "\xC3\xA9");
  EXPECT_EQ(unicode::Normalize("\xEF\xAC\x81", unicode::Form::kNfkc), "fi");  // ligature ﬁ
  EXPECT_EQ(unicode::Lowercase("ÀBÇ"), "àbç");
}

// A tiny byte-level BPE: vocabulary of a few characters and merges, GPT-2 style.
json ByteLevelTokenizer() {
  json vocab = {{"h", 0},   {"e", 1},   {"l", 2},     {"o", 3},       {"Ġ", 4},     {"w", 5},
                {"r", 6},   {"d", 7},   {"he", 8},    {"ll", 9},      {"hell", 10}, {"hello", 11},
                {"Ġw", 12}, {"or", 13}, {"Ġwor", 14}, {"Ġworld", 15}, {"ld", 16},   {"!", 17}};
  json merges = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"};
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 18}, {"content", "<|eot|>"}, {"special", true}, {"normalized", false}},
        {{"id", 19},
         {"content", "[X]"},
         {"special", false},
         {"lstrip", true},
         {"rstrip", true},
         {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|eot|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<|eot|>", {{"id", "<|eot|>"}, {"ids", {18}}, {"tokens", {"<|eot|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

TEST(TokenizerTest, ByteLevelBpeMergesAndTemplates) {
  auto t = Tokenizer::FromJson(ByteLevelTokenizer().dump(), "test").value();
  EXPECT_THAT(t->Encode("hello world", false), ElementsAre(11, 15));
  EXPECT_THAT(t->Encode("hello world", true), ElementsAre(18, 11, 15));
  EXPECT_THAT(t->Encode("hello<|eot|>hello", false), ElementsAre(11, 18, 11));
  // lstrip/rstrip absorb the surrounding spaces.
  EXPECT_THAT(t->Encode("hello [X] world", false), ElementsAre(11, 19, 5, 13, 16));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{18, 11, 15}, false).value(), "<|eot|>hello world");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{18, 11, 15}, true).value(), "hello world");
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{99}, false).ok());
  EXPECT_EQ(t->vocab_size(), 20);
  EXPECT_EQ(t->TokenToId("Ġworld"), 15);
  EXPECT_EQ(t->IdToToken(19), "[X]");
  EXPECT_TRUE(t->IsSpecial(18));
  EXPECT_FALSE(t->IsSpecial(19));
}

// SentencePiece-style (Llama 2): Prepend + Replace normalizer, byte fallback, Strip decoder.
json SentencePieceTokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"▁", 2}, {"h", 3}, {"i", 4}, {"▁h", 5}, {"▁hi", 6}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 7 + b;
  }
  json merges = json::array({json::array({"▁", "h"}), json::array({"▁h", "i"})});
  return {{"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "▁"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
            {"special_tokens", {{"<s>", {{"ids", {1}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", merges}}}};
}

TEST(TokenizerTest, SentencePieceByteFallback) {
  auto t = Tokenizer::FromJson(SentencePieceTokenizer().dump(), "test").value();
  // "hi é": ▁hi ▁ then é as bytes C3 A9.
  const auto ids = t->Encode("hi é", true);
  EXPECT_THAT(ids, ElementsAre(1, 6, 2, 7 + 0xC3, 7 + 0xA9));
  EXPECT_EQ(t->Decode(ids, true).value(), "hi é");
  // An incomplete byte sequence decodes to one U+FFFD per byte, as the reference's ByteFallback.
  EXPECT_EQ(t->Decode(std::vector<int32_t>{6, 7 + 0xE6, 7 + 0x97}, false).value(),
            "hi\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerTest, WordPieceStyleBpeWithPrefixSuffixAndIgnoreMerges) {
  // continuing_subword_prefix "##" and end_of_word_suffix "</w>": "low" → l ##o ##w</w>, merged.
  json vocab = {{"l", 0},     {"##o", 1}, {"##w</w>", 2}, {"lo", 3},   {"low</w>", 4},
                {"[UNK]", 5}, {"o", 6},   {"w</w>", 7},   {"lower", 8}};
  json j = {{"pre_tokenizer", {{"type", "WhitespaceSplit"}}},
            {"model",
             {{"type", "BPE"},
              {"vocab", vocab},
              {"merges", {"l ##o", "lo ##w</w>"}},
              {"continuing_subword_prefix", "##"},
              {"end_of_word_suffix", "</w>"},
              {"unk_token", "[UNK]"},
              {"fuse_unk", true}}}};
  auto t = Tokenizer::FromJson(j.dump(), "wp").value();
  EXPECT_THAT(t->Encode("low", false), ElementsAre(4));
  EXPECT_THAT(t->Encode("lo", false), ElementsAre(0, 5));     // "##o</w>" is unknown → [UNK]
  EXPECT_THAT(t->Encode("xyz", false), ElementsAre(5));       // fused unknowns
  EXPECT_THAT(t->Encode("lower", false), ElementsAre(3, 5));  // lo + fused [UNK]s: no "lower"...
  j["model"]["ignore_merges"] = true;
  j["model"]["end_of_word_suffix"] = nullptr;
  auto ignoring = Tokenizer::FromJson(j.dump(), "wp").value();
  EXPECT_THAT(ignoring->Encode("lower", false),
              ElementsAre(8));  // ...but ignore_merges takes the word whole
}

TEST(TokenizerTest, AddedTokenSingleWordAndNormalized) {
  json j = ByteLevelTokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  j["added_tokens"] = {{{"id", 18},
                        {"content", "hell"},
                        {"special", false},
                        {"single_word", true},
                        {"normalized", true}},
                       {{"id", 19}, {"content", "WOR"}, {"special", false}, {"normalized", false}}};
  auto t = Tokenizer::FromJson(j.dump(), "t").value();
  // "HELL" is matched after lowercasing (normalized), but only as a whole word.
  EXPECT_THAT(t->Encode("HELL world", false), ElementsAre(18, 15));
  EXPECT_THAT(t->Encode("HELLO", false), ElementsAre(11));
  // "WOR" is matched on the raw text, before lowercasing.
  EXPECT_THAT(t->Encode("WORld", false), ElementsAre(19, 16));
}

TEST(TokenizerTest, MetaspaceAndDigitsAndPunctuation) {
  json vocab = {{"▁a", 0}, {"▁", 1}, {"a", 2}, {"1", 3}, {"2", 4}, {"!", 5}, {"▁b", 6}, {"b", 7}};
  json j = {{"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Metaspace"},
                 {"replacement", "▁"},
                 {"prepend_scheme", "first"},
                 {"split", true}},
                {{"type", "Digits"}, {"individual_digits", true}},
                {{"type", "Punctuation"}}}}}},
            {"decoder", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"▁ a", "▁ b"}}}}};
  auto t = Tokenizer::FromJson(j.dump(), "ms").value();
  const auto ids = t->Encode("a12! b", false);
  EXPECT_THAT(ids, ElementsAre(0, 3, 4, 5, 6));
  EXPECT_EQ(t->Decode(ids, false).value(), "a12! b");  // the first token's ▁ is stripped
}

TEST(TokenizerTest, MakeModelsGeneratedTokenizerRoundTrips) {
  // `tandem make-model` ships MakeByteLevelTokenizerJson's output; it must load and round-trip.
  auto t = Tokenizer::FromJson(MakeByteLevelTokenizerJson(512, 3), "generated").value();
  EXPECT_EQ(t->vocab_size(), 512);
  const std::string text = "Hello, wörld! 日本語 \xF0\x9F\x98\x80\t\r\n the end";
  const auto ids = t->Encode(text, true);
  EXPECT_LT(ids.size(), text.size());  // merges apply
  EXPECT_EQ(t->Decode(ids, false).value(), text);
  EXPECT_TRUE(t->IsSpecial(510));
  EXPECT_EQ(t->IdToToken(511), "<|end_of_text|>");
}

TEST(TokenizerTest, InvalidUtf8InputIsRepaired) {
  auto t = Tokenizer::FromJson(ByteLevelTokenizer().dump(), "test").value();
  const auto ids = t->Encode("he\xFFllo", false);
  EXPECT_FALSE(ids.empty());  // U+FFFD has no token in this vocabulary; it is dropped, no crash
}

TEST(TokenizerTest, RefusesUnsupportedPartsByName) {
  struct Case {
    std::string key;
    json value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}, "unsupported normalizer type 'BertNormalizer'"},
      {"pre_tokenizer",
       {{"type", "UnicodeScripts"}},
       "unsupported pre_tokenizer type 'UnicodeScripts'"},
      {"decoder", {{"type", "WordPiece"}}, "unsupported decoder type 'WordPiece'"},
      {"post_processor", {{"type", "Magic"}}, "unsupported post_processor type 'Magic'"},
      {"model",
       {{"type", "Unigram"}, {"vocab", json::array()}},
       "unsupported model type 'Unigram'"},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}},
       "does not compile"},
  };
  for (const Case& c : cases) {
    json j = ByteLevelTokenizer();
    j[c.key] = c.value;
    auto t = Tokenizer::FromJson(j.dump(), "tok.json");
    ASSERT_FALSE(t.ok()) << c.key;
    EXPECT_THAT(t.status().message(), HasSubstr(c.expect));
    EXPECT_THAT(t.status().message(), HasSubstr("tok.json"));
  }
  json bad_merge = ByteLevelTokenizer();
  bad_merge["model"]["merges"].push_back("x y");
  EXPECT_THAT(Tokenizer::FromJson(bad_merge.dump(), "t").status().message(),
              HasSubstr("missing from the vocabulary"));
  EXPECT_THAT(Tokenizer::FromJson("{", "t").status().message(), HasSubstr("invalid JSON"));
  EXPECT_EQ(Tokenizer::Load("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
