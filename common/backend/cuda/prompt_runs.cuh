// What the two prompt-attention kernels (prefill_attention.cu on the CUDA cores,
// prefill_attention_tc.cu on the tensor cores) share: how a tile of consecutive new tokens splits
// into runs of one sequence, and their launch with over 48 KiB of dynamic shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/backend/cuda/launch.cuh"
#include "common/backend/cuda/paged_attention.h"

namespace tandem::cuda {

// Keys token t of a run sees (positions up to its own, at most the sequence's context).
__device__ __forceinline__ int64_t PromptKeys(const PagedAttentionArgs& a, int64_t t, int64_t ctx) {
  const int64_t seen = int64_t(a.positions[t]) + 1;
  return seen < ctx ? seen : ctx;
}

// The run of the tile's tokens that starts at `run`: its end (at most t_end), whether the kernel
// leaves it to the split-KV kernel (a sequence of fewer new tokens than a.tiled_min_new_tokens),
// and, when it does not, the sequence's block table, its context and the most keys a token of the
// run sees. Uniform across a block that asks for the same run.
struct PromptRun {
  int64_t end;
  bool skip;
  const int32_t* table;
  int64_t ctx;
  int64_t keys;
};
__device__ __forceinline__ PromptRun FindPromptRun(const PagedAttentionArgs& a, int64_t run,
                                                   int64_t t_end) {
  int64_t lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.seq_indptr[mid] <= run)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t seq_end = a.seq_indptr[lo + 1];
  PromptRun r;
  r.end = t_end < seq_end ? t_end : seq_end;
  r.skip = a.tiled_min_new_tokens > 0 && seq_end - a.seq_indptr[lo] < a.tiled_min_new_tokens;
  r.table = a.block_indices + a.block_indptr[lo];
  r.ctx = a.context_lens[lo];
  r.keys = r.skip ? 0 : PromptKeys(a, r.end - 1, r.ctx);
  return r;
}

// Launches `kernel` over (ceil(num_tokens / tile_q), num_q_heads) blocks of `threads` with `bytes`
// of dynamic shared memory (over 48 KiB must be asked for, per device: asked at every launch, a
// host-side call of a microsecond, once per layer of a prompt step).
template <typename Kernel>
cudaError_t LaunchPromptKernel(Kernel kernel, const PagedAttentionArgs& a, int tile_q, int threads,
                               size_t bytes, cudaStream_t stream) {
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>((a.num_tokens + tile_q - 1) / tile_q),
                  static_cast<unsigned>(a.num_q_heads));
  Launch(kernel, grid, threads, bytes, stream, a);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
