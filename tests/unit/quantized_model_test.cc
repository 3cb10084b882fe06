// Quantization on load (--quantization int8|int4) over every tiny preset: the CPU's fused kernels
// give the logits Tandem's own f32 path gives on the dequantized weights; the weights shrink as
// the layout says; speculative decoding and prefix caching run unchanged over quantized weights;
// what cannot be quantized is refused with the tensor's name.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "cli/presets.h"
#include "cli/random_model.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/memory_plan.h"
#include "common/quant/rtn.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/forwarding_backend.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> RandomTokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Logits of every position of `tokens`, as one prefill.
std::vector<float> Logits(LlamaModel* model, const std::vector<int32_t>& tokens) {
  auto kv = KvCacheStorage::Create(model->backend(), model->KvGeometry(8, 8)).value();
  ForwardInput in;
  in.token_ids = tokens;
  std::vector<int32_t> table(8);
  for (int i = 0; i < 8; ++i) table[i] = i;
  in.seqs.push_back({static_cast<int64_t>(tokens.size()), 0, table});
  for (size_t i = 0; i < tokens.size(); ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
  std::vector<float> out;
  EXPECT_TRUE(model->runner().Forward(in, kv.get(), &out).ok());
  return out;
}

struct Param {
  std::string preset;
  QuantType type;
};

class QuantizedModelTest : public ::testing::TestWithParam<Param> {
 protected:
  std::string Dir() const { return testing_util::TinyModel(GetParam().preset, 3); }
  LlamaLoadOptions Options(std::optional<bool> stacked = std::nullopt) const {
    LlamaLoadOptions o;
    o.quantization = GetParam().type;
    o.stack_projections = stacked;
    return o;
  }
};

TEST_P(QuantizedModelTest, LogitsEqualTheF32PathOnTheDequantizedWeights) {
  auto cpu = CpuBackend::Create({}).value();
  ForwardingBackend dequantizing;  // no quantized kernels: the Backend default uploads f32
  ASSERT_FALSE(dequantizing.ReadsQuantizedWeights(GetParam().type));
  ASSERT_TRUE(cpu->ReadsQuantizedWeights(GetParam().type));
  for (bool stacked : {false, true}) {
    auto fused = LlamaModel::Load(Dir(), cpu.get(), Options(stacked)).value();
    auto reference = LlamaModel::Load(Dir(), &dequantizing, Options(stacked)).value();
    const auto tokens = RandomTokens(21, fused->config().vocab_size, 4);
    const std::vector<float> a = Logits(fused.get(), tokens), b = Logits(reference.get(), tokens);
    ASSERT_EQ(a.size(), b.size());
    float max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(a[i]));
      max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
      max_abs = std::max(max_abs, std::fabs(b[i]));
    }
    EXPECT_LE(max_diff, 1e-5f * std::max(1.f, max_abs)) << "stacked " << stacked;
  }
  // And quantizing changed the model (the comparison above is not of two unquantized models).
  auto plain = LlamaModel::Load(Dir(), cpu.get()).value();
  auto fused = LlamaModel::Load(Dir(), cpu.get(), Options()).value();
  const auto tokens = RandomTokens(9, plain->config().vocab_size, 5);
  EXPECT_NE(Logits(plain.get(), tokens), Logits(fused.get(), tokens));
}

TEST_P(QuantizedModelTest, LmHeadQuantizedOnRequestMatchesItsDequantizedWeightsAndThePlan) {
  auto cpu = CpuBackend::Create({}).value();
  ForwardingBackend dequantizing;
  LlamaLoadOptions head = Options();
  head.quantize_lm_head = true;
  auto fused = LlamaModel::Load(Dir(), cpu.get(), head).value();
  auto reference = LlamaModel::Load(Dir(), &dequantizing, head).value();
  auto projections_only = LlamaModel::Load(Dir(), cpu.get(), Options()).value();
  const auto tokens = RandomTokens(13, fused->config().vocab_size, 6);
  const std::vector<float> a = Logits(fused.get(), tokens), b = Logits(reference.get(), tokens);
  ASSERT_EQ(a.size(), b.size());
  float max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    max_abs = std::max(max_abs, std::fabs(b[i]));
  }
  EXPECT_LE(max_diff, 1e-5f * std::max(1.f, max_abs));
  // The head is what changed: the logits move, the bytes follow the plan.
  EXPECT_NE(a, Logits(projections_only.get(), tokens));
  const ModelConfig& c = fused->config();
  const int64_t head_quantized =
      QuantizeRtn(std::vector<float>(c.vocab_size * c.hidden_size, 0.5f).data(), c.vocab_size,
                  c.hidden_size, DefaultRtnOptions(GetParam().type))
          .bytes();
  const int64_t head_stored = c.vocab_size * c.hidden_size * DTypeSize(c.torch_dtype);
  // Tied: a quantized copy beside the embedding table; untied: the head replaced.
  EXPECT_EQ(fused->weight_bytes(), projections_only->weight_bytes() + head_quantized -
                                       (c.tie_word_embeddings ? 0 : head_stored));
  EXPECT_EQ(PlannedWeightBytes(Dir(), GetParam().type, nullptr, true).value(),
            fused->weight_bytes());
}

TEST_P(QuantizedModelTest, WeightsShrinkAsTheLayoutSays) {
  auto cpu = CpuBackend::Create({}).value();
  auto plain = LlamaModel::Load(Dir(), cpu.get()).value();
  auto quantized = LlamaModel::Load(Dir(), cpu.get(), Options()).value();
  EXPECT_EQ(quantized->quantization(), GetParam().type);
  const ModelConfig& c = plain->config();
  const int64_t per_layer = c.hidden_size * (c.q_size() + 2 * c.kv_size()) +
                            c.q_size() * c.hidden_size + 3 * c.hidden_size * c.intermediate_size;
  const int64_t projections = c.num_hidden_layers * per_layer;
  // BF16 → 1 byte (+ a scale per row of 4 bytes) or 0.5 byte (+ scale and zero per 128).
  const int64_t saved = plain->weight_bytes() - quantized->weight_bytes();
  if (GetParam().type == QuantType::kInt8) {
    EXPECT_GT(saved, projections * 9 / 10);
    EXPECT_LE(saved, projections);
  } else {
    EXPECT_GT(saved, projections * 13 / 10);
    EXPECT_LE(saved, projections * 3 / 2);
  }
}

TEST_P(QuantizedModelTest, SpeculationAndPrefixCachingWorkUnchanged) {
  auto cpu = CpuBackend::Create({}).value();
  auto model = LlamaModel::Load(Dir(), cpu.get(), Options()).value();
  // The quantized target as its own draft: all greedy proposals agree.
  auto draft = LlamaModel::Load(Dir(), cpu.get(), Options()).value();
  const int64_t vocab = model->config().vocab_size;
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    // Requests 0-2 share a 24-token prefix (prefix-cache hits); 3-5 repeat a unit (n-gram hits).
    if (i < 3) {
      r.prompt_token_ids = RandomTokens(24, vocab, 9);
      const auto tail = RandomTokens(3 + i, vocab, 20 + i);
      r.prompt_token_ids.insert(r.prompt_token_ids.end(), tail.begin(), tail.end());
    } else {
      const auto unit = RandomTokens(2 + i % 3, vocab, 30 + i);
      for (int j = 0; j < 20; ++j) r.prompt_token_ids.push_back(unit[j % unit.size()]);
    }
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = 12 + i;
    reqs.push_back(r);
  }
  auto run = [&](SpeculationMethod method, bool prefix_caching, int64_t* hits, int64_t* accepted) {
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_dtype = DType::kF32;
    o.kv_cache_memory = 96 * (KvCacheStorage::BytesPerBlock(model->KvGeometry(1, 4)) +
                              DraftModelProposer::BytesPerBlock(*draft, 4, DType::kF32));
    o.enable_prefix_caching = prefix_caching;
    o.scheduler.max_model_len = 128;
    o.speculation.method = method;
    o.speculation.num_tokens = 3;
    o.speculation.adaptive = false;
    if (method == SpeculationMethod::kDraft) o.speculation.draft = draft.get();
    auto engine = Engine::Create(model.get(), o).value();
    std::map<std::string, std::vector<int32_t>> out;
    *accepted = 0;
    // One at a time, so later requests find the earlier ones' blocks cached.
    for (const EngineRequest& r : reqs) {
      EXPECT_TRUE(engine->AddRequest(r).ok());
      while (engine->HasWork()) {
        auto step = engine->Step();
        EXPECT_TRUE(step.ok()) << step.status();
        if (!step.ok()) return out;
        for (const RequestOutput& o : *step) {
          out[o.id].insert(out[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
          if (o.finished && o.speculation) *accepted += o.speculation->accepted;
        }
      }
    }
    *hits = engine->stats().prefix_hits;
    return out;
  };
  int64_t hits = 0, accepted = 0;
  const auto plain = run(SpeculationMethod::kOff, false, &hits, &accepted);
  EXPECT_EQ(hits, 0);
  for (const auto& r : reqs)
    EXPECT_EQ(plain.at(r.id).size(), static_cast<size_t>(r.params.max_tokens));
  EXPECT_EQ(run(SpeculationMethod::kOff, true, &hits, &accepted), plain);
  EXPECT_GT(hits, 0);
  EXPECT_EQ(run(SpeculationMethod::kNgram, true, &hits, &accepted), plain);
  EXPECT_EQ(run(SpeculationMethod::kDraft, true, &hits, &accepted), plain);
  EXPECT_GT(accepted, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, QuantizedModelTest,
    ::testing::Values(Param{"tiny-llama", QuantType::kInt8}, Param{"tiny-llama", QuantType::kInt4},
                      Param{"tiny-mistral", QuantType::kInt8},
                      Param{"tiny-mistral", QuantType::kInt4},
                      Param{"tiny-qwen2", QuantType::kInt8}, Param{"tiny-qwen2", QuantType::kInt4},
                      Param{"tiny-qwen3", QuantType::kInt8}, Param{"tiny-qwen3", QuantType::kInt4}),
    [](const ::testing::TestParamInfo<Param>& info) {
      std::string n = info.param.preset + "_" + std::string(QuantTypeName(info.param.type));
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

TEST(QuantizedModelLoadTest, Int4RefusesWidthsItCannotPackNamingTheTensor) {
  RandomModelOptions o;
  o.config = FindModelPreset("tiny-llama").value().config;
  o.config.hidden_size = 200;  // q/k/v and gate/up have 200 input features
  o.out_dir = ::testing::TempDir() + "/tandem_quant_width200";
  o.seed = 1;
  ASSERT_TRUE(WriteRandomModel(o).ok());
  auto cpu = CpuBackend::Create({}).value();
  LlamaLoadOptions load;
  load.quantization = QuantType::kInt4;
  const absl::Status s = LlamaModel::Load(o.out_dir, cpu.get(), load).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_THAT(s.message(), HasSubstr("multiple of 32"));
  // int8 takes any width.
  load.quantization = QuantType::kInt8;
  EXPECT_TRUE(LlamaModel::Load(o.out_dir, cpu.get(), load).ok());
}

}  // namespace
}  // namespace tandem
