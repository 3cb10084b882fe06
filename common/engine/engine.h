// The engine: the step loop tying scheduler, KV cache and model together (schedule → run →
// postprocess). Requests are added at any time and join the batch at the next step; each step
// computes running decodes and prompt chunks together under the token budget, samples, and reports
// per-request outputs. Abort works in any state and returns every block. Single-threaded: the
// caller drives Step() (a service wraps it in its own thread).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/backend/kv_cache_storage.h"
#include "common/engine/speculation.h"
#include "common/engine/step_plan.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/llama_model.h"
#include "common/sampling/finish_reason.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/sched/scheduler.h"
#include "common/spec/draft_proposer.h"
#include "common/spec/ngram_proposer.h"
#include "common/structured/structured_output.h"

namespace tandem {

struct EngineOptions {
  int64_t block_size = 16;
  // Bytes of KV cache (K and V, all layers). 0: on a backend that reports device memory (CUDA),
  // what gpu_memory_utilization leaves after the weights and the profiled activation peak;
  // elsewhere (CPU) room for min(max_num_seqs, 8) sequences of max_model_len.
  int64_t kv_cache_memory = 0;
  // Share of the device's total memory this engine may take for itself (weights + activations + KV
  // cache), whatever other processes hold; the pool never takes more than is free.
  double gpu_memory_utilization = 0.9;
  bool enable_prefix_caching = true;
  // What the KV cache stores. Unset ("auto"): on a GPU backend the model's dtype when it is BF16 or
  // F16 (half the memory and attention reads of f32), else f32.
  std::optional<DType> kv_cache_dtype;
  SchedulerConfig scheduler;  // max_model_len 0 → the model's max_position_embeddings
  int32_t max_logprobs = 20;  // cap on logprobs / prompt_logprobs per request
  // Decode steps as CUDA graphs where the backend has them (ModelRunner::set_use_graphs).
  bool cuda_graphs = true;
  // Sampling where the logits are, when the backend can (DeviceSampler::SupportsSampling: CUDA);
  // false: every sampled row's logits come to the host sampler, as on the CPU.
  bool device_sampling = true;
  // Speculative decoding's worker defaults and policy (speculation.h). Off in the prefill role.
  SpeculationOptions speculation;
  // The model's tokens as bytes, for structured output (SamplingParams::structured_output); null:
  // requests that ask for it are refused (FAILED_PRECONDITION).
  std::shared_ptr<const structured::TokenVocabulary> vocabulary;
};

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  // Speculative decoding for this request; unset: the worker's --speculative-method. 0 tokens: the
  // worker's --num-speculative-tokens.
  std::optional<SpeculationMethod> speculation;
  int32_t num_speculative_tokens = 0;
  // A request resumed elsewhere (the router migrating it off a lost decode worker): the last
  // resumed_output_tokens of prompt_token_ids are output it already generated and streamed. They
  // count as generated for max_tokens, min_tokens and the penalties, move the structured-output
  // constraint on, and advance the sampler's generator by the one draw each took (a sampled step
  // without speculation draws exactly one number: a seeded request goes on with the draws it
  // would have made). In [0, prompt length); less than params.max_tokens.
  int32_t resumed_output_tokens = 0;
};

// What one step produced for one request.
struct RequestOutput {
  std::string id;
  std::vector<int32_t> new_token_ids;
  std::vector<LogprobEntry> new_logprobs;  // when params.logprobs >= 0
  // Sent once, with the request's first output, when params.prompt_logprobs >= 0.
  std::optional<std::vector<std::optional<LogprobEntry>>> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;  // set when finished
  int64_t num_cached_tokens = 0;
  // With a request's first output: when its first prompt chunk was scheduled (queue time ends).
  absl::Time first_scheduled = absl::InfinitePast();
  // A request that speculates: its counts so far (with every output, an abort's included).
  std::optional<SpeculationCounts> speculation;
};

struct EngineStats {
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t preemptions = 0;
  int64_t prefix_queries = 0;  // tokens
  int64_t prefix_hits = 0;     // tokens
  int64_t steps = 0;
  int64_t computed_tokens = 0;
  // Wall time of the steps Step() ran, from scheduling to its return, and the part of it in the
  // model's forward pass (on a GPU: launching the step and waiting for its results); the rest is
  // the host's share (scheduling, batch assembly, sampling and stop bookkeeping). Cumulative
  // seconds.
  double step_seconds = 0;
  double forward_seconds = 0;
  // The part of forward_seconds in steps that computed prompt tokens (prefill chunks, alone or
  // mixed with decode rows); the rest was in decode-only steps.
  double prompt_forward_seconds = 0;
  int64_t max_model_len = 0;
  int64_t last_step_tokens = 0;     // tokens computed by the last step
  int64_t last_step_sequences = 0;  // sequences in the last step
  // Sampled tokens by where they were chosen (cumulative): rows sampled where the logits are
  // (argmax, candidates, draws) and rows whose logits came to the host sampler; and top-p rows
  // whose nucleus outgrew the device's candidates (their logits came to the host after all).
  int64_t sampled_on_device = 0;
  int64_t sampled_on_host = 0;
  int64_t sampling_row_copies = 0;
  SpeculationStats speculation;
  // Structured output (cumulative): token masks by whether they were computed or cached, and the
  // seconds the sampler spent getting them.
  int64_t structured_masks_computed = 0;
  int64_t structured_masks_cached = 0;
  double structured_mask_seconds = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(LlamaModel* model,
                                                        const EngineOptions& options);
  ~Engine();

  // Validates every field (sampling parameters, ids, lengths) and queues the request.
  // INVALID_ARGUMENT / RESOURCE_EXHAUSTED (queue full) / ALREADY_EXISTS before any work.
  absl::Status AddRequest(EngineRequest request);
  // The checks of AddRequest without queueing (ids, lengths, sampling parameters).
  absl::Status Validate(const EngineRequest& request) const;
  // Ends a request wherever it is (waiting, mid-prefill, decoding); its blocks return to the pool.
  // NOT_FOUND when unknown. The abort is reported by the next Step() as FinishReason::kAbort.
  absl::Status Abort(const std::string& id);
  // Prefill role: a request is handed out after its first token (FinishReason::kPrefillDone)
  // with its KV blocks kept for the transfer; Release() returns them. Decode role: Reserve()
  // blocks for arriving KV, then AdmitPrefilled() the request (prompt + first token).
  // Release() also drops a reservation that was never admitted (failed or cancelled transfer).
  absl::Status Release(const std::string& id);
  // Prefill role: called during Step() after each layer's KV is written, with the requests whose
  // prompt that step completes (their layer is then final and can be sent while the next layer
  // computes). Runs on the stepping thread; keep it short or hand the work to a transfer thread.
  using LayerListener =
      std::function<void(int64_t layer, const std::vector<std::string>& completed_ids)>;
  void set_layer_listener(LayerListener listener) { layer_listener_ = std::move(listener); }
  absl::StatusOr<std::vector<int32_t>> Reserve(const std::string& id, int64_t num_tokens);
  // When the first token already ends the request (a stop, max_tokens 1, the context is full), the
  // blocks are freed and the next Step() reports it finished with no new token.
  absl::Status AdmitPrefilled(EngineRequest request, int32_t first_token);

  // Runs one step. Returns the outputs of requests that progressed, finished or were aborted.
  absl::StatusOr<std::vector<RequestOutput>> Step();
  bool HasWork() const { return scheduler_->has_work() || !pending_outputs_.empty(); }
  EngineStats stats() const;
  const KvCacheManager& kv() const { return *kv_; }
  // The device memory of the KV cache, and a request's blocks in it (for KV transfer: the blocks
  // of a handed-out request on a prefill engine, of a reservation on a decode engine).
  KvCacheStorage* kv_storage() { return storage_.get(); }
  const std::vector<int32_t>& block_table(const std::string& id) const {
    return kv_->BlockTable(id);
  }

 private:
  // What the forward pass brought back for a plan's rows.
  struct StepResults {
    std::vector<float> logits;    // [rows][vocab]; empty when no row needs host logits
    std::vector<int32_t> argmax;  // per row (argmax_only rows)
    std::vector<std::optional<RowLogprobs>> logprobs;  // per row, computed where the logits are
    DeviceSamples samples;  // candidates, draws, totals (device sampling)
  };
  Engine() = default;
  // The step, in order (Step() calls each once): which rows the scheduled chunks need and what for;
  // the forward pass; each sampling row's token (-1 for rows that do not sample); the logprobs of
  // tokens drawn on the device; then outputs, prompt logprobs, the scheduler's update and finishes.
  StepPlan PlanStep(const SchedulerStep& step, absl::Time step_start);
  absl::Status RunForward(const StepPlan& plan, StepResults* out);
  absl::StatusOr<std::vector<int32_t>> SampleRows(const StepPlan& plan, const StepResults& res);
  absl::Status LogprobsAfterSampling(const StepPlan& plan, const std::vector<int32_t>& chosen,
                                     StepResults* res);
  void Postprocess(const SchedulerStep& step, const StepPlan& plan,
                   const std::vector<int32_t>& chosen, const StepResults& res,
                   std::vector<RequestOutput>* outputs);
  // Speculative decoding: proposal budgets for the decoding sequences (before Schedule), the
  // proposals themselves in the room the scheduler made (the chunks shrink to what was proposed),
  // and one sequence's verification (its rows from `first_row`): the tokens it emits, in order,
  // each accepted into its sampler, ending at a stop, max_tokens or the context; their logprobs
  // when asked.
  void PrepareSpeculation();
  absl::Status Propose(SchedulerStep* step);
  void ShrinkToProposal(SchedulerStep* step, ScheduledChunk* chunk, std::vector<int32_t> tokens);
  void VerifyRows(const StepPlan& plan, size_t first_row, const StepResults& res,
                  std::vector<int32_t>* tokens, std::vector<LogprobEntry>* logprobs);
  // Where max_tokens or the context end a sequence that has emitted `generated` tokens and holds
  // `num_tokens` (a stop id is the sampler's).
  bool ReachedLength(const SequenceState& seq, int64_t generated, int64_t num_tokens) const;
  void FinishRequest(const std::string& id);
  absl::Status ValidateParams(const EngineRequest& req) const;
  // The automaton of a request's structured output (compiled or cached); FAILED_PRECONDITION
  // without a vocabulary, INVALID_ARGUMENT for a schema the grammar cannot express.
  absl::StatusOr<std::shared_ptr<structured::GrammarAutomaton>> StructuredAutomaton(
      const StructuredOutput& spec) const;
  // A request's sampler, with its structured output's constraint when it asks for one.
  absl::StatusOr<std::unique_ptr<SequenceSampler>> NewSampler(const EngineRequest& req) const;
  // A new sequence's state: its sampler over `sampler`, its speculation as asked (off for
  // structured output).
  SequenceState NewSequence(const EngineRequest& req,
                            std::unique_ptr<SequenceSampler> sampler) const;

  LlamaModel* model_ = nullptr;
  EngineOptions options_;
  std::unique_ptr<KvCacheStorage> storage_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  absl::flat_hash_map<std::string, SequenceState> sequences_;
  std::vector<RequestOutput> pending_outputs_;  // aborts and admissions that ended at once
  std::vector<int32_t> eos_ids_;
  SamplingWorkspace workspace_;
  std::vector<float> edited_row_;  // a row copied for a wide nucleus
  int64_t nucleus_row_copies_ = 0;
  int64_t sampled_on_device_ = 0, sampled_on_host_ = 0;
  LayerListener layer_listener_;
  std::unique_ptr<NgramProposer> ngram_;
  std::unique_ptr<DraftModelProposer> draft_;  // with --speculative-model
  std::unique_ptr<SpeculationPolicy> spec_policy_;
  std::unique_ptr<structured::StructuredOutputCompiler> structured_;  // with options.vocabulary
  SpeculationStats spec_stats_;
  std::vector<float> verify_probs_;  // [vocab] a verification row's distribution
  int64_t steps_ = 0;
  int64_t computed_tokens_ = 0;
  double step_seconds_ = 0, forward_seconds_ = 0, prompt_forward_seconds_ = 0;
  int64_t last_step_tokens_ = 0;
  int64_t last_step_sequences_ = 0;
};

}  // namespace tandem
