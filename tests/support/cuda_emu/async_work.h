// Stream work that completes outside the CUDA emulator's own execution (a plain header, like
// counters.h: host code such as the emulated NCCL, emu/nccl.cc, includes it).
//
// On the device an NCCL send or receive is a kernel that spins until the peer's bytes have moved;
// the stream's later work waits for it, an event recorded after it stays incomplete, and the host
// thread that enqueued it is free to poll, time out and abort. The emulator otherwise runs stream
// work synchronously (cuda_emu.h), which would block the enqueuing thread on the peer instead. Work
// enqueued with EnqueueAsync starts in stream order and holds its stream until its op completes:
// - work the stream gets meanwhile waits behind it and runs, in order, on the first call that looks
//   at the stream after the op completed (an enqueue, a query or a synchronisation);
// - cudaEventQuery on an event recorded behind it answers cudaErrorNotReady;
// - cudaEventSynchronize, cudaStreamSynchronize, cudaStreamWaitEvent, cudaDeviceSynchronize and
//   cudaFree block the calling thread until it completes (cudaStreamWaitEvent waits on the host:
//   streams do not run concurrently here).
// Not inside a graph capture (cudaErrorStreamCaptureUnsupported). With deferred streams
// (TANDEM_CUDA_EMU_STREAMS=deferred) the stream's queued work runs first, as the op starts.
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace tandem_emu {

// The completion of one operation: Complete() once, from any thread.
class AsyncOp {
 public:
  void Complete() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void Wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
};

// Enqueues on `stream` (not the legacy stream) an operation that `start` begins, in stream order,
// on the thread that runs the stream's work then; the stream is held until the returned op
// completes.
cudaError_t EnqueueAsync(cudaStream_t stream, std::function<std::shared_ptr<AsyncOp>()> start);

}  // namespace tandem_emu
