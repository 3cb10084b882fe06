// The Llama-family model configuration, parsed from a Hugging Face config.json.
//
// Supported architectures: LlamaForCausalLM (Llama 2, 3, 3.1 with rope_scaling "llama3"),
// MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (per-head q/k RMSNorm,
// explicit head_dim). Anything else is refused by name. Every field is range-checked so that later
// size arithmetic cannot overflow.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/quant/checkpoint_formats.h"
#include "common/tensor/dtype.h"

namespace tandem {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3 };

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  // Llama 3.1 parameters (see the Llama 3.1 reference rope frequency adjustment).
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // as in config.json, e.g. "Qwen2ForCausalLM"
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2; Llama's attention_bias)
  bool qk_norm = false;         // per-head RMSNorm on q and k before RoPE (Qwen3)
  DType torch_dtype = DType::kBF16;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  // How the checkpoint's Linear weights are quantized (config.json quantization_config: GPTQ,
  // AWQ, compressed-tensors), or kNone.
  CheckpointQuantization quantization;

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Bytes of K and V for one token across all layers at `bytes_per_element`.
  int64_t kv_bytes_per_token(int64_t bytes_per_element) const {
    return 2 * num_hidden_layers * num_key_value_heads * head_dim * bytes_per_element;
  }
};

// Parses config.json text; `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
// Reads DIR/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);
// Serialises to Hugging Face config.json form (what make-model writes).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace tandem
