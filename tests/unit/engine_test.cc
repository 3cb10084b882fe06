// The engine end to end on the tiny presets: batch invariance under chunking and preemption, prefix
// reuse with identical logprobs, aborts in every phase, validation, and no leaked KV blocks.
#include "common/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>

#include "cli/presets.h"
#include "cli/random_model.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/base/argmax.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/forwarding_backend.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

std::string MakeModel(const std::string& preset) { return testing_util::TinyModel(preset, 3); }

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    model_ = LlamaModel::Load(MakeModel(GetParam()), backend_.get()).value();
  }

  std::unique_ptr<Engine> MakeEngine(int64_t kv_blocks, int64_t budget, int64_t chunk,
                                     bool caching = true, int64_t max_seqs = 64,
                                     DType kv_dtype = DType::kF32) {
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_dtype = kv_dtype;
    o.kv_cache_memory =
        kv_blocks * KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4, kv_dtype));
    o.enable_prefix_caching = caching;
    o.scheduler.max_num_batched_tokens = budget;
    o.scheduler.max_prefill_chunk = chunk;
    o.scheduler.max_num_seqs = max_seqs;
    o.scheduler.max_model_len = 256;
    o.max_logprobs = 1024;
    return Engine::Create(model_.get(), o).value();
  }

  // An engine of 64 blocks of 4 tokens in a prefill or decode role.
  std::unique_ptr<Engine> RoleEngine(SchedulerRole role, int64_t kv_blocks = 64) {
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_memory = kv_blocks * KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4));
    o.scheduler.role = role;
    return Engine::Create(model_.get(), o).value();
  }

  // Runs the engine until idle; returns each request's tokens (and its outputs).
  std::map<std::string, std::vector<int32_t>> RunAll(
      Engine* e, std::map<std::string, std::vector<RequestOutput>>* all = nullptr) {
    std::map<std::string, std::vector<int32_t>> tokens;
    for (int guard = 0; e->HasWork() && guard < 100000; ++guard) {
      auto outs = e->Step();
      EXPECT_TRUE(outs.ok()) << outs.status();
      if (!outs.ok()) break;
      for (auto& o : *outs) {
        auto& t = tokens[o.id];
        t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (all) (*all)[o.id].push_back(o);
      }
    }
    return tokens;
  }

  // A request `id` of a random prompt of n tokens, with EOS ignored and max_tokens output tokens.
  EngineRequest Request(const std::string& id, int n, uint32_t seed, int32_t max_tokens) {
    EngineRequest r;
    r.id = id;
    r.prompt_token_ids = Prompt(n, seed);
    r.params.ignore_eos = true;
    r.params.max_tokens = max_tokens;
    return r;
  }

  std::vector<int32_t> Prompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = static_cast<int32_t>(rng() % model_->config().vocab_size);
    return p;
  }

  // Greedy requests run together (a 32-token budget, 8-token prompt chunks, a pool of
  // `together_blocks` too small for all at once, so some are preempted) give each request the same
  // tokens as running it alone in a roomy engine.
  void ExpectBatchInvariance(int requests, uint32_t seed, int64_t together_blocks, DType kv_dtype) {
    std::vector<EngineRequest> reqs;
    std::mt19937 rng(seed);
    for (int i = 0; i < requests; ++i) {
      EngineRequest r;
      r.id = "r" + std::to_string(i);
      r.prompt_token_ids = Prompt(1 + static_cast<int>(rng() % 40), seed * 10 + i);
      r.params.temperature = 0;
      r.params.ignore_eos = true;
      r.params.max_tokens = 1 + static_cast<int32_t>(rng() % 12);
      reqs.push_back(r);
    }
    auto together = MakeEngine(together_blocks, /*budget=*/32, /*chunk=*/8, true, 64, kv_dtype);
    EXPECT_EQ(together->kv_storage()->geometry().dtype, kv_dtype);
    for (const auto& r : reqs) ASSERT_TRUE(together->AddRequest(r).ok());
    const auto batched = RunAll(together.get());
    EXPECT_GT(together->stats().preemptions, 0) << "the test should force preemption";
    EXPECT_EQ(together->stats().free_blocks, together_blocks);
    for (const auto& r : reqs) {
      auto alone = MakeEngine(/*kv_blocks=*/64, /*budget=*/512, /*chunk=*/0, /*caching=*/false, 64,
                              kv_dtype);
      ASSERT_TRUE(alone->AddRequest(r).ok());
      const auto solo = RunAll(alone.get());
      ASSERT_EQ(batched.at(r.id), solo.at(r.id)) << r.id;
      EXPECT_EQ(batched.at(r.id).size(), static_cast<size_t>(r.params.max_tokens));
    }
  }

  // `reqs` through an engine of 64 blocks of 4 tokens over this preset loaded on `backend`; budget
  // and chunk 0: the scheduler's defaults.
  std::map<std::string, std::vector<int32_t>> RunOn(
      Backend* backend, const std::vector<EngineRequest>& reqs, int64_t budget = 0,
      int64_t chunk = 0, std::map<std::string, std::vector<RequestOutput>>* all = nullptr,
      EngineStats* stats = nullptr) {
    auto model = LlamaModel::Load(MakeModel(GetParam()), backend).value();
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_memory = 64 * KvCacheStorage::BytesPerBlock(model->KvGeometry(1, 4));
    if (budget > 0) o.scheduler.max_num_batched_tokens = budget;
    if (chunk > 0) o.scheduler.max_prefill_chunk = chunk;
    o.device_sampling = device_sampling_;
    auto engine = Engine::Create(model.get(), o).value();
    for (const auto& r : reqs) EXPECT_TRUE(engine->AddRequest(r).ok());
    auto tokens = RunAll(engine.get(), all);
    if (stats != nullptr) *stats = engine->stats();
    return tokens;
  }

  // Moves handed-out request `id`'s KV (its first num_tokens tokens' blocks) from a prefill-role
  // engine into blocks the decode-role engine reserves for it: the transport's job, done by hand.
  static void HandOver(Engine* prefill, Engine* decode, const std::string& id, int64_t num_tokens) {
    const std::vector<int32_t> src = prefill->block_table(id);
    const std::vector<int32_t> dst = decode->Reserve(id, num_tokens).value();
    ASSERT_EQ(src.size(), dst.size());
    const KvCacheGeometry g = prefill->kv_storage()->geometry();
    for (int64_t l = 0; l < g.num_layers; ++l) {
      for (size_t b = 0; b < src.size(); ++b) {
        const int64_t from = l * g.elements_per_layer() + src[b] * g.elements_per_block();
        const int64_t to = l * g.elements_per_layer() + dst[b] * g.elements_per_block();
        std::copy_n(static_cast<float*>(prefill->kv_storage()->k_data()) + from,
                    g.elements_per_block(),
                    static_cast<float*>(decode->kv_storage()->k_data()) + to);
        std::copy_n(static_cast<float*>(prefill->kv_storage()->v_data()) + from,
                    g.elements_per_block(),
                    static_cast<float*>(decode->kv_storage()->v_data()) + to);
      }
    }
    ASSERT_TRUE(prefill->Release(id).ok());
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
  bool device_sampling_ = true;  // RunOn's EngineOptions::device_sampling
};

TEST_P(EngineTest, BatchInvarianceUnderChunkingAndPreemption) {
  ExpectBatchInvariance(/*requests=*/64, /*seed=*/17, /*together_blocks=*/48, DType::kF32);
}

// A BF16 KV cache: half the bytes a block, and still the same tokens for a request alone or
// batched, chunked and preempted (keys and values are rounded once, when written).
TEST_P(EngineTest, Bf16KvCacheHalvesTheBlockAndKeepsBatchInvariance) {
  EXPECT_EQ(2 * KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4, DType::kBF16)),
            KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4)));
  ExpectBatchInvariance(/*requests=*/16, /*seed=*/23, /*together_blocks=*/24, DType::kBF16);
}

// An int8 KV cache: a quarter of the f32 block plus a scale per token and head, and the same
// batch invariance (each token's codes and scales depend on that token alone).
TEST_P(EngineTest, Int8KvCacheQuartersTheBlockAndKeepsBatchInvariance) {
  const KvCacheGeometry g = model_->KvGeometry(1, 4, DType::kI8);
  EXPECT_EQ(KvCacheStorage::BytesPerBlock(g),
            2 * g.num_layers * 4 * g.num_kv_heads * (g.head_dim + 4));
  ExpectBatchInvariance(/*requests=*/16, /*seed=*/29, /*together_blocks=*/24, DType::kI8);
}

// A CPU backend standing in for a device: counts the copies to the host of whole rows of logits (a
// size that is a multiple of a row's; the sampling results never are, in these tests).
class RowCountingBackend : public ForwardingBackend {
 public:
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (bytes >= row_bytes && bytes % row_bytes == 0) ++row_copies;  // rows of logits came back
    cpu_->CopyToHost(dst, src, bytes);
  }
  int calls = 0;
  size_t row_bytes = SIZE_MAX;
  int row_copies = 0;
};

// DeviceSampler::Logprobs as the CUDA backend computes it, here with the sampler's own
// ComputeLogprobs.
void HostLogprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens, int32_t top_k,
                  int32_t* token_out, float* logprob, int32_t* rank, int32_t* top_ids,
                  float* top_logprobs) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * d;
    if (tokens[i] == -2) continue;  // asked for nothing
    const int32_t token = tokens[i] >= 0 ? tokens[i] : ArgmaxRow(row, d);
    const LogprobEntry e = ComputeLogprobs(row, d, token, top_k);
    token_out[i] = e.token_id;
    logprob[i] = e.logprob;
    rank[i] = static_cast<int32_t>(e.rank);
    for (int32_t k = 0; k < top_k; ++k) {
      top_ids[i * top_k + k] = e.top[k].token_id;
      top_logprobs[i * top_k + k] = e.top[k].logprob;
    }
  }
}

// A backend that computes logprobs where the logits are: the engine's device-logprobs path on the
// CPU.
class DeviceLogprobsBackend final : public RowCountingBackend, public DeviceSampler {
 public:
  DeviceSampler* sampler() override { return this; }
  bool SupportsLogprobs() const override { return true; }
  void Logprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens, int32_t top_k,
                int32_t* token_out, float* logprob, int32_t* rank, int32_t* top_ids,
                float* top_logprobs) override {
    ++calls;
    HostLogprobs(logits, n, d, tokens, top_k, token_out, logprob, rank, top_ids, top_logprobs);
  }
};

// A backend that samples where the logits are, as the CUDA one does, here on the host: candidates
// by a plain sort, edits by ApplyLogitEdit, totals and draws by the sampler's definitions
// (RowWeightTotal, DrawFromRow): the engine's device sampling path on the CPU.
class DeviceSamplingBackend final : public RowCountingBackend, public DeviceSampler {
 public:
  DeviceSampler* sampler() override { return this; }
  bool SupportsSampling() const override { return true; }
  // With logprobs where the logits are too (the CUDA backend has both).
  bool SupportsLogprobs() const override { return with_logprobs; }
  void Logprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens, int32_t top_k,
                int32_t* token_out, float* logprob, int32_t* rank, int32_t* top_ids,
                float* top_logprobs) override {
    ++logprob_calls;
    HostLogprobs(logits, n, d, tokens, top_k, token_out, logprob, rank, top_ids, top_logprobs);
  }
  bool with_logprobs = false;
  int logprob_calls = 0;
  void TopKRows(const float* x, int64_t n, int64_t d, int32_t k, const int32_t* row_k, int32_t* ids,
                float* values) override {
    ++calls;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t own_k =
          row_k != nullptr ? std::min(row_k[i], k) : k;  // the row's own candidates
      const float* row = x + i * d;
      auto key = [&](int32_t t) {
        return std::isnan(row[t]) ? -std::numeric_limits<float>::infinity() : row[t];
      };
      std::vector<int32_t> order(static_cast<size_t>(d));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return key(a) > key(b); });
      for (int32_t j = 0; j < own_k; ++j) {
        ids[i * k + j] = order[j];
        values[i * k + j] = key(order[j]);
      }
    }
  }
  void ApplyLogitEdits(float* logits, int64_t d, const LogitEdit* edits, int64_t count) override {
    edit_count += count;
    for (int64_t i = 0; i < count; ++i) {
      float& x = logits[edits[i].row * d + edits[i].token];
      x = ApplyLogitEdit(x, edits[i]);
    }
  }
  void SampleRows(const float* logits, int64_t n, int64_t d, const RowDraw* draws, int32_t* tokens,
                  double* totals) override {
    std::vector<float> weights(static_cast<size_t>(d));
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits + i * d;
      if (draws[i].mode == RowDraw::kTotal)
        totals[i] = RowWeightTotal(row, d, draws[i].inv_temperature);
      if (draws[i].mode == RowDraw::kDraw) {
        ++device_draws;
        tokens[i] = DrawFromRow(row, d, draws[i].inv_temperature, draws[i].min_p, draws[i].u,
                                weights.data());
      }
    }
  }
  int64_t edit_count = 0;
  int device_draws = 0;
};

// Seeded sampling of every kind on the device: top-k (with top-p and min-p), top-p alone (a narrow
// nucleus served by its candidates, a wide one by its row), temperature and min-p over the whole
// row, and greedy, each with and without logits processors (penalties, bias, min_tokens): the same
// tokens as sampling the whole rows on the host. Only the wide nucleus copies rows back. A sampling
// configuration of the device-sampling tests, and a request set to it with `seed`.
struct SamplingCase {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};
void Sampled(EngineRequest& r, const SamplingCase& c, uint64_t seed) {
  r.params.temperature = c.temperature;
  r.params.top_k = c.top_k;
  r.params.top_p = c.top_p;
  r.params.min_p = c.min_p;
  r.params.seed = seed;
}

TEST_P(EngineTest, SamplingWhereTheLogitsAreMatchesTheHostPath) {
  using Case = SamplingCase;
  const std::vector<Case> cases = {
      {0.6f, 3, 1.f, 0.f},   {0.9f, 10, 0.8f, 0.f},
      {1.2f, 300, 1.f, 0.f},  // 300: over the device limit
      {1.5f, 24, 1.f, 0.1f}, {0.5f, 0, 0.05f, 0.f},
      {20.f, 0, 0.99f, 0.f},  // top-p: narrow, wide (flattened) nucleus
      {1.f, 0, 1.f, 0.f},    {0.7f, 0, 1.f, 0.05f},
      {0.f, 0, 1.f, 0.f},  // whole-row draws, greedy
  };
  std::vector<EngineRequest> plain, processed;
  for (size_t i = 0; i < cases.size(); ++i) {
    EngineRequest r =
        Request("r" + std::to_string(i), 4 + 5 * static_cast<int>(i), 70 + i, /*max_tokens=*/8);
    Sampled(r, cases[i], 90 + i);
    plain.push_back(r);
    // The same with every kind of processor.
    r.id = "p" + std::to_string(i);
    r.params.repetition_penalty = 1.3f;
    r.params.presence_penalty = 0.5f;
    r.params.frequency_penalty = 0.7f;
    r.params.logit_bias = {{5, 3.f}, {r.prompt_token_ids[0], -2.f}};
    r.params.min_tokens = 4;
    r.params.ignore_eos = false;
    r.params.stop_token_ids = {7};
    processed.push_back(r);
  }
  std::vector<EngineRequest> all = plain;
  all.insert(all.end(), processed.begin(), processed.end());
  const auto host = RunOn(backend_.get(), all);
  DeviceSamplingBackend device;
  EXPECT_EQ(RunOn(&device, all), host);
  EXPECT_GT(device.calls, 0);
  EXPECT_GT(device.edit_count, 0);
  EXPECT_GT(device.device_draws, 0);
  // --device-sampling=false: the same tokens, every row through the host sampler.
  device_sampling_ = false;
  DeviceSamplingBackend off;
  EngineStats off_stats;
  EXPECT_EQ(RunOn(&off, all, 0, 0, nullptr, &off_stats), host);
  EXPECT_EQ(off.calls + off.device_draws, 0);
  EXPECT_EQ(off.edit_count, 0);
  device_sampling_ = true;
  // The counters behind tandem_sampled_tokens_total: every token of the greedy and device-sampled
  // requests on the device, the over-the-limit request's on the host, and top-p's row copies.
  int64_t tokens = 0;
  for (const auto& [id, t] : host) tokens += static_cast<int64_t>(t.size());
  EXPECT_EQ(off_stats.sampled_on_host + off_stats.sampled_on_device, tokens);
  const int64_t plain_greedy = static_cast<int64_t>(host.at("r8").size());  // case 8: temperature 0
  const int64_t over_limit =
      static_cast<int64_t>(host.at("r2").size() + host.at("p2").size());  // top_k 300
  EXPECT_EQ(off_stats.sampled_on_device, plain_greedy)
      << "only the plain greedy request's argmax on the device";
  EngineStats on_stats;
  DeviceSamplingBackend on;
  RunOn(&on, all, 0, 0, nullptr, &on_stats);
  EXPECT_EQ(on_stats.sampled_on_host + on_stats.sampled_on_device, tokens);
  EXPECT_EQ(on_stats.sampled_on_host, over_limit)
      << "the two requests over the device's top-k limit";
  EXPECT_GT(on_stats.sampling_row_copies, 0);
  EXPECT_EQ(off_stats.sampling_row_copies, 0);
  // Each request on its own: rows come back only for the request over the device's top-k limit and
  // for the wide nucleus.
  for (const EngineRequest& r : all) {
    DeviceSamplingBackend alone;
    alone.row_bytes = static_cast<size_t>(model_->config().vocab_size) * sizeof(float);
    const auto got = RunOn(&alone, {r});
    EXPECT_EQ(got.at(r.id), host.at(r.id)) << r.id;
    const bool over_limit = r.params.top_k == 300, wide = r.params.top_p == 0.99f;
    if (over_limit || wide) {
      EXPECT_GT(alone.row_copies, 0)
          << r.id << (wide ? ": the nucleus should be wider than 256 candidates" : "");
    } else {
      EXPECT_EQ(alone.row_copies, 0) << r.id;
    }
  }
}

// Sampled requests that want logprobs, on a device that samples and computes logprobs: the tokens
// are sampled there, and their logprobs (of the raw logits, rank and top entries) computed there
// after, the same as the host path gives them; only a request whose processors edit its rows (the
// logprobs must see the raw row) and the wide nucleus bring rows back.
TEST_P(EngineTest, LogprobsOfTokensSampledWhereTheLogitsAreMatchTheHostPath) {
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition;
  };
  const std::vector<Case> cases = {{0.7f, 5, 1.f, 0.f, 1.f},   {0.5f, 0, 0.05f, 0.f, 1.f},
                                   {20.f, 0, 0.99f, 0.f, 1.f}, {1.f, 0, 1.f, 0.05f, 1.f},
                                   {0.9f, 0, 1.f, 0.f, 1.f},   {0.9f, 8, 1.f, 0.f, 1.3f}};
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < cases.size(); ++i) {
    EngineRequest r =
        Request("r" + std::to_string(i), 6 + 5 * static_cast<int>(i), 80 + i, /*max_tokens=*/6);
    Sampled(r, {cases[i].temperature, cases[i].top_k, cases[i].top_p, cases[i].min_p}, 40 + i);
    r.params.repetition_penalty = cases[i].repetition;
    r.params.logprobs = i % 2 == 0 ? 3 : 0;
    reqs.push_back(r);
  }
  auto run = [&](Backend* backend, const std::vector<EngineRequest>& rs) {
    std::map<std::string, std::vector<RequestOutput>> all;
    RunOn(backend, rs, /*budget=*/0, /*chunk=*/0, &all);
    return all;
  };
  auto same = [](const LogprobEntry& a, const LogprobEntry& b) {
    if (a.token_id != b.token_id || a.rank != b.rank || std::fabs(a.logprob - b.logprob) > 1e-6f)
      return false;
    if (a.top.size() != b.top.size()) return false;
    for (size_t i = 0; i < a.top.size(); ++i) {
      if (a.top[i].token_id != b.top[i].token_id ||
          std::fabs(a.top[i].logprob - b.top[i].logprob) > 1e-6f)
        return false;
    }
    return true;
  };
  const auto host = run(backend_.get(), reqs);
  for (const EngineRequest& r : reqs) {
    DeviceSamplingBackend device;
    device.with_logprobs = true;
    device.row_bytes = static_cast<size_t>(model_->config().vocab_size) * sizeof(float);
    const auto got = run(&device, {r});
    const auto& want_outs = host.at(r.id);
    const auto& got_outs = got.at(r.id);
    std::vector<int32_t> want_tokens, got_tokens;
    std::vector<LogprobEntry> want_lp, got_lp;
    for (const auto& o : want_outs) {
      want_tokens.insert(want_tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      want_lp.insert(want_lp.end(), o.new_logprobs.begin(), o.new_logprobs.end());
    }
    for (const auto& o : got_outs) {
      got_tokens.insert(got_tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      got_lp.insert(got_lp.end(), o.new_logprobs.begin(), o.new_logprobs.end());
    }
    EXPECT_EQ(got_tokens, want_tokens) << r.id;
    ASSERT_EQ(got_lp.size(), want_lp.size()) << r.id;
    for (size_t i = 0; i < got_lp.size(); ++i)
      EXPECT_TRUE(same(got_lp[i], want_lp[i])) << r.id << " token " << i;
    const bool edited = r.params.repetition_penalty != 1.f, wide = r.params.top_p == 0.99f;
    if (edited || wide) {
      EXPECT_GT(device.row_copies, 0) << r.id;
    } else {
      EXPECT_EQ(device.row_copies, 0) << r.id;
      EXPECT_GT(device.logprob_calls, 0) << r.id;
    }
  }
}

TEST_P(EngineTest, LogprobsComputedWhereTheLogitsAreMatchTheHostPath) {
  // Greedy requests with logprobs and prompt logprobs, and a sampled one (whose logprobs stay on
  // the host): the same tokens, logprobs, ranks and top entries either way.
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = Request("r" + std::to_string(i), 5 + 7 * i, 40 + i, /*max_tokens=*/6);
    r.params.temperature = i == 3 ? 0.7f : 0.f;
    r.params.seed = 5;
    r.params.logprobs = i == 0 ? 0 : 3;
    r.params.prompt_logprobs = i == 1 ? -1 : 2;
    reqs.push_back(r);
  }
  auto run = [&](Backend* backend, const std::vector<EngineRequest>& reqs) {
    std::map<std::string, std::vector<RequestOutput>> all;
    // Prompts in chunks, prompt logprobs across them.
    RunOn(backend, reqs, /*budget=*/16, /*chunk=*/8, &all);
    return all;
  };
  DeviceLogprobsBackend device;
  const auto host_outs = run(backend_.get(), reqs);
  const auto device_outs = run(&device, reqs);
  EXPECT_GT(device.calls, 0);
  // Without the sampled request, no step brings logits back at all.
  DeviceLogprobsBackend greedy_only;
  greedy_only.row_bytes = static_cast<size_t>(model_->config().vocab_size) * sizeof(float);
  run(&greedy_only, std::vector<EngineRequest>(reqs.begin(), reqs.begin() + 3));
  EXPECT_GT(greedy_only.calls, 0);
  EXPECT_EQ(greedy_only.row_copies, 0);
  ASSERT_EQ(host_outs.size(), device_outs.size());
  auto same = [](const LogprobEntry& a, const LogprobEntry& b) {
    if (a.token_id != b.token_id || a.logprob != b.logprob || a.rank != b.rank ||
        a.top.size() != b.top.size())
      return false;
    for (size_t i = 0; i < a.top.size(); ++i) {
      if (a.top[i].token_id != b.top[i].token_id || a.top[i].logprob != b.top[i].logprob)
        return false;
    }
    return true;
  };
  for (const auto& [id, host] : host_outs) {
    const auto& dev = device_outs.at(id);
    ASSERT_EQ(host.size(), dev.size()) << id;
    for (size_t s = 0; s < host.size(); ++s) {
      EXPECT_EQ(host[s].new_token_ids, dev[s].new_token_ids) << id;
      ASSERT_EQ(host[s].new_logprobs.size(), dev[s].new_logprobs.size()) << id;
      for (size_t k = 0; k < host[s].new_logprobs.size(); ++k) {
        EXPECT_TRUE(same(host[s].new_logprobs[k], dev[s].new_logprobs[k])) << id << " step " << s;
      }
      ASSERT_EQ(host[s].prompt_logprobs.has_value(), dev[s].prompt_logprobs.has_value()) << id;
      if (!host[s].prompt_logprobs) continue;
      ASSERT_EQ(host[s].prompt_logprobs->size(), dev[s].prompt_logprobs->size());
      for (size_t p = 0; p < host[s].prompt_logprobs->size(); ++p) {
        const auto& a = (*host[s].prompt_logprobs)[p];
        const auto& b = (*dev[s].prompt_logprobs)[p];
        ASSERT_EQ(a.has_value(), b.has_value());
        if (a) {
          EXPECT_TRUE(same(*a, *b)) << id << " prompt position " << p;
        }
      }
    }
  }
}

TEST_P(EngineTest, SeededSamplingIsIndependentOfTheBatch) {
  EngineRequest a;
  a.id = "a";
  a.prompt_token_ids = Prompt(9, 1);
  a.params.temperature = 2.0f;
  a.params.seed = 1234;
  a.params.max_tokens = 10;
  a.params.ignore_eos = true;
  auto solo_engine = MakeEngine(64, 512, 0);
  ASSERT_TRUE(solo_engine->AddRequest(a).ok());
  const auto solo = RunAll(solo_engine.get());
  auto busy = MakeEngine(64, 16, 4);
  for (int i = 0; i < 6; ++i) {
    EngineRequest other = a;
    other.id = "o" + std::to_string(i);
    other.prompt_token_ids = Prompt(5 + i, 50 + i);
    other.params.seed = 99 + i;
    ASSERT_TRUE(busy->AddRequest(other).ok());
  }
  ASSERT_TRUE(busy->AddRequest(a).ok());
  EXPECT_EQ(RunAll(busy.get()).at("a"), solo.at("a"));
}

TEST_P(EngineTest, PrefixReuseComputesOnlyTheRestWithIdenticalLogprobs) {
  const std::vector<int32_t> shared = Prompt(12, 7);  // 3 blocks of 4
  EngineRequest first;
  first.id = "first";
  first.prompt_token_ids = shared;
  first.prompt_token_ids.push_back(1);
  first.params.temperature = 0;
  first.params.max_tokens = 2;
  EngineRequest second = first;
  second.id = "second";
  second.prompt_token_ids = shared;
  for (int32_t t : Prompt(5, 8)) second.prompt_token_ids.push_back(t);
  second.params.logprobs = 5;
  second.params.max_tokens = 4;

  auto cached = MakeEngine(64, 512, 0, /*caching=*/true);
  ASSERT_TRUE(cached->AddRequest(first).ok());
  RunAll(cached.get());
  const int64_t computed_before = cached->stats().computed_tokens;
  ASSERT_TRUE(cached->AddRequest(second).ok());
  std::map<std::string, std::vector<RequestOutput>> outs;
  RunAll(cached.get(), &outs);
  EXPECT_EQ(outs["second"][0].num_cached_tokens, 12);
  // 17 prompt tokens, 12 reused: 5 prompt tokens + 3 decode steps computed.
  EXPECT_EQ(cached->stats().computed_tokens - computed_before, 5 + 3);
  EXPECT_EQ(cached->stats().prefix_hits, 12);

  auto uncached = MakeEngine(64, 512, 0, /*caching=*/false);
  ASSERT_TRUE(uncached->AddRequest(second).ok());
  std::map<std::string, std::vector<RequestOutput>> ref;
  RunAll(uncached.get(), &ref);
  ASSERT_EQ(outs["second"].size(), ref["second"].size());
  for (size_t i = 0; i < ref["second"].size(); ++i) {
    ASSERT_EQ(outs["second"][i].new_token_ids, ref["second"][i].new_token_ids);
    for (size_t k = 0; k < ref["second"][i].new_logprobs.size(); ++k) {
      const auto& x = outs["second"][i].new_logprobs[k];
      const auto& y = ref["second"][i].new_logprobs[k];
      EXPECT_EQ(x.logprob, y.logprob);  // bit-identical: the reused KV is the same KV
      ASSERT_EQ(x.top.size(), y.top.size());
      for (size_t j = 0; j < x.top.size(); ++j) EXPECT_EQ(x.top[j].token_id, y.top[j].token_id);
    }
  }
}

TEST_P(EngineTest, AbortInEveryPhaseReturnsEveryBlock) {
  // Two sequences at most, 8-token budget, 4-token chunks: after 3 steps "decoding" (3-token
  // prompt) decodes, "prefilling" (30-token prompt) is part-way through its prompt, and "waiting"
  // has not started.
  auto e = MakeEngine(32, 8, 4, true, /*max_seqs=*/2);
  const int64_t baseline = e->stats().free_blocks;
  EngineRequest r;
  r.params.temperature = 0;
  r.params.max_tokens = 50;
  r.params.ignore_eos = true;
  for (const char* id : {"decoding", "prefilling", "waiting"}) {
    r.id = id;
    r.prompt_token_ids = Prompt(std::string(id) == "decoding" ? 3 : 30, 3);
    ASSERT_TRUE(e->AddRequest(r).ok());
  }
  std::map<std::string, int> produced;
  for (int i = 0; i < 3; ++i) {
    const std::vector<RequestOutput> outs = e->Step().value();
    for (const auto& o : outs) produced[o.id] += static_cast<int>(o.new_token_ids.size());
  }
  EXPECT_EQ(e->stats().running, 2);
  EXPECT_EQ(e->stats().waiting, 1);
  EXPECT_GT(produced["decoding"], 1);
  EXPECT_EQ(produced["prefilling"], 0);
  EXPECT_LT(e->stats().free_blocks, baseline);
  EXPECT_TRUE(e->Abort("waiting").ok());
  EXPECT_TRUE(e->Abort("prefilling").ok());
  EXPECT_TRUE(e->Abort("decoding").ok());
  EXPECT_EQ(e->Abort("decoding").code(), absl::StatusCode::kNotFound);
  auto outs = e->Step().value();
  int aborted = 0;
  for (const auto& o : outs) aborted += o.finish_reason == FinishReason::kAbort;
  EXPECT_EQ(aborted, 3);
  EXPECT_EQ(e->stats().free_blocks, baseline);
  EXPECT_FALSE(e->HasWork());
  // The engine keeps serving.
  r.id = "after";
  r.prompt_token_ids = Prompt(30, 4);
  r.params.max_tokens = 3;
  ASSERT_TRUE(e->AddRequest(r).ok());
  EXPECT_EQ(RunAll(e.get()).at("after").size(), 3u);
  EXPECT_EQ(e->stats().free_blocks, baseline);
}

TEST_P(EngineTest, BadRequestsAreRefusedAndTheEngineKeepsServing) {
  auto e = MakeEngine(32, 64, 0);
  EngineRequest r;
  r.id = "x";
  r.prompt_token_ids = {1, 2, 3};
  r.params.temperature = std::nanf("");
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.params.temperature = 0;
  r.params.max_tokens = 1000;  // beyond max_model_len 256
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.params.max_tokens = 2;
  r.prompt_token_ids = {1, static_cast<int32_t>(model_->config().vocab_size)};
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.prompt_token_ids = {};
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.prompt_token_ids = {1, 2, 3};
  ASSERT_TRUE(e->AddRequest(r).ok());
  EXPECT_EQ(e->AddRequest(r).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(RunAll(e.get()).at("x").size(), 2u);
}

TEST_P(EngineTest, RandomTrafficNeverLeaksBlocks) {
  auto e = MakeEngine(24, 16, 4);
  std::mt19937 rng(23);
  std::vector<std::string> live;
  for (int i = 0; i < 200; ++i) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {
      EngineRequest r;
      r.id = "q" + std::to_string(i);
      r.prompt_token_ids = Prompt(1 + static_cast<int>(rng() % 30), i);
      r.params.temperature = (rng() % 2) ? 0.f : 1.f;
      r.params.max_tokens = 1 + static_cast<int32_t>(rng() % 8);
      if (e->AddRequest(r).ok()) live.push_back(r.id);
    } else if (op == 1 && !live.empty()) {
      e->Abort(live[rng() % live.size()]).IgnoreError();
    } else {
      auto outs = e->Step();
      ASSERT_TRUE(outs.ok());
    }
  }
  RunAll(e.get());
  EXPECT_EQ(e->stats().free_blocks, 24);
}

TEST_P(EngineTest, PrefillAndDecodeRoles) {
  EngineRequest r;
  r.id = "r";
  r.prompt_token_ids = Prompt(21, 4);
  r.params.temperature = 0;
  r.params.max_tokens = 6;
  r.params.ignore_eos = true;
  auto combined = MakeEngine(64, 512, 0);
  ASSERT_TRUE(combined->AddRequest(r).ok());
  const auto expected = RunAll(combined.get()).at("r");

  auto prefill = RoleEngine(SchedulerRole::kPrefill);
  ASSERT_TRUE(prefill->AddRequest(r).ok());
  std::map<std::string, std::vector<RequestOutput>> outs;
  const auto first = RunAll(prefill.get(), &outs).at("r");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(outs["r"].back().finish_reason, FinishReason::kPrefillDone);
  EXPECT_EQ(prefill->stats().free_blocks, 64 - 6);  // 21 prompt tokens in 6 blocks, kept
  ASSERT_TRUE(prefill->Release("r").ok());
  EXPECT_EQ(prefill->stats().free_blocks, 64);

  // Decode role: reserve blocks for the arriving KV and admit the request with its first token.
  // Moving the KV itself is the transport's job (service issue); here only the bookkeeping is
  // checked: reservation, double reservation refused, admission, abort returning every block.
  auto decode = RoleEngine(SchedulerRole::kDecode);
  auto table = decode->Reserve("r", 21);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->size(), 6u);
  EXPECT_EQ(decode->Reserve("r", 21).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(decode->AdmitPrefilled(r, first[0]).ok());
  EXPECT_EQ(expected[0], first[0]);
  decode->Abort("r").IgnoreError();
  RunAll(decode.get());
  EXPECT_EQ(decode->stats().free_blocks, 64);
}

TEST_P(EngineTest, DecodeRoleReleasesReservationsAndEndsAtAFinalFirstToken) {
  auto decode = RoleEngine(SchedulerRole::kDecode, 16);
  // A reservation that never becomes a request (failed or cancelled transfer) is released.
  ASSERT_TRUE(decode->Reserve("gone", 10).ok());
  EXPECT_EQ(decode->stats().free_blocks, 16 - 3);
  ASSERT_TRUE(decode->Release("gone").ok());
  EXPECT_EQ(decode->stats().free_blocks, 16);
  EXPECT_EQ(decode->Release("gone").code(), absl::StatusCode::kNotFound);
  // max_tokens 1: the prefill worker's token is the whole output; the blocks free at admission.
  EngineRequest r;
  r.id = "one";
  r.prompt_token_ids = Prompt(7, 9);
  r.params.max_tokens = 1;
  r.params.ignore_eos = true;
  ASSERT_TRUE(decode->Reserve("one", 9).ok());
  ASSERT_TRUE(decode->AdmitPrefilled(r, 3).ok());
  EXPECT_EQ(decode->stats().free_blocks, 16);
  std::vector<RequestOutput> outs = decode->Step().value();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(outs[0].finished);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(outs[0].new_token_ids.empty());
  // A first token that is a stop token ends the request the same way.
  r.id = "stop";
  r.params.max_tokens = 5;
  r.params.stop_token_ids = {3};
  ASSERT_TRUE(decode->Reserve("stop", 9).ok());
  ASSERT_TRUE(decode->AdmitPrefilled(r, 3).ok());
  outs = decode->Step().value();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(decode->stats().free_blocks, 16);
}

TEST_P(EngineTest, SeededSamplingContinuesAcrossTheHandOff) {
  EngineRequest r;
  r.id = "s";
  r.prompt_token_ids = Prompt(11, 12);
  r.params.temperature = 1.0f;
  r.params.seed = 1234;
  r.params.max_tokens = 8;
  r.params.ignore_eos = true;
  auto combined = MakeEngine(64, 512, 0);
  ASSERT_TRUE(combined->AddRequest(r).ok());
  const auto expected = RunAll(combined.get()).at("s");
  auto prefill = RoleEngine(SchedulerRole::kPrefill);
  ASSERT_TRUE(prefill->AddRequest(r).ok());
  const auto first = RunAll(prefill.get()).at("s");
  ASSERT_EQ(first.size(), 1u);
  // Hand the KV over block by block (the transport's job, done by hand here) and continue on the
  // decode engine: with the same seed, the tokens after the first must be the combined engine's.
  auto decode = RoleEngine(SchedulerRole::kDecode);
  HandOver(prefill.get(), decode.get(), "s", 12);
  ASSERT_TRUE(decode->AdmitPrefilled(r, first[0]).ok());
  std::vector<int32_t> got = first;
  const auto rest = RunAll(decode.get()).at("s");
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, expected);
}

// A request resumed with its output so far appended to the prompt (resumed_output_tokens: the
// router migrating it off a lost decode worker) goes on exactly as the undisturbed run: greedy, and
// seeded sampling with penalties, min_tokens and a stop id (one draw a token), whether it resumes
// in a combined engine or across a prefill/decode hand-off.
TEST_P(EngineTest, AResumedRequestGoesOnAsTheUndisturbedRun) {
  std::vector<EngineRequest> variants(2);
  variants[0] = Request("greedy", 9, 21, 24);
  variants[0].params.temperature = 0;
  variants[1] = Request("sampled", 13, 22, 24);
  SamplingParams& p = variants[1].params;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 77;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = 0.3f;
  p.repetition_penalty = 1.2f;
  p.min_tokens = 14;
  p.ignore_eos = false;
  for (const EngineRequest& r : variants) {
    auto reference = MakeEngine(64, 512, 0);
    ASSERT_TRUE(reference->AddRequest(r).ok());
    std::map<std::string, std::vector<RequestOutput>> outs;
    const std::vector<int32_t> want = RunAll(reference.get(), &outs).at(r.id);
    const FinishReason reason = outs.at(r.id).back().finish_reason;
    ASSERT_GT(want.size(), 10u) << r.id;
    // The sampled run's stop id: its 12th token, masked by min_tokens until the 14th.
    EngineRequest req = r;
    if (!r.params.greedy()) req.params.stop_token_ids = {want[11]};
    auto with_stop = MakeEngine(64, 512, 0);
    ASSERT_TRUE(with_stop->AddRequest(req).ok());
    outs.clear();
    const std::vector<int32_t> full = RunAll(with_stop.get(), &outs).at(r.id);
    const FinishReason full_reason = outs.at(r.id).back().finish_reason;
    if (r.params.greedy()) {
      EXPECT_EQ(full, want);
      EXPECT_EQ(full_reason, reason);
    }
    for (const int32_t cut : {1, 5, static_cast<int32_t>(full.size()) - 1}) {
      SCOPED_TRACE(absl::StrCat(r.id, ", resumed after ", cut, " tokens"));
      EngineRequest resumed = req;
      resumed.prompt_token_ids.insert(resumed.prompt_token_ids.end(), full.begin(),
                                      full.begin() + cut);
      resumed.resumed_output_tokens = cut;
      const std::vector<int32_t> rest(full.begin() + cut, full.end());
      auto combined = MakeEngine(64, 512, 0);
      ASSERT_TRUE(combined->AddRequest(resumed).ok());
      outs.clear();
      EXPECT_EQ(RunAll(combined.get(), &outs).at(r.id), rest);
      EXPECT_EQ(outs.at(r.id).back().finish_reason, full_reason);
      // The prefill worker samples the next token; the decode worker goes on from it.
      auto prefill = RoleEngine(SchedulerRole::kPrefill);
      ASSERT_TRUE(prefill->AddRequest(resumed).ok());
      const std::vector<int32_t> first = RunAll(prefill.get()).at(r.id);
      ASSERT_EQ(first.size(), 1u);
      EXPECT_EQ(first[0], rest[0]);
      auto decode = RoleEngine(SchedulerRole::kDecode);
      HandOver(prefill.get(), decode.get(), r.id,
               static_cast<int64_t>(resumed.prompt_token_ids.size()));
      ASSERT_TRUE(decode->AdmitPrefilled(resumed, first[0]).ok());
      outs.clear();
      std::vector<int32_t> got = first;
      const auto later = RunAll(decode.get(), &outs);
      if (later.contains(r.id)) got.insert(got.end(), later.at(r.id).begin(), later.at(r.id).end());
      EXPECT_EQ(got, rest);
      EXPECT_EQ(outs.at(r.id).back().finish_reason, full_reason);
      EXPECT_EQ(decode->stats().free_blocks, 64);
    }
  }
  // Nothing left to generate, or more resumed than the prompt holds: refused.
  EngineRequest bad = variants[0];
  bad.resumed_output_tokens = bad.params.max_tokens;
  bad.prompt_token_ids.resize(bad.params.max_tokens + 5, 1);
  EXPECT_EQ(MakeEngine(64, 512, 0)->AddRequest(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = variants[0];
  bad.resumed_output_tokens = static_cast<int32_t>(bad.prompt_token_ids.size());
  EXPECT_EQ(MakeEngine(64, 512, 0)->AddRequest(bad).code(), absl::StatusCode::kInvalidArgument);
}

// A device that takes 20 ms a forward pass (its embedding waits): the stats split each step's wall
// time into the forward pass and the host's share around it.
class SlowForwardBackend final : public ForwardingBackend {
 public:
  void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) override {
    absl::SleepFor(absl::Milliseconds(20));
    cpu_->Embedding(table, ids, n, out);
  }
};

TEST_P(EngineTest, StatsSplitEachStepIntoTheForwardPassAndTheHostsShare) {
  SlowForwardBackend slow;
  EngineStats stats;
  RunOn(&slow, {Request("a", 9, 1, 4), Request("b", 5, 2, 6)}, 0, 0, nullptr, &stats);
  ASSERT_GT(stats.steps, 0);
  EXPECT_GE(stats.forward_seconds, 0.020 * stats.steps);
  EXPECT_GE(stats.step_seconds, stats.forward_seconds);
  // The host's share of a step of two tiny sequences is a small fraction of the 20 ms pass.
  EXPECT_LT(stats.step_seconds - stats.forward_seconds, 0.010 * stats.steps);
  // The prompts' steps come first, then decode-only ones: each kind at least one 20 ms pass.
  EXPECT_GE(stats.prompt_forward_seconds, 0.020);
  EXPECT_GE(stats.forward_seconds - stats.prompt_forward_seconds, 0.020);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, EngineTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

}  // namespace
}  // namespace tandem
