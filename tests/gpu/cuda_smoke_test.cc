// GPU smoke test: the CUDA toolchain, runtime and a kernel work end to end. Exit code 77 (reported
// by ctest as skipped, label "gpu") when no CUDA device is visible.
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/backend/cuda/smoke_kernel.h"

int main() {
  const int devices = tandem::cuda::DeviceCount();
  if (devices == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  auto desc = tandem::cuda::DeviceDescription(0);
  std::printf("device 0: %s\n", desc.ok() ? desc->c_str() : "?");
  const int n = 1 << 20;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 0.001f * (i % 1000);
    y[i] = 1.0f - 0.0005f * (i % 777);
  }
  auto out = tandem::cuda::RunSaxpyOnDevice(2.5f, x, y);
  if (!out.ok()) {
    std::printf("FAILED: %s\n", std::string(out.status().message()).c_str());
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    const float ref = 2.5f * x[i] + y[i];
    if (std::fabs((*out)[i] - ref) > 1e-6f * (1 + std::fabs(ref))) {
      std::printf("FAILED: element %d: %g != %g\n", i, (*out)[i], ref);
      return 1;
    }
  }
  std::printf("PASSED: saxpy over %d elements\n", n);
  return 0;
}
