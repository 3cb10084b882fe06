// Forward-pass invariants on the CPU backend: chunked prefill equals whole-prompt evaluation, the
// physical block layout does not matter, batching does not change results, and bad inputs and bad
// checkpoints are refused with clear errors. Numerical agreement with an independent engine is the
// job of tests/conformance (llama.cpp).
#include "common/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>

#include "cli/presets.h"
#include "cli/random_model.h"
#include "common/backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Logits are O(10); the chunked path changes GEMM blocking and summation order only.
constexpr float kChunkTolerance = 2e-4f;

std::string MakeModel(const std::string& preset, DType dtype = DType::kBF16) {
  return testing_util::TinyModel(preset, 7, dtype);
}

std::vector<int32_t> RandomTokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

class ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    auto m = LlamaModel::Load(MakeModel(GetParam()), backend_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(m).value();
  }

  std::unique_ptr<KvCacheStorage> Cache(int64_t blocks, int64_t block_size) {
    return KvCacheStorage::Create(backend_.get(), model_->KvGeometry(blocks, block_size)).value();
  }

  // Logits for every position of `tokens`, evaluated in chunks of `chunk` over `table`.
  std::vector<float> AllLogits(const std::vector<int32_t>& tokens, int64_t chunk,
                               const std::vector<int32_t>& table, KvCacheStorage* kv) {
    std::vector<float> all, step;
    for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
      const size_t end = std::min(tokens.size(), begin + chunk);
      ForwardInput in;
      in.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
      in.seqs.push_back({static_cast<int64_t>(end - begin), static_cast<int64_t>(begin), table});
      for (size_t i = 0; i < end - begin; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
      absl::Status s = model_->runner().Forward(in, kv, &step);
      EXPECT_TRUE(s.ok()) << s;
      all.insert(all.end(), step.begin(), step.end());
    }
    return all;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_P(ModelTest, ChunkedPrefillMatchesWholePrompt) {
  const auto tokens = RandomTokens(45, model_->config().vocab_size, 1);
  std::vector<int32_t> table(8);
  std::iota(table.begin(), table.end(), 0);
  auto kv_whole = Cache(8, 8);
  const std::vector<float> whole = AllLogits(tokens, 45, table, kv_whole.get());
  for (int64_t chunk : {1, 7, 16}) {
    auto kv = Cache(8, 8);
    const std::vector<float> chunked = AllLogits(tokens, chunk, table, kv.get());
    // The default CPU backend is batch-invariant: chunking changes nothing, bit for bit.
    EXPECT_EQ(MaxAbsDiff(whole, chunked), 0.0f) << "chunk " << chunk;
  }
  for (float x : whole) ASSERT_TRUE(std::isfinite(x));
}

TEST_P(ModelTest, GemmPathMatchesWithinTolerance) {
  // With batch invariance off, large batches go through OpenBLAS: equal within kChunkTolerance.
  auto gemm_backend = CpuBackend::Create({nullptr, /*batch_invariant=*/false}).value();
  auto gemm_model = LlamaModel::Load(MakeModel(GetParam()), gemm_backend.get()).value();
  const auto tokens = RandomTokens(45, model_->config().vocab_size, 1);
  std::vector<int32_t> table(8);
  std::iota(table.begin(), table.end(), 0);
  auto kv_a = Cache(8, 8);
  const std::vector<float> invariant = AllLogits(tokens, 45, table, kv_a.get());
  auto kv_b = KvCacheStorage::Create(gemm_backend.get(), gemm_model->KvGeometry(8, 8)).value();
  std::vector<float> gemm;
  ForwardInput in;
  in.token_ids = tokens;
  in.seqs.push_back({45, 0, table});
  for (int i = 0; i < 45; ++i) in.logits_rows.push_back(i);
  ASSERT_TRUE(gemm_model->runner().Forward(in, kv_b.get(), &gemm).ok());
  EXPECT_LE(MaxAbsDiff(invariant, gemm), kChunkTolerance);
}

TEST_P(ModelTest, BlockLayoutDoesNotChangeResults) {
  const auto tokens = RandomTokens(30, model_->config().vocab_size, 2);
  auto kv_a = Cache(16, 4), kv_b = Cache(16, 4);
  std::vector<int32_t> contiguous(8), scattered = {13, 2, 9, 0, 15, 6, 11, 4};
  std::iota(contiguous.begin(), contiguous.end(), 0);
  const auto a = AllLogits(tokens, 11, contiguous, kv_a.get());
  const auto b = AllLogits(tokens, 11, scattered, kv_b.get());
  EXPECT_EQ(a, b);  // identical arithmetic, only addresses differ
}

TEST_P(ModelTest, BatchedSequencesMatchSeparateRuns) {
  const int64_t vocab = model_->config().vocab_size;
  const auto s1 = RandomTokens(20, vocab, 3), s2 = RandomTokens(13, vocab, 4);
  auto kv = Cache(8, 8);
  // Together: s1 in blocks {0,1,2}, s2 in blocks {5,4}.
  ForwardInput in;
  in.token_ids = s1;
  in.token_ids.insert(in.token_ids.end(), s2.begin(), s2.end());
  in.seqs.push_back({20, 0, {0, 1, 2}});
  in.seqs.push_back({13, 0, {5, 4}});
  in.logits_rows = {19, 32};
  std::vector<float> together;
  ASSERT_TRUE(model_->runner().Forward(in, kv.get(), &together).ok());
  auto kv1 = Cache(8, 8), kv2 = Cache(8, 8);
  const auto a1 = AllLogits(s1, 20, {0, 1, 2}, kv1.get());
  const auto a2 = AllLogits(s2, 13, {0, 1}, kv2.get());
  std::vector<float> separate(a1.end() - vocab, a1.end());
  separate.insert(separate.end(), a2.end() - vocab, a2.end());
  EXPECT_EQ(MaxAbsDiff(together, separate), 0.0f);  // batch-invariant
}

TEST_P(ModelTest, ArgmaxOnlyRowsReturnTheArgmaxOfTheirLogits) {
  const int64_t vocab = model_->config().vocab_size;
  const auto tokens = RandomTokens(20, vocab, 9);
  ForwardInput in;
  in.token_ids = tokens;
  in.seqs.push_back({20, 0, {0, 1, 2}});
  in.logits_rows = {3, 11, 19};
  std::vector<float> full;
  auto kv = Cache(8, 8);
  ASSERT_TRUE(model_->runner().Forward(in, kv.get(), &full).ok());
  ASSERT_EQ(full.size(), static_cast<size_t>(3 * vocab));
  // Every row argmax-only: nothing but the ids.
  in.argmax_only = {1, 1, 1};
  std::vector<float> logits{1.f};
  std::vector<int32_t> argmax;
  auto kv2 = Cache(8, 8);
  ASSERT_TRUE(model_->runner().Forward(in, kv2.get(), &logits, &argmax).ok());
  EXPECT_TRUE(logits.empty());
  ASSERT_EQ(argmax.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const float* row = full.data() + i * vocab;
    const int32_t expected =
        static_cast<int32_t>(std::max_element(row, row + vocab) - row);  // first maximum
    EXPECT_EQ(argmax[i], expected) << i;
  }
  // Mixed: the logits come back whole, and the ids too.
  in.argmax_only = {0, 1, 0};
  auto kv3 = Cache(8, 8);
  ASSERT_TRUE(model_->runner().Forward(in, kv3.get(), &logits, &argmax).ok());
  EXPECT_EQ(logits, full);
  ASSERT_EQ(argmax.size(), 3u);
  EXPECT_EQ(argmax[1],
            static_cast<int32_t>(std::max_element(full.data() + vocab, full.data() + 2 * vocab) -
                                 (full.data() + vocab)));
  in.argmax_only = {1};
  EXPECT_EQ(model_->runner().Forward(in, kv3.get(), &logits, &argmax).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ModelTest, DecodeGraphLayoutGivesTheSameResultsAndWritesNoPadding) {
  // Prompts of different lengths, then one decode step of all of them, run op by op and in the
  // padded layout decode graphs use (9 sequences: a batch of 16, 7 of them padding).
  CpuBackend::Options bo;
  bo.batch_invariant = true;  // a row's result must not depend on the 16-row padded batch
  auto backend = CpuBackend::Create(bo).value();
  auto model = LlamaModel::Load(MakeModel(GetParam()), backend.get()).value();
  const int64_t vocab = model->config().vocab_size;
  const int64_t seqs = 9;
  auto run = [&](bool graph_layout, std::vector<float>* logits, std::vector<int32_t>* argmax) {
    auto kv = KvCacheStorage::Create(backend.get(), model->KvGeometry(64, 4)).value();
    const int64_t floats = kv->geometry().num_layers * kv->geometry().elements_per_layer();
    std::fill(static_cast<float*>(kv->k_data()), static_cast<float*>(kv->k_data()) + floats,
              0.f);  // so that any stray write shows
    std::fill(static_cast<float*>(kv->v_data()), static_cast<float*>(kv->v_data()) + floats, 0.f);
    for (int64_t i = 0; i < seqs; ++i) {
      ForwardInput prefill;
      prefill.token_ids =
          RandomTokens(static_cast<int>(3 + i), vocab, static_cast<uint32_t>(20 + i));
      prefill.seqs.push_back({3 + i,
                              0,
                              {static_cast<int32_t>(5 * i), static_cast<int32_t>(5 * i + 1),
                               static_cast<int32_t>(5 * i + 2), static_cast<int32_t>(5 * i + 3)}});
      std::vector<float> ignored;
      EXPECT_TRUE(model->runner().Forward(prefill, kv.get(), &ignored).ok());
    }
    ForwardInput decode;
    decode.allow_graph = true;
    for (int64_t i = 0; i < seqs; ++i) {
      decode.token_ids.push_back(static_cast<int32_t>((7 * i + 1) % vocab));
      decode.seqs.push_back({1,
                             3 + i,
                             {static_cast<int32_t>(5 * i), static_cast<int32_t>(5 * i + 1),
                              static_cast<int32_t>(5 * i + 2), static_cast<int32_t>(5 * i + 3)}});
      decode.logits_rows.push_back(static_cast<int32_t>(i));
      decode.argmax_only.push_back(i % 2);
    }
    model->runner().set_graph_layout_for_testing(graph_layout);
    EXPECT_TRUE(model->runner().Forward(decode, kv.get(), logits, argmax).ok());
    model->runner().set_graph_layout_for_testing(false);
    std::vector<float> cache(static_cast<float*>(kv->k_data()),
                             static_cast<float*>(kv->k_data()) + floats);
    cache.insert(cache.end(), static_cast<float*>(kv->v_data()),
                 static_cast<float*>(kv->v_data()) + floats);
    return cache;
  };
  std::vector<float> logits_a, logits_b;
  std::vector<int32_t> argmax_a, argmax_b;
  const std::vector<float> cache_a = run(false, &logits_a, &argmax_a);
  const std::vector<float> cache_b = run(true, &logits_b, &argmax_b);
  ASSERT_EQ(logits_a.size(), static_cast<size_t>(seqs * vocab));
  EXPECT_EQ(logits_a, logits_b);
  EXPECT_EQ(argmax_a, argmax_b);
  EXPECT_EQ(cache_a, cache_b);  // the padding sequences (block 0, slot -1) wrote nothing
}

TEST_P(ModelTest, FusedProjectionsGiveTheSameLogits) {
  // q|k|v and gate|up stacked into one weight each (what the CUDA backend runs): a prompt in two
  // chunks, then single-token steps (the fused path's pointer offsets instead of column copies).
  auto fused =
      LlamaModel::Load(MakeModel(GetParam()), backend_.get(), /*stack_projections=*/true).value();
  const int64_t vocab = model_->config().vocab_size;
  const auto tokens = RandomTokens(24, vocab, 17);
  auto run = [&](LlamaModel* m) {
    auto kv = Cache(8, 8);
    std::vector<float> all, step;
    for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 13}, {13, 20}, {20, 21}, {21, 22}, {22, 24}}) {
      ForwardInput in;
      in.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
      in.seqs.push_back({end - begin, begin, {0, 1, 2}});
      for (int64_t i = 0; i < end - begin; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
      EXPECT_TRUE(m->runner().Forward(in, kv.get(), &step).ok());
      all.insert(all.end(), step.begin(), step.end());
    }
    return all;
  };
  const auto plain = run(model_.get()), stacked = run(fused.get());
  ASSERT_EQ(plain.size(), 24u * vocab);
  EXPECT_EQ(MaxAbsDiff(plain, stacked), 0.0f);
}

TEST_P(ModelTest, RefusesBadStepsWithoutTouchingTheCache) {
  auto kv = Cache(4, 4);
  std::vector<float> logits;
  ForwardInput bad_token;
  bad_token.token_ids = {0, static_cast<int32_t>(model_->config().vocab_size)};
  bad_token.seqs.push_back({2, 0, {0}});
  absl::Status s = model_->runner().Forward(bad_token, kv.get(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("outside the vocabulary"));

  ForwardInput short_table;
  short_table.token_ids = RandomTokens(9, model_->config().vocab_size, 5);
  short_table.seqs.push_back({9, 0, {0, 1}});
  s = model_->runner().Forward(short_table, kv.get(), &logits);
  EXPECT_THAT(s.message(), HasSubstr("cannot hold"));

  ForwardInput bad_block;
  bad_block.token_ids = {1};
  bad_block.seqs.push_back({1, 0, {4}});
  s = model_->runner().Forward(bad_block, kv.get(), &logits);
  EXPECT_THAT(s.message(), HasSubstr("outside the pool"));

  ForwardInput too_long;
  too_long.token_ids = {1};
  too_long.seqs.push_back({1, model_->config().max_position_embeddings, {0}});
  s = model_->runner().Forward(too_long, kv.get(), &logits);
  EXPECT_THAT(s.message(), HasSubstr("max_position_embeddings"));

  // Device sampling's inputs: each bad one named, whatever the backend.
  auto one_row = [&] {
    ForwardInput in;
    in.token_ids = {1};
    in.seqs.push_back({1, 0, {0}});
    in.logits_rows = {0};
    return in;
  };
  const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
  std::vector<std::pair<std::function<void(ForwardInput&)>, std::string>> cases = {
      {[](ForwardInput& in) {
         in.sample_draws = {RowDraw{}, RowDraw{}};
       },
       "one entry per logits row"},
      {[](ForwardInput& in) { in.sample_draws = {RowDraw{7}}; }, "mode 7"},
      {[](ForwardInput& in) {
         in.sample_draws = {RowDraw{RowDraw::kDraw, 1.f, 0.f, 0, 1.0}};
       },
       "u in [0, 1)"},
      {[](ForwardInput& in) {
         in.sample_draws = {RowDraw{RowDraw::kTotal, 0.f}};
       },
       "1/temperature > 0"},
      {[](ForwardInput& in) {
         in.sample_draws = {RowDraw{RowDraw::kDraw, 1.f, 1.5f}};
       },
       "min_p in [0, 1]"},
      {[&](ForwardInput& in) {
         in.logit_edits = {LogitEdit{0, vocab}};
       },
       "outside the step's logits"},
      {[](ForwardInput& in) {
         in.logit_edits = {LogitEdit{1, 0}};
       },
       "outside the step's logits"},
      {[](ForwardInput& in) {
         in.logit_edits = {LogitEdit{0, 3}, LogitEdit{0, 3}};
       },
       "two logit edits of row 0, token 3"},
      {[](ForwardInput& in) { in.sample_top_k = {ModelRunner::kMaxSampleTopK + 1}; },
       "sample_top_k must be in"},
  };
  for (auto& [mutate, needle] : cases) {
    ForwardInput in = one_row();
    mutate(in);
    s = model_->runner().Forward(in, kv.get(), &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(s.message(), HasSubstr(needle));
  }
  EXPECT_EQ(model_->runner().CopyLogitsRow(0, &logits).code(),
            absl::StatusCode::kFailedPrecondition)
      << "no step ran since the last failure";
  // After a step, its rows as the device holds them.
  ASSERT_TRUE(model_->runner().Forward(one_row(), kv.get(), &logits).ok());
  std::vector<float> row;
  ASSERT_TRUE(model_->runner().CopyLogitsRow(0, &row).ok());
  EXPECT_EQ(row, logits);
  EXPECT_EQ(model_->runner().CopyLogitsRow(1, &row).code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ModelTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

TEST(RopeTest, Llama3ScalingBands) {
  ModelConfig c = FindModelPreset("tiny-llama").value().config;
  ModelConfig plain = c;
  plain.rope_scaling.type = RopeScaling::Type::kNone;
  const auto scaled = RopeInverseFrequencies(c), base = RopeInverseFrequencies(plain);
  ASSERT_EQ(scaled.size(), 32u);
  // Highest frequency (short wavelength): unchanged. Lowest: divided by the factor.
  EXPECT_FLOAT_EQ(scaled[0], base[0]);
  EXPECT_NEAR(scaled.back(), base.back() / 8.0f, 1e-12);
  // In between the divisor moves smoothly from 1 to 8.
  bool saw_medium = false;
  for (size_t i = 0; i < scaled.size(); ++i) {
    const double ratio = base[i] / scaled[i];
    EXPECT_GE(ratio, 1.0 - 1e-6);
    EXPECT_LE(ratio, 8.0 + 1e-5);
    if (ratio > 1.01 && ratio < 7.99) saw_medium = true;
  }
  EXPECT_TRUE(saw_medium);
}

// --- Checkpoints that do not match their config ---

// Copies `src` to a new directory, rewriting model.safetensors through `edit`.
std::string RewriteCheckpoint(const std::string& src, const std::string& name,
                              const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  const std::string dst = ::testing::TempDir() + "/tandem_bad_" + name;
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const char* f : {"config.json", "tokenizer.json"})
    fs::copy_file(src + "/" + f, dst + "/" + f);
  auto ckpt = Checkpoint::Open(src).value();
  std::vector<TensorToWrite> tensors;
  for (const auto& [tname, view] : ckpt->tensors()) {
    TensorToWrite t;
    t.name = tname;
    t.dtype = view->dtype;
    t.shape = view->shape;
    t.data.assign(view->data, view->data + view->nbytes);
    tensors.push_back(std::move(t));
  }
  edit(tensors);
  EXPECT_TRUE(WriteSafetensors(dst + "/model.safetensors", tensors).ok());
  return dst;
}

absl::Status LoadStatus(const std::string& dir) {
  auto backend = CpuBackend::Create({}).value();
  return LlamaModel::Load(dir, backend.get()).status();
}

TEST(ModelLoadTest, MissingTensorIsNamed) {
  const std::string dir = RewriteCheckpoint(MakeModel("tiny-qwen2"), "missing", [](auto& ts) {
    std::erase_if(ts, [](const TensorToWrite& t) {
      return t.name == "model.layers.1.self_attn.k_proj.bias";
    });
  });
  absl::Status s = LoadStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.1.self_attn.k_proj.bias"));
}

TEST(ModelLoadTest, UnexpectedTensorIsNamed) {
  const std::string dir = RewriteCheckpoint(MakeModel("tiny-qwen2"), "unexpected", [](auto& ts) {
    TensorToWrite extra = ts.front();
    extra.name = "model.layers.0.mlp.extra_proj.weight";
    ts.push_back(extra);
  });
  absl::Status s = LoadStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unexpected tensor model.layers.0.mlp.extra_proj.weight"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST(ModelLoadTest, WrongShapeIsNamed) {
  const std::string dir = RewriteCheckpoint(MakeModel("tiny-llama"), "shape", [](auto& ts) {
    for (auto& t : ts) {
      if (t.name == "model.layers.0.mlp.up_proj.weight") std::swap(t.shape[0], t.shape[1]);
    }
  });
  absl::Status s = LoadStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.0.mlp.up_proj.weight"));
  EXPECT_THAT(s.message(), HasSubstr("expected [640, 256]"));
}

TEST(ModelLoadTest, UnsupportedArchitectureIsRefused) {
  const std::string dir = ::testing::TempDir() + "/tandem_bad_arch";
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"architectures": ["MixtralForCausalLM"]})";
  absl::Status s = LoadStatus(dir);
  EXPECT_THAT(s.message(), HasSubstr("unsupported architecture \"MixtralForCausalLM\""));
}

TEST(ModelLoadTest, AllWeightDtypesAgree) {
  // The same initialisation stored as F32, F16 and BF16: outputs differ only by weight rounding.
  auto backend = CpuBackend::Create({}).value();
  std::vector<std::vector<float>> outs;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto model = LlamaModel::Load(MakeModel("tiny-mistral", t), backend.get()).value();
    auto kv = KvCacheStorage::Create(backend.get(), model->KvGeometry(2, 16)).value();
    ForwardInput in;
    in.token_ids = RandomTokens(12, model->config().vocab_size, 9);
    in.seqs.push_back({12, 0, {0}});
    in.logits_rows = {11};
    std::vector<float> logits;
    ASSERT_TRUE(model->runner().Forward(in, kv.get(), &logits).ok());
    outs.push_back(logits);
  }
  EXPECT_LE(MaxAbsDiff(outs[0], outs[1]), 0.05f);  // f16 keeps 11 mantissa bits
  EXPECT_LE(MaxAbsDiff(outs[0], outs[2]), 0.5f);   // bf16 keeps 8
  EXPECT_GT(MaxAbsDiff(outs[0], outs[2]), 0.0f);   // and the dtypes really differ
}

}  // namespace
}  // namespace tandem
