// Speculative decoding on the CUDA backend (on a GPU, or the emulator): greedy output with n-gram
// and draft-model proposals is token for token, logprobs included, what the same backend gives
// without speculation (batch-invariant GEMMs: a verification row computes as a decode row does),
// with the argmax and logprobs taken on the device and rows copied for penalties; sampled requests
// speculate and finish.
#include <map>
#include <random>

#include "common/backend/cuda/cuda_backend.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

struct Outcome {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<LogprobEntry>> logprobs;
  EngineStats stats;
};

Outcome RunEngine(LlamaModel* model, LlamaModel* draft, SpeculationMethod method,
                  const std::vector<EngineRequest>& requests) {
  EngineOptions o;
  o.kv_cache_memory = 8 << 20;
  o.scheduler.max_model_len = 256;
  o.speculation.method = method;
  o.speculation.num_tokens = 3;
  o.speculation.adaptive = false;
  o.speculation.draft = draft;
  auto engine = Engine::Create(model, o).value();
  for (const EngineRequest& r : requests) EXPECT_TRUE(engine->AddRequest(r).ok());
  Outcome out;
  while (engine->HasWork()) {
    const std::vector<RequestOutput> outs = engine->Step().value();
    for (const RequestOutput& o : outs) {
      auto& t = out.tokens[o.id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      auto& l = out.logprobs[o.id];
      l.insert(l.end(), o.new_logprobs.begin(), o.new_logprobs.end());
    }
  }
  out.stats = engine->stats();
  return out;
}

TEST(CudaSpeculationTest, GreedyOutputMatchesDecodingWithout) {
  CudaBackend::Options bo;
  bo.batch_invariant = true;
  auto backend = CudaBackend::Create(bo).value();
  const std::string dir = testing_util::TinyModel("tiny-qwen3", 7, DType::kBF16);
  auto model = LlamaModel::Load(dir, backend.get()).value();
  auto draft = LlamaModel::Load(dir, backend.get()).value();  // the target as its own draft
  std::vector<EngineRequest> requests;
  std::mt19937 rng(2);
  for (int i = 0; i < 4; ++i) {
    EngineRequest r;
    r.id = "g" + std::to_string(i);
    const int period = 2 + i;
    for (int t = 0; t < 12; ++t)
      r.prompt_token_ids.push_back(static_cast<int32_t>(t % period + 7 * i));
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = 10;
    if (i == 1) r.params.logprobs = 2;               // on the device, with the argmax
    if (i == 2) r.params.repetition_penalty = 1.2f;  // rows copied to the host
    requests.push_back(r);
  }
  const Outcome plain = RunEngine(model.get(), nullptr, SpeculationMethod::kOff, requests);
  for (auto [method, d] : std::vector<std::pair<SpeculationMethod, LlamaModel*>>{
           {SpeculationMethod::kNgram, nullptr}, {SpeculationMethod::kDraft, draft.get()}}) {
    const Outcome spec = RunEngine(model.get(), d, method, requests);
    for (const EngineRequest& r : requests) {
      ASSERT_EQ(spec.tokens.at(r.id), plain.tokens.at(r.id))
          << r.id << " " << SpeculationMethodName(method);
      const auto& a = spec.logprobs.at(r.id);
      const auto& b = plain.logprobs.at(r.id);
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k].logprob, b[k].logprob, 1e-5);
    }
    const SpeculationStats& s = spec.stats.speculation;
    EXPECT_GT(s.counts.accepted, 0) << SpeculationMethodName(method);
    if (method == SpeculationMethod::kDraft)
      EXPECT_GE(s.counts.accepted, s.counts.proposed * 9 / 10);
    EXPECT_EQ(spec.stats.free_blocks, spec.stats.num_blocks);
  }
  // Sampled, with draft distributions: it speculates and ends where asked.
  EngineRequest sampled = requests[0];
  sampled.id = "s";
  sampled.params.temperature = 0.8f;
  sampled.params.seed = 3;
  const Outcome s = RunEngine(model.get(), draft.get(), SpeculationMethod::kDraft, {sampled});
  EXPECT_EQ(s.tokens.at("s").size(), 10u);
  EXPECT_GT(s.stats.speculation.counts.proposed, 0);
  EXPECT_TRUE(backend->CheckErrors().ok());
}

}  // namespace
}  // namespace tandem
