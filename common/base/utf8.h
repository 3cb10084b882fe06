// UTF-8 encoding of Unicode code points, one implementation for the tokenizer and the chat
// templates (which decode with utf8proc; encoding is a few lines and needs no library).
#pragma once

#include <string>

namespace tandem {

// Appends the UTF-8 encoding of cp to *out: 1 to 4 bytes. As utf8proc_encode_char: surrogates
// (U+D800-U+DFFF) are encoded (as 3 bytes) and anything past U+10FFFF appends nothing.
inline void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x110000) {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// cp as UTF-8 (AppendUtf8).
inline std::string EncodeUtf8(char32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

}  // namespace tandem
