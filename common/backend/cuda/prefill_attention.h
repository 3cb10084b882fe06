// Tiled causal attention for prompt chunks (FlashAttention-2's loop, in f32 arithmetic on the CUDA
// cores): a block takes kTileQ consecutive new tokens and one query head, and walks the sequence's
// cached keys and values in tiles through shared memory with an online softmax, so each key and
// value row is read once per tile of queries instead of once per query. Rows of a tile that belong
// to different sequences (a chunk's end, decode tokens batched beside it) are taken one sequence at
// a time. The cache already holds the step's new keys and values (LaunchPagedAttention writes them
// first).
//
// Its arithmetic differs from the split-KV decode kernels', so the batch-invariant mode never uses
// it (a token's bits would depend on whether its step was a prefill).
#pragma once

#include <cuda_runtime.h>

#include "common/backend/cuda/paged_attention.h"

namespace tandem::cuda {

// Whether the tiled kernel takes this launch: head_dim 32, 64, 128 or 256.
bool TiledPrefillCapable(const PagedAttentionArgs& a);
// Whether it pays over the split-KV kernels: a step that is mostly prompt (at least 64 new tokens,
// four a sequence on average).
bool TiledPrefillPays(const PagedAttentionArgs& a);
// In a step that pays, sequences with fewer new tokens than this (decode tokens beside a prompt
// chunk) stay with the split-KV kernel (PagedAttentionArgs::tiled_min_new_tokens).
constexpr int64_t kMinTiledNewTokens = 16;
// Attention only (no KV write); cudaErrorInvalidValue outside TiledPrefillCapable.
cudaError_t LaunchTiledPrefillAttention(const PagedAttentionArgs& a, cudaStream_t stream);

// The same loop with both products on the tensor cores (prefill_attention_tc.cu): queries and
// probabilities rounded to the cache's 16-bit type, f32 accumulation. Takes head_dim 64 or 128 over
// a BF16 or F16 cache (16-byte aligned, as cudaMalloc's are: keys and values are read 16 bytes at a
// time); 64 tokens and one query head a block of four warps.
bool TensorCorePrefillCapable(const PagedAttentionArgs& a);
cudaError_t LaunchTensorCorePrefillAttention(const PagedAttentionArgs& a, cudaStream_t stream);

// The prompt kernel a launch takes: the tensor-core one when a.tensor_core_prefill and it is
// capable, else the tiled one.
inline cudaError_t LaunchPromptAttention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.tensor_core_prefill && TensorCorePrefillCapable(a))
    return LaunchTensorCorePrefillAttention(a, stream);
  return LaunchTiledPrefillAttention(a, stream);
}

}  // namespace tandem::cuda
