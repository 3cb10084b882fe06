// Launchers of the CUDA backend's own elementwise, norm, RoPE, logits and copy kernels (kernels.cu;
// attention: paged_attention.h). Every pointer is device memory, every
// launcher enqueues on `stream` and returns the launch error (cudaSuccess when enqueued).
// Activations are f32 row-major, as in the Backend interface; shapes are written [outer]...[inner].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/tensor/dtype.h"

namespace tandem::cuda {

// Whether launches of the forward pass's kernels use programmatic dependent launch (launch.cuh:
// asked for, on a device of compute capability 9 or more), for the host code.
bool ProgrammaticLaunchOn();
// Asks for programmatic dependent launch from now on, for the whole process
// (CudaTunings::programmatic_launch).
void RequestProgrammaticLaunch();

// out[n][d] = f32(table[ids[i]][d]); table [rows][d] in `dtype`.
cudaError_t LaunchEmbedding(DType dtype, const void* table, int64_t d, const int32_t* ids,
                            int64_t n, float* out, cudaStream_t stream);

// A second, 16-bit copy of a kernel's f32 output, rounded to nearest even in `dtype` (kBF16 or
// kF16) as LaunchConvertF32 rounds: the input of the cuBLAS GEMM that reads the output next, which
// then has nothing to convert. data null: no copy.
struct RoundedCopy {
  void* data = nullptr;
  DType dtype = DType::kBF16;
};

// out[n][d] = x / sqrt(mean(x^2) + eps) * weight[d]; out may alias x. `rounded`: [n][d].
cudaError_t LaunchRmsNorm(const float* x, const float* weight, float eps, int64_t n, int64_t d,
                          float* out, cudaStream_t stream, const RoundedCopy& rounded = {});

// out[count] = round-to-nearest-even(x) in `dtype` (kF16 or kBF16): GEMM inputs for 16-bit weights.
cudaError_t LaunchConvertF32(DType dtype, const float* x, int64_t count, void* out,
                             cudaStream_t stream);

// out[count] = round-to-nearest-even(x - hi) in `dtype`, hi being LaunchConvertF32's output for x:
// the low term of x split into two 16-bit terms, x ≈ hi + lo
// (CudaBackend::Options::split_gemm_inputs). For BF16, hi + lo holds 16 of x's 24 significant bits
// (more where lo's rounding is exact).
cudaError_t LaunchConvertF32Remainder(DType dtype, const float* x, int64_t count, const void* hi,
                                      void* out, cudaStream_t stream);

// out[n][m] += bias[m].
cudaError_t LaunchAddBias(float* out, const float* bias, int64_t n, int64_t m, cudaStream_t stream);

// Rotate-half RoPE in place on q[n][num_q_heads][head_dim] and k[n][num_kv_heads][head_dim];
// angle = positions[t] * inv_freq[i] for i < head_dim / 2.
cudaError_t LaunchRope(float* q, float* k, const int32_t* positions, const float* inv_freq,
                       int64_t n, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                       cudaStream_t stream);

// out[count] = silu(gate) * up; out may alias gate.
cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count, float* out,
                          cudaStream_t stream);

// x[n][d] += y[n][d], then out = RmsNorm(x) as LaunchRmsNorm computes it (out may alias y).
cudaError_t LaunchAddRmsNorm(float* x, const float* y, const float* weight, float eps, int64_t n,
                             int64_t d, float* out, cudaStream_t stream,
                             const RoundedCopy& rounded = {});

// out[n][d] = silu(x[n][j]) * x[n][d + j] for j < d (packed gate|up rows).
cudaError_t LaunchSiluMulPacked(const float* x, int64_t n, int64_t d, float* out,
                                cudaStream_t stream, const RoundedCopy& rounded = {});

// out[n][cols] = columns [offset, offset + cols) of x[n][stride].
cudaError_t LaunchCopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset,
                              int64_t cols, float* out, cudaStream_t stream);

// x[count] += y[count].
cudaError_t LaunchAdd(float* x, const float* y, int64_t count, cudaStream_t stream);

// dst[index[i]][elems] = src[i][elems] for i < n: blocks landed in a staging buffer scattered into
// their cache blocks (the NCCL KV receiver). `index` is device memory.
cudaError_t LaunchScatterBlocks(const float* src, const int32_t* index, int64_t n, int64_t elems,
                                float* dst, cudaStream_t stream);

// out[i] = the lowest index of the largest value of row x[i][d]; NaN never wins; 0 when nothing
// beats -inf (the CPU's ArgmaxRow, common/base/argmax.h).
cudaError_t LaunchArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out,
                             cudaStream_t stream);

// DeviceSampler::Logprobs: one block per row; top_k at most kMaxLogprobsTopK.
constexpr int32_t kMaxLogprobsTopK = 64;
cudaError_t LaunchLogprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens,
                           int32_t top_k, int32_t* token_out, float* logprob, int32_t* rank,
                           int32_t* top_ids, float* top_logprobs, cudaStream_t stream);

// out[m][d] = x[rows[i]][d].
cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out,
                             cudaStream_t stream);

}  // namespace tandem::cuda
