// Block-wide reductions shared by kernels that must agree bit for bit (RmsNorm and the GEMV's norm
// prologue). Device code only (included by .cu files). Sums are spelled with explicit roundings
// (__fadd_rn, __fmul_rn): nvcc contracts a product and a later add into one FMA where it sees fit,
// which could differ between the kernels that inline these (the emulator never contracts).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

template <bool kMax>
__device__ __forceinline__ float Combine(float a, float b) {
  return kMax ? fmaxf(a, b) : __fadd_rn(a, b);
}

// Reduces v over the warp by an xor-shuffle tree (offsets 16, 8, ..., 1); every lane gets the
// result.
template <bool kMax>
__device__ __forceinline__ float WarpReduce(float v) {
  for (int o = 16; o > 0; o >>= 1) v = Combine<kMax>(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024): each warp by WarpReduce,
// then the warps' results in order; every thread gets the result. `red` is shared scratch of 32
// floats.
template <bool kMax>
__device__ float BlockReduce(float v, float* red) {
  v = WarpReduce<kMax>(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // earlier readers of red are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int i = 1; i < warps; ++i) v = Combine<kMax>(v, red[i]);
  return v;
}

// ss + v², the sum of squares' step.
__device__ __forceinline__ float AddSquare(float ss, float v) {
  return __fadd_rn(ss, __fmul_rn(v, v));
}

// The RMSNorm scale from a sum of squares over d elements: 1 / sqrt(ss / d + eps).
__device__ __forceinline__ float RmsInverse(float ss, int64_t d, float eps) {
  return 1.0f / sqrtf(ss / float(d) + eps);
}

// 1 / sqrt(mean(x[0..d)²) + eps), the RMSNorm scale of row x, summed over the block in one fixed
// order (thread j folds elements j, j + blockDim.x, ..., then BlockReduce): the same bits in every
// kernel that calls it with the same block size.
__device__ __forceinline__ float RmsScale(const float* x, int64_t d, float eps, float* red) {
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss = AddSquare(ss, x[j]);
  return RmsInverse(BlockReduce<false>(ss, red), d, eps);
}

// Whether this block is the last of `total` blocks to arrive at `count` (device memory, zero before
// the first of them arrives). Every thread of the block must call it, after its global writes: they
// are made visible to every block before the block is counted, the last block may read the others'
// (from L2: __ldcg), and it sets the count back to zero for the next launch or graph replay.
__device__ __forceinline__ bool LastBlockToArrive(unsigned* count, unsigned total) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(count, 1u) == total - 1;
    if (last) {
      __threadfence();  // the others' writes are read after their counts (acquire)
      *count = 0;
    }
  }
  __syncthreads();
  return last;
}

}  // namespace tandem::cuda
