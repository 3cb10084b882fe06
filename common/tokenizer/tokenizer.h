// The Hugging Face tokenizer.json pipeline: added tokens → normalizer → pre-tokenizer → model (BPE)
// → post-processor on encode; decoder chain on decode. Real checkpoints' tokenizer.json files are
// read as they are; a component Tandem does not support is refused naming it ("unsupported
// pre_tokenizer type 'X'"). Immutable after loading and safe to use from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

namespace tokenizer_internal {
class AddedVocabulary;
class Normalizer;
class PreTokenizer;
class BpeModel;
class PostProcessor;
class Decoder;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory containing one.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // Parses tokenizer.json text; `source` names it in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text,
                                                             const std::string& source);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. add_special_tokens applies the post-processor's template (e.g. BOS).
  // Never fails: text that is not valid UTF-8 is first repaired (invalid bytes → U+FFFD).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids` through the decoder chain; invalid UTF-8 in the result becomes U+FFFD (maximal
  // subparts, as the reference does). INVALID_ARGUMENT for an id outside the vocabulary.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // Largest id + 1 over the model vocabulary and added tokens.
  int64_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string ("" when the id is unknown).
  std::string IdToToken(int32_t id) const;
  // True for added tokens marked special (skipped by skip_special_tokens).
  bool IsSpecial(int32_t id) const;
  bool IsValidId(int32_t id) const;
  // The bytes `id` adds to generated text in the middle of a sequence (byte-level and byte-fallback
  // tokens as raw bytes, which may be part of a UTF-8 character); nullopt for special tokens and
  // unknown ids. Structured output matches grammars against these.
  std::optional<std::string> TokenBytes(int32_t id) const;

 private:
  Tokenizer();
  std::unique_ptr<tokenizer_internal::AddedVocabulary> added_;
  std::unique_ptr<tokenizer_internal::Normalizer> normalizer_;       // may be null
  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_tokenizer_;  // may be null
  std::unique_ptr<tokenizer_internal::BpeModel> model_;
  std::unique_ptr<tokenizer_internal::PostProcessor> post_processor_;  // may be null
  std::unique_ptr<tokenizer_internal::Decoder> decoder_;               // may be null
  int64_t vocab_size_ = 0;
};

}  // namespace tandem
