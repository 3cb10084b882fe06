// A fixed pool of worker threads for data-parallel CPU kernels.
//
// ParallelFor splits [0, n) into contiguous chunks and runs them on the pool and the calling
// thread, returning when all are done. It is not re-entrant: a task must not call ParallelFor on
// the same pool. Concurrent callers are serialised.
//
// A forward step is hundreds of short ParallelFor calls: waking a sleeping thread for each costs
// tens of microseconds in a virtual machine, a large share of a small op. So a worker that runs out
// of work spins for a while (kSpin below) watching for the next job before it sleeps, and the
// caller spins for its workers' last chunks before it sleeps; an idle pool sleeps.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 means everything runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n); chunks hold at least `grain` items.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)
      ABSL_LOCKS_EXCLUDED(call_mu_, mu_);

  // The process-wide pool, sized by TANDEM_NUM_THREADS or the hardware concurrency.
  static ThreadPool& Default();

 private:
  void WorkerLoop();
  // Claims and runs chunks of job `generation` until none is left.
  void RunChunks(uint32_t generation);

  absl::Mutex call_mu_;  // serialises ParallelFor callers
  // The current job: written by the caller before it publishes the job in ticket_, read by whoever
  // claims a chunk of it (a job cannot end, so these cannot change, while a claimed chunk runs).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  // The job's generation, its number of chunks and the next chunk to claim, in one word: a claim
  // (compare-and-swap) is of a chunk of the generation the claimant saw.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int64_t> pending_{0};  // chunks of the current job not finished
  std::atomic<int> sleepers_{0};     // workers asleep (or about to be) on work_cv_
  std::atomic<bool> stop_{false};
  // Sleeping: workers wait for a new generation, the caller for pending_ == 0.
  absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar done_cv_;
  std::vector<std::thread> workers_;
};

}  // namespace tandem
