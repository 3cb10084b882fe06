// The whole forward pass of every tiny preset on the CUDA backend against the CPU backend (F32,
// BF16, F16, BF16 computed in F16 or with split GEMM inputs), decode graphs against op by op, and
// the fusions against the unfused kernels, bit for bit.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda/cuda_backend.h"
#ifdef TANDEM_CUDA_EMULATED
#include "tests/support/cuda_emu/counters.h"
#endif
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/prefill_attention.h"
#include "common/backend/cuda/smoke_kernel.h"
#include "common/backend/kv_cache_storage.h"
#include "common/base/argmax.h"
#include "common/engine/engine.h"
#include "common/model/llama_model.h"
#include "common/sampling/device_sampling.h"
#include "common/sampling/sampler.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/unit/tiny_models.h"

namespace tandem::cuda_test {
namespace {

// --- The whole forward pass ---

class CudaForwardTest : public ::testing::TestWithParam<std::string> {};

// Kernels the emulator has run so far (0 on a device, where nothing counts them).
uint64_t KernelsRun() {
#ifdef TANDEM_CUDA_EMULATED
  return tandem_emu::KernelsRun();
#else
  return 0;
#endif
}

// Prefill in chunks of 16 then 8 single-token decode steps; logits of every row. `kernels`
// (nullable): the kernels each step ran, on the emulator.
std::vector<float> AllLogits(Backend* backend, const std::string& dir,
                             const std::vector<int32_t>& tokens,
                             std::vector<uint64_t>* kernels = nullptr, DType kv_dtype = DType::kF32,
                             QuantType quantization = QuantType::kNone,
                             bool quantize_lm_head = false) {
  LlamaLoadOptions load;
  load.quantization = quantization;
  load.quantize_lm_head = quantize_lm_head;
  auto model = LlamaModel::Load(dir, backend, load);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto kv = KvCacheStorage::Create(backend, (*model)->KvGeometry(16, 16, kv_dtype)).value();
  std::vector<int32_t> table = {7, 3, 11, 0, 5};
  std::vector<float> all, step;
  size_t begin = 0;
  while (begin < tokens.size()) {
    const size_t end = begin < 40 ? std::min<size_t>(begin + 16, 40) : begin + 1;
    ForwardInput in;
    in.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
    in.seqs.push_back({static_cast<int64_t>(end - begin), static_cast<int64_t>(begin), table});
    for (size_t i = 0; i < end - begin; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
    const uint64_t before = KernelsRun();
    const absl::Status s = (*model)->runner().Forward(in, kv.get(), &step);
    EXPECT_TRUE(s.ok()) << s;
    if (kernels != nullptr) kernels->push_back(KernelsRun() - before);
    all.insert(all.end(), step.begin(), step.end());
    begin = end;
  }
  return all;
}

// `dtype`: the checkpoint's; `compute`: the GPU's compute type (unset: the checkpoint's).
// `quantization`: both load the projections quantized (the CPU reads the codes; the GPU runs them
// dequantized to its compute type).
void CompareModels(const std::string& preset, DType dtype,
                   std::optional<DType> compute = std::nullopt, bool split_inputs = false,
                   QuantType quantization = QuantType::kNone, bool quantize_lm_head = false) {
  const std::string dir = testing_util::TinyModel(preset, 7, dtype);
  auto cpu = CpuBackend::Create({}).value();
  CudaBackend::Options options;
  options.compute_dtype = compute;
  options.split_gemm_inputs = split_inputs;
  auto gpu = CudaBackend::Create(options).value();
  const int64_t vocab = LlamaModel::Load(dir, cpu.get()).value()->config().vocab_size;
  std::vector<int32_t> tokens(48);
  std::mt19937 rng(3);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  const auto a = AllLogits(cpu.get(), dir, tokens, nullptr, DType::kF32, quantization,
                           quantize_lm_head),
             b = AllLogits(gpu.get(), dir, tokens, nullptr, DType::kF32, quantization,
                           quantize_lm_head);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), tokens.size() * vocab);
  float max_logit_diff = 0, max_dp = 0;
  int clear_rows = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    const float mx = *std::max_element(x, x + vocab), my = *std::max_element(y, y + vocab);
    double sx = 0, sy = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      sx += std::exp(x[i] - mx);
      sy += std::exp(y[i] - my);
      max_logit_diff = std::max(max_logit_diff, std::fabs(x[i] - y[i]));
    }
    for (int64_t i = 0; i < vocab; ++i) {
      max_dp = std::max(max_dp, static_cast<float>(std::fabs(std::exp(x[i] - mx) / sx -
                                                             std::exp(y[i] - my) / sy)));
    }
    std::vector<float> sorted(x, x + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const int64_t top_x = std::max_element(x, x + vocab) - x,
                  top_y = std::max_element(y, y + vocab) - y;
    const float margin = sorted[0] - sorted[1];
    if (margin > (dtype == DType::kF32 ? 1e-3f : 0.1f)) {
      ++clear_rows;
      EXPECT_EQ(top_x, top_y) << preset << " row " << r << " margin " << margin;
    }
  }
  const std::string computed = absl::StrCat(
      compute.has_value() ? absl::StrCat(" computed in ", std::string(DTypeName(*compute))) : "",
      split_inputs ? ", GEMM inputs split" : "");
  std::printf("%s %s%s: max |Δlogit| %.3g, max |Δp| %.3g, top-1 checked on %d of %zu rows\n",
              preset.c_str(), std::string(DTypeName(dtype)).c_str(), computed.c_str(),
              max_logit_diff, max_dp, clear_rows, tokens.size());
  if (dtype == DType::kF32) {
    EXPECT_LE(max_logit_diff, 2e-3f) << preset;
  }
  // In BF16 the GPU rounds each GEMM's activations to BF16 (tensor cores), the CPU keeps them in
  // f32 against the same BF16 weights: on these small random models with peaked distributions that
  // parts the probabilities by up to ~1.7e-2 (seen on an H200). The 1e-2 bound against transformers
  // in BF16, which rounds where the GPU does, is checked by tests/gpu/hf_forward_check.py. In F16
  // (an F16 checkpoint, or BF16 weights cast to F16) activations keep 11 significant bits to BF16's
  // 8: about 1e-3 here (emulated). Split into two 16-bit terms they keep about 16, and the GPU is
  // as close to the CPU as in F32: about 1e-5 (emulated).
  const bool f16 = compute.value_or(dtype) == DType::kF16;
  EXPECT_LE(max_dp, dtype == DType::kF32 ? 1e-2f
                    : split_inputs       ? 1e-4f
                    : f16                ? 5e-3f
                                         : 3e-2f)
      << preset;
  EXPECT_TRUE(gpu->CheckErrors().ok());
}

// Five prompts of 300 to 900 tokens (emulated: 16 to 64, and 780), up to four 256-key attention
// splits; then decode steps of all five (a graph batch of 8), of three (4) and of all five again (a
// replay), the contexts growing: logits and argmax of every step, in order.
std::vector<std::vector<float>> DecodeScript(const std::string& dir, bool graphs,
                                             size_t* num_graphs, int64_t* replays,
                                             bool batch_invariant = true,
                                             DType kv_dtype = DType::kF32) {
  CudaBackend::Options o;
  o.batch_invariant = batch_invariant;
  auto backend = CudaBackend::Create(o).value();
  auto model = LlamaModel::Load(dir, backend.get()).value();
  model->runner().set_use_graphs(graphs);
  auto kv = KvCacheStorage::Create(backend.get(), model->KvGeometry(320, 16, kv_dtype)).value();
  const int64_t vocab = model->config().vocab_size;
  std::vector<int64_t> len(5);
  std::vector<std::vector<int32_t>> tables(5);
  std::vector<std::vector<float>> outputs;
  std::mt19937 rng(9);
  // The sequences' cached tokens: seeded values written into every block (what the decode steps
  // attend over is all that matters here, not which prompt made it; computing 780-token prompts
  // op by op twice per preset was most of this test's time on the emulator).
  const KvCacheGeometry& g = kv->geometry();
  std::vector<int32_t> all_blocks(g.num_blocks);
  std::iota(all_blocks.begin(), all_blocks.end(), 0);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> f32(static_cast<size_t>(g.elements_per_layer()));
  std::vector<uint16_t> h16(f32.size());
  for (int64_t l = 0; l < g.num_layers; ++l) {
    for (bool v : {false, true}) {
      for (size_t e = 0; e < f32.size(); ++e) {
        f32[e] = value(rng);
        if (kv_dtype != DType::kF32)
          h16[e] = kv_dtype == DType::kBF16 ? F32ToBf16(f32[e]) : F32ToF16(f32[e]);
      }
      kv->WriteBlocks(v, l, all_blocks,
                      kv_dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : h16.data());
    }
  }
  for (int64_t i = 0; i < 5; ++i) {
    for (int b = 0; b < 64; ++b) tables[i].push_back(static_cast<int32_t>(64 * i + b));
    len[i] = kEmulated ? (i == 4 ? 780 : 16 * (i + 1)) : 300 + 150 * i;
  }
  for (std::vector<int64_t> who :
       {std::vector<int64_t>{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {1, 3, 4}, {0, 1, 2, 3, 4}}) {
    ForwardInput in;
    in.allow_graph = true;
    for (size_t k = 0; k < who.size(); ++k) {
      const int64_t i = who[k];
      in.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      in.seqs.push_back({1, len[i]++, tables[i]});
      in.logits_rows.push_back(static_cast<int32_t>(k));
      in.argmax_only.push_back(k % 2);
    }
    std::vector<float> logits;
    std::vector<int32_t> argmax;
    const absl::Status s = model->runner().Forward(in, kv.get(), &logits, &argmax);
    EXPECT_TRUE(s.ok()) << s;
    logits.insert(logits.end(), argmax.begin(), argmax.end());  // ids are small: exact as floats
    outputs.push_back(std::move(logits));
  }
  EXPECT_TRUE(model->runner().graph_error().empty()) << model->runner().graph_error();
  *num_graphs = model->runner().num_graphs();
  *replays = model->runner().graph_replays();
  EXPECT_TRUE(backend->CheckErrors().ok());
  return outputs;
}

TEST_P(CudaForwardTest, DecodeGraphsMatchOpByOpBitForBit) {
  const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
  size_t eager_graphs = 0, graphs = 0;
  int64_t eager_replays = 0, replays = 0;
  const auto eager = DecodeScript(dir, false, &eager_graphs, &eager_replays);
  const auto replayed = DecodeScript(dir, true, &graphs, &replays);
  EXPECT_EQ(eager_graphs, 0u);
  EXPECT_EQ(graphs, 2u) << "one graph for a batch of 8, one for 4";
  EXPECT_EQ(replays, 2) << "the second and fourth steps replay the graph of 8";
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(eager[i], replayed[i]) << "decode step " << i;
}

// The fusions (CudaTunings::fusion, --cuda-fusion: bias and silu · up in the GEMV; the q|k|v split,
// q/k norms, RoPE and the cache write in one kernel) change no bit of a forward pass. On the
// emulator, which counts kernels, a step runs per layer: one fewer for RoPE, three more for the
// split of several tokens, two for Qwen3's norms; where the GEMV runs (up to kGemvMaxRows tokens)
// one for silu · up, one for the attention bias and two for the residual adds and norms it takes
// in, elsewhere four for the GEMM inputs that the norms, attention and silu · up write already
// rounded; and over a cache of the weights' 16-bit type, where the GEMV runs, the prologue kernel
// too (the q|k|v GEMV's last blocks run it).
TEST_P(CudaForwardTest, FusionsChangeNoBitAndRunFewerKernels) {
  const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
  std::vector<int32_t> tokens(44);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    // Fusions off, on, and on but for the prologue in the q|k|v GEMV (TANDEM_CUDA_GEMV_HEADS=0).
    std::vector<uint64_t> kernels[3];
    std::vector<float> logits[3];
    for (int fusion : {0, 1, 2}) {
      // Off through the options (--cuda-fusion=false), the prologue's through the environment
      // variable, which overrides the options.
      CudaBackend::Options o;
      o.tunings.fusion = fusion > 0;
      if (fusion == 2) ::setenv("TANDEM_CUDA_GEMV_HEADS", "0", 1);
      auto backend = CudaBackend::Create(o);
      ::unsetenv("TANDEM_CUDA_GEMV_HEADS");
      ASSERT_TRUE(backend.ok()) << backend.status();
      logits[fusion] = AllLogits(backend->get(), dir, tokens, &kernels[fusion], kv_dtype);
      EXPECT_TRUE((*backend)->CheckErrors().ok());
    }
    ASSERT_FALSE(logits[0].empty());
    EXPECT_EQ(logits[1], logits[0]) << DTypeName(kv_dtype) << " cache";
    EXPECT_EQ(logits[2], logits[0]) << DTypeName(kv_dtype) << " cache, the prologue kernel";
    if (!kEmulated) continue;
    auto cpu = CpuBackend::Create({}).value();
    const ModelConfig c = LlamaModel::Load(dir, cpu.get()).value()->config();
    const std::vector<int64_t> step_tokens = {16, 16, 8, 1,
                                              1,  1,  1};  // prompt chunks, then decode steps
    ASSERT_EQ(kernels[0].size(), step_tokens.size());
    for (size_t i = 0; i < kernels[0].size(); ++i) {
      const bool gemv = step_tokens[i] <= cuda::kGemvMaxRows;
      const int64_t saved =
          1 + (step_tokens[i] > 1 ? 3 : 0) + (c.qk_norm ? 2 : 0) +
          (gemv ? 3 + (c.attention_bias ? 1 : 0) + (kv_dtype == DType::kBF16 ? 1 : 0) : 4);
      // Every row wants logits: with the GEMV the first and the final norm go into the projections;
      // with cuBLAS the final norm rounds the LM head's input.
      EXPECT_EQ(int64_t(kernels[0][i] - kernels[1][i]),
                saved * c.num_hidden_layers + (gemv ? 2 : 1))
          << "step " << i << ", " << DTypeName(kv_dtype) << " cache";
      EXPECT_EQ(int64_t(kernels[2][i] - kernels[1][i]),
                gemv && kv_dtype == DType::kBF16 ? c.num_hidden_layers : 0)
          << "step " << i << ", " << DTypeName(kv_dtype) << " cache: the prologue kernel a layer";
      if (i == 3) {
        std::printf("%s decode step, %lld layers, %s cache: %llu kernels fused, %llu unfused\n",
                    GetParam().c_str(), static_cast<long long>(c.num_hidden_layers),
                    std::string(DTypeName(kv_dtype)).c_str(),
                    static_cast<unsigned long long>(kernels[1][i]),
                    static_cast<unsigned long long>(kernels[0][i]));
      }
    }
  }
}

// The same without --batch-invariant: decode steps of up to 8 rows run the GEMV with its fused
// norms, biases, activations and residual adds, and the q|k|v prologue kernel, captured in graphs
// and replayed: the bits of the same steps op by op (the GEMV's rows do not depend on the padding
// rows). Mistral's steps keep an f32 cache (the prologue kernel in the graphs); the others a BF16
// one, as on a GPU by default (the q|k|v GEMV's last blocks running the prologue, its counters
// reset at each replay).
TEST_P(CudaForwardTest, FusedDecodeGraphsMatchOpByOpBitForBit) {
  const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
  const DType kv_dtype = GetParam() == "tiny-mistral" ? DType::kF32 : DType::kBF16;
  size_t eager_graphs = 0, graphs = 0;
  int64_t eager_replays = 0, replays = 0;
  const auto eager =
      DecodeScript(dir, false, &eager_graphs, &eager_replays, /*batch_invariant=*/false, kv_dtype);
  const auto replayed =
      DecodeScript(dir, true, &graphs, &replays, /*batch_invariant=*/false, kv_dtype);
  EXPECT_EQ(graphs, 2u);
  EXPECT_EQ(replays, 2);
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(eager[i], replayed[i]) << "decode step " << i;
}

TEST_P(CudaForwardTest, MatchesCpuInF32) { CompareModels(GetParam(), DType::kF32); }
TEST_P(CudaForwardTest, MatchesCpuInBf16) { CompareModels(GetParam(), DType::kBF16); }
TEST_P(CudaForwardTest, MatchesCpuInF16) { CompareModels(GetParam(), DType::kF16); }
TEST_P(CudaForwardTest, BF16WeightsComputedInF16MatchTheCpuEightTimesCloser) {
  CompareModels(GetParam(), DType::kBF16, DType::kF16);
  // An auto KV cache takes the type the weights are kept in.
  CudaBackend::Options o;
  o.compute_dtype = DType::kF16;
  auto gpu = CudaBackend::Create(o).value();
  auto model =
      LlamaModel::Load(testing_util::TinyModel(GetParam(), 7, DType::kBF16), gpu.get()).value();
  EXPECT_EQ(model->KvCacheDType(std::nullopt), DType::kF16);
}

// Quantized projections on the GPU keep their codes (quant_gemv.h): decode steps read them in the
// dequantizing GEMV, prefill chunks through a 16-bit dequantized copy and cuBLAS; the logits are
// the CPU's (which reads the codes too) within BF16's bounds, and the weights take the CPU's bytes.
TEST_P(CudaForwardTest, QuantizedWeightsKeepTheirCodes) {
  for (QuantType type : {QuantType::kInt8, QuantType::kInt4}) {
    CompareModels(GetParam(), DType::kBF16, std::nullopt, false, type);
    auto gpu = CudaBackend::Create({}).value();
    auto cpu = CpuBackend::Create({}).value();
    const std::string dir = testing_util::TinyModel(GetParam(), 7, DType::kBF16);
    LlamaLoadOptions load;
    load.quantization = type;
    const int64_t gpu_bytes = LlamaModel::Load(dir, gpu.get(), load).value()->weight_bytes();
    EXPECT_EQ(gpu_bytes, LlamaModel::Load(dir, cpu.get(), load).value()->weight_bytes());
    EXPECT_LT(gpu_bytes, LlamaModel::Load(dir, gpu.get()).value()->weight_bytes());
  }
  // The LM head quantized too (--quantize-lm-head): the same GEMV reads its codes.
  CompareModels(GetParam(), DType::kBF16, std::nullopt, false, QuantType::kInt4,
                /*quantize_lm_head=*/true);
}

// An FP8 E4M3 KV cache through the whole model (prefill chunks, then decode steps): E4M3 keeps 3
// mantissa bits (up to 1/16 of a key or value), so the distributions move (on these random tiny
// models by up to about 0.1), but clear choices stay. On tiny-qwen3 (GQA, q/k norms), the preset
// that moves most.
TEST(CudaFp8KvCacheTest, StaysCloseToTheF32Cache) {
  auto gpu = CudaBackend::Create({}).value();
  const std::string dir = testing_util::TinyModel("tiny-qwen3", 7, DType::kBF16);
  const int64_t vocab = LlamaModel::Load(dir, gpu.get()).value()->config().vocab_size;
  std::vector<int32_t> tokens(48);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  const auto a = AllLogits(gpu.get(), dir, tokens, nullptr, DType::kF32),
             b = AllLogits(gpu.get(), dir, tokens, nullptr, DType::kF8E4M3);
  ASSERT_EQ(a.size(), tokens.size() * vocab);
  ASSERT_EQ(b.size(), a.size());
  float max_dp = 0;
  bool differs = false;
  int clear_rows = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    const float mx = *std::max_element(x, x + vocab), my = *std::max_element(y, y + vocab);
    std::vector<float> sorted(x, x + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 0.5f) {  // a clear choice keeps its top-1
      ++clear_rows;
      EXPECT_EQ(std::max_element(x, x + vocab) - x, std::max_element(y, y + vocab) - y)
          << "row " << r;
    }
    double sx = 0, sy = 0;
    for (int64_t i = 0; i < vocab; ++i) sx += std::exp(x[i] - mx), sy += std::exp(y[i] - my);
    for (int64_t i = 0; i < vocab; ++i) {
      differs = differs || x[i] != y[i];
      max_dp = std::max(max_dp, static_cast<float>(std::fabs(std::exp(x[i] - mx) / sx -
                                                             std::exp(y[i] - my) / sy)));
    }
  }
  std::printf(
      "tiny-qwen3 FP8 KV cache: max |Δp| %.3g against the f32 cache, top-1 kept on %d "
      "clear rows\n",
      max_dp, clear_rows);
  EXPECT_TRUE(differs) << "the cache stored FP8";
  EXPECT_LE(max_dp, 0.15f);
  EXPECT_GE(clear_rows, 8);
}

TEST_P(CudaForwardTest, SplitGemmInputsOverBF16WeightsMatchTheCpuAsF32Does) {
  CompareModels(GetParam(), DType::kBF16, std::nullopt, /*split_inputs=*/true);
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaForwardTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

#ifdef TANDEM_CUDA_EMULATED
// A step's host calls as a line, for failure messages: U upload, L launch, R read, W wait.
std::string Pattern(const std::vector<tandem_emu::HostCallEntry>& log) {
  std::string out;
  for (const auto& e : log) {
    out += e.kind == tandem_emu::HostCall::kUpload   ? 'U'
           : e.kind == tandem_emu::HostCall::kLaunch ? 'L'
           : e.kind == tandem_emu::HostCall::kRead   ? 'R'
                                                     : 'W';
  }
  for (const auto& e : log) {
    if (e.kind == tandem_emu::HostCall::kWait) out += std::string(" ") + e.what;
  }
  return out;
}

// The "no host synchronisation inside a step beyond reading sampled tokens": once a decode
// step's first kernel is enqueued, the host neither waits for the device nor uploads anything until
// it reads the step's results, and then enqueues nothing more; `reads` copies come back (one for
// greedy rows' tokens, one for sampled rows' candidates). The step's inputs go up before its first
// launch, while the device is idle.
void ExpectWaitsOnlyToRead(const std::vector<tandem_emu::HostCallEntry>& log, int reads,
                           const std::string& step) {
  using tandem_emu::HostCall;
  const std::string pattern = Pattern(log);
  const auto first_launch = std::find_if(log.begin(), log.end(),
                                         [](const auto& e) { return e.kind == HostCall::kLaunch; });
  ASSERT_NE(first_launch, log.end()) << step << ": " << pattern;
  const auto first_read = std::find_if(first_launch, log.end(),
                                       [](const auto& e) { return e.kind == HostCall::kRead; });
  ASSERT_NE(first_read, log.end()) << step << ": " << pattern;
  for (auto e = first_launch; e != first_read; ++e) {
    EXPECT_EQ(e->kind, HostCall::kLaunch)
        << step << ": a host " << (e->kind == HostCall::kWait ? "wait" : "upload") << " ("
        << e->what << ") inside the step: " << pattern;
  }
  for (auto e = first_read; e != log.end(); ++e) {
    EXPECT_NE(e->kind, HostCall::kLaunch)
        << step << ": " << e->what << " enqueued after the step's results were read: " << pattern;
  }
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const auto& e) { return e.kind == HostCall::kRead; }),
            reads)
      << step << ": " << pattern;
}

TEST(CudaDecodeStepTest, WaitsForTheDeviceOnlyToReadTheStepsTokens) {
  auto backend = CudaBackend::Create({}).value();
  auto model =
      LlamaModel::Load(testing_util::TinyModel("tiny-qwen3", 7, DType::kBF16), backend.get())
          .value();
  auto kv = KvCacheStorage::Create(backend.get(),
                                   model->KvGeometry(64, 16, model->KvCacheDType(std::nullopt)))
                .value();
  const int64_t vocab = model->config().vocab_size;
  std::vector<std::vector<int32_t>> tables = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  std::vector<int64_t> len = {0, 0, 0};
  std::mt19937 rng(4);
  struct Step {
    std::string name;
    bool graphs = true;
    std::vector<size_t> seqs = {0, 1};  // which sequences, one new token each
    int64_t prompt = 0;                 // and a prompt chunk of this many tokens first
    size_t prompt_seq = 2;              // of this sequence
    std::vector<bool> sampled = {};     // rows that want top-8 candidates (the others their argmax)
    std::vector<bool> logprobs = {};    // greedy rows that want their token's logprobs (top 2)
    bool layer_listener = false;        // the prefill role's per-layer callback
    int reads = 1;                      // copies back expected
    bool log = true;
  };
  auto run = [&](const Step& st) {
    model->runner().set_use_graphs(st.graphs);
    ForwardInput in;
    in.allow_graph = true;
    if (st.prompt > 0) {
      for (int64_t t = 0; t < st.prompt; ++t)
        in.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      in.seqs.push_back({st.prompt, len[st.prompt_seq], tables[st.prompt_seq]});
      len[st.prompt_seq] += st.prompt;
      in.logits_rows.push_back(static_cast<int32_t>(st.prompt - 1));
      in.argmax_only.push_back(1);
      in.sample_top_k.push_back(0);
      in.logprob_tokens.push_back(ForwardInput::kNoLogprobs);
    }
    for (size_t k = 0; k < st.seqs.size(); ++k) {
      const size_t i = st.seqs[k];
      in.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      in.seqs.push_back({1, len[i]++, tables[i]});
      in.logits_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
      const bool sampled = k < st.sampled.size() && st.sampled[k];
      in.argmax_only.push_back(sampled ? 0 : 1);
      in.sample_top_k.push_back(sampled ? 8 : 0);
      in.logprob_tokens.push_back(
          k < st.logprobs.size() && st.logprobs[k] ? -1 : ForwardInput::kNoLogprobs);
    }
    if (st.sampled.empty()) in.sample_top_k.clear();
    if (st.logprobs.empty()) in.logprob_tokens.clear();
    in.logprob_top_k = st.logprobs.empty() ? 0 : 2;
    int64_t layers_done = 0;
    if (st.layer_listener) in.on_layer_done = [&](int64_t) { ++layers_done; };
    std::vector<float> logits;
    std::vector<int32_t> argmax;
    std::vector<std::optional<RowLogprobs>> lp;
    DeviceSamples samples;
    if (st.log) tandem_emu::StartHostLog();
    const absl::Status s = model->runner().Forward(in, kv.get(), &logits, &argmax, &lp, &samples);
    const std::vector<tandem_emu::HostCallEntry> calls = tandem_emu::TakeHostLog();
    ASSERT_TRUE(s.ok()) << st.name << ": " << s;
    EXPECT_TRUE(logits.empty()) << st.name << ": no row needs its logits on the host";
    if (st.layer_listener) {
      EXPECT_EQ(layers_done, model->config().num_hidden_layers) << st.name;
    }
    if (!in.logprob_tokens.empty()) {
      ASSERT_EQ(lp.size(), in.logits_rows.size()) << st.name;
      for (size_t r = 0; r < lp.size(); ++r) {
        EXPECT_EQ(lp[r].has_value(), in.logprob_tokens[r] != ForwardInput::kNoLogprobs)
            << st.name << " row " << r;
        if (lp[r].has_value()) {
          EXPECT_EQ(lp[r]->token, argmax[r]) << st.name << " row " << r;
        }
      }
    }
    if (st.log) ExpectWaitsOnlyToRead(calls, st.reads, st.name);
  };
  run({.name = "prompt of sequence 0",
       .graphs = false,
       .seqs = {},
       .prompt = 16,
       .prompt_seq = 0,
       .log = false});
  run({.name = "prompt of sequence 1",
       .graphs = false,
       .seqs = {},
       .prompt = 24,
       .prompt_seq = 1,
       .log = false});
  run({.name = "greedy, captured", .log = false});
  run({.name = "greedy, a graph replayed"});
  run({.name = "greedy, op by op", .graphs = false});
  // The first step of a kind allocates its buffers (and zeroes them: a memset enqueued before the
  // step).
  run({.name = "top-k, the sampling buffer's first use", .sampled = {true, true}, .log = false});
  run({.name = "top-k, a graph replayed", .sampled = {true, true}});
  run({.name = "top-k and greedy, a graph replayed", .sampled = {true, false}, .reads = 2});
  run({.name = "top-k, op by op", .graphs = false, .sampled = {true, true}});
  run({.name = "greedy with logprobs, the logprobs buffer's first use",
       .logprobs = {true, true},
       .log = false});
  run({.name = "greedy with logprobs, a graph replayed", .logprobs = {true, true}, .reads = 2});
  run({.name = "top-k and greedy with logprobs, a graph replayed",
       .sampled = {true, false},
       .logprobs = {false, true},
       .reads = 3});
  run({.name = "a prompt chunk beside a decode row", .seqs = {0}, .prompt = 8});
  run({.name = "a prompt chunk, the prefill role's layer callbacks",
       .seqs = {},
       .prompt = 8,
       .layer_listener = true});
  EXPECT_EQ(model->runner().graph_replays(), 7)
      << "one graph, captured by the first decode step, replayed by the others";
  EXPECT_TRUE(model->runner().graph_error().empty()) << model->runner().graph_error();
  EXPECT_TRUE(backend->CheckErrors().ok());
}
#endif

}  // namespace
}  // namespace tandem::cuda_test
