// The decode worker's service (tandem.v1.Decode), and the combined role's.
//
// Decode role: a Decode call reserves KV blocks for the prompt (RESOURCE_EXHAUSTED when the pool
// cannot hold it: backpressure before any prefill work), tells the KV receiver to expect the
// transfer, and answers Reserved with the receiver's address. When the prefill worker's transfer
// completes, the request joins the running batch with its first token; tokens stream back; the call
// ends with Finished. A failed transfer ends the call with UNAVAILABLE; one that does not complete
// within --kv-transfer-timeout-s (or the call's deadline) with DEADLINE_EXCEEDED. Cancelling the
// call aborts the request. Every path frees the request's blocks. How each reservation ended is
// counted in tandem_kv_reservations_total{outcome}. Combined role (local_prefill): the prompt is
// computed here; no reservation, no transfer.
//
// Threads: gRPC handlers only post to the engine loop; all per-request state lives on its thread.
// The loop queues each step's events on their streams and a write thread sends them (gRPC sends on
// the thread that starts a write: a system call a stream a step), so the next step does not wait.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/metrics/worker_metrics.h"
#include "common/rpc/reactors.h"
#include "common/rpc/write_thread.h"
#include "common/serving/engine_loop.h"
#include "common/serving/engine_service.h"
#include "common/transport/kv_control.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class DecodeService final : public v1::Decode::CallbackService, public EngineService {
 public:
  struct Options {
    bool combined = false;
    std::string bind_address = "0.0.0.0";
    std::string advertise_host = "127.0.0.1";
    int kv_port = 0;
    absl::Duration kv_transfer_timeout = absl::Seconds(30);
    absl::Duration kv_io_timeout = absl::Seconds(10);
    // A KV connection idle this long with no transfer of its own waiting is closed
    // (KvControlReceiver's idle_timeout).
    absl::Duration kv_idle_connection = absl::Seconds(600);
    // Above this share of the KV pool in use the worker reports itself full in its heartbeats and
    // the router sends it no new work; preemption stays the last resort.
    double kv_high_water = 0.95;
  };
  explicit DecodeService(const Options& options) : options_(options) {}
  ~DecodeService() override;

  grpc::ServerWriteReactor<v1::DecodeEvent>* Decode(grpc::CallbackServerContext* context,
                                                    const v1::DecodeRequest* request) override;

  std::vector<grpc::Service*> grpc_services() override { return {this}; }
  std::vector<std::string> health_service_names() const override { return {"tandem.v1.Decode"}; }
  absl::Status Start(LlamaModel* model, Engine* engine, const std::string& fingerprint,
                     WorkerMetrics* metrics, v1::WorkerDescription* description) override;
  EngineSnapshot snapshot() const override;
  void Stop() override;

 private:
  using Stream = rpc::ServerStream<v1::DecodeEvent>;
  struct Call {
    std::shared_ptr<Stream> stream;
    EngineRequest request;
    bool awaiting_kv = false;
    absl::Time arrival, kv_deadline, kv_done, first_scheduled = absl::InfinitePast();
    int64_t num_tokens = 0;
    int64_t cached_tokens = 0;
  };
  // Loop-thread handlers.
  void StartCall(Engine& engine, std::shared_ptr<Stream> stream, v1::DecodeRequest request,
                 absl::Time deadline);
  void TransferDone(Engine& engine, const std::string& id);
  void CancelCall(Engine& engine, const std::string& id, const grpc::Status& status);
  void OnOutputs(std::vector<RequestOutput>& outputs);
  void OnTick();
  void EndCall(const std::string& id, const grpc::Status& status, const std::string& reason);
  // The call stops waiting for its KV: counted by outcome. Not landed: the receiver forgets the
  // transfer and the engine frees the reserved blocks.
  void EndReservation(Engine& engine, const std::string& id, Call& call,
                      KvReservationOutcome outcome);

  Options options_;
  KvDataPaths data_paths_;  // --kv-transport; outlives what uses it
  std::unique_ptr<KvControlReceiver> receiver_;
  // Starts the streams' writes. Lives as long as the service, so that gRPC threads may read it at
  // any time and the loop's last tasks' writes go out after Stop().
  rpc::WriteThread write_thread_;
  Engine* engine_ = nullptr;
  WorkerMetrics* metrics_ = nullptr;
  std::string kv_address_;
  std::atomic<int64_t> pending_transfers_{0};
  absl::flat_hash_map<std::string, Call> calls_;  // loop thread only
};

}  // namespace tandem
