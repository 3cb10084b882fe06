#include "common/rpc/convert.h"

#include "common/tokenizer/tokenizer.h"

namespace tandem::rpc {

SamplingParams FromProto(const v1::SamplingParameters& p) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  for (const auto& b : p.logit_bias()) s.logit_bias.push_back({b.token_id(), b.bias()});
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.min_tokens = p.min_tokens();
  if (p.has_seed()) s.seed = p.seed();
  if (p.has_logprobs()) s.logprobs = p.logprobs();
  if (p.has_prompt_logprobs()) s.prompt_logprobs = p.prompt_logprobs();
  if (p.structured_output().has_json_schema()) {
    s.structured_output.kind = StructuredOutput::Kind::kJsonSchema;
    s.structured_output.json_schema = p.structured_output().json_schema();
  } else if (p.structured_output().json_object()) {
    s.structured_output.kind = StructuredOutput::Kind::kJsonObject;
  }
  return s;
}

v1::SamplingParameters ToProto(const SamplingParams& s) {
  v1::SamplingParameters p;
  p.set_temperature(s.temperature);
  p.set_top_k(s.top_k);
  p.set_top_p(s.top_p);
  p.set_min_p(s.min_p);
  p.set_repetition_penalty(s.repetition_penalty);
  p.set_presence_penalty(s.presence_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  for (const LogitBias& b : s.logit_bias) {
    auto* e = p.add_logit_bias();
    e->set_token_id(b.token_id);
    e->set_bias(b.bias);
  }
  for (int32_t t : s.stop_token_ids) p.add_stop_token_ids(t);
  p.set_ignore_eos(s.ignore_eos);
  p.set_max_tokens(s.max_tokens);
  p.set_min_tokens(s.min_tokens);
  if (s.seed) p.set_seed(*s.seed);
  if (s.logprobs >= 0) p.set_logprobs(s.logprobs);
  if (s.prompt_logprobs >= 0) p.set_prompt_logprobs(s.prompt_logprobs);
  switch (s.structured_output.kind) {
    case StructuredOutput::Kind::kNone: break;
    case StructuredOutput::Kind::kJsonObject:
      p.mutable_structured_output()->set_json_object(true);
      break;
    case StructuredOutput::Kind::kJsonSchema:
      p.mutable_structured_output()->set_json_schema(s.structured_output.json_schema);
      break;
  }
  return p;
}

v1::PositionLogprobs ToProto(const LogprobEntry& e, const Tokenizer* tokenizer) {
  v1::PositionLogprobs p;
  p.set_token_id(e.token_id);
  p.set_logprob(e.logprob);
  p.set_rank(e.rank);
  for (const TokenLogprob& t : e.top) {
    auto* x = p.add_top();
    x->set_token_id(t.token_id);
    x->set_logprob(t.logprob);
    if (tokenizer != nullptr) x->set_token(tokenizer->IdToToken(t.token_id));
  }
  return p;
}

LogprobEntry FromProto(const v1::PositionLogprobs& p) {
  LogprobEntry e;
  e.token_id = p.token_id();
  e.logprob = p.logprob();
  e.rank = p.rank();
  for (const auto& t : p.top()) e.top.push_back({t.token_id(), t.logprob()});
  return e;
}

void AppendPromptLogprobs(const std::vector<std::optional<LogprobEntry>>& entries,
                          const std::vector<int32_t>& prompt,
                          google::protobuf::RepeatedPtrField<v1::PositionLogprobs>* out) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i]) {
      *out->Add() = ToProto(*entries[i]);
    } else {
      v1::PositionLogprobs* p = out->Add();
      if (i < prompt.size()) p->set_token_id(prompt[i]);
    }
  }
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort: return v1::FINISH_REASON_ABORT;
    case FinishReason::kNone:
    case FinishReason::kPrefillDone: break;  // not a finish of the public API
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_ABORT: return "abort";
    default: return "";
  }
}

}  // namespace tandem::rpc
