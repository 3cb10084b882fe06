#include "common/backend/cpu/quant_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "common/backend/cpu/cpu_kernels.h"

// GCC 12's AVX-512 extract intrinsics start from an "undefined" vector it then calls uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace tandem::cpu {
namespace {

// Int4 codes in 32-bit lanes as floats, from a table: vpermps reads an index's low four bits, so a
// lane holding a whole byte gives its low nibble with no mask; the same values as a conversion.
__attribute__((target("avx512f"), always_inline)) inline __m512 Int4AsFloats(__m512i codes) {
  return _mm512_permutexvar_ps(
      codes, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// 16 codes of a row from column c on (for int4: half h of the 32-column block at c), as f32.
template <bool kInt4>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512 Widen16(const uint8_t* row,
                                                                                 int64_t c, int h) {
  if constexpr (kInt4) {
    const __m512i v =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
    return Int4AsFloats(h == 0 ? v : _mm512_srli_epi32(v, 4));
  } else {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c + 16 * h))));
  }
}

// One step of QuantDotBlockAvx512: 16 columns at c + 16h for every (row, activation) pair.
template <int R, int T, bool kInt4>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void QuantStep(
    const float* const* x, const uint8_t* const* q, int64_t c, int h, __m512 (&ga)[R][T]) {
  __m512 wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wv[r] = Widen16<kInt4>(q[r], c, h);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    __m512 xv = _mm512_loadu_ps(x[t] + c + 16 * h);
    // Kept in a register: folded into each FMA as a memory operand it would be loaded R times.
    if constexpr (R > 1) asm("" : "+v"(xv));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) ga[r][t] = _mm512_fmadd_ps(xv, wv[r], ga[r][t]);
  }
}

// 32 columns at c: the two halves in turn, or for one activation row (where widening, not FMAs,
// is the work) each row's 32 codes widened at once, an int4 row's bytes loaded once for both.
// The FMAs of a pair come in the same order either way.
template <int R, int T, bool kInt4>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void QuantStep32(
    const float* const* x, const uint8_t* const* q, int64_t c, __m512 (&ga)[R][T]) {
  if constexpr (T == 1 && kInt4) {
    const __m512 x0 = _mm512_loadu_ps(x[0] + c), x1 = _mm512_loadu_ps(x[0] + c + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i v =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c / 2)));
      ga[r][0] = _mm512_fmadd_ps(x0, Int4AsFloats(v), ga[r][0]);
      ga[r][0] = _mm512_fmadd_ps(x1, Int4AsFloats(_mm512_srli_epi32(v, 4)), ga[r][0]);
    }
  } else {
    QuantStep<R, T, kInt4>(x, q, c, 0, ga);
    QuantStep<R, T, kInt4>(x, q, c, 1, ga);
  }
}

// R weight rows against T activation rows. Per group, one vector accumulator per (row, activation)
// pair, in registers, holds sum x·q over 16 lanes; at the group's end it is scaled into the pair's
// total, which for several activation rows lives in memory (touched once a group, so the registers
// go to a wider block: RT accumulators, R widened weights and one activation vector). Zero points
// are subtracted once per group through the activation's group sum. Each activation vector is
// loaded once for the R rows and each widened weight vector feeds T FMAs. The operations for one
// (row, activation) pair do not depend on R or T. The block's rows are r0, r0 + step, ...,
// r0 + (R - 1) * step (step 1: a tile's neighbours; a run's length: QuantDotRowsStreamed's
// streams), row r0 + i * step's output at out[t * stride + i * step].
template <int R, int T, bool kInt4>
__attribute__((target("avx512f,avx512bw"))) void QuantDotBlockAvx512(const float* const* x,
                                                                     const float* const* xsum,
                                                                     const QuantRows& w, int64_t r0,
                                                                     float* out, int64_t stride,
                                                                     int64_t step = 1) {
  const uint8_t* q[R];
  const float* sc[R];
  const float* zp[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t row = r0 + r * step;
    q[r] = w.codes + row * static_cast<int64_t>(w.row_bytes);
    sc[r] = w.scales + row * w.groups;
    zp[r] = w.zeros ? w.zeros + row * w.groups : nullptr;
  }
  // Totals: in registers for one activation row (R of them fit beside the R group accumulators),
  // else in memory.
  const int64_t ahead = Prefetch().bytes;
  alignas(64) float total[R][T][16] = {};
  __m512 total_reg[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) total_reg[r] = _mm512_setzero_ps();
  float extra[R][T] = {};
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
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // The codes stream from memory: ask for them early, so the loads overlap the FMAs.
        _mm_prefetch(reinterpret_cast<const char*>(q[r]) + (kInt4 ? c / 2 : c) + ahead,
                     _MM_HINT_T0);
      }
      QuantStep32<R, T, kInt4>(x, q, c, ga);
    }
    float tail[R][T] = {};
    if constexpr (!kInt4) {  // int4 groups are whole 32-column blocks
      if (c + 16 <= c1) {
        QuantStep<R, T, kInt4>(x, q, c, 0, ga);
        c += 16;
      }
      // Fused explicitly: left to the compiler, whether a product and its sum are contracted
      // into one FMA depends on how it vectorises these loops for R and T, and the bits with it.
      for (; c < c1; ++c) {
        for (int r = 0; r < R; ++r) {
          const float wq = static_cast<float>(static_cast<int8_t>(q[r][c]));
          for (int t = 0; t < T; ++t) tail[r][t] = std::fma(x[t][c], wq, tail[r][t]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float s = sc[r][g];
      const __m512 sv = _mm512_set1_ps(s);
      const float sz = zp[r] != nullptr ? s * zp[r][g] : 0.f;
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        if constexpr (T == 1) {
          total_reg[r] = _mm512_fmadd_ps(ga[r][t], sv, total_reg[r]);
        } else {
          _mm512_store_ps(total[r][t], _mm512_fmadd_ps(ga[r][t], sv, _mm512_load_ps(total[r][t])));
        }
        if constexpr (!kInt4) extra[r][t] = std::fma(tail[r][t], s, extra[r][t]);
        if (zp[r] != nullptr) extra[r][t] = std::fma(-sz, xsum[t][g], extra[r][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 sum = T == 1 ? total_reg[r] : _mm512_load_ps(total[r][t]);
      out[t * stride + r * step] = _mm512_reduce_add_ps(sum) + extra[r][t];
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

// QuantDotRowsStreamed with AVX-512: S runs of `run` rows, row j of every run at a time, for T
// activation rows.
template <int S, int T, bool kInt4>
void QuantRowsStreamedAvx512(const float* const* x, const float* const* xsum, const QuantRows& w,
                             int64_t rows, float* out, int64_t stride) {
  const int64_t run = rows / S;
  for (int64_t j = 0; j < run; ++j)
    QuantDotBlockAvx512<S, T, kInt4>(x, xsum, w, j, out + j, stride, run);
  for (int64_t r = run * S; r < rows; ++r)
    QuantDotBlockAvx512<1, T, kInt4>(x, xsum, w, r, out + r, stride);
}

// Four runs up to six activation rows, three for seven and eight (the tiles' register blocks).
template <int T>
void QuantRowsStreamedRows(const float* const* x, const float* const* xsum, const QuantRows& w,
                           int64_t rows, float* out, int64_t stride) {
  constexpr int S = T <= 6 ? kBatch1Streams : 3;
  if (w.type == QuantType::kInt4) {
    QuantRowsStreamedAvx512<S, T, true>(x, xsum, w, rows, out, stride);
  } else {
    QuantRowsStreamedAvx512<S, T, false>(x, xsum, w, rows, out, stride);
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
    // Register blocks within AVX-512's 32 registers: RT accumulators, R weights, 1 activation.
    case 1: return QuantDotRowsAvx512<8, 1>(x, xsum, w, rows_w, out, out_stride);
    case 2: return QuantDotRowsAvx512<8, 2>(x, xsum, w, rows_w, out, out_stride);
    case 3: return QuantDotRowsAvx512<6, 3>(x, xsum, w, rows_w, out, out_stride);
    case 4: return QuantDotRowsAvx512<4, 4>(x, xsum, w, rows_w, out, out_stride);
    case 5: return QuantDotRowsAvx512<4, 5>(x, xsum, w, rows_w, out, out_stride);
    case 6: return QuantDotRowsAvx512<4, 6>(x, xsum, w, rows_w, out, out_stride);
    case 7: return QuantDotRowsAvx512<3, 7>(x, xsum, w, rows_w, out, out_stride);
    default: return QuantDotRowsAvx512<3, 8>(x, xsum, w, rows_w, out, out_stride);
  }
}

void QuantDotRowsStreamed(const float* const* x, int rows_x, const float* const* xsum,
                          const QuantRows& w, int64_t rows, float* out, int64_t out_stride) {
  if (!HaveAvx512() || rows_x < 1 || rows_x > 8) {
    // Each row's dot products as the tiles compute them (the portable tile takes any rows).
    return QuantDotTilePortable(x, rows_x, xsum, w, static_cast<int>(rows), out, out_stride);
  }
  WithRowCount(rows_x, [&](auto t) {
    QuantRowsStreamedRows<decltype(t)::value>(x, xsum, w, rows, out, out_stride);
  });
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
