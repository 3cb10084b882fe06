// Quantized checkpoints read unchanged (common/quant/checkpoint_formats.h), against a test-side
// packer written from the formats' documentation (tests/support/quant_packer.mjs, run by the
// quant.checkpoints fixture into $TANDEM_QUANT_CHECKPOINTS): GPTQ (v1 and v2 zero points, 4 and 8
// bits, per channel and grouped, act-order), AWQ (GEMM nibble order) and compressed-tensors
// (pack-quantized, symmetric and asymmetric with packed or int8 zero points, act-order), on every
// tiny preset. The dequantized weights equal the packer's floats bit for bit; the model's logits
// equal Tandem's f32 path on those floats; hostile checkpoints are refused naming what is wrong.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/backend/cpu/cpu_backend.h"
#include "common/model/llama_model.h"
#include "common/model/memory_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Root() {
  const char* root = std::getenv("TANDEM_QUANT_CHECKPOINTS");
  return root != nullptr ? root : "";
}

struct Variant {
  std::string preset;
  std::string name;
};

class CheckpointFormatTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Root().empty()) << "TANDEM_QUANT_CHECKPOINTS is not set (run through ctest)";
    dir_ = Root() + "/" + GetParam().preset + "/" + GetParam().name;
    ASSERT_TRUE(fs::exists(dir_ + "/config.json")) << dir_;
  }
  std::string dir_;
};

std::vector<float> Logits(LlamaModel* model, const std::vector<int32_t>& tokens) {
  auto kv = KvCacheStorage::Create(model->backend(), model->KvGeometry(4, 16)).value();
  ForwardInput in;
  in.token_ids = tokens;
  in.seqs.push_back({static_cast<int64_t>(tokens.size()), 0, {0, 1, 2, 3}});
  for (size_t i = 0; i < tokens.size(); ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
  std::vector<float> out;
  EXPECT_TRUE(model->runner().Forward(in, kv.get(), &out).ok());
  return out;
}

TEST_P(CheckpointFormatTest, DequantizedWeightsEqualThePackersFloats) {
  const ModelConfig c = LoadModelConfig(dir_).value();
  ASSERT_NE(c.quantization.format, CheckpointFormat::kNone);
  auto ckpt = Checkpoint::Open(dir_).value();
  auto ref = Checkpoint::Open(dir_ + "-ref").value();
  int compared = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::pair<std::string, std::pair<int64_t, int64_t>> linears[] = {
        {"self_attn.q_proj", {c.q_size(), c.hidden_size}},
        {"self_attn.k_proj", {c.kv_size(), c.hidden_size}},
        {"self_attn.v_proj", {c.kv_size(), c.hidden_size}},
        {"self_attn.o_proj", {c.hidden_size, c.q_size()}},
        {"mlp.gate_proj", {c.intermediate_size, c.hidden_size}},
        {"mlp.up_proj", {c.intermediate_size, c.hidden_size}},
        {"mlp.down_proj", {c.hidden_size, c.intermediate_size}}};
    for (const auto& [name, shape] : linears) {
      const std::string prefix = "model.layers." + std::to_string(l) + "." + name;
      auto m = ReadQuantizedLinear(*ckpt, c.quantization, prefix, shape.first, shape.second);
      ASSERT_TRUE(m.ok()) << m.status();
      const std::vector<float> got = Dequantize(*m);
      const TensorView* want = ref->Get(prefix + ".weight").value();
      ASSERT_EQ(want->dtype, DType::kF32);
      ASSERT_EQ(got.size() * 4, want->nbytes);
      ASSERT_EQ(std::memcmp(got.data(), want->data, want->nbytes), 0) << prefix;
      EXPECT_EQ(
          m->bytes(),
          QuantizedLinearBytes(*ckpt, c.quantization, prefix, shape.first, shape.second).value());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 7 * c.num_hidden_layers);
}

TEST_P(CheckpointFormatTest, LogitsEqualTheF32PathOnTheDequantizedWeights) {
  auto cpu = CpuBackend::Create({}).value();
  auto quantized = LlamaModel::Load(dir_, cpu.get());
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  auto reference = LlamaModel::Load(dir_ + "-ref", cpu.get()).value();
  const std::vector<int32_t> tokens = {1, 7, 42, 300, 5, 99, 12, 250, 3, 77, 18};
  const std::vector<float> a = Logits(quantized->get(), tokens),
                           b = Logits(reference.get(), tokens);
  ASSERT_EQ(a.size(), b.size());
  float diff = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  EXPECT_LE(diff, 1e-5f * scale);
  // What `tandem plan` counts is what the model holds.
  EXPECT_EQ(PlannedWeightBytes(dir_, QuantType::kNone).value(), (*quantized)->weight_bytes());
  // --quantization on a quantized checkpoint is refused.
  LlamaLoadOptions again;
  again.quantization = QuantType::kInt8;
  const absl::Status s = LlamaModel::Load(dir_, cpu.get(), again).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("already quantized"));
}

TEST_P(CheckpointFormatTest, StackedProjectionsShareALayoutOrAreRefused) {
  auto cpu = CpuBackend::Create({}).value();
  auto stacked = LlamaModel::Load(dir_, cpu.get(), /*stack_projections=*/true);
  if (GetParam().name.ends_with("-act")) {
    // The packer gives q, k and v each its own act-order: they cannot share one column order.
    ASSERT_FALSE(stacked.ok());
    EXPECT_EQ(stacked.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(stacked.status().message(), HasSubstr("q_proj.weight"));
    EXPECT_THAT(stacked.status().message(), HasSubstr("act-order g_idx"));
    return;
  }
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  auto plain = LlamaModel::Load(dir_, cpu.get(), /*stack_projections=*/false).value();
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::vector<float> a = Logits(stacked->get(), tokens), b = Logits(plain.get(), tokens);
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-4f * std::max(1.f, std::fabs(b[i])));
}

std::vector<Variant> AllVariants() {
  std::vector<Variant> v;
  for (const char* name :
       {"gptq-4-g32-sym", "gptq-4-g64-asym-act", "gptq-8-ch-asym-v2", "gptq-8-g64-sym-v2-act",
        "awq-4-g64", "awq-4-g128", "ct-4-g32-sym", "ct-8-ch-asym-packedzp",
        "ct-4-g64-asym-int8zp-act", "ct-8-g64-sym-act"}) {
    v.push_back({"tiny-llama", name});
  }
  for (const char* name : {"gptq-4-g64-asym-act", "awq-4-g128", "ct-8-ch-asym-packedzp"}) {
    v.push_back({"tiny-mistral", name});
  }
  for (const char* name : {"gptq-8-ch-asym-v2", "awq-4-g64", "ct-4-g64-asym-int8zp-act"}) {
    v.push_back({"tiny-qwen2", name});
  }
  for (const char* name : {"gptq-4-g32-sym", "awq-4-g64", "ct-8-g64-sym-act"}) {
    v.push_back({"tiny-qwen3", name});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Packed, CheckpointFormatTest, ::testing::ValuesIn(AllVariants()),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           std::string n = info.param.preset + "_" + info.param.name;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

TEST(HostileCheckpointTest, EachDefectIsRefusedNamingIt) {
  ASSERT_FALSE(Root().empty());
  const std::pair<const char*, const char*> cases[] = {
      {"broken-bits", "3-bit weights are not read"},
      {"broken-method", "quant_method 'exl2' is not read"},
      {"broken-unsupported-format", "checkpoint_format 'marlin'"},
      {"broken-gidx-range", "model.layers.0.mlp.up_proj.g_idx: g_idx[0] = 99 is outside"},
      {"broken-gidx-unequal", "model.layers.1.self_attn.o_proj.g_idx"},
      {"broken-group", "group size 96 does not divide"},
      {"broken-qweight-shape", "model.layers.0.self_attn.k_proj.qweight: shape"},
      {"broken-scale-dtype", "model.layers.0.mlp.down_proj.weight_scale: dtype I32"},
  };
  auto cpu = CpuBackend::Create({}).value();
  for (const auto& [name, why] : cases) {
    const absl::Status s = LlamaModel::Load(Root() + "/tiny-llama/" + name, cpu.get()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(why)) << name;
  }
}

TEST(QuantizationConfigTest, ParsesEachFormatsFieldsAndRefusesTheRest) {
  using nlohmann::json;
  auto parse = [](const char* text) { return ParseQuantizationConfig(json::parse(text)); };
  const CheckpointQuantization g =
      parse(R"({"quant_method":"gptq","bits":4,"group_size":128,"desc_act":true,"sym":false})")
          .value();
  EXPECT_EQ(g.format, CheckpointFormat::kGptq);
  EXPECT_FALSE(g.gptq_v2);  // no checkpoint_format: the original zero - 1 convention
  EXPECT_TRUE(g.desc_act);
  EXPECT_FALSE(g.symmetric);
  EXPECT_TRUE(
      parse(R"({"quant_method":"gptq","bits":8,"group_size":-1,"format":"gptq_v2"})")->gptq_v2);
  EXPECT_EQ(
      parse(R"({"quant_method":"awq","w_bit":4,"q_group_size":64,"version":"GEMM"})")->group_size,
      64);
  EXPECT_FALSE(parse(R"({"quant_method":"awq","bits":4,"group_size":64,"version":"gemv"})").ok());
  EXPECT_FALSE(parse(R"({"quant_method":"awq","bits":4,"group_size":64,"zero_point":false})").ok());
  EXPECT_FALSE(parse(R"({"quant_method":"compressed-tensors","format":"float-quantized",
                         "config_groups":{}})")
                   .ok());
  EXPECT_FALSE(parse(R"({"quant_method":"compressed-tensors","format":"pack-quantized",
      "config_groups":{"g":{"weights":{"num_bits":4,"type":"int","strategy":"group",
      "group_size":32},"input_activations":{"num_bits":8}}}})")
                   .ok());
  EXPECT_FALSE(parse(R"({"quant_method":"gptq","bits":4,"group_size":0})").ok());
  EXPECT_EQ(parse("null")->format, CheckpointFormat::kNone);
}

}  // namespace
}  // namespace tandem
