// Speculative decoding in the engine (docs/architecture.md, "Speculative decoding"): the worker's
// options, each sequence's speculation state, and the load-adaptive policy that decides how many
// tokens a sequence proposes in a step.
//
// A step with speculation: before scheduling, the engine gives every decoding sequence that
// speculates a budget (SchedRequest::spec_budget, from SpeculationPolicy); the scheduler makes room
// for that many proposed tokens after the sequence's next one; the proposer fills what it can
// (SchedRequest::draft_tokens); the forward pass computes them with everyone else's rows; and the
// engine verifies them row by row (common/spec/verify.h), keeps the accepted ones plus the target's
// own next token, and rolls the rest back (Scheduler::Update).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/model/llama_model.h"
#include "common/spec/proposer.h"

namespace tandem {

struct SpeculationOptions {
  // What a request that does not say speculates with (--speculative-method; "draft" needs a draft
  // model).
  SpeculationMethod method = SpeculationMethod::kOff;
  int32_t num_tokens = 4;  // k, the most tokens proposed per step (--num-speculative-tokens)
  int32_t ngram_min = 1;   // --ngram-min
  int32_t ngram_max = 4;   // --ngram-max
  bool adaptive = true;    // --speculative-adaptive: SpeculationPolicy below; false: always k
  // Adaptive: the rows (tokens) of decoding sequences one step may hold before proposals stop
  // growing it: while a step stays near the cost of reading the weights once, proposals are almost
  // free; past it they cost throughput (--speculative-step-rows).
  int32_t step_rows = 6;
  // The draft model (--speculative-model), loaded by the caller on the target's backend; it must
  // outlive the engine. Its KV cache shares the pool's blocks (common/spec/draft_proposer.h).
  LlamaModel* draft = nullptr;
};

// Why a decoding sequence's proposal budget is what it is this step (counted per sequence-step:
// tandem_spec_decode_decisions_total{decision}).
enum class SpecDecision : uint8_t {
  kFull,              // k as asked
  kShrunkBatch,       // fewer: the step's row budget ran short
  kShrunkAcceptance,  // fewer: the sequence's recent acceptance makes the last ones unlikely
  kOffBatch,          // none: no rows left in the step
  kOffAcceptance,     // none: acceptance too low; paused for a few steps, then probed with one
};
inline constexpr int kNumSpecDecisions = 5;  // named in metrics' kSpecDecisionNames

struct SpeculationCounts {
  int64_t proposed = 0;
  int64_t accepted = 0;  // proposed tokens kept (the target's own next token not counted)
};

// One sequence's speculation.
struct SequenceSpeculation {
  SpeculationMethod method = SpeculationMethod::kOff;
  int32_t k = 0;  // the most tokens it proposes per step
  SpeculationCounts counts;
  // Moving average of the rate at which a proposed token is kept (given the ones before it were),
  // per verification: kept / (kept + 1 if one was refused).
  double acceptance = 0.8;
  int32_t paused_steps = 0;  // steps left without proposing (kOffAcceptance)
  bool probe = false;        // the pause just ended: the next step proposes one token
  // Draft model: tokens of the sequence whose KV the draft holds, valid while the sequence has
  // been preempted draft_preemptions times (a preemption frees its blocks).
  int64_t draft_computed = 0;
  int64_t draft_preemptions = 0;
  // The last proposal's distributions ([tokens][vocab]; empty when drawn without a sampler).
  std::vector<float> draft_probs;
};

// The worker's speculation counters (EngineStats::speculation; cumulative).
struct SpeculationStats {
  SpeculationCounts counts;
  int64_t verify_steps = 0;  // sequence-steps that verified at least one proposed token
  // Per position i (the i+1-th proposed token of a step): proposed, and kept.
  std::array<int64_t, kMaxSpeculativeTokens> proposed_at{};
  std::array<int64_t, kMaxSpeculativeTokens> accepted_at{};
  std::array<int64_t, kNumSpecDecisions> decisions{};
  // The last step that had speculating sequences: their budgets' mean (the adaptive k in force).
  double k_in_force = 0;
};

// The adaptive policy. Per step, over the decoding sequences in admission order:
//  - rows: a step of `decoding` sequences has step_rows - decoding rows left for proposals (none
//    at step_rows sequences or more); each sequence takes what it wants from what is left;
//  - acceptance: a sequence whose recent acceptance is a proposes at most the largest j with
//    a^j >= kMinGain (the j-th token is kept with probability about a^j, and a row that is rarely
//    kept only costs); below kMinGain it pauses kPauseSteps steps, then proposes one to probe.
class SpeculationPolicy {
 public:
  static constexpr double kMinGain = 0.15;
  static constexpr int32_t kPauseSteps = 8;
  static constexpr double kAverageWeight = 0.15;  // of the newest verification in `acceptance`

  explicit SpeculationPolicy(const SpeculationOptions& options) : options_(options) {}

  // Starts a step with `decoding` sequences decoding.
  void BeginStep(int64_t decoding);
  // The budget of a sequence that wants `wanted` tokens (its k, already cut to what max_tokens and
  // the context leave), and why; advances its pause.
  int32_t Budget(SequenceSpeculation* seq, int32_t wanted, SpecDecision* decision);
  // A verification's outcome, for the sequence's acceptance.
  static void Record(SequenceSpeculation* seq, int32_t proposed, int32_t accepted);

 private:
  SpeculationOptions options_;
  int64_t rows_left_ = 0;
};

}  // namespace tandem
