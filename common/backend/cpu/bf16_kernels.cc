#include "common/backend/cpu/bf16_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/cpu/simd.h"
#include "common/tensor/dtype.h"

// GCC 12's AVX-512 extract intrinsics start from an "undefined" vector it then calls uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace tandem::cpu {
namespace {

const bool kHaveBf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512bf16") &&
                       std::getenv("TANDEM_DISABLE_AVX512") == nullptr;

#define TANDEM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// One 32-column block of a tile or of runs side by side (below): R weight rows w + r · w_stride,
// weights past the mask zero, asked for `ahead` bytes early (Prefetch()).
template <int R, int T>
TANDEM_BF16_TARGET __attribute__((always_inline)) inline void Block(
    __m512 (&acc)[R][T], const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride,
    int64_t i, __mmask32 m, int64_t ahead) {
  __m512i wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if constexpr (R * T > 1)
      _mm_prefetch(reinterpret_cast<const char*>(w + r * w_stride + i) + ahead, _MM_HINT_T0);
    wv[r] = _mm512_maskz_loadu_epi16(m, w + r * w_stride + i);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    __m512i xv = _mm512_loadu_si512(x + t * x_stride + i);
    if constexpr (R > 1) asm("" : "+v"(xv));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)xv, (__m512bh)wv[r]);
  }
}

// R weight rows (w + r · w_stride, k columns) × T activation rows in registers: per 32 columns, R
// weight and T activation loads feed R·T dot products of 32 pairs each; out[t · out_stride +
// r · out_step]. Every (weight row, activation row) pair gets the same operations whatever R and T:
// the blocks in column order, the masked last one, the lanes' fixed sum.
template <int R, int T>
TANDEM_BF16_TARGET void Sums(const uint16_t* x, int64_t x_stride, const uint16_t* w,
                             int64_t w_stride, int64_t k, float* out, int64_t out_stride,
                             int64_t out_step) {
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const int64_t ahead = Prefetch().bytes;
  // Whole 32-column blocks, then the last block with its weights past k masked to zero (the
  // activations there are zero too).
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) Block<R, T>(acc, x, x_stride, w, w_stride, i, ~__mmask32{0}, ahead);
  if (i < k) Block<R, T>(acc, x, x_stride, w, w_stride, i, (__mmask32{1} << (k - i)) - 1, ahead);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) out[t * out_stride + r * out_step] = ReduceAddAvx512(acc[r][t]);
  }
}

// A tile: R consecutive weight rows at a time.
template <int R, int T>
void TileRows(const uint16_t* x, int64_t x_stride, const uint16_t* w, int rows_w, int64_t k,
              float* out, int64_t out_stride) {
  int r = 0;
  for (; r + R <= rows_w; r += R) Sums<R, T>(x, x_stride, w + r * k, k, k, out + r, out_stride, 1);
  for (; r < rows_w; ++r) Sums<1, T>(x, x_stride, w + r * k, k, k, out + r, out_stride, 1);
}

// Bf16DotRowsStreamed: the rows in S runs of `run` rows, row j of every run at a time (so each
// pair's bits are a tile's). S·T accumulators, S weights and one activation within the 32 registers
// (cpu::DotRowsStreamed's pattern: long sequential streams, independent chains of dot products).
template <int S, int T>
void Runs(const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t k, int64_t run,
          float* out, int64_t out_stride) {
  for (int64_t j = 0; j < run; ++j)
    Sums<S, T>(x, x_stride, w + j * k, run * k, k, out + j, out_stride, run);
}

// Rounds x[0, k) to BF16 (F32ToBf16's bits: nearest even, a NaN kept quiet) 16 at a time.
TANDEM_BF16_TARGET void RoundRowAvx512(const float* x, int64_t k, uint16_t* out) {
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff),
                abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512i bits = _mm512_loadu_si512(x + i), high = _mm512_srli_epi32(bits, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(half, _mm512_and_si512(high, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs_mask), inf);
    r = _mm512_mask_or_epi32(r, nan, high, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < k; ++i) out[i] = F32ToBf16(x[i]);
}

}  // namespace

bool HaveAvx512Bf16() { return kHaveBf16; }

int64_t Bf16PaddedCols(int64_t k) { return (k + 31) / 32 * 32; }

void RoundRowsToBf16(const float* x, int64_t rows, int64_t k, uint16_t* out) {
  const int64_t kp = Bf16PaddedCols(k);
  for (int64_t t = 0; t < rows; ++t) {
    if (kHaveBf16) {
      RoundRowAvx512(x + t * k, k, out + t * kp);
    } else {
      for (int64_t i = 0; i < k; ++i) out[t * kp + i] = F32ToBf16(x[t * k + i]);
    }
    std::fill(out + t * kp + k, out + (t + 1) * kp, uint16_t{0});
  }
}

void Bf16DotTile(const uint16_t* x, int64_t x_stride, int rows_x, const uint16_t* w, int rows_w,
                 int64_t k, float* out, int64_t out_stride) {
  // Register blocks within 32 registers: R·T accumulators, R weights, one activation. Measured
  // (linear_bench, AMD EPYC Zen 5): one row, 6 weight rows stream from DRAM at 45 GB/s against 32
  // with 8 and 33 with 4; eight rows, 3 weight rows reach 560 GFLOP/s in cache (2: 430) and 250
  // from DRAM (2: 160).
  switch (rows_x) {
    case 1: return TileRows<6, 1>(x, x_stride, w, rows_w, k, out, out_stride);
    case 2: return TileRows<8, 2>(x, x_stride, w, rows_w, k, out, out_stride);
    case 3: return TileRows<6, 3>(x, x_stride, w, rows_w, k, out, out_stride);
    case 4: return TileRows<6, 4>(x, x_stride, w, rows_w, k, out, out_stride);
    case 5: return TileRows<5, 5>(x, x_stride, w, rows_w, k, out, out_stride);
    case 6: return TileRows<4, 6>(x, x_stride, w, rows_w, k, out, out_stride);
    case 7: return TileRows<3, 7>(x, x_stride, w, rows_w, k, out, out_stride);
    default: return TileRows<3, 8>(x, x_stride, w, rows_w, k, out, out_stride);
  }
}

void Bf16DotRowsStreamed(const uint16_t* x, int64_t x_stride, int rows_x, const uint16_t* w,
                         int64_t rows, int64_t k, float* out, int64_t out_stride) {
  WithRowCount(rows_x, [&](auto t) {
    constexpr int T = decltype(t)::value;
    constexpr int S = T <= 6 ? kBatch1Streams : 3;  // S·T + S + 1 registers
    const int64_t run = rows / S, done = run * S;
    if (run > 0) Runs<S, T>(x, x_stride, w, k, run, out, out_stride);
    Runs<1, T>(x, x_stride, w + done * k, k, rows - done, out + done, out_stride);
  });
}

}  // namespace tandem::cpu
