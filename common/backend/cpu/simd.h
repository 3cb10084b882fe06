// Small SIMD helpers shared by the CPU kernels, inlined into their callers' target.
#pragma once

#include <immintrin.h>

namespace tandem::cpu {

// A fixed pairwise sum of the 16 lanes (halves, then quarters, ...): the same order for every
// caller, so results that go through it do not depend on which kernel ran them. (GCC 12 warns that
// the extract starts from an "undefined" vector; callers' files silence -Wmaybe-uninitialized.)
__attribute__((target("avx512f"), always_inline)) inline float ReduceAddAvx512(__m512 a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (the softmax's shifted scores, SiLU's exp(-|x|)): x = n·ln2 + r with |r| <=
// ln2/2, exp(r) by Cephes' expf polynomial, times 2^n. Within 2 ulp of exp; below -87 (where exp
// underflows to denormals) it returns about 1.6e-38 instead, which no softmax weight can tell from
// 0.
inline constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f,
                       kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                   4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

__attribute__((target("avx512f"), always_inline)) inline __m512 ExpAvx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 ExpAvx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[i]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^n from its exponent bits (n >= -126 after the clamp).
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace tandem::cpu
