#include "common/backend/cpu/quant_kernels.h"

#include <immintrin.h>

#include <algorithm>

#include "common/backend/cpu/cpu_kernels.h"

namespace tandem::cpu {
namespace {

// How far ahead of the FMAs a row's codes are asked for (as cpu_kernels.cc's 16-bit tiles).
constexpr int64_t kPrefetchBytes = 8192;

// R weight rows against T activation rows, in registers. Per group: one vector accumulator per
// (row, activation) pair holds sum x·q, which is scaled into the pair's total (the RT independent
// accumulators keep the FMA units busy); zero points are subtracted once per group through the
// activation's group sum. Each activation vector is loaded once for the R rows and each widened
// weight vector feeds T FMAs. The operations for one (row, activation) pair do not depend on R or
// T.
template <int R, int T, bool kInt4>
__attribute__((target("avx512f,avx512bw"))) void QuantDotBlockAvx512(const float* const* x,
                                                                     const float* const* xsum,
                                                                     const QuantRows& w, int64_t r0,
                                                                     float* out, int64_t stride) {
  const uint8_t* q[R];
  const float* sc[R];
  const float* zp[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    q[r] = w.codes + (r0 + r) * w.row_bytes;
    sc[r] = w.scales + (r0 + r) * w.groups;
    zp[r] = w.zeros ? w.zeros + (r0 + r) * w.groups : nullptr;
  }
  __m512 acc[R][T];
  float extra[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm512_setzero_ps();
      extra[r][t] = 0.f;
    }
  }
  const __m512i low4 = _mm512_set1_epi32(0xF);
  for (int64_t g = 0; g < w.groups; ++g) {
    const int64_t c0 = g * w.group_size, c1 = std::min(w.cols, c0 + w.group_size);
    __m512 ga[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) ga[r][t] = _mm512_setzero_ps();
    }
    int64_t c = c0;
    for (; c + 32 <= c1; c += 32) {
      __m512 w0[R], w1[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // The codes stream from memory: ask for them early, so the loads overlap the FMAs.
        _mm_prefetch(reinterpret_cast<const char*>(q[r]) + (kInt4 ? c / 2 : c) + kPrefetchBytes,
                     _MM_HINT_T0);
        if constexpr (kInt4) {
          const __m512i v =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c / 2)));
          w0[r] = _mm512_cvtepi32_ps(_mm512_and_si512(v, low4));
          w1[r] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
        } else {
          w0[r] = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c))));
          w1[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c + 16))));
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512 xa = _mm512_loadu_ps(x[t] + c), xb = _mm512_loadu_ps(x[t] + c + 16);
        // Kept in registers: folded into each FMA as a memory operand they would be loaded R times.
        if constexpr (R > 1) asm("" : "+v"(xa), "+v"(xb));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          ga[r][t] = _mm512_fmadd_ps(xa, w0[r], ga[r][t]);
          ga[r][t] = _mm512_fmadd_ps(xb, w1[r], ga[r][t]);
        }
      }
    }
    float tail[R][T] = {};
    if constexpr (!kInt4) {  // int4 groups are whole 32-column blocks
      if (c + 16 <= c1) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 w0 = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c))));
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            ga[r][t] = _mm512_fmadd_ps(_mm512_loadu_ps(x[t] + c), w0, ga[r][t]);
          }
        }
        c += 16;
      }
      for (; c < c1; ++c) {
        for (int r = 0; r < R; ++r) {
          const float wq = static_cast<float>(static_cast<int8_t>(q[r][c]));
          for (int t = 0; t < T; ++t) tail[r][t] += x[t][c] * wq;
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float s = sc[r][g];
      const __m512 sv = _mm512_set1_ps(s);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm512_fmadd_ps(ga[r][t], sv, acc[r][t]);
        extra[r][t] += tail[r][t] * s;
        if (zp[r] != nullptr) extra[r][t] -= s * zp[r][g] * xsum[t][g];
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      out[t * stride + r] = _mm512_reduce_add_ps(acc[r][t]) + extra[r][t];
    }
  }
}

// The weight rows of a tile R at a time (the rest one at a time) for T activation rows.
template <int R, int T>
void QuantDotRowsAvx512(const float* const* x, const float* const* xsum, const QuantRows& w,
                        int rows_w, float* out, int64_t stride) {
  const bool int4 = w.type == QuantType::kInt4;
  int r = 0;
  for (; r + R <= rows_w; r += R) {
    if (int4) {
      QuantDotBlockAvx512<R, T, true>(x, xsum, w, r, out + r, stride);
    } else {
      QuantDotBlockAvx512<R, T, false>(x, xsum, w, r, out + r, stride);
    }
  }
  for (; r < rows_w; ++r) {
    if (int4) {
      QuantDotBlockAvx512<1, T, true>(x, xsum, w, r, out + r, stride);
    } else {
      QuantDotBlockAvx512<1, T, false>(x, xsum, w, r, out + r, stride);
    }
  }
}

}  // namespace

QuantRows QuantRowsOf(const QuantizedMatrix& m) {
  QuantRows q;
  q.type = m.type;
  q.cols = m.cols;
  q.group_size = m.group_size;
  q.groups = m.num_groups();
  q.codes = m.codes.data();
  q.row_bytes = static_cast<size_t>(m.row_bytes());
  q.scales = m.scales.data();
  q.zeros = m.zeros.empty() ? nullptr : m.zeros.data();
  return q;
}

void QuantGroupSums(const float* x, int64_t cols, int64_t group_size, float* xsum) {
  for (int64_t c0 = 0, g = 0; c0 < cols; c0 += group_size, ++g) {
    float s = 0.f;
    for (int64_t c = c0; c < std::min(cols, c0 + group_size); ++c) s += x[c];
    xsum[g] = s;
  }
}

void QuantDotTilePortable(const float* const* x, int rows_x, const float* const* xsum,
                          const QuantRows& w, int rows_w, float* out, int64_t out_stride) {
  for (int r = 0; r < rows_w; ++r) {
    const uint8_t* q = w.codes + r * w.row_bytes;
    for (int t = 0; t < rows_x; ++t) {
      float total = 0.f;
      for (int64_t g = 0; g < w.groups; ++g) {
        const int64_t c0 = g * w.group_size, c1 = std::min(w.cols, c0 + w.group_size);
        float dot = 0.f;
        for (int64_t c = c0; c < c1; ++c) dot += x[t][c] * static_cast<float>(CodeAt(w.type, q, c));
        const float s = w.scales[r * w.groups + g];
        total += dot * s;
        if (w.zeros != nullptr) total -= s * w.zeros[r * w.groups + g] * xsum[t][g];
      }
      out[t * out_stride + r] = total;
    }
  }
}

void QuantDotTile(const float* const* x, int rows_x, const float* const* xsum, const QuantRows& w,
                  int rows_w, float* out, int64_t out_stride) {
  if (!HaveAvx512() || rows_x < 1 || rows_x > 8) {
    return QuantDotTilePortable(x, rows_x, xsum, w, rows_w, out, out_stride);
  }
  switch (rows_x) {
    // Register blocks within AVX-512's 32 registers: 2RT accumulators, 2R weights, 2 activations.
    case 1: return QuantDotRowsAvx512<8, 1>(x, xsum, w, rows_w, out, out_stride);
    case 2: return QuantDotRowsAvx512<4, 2>(x, xsum, w, rows_w, out, out_stride);
    case 3: return QuantDotRowsAvx512<3, 3>(x, xsum, w, rows_w, out, out_stride);
    case 4: return QuantDotRowsAvx512<2, 4>(x, xsum, w, rows_w, out, out_stride);
    case 5: return QuantDotRowsAvx512<2, 5>(x, xsum, w, rows_w, out, out_stride);
    case 6: return QuantDotRowsAvx512<2, 6>(x, xsum, w, rows_w, out, out_stride);
    case 7: return QuantDotRowsAvx512<1, 7>(x, xsum, w, rows_w, out, out_stride);
    default: return QuantDotRowsAvx512<1, 8>(x, xsum, w, rows_w, out, out_stride);
  }
}

void DequantizeRows(const QuantRows& w, int64_t rows, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* q = w.codes + r * w.row_bytes;
    for (int64_t c = 0; c < w.cols; ++c) {
      const int64_t g = r * w.groups + c / w.group_size;
      const float z = w.zeros ? w.zeros[g] : 0.f;
      out[r * w.cols + c] = (static_cast<float>(CodeAt(w.type, q, c)) - z) * w.scales[g];
    }
  }
}

}  // namespace tandem::cpu
