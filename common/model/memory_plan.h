// The seed's capacity arithmetic, from a checkpoint's headers and the engine's settings, without
// loading a weight (`tandem plan`): the bytes the weights take as a backend holds them (quantized
// codes, scales and zeros included), the KV cache's bytes per token (2 × layers × KV heads ×
// head_dim × element size: GQA-correct), an activation reserve, and how many sequences of which
// lengths the rest holds. Its weight and KV figures are the ones LlamaModel and Engine::Create
// arrive at (tests/unit/memory_plan_test.cc holds them to it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/quant/quantized_matrix.h"
#include "common/tensor/dtype.h"

namespace tandem {

struct MemoryPlanOptions {
  int64_t memory = 0;  // bytes this engine may use: weights + activations + KV cache
  QuantType quantization = QuantType::kNone;
  bool quantize_lm_head = false;  // LlamaLoadOptions::quantize_lm_head
  DType kv_dtype = DType::kF32;   // resolved (LlamaModel::KvCacheDType)
  int64_t block_size = 16;
  int64_t max_model_len = 0;  // 0: the model's context
  int64_t max_num_seqs = 128;
  int64_t max_num_batched_tokens = 2048;
};

struct MemoryPlan {
  int64_t weight_bytes = 0;
  int64_t stored_weight_bytes = 0;  // the checkpoint's tensors as stored
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes_per_block = 0;
  // Activations of the largest step (max_num_batched_tokens rows, logits for every row) in the
  // generic runner's buffers, plus a quarter: an estimate (a GPU engine profiles its own).
  int64_t activation_reserve_bytes = 0;
  int64_t kv_cache_bytes = 0;  // memory - weights - activations
  int64_t num_blocks = 0;
  int64_t kv_tokens = 0;
  int64_t max_model_len = 0;
  // Sequences of max_model_len tokens that fit at once (block-granular).
  int64_t max_concurrent_sequences = 0;
  // (length, sequences of that length that fit) for powers of two up to max_model_len.
  std::vector<std::pair<int64_t, int64_t>> sequences_by_length;
};

// Whether checkpoint tensor `name` is the weight of one of the layers' projections (q, k, v, o,
// gate, up, down): what --quantization and `tandem quantize` quantize (embeddings, norms and
// lm_head stay as stored).
bool IsProjectionWeight(const std::string& name);

// Sequences of `length` tokens that `num_blocks` blocks of `block_size` hold at once.
int64_t SequencesThatFit(int64_t num_blocks, int64_t block_size, int64_t length);

// The weights' bytes as LlamaModel::Load(dir, backend, {quantization, quantize_lm_head}) holds
// them on a backend that keeps 2-D weights in their stored size and 1-D ones as f32 (the CPU and
// CUDA backends).
absl::StatusOr<int64_t> PlannedWeightBytes(const std::string& model_dir, QuantType quantization,
                                           int64_t* stored_bytes = nullptr,
                                           bool quantize_lm_head = false);

// RESOURCE_EXHAUSTED when the weights and activations leave nothing for the KV cache.
absl::StatusOr<MemoryPlan> PlanMemory(const std::string& model_dir, const MemoryPlanOptions& o);

}  // namespace tandem
