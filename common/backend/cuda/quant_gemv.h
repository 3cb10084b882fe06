// Weight-only quantized Linear on the GPU (quantized_matrix.h's layout kept in device memory):
// decode steps of up to kGemvMaxRows rows read the codes once in a fused dequantizing GEMV with f32
// activations; larger steps dequantize the weight into 16-bit scratch for cuBLAS.
//
// The GEMV: each warp computes C output columns (1, 2 or 4: LaunchQuantGemv's `columns`) for all
// n rows, from activations each block stages in shared memory. Lane l takes the 32-column blocks
// l, l + 32, ... of the weight rows in order (int4: 16 bytes, byte j holding columns j and 16 + j;
// int8: 32 bytes) and folds each block b of a row into that row's f32 sum as
// scale · (Σ q x − zero · Σ x), both sums over the block in column order with the codes q as exact
// floats; the warp then adds its lanes' sums by an xor-shuffle tree. A row's result depends on
// neither n, C nor the other rows (batch invariance among GEMV steps).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/backend/cuda/paged_attention.h"
#include "common/quant/quantized_matrix.h"
#include "common/tensor/dtype.h"

namespace tandem::cuda {

// A quantized weight in device memory: codes [m][row bytes], scales and zeros [m][groups] f32
// (zeros null: all 0), perm [k] or null.
struct QuantWeight {
  QuantType type = QuantType::kNone;
  int64_t m = 0, k = 0, group_size = 0;
  int64_t groups = 0;     // ceil(k / group_size)
  int64_t row_bytes = 0;  // k / 2 (int4) or k (int8)
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const float* zeros = nullptr;
  const int32_t* perm = nullptr;
};

// The QuantWeight of a weight held as codes (DeviceWeight's quantized fields).
inline QuantWeight MakeQuantWeight(QuantType type, int64_t m, int64_t k, int64_t group_size,
                                   const void* codes, const float* scales, const float* zeros,
                                   const int32_t* perm) {
  QuantWeight w;
  w.type = type;
  w.m = m;
  w.k = k;
  w.group_size = group_size;
  w.groups = group_size > 0 ? (k + group_size - 1) / group_size : 0;
  w.row_bytes = type == QuantType::kInt4 ? k / 2 : k;
  w.codes = static_cast<const uint8_t*>(codes);
  w.scales = scales;
  w.zeros = zeros;
  w.perm = perm;
  return w;
}

// Whether the GPU keeps this layout's codes (else it runs the weight dequantized): k and the group
// size multiples of 32 (a 32-column block never straddles groups), codes 16-byte aligned rows.
bool QuantLayoutCovered(QuantType type, int64_t k, int64_t group_size);

// What the quantized GEMV fuses (the kernels a decode step would otherwise launch around it, with
// their bits): with `norm` ([k] f32, 16-byte aligned) it multiplies RmsNorm(x) (LaunchRmsNorm's
// x · inv · norm, the scale folded as RmsNormKernel's block folds it) instead of x; with
// `accumulate`, out[t][j] += sum (LaunchAdd); with `silu_mul`, w is [2m][k], gate rows then up
// rows, and out[t][j] = silu(gate sum j) · (up sum j) (LaunchSiluMulPacked). At most one of
// accumulate, silu_mul and a bias.
// With `heads` (out its qkv, its num_tokens n; head_counters as GemvEpilogue's), the last of each
// head's blocks runs LaunchQkvPrologue's work on that head, as the 16-bit GEMV does (a cache of
// BF16, F16, FP8 E4M3 or f32; not with accumulate or silu_mul; fewer columns a warp where a head is
// narrower than a block).
struct QuantGemvFusion {
  const float* norm = nullptr;
  float eps = 0.f;
  bool accumulate = false;
  bool silu_mul = false;
  const QkvPrologueArgs* heads = nullptr;
  unsigned* head_counters = nullptr;
};

// The columns a warp computes when LaunchQuantGemv is given 0: 4 for m >= 8192, 2 for m >= 4096,
// else 1 (enough blocks to fill the device, each warp's staged activations used for C columns).
int QuantGemvColumns(int64_t m);

// Whether LaunchQuantGemv takes these rows, weight, input and fusion (all but the heads' qkv being
// its out): what the backend asks before fusing ops into it.
bool QuantGemvTakes(int64_t n, const QuantWeight& w, const void* x, const float* bias,
                    const QuantGemvFusion& fusion);

// out[n][m] = x[n][k] · dequantized(w)^T (+ bias[m]); x in stored column order (gathered through
// perm first by the caller), 16-byte aligned. 1 <= n <= kGemvMaxRows; columns 0 (by m), 1, 2 or 4,
// at most 4 for one row, 2 for up to 4, 1 beyond (fewer are run, with the same results; silu_mul
// runs 2 or 4, a warp's rows in gate/up pairs);
// cudaErrorInvalidValue otherwise or for a layout QuantLayoutCovered refuses.
cudaError_t LaunchQuantGemv(const float* x, int64_t n, const QuantWeight& w, const float* bias,
                            float* out, cudaStream_t stream, int columns = 0,
                            const QuantGemvFusion& fusion = {});

// out[m][k] of `dtype` (BF16 or F16) = (q − zero) · scale, stored column order.
cudaError_t LaunchDequantize(const QuantWeight& w, DType dtype, void* out, cudaStream_t stream);

// out[n][k] = x[n][perm[c]] (an act-order weight's column order).
cudaError_t LaunchGatherColumns(const float* x, int64_t n, int64_t k, const int32_t* perm,
                                float* out, cudaStream_t stream);

}  // namespace tandem::cuda
