// The process around a worker's service: flags, the gRPC server (with health and reflection), model
// loading, registration and heartbeats to the router, the WorkerStatus service, and draining.
//
// Lifecycle: the server starts first and answers health checks with NOT_SERVING while the model
// loads; then the service starts and health turns SERVING; the worker registers with --router and
// heartbeats its load. On SIGTERM or SIGINT it drains: health NOT_SERVING, heartbeats say draining
// (the router routes nothing new to it), new calls are refused with UNAVAILABLE, in-flight requests
// finish within --drain-grace; then the server shuts down and the process exits 0.
#pragma once

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "common/engine/engine.h"
#include "common/metrics/worker_metrics.h"
#include "common/model/llama_model.h"
#include "common/transport/kv_data_paths.h"
#include "common/transport/kv_link.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/worker.pb.h"

ABSL_DECLARE_FLAG(std::string, bind_address);
ABSL_DECLARE_FLAG(std::string, advertise_host);

namespace tandem {

// What a worker role plugs into the host.
class WorkerService {
 public:
  virtual ~WorkerService() = default;
  virtual std::vector<grpc::Service*> grpc_services() = 0;
  virtual std::vector<std::string> health_service_names() const = 0;
  // Once the model and engine exist: start serving; fill the role's part of the description
  // (e.g. the KV receiver's address). Calls before Start() are refused with UNAVAILABLE.
  // `metrics` outlives the service.
  virtual absl::Status Start(LlamaModel* model, Engine* engine, const std::string& fingerprint,
                             WorkerMetrics* metrics, v1::WorkerDescription* description) = 0;
  // The engine's state as its loop last published it (heartbeats, WorkerStatus, metrics).
  virtual EngineSnapshot snapshot() const = 0;
  virtual int64_t in_flight() const = 0;
  // Refuse new calls (UNAVAILABLE, "draining"); in-flight ones continue.
  virtual void StartDraining() = 0;
  // Abort what is left and stop the engine thread. The service keeps answering snapshot() (and
  // refusing calls) until it is destroyed: the host stops it before it shuts its server down.
  virtual void Stop() = 0;
};

// Runs a worker process until SIGTERM/SIGINT and drain; returns the exit code. Flags: --model,
// --port, --bind-address, --advertise-host, --router, --heartbeat-interval-ms, --drain-grace-s,
// --metrics-port, --kv-transport, --nccl-host-id and the engine flags. `name` is used in logs
// ("prefill-worker").
int RunWorker(const std::string& name, v1::WorkerRole role, WorkerService* service);

// The data paths --kv-transport names (kv_data_paths.h), serving `storage`: FAILED_PRECONDITION
// when a side link cannot be made (the cache is not in CUDA memory, the plugin or NCCL does not
// load).
absl::StatusOr<KvDataPaths> KvDataPathsFromFlags(KvCacheStorage* storage);

}  // namespace tandem
