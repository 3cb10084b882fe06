// Block-wide reductions shared by kernels that must agree bit for bit (RmsNorm and the GEMV's norm
// prologue). Device code only (included by .cu files). Sums are spelled with explicit roundings
// (__fadd_rn, __fmul_rn): nvcc contracts a product and a later add into one FMA where it sees fit,
// which could differ between the kernels that inline these (the emulator never contracts).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `red` is shared scratch of 32 floats.
template <bool kMax>
__device__ float BlockReduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : __fadd_rn(v, w);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // earlier readers of red are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int i = 1; i < warps; ++i) v = kMax ? fmaxf(v, red[i]) : __fadd_rn(v, red[i]);
  return v;
}

// 1 / sqrt(mean(x[0..d)²) + eps), the RMSNorm scale of row x, summed over the block in one fixed order
// (thread j folds elements j, j + blockDim.x, ..., then BlockReduce): the same bits in every kernel
// that calls it with the same block size.
__device__ __forceinline__ float RmsScale(const float* x, int64_t d, float eps, float* red) {
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(x[j], x[j]));
  ss = BlockReduce<false>(ss, red);
  return 1.0f / sqrtf(ss / float(d) + eps);
}

}  // namespace tandem::cuda
