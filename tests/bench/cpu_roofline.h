// The CPU's memory-bandwidth ceiling for the benchmarks: how fast the thread pool can read a buffer
// far larger than the caches, as batch-1 decode reads its weights (a read, not a copy: decode
// writes almost nothing).
#pragma once

#include <cstddef>

#include "common/base/thread_pool.h"

namespace tandem::bench {

// GB/s (1e9 bytes) of the best of `passes` reads of `bytes` (rounded down to 64-byte lines), each
// split across the pool's threads, with the widest vector loads this CPU has.
double MeasureReadBandwidth(ThreadPool& pool, size_t bytes, int passes = 3);

}  // namespace tandem::bench
