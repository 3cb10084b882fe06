// Disaggregated prefill and decode in one process: a prefill-role engine computes prompts and hands
// requests out; their KV travels over the TCP transport (loopback) into blocks a decode-role engine
// reserved; the decode engine admits each request with its first token and finishes it. Outputs
// must be token-identical to the combined engine, and every block returns to both pools.
#include <filesystem>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "cli/presets.h"
#include "cli/random_model.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/transport/kv_control.h"
#include "gtest/gtest.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

class DisaggregationTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = testing_util::TinyModel(GetParam(), 9);
    backend_ = CpuBackend::Create({}).value();
    model_ = LlamaModel::Load(dir, backend_.get()).value();
  }

  std::unique_ptr<Engine> MakeEngine(SchedulerRole role) {
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_memory = 96 * KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4));
    o.scheduler.role = role;
    o.scheduler.max_num_batched_tokens = 64;
    o.scheduler.max_prefill_chunk = 16;
    o.scheduler.max_model_len = 128;
    return Engine::Create(model_.get(), o).value();
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(DisaggregationTest, PrefillToDecodeOverTcpMatchesCombined) {
  std::vector<EngineRequest> reqs;
  std::mt19937 rng(4);
  for (int i = 0; i < 8; ++i) {
    EngineRequest r;
    r.id = absl::StrCat("r", i);
    r.prompt_token_ids.resize(3 + rng() % 30);
    for (auto& t : r.prompt_token_ids)
      t = static_cast<int32_t>(rng() % model_->config().vocab_size);
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = 2 + static_cast<int32_t>(rng() % 8);
    reqs.push_back(r);
  }
  // Reference: the combined role.
  auto combined = MakeEngine(SchedulerRole::kCombined);
  for (const auto& r : reqs) ASSERT_TRUE(combined->AddRequest(r).ok());
  std::map<std::string, std::vector<int32_t>> expected;
  while (combined->HasWork()) {
    const std::vector<RequestOutput> outs = combined->Step().value();
    for (const auto& o : outs) {
      expected[o.id].insert(expected[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }

  auto prefill = MakeEngine(SchedulerRole::kPrefill);
  auto decode = MakeEngine(SchedulerRole::kDecode);
  const KvEndpointInfo info{"tiny", model_->KvGeometry(0, 4)};
  auto receiver =
      KvControlReceiver::Create({"127.0.0.1", 0, decode->kv_storage(), info, absl::Seconds(5)})
          .value();
  auto sender =
      KvControlSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), info, absl::Seconds(5))
          .value();

  // The decode side reserves blocks before the prefill starts (backpressure lives here).
  for (const auto& r : reqs) {
    auto blocks = decode->Reserve(r.id, static_cast<int64_t>(r.prompt_token_ids.size()));
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    ASSERT_TRUE(receiver->Expect(r.id, *blocks, "").ok());
    ASSERT_TRUE(prefill->AddRequest(r).ok());
  }
  std::map<std::string, std::vector<int32_t>> got;
  std::map<std::string, const EngineRequest*> by_id;
  for (const auto& r : reqs) by_id[r.id] = &r;
  while (prefill->HasWork()) {
    const std::vector<RequestOutput> outs = prefill->Step().value();
    for (const auto& o : outs) {
      if (o.finish_reason != FinishReason::kPrefillDone) continue;
      const EngineRequest& r = *by_id.at(o.id);
      ASSERT_EQ(o.new_token_ids.size(), 1u);
      ASSERT_TRUE(sender->Begin(r.id, static_cast<int64_t>(r.prompt_token_ids.size()), "").ok());
      for (int32_t l = 0; l < model_->config().num_hidden_layers; ++l) {
        ASSERT_TRUE(
            sender->SendLayer(r.id, l, prefill->block_table(r.id), prefill->kv_storage()).ok());
      }
      ASSERT_TRUE(sender->End(r.id, o.new_token_ids[0]).ok());
      ASSERT_TRUE(prefill->Release(r.id).ok());
      auto first = receiver->Wait(r.id, absl::Seconds(5));
      ASSERT_TRUE(first.ok()) << first.status();
      got[r.id].push_back(*first);
      if (r.params.max_tokens > 1) {
        ASSERT_TRUE(decode->AdmitPrefilled(r, *first).ok());
      } else {
        decode->Abort(r.id).IgnoreError();
      }
    }
  }
  while (decode->HasWork()) {
    const std::vector<RequestOutput> outs = decode->Step().value();
    for (const auto& o : outs) {
      got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], expected[r.id]) << r.id;
  EXPECT_EQ(prefill->stats().free_blocks, prefill->stats().num_blocks);
  EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
}

TEST_P(DisaggregationTest, LayerWiseSendingDuringThePrefillStep) {
  // Each layer of a request whose prompt completes in a step is sent as soon as the forward pass
  // has written it (before the next layer runs), not after the step.
  EngineRequest r;
  r.id = "r";
  r.prompt_token_ids.resize(29);
  for (size_t i = 0; i < r.prompt_token_ids.size(); ++i)
    r.prompt_token_ids[i] = static_cast<int32_t>((i * 37) % 500);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = 5;
  auto combined = MakeEngine(SchedulerRole::kCombined);
  ASSERT_TRUE(combined->AddRequest(r).ok());
  std::vector<int32_t> expected;
  while (combined->HasWork()) {
    const std::vector<RequestOutput> outs = combined->Step().value();
    for (const auto& o : outs)
      expected.insert(expected.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }

  auto prefill = MakeEngine(SchedulerRole::kPrefill);
  auto decode = MakeEngine(SchedulerRole::kDecode);
  const KvEndpointInfo info{"tiny", model_->KvGeometry(0, 4)};
  auto receiver =
      KvControlReceiver::Create({"127.0.0.1", 0, decode->kv_storage(), info, absl::Seconds(5)})
          .value();
  auto sender =
      KvControlSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), info, absl::Seconds(5))
          .value();
  auto blocks = decode->Reserve("r", 29);
  ASSERT_TRUE(blocks.ok());
  ASSERT_TRUE(receiver->Expect("r", *blocks, "").ok());
  std::vector<int64_t> layers_sent;
  prefill->set_layer_listener([&](int64_t layer, const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      if (layer == 0) {
        ASSERT_TRUE(sender->Begin(id, 29, "").ok());
      }
      ASSERT_TRUE(sender
                      ->SendLayer(id, static_cast<int32_t>(layer), prefill->block_table(id),
                                  prefill->kv_storage())
                      .ok());
      layers_sent.push_back(layer);
    }
  });
  ASSERT_TRUE(prefill->AddRequest(r).ok());
  std::vector<int32_t> got;
  while (prefill->HasWork()) {
    const std::vector<RequestOutput> outs = prefill->Step().value();
    for (const auto& o : outs) {
      if (o.finish_reason != FinishReason::kPrefillDone) continue;
      ASSERT_TRUE(sender->End(o.id, o.new_token_ids[0]).ok());
      ASSERT_TRUE(prefill->Release(o.id).ok());
      got.push_back(receiver->Wait(o.id, absl::Seconds(5)).value());
      ASSERT_TRUE(decode->AdmitPrefilled(r, got[0]).ok());
    }
  }
  std::vector<int64_t> all_layers(model_->config().num_hidden_layers);
  std::iota(all_layers.begin(), all_layers.end(), 0);
  EXPECT_EQ(layers_sent, all_layers);  // one send per layer, in order, during the completing step
  while (decode->HasWork()) {
    const std::vector<RequestOutput> outs = decode->Step().value();
    for (const auto& o : outs)
      got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, DisaggregationTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

}  // namespace
}  // namespace tandem
