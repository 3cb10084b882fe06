// What the worker services (prefill, decode, combined) share: the engine loop that owns the engine,
// and the loading / draining / in-flight state the host reads. gRPC handlers check Admission()
// first, then post their work to the loop.
#pragma once

#include <atomic>
#include <memory>

#include "common/serving/engine_loop.h"
#include "common/serving/worker_host.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

class EngineService : public WorkerService {
 public:
  int64_t in_flight() const override { return in_flight_.load(); }
  void StartDraining() override { draining_ = true; }
  EngineSnapshot snapshot() const override { return loop_ ? loop_->snapshot() : EngineSnapshot{}; }

 protected:
  // UNAVAILABLE while the model loads or the worker drains (new calls are refused), else OK.
  grpc::Status Admission() const {
    if (!started_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is loading");
    if (draining_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is draining");
    return grpc::Status::OK;
  }

  std::unique_ptr<EngineLoop> loop_;
  std::atomic<bool> started_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace tandem
