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

}  // namespace tandem::cpu
