// The q|k|v prologue's work on one head (paged_attention.h: LaunchQkvPrologue), shared by its own
// kernel and by the q|k|v GEMV that runs it as an epilogue (gemv.h: GemvEpilogue::heads), so that
// both give the same bits. Device code only (included by .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/backend/cuda/block_reduce.cuh"
#include "common/backend/cuda/kv_types.cuh"
#include "common/backend/cuda/paged_attention.h"

namespace tandem::cuda {

// (x0, x1) of a rotate-half pair turned by pos · inv_freq. Explicit roundings: no contraction into
// FMAs that could differ between the kernels inlining it (RopeKernel, the prologue kernel, the
// q|k|v GEMV), which must agree bit for bit.
__device__ __forceinline__ float2 Rotate(float x0, float x1, float pos, float inv_freq) {
  const float angle = __fmul_rn(pos, inv_freq);
  float s, c;
  sincosf(angle, &s, &c);
  return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)),
                     __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
}

// Warp-wide: head h of token t's q|k|v row (the q heads, then the k heads, then the v heads). A q
// or k head is normalised (q_norm / k_norm: the squares added as RmsNormKernel's block adds them:
// element j by thread j, each warp by WarpReduce, the warps' sums in order; its extra zeros change
// nothing), rotated at the token's position, and written to q_out or the k cache; a v head is
// copied into the v cache. A padding token (slot < 0) stores nothing in the caches. The row is read
// from L2 (another block may have written it); x is the warp's shared staging [head_dim].
template <typename T>
__device__ void PrologueHead(const QkvPrologueArgs& a, int64_t t, int64_t h, float* x) {
  const int lane = threadIdx.x % 32;
  const int64_t hd = a.layer.head_dim, half = hd / 2, nq = a.num_q_heads,
                nkv = a.layer.num_kv_heads;
  const int64_t kvs = nkv * hd, slot = a.slot_mapping[t];
  const float* src = a.qkv + t * (nq * hd + 2 * kvs) + h * hd;
  if (h >= nq + nkv) {
    if (slot < 0) return;
    T* vc = static_cast<T*>(a.layer.v_cache) + slot * kvs + (h - nq - nkv) * hd;
    for (int64_t j = lane; j < hd; j += 32) StoreKv(vc + j, __ldcg(src + j));
    return;
  }
  const float* norm = h < nq ? a.q_norm : a.k_norm;
  if (norm != nullptr) {
    float ss = 0.f;
    for (int64_t c0 = 0; c0 < hd; c0 += 32) {
      // Thread j's own sum in RmsScale: 0 + x[j]².
      const float v =
          WarpReduce<false>(c0 + lane < hd ? AddSquare(0.f, __ldcg(src + c0 + lane)) : 0.f);
      ss = c0 == 0 ? v : __fadd_rn(ss, v);
    }
    const float inv = RmsInverse(ss, hd, a.eps);
    for (int64_t j = lane; j < hd; j += 32) x[j] = __ldcg(src + j) * inv * norm[j];
  } else {
    for (int64_t j = lane; j < hd; j += 32) x[j] = __ldcg(src + j);
  }
  __syncwarp();
  const float pos = float(a.positions[t]);
  T* kc = slot >= 0 && h >= nq ? static_cast<T*>(a.layer.k_cache) + slot * kvs + (h - nq) * hd
                               : nullptr;
  for (int64_t i = lane; i < half; i += 32) {
    const float2 y = Rotate(x[i], x[i + half], pos, a.inv_freq[i]);
    if (h < nq) {
      float* q = a.q_out + (t * nq + h) * hd;
      q[i] = y.x;
      q[i + half] = y.y;
    } else if (kc != nullptr) {
      StoreKv(kc + i, y.x);
      StoreKv(kc + i + half, y.y);
    }
  }
  __syncwarp();  // the warp's reads of x are done before it is staged again
}

}  // namespace tandem::cuda
