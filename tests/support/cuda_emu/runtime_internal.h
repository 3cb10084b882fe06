// What the CUDA emulator's parts share (cuda_emu.h is the emulator's face to the device code):
// launch.cc runs kernels as fibers, runtime.cc implements the runtime's devices, memory, streams,
// events and graphs, cublas.cc the GEMMs. Not for code outside emu/.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/support/cuda_emu/async_work.h"
#include "tests/support/cuda_emu/counters.h"

// The opaque handles of the runtime and cuBLAS.
struct CUstream_st {
  bool blocking = true;  // (cudaStreamNonBlocking: not ordered with the legacy default stream)
  bool capturing = false;
  bool capture_invalidated = false;
  std::thread::id capturer;
  std::vector<std::function<cudaError_t()>> recorded;
  // Async work (async_work.h), under async_mu: the op holding the stream, the work waiting behind
  // it, and whether a thread is running that work now.
  std::shared_ptr<tandem_emu::AsyncOp> in_flight;
  std::deque<std::function<cudaError_t()>> behind;
  bool draining = false;
};
struct CUevent_st {
  cudaStream_t stream = nullptr;  // where it was last recorded
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
  std::atomic<int> unrun{0};  // records enqueued (outside captures) whose work has not run yet
};
struct CUgraph_st {
  std::vector<std::function<cudaError_t()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<cudaError_t()>> work;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace tandem_emu {

// The emulated device: an sm_90 with the H100's per-block limits.
constexpr int kMaxThreads = 1024;
constexpr int kMultiProcessors = 8;
constexpr int kComputeMajor = 9, kComputeMinor = 0;
constexpr size_t kDefaultSharedLimit = 48 << 10;
constexpr size_t kMaxSharedOptIn = 227 << 10;  // sm_90's per-block opt-in limit

extern std::mutex state_mu;                            // streams, memory accounting, attributes
extern std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute, by kernel (state_mu)

// Records `e` as this thread's last error (cudaGetLastError) unless it is cudaSuccess; returns it.
cudaError_t SetLast(cudaError_t e);
// Work for `stream`: recorded when it is being captured, else run now or queued (deferred streams);
// behind an async op in flight on it, queued there. (runtime.cc)
cudaError_t Enqueue(cudaStream_t stream, std::function<cudaError_t()> work);
// A call that the device refuses while this thread captures a graph (allocation, synchronisation):
// invalidates the capture, as the device does; true if so.
bool RefusedInCapture();
// Adds the call to the host log when one is being kept (counters.h: StartHostLog). (runtime.cc)
void NoteHostCall(HostCall kind, const char* what);

}  // namespace tandem_emu
