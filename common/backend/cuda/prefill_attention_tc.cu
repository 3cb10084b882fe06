// Tensor-core prompt attention (prefill_attention.h): FlashAttention-2's loop with both products on
// the tensor cores (WMMA, 16×16×16 tiles of the cache's 16-bit type, f32 accumulation).
//
// A block of kTcWarps warps takes kTcTileQ consecutive new tokens and one query head; warp w owns
// tile rows 16 w .. 16 w + 15. Per tile of kTcTileK keys (loaded once for the block, 16 bytes a
// thread at a time, from the paged cache into shared memory): S = Q · Kᵀ into f32 fragments, stored
// to the warp's scratch; two lanes a row mask (causal: keys up to the row's position), scale and
// exponentiate against the running max, writing P in the 16-bit type; O_tile = P · V into
// fragments, stored to the same scratch, and each lane adds its half of its row's dimensions into
// the running output it holds in registers (rescaled by the max's correction first). Queries and
// probabilities are rounded to the 16-bit type for the products, as FlashAttention does; maxima,
// sums and outputs stay f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/backend/cuda/prefill_attention.h"
#include "common/backend/cuda/prompt_runs.cuh"
#include "common/backend/cuda/store_out.cuh"

namespace tandem::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcTileQ = 64;  // new tokens a block takes
constexpr int kTcTileK = 64;  // keys a shared-memory tile holds
constexpr int kTcWarps = kTcTileQ / 16;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kPLd = kTcTileK + 8;  // P rows (16-bit), skewed by 16 bytes
constexpr unsigned kFullMask = 0xffffffffu;

// Row strides: 16-bit rows of Q, K and V skewed by 16 bytes; f32 scratch rows (S, then P · V) by 16
// bytes. Every fragment starts 32-byte aligned: rows in multiples of 16, columns in multiples
// of 16.
template <int kHd>
__host__ __device__ constexpr int TcLd() {
  return kHd + 8;
}
template <int kHd>
__host__ __device__ constexpr int TcScratchLd() {
  return (kHd > kTcTileK ? kHd : kTcTileK) + 4;
}
template <int kHd>
constexpr size_t TcSharedBytes() {
  return 3 * size_t(kTcTileQ) * TcLd<kHd>() * 2 + size_t(kTcTileQ) * kPLd * 2 +
         size_t(kTcWarps) * 16 * TcScratchLd<kHd>() * 4;
}

template <typename E>
__device__ __forceinline__ E FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half(x);
}

// Grid (ceil(num_tokens / kTcTileQ), num_q_heads), kTcThreads threads, TcSharedBytes<kHd>() bytes
// of dynamic shared memory. E: the cache's (and the products') 16-bit type.
template <int kHd, typename E>
__global__ void __launch_bounds__(kTcThreads) TensorCorePrefillKernel(PagedAttentionArgs a) {
  constexpr int kLd = TcLd<kHd>(), kSLd = TcScratchLd<kHd>(), kHalfDims = kHd / 2;
  constexpr int kChunks = kHd / 8;  // 16-byte pieces of a 16-bit row
  TANDEM_DYNAMIC_SHARED(unsigned char, tc_smem, 128);
  E* qs = reinterpret_cast<E*>(tc_smem);                                // [kTcTileQ][kLd]
  E* ks = qs + kTcTileQ * kLd;                                          // [kTcTileK][kLd]
  E* vs = ks + kTcTileK * kLd;                                          // [kTcTileK][kLd]
  E* ps = vs + kTcTileK * kLd;                                          // [kTcTileQ][kPLd]
  float* scratch_all = reinterpret_cast<float*>(ps + kTcTileQ * kPLd);  // [kTcWarps][16][kSLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch = scratch_all + warp * 16 * kSLd;
  E* pw = ps + warp * 16 * kPLd;
  const int row = lane / 2,
            half = lane % 2;  // the lane's row of the warp's 16; its half of the keys and dims
  const int tile_row = warp * 16 + row;
  const int64_t h = blockIdx.y, group = a.num_q_heads / a.layer.num_kv_heads, kh = h / group;
  const int64_t t_begin = int64_t(blockIdx.x) * kTcTileQ;
  const int64_t t_end = t_begin + kTcTileQ < a.num_tokens ? t_begin + kTcTileQ : a.num_tokens;
  const int64_t slot_row = a.layer.num_kv_heads * kHd, bs = a.layer.block_size;
  const E* kbase = static_cast<const E*>(a.layer.k_cache) + kh * kHd;
  const E* vbase = static_cast<const E*>(a.layer.v_cache) + kh * kHd;

  for (int64_t run = t_begin; run < t_end;) {
    // This run: the tile's tokens of one sequence, [run, run_end).
    const PromptRun pr = FindPromptRun(a, run, t_end);
    const int64_t run_end = pr.end, keys = pr.keys;
    const int32_t* table = pr.table;
    if (pr.skip) {
      run = run_end;  // the split-KV kernel's (uniform across the block)
      continue;
    }
    const int64_t t = run + tile_row;
    // Keys this lane's row sees (0: not a row of the run).
    const int64_t len = t < run_end ? PromptKeys(a, t, pr.ctx) : 0;

    __syncthreads();  // the previous run is done with qs
    for (int i = threadIdx.x; i < kTcTileQ * kHd; i += kTcThreads) {
      const int r = i / kHd, d = i % kHd;
      const int64_t tt = run + r;
      qs[r * kLd + d] = FromFloat<E>(tt < run_end ? a.q[(tt * a.num_q_heads + h) * kHd + d] : 0.f);
    }
    float m = -INFINITY, l = 0.f;
    float o[kHalfDims];
#pragma unroll
    for (int i = 0; i < kHalfDims; ++i) o[i] = 0.f;

    for (int64_t k0 = 0; k0 < keys; k0 += kTcTileK) {
      __syncthreads();  // qs written (first tile); ks, vs free again (later tiles)
      for (int i = threadIdx.x; i < kTcTileK * kChunks; i += kTcThreads) {
        const int j = i / kChunks, c = i % kChunks;
        const int64_t p = k0 + j;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (p < keys) {
          const int64_t slot = int64_t(table[p / bs]) * bs + p % bs;
          kv = *reinterpret_cast<const uint4*>(kbase + slot * slot_row + 8 * c);
          vv = *reinterpret_cast<const uint4*>(vbase + slot * slot_row + 8 * c);
        }
        *reinterpret_cast<uint4*>(ks + j * kLd + 8 * c) = kv;
        *reinterpret_cast<uint4*>(vs + j * kLd + 8 * c) = vv;
      }
      __syncthreads();

      // S = Q · Kᵀ for the warp's 16 rows and the tile's keys.
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag[kTcTileK / 16];
#pragma unroll
      for (int j = 0; j < kTcTileK / 16; ++j) wmma::fill_fragment(s_frag[j], 0.f);
#pragma unroll
      for (int d0 = 0; d0 < kHd; d0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> qa;
        wmma::load_matrix_sync(qa, qs + warp * 16 * kLd + d0, kLd);
#pragma unroll
        for (int j = 0; j < kTcTileK / 16; ++j) {
          // Kᵀ: K's rows as columns.
          wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> kb;
          wmma::load_matrix_sync(kb, ks + j * 16 * kLd + d0, kLd);
          wmma::mma_sync(s_frag[j], qa, kb, s_frag[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kTcTileK / 16; ++j) {
        wmma::store_matrix_sync(scratch + j * 16, s_frag[j], kSLd, wmma::mem_row_major);
      }
      __syncwarp();

      // Online softmax: each row by its two lanes, half the tile's keys each.
      constexpr int kKeysPerLane = kTcTileK / 2;
      const float* srow = scratch + row * kSLd + half * kKeysPerLane;
      const int64_t key0 = k0 + half * kKeysPerLane;
      float tile_max = -INFINITY;
#pragma unroll 8
      for (int j = 0; j < kKeysPerLane; ++j) {
        if (key0 + j < len) tile_max = fmaxf(tile_max, srow[j] * a.scale);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
      const float new_m = fmaxf(m, tile_max);
      float sum = 0.f;
      E* prow = pw + row * kPLd + half * kKeysPerLane;
#pragma unroll 8
      for (int j = 0; j < kKeysPerLane; ++j) {
        const float e =
            key0 + j < len && new_m != -INFINITY ? expf(srow[j] * a.scale - new_m) : 0.f;
        prow[j] = FromFloat<E>(e);
        sum += e;
      }
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      const float corr = m == -INFINITY ? 0.f : expf(m - new_m);  // nothing accumulated yet: 0
      l = l * corr + sum;
      m = new_m;
#pragma unroll
      for (int i = 0; i < kHalfDims; ++i) o[i] *= corr;
      __syncwarp();  // P written, S read: the scratch takes P · V next

      // O += P · V.
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag[kHd / 16];
#pragma unroll
      for (int n = 0; n < kHd / 16; ++n) wmma::fill_fragment(o_frag[n], 0.f);
#pragma unroll
      for (int kk = 0; kk < kTcTileK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, pw + kk, kPLd);
#pragma unroll
        for (int n = 0; n < kHd / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> vb;
          wmma::load_matrix_sync(vb, vs + kk * kLd + n * 16, kLd);
          wmma::mma_sync(o_frag[n], pa, vb, o_frag[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kHd / 16; ++n) {
        wmma::store_matrix_sync(scratch + n * 16, o_frag[n], kSLd, wmma::mem_row_major);
      }
      __syncwarp();
      const float* orow = scratch + row * kSLd + half * kHalfDims;
#pragma unroll
      for (int i = 0; i < kHalfDims; ++i) o[i] += orow[i];
      __syncwarp();  // the scratch is S again in the next tile
    }
    if (t < run_end) {
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t out = (t * a.num_q_heads + h) * kHd + half * kHalfDims;
#pragma unroll
      for (int i = 0; i < kHalfDims; ++i) StoreOut(a.out, a.rounded, out + i, o[i] * inv);
    }
    run = run_end;
  }
}

template <int kHd, typename E>
cudaError_t LaunchTc(const PagedAttentionArgs& a, cudaStream_t stream) {
  return LaunchPromptKernel(TensorCorePrefillKernel<kHd, E>, a, kTcTileQ, kTcThreads,
                            TcSharedBytes<kHd>(), stream);
}

}  // namespace

bool TensorCorePrefillCapable(const PagedAttentionArgs& a) {
  const int64_t hd = a.layer.head_dim;
  return (hd == 64 || hd == 128) &&
         (a.layer.dtype == DType::kBF16 || a.layer.dtype == DType::kF16) && a.num_q_heads > 0 &&
         a.num_q_heads <= 65535 && a.layer.num_kv_heads > 0 &&
         a.num_q_heads % a.layer.num_kv_heads == 0;
}

cudaError_t LaunchTensorCorePrefillAttention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (!TensorCorePrefillCapable(a)) return cudaErrorInvalidValue;
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.layer.dtype == DType::kBF16) {
    return a.layer.head_dim == 64 ? LaunchTc<64, __nv_bfloat16>(a, stream)
                                  : LaunchTc<128, __nv_bfloat16>(a, stream);
  }
  return a.layer.head_dim == 64 ? LaunchTc<64, __half>(a, stream)
                                : LaunchTc<128, __half>(a, stream);
}

}  // namespace tandem::cuda
