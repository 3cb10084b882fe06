// Writing a kernel's f32 output with its optional 16-bit copy (kernels.h: RoundedCopy). Device code
// only (included by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/kv_types.cuh"

namespace tandem::cuda {

// out[i] = v, and the rounded copy's [i] (round to nearest even, as LaunchConvertF32 and the
// cache's StoreKv) when there is one.
__device__ __forceinline__ void StoreOut(float* out, const RoundedCopy& r, int64_t i, float v) {
  out[i] = v;
  if (r.data == nullptr) return;
  if (r.dtype == DType::kF16) {
    StoreKv(static_cast<__half*>(r.data) + i, v);
  } else {
    StoreKv(static_cast<__nv_bfloat16*>(r.data) + i, v);
  }
}

}  // namespace tandem::cuda
