#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cuda/smoke_kernel.h"

namespace tandem::cuda {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::string> DeviceDescription(int index) {
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceProperties");
  }
  return absl::StrFormat("%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                         prop.totalGlobalMem / double(1ull << 30));
}

absl::StatusOr<std::vector<float>> RunSaxpyOnDevice(float a, const std::vector<float>& x,
                                                    const std::vector<float>& y) {
  if (x.size() != y.size()) return absl::InvalidArgumentError("x and y differ in length");
  const size_t bytes = x.size() * sizeof(float);
  float *dx = nullptr, *dy = nullptr;
  if (cudaError_t e = cudaMalloc(&dx, bytes); e != cudaSuccess) return CudaError(e, "cudaMalloc");
  if (cudaError_t e = cudaMalloc(&dy, bytes); e != cudaSuccess) {
    cudaFree(dx);
    return CudaError(e, "cudaMalloc");
  }
  std::vector<float> out(y.size());
  cudaError_t e = cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = LaunchSaxpy({static_cast<int>(x.size()), a, dx, dy}, nullptr);
  if (e == cudaSuccess) e = cudaMemcpy(out.data(), dy, bytes, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  if (e != cudaSuccess) return CudaError(e, "saxpy");
  return out;
}

}  // namespace tandem::cuda
