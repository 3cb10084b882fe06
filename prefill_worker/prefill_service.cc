#include "prefill_worker/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/rpc/convert.h"
#include "common/rpc/status.h"
#include "common/serving/worker_host.h"

namespace tandem {

PrefillService::~PrefillService() { Stop(); }

absl::Status PrefillService::Start(LlamaModel* model, Engine* engine,
                                   const std::string& fingerprint, WorkerMetrics* metrics,
                                   v1::WorkerDescription* description) {
  (void)model;
  (void)description;
  engine_ = engine;
  metrics_ = metrics;
  absl::StatusOr<KvDataPaths> paths = KvDataPathsFromFlags(engine->kv_storage());
  if (!paths.ok()) return paths.status();
  data_paths_ = *std::move(paths);
  absl::StatusOr<std::shared_ptr<KvTls>> tls = KvTlsFromFlags();
  if (!tls.ok()) return tls.status();
  KvTransferLanes::Options lanes{{fingerprint, engine->kv_storage()->geometry()},
                                 engine->kv_storage(),
                                 options_.kv_io_timeout,
                                 data_paths_.order(),
                                 options_.fault_stop_after_kv_layer};
  lanes.tls = *tls;
  lanes_ = std::make_unique<KvTransferLanes>(lanes);
  TANDEM_LOG(INFO) << "KV layers go "
                   << (data_paths_.links().empty() ? "inline on the TCP connection"
                                                   : "over " + data_paths_.Describe())
                   << (*tls != nullptr ? " (KV connections over TLS)" : "");
  if (options_.layerwise_transfer) {
    engine->set_layer_listener([this](int64_t layer, const std::vector<std::string>& completed) {
      OnLayer(layer, completed);
    });
  }
  EngineLoop::Handlers handlers;
  handlers.metrics = metrics;
  handlers.on_outputs = [this](std::vector<RequestOutput>& outputs) { OnOutputs(outputs); };
  loop_ = std::make_unique<EngineLoop>(engine, std::move(handlers));
  started_ = true;
  return absl::OkStatus();
}

void PrefillService::Stop() {
  if (!loop_) return;
  loop_->Post([this](Engine& e) {
    std::vector<std::string> ids;
    for (const auto& [id, r] : requests_) ids.push_back(id);
    for (const std::string& id : ids) CancelCall(e, id);
  });
  loop_->Stop();
  lanes_.reset();  // fails queued transfers; their callbacks post to a stopped loop (dropped)
  // The loop object stays until the service goes: until the server has shut down, status calls
  // and cancellations may still read it (they find it stopped; a task posted now is dropped).
}

EngineSnapshot PrefillService::snapshot() const {
  EngineSnapshot s = EngineService::snapshot();
  s.kv_links = data_paths_.live_links();
  return s;
}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  const std::string id = request->request_id();
  std::shared_ptr<Call> call;
  auto* reactor = Call::Start(
      response,
      [this, id] {
        if (loop_) loop_->Post([this, id](Engine& e) { CancelCall(e, id); });
      },
      &call);
  if (grpc::Status s = Admission(); !s.ok()) {
    call->Finish(s);
    return reactor;
  }
  ++in_flight_;
  loop_->Post([this, call, context, req = *request](Engine& e) mutable {
    StartCall(e, std::move(call), context, std::move(req));
  });
  return reactor;
}

void PrefillService::StartCall(Engine& engine, std::shared_ptr<Call> call,
                               grpc::CallbackServerContext* context, v1::PrefillRequest request) {
  const std::string id = request.request_id();
  auto refuse = [&](const absl::Status& s) {
    --in_flight_;
    call->Finish(rpc::ToGrpc(s));
  };
  if (call->cancelled()) return refuse(absl::CancelledError("cancelled"));
  if (requests_.contains(id))
    return refuse(absl::AlreadyExistsError(absl::StrCat("request \"", id, "\" is in flight")));
  EngineRequest er;
  er.id = id;
  er.prompt_token_ids.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  er.params = rpc::FromProto(request.sampling());
  er.resumed_output_tokens = request.resumed_output_tokens();
  if (er.params.max_tokens != 0 && request.decode_kv_address().empty()) {
    return refuse(
        absl::InvalidArgumentError("decode_kv_address is required unless max_tokens is 0"));
  }
  Request r;
  r.call = call;
  r.context = context;
  r.decode_address = er.params.max_tokens == 0 ? "" : request.decode_kv_address();
  r.kv_capability = request.kv_capability();
  r.prompt = er.prompt_token_ids;
  r.num_tokens = static_cast<int64_t>(er.prompt_token_ids.size());
  r.arrival = absl::Now();
  if (absl::Status s = engine.AddRequest(std::move(er)); !s.ok()) return refuse(s);
  requests_.emplace(id, std::move(r));
}

void PrefillService::OnLayer(int64_t layer, const std::vector<std::string>& completed) {
  // Called as the layer's KV writes are enqueued: its sends wait for them, not for the layers (or
  // the step) enqueued after them by the time a lane gets to it.
  std::shared_ptr<WorkMark> ready;
  for (const std::string& id : completed) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.decode_address.empty()) continue;
    const Request& r = it->second;
    if (layer == 0) lanes_->Begin(r.decode_address, id, r.num_tokens, r.kv_capability);
    if (ready == nullptr) ready = engine_->kv_storage()->backend()->Mark();
    lanes_->SendLayer(r.decode_address, id, static_cast<int32_t>(layer), engine_->block_table(id),
                      ready);
  }
}

void PrefillService::OnOutputs(std::vector<RequestOutput>& outputs) {
  const absl::Time now = absl::Now();
  for (RequestOutput& o : outputs) {
    auto it = requests_.find(o.id);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    v1::PrefillResponse& resp = r.response;
    if (o.first_scheduled != absl::InfinitePast()) {
      resp.set_queue_seconds(absl::ToDoubleSeconds(o.first_scheduled - r.arrival));
      resp.set_compute_seconds(absl::ToDoubleSeconds(now - o.first_scheduled));
    }
    resp.set_cached_prompt_tokens(static_cast<int32_t>(o.num_cached_tokens));
    if (o.prompt_logprobs)
      rpc::AppendPromptLogprobs(*o.prompt_logprobs, r.prompt, resp.mutable_prompt_logprobs());
    if (!o.finished) continue;
    if (o.finish_reason == FinishReason::kPrefillDone && !o.new_token_ids.empty()) {
      const int32_t first = o.new_token_ids[0];
      resp.set_first_token(first);
      if (!o.new_logprobs.empty()) *resp.mutable_first_logprobs() = rpc::ToProto(o.new_logprobs[0]);
      r.first_token_at = now;
      r.transferring = true;
      if (!options_.layerwise_transfer) {
        const KvCacheGeometry& g = engine_->kv_storage()->geometry();
        const std::shared_ptr<WorkMark> ready =
            engine_->kv_storage()->backend()->Mark();  // the step's work
        lanes_->Begin(r.decode_address, o.id, r.num_tokens, r.kv_capability);
        for (int32_t l = 0; l < g.num_layers; ++l) {
          lanes_->SendLayer(r.decode_address, o.id, l, engine_->block_table(o.id), ready);
        }
      }
      lanes_->End(
          r.decode_address, o.id, first, [this, id = o.id](const absl::Status& s, double seconds) {
            loop_->Post([this, id, s, seconds](Engine& e) { TransferDone(e, id, s, seconds); });
          });
    } else if (o.finish_reason ==
               FinishReason::kLength) {  // max_tokens 0: prompt evaluated, nothing to send
      Answer(o.id, grpc::Status::OK, "prompt evaluated");
    } else if (o.finish_reason != FinishReason::kAbort) {
      const std::string name = FinishReasonName(o.finish_reason);
      Answer(o.id, grpc::Status(grpc::StatusCode::INTERNAL, "unexpected finish " + name), name);
    }
  }
}

void PrefillService::TransferDone(Engine& engine, const std::string& id, const absl::Status& status,
                                  double seconds) {
  (void)engine.Release(id);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  if (r.cancelled) {
    requests_.erase(it);
    return;
  }
  r.response.set_transfer_seconds(absl::ToDoubleSeconds(absl::Now() - r.first_token_at));
  if (metrics_ != nullptr) {
    const KvCacheGeometry& g = engine.kv_storage()->geometry();
    const int64_t blocks = (r.num_tokens + g.block_size - 1) / g.block_size;
    metrics_->ObserveTransfer(blocks * KvCacheStorage::BytesPerBlock(g), seconds, status.ok());
  }
  if (!status.ok()) {
    r.context->AddTrailingMetadata(kKvFailureKey, "1");
    return Answer(id, grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(status.message())),
                  "transfer failed");
  }
  Answer(id, grpc::Status::OK, "transferred");
}

void PrefillService::CancelCall(Engine& engine, const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.cancelled) return;
  Request& r = it->second;
  if (r.transferring) {
    lanes_->Cancel(id);  // TransferDone releases the blocks and forgets the request
    r.cancelled = true;
    r.call->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    --in_flight_;
    return;
  }
  (void)engine.Abort(id);
  Answer(id, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"), "cancelled");
}

void PrefillService::Answer(const std::string& id, const grpc::Status& status,
                            const std::string& outcome) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  TANDEM_LOG(INFO) << "request " << id << " " << outcome << ": prompt " << r.num_tokens
                   << " tokens (" << r.response.cached_prompt_tokens() << " cached), queue "
                   << r.response.queue_seconds() * 1e3 << " ms, compute "
                   << r.response.compute_seconds() * 1e3 << " ms, transfer "
                   << r.response.transfer_seconds() * 1e3 << " ms";
  r.call->Finish(status, &r.response);
  requests_.erase(it);
  --in_flight_;
}

}  // namespace tandem
