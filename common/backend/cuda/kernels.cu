// The CUDA backend's own kernels: f32 activations, accumulation in f32, results within rounding of the
// CPU backend (tests/gpu/cuda_backend_test.cc states the tolerances).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/backend/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kAttentionThreads = 128;  // keys per tile of the online softmax
constexpr int kMaxDimsPerThread = 4;    // head_dim ≤ kAttentionThreads * kMaxDimsPerThread

int Blocks(int64_t count, int threads = kThreads) {
  return static_cast<int>(std::min<int64_t>((count + threads - 1) / threads, 65535 * 32));
}

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `red` is shared scratch of 32 floats.
template <bool kMax>
__device__ float BlockReduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // earlier readers of red are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int i = 1; i < warps; ++i) v = kMax ? fmaxf(v, red[i]) : v + red[i];
  return v;
}

template <typename T>
__global__ void EmbeddingKernel(const T* table, int64_t d, const int32_t* ids, int64_t n, float* out) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n * d;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / d, j = idx % d;
    out[idx] = Load(table, int64_t(ids[i]) * d + j);
  }
}

__global__ void RmsNormKernel(const float* x, const float* w, float eps, int64_t d, float* out) {
  __shared__ float red[32];
  const float* xi = x + blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
  ss = BlockReduce<false>(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  float* oi = out + blockIdx.x * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) oi[j] = xi[j] * inv * w[j];
}

template <typename T>
__device__ T FromF32(float v);
template <>
__device__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half FromF32<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void ConvertKernel(const float* x, int64_t count, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = FromF32<T>(x[i]);
  }
}

__global__ void AddBiasKernel(float* out, const float* bias, int64_t n, int64_t m) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * m; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] += bias[i % m];
  }
}

// Grid: one block per token. Threads walk (head, i) pairs of q then k.
__global__ void RopeKernel(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t nq,
                           int64_t nk, int64_t head_dim) {
  const int64_t t = blockIdx.x, half = head_dim / 2;
  const float pos = float(positions[t]);
  for (int64_t idx = threadIdx.x; idx < (nq + nk) * half; idx += blockDim.x) {
    const int64_t h = idx / half, i = idx % half;
    float* x = h < nq ? q + (t * nq + h) * head_dim : k + (t * nk + (h - nq)) * head_dim;
    const float angle = pos * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

__global__ void WriteKvKernel(float* kc, float* vc, const float* k, const float* v, const int32_t* slots,
                              int64_t row) {
  const int64_t t = blockIdx.x, slot = slots[t];
  for (int64_t j = threadIdx.x; j < row; j += blockDim.x) {
    kc[slot * row + j] = k[t * row + j];
    vc[slot * row + j] = v[t * row + j];
  }
}

// Float offset of the 8-byte aligned slot array after q [head_dim] and probs [kAttentionThreads].
__host__ __device__ int64_t SlotsOffset(int64_t head_dim) { return (head_dim + kAttentionThreads + 1) & ~int64_t(1); }

// Grid (num_tokens, num_q_heads), kAttentionThreads threads. Each tile: every thread scores one key,
// the block agrees on the tile's max and sum (online softmax), then each thread accumulates its
// head dimensions over the tile's values.
__global__ void PagedAttentionKernel(PagedAttentionArgs a) {
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;                                                   // [head_dim]
  float* probs = qs + a.layer.head_dim;                               // [kAttentionThreads]
  int64_t* slots = reinterpret_cast<int64_t*>(smem + SlotsOffset(a.layer.head_dim));  // [kAttentionThreads]
  __shared__ float red[32];

  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.layer.head_dim;
  int64_t lo = 0, hi = a.num_seqs - 1;  // the sequence holding token t
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.seq_indptr[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int64_t s = lo;
  const int64_t len = min(int64_t(a.positions[t]) + 1, int64_t(a.context_lens[s]));
  const int64_t group = a.num_q_heads / a.layer.num_kv_heads, kh = h / group;
  const int64_t row = a.layer.num_kv_heads * hd;
  const int32_t* table = a.block_indices + a.block_indptr[s];
  const float* kbase = a.layer.k_cache + kh * hd;
  const float* vbase = a.layer.v_cache + kh * hd;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = a.q[(t * a.num_q_heads + h) * hd + i];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0.f;
  float acc[kMaxDimsPerThread] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t base = 0; base < len; base += blockDim.x) {
    const int64_t p = base + threadIdx.x;
    float score = -INFINITY;
    if (p < len) {
      const int64_t slot = int64_t(table[p / a.layer.block_size]) * a.layer.block_size + p % a.layer.block_size;
      slots[threadIdx.x] = slot;
      const float* kv = kbase + slot * row;
      float dot = 0.f;
      for (int64_t i = 0; i < hd; ++i) dot += qs[i] * kv[i];
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
      for (int64_t k = 0; k < tile; ++k) v += probs[k] * vbase[slots[k] * row + d];
      acc[j] = v;
    }
    __syncthreads();  // the next tile overwrites probs and slots
  }
  float* o = a.out + (t * a.num_q_heads + h) * hd;
  const float inv = len > 0 ? 1.f / running_sum : 0.f;
  for (int j = 0; j < kMaxDimsPerThread; ++j) {
    const int64_t d = threadIdx.x + int64_t(j) * blockDim.x;
    if (d < hd) o[d] = acc[j] * inv;
  }
}

__global__ void SiluMulKernel(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void GatherRowsKernel(const float* x, const int32_t* rows, int64_t d, float* out) {
  const int64_t i = blockIdx.x;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = x[int64_t(rows[i]) * d + j];
}

}  // namespace

cudaError_t LaunchEmbedding(DType dtype, const void* table, int64_t d, const int32_t* ids, int64_t n,
                            float* out, cudaStream_t stream) {
  if (n * d == 0) return cudaSuccess;
  const int blocks = Blocks(n * d);
  switch (dtype) {
    case DType::kF32:
      EmbeddingKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(table), d, ids, n, out);
      break;
    case DType::kBF16:
      EmbeddingKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), d, ids, n, out);
      break;
    case DType::kF16:
      EmbeddingKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(table), d, ids, n, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps, int64_t n, int64_t d, float* out,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  RmsNormKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, weight, eps, d, out);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32(DType dtype, const float* x, int64_t count, void* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (dtype == DType::kBF16) {
    ConvertKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, static_cast<__nv_bfloat16*>(out));
  } else if (dtype == DType::kF16) {
    ConvertKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, static_cast<__half*>(out));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* out, const float* bias, int64_t n, int64_t m, cudaStream_t stream) {
  if (n * m == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(n * m), kThreads, 0, stream>>>(out, bias, n, m);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t n,
                       int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  RopeKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(q, k, positions, inv_freq, num_q_heads,
                                                                 num_kv_heads, head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchPagedAttention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.layer.head_dim > kAttentionThreads * kMaxDimsPerThread || a.num_tokens > 0x7fffffff ||
      a.num_q_heads <= 0 || a.num_q_heads > 65535 || a.layer.num_kv_heads <= 0 ||
      a.num_q_heads % a.layer.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  WriteKvKernel<<<static_cast<unsigned>(a.num_tokens), kThreads, 0, stream>>>(
      a.layer.k_cache, a.layer.v_cache, a.k, a.v, a.slot_mapping, a.layer.num_kv_heads * a.layer.head_dim);
  const size_t smem = SlotsOffset(a.layer.head_dim) * sizeof(float) + kAttentionThreads * sizeof(int64_t);
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_q_heads));
  PagedAttentionKernel<<<grid, kAttentionThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

__global__ void ScatterBlocksKernel(const float* src, const int32_t* index, int64_t elems, float* dst) {
  const int64_t i = blockIdx.x;
  const float* from = src + i * elems;
  float* to = dst + int64_t(index[i]) * elems;
  for (int64_t j = threadIdx.x; j < elems; j += blockDim.x) to[j] = from[j];
}

cudaError_t LaunchScatterBlocks(const float* src, const int32_t* index, int64_t n, int64_t elems, float* dst,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  ScatterBlocksKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(src, index, elems, dst);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  SiluMulKernel<<<Blocks(count), kThreads, 0, stream>>>(gate, up, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  AddKernel<<<Blocks(count), kThreads, 0, stream>>>(x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out,
                             cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  if (m > 0x7fffffff) return cudaErrorInvalidValue;
  GatherRowsKernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(x, rows, d, out);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
