// Quantized Linear with 8-bit activations (W8A8 / W4A8, `--activation-dtype int8`): the opt-in
// CPU path that trades a little accuracy for integer dot products, four byte products a lane per
// VNNI instruction (vpdpbusd) instead of widening every weight to f32 for an FMA.
//
// Activations are quantized per row in blocks of at most 128 columns (the weight group when it is
// 128 or less, or when it is not a multiple of 128; else 128, so blocks never straddle groups),
// symmetric: sx = max|x| / 127, xq = round(x / sx) in [-127, 127] (ties to even). With weight
// codes q, zero points z and scales sw (quantized_matrix.h), a block in group g contributes
//
//   sw[g] · sx · (Σ (q + o) · xq − (o + z[g]) · Σ xq)
//
// where o = 128 for int8 weights (their codes are made unsigned, q + 128, as vpdpbusd multiplies an
// unsigned byte by a signed one) and 0 for int4 (codes already unsigned). The integer sums are
// exact; only the scaling is in f32.
#pragma once

#include <cstdint>
#include <vector>

#include "common/backend/cpu/quant_kernels.h"

namespace tandem::cpu {

// Whether this CPU has AVX-512 VNNI (and BW, VL), the fast path; without it the same arithmetic
// runs in portable code (correct, slow). Off when TANDEM_DISABLE_AVX512 is set.
bool HaveAvx512Vnni();

// Activation rows quantized for weights `w`, in the order the kernels read them: int8 weights in
// column order; int4 weights, within each block, a full 128-column block as the low
// halves of its four 32-column blocks (columns 32b .. 32b + 15) then their high halves (32b + 16 ..
// 32b + 31), matching the nibbles of 64 bytes of codes; shorter tails in column order.
struct QuantizedActivations {
  int64_t cols = 0;
  int64_t block_size = 0;    // ActivationBlockSize(w)
  int64_t blocks = 0;        // ceil(cols / block_size)
  std::vector<int8_t> q;     // [rows][cols]
  std::vector<float> scale;  // [rows][blocks]: sx
  std::vector<int32_t> sum;  // [rows][blocks]: Σ xq
  int64_t rows = 0;
  // [blocks][rows] (block-major, so that one load gives a block's value for several rows):
  // sx · (float) Σ xq, the activation's share of the zero point's correction, rounded once.
  std::vector<float> scaled_sum;
  const int8_t* row(int64_t i) const { return q.data() + i * cols; }
  const float* scaled_sums(int64_t b) const { return scaled_sum.data() + b * rows; }
  const float* scales(int64_t i) const { return scale.data() + i * blocks; }
  const int32_t* sums(int64_t i) const { return sum.data() + i * blocks; }
};

// The columns an activation scale covers for weights `w` (the rule above).
int64_t ActivationBlockSize(const QuantRows& w);

// Quantizes x[rows][w.cols] (stored column order) for w. With VNNI sixteen columns at a time, the
// portable code's bits (a NaN becomes 127 in both; its block's scale ignores it).
void QuantizeActivations(const float* x, int64_t rows, const QuantRows& w,
                         QuantizedActivations* out);
// The portable path, for tests.
void QuantizeActivationsPortable(const float* x, int64_t rows, const QuantRows& w,
                                 QuantizedActivations* out);

// A tile: out[t * out_stride + r] for activation rows first_row .. first_row + rows_x − 1 of `a`
// (at most 8) and weight rows [0, rows_w) of w, as the formula above. Each output is computed the
// same way whatever rows_x is (batch invariance).
void QuantDotTileA8(const QuantizedActivations& a, int64_t first_row, int rows_x,
                    const QuantRows& w, int rows_w, float* out, int64_t out_stride);
// Batch 1 and a few rows (up to 8): out[t * out_stride + r] for activation rows first_row ..
// first_row + rows_x − 1 of `a` against weight rows [0, rows) of w, the same bits QuantDotTileA8
// gives them, the rows read as runs side by side (QuantDotRowsStreamed's pattern; four runs for one
// or two rows, two for three or four, one from five, as many as the tiles' registers hold).
void QuantDotRowsStreamedA8(const QuantizedActivations& a, int64_t first_row, int rows_x,
                            const QuantRows& w, int64_t rows, float* out, int64_t out_stride);
// The portable path (what a CPU without VNNI runs), for tests.
void QuantDotTileA8Portable(const QuantizedActivations& a, int64_t first_row, int rows_x,
                            const QuantRows& w, int rows_w, float* out, int64_t out_stride);

}  // namespace tandem::cpu
