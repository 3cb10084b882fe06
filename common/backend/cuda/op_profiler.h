// Per-op GPU times of the CUDA backend, for finding where a step's time goes (forward_bench
// --profile-ops; TANDEM_CUDA_OP_PROFILE=1 in any program). Each op the backend enqueues while this
// is on is bracketed by two CUDA events; after the stream is synchronised (Backend::CheckErrors)
// the finished pairs are added up by op name. Events cost a few microseconds of launch gaps each,
// so the figures are for proportions, not for absolute step times; ops inside a graph capture are
// not timed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::cuda {

class OpProfiler {
 public:
  ~OpProfiler();
  // Records the start of op `name` on `stream`; `bytes`: the bytes it must move (0: unknown), for a
  // GB/s column.
  void Begin(const std::string& name, int64_t bytes, cudaStream_t stream);
  void End(cudaStream_t stream);
  // Adds up every pair recorded so far; the stream they were recorded on must be idle.
  void Collect();
  void Reset();
  // One line per op name, the most time first: calls, total ms, share, mean µs, GB/s.
  std::string Report() const;

 private:
  struct Pending {
    std::string name;
    int64_t bytes;
    cudaEvent_t start, end;
  };
  struct Total {
    int64_t calls = 0;
    double ms = 0;
    double bytes = 0;
  };
  cudaEvent_t NewEvent();
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, Total> totals_;
};

// Brackets one op when `profiler` is set and no capture is in progress.
class OpScope {
 public:
  OpScope(OpProfiler* profiler, bool capturing, const std::string& name, int64_t bytes,
          cudaStream_t stream)
      : profiler_(capturing ? nullptr : profiler), stream_(stream) {
    if (profiler_ != nullptr) profiler_->Begin(name, bytes, stream_);
  }
  ~OpScope() {
    if (profiler_ != nullptr) profiler_->End(stream_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfiler* profiler_;
  cudaStream_t stream_;
};

}  // namespace tandem::cuda
