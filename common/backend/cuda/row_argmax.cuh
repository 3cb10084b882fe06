// The argmax of one row by one block, as ArgmaxRow (common/base/argmax.h) takes it: the lowest
// index of the largest value, NaN never winning, 0 when nothing beats -inf. Shared by the greedy
// kernel (kernels.cu) and the sampling kernels (sampling.cu).
#pragma once

#include <cstdint>

namespace tandem::cuda {

// Every thread of the block (blockDim.x a multiple of 32, at most 1024) gets the row's argmax.
// warp_v, warp_i: shared scratch of 32 entries each; reusing them afterwards needs a __syncthreads
// first.
__device__ __forceinline__ int32_t BlockRowArgmax(const float* row, int64_t d, float* warp_v,
                                                  int64_t* warp_i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float v = -INFINITY;
  int64_t vi = INT64_MAX;  // nothing beats -inf yet
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float y = row[j];
    if (y > v) {  // strictly larger (NaN never is): the thread's first index of its maximum stays
      v = y;
      vi = j;
    }
  }
  // (value, index) pairs ordered by value, then lower index: a total order, so any reduction order
  // gives every thread the same winner.
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, vi, o);
    if (ov > v || (ov == v && oi < vi)) {
      v = ov;
      vi = oi;
    }
  }
  __syncthreads();  // earlier readers of the scratch are done
  if (lane == 0) {
    warp_v[warp] = v;
    warp_i[warp] = vi;
  }
  __syncthreads();
  for (int w = 0; w < warps; ++w) {
    if (warp_v[w] > v || (warp_v[w] == v && warp_i[w] < vi)) {
      v = warp_v[w];
      vi = warp_i[w];
    }
  }
  return vi == INT64_MAX ? 0 : static_cast<int32_t>(vi);
}

}  // namespace tandem::cuda
