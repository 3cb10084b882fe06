#include "common/tokenizer/byte_level.h"

namespace tandem {

const std::array<int, 256>& ByteLevelCodePoints() {
  static const std::array<int, 256> cps = [] {
    std::array<int, 256> c{};
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      c[b] = printable ? b : next++;
    }
    return c;
  }();
  return cps;
}

}  // namespace tandem
