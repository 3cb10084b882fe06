// A smoke kernel and device probe for the CUDA toolchain: y = a*x + y in f32 on the GPU, checked by
// tests/gpu against the host computation.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cuda {

struct SaxpyParams {
  int n = 0;
  float a = 0.f;
  const float* x = nullptr;  // device [n]
  float* y = nullptr;        // device [n], updated in place
};

cudaError_t LaunchSaxpy(const SaxpyParams& params, cudaStream_t stream);

// Number of visible CUDA devices; 0 when there is no driver or no device.
int DeviceCount();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for device `index`.
absl::StatusOr<std::string> DeviceDescription(int index);

// Runs saxpy on device 0 through host buffers (allocates, copies, launches, copies back).
absl::StatusOr<std::vector<float>> RunSaxpyOnDevice(float a, const std::vector<float>& x,
                                                    const std::vector<float>& y);

}  // namespace tandem::cuda
