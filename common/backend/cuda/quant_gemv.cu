#include "common/backend/cuda/quant_gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kv_types.cuh"
#include "common/backend/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 8;      // output columns a GEMV block computes
constexpr int kThreads = 256;  // the other kernels' blocks

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The 32 weights of 32-column block b of a row (codes at `row`), dequantized: (q − zero) · scale.
template <bool kInt4>
__device__ __forceinline__ void DequantizeBlock(const uint8_t* row, int64_t b, float scale,
                                                float zero, float (&wv)[32]) {
  if constexpr (kInt4) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + b * 16);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t code = (words[j / 4] >> (8 * (j % 4))) & 0xFFu;
      wv[j] = (static_cast<float>(code & 0xFu) - zero) * scale;
      wv[16 + j] = (static_cast<float>(code >> 4) - zero) * scale;
    }
  } else {
    const uint4 v0 = *reinterpret_cast<const uint4*>(row + b * 32);
    const uint4 v1 = *reinterpret_cast<const uint4*>(row + b * 32 + 16);
    const uint32_t words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const auto code = static_cast<int8_t>((words[j / 4] >> (8 * (j % 4))) & 0xFFu);
      wv[j] = (static_cast<float>(code) - zero) * scale;
    }
  }
}

// Grid ceil(m / kWarps), kWarps warps: warp w of block b computes output column b kWarps + w for
// the N rows (the header's order of folding).
template <int N, bool kInt4>
__global__ void __launch_bounds__(kWarps * 32)
    QuantGemvKernel(const float* __restrict__ x, QuantWeight w, const float* __restrict__ bias,
                    float* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t col = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (col >= w.m) return;
  const uint8_t* row = w.codes + col * w.row_bytes;
  const int64_t groups = w.groups;
  const float* scales = w.scales + col * groups;
  const float* zeros = w.zeros != nullptr ? w.zeros + col * groups : nullptr;
  float acc[N];
#pragma unroll
  for (int t = 0; t < N; ++t) acc[t] = 0.f;
  const int64_t blocks = w.k / 32;
  for (int64_t b = lane; b < blocks; b += 32) {
    const int64_t g = b * 32 / w.group_size;
    float wv[32];
    DequantizeBlock<kInt4>(row, b, scales[g], zeros != nullptr ? zeros[g] : 0.f, wv);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float* xr = x + t * w.k + b * 32;
      float s = acc[t];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 a = *reinterpret_cast<const float4*>(xr + 4 * i);
        s = fmaf(wv[4 * i], a.x, s);
        s = fmaf(wv[4 * i + 1], a.y, s);
        s = fmaf(wv[4 * i + 2], a.z, s);
        s = fmaf(wv[4 * i + 3], a.w, s);
      }
      acc[t] = s;
    }
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  }
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < N; ++t) out[t * w.m + col] = acc[t] + (bias != nullptr ? bias[col] : 0.f);
  }
}

// One thread a (row, 32-column block): its 32 weights written as T.
template <typename T, bool kInt4>
__global__ void DequantizeKernel(QuantWeight w, T* __restrict__ out) {
  const int64_t blocks = w.k / 32, units = w.m * blocks, groups = w.groups;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / blocks, b = u % blocks, g = b * 32 / w.group_size;
    float wv[32];
    DequantizeBlock<kInt4>(w.codes + r * w.row_bytes, b, w.scales[r * groups + g],
                           w.zeros != nullptr ? w.zeros[r * groups + g] : 0.f, wv);
    for (int j = 0; j < 32; ++j) StoreKv(out + r * w.k + b * 32 + j, wv[j]);
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

template <int N>
cudaError_t LaunchRows(const float* x, const QuantWeight& w, const float* bias, float* out,
                       cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((w.m + kWarps - 1) / kWarps));
  if (w.type == QuantType::kInt4) {
    return Launch(QuantGemvKernel<N, true>, grid, kWarps * 32, 0, stream, x, w, bias, out);
  }
  return Launch(QuantGemvKernel<N, false>, grid, kWarps * 32, 0, stream, x, w, bias, out);
}

}  // namespace

bool QuantLayoutCovered(QuantType type, int64_t k, int64_t group_size) {
  return (type == QuantType::kInt8 || type == QuantType::kInt4) && k > 0 && k % 32 == 0 &&
         group_size > 0 && group_size % 32 == 0;
}

cudaError_t LaunchQuantGemv(const float* x, int64_t n, const QuantWeight& w, const float* bias,
                            float* out, cudaStream_t stream) {
  if (n < 1 || n > kGemvMaxRows || w.m <= 0 || !QuantLayoutCovered(w.type, w.k, w.group_size) ||
      !Aligned16(x) || !Aligned16(w.codes) || (w.m + kWarps - 1) / kWarps > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  switch (n) {
    case 1: return LaunchRows<1>(x, w, bias, out, stream);
    case 2: return LaunchRows<2>(x, w, bias, out, stream);
    case 3: return LaunchRows<3>(x, w, bias, out, stream);
    case 4: return LaunchRows<4>(x, w, bias, out, stream);
    case 5: return LaunchRows<5>(x, w, bias, out, stream);
    case 6: return LaunchRows<6>(x, w, bias, out, stream);
    case 7: return LaunchRows<7>(x, w, bias, out, stream);
    default: return LaunchRows<8>(x, w, bias, out, stream);
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
