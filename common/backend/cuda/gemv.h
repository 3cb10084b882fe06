// Matrix-vector products for decode steps: out[n][m] = x[n][k] · W[m][k]^T for a handful of rows
// (n <= kGemvMaxRows) over 16-bit weights, reading each weight once, 16 bytes a lane, at the
// device's memory bandwidth, with the activations kept in f32 (no rounding to the weight type).
//
// Each warp computes one output column (or 2 or 4: LaunchGemv's `columns`) for all n rows: lane l
// takes the 8-element pieces l, l + 32,
// ... of the weight row in order, folding each into one f32 sum per activation row (fma in element
// order), then the warp adds its lanes' sums by an xor-shuffle tree. A row's result therefore does
// not depend on n or on the other rows: a token gets the same bits alone or in any batch of up to
// kGemvMaxRows. Steps of 2 or more rows read the activations from a tile each block stages in
// shared memory (every warp of the block reads it there), one row's from L1; the same arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/paged_attention.h"
#include "common/tensor/dtype.h"

namespace tandem::cuda {

constexpr int64_t kGemvMaxRows = 8;

// Whether LaunchGemv takes these shapes: 1 <= n <= kGemvMaxRows, BF16 or F16 weights, k a multiple
// of 8, and x, w 16-byte aligned.
bool GemvCovers(int64_t n, DType w_dtype, int64_t k, const void* x, const void* w);

// What the GEMV does with each output column's sum before writing it (the kernel a decode step
// would otherwise launch next, fused; the same bits as that kernel after the plain GEMV):
struct GemvEpilogue {
  // out[t][j] = sum + bias[j] (LaunchAddBias): bias [m] f32, device memory.
  const float* bias = nullptr;
  // w is [2m][k], gate rows then up rows (a fused gate|up projection), and out[t][j] =
  // silu(gate sum j) · (up sum j) (LaunchSiluMulPacked after the [n][2m] GEMV).
  bool silu_mul = false;
  // out[t][j] += sum (LaunchAdd after the GEMV: a residual add into out). One column a warp only.
  bool accumulate = false;
  // A fused q|k|v projection's prologue: out is the qkv [n][(nq + 2 nkv) head_dim] of `heads` (its
  // qkv must be out, its num_tokens n, its cache of the weights' type), and the last of each head's
  // blocks to finish runs LaunchQkvPrologue's work on that head for every token (its bits:
  // qkv_prologue.cuh). head_counters: device memory of at least nq + 2 nkv counters, zero, left
  // zero. With or without the bias; one column a warp, head_dim a multiple of 8.
  const QkvPrologueArgs* heads = nullptr;
  unsigned* head_counters = nullptr;
};

// What the GEMV does to its input first: with `norm` ([k] f32, 16-byte aligned), it multiplies
// RmsNorm(x) (LaunchRmsNorm's bits: every block computes each row's scale in RmsNormKernel's order)
// instead of x. One column a warp only, and not with `accumulate`.
struct GemvPrologue {
  const float* norm = nullptr;
  float eps = 0.f;
};

// Whether LaunchGemv takes this combination: at most one epilogue (heads may go with the bias), and
// the rules above (the norm's alignment included).
bool GemvTakes(const GemvEpilogue& epilogue, const GemvPrologue& prologue, int columns);

// x: [n][k] f32; w: [m][k] of w_dtype ([2m][k] with silu_mul); out: [n][m] f32.
// cudaErrorInvalidValue outside GemvCovers or GemvTakes. `columns` (1, 2 or 4): output columns a
// warp computes, reading each activation piece once for all of them (fewer re-reads of x, fewer
// loads in flight a column); the same bits whatever it is.
cudaError_t LaunchGemv(const float* x, int64_t n, DType w_dtype, const void* w, int64_t m,
                       int64_t k, float* out, cudaStream_t stream, int columns = 1,
                       const GemvEpilogue& epilogue = {}, const GemvPrologue& prologue = {});

}  // namespace tandem::cuda
