#include "common/tokenizer/text_stream.h"

#include <utility>

namespace tandem {

TextStream::TextStream(const Tokenizer* tokenizer, bool skip_special_tokens,
                       std::span<const int32_t> prompt_ids, std::vector<std::string> stops,
                       bool include_stop)
    : detokenizer_(tokenizer, skip_special_tokens, prompt_ids),
      stops_(std::move(stops), include_stop) {}

std::string TextStream::Emit(std::string_view text) {
  StopStringMatcher::Result m = stops_.Add(text);
  stopped_ |= m.stopped;
  text_ += m.emit;
  return std::move(m.emit);
}

std::string TextStream::Add(std::span<const int32_t> ids, size_t* used) {
  if (used != nullptr) *used = 0;
  if (stopped_ || finished_) return "";
  std::string text;
  for (int32_t id : ids) {
    if (used != nullptr) ++*used;
    absl::StatusOr<std::string> piece = detokenizer_.Add(id);
    if (!piece.ok() || piece->empty()) continue;
    text += Emit(*piece);
    if (stopped_) break;  // the ids after this one are not part of the output
  }
  return text;
}

std::string TextStream::Finish(absl::Status* detokenizer_status) {
  if (detokenizer_status != nullptr) *detokenizer_status = absl::OkStatus();
  if (stopped_ || finished_) return "";
  finished_ = true;
  absl::StatusOr<std::string> rest = detokenizer_.Finish();
  if (!rest.ok() && detokenizer_status != nullptr) *detokenizer_status = rest.status();
  std::string tail = Emit(rest.ok() ? *rest : "");
  if (!stopped_) {
    std::string held = stops_.Finish();
    text_ += held;
    tail += held;
  }
  return tail;
}

}  // namespace tandem
