// `tandem make-model --pad-from`: the padded model is wider and deeper, loads, and gives the small
// model's logits (to the rounding of sums made longer by zeros) and the same greedy tokens.
#include "cli/pad_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/kv_cache_storage.h"
#include "common/base/argmax.h"
#include "common/model/llama_model.h"
#include "gtest/gtest.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

// Logits of every position of `tokens`, one prompt step.
std::vector<float> Logits(const std::string& dir, const std::vector<int32_t>& tokens) {
  auto backend = CpuBackend::Create({}).value();
  auto model = LlamaModel::Load(dir, backend.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto kv = KvCacheStorage::Create(backend.get(), (*model)->KvGeometry(8, 16)).value();
  ForwardInput in;
  in.token_ids = tokens;
  in.seqs.push_back({static_cast<int64_t>(tokens.size()), 0, {0, 1, 2, 3}});
  for (size_t i = 0; i < tokens.size(); ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
  std::vector<float> logits;
  EXPECT_TRUE((*model)->runner().Forward(in, kv.get(), &logits).ok());
  return logits;
}

class PadModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PadModelTest, ThePaddedModelComputesTheSameFunction) {
  const std::string small = testing_util::TinyModel(GetParam(), 3, DType::kBF16);
  const ModelConfig c = LoadModelConfig(small).value();
  const std::string padded =
      ::testing::TempDir() + "/padded_" + GetParam() + "_" + std::to_string(::getpid());
  PadModelOptions o;
  o.from_dir = small;
  o.out_dir = padded;
  o.intermediate_size = 3 * c.intermediate_size + 8;
  o.extra_layers = 3;
  ASSERT_TRUE(PadModel(o).ok());
  const ModelConfig p = LoadModelConfig(padded).value();
  EXPECT_EQ(p.intermediate_size, 3 * c.intermediate_size + 8);
  EXPECT_EQ(p.num_hidden_layers, c.num_hidden_layers + 3);
  EXPECT_GT(std::filesystem::file_size(padded + "/model.safetensors"),
            2 * std::filesystem::file_size(small + "/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(padded + "/tokenizer.json"));

  std::vector<int32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 5) % 256);
  const std::vector<float> a = Logits(small, tokens), b = Logits(padded, tokens);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  float max_diff = 0.f, max_abs = 0.f;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    max_abs = std::max(max_abs, std::fabs(a[i]));
  }
  EXPECT_LE(max_diff, 1e-5f * std::max(1.f, max_abs)) << "max |Δlogit| " << max_diff;
  const int64_t vocab = c.vocab_size;
  for (size_t r = 0; r < tokens.size(); ++r) {
    EXPECT_EQ(ArgmaxRow(a.data() + r * vocab, vocab), ArgmaxRow(b.data() + r * vocab, vocab)) << r;
  }
  std::filesystem::remove_all(padded);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, PadModelTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

TEST(PadModelRefusalTest, ANarrowerMlpOrTheSameDirectoryIsRefused) {
  const std::string small = testing_util::TinyModel("tiny-llama", 3, DType::kBF16);
  const ModelConfig c = LoadModelConfig(small).value();
  PadModelOptions o;
  o.from_dir = small;
  o.out_dir = ::testing::TempDir() + "/padded_refused";
  o.intermediate_size = c.intermediate_size - 1;
  absl::Status s = PadModel(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("narrower"), std::string::npos) << s;
  o.intermediate_size = 0;
  o.extra_layers = -1;
  EXPECT_EQ(PadModel(o).code(), absl::StatusCode::kInvalidArgument);
  o.extra_layers = 1;
  o.out_dir = small;
  EXPECT_EQ(PadModel(o).code(), absl::StatusCode::kInvalidArgument);
  o.from_dir = ::testing::TempDir() + "/no_such_model";
  o.out_dir = ::testing::TempDir() + "/padded_refused";
  EXPECT_FALSE(PadModel(o).ok());
}

}  // namespace
}  // namespace tandem
