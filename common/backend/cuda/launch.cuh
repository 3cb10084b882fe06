// Kernel launches with programmatic dependent launch (Hopper's PDL), opt-in with
// TANDEM_CUDA_PDL=1 until a GPU run has compared it: a kernel so launched may be scheduled while
// the kernel before it in the stream drains (its blocks start once every block of that kernel has
// passed its prologue or exited), instead of after that kernel's completion and a launch gap. Every
// kernel launched this way begins with PdlPrologue(), which waits for the previous kernel's results
// (visible once it returns) and lets the next kernel be scheduled. Without the attribute both are
// no-ops, so the arithmetic is the same either way; inside CUDA graphs the dependencies become
// programmatic edges. The wait is compiled for sm_90 and newer only: a build whose device code is
// older must not turn it on (the project builds sm_90; the attribute is also set only on a device
// of compute capability 9 or more).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tandem::cuda {

// Whether programmatic dependent launch was asked for: TANDEM_CUDA_PDL=1 at start, or a backend's
// CudaTunings::programmatic_launch (RequestProgrammaticLaunch, kernels.h; one setting a process).
inline std::atomic<bool>& ProgrammaticLaunchRequested() {
  static std::atomic<bool> requested{[] {
    const char* p = std::getenv("TANDEM_CUDA_PDL");
    return p != nullptr && std::strcmp(p, "1") == 0;
  }()};
  return requested;
}

// Whether launches set the programmatic-serialization attribute: asked for, on a device of compute
// capability 9 or more (Hopper on; read once).
inline bool ProgrammaticLaunch() {
  if (!ProgrammaticLaunchRequested().load(std::memory_order_relaxed)) return false;
  static const bool capable = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major >= 9;
  }();
  return capable;
}

// First statement of a kernel launched by LaunchKernel: the previous kernel's writes are complete
// and visible after it; the next kernel may be scheduled from here on.
__device__ __forceinline__ void PdlPrologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), with the PDL attribute when `pdl` and it
// is on. Errors are also left for cudaGetLastError, as a <<<>>> launch leaves them. Under the CUDA
// emulator (emu/cuda_emu.h) the grid runs on the CPU.
template <typename... Params, typename... Args>
cudaError_t LaunchWithAttributes(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t shared_bytes, cudaStream_t stream, Args&&... args) {
#ifdef TANDEM_CUDA_EMU
  (void)pdl;
  return ::tandem_emu::Launch(kernel, grid, block, shared_bytes, stream,
                              std::forward<Args>(args)...);
#else
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (pdl && ProgrammaticLaunch()) {
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
#endif
}

// A kernel that begins with PdlPrologue(): launched with programmatic serialization when it is on.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                         cudaStream_t stream, Args&&... args) {
  return LaunchWithAttributes(true, kernel, grid, block, shared_bytes, stream,
                              std::forward<Args>(args)...);
}

// Any other kernel: a plain launch, after everything before it in the stream.
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  return LaunchWithAttributes(false, kernel, grid, block, shared_bytes, stream,
                              std::forward<Args>(args)...);
}

// Dynamic shared memory: `extern __shared__ __align__(alignment) type name[]` (the emulator's is
// the running block's buffer).
#ifdef TANDEM_CUDA_EMU
#define TANDEM_DYNAMIC_SHARED(type, name, alignment) \
  type* name = reinterpret_cast<type*>(::tandem_emu::DynamicShared())
#else
#define TANDEM_DYNAMIC_SHARED(type, name, alignment) \
  extern __shared__ __align__(alignment)             \
  type name[]
#endif

}  // namespace tandem::cuda
