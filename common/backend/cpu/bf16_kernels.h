// Linear over BF16 weights with BF16 activations (`--activation-dtype bf16`): the opt-in CPU path
// that rounds each activation to BF16 (nearest even) and multiplies with AVX-512 BF16 dot products
// (vdpbf16ps: two products per f32 lane and instruction, the weights used as stored). As
// llama.cpp's BF16 path does; twice the arithmetic of the f32 path per instruction, at the cost of
// the activations' low 16 bits (docs/benchmarks.md measures both).
//
// Each output is sum over 32-column blocks, in column order, of vdpbf16ps into one f32 vector, then
// a fixed pairwise sum of its 16 lanes: the same operations whatever the number of rows (batch
// invariance). Without AVX-512 BF16 the backend runs the f32 path on the rounded activations
// instead (same inputs, other sums).
#pragma once

#include <cstdint>

namespace tandem::cpu {

// Whether this CPU has AVX-512 BF16 (with BW). Off when TANDEM_DISABLE_AVX512 is set.
bool HaveAvx512Bf16();

// Columns of a row of rounded activations: k rounded up to a multiple of 32 (zeros after k).
int64_t Bf16PaddedCols(int64_t k);

// Rounds x[rows][k] to BF16, nearest even: out[rows][Bf16PaddedCols(k)], zero padded.
void RoundRowsToBf16(const float* x, int64_t rows, int64_t k, uint16_t* out);

// A tile: out[t * out_stride + r] = Σ_i x[t][i] · w[r][i] for activation rows x + t · x_stride
// (t < rows_x ≤ 8; from RoundRowsToBf16) and weight rows w + r · k (r < rows_w, BF16). Requires
// HaveAvx512Bf16().
void Bf16DotTile(const uint16_t* x, int64_t x_stride, int rows_x, const uint16_t* w, int rows_w,
                 int64_t k, float* out, int64_t out_stride);

// The same sums for `rows` consecutive weight rows (w + r · k), read as four runs side by side
// (three past six activation rows; cpu::DotRowsStreamed's pattern), each output the bits
// Bf16DotTile gives it: batch 1's Linear and a few rows' (rows_x ≤ kStreamedMaxRows), which read
// each weight once. Requires HaveAvx512Bf16().
void Bf16DotRowsStreamed(const uint16_t* x, int64_t x_stride, int rows_x, const uint16_t* w,
                         int64_t rows, int64_t k, float* out, int64_t out_stride);

}  // namespace tandem::cpu
