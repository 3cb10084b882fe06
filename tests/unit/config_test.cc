#include "common/model/config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// The published config.json of Llama 3.1 8B (fields Tandem reads).
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
  "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "vocab_size": 151936})";

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "tie_word_embeddings": true, "vocab_size": 151936})";

constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "tie_word_embeddings": false, "vocab_size": 32768, "torch_dtype": "float16"})";

TEST(ConfigTest, ParsesLlama31) {
  auto c = ParseModelConfig(kLlama31, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kLlama);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->eos_token_id, 128001);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  // KV bytes per token in bf16: 2 × 32 layers × 8 KV heads × 128 × 2 bytes = 128 KiB.
  EXPECT_EQ(c->kv_bytes_per_token(2), 131072);
}

TEST(ConfigTest, ParsesQwen3ExplicitHeadDimAndQkNorm) {
  auto c = ParseModelConfig(kQwen3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3);
  EXPECT_EQ(c->head_dim, 128);  // not hidden_size / heads = 64
  EXPECT_EQ(c->q_size(), 2048);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ConfigTest, ParsesQwen2WithBias) {
  auto c = ParseModelConfig(kQwen2, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_attention_heads / c->num_key_value_heads, 7);
}

TEST(ConfigTest, ParsesMistral) {
  auto c = ParseModelConfig(kMistral, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kMistral);
  EXPECT_EQ(c->torch_dtype, DType::kF16);
}

TEST(ConfigTest, RefusesUnsupportedArchitectureByName) {
  auto c = ParseModelConfig(R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 5})",
                            "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("GPT2LMHeadModel"));
  EXPECT_THAT(c.status().message(), HasSubstr("x/config.json"));
}

TEST(ConfigTest, RefusesBadFields) {
  struct Case {
    std::string json;
    std::string expect;
  };
  const std::string base = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4)";
  const std::vector<Case> cases = {
      {"{" + base + "}", "vocab_size"},                                     // missing
      {"{" + base + R"(, "vocab_size": -3})", "vocab_size"},                // negative
      {"{" + base + R"(, "vocab_size": 1e30})", "vocab_size"},              // not an integer
      {"{" + base + R"(, "vocab_size": 99999999999999})", "out of range"},  // absurd
      {"{" + base + R"(, "vocab_size": 10, "num_key_value_heads": 3})", "multiple"},
      {"{" + base + R"(, "vocab_size": 10, "rope_scaling": {"rope_type": "yarn"}})", "yarn"},
      {"{" + base + R"(, "vocab_size": 10, "tie_word_embeddings": "yes"})", "tie_word_embeddings"},
      {"[1, 2]", "not a JSON object"},
      {"{\"architectures\": ", "invalid JSON"},
      {"{\"architectures\": [\"Llama\xff\"]}", "invalid JSON"},  // not UTF-8
  };
  for (const Case& k : cases) {
    auto c = ParseModelConfig(k.json, "cfg.json");
    ASSERT_FALSE(c.ok()) << k.json;
    EXPECT_THAT(c.status().message(), HasSubstr(k.expect)) << k.json;
    EXPECT_THAT(c.status().message(), HasSubstr("cfg.json")) << k.json;
  }
}

TEST(ConfigTest, JsonRoundTrip) {
  auto c = ParseModelConfig(kLlama31, "config.json");
  ASSERT_TRUE(c.ok());
  auto again = ParseModelConfig(ModelConfigToJson(*c), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->hidden_size, c->hidden_size);
  EXPECT_EQ(again->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(again->rope_scaling.factor, 8.0);
  EXPECT_EQ(again->head_dim, c->head_dim);
}

}  // namespace
}  // namespace tandem
