// One sequence's generated text as it streams: token ids in, text deltas out, incremental
// detokenization (IncrementalDetokenizer) followed by stop strings (StopStringMatcher). The
// router's request flows and `tandem generate`'s in-process path both use it, so a stop string ends
// a request the same way whichever door it came through.
//
// Contract: the deltas of Add() and Finish() concatenate to the detokenized text, cut before the
// first stop string (or after it, with include_stop), never broken UTF-8. Once stopped(), further
// ids produce nothing: the caller ends the request (its finish is "stop"). An id the tokenizer
// lacks (a vocabulary padded past the tokenizer's) has no text and is skipped.
//
// Not thread-safe; one instance per sequence. The Tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/stop_strings.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

class TextStream {
 public:
  // `prompt_ids` gives the first generated token its context (IncrementalDetokenizer); `stops` must
  // have passed StopStringMatcher::Validate.
  TextStream(const Tokenizer* tokenizer, bool skip_special_tokens,
             std::span<const int32_t> prompt_ids, std::vector<std::string> stops = {},
             bool include_stop = false);
  TextStream(const TextStream&) = delete;
  TextStream& operator=(const TextStream&) = delete;

  // Appends `ids` and returns the text that became final; "" once stopped. `used` (optional): how
  // many of `ids` were taken, up to the one whose text completed a stop string; the rest are not
  // part of the output (several tokens at once: a speculative step's accepted run).
  std::string Add(std::span<const int32_t> ids, size_t* used = nullptr);
  // End of generation: the held-back text (detokenizer and stop matcher), which may still complete
  // a stop string. `detokenizer_status` (optional) gets the detokenizer's verdict: INTERNAL if the
  // whole decode disagrees with what was emitted, and then only the stop matcher's held text (final
  // already) is returned. A second call returns "".
  std::string Finish(absl::Status* detokenizer_status = nullptr);

  bool stopped() const { return stopped_; }
  // Everything returned so far.
  const std::string& text() const { return text_; }

 private:
  std::string Emit(std::string_view text);

  IncrementalDetokenizer detokenizer_;
  StopStringMatcher stops_;
  bool stopped_ = false;
  bool finished_ = false;
  std::string text_;
};

}  // namespace tandem
