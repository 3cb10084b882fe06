#include "cli/presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

ModelConfig Base(const char* arch, ModelFamily family, int64_t vocab, int64_t hidden, int64_t inter,
                 int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  ModelConfig c;
  c.architecture = arch;
  c.family = family;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.torch_dtype = DType::kBF16;
  c.attention_bias = family == ModelFamily::kQwen2;
  c.qk_norm = family == ModelFamily::kQwen3;
  return c;
}

std::vector<ModelPreset> MakePresets() {
  std::vector<ModelPreset> p;
  // Tiny vocabularies hold the 256 byte tokens, generated merges and the special tokens.
  constexpr int64_t kTinyVocab = 512;
  {
    ModelConfig c =
        Base("LlamaForCausalLM", ModelFamily::kLlama, kTinyVocab, 256, 640, 2, 4, 1, 64);
    c.rope_theta = 500000.0;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 64;  // small so all three bands are exercised
    p.push_back({"tiny-llama",
                 "Llama 3.1 layout: GQA group 4, head_dim 64, llama3 rope scaling, untied", c});
  }
  {
    ModelConfig c =
        Base("MistralForCausalLM", ModelFamily::kMistral, kTinyVocab, 256, 512, 2, 2, 1, 128);
    c.rope_theta = 1000000.0;
    p.push_back({"tiny-mistral", "Mistral layout: GQA group 2, head_dim 128, untied", c});
  }
  {
    ModelConfig c =
        Base("Qwen2ForCausalLM", ModelFamily::kQwen2, kTinyVocab, 256, 704, 2, 4, 4, 64);
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = true;
    p.push_back({"tiny-qwen2", "Qwen2 layout: q/k/v bias, no GQA (group 1), head_dim 64, tied", c});
  }
  {
    ModelConfig c =
        Base("Qwen3ForCausalLM", ModelFamily::kQwen3, kTinyVocab, 192, 512, 2, 4, 2, 128);
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = true;
    p.push_back({"tiny-qwen3",
                 "Qwen3 layout: q/k RMSNorm, head_dim 128 != hidden/heads, GQA group 2, tied", c});
  }
  {
    ModelConfig c = Base("Qwen2ForCausalLM", ModelFamily::kQwen2, 151936, 896, 4864, 24, 14, 2, 64);
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.max_position_embeddings = 32768;
    c.tie_word_embeddings = true;
    c.bos_token_id = 151643;
    c.eos_token_id = 151643;
    p.push_back({"qwen2.5-0.5b", "Qwen2.5-0.5B shape (494M parameters)", c});
  }
  {
    ModelConfig c =
        Base("Qwen2ForCausalLM", ModelFamily::kQwen2, 152064, 3584, 18944, 28, 28, 4, 128);
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.max_position_embeddings = 32768;
    c.bos_token_id = 151643;
    c.eos_token_id = 151643;
    p.push_back({"qwen2.5-7b", "Qwen2.5-7B shape (7.6B parameters)", c});
  }
  {
    ModelConfig c =
        Base("LlamaForCausalLM", ModelFamily::kLlama, 128256, 4096, 14336, 32, 32, 8, 128);
    c.rope_theta = 500000.0;
    c.max_position_embeddings = 8192;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
    p.push_back({"llama-3-8b", "Llama-3-8B shape (8.0B parameters)", c});
  }
  return p;
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset>* presets = new std::vector<ModelPreset>(MakePresets());
  return *presets;
}

absl::StatusOr<ModelPreset> FindModelPreset(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelPreset& p : ModelPresets()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(
      absl::StrCat("unknown preset \"", name, "\" (known: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace tandem
