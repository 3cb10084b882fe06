// The device side of a backend: its memory, copies between it and the host, marks in its stream of
// work, graphs and per-op profiling. What KV storage and the transports use; the ops are Backend's
// (backend.h). Pointers are device pointers of this device (host pointers on the CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

// A block of device memory owned by the backend that allocated it.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  float* f32() { return static_cast<float*>(data()); }
  int32_t* i32() { return static_cast<int32_t*>(data()); }
};

// Memory of the device a backend computes on.
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
  // Held by this backend now: what it allocated and has not freed (weights, KV cache, activations,
  // workspaces). Counted by the backend itself, so other processes sharing the device do not show
  // up in it (they do in free_bytes).
  int64_t own_bytes = 0;
};

// A point in a backend's stream of enqueued ops (Device::Mark). Thread-safe; may outlive nothing
// but its backend.
class WorkMark {
 public:
  virtual ~WorkMark() = default;
  // Returns once every op enqueued before the mark has completed (not those enqueued after it):
  // OK; DEADLINE_EXCEEDED at `deadline`; the device's error if the work failed.
  virtual absl::Status Wait(absl::Time deadline) = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  // Human-readable device description for logs and build info.
  virtual std::string device_description() const = 0;
  // Whether buffers of this backend are host memory that other threads may read and write directly
  // (the CPU backend); otherwise data moves only through CopyToHost / CopyToDevice.
  virtual bool host_memory() const { return false; }
  // The device queue every op is enqueued on (a cudaStream_t on CUDA, on device
  // `device_ordinal()`), for device-side transports (NCCL) that order their own work after the
  // backend's; nullptr and -1 on the CPU.
  virtual void* native_stream() { return nullptr; }
  virtual int device_ordinal() const { return -1; }

  // A mark after the work enqueued so far on this thread's stream of ops (WorkMark), so
  // that another thread can wait for that work alone, however much is enqueued after it meanwhile
  // (a KV transfer waiting for one layer's cache writes while the next layers, or the next step,
  // compute). Null where every op is complete when it returns (the CPU).
  virtual std::shared_ptr<WorkMark> Mark() { return nullptr; }

  // Waits for enqueued work and returns the first failure of any of it (a kernel launch, a library
  // call); OK when none. Sticky: a failed backend stays failed. Ops themselves return nothing.
  virtual absl::Status CheckErrors() { return absl::OkStatus(); }

  // --- Graphs (CUDA) ---
  // Work enqueued between BeginCapture() and EndCapture() is recorded instead of run; Replay() runs
  // it again with the same pointers, shapes and scalar arguments (the data behind the pointers may
  // change). Allocation is not allowed while capturing: run the same work once before. A backend
  // drops its graphs when memory they use may have moved (its scratch grew): Replay() then returns
  // NOT_FOUND and the caller captures again. UNIMPLEMENTED where graphs do not exist (the CPU).
  virtual bool SupportsGraphs() const { return false; }
  virtual bool capturing() const { return false; }
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError("graphs need a CUDA backend");
  }
  virtual absl::StatusOr<int64_t> EndCapture() {
    return absl::UnimplementedError("graphs need a CUDA backend");
  }
  virtual absl::Status Replay(int64_t /*graph*/) {
    return absl::UnimplementedError("graphs need a CUDA backend");
  }
  virtual void DropGraphs() {}

  // Per-op device timing (GPU backends; TANDEM_CUDA_OP_PROFILE=1 turns it on at creation): while
  // on, every op enqueued outside a graph capture is timed; the report is a table of what was timed
  // since the last report, the most time first ("" when off or unsupported).
  virtual void SetOpProfiling(bool /*on*/) {}
  virtual std::string OpProfileReport() { return ""; }

  // --- Memory ---
  // Free and total memory of the device (all processes' use counted). UNIMPLEMENTED where the
  // backend computes in host memory (CPU), whose KV cache is sized by --kv-cache-memory instead.
  virtual absl::StatusOr<DeviceMemory> Memory() {
    return absl::UnimplementedError("this backend does not report device memory");
  }
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) = 0;
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Waits for enqueued work, then copies.
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Pieces of `bytes` bytes at src + index[i] * bytes (this backend's memory) to host_out, one
  // after another: a KV layer's blocks. With `after_enqueued_work`, after the ops enqueued before
  // the call; without, the caller has waited for what it reads (a WorkMark). Thread-safe. A GPU
  // backend gathers them on the device, off its stream of ops, and waits once; this default copies
  // piece by piece.
  virtual void GatherToHost(const std::byte* src, const std::vector<int32_t>& index, size_t bytes,
                            void* host_out, bool after_enqueued_work) {
    (void)after_enqueued_work;  // CopyToHost waits for enqueued work anyway
    for (size_t i = 0; i < index.size(); ++i) {
      CopyToHost(static_cast<std::byte*>(host_out) + i * bytes,
                 src + static_cast<size_t>(index[i]) * bytes, bytes);
    }
  }
  // The reverse: dst + index[i] * bytes = host_in's i-th piece, done when it returns. Not ordered
  // after the enqueued ops: for memory none of them uses (KV blocks reserved between steps).
  virtual void ScatterFromHost(std::byte* dst, const std::vector<int32_t>& index, size_t bytes,
                               const void* host_in) {
    for (size_t i = 0; i < index.size(); ++i) {
      CopyToDevice(dst + static_cast<size_t>(index[i]) * bytes,
                   static_cast<const std::byte*>(host_in) + i * bytes, bytes);
    }
  }
};

}  // namespace tandem
