// Next-token selection and log-probabilities over one row of logits.
//
// The first slice of common/sampling: greedy, temperature, top-k and top-p with a seeded generator,
// plus vLLM-style logprob entries. Penalties, min-p and logit bias arrive with the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;  // 0 → greedy
  int32_t top_k = 0;         // 0 → off
  float top_p = 1.0f;        // 1 → off
  std::optional<uint64_t> seed;
  int32_t max_tokens = 16;
  int32_t logprobs = -1;         // top-K logprobs per generated token; -1 → none
  int32_t prompt_logprobs = -1;  // top-K logprobs per prompt token; -1 → none
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;

  // INVALID_ARGUMENT naming the field for out-of-range values.
  absl::Status Validate(int64_t vocab_size) const;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.f;
};

// One position: the chosen (or actual prompt) token with its logprob and rank (1 = most likely),
// and the `top` most likely tokens, most likely first.
struct LogprobEntry {
  int32_t token_id = 0;
  float logprob = 0.f;
  int64_t rank = 0;
  std::vector<TokenLogprob> top;
};

// log_softmax of the raw logits (computed in double), with the top-k entries and the rank of `token`.
LogprobEntry ComputeLogprobs(const float* logits, int64_t vocab_size, int32_t token, int32_t top_k);

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  // Picks the next token from logits [vocab_size].
  int32_t Sample(const float* logits, int64_t vocab_size, const SamplingParams& params);

 private:
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace tandem
