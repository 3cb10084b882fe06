#include "router/request_flow.h"

#include <algorithm>

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
    f.mutable_usage()->set_completion_tokens(completion_tokens_);
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

  // KV blocks the request takes on a decode worker at first.
  int64_t Blocks(const Cluster::Worker& w) const {
    const int64_t bs = std::max<int32_t>(1, w.description.kv_geometry().block_size());
    return (static_cast<int64_t>(req_.prompt.size()) + bs) / bs;
  }

  DecodeDemand Demand() const {
    return {static_cast<int64_t>(req_.prompt.size()), req_.params.max_tokens, 0.25};
  }

  v1::DecodeRequest MakeDecodeRequest(bool local_prefill) const {
    v1::DecodeRequest d;
    d.set_request_id(req_.id);
    *d.mutable_prompt_token_ids() = {req_.prompt.begin(), req_.prompt.end()};
    *d.mutable_sampling() = req_.proto_params;
    d.set_local_prefill(local_prefill);
    return d;
  }

  grpc::Status LostWorker(const std::string& role, const std::string& address) {
    env_.cluster->MarkUnhealthy(address);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(role, " worker ", address, " was lost"));
  }

  // Reads decode events until Finished or the end of the stream.
  grpc::Status ReadDecode(ChildCall& call, grpc::ClientReader<v1::DecodeEvent>* reader,
                          const std::string& address) {
    v1::DecodeEvent event;
    while (reader->Read(&event)) {
      if (event.has_tokens()) {
        const v1::DecodeTokens& t = event.tokens();
        if (t.prompt_logprobs_size() > 0) *final_.mutable_prompt_logprobs() = t.prompt_logprobs();
        if (t.has_speculation()) *final_.mutable_speculation() = t.speculation();
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
        if (f.has_speculation()) *final_.mutable_speculation() = f.speculation();
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
      grpc::Status s = ReadDecode(call, reader.get(), w->address);
      // Nothing was produced yet by a worker that is gone: another one can take the request.
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && completion_tokens_ == 0 &&
          TimeLeft()) {
        tried.insert(w->address);
        continue;
      }
      return s;
    }
  }

  bool TimeLeft() const {
    return !control_->cancelled() && req_.deadline - absl::Now() > env_.prefill_retry_min_time_left;
  }

  // Calls Prefill on live prefill workers until one succeeds, the transfer itself fails, or the
  // deadline does not allow another try.
  grpc::Status Prefill(const v1::DecodeReserved& reserved, v1::PrefillResponse* response) {
    v1::PrefillRequest p;
    p.set_request_id(req_.id);
    *p.mutable_prompt_token_ids() = {req_.prompt.begin(), req_.prompt.end()};
    *p.mutable_sampling() = req_.proto_params;
    p.set_decode_kv_address(reserved.kv_address());
    p.set_kv_capability(reserved.kv_capability());
    absl::flat_hash_set<std::string> tried;
    while (true) {
      absl::StatusOr<Cluster::Worker> w = env_.cluster->ChoosePrefill(req_.prompt, tried);
      if (!w.ok()) return rpc::ToGrpc(w.status());
      Cluster::Assignment assigned(env_.cluster, w->address, 0);
      ChildCall call(control_, w->address, req_.deadline);
      grpc::Status s = env_.cluster->prefill_stub(w->address)->Prefill(&call.context, p, response);
      if (s.ok()) return s;
      const auto& trailers = call.context.GetServerTrailingMetadata();
      const bool kv_failure = trailers.find("tandem-kv-failure") != trailers.end();
      const bool worker_failed = call.lost() || (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                                                 !kv_failure && !control_->cancelled());
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
      grpc::Status s = Prefill(event.reserved(), &r);
      if (!s.ok()) {
        call.context.TryCancel();  // frees the reservation
        reader->Finish();
        return s;
      }
      TakePrefillTimings(r);
      // 3. The first token (TTFT), then the decode stream.
      first_token_ = absl::Now();
      google::protobuf::RepeatedPtrField<v1::PositionLogprobs> first_logprobs;
      if (req_.params.logprobs >= 0) *first_logprobs.Add() = r.first_logprobs();
      if (!Emit({r.first_token()}, first_logprobs)) {
        call.context.TryCancel();
        reader->Finish();
        return grpc::Status::OK;
      }
      return ReadDecode(call, reader.get(), w->address);
    }
  }

  // Detokenizes `ids`, applies stop strings and sends a delta. False when a stop string matched.
  // Several ids at once (a speculative step's run) end at the one that completes a stop string.
  bool Emit(const std::vector<int32_t>& ids,
            const google::protobuf::RepeatedPtrField<v1::PositionLogprobs>& logprobs) {
    if (text_.stopped()) return false;
    size_t used = 0;
    std::string text = text_.Add(ids, &used);
    completion_tokens_ += static_cast<int32_t>(used);
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
  int32_t completion_tokens_ = 0;
  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;
  absl::Time started_;
  absl::Time first_token_ = absl::InfinitePast();
  v1::GenerateResponse final_;
};

}  // namespace

void RunFlow(const FlowEnvironment& env, const FlowRequest& request, FlowControl* control,
             FlowSink* sink) {
  Flow(env, request, control, sink).Run();
}

}  // namespace tandem::router
