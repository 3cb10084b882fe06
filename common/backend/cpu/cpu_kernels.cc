#include "common/backend/cpu/cpu_kernels.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "common/backend/cpu/simd.h"

// GCC 12's AVX-512 extract intrinsics start from an "undefined" vector it then calls uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace tandem::cpu {
namespace {

// Dot products of T activation rows against one weight row. Each row's result is computed with
// exactly the operations of the T = 1 case, in the same order, so Linear gives bit-identical
// results whatever the batch size (batch invariance); T > 1 only shares the weight loads.
// Weight loaders: 8 (AVX2) or 16 (AVX-512) consecutive weights as f32.
struct Avx2Bf16 {
  __attribute__((target("avx2,fma,f16c"))) static __m256 Load(const void* w, int64_t i) {
    const auto* p = static_cast<const uint16_t*>(w) + i;
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static float Scalar(const void* w, int64_t i) {
    return Bf16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
};
struct Avx2F16 {
  __attribute__((target("avx2,fma,f16c"))) static __m256 Load(const void* w, int64_t i) {
    const auto* p = static_cast<const uint16_t*>(w) + i;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float Scalar(const void* w, int64_t i) {
    return F16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
};
struct Avx2F32 {
  __attribute__((target("avx2,fma,f16c"))) static __m256 Load(const void* w, int64_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  }
  static float Scalar(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct Avx512Bf16 {
  static constexpr int kBytes = 2;
  __attribute__((target("avx512f"))) static __m512 Load(const void* w, int64_t i) {
    const auto* p = static_cast<const uint16_t*>(w) + i;
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static float Scalar(const void* w, int64_t i) {
    return Bf16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
};
struct Avx512F16 {
  static constexpr int kBytes = 2;
  __attribute__((target("avx512f"))) static __m512 Load(const void* w, int64_t i) {
    const auto* p = static_cast<const uint16_t*>(w) + i;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static float Scalar(const void* w, int64_t i) {
    return F16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
};
struct Avx512F32 {
  static constexpr int kBytes = 4;
  __attribute__((target("avx512f"))) static __m512 Load(const void* w, int64_t i) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  }
  static float Scalar(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};

template <typename L, int T>
__attribute__((target("avx2,fma,f16c"))) void DotRowsAvx2(const float* const* x, const void* w,
                                                          int64_t n, float* out) {
  __m256 acc0[T], acc1[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = L::Load(w, i), w1 = L::Load(w, i + 8);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      acc0[t] = _mm256_fmadd_ps(_mm256_loadu_ps(x[t] + i), w0, acc0[t]);
      acc1[t] = _mm256_fmadd_ps(_mm256_loadu_ps(x[t] + i + 8), w1, acc1[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m256 a = _mm256_add_ps(acc0[t], acc1[t]);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float sum = _mm_cvtss_f32(s);
    for (int64_t k = i; k < n; ++k) sum += x[t][k] * L::Scalar(w, k);
    out[t] = sum;
  }
}

// R weight rows × T activation rows in registers: per 16 weights, R weight vectors and one
// activation vector at a time feed R·T FMAs, one accumulator per (r, t) pair. Each pair's result is
// the same operations whatever R and T (16 lanes summed along the row, a fixed pairwise sum of the
// lanes, then the scalar tail), so every batch size gives the same bits.
template <typename L, int R, int T>
__attribute__((target("avx512f"))) void DotTileAvx512(const float* const* x, const std::byte* w,
                                                      size_t row_bytes, int64_t n, float* out,
                                                      int64_t out_stride) {
  const int64_t ahead = Prefetch().bytes;
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // The weights stream from memory: ask for them early (once per 64-byte line), so the loads
      // overlap the FMAs.
      if constexpr (R * T > 1) {
        if (ahead > 0 && (i * L::kBytes) % 64 == 0)
          _mm_prefetch(reinterpret_cast<const char*>(w + r * row_bytes) + i * L::kBytes + ahead,
                       _MM_HINT_T0);
      }
      wv[r] = L::Load(w + r * row_bytes, i);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      __m512 xv = _mm512_loadu_ps(x[t] + i);
      // Kept in a register: folded into each FMA as a memory operand it would be loaded R times.
      if constexpr (R > 1) asm("" : "+v"(xv));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(xv, wv[r], acc[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const void* wr = w + r * row_bytes;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float sum = ReduceAddAvx512(acc[r][t]);
      for (int64_t k = i; k < n; ++k) sum += x[t][k] * L::Scalar(wr, k);
      out[t * out_stride + r] = sum;
    }
  }
}

// The weight rows of a tile taken R at a time (the rest one at a time) for T activation rows.
template <typename L, int R, int T>
void DotTileRows(const float* const* x, const std::byte* w, size_t row_bytes, int rows_w, int64_t n,
                 float* out, int64_t out_stride) {
  int r = 0;
  for (; r + R <= rows_w; r += R)
    DotTileAvx512<L, R, T>(x, w + r * row_bytes, row_bytes, n, out + r, out_stride);
  for (; r < rows_w; ++r)
    DotTileAvx512<L, 1, T>(x, w + r * row_bytes, row_bytes, n, out + r, out_stride);
}

// Register blocks within AVX-512's 32 registers: R·T accumulators, R weights, one activation; R
// divides the backend's 24-row tiles. One row streams 6 weight rows (as many streams from DRAM as
// measured best); more rows take as many weight rows as the registers hold, so a step of a few
// rows (speculative verification, small batches) reads its weights at nearly one row's cost.
template <typename L>
void DotTileDispatch(const float* const* x, int rows_x, const std::byte* w, size_t row_bytes,
                     int rows_w, int64_t n, float* out, int64_t out_stride) {
  switch (rows_x) {
    case 1: return DotTileRows<L, 6, 1>(x, w, row_bytes, rows_w, n, out, out_stride);
    case 2: return DotTileRows<L, 8, 2>(x, w, row_bytes, rows_w, n, out, out_stride);
    case 3: return DotTileRows<L, 6, 3>(x, w, row_bytes, rows_w, n, out, out_stride);
    case 4: return DotTileRows<L, 4, 4>(x, w, row_bytes, rows_w, n, out, out_stride);
    case 5: return DotTileRows<L, 4, 5>(x, w, row_bytes, rows_w, n, out, out_stride);
    case 6: return DotTileRows<L, 4, 6>(x, w, row_bytes, rows_w, n, out, out_stride);
    case 7: return DotTileRows<L, 3, 7>(x, w, row_bytes, rows_w, n, out, out_stride);
    default: return DotTileRows<L, 3, 8>(x, w, row_bytes, rows_w, n, out, out_stride);
  }
}

// DotRowsStreamed with AVX-512: the rows in S runs of `run` rows, row j of every run at a time
// against T activation rows, each (row, activation row) pair's sum the operations of
// DotTileAvx512 (16 lanes along the row, the lanes, the scalar tail). Rows of 896 and 4864 weights
// (Qwen2.5-0.5B) read as four streams ran at 100-110% of a plain read of the same memory on an AMD
// EPYC Zen 5 VM, one row at a time at 90% (896) and 60% (4864), six rows side by side (16 weights
// of each in turn) at 70-80%. S·T accumulators, S weights and one activation fit the 32 registers:
// S = 4 up to T = 6, S = 3 up to T = 8.
template <typename L, int S, int T>
__attribute__((target("avx512f"))) void DotRowsRunsAvx512(const float* const* x, const std::byte* w,
                                                          size_t row_bytes, int64_t run, int64_t n,
                                                          float* out, int64_t out_stride) {
  // One row's weights arrive as fast as its FMAs go: left to the hardware's prefetchers where
  // they keep up (Prefetch()).
  const int64_t ahead = T > 1 || Prefetch().batch1 ? Prefetch().bytes : 0;
  for (int64_t j = 0; j < run; ++j) {
    const std::byte* wj = w + j * row_bytes;
    __m512 acc[S][T];
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[s][t] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m512 wv[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) {
        // Ask for the weights early (once per 64-byte line) so that the loads overlap the FMAs.
        if (ahead > 0 && (i * L::kBytes) % 64 == 0)
          _mm_prefetch(
              reinterpret_cast<const char*>(wj + s * run * row_bytes) + i * L::kBytes + ahead,
              _MM_HINT_T0);
        wv[s] = L::Load(wj + s * run * row_bytes, i);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512 xv = _mm512_loadu_ps(x[t] + i);
        if constexpr (S > 1 && T > 1) asm("" : "+v"(xv));  // one load for the S FMAs
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) acc[s][t] = _mm512_fmadd_ps(xv, wv[s], acc[s][t]);
      }
    }
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      const void* wr = wj + s * run * row_bytes;
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        float sum = ReduceAddAvx512(acc[s][t]);
        for (int64_t k = i; k < n; ++k) sum += x[t][k] * L::Scalar(wr, k);
        out[t * out_stride + s * run + j] = sum;
      }
    }
  }
}

// Four runs up to six activation rows, three (S·T + S + 1 registers) for seven and eight.
template <typename L, int T>
void DotRowsStreamedAvx512(const float* const* x, const std::byte* w, size_t row_bytes,
                           int64_t rows, int64_t n, float* out, int64_t out_stride) {
  constexpr int S = T <= 6 ? kBatch1Streams : 3;
  const int64_t run = rows / S;
  if (run > 0) DotRowsRunsAvx512<L, S, T>(x, w, row_bytes, run, n, out, out_stride);
  const int64_t done = run * S;
  DotRowsRunsAvx512<L, 1, T>(x, w + done * row_bytes, row_bytes, rows - done, n, out + done,
                             out_stride);
}

template <typename L>
void DotRowsStreamedDispatch(const float* const* x, int rows_x, const std::byte* w,
                             size_t row_bytes, int64_t rows, int64_t n, float* out,
                             int64_t out_stride) {
  WithRowCount(rows_x, [&](auto t) {
    DotRowsStreamedAvx512<L, decltype(t)::value>(x, w, row_bytes, rows, n, out, out_stride);
  });
}

template <typename L>
float DotScalar(const float* x, const void* w, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * L::Scalar(w, i);
  return sum;
}

__attribute__((target("avx2,f16c"))) void F16ToF32Avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

__attribute__((target("avx2"))) void Bf16ToF32Avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i v = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(v));
  }
  for (; i < n; ++i) dst[i] = Bf16ToF32(src[i]);
}

__attribute__((target("avx2"))) void I8ToF32Avx2(const int8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)))));
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// F16C from CPUID leaf 1 (clang before 15 knows no "f16c" for __builtin_cpu_supports).
bool HaveF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

const bool kHaveAvx2 =
    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HaveF16c();
// Off when TANDEM_DISABLE_AVX512 is set (to compare the two paths on one machine).
const bool kHaveAvx512 =
    __builtin_cpu_supports("avx512f") && std::getenv("TANDEM_DISABLE_AVX512") == nullptr;

}  // namespace

bool IsIntelCpu() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = {};
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
  }
  return std::strcmp(vendor, "GenuineIntel") == 0;
}

PrefetchPlan ComputePrefetch() {
  const bool intel = IsIntelCpu();
  PrefetchPlan p{intel ? 2048 : 8192, intel, false, ""};
  if (const char* e = std::getenv("TANDEM_CPU_PREFETCH_BYTES")) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(e, &end, 10);
    if (end != e && *end == '\0' && errno == 0 && v >= 0 && v <= 65536) {
      p.bytes = v;
      p.overridden = true;
    } else {
      p.error = std::string("TANDEM_CPU_PREFETCH_BYTES=") + e + ": want bytes from 0 to 65536";
    }
  }
  if (const char* e = std::getenv("TANDEM_CPU_PREFETCH_BATCH1")) {
    if (std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0) {
      p.batch1 = e[0] == '1';
      p.overridden = true;
    } else if (p.error.empty()) {
      p.error = std::string("TANDEM_CPU_PREFETCH_BATCH1=") + e + ": want 0 or 1";
    }
  }
  return p;
}

bool HaveAvx2() { return kHaveAvx2; }
bool HaveAvx512() { return kHaveAvx512; }

namespace {

template <int T>
void DotRowsDispatch(const float* const* x, const void* w, DType dtype, int64_t n, float* out) {
  if (kHaveAvx2) {
    switch (dtype) {
      case DType::kF32: return DotRowsAvx2<Avx2F32, T>(x, w, n, out);
      case DType::kBF16: return DotRowsAvx2<Avx2Bf16, T>(x, w, n, out);
      case DType::kF16: return DotRowsAvx2<Avx2F16, T>(x, w, n, out);
      default: break;  // weights are floating point (LlamaModel refuses others)
    }
  }
  for (int t = 0; t < T; ++t) {
    switch (dtype) {
      case DType::kF32: out[t] = DotScalar<Avx2F32>(x[t], w, n); break;
      case DType::kBF16: out[t] = DotScalar<Avx2Bf16>(x[t], w, n); break;
      case DType::kF16: out[t] = DotScalar<Avx2F16>(x[t], w, n); break;
      default: out[t] = 0.f; break;
    }
  }
}

// out[r] = x[r] · w for `rows` activation rows, each the same bits as alone (the weight row is
// loaded once per group of four rows): the AVX2 and portable path of DotTile.
void DotRows(const float* const* x, int rows, const void* w, DType dtype, int64_t n, float* out) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) DotRowsDispatch<4>(x + r, w, dtype, n, out + r);
  for (; r < rows; ++r) DotRowsDispatch<1>(x + r, w, dtype, n, out + r);
}

}  // namespace

void DotTile(const float* const* x, int rows_x, const void* w, size_t w_row_bytes, int rows_w,
             DType dtype, int64_t n, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const std::byte*>(w);
  if (kHaveAvx512 && rows_x >= 1 && rows_x <= 8) {
    switch (dtype) {
      case DType::kF32:
        return DotTileDispatch<Avx512F32>(x, rows_x, wb, w_row_bytes, rows_w, n, out, out_stride);
      case DType::kBF16:
        return DotTileDispatch<Avx512Bf16>(x, rows_x, wb, w_row_bytes, rows_w, n, out, out_stride);
      case DType::kF16:
        return DotTileDispatch<Avx512F16>(x, rows_x, wb, w_row_bytes, rows_w, n, out, out_stride);
      default: break;
    }
  }
  float res[8];
  for (int r = 0; r < rows_w; ++r) {
    for (int t0 = 0; t0 < rows_x; t0 += 8) {
      const int count = std::min(8, rows_x - t0);
      DotRows(x + t0, count, wb + r * w_row_bytes, dtype, n, res);
      for (int t = 0; t < count; ++t) out[(t0 + t) * out_stride + r] = res[t];
    }
  }
}

void DotRowsStreamed(const float* const* x, int rows_x, const void* w, size_t w_row_bytes,
                     int64_t rows, DType dtype, int64_t n, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const std::byte*>(w);
  if (kHaveAvx512 && rows_x >= 1 && rows_x <= kStreamedMaxRows) {
    switch (dtype) {
      case DType::kF32:
        return DotRowsStreamedDispatch<Avx512F32>(x, rows_x, wb, w_row_bytes, rows, n, out,
                                                  out_stride);
      case DType::kBF16:
        return DotRowsStreamedDispatch<Avx512Bf16>(x, rows_x, wb, w_row_bytes, rows, n, out,
                                                   out_stride);
      case DType::kF16:
        return DotRowsStreamedDispatch<Avx512F16>(x, rows_x, wb, w_row_bytes, rows, n, out,
                                                  out_stride);
      default: break;
    }
  }
  // Each row's dot products as the tiles compute them (DotTile takes any number of weight rows).
  for (int t0 = 0; t0 < rows_x; t0 += 8) {
    DotTile(x + t0, std::min(8, rows_x - t0), wb, w_row_bytes, static_cast<int>(rows), dtype, n,
            out + t0 * out_stride, out_stride);
  }
}

namespace {

__attribute__((target("avx512f"))) void SiluMulAvx512(const float* gate, const float* up, int64_t n,
                                                      float* out) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = ExpAvx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));  // exp(-|g|)
    const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_mul_ps(g, negative, g, e);
    const __m512 silu = _mm512_div_ps(num, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

// Eight elements of SiluMulAvx2.
__attribute__((target("avx2,fma"))) inline void SiluMulAvx2Eight(const float* gate, const float* up,
                                                                 float* out) {
  const __m256 g = _mm256_loadu_ps(gate);
  const __m256 e = ExpAvx2(_mm256_or_ps(g, _mm256_set1_ps(-0.f)));  // exp(-|g|)
  const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 num = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), negative);
  const __m256 silu = _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.f), e));
  _mm256_storeu_ps(out, _mm256_mul_ps(silu, _mm256_loadu_ps(up)));
}

__attribute__((target("avx2,fma"))) void SiluMulAvx2(const float* gate, const float* up, int64_t n,
                                                     float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) SiluMulAvx2Eight(gate + i, up + i, out + i);
  if (i < n) {  // the tail through padded buffers: the same operations as a whole vector
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    for (int64_t k = i; k < n; ++k) {
      g[k - i] = gate[k];
      u[k - i] = up[k];
    }
    SiluMulAvx2Eight(g, u, o);
    for (int64_t k = i; k < n; ++k) out[k] = o[k - i];
  }
}

}  // namespace

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  if (kHaveAvx512) return SiluMulAvx512(gate, up, n, out);
  if (kHaveAvx2) return SiluMulAvx2(gate, up, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void ToF32(const void* src, DType dtype, float* dst, int64_t n) {
  if (kHaveAvx2 && dtype == DType::kBF16) {
    Bf16ToF32Avx2(static_cast<const uint16_t*>(src), dst, n);
  } else if (kHaveAvx2 && dtype == DType::kF16) {
    F16ToF32Avx2(static_cast<const uint16_t*>(src), dst, n);
  } else if (kHaveAvx2 && dtype == DType::kI8) {
    I8ToF32Avx2(static_cast<const int8_t*>(src), dst, n);
  } else {
    ConvertToF32(dtype, src, dst, static_cast<size_t>(n));
  }
}

}  // namespace tandem::cpu
