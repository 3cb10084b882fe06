#include "common/backend/cpu/quant_a8_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace tandem::cpu {
namespace {

const bool kHaveVnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                       std::getenv("TANDEM_DISABLE_AVX512") == nullptr;

// How far ahead of the dot products a row's codes are asked for (as quant_kernels.cc's).
constexpr int64_t kPrefetchBytes = 8192;

// Where stored column c of an activation block [c0, c1) sits in the quantized activation row (the
// header's layout: int4's full 128-column blocks as lows then highs).
inline int64_t ActivationSlot(QuantType type, int64_t c0, int64_t c1, int64_t c) {
  if (type != QuantType::kInt4) return c;
  const int64_t chunk = c0 + (c - c0) / 128 * 128;
  if (chunk + 128 > c1) return c;  // a tail: column order
  const int64_t i = c - chunk, block = i / 32, j = i % 32;
  return chunk + (j < 16 ? 16 * block + j : 64 + 16 * block + (j - 16));
}

// One group's share of an output: sw · sx · (dot − (o + z) · Σxq), in double for the correction
// (o + z) · Σxq, which passes f32's exact integers for long groups.
inline double GroupTerm(float k, double dot, int offset, float zero, int32_t xsum) {
  return static_cast<double>(k) * (dot - (offset + static_cast<double>(zero)) * xsum);
}

// R weight rows against T activation rows. Per group, one int32 vector accumulator per pair holds
// Σ (q + o)·xq lane-wise (vpdpbusd: four byte products per lane); at the group's end it is
// converted and scaled into the pair's f32 vector total by sw·sx, and the zero point's correction
// goes to a scalar. The operations for one pair do not depend on R or T.
template <int R, int T, bool kInt4>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void A8BlockVnni(
    const QuantizedActivations& a, int64_t row0, const QuantRows& w, int64_t r0, float* out,
    int64_t stride) {
  const uint8_t* q[R];
  const float* sc[R];
  const float* zp[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    q[r] = w.codes + (r0 + r) * w.row_bytes;
    sc[r] = w.scales + (r0 + r) * w.groups;
    zp[r] = w.zeros ? w.zeros + (r0 + r) * w.groups : nullptr;
  }
  const int8_t* xr[T];
  const float* xs[T];
  const int32_t* xsum[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    xr[t] = a.row(row0 + t);
    xs[t] = a.scales(row0 + t);
    xsum[t] = a.sums(row0 + t);
  }
  __m512 f[R][T];
  double extra[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      f[r][t] = _mm512_setzero_ps();
      extra[r][t] = 0;
    }
  }
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  constexpr int kOffset = kInt4 ? 0 : 128;
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
    if constexpr (kInt4) {
      // 128 columns: 64 bytes of codes, their low nibbles against the chunk's low halves.
      for (; c + 128 <= c1; c += 128) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(q[r]) + c / 2 + kPrefetchBytes, _MM_HINT_T0);
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
          _mm_prefetch(reinterpret_cast<const char*>(q[r]) + c + kPrefetchBytes, _MM_HINT_T0);
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
      for (; c < c1; ++c) {
        for (int r = 0; r < R; ++r) {
          const int u = static_cast<int8_t>(q[r][c]) + 128;
          for (int t = 0; t < T; ++t) tail[r][t] += u * xr[t][c];
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float s = sc[r][g];
      const float z = zp[r] != nullptr ? zp[r][g] : 0.f;
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const float k = s * xs[t][b];
        f[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][t]), _mm512_set1_ps(k), f[r][t]);
        extra[r][t] += GroupTerm(k, tail[r][t], kOffset, z, xsum[t][b]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      out[t * stride + r] =
          static_cast<float>(static_cast<double>(_mm512_reduce_add_ps(f[r][t])) + extra[r][t]);
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

}  // namespace

bool HaveAvx512Vnni() { return kHaveVnni; }

int64_t ActivationBlockSize(const QuantRows& w) {
  const int64_t g = w.group_size;
  return g > 128 && (g % 128 == 0 || g >= w.cols) ? 128 : g;
}

void QuantizeActivations(const float* x, int64_t rows, const QuantRows& w,
                         QuantizedActivations* out) {
  out->cols = w.cols;
  out->block_size = ActivationBlockSize(w);
  out->blocks = (w.cols + out->block_size - 1) / out->block_size;
  const int64_t blocks = out->blocks;
  out->q.resize(static_cast<size_t>(rows * w.cols));
  out->scale.resize(static_cast<size_t>(rows * blocks));
  out->sum.resize(static_cast<size_t>(rows * blocks));
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * w.cols;
    int8_t* qi = out->q.data() + i * w.cols;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * out->block_size, c1 = std::min(w.cols, c0 + out->block_size);
      float amax = 0.f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::abs(xi[c]));
      const float s = amax > 0 && std::isfinite(amax) ? amax / 127.f : 1.f;
      int32_t sum = 0;
      for (int64_t c = c0; c < c1; ++c) {
        const int v = static_cast<int>(std::clamp(std::nearbyint(xi[c] / s), -127.f, 127.f));
        qi[ActivationSlot(w.type, c0, c1, c)] = static_cast<int8_t>(v);
        sum += v;
      }
      out->scale[i * blocks + b] = s;
      out->sum[i * blocks + b] = sum;
    }
  }
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

}  // namespace tandem::cpu
