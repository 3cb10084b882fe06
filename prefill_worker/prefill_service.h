// The prefill worker's service (tandem.v1.Prefill).
//
// A Prefill call queues the prompt in the prefill-role engine (chunked, batched with other prompts,
// prefix cache reused). During the step that completes the prompt, each layer's KV blocks are
// handed to the transfer lane of the request's decode worker as soon as that layer is computed
// (with
// --layerwise-transfer=false, after the whole step: the comparison point). The first token is
// sampled here and sent with the end of the transfer; the call answers once the decode worker
// acknowledged it, with the first token, its logprobs and the time spent queued, computing and
// transferring. A failed transfer answers UNAVAILABLE with trailing metadata tandem-kv-failure=1
// (the decode side failed: the router must not retry elsewhere). max_tokens 0 evaluates the prompt
// only (prompt logprobs) and transfers nothing. Cancelling the call aborts the request wherever it
// is; the request's blocks are released on every path.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/rpc/reactors.h"
#include "common/serving/engine_loop.h"
#include "common/serving/engine_service.h"
#include "prefill_worker/kv_transfer_lanes.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class PrefillService final : public v1::Prefill::CallbackService, public EngineService {
 public:
  struct Options {
    bool layerwise_transfer = true;
    absl::Duration kv_io_timeout = absl::Seconds(10);
    int32_t fault_stop_after_kv_layer = -1;  // KvTransferLanes::Options::fault_stop_after_layer
  };
  static constexpr char kKvFailureKey[] = "tandem-kv-failure";

  explicit PrefillService(const Options& options) : options_(options) {}
  ~PrefillService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;

  std::vector<grpc::Service*> grpc_services() override { return {this}; }
  std::vector<std::string> health_service_names() const override { return {"tandem.v1.Prefill"}; }
  absl::Status Start(LlamaModel* model, Engine* engine, const std::string& fingerprint,
                     WorkerMetrics* metrics, v1::WorkerDescription* description) override;
  void Stop() override;
  EngineSnapshot snapshot() const override;

 private:
  using Call = rpc::UnaryCall<v1::PrefillResponse>;
  struct Request {
    std::shared_ptr<Call> call;
    grpc::CallbackServerContext* context;  // valid until the call is finished
    std::string decode_address;
    std::string kv_capability;  // the decode worker's for the reservation
    std::vector<int32_t> prompt;
    int64_t num_tokens = 0;
    bool transferring = false;  // handed out: the End job is queued
    bool cancelled = false;     // answered already; blocks released when the transfer ends
    v1::PrefillResponse response;
    absl::Time arrival, first_token_at;
  };
  void StartCall(Engine& engine, std::shared_ptr<Call> call, grpc::CallbackServerContext* context,
                 v1::PrefillRequest request);
  void CancelCall(Engine& engine, const std::string& id);
  void OnLayer(int64_t layer, const std::vector<std::string>& completed);
  void OnOutputs(std::vector<RequestOutput>& outputs);
  void TransferDone(Engine& engine, const std::string& id, const absl::Status& status,
                    double seconds);
  void Answer(const std::string& id, const grpc::Status& status, const std::string& outcome);

  Options options_;
  Engine* engine_ = nullptr;
  WorkerMetrics* metrics_ = nullptr;
  KvDataPaths data_paths_;  // --kv-transport; outlives what uses it
  std::unique_ptr<KvTransferLanes> lanes_;
  absl::flat_hash_map<std::string, Request> requests_;  // loop thread only
};

}  // namespace tandem
