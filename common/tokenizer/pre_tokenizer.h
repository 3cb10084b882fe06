// tokenizer.json "pre_tokenizer": ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace,
// WhitespaceSplit, Sequence. A pre-tokenizer turns each piece of text into smaller pieces that the
// model tokenizes independently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer_internal {

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace prepend "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void Apply(std::vector<Piece>* pieces) const = 0;
};

// How a split treats the delimiters it finds (the reference's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `piece` at [begin, end) delimiter ranges (sorted, non-overlapping) according to
// `behavior`. With `invert`, the ranges are the content and the text between them the delimiters.
std::vector<Piece> SplitPiece(const Piece& piece,
                              const std::vector<std::pair<size_t, size_t>>& delimiters,
                              SplitBehavior behavior, bool invert);

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& j);

// GPT-2's byte → printable character mapping applied to every byte of `s`.
std::string ByteLevelEncode(std::string_view s);

}  // namespace tandem::tokenizer_internal
