#include "common/backend/cuda/prefill_attention.h"

#include <type_traits>

#include "common/backend/cuda/kv_types.cuh"
#include "common/backend/cuda/prompt_runs.cuh"
#include "common/backend/cuda/store_out.cuh"

namespace tandem::cuda {
namespace {

constexpr int kTileQ = 64;            // new tokens a block takes
constexpr int kPrefillThreads = 256;  // 32 row groups (2 rows each) × 8 lanes
template <int kHd>
__host__ __device__ constexpr int TileK() {
  return kHd <= 128 ? 32 : 16;
}  // keys a shared-memory tile holds

template <int kHd>
constexpr size_t SharedFloats() {
  return size_t(kTileQ + 2 * TileK<kHd>()) * (kHd + 1) + size_t(kTileQ) * (TileK<kHd>() + 1);
}

// Grid (ceil(num_tokens / kTileQ), num_q_heads), kPrefillThreads threads, SharedFloats<kHd>()
// floats of dynamic shared memory. Thread (rg, c) = (threadIdx.x / 8, threadIdx.x % 8) owns rows 2
// rg and 2 rg + 1 of the tile: their scores for keys c · kKeys ... of each key tile, and output
// dimensions c, c + 8, ... The 8 lanes of a row group reduce a row's max and sum by shuffles.
// Shared rows are padded by one float so that neither the strided key rows nor the query rows share
// a bank.
template <int kHd, typename T>
__global__ void __launch_bounds__(kPrefillThreads) TiledPrefillKernel(PagedAttentionArgs a) {
  constexpr int kTileK = TileK<kHd>();
  constexpr int kKeys = kTileK / 8;  // scores per row a thread computes per tile
  constexpr int kDims = kHd / 8;     // output dimensions per row a thread accumulates
  constexpr int kStride = kHd + 1;
  constexpr int kPStride = kTileK + 1;
  TANDEM_DYNAMIC_SHARED(float, smem, 16);
  float* qs = smem;                   // [kTileQ][kStride]
  float* ks = qs + kTileQ * kStride;  // [kTileK][kStride]
  float* vs = ks + kTileK * kStride;  // [kTileK][kStride]
  float* ps = vs + kTileK * kStride;  // [kTileQ][kPStride]
  const int rg = threadIdx.x / 8, c8 = threadIdx.x % 8;
  const int64_t h = blockIdx.y, group = a.num_q_heads / a.layer.num_kv_heads, kh = h / group;
  const int64_t t_begin = int64_t(blockIdx.x) * kTileQ, t_end = min(t_begin + kTileQ, a.num_tokens);
  const int64_t bs = a.layer.block_size;
  const KvRows<T> krows{static_cast<const T*>(a.layer.k_cache), a.layer.num_kv_heads, kHd, bs};
  const KvRows<T> vrows{static_cast<const T*>(a.layer.v_cache), a.layer.num_kv_heads, kHd, bs};

  for (int64_t run = t_begin; run < t_end;) {
    // This run: the tile's tokens of one sequence, [run, run_end).
    const PromptRun pr = FindPromptRun(a, run, t_end);
    const int64_t run_end = pr.end, ctx = pr.ctx, keys = pr.keys;
    const int32_t* table = pr.table;
    if (pr.skip) {
      run = run_end;  // the split-KV kernel's (uniform across the block)
      continue;
    }
    // Keys each of this thread's rows sees (0: not a row of the run).
    int64_t len[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t t = run + 2 * rg + i;
      len[i] = t < run_end ? PromptKeys(a, t, ctx) : 0;
    }

    __syncthreads();  // the previous run is done with qs
    for (int64_t i = threadIdx.x; i < int64_t(kTileQ) * kHd; i += kPrefillThreads) {
      const int64_t r = i / kHd, d = i % kHd, t = run + r;
      qs[r * kStride + d] = t < run_end ? a.q[(t * a.num_q_heads + h) * kHd + d] : 0.f;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float acc[2][kDims];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < kDims; ++j) acc[i][j] = 0.f;
    }
    for (int64_t k0 = 0; k0 < keys; k0 += kTileK) {
      __syncthreads();  // qs written (first tile); ks, vs free again (later tiles)
      for (int64_t i = threadIdx.x; i < int64_t(kTileK) * kHd; i += kPrefillThreads) {
        const int64_t j = i / kHd, d = i % kHd, p = k0 + j;
        float kv = 0.f, vv = 0.f;
        if (p < keys) {
          const int64_t slot = int64_t(table[p / bs]) * bs + p % bs;
          kv = LoadKv(krows.Row(slot, kh) + d);
          vv = LoadKv(vrows.Row(slot, kh) + d);
          if constexpr (kScaledKv<T>) {  // staged dequantized
            kv *= krows.Scale(slot, kh);
            vv *= vrows.Scale(slot, kh);
          }
        }
        ks[j * kStride + d] = kv;
        vs[j * kStride + d] = vv;
      }
      __syncthreads();
      float sc[2][kKeys];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < kKeys; ++j) sc[i][j] = 0.f;
      }
#pragma unroll 8
      for (int d = 0; d < kHd; ++d) {
        const float q0 = qs[(2 * rg) * kStride + d], q1 = qs[(2 * rg + 1) * kStride + d];
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          const float kk = ks[(c8 * kKeys + j) * kStride + d];
          sc[0][j] = fmaf(q0, kk, sc[0][j]);
          sc[1][j] = fmaf(q1, kk, sc[1][j]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          const int64_t p = k0 + c8 * kKeys + j;
          sc[i][j] =
              p < len[i] ? sc[i][j] * a.scale : -INFINITY;  // causal: keys up to the row's position
          tile_max = fmaxf(tile_max, sc[i][j]);
        }
#pragma unroll
        for (int o = 4; o > 0; o >>= 1)
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
        const float new_m = fmaxf(m[i], tile_max);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          const float e = new_m == -INFINITY ? 0.f : expf(sc[i][j] - new_m);
          ps[(2 * rg + i) * kPStride + c8 * kKeys + j] = e;
          sum += e;
        }
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float corr =
            m[i] == -INFINITY ? 0.f : expf(m[i] - new_m);  // nothing accumulated yet: 0
        l[i] = l[i] * corr + sum;
#pragma unroll
        for (int j = 0; j < kDims; ++j) acc[i][j] *= corr;
        m[i] = new_m;
      }
      __syncwarp();  // a row group's probabilities are read by its own 8 lanes, in this warp
#pragma unroll 4
      for (int j = 0; j < kTileK; ++j) {
        const float p0 = ps[(2 * rg) * kPStride + j], p1 = ps[(2 * rg + 1) * kPStride + j];
#pragma unroll
        for (int d = 0; d < kDims; ++d) {
          const float v = vs[j * kStride + c8 + 8 * d];
          acc[0][d] = fmaf(p0, v, acc[0][d]);
          acc[1][d] = fmaf(p1, v, acc[1][d]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t t = run + 2 * rg + i;
      if (t >= run_end) continue;
      const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
      const int64_t o = (t * a.num_q_heads + h) * kHd;
#pragma unroll
      for (int d = 0; d < kDims; ++d) StoreOut(a.out, a.rounded, o + c8 + 8 * d, acc[i][d] * inv);
    }
    run = run_end;
  }
}

template <int kHd, typename T>
cudaError_t Launch(const PagedAttentionArgs& a, cudaStream_t stream) {
  return LaunchPromptKernel(TiledPrefillKernel<kHd, T>, a, kTileQ, kPrefillThreads,
                            SharedFloats<kHd>() * sizeof(float), stream);
}

}  // namespace

bool TiledPrefillCapable(const PagedAttentionArgs& a) {
  const int64_t hd = a.layer.head_dim;
  return (hd == 32 || hd == 64 || hd == 128 || hd == 256) && a.num_q_heads > 0 &&
         a.num_q_heads <= 65535 && a.layer.num_kv_heads > 0 &&
         a.num_q_heads % a.layer.num_kv_heads == 0;
}

bool TiledPrefillPays(const PagedAttentionArgs& a) {
  return a.num_tokens >= 64 && a.num_tokens >= 4 * a.num_seqs;
}

cudaError_t LaunchTiledPrefillAttention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (!TiledPrefillCapable(a)) return cudaErrorInvalidValue;
  if (a.num_tokens == 0) return cudaSuccess;
  return WithKvType(a.layer.dtype, [&](auto* type) -> cudaError_t {
    using T = std::remove_pointer_t<decltype(type)>;
    switch (a.layer.head_dim) {
      case 32: return Launch<32, T>(a, stream);
      case 64: return Launch<64, T>(a, stream);
      case 128: return Launch<128, T>(a, stream);
      default: return Launch<256, T>(a, stream);
    }
  });
}

}  // namespace tandem::cuda
