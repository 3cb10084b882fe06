#include "router/request_flow.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/convert.h"
#include "common/rpc/status.h"
#include "common/tokenizer/text_stream.h"

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

// A child call's context, registered with the flow's control for its lifetime.
class ChildCall {
 public:
  ChildCall(FlowControl* control, const std::string& worker, absl::Time deadline)
      : control_(control) {
    rpc::SetDeadline(&context, deadline);
    control_->Attach(&context, worker);
  }
  ~ChildCall() { control_->Detach(&context); }
  bool lost() const { return control_->lost(&context); }
  grpc::ClientContext context;

 private:
  FlowControl* control_;
};

class Flow {
 public:
  Flow(const FlowEnvironment& env, const FlowRequest& req, FlowControl* control, FlowSink* sink)
      : env_(env),
        req_(req),
        control_(control),
        sink_(sink),
        text_(env.tokenizer, req.skip_special_tokens, req.prompt, req.stop) {}

  void Run() {
    started_ = absl::Now();
    grpc::Status status = Dispatch();
    if (status.ok()) {
      status = FinishText();
    } else if (control_->cancelled() && status.error_code() == grpc::StatusCode::CANCELLED) {
      status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    if (!status.ok() && absl::Now() >= req_.deadline &&
        status.error_code() != grpc::StatusCode::CANCELLED) {
      status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "deadline exceeded: " + status.error_message());
    }
    v1::GenerateResponse& f = final_;
    f.set_request_id(req_.id);
    f.set_finish_reason(finish_reason_);
    f.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(req_.prompt.size()));
    f.mutable_usage()->set_completion_tokens(Resumed());
    f.set_migrations(migrations_);
    if (speculated_) {
      v1::SpeculationCounts* sc = f.mutable_speculation();
      sc->set_proposed(spec_base_.proposed() + spec_run_.proposed());
      sc->set_accepted(spec_base_.accepted() + spec_run_.accepted());
    }
    v1::Timings* t = f.mutable_timings();
    t->set_router_queue(Seconds(req_.arrival, started_));
    if (first_token_ != absl::InfinitePast())
      t->set_time_to_first_token(Seconds(req_.arrival, first_token_));
    t->set_end_to_end(Seconds(req_.arrival, absl::Now()));
    sink_->Finish(status, std::move(final_));
  }

 private:
  grpc::Status Dispatch() {
    absl::StatusOr<bool> disaggregated = env_.cluster->UseDisaggregated();
    if (!disaggregated.ok()) return rpc::ToGrpc(disaggregated.status());
    if (!*disaggregated) return RunCombined();
    if (req_.params.max_tokens == 0) return RunPromptOnly();
    return RunDisaggregated();
  }

  // What the workers compute from: the prompt, then, after a migration, the output streamed so far
  // (resumed_output_tokens of it).
  std::vector<int32_t> Tokens() const {
    std::vector<int32_t> t = req_.prompt;
    t.insert(t.end(), generated_.begin(), generated_.end());
    return t;
  }
  int32_t Resumed() const { return static_cast<int32_t>(generated_.size()); }
  v1::SamplingParameters WorkerSampling() const {
    v1::SamplingParameters p = req_.proto_params;
    if (!generated_.empty()) p.clear_prompt_logprobs();  // the response has the first run's
    return p;
  }

  // KV blocks the request takes on a decode worker at first.
  int64_t Blocks(const Cluster::Worker& w) const {
    const int64_t bs = std::max<int32_t>(1, w.description.kv_geometry().block_size());
    return (static_cast<int64_t>(req_.prompt.size() + generated_.size()) + bs) / bs;
  }

  DecodeDemand Demand() const {
    return {static_cast<int64_t>(req_.prompt.size() + generated_.size()),
            req_.params.max_tokens - Resumed(), 0.25};
  }

  v1::DecodeRequest MakeDecodeRequest(bool local_prefill) const {
    v1::DecodeRequest d;
    d.set_request_id(req_.id);
    const std::vector<int32_t> tokens = Tokens();
    *d.mutable_prompt_token_ids() = {tokens.begin(), tokens.end()};
    *d.mutable_sampling() = WorkerSampling();
    d.set_local_prefill(local_prefill);
    d.set_resumed_output_tokens(Resumed());
    return d;
  }

  // Whether the output streamed so far already ends the request (max_tokens, the context, EOS or a
  // stop id past min_tokens): a worker lost between its last token and its Finished message. Sets
  // the finish reason when it does.
  bool EndedAtLastToken() {
    if (generated_.empty()) return false;
    const int64_t n = Resumed(), last = generated_.back();
    const bool stop =
        n >= req_.params.min_tokens && ((!req_.params.ignore_eos && last == env_.eos_token_id) ||
                                        absl::c_linear_search(req_.params.stop_token_ids, last));
    const int64_t context = env_.cluster->max_model_len();
    if (stop) {
      finish_reason_ = v1::FINISH_REASON_STOP;
    } else if (n >= req_.params.max_tokens ||
               (context > 0 && static_cast<int64_t>(req_.prompt.size()) + n >= context)) {
      finish_reason_ = v1::FINISH_REASON_LENGTH;
    }
    return finish_reason_ != v1::FINISH_REASON_UNSPECIFIED;
  }

  // After losing decode worker `address` (dead, drained, or its KV transfer failed) with the
  // request unfinished: whether to resume it on another pair (request migration). False leaves
  // *status as the request's answer, OK when the output already ended.
  bool Migrate(const std::string& address, grpc::Status* status) {
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
        TANDEM_LOG(WARNING) << "request " << req_.id << ": decode worker " << address << " lost ("
                            << status->error_message() << "); not resumed: "
                            << (outcome == MigrationOutcome::kNoTime
                                    ? "too close to its deadline"
                                    : absl::StrCat(migrations_, " migrations already"));
      }
      return false;
    }
    ++migrations_;
    TANDEM_LOG(WARNING) << "request " << req_.id << ": decode worker " << address << " lost ("
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

  // Reads decode events until Finished or the end of the stream. *lost: the worker was lost (the
  // status is then UNAVAILABLE).
  grpc::Status ReadDecode(ChildCall& call, grpc::ClientReader<v1::DecodeEvent>* reader,
                          const std::string& address, bool* lost) {
    *lost = false;
    v1::DecodeEvent event;
    while (reader->Read(&event)) {
      if (event.has_tokens()) {
        const v1::DecodeTokens& t = event.tokens();
        if (t.prompt_logprobs_size() > 0) *final_.mutable_prompt_logprobs() = t.prompt_logprobs();
        if (t.has_speculation()) {
          spec_run_ = t.speculation();
          speculated_ = true;
        }
        if (t.token_ids_size() > 0 && first_token_ == absl::InfinitePast())
          first_token_ = absl::Now();
        if (!Emit({t.token_ids().begin(), t.token_ids().end()}, t.logprobs())) {
          call.context.TryCancel();  // a stop string matched: the decode worker aborts the request
          reader->Finish();
          return grpc::Status::OK;
        }
      } else if (event.has_finished()) {
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
    }
    grpc::Status s = reader->Finish();
    if (call.lost() ||
        (s.error_code() == grpc::StatusCode::UNAVAILABLE && !control_->cancelled())) {
      *lost = true;
      return LostWorker("decode", address);
    }
    if (s.ok() && finish_reason_ == v1::FINISH_REASON_UNSPECIFIED) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "decode stream ended without a finish");
    }
    return s;
  }

  grpc::Status RunCombined() {
    absl::flat_hash_set<std::string> tried;
    while (true) {
      absl::StatusOr<Cluster::Worker> w =
          env_.cluster->ChooseDecode(Demand(), /*combined=*/true, tried);
      if (!w.ok()) return rpc::ToGrpc(w.status());
      Cluster::Assignment assigned(env_.cluster, w->address, Blocks(*w));
      ChildCall call(control_, w->address, req_.deadline);
      auto reader =
          env_.cluster->decode_stub(w->address)->Decode(&call.context, MakeDecodeRequest(true));
      bool lost = false;
      grpc::Status s = ReadDecode(call, reader.get(), w->address, &lost);
      // Nothing was produced yet by a worker that is gone: another one can take the request.
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && generated_.empty() && TimeLeft()) {
        tried.insert(w->address);
        continue;
      }
      // Output was streamed: the request resumes elsewhere from it.
      if (lost && Migrate(w->address, &s)) {
        tried.insert(w->address);
        continue;
      }
      return s;
    }
  }

  bool TimeLeft() const {
    return !control_->cancelled() && req_.deadline - absl::Now() > env_.prefill_retry_min_time_left;
  }

  // Calls Prefill on live prefill workers until one succeeds, the transfer itself fails
  // (*kv_failure set: the decode side's doing), or the deadline does not allow another try.
  grpc::Status Prefill(const v1::DecodeReserved& reserved, v1::PrefillResponse* response,
                       bool* kv_failure = nullptr) {
    v1::PrefillRequest p;
    p.set_request_id(req_.id);
    const std::vector<int32_t> tokens = Tokens();
    *p.mutable_prompt_token_ids() = {tokens.begin(), tokens.end()};
    *p.mutable_sampling() = WorkerSampling();
    p.set_decode_kv_address(reserved.kv_address());
    p.set_kv_capability(reserved.kv_capability());
    p.set_resumed_output_tokens(Resumed());
    absl::flat_hash_set<std::string> tried;
    while (true) {
      absl::StatusOr<Cluster::Worker> w = env_.cluster->ChoosePrefill(tokens, tried);
      if (!w.ok()) return rpc::ToGrpc(w.status());
      Cluster::Assignment assigned(env_.cluster, w->address, 0);
      ChildCall call(control_, w->address, req_.deadline);
      grpc::Status s = env_.cluster->prefill_stub(w->address)->Prefill(&call.context, p, response);
      if (s.ok()) return s;
      const auto& trailers = call.context.GetServerTrailingMetadata();
      const bool kv_failed = trailers.find("tandem-kv-failure") != trailers.end();
      if (kv_failure != nullptr) *kv_failure = kv_failed;
      const bool worker_failed = call.lost() || (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                                                 !kv_failed && !control_->cancelled());
      if (!worker_failed) return s;
      env_.cluster->MarkUnhealthy(w->address);
      TANDEM_LOG(WARNING) << "request " << req_.id << ": prefill worker " << w->address
                          << " failed (" << s.error_message() << ")"
                          << (TimeLeft() ? ", retrying elsewhere" : "");
      if (!TimeLeft()) return LostWorker("prefill", w->address);
      tried.insert(w->address);
    }
  }

  void TakePrefillTimings(const v1::PrefillResponse& r) {
    v1::Timings* t = final_.mutable_timings();
    t->set_prefill_queue(r.queue_seconds());
    t->set_prefill_compute(r.compute_seconds());
    t->set_kv_transfer(r.transfer_seconds());
    final_.mutable_usage()->set_cached_prompt_tokens(r.cached_prompt_tokens());
    if (r.prompt_logprobs_size() > 0) *final_.mutable_prompt_logprobs() = r.prompt_logprobs();
  }

  grpc::Status RunPromptOnly() {
    v1::PrefillResponse r;
    grpc::Status s = Prefill(v1::DecodeReserved(), &r);
    if (!s.ok()) return s;
    TakePrefillTimings(r);
    finish_reason_ = v1::FINISH_REASON_LENGTH;
    return s;
  }

  grpc::Status RunDisaggregated() {
    // 1. A decode worker reserves blocks (backpressure before any prefill work).
    absl::flat_hash_set<std::string> tried;
    while (true) {
      absl::StatusOr<Cluster::Worker> w =
          env_.cluster->ChooseDecode(Demand(), /*combined=*/false, tried);
      if (!w.ok()) return rpc::ToGrpc(w.status());
      Cluster::Assignment assigned(env_.cluster, w->address, Blocks(*w));
      ChildCall call(control_, w->address, req_.deadline);
      auto reader =
          env_.cluster->decode_stub(w->address)->Decode(&call.context, MakeDecodeRequest(false));
      v1::DecodeEvent event;
      if (!reader->Read(&event) || !event.has_reserved()) {
        grpc::Status s = reader->Finish();
        if ((call.lost() || s.error_code() == grpc::StatusCode::UNAVAILABLE) && TimeLeft()) {
          env_.cluster->MarkUnhealthy(w->address);
          tried.insert(w->address);
          continue;
        }
        if (s.ok())
          s = grpc::Status(grpc::StatusCode::INTERNAL,
                           "decode stream did not start with a reservation");
        return s;
      }
      // 2. Prefill, with the KV sent straight to the reserved blocks.
      v1::PrefillResponse r;
      bool kv_failure = false;
      grpc::Status s = Prefill(event.reserved(), &r, &kv_failure);
      if (!s.ok()) {
        call.context.TryCancel();  // frees the reservation
        reader->Finish();
        // The transfer into this decode worker failed (it died, or was drained): elsewhere.
        if (kv_failure && Migrate(w->address, &s)) {
          tried.insert(w->address);
          continue;
        }
        return s;
      }
      // 3. The first token (TTFT), then the decode stream. A migrated request's TTFT and its parts
      // stay the first run's.
      if (first_token_ == absl::InfinitePast()) {
        TakePrefillTimings(r);
        first_token_ = absl::Now();
      }
      google::protobuf::RepeatedPtrField<v1::PositionLogprobs> first_logprobs;
      if (req_.params.logprobs >= 0) *first_logprobs.Add() = r.first_logprobs();
      if (!Emit({r.first_token()}, first_logprobs)) {
        call.context.TryCancel();
        reader->Finish();
        return grpc::Status::OK;
      }
      bool lost = false;
      s = ReadDecode(call, reader.get(), w->address, &lost);
      if (lost && Migrate(w->address, &s)) {
        tried.insert(w->address);
        continue;
      }
      return s;
    }
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
  grpc::Status FinishText() {
    if (text_.stopped()) return grpc::Status::OK;
    std::string tail = text_.Finish();
    if (text_.stopped()) finish_reason_ = v1::FINISH_REASON_STOP;
    if (!tail.empty()) {
      v1::TextDelta delta;
      delta.set_text(std::move(tail));
      sink_->Delta(std::move(delta));
    }
    return grpc::Status::OK;
  }

  const FlowEnvironment& env_;
  const FlowRequest& req_;
  FlowControl* control_;
  FlowSink* sink_;
  TextStream text_;  // detokenizer and stop strings
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

void RunFlow(const FlowEnvironment& env, const FlowRequest& request, FlowControl* control,
             FlowSink* sink) {
  Flow(env, request, control, sink).Run();
}

}  // namespace tandem::router
