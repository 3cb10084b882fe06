// KV cache element types for the attention kernels: f32, or BF16/F16 rounded to nearest even when
// written and read back as f32. Device code only (included by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/model/dtype.h"

namespace tandem::cuda {

__device__ __forceinline__ float LoadKv(const float* p) { return *p; }
__device__ __forceinline__ float LoadKv(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float LoadKv(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void StoreKv(float* p, float x) { *p = x; }
__device__ __forceinline__ void StoreKv(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void StoreKv(__half* p, float x) { *p = __float2half_rn(x); }

// fn(static_cast<T*>(nullptr)) for the cache's element type T.
template <typename Fn>
cudaError_t WithKvType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(static_cast<float*>(nullptr));
    case DType::kBF16: return fn(static_cast<__nv_bfloat16*>(nullptr));
    case DType::kF16: return fn(static_cast<__half*>(nullptr));
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
