#include "common/tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "common/base/utf8.h"

namespace tandem::unicode {

size_t SequenceLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 1;
}

namespace {

// Number of bytes of s[i..] that form a valid prefix of a UTF-8 sequence (0 if the lead is
// invalid), following the Unicode table of well-formed byte sequences.
size_t ValidPrefix(std::string_view s, size_t i, bool* complete) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  const size_t need = SequenceLength(b0);
  if (need == 1) return 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 == 0xE0) lo = 0xA0;
  if (b0 == 0xED) hi = 0x9F;
  if (b0 == 0xF0) lo = 0x90;
  if (b0 == 0xF4) hi = 0x8F;
  size_t n = 1;
  for (; n < need && i + n < s.size(); ++n) {
    const auto b = static_cast<unsigned char>(s[i + n]);
    if (n == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return n;
  }
  *complete = n == need;
  return n;
}

}  // namespace

int32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  bool complete;
  const size_t n = ValidPrefix(s, i, &complete);
  if (!complete) {
    *len = 1;
    return -1;
  }
  *len = n;
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (n == 1) return b0;
  int32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    bool complete;
    const size_t n = ValidPrefix(s, i, &complete);
    if (!complete) return false;
    i += n;
  }
  return true;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool complete;
    const size_t n = ValidPrefix(s, i, &complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += std::max<size_t>(n, 1);
    }
  }
  return out;
}

size_t CompletePrefixLength(std::string_view s) {
  // Look back at most 3 bytes for the start of a sequence that is valid so far but incomplete.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    bool complete;
    const size_t n = ValidPrefix(s, i, &complete);
    if (!complete && n == back) return i;  // valid prefix running to the end
    return s.size();
  }
  return s.size();
}

std::string Normalize(std::string_view s, Form form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Form::kNfc: options |= UTF8PROC_COMPOSE; break;
    case Form::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case Form::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Form::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  // ASCII is invariant under every normalisation form.
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  const std::string valid = ToValidUtf8(s);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()),
                                          static_cast<utf8proc_ssize_t>(valid.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) return valid;
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string Lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const int32_t cp = DecodeAt(s, i, &len);
    if (cp < 0) {
      out.append(s.substr(i, len));
    } else if (cp == 0x130) {
      out.append("i\xCC\x87");  // İ lowercases to i + combining dot above (full case mapping)
    } else {
      AppendUtf8(utf8proc_tolower(cp), &out);
    }
    i += len;
  }
  return out;
}

bool IsWhitespace(int32_t cp) {
  if (cp < 0) return false;
  // White_Space = the separators (Zs, Zl, Zp) plus the C0/C1 controls TAB..CR and NEL.
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85) return true;
  if (cp < 0x80) return false;
  const auto cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool IsPunctuation(int32_t cp) {
  if (cp < 0) return false;
  if (cp < 0x80) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  }
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO: return true;
    default: return false;
  }
}

bool IsAlphanumeric(int32_t cp) {
  if (cp < 0) return false;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return true;
    default: return false;
  }
}

bool IsDigit(int32_t cp) { return cp >= 0 && utf8proc_category(cp) == UTF8PROC_CATEGORY_ND; }

}  // namespace tandem::unicode
