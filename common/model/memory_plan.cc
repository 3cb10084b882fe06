#include "common/model/memory_plan.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/backend/backend.h"
#include "common/base/status_macros.h"
#include "common/quant/rtn.h"
#include "common/tensor/safetensors.h"

namespace tandem {

bool IsProjectionWeight(const std::string& name) {
  if (!name.starts_with("model.layers.")) return false;
  for (const char* suffix : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                             ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

namespace {

// QuantizedMatrix::bytes() of QuantizeRtn(rows × cols, DefaultRtnOptions(type)).
int64_t QuantizedBytes(QuantType type, int64_t rows, int64_t cols) {
  const RtnOptions o = DefaultRtnOptions(type);
  const int64_t group = o.group_size <= 0 || o.group_size > cols ? cols : o.group_size;
  const int64_t groups = (cols + group - 1) / group;
  const bool zeros = !(o.symmetric && type == QuantType::kInt8);
  const int64_t codes = type == QuantType::kInt4 ? rows * (cols / 2) : rows * cols;
  return codes + rows * groups * static_cast<int64_t>(sizeof(float)) * (zeros ? 2 : 1);
}

// [out_features, in_features] of the Linear `prefix` ("model.layers.3.mlp.up_proj", "lm_head").
absl::StatusOr<std::pair<int64_t, int64_t>> LinearShape(const ModelConfig& c,
                                                        const std::string& prefix) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> shapes[] = {
      {".q_proj", {c.q_size(), c.hidden_size}},
      {".k_proj", {c.kv_size(), c.hidden_size}},
      {".v_proj", {c.kv_size(), c.hidden_size}},
      {".o_proj", {c.hidden_size, c.q_size()}},
      {".gate_proj", {c.intermediate_size, c.hidden_size}},
      {".up_proj", {c.intermediate_size, c.hidden_size}},
      {".down_proj", {c.hidden_size, c.intermediate_size}},
      {"lm_head", {c.vocab_size, c.hidden_size}},
  };
  for (const auto& [suffix, shape] : shapes) {
    if (prefix.ends_with(suffix)) return shape;
  }
  return absl::InvalidArgumentError(absl::StrCat(prefix, ": not a Linear of this architecture"));
}

}  // namespace

int64_t SequencesThatFit(int64_t num_blocks, int64_t block_size, int64_t length) {
  const int64_t per_seq = (std::max<int64_t>(1, length) + block_size - 1) / block_size;
  return num_blocks / per_seq;
}

absl::StatusOr<int64_t> PlannedWeightBytes(const std::string& model_dir, QuantType quantization,
                                           int64_t* stored_bytes, bool quantize_lm_head) {
  ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(model_dir));
  int64_t bytes = 0, stored = 0;
  const CheckpointQuantization& cq = c.quantization;
  // A checkpoint's quantized Linears: their tensors are counted once, by prefix.
  std::set<std::string> quantized_tensors;
  for (const auto& [name, t] : checkpoint->tensors()) {
    stored +=
        name.ends_with(".self_attn.rotary_emb.inv_freq") ? 0 : static_cast<int64_t>(t->nbytes);
    if (cq.format == CheckpointFormat::kNone) continue;
    for (const char* suffix : {".qweight", ".weight_packed"}) {
      if (!name.ends_with(suffix)) continue;
      const std::string prefix = name.substr(0, name.size() - std::string_view(suffix).size());
      const std::vector<std::string> names = QuantizedTensorNames(*checkpoint, cq, prefix);
      if (names.empty()) continue;
      // [out][in] from the names: the Linear's shape in the config.
      ASSIGN_OR_RETURN(const auto shape, LinearShape(c, prefix));
      ASSIGN_OR_RETURN(const int64_t b,
                       QuantizedLinearBytes(*checkpoint, cq, prefix, shape.first, shape.second));
      bytes += b;
      quantized_tensors.insert(names.begin(), names.end());
    }
  }
  auto quantized_bytes = [&](const std::string& name,
                             const std::vector<int64_t>& shape) -> absl::StatusOr<int64_t> {
    if (quantization == QuantType::kInt4 && shape[1] % 32 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", shape[1], " input features are not a multiple of 32 (int4)"));
    }
    return QuantizedBytes(quantization, shape[0], shape[1]);
  };
  const bool quantize_head = quantize_lm_head && quantization != QuantType::kNone;
  for (const auto& [name, t] : checkpoint->tensors()) {
    if (name.ends_with(".self_attn.rotary_emb.inv_freq")) continue;  // recomputed, not loaded
    if (quantized_tensors.contains(name)) continue;
    if (t->shape.size() == 1) {
      bytes += t->shape[0] * static_cast<int64_t>(sizeof(float));  // vectors become f32
    } else if (t->shape.size() == 2 && quantization != QuantType::kNone &&
               (IsProjectionWeight(name) ||
                (quantize_head && !c.tie_word_embeddings && name == "lm_head.weight"))) {
      ASSIGN_OR_RETURN(const int64_t b, quantized_bytes(name, t->shape));
      bytes += b;
    } else {
      bytes += static_cast<int64_t>(t->nbytes);
    }
  }
  // A tied LM head quantized gets its own copy beside the embedding table.
  if (quantize_head && c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(const int64_t b,
                     quantized_bytes("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
    bytes += b;
  }
  bytes += (c.head_dim / 2) * static_cast<int64_t>(sizeof(float));  // the rotary table
  if (stored_bytes != nullptr) *stored_bytes = stored;
  return bytes;
}

absl::StatusOr<MemoryPlan> PlanMemory(const std::string& model_dir, const MemoryPlanOptions& o) {
  ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(model_dir));
  if (o.block_size < 1) return absl::InvalidArgumentError("--block-size must be at least 1");
  MemoryPlan p;
  ASSIGN_OR_RETURN(p.weight_bytes, PlannedWeightBytes(model_dir, o.quantization,
                                                      &p.stored_weight_bytes, o.quantize_lm_head));
  p.max_model_len = o.max_model_len > 0 ? std::min(o.max_model_len, c.max_position_embeddings)
                                        : c.max_position_embeddings;
  // K and V of every layer, as KvCacheStorage lays a block out (an int8 cache's scales included).
  KvCacheGeometry g;
  g.num_layers = c.num_hidden_layers;
  g.num_blocks = 1;
  g.block_size = o.block_size;
  g.num_kv_heads = c.num_key_value_heads;
  g.head_dim = c.head_dim;
  g.dtype = o.kv_dtype;
  p.kv_bytes_per_block = 2 * g.num_layers * g.bytes_per_block();
  p.kv_bytes_per_token = p.kv_bytes_per_block / o.block_size;
  // The generic runner's buffers for a step of `tokens` rows, every row with logits: hidden
  // states, residual and norm output, q|k|v, attention output, gate|up and its product, logits.
  const int64_t tokens = std::max<int64_t>(
      1,
      std::min(o.max_num_batched_tokens, std::max<int64_t>(1, o.max_num_seqs) * p.max_model_len));
  // A quarter more for what the formula leaves out (metadata, buffers grown in steps, scratch).
  const int64_t buffers = static_cast<int64_t>(sizeof(float)) * tokens *
                          (3 * c.hidden_size + 2 * c.q_size() + 2 * c.kv_size() +
                           3 * c.intermediate_size + c.vocab_size);
  p.activation_reserve_bytes = buffers + buffers / 4;
  p.kv_cache_bytes = o.memory - p.weight_bytes - p.activation_reserve_bytes;
  if (p.kv_cache_bytes < p.kv_bytes_per_block) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--memory ", o.memory, " bytes holds no KV cache: the weights take ", p.weight_bytes,
        " and the activations of a ", tokens, "-token step about ", p.activation_reserve_bytes,
        " (one block of ", o.block_size, " tokens takes ", p.kv_bytes_per_block, ")"));
  }
  p.num_blocks = p.kv_cache_bytes / p.kv_bytes_per_block;
  p.kv_tokens = p.num_blocks * o.block_size;
  // As Engine::Create: the pool bounds the context.
  p.max_model_len = std::min(p.max_model_len, p.kv_tokens);
  p.max_concurrent_sequences = SequencesThatFit(p.num_blocks, o.block_size, p.max_model_len);
  for (int64_t len = 512; len < p.max_model_len; len *= 2) {
    p.sequences_by_length.emplace_back(len, SequencesThatFit(p.num_blocks, o.block_size, len));
  }
  p.sequences_by_length.emplace_back(p.max_model_len, p.max_concurrent_sequences);
  return p;
}

}  // namespace tandem
