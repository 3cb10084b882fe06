// The KV memory plan of a backend that reports device memory (as CUDA does): weights, then a
// profiled activation peak, then the KV block pool from gpu_memory_utilization. The device here is
// the CPU backend under an accounting wrapper that counts every byte the model and engine allocate
// against a pretend capacity, so the plan's arithmetic and its promise (the largest step never
// takes memory past the budget) are checked without a GPU.
#include <algorithm>
#include <memory>

#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/memory_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/forwarding_backend.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Every op on a CPU backend; Memory() reports `capacity` minus what is allocated through it
// (2-D weights count as uploaded) and the high-water mark is kept.
class AccountingBackend final : public ForwardingBackend {
 public:
  explicit AccountingBackend(int64_t capacity) : capacity_(capacity) {}

  int64_t used() const { return used_; }
  int64_t peak() const { return peak_; }
  void set_capacity(int64_t c) { capacity_ = c; }

  std::string name() const override { return "accounting"; }
  std::string device_description() const override { return "cpu with a pretend memory capacity"; }
  absl::StatusOr<DeviceMemory> Memory() override {
    return DeviceMemory{capacity_ - used_ - others_, capacity_, used_};
  }
  // Memory held by other processes on the pretend device.
  void set_others(int64_t bytes) { others_ = bytes; }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override {
    if (used_ + others_ + static_cast<int64_t>(bytes) > capacity_)
      return absl::ResourceExhaustedError("pretend device is full");
    auto inner = cpu_->Allocate(bytes);
    if (!inner.ok()) return inner.status();
    Charge(static_cast<int64_t>(bytes));
    return std::unique_ptr<DeviceBuffer>(
        new Counted(std::move(*inner), this, static_cast<int64_t>(bytes)));
  }
  absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& t) override {
    Charge(static_cast<int64_t>(t.nbytes));
    return cpu_->UploadWeight(t);
  }

 private:
  class Counted final : public DeviceBuffer {
   public:
    Counted(std::unique_ptr<DeviceBuffer> inner, AccountingBackend* owner, int64_t bytes)
        : inner_(std::move(inner)), owner_(owner), bytes_(bytes) {}
    ~Counted() override { owner_->used_ -= bytes_; }
    void* data() override { return inner_->data(); }
    size_t size() const override { return inner_->size(); }

   private:
    std::unique_ptr<DeviceBuffer> inner_;
    AccountingBackend* owner_;
    int64_t bytes_;
  };
  void Charge(int64_t bytes) {
    used_ += bytes;
    peak_ = std::max(peak_, used_);
  }

  int64_t capacity_;
  int64_t used_ = 0;
  int64_t others_ = 0;
  int64_t peak_ = 0;
};

class MemoryPlanTest : public ::testing::Test {
 protected:
  static constexpr int64_t kCapacity = int64_t{64} << 20;
  void SetUp() override {
    backend_ = std::make_unique<AccountingBackend>(kCapacity);
    model_ = LlamaModel::Load(testing_util::TinyModel("tiny-llama", 5), backend_.get()).value();
    weights_ = backend_->used();
  }
  EngineOptions Options(double util) {
    EngineOptions o;
    o.block_size = 16;
    o.gpu_memory_utilization = util;
    o.scheduler.max_num_batched_tokens = 512;
    o.scheduler.max_num_seqs = 32;
    return o;
  }

  std::unique_ptr<AccountingBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
  int64_t weights_ = 0;
};

TEST_F(MemoryPlanTest, KvPoolFillsTheBudgetLeftByWeightsAndActivations) {
  ASSERT_GT(weights_, 0);
  const double util = 0.5;
  auto engine = Engine::Create(model_.get(), Options(util));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t budget = static_cast<int64_t>(util * kCapacity);
  const int64_t per_block = KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 16));
  const int64_t kv_bytes = (*engine)->stats().num_blocks * per_block;
  // The profile grew the activation buffers before the pool was sized: weights + activations + KV.
  EXPECT_GT(backend_->used() - weights_ - kv_bytes, 0) << "no activation memory was profiled";
  EXPECT_LE(backend_->used(), budget);
  EXPECT_GT(backend_->used() + per_block, budget)
      << "the pool leaves a whole block of the budget unused";
}

// Runs `requests` to completion; returns the largest step in tokens.
int64_t RunAll(Engine* engine, const std::vector<EngineRequest>& requests) {
  for (const EngineRequest& r : requests) EXPECT_TRUE(engine->AddRequest(r).ok());
  int64_t largest = 0;
  for (int guard = 0; engine->HasWork() && guard < 10000; ++guard) {
    EXPECT_TRUE(engine->Step().ok());
    largest = std::max(largest, engine->stats().last_step_tokens);
  }
  return largest;
}

std::vector<EngineRequest> Requests(int n, int prompt_len, int prompt_logprobs = -1) {
  std::vector<EngineRequest> out;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt_token_ids.assign(prompt_len, static_cast<int32_t>(i + 1));
    r.params.max_tokens = 4;
    r.params.prompt_logprobs = prompt_logprobs;
    out.push_back(r);
  }
  return out;
}

TEST_F(MemoryPlanTest, LargestStepStaysWithinTheBudget) {
  const double util = 0.5;
  auto engine = Engine::Create(model_.get(), Options(util)).value();
  // 32 requests whose prompts add up to more than the 512-token step budget.
  EXPECT_EQ(RunAll(engine.get(), Requests(32, 40)), 512);
  EXPECT_LE(backend_->peak(), static_cast<int64_t>(util * kCapacity));
}

TEST_F(MemoryPlanTest, FullStepOfShortSequencesStaysWithinTheBudget) {
  // max_model_len far below the step budget: a full step spreads over many sequences.
  EngineOptions o = Options(0.5);
  o.scheduler.max_model_len = 64;
  auto engine = Engine::Create(model_.get(), o).value();
  EXPECT_EQ(RunAll(engine.get(), Requests(32, 40)), 512);
  EXPECT_LE(backend_->peak(), static_cast<int64_t>(0.5 * kCapacity));
}

TEST_F(MemoryPlanTest, PromptLogprobsOverAWholeChunkStayWithinTheBudget) {
  // Logits for every prompt position of a 500-token chunk.
  auto engine = Engine::Create(model_.get(), Options(0.5)).value();
  EXPECT_GE(RunAll(engine.get(), Requests(1, 500, /*prompt_logprobs=*/0)), 500);
  EXPECT_LE(backend_->peak(), static_cast<int64_t>(0.5 * kCapacity));
}

TEST_F(MemoryPlanTest, OtherProcessesLimitThePoolOnlyThroughFreeMemory) {
  const int64_t per_block = KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 16));
  // Another process holds 20 MiB: this engine's share (half of 64 MiB) is still all its own.
  backend_->set_others(int64_t{20} << 20);
  const int64_t blocks_alone = [&] {
    auto e = Engine::Create(model_.get(), Options(0.5)).value();
    EXPECT_GT(backend_->used() + per_block, static_cast<int64_t>(0.5 * kCapacity));
    return e->stats().num_blocks;
  }();
  // Another holds 50 MiB: what is free, less a little slack, caps the pool below the share.
  backend_->set_others(int64_t{50} << 20);
  auto engine = Engine::Create(model_.get(), Options(0.5)).value();
  EXPECT_LT(engine->stats().num_blocks, blocks_alone);
  EXPECT_LE(backend_->used() + (int64_t{50} << 20), kCapacity);
}

TEST_F(MemoryPlanTest, TooSmallAUtilizationIsRefusedWithTheNumbers) {
  const double util = static_cast<double>(weights_) / kCapacity;  // the weights alone fill it
  auto engine = Engine::Create(model_.get(), Options(util));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(engine.status().message(), HasSubstr("leaves no room for the KV cache"));
}

TEST_F(MemoryPlanTest, UtilizationOutsideTheUnitIntervalIsRejected) {
  for (double util : {0.0, -0.5, 1.5}) {
    auto engine = Engine::Create(model_.get(), Options(util));
    ASSERT_FALSE(engine.ok()) << util;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(engine.status().message(), HasSubstr("--gpu-memory-utilization"));
  }
}

TEST_F(MemoryPlanTest, ExplicitKvCacheMemoryWins) {
  EngineOptions o = Options(0.5);
  const int64_t per_block = KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 16));
  o.kv_cache_memory = 40 * per_block;
  auto engine = Engine::Create(model_.get(), o).value();
  EXPECT_EQ(engine->stats().num_blocks, 40);
}

// `tandem plan`'s arithmetic (common/model/memory_plan.h), from headers alone, against what loading
// the model and creating the engine with the same settings give.
struct PlanCase {
  std::string preset;
  QuantType type;
};

class PlanMatchesTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanMatchesTest, WeightsAndPoolEqualWhatTheModelAndEngineAllocate) {
  const std::string dir = testing_util::TinyModel(GetParam().preset, 5);
  auto cpu = CpuBackend::Create({}).value();
  LlamaLoadOptions load;
  load.quantization = GetParam().type;
  auto model = LlamaModel::Load(dir, cpu.get(), load).value();
  int64_t stored = 0;
  EXPECT_EQ(PlannedWeightBytes(dir, GetParam().type, &stored).value(), model->weight_bytes());
  for (const auto& [block, kv] :
       {std::pair{int64_t{16}, DType::kF32}, std::pair{int64_t{5}, DType::kF32},
        std::pair{int64_t{16}, DType::kI8}, std::pair{int64_t{5}, DType::kI8}}) {
    MemoryPlanOptions o;
    o.quantization = GetParam().type;
    o.kv_dtype = kv;
    o.block_size = block;
    o.max_model_len = 300;
    o.max_num_seqs = 16;
    o.max_num_batched_tokens = 256;
    o.memory = int64_t{24} << 20;
    const MemoryPlan p = PlanMemory(dir, o).value();
    EXPECT_EQ(p.weight_bytes, model->weight_bytes());
    EXPECT_EQ(p.stored_weight_bytes, stored);
    const ModelConfig& c = model->config();
    // f32: 4 bytes an element; int8: one, and a 4-byte scale per token and head.
    EXPECT_EQ(p.kv_bytes_per_token, 2 * c.num_hidden_layers * c.num_key_value_heads *
                                        (kv == DType::kI8 ? c.head_dim + 4 : c.head_dim * 4));
    EXPECT_EQ(p.kv_cache_bytes, o.memory - p.weight_bytes - p.activation_reserve_bytes);
    // A worker given the planned pool with the same settings allocates exactly it.
    EngineOptions e;
    e.block_size = block;
    e.kv_cache_dtype = kv;
    e.kv_cache_memory = p.kv_cache_bytes;
    e.scheduler.max_model_len = o.max_model_len;
    e.scheduler.max_num_seqs = o.max_num_seqs;
    e.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    auto engine = Engine::Create(model.get(), e).value();
    EXPECT_EQ(engine->stats().num_blocks, p.num_blocks);
    EXPECT_EQ(engine->stats().max_model_len, p.max_model_len);
    EXPECT_EQ(p.max_concurrent_sequences, p.num_blocks / ((300 + block - 1) / block));
    EXPECT_EQ(p.sequences_by_length.back(),
              std::make_pair(p.max_model_len, p.max_concurrent_sequences));
  }
}

TEST_P(PlanMatchesTest, TheActivationReserveCoversTheProfiledPeak) {
  // The accounting backend's profile (what a GPU engine measures) against the plan's estimate.
  const std::string dir = testing_util::TinyModel(GetParam().preset, 5);
  AccountingBackend backend(int64_t{256} << 20);
  LlamaLoadOptions load;
  load.quantization = GetParam().type;
  auto model = LlamaModel::Load(dir, &backend, load).value();
  const int64_t before = backend.used();
  EngineOptions e;
  e.block_size = 16;
  e.kv_cache_memory = 64 * KvCacheStorage::BytesPerBlock(model->KvGeometry(1, 16));
  e.scheduler.max_num_batched_tokens = 256;
  e.scheduler.max_num_seqs = 16;
  auto engine = Engine::Create(model.get(), e).value();
  // Run the largest step: 256 prompt tokens with logits for every row.
  EngineRequest r;
  r.id = "big";
  r.prompt_token_ids.assign(256, 1);
  r.params.max_tokens = 1;
  r.params.prompt_logprobs = 0;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  while (engine->HasWork()) ASSERT_TRUE(engine->Step().ok());
  const int64_t activations = backend.peak() - before - e.kv_cache_memory;
  MemoryPlanOptions o;
  o.quantization = GetParam().type;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.memory = int64_t{1} << 30;
  const MemoryPlan p = PlanMemory(dir, o).value();
  EXPECT_GE(p.activation_reserve_bytes, activations);
  EXPECT_LE(p.activation_reserve_bytes, 3 * std::max<int64_t>(activations, 1));
}

TEST(PlanTest, TooLittleMemoryIsRefusedWithTheNumbers) {
  MemoryPlanOptions o;
  o.memory = 1 << 20;
  const absl::Status s = PlanMemory(testing_util::TinyModel("tiny-llama", 5), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("holds no KV cache"));
  EXPECT_EQ(SequencesThatFit(10, 16, 33), 3);  // 3 blocks each
  EXPECT_EQ(SequencesThatFit(10, 16, 32), 5);
}

INSTANTIATE_TEST_SUITE_P(Presets, PlanMatchesTest,
                         ::testing::Values(PlanCase{"tiny-llama", QuantType::kNone},
                                           PlanCase{"tiny-llama", QuantType::kInt8},
                                           PlanCase{"tiny-qwen2", QuantType::kInt4},
                                           PlanCase{"tiny-qwen3", QuantType::kInt4},
                                           PlanCase{"tiny-mistral", QuantType::kInt8}),
                         [](const ::testing::TestParamInfo<PlanCase>& info) {
                           std::string n = info.param.preset + "_" +
                                           std::string(QuantTypeName(info.param.type));
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace tandem
