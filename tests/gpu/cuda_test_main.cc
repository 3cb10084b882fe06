// main() of the CUDA backend's tests: exit code 77 (ctest: skipped, label "gpu") without a device.
#include <cstdio>

#include "common/backend/cuda/smoke_kernel.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (tandem::cuda::DeviceCount() == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
