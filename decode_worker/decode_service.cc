#include "decode_worker/decode_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/convert.h"
#include "common/rpc/status.h"
#include "common/serving/speculation_convert.h"
#include "common/serving/worker_host.h"

namespace tandem {
namespace {

// "cuda-ipc or nccl-chunks": the side links a receiver offers.
std::string OfferedLinks(const KvControlReceiver::Options& o) {
  std::string names;
  for (const KvLinkFactory* f : o.link_factories)
    absl::StrAppend(&names, names.empty() ? "" : " or ", f->name());
  return names;
}

}  // namespace

DecodeService::~DecodeService() { Stop(); }

absl::Status DecodeService::Start(LlamaModel* model, Engine* engine, const std::string& fingerprint,
                                  WorkerMetrics* metrics, v1::WorkerDescription* description) {
  engine_ = engine;
  metrics_ = metrics;
  if (!options_.combined) {
    KvControlReceiver::Options ro;
    ro.host = options_.bind_address;
    ro.port = options_.kv_port;
    ro.storage = engine->kv_storage();
    ro.info = {fingerprint, engine->kv_storage()->geometry()};
    ro.io_timeout = options_.kv_io_timeout;
    ro.idle_timeout = options_.kv_idle_connection;
    ro.keep_reservation_on_sender_loss = true;  // the router may retry the prefill elsewhere
    absl::StatusOr<KvDataPaths> paths = KvDataPathsFromFlags(engine->kv_storage());
    if (!paths.ok()) return paths.status();
    data_paths_ = *std::move(paths);
    ro.link_factories = data_paths_.links();
    absl::StatusOr<std::shared_ptr<KvTls>> tls = KvTlsFromFlags();
    if (!tls.ok()) return tls.status();
    ro.tls = *tls;
    auto receiver = KvControlReceiver::Create(ro);
    if (!receiver.ok()) return receiver.status();
    receiver_ = *std::move(receiver);
    // A TLS receiver's address says so: senders must then connect with TLS (kv_stream.h).
    kv_address_ = absl::StrCat(ro.tls != nullptr ? kKvTlsScheme : "", options_.advertise_host, ":",
                               receiver_->port());
    description->set_kv_address(kv_address_);
    TANDEM_LOG(INFO) << "KV receiver on " << kv_address_
                     << (ro.link_factories.empty()
                             ? ""
                             : absl::StrCat(" (layers inline or over ", OfferedLinks(ro), ")"));
  }
  EngineLoop::Handlers handlers;
  handlers.metrics = metrics;
  handlers.on_outputs = [this](std::vector<RequestOutput>& outputs) { OnOutputs(outputs); };
  handlers.on_tick = [this] { OnTick(); };
  loop_ = std::make_unique<EngineLoop>(engine, std::move(handlers));
  if (receiver_) {
    receiver_->SetCompletionCallback([this](const std::string& id) {
      loop_->Post([this, id](Engine& e) { TransferDone(e, id); });
    });
  }
  (void)model;
  started_ = true;
  return absl::OkStatus();
}

void DecodeService::Stop() {
  if (!loop_) return;
  loop_->Post([this](Engine& e) {
    std::vector<std::string> ids;
    for (const auto& [id, call] : calls_) ids.push_back(id);
    for (const std::string& id : ids)
      CancelCall(e, id, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down"));
  });
  loop_->Stop();
  // The loop object stays until the service goes: until the server has shut down, status calls
  // and cancellations may still read it (they find it stopped; a task posted now is dropped).
  receiver_.reset();
}

EngineSnapshot DecodeService::snapshot() const {
  EngineSnapshot s = EngineService::snapshot();
  s.pending_transfers = pending_transfers_.load();
  s.kv_links = data_paths_.live_links();
  s.kv_full = s.total_blocks > 0 && static_cast<double>(s.total_blocks - s.free_blocks) >
                                        options_.kv_high_water * s.total_blocks;
  return s;
}

grpc::ServerWriteReactor<v1::DecodeEvent>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  const std::string id = request->request_id();
  std::shared_ptr<Stream> stream;
  auto* reactor = Stream::Start(
      [this, id] {
        if (loop_) {
          loop_->Post([this, id](Engine& e) {
            CancelCall(e, id, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
          });
        }
      },
      &stream, &write_thread_);
  if (grpc::Status s = Admission(); !s.ok()) {
    stream->Finish(s);
    return reactor;
  }
  if (request->local_prefill() != options_.combined) {
    stream->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        options_.combined ? "this combined worker only runs local prefill"
                          : "this decode worker needs a KV transfer (not local_prefill)"));
    return reactor;
  }
  ++in_flight_;
  loop_->Post(
      [this, stream, req = *request, deadline = rpc::DeadlineOf(*context)](Engine& e) mutable {
        StartCall(e, std::move(stream), std::move(req), deadline);
      });
  return reactor;
}

void DecodeService::StartCall(Engine& engine, std::shared_ptr<Stream> stream,
                              v1::DecodeRequest request, absl::Time deadline) {
  const std::string id = request.request_id();
  auto refuse = [&](const absl::Status& s) {
    --in_flight_;
    stream->Finish(rpc::ToGrpc(s));
  };
  if (stream->cancelled()) return refuse(absl::CancelledError("cancelled"));
  if (calls_.contains(id))
    return refuse(absl::AlreadyExistsError(absl::StrCat("request \"", id, "\" is in flight")));
  Call call;
  call.stream = stream;
  call.arrival = absl::Now();
  call.request.id = id;
  call.request.prompt_token_ids.assign(request.prompt_token_ids().begin(),
                                       request.prompt_token_ids().end());
  call.request.params = rpc::FromProto(request.sampling());
  call.request.resumed_output_tokens = request.resumed_output_tokens();
  SpeculationFromProto(request.sampling().speculation(), &call.request);
  call.num_tokens = static_cast<int64_t>(call.request.prompt_token_ids.size());
  if (absl::Status s = engine.Validate(call.request); !s.ok()) return refuse(s);
  if (options_.combined) {
    if (absl::Status s = engine.AddRequest(call.request); !s.ok()) return refuse(s);
    calls_.emplace(id, std::move(call));
    return;
  }
  absl::StatusOr<std::vector<int32_t>> blocks = engine.Reserve(id, call.num_tokens);
  if (!blocks.ok()) return refuse(blocks.status());
  // Only the prefill worker the router hands this capability to may write into the blocks.
  const std::string capability = NewKvCapability();
  if (absl::Status s = receiver_->Expect(id, *blocks, capability); !s.ok()) {
    (void)engine.Release(id);
    return refuse(s);
  }
  call.awaiting_kv = true;
  call.kv_deadline = std::min(deadline, call.arrival + options_.kv_transfer_timeout);
  ++pending_transfers_;
  v1::DecodeEvent event;
  event.mutable_reserved()->set_kv_address(kv_address_);
  event.mutable_reserved()->set_num_blocks(static_cast<int32_t>(blocks->size()));
  event.mutable_reserved()->set_kv_capability(capability);
  stream->Write(std::move(event));
  calls_.emplace(id, std::move(call));
}

void DecodeService::TransferDone(Engine& engine, const std::string& id) {
  auto it = calls_.find(id);
  if (it == calls_.end() || !it->second.awaiting_kv) return;  // cancelled meanwhile
  Call& call = it->second;
  absl::StatusOr<int32_t> first = receiver_->Wait(id, absl::ZeroDuration());
  absl::Status s = first.status();
  if (s.ok()) s = engine.AdmitPrefilled(call.request, *first);
  if (!s.ok()) {
    EndReservation(engine, id, call, KvReservationOutcome::kFailed);
    return EndCall(id, grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(s.message())),
                   "transfer failed");
  }
  EndReservation(engine, id, call, KvReservationOutcome::kLanded);
  call.kv_done = absl::Now();
}

void DecodeService::EndReservation(Engine& engine, const std::string& id, Call& call,
                                   KvReservationOutcome outcome) {
  call.awaiting_kv = false;
  --pending_transfers_;
  if (metrics_ != nullptr) metrics_->ObserveReservation(outcome);
  if (outcome == KvReservationOutcome::kLanded) return;
  if (outcome != KvReservationOutcome::kFailed) receiver_->Cancel(id);
  (void)engine.Release(id);
}

void DecodeService::CancelCall(Engine& engine, const std::string& id, const grpc::Status& status) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  if (it->second.awaiting_kv) {
    EndReservation(engine, id, it->second, KvReservationOutcome::kCancelled);
  } else {
    (void)engine.Abort(id);  // NOT_FOUND when it already finished at admission
  }
  EndCall(
      id, status,
      status.error_code() == grpc::StatusCode::CANCELLED ? "cancelled" : status.error_message());
}

void DecodeService::EndCall(const std::string& id, const grpc::Status& status,
                            const std::string& reason) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  const Call& c = it->second;
  TANDEM_LOG(INFO) << "request " << id << " " << reason << ": prompt " << c.num_tokens
                   << " tokens, "
                   << absl::FormatDuration(
                          absl::Trunc(absl::Now() - c.arrival, absl::Milliseconds(1)));
  c.stream->Finish(status);
  calls_.erase(it);
  --in_flight_;
}

void DecodeService::OnOutputs(std::vector<RequestOutput>& outputs) {
  const absl::Time now = absl::Now();
  rpc::WriteThread::Hold hold(&write_thread_);  // one wake-up for the step's streams
  for (RequestOutput& o : outputs) {
    auto it = calls_.find(o.id);
    if (it == calls_.end()) continue;  // an abort we already answered
    Call& call = it->second;
    if (o.first_scheduled != absl::InfinitePast()) call.first_scheduled = o.first_scheduled;
    call.cached_tokens = std::max(call.cached_tokens, o.num_cached_tokens);
    if (!o.new_token_ids.empty() || o.prompt_logprobs) {
      v1::DecodeEvent event;
      v1::DecodeTokens* t = event.mutable_tokens();
      for (int32_t id : o.new_token_ids) t->add_token_ids(id);
      for (const LogprobEntry& e : o.new_logprobs) *t->add_logprobs() = rpc::ToProto(e);
      if (o.speculation) *t->mutable_speculation() = ToProto(*o.speculation);
      if (o.prompt_logprobs)
        rpc::AppendPromptLogprobs(*o.prompt_logprobs, call.request.prompt_token_ids,
                                  t->mutable_prompt_logprobs());
      call.stream->Write(std::move(event));
    }
    if (o.finished) {
      v1::DecodeEvent event;
      v1::DecodeFinished* f = event.mutable_finished();
      f->set_finish_reason(rpc::ToProto(o.finish_reason));
      f->set_cached_prompt_tokens(static_cast<int32_t>(call.cached_tokens));
      if (o.speculation) *f->mutable_speculation() = ToProto(*o.speculation);
      if (options_.combined) {
        if (call.first_scheduled != absl::InfinitePast()) {
          f->set_prefill_queue_seconds(absl::ToDoubleSeconds(call.first_scheduled - call.arrival));
        }
      } else {
        f->set_kv_wait_seconds(absl::ToDoubleSeconds(call.kv_done - call.arrival));
        if (call.first_scheduled != absl::InfinitePast()) {
          f->set_decode_queue_seconds(absl::ToDoubleSeconds(call.first_scheduled - call.kv_done));
        }
      }
      call.stream->Write(std::move(event));
      EndCall(o.id, grpc::Status::OK, FinishReasonName(o.finish_reason));
    }
  }
  (void)now;
}

void DecodeService::OnTick() {
  const absl::Time now = absl::Now();
  std::vector<std::string> expired;
  for (const auto& [id, call] : calls_) {
    if (call.awaiting_kv && now >= call.kv_deadline) expired.push_back(id);
  }
  for (const std::string& id : expired) {
    EndReservation(*engine_, id, calls_.at(id), KvReservationOutcome::kTimedOut);
    EndCall(
        id,
        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the KV transfer did not arrive in time"),
        "KV transfer timed out");
  }
}

}  // namespace tandem
