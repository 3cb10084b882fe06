#include "common/tokenizer/incremental_detokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

constexpr absl::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

bool EndsWithReplacement(absl::string_view text) { return absl::EndsWith(text, kReplacementChar); }

// A short, escaped excerpt of `text` around byte `pos` for error messages.
std::string Excerpt(absl::string_view text, size_t pos) {
  const size_t begin = pos > 24 ? pos - 24 : 0;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(begin, 48)), "\"");
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens,
                                               std::span<const int32_t> prompt_ids)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  // The longest tail of valid prompt ids, at most kPromptContextTokens long.
  size_t begin = prompt_ids.size();
  while (begin > 0 && prompt_ids.size() - begin < kPromptContextTokens &&
         tokenizer_->IsValidId(prompt_ids[begin - 1])) {
    --begin;
  }
  tokens_.assign(prompt_ids.begin() + static_cast<std::ptrdiff_t>(begin), prompt_ids.end());
  // Drop trailing tokens whose text a generated token could still change.
  while (!tokens_.empty()) {
    auto last =
        std::find_if(tokens_.rbegin(), tokens_.rend(), [&](int32_t id) { return !IsSkipped(id); });
    if (last != tokens_.rend() && IsByteToken(*last)) {
      tokens_.resize(static_cast<size_t>(tokens_.rend() - last) - 1);
      continue;
    }
    absl::StatusOr<std::string> text = DecodeRange(0, tokens_.size());
    if (!text.ok()) {  // Not expected for valid ids; streaming then simply starts without context.
      tokens_.clear();
      break;
    }
    if (EndsWithReplacement(*text)) {
      tokens_.pop_back();
      continue;
    }
    context_text_ = *std::move(text);
    break;
  }
  context_size_ = tokens_.size();
  prefix_offset_ = 0;
  read_offset_ = context_size_;
  prefix_text_ = context_text_;
}

bool IncrementalDetokenizer::IsByteToken(int32_t id) const {
  const std::string token = tokenizer_->IdToToken(id);
  return token.size() == 6 && absl::StartsWith(token, "<0x") && token[5] == '>' &&
         absl::ascii_isxdigit(static_cast<unsigned char>(token[3])) &&
         absl::ascii_isxdigit(static_cast<unsigned char>(token[4]));
}

absl::StatusOr<std::string> IncrementalDetokenizer::DecodeRange(size_t begin, size_t end) const {
  return tokenizer_->Decode(std::span<const int32_t>(tokens_).subspan(begin, end - begin),
                            skip_special_tokens_);
}

absl::StatusOr<std::string> IncrementalDetokenizer::Add(int32_t id) {
  if (finished_) return absl::FailedPreconditionError("IncrementalDetokenizer::Add after Finish");
  if (!tokenizer_->IsValidId(id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is outside the vocabulary (size ", tokenizer_->vocab_size(), ")"));
  }
  tokens_.push_back(id);
  if (!IsSkipped(id)) ends_in_byte_token_ = IsByteToken(id);
  if (ends_in_byte_token_) return std::string();

  absl::StatusOr<std::string> new_text = DecodeRange(prefix_offset_, tokens_.size());
  if (!new_text.ok()) {
    tokens_.pop_back();
    return new_text.status();
  }
  // Hold back: nothing new yet, an incomplete character at the end, or (not expected with the
  // supported decoders) a change to text before the read offset.
  if (new_text->size() <= prefix_text_.size() || EndsWithReplacement(*new_text) ||
      !absl::StartsWith(*new_text, prefix_text_)) {
    return std::string();
  }
  std::string delta = new_text->substr(prefix_text_.size());
  prefix_offset_ = read_offset_;
  read_offset_ = tokens_.size();
  ASSIGN_OR_RETURN(prefix_text_, DecodeRange(prefix_offset_, read_offset_));
  emitted_ += delta;
  return delta;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Finish() {
  if (finished_) return std::string();
  finished_ = true;
  ASSIGN_OR_RETURN(std::string full, DecodeRange(0, tokens_.size()));
  if (!absl::StartsWith(full, context_text_)) {
    return absl::InternalError(absl::StrCat(
        "incremental detokenization: the prompt context decodes to ", Excerpt(context_text_, 0),
        " alone but to ", Excerpt(full, 0), " followed by the generated tokens"));
  }
  absl::string_view generated = absl::string_view(full).substr(context_text_.size());
  if (!absl::StartsWith(generated, emitted_)) {
    size_t diverge = 0;
    while (diverge < emitted_.size() && diverge < generated.size() &&
           emitted_[diverge] == generated[diverge]) {
      ++diverge;
    }
    return absl::InternalError(absl::StrCat("incremental detokenization diverged at byte ", diverge,
                                            ": streamed ", Excerpt(emitted_, diverge),
                                            " but the whole sequence decodes to ",
                                            Excerpt(generated, diverge)));
  }
  std::string rest(generated.substr(emitted_.size()));
  emitted_ += rest;
  return rest;
}

}  // namespace tandem
