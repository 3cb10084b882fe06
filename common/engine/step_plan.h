// One engine step, typed: Engine::Step() is schedule → plan → run → postprocess, and this is the
// plan. The scheduler says which sequences compute how many tokens (SchedulerStep); the plan adds,
// for every logits row the step needs, what that row is for and how it is sampled and scored,
// decided once per row instead of in parallel per-row vectors. PackForward() turns a plan into the
// model runner's input (common/backend/model_runner.h: ForwardInput).
//
// Shape: seqs in the scheduler's order; rows grouped by sequence, ascending position within one.
// A sequence contributes its new tokens' rows that need logits: prompt-logprob rows, and the last
// row when it samples. Speculative decoding (issue 29) adds verification rows, several per sequence
// (one per draft token plus the bonus), as further RowPlans of that sequence; a draft model's
// sequences join a plan of their own model's step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "common/backend/model_runner.h"
#include "common/engine/speculation.h"
#include "common/sampling/device_sampling.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/sched/request.h"

namespace tandem {

// What the engine keeps for a running request besides the scheduler's view of it.
struct SequenceState {
  std::unique_ptr<SequenceSampler> sampler;
  SamplingParams params;
  int64_t prompt_logprobs_sent_until = 1;  // prompt positions [1, this) already computed
  std::vector<std::optional<LogprobEntry>> prompt_logprobs;
  absl::Time first_scheduled = absl::InfinitePast();
  bool first_output_sent = false;
  SequenceSpeculation spec;
  // Output generated before the request was resumed here (EngineRequest::resumed_output_tokens):
  // the scheduler counts it as prompt, the stop and length checks as generated.
  int64_t resumed = 0;
};

// One sequence's part of a step.
struct SeqPlan {
  SchedRequest* request = nullptr;  // the scheduler's; alive until the step's Scheduler::Update
  SequenceState* state = nullptr;   // the engine's
  int64_t begin = 0;                // tokens already computed (cached)
  int64_t num_new_tokens = 0;  // request->token_ids[begin, begin + num_new_tokens) computed now
  bool samples = false;        // its next token is sampled this step
  // Speculating: the last num_draft_tokens of the new tokens are request->draft_tokens, and the
  // sequence's last num_draft_tokens + 1 rows verify them (RowPlan::verify).
  int64_t num_draft_tokens = 0;
};

// One logits row: whose, where, and what for.
struct RowPlan {
  int32_t seq = 0;               // index into StepPlan::seqs
  int64_t position = 0;          // absolute position of the row's token in its sequence
  bool prompt_logprobs = false;  // gives the distribution of prompt position + 1
  bool last = false;    // the sequence's last row this step, which samples (SeqPlan::samples)
  bool sample = false;  // the sequence's next token is drawn from it: last, unless max_tokens is 0
  // One of a speculating sequence's verification rows (SeqPlan::num_draft_tokens + 1 of them, the
  // last with `last` set): the engine verifies them together, and none has `sample`.
  bool verify = false;
  // How the draw happens. kHost: from the row's logits on the host; otherwise on the device, as
  // DeviceSamplingPlan says (kArgmax: argmax_only; kTopK/kNucleus: sample_top_k candidates; kDraw).
  DeviceSamplingPlan::Kind sampling = DeviceSamplingPlan::Kind::kHost;
  bool argmax_only = false;  // only the row's argmax comes back (plain greedy, or kArgmax)
  int32_t sample_top_k = 0;  // candidates wanted from the device
  RowDraw draw;              // the device's draw or weight total
  // The token whose logprobs are computed with the logits (ForwardInput::logprob_tokens; -1: the
  // argmax), or ForwardInput::kNoLogprobs.
  int32_t logprob_token = ForwardInput::kNoLogprobs;
  // The sampled token's logprobs, computed where the logits are once it is drawn (a device draw).
  bool logprobs_after = false;
  bool sampled_on_device() const {
    return argmax_only || sampling != DeviceSamplingPlan::Kind::kHost;
  }
};

struct StepPlan {
  std::vector<SeqPlan> seqs;
  std::vector<RowPlan> rows;
  std::vector<LogitEdit>
      logit_edits;               // logits processors run on the device (LogitEdit::row: rows index)
  int32_t logprob_top_k = 0;     // top entries wanted by rows with a logprob_token
  bool computes_prompt = false;  // some sequence computes prompt tokens (EngineStats)
  bool allow_graph = false;      // the step may replay a captured decode graph
};

// The model's input for `plan`: tokens, positions and block tables per sequence, and the per-row
// requests in ForwardInput's terms. `block_table(request)` gives a request's blocks.
template <typename BlockTableFn>
ForwardInput PackForward(const StepPlan& plan, BlockTableFn&& block_table) {
  ForwardInput in;
  in.allow_graph = plan.allow_graph;
  std::vector<int64_t> row0(plan.seqs.size());
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const SeqPlan& sp = plan.seqs[s];
    row0[s] = static_cast<int64_t>(in.token_ids.size());
    const auto& ids = sp.request->token_ids;
    const int64_t known = sp.num_new_tokens - sp.num_draft_tokens;
    in.token_ids.insert(in.token_ids.end(), ids.begin() + sp.begin, ids.begin() + sp.begin + known);
    in.token_ids.insert(in.token_ids.end(), sp.request->draft_tokens.begin(),
                        sp.request->draft_tokens.begin() + sp.num_draft_tokens);
    in.seqs.push_back({sp.num_new_tokens, sp.begin, block_table(*sp.request)});
  }
  for (const RowPlan& r : plan.rows) {
    in.logits_rows.push_back(
        static_cast<int32_t>(row0[r.seq] + (r.position - plan.seqs[r.seq].begin)));
    in.argmax_only.push_back(r.argmax_only);
    in.sample_top_k.push_back(r.sample_top_k);
    in.sample_draws.push_back(r.draw);
    in.logprob_tokens.push_back(r.logprob_token);
  }
  in.logit_edits = plan.logit_edits;
  in.logprob_top_k = plan.logprob_top_k;
  return in;
}

}  // namespace tandem
