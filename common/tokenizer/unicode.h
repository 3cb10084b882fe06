// UTF-8 and Unicode helpers for the tokenizer, on utf8proc (normalisation forms, case mapping,
// general categories). No hand-written Unicode tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::unicode {

// Decodes the code point at s[i]; sets *len to its byte length. Invalid bytes decode as -1, len 1.
int32_t DecodeAt(std::string_view s, size_t i, size_t* len);
// Byte length of the UTF-8 sequence starting with lead byte `c` (1 for invalid lead bytes).
size_t SequenceLength(unsigned char c);

bool IsValidUtf8(std::string_view s);
// Replaces invalid sequences with U+FFFD, one per maximal subpart (WHATWG / Rust from_utf8_lossy).
std::string ToValidUtf8(std::string_view s);
// Length of the longest prefix of s that does not end inside an incomplete (but so far valid)
// multi-byte sequence.
size_t CompletePrefixLength(std::string_view s);

enum class Form { kNfc, kNfd, kNfkc, kNfkd };
std::string Normalize(std::string_view s, Form form);
std::string Lowercase(std::string_view s);

bool IsWhitespace(int32_t cp);    // Unicode White_Space (as Rust's char::is_whitespace)
bool IsPunctuation(int32_t cp);   // ASCII punctuation or general category P*
bool IsAlphanumeric(int32_t cp);  // letters (L*) and numbers (N*)
bool IsDigit(int32_t cp);         // general category Nd

}  // namespace tandem::unicode
