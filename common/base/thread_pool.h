// A fixed pool of worker threads for data-parallel CPU kernels.
//
// ParallelFor splits [0, n) into contiguous chunks and runs them on the pool and the calling
// thread, returning when all are done. It is not re-entrant: a task must not call ParallelFor on
// the same pool. Concurrent callers are serialised.
#pragma once

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
  // Runs chunks of the current job until none is left. Called with mu_ held; releases it while
  // running a chunk.
  void RunChunks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex call_mu_;  // serialises ParallelFor callers
  absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tandem
