// The CPU's memory-bandwidth ceiling for the benchmarks: how fast the thread pool can read a buffer
// far larger than the caches, as batch-1 decode reads its weights (a read, not a copy: decode
// writes almost nothing).
#pragma once

#include <cstddef>
#include <memory>

#include "common/base/thread_pool.h"

namespace tandem::bench {

// A buffer of `bytes` (rounded down to 64-byte lines), touched once, read by Measure() with the
// widest vector loads this CPU has, split across the pool's threads (as one run a thread, and with
// AVX-512 as four runs a thread read side by side too, the batch-1 Linear's pattern: the faster).
// On a shared machine the bandwidth a process gets moves from second to second, so a benchmark
// interleaves Measure() with what it compares against the ceiling: each measurement against the
// pass right after it (forward_bench's median step share), or the best of both sides (best()).
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadPool& pool, size_t bytes);
  // GB/s (1e9 bytes) of the best of `passes` reads of the whole buffer.
  double Measure(int passes = 1);
  // The best of every Measure() so far (0 before the first).
  double best() const { return best_; }

 private:
  ThreadPool& pool_;
  size_t lines_;
  std::unique_ptr<float, void (*)(float*)> buf_;
  double best_ = 0;
};

}  // namespace tandem::bench
