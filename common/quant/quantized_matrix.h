// Tandem's host layout of a weight-only quantized matrix: what every quantized format (on-load RTN,
// and the checkpoint formats GPTQ, AWQ and compressed-tensors) is turned into before a backend
// uploads it (Backend::UploadQuantizedWeight). The meaning is fixed here, once:
//
//   w[r][c] = (q[r][c] - zero[r][g]) * scale[r][g],   g = c / group_size
//
// for a matrix [rows][cols] in PyTorch Linear layout ([out_features][in_features]). Groups run
// along the input columns; the last group may be shorter (num_groups = ceil(cols / group_size)).
//   kInt8: q int8 in [-128, 127], one byte per weight, codes [rows][cols].
//   kInt4: q unsigned in [0, 15], two per byte, codes [rows][cols / 2]; cols and group_size (when
//          below cols) are multiples of 32.
//          Per 32-column block b of a row, byte 16·b + j holds column 32·b + j in its low nibble
//          and column 32·b + 16 + j in its high nibble (so 16 bytes widen to two runs of 16 lanes).
// scales, zeros: f32 [rows][num_groups]; zeros empty means every zero point is 0.
// perm (act-order checkpoints): empty, or [cols] with stored column c holding input column
// perm[c]; a Linear gathers x[perm[c]] before the dot products, so groups stay contiguous.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

enum class QuantType : uint8_t { kNone, kInt8, kInt4 };

// "none", "int8", "int4".
std::string_view QuantTypeName(QuantType t);
// --quantization's values (any case): "none", "int8", "int4".
std::optional<QuantType> ParseQuantType(std::string_view text);
inline int QuantBits(QuantType t) {
  return t == QuantType::kInt8 ? 8 : t == QuantType::kInt4 ? 4 : 0;
}

struct QuantizedMatrix {
  QuantType type = QuantType::kNone;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;      // columns per scale group, ≥ 1 (cols: one group per row)
  std::vector<uint8_t> codes;  // [rows][row_bytes()]
  std::vector<float> scales;   // [rows][num_groups()]
  std::vector<float> zeros;    // [rows][num_groups()], or empty (all 0)
  std::vector<int32_t> perm;   // [cols], or empty (identity)

  int64_t num_groups() const { return group_size > 0 ? (cols + group_size - 1) / group_size : 0; }
  int64_t row_bytes() const { return type == QuantType::kInt4 ? cols / 2 : cols; }
  // Bytes held: codes, scales, zeros and perm.
  int64_t bytes() const;

  // The code of stored column c of row r (int8: signed; int4: 0..15).
  int Code(int64_t r, int64_t c) const;
  void SetCode(int64_t r, int64_t c, int q);
  // The weight at row r, stored column c: (q - zero) * scale, in f32.
  float Value(int64_t r, int64_t c) const;
};

// An empty matrix of `type` with codes zeroed and scales 1 (zeros and perm empty).
// Requires Validate's shape rules.
QuantizedMatrix MakeQuantizedMatrix(QuantType type, int64_t rows, int64_t cols, int64_t group_size);

// Checks the invariants above (sizes, int4's multiple of 32, finite scales, perm a permutation);
// INVALID_ARGUMENT naming `what` otherwise.
absl::Status Validate(const QuantizedMatrix& m, std::string_view what);

// The f32 matrix [rows][cols] it stands for, in input-column order (perm undone).
std::vector<float> Dequantize(const QuantizedMatrix& m);

}  // namespace tandem
