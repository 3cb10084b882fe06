// libFuzzer target: tokenizer.json text through Tokenizer::FromJson; a tokenizer it accepts then
// encodes a fixed multilingual text and the input itself, decodes the ids at once and one at a
// time (IncrementalDetokenizer), which must give valid UTF-8.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto tokenizer = tandem::Tokenizer::FromJson(text, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  for (const std::string& input :
       {std::string("In the beginning God créa 天地 🙂 \t\n  x"), text.substr(0, 256)}) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode(input, true);
    (void)(*tokenizer)->Decode(ids, false);
    tandem::IncrementalDetokenizer detok(tokenizer->get(), false);
    for (int32_t id : ids) {
      absl::StatusOr<std::string> piece = detok.Add(id);
      if (piece.ok() && !tandem::unicode::IsValidUtf8(*piece)) std::abort();
    }
    (void)detok.Finish();
  }
  return 0;
}
