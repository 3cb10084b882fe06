#include "router/request_flow.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/convert.h"
#include "common/rpc/status.h"
#include "common/tokenizer/text_stream.h"
#include "router/flow_calls.h"

namespace tandem::router {

void FlowControl::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (const Child& c : children_) c.context->TryCancel();
}

bool FlowControl::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void FlowControl::Attach(grpc::ClientContext* context, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  children_.push_back({context, worker});
  if (cancelled_) context->TryCancel();
}

void FlowControl::Detach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  std::erase_if(children_, [&](const Child& c) { return c.context == context; });
  std::erase(lost_, context);
}

void FlowControl::CancelUnhealthy(const std::function<bool(const std::string&)>& healthy) {
  absl::MutexLock lock(&mu_);
  for (const Child& c : children_) {
    if (std::find(lost_.begin(), lost_.end(), c.context) != lost_.end() || healthy(c.worker))
      continue;
    lost_.push_back(c.context);
    c.context->TryCancel();
  }
}

bool FlowControl::lost(const grpc::ClientContext* context) const {
  absl::MutexLock lock(&mu_);
  return std::find(lost_.begin(), lost_.end(), context) != lost_.end();
}

namespace {

double Seconds(absl::Time from, absl::Time to) { return absl::ToDoubleSeconds(to - from); }

// One request's flow as a state machine driven by its child calls' completions (flow_calls.h).
// Every method below runs inside the flow's executor.
//   Mode: how the request runs (chosen once by Dispatch).
//   Phase of the current decode attempt: kReserving (the Decode stream's first event, the
//   reservation, is awaited), kPrefilling (the Prefill call is out; the decode stream is held
//   unread), kStreaming (decode events are read one after another), kLeaving (the flow gave the
//   decode stream up and waits for its end to act on leave_status_).
class Flow : public std::enable_shared_from_this<Flow> {
 public:
  Flow(const FlowEnvironment& env, std::shared_ptr<const FlowRequest> req,
       std::shared_ptr<FlowControl> control, std::shared_ptr<FlowSink> sink,
       std::function<void()> done)
      : env_(env),
        req_(std::move(req)),
        control_(std::move(control)),
        sink_(std::move(sink)),
        done_(std::move(done)),
        text_(env.tokenizer, req_->skip_special_tokens, req_->prompt, req_->stop) {}

  void Start() {
    Post([this] {
      started_ = absl::Now();
      Dispatch();
    });
  }

 private:
  enum class Mode { kCombined, kDisaggregated, kPromptOnly };
  enum class Phase { kReserving, kPrefilling, kStreaming, kLeaving };

  // Runs `task` in the executor with the flow kept alive.
  void Post(std::function<void()> task) {
    auto self = shared_from_this();  // alive until Post returns, whatever the tasks release
    executor_.Post([self, task = std::move(task)] { task(); });
  }

  void Dispatch() {
    absl::StatusOr<bool> disaggregated = env_.cluster->UseDisaggregated();
    if (!disaggregated.ok()) return Complete(rpc::ToGrpc(disaggregated.status()));
    if (!*disaggregated) {
      mode_ = Mode::kCombined;
    } else {
      mode_ = req_->params.max_tokens == 0 ? Mode::kPromptOnly : Mode::kDisaggregated;
    }
    if (mode_ == Mode::kPromptOnly) return StartPrefill();
    StartDecode();
  }

  // --- The decode side ---------------------------------------------------------------------------

  // Chooses a decode (or combined) worker not tried yet and opens its Decode stream.
  void StartDecode() {
    const bool combined = mode_ == Mode::kCombined;
    absl::StatusOr<Cluster::Worker> w = env_.cluster->ChooseDecode(Demand(), combined, tried_);
    if (!w.ok()) return Complete(rpc::ToGrpc(w.status()));
    decode_worker_ = w->address;
    decode_heard_ = absl::InfinitePast();
    decode_assignment_.emplace(env_.cluster, w->address, Blocks(*w));
    phase_ = combined ? Phase::kStreaming : Phase::kReserving;
    decode_done_ = false;
    stopped_ = false;
    no_reservation_ = false;
    auto self = shared_from_this();
    decode_ = std::make_unique<DecodeCall>(
        control_.get(), w->address, req_->deadline,
        [self](bool ok) { self->Post([f = self.get(), ok] { f->OnDecodeRead(ok); }); },
        [self](grpc::Status s, bool lost) {
          self->Post([f = self.get(), s = std::move(s), lost] { f->OnDecodeDone(s, lost); });
        });
    decode_->Start(env_.cluster->decode_stub(w->address), MakeDecodeRequest(combined));
  }

  void OnDecodeRead(bool ok) {
    if (!decode_->Arrived(ok)) return;  // its end comes to OnDecodeDone
    DecodeWorkerHeard();
    const v1::DecodeEvent& event = decode_->event();
    if (phase_ == Phase::kReserving) {
      if (!event.has_reserved()) {
        no_reservation_ = true;
        decode_->Abandon();
        return;
      }
      // Prefill, with the KV sent straight to the reserved blocks.
      reserved_ = event.reserved();
      phase_ = Phase::kPrefilling;
      prefill_tried_.clear();
      return StartPrefill();
    }
    if (!TakeDecodeEvent(event)) {
      stopped_ = true;  // a stop string matched: the decode worker aborts the request
      decode_->Abandon();
      return;
    }
    decode_->Next();
  }

  // The decode worker sent an event: proof of life for the registry, told at most once a second a
  // flow (a stream's events would otherwise take the registry's lock once a token).
  void DecodeWorkerHeard() {
    const absl::Time now = absl::Now();
    if (now - decode_heard_ < absl::Seconds(1)) return;
    decode_heard_ = now;
    env_.cluster->Heard(decode_worker_);
  }

  // A decode event while streaming: tokens, or the finish. False when a stop string matched.
  bool TakeDecodeEvent(const v1::DecodeEvent& event) {
    if (event.has_tokens()) {
      const v1::DecodeTokens& t = event.tokens();
      if (t.prompt_logprobs_size() > 0) *final_.mutable_prompt_logprobs() = t.prompt_logprobs();
      if (t.has_speculation()) {
        spec_run_ = t.speculation();
        speculated_ = true;
      }
      if (t.token_ids_size() > 0 && first_token_ == absl::InfinitePast())
        first_token_ = absl::Now();
      return Emit({t.token_ids().begin(), t.token_ids().end()}, t.logprobs());
    }
    if (event.has_finished()) {
      const v1::DecodeFinished& f = event.finished();
      finish_reason_ = f.finish_reason();
      if (f.has_speculation()) {
        spec_run_ = f.speculation();
        speculated_ = true;
      }
      v1::Timings* t = final_.mutable_timings();
      t->set_decode_queue(f.decode_queue_seconds());
      if (f.prefill_queue_seconds() > 0) t->set_prefill_queue(f.prefill_queue_seconds());
      if (f.cached_prompt_tokens() > 0)
        final_.mutable_usage()->set_cached_prompt_tokens(f.cached_prompt_tokens());
    }
    return true;
  }

  void OnDecodeDone(grpc::Status status, bool lost) {
    decode_.reset();
    decode_done_ = true;
    decode_status_ = std::move(status);
    decode_lost_ = lost;
    // While the prefill is out, its answer decides: its transfer fails without this worker.
    if (phase_ != Phase::kPrefilling) DecodeEnded();
  }

  // The decode stream ended (and no prefill is out): the attempt's outcome.
  void DecodeEnded() {
    decode_assignment_.reset();
    grpc::Status s = decode_status_;
    switch (phase_) {
      case Phase::kReserving:
        if ((decode_lost_ || s.error_code() == grpc::StatusCode::UNAVAILABLE) && TimeLeft()) {
          env_.cluster->MarkUnhealthy(decode_worker_);
          return Retry();
        }
        if (s.ok() || no_reservation_) {
          s = grpc::Status(grpc::StatusCode::INTERNAL,
                           "decode stream did not start with a reservation");
        }
        return Complete(s);
      case Phase::kLeaving:
        s = leave_status_;
        // The transfer into this decode worker failed (it died, or was drained): elsewhere.
        if (leave_kv_failure_ && Migrate(&s)) return Retry();
        return Complete(s);
      case Phase::kStreaming: {
        if (stopped_) return Complete(grpc::Status::OK);
        bool lost = false;
        if (decode_lost_ ||
            (s.error_code() == grpc::StatusCode::UNAVAILABLE && !control_->cancelled())) {
          lost = true;
          s = LostWorker("decode", decode_worker_);
        } else if (s.ok() && finish_reason_ == v1::FINISH_REASON_UNSPECIFIED) {
          s = grpc::Status(grpc::StatusCode::INTERNAL, "decode stream ended without a finish");
        }
        // Nothing was produced yet by a combined worker that is gone: another one can take it.
        if (mode_ == Mode::kCombined && s.error_code() == grpc::StatusCode::UNAVAILABLE &&
            generated_.empty() && TimeLeft()) {
          return Retry();
        }
        // Output was streamed: the request resumes elsewhere from it.
        if (lost && Migrate(&s)) return Retry();
        return Complete(s);
      }
      case Phase::kPrefilling: break;  // not reached: the prefill's answer comes first
    }
  }

  // Another decode attempt, on a worker other than the ones tried.
  void Retry() {
    tried_.insert(decode_worker_);
    StartDecode();
  }

  // Gives the decode stream up (cancelling it frees the reservation); `status` (and, with
  // `kv_failure`, a migration) decides once it ended.
  void Leave(grpc::Status status, bool kv_failure) {
    phase_ = Phase::kLeaving;
    leave_status_ = std::move(status);
    leave_kv_failure_ = kv_failure;
    if (decode_done_) return DecodeEnded();
    decode_->Abandon();
  }

  // --- The prefill side --------------------------------------------------------------------------

  // Calls Prefill on a live prefill worker not tried yet in this attempt.
  void StartPrefill() {
    const std::vector<int32_t> tokens = Tokens();
    absl::StatusOr<Cluster::Worker> w = env_.cluster->ChoosePrefill(tokens, prefill_tried_);
    if (!w.ok()) return PrefillFailed(rpc::ToGrpc(w.status()), false);
    prefill_worker_ = w->address;
    prefill_assignment_.emplace(env_.cluster, w->address, 0);
    prefill_ = std::make_unique<PrefillCall>(control_.get(), w->address, req_->deadline);
    v1::PrefillRequest& p = prefill_->request;
    p.set_request_id(req_->id);
    *p.mutable_prompt_token_ids() = {tokens.begin(), tokens.end()};
    *p.mutable_sampling() = WorkerSampling();
    if (mode_ == Mode::kDisaggregated) {
      p.set_decode_kv_address(reserved_.kv_address());
      p.set_kv_capability(reserved_.kv_capability());
    }
    p.set_resumed_output_tokens(Resumed());
    auto self = shared_from_this();
    prefill_->Start(env_.cluster->prefill_stub(w->address), [self](grpc::Status s, bool lost) {
      self->Post([f = self.get(), s = std::move(s), lost] { f->OnPrefillDone(s, lost); });
    });
  }

  void OnPrefillDone(const grpc::Status& s, bool lost) {
    std::unique_ptr<PrefillCall> call = std::move(prefill_);
    prefill_assignment_.reset();
    if (s.ok()) {
      env_.cluster->Heard(prefill_worker_);
      return PrefillSucceeded(call->response);
    }
    const bool kv_failed = call->kv_failure();
    const bool worker_failed = lost || (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                                        !kv_failed && !control_->cancelled());
    if (!worker_failed) return PrefillFailed(s, kv_failed);
    env_.cluster->MarkUnhealthy(prefill_worker_);
    TANDEM_LOG(WARNING) << "request " << req_->id << ": prefill worker " << prefill_worker_
                        << " failed (" << s.error_message() << ")"
                        << (TimeLeft() ? ", retrying elsewhere" : "");
    if (!TimeLeft()) return PrefillFailed(LostWorker("prefill", prefill_worker_), kv_failed);
    prefill_tried_.insert(prefill_worker_);
    StartPrefill();
  }

  void PrefillFailed(grpc::Status s, bool kv_failure) {
    if (mode_ == Mode::kPromptOnly) return Complete(s);
    Leave(std::move(s), kv_failure);
  }

  void PrefillSucceeded(const v1::PrefillResponse& r) {
    if (mode_ == Mode::kPromptOnly) {
      TakePrefillTimings(r);
      finish_reason_ = v1::FINISH_REASON_LENGTH;
      return Complete(grpc::Status::OK);
    }
    // The first token (TTFT), then the decode stream. A migrated request's TTFT and its parts
    // stay the first run's.
    if (first_token_ == absl::InfinitePast()) {
      TakePrefillTimings(r);
      first_token_ = absl::Now();
    }
    google::protobuf::RepeatedPtrField<v1::PositionLogprobs> first_logprobs;
    if (req_->params.logprobs >= 0) *first_logprobs.Add() = r.first_logprobs();
    if (!Emit({r.first_token()}, first_logprobs)) return Leave(grpc::Status::OK, false);
    phase_ = Phase::kStreaming;
    if (decode_done_) return DecodeEnded();
    decode_->Next();
  }

  void TakePrefillTimings(const v1::PrefillResponse& r) {
    v1::Timings* t = final_.mutable_timings();
    t->set_prefill_queue(r.queue_seconds());
    t->set_prefill_compute(r.compute_seconds());
    t->set_kv_transfer(r.transfer_seconds());
    final_.mutable_usage()->set_cached_prompt_tokens(r.cached_prompt_tokens());
    if (r.prompt_logprobs_size() > 0) *final_.mutable_prompt_logprobs() = r.prompt_logprobs();
  }

  // --- The request
  // ---------------------------------------------------------------------------------

  // What the workers compute from: the prompt, then, after a migration, the output streamed so far
  // (resumed_output_tokens of it).
  std::vector<int32_t> Tokens() const {
    std::vector<int32_t> t = req_->prompt;
    t.insert(t.end(), generated_.begin(), generated_.end());
    return t;
  }
  int32_t Resumed() const { return static_cast<int32_t>(generated_.size()); }
  v1::SamplingParameters WorkerSampling() const {
    v1::SamplingParameters p = req_->proto_params;
    if (!generated_.empty()) p.clear_prompt_logprobs();  // the response has the first run's
    return p;
  }

  // KV blocks the request takes on a decode worker at first.
  int64_t Blocks(const Cluster::Worker& w) const {
    const int64_t bs = std::max<int32_t>(1, w.description.kv_geometry().block_size());
    return (static_cast<int64_t>(req_->prompt.size() + generated_.size()) + bs) / bs;
  }

  DecodeDemand Demand() const {
    return {static_cast<int64_t>(req_->prompt.size() + generated_.size()),
            req_->params.max_tokens - Resumed(), 0.25};
  }

  v1::DecodeRequest MakeDecodeRequest(bool local_prefill) const {
    v1::DecodeRequest d;
    d.set_request_id(req_->id);
    const std::vector<int32_t> tokens = Tokens();
    *d.mutable_prompt_token_ids() = {tokens.begin(), tokens.end()};
    *d.mutable_sampling() = WorkerSampling();
    d.set_local_prefill(local_prefill);
    d.set_resumed_output_tokens(Resumed());
    return d;
  }

  bool TimeLeft() const {
    return !control_->cancelled() &&
           req_->deadline - absl::Now() > env_.prefill_retry_min_time_left;
  }

  // Whether the output streamed so far already ends the request (max_tokens, the context, EOS or a
  // stop id past min_tokens): a worker lost between its last token and its Finished message. Sets
  // the finish reason when it does.
  bool EndedAtLastToken() {
    if (generated_.empty()) return false;
    const int64_t n = Resumed(), last = generated_.back();
    const SamplingParams& p = req_->params;
    const bool stop = n >= p.min_tokens && ((!p.ignore_eos && last == env_.eos_token_id) ||
                                            absl::c_linear_search(p.stop_token_ids, last));
    const int64_t context = env_.cluster->max_model_len();
    if (stop) {
      finish_reason_ = v1::FINISH_REASON_STOP;
    } else if (n >= p.max_tokens ||
               (context > 0 && static_cast<int64_t>(req_->prompt.size()) + n >= context)) {
      finish_reason_ = v1::FINISH_REASON_LENGTH;
    }
    return finish_reason_ != v1::FINISH_REASON_UNSPECIFIED;
  }

  // After losing the decode worker (dead, drained, or its KV transfer failed) with the request
  // unfinished: whether to resume it on another pair (request migration). False leaves *status as
  // the request's answer, OK when the output already ended.
  bool Migrate(grpc::Status* status) {
    const std::string& address = decode_worker_;
    if (finish_reason_ != v1::FINISH_REASON_UNSPECIFIED || EndedAtLastToken()) {
      *status = grpc::Status::OK;
      return false;
    }
    if (control_->cancelled()) return false;
    MigrationOutcome outcome = MigrationOutcome::kResumed;
    if (migrations_ >= env_.max_migrations) {
      outcome = MigrationOutcome::kExhausted;
    } else if (!TimeLeft()) {
      outcome = MigrationOutcome::kNoTime;
    }
    if (env_.metrics != nullptr) env_.metrics->Migration(outcome);
    if (outcome != MigrationOutcome::kResumed) {
      if (env_.max_migrations > 0) {
        TANDEM_LOG(WARNING) << "request " << req_->id << ": decode worker " << address << " lost ("
                            << status->error_message() << "); not resumed: "
                            << (outcome == MigrationOutcome::kNoTime
                                    ? "too close to its deadline"
                                    : absl::StrCat(migrations_, " migrations already"));
      }
      return false;
    }
    ++migrations_;
    TANDEM_LOG(WARNING) << "request " << req_->id << ": decode worker " << address << " lost ("
                        << status->error_message() << "); resuming after " << generated_.size()
                        << " output tokens on another pair (migration " << migrations_ << " of at "
                        << "most " << env_.max_migrations << ")";
    // The lost worker's speculation counts stay the request's.
    spec_base_.set_proposed(spec_base_.proposed() + spec_run_.proposed());
    spec_base_.set_accepted(spec_base_.accepted() + spec_run_.accepted());
    spec_run_.Clear();
    return true;
  }

  grpc::Status LostWorker(const std::string& role, const std::string& address) {
    env_.cluster->MarkUnhealthy(address);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(role, " worker ", address, " was lost"));
  }

  // Detokenizes `ids`, applies stop strings and sends a delta. False when a stop string matched.
  // Several ids at once (a speculative step's run) end at the one that completes a stop string.
  bool Emit(const std::vector<int32_t>& ids,
            const google::protobuf::RepeatedPtrField<v1::PositionLogprobs>& logprobs) {
    if (text_.stopped()) return false;
    size_t used = 0;
    std::string text = text_.Add(ids, &used);
    generated_.insert(generated_.end(), ids.begin(), ids.begin() + used);
    v1::TextDelta delta;
    *delta.mutable_token_ids() = {ids.begin(), ids.begin() + used};
    for (int i = 0; i < logprobs.size() && i < static_cast<int>(used); ++i) {
      const v1::PositionLogprobs& p = logprobs[i];
      v1::PositionLogprobs* q = delta.add_logprobs();
      *q = p;
      for (v1::TokenLogprob& t : *q->mutable_top())
        t.set_token(env_.tokenizer->IdToToken(t.token_id()));
    }
    delta.set_text(std::move(text));
    sink_->Delta(std::move(delta));
    if (text_.stopped()) {
      finish_reason_ = v1::FINISH_REASON_STOP;
      return false;
    }
    return true;
  }

  // The detokenizer's and the stop matcher's held-back text.
  void FinishText() {
    if (text_.stopped()) return;
    std::string tail = text_.Finish();
    if (text_.stopped()) finish_reason_ = v1::FINISH_REASON_STOP;
    if (!tail.empty()) {
      v1::TextDelta delta;
      delta.set_text(std::move(tail));
      sink_->Delta(std::move(delta));
    }
  }

  // The request's end: no child call is open. Finishes the sink, then tells the owner.
  void Complete(grpc::Status status) {
    if (status.ok()) {
      FinishText();
    } else if (control_->cancelled() && status.error_code() == grpc::StatusCode::CANCELLED) {
      status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    if (!status.ok() && absl::Now() >= req_->deadline &&
        status.error_code() != grpc::StatusCode::CANCELLED) {
      status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "deadline exceeded: " + status.error_message());
    }
    v1::GenerateResponse& f = final_;
    f.set_request_id(req_->id);
    f.set_finish_reason(finish_reason_);
    f.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(req_->prompt.size()));
    f.mutable_usage()->set_completion_tokens(Resumed());
    f.set_migrations(migrations_);
    if (speculated_) {
      v1::SpeculationCounts* sc = f.mutable_speculation();
      sc->set_proposed(spec_base_.proposed() + spec_run_.proposed());
      sc->set_accepted(spec_base_.accepted() + spec_run_.accepted());
    }
    v1::Timings* t = f.mutable_timings();
    t->set_router_queue(Seconds(req_->arrival, started_));
    if (first_token_ != absl::InfinitePast())
      t->set_time_to_first_token(Seconds(req_->arrival, first_token_));
    t->set_end_to_end(Seconds(req_->arrival, absl::Now()));
    sink_->Finish(status, std::move(final_));
    if (done_) std::exchange(done_, nullptr)();
  }

  const FlowEnvironment& env_;
  const std::shared_ptr<const FlowRequest> req_;
  const std::shared_ptr<FlowControl> control_;
  const std::shared_ptr<FlowSink> sink_;
  std::function<void()> done_;
  SerialExecutor executor_;
  TextStream text_;  // detokenizer and stop strings
  Mode mode_ = Mode::kCombined;
  Phase phase_ = Phase::kReserving;

  // The current decode attempt.
  absl::flat_hash_set<std::string> tried_;  // decode workers lost (or refusing) for this request
  std::string decode_worker_;
  std::optional<Cluster::Assignment> decode_assignment_;
  std::unique_ptr<DecodeCall> decode_;
  absl::Time decode_heard_ = absl::InfinitePast();  // when its events last counted as liveness
  bool decode_done_ = false;
  grpc::Status decode_status_;
  bool decode_lost_ = false;     // the watchdog cancelled the stream: its worker was lost
  bool no_reservation_ = false;  // the stream's first event was not a reservation
  bool stopped_ = false;         // a stop string matched while streaming
  grpc::Status leave_status_;
  bool leave_kv_failure_ = false;
  v1::DecodeReserved reserved_;

  // The current prefill attempt.
  absl::flat_hash_set<std::string> prefill_tried_;
  std::string prefill_worker_;
  std::optional<Cluster::Assignment> prefill_assignment_;
  std::unique_ptr<PrefillCall> prefill_;

  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;
  absl::Time started_;
  absl::Time first_token_ = absl::InfinitePast();
  v1::GenerateResponse final_;
  std::vector<int32_t> generated_;  // every output token streamed (the completion's tokens)
  int32_t migrations_ = 0;
  // Speculation counts: the lost workers' together, and the current worker's so far.
  v1::SpeculationCounts spec_base_, spec_run_;
  bool speculated_ = false;  // a worker reported counts: the response carries them
};

}  // namespace

void StartFlow(const FlowEnvironment& env, std::shared_ptr<const FlowRequest> request,
               std::shared_ptr<FlowControl> control, std::shared_ptr<FlowSink> sink,
               std::function<void()> done) {
  std::make_shared<Flow>(env, std::move(request), std::move(control), std::move(sink),
                         std::move(done))
      ->Start();
}

}  // namespace tandem::router
