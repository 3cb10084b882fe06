// Activation arithmetic shared by the kernels that apply it, so that a fused kernel gives the same
// bits as the separate one it replaces.
#pragma once

#include <cuda_runtime.h>

namespace tandem::cuda {

// silu(g) · u = g / (1 + e^-g) · u, in f32.
__device__ __forceinline__ float SiluTimes(float g, float u) { return g / (1.0f + expf(-g)) * u; }

}  // namespace tandem::cuda
