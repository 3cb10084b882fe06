#include "common/backend/cuda/quant_gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/backend/cuda/activation.cuh"
#include "common/backend/cuda/block_reduce.cuh"
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kv_types.cuh"
#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/qkv_prologue.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;      // output columns a GEMV block computes
constexpr int kThreads = 256;  // the other kernels' blocks

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The GEMV stages each activation row's tile of k in shared memory once per block (every warp of
// the block reads it there, not from L1 at a 128-byte stride a lane): float4 piece p of 32-column
// block i of the tile sits in slot i * 8 + ((p + i) & 7), so that the 8 lanes of a phase, which
// read piece p of 8 consecutive blocks, hit 8 different bank groups, and so do the 8 threads that
// store one block's pieces.
constexpr int kTileFloats = 8192;  // f32 of x a block stages at once (32 KiB), over all n rows

template <int N>
constexpr int kTileBlocks = (kTileFloats / (N * 32)) / 32 * 32;  // 32-column blocks a tile: 32 T

__device__ __forceinline__ int Slot(int block, int piece) {
  return block * 8 + ((piece + block) & 7);
}

// q (an int4 code, or an int8 code + 128) as an exact float: 2^23 + q read as a float, less 2^23.
__device__ __forceinline__ float ExactCode(uint32_t q, float offset) {
  return __uint_as_float(0x4B000000u | q) - offset;
}

// The codes of one 32-column block of C weight rows: int4 16 bytes, int8 32 bytes a row.
template <bool kInt4, int C>
struct BlockCodes {
  uint4 v[C][kInt4 ? 1 : 2];
};

// Blocks b + 64 and b + 96 of the C rows towards L2 (loads further ahead, in no register).
template <bool kInt4, int C>
__device__ __forceinline__ void PrefetchCodes(const uint8_t* const (&rows)[C], int64_t b,
                                              int64_t blocks) {
#ifdef __CUDA_ARCH__
#pragma unroll
  for (int u = 2; u <= 3; ++u) {
    if (b + 32 * u >= blocks) break;
#pragma unroll
    for (int c = 0; c < C; ++c)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(rows[c] + (b + 32 * u) * (kInt4 ? 16 : 32)));
  }
#endif
}

template <bool kInt4, int C>
__device__ __forceinline__ void LoadCodes(const uint8_t* const (&rows)[C], int64_t b,
                                          BlockCodes<kInt4, C>& codes) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if constexpr (kInt4) {
      codes.v[c][0] = *reinterpret_cast<const uint4*>(rows[c] + b * 16);
    } else {
      codes.v[c][0] = *reinterpret_cast<const uint4*>(rows[c] + b * 32);
      codes.v[c][1] = *reinterpret_cast<const uint4*>(rows[c] + b * 32 + 16);
    }
  }
}

// Code j of one weight row's 32-column block as an exact float, in column order (int4: byte j % 16
// holds column j in its low half for j < 16, in its high half for j >= 16; int8: signed).
template <bool kInt4>
__device__ __forceinline__ float CodeValue(const uint4 (&v)[kInt4 ? 1 : 2], int j) {
  if constexpr (kInt4) {
    const int byte = j % 16;
    const uint32_t word = byte < 4 ? v[0].x : byte < 8 ? v[0].y : byte < 12 ? v[0].z : v[0].w;
    return ExactCode((word >> (8 * (byte % 4) + (j < 16 ? 0 : 4))) & 0xFu, 8388608.f);
  } else {
    const uint4& h = v[j / 16];
    const int i = j % 16;
    const uint32_t word = i < 4 ? h.x : i < 8 ? h.y : i < 12 ? h.z : h.w;
    return ExactCode(((word >> (8 * (i % 4))) & 0xFFu) ^ 0x80u, 8388736.f);
  }
}

// Grid ceil(mo / (kWarps P)), kWarps warps, where mo is the output's columns (w.m, or w.m / 2 with
// silu_mul) and P the columns a warp writes (C, or C / 2 with silu_mul: gate and up rows in pairs):
// warp w of block b computes output columns (b kWarps + w) P + c, c < P, for the N rows (the
// header's order of folding, whatever N and C). The fusion's prologue scales x as it is staged;
// its epilogue replaces the write.
template <int N, int C, bool kInt4>
__global__ void __launch_bounds__(kWarps * 32)
    QuantGemvKernel(const float* __restrict__ x, QuantWeight w, const float* __restrict__ bias,
                    float* out, QuantGemvFusion f, QkvPrologueArgs heads) {
  __shared__ float4 xs[kTileFloats / 4];  // [N][kTileBlocks<N>][8] swizzled (Slot)
  constexpr int kTile = kTileBlocks<N>;
  const int lane = threadIdx.x % 32;
  const int pairs = f.silu_mul ? C / 2 : C;  // output columns a warp writes
  const int64_t mo = f.silu_mul ? w.m / 2 : w.m;
  const int64_t col0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * pairs;
  const bool active = col0 < mo;  // a warp past mo only helps stage x
  const uint8_t* rows[C];
  const float* scales[C];
  const float* zeros[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    // A column past mo reads column col0's row again; its result is not written.
    const int cc = c % pairs;
    int64_t col = active && col0 + cc < mo ? col0 + cc : (active ? col0 : 0);
    if (c >= pairs) col += mo;  // silu_mul: the up row of the pair
    rows[c] = w.codes + col * w.row_bytes;
    scales[c] = w.scales + col * w.groups;
    zeros[c] = w.zeros != nullptr ? w.zeros + col * w.groups : nullptr;
  }
  // The norm prologue: each row's RMSNorm scale, as RmsNormKernel's block of this size folds it.
  float inv[N];
#pragma unroll
  for (int t = 0; t < N; ++t) inv[t] = 1.f;
  if (f.norm != nullptr) {
    __shared__ float red[32];
#pragma unroll
    for (int t = 0; t < N; ++t) inv[t] = RmsScale(x + t * w.k, w.k, f.eps, red);
  }
  float acc[C][N];
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int t = 0; t < N; ++t) acc[c][t] = 0.f;
  }
  const int64_t blocks = w.k / 32;
  BlockCodes<kInt4, C> next;
  if (active && lane < blocks) {  // before x's staging
    LoadCodes<kInt4, C>(rows, lane, next);
    PrefetchCodes<kInt4, C>(rows, lane - 32, blocks);
  }
  for (int64_t tile = 0; tile < blocks; tile += kTile) {
    const int nb = static_cast<int>(blocks - tile < kTile ? blocks - tile : kTile);
    __syncthreads();  // the previous tile is read
    for (int i = threadIdx.x; i < N * nb * 8; i += kWarps * 32) {
      const int t = i / (nb * 8), b = (i / 8) % nb, p = i % 8;
      const int64_t j = (tile + b) * 32 + 4 * p;
      float4 v = *reinterpret_cast<const float4*>(x + t * w.k + j);
      if (f.norm != nullptr) {  // RmsNormKernel's x · inv · norm
        const float4 g = *reinterpret_cast<const float4*>(f.norm + j);
        float it = 1.f;
#pragma unroll
        for (int u = 0; u < N; ++u) it = u == t ? inv[u] : it;  // inv[t], t not a constant
        v = make_float4(v.x * it * g.x, v.y * it * g.y, v.z * it * g.z, v.w * it * g.w);
      }
      xs[t * kTile * 8 + Slot(b, p)] = v;
    }
    __syncthreads();
    if (!active) continue;
    for (int b = lane; b < nb; b += 32) {
      const BlockCodes<kInt4, C> codes = next;
      const int64_t g = (tile + b) * 32 / w.group_size;
      if (tile + b + 32 < blocks) LoadCodes<kInt4, C>(rows, tile + b + 32, next);
      PrefetchCodes<kInt4, C>(rows, tile + b + 32, blocks);
      float s[C], z[C];
#pragma unroll
      for (int c = 0; c < C; ++c) {
        s[c] = scales[c][g];
        z[c] = zeros[c] != nullptr ? zeros[c][g] : 0.f;
      }
      // With more than 2 rows a warp converts its codes once (C × 32 registers); with fewer, as it
      // folds them (registers for 4 columns a warp). The same sums either way.
      constexpr bool kStoreCodes = N > 2;
      float q[kStoreCodes ? C : 1][32];
      if constexpr (kStoreCodes) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
#pragma unroll
          for (int j = 0; j < 32; ++j) q[c][j] = CodeValue<kInt4>(codes.v[c], j);
        }
      }
#pragma unroll
      for (int t = 0; t < N; ++t) {
        // Σ (q − zero) · scale · x over the block, as scale · (Σ q x − zero Σ x), each sum in
        // column order, a staged float4 of x at a time.
        float sx = 0.f, d[C];
#pragma unroll
        for (int c = 0; c < C; ++c) d[c] = 0.f;
#pragma unroll
        for (int p = 0; p < 8; ++p) {
          const float4 a4 = xs[t * kTile * 8 + Slot(b, p)];
          const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) sx += a[e];
#pragma unroll
          for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int j = 4 * p + e;
              const float qj =
                  kStoreCodes ? q[kStoreCodes ? c : 0][j] : CodeValue<kInt4>(codes.v[c], j);
              d[c] = fmaf(qj, a[e], d[c]);
            }
          }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c][t] = fmaf(s[c], fmaf(-z[c], sx, d[c]), acc[c][t]);
      }
    }
  }
  if (!active) return;  // (with heads every warp has columns: m is a whole number of blocks)
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      for (int o = 16; o > 0; o >>= 1) acc[c][t] += __shfl_xor_sync(0xffffffffu, acc[c][t], o);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (c >= pairs || col0 + c >= mo) break;
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float& o = out[t * mo + col0 + c];
        if (f.silu_mul) {
          o = SiluTimes(acc[c][t], acc[(c + C / 2) % C][t]);  // pairs = C / 2
        } else if (f.accumulate) {
          o = o + acc[c][t];
        } else {
          o = acc[c][t] + (bias != nullptr ? bias[col0 + c] : 0.f);
        }
      }
    }
  }
  if (f.head_counters != nullptr) {
    // The q|k|v prologue: the last of a head's blocks to finish runs it on that head, warp t for
    // token t, staging rows where x's tile was (every warp is past the tile loop).
    const int64_t hd = heads.layer.head_dim, head = int64_t(blockIdx.x) * kWarps * C / hd;
    if (!LastBlockToArrive(f.head_counters + head, unsigned(hd / (kWarps * C)))) return;
    const int warp = threadIdx.x / 32;
    if (warp >= N) return;
    float* staged = reinterpret_cast<float*>(xs) + warp * kMaxPrologueHeadDim;
    switch (heads.layer.dtype) {
      case DType::kBF16: PrologueHead<__nv_bfloat16>(heads, warp, head, staged); break;
      case DType::kF16: PrologueHead<__half>(heads, warp, head, staged); break;
      case DType::kF8E4M3: PrologueHead<__nv_fp8_e4m3>(heads, warp, head, staged); break;
      default: PrologueHead<float>(heads, warp, head, staged); break;
    }
  }
}

// One thread a (row, 32-column block): its 32 weights written as T.
template <typename T, bool kInt4>
__global__ void DequantizeKernel(QuantWeight w, T* __restrict__ out) {
  const int64_t blocks = w.k / 32, units = w.m * blocks, groups = w.groups;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / blocks, b = u % blocks, g = b * 32 / w.group_size;
    const uint8_t* const row[1] = {w.codes + r * w.row_bytes};
    BlockCodes<kInt4, 1> codes;
    LoadCodes<kInt4, 1>(row, b, codes);
    const float scale = w.scales[r * groups + g];
    const float zero = w.zeros != nullptr ? w.zeros[r * groups + g] : 0.f;
    for (int j = 0; j < 32; ++j) {  // (q − zero) · scale
      StoreKv(out + r * w.k + b * 32 + j, (CodeValue<kInt4>(codes.v[0], j) - zero) * scale);
    }
  }
}

__global__ void GatherColumnsKernel(const float* __restrict__ x, int64_t n, int64_t k,
                                    const int32_t* __restrict__ perm, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * k;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = x[(i / k) * k + perm[i % k]];
  }
}

unsigned Blocks(int64_t units) {
  return static_cast<unsigned>(std::min<int64_t>((units + kThreads - 1) / kThreads, 65535));
}

template <int N, int C>
cudaError_t LaunchRows(const float* x, const QuantWeight& w, const float* bias, float* out,
                       const QuantGemvFusion& f, cudaStream_t stream) {
  const int64_t per_block = kWarps * (f.silu_mul ? C / 2 : C), mo = f.silu_mul ? w.m / 2 : w.m;
  const dim3 grid(static_cast<unsigned>((mo + per_block - 1) / per_block));
  const QkvPrologueArgs heads = f.heads != nullptr ? *f.heads : QkvPrologueArgs{};
  if (w.type == QuantType::kInt4) {
    return Launch(QuantGemvKernel<N, C, true>, grid, kWarps * 32, 0, stream, x, w, bias, out, f,
                  heads);
  }
  return Launch(QuantGemvKernel<N, C, false>, grid, kWarps * 32, 0, stream, x, w, bias, out, f,
                heads);
}

// At most 4 columns a warp for 1 row, 2 for up to 4 rows, 1 beyond (registers: a warp holds C rows
// of codes, and the compiler keeps each code's float for every row it folds); silu_mul pairs gate
// and up rows, so 2 or 4.
template <int N>
cudaError_t LaunchColumns(const float* x, const QuantWeight& w, const float* bias, float* out,
                          int columns, const QuantGemvFusion& f, cudaStream_t stream) {
  if constexpr (N == 1) {
    if (columns == 4) return LaunchRows<N, 4>(x, w, bias, out, f, stream);
  }
  if (f.silu_mul || (N <= 4 && columns >= 2)) return LaunchRows<N, 2>(x, w, bias, out, f, stream);
  return LaunchRows<N, 1>(x, w, bias, out, f, stream);
}

}  // namespace

bool QuantLayoutCovered(QuantType type, int64_t k, int64_t group_size) {
  return (type == QuantType::kInt8 || type == QuantType::kInt4) && k > 0 && k % 32 == 0 &&
         group_size > 0 && group_size % 32 == 0;
}

int QuantGemvColumns(int64_t m) { return m >= 8192 ? 4 : m >= 4096 ? 2 : 1; }

bool QuantGemvTakes(int64_t n, const QuantWeight& w, const void* x, const float* bias,
                    const QuantGemvFusion& f) {
  if (n < 1 || n > kGemvMaxRows || w.m <= 0 || !QuantLayoutCovered(w.type, w.k, w.group_size) ||
      !Aligned16(x) || !Aligned16(w.codes) || (w.m + kWarps - 1) / kWarps > 0x7fffffff ||
      int(f.silu_mul) + int(f.accumulate) + int(bias != nullptr) > 1 ||
      (f.silu_mul && w.m % 2 != 0) || (f.norm != nullptr && !Aligned16(f.norm))) {
    return false;
  }
  if (f.heads == nullptr) return f.head_counters == nullptr;
  const QkvPrologueArgs& h = *f.heads;
  const int64_t hd = h.layer.head_dim;
  return !f.silu_mul && !f.accumulate && f.head_counters != nullptr && hd > 0 && hd % kWarps == 0 &&
         hd <= kMaxPrologueHeadDim && h.num_tokens == n && h.num_q_heads > 0 &&
         h.layer.num_kv_heads > 0 && w.m == (h.num_q_heads + 2 * h.layer.num_kv_heads) * hd &&
         (h.layer.dtype == DType::kBF16 || h.layer.dtype == DType::kF16 ||
          h.layer.dtype == DType::kF8E4M3 || h.layer.dtype == DType::kF32);
}

cudaError_t LaunchQuantGemv(const float* x, int64_t n, const QuantWeight& w, const float* bias,
                            float* out, cudaStream_t stream, int columns,
                            const QuantGemvFusion& f) {
  if (columns == 0) columns = QuantGemvColumns(f.silu_mul ? w.m / 2 : w.m);
  if (!QuantGemvTakes(n, w, x, bias, f) || (columns != 1 && columns != 2 && columns != 4) ||
      (f.heads != nullptr && f.heads->qkv != out)) {
    return cudaErrorInvalidValue;
  }
  if (f.heads != nullptr) {
    // A block's columns lie in one head: fewer columns a warp where the head is narrower than the
    // block (the columns that run, as LaunchColumns picks them).
    const int64_t hd = f.heads->layer.head_dim;
    columns = std::min(columns, n == 1 ? 4 : n <= 4 ? 2 : 1);
    while (columns > 1 && hd % (kWarps * columns) != 0) columns /= 2;
  }
  switch (n) {
    case 1: return LaunchColumns<1>(x, w, bias, out, columns, f, stream);
    case 2: return LaunchColumns<2>(x, w, bias, out, columns, f, stream);
    case 3: return LaunchColumns<3>(x, w, bias, out, columns, f, stream);
    case 4: return LaunchColumns<4>(x, w, bias, out, columns, f, stream);
    case 5: return LaunchColumns<5>(x, w, bias, out, columns, f, stream);
    case 6: return LaunchColumns<6>(x, w, bias, out, columns, f, stream);
    case 7: return LaunchColumns<7>(x, w, bias, out, columns, f, stream);
    default: return LaunchColumns<8>(x, w, bias, out, columns, f, stream);
  }
}

cudaError_t LaunchDequantize(const QuantWeight& w, DType dtype, void* out, cudaStream_t stream) {
  if (!QuantLayoutCovered(w.type, w.k, w.group_size) || !Aligned16(w.codes) ||
      (dtype != DType::kBF16 && dtype != DType::kF16)) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = Blocks(w.m * (w.k / 32));
  const bool int4 = w.type == QuantType::kInt4;
  if (dtype == DType::kBF16) {
    auto* o = static_cast<__nv_bfloat16*>(out);
    return int4 ? Launch(DequantizeKernel<__nv_bfloat16, true>, grid, kThreads, 0, stream, w, o)
                : Launch(DequantizeKernel<__nv_bfloat16, false>, grid, kThreads, 0, stream, w, o);
  }
  auto* o = static_cast<__half*>(out);
  return int4 ? Launch(DequantizeKernel<__half, true>, grid, kThreads, 0, stream, w, o)
              : Launch(DequantizeKernel<__half, false>, grid, kThreads, 0, stream, w, o);
}

cudaError_t LaunchGatherColumns(const float* x, int64_t n, int64_t k, const int32_t* perm,
                                float* out, cudaStream_t stream) {
  if (n * k == 0) return cudaSuccess;
  return Launch(GatherColumnsKernel, Blocks(n * k), kThreads, 0, stream, x, n, k, perm, out);
}

}  // namespace tandem::cuda
