#include "common/backend/cpu/cpu_kernels.h"

#include <immintrin.h>

#include <cstdlib>

namespace tandem::cpu {
namespace {

__attribute__((target("avx2,fma,f16c"))) float DotBf16Avx2(const float* x, const uint16_t* w,
                                                           int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i w0 = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i))), 16);
    __m256i w1 = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8))), 16);
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_castsi256_ps(w0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_castsi256_ps(w1), acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float sum = _mm_cvtss_f32(s);
  for (; i < n; ++i) sum += x[i] * Bf16ToF32(w[i]);
  return sum;
}

__attribute__((target("avx2,fma,f16c"))) float DotF16Avx2(const float* x, const uint16_t* w,
                                                          int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8)));
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), w0, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), w1, acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float sum = _mm_cvtss_f32(s);
  for (; i < n; ++i) sum += x[i] * F16ToF32(w[i]);
  return sum;
}

__attribute__((target("avx2,fma"))) float DotF32Avx2(const float* x, const float* w, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float sum = _mm_cvtss_f32(s);
  for (; i < n; ++i) sum += x[i] * w[i];
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

// AVX-512 variants: twice the width, so the per-element conversion cost halves (decode at batch 1
// reads every weight once and is limited by how fast it can convert and accumulate them).
__attribute__((target("avx512f"))) float DotBf16Avx512(const float* x, const uint16_t* w,
                                                       int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i w0 = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i))), 16);
    __m512i w1 = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16))), 16);
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_castsi512_ps(w0), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_castsi512_ps(w1), acc1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += x[i] * Bf16ToF32(w[i]);
  return sum;
}

__attribute__((target("avx512f"))) float DotF16Avx512(const float* x, const uint16_t* w,
                                                      int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
    __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16)));
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), w0, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), w1, acc1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += x[i] * F16ToF32(w[i]);
  return sum;
}

__attribute__((target("avx512f"))) float DotF32Avx512(const float* x, const float* w, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), acc1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += x[i] * w[i];
  return sum;
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c");
// Off when TANDEM_DISABLE_AVX512 is set (to compare the two paths on one machine).
const bool kHaveAvx512 = __builtin_cpu_supports("avx512f") && std::getenv("TANDEM_DISABLE_AVX512") == nullptr;

}  // namespace

bool HaveAvx2() { return kHaveAvx2; }
bool HaveAvx512() { return kHaveAvx512; }

float Dot(const float* x, const void* w, DType dtype, int64_t n) {
  const auto* w16 = static_cast<const uint16_t*>(w);
  if (kHaveAvx512) {
    switch (dtype) {
      case DType::kF32:
        return DotF32Avx512(x, static_cast<const float*>(w), n);
      case DType::kBF16:
        return DotBf16Avx512(x, w16, n);
      case DType::kF16:
        return DotF16Avx512(x, w16, n);
    }
  }
  if (kHaveAvx2) {
    switch (dtype) {
      case DType::kF32:
        return DotF32Avx2(x, static_cast<const float*>(w), n);
      case DType::kBF16:
        return DotBf16Avx2(x, w16, n);
      case DType::kF16:
        return DotF16Avx2(x, w16, n);
    }
  }
  float sum = 0.f;
  switch (dtype) {
    case DType::kF32: {
      const auto* wf = static_cast<const float*>(w);
      for (int64_t i = 0; i < n; ++i) sum += x[i] * wf[i];
      break;
    }
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) sum += x[i] * Bf16ToF32(w16[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) sum += x[i] * F16ToF32(w16[i]);
      break;
  }
  return sum;
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
