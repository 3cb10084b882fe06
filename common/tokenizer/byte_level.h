// GPT-2's byte-level alphabet: each byte 0..255 maps to a printable Unicode code point (printable
// Latin-1 bytes map to themselves, the rest to U+0100 upwards in byte order), so any byte string
// becomes a string of visible characters and back.
#pragma once

#include <array>
#include <string>

#include "common/base/utf8.h"

namespace tandem {

// Code point standing for each byte.
const std::array<int, 256>& ByteLevelCodePoints();

}  // namespace tandem
