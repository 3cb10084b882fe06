#include "common/backend/cuda/smoke_kernel.h"

#include "common/backend/cuda/launch.cuh"

namespace tandem::cuda {
namespace {

__global__ void SaxpyKernel(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

}  // namespace

cudaError_t LaunchSaxpy(const SaxpyParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = (p.n + kThreads - 1) / kThreads;
  Launch(SaxpyKernel, blocks, kThreads, 0, stream, p.n, p.a, p.x, p.y);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
