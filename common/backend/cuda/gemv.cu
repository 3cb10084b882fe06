#include "common/backend/cuda/gemv.h"

#include "common/backend/cuda/activation.cuh"
#include "common/backend/cuda/block_reduce.cuh"
#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/qkv_prologue.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tandem::cuda {
namespace {

constexpr int kGemvWarps = 8;   // output columns per block
constexpr int kGemvUnroll = 4;  // 16-byte weight loads in flight per lane

// 16 bytes of weights, streamed past L1 (the activations, re-read by every warp, stay there).
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
#else
  return *p;  // the CUDA emulator
#endif
}

// The two 16-bit weights of a 32-bit word as floats (low half first).
__device__ __forceinline__ float2 Unpack(uint32_t word, __nv_bfloat16*) {
  return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
}
__device__ __forceinline__ float2 Unpack(uint32_t word, __half*) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = word;
  return __half22float2(h);
}

// Steps of 2 to 8 rows stage their activations in shared memory a tile at a time (kGemvTileFloats
// over all rows, a whole number of rounds of pieces), where one row's pieces stay in L1 but 8 rows
// of a long k do not (a 65536-wide down projection's 8 rows are 2 MB, re-read by every warp).
// Half h of piece q of a row sits in slot 2q + (h ^ ((q >> 2) & 1)): the 8 lanes of a phase, which
// read half h of 8 consecutive pieces, and the 8 threads that store 4 pieces, hit 8 bank groups.
constexpr int kGemvTileFloats = 8192;  // 32 KiB

template <int N>
constexpr int kGemvTilePieces = (kGemvTileFloats / N / 1024) * 128;  // rounds of 32 x 4 pieces

__device__ __forceinline__ int StagedSlot(int q, int h) { return 2 * q + (h ^ ((q >> 2) & 1)); }

// acc[c][t] += Σ_{i<8} w_c[i] · a[t][base + i], in element order, for each of the C columns whose
// 16 bytes of weights are wv[c]: each activation piece is read once for all C columns, and each
// column folds exactly as it would alone. The activations a are x, or with kNorm RmsNorm(x) as
// RmsNormKernel writes it: x[t][j] · inv[t] · norm[j].
// With kStaged the activations come from the block's shared tile xs (StagedSlot) instead of x:
// piece `base / 8 - tile` of row t there is the same 8 floats.
template <typename W, int N, int C, bool kNorm, bool kStaged = false>
__device__ __forceinline__ void Fold(const uint4 (&wv)[C], const float* __restrict__ x, int64_t k,
                                     int64_t base, const float (&inv)[N],
                                     const float* __restrict__ norm, float (&acc)[C][N],
                                     const float4* xs = nullptr, int64_t tile = 0,
                                     int tile_pieces = 0) {
  float w[C][8];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const uint32_t words[4] = {wv[c].x, wv[c].y, wv[c].z, wv[c].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = Unpack(words[i], static_cast<W*>(nullptr));
      w[c][2 * i] = f.x;
      w[c][2 * i + 1] = f.y;
    }
  }
  float4 na, nb;
  if constexpr (kNorm) {
    na = *reinterpret_cast<const float4*>(norm + base);
    nb = *reinterpret_cast<const float4*>(norm + base + 4);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    float4 a, b;
    if constexpr (kStaged) {
      const int q = static_cast<int>(base / 8 - tile);
      a = xs[t * tile_pieces * 2 + StagedSlot(q, 0)];
      b = xs[t * tile_pieces * 2 + StagedSlot(q, 1)];
    } else {
      a = *reinterpret_cast<const float4*>(x + t * k + base);
      b = *reinterpret_cast<const float4*>(x + t * k + base + 4);
    }
    if constexpr (kNorm) {
      a = make_float4(a.x * inv[t] * na.x, a.y * inv[t] * na.y, a.z * inv[t] * na.z,
                      a.w * inv[t] * na.w);
      b = make_float4(b.x * inv[t] * nb.x, b.y * inv[t] * nb.y, b.z * inv[t] * nb.z,
                      b.w * inv[t] * nb.w);
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float s = acc[c][t];
      s = fmaf(w[c][0], a.x, s);
      s = fmaf(w[c][1], a.y, s);
      s = fmaf(w[c][2], a.z, s);
      s = fmaf(w[c][3], a.w, s);
      s = fmaf(w[c][4], b.x, s);
      s = fmaf(w[c][5], b.y, s);
      s = fmaf(w[c][6], b.z, s);
      s = fmaf(w[c][7], b.w, s);
      acc[c][t] = s;
    }
  }
}

// What a warp does with its columns' sums (GemvEpilogue): write them, add a bias, (kSiluMul) pair
// gate column j with up column m + j of a [2m][k] weight and write silu(gate) · up, or
// (kAccumulate) add them to out.
enum class Epi { kNone, kBias, kSiluMul, kAccumulate };

// Grid ceil(m / (kGemvWarps C)), kGemvWarps warps: warp w of block b computes the C output columns
// from (b kGemvWarps + w) C (kSiluMul: from 2C weight rows). Each lane folds the 8-element pieces
// lane, lane + 32, ... of its weight rows in that order (whatever C, the epilogue and the loads in
// flight), so every C and epilogue gives a column the same sum, and the epilogue's arithmetic is
// the separate kernels' (AddBiasKernel, SiluMulPackedKernel, AddKernel). With kNorm every block
// first computes each row's RMSNorm scale as RmsNormKernel's block of the same size does
// (block_reduce.cuh: RmsScale). With kHeads (GemvEpilogue::heads; C = 1, so a block's columns lie
// in one head) the last of a head's blocks to finish runs the q|k|v prologue on it, warp t for
// token t.
template <typename W, int N, int C, Epi E, bool kNorm, bool kHeads>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvKernel(const float* __restrict__ x, const W* __restrict__ w, int64_t m, int64_t k,
               const float* __restrict__ bias, const float* __restrict__ norm, float eps,
               float* out, QkvPrologueArgs heads, unsigned* head_counters) {
  constexpr int R = E == Epi::kSiluMul ? 2 * C : C;                   // weight rows a warp folds
  constexpr int kUnroll = kGemvUnroll / R > 0 ? kGemvUnroll / R : 1;  // loads in flight a row
  constexpr bool kStaged = N >= 2;  // (one row's pieces stay in L1)
  constexpr int kTilePieces = kStaged ? kGemvTilePieces<N> : 1;
  __shared__ float4 xs[kStaged ? kTilePieces * 2 * N : 1];  // [N][kTilePieces][2] (StagedSlot)
  const int lane = threadIdx.x % 32;
  const int64_t col0 = (int64_t(blockIdx.x) * kGemvWarps + threadIdx.x / 32) * C;
  // A warp of no column reads and writes nothing and need not wait, unless the block's norm or its
  // staging needs it (with kHeads every warp has a column: m is a whole number of heads).
  if (!kNorm && !kHeads && !kStaged && col0 >= m) return;
  const uint4* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    // A column past m reads column col0's row again; its result is not written.
    const int64_t c = r % C, col = col0 + c < m ? col0 + c : col0;
    rows[r] = reinterpret_cast<const uint4*>(w + (r < C ? col : m + col) * k);
  }
  const int64_t pieces = k / 8;
  // No kernel writes the weights: this lane's first round of them starts towards L2 before the wait
  // for the previous kernel (programmatic dependent launch), whose results (x) are read only after
  // it.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#ifdef __CUDA_ARCH__
      if (col0 < m && lane + 32 * u < pieces)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(rows[r] + lane + 32 * u));
#endif
    }
  }
  PdlPrologue();
  float inv[N] = {};
  if constexpr (kNorm) {
    __shared__ float red[32];
#pragma unroll
    for (int t = 0; t < N; ++t) inv[t] = RmsScale(x + t * k, k, eps, red);
    if (!kHeads && !kStaged && col0 >= m) return;
  }
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = 0.f;
  }
  // Lane l folds pieces l, l + 32, ... in order, tile after tile (a tile is a whole number of
  // rounds, so the order is the unstaged kernel's).
  for (int64_t tile = 0; tile < pieces; tile += kStaged ? kTilePieces : pieces) {
    const int64_t end = kStaged && tile + kTilePieces < pieces ? tile + kTilePieces : pieces;
    if constexpr (kStaged) {
      const int tp = static_cast<int>(end - tile);
      __syncthreads();  // the previous tile is read
      for (int i = threadIdx.x; i < N * tp * 2; i += kGemvWarps * 32) {
        const int t = i / (tp * 2), q = (i / 2) % tp, h = i % 2;
        xs[t * kTilePieces * 2 + StagedSlot(q, h)] =
            *reinterpret_cast<const float4*>(x + t * k + (tile + q) * 8 + 4 * h);
      }
      __syncthreads();
      if (col0 >= m) continue;  // a warp of no column only stages
    }
    int64_t p = tile + lane;
    // Every load of a round issued before the first use.
    for (; p + 32 * (kUnroll - 1) < end; p += 32 * kUnroll) {
      uint4 wv[kUnroll][R];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = LoadStreaming(rows[r] + p + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        Fold<W, N, R, kNorm, kStaged>(wv[u], x, k, (p + 32 * u) * 8, inv, norm, acc, xs, tile,
                                      kTilePieces);
      }
    }
    for (; p < end; p += 32) {
      uint4 wv[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r] = LoadStreaming(rows[r] + p);
      Fold<W, N, R, kNorm, kStaged>(wv, x, k, p * 8, inv, norm, acc, xs, tile, kTilePieces);
    }
  }
  if (kStaged && !kHeads && col0 >= m) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (col0 + c >= m) break;
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float& o = out[t * m + col0 + c];
        if constexpr (E == Epi::kSiluMul) {
          o = SiluTimes(acc[c][t], acc[C + c][t]);
        } else if constexpr (E == Epi::kBias) {
          o = acc[c][t] + bias[col0 + c];
        } else if constexpr (E == Epi::kAccumulate) {
          o = o + acc[c][t];
        } else {
          o = acc[c][t];
        }
      }
    }
  }
  if constexpr (kHeads) {
    __shared__ float staged[kGemvWarps][kMaxPrologueHeadDim];
    const int64_t head = int64_t(blockIdx.x) * kGemvWarps / heads.layer.head_dim;
    if (!LastBlockToArrive(head_counters + head, unsigned(heads.layer.head_dim / kGemvWarps)))
      return;
    const int warp = threadIdx.x / 32;
    if (warp < N) {
      // The cache is of the weights' 16-bit type, or FP8 E4M3.
      if (heads.layer.dtype == DType::kF8E4M3) {
        PrologueHead<__nv_fp8_e4m3>(heads, warp, head, staged[warp]);
      } else {
        PrologueHead<W>(heads, warp, head, staged[warp]);
      }
    }
  }
}

template <typename W, int N, int C, Epi E, bool kNorm, bool kHeads = false>
void LaunchVariant(const float* x, const W* w, int64_t m, int64_t k, const GemvEpilogue& epi,
                   const GemvPrologue& pro, float* out, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((m + kGemvWarps * C - 1) / (kGemvWarps * C));
  LaunchKernel(GemvKernel<W, N, C, E, kNorm, kHeads>, blocks, kGemvWarps * 32, 0, stream, x, w, m,
               k, epi.bias, pro.norm, pro.eps, out,
               epi.heads != nullptr ? *epi.heads : QkvPrologueArgs{}, epi.head_counters);
}

// The variant for the bias or silu-mul epilogue (or none), with or without the norm (and with the
// heads' prologue, one column a warp).
template <typename W, int N, int C, bool kNorm>
cudaError_t LaunchWriting(const float* x, const W* w, int64_t m, int64_t k, const GemvEpilogue& epi,
                          const GemvPrologue& pro, float* out, cudaStream_t stream) {
  if constexpr (C == 1) {
    if (epi.heads != nullptr) {
      if (epi.bias != nullptr) {
        LaunchVariant<W, N, C, Epi::kBias, kNorm, true>(x, w, m, k, epi, pro, out, stream);
      } else {
        LaunchVariant<W, N, C, Epi::kNone, kNorm, true>(x, w, m, k, epi, pro, out, stream);
      }
      return cudaGetLastError();
    }
  }
  if (epi.silu_mul) {
    LaunchVariant<W, N, C, Epi::kSiluMul, kNorm>(x, w, m, k, epi, pro, out, stream);
  } else if (epi.bias != nullptr) {
    LaunchVariant<W, N, C, Epi::kBias, kNorm>(x, w, m, k, epi, pro, out, stream);
  } else {
    LaunchVariant<W, N, C, Epi::kNone, kNorm>(x, w, m, k, epi, pro, out, stream);
  }
  return cudaGetLastError();
}

template <typename W, int N, int C>
cudaError_t LaunchEpilogue(const float* x, const W* w, int64_t m, int64_t k,
                           const GemvEpilogue& epi, const GemvPrologue& pro, float* out,
                           cudaStream_t stream) {
  if constexpr (C == 1) {  // the norm and the accumulation: one column a warp only
    if (pro.norm != nullptr) return LaunchWriting<W, N, C, true>(x, w, m, k, epi, pro, out, stream);
    if (epi.accumulate) {
      LaunchVariant<W, N, C, Epi::kAccumulate, false>(x, w, m, k, epi, pro, out, stream);
      return cudaGetLastError();
    }
  }
  return LaunchWriting<W, N, C, false>(x, w, m, k, epi, pro, out, stream);
}

template <typename W, int C>
cudaError_t LaunchColumns(const float* x, int64_t n, const W* w, int64_t m, int64_t k,
                          const GemvEpilogue& epi, const GemvPrologue& pro, float* out,
                          cudaStream_t stream) {
  switch (n) {
    case 1: return LaunchEpilogue<W, 1, C>(x, w, m, k, epi, pro, out, stream);
    case 2: return LaunchEpilogue<W, 2, C>(x, w, m, k, epi, pro, out, stream);
    case 3: return LaunchEpilogue<W, 3, C>(x, w, m, k, epi, pro, out, stream);
    case 4: return LaunchEpilogue<W, 4, C>(x, w, m, k, epi, pro, out, stream);
    case 5: return LaunchEpilogue<W, 5, C>(x, w, m, k, epi, pro, out, stream);
    case 6: return LaunchEpilogue<W, 6, C>(x, w, m, k, epi, pro, out, stream);
    case 7: return LaunchEpilogue<W, 7, C>(x, w, m, k, epi, pro, out, stream);
    case 8: return LaunchEpilogue<W, 8, C>(x, w, m, k, epi, pro, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename W>
cudaError_t Launch(const float* x, int64_t n, const W* w, int64_t m, int64_t k,
                   const GemvEpilogue& epi, const GemvPrologue& pro, float* out, int columns,
                   cudaStream_t stream) {
  switch (columns) {
    case 1: return LaunchColumns<W, 1>(x, n, w, m, k, epi, pro, out, stream);
    case 2: return LaunchColumns<W, 2>(x, n, w, m, k, epi, pro, out, stream);
    case 4: return LaunchColumns<W, 4>(x, n, w, m, k, epi, pro, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GemvCovers(int64_t n, DType w_dtype, int64_t k, const void* x, const void* w) {
  return n >= 1 && n <= kGemvMaxRows && (w_dtype == DType::kBF16 || w_dtype == DType::kF16) &&
         k > 0 && k % 8 == 0 && Aligned16(x) && Aligned16(w);
}

bool GemvTakes(const GemvEpilogue& epilogue, const GemvPrologue& prologue, int columns) {
  const int epilogues = (epilogue.bias != nullptr) + epilogue.silu_mul + epilogue.accumulate;
  if (const QkvPrologueArgs* h = epilogue.heads; h != nullptr) {
    const int64_t hd = h->layer.head_dim;
    if (epilogue.silu_mul || epilogue.accumulate || columns != 1 ||
        epilogue.head_counters == nullptr || hd <= 0 || hd % kGemvWarps != 0 ||
        hd > kMaxPrologueHeadDim || h->qkv == nullptr || h->num_q_heads <= 0 ||
        h->layer.num_kv_heads <= 0) {
      return false;
    }
  }
  return epilogues <= 1 && (columns == 1 || (prologue.norm == nullptr && !epilogue.accumulate)) &&
         (prologue.norm == nullptr || (!epilogue.accumulate && Aligned16(prologue.norm))) &&
         (columns == 1 || columns == 2 || columns == 4);
}

cudaError_t LaunchGemv(const float* x, int64_t n, DType w_dtype, const void* w, int64_t m,
                       int64_t k, float* out, cudaStream_t stream, int columns,
                       const GemvEpilogue& epilogue, const GemvPrologue& prologue) {
  if (!GemvCovers(n, w_dtype, k, x, w) || m <= 0 ||
      (m + kGemvWarps - 1) / kGemvWarps > 0x7fffffff || !GemvTakes(epilogue, prologue, columns)) {
    return cudaErrorInvalidValue;
  }
  if (const QkvPrologueArgs* h = epilogue.heads;
      h != nullptr && (h->qkv != out || h->num_tokens != n ||
                       (h->layer.dtype != w_dtype && h->layer.dtype != DType::kF8E4M3) ||
                       m != (h->num_q_heads + 2 * h->layer.num_kv_heads) * h->layer.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (w_dtype == DType::kBF16) {
    return Launch(x, n, static_cast<const __nv_bfloat16*>(w), m, k, epilogue, prologue, out,
                  columns, stream);
  }
  return Launch(x, n, static_cast<const __half*>(w), m, k, epilogue, prologue, out, columns,
                stream);
}

}  // namespace tandem::cuda
