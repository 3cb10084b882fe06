#include "common/base/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace tandem {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
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
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + max_chunks - 1) / max_chunks;
    num_chunks_ = (n + chunk_ - 1) / chunk_;
    next_chunk_ = 0;
    pending_ = num_chunks_;
    ++generation_;
  }
  work_cv_.notify_all();
  // The caller takes chunks too.
  while (true) {
    int64_t c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= num_chunks_) break;
      c = next_chunk_++;
    }
    fn(c * chunk_, std::min(n, (c + 1) * chunk_));
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_all();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int /*index*/) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && next_chunk_ < num_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (fn_ != nullptr && next_chunk_ < num_chunks_) {
      const int64_t c = next_chunk_++;
      const auto* fn = fn_;
      const int64_t n = n_, chunk = chunk_;
      lock.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("TANDEM_NUM_THREADS")) {
      try {
        n = std::stoi(env);
      } catch (...) {
      }
    }
    return new ThreadPool(std::max(1, n));
  }();
  return *pool;
}

}  // namespace tandem
