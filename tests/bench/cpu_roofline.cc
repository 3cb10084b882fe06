#include "tests/bench/cpu_roofline.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>

namespace tandem::bench {
namespace {

// Sums of 64-byte lines, kept so the compiler cannot drop the loads.
__attribute__((target("avx512f"))) float ReadAvx512(const float* p, size_t lines) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 4 <= lines; i += 4) {
    a = _mm512_add_ps(a, _mm512_load_ps(p + 16 * i));
    b = _mm512_add_ps(b, _mm512_load_ps(p + 16 * (i + 1)));
    c = _mm512_add_ps(c, _mm512_load_ps(p + 16 * (i + 2)));
    d = _mm512_add_ps(d, _mm512_load_ps(p + 16 * (i + 3)));
  }
  for (; i < lines; ++i) a = _mm512_add_ps(a, _mm512_load_ps(p + 16 * i));
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
  return out[0] + out[15];
}

// The same lines as four runs read side by side (the pattern of the batch-1 Linear,
// cpu::DotRowsStreamed), which some machines stream faster than one run.
__attribute__((target("avx512f"))) float ReadStreamsAvx512(const float* p, size_t lines) {
  constexpr size_t kStreams = 4;
  const size_t run = lines / kStreams;
  __m512 a[kStreams];
  for (auto& v : a) v = _mm512_setzero_ps();
  for (size_t i = 0; i < run; ++i) {
#pragma GCC unroll 4
    for (size_t s = 0; s < kStreams; ++s)
      a[s] = _mm512_add_ps(a[s], _mm512_load_ps(p + 16 * (s * run + i)));
  }
  for (size_t i = kStreams * run; i < lines; ++i)
    a[0] = _mm512_add_ps(a[0], _mm512_load_ps(p + 16 * i));
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  return out[0] + out[15];
}

__attribute__((target("avx2"))) float ReadAvx2(const float* p, size_t lines) {
  __m256 a = _mm256_setzero_ps(), b = a;
  for (size_t i = 0; i < lines; ++i) {
    a = _mm256_add_ps(a, _mm256_load_ps(p + 16 * i));
    b = _mm256_add_ps(b, _mm256_load_ps(p + 16 * i + 8));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(a, b));
  return out[0] + out[7];
}

float ReadPortable(const float* p, size_t lines) {
  float s = 0;
  for (size_t i = 0; i < lines; ++i) s += p[16 * i];
  return s;
}

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, size_t bytes)
    : pool_(pool),
      lines_(bytes / 64),
      buf_(static_cast<float*>(
               ::operator new[](std::max<size_t>(lines_, 1) * 64, std::align_val_t(64))),
           [](float* p) { ::operator delete[](p, std::align_val_t(64)); }) {
  std::memset(buf_.get(), 0, lines_ * 64);  // touch every page before timing
}

double ReadBandwidthProbe::Measure(int passes) {
  if (lines_ == 0) return 0;
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  std::atomic<float> sink{0};
  double fastest = 1e30;
  // Each pass reads the buffer as one run a thread and, with AVX-512, as four runs a thread too;
  // the faster counts.
  for (int pass = 0; pass < passes; ++pass) {
    for (const bool streams : {false, true}) {
      if (streams && !avx512) continue;
      const auto t0 = std::chrono::steady_clock::now();
      // One chunk per thread: each reads a contiguous part of the buffer.
      const int64_t chunks = pool_.num_threads();
      pool_.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          const size_t first = lines_ * c / chunks, last = lines_ * (c + 1) / chunks;
          const float* p = buf_.get() + 16 * first;
          const float s = streams  ? ReadStreamsAvx512(p, last - first)
                          : avx512 ? ReadAvx512(p, last - first)
                          : avx2   ? ReadAvx2(p, last - first)
                                   : ReadPortable(p, last - first);
          sink.store(s, std::memory_order_relaxed);
        }
      });
      fastest = std::min(
          fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const double gb_s = static_cast<double>(lines_ * 64) / fastest / 1e9;
  best_ = std::max(best_, gb_s);
  return gb_s;
}

}  // namespace tandem::bench
