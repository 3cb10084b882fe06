#include "common/sampling/sampling_params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::Status Invalid(const auto&... pieces) {
  return absl::InvalidArgumentError(absl::StrCat(pieces...));
}

// `field` must be finite and in [lo, hi].
absl::Status CheckRange(const char* field, float value, float lo, float hi) {
  if (!std::isfinite(value) || value < lo || value > hi) {
    return Invalid(field, " must be a finite number in [", lo, ", ", hi, "], got ", value);
  }
  return absl::OkStatus();
}

absl::Status CheckLogprobs(const char* field, int32_t value, int64_t cap) {
  if (value < -1 || value > cap) {
    return Invalid(field, " must be -1 (none) or in [0, ", cap, "], got ", value);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SamplingParams::Validate(const SamplingLimits& limits) const {
  const int64_t vocab = limits.vocab_size;
  if (!std::isfinite(temperature) || temperature < 0.f) {
    return Invalid("temperature must be a finite number >= 0, got ", temperature);
  }
  if (top_k < -1) return Invalid("top_k must be >= 1, or 0 or -1 for off, got ", top_k);
  if (!std::isfinite(top_p) || !(top_p > 0.f && top_p <= 1.f)) {
    return Invalid("top_p must be a finite number in (0, 1], got ", top_p);
  }
  if (absl::Status s = CheckRange("min_p", min_p, 0.f, 1.f); !s.ok()) return s;
  if (!std::isfinite(repetition_penalty) || !(repetition_penalty > 0.f)) {
    return Invalid("repetition_penalty must be a finite number > 0, got ", repetition_penalty);
  }
  if (absl::Status s =
          CheckRange("presence_penalty", presence_penalty, -kMaxAbsPresenceFrequencyPenalty,
                     kMaxAbsPresenceFrequencyPenalty);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRange("frequency_penalty", frequency_penalty, -kMaxAbsPresenceFrequencyPenalty,
                     kMaxAbsPresenceFrequencyPenalty);
      !s.ok()) {
    return s;
  }

  if (logit_bias.size() > kMaxLogitBias) {
    return Invalid("logit_bias has ", logit_bias.size(), " entries, at most ", kMaxLogitBias,
                   " are allowed");
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const LogitBias& b = logit_bias[i];
    if (b.token_id < 0 || b.token_id >= vocab) {
      return Invalid("logit_bias[", i, "]: token id ", b.token_id,
                     " is outside the vocabulary [0, ", vocab, ")");
    }
    if (!std::isfinite(b.bias) || b.bias < -kMaxAbsLogitBias || b.bias > kMaxAbsLogitBias) {
      return Invalid("logit_bias[", i, "]: bias for token id ", b.token_id,
                     " must be a finite number in [", -kMaxAbsLogitBias, ", ", kMaxAbsLogitBias,
                     "], got ", b.bias);
    }
  }
  if (logit_bias.size() > 1) {
    std::vector<int32_t> ids;
    ids.reserve(logit_bias.size());
    for (const LogitBias& b : logit_bias) ids.push_back(b.token_id);
    std::sort(ids.begin(), ids.end());
    if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
      return Invalid("logit_bias lists token id ", *dup, " more than once");
    }
  }

  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return Invalid("stop_token_ids has ", stop_token_ids.size(), " entries, at most ",
                   kMaxStopTokenIds, " are allowed");
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const int32_t t = stop_token_ids[i];
    if (t < 0 || t >= vocab) {
      return Invalid("stop_token_ids[", i, "]: token id ", t, " is outside the vocabulary [0, ",
                     vocab, ")");
    }
  }

  if (max_tokens < 0) return Invalid("max_tokens must be >= 0, got ", max_tokens);
  if (limits.prompt_len + max_tokens > limits.max_model_len) {
    return Invalid("prompt (", limits.prompt_len, " tokens) + max_tokens (", max_tokens,
                   ") exceeds the model's context of ", limits.max_model_len, " tokens");
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return Invalid("min_tokens must be in [0, max_tokens=", max_tokens, "], got ", min_tokens);
  }

  if (structured_output.kind != StructuredOutput::Kind::kNone) {
    if (ignore_eos) {
      return Invalid("structured output ends with EOS once complete: ignore_eos cannot go with it");
    }
    if (min_tokens > 0) {
      return Invalid("structured output ends where its value does: min_tokens (", min_tokens,
                     ") cannot go with it");
    }
  }
  if (structured_output.kind == StructuredOutput::Kind::kJsonSchema &&
      structured_output.json_schema.size() > StructuredOutput::kMaxSchemaBytes) {
    return Invalid("structured_output.json_schema has ", structured_output.json_schema.size(),
                   " bytes, at most ", StructuredOutput::kMaxSchemaBytes, " are allowed");
  }

  const int64_t logprobs_cap = std::min<int64_t>(limits.max_logprobs, vocab);
  if (absl::Status s = CheckLogprobs("logprobs", logprobs, logprobs_cap); !s.ok()) return s;
  return CheckLogprobs("prompt_logprobs", prompt_logprobs, logprobs_cap);
}

}  // namespace tandem
