// The public API (tandem.v1.Generation) and the worker registration API (tandem.v1.Registration)
// of the router. Translators only: requests are validated here (every field, before any queue:
// INVALID_ARGUMENT with a message), admitted or refused at once (RESOURCE_EXHAUSTED when
// max_concurrent_requests run and max_queued_requests wait), and run by RunFlow on a fixed pool of
// flow threads, higher priority first. A watchdog cancels child calls to workers that stopped being
// healthy, so a hung worker costs a request a retry or an UNAVAILABLE, never its whole deadline.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/chat/chat_template.h"
#include "common/chat/tool_calls.h"
#include "common/model/config.h"
#include "common/tokenizer/tokenizer.h"
#include "router/cluster.h"
#include "router/request_flow.h"
#include "router/router_metrics.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  struct Options {
    v1::ModelInfo model;  // name, fingerprint, vocabulary, context
    int64_t max_queued_requests = 1024;
    int max_concurrent_requests = 256;
    absl::Duration request_timeout = absl::Minutes(10);  // deadline of requests that set none
    int32_t max_logprobs = 20;
    // The model's chat template (null: chat requests are refused) and the format tool calls in a
    // chat response are parsed with.
    const chat::ChatTemplate* chat_template = nullptr;
    chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kNone;
  };
  // `metrics` may be null.
  GenerationService(const Options& options, Cluster* cluster, const Tokenizer* tokenizer,
                    RouterMetrics* metrics = nullptr);
  ~GenerationService() override;

  grpc::ServerWriteReactor<v1::GenerateStreamResponse>* GenerateStream(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const v1::GenerateRequest* request,
                                     v1::GenerateResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

  // Another front door (the HTTP API): validates and admits `request` as Generate does and runs it
  // into `sink`, which then gets its deltas and exactly one Finish. A refusal (bad request,
  // overload, draining) is returned and nothing is called on the sink.
  absl::Status SubmitRequest(const v1::GenerateRequest& request, absl::Time deadline,
                             std::shared_ptr<FlowControl> control, std::shared_ptr<FlowSink> sink);
  const Options& options() const { return options_; }
  bool draining() const;

  int64_t in_flight() const;
  // New requests are refused with UNAVAILABLE; those admitted run to their end.
  void StartDraining();

 private:
  struct Job {
    int32_t priority;
    uint64_t order;
    std::function<void()> run;
  };
  // A chat's tool_choice: sets the request's tool-call format, and returns the schema a forced
  // choice (required, a named function) generates under ("" otherwise).
  absl::StatusOr<std::string> ForcedToolChoice(const v1::ChatInput& chat, FlowRequest* r) const;
  absl::StatusOr<FlowRequest> Validate(const v1::GenerateRequest& request,
                                       absl::Time deadline) const;
  absl::Status CheckModel(const std::string& model) const;
  // Queues the flow or refuses it (RESOURCE_EXHAUSTED, ALREADY_EXISTS for an id in flight).
  absl::Status Admit(std::shared_ptr<FlowRequest> request, std::shared_ptr<FlowControl> control,
                     std::shared_ptr<FlowSink> sink, int32_t priority);
  // Validates and admits a request; a refusal is counted and returned for the caller to finish its
  // call with.
  using SinkFactory = std::function<std::shared_ptr<FlowSink>(const std::string& request_id)>;
  absl::Status Submit(const v1::GenerateRequest& request, absl::Time deadline,
                      std::shared_ptr<FlowControl> control, const SinkFactory& make_sink);
  void FlowThread();
  void Watchdog();

  Options options_;
  Cluster* cluster_;
  const Tokenizer* tokenizer_;
  RouterMetrics* metrics_;
  FlowEnvironment env_;
  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);  // by priority, then arrival
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::shared_ptr<FlowControl>> active_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
  std::thread watchdog_;
};

class RegistrationService final : public v1::Registration::CallbackService {
 public:
  explicit RegistrationService(Cluster* cluster) : cluster_(cluster) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;

 private:
  Cluster* cluster_;
};

}  // namespace tandem::router
