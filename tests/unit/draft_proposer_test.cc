// The draft-model proposer on the tiny presets: its greedy proposals are the draft model's own
// greedy continuation (as an engine running the draft alone gives it), whether it catches up from
// nothing, from a partial cache after kept proposals, or past a token it did not propose; sampled
// proposals come with the distributions they were drawn from; bad requests are refused.
#include "common/spec/draft_proposer.h"

#include <numeric>
#include <random>

#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/tiny_models.h"

namespace tandem {
namespace {

class DraftProposerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    draft_ = LlamaModel::Load(testing_util::TinyModel(GetParam(), 5), backend_.get()).value();
    proposer_ =
        DraftModelProposer::Create(draft_.get(), {kBlocks, kBlockSize, DType::kF32, 64}).value();
    table_.resize(kBlocks);
    std::iota(table_.begin(), table_.end(), 0);
  }

  // The draft's own greedy continuation of `prompt`, from an engine without speculation.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    EngineOptions o;
    o.block_size = kBlockSize;
    o.kv_cache_dtype = DType::kF32;
    o.kv_cache_memory = 64 * KvCacheStorage::BytesPerBlock(draft_->KvGeometry(1, kBlockSize));
    auto engine = Engine::Create(draft_.get(), o).value();
    EngineRequest r;
    r.id = "r";
    r.prompt_token_ids = prompt;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = n;
    EXPECT_TRUE(engine->AddRequest(r).ok());
    std::vector<int32_t> out;
    while (engine->HasWork()) {
      const std::vector<RequestOutput> outs = engine->Step().value();
      for (const RequestOutput& o : outs)
        out.insert(out.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
    return out;
  }

  std::vector<int32_t> Propose(const std::vector<int32_t>& tokens, int32_t k, int64_t computed,
                               SequenceSampler* sampler = nullptr,
                               std::vector<float>* probs = nullptr,
                               DraftModelProposer* proposer = nullptr,
                               int64_t* draft_computed = nullptr) {
    ProposalRequest r;
    r.seq_id = 1;
    r.tokens = tokens;
    r.k = k;
    r.block_table = table_;
    r.draft_computed = computed;
    r.sampler = sampler;
    std::vector<Proposal> out;
    const absl::Status s = (proposer ? proposer : proposer_.get())->Propose({r}, &out);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok() || out.size() != 1) return {};
    if (probs != nullptr) *probs = out[0].probs;
    if (draft_computed != nullptr) *draft_computed = out[0].draft_computed;
    return out[0].tokens;
  }

  static constexpr int64_t kBlocks = 64, kBlockSize = 4;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> draft_;
  std::unique_ptr<DraftModelProposer> proposer_;
  std::vector<int32_t> table_;
};

TEST_P(DraftProposerTest, GreedyProposalsAreTheDraftsOwnContinuation) {
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(29);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % draft_->config().vocab_size);
  const std::vector<int32_t> greedy = Greedy(prompt, 14);
  ASSERT_EQ(greedy.size(), 14u);
  // From nothing (a decode worker's first proposal): the whole prompt in chunks of 7 tokens.
  std::vector<int32_t> seq = prompt;
  EXPECT_EQ(Propose(seq, 4, 0), std::vector<int32_t>(greedy.begin(), greedy.begin() + 4));
  // All four kept and the target's next token: the draft holds KV for all but the last proposed.
  seq.insert(seq.end(), greedy.begin(), greedy.begin() + 5);
  const int64_t held = static_cast<int64_t>(prompt.size()) + 3;
  EXPECT_EQ(Propose(seq, 5, held), std::vector<int32_t>(greedy.begin() + 5, greedy.begin() + 10));
  // Only two kept, then a token the draft did not propose: its continuation after that token.
  seq.insert(seq.end(), greedy.begin() + 5, greedy.begin() + 7);
  const int32_t other = (greedy[7] + 1) % static_cast<int32_t>(draft_->config().vocab_size);
  seq.push_back(other);
  const int64_t kept = static_cast<int64_t>(seq.size()) - 1;
  EXPECT_EQ(Propose(seq, 3, kept), Greedy(seq, 3));
  // The caller's count may lag (a step without proposals): the draft catches up.
  EXPECT_EQ(Propose(seq, 3, 10), Greedy(seq, 3));
}

TEST_P(DraftProposerTest, CatchUpBeyondTheBudgetGoesOnOverSeveralCalls) {
  // 7 tokens a call: a 29-token prompt takes four calls of catch-up without proposals (each
  // reporting its progress), then the fifth proposes the draft's own continuation.
  auto small =
      DraftModelProposer::Create(draft_.get(), {kBlocks, kBlockSize, DType::kF32, 7}).value();
  std::mt19937 rng(8);
  std::vector<int32_t> prompt(29);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % draft_->config().vocab_size);
  int64_t held = 0;
  for (int call = 0; call < 4; ++call) {
    int64_t progress = -1;
    EXPECT_TRUE(Propose(prompt, 3, held, nullptr, nullptr, small.get(), &progress).empty());
    EXPECT_EQ(progress, held + 7) << call;
    held = progress;
  }
  int64_t progress = -1;
  EXPECT_EQ(Propose(prompt, 3, held, nullptr, nullptr, small.get(), &progress), Greedy(prompt, 3));
  EXPECT_EQ(progress, static_cast<int64_t>(prompt.size()) + 2) << "all but the last proposed";
}

TEST_P(DraftProposerTest, SampledProposalsComeWithTheirDistributions) {
  std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11};
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 40;
  params.seed = 1;
  SequenceSampler sampler(params, prompt, draft_->config().vocab_size, {});
  auto fork = sampler.Fork(77);
  std::vector<float> probs;
  const std::vector<int32_t> tokens = Propose(prompt, 4, 0, fork.get(), &probs);
  ASSERT_EQ(tokens.size(), 4u);
  const int64_t vocab = draft_->config().vocab_size;
  ASSERT_EQ(probs.size(), static_cast<size_t>(4 * vocab));
  for (int i = 0; i < 4; ++i) {
    const float* q = probs.data() + i * vocab;
    EXPECT_NEAR(std::accumulate(q, q + vocab, 0.0), 1.0, 1e-5);
    EXPECT_GT(q[tokens[i]], 0.f) << "token " << i << " was drawn from its distribution";
    EXPECT_EQ(std::count_if(q, q + vocab, [](float p) { return p > 0; }), 40) << "top_k 40";
  }
  EXPECT_EQ(fork->num_generated(), 4) << "the fork accepted its draws";
  EXPECT_EQ(sampler.num_generated(), 0) << "the sequence's own sampler is untouched";
  // The same fork seed draws the same proposal.
  auto again = sampler.Fork(77);
  EXPECT_EQ(Propose(prompt, 4, 0, again.get()), tokens);
}

TEST_P(DraftProposerTest, RefusesRequestsItCannotServe) {
  std::vector<Proposal> out;
  const std::vector<int32_t> tokens = {1, 2, 3}, short_table = {0};
  ProposalRequest r{.seq_id = 1, .tokens = tokens, .k = 4, .block_table = short_table};
  EXPECT_EQ(proposer_->Propose({r}, &out).code(), absl::StatusCode::kInvalidArgument)
      << "3 tokens and 4 proposed do not fit one block of 4";
  const std::vector<int32_t> bad_block = {0, static_cast<int32_t>(kBlocks)};
  r.block_table = bad_block;
  r.k = 2;
  EXPECT_EQ(proposer_->Propose({r}, &out).code(), absl::StatusCode::kInvalidArgument);
  r.block_table = table_;
  r.draft_computed = 4;
  EXPECT_EQ(proposer_->Propose({r}, &out).code(), absl::StatusCode::kInvalidArgument);
  r.draft_computed = 0;
  r.k = 0;
  EXPECT_EQ(proposer_->Propose({r}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftModelProposer::Create(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, DraftProposerTest, testing_util::TinyPresets(),
                         testing_util::PresetName);

}  // namespace
}  // namespace tandem
