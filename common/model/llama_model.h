// The Llama-family transformer (Llama 2/3/3.1, Mistral, Qwen2, Qwen3): its checkpoint read into the
// transformer description the backends' model runners execute (common/backend/transformer.h).
//
// Load() validates the checkpoint against the config (every expected tensor present with the exact
// shape; no unexpected tensors), uploads the weights to the backend and makes the backend's runner
// over them; runner().Forward() runs a step. Used by one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/kv_cache_storage.h"
#include "common/backend/model_runner.h"
#include "common/backend/transformer.h"
#include "common/model/config.h"
#include "common/tensor/safetensors.h"

namespace tandem {

struct LlamaLoadOptions {
  // Load q|k|v and gate|up as one row-stacked weight each (unset: as the backend's runner
  // prefers, Backend::PrefersStackedProjections).
  std::optional<bool> stack_projections;
  // Quantize the projections' weights on load (round to nearest, common/quant/rtn.h's defaults:
  // int8 per output channel symmetric, int4 groups of 128 asymmetric). Embeddings, norms and
  // lm_head stay as stored. INVALID_ARGUMENT when a projection cannot take the layout (int4 needs
  // in_features a multiple of 32).
  QuantType quantization = QuantType::kNone;
  // With `quantization`: quantize the LM head too (as the projections). A tied LM head gets a
  // quantized copy of its own while the embedding table stays as stored for the row lookups. An
  // LM head the checkpoint already quantized stays as it is.
  bool quantize_lm_head = false;
};

class LlamaModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& model_dir,
                                                          Backend* backend,
                                                          const LlamaLoadOptions& options);
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(
      const std::string& model_dir, Backend* backend,
      std::optional<bool> stack_projections = std::nullopt) {
    return Load(model_dir, backend, LlamaLoadOptions{stack_projections});
  }
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  Backend* backend() const { return backend_; }
  // How its projections were quantized on load (kNone: as stored).
  QuantType quantization() const { return quantization_; }
  // Bytes of its weights as the backend holds them (quantized codes, scales and zeros included).
  int64_t weight_bytes() const { return weight_bytes_; }
  // What runs its steps (model_runner.h): the backend's runner over this model's weights.
  ModelRunner& runner() { return *runner_; }
  // The KV cache geometry this model needs for `num_blocks` blocks of `block_size` tokens.
  KvCacheGeometry KvGeometry(int64_t num_blocks, int64_t block_size,
                             DType kv_dtype = DType::kF32) const;
  // What its KV cache stores: `requested`, or when unset (--kv-cache-dtype auto) the weights'
  // 16-bit dtype on a GPU backend, else f32.
  DType KvCacheDType(std::optional<DType> requested) const;

 private:
  LlamaModel() = default;
  // Reads and checks every tensor of the checkpoint into `out` (the description the runner runs).
  absl::Status LoadWeights(bool stacked, TransformerWeights* out);

  ModelConfig config_;
  Backend* backend_ = nullptr;
  QuantType quantization_ = QuantType::kNone;
  bool quantize_lm_head_ = false;
  int64_t weight_bytes_ = 0;
  std::unique_ptr<Checkpoint> checkpoint_;  // the CPU backend's weights point into its mapping
  std::unique_ptr<ModelRunner> runner_;
};

// The transformer description of `config` (transformer.h) without its weights.
TransformerShape TransformerShapeOf(const ModelConfig& config);

// RoPE inverse frequencies [head_dim / 2], with Llama 3.1 scaling applied when configured.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace tandem
