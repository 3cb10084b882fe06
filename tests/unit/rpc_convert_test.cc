// Proto ↔ domain conversion: sampling parameters round-trip field by field, unset optional fields
// keep the engine's defaults, and statuses map code for code.
#include "common/rpc/convert.h"

#include "common/rpc/status.h"
#include "gtest/gtest.h"

namespace tandem::rpc {
namespace {

TEST(RpcConvertTest, UnsetFieldsKeepTheDefaults) {
  const SamplingParams d;
  const SamplingParams p = FromProto(v1::SamplingParameters());
  EXPECT_EQ(p.temperature, d.temperature);
  EXPECT_EQ(p.top_p, d.top_p);
  EXPECT_EQ(p.max_tokens, d.max_tokens);
  EXPECT_EQ(p.logprobs, -1);
  EXPECT_EQ(p.prompt_logprobs, -1);
  EXPECT_FALSE(p.seed.has_value());
}

TEST(RpcConvertTest, SamplingParametersRoundTrip) {
  SamplingParams s;
  s.temperature = 0.7f;
  s.top_k = 5;
  s.top_p = 0.9f;
  s.min_p = 0.05f;
  s.repetition_penalty = 1.1f;
  s.presence_penalty = 0.5f;
  s.frequency_penalty = -0.5f;
  s.logit_bias = {{3, 2.5f}, {9, -100.f}};
  s.stop_token_ids = {1, 2};
  s.ignore_eos = true;
  s.max_tokens = 0;  // explicit zero must survive (prompt-only)
  s.min_tokens = 0;
  s.seed = 42;
  s.logprobs = 0;
  s.prompt_logprobs = 3;
  const SamplingParams r = FromProto(ToProto(s));
  EXPECT_EQ(r.temperature, s.temperature);
  EXPECT_EQ(r.top_k, s.top_k);
  EXPECT_EQ(r.top_p, s.top_p);
  EXPECT_EQ(r.min_p, s.min_p);
  EXPECT_EQ(r.repetition_penalty, s.repetition_penalty);
  EXPECT_EQ(r.presence_penalty, s.presence_penalty);
  EXPECT_EQ(r.frequency_penalty, s.frequency_penalty);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[1].token_id, 9);
  EXPECT_EQ(r.logit_bias[1].bias, -100.f);
  EXPECT_EQ(r.stop_token_ids, s.stop_token_ids);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.seed, s.seed);
  EXPECT_EQ(r.logprobs, 0);
  EXPECT_EQ(r.prompt_logprobs, 3);
}

TEST(RpcConvertTest, LogprobsAndFinishReasons) {
  LogprobEntry e{7, -0.25f, 2, {{7, -0.25f}, {1, -1.5f}}};
  const LogprobEntry r = FromProto(ToProto(e));
  EXPECT_EQ(r.token_id, 7);
  EXPECT_EQ(r.logprob, -0.25f);
  EXPECT_EQ(r.rank, 2);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[1].token_id, 1);
  for (const FinishReason reason :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort}) {
    EXPECT_EQ(FinishReasonName(ToProto(reason)), tandem::FinishReasonName(reason));
  }
  EXPECT_EQ(FinishReasonName(ToProto(FinishReason::kStop)), "stop");
  EXPECT_EQ(ToProto(FinishReason::kPrefillDone), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(ToProto(FinishReason::kNone), v1::FINISH_REASON_UNSPECIFIED);
}

TEST(RpcStatusTest, CodesAndMessagesMapBothWays) {
  for (absl::StatusCode c :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
        absl::StatusCode::kCancelled, absl::StatusCode::kNotFound}) {
    const absl::Status s(c, "why");
    const grpc::Status g = ToGrpc(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), static_cast<int>(c));
    EXPECT_EQ(g.error_message(), "why");
    EXPECT_EQ(FromGrpc(g), s);
  }
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace tandem::rpc
