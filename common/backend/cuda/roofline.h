// The device's measured ceilings, for benchmarks that report a share of them: memory bandwidth by a
// copy kernel, and BF16 tensor-core throughput by a large cuBLAS GEMM, both on the current device.
#pragma once

#include "absl/status/statusor.h"

namespace tandem::cuda {

// GB/s (1e9 bytes) counting bytes read plus bytes written, best of `repeats` copies of `bytes`.
absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes = size_t{1} << 30, int repeats = 10);

// TFLOP/s of C[m][n] = A[m][k] · B[k][n] in BF16 with f32 accumulation, best of `repeats`.
absl::StatusOr<double> MeasureBf16GemmTflops(int m = 8192, int n = 8192, int k = 8192,
                                             int repeats = 10);

}  // namespace tandem::cuda
