// The CUDA backend's own kernels (attention: paged_attention.cu): f32 activations, accumulation in
// f32, results within rounding of the CPU backend (tests/gpu/cuda_test_util.h states the
// tolerances).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "common/backend/cuda/activation.cuh"
#include "common/backend/cuda/block_reduce.cuh"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/kv_types.cuh"
#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/qkv_prologue.cuh"
#include "common/backend/cuda/row_argmax.cuh"
#include "common/backend/cuda/store_out.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count, int threads = kThreads) {
  return static_cast<int>(std::min<int64_t>((count + threads - 1) / threads, 65535 * 32));
}

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }

template <typename T>
__global__ void EmbeddingKernel(const T* table, int64_t d, const int32_t* ids, int64_t n,
                                float* out) {
  PdlPrologue();
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n * d;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / d, j = idx % d;
    out[idx] = Load(table, int64_t(ids[i]) * d + j);
  }
}

__global__ void RmsNormKernel(const float* x, const float* w, float eps, int64_t d, float* out,
                              RoundedCopy r) {
  PdlPrologue();
  __shared__ float red[32];
  const float* xi = x + blockIdx.x * d;
  const float inv = RmsScale(xi, d, eps, red);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    StoreOut(out, r, blockIdx.x * d + j, xi[j] * inv * w[j]);
}

// RmsNormKernel after the residual add, with the same arithmetic: each thread reads its elements of
// y before the reduction's barriers and writes out after them, so out may alias y.
__global__ void AddRmsNormKernel(float* x, const float* y, const float* w, float eps, int64_t d,
                                 float* out, RoundedCopy r) {
  PdlPrologue();
  __shared__ float red[32];
  float* xi = x + blockIdx.x * d;
  const float* yi = y + blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = xi[j] + yi[j];
    xi[j] = v;
    ss = AddSquare(ss, v);
  }
  const float inv = RmsInverse(BlockReduce<false>(ss, red), d, eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    StoreOut(out, r, blockIdx.x * d + j, xi[j] * inv * w[j]);
}

template <typename T>
__device__ T FromF32(float v);
template <>
__device__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half FromF32<__half>(float v) {
  return __float2half_rn(v);
}

template <typename T>
__global__ void ConvertKernel(const float* x, int64_t count, T* out) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = FromF32<T>(x[i]);
  }
}

template <typename T>
__global__ void ConvertRemainderKernel(const float* x, int64_t count, const T* hi, T* out) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = FromF32<T>(x[i] - LoadKv(hi + i));
  }
}

__global__ void AddBiasKernel(float* out, const float* bias, int64_t n, int64_t m) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * m;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] += bias[i % m];
  }
}

// Grid: one block per token. Threads walk (head, i) pairs of q then k.
__global__ void RopeKernel(float* q, float* k, const int32_t* positions, const float* inv_freq,
                           int64_t nq, int64_t nk, int64_t head_dim) {
  PdlPrologue();
  const int64_t t = blockIdx.x, half = head_dim / 2;
  const float pos = float(positions[t]);
  for (int64_t idx = threadIdx.x; idx < (nq + nk) * half; idx += blockDim.x) {
    const int64_t h = idx / half, i = idx % half;
    float* x = h < nq ? q + (t * nq + h) * head_dim : k + (t * nk + (h - nq)) * head_dim;
    const float2 y = Rotate(x[i], x[i + half], pos, inv_freq[i]);
    x[i] = y.x;
    x[i + half] = y.y;
  }
}

__global__ void SiluMulKernel(const float* gate, const float* up, int64_t count, float* out) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = SiluTimes(gate[i], up[i]);
  }
}

__global__ void SiluMulPackedKernel(const float* x, int64_t d, int64_t count, float* out,
                                    RoundedCopy r) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, j = i % d;
    StoreOut(out, r, i, SiluTimes(x[t * 2 * d + j], x[t * 2 * d + d + j]));
  }
}

__global__ void CopyColumnsKernel(const float* x, int64_t stride, int64_t offset, int64_t cols,
                                  int64_t count, float* out) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = x[(i / cols) * stride + offset + i % cols];
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t count) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void GatherRowsKernel(const float* x, const int32_t* rows, int64_t d, float* out) {
  PdlPrologue();
  const int64_t i = blockIdx.x;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    out[i * d + j] = x[int64_t(rows[i]) * d + j];
}

}  // namespace

bool ProgrammaticLaunchOn() { return ProgrammaticLaunch(); }
void RequestProgrammaticLaunch() { ProgrammaticLaunchRequested().store(true); }

cudaError_t LaunchEmbedding(DType dtype, const void* table, int64_t d, const int32_t* ids,
                            int64_t n, float* out, cudaStream_t stream) {
  if (n * d == 0) return cudaSuccess;
  const int blocks = Blocks(n * d);
  switch (dtype) {
    case DType::kF32:
      LaunchKernel(EmbeddingKernel<float>, blocks, kThreads, 0, stream,
                   static_cast<const float*>(table), d, ids, n, out);
      break;
    case DType::kBF16:
      LaunchKernel(EmbeddingKernel<__nv_bfloat16>, blocks, kThreads, 0, stream,
                   static_cast<const __nv_bfloat16*>(table), d, ids, n, out);
      break;
    case DType::kF16:
      LaunchKernel(EmbeddingKernel<__half>, blocks, kThreads, 0, stream,
                   static_cast<const __half*>(table), d, ids, n, out);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps, int64_t n, int64_t d,
                          float* out, cudaStream_t stream, const RoundedCopy& rounded) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  LaunchKernel(RmsNormKernel, static_cast<unsigned>(n), kThreads, 0, stream, x, weight, eps, d, out,
               rounded);
  return cudaGetLastError();
}

cudaError_t LaunchAddRmsNorm(float* x, const float* y, const float* weight, float eps, int64_t n,
                             int64_t d, float* out, cudaStream_t stream,
                             const RoundedCopy& rounded) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  LaunchKernel(AddRmsNormKernel, static_cast<unsigned>(n), kThreads, 0, stream, x, y, weight, eps,
               d, out, rounded);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32(DType dtype, const float* x, int64_t count, void* out,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (dtype == DType::kBF16) {
    LaunchKernel(ConvertKernel<__nv_bfloat16>, Blocks(count), kThreads, 0, stream, x, count,
                 static_cast<__nv_bfloat16*>(out));
  } else if (dtype == DType::kF16) {
    LaunchKernel(ConvertKernel<__half>, Blocks(count), kThreads, 0, stream, x, count,
                 static_cast<__half*>(out));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32Remainder(DType dtype, const float* x, int64_t count, const void* hi,
                                      void* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (dtype == DType::kBF16) {
    LaunchKernel(ConvertRemainderKernel<__nv_bfloat16>, Blocks(count), kThreads, 0, stream, x,
                 count, static_cast<const __nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(out));
  } else if (dtype == DType::kF16) {
    LaunchKernel(ConvertRemainderKernel<__half>, Blocks(count), kThreads, 0, stream, x, count,
                 static_cast<const __half*>(hi), static_cast<__half*>(out));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* out, const float* bias, int64_t n, int64_t m,
                          cudaStream_t stream) {
  if (n * m == 0) return cudaSuccess;
  LaunchKernel(AddBiasKernel, Blocks(n * m), kThreads, 0, stream, out, bias, n, m);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* q, float* k, const int32_t* positions, const float* inv_freq,
                       int64_t n, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  LaunchKernel(RopeKernel, static_cast<unsigned>(n), kThreads, 0, stream, q, k, positions, inv_freq,
               num_q_heads, num_kv_heads, head_dim);
  return cudaGetLastError();
}

// Tree reduction of the block's (value, index) pairs in shared best_v/best_i [blockDim.x] (written
// and published by a barrier before): larger value first, then lower index; the winner ends in [0].
__device__ void ReduceArgmax(float* best_v, int64_t* best_i) {
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int64_t oi = best_i[threadIdx.x + stride];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
}

// One block per row (row_argmax.cuh: NaN is skipped, so a row of NaN and -inf yields index 0).
__global__ void ArgmaxRowsKernel(const float* x, int64_t d, int32_t* out) {
  PdlPrologue();
  __shared__ float warp_v[32];
  __shared__ int64_t warp_i[32];
  const int32_t best = BlockRowArgmax(x + blockIdx.x * d, d, warp_v, warp_i);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

// (value, index) of the largest logit of `row` not in taken[0..count) (lowest index on ties, -inf
// included; NaN skipped), reduced over the block; every thread gets it. best_v/best_i: shared
// [kThreads].
__device__ void BlockArgmax(const float* row, int64_t d, const int32_t* taken, int count,
                            float* best_v, int64_t* best_i, float* v_out, int64_t* i_out) {
  float v = -INFINITY;
  int64_t i = INT64_MAX;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float y = row[j];
    if (!(y > v || (y == v && j < i)))
      continue;  // -inf still counts (it ranks by id, as on the CPU)
    bool skip = false;
    for (int t = 0; t < count; ++t) skip |= taken[t] == j;
    if (skip) continue;
    v = y;
    i = j;
  }
  __syncthreads();  // earlier readers of best_* are done
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = i;
  __syncthreads();
  ReduceArgmax(best_v, best_i);
  *v_out = best_v[0];
  *i_out = best_i[0];
}

__global__ void LogprobsKernel(const float* logits, int64_t d, const int32_t* tokens, int32_t top_k,
                               int32_t* token_out, float* logprob, int32_t* rank, int32_t* top_ids,
                               float* top_logprobs) {
  __shared__ float best_v[kThreads];
  __shared__ int64_t best_i[kThreads];
  __shared__ double red_d[kThreads];
  __shared__ int32_t taken[kMaxLogprobsTopK];
  if (tokens[blockIdx.x] == -2) return;  // a row that asked for nothing (the whole block leaves)
  const float* row = logits + blockIdx.x * d;
  // The normaliser in double, as ComputeLogprobs: max, then the sum of exp(x - max).
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) m = fmaxf(m, row[j]);
  best_v[threadIdx.x] = m;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride)
      best_v[threadIdx.x] = fmaxf(best_v[threadIdx.x], best_v[threadIdx.x + stride]);
    __syncthreads();
  }
  const double max_logit = best_v[0];
  double sum = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += exp(double(row[j]) - max_logit);
  red_d[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) red_d[threadIdx.x] += red_d[threadIdx.x + stride];
    __syncthreads();
  }
  const double log_z = max_logit + log(red_d[0]);
  // The token (the argmax when none is given) and its rank.
  int64_t token = tokens[blockIdx.x];
  if (token < 0) {
    float v;
    int64_t i;
    BlockArgmax(row, d, taken, 0, best_v, best_i, &v, &i);
    token =
        i == INT64_MAX || v == -INFINITY ? 0 : i;  // ArgmaxRows' choice: 0 when nothing beats -inf
  }
  const float x = row[token];
  int64_t above = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    above += (row[j] > x || (row[j] == x && j < token)) ? 1 : 0;
  __syncthreads();
  red_d[threadIdx.x] = static_cast<double>(above);
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) red_d[threadIdx.x] += red_d[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    token_out[blockIdx.x] = static_cast<int32_t>(token);
    logprob[blockIdx.x] = static_cast<float>(double(x) - log_z);
    rank[blockIdx.x] = static_cast<int32_t>(red_d[0]) + 1;
  }
  // The top k, one block-wide argmax at a time over what is not taken yet.
  for (int k = 0; k < top_k; ++k) {
    float v;
    int64_t i;
    BlockArgmax(row, d, taken, k, best_v, best_i, &v, &i);
    if (i == INT64_MAX) i = 0;  // nothing left but NaN
    if (threadIdx.x == 0) {
      taken[k] = static_cast<int32_t>(i);
      top_ids[blockIdx.x * top_k + k] = static_cast<int32_t>(i);
      top_logprobs[blockIdx.x * top_k + k] = static_cast<float>(double(row[i]) - log_z);
    }
    __syncthreads();
  }
}

cudaError_t LaunchLogprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens,
                           int32_t top_k, int32_t* token_out, float* logprob, int32_t* rank,
                           int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d > 0x7fffffff || top_k < 0 || top_k > kMaxLogprobsTopK || top_k > d) {
    return cudaErrorInvalidValue;
  }
  Launch(LogprobsKernel, static_cast<unsigned>(n), kThreads, 0, stream, logits, d, tokens, top_k,
         token_out, logprob, rank, top_ids, top_logprobs);
  return cudaGetLastError();
}

cudaError_t LaunchArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff || d > 0x7fffffff) return cudaErrorInvalidValue;
  LaunchKernel(ArgmaxRowsKernel, static_cast<unsigned>(n), kThreads, 0, stream, x, d, out);
  return cudaGetLastError();
}

__global__ void ScatterBlocksKernel(const float* src, const int32_t* index, int64_t elems,
                                    float* dst) {
  const int64_t i = blockIdx.x;
  const float* from = src + i * elems;
  float* to = dst + int64_t(index[i]) * elems;
  for (int64_t j = threadIdx.x; j < elems; j += blockDim.x) to[j] = from[j];
}

cudaError_t LaunchScatterBlocks(const float* src, const int32_t* index, int64_t n, int64_t elems,
                                float* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  Launch(ScatterBlocksKernel, static_cast<unsigned>(n), kThreads, 0, stream, src, index, elems,
         dst);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count, float* out,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  LaunchKernel(SiluMulKernel, Blocks(count), kThreads, 0, stream, gate, up, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMulPacked(const float* x, int64_t n, int64_t d, float* out,
                                cudaStream_t stream, const RoundedCopy& rounded) {
  if (n * d == 0) return cudaSuccess;
  LaunchKernel(SiluMulPackedKernel, Blocks(n * d), kThreads, 0, stream, x, d, n * d, out, rounded);
  return cudaGetLastError();
}

cudaError_t LaunchCopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset,
                              int64_t cols, float* out, cudaStream_t stream) {
  if (n * cols == 0) return cudaSuccess;
  LaunchKernel(CopyColumnsKernel, Blocks(n * cols), kThreads, 0, stream, x, stride, offset, cols,
               n * cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  LaunchKernel(AddKernel, Blocks(count), kThreads, 0, stream, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out,
                             cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  if (m > 0x7fffffff) return cudaErrorInvalidValue;
  LaunchKernel(GatherRowsKernel, static_cast<unsigned>(m), kThreads, 0, stream, x, rows, d, out);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
