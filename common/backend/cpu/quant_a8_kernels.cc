#include "common/backend/cpu/quant_a8_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/backend/cpu/cpu_kernels.h"

// GCC 12's AVX-512 extract intrinsics start from an "undefined" vector it then calls uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace tandem::cpu {
namespace {

const bool kHaveVnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                       std::getenv("TANDEM_DISABLE_AVX512") == nullptr;

// Where stored column c of an activation block [c0, c1) sits in the quantized activation row (the
// header's layout: int4's full 128-column blocks as lows then highs).
inline int64_t ActivationSlot(QuantType type, int64_t c0, int64_t c1, int64_t c) {
  if (type != QuantType::kInt4) return c;
  const int64_t chunk = c0 + (c - c0) / 128 * 128;
  if (chunk + 128 > c1) return c;  // a tail: column order
  const int64_t i = c - chunk, block = i / 32, j = i % 32;
  return chunk + (j < 16 ? 16 * block + j : 64 + 16 * block + (j - 16));
}

// An activation block's scale from its largest magnitude (1 for an all-zero or non-finite block).
inline float BlockScale(float amax) { return amax > 0 && std::isfinite(amax) ? amax / 127.f : 1.f; }
// x / s rounded to even and clamped to [-127, 127] (NaN to 127, as QuantizeBlockAvx512's min/max).
inline int QuantizeValue(float x, float s) {
  float v = std::nearbyint(x / s);
  v = v < 127.f ? v : 127.f;
  return static_cast<int>(v > -127.f ? v : -127.f);
}
// Columns [from, c1) of block [c0, c1) at scale s into their slots; returns their codes' sum.
int32_t QuantizeColumns(QuantType type, const float* x, int64_t c0, int64_t c1, int64_t from,
                        float s, int8_t* q) {
  int32_t total = 0;
  for (int64_t c = from; c < c1; ++c) {
    const int v = QuantizeValue(x[c], s);
    q[ActivationSlot(type, c0, c1, c)] = static_cast<int8_t>(v);
    total += v;
  }
  return total;
}
// Activation block [c0, c1) of row x: its scale, its codes at their slots in q, their sum.
void QuantizeBlock(QuantType type, const float* x, int64_t c0, int64_t c1, int8_t* q, float* scale,
                   int32_t* sum) {
  float amax = 0.f;
  for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::abs(x[c]));
  *scale = BlockScale(amax);
  *sum = QuantizeColumns(type, x, c0, c1, c0, *scale, q);
}
// The same with AVX-512, bit for bit: a maximum is exact in any order, the division and the
// rounding to even are IEEE's, the integer sum is exact. Sixteen columns at a time share a half of
// an int4 block, so their slots are consecutive.
__attribute__((target("avx512f,avx512bw"))) void QuantizeBlockAvx512(QuantType type, const float* x,
                                                                     int64_t c0, int64_t c1,
                                                                     int8_t* q, float* scale,
                                                                     int32_t* sum) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t c = c0;
  // max_ps gives its second operand where either is NaN: a NaN is skipped, as std::max does.
  for (; c + 16 <= c1; c += 16) vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + c)), vmax);
  float amax = _mm512_reduce_max_ps(vmax);
  for (int64_t k = c; k < c1; ++k) amax = std::max(amax, std::abs(x[k]));
  const float s = BlockScale(amax);
  const __m512 sv = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  __m512i vsum = _mm512_setzero_si512();
  for (c = c0; c + 16 <= c1; c += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + c), sv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
    const __m512i iv = _mm512_cvtps_epi32(v);
    vsum = _mm512_add_epi32(vsum, iv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + ActivationSlot(type, c0, c1, c)),
                     _mm512_cvtepi32_epi8(iv));
  }
  *scale = s;
  *sum = _mm512_reduce_add_epi32(vsum) + QuantizeColumns(type, x, c0, c1, c, s, q);
}

// One group's share of an output: sw · sx · (dot − (o + z) · Σxq), in double for the correction
// (o + z) · Σxq, which passes f32's exact integers for long groups.
inline double GroupTerm(float k, double dot, int offset, float zero, int32_t xsum) {
  return static_cast<double>(k) * (dot - (offset + static_cast<double>(zero)) * xsum);
}

// R weight rows against T activation rows. Per group, one int32 vector accumulator per pair holds
// Σ (q + o)·xq lane-wise (vpdpbusd: four byte products per lane); at the group's end it is
// converted and scaled into the pair's f32 vector total by sw·sx, and the zero point's and the
// offset's share, sw·(o + z) · (sx·Σxq), into an f32 total (one FMA, for all T pairs of a row in
// the lanes of one vector: sx·Σxq is the activation's alone, rounded once when it is quantized;
// computed here per pair and block, it cost several times the block's two vpdpbusd for 5 rows).
// The operations for one pair do not depend on R or T. The block's weight rows are r0, r0 + step,
// ..., r0 + (R - 1) * step (step 1: a tile's neighbours; a run's length: QuantDotRowsStreamedA8's
// streams), row r0 + i * step's output at out[t * stride + i * step].
template <int R, int T, bool kInt4>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) void A8BlockVnni(
    const QuantizedActivations& a, int64_t row0, const QuantRows& w, int64_t r0, float* out,
    int64_t stride, int64_t step = 1) {
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
  const int8_t* xr[T];
  const float* xs[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    xr[t] = a.row(row0 + t);
    xs[t] = a.scales(row0 + t);
  }
  __m512 f[R][T];
  __m256 corr[R];  // lane t: Σ sw·(o + z)·(sx·Σxq) of pair (r, t)
  const __mmask8 lanes = static_cast<__mmask8>((1u << T) - 1);
  double extra[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    corr[r] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      f[r][t] = _mm512_setzero_ps();
      extra[r][t] = 0;
    }
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  constexpr int kOffset = kInt4 ? 0 : 128;
  const int64_t ahead = Prefetch().bytes;
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int64_t c0 = b * a.block_size, c1 = std::min(w.cols, c0 + a.block_size);
    const int64_t g = c0 / w.group_size;  // blocks never straddle groups
    __m512i acc[R][T];
    int32_t tail[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm512_setzero_si512();
        tail[r][t] = 0;
      }
    }
    int64_t c = c0;
    bool has_tail = false;  // int8 columns past the last 16 (summed in scalar code)
    if constexpr (kInt4) {
      // 128 columns: 64 bytes of codes, their low nibbles against the chunk's low halves.
      for (; c + 128 <= c1; c += 128) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(q[r]) + c / 2 + ahead, _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(q[r] + c / 2);
          const __m512i lo = _mm512_and_si512(v, nibble);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], lo, _mm512_loadu_si512(xr[t] + c));
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], hi, _mm512_loadu_si512(xr[t] + c + 64));
          }
        }
      }
      // 32-column blocks (groups of 32 or 64): 16 bytes, the rest of the vector zero.
      for (; c + 32 <= c1; c += 32) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512i v = _mm512_zextsi128_si512(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c / 2)));
          const __m512i lo = _mm512_and_si512(v, nibble);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            const __m512i xlo = _mm512_zextsi128_si512(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[t] + c)));
            const __m512i xhi = _mm512_zextsi128_si512(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[t] + c + 16)));
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], lo, xlo);
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], hi, xhi);
          }
        }
      }
    } else {
      // 64 columns: codes made unsigned (+128) against the activations.
      for (; c + 64 <= c1; c += 64) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(q[r]) + c + ahead, _MM_HINT_T0);
          const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(q[r] + c), flip);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], v, _mm512_loadu_si512(xr[t] + c));
          }
        }
      }
      for (; c + 16 <= c1; c += 16) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          // The zero upper bytes flip to 128, against zero activations.
          const __m512i v = _mm512_xor_si512(
              _mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c))),
              flip);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], v,
                                            _mm512_zextsi128_si512(_mm_loadu_si128(
                                                reinterpret_cast<const __m128i*>(xr[t] + c))));
          }
        }
      }
      has_tail = c < c1;
      for (; c < c1; ++c) {
        for (int r = 0; r < R; ++r) {
          const int u = static_cast<int8_t>(q[r][c]) + 128;
          for (int t = 0; t < T; ++t) tail[r][t] += u * xr[t][c];
        }
      }
    }
    // The rows' sx·Σxq for this block, one lane each (QuantizedActivations::scaled_sum).
    const __m256 u = _mm256_maskz_loadu_ps(lanes, a.scaled_sums(b) + row0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float s = sc[r][g];
      const float zo = static_cast<float>(kOffset) + (zp[r] != nullptr ? zp[r][g] : 0.f);
      if (kOffset != 0 || zp[r] != nullptr) {
        corr[r] = _mm256_fmadd_ps(_mm256_set1_ps(s * zo), u, corr[r]);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const float k = s * xs[t][b];
        f[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][t]), _mm512_set1_ps(k), f[r][t]);
        if (!kInt4 && has_tail) extra[r][t] += static_cast<double>(k) * tail[r][t];
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    alignas(32) float c[8];
    _mm256_store_ps(c, corr[r]);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      out[t * stride + r * step] =
          static_cast<float>(static_cast<double>(_mm512_reduce_add_ps(f[r][t])) -
                             static_cast<double>(c[t]) + extra[r][t]);
    }
  }
}

template <int R, int T>
void A8RowsVnni(const QuantizedActivations& a, int64_t row0, const QuantRows& w, int rows_w,
                float* out, int64_t stride) {
  const bool int4 = w.type == QuantType::kInt4;
  int r = 0;
  for (; r + R <= rows_w; r += R) {
    if (int4) {
      A8BlockVnni<R, T, true>(a, row0, w, r, out + r, stride);
    } else {
      A8BlockVnni<R, T, false>(a, row0, w, r, out + r, stride);
    }
  }
  for (; r < rows_w; ++r) {
    if (int4) {
      A8BlockVnni<1, T, true>(a, row0, w, r, out + r, stride);
    } else {
      A8BlockVnni<1, T, false>(a, row0, w, r, out + r, stride);
    }
  }
}

// Int4 weights in whole blocks of 128 columns (groups of 128 or a multiple: the default layout),
// one activation row: A8BlockVnni<kBatch1Streams, 1, true>'s operations for each row in the same
// order (the same bits), without its general loops, which at batch 1 cost a third of the time.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma"))) void A8Int4Streams128(
    const QuantizedActivations& a, int64_t row, const QuantRows& w, int64_t run, float* out) {
  const int8_t* xr = a.row(row);
  const float* xs = a.scales(row);
  const int64_t per_group = w.group_size / 128;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const int64_t ahead = Prefetch().bytes;
  for (int64_t j = 0; j < run; ++j) {
    const uint8_t* q[kBatch1Streams];
    const float* sc[kBatch1Streams];
    const float* zp[kBatch1Streams];
    __m512 f[kBatch1Streams];
    __m128 corr[kBatch1Streams];
#pragma GCC unroll 4
    for (int r = 0; r < kBatch1Streams; ++r) {
      const int64_t i = j + r * run;
      q[r] = w.codes + i * static_cast<int64_t>(w.row_bytes);
      sc[r] = w.scales + i * w.groups;
      zp[r] = w.zeros != nullptr ? w.zeros + i * w.groups : nullptr;
      f[r] = _mm512_setzero_ps();
      corr[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0, g = 0, in_group = 0; b < a.blocks; ++b) {
      const __m512i x0 = _mm512_loadu_si512(xr + 128 * b),
                    x1 = _mm512_loadu_si512(xr + 128 * b + 64);
      const float sx = xs[b], u = a.scaled_sums(b)[row];
#pragma GCC unroll 4
      for (int r = 0; r < kBatch1Streams; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(q[r]) + 64 * b + ahead, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(q[r] + 64 * b);
        __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, nibble), x0);
        acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), x1);
        const float k = sc[r][g] * sx;
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(k), f[r]);
        if (zp[r] != nullptr) {
          const float zo = 0.f + zp[r][g];
          corr[r] = _mm_fmadd_ss(_mm_set_ss(sc[r][g] * zo), _mm_set_ss(u), corr[r]);
        }
      }
      if (++in_group == per_group) {
        in_group = 0;
        ++g;
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < kBatch1Streams; ++r) {
      out[r * run + j] = static_cast<float>(static_cast<double>(_mm512_reduce_add_ps(f[r])) -
                                            static_cast<double>(_mm_cvtss_f32(corr[r])) + 0.0);
    }
  }
}

// QuantDotRowsStreamedA8 with VNNI: S runs of `run` rows, row j of every run at a time, for T
// activation rows from first_row.
template <int S, int T, bool kInt4>
void A8RowsStreamedVnni(const QuantizedActivations& a, int64_t first_row, const QuantRows& w,
                        int64_t rows, float* out, int64_t stride) {
  const int64_t run = rows / S;
  bool done = false;
  if constexpr (T == 1 && S == kBatch1Streams && kInt4) {
    if (a.block_size == 128 && w.group_size % 128 == 0 && w.cols % 128 == 0) {
      A8Int4Streams128(a, first_row, w, run, out);
      done = true;
    }
  }
  if (!done) {
    for (int64_t j = 0; j < run; ++j)
      A8BlockVnni<S, T, kInt4>(a, first_row, w, j, out + j, stride, run);
  }
  for (int64_t r = run * S; r < rows; ++r)
    A8BlockVnni<1, T, kInt4>(a, first_row, w, r, out + r, stride);
}

// As many runs as the tiles' register blocks hold weight rows for T (2·S·T accumulators), up to
// four: one run, a single sequential stream, from five rows.
template <int T>
void A8RowsStreamedRows(const QuantizedActivations& a, int64_t first_row, const QuantRows& w,
                        int64_t rows, float* out, int64_t stride) {
  constexpr int S = T <= 2 ? kBatch1Streams : T <= 4 ? 2 : 1;
  if (w.type == QuantType::kInt4) {
    A8RowsStreamedVnni<S, T, true>(a, first_row, w, rows, out, stride);
  } else {
    A8RowsStreamedVnni<S, T, false>(a, first_row, w, rows, out, stride);
  }
}

}  // namespace

bool HaveAvx512Vnni() { return kHaveVnni; }

int64_t ActivationBlockSize(const QuantRows& w) {
  const int64_t g = w.group_size;
  return g > 128 && (g % 128 == 0 || g >= w.cols) ? 128 : g;
}

namespace {

void QuantizeActivationsWith(bool avx512, const float* x, int64_t rows, const QuantRows& w,
                             QuantizedActivations* out) {
  out->cols = w.cols;
  out->block_size = ActivationBlockSize(w);
  out->blocks = (w.cols + out->block_size - 1) / out->block_size;
  const int64_t blocks = out->blocks;
  out->q.resize(static_cast<size_t>(rows * w.cols));
  out->scale.resize(static_cast<size_t>(rows * blocks));
  out->sum.resize(static_cast<size_t>(rows * blocks));
  out->rows = rows;
  out->scaled_sum.resize(static_cast<size_t>(rows * blocks));
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * w.cols;
    int8_t* qi = out->q.data() + i * w.cols;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * out->block_size, c1 = std::min(w.cols, c0 + out->block_size);
      float* s = &out->scale[i * blocks + b];
      int32_t* sum = &out->sum[i * blocks + b];
      if (avx512) {
        QuantizeBlockAvx512(w.type, xi, c0, c1, qi, s, sum);
      } else {
        QuantizeBlock(w.type, xi, c0, c1, qi, s, sum);
      }
      out->scaled_sum[b * rows + i] = *s * static_cast<float>(*sum);
    }
  }
}

}  // namespace

void QuantizeActivations(const float* x, int64_t rows, const QuantRows& w,
                         QuantizedActivations* out) {
  QuantizeActivationsWith(kHaveVnni, x, rows, w, out);
}

void QuantizeActivationsPortable(const float* x, int64_t rows, const QuantRows& w,
                                 QuantizedActivations* out) {
  QuantizeActivationsWith(false, x, rows, w, out);
}

void QuantDotTileA8Portable(const QuantizedActivations& a, int64_t first_row, int rows_x,
                            const QuantRows& w, int rows_w, float* out, int64_t out_stride) {
  const int offset = w.type == QuantType::kInt8 ? 128 : 0;
  for (int r = 0; r < rows_w; ++r) {
    const uint8_t* q = w.codes + r * w.row_bytes;
    for (int t = 0; t < rows_x; ++t) {
      const int8_t* xq = a.row(first_row + t);
      double total = 0;
      for (int64_t b = 0; b < a.blocks; ++b) {
        const int64_t c0 = b * a.block_size, c1 = std::min(w.cols, c0 + a.block_size);
        const int64_t g = c0 / w.group_size;
        int64_t dot = 0;
        for (int64_t c = c0; c < c1; ++c) {
          dot += (CodeAt(w.type, q, c) + offset) * xq[ActivationSlot(w.type, c0, c1, c)];
        }
        const float k = w.scales[r * w.groups + g] * a.scales(first_row + t)[b];
        const float z = w.zeros != nullptr ? w.zeros[r * w.groups + g] : 0.f;
        total += GroupTerm(k, static_cast<double>(dot), offset, z, a.sums(first_row + t)[b]);
      }
      out[t * out_stride + r] = static_cast<float>(total);
    }
  }
}

void QuantDotTileA8(const QuantizedActivations& a, int64_t first_row, int rows_x,
                    const QuantRows& w, int rows_w, float* out, int64_t out_stride) {
  if (!kHaveVnni || rows_x < 1 || rows_x > 8) {
    return QuantDotTileA8Portable(a, first_row, rows_x, w, rows_w, out, out_stride);
  }
  switch (rows_x) {
    // 2RT accumulators (int32 for the group, f32 for the total) and three for the codes.
    case 1: return A8RowsVnni<8, 1>(a, first_row, w, rows_w, out, out_stride);
    case 2: return A8RowsVnni<4, 2>(a, first_row, w, rows_w, out, out_stride);
    case 3: return A8RowsVnni<2, 3>(a, first_row, w, rows_w, out, out_stride);
    case 4: return A8RowsVnni<2, 4>(a, first_row, w, rows_w, out, out_stride);
    case 5: return A8RowsVnni<1, 5>(a, first_row, w, rows_w, out, out_stride);
    case 6: return A8RowsVnni<1, 6>(a, first_row, w, rows_w, out, out_stride);
    case 7: return A8RowsVnni<1, 7>(a, first_row, w, rows_w, out, out_stride);
    default: return A8RowsVnni<1, 8>(a, first_row, w, rows_w, out, out_stride);
  }
}

void QuantDotRowsStreamedA8(const QuantizedActivations& a, int64_t first_row, int rows_x,
                            const QuantRows& w, int64_t rows, float* out, int64_t out_stride) {
  if (!kHaveVnni || rows_x < 1 || rows_x > 8) {
    return QuantDotTileA8Portable(a, first_row, rows_x, w, static_cast<int>(rows), out, out_stride);
  }
  WithRowCount(rows_x, [&](auto t) {
    A8RowsStreamedRows<decltype(t)::value>(a, first_row, w, rows, out, out_stride);
  });
}

}  // namespace tandem::cpu
