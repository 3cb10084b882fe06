#include "common/base/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace tandem {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i)
    workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  while (fn_ != nullptr && next_chunk_ < num_chunks_) {
    const int64_t c = next_chunk_++;
    const auto* fn = fn_;
    const int64_t n = n_, chunk = chunk_;
    mu_.Unlock();
    (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
    mu_.Lock();
    if (--pending_ == 0) done_cv_.SignalAll();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  if (max_chunks <= 1) {
    fn(0, n);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  absl::MutexLock lock(&mu_);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + max_chunks - 1) / max_chunks;
  num_chunks_ = (n + chunk_ - 1) / chunk_;
  next_chunk_ = 0;
  pending_ = num_chunks_;
  work_cv_.SignalAll();
  RunChunks();  // the caller takes chunks too
  while (pending_ > 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && !(fn_ != nullptr && next_chunk_ < num_chunks_)) work_cv_.Wait(&mu_);
    if (stop_) return;
    RunChunks();
  }
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("TANDEM_NUM_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && v > 0 && v <= 1024) n = static_cast<int>(v);
    }
    return new ThreadPool(std::max(1, n));
  }();
  return *pool;
}

}  // namespace tandem
