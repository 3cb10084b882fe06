#include "common/model/config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

// Reads an integer field in [lo, hi]; `required` fields must be present.
absl::StatusOr<int64_t> GetInt(const json& j, const char* key, const std::string& source,
                               int64_t lo, int64_t hi, std::optional<int64_t> fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": missing required field \"", key, "\""));
  }
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field \"", key, "\" must be an integer, got ", it->dump()));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", key, "\" = ", it->dump(),
                                                   " is out of range [", lo, ", ", hi, "]"));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", key, "\" = ", v,
                                                   " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<double> GetDouble(const json& j, const char* key, const std::string& source,
                                 double lo, double hi, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field \"", key, "\" must be a number, got ", it->dump()));
  }
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", key, "\" = ", v,
                                                   " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<bool> GetBool(const json& j, const char* key, const std::string& source,
                             bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field \"", key, "\" must be true or false, got ", it->dump()));
  }
  return it->get<bool>();
}

// eos_token_id may be an integer or a list (Llama 3.1 instruct); the first entry is kept.
int64_t GetTokenId(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return -1;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer())
    return (*it)[0].get<int64_t>();
  return -1;
}

constexpr int64_t kMaxDim = 1 << 20;  // hidden, intermediate, head sizes
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));

  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": \"architectures\" must be a non-empty list of names"));
  }
  c.architecture = (*arch)[0].get<std::string>();
  if (c.architecture == "LlamaForCausalLM") {
    c.family = ModelFamily::kLlama;
  } else if (c.architecture == "MistralForCausalLM") {
    c.family = ModelFamily::kMistral;
  } else if (c.architecture == "Qwen2ForCausalLM") {
    c.family = ModelFamily::kQwen2;
  } else if (c.architecture == "Qwen3ForCausalLM") {
    c.family = ModelFamily::kQwen3;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unsupported architecture \"", c.architecture,
                     "\" (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                     "Qwen3ForCausalLM)"));
  }

  ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", source, 1, kMaxVocab, std::nullopt));
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", source, 1, kMaxDim, std::nullopt));
  ASSIGN_OR_RETURN(c.intermediate_size,
                   GetInt(j, "intermediate_size", source, 1, kMaxDim, std::nullopt));
  ASSIGN_OR_RETURN(c.num_hidden_layers,
                   GetInt(j, "num_hidden_layers", source, 1, kMaxLayers, std::nullopt));
  ASSIGN_OR_RETURN(c.num_attention_heads,
                   GetInt(j, "num_attention_heads", source, 1, kMaxHeads, std::nullopt));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   GetInt(j, "num_key_value_heads", source, 1, kMaxHeads, c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": num_attention_heads (", c.num_attention_heads,
                     ") must be a multiple of num_key_value_heads (", c.num_key_value_heads, ")"));
  }
  const bool explicit_head_dim = j.contains("head_dim") && !j["head_dim"].is_null();
  if (!explicit_head_dim && c.hidden_size % c.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": hidden_size (", c.hidden_size, ") is not divisible by num_attention_heads (",
        c.num_attention_heads, ") and no head_dim is given"));
  }
  ASSIGN_OR_RETURN(
      c.head_dim, GetInt(j, "head_dim", source, 2, kMaxDim, c.hidden_size / c.num_attention_heads));
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": head_dim must be even for RoPE"));
  }
  if (c.num_attention_heads * c.head_dim > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": attention width too large"));
  }
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   GetInt(j, "max_position_embeddings", source, 1, kMaxPositions, 2048));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", source, 0.0, 1.0, 1e-6));
  ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta", source, 1.0, 1e12, 10000.0));
  ASSIGN_OR_RETURN(c.tie_word_embeddings,
                   GetBool(j, "tie_word_embeddings", source, c.family == ModelFamily::kQwen2));
  ASSIGN_OR_RETURN(c.attention_bias, GetBool(j, "attention_bias", source, false));
  if (c.family == ModelFamily::kQwen2) c.attention_bias = true;  // Qwen2 always has q/k/v bias
  c.qk_norm = c.family == ModelFamily::kQwen3;

  if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": rope_scaling must be an object"));
    }
    std::string type;
    if (rs->contains("rope_type") && (*rs)["rope_type"].is_string()) {
      type = (*rs)["rope_type"].get<std::string>();
    } else if (rs->contains("type") && (*rs)["type"].is_string()) {
      type = (*rs)["type"].get<std::string>();
    }
    if (type == "llama3") {
      RopeScaling& s = c.rope_scaling;
      s.type = RopeScaling::Type::kLlama3;
      ASSIGN_OR_RETURN(s.factor, GetDouble(*rs, "factor", source, 1.0, 1e6, 8.0));
      ASSIGN_OR_RETURN(s.low_freq_factor,
                       GetDouble(*rs, "low_freq_factor", source, 1e-6, 1e6, 1.0));
      ASSIGN_OR_RETURN(s.high_freq_factor,
                       GetDouble(*rs, "high_freq_factor", source, 1e-6, 1e6, 4.0));
      ASSIGN_OR_RETURN(
          s.original_max_position_embeddings,
          GetInt(*rs, "original_max_position_embeddings", source, 1, kMaxPositions, 8192));
      if (!(s.high_freq_factor > s.low_freq_factor)) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": rope_scaling high_freq_factor must exceed low_freq_factor"));
      }
    } else if (type != "default" && !type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported rope_scaling type \"",
                                                     type, "\" (supported: llama3, default)"));
    }
  }
  if (auto td = j.find("torch_dtype"); td != j.end() && td->is_string()) {
    const std::string s = td->get<std::string>();
    if (s == "float32")
      c.torch_dtype = DType::kF32;
    else if (s == "float16")
      c.torch_dtype = DType::kF16;
    else if (s == "bfloat16")
      c.torch_dtype = DType::kBF16;
  }
  c.bos_token_id = GetTokenId(j, "bos_token_id");
  c.eos_token_id = GetTokenId(j, "eos_token_id");
  if (auto qc = j.find("quantization_config"); qc != j.end()) {
    absl::StatusOr<CheckpointQuantization> q = ParseQuantizationConfig(*qc);
    if (!q.ok())
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", q.status().message()));
    c.quantization = *q;
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (is this a model directory?)"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || size > (16 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": implausible size for a config.json"));
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  return ParseModelConfig(text, path);
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.architecture};
  switch (c.family) {
    case ModelFamily::kLlama: j["model_type"] = "llama"; break;
    case ModelFamily::kMistral: j["model_type"] = "mistral"; break;
    case ModelFamily::kQwen2: j["model_type"] = "qwen2"; break;
    case ModelFamily::kQwen3: j["model_type"] = "qwen3"; break;
  }
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (c.family == ModelFamily::kLlama || c.family == ModelFamily::kQwen3) {
    j["attention_bias"] = c.attention_bias;
  }
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["torch_dtype"] = c.torch_dtype == DType::kF32   ? "float32"
                     : c.torch_dtype == DType::kF16 ? "float16"
                                                    : "bfloat16";
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  return j.dump(2) + "\n";
}

}  // namespace tandem
