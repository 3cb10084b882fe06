#include "common/backend/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/backend/cpu/cpu_kernels.h"
#include "common/backend/cpu/simd.h"

// GCC 12's AVX-512 extract intrinsics start from an "undefined" vector it then calls uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace tandem::cpu {
namespace {

// Head vectors are padded with zeros to a multiple of this (the widest vector), so every path runs
// whole vectors and the padding adds exact zeros.
constexpr int64_t kPad = 16;
// Positions per converted chunk of keys or values.
constexpr int64_t kChunk = 16;
// At most this many scores are held per pass over an item's keys (rows beyond it take more passes).
constexpr int64_t kMaxScores = int64_t{1} << 20;

// The two inner loops, per instruction set. Each computes one row's results with operations that
// depend only on that row's data (not on how many rows or positions a call covers).
//   Scores: out[p] = q · keys[p] for p < count; q and keys[p] hold hdp floats (hdp % kPad == 0).
//   Accumulate: acc += sum over p < count, in order, of w[p] · values[p].
//   Softmax: x[p] = exp(x[p] - max x) for p < len; returns their sum (in double, lane by lane).
struct Kernels {
  void (*scores)(const float* q, const float* keys, int64_t count, int64_t hdp, float* out);
  void (*accumulate)(float* acc, const float* w, const float* values, int64_t count, int64_t hdp);
  double (*softmax)(float* x, int64_t len);
};

__attribute__((target("avx512f"))) void ScoresAvx512(const float* q, const float* keys,
                                                     int64_t count, int64_t hdp, float* out) {
  int64_t p = 0;
  // Four keys at once: independent accumulators hide the FMA latency; each key's sum is the same.
  for (; p + 4 <= count; p += 4) {
    const float* k0 = keys + p * hdp;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < hdp; i += 16) {
      const __m512 qv = _mm512_loadu_ps(q + i);
      a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + i), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + hdp + i), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 2 * hdp + i), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + 3 * hdp + i), a3);
    }
    out[p] = ReduceAddAvx512(a0);
    out[p + 1] = ReduceAddAvx512(a1);
    out[p + 2] = ReduceAddAvx512(a2);
    out[p + 3] = ReduceAddAvx512(a3);
  }
  for (; p < count; ++p) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = 0; i < hdp; i += 16)
      a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(keys + p * hdp + i), a);
    out[p] = ReduceAddAvx512(a);
  }
}

__attribute__((target("avx512f"))) void AccumulateAvx512(float* acc, const float* w,
                                                         const float* values, int64_t count,
                                                         int64_t hdp) {
  int64_t i = 0;
  // 64 columns at a time stay in registers across the positions.
  for (; i + 64 <= hdp; i += 64) {
    __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + 16),
           a2 = _mm512_loadu_ps(acc + i + 32), a3 = _mm512_loadu_ps(acc + i + 48);
    for (int64_t p = 0; p < count; ++p) {
      const __m512 wv = _mm512_set1_ps(w[p]);
      const float* v = values + p * hdp + i;
      a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v), a0);
      a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 16), a1);
      a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 32), a2);
      a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v + 48), a3);
    }
    _mm512_storeu_ps(acc + i, a0);
    _mm512_storeu_ps(acc + i + 16, a1);
    _mm512_storeu_ps(acc + i + 32, a2);
    _mm512_storeu_ps(acc + i + 48, a3);
  }
  for (; i < hdp; i += 16) {
    __m512 a = _mm512_loadu_ps(acc + i);
    for (int64_t p = 0; p < count; ++p)
      a = _mm512_fmadd_ps(_mm512_set1_ps(w[p]), _mm512_loadu_ps(values + p * hdp + i), a);
    _mm512_storeu_ps(acc + i, a);
  }
}

__attribute__((target("avx2,fma"))) float ReduceAvx2(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void ScoresAvx2(const float* q, const float* keys,
                                                    int64_t count, int64_t hdp, float* out) {
  int64_t p = 0;
  for (; p + 4 <= count; p += 4) {
    const float* k0 = keys + p * hdp;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < hdp; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hdp + i), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hdp + i), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hdp + i), a3);
    }
    out[p] = ReduceAvx2(a0);
    out[p + 1] = ReduceAvx2(a1);
    out[p + 2] = ReduceAvx2(a2);
    out[p + 3] = ReduceAvx2(a3);
  }
  for (; p < count; ++p) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < hdp; i += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(keys + p * hdp + i), a);
    out[p] = ReduceAvx2(a);
  }
}

__attribute__((target("avx2,fma"))) void AccumulateAvx2(float* acc, const float* w,
                                                        const float* values, int64_t count,
                                                        int64_t hdp) {
  for (int64_t i = 0; i < hdp; i += 16) {
    __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8);
    for (int64_t p = 0; p < count; ++p) {
      const __m256 wv = _mm256_set1_ps(w[p]);
      a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(values + p * hdp + i), a0);
      a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(values + p * hdp + i + 8), a1);
    }
    _mm256_storeu_ps(acc + i, a0);
    _mm256_storeu_ps(acc + i + 8, a1);
  }
}

__attribute__((target("avx512f"))) double SoftmaxAvx512(float* x, int64_t len) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 m = len - p >= 16 ? 0xffff : static_cast<__mmask16>((1u << (len - p)) - 1);
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + p));
  }
  const __m512 max_v = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 m = len - p >= 16 ? 0xffff : static_cast<__mmask16>((1u << (len - p)) - 1);
    const __m512 e =
        _mm512_maskz_mov_ps(m, ExpAvx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + p), max_v)));
    _mm512_mask_storeu_ps(x + p, m, e);
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    hi = _mm512_add_pd(
        hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  alignas(64) double lanes[16];
  _mm512_store_pd(lanes, lo);
  _mm512_store_pd(lanes + 8, hi);
  double sum = 0;
  for (double d : lanes) sum += d;
  return sum;
}

// AVX2: whole vectors of 8, the tail through a buffer padded with -inf (whose exps are not summed).
__attribute__((target("avx2,fma"))) double SoftmaxAvx2(float* x, int64_t len) {
  const int64_t whole = len / 8 * 8;
  alignas(32) float tail[8];
  for (int i = 0; i < 8; ++i) tail[i] = whole + i < len ? x[whole + i] : -INFINITY;
  __m256 mx = _mm256_load_ps(tail);
  for (int64_t p = 0; p < whole; p += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + p));
  alignas(32) float m8[8];
  _mm256_store_ps(m8, mx);
  const __m256 max_v = _mm256_set1_ps(*std::max_element(m8, m8 + 8));
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (int64_t p = 0; p < whole; p += 8) {
    const __m256 e = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(x + p), max_v));
    _mm256_storeu_ps(x + p, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[8];
  _mm256_store_pd(lanes, lo);
  _mm256_store_pd(lanes + 4, hi);
  _mm256_store_ps(tail, ExpAvx2(_mm256_sub_ps(_mm256_load_ps(tail), max_v)));
  for (int64_t i = 0; whole + i < len; ++i) {
    x[whole + i] = tail[i];
    lanes[i] += tail[i];
  }
  double sum = 0;
  for (double d : lanes) sum += d;
  return sum;
}

double SoftmaxPortable(float* x, int64_t len) {
  float max_score = -INFINITY;
  for (int64_t p = 0; p < len; ++p) max_score = std::max(max_score, x[p]);
  double sum = 0;
  for (int64_t p = 0; p < len; ++p) sum += x[p] = std::exp(x[p] - max_score);
  return sum;
}

void ScoresPortable(const float* q, const float* keys, int64_t count, int64_t hdp, float* out) {
  for (int64_t p = 0; p < count; ++p) {
    float s = 0.f;
    for (int64_t i = 0; i < hdp; ++i) s += q[i] * keys[p * hdp + i];
    out[p] = s;
  }
}

void AccumulatePortable(float* acc, const float* w, const float* values, int64_t count,
                        int64_t hdp) {
  for (int64_t p = 0; p < count; ++p) {
    for (int64_t i = 0; i < hdp; ++i) acc[i] += w[p] * values[p * hdp + i];
  }
}

Kernels Select() {
  if (HaveAvx512()) return {ScoresAvx512, AccumulateAvx512, SoftmaxAvx512};
  if (HaveAvx2()) return {ScoresAvx2, AccumulateAvx2, SoftmaxAvx2};
  return {ScoresPortable, AccumulatePortable, SoftmaxPortable};
}

// Per-thread buffers, grown as needed.
struct Scratch {
  std::vector<float> q;       // [rows][hdp]
  std::vector<float> chunk;   // [kChunk][hdp]: keys or values of kChunk positions as f32
  std::vector<float> scores;  // [rows][context]
  std::vector<float> acc;     // [rows][hdp]
  std::vector<int64_t> lens;  // [rows]
  std::vector<float> inv;     // [rows]: 1 / the softmax denominator
};

struct Item {
  int32_t seq, t0, t1, kv_head;
};

class ItemRunner {
 public:
  ItemRunner(const float* q, const std::byte* kc, const std::byte* vc, const KvCacheGeometry& g,
             const AttentionMetadata& md, int64_t num_q_heads, float scale, float* out)
      : q_(q),
        kc_(kc),
        vc_(vc),
        g_(g),
        md_(md),
        num_q_heads_(num_q_heads),
        group_(num_q_heads / g.num_kv_heads),
        hd_(g.head_dim),
        hdp_((g.head_dim + kPad - 1) / kPad * kPad),
        scale_(scale),
        out_(out),
        kernels_(Select()) {}

  void Run(const Item& item, Scratch& s) const {
    const int64_t tokens = item.t1 - item.t0, rows = tokens * group_;
    const int64_t ctx = md_.context_lens[item.seq];
    int64_t longest = 0;
    s.lens.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = item.t0 + r / group_;
      s.lens[r] = std::min<int64_t>(md_.positions[t] + 1, ctx);
      longest = std::max(longest, s.lens[r]);
    }
    if (longest <= 0) {
      for (int64_t r = 0; r < rows; ++r) std::fill_n(OutRow(item, r), hd_, 0.f);
      return;
    }
    const int64_t per_pass = std::max<int64_t>(1, kMaxScores / longest);
    for (int64_t r0 = 0; r0 < rows; r0 += per_pass)
      RunRows(item, r0, std::min(rows, r0 + per_pass), s);
  }

 private:
  float* OutRow(const Item& item, int64_t r) const {
    const int64_t t = item.t0 + r / group_, h = item.kv_head * group_ + r % group_;
    return out_ + (t * num_q_heads_ + h) * hd_;
  }

  // Converts positions [p0, p0 + count) of the sequence's keys or values (head kv_head) into
  // s.chunk, and their int8 scales (else 1) into scales.
  void LoadChunk(const std::byte* layer, const Item& item, int64_t p0, int64_t count, Scratch& s,
                 float* scales) const {
    const int32_t* table = md_.block_indices + md_.block_indptr[item.seq];
    const int64_t bs = g_.block_size;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t p = p0 + j, slot = table[p / bs] * bs + p % bs;
      ToF32(layer + g_.slot_offset(slot) + item.kv_head * hd_ * g_.bytes_per_element(), g_.dtype,
            s.chunk.data() + j * hdp_, hd_);
      scales[j] = g_.dtype == DType::kI8
                      ? reinterpret_cast<const float*>(layer + g_.scale_offset(slot))[item.kv_head]
                      : 1.f;
    }
  }

  void RunRows(const Item& item, int64_t r0, int64_t r1, Scratch& s) const {
    const int64_t rows = r1 - r0;
    int64_t longest = 0;
    for (int64_t r = r0; r < r1; ++r) longest = std::max(longest, s.lens[r]);
    s.q.assign(static_cast<size_t>(rows * hdp_), 0.f);
    s.chunk.assign(static_cast<size_t>(kChunk * hdp_), 0.f);  // the padding stays zero
    s.scores.resize(static_cast<size_t>(rows * longest));
    s.acc.assign(static_cast<size_t>(rows * hdp_), 0.f);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = item.t0 + r / group_, h = item.kv_head * group_ + r % group_;
      std::memcpy(&s.q[(r - r0) * hdp_], q_ + (t * num_q_heads_ + h) * hd_, hd_ * sizeof(float));
    }
    float scales[kChunk];
    // 1. Scores: (q · k) · k_scale · scale.
    for (int64_t p0 = 0; p0 < longest; p0 += kChunk) {
      const int64_t count = std::min(kChunk, longest - p0);
      LoadChunk(kc_, item, p0, count, s, scales);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = std::min(count, s.lens[r] - p0);
        if (n <= 0) continue;
        float* sc = &s.scores[(r - r0) * longest + p0];
        kernels_.scores(&s.q[(r - r0) * hdp_], s.chunk.data(), n, hdp_, sc);
        for (int64_t j = 0; j < n; ++j) sc[j] = sc[j] * scales[j] * scale_;
      }
    }
    // 2. Softmax weights (unnormalised) and their sums.
    std::vector<float>& inv = s.inv;
    inv.resize(static_cast<size_t>(rows));
    for (int64_t r = r0; r < r1; ++r) {
      const double denom = kernels_.softmax(&s.scores[(r - r0) * longest], s.lens[r]);
      inv[r - r0] = static_cast<float>(1.0 / denom);
    }
    // 3. Values, weighted, in position order.
    float w[kChunk];
    for (int64_t p0 = 0; p0 < longest; p0 += kChunk) {
      const int64_t count = std::min(kChunk, longest - p0);
      LoadChunk(vc_, item, p0, count, s, scales);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = std::min(count, s.lens[r] - p0);
        if (n <= 0) continue;
        const float* sc = &s.scores[(r - r0) * longest + p0];
        for (int64_t j = 0; j < n; ++j) w[j] = sc[j] * scales[j];
        kernels_.accumulate(&s.acc[(r - r0) * hdp_], w, s.chunk.data(), n, hdp_);
      }
    }
    for (int64_t r = r0; r < r1; ++r) {
      float* o = OutRow(item, r);
      const float* a = &s.acc[(r - r0) * hdp_];
      for (int64_t i = 0; i < hd_; ++i) o[i] = a[i] * inv[r - r0];
    }
  }

  const float* q_;
  const std::byte* kc_;
  const std::byte* vc_;
  const KvCacheGeometry& g_;
  const AttentionMetadata& md_;
  int64_t num_q_heads_, group_, hd_, hdp_;
  float scale_;
  float* out_;
  Kernels kernels_;
};

// Writes token keys or values into their slots, rounded to the cache's dtype (int8: one scale per
// head, max|x| / 127, codes rounded to nearest even).
void Store(const KvCacheGeometry& g, std::byte* layer, int64_t slot, const float* src) {
  const int64_t hd = g.head_dim, kvh = g.num_kv_heads, token_stride = kvh * hd;
  std::byte* dst = layer + g.slot_offset(slot);
  if (g.dtype == DType::kF32) {
    std::memcpy(dst, src, token_stride * sizeof(float));
  } else if (g.dtype == DType::kI8) {
    auto* codes = reinterpret_cast<int8_t*>(dst);
    auto* scales = reinterpret_cast<float*>(layer + g.scale_offset(slot));
    for (int64_t h = 0; h < kvh; ++h) {
      const float* x = src + h * hd;
      float amax = 0.f;
      for (int64_t i = 0; i < hd; ++i) amax = std::max(amax, std::abs(x[i]));
      const float s = amax > 0 && std::isfinite(amax) ? amax / 127.f : 1.f;
      scales[h] = s;
      for (int64_t i = 0; i < hd; ++i) {
        codes[h * hd + i] =
            static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / s), -127.f, 127.f));
      }
    }
  } else {
    auto* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < token_stride; ++i)
      d[i] = g.dtype == DType::kBF16 ? F32ToBf16(src[i]) : F32ToF16(src[i]);
  }
}

}  // namespace

void PagedAttention(ThreadPool& pool, const float* q, const float* k, const float* v, void* k_cache,
                    void* v_cache, const KvCacheGeometry& g, int64_t layer,
                    const AttentionMetadata& md, int64_t num_q_heads, float scale, float* out) {
  const int64_t token_stride = g.num_kv_heads * g.head_dim;
  std::byte* kc = static_cast<std::byte*>(k_cache) + layer * g.bytes_per_layer();
  std::byte* vc = static_cast<std::byte*>(v_cache) + layer * g.bytes_per_layer();
  // 1. The new keys and values into their slots.
  for (int64_t t = 0; t < md.num_tokens; ++t) {
    const int64_t slot = md.slot_mapping[t];
    if (slot < 0) continue;  // a padding token: nothing to keep
    Store(g, kc, slot, k + t * token_stride);
    Store(g, vc, slot, v + t * token_stride);
  }
  // 2. Items: (sequence, tile of its tokens, KV head).
  std::vector<Item> items;
  for (int64_t s = 0; s < md.num_seqs; ++s) {
    for (int32_t t0 = md.seq_indptr[s]; t0 < md.seq_indptr[s + 1];
         t0 += static_cast<int32_t>(kQueryTile)) {
      const int32_t t1 = std::min<int32_t>(md.seq_indptr[s + 1], t0 + kQueryTile);
      for (int32_t kh = 0; kh < g.num_kv_heads; ++kh)
        items.push_back({static_cast<int32_t>(s), t0, t1, kh});
    }
  }
  const ItemRunner runner(q, kc, vc, g, md, num_q_heads, scale, out);
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    thread_local Scratch scratch;
    for (int64_t i = b; i < e; ++i) runner.Run(items[i], scratch);
  });
}

}  // namespace tandem::cpu
