#include "common/base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem {
namespace {

// How long a thread spins before it sleeps: longer than the gaps between a step's ops (a few
// microseconds) and between steps (the host's sampling and scheduling), short enough that an idle
// pool costs nothing noticeable.
constexpr std::chrono::microseconds kSpin(30);

inline void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() or kSpin has passed; returns done(). It yields now and then, so that where
// processes share the cores (a prefill and a decode worker on one machine) a spinning thread gives
// way to another process's work.
template <typename Done>
bool SpinUntil(const Done& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    for (int p = 0; p < 16; ++p) Pause();
    if ((i & 15) == 15) {
      if (std::chrono::steady_clock::now() > deadline) return done();
      std::this_thread::yield();
    }
  }
}

// ticket_'s fields: generation (24 bits) | chunks of the job (20) | next chunk to claim (20).
constexpr int kCountBits = 20;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
uint32_t GenerationOf(uint64_t t) { return static_cast<uint32_t>(t >> (2 * kCountBits)); }
uint64_t TotalOf(uint64_t t) { return (t >> kCountBits) & kCountMask; }
uint64_t NextOf(uint64_t t) { return t & kCountMask; }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i)
    workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    absl::MutexLock lock(&mu_);
    work_cv_.SignalAll();
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint32_t generation) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  while (GenerationOf(t) == generation && NextOf(t) < TotalOf(t)) {
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
    // Claimed: the job cannot end, nor its fields change, before this chunk is done.
    const int64_t c = static_cast<int64_t>(NextOf(t));
    (*fn_)(c * chunk_, std::min(n_, (c + 1) * chunk_));
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      absl::MutexLock lock(&mu_);
      done_cv_.SignalAll();
    }
    t = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = std::min<int64_t>(4 * num_threads(), (n + grain - 1) / grain);
  if (max_chunks <= 1) {
    fn(0, n);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  const uint32_t generation = (GenerationOf(ticket_.load()) + 1) & ((1u << 24) - 1);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + max_chunks - 1) / max_chunks;
  const uint64_t num_chunks = static_cast<uint64_t>((n + chunk_ - 1) / chunk_);
  pending_.store(static_cast<int64_t>(num_chunks), std::memory_order_relaxed);
  // Publishes the job (the fields above are visible to whoever sees the generation).
  ticket_.store((uint64_t{generation} << (2 * kCountBits)) | (num_chunks << kCountBits),
                std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    absl::MutexLock lock(&mu_);
    work_cv_.SignalAll();
  }
  RunChunks(generation);  // the caller takes chunks too
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(done)) {
    absl::MutexLock lock(&mu_);
    while (!done()) done_cv_.Wait(&mu_);
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  while (true) {
    // seq_cst: a worker about to sleep counts itself in sleepers_ and then looks at ticket_; the
    // caller stores ticket_ and then looks at sleepers_; one of the two sees the other.
    auto fresh = [&] {
      return stop_.load(std::memory_order_seq_cst) ||
             GenerationOf(ticket_.load(std::memory_order_seq_cst)) != seen;
    };
    if (!SpinUntil(fresh)) {
      absl::MutexLock lock(&mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while (!fresh()) work_cv_.Wait(&mu_);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = GenerationOf(ticket_.load(std::memory_order_acquire));
    RunChunks(seen);
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
