// Attention over the paged KV cache (paged_attention.cu): the cache's layer layout, the q|k|v
// prologue that writes new keys and values into it, and the launcher that picks the kernel for a
// step (the GQA split-KV kernels for decode-like steps, in-block or with splits on blocks of their
// own; the tiled or tensor-core prompt kernels of prefill_attention.h for steps that are mostly
// prompt; one block per (token, head) for other head sizes). Same conventions as kernels.h: device
// pointers, launches enqueued on `stream`, the launch error returned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/backend/cuda/kernels.h"
#include "common/tensor/dtype.h"

namespace tandem::cuda {

// Paged-cache layout of one layer: [num_blocks][block_size][num_kv_heads][head_dim] of `dtype`
// (f32, bf16 or f16: written rounded to nearest even, read as f32).
struct PagedLayer {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType dtype = DType::kF32;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// How LaunchPagedAttention computes: kAuto picks; the others are forced (tests compare them).
enum class AttentionMode {
  kAuto,     // split-KV, its splits on blocks of their own when the batch is too small to fill the
             // device
  kInBlock,  // split-KV, every split of a token merged by one block
  kGridSplit,   // split-KV, one block per split, the last to finish merging them (needs the
                // workspace)
  kLegacy,      // one block per (token, query head): any head_dim up to 512
  kTiled,       // the tiled prompt kernel (prefill_attention.h): head_dim 32, 64, 128 or 256
  kTensorCore,  // the tensor-core prompt kernel (prefill_attention.h): head_dim 64 or 128, 16-bit
                // caches
};

// First writes the new keys and values into the cache (k_cache/v_cache[slot_mapping[t]] = k/v[t],
// rows [num_kv_heads][head_dim]; not when kv_written), then runs causal attention of every new
// token over its sequence's paged keys and values (metadata as in backend.h's AttentionMetadata):
// out[n][num_q_heads][head_dim].
// head_dim 32, 64, 128 or 256: GQA-aware split-KV kernels (paged_attention.cu), bit-identical in
// every split mode and whatever the batch with grid_split_keys 0 or 256 (kAuto with allow_tiled may
// take the tiled prompt kernel instead, whose arithmetic differs); other head_dims up to 512: one
// block per (token, head). cudaErrorInvalidValue, with nothing launched, for head_dim > 512, heads
// that do not group, a grid_split_keys other than 0, 32, 64, 128 or 256, or kGridSplit without
// workspace (or over 4096 blocks a split: SplitAttentionWorkspaceFloats is then 0).
struct PagedAttentionArgs {
  PagedLayer layer;
  const float* q = nullptr;
  const float* k = nullptr;  // [num_tokens][num_kv_heads][head_dim]
  const float* v = nullptr;
  // The new keys and values are in the cache already (LaunchQkvPrologue wrote them): k and v
  // unused.
  bool kv_written = false;
  const int32_t* slot_mapping = nullptr;
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t num_q_heads = 0;
  float scale = 1.f;
  const int32_t* seq_indptr = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_indptr = nullptr;
  const int32_t* block_indices = nullptr;
  float* out = nullptr;
  RoundedCopy rounded;  // of out [num_tokens][num_q_heads][head_dim], written by every kernel that
                        // writes out
  int64_t max_context_len = 0;  // of the batch: sets the number of splits
  // Keys of a split where the splits take blocks of their own (a power of two, 32 to 256; 0: 256,
  // the in-block splits'). Below 256 a split block walks a shorter chain of loads but a token's
  // bits then differ from the in-block mode's (not for the batch-invariant mode). Doubled, up to
  // 256, while a token would have more than kMaxGridSplits splits (the last block merges them one
  // by one).
  int64_t grid_split_keys = 0;
  AttentionMode mode = AttentionMode::kAuto;
  // kAuto may take the tiled prompt kernel for steps that are mostly prompt (not in the
  // batch-invariant mode: its arithmetic is not the split-KV kernels').
  bool allow_tiled = false;
  // Set by the launcher when both kinds run in one step: sequences with at least this many new
  // tokens go to the tiled kernel, the others (decode tokens beside a prompt chunk) to the split-KV
  // kernel; each skips the other's. 0: one kernel takes every token.
  int64_t tiled_min_new_tokens = 0;
  // kAuto's prompt kernel runs on the tensor cores where it can (TensorCorePrefillCapable); off: on
  // the CUDA cores (CudaBackend: TANDEM_CUDA_TC_ATTENTION=1 turns it on).
  bool tensor_core_prefill = false;
  // [SplitAttentionWorkspaceFloats(args)] for split partials and the blocks' counters: zero before
  // its first launch (each launch leaves the counters at zero for the next, or for a graph's
  // replay).
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};
cudaError_t LaunchPagedAttention(const PagedAttentionArgs& args, cudaStream_t stream);

// What comes between a fused q|k|v projection and attention, in one pass a token: splits each row
// of qkv [num_tokens][(num_q_heads + 2 num_kv_heads) head_dim] into heads; with q_norm / k_norm
// ([head_dim] f32, Qwen3) RMS-normalises every q and k head; rotates q and k at `positions` (RoPE,
// inv_freq [head_dim/2]); writes q to q_out [num_tokens][num_q_heads][head_dim] and k, v into the
// layer's cache at slot_mapping (a negative slot: not written). Bit for bit what LaunchCopyColumns,
// LaunchRmsNorm (per head), LaunchRope and LaunchPagedAttention's cache write give (the norm's sum
// in RmsNorm's order). cudaErrorInvalidValue, nothing launched, unless head_dim is even and at most
// kMaxPrologueHeadDim.
constexpr int64_t kMaxPrologueHeadDim = 256;
struct QkvPrologueArgs {
  PagedLayer layer;  // the cache's layer, num_kv_heads and head_dim
  const float* qkv = nullptr;
  int64_t num_tokens = 0;
  int64_t num_q_heads = 0;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.f;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  const int32_t* slot_mapping = nullptr;
  float* q_out = nullptr;
};
cudaError_t LaunchQkvPrologue(const QkvPrologueArgs& args, cudaStream_t stream);
// Floats of workspace the launch wants (0: it needs none and will not split across blocks).
int64_t SplitAttentionWorkspaceFloats(const PagedAttentionArgs& args);

constexpr int64_t kMaxGridSplits = 64;

}  // namespace tandem::cuda
