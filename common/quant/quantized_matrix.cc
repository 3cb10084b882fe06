#include "common/quant/quantized_matrix.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// The byte holding stored column c of a row, and whether it is the high nibble (int4).
int64_t Int4Byte(int64_t c, bool* high) {
  const int64_t j = c % 32;
  *high = j >= 16;
  return (c / 32) * 16 + j % 16;
}

}  // namespace

std::string_view QuantTypeName(QuantType t) {
  switch (t) {
    case QuantType::kNone: return "none";
    case QuantType::kInt8: return "int8";
    case QuantType::kInt4: return "int4";
  }
  return "?";
}

std::optional<QuantType> ParseQuantType(std::string_view text) {
  const std::string lower = absl::AsciiStrToLower(std::string(text));
  for (QuantType t : {QuantType::kNone, QuantType::kInt8, QuantType::kInt4}) {
    if (lower == QuantTypeName(t)) return t;
  }
  return std::nullopt;
}

int64_t QuantizedMatrix::bytes() const {
  return static_cast<int64_t>(codes.size() + (scales.size() + zeros.size()) * sizeof(float) +
                              perm.size() * sizeof(int32_t));
}

int QuantizedMatrix::Code(int64_t r, int64_t c) const {
  if (type == QuantType::kInt8) return static_cast<int8_t>(codes[r * cols + c]);
  bool high;
  const uint8_t b = codes[r * row_bytes() + Int4Byte(c, &high)];
  return high ? b >> 4 : b & 0xF;
}

void QuantizedMatrix::SetCode(int64_t r, int64_t c, int q) {
  if (type == QuantType::kInt8) {
    codes[r * cols + c] = static_cast<uint8_t>(static_cast<int8_t>(q));
    return;
  }
  bool high;
  uint8_t& b = codes[r * row_bytes() + Int4Byte(c, &high)];
  b = high ? static_cast<uint8_t>((b & 0x0F) | ((q & 0xF) << 4))
           : static_cast<uint8_t>((b & 0xF0) | (q & 0xF));
}

float QuantizedMatrix::Value(int64_t r, int64_t c) const {
  const int64_t g = r * num_groups() + c / group_size;
  const float z = zeros.empty() ? 0.f : zeros[g];
  return (static_cast<float>(Code(r, c)) - z) * scales[g];
}

QuantizedMatrix MakeQuantizedMatrix(QuantType type, int64_t rows, int64_t cols,
                                    int64_t group_size) {
  QuantizedMatrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.group_size = group_size;
  m.codes.assign(static_cast<size_t>(rows * m.row_bytes()), 0);
  m.scales.assign(static_cast<size_t>(rows * m.num_groups()), 1.f);
  return m;
}

absl::Status Validate(const QuantizedMatrix& m, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", why));
  };
  if (m.type == QuantType::kNone) return bad("not quantized");
  if (m.rows <= 0 || m.cols <= 0) return bad(absl::StrCat("shape [", m.rows, ", ", m.cols, "]"));
  if (m.group_size <= 0) return bad(absl::StrCat("group size ", m.group_size));
  if (m.type == QuantType::kInt4 && m.cols % 32 != 0) {
    return bad(absl::StrCat("4-bit weights need a multiple of 32 input columns, not ", m.cols));
  }
  if (m.type == QuantType::kInt4 && m.group_size < m.cols && m.group_size % 32 != 0) {
    return bad(absl::StrCat("4-bit groups must be a multiple of 32 columns, not ", m.group_size));
  }
  const auto want = [&](size_t have, int64_t expected, const char* name) -> absl::Status {
    if (static_cast<int64_t>(have) == expected) return absl::OkStatus();
    return bad(absl::StrCat(name, " holds ", have, " elements, expected ", expected));
  };
  if (auto s = want(m.codes.size(), m.rows * m.row_bytes(), "codes"); !s.ok()) return s;
  if (auto s = want(m.scales.size(), m.rows * m.num_groups(), "scales"); !s.ok()) return s;
  if (!m.zeros.empty()) {
    if (auto s = want(m.zeros.size(), m.rows * m.num_groups(), "zeros"); !s.ok()) return s;
  }
  for (size_t i = 0; i < m.scales.size(); ++i) {
    if (!std::isfinite(m.scales[i])) return bad(absl::StrCat("scale ", i, " is not finite"));
  }
  for (size_t i = 0; i < m.zeros.size(); ++i) {
    if (!std::isfinite(m.zeros[i])) return bad(absl::StrCat("zero point ", i, " is not finite"));
  }
  if (!m.perm.empty()) {
    if (auto s = want(m.perm.size(), m.cols, "perm"); !s.ok()) return s;
    std::vector<bool> seen(static_cast<size_t>(m.cols), false);
    for (int32_t p : m.perm) {
      if (p < 0 || p >= m.cols || seen[p]) {
        return bad(absl::StrCat("column order is not a permutation (", p, ")"));
      }
      seen[p] = true;
    }
  }
  return absl::OkStatus();
}

std::vector<float> Dequantize(const QuantizedMatrix& m) {
  std::vector<float> w(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const int64_t in = m.perm.empty() ? c : m.perm[c];
      w[r * m.cols + in] = m.Value(r, c);
    }
  }
  return w;
}

}  // namespace tandem
