#include "cli/random_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/checkpoint_writer.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/tensor/safetensors.h"
#include "common/tokenizer/byte_level.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// What one tensor is initialised to: uniform with the given mean and standard deviation.
struct TensorInit {
  std::string name;
  std::vector<int64_t> shape;
  float mean = 0.f;
  float stddev = 0.f;
};

std::vector<TensorInit> TensorPlan(const ModelConfig& c) {
  std::vector<TensorInit> plan;
  const float inv_sqrt_hidden = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
  const float lm_std = 4.0f * inv_sqrt_hidden;  // logits with std ~4: peaked distributions
  plan.push_back({"model.embed_tokens.weight",
                  {c.vocab_size, c.hidden_size},
                  0.f,
                  c.tie_word_embeddings ? lm_std : 1.0f});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    plan.push_back({p + "input_layernorm.weight", {c.hidden_size}, 1.f, 0.1f});
    plan.push_back(
        {p + "self_attn.q_proj.weight", {c.q_size(), c.hidden_size}, 0.f, inv_sqrt_hidden});
    plan.push_back(
        {p + "self_attn.k_proj.weight", {c.kv_size(), c.hidden_size}, 0.f, inv_sqrt_hidden});
    plan.push_back(
        {p + "self_attn.v_proj.weight", {c.kv_size(), c.hidden_size}, 0.f, inv_sqrt_hidden});
    if (c.attention_bias) {
      plan.push_back({p + "self_attn.q_proj.bias", {c.q_size()}, 0.f, 0.3f});
      plan.push_back({p + "self_attn.k_proj.bias", {c.kv_size()}, 0.f, 0.3f});
      plan.push_back({p + "self_attn.v_proj.bias", {c.kv_size()}, 0.f, 0.3f});
    }
    if (c.qk_norm) {
      plan.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, 1.f, 0.1f});
      plan.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, 1.f, 0.1f});
    }
    plan.push_back({p + "self_attn.o_proj.weight",
                    {c.hidden_size, c.q_size()},
                    0.f,
                    1.0f / std::sqrt(static_cast<float>(c.q_size()))});
    plan.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}, 1.f, 0.1f});
    plan.push_back(
        {p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, 0.f, inv_sqrt_hidden});
    plan.push_back(
        {p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, 0.f, inv_sqrt_hidden});
    plan.push_back({p + "mlp.down_proj.weight",
                    {c.hidden_size, c.intermediate_size},
                    0.f,
                    1.0f / std::sqrt(static_cast<float>(c.intermediate_size))});
  }
  plan.push_back({"model.norm.weight", {c.hidden_size}, 1.f, 0.1f});
  if (!c.tie_word_embeddings) {
    plan.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}, 0.f, lm_std});
  }
  return plan;
}

// Fills `out` (n elements of dtype) deterministically from (seed, tensor index), in parallel
// chunks.
void FillTensor(const TensorInit& init, uint64_t seed, uint64_t tensor_index, DType dtype,
                int64_t n, std::byte* out) {
  constexpr int64_t kChunk = 1 << 16;
  const float half_width = init.stddev * std::sqrt(3.0f);
  ThreadPool::Default().ParallelFor((n + kChunk - 1) / kChunk, 1, [&](int64_t b, int64_t e) {
    for (int64_t chunk = b; chunk < e; ++chunk) {
      uint64_t state =
          seed * 0x100000001b3ull ^ (tensor_index << 32) ^ static_cast<uint64_t>(chunk);
      SplitMix64(state);
      const int64_t end = std::min(n, (chunk + 1) * kChunk);
      for (int64_t i = chunk * kChunk; i < end; ++i) {
        const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
        const float v = init.mean + static_cast<float>(2 * u - 1) * half_width;
        switch (dtype) {
          case DType::kF32: std::memcpy(out + 4 * i, &v, 4); break;
          case DType::kBF16: {
            const uint16_t h = F32ToBf16(v);
            std::memcpy(out + 2 * i, &h, 2);
            break;
          }
          case DType::kF16: {
            const uint16_t h = F32ToF16(v);
            std::memcpy(out + 2 * i, &h, 2);
            break;
          }
        }
      }
    }
  });
}

// The 256 byte tokens of the GPT-2 byte-level alphabet, as UTF-8 strings.
std::vector<std::string> ByteLevelAlphabet() {
  std::vector<std::string> out;
  for (int cp : ByteLevelCodePoints()) out.push_back(EncodeUtf8(cp));
  return out;
}

absl::Status CheckTokenizerFits(const std::string& path, int64_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open tokenizer file"));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
  int64_t max_id = -1;
  if (j.contains("model") && j["model"].contains("vocab") && j["model"]["vocab"].is_object()) {
    for (const auto& [tok, id] : j["model"]["vocab"].items()) {
      if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& t : j["added_tokens"]) {
      if (t.contains("id") && t["id"].is_number_integer())
        max_id = std::max(max_id, t["id"].get<int64_t>());
    }
  }
  if (max_id < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no vocabulary found"));
  if (max_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": token id ", max_id, " does not fit the model's vocab_size ", vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace

std::string MakeByteLevelTokenizerJson(int64_t vocab_size, uint64_t seed) {
  const std::vector<std::string> bytes = ByteLevelAlphabet();
  std::vector<std::string> tokens(bytes.begin(), bytes.end());
  std::unordered_set<std::string> seen(tokens.begin(), tokens.end());
  json merges = json::array();
  // Right-hand pieces favour letters and the space marker so short merges look like English.
  std::vector<int> right;
  for (int b = 'a'; b <= 'z'; ++b) right.push_back(b);
  for (int b : {' ', 'e', 't', 'a', 'o', 'n', 's'}) right.push_back(b);
  uint64_t state = seed ^ 0x746f6b656e697a65ull;
  const int64_t num_special = 2;
  const int64_t target = std::max<int64_t>(vocab_size - num_special, 257);
  int64_t attempts = 0;
  while (static_cast<int64_t>(tokens.size()) < target && attempts < target * 64) {
    ++attempts;
    const std::string& left = tokens[SplitMix64(state) % tokens.size()];
    const std::string& rhs = bytes[right[SplitMix64(state) % right.size()]];
    std::string merged = left + rhs;
    if (merged.size() > 48 || seen.contains(merged)) continue;
    merges.push_back(left + " " + rhs);
    seen.insert(merged);
    tokens.push_back(std::move(merged));
  }
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  json added = json::array();
  const char* specials[] = {"<|begin_of_text|>", "<|end_of_text|>"};
  for (int i = 0; i < num_special; ++i) {
    added.push_back({{"id", static_cast<int64_t>(tokens.size()) + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level},
            {"post_processor", byte_level},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", merges}}}};
  return j.dump(1) + "\n";
}

// A ChatML chat template with tools in the Hermes format (<tool_call> JSON), so that every model
// written here serves chat requests (tool calls parsed as hermes).
constexpr char kChatTemplate[] = R"jinja({%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call functions. Their signatures:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nTo call one, answer with <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{%- continue %}{%- endif %}
{{- '<|im_start|>' + message.role + '\n' }}
{%- if message.content is string %}{{- message.content }}
{%- elif message.content %}{%- for part in message.content %}{{- part.text }}{%- endfor %}
{%- endif %}
{%- for call in message.tool_calls or [] %}
{{- '\n<tool_call>\n' + {'name': call.function.name, 'arguments': call.function.arguments} | tojson + '\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
)jinja";

absl::Status WriteRandomModel(const RandomModelOptions& options) {
  ModelConfig c = options.config;
  c.torch_dtype = options.dtype;
  const fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": cannot create: ", ec.message()));

  // Tokenizer first: the special token ids go into the configs.
  if (options.tokenizer_file.empty()) {
    const std::string tok = MakeByteLevelTokenizerJson(c.vocab_size, options.seed);
    c.bos_token_id = c.vocab_size - 2;
    c.eos_token_id = c.vocab_size - 1;
    RETURN_IF_ERROR(WriteTextFile((dir / "tokenizer.json").string(), tok));
  } else {
    RETURN_IF_ERROR(CheckTokenizerFits(options.tokenizer_file, c.vocab_size));
    fs::copy_file(options.tokenizer_file, dir / "tokenizer.json",
                  fs::copy_options::overwrite_existing, ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("cannot copy ", options.tokenizer_file, ": ", ec.message()));
  }
  json tok_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                     {"model_max_length", c.max_position_embeddings},
                     {"clean_up_tokenization_spaces", false}};
  if (options.tokenizer_file.empty()) {
    tok_config["bos_token"] = "<|begin_of_text|>";
    tok_config["eos_token"] = "<|end_of_text|>";
  }
  tok_config["chat_template"] = kChatTemplate;
  RETURN_IF_ERROR(
      WriteTextFile((dir / "tokenizer_config.json").string(), tok_config.dump(2) + "\n"));
  json gen = {{"do_sample", false}};
  if (c.bos_token_id >= 0) gen["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) gen["eos_token_id"] = c.eos_token_id;
  RETURN_IF_ERROR(WriteTextFile((dir / "generation_config.json").string(), gen.dump(2) + "\n"));
  RETURN_IF_ERROR(WriteTextFile((dir / "config.json").string(), ModelConfigToJson(c)));

  // Weights, split into shards of at most max_shard_bytes.
  const std::vector<TensorInit> plan = TensorPlan(c);
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < plan.size(); ++i) {
    TensorSpec t;
    t.name = plan[i].name;
    t.dtype = options.dtype;
    t.shape = plan[i].shape;
    t.fill = [&, i, elements = static_cast<int64_t>(t.bytes() / DTypeSize(options.dtype))](
                 std::byte* out) {
      FillTensor(plan[i], options.seed, i, options.dtype, elements, out);
    };
    specs.push_back(std::move(t));
  }
  RETURN_IF_ERROR(
      WriteCheckpointWeights(dir.string(), specs, options.max_shard_bytes, options.progress));
  return absl::OkStatus();
}

}  // namespace tandem
