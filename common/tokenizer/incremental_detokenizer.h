// Streaming detokenization of one sequence: feed generated token ids one at a time and get back the
// text that is safe to show so far.
//
// Contract: the deltas returned by Add() followed by Finish() concatenate to
//   Decode(generated ids)                                        without prompt context, and to
//   Decode(context + generated ids) - Decode(context)            with it,
// where `context` is the last few prompt ids (see the constructor). No delta is broken UTF-8.
//
// Text is held back while a later token can still change it: while the decoded window ends with
// U+FFFD (an incomplete multi-byte sequence a later token may complete), and while the last token
// is a byte-fallback token "<0xNN>" (the reference ByteFallback decoder turns a whole run of byte
// tokens into U+FFFDs if the run as a whole is not valid UTF-8, so the run is final only once a
// non-byte token follows it).
//
// The algorithm is vLLM's: `prefix_offset_` and `read_offset_` index the token list; each Add()
// decodes tokens[prefix_offset_, read_offset_) and tokens[prefix_offset_, end) and emits the
// difference. Decoding a window rather than the whole sequence keeps Add() O(window) per token;
// the window only grows while text is held back.
//
// Not thread-safe; one instance per sequence. The Tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

class IncrementalDetokenizer {
 public:
  // `prompt_ids` (optional) gives the first generated token its context, so that a decoder that
  // strips the leading space of the first token of a decode (SentencePiece's Metaspace, Strip)
  // does not strip it from the first generated token. Only the last kPromptContextTokens valid ids
  // are kept; trailing prompt tokens whose text is not final yet (an incomplete UTF-8 sequence, a
  // byte-fallback run) are dropped from the context, so generated text never rewrites the prompt's.
  IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens,
                         std::span<const int32_t> prompt_ids = {});
  IncrementalDetokenizer(const IncrementalDetokenizer&) = delete;
  IncrementalDetokenizer& operator=(const IncrementalDetokenizer&) = delete;

  // Appends `id` and returns the text that became final (possibly empty). INVALID_ARGUMENT for an
  // id outside the vocabulary (the id is not appended); FAILED_PRECONDITION after Finish().
  absl::StatusOr<std::string> Add(int32_t id);

  // Returns the rest of the text, computed from a decode of the whole sequence. INTERNAL if the
  // text already emitted is not a prefix of that decode (the decoder changed text retroactively in
  // a way the hold-back rules did not foresee); nothing wrong is emitted in that case. A second
  // call returns "".
  absl::StatusOr<std::string> Finish();

  // Generated ids so far (excluding the prompt context).
  std::span<const int32_t> generated_ids() const {
    return std::span<const int32_t>(tokens_).subspan(context_size_);
  }
  // Concatenation of everything returned so far.
  const std::string& emitted_text() const { return emitted_; }

  static constexpr size_t kPromptContextTokens = 5;

 private:
  // True when `id` is a byte-fallback token ("<0x41>").
  bool IsByteToken(int32_t id) const;
  bool IsSkipped(int32_t id) const { return skip_special_tokens_ && tokenizer_->IsSpecial(id); }
  absl::StatusOr<std::string> DecodeRange(size_t begin, size_t end) const;

  const Tokenizer* const tokenizer_;
  const bool skip_special_tokens_;
  // [context (prompt tail)][generated ids]
  std::vector<int32_t> tokens_;
  size_t context_size_ = 0;
  // Text of tokens_[0, context_size_), subtracted by Finish().
  std::string context_text_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  // Decode of tokens_[prefix_offset_, read_offset_), cached between Add() calls.
  std::string prefix_text_;
  // Whether the last token that reaches the decoder is a byte-fallback token.
  bool ends_in_byte_token_ = false;
  std::string emitted_;
  bool finished_ = false;
};

}  // namespace tandem
