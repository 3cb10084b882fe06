// A fixed pool of worker threads for data-parallel CPU kernels.
//
// ParallelFor splits [0, n) into contiguous chunks and runs them on the pool and the calling thread,
// returning when all are done. It is not re-entrant: a task must not call ParallelFor on the same pool.
// Thread-safe for one caller at a time (calls are serialised by an internal mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool, sized by TANDEM_NUM_THREADS or the hardware concurrency.
  static ThreadPool& Default();

 private:
  void WorkerLoop(int index);

  std::mutex call_mu_;  // serialises ParallelFor callers
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t num_chunks_ = 0;
  int64_t next_chunk_ = 0;   // guarded by mu_
  int64_t pending_ = 0;      // guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace tandem
