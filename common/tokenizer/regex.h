// Unicode regular expressions for tokenizers, on PCRE2 (UTF + UCP, JIT-compiled when available):
// \p{L}, \p{N}, \s and look-ahead behave as in the Oniguruma / fancy-regex patterns of
// tokenizer.json files. Immutable after Compile; FindAll is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Regex {
 public:
  // INVALID_ARGUMENT with PCRE2's message and offset when the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A pattern matching `literal` exactly.
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches [begin, end) left to right (empty matches skipped). `text` must be
  // valid UTF-8.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;
  // `text` with every match (as FindAll finds them) replaced by `replacement`.
  std::string ReplaceAll(std::string_view text, std::string_view replacement) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace tandem
