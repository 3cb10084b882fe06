// Seeded random fuzzing of the encoder and the incremental decoder on real tokenizers:
//   tokenizer_fuzz [--iterations N] [--seed S] TOKENIZER_DIR...
// For each tokenizer and each random input (a mix of ASCII, whitespace runs, digits, CJK, emoji
// with ZWJ, combining marks, special-token text and invalid bytes): Encode must finish, return
// valid ids, and Decode must return valid UTF-8; for valid input the byte-level tokenizers must
// round-trip the normalised text (byte-level tokenizers); streaming the ids through
// IncrementalDetokenizer must reproduce Decode exactly. Random id sequences (including byte tokens
// that form invalid UTF-8) are streamed too. Prints "N passed, M failed" and exits non-zero on any
// failure.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/base/command_line.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

ABSL_FLAG(int, iterations, 300, "random inputs per tokenizer");
ABSL_FLAG(uint64_t, seed, 1, "random seed");

namespace tandem {
namespace {

const std::vector<std::string> kFragments = {"Hello",
                                             " world",
                                             "The quick brown fox",
                                             "DON'T",
                                             " we'Ll",
                                             "   ",
                                             "\t\t",
                                             "\n\n\n",
                                             "\r\n",
                                             " \u00A0 ",
                                             "\u3000",
                                             "123",
                                             "4567890123",
                                             "3.14159",
                                             "1,000,000",
                                             "日本語",
                                             "中文文本",
                                             "한국어",
                                             "العربية",
                                             "हिन्दी",
                                             "ไทย",
                                             "Привет",
                                             "Ελληνικά",
                                             "🙂",
                                             "👨\u200D👩\u200D👧",
                                             "👍🏽",
                                             "🇯🇵",
                                             "e\u0301",
                                             "\uFB01",
                                             "Ｆｕｌｌ",
                                             "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
                                             "\u200B",
                                             "\u200C",
                                             "\u2028",
                                             "\uE000",
                                             "<|endoftext|>",
                                             "<|im_start|>",
                                             "<s>",
                                             "</s>",
                                             "<bos>",
                                             "<|begin_of_text|>",
                                             "int main() {\n  return 0;\n}",
                                             "def f(x):\n\treturn x",
                                             "{\"a\": [1, 2]}",
                                             "'s",
                                             "'t",
                                             "...",
                                             "!!!",
                                             "--",
                                             "__init__",
                                             "\\n",
                                             "\x01\x02",
                                             "\x7F"};

std::string RandomText(std::mt19937_64& rng) {
  std::string s;
  const int parts = static_cast<int>(rng() % 12);
  for (int i = 0; i < parts; ++i) {
    const uint64_t r = rng() % 20;
    if (r < 15) {
      s += kFragments[rng() % kFragments.size()];
    } else if (r < 17) {
      s.append(1 + rng() % 40, " \t\n"[rng() % 3]);
    } else if (r < 19) {
      s.push_back(static_cast<char>(rng() % 256));  // possibly invalid UTF-8
    } else {
      for (int k = 0; k < 8; ++k) s.push_back(static_cast<char>('0' + rng() % 10));
    }
  }
  return s;
}

struct Counts {
  int passed = 0;
  int failed = 0;
};

void Check(bool ok, Counts* c, const std::string& what) {
  if (ok) {
    ++c->passed;
  } else {
    ++c->failed;
    if (c->failed <= 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

std::string Show(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 80)) {
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

void StreamCheck(const Tokenizer& tok, const std::vector<int32_t>& ids, Counts* c,
                 const std::string& label) {
  IncrementalDetokenizer detok(&tok, /*skip_special_tokens=*/false);
  std::string streamed;
  for (int32_t id : ids) {
    auto delta = detok.Add(id);
    if (!delta.ok()) {
      Check(false, c, label + ": Add failed: " + std::string(delta.status().message()));
      return;
    }
    Check(unicode::IsValidUtf8(*delta), c, label + ": delta is not valid UTF-8");
    streamed += *delta;
  }
  auto rest = detok.Finish();
  Check(rest.ok(), c,
        label + ": Finish failed: " + (rest.ok() ? "" : std::string(rest.status().message())));
  if (rest.ok()) streamed += *rest;
  auto whole = tok.Decode(ids, false);
  Check(whole.ok() && streamed == *whole, c,
        label + ": streamed \"" + Show(streamed) + "\" != decoded \"" +
            (whole.ok() ? Show(*whole) : "?") + "\"");
}

int Run(const std::vector<std::string>& dirs) {
  Counts counts;
  for (const std::string& dir : dirs) {
    auto loaded = Tokenizer::Load(dir);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    const Tokenizer& tok = **loaded;
    const bool byte_level = tok.TokenToId("\xC4\xA0").has_value();  // "Ġ", the byte-level space
    std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
    const auto t0 = std::chrono::steady_clock::now();
    double worst = 0;
    for (int it = 0; it < absl::GetFlag(FLAGS_iterations); ++it) {
      const std::string text = RandomText(rng);
      const auto t = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = tok.Encode(text, it % 2 == 0);
      worst = std::max(worst,
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
      bool ids_ok = true;
      for (int32_t id : ids) ids_ok &= tok.IsValidId(id);
      Check(ids_ok, &counts, dir + ": Encode returned an invalid id for \"" + Show(text) + "\"");
      auto decoded = tok.Decode(ids, false);
      Check(decoded.ok() && unicode::IsValidUtf8(*decoded), &counts,
            dir + ": Decode failed or invalid UTF-8");
      if (byte_level && it % 2 == 1 && unicode::IsValidUtf8(text) && decoded.ok()) {
        // A byte-level tokenizer covers every byte, so decoding gives back the normalised text. NFC
        // is the only normaliser such tokenizers use (Qwen). SentencePiece-style tokenizers are
        // left out: they prepend "▁" after special tokens, which decodes to an extra space.
        const bool nfc = *decoded == unicode::Normalize(text, unicode::Form::kNfc);
        Check(*decoded == text || nfc, &counts,
              dir + ": round trip of \"" + Show(text) + "\" gave \"" + Show(*decoded) + "\"");
      }
      StreamCheck(tok, ids, &counts, dir + " text \"" + Show(text) + "\"");
      // Random id sequences, biased towards byte tokens and special tokens.
      std::vector<int32_t> random_ids;
      const int n = static_cast<int>(rng() % 24);
      for (int k = 0; k < n; ++k) {
        int32_t id;
        do {
          id = static_cast<int32_t>(rng() % tok.vocab_size());
        } while (!tok.IsValidId(id));
        random_ids.push_back(k % 3 == 0 && !ids.empty() ? ids[rng() % ids.size()] : id);
      }
      for (int b = 0; b < 4; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<int>(0x80 + rng() % 0x80));
        if (auto byte_id = tok.TokenToId(name))
          random_ids.insert(random_ids.begin() + rng() % (random_ids.size() + 1), *byte_id);
      }
      StreamCheck(tok, random_ids, &counts, dir + " random ids");
    }
    // No hang: the slowest single encode must stay far below a second.
    Check(worst < 1.0, &counts, dir + ": an encode took " + std::to_string(worst) + " s");
    std::printf("tokenizer_fuzz: %s: %d inputs in %.2f s (slowest encode %.4f s)\n", dir.c_str(),
                absl::GetFlag(FLAGS_iterations),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                worst);
  }
  std::printf("%d passed, %d failed\n", counts.passed, counts.failed);
  return counts.failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  std::vector<std::string> args = tandem::ParseCommandLine(argc, argv);
  args.erase(args.begin());
  if (args.empty()) {
    std::fprintf(stderr, "usage: tokenizer_fuzz [--iterations N] [--seed S] TOKENIZER_DIR...\n");
    return 2;
  }
  return tandem::Run(args);
}
