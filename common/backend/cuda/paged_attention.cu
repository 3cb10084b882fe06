// Attention over the paged KV cache (paged_attention.h): the cache write, the q|k|v prologue, the
// GQA split-KV kernels for decode-like steps and the launcher that picks among them and the prompt
// kernels (prefill_attention.cu, prefill_attention_tc.cu). f32 activations, accumulation in f32,
// results within rounding of the CPU backend (tests/gpu/cuda_test_util.h states the tolerances).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "common/backend/cuda/block_reduce.cuh"
#include "common/backend/cuda/kv_types.cuh"
#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/paged_attention.h"
#include "common/backend/cuda/prefill_attention.h"
#include "common/backend/cuda/qkv_prologue.cuh"
#include "common/backend/cuda/store_out.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWriteKvThreads = 256;
constexpr int kAttentionThreads = 128;  // keys per tile of the online softmax
constexpr int kMaxDimsPerThread = 4;    // head_dim ≤ kAttentionThreads * kMaxDimsPerThread

template <typename T>
__global__ void WriteKvKernel(T* kc, T* vc, const float* k, const float* v, const int32_t* slots,
                              int64_t row) {
  PdlPrologue();
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;  // a padding token: nothing to keep
  for (int64_t j = threadIdx.x; j < row; j += blockDim.x) {
    StoreKv(kc + slot * row + j, k[t * row + j]);
    StoreKv(vc + slot * row + j, v[t * row + j]);
  }
}

// An int8 cache's writes: one block per token, warp w taking rows w, w + 8, ... of its 2 ·
// num_kv_heads (K's heads, then V's). A row's scale is max|x| / 127 (1 when that is 0 or not
// finite) and its codes round(x / scale) to nearest even, clamped to ±127: the CPU's arithmetic, so
// both backends write the same bytes.
__global__ void WriteKvI8Kernel(int8_t* kc, int8_t* vc, const float* k, const float* v,
                                const int32_t* slots, int64_t num_kv_heads, int64_t head_dim,
                                int64_t block_size) {
  PdlPrologue();
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;  // a padding token: nothing to keep
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = num_kv_heads * head_dim;
  for (int64_t i = warp; i < 2 * num_kv_heads; i += blockDim.x / 32) {
    const bool is_v = i >= num_kv_heads;
    const int64_t kh = is_v ? i - num_kv_heads : i;
    const float* x = (is_v ? v : k) + t * row + kh * head_dim;
    float amax = 0.f;
    for (int64_t j = lane; j < head_dim; j += 32) amax = fmaxf(amax, fabsf(x[j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = amax > 0.f && isfinite(amax) ? __fdiv_rn(amax, 127.f) : 1.f;
    const KvRows<int8_t> rows{is_v ? vc : kc, num_kv_heads, head_dim, block_size};
    int8_t* codes = const_cast<int8_t*>(rows.Row(slot, kh));
    for (int64_t j = lane; j < head_dim; j += 32) {
      // rintf: to nearest even, as the CPU's nearbyint.
      codes[j] = static_cast<int8_t>(fminf(127.f, fmaxf(-127.f, rintf(__fdiv_rn(x[j], s)))));
    }
    if (lane == 0) *const_cast<float*>(rows.ScaleAt(slot, kh)) = s;
  }
}

constexpr int kPrologueWarps = 8;

// LaunchQkvPrologue's kernel. Grid: one block per token; warp w takes heads w, w + 8, ... of its
// row (qkv_prologue.cuh: PrologueHead).
template <typename T>
__global__ void __launch_bounds__(kPrologueWarps * 32) QkvPrologueKernel(QkvPrologueArgs a) {
  PdlPrologue();
  __shared__ float staged[kPrologueWarps][kMaxPrologueHeadDim];
  const int warp = threadIdx.x / 32;
  for (int64_t h = warp; h < a.num_q_heads + 2 * a.layer.num_kv_heads; h += kPrologueWarps) {
    PrologueHead<T>(a, blockIdx.x, h, staged[warp]);
  }
}

// Float offset of the 8-byte aligned slot array after q [head_dim] and probs [kAttentionThreads].
__host__ __device__ int64_t SlotsOffset(int64_t head_dim) {
  return (head_dim + kAttentionThreads + 1) & ~int64_t(1);
}

// Grid (num_tokens, num_q_heads), kAttentionThreads threads. Each tile: every thread scores one
// key, the block agrees on the tile's max and sum (online softmax), then each thread accumulates
// its head dimensions over the tile's values.
template <typename T>
__global__ void PagedAttentionKernel(PagedAttentionArgs a) {
  PdlPrologue();
  TANDEM_DYNAMIC_SHARED(float, smem, 16);
  float* qs = smem;                      // [head_dim]
  float* probs = qs + a.layer.head_dim;  // [kAttentionThreads]
  int64_t* slots =
      reinterpret_cast<int64_t*>(smem + SlotsOffset(a.layer.head_dim));  // [kAttentionThreads]
  __shared__ float red[32];

  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.layer.head_dim;
  int64_t lo = 0, hi = a.num_seqs - 1;  // the sequence holding token t
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.seq_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t s = lo;
  const int64_t len = min(int64_t(a.positions[t]) + 1, int64_t(a.context_lens[s]));
  const int64_t group = a.num_q_heads / a.layer.num_kv_heads, kh = h / group;
  const int32_t* table = a.block_indices + a.block_indptr[s];
  const KvRows<T> krows{static_cast<const T*>(a.layer.k_cache), a.layer.num_kv_heads, hd,
                        a.layer.block_size};
  const KvRows<T> vrows{static_cast<const T*>(a.layer.v_cache), a.layer.num_kv_heads, hd,
                        a.layer.block_size};
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x)
    qs[i] = a.q[(t * a.num_q_heads + h) * hd + i];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0.f;
  float acc[kMaxDimsPerThread] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t base = 0; base < len; base += blockDim.x) {
    const int64_t p = base + threadIdx.x;
    float score = -INFINITY;
    if (p < len) {
      const int64_t slot =
          int64_t(table[p / a.layer.block_size]) * a.layer.block_size + p % a.layer.block_size;
      slots[threadIdx.x] = slot;
      const T* kv = krows.Row(slot, kh);
      float dot = 0.f;
      for (int64_t i = 0; i < hd; ++i) dot += qs[i] * LoadKv(kv + i);
      if constexpr (kScaledKv<T>) dot *= krows.Scale(slot, kh);
      score = dot * a.scale;
    }
    const float new_max = fmaxf(running_max, BlockReduce<true>(score, red));
    const float e = p < len ? expf(score - new_max) : 0.f;
    probs[threadIdx.x] = e;
    const float tile_sum = BlockReduce<false>(e, red);  // its barriers also publish probs and slots
    const float correction = expf(running_max - new_max);  // 0 on the first tile
    running_sum = running_sum * correction + tile_sum;
    running_max = new_max;
    const int64_t tile = min(int64_t(blockDim.x), len - base);
    for (int j = 0; j < kMaxDimsPerThread; ++j) {
      const int64_t d = threadIdx.x + int64_t(j) * blockDim.x;
      if (d >= hd) break;
      float v = acc[j] * correction;
      // (Scale is the literal 1 for the unscaled types: the product folds away.)
      for (int64_t k = 0; k < tile; ++k)
        v += probs[k] * vrows.Scale(slots[k], kh) * LoadKv(vrows.Row(slots[k], kh) + d);
      acc[j] = v;
    }
    __syncthreads();  // the next tile overwrites probs and slots
  }
  const int64_t o = (t * a.num_q_heads + h) * hd;
  const float inv = len > 0 ? 1.f / running_sum : 0.f;
  for (int j = 0; j < kMaxDimsPerThread; ++j) {
    const int64_t d = threadIdx.x + int64_t(j) * blockDim.x;
    if (d < hd) StoreOut(a.out, a.rounded, o + d, acc[j] * inv);
  }
}

// ---------------------------------------------------------------- GQA split-KV attention
//
// Each block takes one token, one KV head and up to kGroup of the query heads sharing it (K and V
// rows are read once for the whole group), over fixed splits of kSplitKeys keys: split s covers
// keys [s * kSplitKeys, (s + 1) * kSplitKeys) of every token, whatever else is in the batch (where
// the splits take blocks of their own, PagedAttentionArgs::grid_split_keys may make them shorter: a
// shorter chain of loads a block, other bits). Within a split
// each of the block's warps takes every kSplitWarps-th key, lane l holding the head dimensions
// [l kDims, (l + 1) kDims) (one access a row: KvVec), with a running softmax per head; the warps'
// partials are then merged in warp order. A warp loads KeyBatch keys' rows at once before it folds
// them in, in key order (the loads overlap; the arithmetic is that of one key at a time), and
// reduces its group's dot products together (independent shuffle chains). Splits are merged in
// split order, either by the same block one after another (in-block) or, when the batch is too
// small to fill the device, by one block per split, the last of which to finish merges the others'
// partials (no separate merge kernel: one launch a layer fewer). Both merges go through MergeStep,
// whose arithmetic cannot be contracted or reordered, so a token's output is bit-identical either
// way and independent of its batch (what the batch-invariant mode and the equivalence tests need).
constexpr int kSplitKeys = 256;
constexpr int kSplitWarps = 8;
constexpr int kSplitThreads = kSplitWarps * 32;
constexpr int kSplitMaxElems = 1024;  // kGroup * head_dim per block
constexpr int kElemsPerThread = kSplitMaxElems / kSplitThreads;

__host__ __device__ constexpr int SplitGroup(int64_t head_dim) {
  return kSplitMaxElems / head_dim < 8 ? static_cast<int>(kSplitMaxElems / head_dim) : 8;
}

// Blocks a token and KV head take (each up to SplitGroup of its query heads).
int64_t SplitHeadChunks(const PagedAttentionArgs& a) {
  const int64_t group = a.num_q_heads / a.layer.num_kv_heads, kgroup = SplitGroup(a.layer.head_dim);
  return (group + kgroup - 1) / kgroup;
}

// The grid split's workspace: a 4-byte counter per (token, KV head, head chunk) at the start, in
// kSplitCounters slots whatever the launch (so no launch's partials ever land on another's
// counters, which stay zero between launches), then the partials
// [num_tokens][num_q_heads][splits][head_dim + 2]. A grid split takes at most this many blocks a
// split (kAuto: below FillBlocks, 8 a multiprocessor).
constexpr int64_t kSplitCounters = 4096;

// Keys whose K and V rows a warp has in flight at once: up to 16 raw words of each a lane (8 keys
// of a 128-wide BF16 head: 4 KB a warp), at least 2 keys.
template <typename T, int kDims>
__host__ __device__ constexpr int KeyBatch() {
  constexpr int words = KvVec<T, kDims>::kWords;
  return words >= 8 ? 2 : (16 / words < 8 ? 16 / words : 8);
}

// (M, L, O) ⊕ (m, l, o), the ordered merge of two softmax partials; an empty partial (m = -inf)
// changes nothing.
__device__ __forceinline__ void MergeStep(float& M, float& L, float& O, float m, float l, float o) {
  if (m == -INFINITY) return;
  const float nm = fmaxf(M, m);
  const float a = expf(M - nm), b = expf(m - nm);
  L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
  O = __fadd_rn(__fmul_rn(O, a), __fmul_rn(o, b));
  M = nm;
}

// The keys token t attends to (its causal prefix), and its sequence.
__device__ __forceinline__ int64_t CausalLength(const PagedAttentionArgs& a, int64_t t,
                                                int64_t* seq) {
  int64_t lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.seq_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  *seq = lo;
  return min(int64_t(a.positions[t]) + 1, int64_t(a.context_lens[lo]));
}

// Element d of one (token, query head)'s output from its `splits` partials [splits][hd + 2] (o...,
// m, l), merged in split order (read from L2: other blocks wrote them).
__device__ __forceinline__ float MergedSplits(const float* part, int64_t splits, int64_t hd,
                                              int64_t d) {
  float M = -INFINITY, L = 0.f, O = 0.f;
  for (int64_t s = 0; s < splits; ++s, part += hd + 2)
    MergeStep(M, L, O, __ldcg(part + hd), __ldcg(part + hd + 1), __ldcg(part + d));
  return L > 0.f ? __fdiv_rn(O, L) : 0.f;
}

// Grid (num_tokens, num_kv_heads * head_chunks, 1 or the batch's split count); kSplitThreads
// threads. Grid split: partials [num_tokens][num_q_heads][gridDim.z][head_dim + 2] (o..., m, l) and
// counters [num_tokens][num_kv_heads * head_chunks], zero before the launch and after it.
template <int kDims, int kGroup, typename T>
__global__ void SplitAttentionKernel(PagedAttentionArgs a, int64_t head_chunks, int64_t split_keys,
                                     float* partials, unsigned* counters) {
  PdlPrologue();
  constexpr int64_t hd = kDims * 32;
  __shared__ float sm_m[kSplitWarps * kGroup], sm_l[kSplitWarps * kGroup];
  __shared__ __align__(16) float sm_o[kSplitWarps * kGroup * hd];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x, kh = blockIdx.y / head_chunks, chunk = blockIdx.y % head_chunks;
  const int64_t group = a.num_q_heads / a.layer.num_kv_heads;
  const int64_t h0 = kh * group + chunk * kGroup;
  const int gc = static_cast<int>(min(int64_t(kGroup), group - chunk * kGroup));
  int64_t seq;
  const int64_t len = CausalLength(a, t, &seq);
  if (a.tiled_min_new_tokens > 0 &&
      a.seq_indptr[seq + 1] - a.seq_indptr[seq] >= a.tiled_min_new_tokens) {
    return;  // the tiled kernel's (the whole block alike: no barrier is left waiting)
  }
  const int64_t splits = (len + split_keys - 1) / split_keys;
  const bool grid_split = gridDim.z > 1;
  const int64_t s_begin = grid_split ? blockIdx.z : 0,
                s_end = grid_split ? min(s_begin + 1, splits) : splits;
  const int64_t bs = a.layer.block_size;
  const int32_t* table = a.block_indices + a.block_indptr[seq];
  const KvRows<T> krows{static_cast<const T*>(a.layer.k_cache), a.layer.num_kv_heads, hd, bs};
  const KvRows<T> vrows{static_cast<const T*>(a.layer.v_cache), a.layer.num_kv_heads, hd, bs};

  float q[kGroup][kDims];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int j = 0; j < kDims; ++j)
      q[g][j] = g < gc ? a.q[(t * a.num_q_heads + h0 + g) * hd + lane * kDims + j] : 0.f;
  }
  // This thread's elements (g, d) of the block's output: idx = threadIdx.x + e * kSplitThreads.
  float M[kElemsPerThread], L[kElemsPerThread], O[kElemsPerThread];
#pragma unroll
  for (int e = 0; e < kElemsPerThread; ++e) M[e] = -INFINITY, L[e] = 0.f, O[e] = 0.f;

  for (int64_t s = s_begin; s < s_end; ++s) {
    const int64_t k0 = s * split_keys, k1 = min(len, k0 + split_keys);
    float m[kGroup], l[kGroup], acc[kGroup][kDims];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.f;
#pragma unroll
      for (int j = 0; j < kDims; ++j) acc[g][j] = 0.f;
    }
    constexpr int kBatch = KeyBatch<T, kDims>();
    for (int64_t p0 = k0 + warp; p0 < k1; p0 += int64_t(kSplitWarps) * kBatch) {
      // This warp's next keys p0, p0 + kSplitWarps, ...: every row load issued before the first
      // use.
      KvVec<T, kDims> kr[kBatch], vr[kBatch];
      float ksc[kBatch], vsc[kBatch];  // int8: the rows' scales
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t p = p0 + int64_t(b) * kSplitWarps;
        if (p < k1) {
          const int64_t slot = int64_t(table[p / bs]) * bs + p % bs;
          kr[b].Load(krows.Row(slot, kh) + lane * kDims);
          vr[b].Load(vrows.Row(slot, kh) + lane * kDims);
          if constexpr (kScaledKv<T>)
            ksc[b] = krows.Scale(slot, kh), vsc[b] = vrows.Scale(slot, kh);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (p0 + int64_t(b) * kSplitWarps >= k1) break;  // the same for the whole warp
        // The group rows' dot products, their shuffle reductions interleaved. Rows past gc are
        // skipped (gc is the same for the whole block: no divergence) and never written out.
        float dot[kGroup];
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          dot[g] = 0.f;
          if (g >= gc) continue;
#pragma unroll
          for (int j = 0; j < kDims; ++j) dot[g] = fmaf(q[g][j], kr[b][j], dot[g]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
            if (g < gc) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
          }
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (g >= gc) continue;
          // Explicit roundings: one arithmetic wherever the compiler places this loop.
          const float score = __fmul_rn(kScaledKv<T> ? __fmul_rn(dot[g], ksc[b]) : dot[g], a.scale);
          const float nm = fmaxf(m[g], score);
          const float c = expf(m[g] - nm), e = expf(score - nm);
          const float ve = kScaledKv<T> ? __fmul_rn(e, vsc[b]) : e;  // the value elements' weight
          l[g] = __fmaf_rn(l[g], c, e);
#pragma unroll
          for (int j = 0; j < kDims; ++j)
            acc[g][j] = __fmaf_rn(acc[g][j], c, __fmul_rn(ve, vr[b][j]));
          m[g] = nm;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (g >= gc) break;
      if (lane == 0) {
        sm_m[warp * kGroup + g] = m[g];
        sm_l[warp * kGroup + g] = l[g];
      }
      // A lane's adjacent dimensions in 16-byte stores where they fill them (no bank conflicts).
      float* so = sm_o + (warp * kGroup + g) * hd + lane * kDims;
      if constexpr (kDims % 4 == 0) {
#pragma unroll
        for (int j = 0; j < kDims; j += 4) {
          *reinterpret_cast<float4*>(so + j) =
              make_float4(acc[g][j], acc[g][j + 1], acc[g][j + 2], acc[g][j + 3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kDims; ++j) so[j] = acc[g][j];
      }
    }
    __syncthreads();
    // The split's partial per element, merged over the warps in order, then into the running state
    // (in-block) or out to `partials` (grid split).
#pragma unroll
    for (int e = 0; e < kElemsPerThread; ++e) {
      const int64_t idx = threadIdx.x + int64_t(e) * kSplitThreads;
      if (idx >= gc * hd) break;
      const int64_t g = idx / hd, d = idx % hd;
      float sm = -INFINITY, sl = 0.f, so = 0.f;
      for (int w = 0; w < kSplitWarps; ++w) {
        MergeStep(sm, sl, so, sm_m[w * kGroup + g], sm_l[w * kGroup + g],
                  sm_o[(w * kGroup + g) * hd + d]);
      }
      if (grid_split) {
        float* part = partials + ((t * a.num_q_heads + h0 + g) * gridDim.z + s) * (hd + 2);
        part[d] = so;
        if (d == 0) {
          part[hd] = sm;
          part[hd + 1] = sl;
        }
      } else {
        MergeStep(M[e], L[e], O[e], sm, sl, so);
      }
    }
    __syncthreads();  // the next split overwrites sm_*
  }
  if (grid_split) {
    if (s_begin >= splits) {  // past this token's keys: an empty partial
#pragma unroll
      for (int e = 0; e < kElemsPerThread; ++e) {
        const int64_t idx = threadIdx.x + int64_t(e) * kSplitThreads;
        if (idx >= gc * hd) break;
        const int64_t g = idx / hd, d = idx % hd;
        float* part = partials + ((t * a.num_q_heads + h0 + g) * gridDim.z + s_begin) * (hd + 2);
        part[d] = 0.f;
        if (d == 0) {
          part[hd] = -INFINITY;
          part[hd + 1] = 0.f;
        }
      }
    }
    // The last of this token and head chunk's gridDim.z blocks to finish merges their partials (in
    // split order, whichever block it is).
    if (!LastBlockToArrive(counters + blockIdx.x * gridDim.y + blockIdx.y, gridDim.z)) return;
  }
#pragma unroll
  for (int e = 0; e < kElemsPerThread; ++e) {
    const int64_t idx = threadIdx.x + int64_t(e) * kSplitThreads;
    if (idx >= gc * hd) break;
    const int64_t g = idx / hd, d = idx % hd;
    const float o =
        grid_split ? MergedSplits(partials + (t * a.num_q_heads + h0 + g) * gridDim.z * (hd + 2),
                                  gridDim.z, hd, d)
                   : (L[e] > 0.f ? __fdiv_rn(O[e], L[e]) : 0.f);
    StoreOut(a.out, a.rounded, (t * a.num_q_heads + h0 + g) * hd + d, o);
  }
}

template <int kDims, typename T>
cudaError_t LaunchSplitAttention(const PagedAttentionArgs& a, int64_t grid_splits,
                                 int64_t split_keys, cudaStream_t stream) {
  constexpr int kGroup = SplitGroup(kDims * 32);
  const int64_t chunks = SplitHeadChunks(a);
  const dim3 grid(static_cast<unsigned>(a.num_tokens),
                  static_cast<unsigned>(a.layer.num_kv_heads * chunks),
                  static_cast<unsigned>(grid_splits));
  unsigned* counters = grid_splits > 1 ? reinterpret_cast<unsigned*>(a.workspace) : nullptr;
  float* partials = grid_splits > 1 ? a.workspace + kSplitCounters : nullptr;
  LaunchKernel(SplitAttentionKernel<kDims, kGroup, T>, grid, kSplitThreads, 0, stream, a, chunks,
               split_keys, partials, counters);
  return cudaGetLastError();
}

// LaunchSplitAttention for the launch's head_dim (SplitCapable).
template <typename T>
cudaError_t LaunchSplitAttentionForHeadDim(const PagedAttentionArgs& a, int64_t grid_splits,
                                           int64_t split_keys, cudaStream_t stream) {
  switch (a.layer.head_dim) {
    case 32: return LaunchSplitAttention<1, T>(a, grid_splits, split_keys, stream);
    case 64: return LaunchSplitAttention<2, T>(a, grid_splits, split_keys, stream);
    case 128: return LaunchSplitAttention<4, T>(a, grid_splits, split_keys, stream);
    default: return LaunchSplitAttention<8, T>(a, grid_splits, split_keys, stream);
  }
}

// Fewer blocks than this and the splits get blocks of their own: eight a multiprocessor. The split
// kernel fits one or two of its 8-warp blocks on a multiprocessor, each walking its keys in a chain
// of dependent loads, so a few waves of them leave the device latency-bound (a batch of 64 on an
// 8-KV-head model is 512 blocks); the merge of the partials costs far less.
int64_t FillBlocks() {
  static const int64_t blocks = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      sms = 132;
    }
    return int64_t(8) * sms;
  }();
  return blocks;
}

bool SplitCapable(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}
// And its lanes' row loads aligned: an int8 block is block_size · kv_heads · (head_dim + 4) bytes,
// which the 8-byte loads of head_dim 256 need even.
bool SplitCapable(const PagedLayer& l) {
  return SplitCapable(l.head_dim) &&
         (l.dtype != DType::kI8 || l.head_dim != 256 || (l.block_size * l.num_kv_heads) % 2 == 0);
}

int64_t SplitCount(int64_t max_context_len, int64_t keys = kSplitKeys) {
  return std::max<int64_t>(1, (max_context_len + keys - 1) / keys);
}

// Keys of a grid split's splits (PagedAttentionArgs::grid_split_keys): the asked power of two,
// doubled while the longest context would take more than kMaxGridSplits splits, never past
// kSplitKeys.
int64_t GridSplitKeys(const PagedAttentionArgs& a) {
  int64_t keys = a.grid_split_keys > 0 ? a.grid_split_keys : kSplitKeys;
  while (keys < kSplitKeys && SplitCount(a.max_context_len, keys) > kMaxGridSplits) keys *= 2;
  return keys;
}

bool GridSplitKeysValid(int64_t keys) {
  return keys == 0 || keys == 32 || keys == 64 || keys == 128 || keys == kSplitKeys;
}

// Whether kAuto takes the tiled prompt kernel for this launch.
bool TakesTiled(const PagedAttentionArgs& a) {
  return a.mode == AttentionMode::kAuto && a.allow_tiled && TiledPrefillCapable(a) &&
         TiledPrefillPays(a);
}

}  // namespace

cudaError_t LaunchQkvPrologue(const QkvPrologueArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.layer.head_dim <= 0 || a.layer.head_dim % 2 != 0 ||
      a.layer.head_dim > kMaxPrologueHeadDim || a.num_tokens > 0x7fffffff || a.num_q_heads <= 0 ||
      a.layer.num_kv_heads <= 0) {
    return cudaErrorInvalidValue;
  }
  return WithKvType(a.layer.dtype, [&](auto* type) -> cudaError_t {
    using T = std::remove_pointer_t<decltype(type)>;
    if constexpr (kScaledKv<T>) {
      return cudaErrorInvalidValue;  // an int8 row's scale needs the whole row: WriteKvI8Kernel
    } else {
      LaunchKernel(QkvPrologueKernel<T>, static_cast<unsigned>(a.num_tokens), kPrologueWarps * 32,
                   0, stream, a);
      return cudaGetLastError();
    }
  });
}

int64_t SplitAttentionWorkspaceFloats(const PagedAttentionArgs& a) {
  if (!SplitCapable(a.layer) || a.mode == AttentionMode::kInBlock ||
      a.mode == AttentionMode::kLegacy || a.mode == AttentionMode::kTiled ||
      a.mode == AttentionMode::kTensorCore || a.num_q_heads <= 0 || a.layer.num_kv_heads <= 0 ||
      TakesTiled(a)) {
    return 0;
  }
  const int64_t splits = SplitCount(a.max_context_len, GridSplitKeys(a));
  if (!GridSplitKeysValid(a.grid_split_keys) || splits <= 1 || splits > 65535) return 0;
  const int64_t blocks = a.num_tokens * a.layer.num_kv_heads * SplitHeadChunks(a);
  if ((a.mode == AttentionMode::kAuto && blocks >= FillBlocks()) || blocks > kSplitCounters)
    return 0;
  static_assert(sizeof(unsigned) == sizeof(float), "a counter takes a float's place");
  return kSplitCounters + a.num_tokens * a.num_q_heads * splits * (a.layer.head_dim + 2);
}

cudaError_t LaunchPagedAttention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.layer.head_dim > kAttentionThreads * kMaxDimsPerThread || a.num_tokens > 0x7fffffff ||
      a.num_q_heads <= 0 || a.num_q_heads > 65535 || a.layer.num_kv_heads <= 0 ||
      a.num_q_heads % a.layer.num_kv_heads != 0 || !GridSplitKeysValid(a.grid_split_keys)) {
    return cudaErrorInvalidValue;
  }
  const int64_t ws = SplitAttentionWorkspaceFloats(a);
  const int64_t grid_keys = GridSplitKeys(a);
  const bool grid_split = ws > 0 && a.workspace != nullptr && a.workspace_floats >= ws;
  if (a.mode == AttentionMode::kGridSplit && !grid_split &&
      SplitCount(a.max_context_len, grid_keys) > 1) {
    return cudaErrorInvalidValue;
  }
  if (a.mode == AttentionMode::kTiled && !TiledPrefillCapable(a))
    return cudaErrorInvalidValue;  // nothing written
  if (a.mode == AttentionMode::kTensorCore && !TensorCorePrefillCapable(a))
    return cudaErrorInvalidValue;
  return WithKvType(a.layer.dtype, [&](auto* type) -> cudaError_t {
    using T = std::remove_pointer_t<decltype(type)>;
    if (!a.kv_written) {
      if constexpr (kScaledKv<T>) {
        LaunchKernel(WriteKvI8Kernel, static_cast<unsigned>(a.num_tokens), kWriteKvThreads, 0,
                     stream, static_cast<T*>(a.layer.k_cache), static_cast<T*>(a.layer.v_cache),
                     a.k, a.v, a.slot_mapping, a.layer.num_kv_heads, a.layer.head_dim,
                     a.layer.block_size);
      } else {
        LaunchKernel(WriteKvKernel<T>, static_cast<unsigned>(a.num_tokens), kWriteKvThreads, 0,
                     stream, static_cast<T*>(a.layer.k_cache), static_cast<T*>(a.layer.v_cache),
                     a.k, a.v, a.slot_mapping, a.layer.num_kv_heads * a.layer.head_dim);
      }
    }
    if (a.mode == AttentionMode::kTiled) return LaunchTiledPrefillAttention(a, stream);
    if (a.mode == AttentionMode::kTensorCore) return LaunchTensorCorePrefillAttention(a, stream);
    if (TakesTiled(a)) {
      // Prompt chunks through the tiled kernel; decode tokens and short chunks beside them through
      // the split-KV kernel, in-block (a run of one token would hold a whole tiled block).
      PagedAttentionArgs both = a;  // each kernel skips the other's sequences
      both.tiled_min_new_tokens = kMinTiledNewTokens;
      if (cudaError_t e = LaunchPromptAttention(both, stream); e != cudaSuccess) return e;
      if (!SplitCapable(a.layer)) return cudaErrorInvalidValue;  // TiledPrefillCapable implies it
      return LaunchSplitAttentionForHeadDim<T>(both, 1, kSplitKeys, stream);
    }
    if (a.mode == AttentionMode::kLegacy || !SplitCapable(a.layer)) {
      const size_t smem =
          SlotsOffset(a.layer.head_dim) * sizeof(float) + kAttentionThreads * sizeof(int64_t);
      const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_q_heads));
      LaunchKernel(PagedAttentionKernel<T>, grid, kAttentionThreads, smem, stream, a);
      return cudaGetLastError();
    }
    return grid_split ? LaunchSplitAttentionForHeadDim<T>(
                            a, SplitCount(a.max_context_len, grid_keys), grid_keys, stream)
                      : LaunchSplitAttentionForHeadDim<T>(a, 1, kSplitKeys, stream);
  });
}

}  // namespace tandem::cuda
