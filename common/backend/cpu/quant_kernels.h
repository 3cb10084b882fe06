// The CPU's kernels for weight-only quantized Linear (common/quant/quantized_matrix.h's layout):
// dot products that widen INT8/INT4 codes in registers (AVX-512, portable fallback).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/quant/quantized_matrix.h"

namespace tandem::cpu {

// Weight rows of a weight-only quantized matrix in quantized_matrix.h's layout: codes, scales and
// zeros point at row 0 of the rows a call covers.
struct QuantRows {
  QuantType type = QuantType::kInt8;
  int64_t cols = 0;
  int64_t group_size = 0;
  int64_t groups = 0;              // ceil(cols / group_size)
  const uint8_t* codes = nullptr;  // [rows][row_bytes]
  size_t row_bytes = 0;
  const float* scales = nullptr;  // [rows][groups]
  const float* zeros = nullptr;   // [rows][groups], or null (all 0)

  // The same rows from row r0 on.
  QuantRows RowsFrom(int64_t r0) const {
    QuantRows q = *this;
    q.codes = codes + r0 * static_cast<int64_t>(row_bytes);
    q.scales = scales + r0 * groups;
    q.zeros = zeros != nullptr ? zeros + r0 * groups : nullptr;
    return q;
  }
};
// The rows of a whole matrix.
QuantRows QuantRowsOf(const QuantizedMatrix& m);
// The code of stored column c in one row's bytes (quantized_matrix.h's layouts; int8 signed).
inline int CodeAt(QuantType type, const uint8_t* row, int64_t c) {
  if (type == QuantType::kInt8) return static_cast<int8_t>(row[c]);
  const int64_t j = c % 32;
  const uint8_t b = row[(c / 32) * 16 + j % 16];
  return j >= 16 ? b >> 4 : b & 0xF;
}
// xsum[g] = sum of x over group g's columns (what the zero points multiply).
void QuantGroupSums(const float* x, int64_t cols, int64_t group_size, float* xsum);
// A tile of a quantized Linear, for `rows_x` (at most 8) activation rows in stored column order
// and weight rows [0, rows_w) of w:
//   out[t * out_stride + r] = sum_g scale[r][g] * (sum_{c in g} x[t][c] * q[r][c]
//                                                  - zero[r][g] * xsum[t][g])
// with xsum[t] from QuantGroupSums. The dequantization is fused: each weight is widened in
// registers and never written out. Each output is computed the same way whatever rows_x is
// (batch invariance). AVX-512 where present, else portable code.
void QuantDotTile(const float* const* x, int rows_x, const float* const* xsum, const QuantRows& w,
                  int rows_w, float* out, int64_t out_stride);
// The portable path of QuantDotTile (what a machine without AVX-512 runs), for tests.
void QuantDotTilePortable(const float* const* x, int rows_x, const float* const* xsum,
                          const QuantRows& w, int rows_w, float* out, int64_t out_stride);
// Batch 1's quantized Linear and a few rows' (up to 8): out[t * out_stride + r] for activation
// rows x[t] (stored column order, xsum[t] their group sums) against weight rows [0, rows) of w, the
// same bits QuantDotTile gives them. With AVX-512 the rows are read as four equal runs side by side
// (three past six activation rows), sequential streams (cpu::DotRowsStreamed's pattern; a tile's
// neighbouring rows are short streams that jump).
void QuantDotRowsStreamed(const float* const* x, int rows_x, const float* const* xsum,
                          const QuantRows& w, int64_t rows, float* out, int64_t out_stride);
// Dequantizes weight rows [0, rows) of w into out[rows][cols] (f32, stored column order).
void DequantizeRows(const QuantRows& w, int64_t rows, float* out);

}  // namespace tandem::cpu
