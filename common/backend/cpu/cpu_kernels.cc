#include "common/backend/cpu/cpu_kernels.h"

#include <immintrin.h>

#include <cstdlib>

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
  __attribute__((target("avx512f"))) static __m512 Load(const void* w, int64_t i) {
    const auto* p = static_cast<const uint16_t*>(w) + i;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static float Scalar(const void* w, int64_t i) {
    return F16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
};
struct Avx512F32 {
  __attribute__((target("avx512f"))) static __m512 Load(const void* w, int64_t i) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  }
  static float Scalar(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};

template <typename L, int T>
__attribute__((target("avx2,fma,f16c"))) void DotRowsAvx2(const float* const* x, const void* w,
                                                          int64_t n, float* out) {
  __m256 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = L::Load(w, i), w1 = L::Load(w, i + 8);
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

template <typename L, int T>
__attribute__((target("avx512f"))) void DotRowsAvx512(const float* const* x, const void* w,
                                                      int64_t n, float* out) {
  __m512 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 w0 = L::Load(w, i), w1 = L::Load(w, i + 16);
    for (int t = 0; t < T; ++t) {
      acc0[t] = _mm512_fmadd_ps(_mm512_loadu_ps(x[t] + i), w0, acc0[t]);
      acc1[t] = _mm512_fmadd_ps(_mm512_loadu_ps(x[t] + i + 16), w1, acc1[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
    for (int64_t k = i; k < n; ++k) sum += x[t][k] * L::Scalar(w, k);
    out[t] = sum;
  }
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

const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c");
// Off when TANDEM_DISABLE_AVX512 is set (to compare the two paths on one machine).
const bool kHaveAvx512 =
    __builtin_cpu_supports("avx512f") && std::getenv("TANDEM_DISABLE_AVX512") == nullptr;

}  // namespace

bool HaveAvx2() { return kHaveAvx2; }
bool HaveAvx512() { return kHaveAvx512; }

namespace {

template <int T>
void DotRowsDispatch(const float* const* x, const void* w, DType dtype, int64_t n, float* out) {
  if (kHaveAvx512) {
    switch (dtype) {
      case DType::kF32: return DotRowsAvx512<Avx512F32, T>(x, w, n, out);
      case DType::kBF16: return DotRowsAvx512<Avx512Bf16, T>(x, w, n, out);
      case DType::kF16: return DotRowsAvx512<Avx512F16, T>(x, w, n, out);
    }
  }
  if (kHaveAvx2) {
    switch (dtype) {
      case DType::kF32: return DotRowsAvx2<Avx2F32, T>(x, w, n, out);
      case DType::kBF16: return DotRowsAvx2<Avx2Bf16, T>(x, w, n, out);
      case DType::kF16: return DotRowsAvx2<Avx2F16, T>(x, w, n, out);
    }
  }
  for (int t = 0; t < T; ++t) {
    switch (dtype) {
      case DType::kF32: out[t] = DotScalar<Avx2F32>(x[t], w, n); break;
      case DType::kBF16: out[t] = DotScalar<Avx2Bf16>(x[t], w, n); break;
      case DType::kF16: out[t] = DotScalar<Avx2F16>(x[t], w, n); break;
    }
  }
}

}  // namespace

float Dot(const float* x, const void* w, DType dtype, int64_t n) {
  float out;
  DotRowsDispatch<1>(&x, w, dtype, n, &out);
  return out;
}

void DotRows(const float* const* x, int rows, const void* w, DType dtype, int64_t n, float* out) {
  int r = 0;
  // AVX-512 has registers for 8 rows' accumulators; AVX2's 16 fit 4.
  if (kHaveAvx512) {
    for (; r + 8 <= rows; r += 8) DotRowsDispatch<8>(x + r, w, dtype, n, out + r);
  }
  for (; r + 4 <= rows; r += 4) DotRowsDispatch<4>(x + r, w, dtype, n, out + r);
  for (; r < rows; ++r) DotRowsDispatch<1>(x + r, w, dtype, n, out + r);
}

void ToF32(const void* src, DType dtype, float* dst, int64_t n) {
  if (kHaveAvx2 && dtype == DType::kBF16) {
    Bf16ToF32Avx2(static_cast<const uint16_t*>(src), dst, n);
  } else if (kHaveAvx2 && dtype == DType::kF16) {
    F16ToF32Avx2(static_cast<const uint16_t*>(src), dst, n);
  } else {
    ConvertToF32(dtype, src, dst, static_cast<size_t>(n));
  }
}

}  // namespace tandem::cpu
