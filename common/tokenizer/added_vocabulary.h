// tokenizer.json "added_tokens": matched in the text before the model, honouring lstrip / rstrip
// (absorb neighbouring whitespace), single_word (not inside a word) and normalized (matched on the
// normalized text instead of the raw input). Longest match wins at a position; earlier positions
// win over later ones.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A stretch of text: either an added token (token_id >= 0) or text for the normal pipeline.
struct TextSegment {
  std::string text;
  int32_t token_id = -1;
  size_t offset = 0;  // byte offset in the input it was cut from
};

class AddedVocabulary {
 public:
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Parse(const nlohmann::json& added_tokens);

  // Splits `text` at added tokens with normalized == `normalized_pass`.
  std::vector<TextSegment> Split(std::string_view text, bool normalized_pass) const;

  const AddedToken* Find(int32_t id) const;
  const AddedToken* FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool has_normalized() const { return has_normalized_; }

 private:
  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  // Candidate tokens by first byte, longest first.
  std::vector<size_t> by_first_byte_[256];
  bool has_normalized_ = false;
};

}  // namespace tandem::tokenizer_internal
