#include "common/engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/spec/verify.h"

namespace tandem {

Engine::~Engine() = default;

namespace {

std::string Size(int64_t bytes) {
  return bytes >= (int64_t{1} << 30) ? absl::StrFormat("%.2f GiB", bytes / double(int64_t{1} << 30))
                                     : absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
}

// Runs the largest step the scheduler can build once on a scratch cache, so the model's activation
// buffers reach their peak: max_num_batched_tokens prompt tokens (spread over as many sequences as
// max_model_len and max_num_seqs require), each sequence with a block table of a full
// max_model_len, and logits for every row (a prompt chunk with prompt_logprobs asks for all of
// them). Then the KV cache gets what gpu_memory_utilization leaves of the device after this
// engine's own use (weights, activations, library workspaces), and never more than is free.
absl::StatusOr<int64_t> PlanKvMemory(LlamaModel* model, const EngineOptions& o,
                                     const SchedulerConfig& sc, const DeviceMemory& before) {
  const double util = o.gpu_memory_utilization;
  if (!(util > 0.0 && util <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", util));
  }
  const int64_t max_len = std::max<int64_t>(1, sc.max_model_len);
  const int64_t tokens = std::max<int64_t>(
      1, std::min(sc.max_num_batched_tokens, std::max<int64_t>(1, sc.max_num_seqs) * max_len));
  const int64_t seqs = std::max((tokens + max_len - 1) / max_len,
                                std::min<int64_t>(std::max<int64_t>(1, sc.max_num_seqs), tokens));
  const int64_t table_len = (max_len + o.block_size - 1) / o.block_size;
  {
    ASSIGN_OR_RETURN(auto scratch, KvCacheStorage::Create(
                                       model->backend(),
                                       model->KvGeometry(table_len, o.block_size,
                                                         model->KvCacheDType(o.kv_cache_dtype))));
    std::vector<int32_t> table(static_cast<size_t>(table_len));
    for (int64_t b = 0; b < table_len; ++b) table[b] = static_cast<int32_t>(b);
    ForwardInput in;
    in.token_ids.assign(static_cast<size_t>(tokens), 0);
    // The sequences share one table: only the shapes matter here.
    for (int64_t s = 0; s < seqs; ++s) {
      in.seqs.push_back({tokens / seqs + (s < tokens % seqs ? 1 : 0), 0, table});
    }
    for (int64_t r = 0; r < tokens; ++r) in.logits_rows.push_back(static_cast<int32_t>(r));
    std::vector<float> logits;
    absl::Status s = model->runner().Forward(in, scratch.get(), &logits);
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat("profiling the activation peak: ", s.message()));
  }
  ASSIGN_OR_RETURN(const DeviceMemory after, model->backend()->Memory());
  const int64_t own = after.own_bytes;
  const int64_t budget = static_cast<int64_t>(util * static_cast<double>(after.total_bytes));
  const int64_t activations = std::max<int64_t>(0, after.own_bytes - before.own_bytes);
  // Leave the device a little slack beyond what is free now (other processes, the driver).
  const int64_t slack = std::min<int64_t>(int64_t{256} << 20, after.total_bytes / 100);
  const int64_t available = std::max<int64_t>(0, after.free_bytes - slack);
  const int64_t kv = std::min(budget - own, available);
  TANDEM_LOG(INFO) << "memory plan: device " << Size(after.total_bytes) << " × " << util << " = "
                   << Size(budget) << "; this engine uses " << Size(own)
                   << " (weights and other buffers " << Size(own - activations)
                   << ", activations of a " << tokens << "-token step " << Size(activations)
                   << "); free " << Size(after.free_bytes) << "; KV cache gets "
                   << Size(std::max<int64_t>(0, kv));
  // What the backend does not count (libraries' own memory), or other processes' allocations
  // meanwhile.
  TANDEM_LOG(INFO) << "memory plan: free memory fell by "
                   << Size(before.free_bytes - after.free_bytes)
                   << " during the profile, this engine's own by " << Size(activations)
                   << "; graphs, NCCL and later "
                   << "library allocations come out of the " << Size(slack) << " of slack";
  if (kv <= 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--gpu-memory-utilization ", util,
                     " leaves no room for the KV cache: this engine already uses ", Size(own),
                     " (weights and activations) of the ", Size(budget), " allowed, and ",
                     Size(after.free_bytes),
                     " of the device are free; raise it, lower --max-num-batched-tokens, or give "
                     "--kv-cache-memory"));
  }
  return kv;
}

// A device-computed row as the sampler's ComputeLogprobs would give it, with `top_k` entries.
LogprobEntry FromDevice(const RowLogprobs& d, int32_t top_k) {
  LogprobEntry e{d.token, d.logprob, d.rank, {}};
  for (int32_t i = 0; i < top_k && i < static_cast<int32_t>(d.top_ids.size()); ++i) {
    e.top.push_back({d.top_ids[i], d.top_logprobs[i]});
  }
  return e;
}

absl::Status ValidateSpeculation(const SpeculationOptions& o) {
  if (o.num_tokens < 1 || o.num_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("--num-speculative-tokens must be in [1, ",
                                                   kMaxSpeculativeTokens, "], got ", o.num_tokens));
  }
  if (o.step_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-step-rows must be at least 1, got ", o.step_rows));
  }
  if (o.method == SpeculationMethod::kDraft && o.draft == nullptr) {
    return absl::InvalidArgumentError(
        "--speculative-method draft needs a draft model (--speculative-model), which this engine "
        "was not given");
  }
  return absl::OkStatus();
}

absl::Status ValidateDraft(const LlamaModel& target, const LlamaModel& draft) {
  if (draft.config().vocab_size != target.config().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the draft model's vocabulary (", draft.config().vocab_size,
                     " tokens) differs from the target's (", target.config().vocab_size,
                     "): speculative decoding needs a draft with the target's tokenizer"));
  }
  if (draft.backend() != target.backend()) {
    return absl::InvalidArgumentError("the draft model must be on the target's device");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(LlamaModel* model,
                                                       const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->model_ = model;
  e->options_ = options;
  // A prefill worker samples one token a request: nothing to speculate.
  if (options.scheduler.role == SchedulerRole::kPrefill) e->options_.speculation = {};
  LlamaModel* draft = e->options_.speculation.draft;
  if (draft != nullptr) RETURN_IF_ERROR(ValidateDraft(*model, *draft));
  model->runner().set_use_graphs(options.cuda_graphs);
  const ModelConfig& c = model->config();
  SchedulerConfig& sc = e->options_.scheduler;
  if (sc.max_model_len <= 0 || sc.max_model_len > c.max_position_embeddings) {
    sc.max_model_len = c.max_position_embeddings;
  }
  if (options.block_size <= 0 || options.block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be in [1, 1024], got ", options.block_size));
  }
  const DType kv_dtype = model->KvCacheDType(options.kv_cache_dtype);
  // A draft model's KV cache shares the pool's blocks: each block holds both models' KV.
  const int64_t bytes_per_block =
      KvCacheStorage::BytesPerBlock(model->KvGeometry(1, options.block_size, kv_dtype)) +
      (draft != nullptr
           ? DraftModelProposer::BytesPerBlock(*draft, options.block_size, options.kv_cache_dtype)
           : 0);
  int64_t memory = options.kv_cache_memory;
  if (memory < 0) return absl::InvalidArgumentError("--kv-cache-memory must be >= 0");
  absl::StatusOr<DeviceMemory> device_memory = model->backend()->Memory();
  if (!device_memory.ok() && !absl::IsUnimplemented(device_memory.status()))
    return device_memory.status();
  const bool planned = memory == 0 && device_memory.ok();
  if (planned) {
    ASSIGN_OR_RETURN(memory, PlanKvMemory(model, options, sc, *device_memory));
  } else if (memory == 0) {
    memory = bytes_per_block * ((sc.max_model_len + options.block_size - 1) / options.block_size) *
             std::min<int64_t>(sc.max_num_seqs, 8);
  }
  const int64_t num_blocks = memory / bytes_per_block;
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        planned ? "the KV memory left by --gpu-memory-utilization (" : "--kv-cache-memory of ",
        memory, " bytes", planned ? ")" : "", " holds no block (one block of ", options.block_size,
        " tokens takes ", bytes_per_block, " bytes)"));
  }
  if (num_blocks > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(planned ? "the planned KV memory" : "--kv-cache-memory",
                     " exceeds 2^30 blocks; use a larger --block-size"));
  }
  // Every admitted request must fit the pool on its own (prompt + max_tokens <= max_model_len), so
  // preemption always lets the oldest request finish.
  if (num_blocks * options.block_size < sc.max_model_len) {
    TANDEM_LOG(WARNING) << "max_model_len lowered from " << sc.max_model_len << " to "
                        << num_blocks * options.block_size << ": the KV cache holds no more tokens";
    sc.max_model_len = num_blocks * options.block_size;
  }
  if (sc.max_model_len < 2)
    return absl::InvalidArgumentError("the KV cache must hold at least 2 tokens");
  model->runner().set_graph_context_limit(sc.max_model_len);
  ASSIGN_OR_RETURN(e->storage_, KvCacheStorage::Create(
                                    model->backend(),
                                    model->KvGeometry(num_blocks, options.block_size, kv_dtype)));
  ASSIGN_OR_RETURN(e->kv_, KvCacheManager::Create({static_cast<int32_t>(num_blocks),
                                                   static_cast<int32_t>(options.block_size),
                                                   options.enable_prefix_caching, 0}));
  ASSIGN_OR_RETURN(e->scheduler_, Scheduler::Create(sc, e->kv_.get()));
  const SpeculationOptions& so = e->options_.speculation;
  RETURN_IF_ERROR(ValidateSpeculation(so));
  if (draft != nullptr) {
    draft->runner().set_use_graphs(options.cuda_graphs);
    draft->runner().set_graph_context_limit(sc.max_model_len);
    ASSIGN_OR_RETURN(e->draft_, DraftModelProposer::Create(
                                    draft, {num_blocks, options.block_size, options.kv_cache_dtype,
                                            std::max<int64_t>(1, sc.max_num_batched_tokens)}));
    if (draft->config().max_position_embeddings < sc.max_model_len) {
      TANDEM_LOG(WARNING) << "the draft model's context ("
                          << draft->config().max_position_embeddings
                          << " tokens) is shorter than max_model_len " << sc.max_model_len
                          << ": sequences past it decode without proposals";
    }
  }
  absl::StatusOr<std::unique_ptr<NgramProposer>> ngram =
      NgramProposer::Create({so.ngram_min, so.ngram_max});
  if (!ngram.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--ngram-min ", so.ngram_min, " / --ngram-max ",
                                                   so.ngram_max, ": ", ngram.status().message()));
  }
  e->ngram_ = std::move(ngram).value();
  e->spec_policy_ = std::make_unique<SpeculationPolicy>(so);
  if (c.eos_token_id >= 0) e->eos_ids_.push_back(static_cast<int32_t>(c.eos_token_id));
  if (options.vocabulary != nullptr) {
    e->structured_ = std::make_unique<structured::StructuredOutputCompiler>(options.vocabulary);
  }
  const int64_t tokens = num_blocks * options.block_size;
  TANDEM_LOG(INFO) << "KV cache: " << num_blocks << " blocks of " << options.block_size
                   << " tokens (" << memory / (1 << 20) << " MiB, " << bytes_per_block
                   << " bytes per block, " << DTypeName(kv_dtype) << ") = " << tokens << " tokens, "
                   << num_blocks /
                          ((sc.max_model_len + options.block_size - 1) / options.block_size)
                   << " sequences of " << sc.max_model_len << " tokens; weights "
                   << model->weight_bytes() << " bytes; prefix caching "
                   << (options.enable_prefix_caching ? "on" : "off");
  return e;
}

absl::Status Engine::ValidateParams(const EngineRequest& req) const {
  SamplingLimits limits;
  limits.vocab_size = model_->config().vocab_size;
  limits.max_model_len = options_.scheduler.max_model_len;
  limits.prompt_len = static_cast<int64_t>(req.prompt_token_ids.size()) - req.resumed_output_tokens;
  limits.max_logprobs = options_.max_logprobs;
  RETURN_IF_ERROR(req.params.Validate(limits));
  if (req.params.structured_output.kind != StructuredOutput::Kind::kNone) {
    RETURN_IF_ERROR(StructuredAutomaton(req.params.structured_output).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<structured::GrammarAutomaton>> Engine::StructuredAutomaton(
    const StructuredOutput& spec) const {
  if (structured_ == nullptr) {
    return absl::FailedPreconditionError(
        "structured output needs the model's tokenizer, and this engine was started without it");
  }
  return structured_->Automaton(spec);
}

absl::StatusOr<std::unique_ptr<SequenceSampler>> Engine::NewSampler(
    const EngineRequest& req) const {
  const std::span<const int32_t> all(req.prompt_token_ids);
  const size_t prompt_len = all.size() - static_cast<size_t>(req.resumed_output_tokens);
  auto sampler = std::make_unique<SequenceSampler>(req.params, all.first(prompt_len),
                                                   model_->config().vocab_size, eos_ids_);
  if (req.params.structured_output.kind != StructuredOutput::Kind::kNone) {
    ASSIGN_OR_RETURN(std::shared_ptr<structured::GrammarAutomaton> automaton,
                     StructuredAutomaton(req.params.structured_output));
    sampler->set_constraint(std::make_unique<structured::GrammarConstraint>(std::move(automaton)));
  }
  // Output generated before a resumption: each token as its step took it (one draw when sampled).
  for (const int32_t token : all.subspan(prompt_len)) {
    if (!req.params.greedy()) sampler->SkipDraw();
    sampler->Accept(token);
  }
  return sampler;
}

absl::Status Engine::Validate(const EngineRequest& req) const {
  const ModelConfig& c = model_->config();
  if (req.id.empty()) return absl::InvalidArgumentError("request id must not be empty");
  if (req.prompt_token_ids.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  for (size_t i = 0; i < req.prompt_token_ids.size(); ++i) {
    const int32_t t = req.prompt_token_ids[i];
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t, " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  if (req.num_speculative_tokens < 0 || req.num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speculation.num_tokens must be in [1, ", kMaxSpeculativeTokens,
        "] (0: the worker's --num-speculative-tokens), got ", req.num_speculative_tokens));
  }
  if (req.resumed_output_tokens < 0 ||
      req.resumed_output_tokens >= static_cast<int64_t>(req.prompt_token_ids.size()) ||
      (req.resumed_output_tokens > 0 && req.resumed_output_tokens >= req.params.max_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resumed_output_tokens must be in [0, ", req.prompt_token_ids.size(),
        ") and below max_tokens (", req.params.max_tokens, "), got ", req.resumed_output_tokens));
  }
  if (req.speculation == SpeculationMethod::kDraft && draft_ == nullptr) {
    return absl::InvalidArgumentError(
        "speculation method draft needs a worker started with --speculative-model; this one has "
        "no draft model");
  }
  return ValidateParams(req);
}

SequenceState Engine::NewSequence(const EngineRequest& req,
                                  std::unique_ptr<SequenceSampler> sampler) const {
  SequenceState seq;
  seq.params = req.params;
  seq.sampler = std::move(sampler);
  seq.resumed = req.resumed_output_tokens;
  if (options_.scheduler.role != SchedulerRole::kPrefill) {
    seq.spec.method = req.speculation.value_or(options_.speculation.method);
    seq.spec.k = req.num_speculative_tokens > 0 ? req.num_speculative_tokens
                                                : options_.speculation.num_tokens;
    // Proposals would need the constraint at every position they reach: not speculated.
    if (seq.sampler->constrained()) seq.spec.method = SpeculationMethod::kOff;
  }
  return seq;
}

absl::Status Engine::AddRequest(EngineRequest req) {
  if (sequences_.contains(req.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request id \"", req.id, "\" is already in use"));
  }
  RETURN_IF_ERROR(Validate(req));
  ASSIGN_OR_RETURN(std::unique_ptr<SequenceSampler> sampler, NewSampler(req));

  auto r = std::make_unique<SchedRequest>();
  r->id = req.id;
  r->token_ids = req.prompt_token_ids;
  r->max_tokens = req.params.max_tokens - req.resumed_output_tokens;
  r->use_prefix_cache = req.params.prompt_logprobs < 0;
  RETURN_IF_ERROR(scheduler_->AddRequest(std::move(r)));
  SequenceState seq = NewSequence(req, std::move(sampler));
  if (req.params.prompt_logprobs >= 0) seq.prompt_logprobs.resize(req.prompt_token_ids.size());
  sequences_.emplace(req.id, std::move(seq));
  return absl::OkStatus();
}

absl::Status Engine::Release(const std::string& id) {
  SchedRequest* r = scheduler_->Find(id);
  const bool reservation = r == nullptr && kv_->Has(id);
  if (!reservation && (r == nullptr || r->state != RequestState::kHandedOut)) {
    return absl::NotFoundError(absl::StrCat("no handed-out request or reservation \"", id, "\""));
  }
  scheduler_->Release(id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Engine::Reserve(const std::string& id, int64_t num_tokens) {
  return scheduler_->Reserve(id, num_tokens);
}

absl::Status Engine::AdmitPrefilled(EngineRequest req, int32_t first_token) {
  const ModelConfig& c = model_->config();
  if (first_token < 0 || first_token >= c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", first_token, " is outside the vocabulary"));
  }
  RETURN_IF_ERROR(Validate(req));
  const int64_t prompt_len = static_cast<int64_t>(req.prompt_token_ids.size());
  ASSIGN_OR_RETURN(std::unique_ptr<SequenceSampler> sampler, NewSampler(req));
  if (!req.params.greedy()) sampler->SkipDraw();  // the prefill worker drew for the first token
  sampler->Accept(first_token);
  // The first token may already end the request: it is reported by the next Step().
  const int32_t generated = req.resumed_output_tokens + 1;
  FinishReason reason = FinishReason::kNone;
  if (sampler->IsStop(first_token, generated)) {
    reason = FinishReason::kStop;
  } else if (req.params.max_tokens <= generated ||
             prompt_len + 1 >= options_.scheduler.max_model_len) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) {
    if (!kv_->Has(req.id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("request \"", req.id, "\" has no reserved blocks"));
    }
    scheduler_->Finish(req.id);
    RequestOutput o;
    o.id = req.id;
    o.finished = true;
    o.finish_reason = reason;
    pending_outputs_.push_back(std::move(o));
    return absl::OkStatus();
  }
  auto r = std::make_unique<SchedRequest>();
  r->id = req.id;
  r->token_ids = req.prompt_token_ids;
  r->token_ids.push_back(first_token);
  r->prompt_len = static_cast<int64_t>(req.prompt_token_ids.size());
  r->max_tokens = req.params.max_tokens - req.resumed_output_tokens;
  RETURN_IF_ERROR(scheduler_->AdmitPrefilled(std::move(r)));
  sequences_.emplace(req.id, NewSequence(req, std::move(sampler)));
  return absl::OkStatus();
}

absl::Status Engine::Abort(const std::string& id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("no request \"", id, "\""));
  RequestOutput o;
  if (it->second.spec.method != SpeculationMethod::kOff) o.speculation = it->second.spec.counts;
  FinishRequest(id);
  o.id = id;
  o.finished = true;
  o.finish_reason = FinishReason::kAbort;
  pending_outputs_.push_back(std::move(o));
  return absl::OkStatus();
}

void Engine::FinishRequest(const std::string& id) {
  scheduler_->Finish(id);
  sequences_.erase(id);
}

absl::StatusOr<std::vector<RequestOutput>> Engine::Step() {
  std::vector<RequestOutput> outputs;
  outputs.swap(pending_outputs_);

  const absl::Time schedule_start = absl::Now();
  PrepareSpeculation();
  SchedulerStep step = scheduler_->Schedule();
  if (step.empty()) return outputs;
  RETURN_IF_ERROR(Propose(&step));
  const absl::Time step_start = absl::Now();
  // The step's wall time, whichever way it returns.
  struct StepClock {
    absl::Time start;
    double* total;
    ~StepClock() { *total += absl::ToDoubleSeconds(absl::Now() - start); }
  } step_clock{schedule_start, &step_seconds_};

  const StepPlan plan = PlanStep(step, step_start);
  StepResults results;
  RETURN_IF_ERROR(RunForward(plan, &results));
  ++steps_;
  computed_tokens_ += step.num_tokens;
  last_step_tokens_ = step.num_tokens;
  last_step_sequences_ = static_cast<int64_t>(step.chunks.size());
  ASSIGN_OR_RETURN(const std::vector<int32_t> chosen, SampleRows(plan, results));
  RETURN_IF_ERROR(LogprobsAfterSampling(plan, chosen, &results));
  Postprocess(step, plan, chosen, results, &outputs);
  return outputs;
}

StepPlan Engine::PlanStep(const SchedulerStep& step, absl::Time step_start) {
  StepPlan plan;
  plan.allow_graph = options_.scheduler.role != SchedulerRole::kPrefill;
  // Logprobs where the logits are (CUDA): such rows then need no logits on the host.
  const bool device_logprobs = model_->runner().logprobs_on_device();
  // Sampling where the logits are: such rows copy a token, or k candidates, instead of the row.
  const bool device_sampling = options_.device_sampling && model_->runner().samples_on_device();
  using PlanKind = DeviceSamplingPlan::Kind;
  plan.seqs.reserve(step.chunks.size());
  for (const ScheduledChunk& ch : step.chunks) {
    SchedRequest* r = ch.request;
    // Looked up once a step: the per-row work is the host's share of a step.
    SequenceState& seq = sequences_.at(r->id);
    const int64_t begin = r->num_computed_tokens, end = begin + ch.num_new_tokens;
    plan.computes_prompt |= begin < r->prompt_len;
    if (seq.first_scheduled == absl::InfinitePast()) seq.first_scheduled = step_start;
    const int32_t s = static_cast<int32_t>(plan.seqs.size());
    plan.seqs.push_back({r, &seq, begin, ch.num_new_tokens, ch.samples, ch.num_draft_tokens});
    // A speculating sequence's last num_draft_tokens + 1 rows verify its proposal.
    const int64_t verify_from = ch.num_draft_tokens > 0 ? end - 1 - ch.num_draft_tokens : end;
    for (int64_t p = begin; p < end; ++p) {
      RowPlan row;
      row.seq = s;
      row.position = p;
      row.prompt_logprobs = seq.params.prompt_logprobs >= 0 && p + 1 < r->prompt_len &&
                            p + 1 >= seq.prompt_logprobs_sent_until;
      row.last = ch.samples && p == end - 1;
      row.verify = p >= verify_from;
      if (row.verify) {
        // The target's choices: the argmax alone for plain greedy (with its logprobs, when asked,
        // where the logits are); otherwise the row comes to the host, where the sampler's
        // distribution is verified against (VerifyRows).
        const bool lp_on_device = device_logprobs && seq.params.logprobs >= 0 &&
                                  seq.params.logprobs <= ModelRunner::kMaxLogprobsTopK;
        row.argmax_only = seq.sampler->PlainArgmax() && (seq.params.logprobs < 0 || lp_on_device);
        if (row.argmax_only && lp_on_device) {
          row.logprob_token = -1;
          plan.logprob_top_k = std::max(plan.logprob_top_k, seq.params.logprobs);
        }
        plan.rows.push_back(row);
        continue;
      }
      if (!row.prompt_logprobs && !row.last) continue;
      row.sample = row.last && seq.params.max_tokens != 0;
      // A plain greedy step needs the argmax alone, taken on the device, and its logprobs (if
      // asked) can be computed there too.
      const int32_t k = row.prompt_logprobs ? seq.params.prompt_logprobs : seq.params.logprobs;
      const bool lp_on_device = device_logprobs && k >= 0 && k <= ModelRunner::kMaxLogprobsTopK;
      const bool sampled = row.sample && !row.prompt_logprobs;
      row.argmax_only =
          sampled && seq.sampler->PlainArgmax() && (seq.params.logprobs < 0 || lp_on_device);
      // The rest of sampling on the device. A row with logprobs needs them of its raw logits, which
      // the device computes for the sampled token after the step (DeviceSampler::Logprobs): only
      // when no logits processor edits the row.
      DeviceSamplingPlan dp;
      if (device_sampling && sampled && !row.argmax_only &&
          (seq.params.logprobs < 0 || lp_on_device)) {
        dp = seq.sampler->DevicePlan(ModelRunner::kMaxSampleTopK);
        if (seq.params.logprobs >= 0 && dp.edits) dp = DeviceSamplingPlan{};
      }
      row.sampling = dp.kind;
      row.logprobs_after = dp.kind != PlanKind::kHost && seq.params.logprobs >= 0;
      if (dp.edits && dp.kind != PlanKind::kHost) {
        seq.sampler->AppendLogitEdits(static_cast<int32_t>(plan.rows.size()), &plan.logit_edits);
      }
      row.argmax_only |= dp.kind == PlanKind::kArgmax;
      row.sample_top_k = dp.kind == PlanKind::kTopK || dp.kind == PlanKind::kNucleus ? dp.k : 0;
      if (dp.kind == PlanKind::kNucleus || dp.kind == PlanKind::kDraw) {
        row.draw.inv_temperature = seq.sampler->inv_temperature();
        row.draw.mode = dp.kind == PlanKind::kNucleus ? RowDraw::kTotal : RowDraw::kDraw;
        if (dp.kind == PlanKind::kDraw) {
          row.draw.min_p = seq.params.min_p;
          row.draw.u = seq.sampler->DrawForDevice();
        }
      }
      if (lp_on_device && row.prompt_logprobs) row.logprob_token = r->token_ids[p + 1];
      if (lp_on_device && row.argmax_only && seq.params.logprobs >= 0)
        row.logprob_token = -1;  // the argmax
      if (row.logprob_token != ForwardInput::kNoLogprobs)
        plan.logprob_top_k = std::max(plan.logprob_top_k, k);
      plan.rows.push_back(row);
    }
  }
  return plan;
}

absl::Status Engine::RunForward(const StepPlan& plan, StepResults* out) {
  ForwardInput in = PackForward(
      plan, [this](const SchedRequest& r) { return scheduler_->kv()->BlockTable(r.id); });
  if (layer_listener_) {
    // The requests whose prompt this step completes: each layer of theirs is final once written.
    std::vector<std::string> completed;
    for (const SeqPlan& s : plan.seqs) {
      if (s.samples && s.request->num_output_tokens() == 0) completed.push_back(s.request->id);
    }
    if (!completed.empty()) {
      in.on_layer_done = [this, completed](int64_t layer) { layer_listener_(layer, completed); };
    }
  }
  const absl::Time forward_start = absl::Now();
  const absl::Status forwarded = model_->runner().Forward(
      in, storage_.get(), &out->logits, &out->argmax, &out->logprobs, &out->samples);
  const double forward_seconds = absl::ToDoubleSeconds(absl::Now() - forward_start);
  forward_seconds_ += forward_seconds;
  if (plan.computes_prompt) prompt_forward_seconds_ += forward_seconds;
  return forwarded;
}

absl::StatusOr<std::vector<int32_t>> Engine::SampleRows(const StepPlan& plan,
                                                        const StepResults& res) {
  using PlanKind = DeviceSamplingPlan::Kind;
  const int64_t vocab = model_->config().vocab_size;
  // Each sampled row's token (every sequence has its own generator, so the order is free).
  std::vector<int32_t> chosen(plan.rows.size(), -1);
  for (size_t k = 0; k < plan.rows.size(); ++k) {
    const RowPlan& row = plan.rows[k];
    if (!row.sample) continue;
    SequenceState& seq = *plan.seqs[row.seq].state;
    // The row's own candidates: the first sample_top_k of its samples.k.
    const size_t at = k * static_cast<size_t>(res.samples.k),
                 row_k = static_cast<size_t>(row.sample_top_k);
    auto candidate_ids = [&] {
      return std::span<const int32_t>(res.samples.ids.data() + at, row_k);
    };
    auto candidate_logits = [&] {
      return std::span<const float>(res.samples.logits.data() + at, row_k);
    };
    ++(row.sampled_on_device() ? sampled_on_device_ : sampled_on_host_);
    if (row.argmax_only) {
      chosen[k] = res.argmax[k];
    } else if (row.sampling == PlanKind::kTopK) {
      chosen[k] = seq.sampler->SampleFromTopK(candidate_ids(), candidate_logits(), workspace_);
    } else if (row.sampling == PlanKind::kNucleus) {
      const std::optional<int32_t> from_candidates = seq.sampler->SampleFromNucleus(
          candidate_ids(), candidate_logits(), res.samples.totals[k], workspace_);
      if (from_candidates.has_value()) {
        chosen[k] = *from_candidates;
      } else {  // a nucleus wider than the candidates: the edited row, after all
        ++nucleus_row_copies_;
        RETURN_IF_ERROR(model_->runner().CopyLogitsRow(static_cast<int64_t>(k), &edited_row_));
        chosen[k] = seq.sampler->SampleProcessed(edited_row_, workspace_);
      }
    } else if (row.sampling == PlanKind::kDraw) {
      chosen[k] = res.samples.tokens[k];
    } else {
      chosen[k] = seq.sampler->Sample(std::span<const float>(res.logits.data() + k * vocab, vocab),
                                      workspace_);
    }
  }
  return chosen;
}

absl::Status Engine::LogprobsAfterSampling(const StepPlan& plan, const std::vector<int32_t>& chosen,
                                           StepResults* res) {
  std::vector<int32_t> tokens(plan.rows.size(), ForwardInput::kNoLogprobs);
  int32_t top_k = 0;
  bool any = false;
  for (size_t k = 0; k < plan.rows.size(); ++k) {
    if (!plan.rows[k].logprobs_after) continue;
    any = true;
    tokens[k] = chosen[k];
    top_k = std::max(top_k, plan.seqs[plan.rows[k].seq].state->params.logprobs);
  }
  if (!any) return absl::OkStatus();
  std::vector<std::optional<RowLogprobs>> after;
  RETURN_IF_ERROR(model_->runner().LastStepLogprobs(tokens, top_k, &after));
  res->logprobs.resize(plan.rows.size());
  for (size_t k = 0; k < plan.rows.size(); ++k) {
    if (plan.rows[k].logprobs_after) res->logprobs[k] = std::move(after[k]);
  }
  return absl::OkStatus();
}

void Engine::Postprocess(const SchedulerStep& step, const StepPlan& plan,
                         const std::vector<int32_t>& chosen, const StepResults& res,
                         std::vector<RequestOutput>* outputs) {
  const int64_t vocab = model_->config().vocab_size;
  auto from_device = [&](size_t k, int32_t top_k) { return FromDevice(*res.logprobs[k], top_k); };
  auto on_device = [&](size_t k) { return k < res.logprobs.size() && res.logprobs[k].has_value(); };
  std::vector<int32_t> accepted(plan.seqs.size(), 0);  // speculating sequences' kept proposals
  // Per sequence: its sampled token and its output's index (a request has one sequence a step;
  // aborts and ended admissions in `outputs` already are not in the step).
  std::vector<int32_t> sampled(plan.seqs.size(), Scheduler::kNotSampled);
  std::vector<size_t> output_index(plan.seqs.size(), SIZE_MAX);
  std::vector<std::string> prompt_only;
  auto output_for = [&](int32_t s) -> RequestOutput& {
    if (output_index[s] == SIZE_MAX) {
      output_index[s] = outputs->size();
      outputs->emplace_back();
      outputs->back().id = plan.seqs[s].request->id;
      SequenceState& seq = *plan.seqs[s].state;
      if (!seq.first_output_sent) {
        seq.first_output_sent = true;
        outputs->back().first_scheduled = seq.first_scheduled;
      }
    }
    return (*outputs)[output_index[s]];
  };
  for (size_t k = 0; k < plan.rows.size(); ++k) {
    const RowPlan& rp = plan.rows[k];
    SchedRequest* r = plan.seqs[rp.seq].request;
    SequenceState& seq = *plan.seqs[rp.seq].state;
    // Null when no row of the step needs host logits (argmax-only rows, logprobs computed on the
    // device).
    const float* row = res.logits.empty() ? nullptr : res.logits.data() + k * vocab;
    const int64_t p = rp.position;
    if (rp.verify) {
      if (!rp.last) continue;  // verified together, at the sequence's last row
      std::vector<int32_t> tokens;
      std::vector<LogprobEntry> logprobs;
      VerifyRows(plan, k - static_cast<size_t>(plan.seqs[rp.seq].num_draft_tokens), res, &tokens,
                 &logprobs);
      // Every emitted token but the last is a kept proposal; the last is the scheduler's sample.
      accepted[rp.seq] = static_cast<int32_t>(tokens.size()) - 1;
      sampled[rp.seq] = tokens.back();
      RequestOutput& o = output_for(rp.seq);
      o.new_token_ids.insert(o.new_token_ids.end(), tokens.begin(), tokens.end());
      for (LogprobEntry& e : logprobs) o.new_logprobs.push_back(std::move(e));
      o.num_cached_tokens = r->num_cached_tokens;
      continue;
    }
    if (rp.prompt_logprobs) {
      seq.prompt_logprobs[p + 1] = on_device(k) ? from_device(k, seq.params.prompt_logprobs)
                                                : ComputeLogprobs(row, vocab, r->token_ids[p + 1],
                                                                  seq.params.prompt_logprobs);
      if (p + 2 == r->prompt_len) seq.prompt_logprobs_sent_until = r->prompt_len;
    }
    if (rp.last && !rp.sample) {
      // Prompt only (max_tokens 0): the prompt is evaluated, nothing is sampled.
      RequestOutput& o = output_for(rp.seq);
      if (seq.params.prompt_logprobs >= 0) o.prompt_logprobs = seq.prompt_logprobs;
      o.num_cached_tokens = r->num_cached_tokens;
      o.finished = true;
      o.finish_reason = FinishReason::kLength;
      prompt_only.push_back(r->id);
    } else if (rp.sample) {
      const int32_t token = chosen[k];
      seq.sampler->Accept(token);
      sampled[rp.seq] = token;
      RequestOutput& o = output_for(rp.seq);
      o.new_token_ids.push_back(token);
      if (seq.params.logprobs >= 0) {
        LogprobEntry e = on_device(k) ? from_device(k, seq.params.logprobs)
                                      : ComputeLogprobs(row, vocab, token, seq.params.logprobs);
        e.token_id = token;  // the sampled token, whatever a degenerate row's argmax said
        o.new_logprobs.push_back(std::move(e));
      }
      if (seq.params.prompt_logprobs >= 0 && r->num_output_tokens() == 0) {
        o.prompt_logprobs = seq.prompt_logprobs;
      }
      o.num_cached_tokens = r->num_cached_tokens;
    }
  }
  // A speculating request's counts so far travel with each of its outputs.
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const SequenceSpeculation& spec = plan.seqs[s].state->spec;
    if (output_index[s] != SIZE_MAX && spec.method != SpeculationMethod::kOff)
      (*outputs)[output_index[s]].speculation = spec.counts;
  }
  scheduler_->Update(step, sampled, accepted);
  for (const std::string& id : prompt_only) FinishRequest(id);
  // Stop conditions of the sequences that took a token.
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    if (sampled[s] == Scheduler::kNotSampled) continue;
    const int32_t token = sampled[s];
    SchedRequest* r =
        plan.seqs[s].request;  // sampled: not among prompt_only, still the scheduler's
    SequenceState& seq = *plan.seqs[s].state;
    const int32_t generated = static_cast<int32_t>(r->num_output_tokens() + seq.resumed);
    FinishReason reason = FinishReason::kNone;
    if (options_.scheduler.role == SchedulerRole::kPrefill) {
      reason = FinishReason::kPrefillDone;
    } else if (seq.sampler->IsStop(token, generated)) {
      reason = FinishReason::kStop;
    } else if (ReachedLength(seq, generated, r->num_tokens())) {
      reason = FinishReason::kLength;
    }
    if (reason == FinishReason::kNone) continue;
    RequestOutput& o = output_for(static_cast<int32_t>(s));
    o.finished = true;
    o.finish_reason = reason;
    const std::string id = r->id;  // r goes with the request
    if (reason == FinishReason::kPrefillDone) {
      scheduler_->HandOut(id);  // blocks stay until Release()
      sequences_.erase(id);
    } else {
      FinishRequest(id);
    }
  }
}

bool Engine::ReachedLength(const SequenceState& seq, int64_t generated, int64_t num_tokens) const {
  return generated >= seq.params.max_tokens || num_tokens >= options_.scheduler.max_model_len;
}

void Engine::PrepareSpeculation() {
  if (options_.scheduler.role == SchedulerRole::kPrefill) return;
  // Decoding: the prompt is done and a token was sampled, whose KV the next step computes.
  auto decoding = [](const SchedRequest* r) {
    return r->num_output_tokens() > 0 && r->num_computed_tokens == r->num_tokens() - 1;
  };
  int64_t num_decoding = 0;
  for (SchedRequest* r : scheduler_->running()) {
    r->spec_budget = 0;
    num_decoding += decoding(r) ? 1 : 0;
  }
  spec_policy_->BeginStep(num_decoding);
  int64_t budgets = 0, speculating = 0;
  for (SchedRequest* r : scheduler_->running()) {
    if (!decoding(r)) continue;
    SequenceState& seq = sequences_.at(r->id);
    if (seq.spec.method == SpeculationMethod::kOff) continue;
    // Never past max_tokens or the context: the target adds a token after the kept ones.
    int64_t wanted = std::min<int64_t>(
        {seq.spec.k, seq.params.max_tokens - seq.resumed - r->num_output_tokens() - 1,
         options_.scheduler.max_model_len - r->num_tokens() - 1});
    // Nor past the draft's own context: it reads the proposed tokens but the last.
    if (seq.spec.method == SpeculationMethod::kDraft && draft_ != nullptr) {
      wanted = std::min<int64_t>(
          wanted, draft_->model().config().max_position_embeddings - r->num_tokens());
    }
    if (wanted <= 0) continue;
    SpecDecision decision;
    r->spec_budget = spec_policy_->Budget(&seq.spec, static_cast<int32_t>(wanted), &decision);
    ++spec_stats_.decisions[static_cast<int>(decision)];
    budgets += r->spec_budget;
    ++speculating;
  }
  if (speculating > 0) spec_stats_.k_in_force = static_cast<double>(budgets) / speculating;
}

absl::Status Engine::Propose(SchedulerStep* step) {
  // Draft-model sequences are proposed for together: one draft forward pass per token.
  std::vector<ProposalRequest> draft_requests;
  std::vector<ScheduledChunk*> draft_chunks;
  std::vector<std::unique_ptr<SequenceSampler>> forks;
  std::vector<Proposal> proposals;
  for (ScheduledChunk& ch : step->chunks) {
    if (ch.num_draft_tokens == 0) continue;
    SchedRequest* r = ch.request;
    SequenceState& seq = sequences_.at(r->id);
    if (seq.spec.method == SpeculationMethod::kDraft && draft_ != nullptr) {
      SequenceSpeculation& spec = seq.spec;
      if (spec.draft_preemptions != r->num_preemptions) {  // its blocks, and the draft's KV, went
        spec.draft_computed = 0;
        spec.draft_preemptions = r->num_preemptions;
      }
      ProposalRequest pr;
      pr.seq_id = static_cast<int64_t>(draft_requests.size());
      pr.tokens = r->token_ids;
      pr.k = static_cast<int32_t>(ch.num_draft_tokens);
      pr.block_table = kv_->BlockTable(r->id);
      pr.draft_computed = spec.draft_computed;
      // The draft draws as the sequence would (its parameters and history), from a generator of
      // its own, seeded from the sequence's so that seeded requests repeat.
      if (!seq.sampler->PlainArgmax()) {
        const bool greedy = seq.params.greedy() || seq.params.top_k == 1;
        const uint64_t seed = greedy ? 0 : static_cast<uint64_t>(seq.sampler->Uniform() * 0x1p53);
        forks.push_back(seq.sampler->Fork(seed));
        pr.sampler = forks.back().get();
      }
      draft_requests.push_back(pr);
      draft_chunks.push_back(&ch);
      continue;
    }
    std::vector<int32_t> tokens;
    if (seq.spec.method == SpeculationMethod::kNgram) {
      tokens = ngram_->ProposeOne(r->token_ids, static_cast<int32_t>(ch.num_draft_tokens));
    }
    ShrinkToProposal(step, &ch, std::move(tokens));
  }
  if (draft_requests.empty()) return absl::OkStatus();
  if (absl::Status s = draft_->Propose(draft_requests, &proposals); !s.ok()) {
    // The draft failed (out of device memory, say): this step decodes without proposals, and the
    // draft starts these sequences over; the target's work goes on.
    TANDEM_LOG(WARNING) << "draft model proposal failed, decoding without it this step: " << s;
    proposals.assign(draft_requests.size(), Proposal{});
  }
  for (size_t i = 0; i < draft_chunks.size(); ++i) {
    SequenceState& seq = sequences_.at(draft_chunks[i]->request->id);
    seq.spec.draft_probs = std::move(proposals[i].probs);
    seq.spec.draft_computed = proposals[i].draft_computed;
    ShrinkToProposal(step, draft_chunks[i], std::move(proposals[i].tokens));
  }
  return absl::OkStatus();
}

void Engine::ShrinkToProposal(SchedulerStep* step, ScheduledChunk* ch,
                              std::vector<int32_t> tokens) {
  // The chunk shrinks to what was proposed; its unused room goes back in Scheduler::Update.
  const int64_t unused = ch->num_draft_tokens - static_cast<int64_t>(tokens.size());
  ch->request->draft_tokens = std::move(tokens);
  ch->num_draft_tokens -= unused;
  ch->num_new_tokens -= unused;
  step->num_tokens -= unused;
}

void Engine::VerifyRows(const StepPlan& plan, size_t first_row, const StepResults& res,
                        std::vector<int32_t>* tokens, std::vector<LogprobEntry>* logprobs) {
  const int64_t vocab = model_->config().vocab_size;
  const SeqPlan& sp = plan.seqs[plan.rows[first_row].seq];
  SequenceState& seq = *sp.state;
  SequenceSampler& sampler = *seq.sampler;
  const SchedRequest& r = *sp.request;
  const int64_t num_proposed = sp.num_draft_tokens;
  const bool greedy = seq.params.greedy() || seq.params.top_k == 1;
  auto uniform = [&sampler] { return sampler.Uniform(); };
  int32_t accepted = 0;  // proposed tokens kept
  int64_t generated = r.num_output_tokens() + seq.resumed;
  for (int64_t i = 0; i < num_proposed; ++i) ++spec_stats_.proposed_at[i];
  // Row i is the target's distribution after the sequence and proposals [0, i). Each token is
  // accepted into the sampler before the next row is read, so the penalties and min_tokens of row
  // i + 1 count it, as they would have without speculation.
  for (int64_t i = 0; i <= num_proposed; ++i) {
    const size_t k = first_row + static_cast<size_t>(i);
    const RowPlan& row = plan.rows[k];
    const std::span<const float> logits =
        res.logits.empty() ? std::span<const float>()
                           : std::span<const float>(res.logits.data() + k * vocab, vocab);
    const bool proposed = i < num_proposed;
    int32_t token = 0;
    bool kept = false;
    if (greedy) {
      token = row.argmax_only ? res.argmax[k] : sampler.Sample(logits, workspace_);
      kept = proposed && token == r.draft_tokens[i];
    } else {
      sampler.Distribution(logits, workspace_, &verify_probs_);
      if (proposed) {
        // The draft's distribution for this token, or none (n-gram: all its mass on the token).
        const absl::Span<const float> q =
            seq.spec.draft_probs.empty()
                ? absl::Span<const float>()
                : absl::Span<const float>(seq.spec.draft_probs.data() + i * vocab, vocab);
        const TokenVerdict v = VerifySampledToken(r.draft_tokens[i], q, verify_probs_, uniform);
        token = v.token;
        kept = v.accepted;
      } else {
        token = DrawFromDistribution(verify_probs_, sampler.Uniform());
      }
    }
    ++(row.sampled_on_device() ? sampled_on_device_ : sampled_on_host_);
    if (kept) {
      ++spec_stats_.accepted_at[i];
      ++accepted;
    }
    sampler.Accept(token);
    tokens->push_back(token);
    if (seq.params.logprobs >= 0) {
      const bool on_device = k < res.logprobs.size() && res.logprobs[k].has_value();
      LogprobEntry e = on_device
                           ? FromDevice(*res.logprobs[k], seq.params.logprobs)
                           : ComputeLogprobs(logits.data(), vocab, token, seq.params.logprobs);
      e.token_id = token;
      logprobs->push_back(std::move(e));
    }
    ++generated;
    if (!kept || sampler.IsStop(token, static_cast<int32_t>(generated)) ||
        ReachedLength(seq, generated, r.num_tokens() + static_cast<int64_t>(tokens->size())))
      break;
  }
  // The draft holds KV for the sequence's tokens and the proposed ones it read (all but the last):
  // the kept ones stay valid.
  if (seq.spec.method == SpeculationMethod::kDraft) {
    seq.spec.draft_computed = std::min<int64_t>(seq.spec.draft_computed, r.num_tokens() + accepted);
    seq.spec.draft_probs.clear();
  }
  seq.spec.counts.proposed += num_proposed;
  seq.spec.counts.accepted += accepted;
  spec_stats_.counts.proposed += num_proposed;
  spec_stats_.counts.accepted += accepted;
  ++spec_stats_.verify_steps;
  SpeculationPolicy::Record(&seq.spec, static_cast<int32_t>(num_proposed), accepted);
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.num_blocks = kv_->num_blocks();
  s.free_blocks = kv_->num_free_blocks();
  s.waiting = scheduler_->num_waiting();
  s.running = scheduler_->num_running();
  s.preemptions = scheduler_->num_preemptions();
  s.prefix_queries = kv_->prefix_queries();
  s.prefix_hits = kv_->prefix_hits();
  s.steps = steps_;
  s.step_seconds = step_seconds_;
  s.forward_seconds = forward_seconds_;
  s.prompt_forward_seconds = prompt_forward_seconds_;
  s.computed_tokens = computed_tokens_;
  s.max_model_len = options_.scheduler.max_model_len;
  s.last_step_tokens = last_step_tokens_;
  s.last_step_sequences = last_step_sequences_;
  s.sampled_on_device = sampled_on_device_;
  s.sampled_on_host = sampled_on_host_;
  s.sampling_row_copies = nucleus_row_copies_;
  if (structured_ != nullptr) {
    const structured::MaskCounters& m = structured_->counters();
    s.structured_masks_computed = m.computed.load(std::memory_order_relaxed);
    s.structured_masks_cached = m.cached.load(std::memory_order_relaxed);
    s.structured_mask_seconds = static_cast<double>(m.nanos.load(std::memory_order_relaxed)) * 1e-9;
  }
  s.speculation = spec_stats_;
  return s;
}

}  // namespace tandem
