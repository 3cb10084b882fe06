#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/roofline.h"

namespace tandem::cuda {
namespace {

__global__ void CopyKernel(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = in[i];
  }
}

__global__ void FillKernel(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1024) / 1024.f - 0.5f);
  }
}

absl::Status Err(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Frees everything it holds on every path.
struct Scope {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cublasHandle_t blas = nullptr;
  ~Scope() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (blas) cublasDestroy(blas);
  }
};

}  // namespace

absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes, int repeats) {
  Scope s;
  bytes = bytes / 16 * 16;
  if (cudaError_t e = cudaMalloc(&s.a, bytes); e != cudaSuccess) return Err(e, "cudaMalloc");
  if (cudaError_t e = cudaMalloc(&s.b, bytes); e != cudaSuccess) return Err(e, "cudaMalloc");
  cudaMemset(s.a, 1, bytes);
  cudaEventCreate(&s.start);
  cudaEventCreate(&s.stop);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t n = bytes / 16;
  float best = 1e30f;
  for (int r = 0; r < repeats + 2; ++r) {  // two warm-ups
    cudaEventRecord(s.start);
    Launch(CopyKernel, sms * 8, 512, 0, nullptr, static_cast<const float4*>(s.a),
           static_cast<float4*>(s.b), n);
    cudaEventRecord(s.stop);
    if (cudaError_t e = cudaEventSynchronize(s.stop); e != cudaSuccess)
      return Err(e, "copy kernel");
    float ms = 0;
    cudaEventElapsedTime(&ms, s.start, s.stop);
    if (r >= 2) best = std::min(best, ms);
  }
  return 2.0 * bytes / (best * 1e-3) / 1e9;
}

absl::StatusOr<double> MeasureBf16GemmTflops(int m, int n, int k, int repeats) {
  Scope s;
  const size_t a = size_t(m) * k, b = size_t(k) * n;
  if (cudaError_t e = cudaMalloc(&s.a, a * 2); e != cudaSuccess) return Err(e, "cudaMalloc");
  if (cudaError_t e = cudaMalloc(&s.b, b * 2); e != cudaSuccess) return Err(e, "cudaMalloc");
  if (cudaError_t e = cudaMalloc(&s.c, size_t(m) * n * 4); e != cudaSuccess)
    return Err(e, "cudaMalloc");
  Launch(FillKernel, 1024, 256, 0, nullptr, static_cast<__nv_bfloat16*>(s.a),
         a);  // random-ish data: zeros run faster
  Launch(FillKernel, 1024, 256, 0, nullptr, static_cast<__nv_bfloat16*>(s.b), b);
  if (cublasCreate(&s.blas) != CUBLAS_STATUS_SUCCESS)
    return absl::InternalError("cublasCreate failed");
  cudaEventCreate(&s.start);
  cudaEventCreate(&s.stop);
  const float alpha = 1.f, beta = 0.f;
  float best = 1e30f;
  for (int r = 0; r < repeats + 3; ++r) {  // three warm-ups
    cudaEventRecord(s.start);
    const cublasStatus_t st = cublasGemmEx(s.blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, s.a,
                                           CUDA_R_16BF, m, s.b, CUDA_R_16BF, k, &beta, s.c,
                                           CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(s.stop);
    if (st != CUBLAS_STATUS_SUCCESS)
      return absl::InternalError(absl::StrCat("cublasGemmEx: ", cublasGetStatusString(st)));
    if (cudaError_t e = cudaEventSynchronize(s.stop); e != cudaSuccess) return Err(e, "GEMM");
    float ms = 0;
    cudaEventElapsedTime(&ms, s.start, s.stop);
    if (r >= 3) best = std::min(best, ms);
  }
  return 2.0 * m * n * k / (best * 1e-3) / 1e12;
}

}  // namespace tandem::cuda
