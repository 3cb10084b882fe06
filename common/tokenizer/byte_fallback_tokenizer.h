// A stand-in tokenizer until the full tokenizer.json pipeline lands: one token per UTF-8 byte.
//
// It reads the vocabulary of a tokenizer.json and maps each byte to its byte-level token (GPT-2's
// byte-to-unicode alphabet) or to its "<0xNN>" byte-fallback token (SentencePiece-style vocabularies).
// Encoding applies no merges, so ids differ from the reference tokenizer's; decoding any id of the
// vocabulary is exact for byte-level vocabularies. Non-copyable, immutable after Load.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem {

class ByteFallbackTokenizer {
 public:
  // Reads DIR/tokenizer.json. NOT_FOUND when absent; INVALID_ARGUMENT when it lacks byte tokens.
  static absl::StatusOr<std::unique_ptr<ByteFallbackTokenizer>> Load(const std::string& model_dir);

  std::vector<int32_t> Encode(const std::string& text) const;
  // Concatenated bytes of the tokens; special added tokens are skipped when skip_special is set.
  // Ids outside the vocabulary are an error.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids, bool skip_special) const;

 private:
  ByteFallbackTokenizer() = default;
  std::array<int32_t, 256> byte_to_id_{};
  absl::flat_hash_map<int32_t, std::string> id_to_bytes_;
  absl::flat_hash_map<int32_t, bool> special_;
};

}  // namespace tandem
