// Next-token selection for one sequence, and vLLM-style log-probabilities over one row of logits.
//
// A SequenceSampler holds everything sampling needs to remember about its sequence: its own random
// generator, the prompt tokens and the counts of generated tokens (for the penalties), and how many
// tokens were generated (for min_tokens). Nothing is shared between sequences, so a seeded request
// draws the same tokens whatever else is in the batch and in whatever order the batch is sampled.
//
// Per step, on a copy of the logits (the input is never modified), in vLLM's order:
//   1. min_tokens: while fewer than min_tokens tokens were generated, EOS (unless ignore_eos) and
//      the stop ids get -inf;
//   2. logit_bias is added;
//   3. repetition_penalty on tokens seen in the prompt or output (positive logits divided,
//      negative ones multiplied);
//   4. frequency and presence penalties on generated tokens (logit -= frequency × count +
//      presence × [count > 0]);
//   5. greedy: argmax, lowest id on ties. Otherwise temperature, top-k, top-p (the smallest most
//      likely set whose mass reaches top_p, ties broken by lower id), min-p (relative to the most
//      likely token), then one uniform draw from the sequence's generator.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/sampling/sampling_params.h"

namespace tandem {

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

// log_softmax of the raw logits (computed in double), with the top-k entries and the rank of
// `token` (1-based; equal logits rank the lower id first). The raw model distribution, before any
// sampling parameter is applied: vLLM's default.
LogprobEntry ComputeLogprobs(const float* logits, int64_t vocab_size, int32_t token, int32_t top_k);

// Scratch memory for SequenceSampler::Sample: vocabulary-sized buffers, grown once and reused. One
// workspace per sampling thread serves any number of sequences; a sampler used without one keeps
// its own. Not thread-safe.
class SamplingWorkspace {
 public:
  SamplingWorkspace() = default;
  SamplingWorkspace(const SamplingWorkspace&) = delete;
  SamplingWorkspace& operator=(const SamplingWorkspace&) = delete;
  SamplingWorkspace(SamplingWorkspace&&) = default;
  SamplingWorkspace& operator=(SamplingWorkspace&&) = default;

 private:
  friend class SequenceSampler;
  std::vector<float> logits_;          // [vocab] processed logits
  std::vector<int32_t> ids_;           // [vocab] candidate token ids
  std::vector<int32_t> boundary_ids_;  // [vocab] top-p: tokens where the nucleus may end
  std::vector<float> weights_;       // [vocab] exp((logit - max) / temperature), set for candidates
  std::vector<double> bucket_mass_;  // [weight buckets] top-p: total weight per bucket
};

class SequenceSampler {
 public:
  // `params` must have passed Validate() for this vocabulary. `prompt_token_ids` feed the
  // repetition penalty; `eos_token_ids` (ids outside the vocabulary are ignored) end generation
  // unless params.ignore_eos. The generator is seeded from params.seed, or from std::random_device
  // when it is unset.
  SequenceSampler(const SamplingParams& params, std::span<const int32_t> prompt_token_ids,
                  int64_t vocab_size, std::vector<int32_t> eos_token_ids);
  SequenceSampler(const SequenceSampler&) = delete;
  SequenceSampler& operator=(const SequenceSampler&) = delete;
  SequenceSampler(SequenceSampler&&) = default;
  SequenceSampler& operator=(SequenceSampler&&) = default;

  // The next token for logits [vocab_size] (the model's raw output row; not modified). Does not
  // record the token: call Accept() with the token the sequence actually takes. Deterministic
  // given the seed and the sequence of (logits, accepted token) pairs. Greedy steps draw nothing
  // from the generator; every other step draws exactly one number.
  int32_t Sample(std::span<const float> logits);
  // The same, with scratch memory shared with other samplers on this thread.
  int32_t Sample(std::span<const float> logits, SamplingWorkspace& workspace);

  // Whether the next Sample() is just the argmax of the raw logits (greedy or top_k 1, and no
  // processor active this step): the caller may take the argmax where the logits are instead
  // (Backend::ArgmaxRows, same ties and NaN rules) and skip copying the row.
  bool PlainArgmax() const;

  // The k of a sampled step that needs only the row's k most likely tokens and their raw logits
  // (top_k sampling, 1 < top_k < vocab, top_k <= max_k, no logits processor active this step): the
  // caller may select them where the logits are (Backend::TopKRows) and call SampleFromTopK. 0 when
  // the step needs the whole row.
  int32_t TopKCandidates(int32_t max_k) const;
  // Sample(row) for a step TopKCandidates() allows, from the row's top-k candidates alone: ids and
  // logits of at least TopKCandidates() entries, most likely first, lower id first among equal
  // logits, NaN given as -inf (Backend::TopKRows' order). The same token and the same draw as
  // Sample() over the whole row.
  int32_t SampleFromTopK(std::span<const int32_t> ids, std::span<const float> logits, SamplingWorkspace& workspace);

  // Records `token` as generated: it counts towards min_tokens and the penalties from now on.
  void Accept(int32_t token);

  // Whether generation ends with `token` as its `num_generated`-th output token (1-based, this
  // token included): it is EOS (unless ignore_eos) or a stop id, and num_generated >= min_tokens.
  // max_tokens is the caller's to check.
  bool IsStop(int32_t token, int32_t num_generated) const;

  int32_t num_generated() const { return num_generated_; }
  // Advances the generator by the one draw a sampled step makes, for a step that ran elsewhere
  // (the prefill worker sampled the first token with the same seed).
  void SkipDraw() { NextUniform(); }
  const SamplingParams& params() const { return params_; }

 private:
  bool HasLogitsProcessors() const;
  // Steps 1-4 above on logits [vocab_size].
  void ApplyLogitsProcessors(float* logits) const;
  // The draw over ws.logits_ (processed). `top_k_ids`: the top-k candidates, already selected (then
  // only their entries of ws.logits_ are read).
  int32_t SampleFromProcessed(SamplingWorkspace& ws, const std::vector<int32_t>* top_k_ids = nullptr);
  // A uniform double in [0, 1) from the top 53 bits of one draw: the same on every platform,
  // unlike std::uniform_real_distribution.
  double NextUniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  SamplingParams params_;
  int64_t vocab_size_;
  std::vector<int32_t> eos_token_ids_;    // in-vocabulary EOS ids
  std::vector<int32_t> min_tokens_mask_;  // ids masked while num_generated_ < min_tokens
  std::mt19937_64 rng_;
  int32_t num_generated_ = 0;
  // Kept only when the penalty that reads it is on.
  absl::flat_hash_set<int32_t> seen_tokens_;             // prompt ∪ output, repetition penalty
  absl::flat_hash_map<int32_t, int32_t> output_counts_;  // frequency and presence penalties
  SamplingWorkspace own_workspace_;
};

}  // namespace tandem
