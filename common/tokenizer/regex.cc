#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF: patterns and subjects are UTF-8; UCP: \s \w \d and POSIX classes use Unicode properties.
  // NO_UTF_CHECK is not used for patterns (they come from files).
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex does not compile at offset ", offset,
                                                   ": ", reinterpret_cast<char*>(message)));
  }
  std::unique_ptr<Regex> r(new Regex());
  r->pattern_ = std::string(pattern);
  r->code_ = code;
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view literal) {
  std::string quoted = "\\Q";
  // \E inside the literal would end quoting early; split it out.
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal.substr(i, 2) == "\\E") {
      quoted += "\\E\\\\E\\Q";
      ++i;
    } else {
      quoted.push_back(literal[i]);
    }
  }
  quoted += "\\E";
  return Compile(quoted);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // The subject is validated once by the caller (Tokenizer repairs input to valid UTF-8).
    int rc =
        jit_ ? pcre2_jit_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr)
             : pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_) {
      // The JIT stack ran out on a long subject: the interpreter has no such limit.
      rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      // Match or depth limit exceeded (pathological input): keep the rest as one piece so no text
      // is lost.
      if (start < text.size()) out.emplace_back(start, text.size());
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: advance one UTF-8 character.
      if (b >= text.size()) break;
      size_t step = 1;
      while (b + step < text.size() && (static_cast<unsigned char>(text[b + step]) & 0xC0) == 0x80)
        ++step;
      start = b + step;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

std::string Regex::ReplaceAll(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t last = 0;
  for (auto [b, e] : FindAll(text)) {
    out.append(text.substr(last, b - last));
    out.append(replacement);
    last = e;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace tandem
