// Next-token selection for one sequence, and vLLM-style log-probabilities over one row of logits.
//
// A SequenceSampler holds everything sampling needs to remember about its sequence: its own random
// generator, the prompt tokens and the counts of generated tokens (for the penalties), and how many
// tokens were generated (for min_tokens). Nothing is shared between sequences, so a seeded request
// draws the same tokens whatever else is in the batch and in whatever order the batch is sampled.
//
// Per step, on a copy of the logits (the input is never modified), in vLLM's order:
//   0. a TokenConstraint (structured output), when set: tokens it does not allow get -inf, and EOS
//      is allowed only where the output is complete (and then always: it ends the output);
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
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/sampling/device_sampling.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/token_constraint.h"

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

// What a sampled step can leave to the device that holds its logits (SequenceSampler::DevicePlan).
struct DeviceSamplingPlan {
  enum class Kind : uint8_t {
    kHost,     // the whole row comes to the host: Sample()
    kArgmax,   // greedy: the argmax of the (edited) row, Backend::ArgmaxRows
    kTopK,     // top-k sampling: the row's k most likely tokens, SampleFromTopK()
    kNucleus,  // top-p without top-k: k candidates and the row's weight total, SampleFromNucleus()
    kDraw,     // temperature and min-p over the whole row: the device draws (DrawForDevice)
  };
  Kind kind = Kind::kHost;
  int32_t k = 0;  // kTopK, kNucleus: the candidates wanted
  // Logits processors are active: their LogitEdits are applied on the device first.
  bool edits = false;
};

// The token a sampled step without top-k and top-p takes from a processed row with uniform draw u:
// weights exp((logit - max) × inv_temperature) (NaN and -inf weigh 0; those below min_p count 0),
// the first token by id whose running sum exceeds u × the sum; the argmax when the largest logit is
// not finite. RowDraw::kDraw's definition (a device computes it to rounding). `weights`: scratch
// [vocab].
int32_t DrawFromRow(const float* logits, int64_t vocab, float inv_temperature, float min_p,
                    double u, float* weights);
// The row's weight total, summed in id order in double (RowDraw::kTotal's definition); 0 when the
// largest logit is not finite.
double RowWeightTotal(const float* logits, int64_t vocab, float inv_temperature);

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

  // The same over a row whose logits processors were already applied (AppendLogitEdits on the
  // device): the row a kNucleus step falls back to.
  int32_t SampleProcessed(std::span<const float> processed, SamplingWorkspace& workspace);

  // Whether the next Sample() is just the argmax of the raw logits (greedy or top_k 1, and no
  // processor active this step): the caller may take the argmax where the logits are instead
  // (Backend::ArgmaxRows, same ties and NaN rules) and skip copying the row.
  bool PlainArgmax() const;

  // How the next step can sample where the logits are, on a device that selects at most max_k
  // candidates a row: greedy → kArgmax; top_k in (1, vocab) → kTopK when top_k <= max_k, else
  // kHost; top_k off and top_p < 1 → kNucleus over min(max_k, vocab) candidates; top_k and top_p
  // off → kDraw. `edits` when a logits processor is active this step.
  DeviceSamplingPlan DevicePlan(int32_t max_k) const;
  // Appends this step's logits processors as edits of logits row `row`, one per token touched (in
  // no particular order). The edited row is bit-identical to what Sample() processes.
  void AppendLogitEdits(int32_t row, std::vector<LogitEdit>* edits) const;

  // Sample(row) for a kTopK step, from the (edited) row's top-k candidates alone: ids and logits of
  // at least k entries, most likely first, lower id first among equal logits, NaN given as -inf
  // (DeviceSampler::TopKRows' order). The same token and the same draw as Sample() over the whole
  // row.
  int32_t SampleFromTopK(std::span<const int32_t> ids, std::span<const float> logits,
                         SamplingWorkspace& workspace);
  // Sample(row) for a kNucleus step from the (edited) row's top candidates (as SampleFromTopK's)
  // and its weight total (RowDraw::kTotal): the nucleus is the most likely candidates whose weights
  // reach top_p × total, drawn from in Sample()'s order; the same token as Sample() unless the cut
  // falls within rounding of the target. nullopt, with nothing drawn, when the nucleus is wider
  // than the candidates: the step then needs the edited row (SampleProcessed).
  std::optional<int32_t> SampleFromNucleus(std::span<const int32_t> ids,
                                           std::span<const float> logits, double total,
                                           SamplingWorkspace& workspace);
  // The uniform draw of a kDraw step, whose token the device picks (RowDraw::kDraw); the caller
  // then Accept()s it.
  double DrawForDevice();
  // 1 / temperature, as the sampler's weights use it.
  float inv_temperature() const { return 1.f / params_.temperature; }

  // The distribution Sample() draws the next token from, as probabilities [vocab_size] (raw logits
  // in): the logits processors with this sequence's state, then temperature, top-k, top-p and
  // min-p; greedy (or top_k 1) puts all the mass on the argmax. Draws nothing. Speculative
  // decoding verifies proposed tokens against it (common/spec/verify.h).
  void Distribution(std::span<const float> logits, SamplingWorkspace& workspace,
                    std::vector<float>* probs);
  // One uniform number in [0, 1) from the sequence's generator (a verification's decisions and
  // draws: seeded requests repeat).
  double Uniform() { return NextUniform(); }

  // A sampler with this one's parameters and history (generated count, penalties' counts) and its
  // own generator seeded with `seed`: a draft model draws its proposals with it, as the sequence
  // would, without touching the sequence's state.
  std::unique_ptr<SequenceSampler> Fork(uint64_t seed) const;

  // Records `token` as generated: it counts towards min_tokens and the penalties from now on, and
  // moves the constraint on.
  void Accept(int32_t token);

  // Structured output: every later step follows `constraint` (step 0 above). The sampler then
  // needs whole rows (DevicePlan kHost, never PlainArgmax).
  void set_constraint(std::unique_ptr<TokenConstraint> constraint);
  bool constrained() const { return constraint_ != nullptr; }

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
  // What the presence and frequency penalties subtract from a token generated `count` times.
  float PenaltySubtraction(int32_t count) const {
    return params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
  }
  // Sample() with or without step 1-4 (a processed row).
  int32_t SampleRow(std::span<const float> logits, SamplingWorkspace& ws, bool apply_processors);
  // The tokens a sampled step draws among, over ws.logits_ (processed): every token (all_tokens,
  // n = vocab) or ws.ids_[0, n), each with its weight in ws.weights_ (min_p not yet applied);
  // `degenerate` when the largest logit is not finite (the step takes `best`).
  struct Candidates {
    bool all_tokens = true;
    size_t n = 0;
    int32_t best = 0;
    bool degenerate = false;
  };
  Candidates SelectCandidates(SamplingWorkspace& ws, const std::vector<int32_t>* top_k_ids) const;
  // The draw over ws.logits_ (processed). `top_k_ids`: the top-k candidates, already selected (then
  // only their entries of ws.logits_ are read).
  int32_t SampleFromProcessed(SamplingWorkspace& ws,
                              const std::vector<int32_t>* top_k_ids = nullptr);
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
  std::unique_ptr<TokenConstraint> constraint_;
  // The constraint's allowed tokens for the next step, and whether they are current.
  mutable std::vector<uint64_t> allowed_;
  mutable bool allowed_current_ = false;
  mutable std::vector<float> eos_logits_;  // [EOS ids] their logits while the mask is applied
};

}  // namespace tandem
