// Structured output: the grammar builder's refusals, token masks against a per-token check, the
// sampler under a constraint (EOS only once complete), and the engine generating schema-valid JSON
// in the combined and the prefill → decode roles. The schema semantics are proven against Python's
// jsonschema in conformance.structured_output.jsonschema.
#include <random>

#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/sampling/sampler.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/json_schema.h"
#include "common/structured/structured_output.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/tiny_models.h"

namespace tandem::structured {
namespace {

using GB = GrammarBuilder;

TEST(GrammarBuilderTest, RefusesWhatTheMatcherCannotRun) {
  {
    GrammarBuilder b;
    const uint32_t r = b.NewRule("r");
    EXPECT_NE(b.Build(r).status().message().find("no alternatives"), std::string::npos);
  }
  {
    GrammarBuilder b;
    const uint32_t a = b.NewRule("a");
    const uint32_t n = b.NewRule("nullable");
    b.AddAlternative(n, {});
    b.AddAlternative(a, {GB::Ref(n), GB::Ref(a), GB::Byte('x')});  // reaches itself unconsumed
    b.AddAlternative(a, {GB::Byte('y')});
    EXPECT_NE(b.Build(a).status().message().find("left-recursive"), std::string::npos);
  }
  {
    GrammarBuilder b;
    EXPECT_FALSE(b.Repeat("r", GB::Byte('x'), 3, 2).ok());
    EXPECT_FALSE(b.Repeat("r", GB::Byte('x'), 0, GrammarBuilder::kMaxRepeat + 1).ok());
  }
}

TEST(GrammarAutomatonTest, BoundedRepeatAndRightRecursionComeBackToTheSameState) {
  GrammarBuilder b;
  const uint32_t root = *b.Repeat("x{2,4}", GB::Byte('x'), 2, 4);
  GrammarAutomaton a(*b.Build(root), TokenVocabulary::Create({}));
  EXPECT_FALSE(a.IsAccepting(a.NextBytes(a.start(), "x")));
  EXPECT_TRUE(a.IsAccepting(a.NextBytes(a.start(), "xx")));
  EXPECT_TRUE(a.IsAccepting(a.NextBytes(a.start(), "xxxx")));
  EXPECT_EQ(a.NextBytes(a.start(), "xxxxx"), GrammarAutomaton::kDead);

  // A string's body loops: every character after the first leaves the state where it was.
  GrammarAutomaton s(*JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"type":"string"})")),
                     TokenVocabulary::Create({}));
  const uint32_t one = s.NextBytes(s.start(), "\"a");
  EXPECT_EQ(s.NextBytes(one, "bcdé\\n"), one);
}

// A vocabulary of short byte strings covering JSON's structure, digits, letters and UTF-8 pieces.
std::vector<std::optional<std::string>> TestVocabulary() {
  std::vector<std::optional<std::string>> v = {std::nullopt};  // id 0: a special token
  for (const char* t :
       {"{",  "}",      "[",   "]",   ",",   ":",    "\"",   " ",    "\n",       "  ",
        "\t", "{\"",    "\":", "\",", "\"}", "a",    "b",    "ab",   "name",     "\"name\"",
        "1",  "2",      "0",   "-",   ".",   "e",    "12",   "true", "false",    "null",
        "tr", "ue",     "\\",  "\\n", "\\u", "00e9", "\xC3", "\xA9", "\xC3\xA9", "\xE4\xB8\xAD",
        ", ", "\": \"", "x\"}"}) {
    v.push_back(std::string(t));
  }
  return v;
}

TEST(GrammarAutomatonTest, TokenMaskIsEveryTokenWhoseBytesKeepTheParseAlive) {
  const char* kSchema = R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":5},"n":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["a","b",true]}}},"required":["name"],
      "additionalProperties":false})";
  auto vocab = TokenVocabulary::Create(TestVocabulary());
  GrammarAutomaton a(*JsonSchemaGrammar(nlohmann::ordered_json::parse(kSchema)), vocab);
  std::mt19937 rng(7);
  int checked_states = 0;
  for (int walk = 0; walk < 30; ++walk) {
    uint32_t state = a.start();
    for (int step = 0; step < 40 && state != GrammarAutomaton::kDead; ++step) {
      std::vector<uint64_t> bits;
      a.AllowedTokens(state, &bits);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        const bool expect = vocab->bytes(id).has_value() &&
                            a.NextBytes(state, *vocab->bytes(id)) != GrammarAutomaton::kDead;
        const bool got = (bits[id >> 6] >> (id & 63)) & 1;
        ASSERT_EQ(got, expect) << "token " << id << " at step " << step;
        if (expect) allowed.push_back(id);
      }
      ++checked_states;
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      state = a.NextBytes(state, *vocab->bytes(pick));
    }
  }
  EXPECT_GT(checked_states, 300);
  EXPECT_GT(a.stats().mask_cache_hits, 0);  // states recur (a string's body)
}

// A constraint that allows tokens 1 and 2 until it has seen `length` tokens, then nothing
// (complete).
class CountingConstraint final : public TokenConstraint {
 public:
  explicit CountingConstraint(int length) : length_(length) {}
  void AllowedTokens(std::vector<uint64_t>* bits) override {
    bits->assign(1, seen_ < length_ ? 0b110 : 0);
  }
  bool CanEnd() const override { return seen_ >= length_; }
  bool Accept(int32_t token) override {
    ++seen_;
    return token == 1 || token == 2;
  }
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<CountingConstraint>(*this);
  }

 private:
  int length_;
  int seen_ = 0;
};

TEST(SamplerConstraintTest, MasksEverythingElseAndAllowsEosOnlyOnceComplete) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 3;
  constexpr int64_t kVocab = 8;
  constexpr int32_t kEos = 7;
  SequenceSampler s(p, {}, kVocab, {kEos});
  s.set_constraint(std::make_unique<CountingConstraint>(3));
  EXPECT_FALSE(s.PlainArgmax());
  EXPECT_EQ(s.DevicePlan(64).kind, DeviceSamplingPlan::Kind::kHost);
  // EOS and token 5 are the likeliest by far; the constraint wins.
  const std::vector<float> logits = {0, 1, 1, 0, 0, 9, 0, 10};
  for (int i = 0; i < 3; ++i) {
    std::vector<float> probs;
    SamplingWorkspace ws;
    s.Distribution(logits, ws, &probs);
    EXPECT_EQ(probs[kEos], 0.f);
    EXPECT_EQ(probs[5], 0.f);
    EXPECT_NEAR(probs[1] + probs[2], 1.f, 1e-6);
    const int32_t t = s.Sample(logits);
    ASSERT_TRUE(t == 1 || t == 2) << t;
    s.Accept(t);
  }
  // Complete: only EOS is left.
  std::unique_ptr<SequenceSampler> fork = s.Fork(11);
  EXPECT_EQ(s.Sample(logits), kEos);
  EXPECT_EQ(fork->Sample(logits), kEos);  // the fork carries the constraint's state
}

class StructuredEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::TinyModel("tiny-llama", 3);
    backend_ = CpuBackend::Create({}).value();
    model_ = LlamaModel::Load(dir_, backend_.get()).value();
    tokenizer_ = Tokenizer::Load(dir_).value();
  }
  std::unique_ptr<Engine> MakeEngine(SchedulerRole role, bool vocabulary = true) {
    EngineOptions o;
    o.block_size = 4;
    o.kv_cache_memory = 128 * KvCacheStorage::BytesPerBlock(model_->KvGeometry(1, 4));
    o.scheduler.role = role;
    o.scheduler.max_model_len = 512;
    if (vocabulary) {
      o.vocabulary = TokenVocabulary::FromTokenizer(*tokenizer_, model_->config().vocab_size);
    }
    return Engine::Create(model_.get(), o).value();
  }
  EngineRequest Request(float temperature) {
    EngineRequest r;
    r.id = "r";
    r.prompt_token_ids = tokenizer_->Encode("Answer in JSON:", true);
    r.params.temperature = temperature;
    r.params.seed = 5;
    r.params.max_tokens = 400;
    r.params.structured_output.kind = StructuredOutput::Kind::kJsonSchema;
    r.params.structured_output.json_schema =
        R"({"type":"object","properties":{"k":{"enum":["x","y"]},"ok":{"type":"boolean"},)"
        R"("n":{"type":"array","items":{"type":"null"},"maxItems":2}},"required":["k","ok"],)"
        R"("additionalProperties":false})";
    return r;
  }
  // Runs to the end; the generated ids and the finish reason.
  std::vector<int32_t> Run(Engine* e, FinishReason* reason) {
    std::vector<int32_t> ids;
    while (e->HasWork()) {
      auto outs = e->Step();
      EXPECT_TRUE(outs.ok()) << outs.status();
      if (!outs.ok()) break;
      for (const RequestOutput& o : *outs) {
        ids.insert(ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finished) *reason = o.finish_reason;
      }
    }
    return ids;
  }
  void ExpectValid(std::vector<int32_t> ids) {
    const int32_t eos = static_cast<int32_t>(model_->config().eos_token_id);
    ASSERT_FALSE(ids.empty());
    ASSERT_EQ(ids.back(), eos);
    ids.pop_back();
    const std::string text = tokenizer_->Decode(ids, true).value();
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_TRUE(j.contains("k") && j["k"].is_string()) << text;
    EXPECT_TRUE(j.contains("ok") && j["ok"].is_boolean()) << text;
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(StructuredEngineTest, GeneratesValidJsonGreedyAndSampledAndAcrossThePrefillDecodeSplit) {
  for (float temperature : {0.f, 1.f}) {
    SCOPED_TRACE(temperature);
    auto combined = MakeEngine(SchedulerRole::kCombined);
    ASSERT_TRUE(combined->AddRequest(Request(temperature)).ok());
    FinishReason reason = FinishReason::kNone;
    ExpectValid(Run(combined.get(), &reason));
    EXPECT_EQ(reason, FinishReason::kStop);
    EXPECT_EQ(combined->stats().free_blocks, combined->stats().num_blocks);

    // The prefill worker samples the first token under the constraint; the decode worker's
    // sequence takes it and goes on from there (its KV is not moved here, so only validity holds).
    auto prefill = MakeEngine(SchedulerRole::kPrefill);
    ASSERT_TRUE(prefill->AddRequest(Request(temperature)).ok());
    std::vector<int32_t> first = Run(prefill.get(), &reason);
    ASSERT_EQ(first.size(), 1u);
    ASSERT_TRUE(prefill->Release("r").ok());
    auto decode = MakeEngine(SchedulerRole::kDecode);
    const EngineRequest r = Request(temperature);
    ASSERT_TRUE(decode->Reserve("r", static_cast<int64_t>(r.prompt_token_ids.size())).ok());
    ASSERT_TRUE(decode->AdmitPrefilled(r, first[0]).ok());
    std::vector<int32_t> rest = Run(decode.get(), &reason);
    rest.insert(rest.begin(), first[0]);
    ExpectValid(rest);
  }
}

TEST_F(StructuredEngineTest, RefusesWhatItCannotHonour) {
  auto engine = MakeEngine(SchedulerRole::kCombined);
  EngineRequest r = Request(0.f);
  r.params.structured_output.json_schema = R"({"type":"string","pattern":"a+"})";
  absl::Status s = engine->AddRequest(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keyword 'pattern'"), std::string::npos) << s;
  r = Request(0.f);
  r.params.structured_output.json_schema = "{not json";
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r = Request(0.f);
  r.params.ignore_eos = true;
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r = Request(0.f);
  r.params.min_tokens = 2;
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  auto without = MakeEngine(SchedulerRole::kCombined, /*vocabulary=*/false);
  EXPECT_EQ(without->AddRequest(Request(0.f)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->stats().waiting, 0);
}

}  // namespace
}  // namespace tandem::structured
