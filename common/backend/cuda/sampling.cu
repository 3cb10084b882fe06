// Sampling kernels (sampling.h): top-k candidates by radix select, logit edits, weight totals and
// whole-row draws.
#include "common/backend/cuda/sampling.h"

#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/row_argmax.cuh"

#include <cstdint>

namespace tandem::cuda {
namespace {

constexpr int kTopKThreads = 1024;
constexpr int kSampleThreads = 256;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kEditThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

// An unsigned key in the order of the logits: a larger logit, a larger key; NaN as -inf; -0 as +0
// (equal logits, equal keys).
__device__ __forceinline__ uint32_t OrderKey(float v) {
  if (isnan(v)) v = -INFINITY;
  uint32_t u = __float_as_uint(v);
  if ((u << 1) == 0) u = 0;  // ±0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Grid n, kTopKThreads threads (a multiple of 32: every lane of a warp runs every iteration of the
// loops that use warp intrinsics).
__global__ void __launch_bounds__(kTopKThreads)
    TopKRowsKernel(const float* x, int64_t d, int32_t width, const int32_t* row_k, int32_t* ids,
                   float* values) {
  const int32_t k = row_k != nullptr ? min(row_k[blockIdx.x], width) : width;
  if (k <= 0) return;  // the whole block leaves
  const float* row = x + blockIdx.x * d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;  // the k-th key's bits found so far
  __shared__ int s_remaining;    // of the k, how many are still to find among keys with that prefix
  __shared__ int s_above, s_ties;
  __shared__ int warp_ties[kTopKThreads / 32];
  __shared__ uint32_t cand_key[kMaxTopK];
  __shared__ int32_t cand_id[kMaxTopK];
  const int64_t span = (d + blockDim.x - 1) / blockDim.x * blockDim.x;

  // 1. The k-th largest key, 8 bits a pass from the top.
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_remaining = k;
  }
  uint32_t prefix_mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int64_t j = threadIdx.x; j < span; j += blockDim.x) {
      int digit = 256;  // not counted
      if (j < d) {
        const uint32_t key = OrderKey(row[j]);
        if ((key & prefix_mask) == prefix) digit = static_cast<int>((key >> shift) & 0xffu);
      }
      // Lanes with the same digit add once: the first passes see few distinct digits.
      const unsigned peers = __match_any_sync(kFullMask, digit);
      if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int remaining = s_remaining, digit = 255;
      for (; digit > 0; --digit) {  // from the largest digit down to the one holding the k-th key
        if (hist[digit] >= remaining) break;
        remaining -= hist[digit];
      }
      s_remaining = remaining;
      s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
    }
    prefix_mask |= 0xffu << shift;
    __syncthreads();
  }
  const uint32_t threshold = s_prefix;
  const int ties_wanted = s_remaining;  // keys equal to the threshold to take, lowest ids first
  const int above = k - ties_wanted;    // keys above it: all taken

  // 2. Gather: keys above the threshold in any order, ties in id order after them.
  if (threadIdx.x == 0) {
    s_above = 0;
    s_ties = 0;
  }
  __syncthreads();
  for (int64_t base = 0; base < span; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    uint32_t key = 0;
    bool tie = false;
    if (j < d) {
      key = OrderKey(row[j]);
      if (key > threshold) {
        const int slot = atomicAdd(&s_above, 1);
        cand_key[slot] = key;
        cand_id[slot] = static_cast<int32_t>(j);
      }
      tie = key == threshold;
    }
    const unsigned ballot = __ballot_sync(kFullMask, tie);
    if (lane == 0) warp_ties[warp] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) before += warp_ties[w];
    const int taken = s_ties;
    if (tie && taken + before < ties_wanted) {
      cand_key[above + taken + before] = key;
      cand_id[above + taken + before] = static_cast<int32_t>(j);
    }
    __syncthreads();  // s_ties and warp_ties read by all
    if (threadIdx.x == 0) {
      int chunk = 0;
      for (int w = 0; w < warps; ++w) chunk += warp_ties[w];
      s_ties = taken + chunk;
    }
    __syncthreads();
  }

  // 3. Bitonic sort of the k (padded to a power of two): larger key first, then lower id.
  int padded = 1;
  while (padded < k) padded <<= 1;
  for (int i = k + static_cast<int>(threadIdx.x); i < padded; i += blockDim.x) {
    cand_key[i] = 0;  // below every real key (-inf's is 0x007fffff)
    cand_id[i] = INT32_MAX;
  }
  __syncthreads();
  for (int size = 2; size <= padded; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < padded; i += blockDim.x) {
        const int l = i ^ stride;
        if (l <= i) continue;
        const uint32_t ki = cand_key[i], kl = cand_key[l];
        const int32_t ii = cand_id[i], il = cand_id[l];
        const bool l_first = kl > ki || (kl == ki && il < ii);
        // Runs whose bit `size` is clear end in sorted order, the others in reverse (bitonic
        // merge).
        if ((i & size) == 0 ? l_first : !l_first) {
          cand_key[i] = kl;
          cand_key[l] = ki;
          cand_id[i] = il;
          cand_id[l] = ii;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const int32_t id = cand_id[i];
    const float v = row[id];
    ids[blockIdx.x * static_cast<int64_t>(width) + i] = id;
    values[blockIdx.x * static_cast<int64_t>(width) + i] = isnan(v) ? -INFINITY : v;
  }
}

__global__ void ApplyLogitEditsKernel(float* logits, int64_t d, const LogitEdit* edits,
                                      int64_t count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const LogitEdit e = edits[i];
  float* x = logits + e.row * d + e.token;
  *x = ApplyLogitEdit(*x, e);
}

__device__ __forceinline__ double WarpInclusiveScan(double v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const double up = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

// The sampler's weight, each operation rounded on its own as on the host; NaN weighs 0.
__device__ __forceinline__ float RowWeight(float x, float max_logit, float inv_temperature) {
  return isnan(x) ? 0.f : expf(__fmul_rn(__fsub_rn(x, max_logit), inv_temperature));
}

// Grid n, kSampleThreads threads.
__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* logits, int64_t d, const RowDraw* draws, int32_t* tokens,
                     double* totals) {
  const RowDraw draw = draws[blockIdx.x];
  if (draw.mode != RowDraw::kTotal && draw.mode != RowDraw::kDraw)
    return;  // the whole block leaves
  const bool drawing = draw.mode == RowDraw::kDraw;
  const float* row = logits + blockIdx.x * d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float warp_best_v[32];
  __shared__ int64_t warp_best_i[32];
  __shared__ double span_sum[kSampleWarps];
  __shared__ int64_t span_last[kSampleWarps];  // the span's last token of nonzero weight, or -1
  __shared__ int s_span;
  __shared__ double s_before, s_r;

  // The argmax as ArgmaxRow takes it (every thread gets it, so the early return below is uniform).
  const int32_t best = BlockRowArgmax(row, d, warp_best_v, warp_best_i);
  const float max_logit = row[best];
  if (!isfinite(max_logit)) {  // all masked, or an infinite logit: nothing to weigh
    if (threadIdx.x == 0) {
      if (drawing) tokens[blockIdx.x] = best;
      if (!drawing) totals[blockIdx.x] = 0;
    }
    return;
  }

  // Each warp's span of the row, summed 32 weights at a time.
  const int64_t per_warp = ((d + kSampleWarps - 1) / kSampleWarps + 31) / 32 * 32;
  const int64_t begin = warp * per_warp, end = begin + per_warp < d ? begin + per_warp : d;
  const float min_p = drawing ? draw.min_p : 0.f;  // a total counts every weight
  auto weight_at = [&](int64_t j) {
    if (j >= end) return 0.f;
    const float w = RowWeight(row[j], max_logit, draw.inv_temperature);
    return w < min_p ? 0.f : w;
  };
  double sum = 0;
  int64_t last = -1;
  for (int64_t base = begin; base < end; base += 32) {
    const float w = weight_at(base + lane);
    sum += __shfl_sync(kFullMask, WarpInclusiveScan(w, lane), 31);
    const unsigned nonzero = __ballot_sync(kFullMask, w > 0.f);
    if (nonzero != 0) last = base + 31 - __clz(nonzero);
  }
  if (lane == 0) {
    span_sum[warp] = sum;
    span_last[warp] = last;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kSampleWarps; ++w) total += span_sum[w];
    if (!drawing) {
      totals[blockIdx.x] = total;
    } else {
      const double r = draw.u * total;
      double before = 0;
      int s = 0;
      for (; s < kSampleWarps; ++s) {
        if (r < before + span_sum[s]) break;
        before += span_sum[s];
      }
      if (s == kSampleWarps) {  // rounding left r at the very top: the last token with any weight
        int64_t t = best;
        for (int w = kSampleWarps - 1; w >= 0; --w) {
          if (span_last[w] >= 0) {
            t = span_last[w];
            break;
          }
        }
        tokens[blockIdx.x] = static_cast<int32_t>(t);
      }
      s_span = s;
      s_before = before;
      s_r = r;
    }
  }
  __syncthreads();
  if (!drawing || s_span == kSampleWarps || warp != s_span) return;
  // The warp whose span holds r finds the first token whose running sum exceeds it.
  const double r = s_r;
  double running = s_before;
  for (int64_t base = begin; base < end; base += 32) {
    const float w = weight_at(base + lane);
    const double scan = WarpInclusiveScan(w, lane);
    const unsigned hit = __ballot_sync(kFullMask, base + lane < end && r < running + scan);
    if (hit != 0) {
      if (lane == 0) tokens[blockIdx.x] = static_cast<int32_t>(base + __ffs(hit) - 1);
      return;
    }
    running += __shfl_sync(kFullMask, scan, 31);
  }
  // The span's sums rounded the other way: its last token with any weight.
  if (lane == 0)
    tokens[blockIdx.x] = static_cast<int32_t>(span_last[warp] >= 0 ? span_last[warp] : best);
}

}  // namespace

cudaError_t LaunchTopKRows(const float* x, int64_t n, int64_t d, int32_t k, const int32_t* row_k,
                           int32_t* ids, float* values, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d > 0x7fffffff || k < 1 || k > kMaxTopK || k > d)
    return cudaErrorInvalidValue;
  Launch(TopKRowsKernel, static_cast<unsigned>(n), kTopKThreads, 0, stream, x, d, k, row_k, ids,
         values);
  return cudaGetLastError();
}

cudaError_t LaunchApplyLogitEdits(float* logits, int64_t d, const LogitEdit* edits, int64_t count,
                                  cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count < 0 || count > int64_t{0x7fffffff} * kEditThreads) return cudaErrorInvalidValue;
  const auto blocks = static_cast<unsigned>((count + kEditThreads - 1) / kEditThreads);
  Launch(ApplyLogitEditsKernel, blocks, kEditThreads, 0, stream, logits, d, edits, count);
  return cudaGetLastError();
}

cudaError_t LaunchSampleRows(const float* logits, int64_t n, int64_t d, const RowDraw* draws,
                             int32_t* tokens, double* totals, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d <= 0 || d > 0x7fffffff) return cudaErrorInvalidValue;
  Launch(SampleRowsKernel, static_cast<unsigned>(n), kSampleThreads, 0, stream, logits, d, draws,
         tokens, totals);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
