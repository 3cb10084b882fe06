// What a request asks of the sampler, and the checks it must pass before it is queued.
//
// The fields and their "off" values follow vLLM's SamplingParams (and, for the penalties and logit
// bias, the OpenAI API), so a request means the same thing here as there. Validate() is the only
// gate: the sampler assumes a validated request and the engine never sees an invalid one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

// What the serving side knows that a request cannot: the model's vocabulary and context, the
// prompt's length after tokenization, and the most top-logprobs a request may ask for.
struct SamplingLimits {
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;  // prompt + generated tokens
  int64_t prompt_len = 0;
  // Cap on logprobs and prompt_logprobs (vLLM's max_logprobs, default 20). A caller that wants
  // whole distributions (the conformance tests) passes the vocabulary size.
  int32_t max_logprobs = 20;
};

struct LogitBias {
  int32_t token_id = 0;
  float bias = 0.f;  // added to the logit; finite, in [-100, 100]
};

// Structured output: what the generated text must be (common/structured compiles it).
struct StructuredOutput {
  enum class Kind : uint8_t {
    kNone,
    kJsonObject,  // any JSON object
    kJsonSchema,  // JSON valid against `json_schema` (docs/structured_output.md)
  };
  static constexpr size_t kMaxSchemaBytes = size_t{1} << 20;
  Kind kind = Kind::kNone;
  std::string json_schema;  // kJsonSchema: the schema as JSON text
  bool operator==(const StructuredOutput&) const = default;
};

struct SamplingParams {
  // Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
  static constexpr float kGreedyTemperature = 1e-5f;
  static constexpr size_t kMaxLogitBias = 1024;
  static constexpr size_t kMaxStopTokenIds = 1024;
  static constexpr float kMaxAbsLogitBias = 100.f;
  static constexpr float kMaxAbsPresenceFrequencyPenalty = 2.f;

  float temperature = 1.0f;  // >= 0; below kGreedyTemperature → greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // keep the k most likely tokens; 0 or -1 → off
  float top_p = 1.0f;        // (0, 1]; keep the smallest most-likely set with this mass; 1 → off
  float min_p = 0.0f;        // [0, 1]; drop tokens below min_p × the top probability; 0 → off
  // > 0; logits of tokens in the prompt or output: positive ones divided, negative multiplied.
  float repetition_penalty = 1.0f;
  // [-2, 2]; subtracted once from the logit of every token already generated.
  float presence_penalty = 0.0f;
  // [-2, 2]; subtracted from a generated token's logit once per time it was generated.
  float frequency_penalty = 0.0f;
  std::vector<LogitBias> logit_bias;    // at most kMaxLogitBias, distinct ids in the vocabulary
  std::vector<int32_t> stop_token_ids;  // at most kMaxStopTokenIds, ids in the vocabulary
  bool ignore_eos = false;              // EOS neither stops generation nor is masked by min_tokens
  int32_t max_tokens = 16;              // >= 0; prompt + max_tokens must fit the context
  int32_t min_tokens = 0;               // [0, max_tokens]; EOS and stop ids are masked until then
  std::optional<uint64_t> seed;         // unset → a random seed per request
  int32_t logprobs = -1;                // top-K logprobs per generated token; -1 → none
  int32_t prompt_logprobs = -1;         // top-K logprobs per prompt token; -1 → none
  // The output's shape. It ends with EOS once complete, so neither ignore_eos nor min_tokens go
  // with it.
  StructuredOutput structured_output;

  bool greedy() const { return temperature < kGreedyTemperature; }

  // OK, or INVALID_ARGUMENT naming the first offending field and its value: NaN or infinite
  // floats, values outside the ranges above, ids outside [0, vocab_size), oversized lists,
  // duplicate logit_bias ids, logprobs above min(max_logprobs, vocab_size), and
  // prompt_len + max_tokens > max_model_len, structured output with ignore_eos or min_tokens, or
  // a schema over kMaxSchemaBytes (whether it compiles is the engine's check).
  absl::Status Validate(const SamplingLimits& limits) const;
};

}  // namespace tandem
