// Sampling on the device against the host sampler: argmax, logit edits, top-k candidates, draws and
// logprobs (tolerances: cuda_test_util.h).
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
TEST_F(CudaBackendTest, ArgmaxRowsMatchesTheCpu) {
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t d = 151936;  // Qwen 2.5's vocabulary: many elements per thread
  std::vector<float> x = Random(6 * d, 31);
  x[0 * d + 70000] = x[0 * d + 150000] = x[0 * d + 5] = 50.f;  // ties: the lowest id wins
  for (int64_t j = 0; j < d; ++j) x[1 * d + j] = j % 3 == 0 ? nan : x[1 * d + j];
  x[1 * d + 999] = 60.f;
  for (int64_t j = 0; j < d; ++j) x[2 * d + j] = -inf;
  for (int64_t j = 0; j < d; ++j) x[3 * d + j] = nan;
  x[4 * d + d - 1] = inf;
  std::vector<int32_t> ref(6);
  cpu_->ArgmaxRows(x.data(), 6, d, ref.data());
  auto ids = gpu_->Allocate(6 * sizeof(int32_t)).value();
  gpu_->ArgmaxRows(Up(x), 6, d, static_cast<int32_t*>(ids->data()));
  std::vector<int32_t> got(6);
  gpu_->CopyToHost(got.data(), ids->data(), 6 * sizeof(int32_t));
  EXPECT_EQ(got, ref);
  EXPECT_EQ(ref[0], 5);
  EXPECT_EQ(ref[1], 999);
  EXPECT_EQ(ref[2], 0);
  EXPECT_EQ(ref[3], 0);
  EXPECT_EQ(ref[4], d - 1);
}

// Top-k candidates on the device (radix select, then a bitonic sort) against a plain sort (value,
// then lower id; NaN as -inf; -0 equal to +0), on a Qwen-sized vocabulary and a small one, for k
// from 1 to 256 and per-row k (0 skips a row, leaving its outputs alone): rows with ties around the
// cut, NaN, an -inf tail, +inf, signed zeros and a row of one value. The sampler finishing from the
// candidates gives the token it gives from the whole row. The engine sampling where the logits are
// (every kind of step) against the same engine on the same GPU sampling on the host
// (EngineOptions::device_sampling false), over a tiny F32 model: greedy (with a penalty) and top-k
// requests give the host's tokens exactly, and logprobs within 1e-5; top-p, min-p and temperature
// requests (the device's expf and sums round differently) the host's tokens in nearly every
// request.
TEST_F(CudaBackendTest, EngineSamplingOnTheDeviceMatchesTheHostSampler) {
  auto model =
      LlamaModel::Load(testing_util::TinyModel("tiny-qwen2", 3, DType::kF32), gpu_.get()).value();
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition;
    int32_t logprobs;
    bool exact;
  };
  const std::vector<Case> cases = {
      {0.f, 0, 1.f, 0.f, 1.3f, -1, true},      {0.8f, 20, 1.f, 0.f, 1.f, -1, true},
      {0.8f, 40, 0.9f, 0.05f, 1.2f, -1, true}, {1.f, 10, 1.f, 0.f, 1.f, 3, true},
      {1.f, 0, 0.9f, 0.f, 1.f, -1, false},     {0.3f, 0, 0.5f, 0.f, 1.f, -1, false},
      {1.f, 0, 1.f, 0.f, 1.f, -1, false},      {0.7f, 0, 1.f, 0.1f, 1.f, 2, false}};
  std::vector<EngineRequest> reqs;
  std::mt19937 rng(5);
  // Every case four times on a GPU, twice on the emulator (whose kernels run on the CPU: 32
  // requests took 9 s of ctest's budget, twice, the emulated ops running in two schedules).
  for (int i = 0; i < (kEmulated ? 16 : 32); ++i) {
    const Case& c = cases[i % cases.size()];
    EngineRequest r;
    r.id = std::to_string(i);
    for (int t = 0; t < 5 + i * 3; ++t)
      r.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 500));
    r.params.temperature = c.temperature;
    r.params.top_k = c.top_k;
    r.params.top_p = c.top_p;
    r.params.min_p = c.min_p;
    r.params.repetition_penalty = c.repetition;
    r.params.logprobs = c.logprobs;
    r.params.seed = 100 + i;
    r.params.max_tokens = 16;
    r.params.ignore_eos = true;
    reqs.push_back(r);
  }
  auto run = [&](bool device_sampling) {
    EngineOptions o;
    o.kv_cache_memory = int64_t{64} << 20;
    o.device_sampling = device_sampling;
    auto engine = Engine::Create(model.get(), o).value();
    for (const EngineRequest& r : reqs) EXPECT_TRUE(engine->AddRequest(r).ok());
    std::map<std::string, std::pair<std::vector<int32_t>, std::vector<LogprobEntry>>> out;
    for (int guard = 0; engine->HasWork() && guard < 10000; ++guard) {
      auto step = engine->Step();
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) break;
      for (const RequestOutput& o : *step) {
        auto& [tokens, logprobs] = out[o.id];
        tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        logprobs.insert(logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      }
    }
    return out;
  };
  const auto host = run(false), device = run(true);
  int inexact = 0, inexact_same = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& id = reqs[i].id;
    const Case& c = cases[i % cases.size()];
    const auto& [want, want_lp] = host.at(id);
    const auto& [got, got_lp] = device.at(id);
    ASSERT_EQ(got.size(), 16u) << id;
    if (!c.exact) {
      ++inexact;
      inexact_same += got == want;
      continue;
    }
    EXPECT_EQ(got, want) << "request " << id;
    ASSERT_EQ(got_lp.size(), want_lp.size()) << id;
    for (size_t t = 0; t < got_lp.size(); ++t) {
      EXPECT_EQ(got_lp[t].token_id, want_lp[t].token_id);
      EXPECT_EQ(got_lp[t].rank, want_lp[t].rank);
      EXPECT_NEAR(got_lp[t].logprob, want_lp[t].logprob, 1e-5)
          << "request " << id << " token " << t;
    }
  }
  EXPECT_GE(inexact_same, inexact - 2)
      << inexact_same << " of " << inexact << " top-p/temperature requests alike";
}

TEST_F(CudaBackendTest, TopKRowsMatchAPlainSortAndTheSampler) {
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t d : {int64_t{151936}, int64_t{300}}) {
    const int64_t n = 7;
    std::vector<float> x = Random(n * d, 33);
    for (int64_t j = 0; j < d; j += 97) x[j] = 4.f;         // row 0: many ties around the cut
    for (int64_t j = 0; j < d; j += 3) x[1 * d + j] = nan;  // row 1: a third NaN
    for (int64_t j = 0; j < d; ++j)
      x[2 * d + j] = j < d - 10 ? -inf : 1.f;  // row 2: ten finite, -inf by id
    x[3 * d + 77] = inf;                       // row 3: +inf first
    for (int64_t j = 0; j < d; ++j)
      x[4 * d + j] = j % 2 ? 0.f : -0.f;  // row 4: signed zeros, all equal
    for (int64_t j = 0; j < d; ++j)
      x[5 * d + j] = static_cast<float>(j % 7) - 3.f;  // row 5: 7 values
    const float* xg = Up(x);
    for (const int32_t k : {1, 40, 64, 256}) {
      // Per-row k: the full width, a smaller one, and a skipped row.
      std::vector<int32_t> row_k(static_cast<size_t>(n), k);
      row_k[5] = std::max(1, k / 3);
      row_k[6] = 0;
      std::vector<int32_t> ids(static_cast<size_t>(n * k), -7);
      std::vector<float> vals(static_cast<size_t>(n * k), 42.f);
      int32_t* ids_dev = Up(ids);
      float* vals_dev = Up(vals);
      gpu_->TopKRows(xg, n, d, k, Up(row_k), ids_dev, vals_dev);
      gpu_->CopyToHost(ids.data(), ids_dev, ids.size() * sizeof(int32_t));
      gpu_->CopyToHost(vals.data(), vals_dev, vals.size() * sizeof(float));
      for (int64_t i = 0; i < n; ++i) {
        const float* row = x.data() + i * d;
        auto key = [&](int32_t t) { return std::isnan(row[t]) ? -inf : row[t]; };
        std::vector<int32_t> order(static_cast<size_t>(d));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return key(a) > key(b); });
        for (int32_t j = 0; j < k; ++j) {
          if (j >= row_k[i]) {  // beyond the row's own k (all of a skipped row's): left alone
            ASSERT_EQ(ids[i * k + j], -7) << "row " << i << " entry " << j;
            ASSERT_EQ(vals[i * k + j], 42.f) << "row " << i << " entry " << j;
            continue;
          }
          ASSERT_EQ(ids[i * k + j], order[j])
              << "d " << d << " k " << k << " row " << i << " rank " << j;
          ASSERT_EQ(vals[i * k + j], key(order[j]))
              << "d " << d << " k " << k << " row " << i << " rank " << j;
        }
        if (row_k[i] < 40) continue;
        SamplingParams p;
        p.temperature = 0.9f;
        p.top_k = 40;
        p.top_p = 0.9f;
        p.seed = 7 + i;
        SequenceSampler whole(p, {}, d, {}), from_top(p, {}, d, {});
        SamplingWorkspace ws;
        EXPECT_EQ(from_top.SampleFromTopK(std::span<const int32_t>(ids.data() + i * k, k),
                                          std::span<const float>(vals.data() + i * k, k), ws),
                  whole.Sample(std::span<const float>(row, d)))
            << "row " << i;
      }
      // Without per-row k every row gets k.
      std::vector<int32_t> all_ids(static_cast<size_t>(n * k));
      int32_t* all_dev = Up(all_ids);
      gpu_->TopKRows(xg, n, d, k, nullptr, all_dev, vals_dev);
      gpu_->CopyToHost(all_ids.data(), all_dev, all_ids.size() * sizeof(int32_t));
      const float* row6 = x.data() + 6 * d;
      std::vector<int32_t> order(static_cast<size_t>(d));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return row6[a] > row6[b]; });
      for (int32_t j = 0; j < k; ++j)
        ASSERT_EQ(all_ids[6 * k + j], order[j]) << "d " << d << " k " << k;
      for (int32_t j = 0; j < k; ++j)
        ASSERT_EQ(all_ids[0 * k + j], ids[0 * k + j]) << "d " << d << " k " << k;
    }
  }
}

// Logits processors as edits on the device: bit for bit the rows the host sampler processes, for
// samplers with every processor, over a batch whose rows each carry their own edits.
TEST_F(CudaBackendTest, LogitEditsMatchTheHostBitForBit) {
  const int64_t d = 151936, n = 6;
  std::vector<float> x = Random(n * d, 51, 4.f);
  x[2 * d + 5] = std::numeric_limits<float>::quiet_NaN();  // an edited NaN becomes -inf first
  std::vector<LogitEdit> edits;
  std::mt19937 rng(3);
  for (int64_t i = 0; i < n; ++i) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.repetition_penalty = i % 2 ? 1.3f : 0.7f;
    p.presence_penalty = 0.4f * static_cast<float>(i % 3);
    p.frequency_penalty = -0.3f * static_cast<float>(i % 4);
    p.logit_bias = {{5, 2.5f}, {static_cast<int32_t>(1000 + i), -7.f}};
    p.min_tokens = i == 3 ? 5 : 0;
    p.stop_token_ids = {11};
    p.max_tokens = 20;
    std::vector<int32_t> prompt;
    for (int t = 0; t < 500; ++t) prompt.push_back(static_cast<int32_t>(rng() % d));
    SequenceSampler s(p, prompt, d, {2});
    for (int t = 0; t < 3; ++t) s.Accept(static_cast<int32_t>(rng() % d));
    s.Accept(5);
    s.AppendLogitEdits(static_cast<int32_t>(i), &edits);
  }
  std::vector<float> want = x;
  for (const LogitEdit& e : edits)
    want[e.row * d + e.token] = ApplyLogitEdit(want[e.row * d + e.token], e);
  float* xg = Up(x);
  gpu_->ApplyLogitEdits(xg, d, Up(edits), static_cast<int64_t>(edits.size()));
  std::vector<float> got(x.size());
  gpu_->CopyToHost(got.data(), xg, got.size() * sizeof(float));
  for (size_t j = 0; j < got.size(); ++j) {
    if (std::isnan(want[j]) && std::isnan(got[j])) continue;  // unedited NaN
    ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j]))
        << "row " << j / d << " token " << j % d << ": " << got[j] << " vs " << want[j];
  }
  EXPECT_GT(edits.size(), 3000u);
}

// Weight totals and whole-row draws on the device against the host definitions (RowWeightTotal,
// DrawFromRow): totals within 5e-7 relative (the device's expf is within 2 ulp, glibc's within 1);
// a drawn token either the host's or one whose interval of the host's running sums lies within 1e-6
// of the sum from u × sum (exp and the sums round differently on the device), and the host's in
// most rows. Rows: peaked, flat, min-p cut, NaN, all -inf, +inf, u at 0 and just below 1, min_p 1,
// rows asking for nothing; vocabularies down to 1 token (warps with empty spans).
TEST_F(CudaBackendTest, SampleRowsMatchTheHostDefinitions) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t d : {int64_t{151936}, int64_t{1000}, int64_t{33}, int64_t{1}}) {
    const int64_t n = 64;
    std::vector<float> x = Random(n * d, 61, 2.f);
    std::vector<RowDraw> draws(static_cast<size_t>(n));
    std::mt19937_64 rng(8);
    for (int64_t i = 0; i < n; ++i) {
      RowDraw& r = draws[i];
      r.mode = i % 5 == 4 ? RowDraw::kTotal : RowDraw::kDraw;
      r.inv_temperature = 1.f / (i % 3 == 0 ? 0.3f : (i % 3 == 1 ? 1.f : 2.5f));
      r.min_p = i % 4 == 1 ? 0.05f : 0.f;
      r.u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    }
    if (d > 3) x[7 * d + 3] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < d; ++j) x[10 * d + j] = -inf;  // row 10: nothing to weigh (token 0)
    if (d > 123) x[11 * d + 123] = inf;                    // row 11: +inf (its argmax)
    draws[10].mode = draws[11].mode = RowDraw::kDraw;
    draws[12].u = 0;              // the first token with weight
    draws[13].u = 1 - 0x1.0p-53;  // the last
    draws[13].mode = RowDraw::kDraw;
    draws[15].min_p = 1.f;  // only the most likely tokens
    draws[15].mode = RowDraw::kDraw;
    draws[16].mode = draws[17].mode = RowDraw::kNone;      // asked for nothing: left alone
    for (int64_t j = 0; j < d; ++j) x[19 * d + j] = -inf;  // row 19: a total of nothing to weigh
    draws[19].mode = RowDraw::kTotal;
    std::vector<int32_t> tokens(static_cast<size_t>(n), -1);
    std::vector<double> totals(static_cast<size_t>(n), -1);
    int32_t* tokens_dev = Up(tokens);
    double* totals_dev = Up(totals);
    gpu_->SampleRows(Up(x), n, d, Up(draws), tokens_dev, totals_dev);
    gpu_->CopyToHost(tokens.data(), tokens_dev, tokens.size() * sizeof(int32_t));
    gpu_->CopyToHost(totals.data(), totals_dev, totals.size() * sizeof(double));
    std::vector<float> weights(static_cast<size_t>(d));
    int same = 0, draws_made = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x.data() + i * d;
      const RowDraw& r = draws[i];
      if (r.mode == RowDraw::kNone) {
        EXPECT_EQ(tokens[i], -1) << "row " << i;
        EXPECT_EQ(totals[i], -1) << "row " << i;
        continue;
      }
      if (r.mode == RowDraw::kTotal) {
        const double want = RowWeightTotal(row, d, r.inv_temperature);
        EXPECT_NEAR(totals[i], want, 5e-7 * want) << "d " << d << " row " << i;
        EXPECT_EQ(tokens[i], -1) << "a total row draws nothing";
        continue;
      }
      ++draws_made;
      const int32_t want = DrawFromRow(row, d, r.inv_temperature, r.min_p, r.u, weights.data());
      if (tokens[i] == want) {
        ++same;
        continue;
      }
      ASSERT_GE(tokens[i], 0) << "row " << i;
      ASSERT_LT(tokens[i], d) << "row " << i;
      // DrawFromRow left the host's weights (min-p applied) in `weights`.
      double sum = 0, before = 0;
      for (int64_t t = 0; t < d; ++t) {
        if (t < tokens[i]) before += weights[t];
        sum += weights[t];
      }
      const double at = r.u * sum, tol = 1e-6 * sum;
      EXPECT_GT(weights[tokens[i]], 0.f) << "row " << i << ": a token of no weight";
      EXPECT_TRUE(at >= before - tol && at < before + weights[tokens[i]] + tol)
          << "d " << d << " row " << i << ": device token " << tokens[i] << ", host " << want;
    }
    EXPECT_EQ(tokens[10], 0);
    if (d > 123) {
      EXPECT_EQ(tokens[11], 123);
    }
    EXPECT_EQ(totals[19], 0);
    EXPECT_GE(same, draws_made - 2) << "d " << d;
  }
}

TEST_F(CudaBackendTest, LogprobsMatchTheSampler) {
  // Rows of a 151936-wide vocabulary: given tokens and the argmax (-1), top 5 and top 0.
  const int64_t d = 151936, n = 4;
  std::vector<float> x = Random(n * d, 41, 8.f);
  x[2 * d + 100] = x[2 * d + 200] = 30.f;  // a tie at the top: the lower id first
  const std::vector<int32_t> tokens = {7, -1, 200, 151935};
  for (int32_t top_k : {5, 0}) {
    auto region = gpu_->Allocate(static_cast<size_t>(n * (4 + 2 * top_k)) * 4).value();
    auto* r = static_cast<int32_t*>(region->data());
    gpu_->CopyToDevice(r, tokens.data(), n * sizeof(int32_t));
    gpu_->Logprobs(Up(x), n, d, r, top_k, r + n, reinterpret_cast<float*>(r + 2 * n), r + 3 * n,
                   r + 4 * n, reinterpret_cast<float*>(r + 4 * n + n * top_k));
    std::vector<int32_t> host(static_cast<size_t>(n * (4 + 2 * top_k)));
    gpu_->CopyToHost(host.data(), r, host.size() * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x.data() + i * d;
      const int32_t token = tokens[i] >= 0 ? tokens[i] : ArgmaxRow(row, d);
      const LogprobEntry e = ComputeLogprobs(row, d, token, top_k);
      float lp;
      std::memcpy(&lp, &host[2 * n + i], 4);
      EXPECT_EQ(host[n + i], e.token_id) << i;
      EXPECT_NEAR(lp, e.logprob, 1e-5f) << i;
      EXPECT_EQ(host[3 * n + i], e.rank) << i;
      for (int32_t k = 0; k < top_k; ++k) {
        float tlp;
        std::memcpy(&tlp, &host[4 * n + n * top_k + i * top_k + k], 4);
        EXPECT_EQ(host[4 * n + i * top_k + k], e.top[k].token_id) << i << " top " << k;
        EXPECT_NEAR(tlp, e.top[k].logprob, 1e-5f) << i << " top " << k;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cuda_test
