// The public API (tandem.v1.Generation) and the worker registration API (tandem.v1.Registration)
// of the router. Translators only: requests are validated here (every field, before any queue:
// INVALID_ARGUMENT with a message), admitted or refused at once (RESOURCE_EXHAUSTED when
// max_concurrent_requests run and max_queued_requests wait), and started as asynchronous flows
// (StartFlow), higher priority first. A flow holds no thread while it waits on workers: requests in
// flight cost memory, and the router's threads are gRPC's and the HTTP front end's however many
// streams are open. A watchdog cancels child calls to workers that stopped being
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
#include "router/api_keys.h"
#include "router/cluster.h"
#include "router/request_flow.h"
#include "router/router_metrics.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// Generate, GenerateStream and Tokenize are served raw and parsed here (rpc/raw_message.h): a
// request protobuf cannot parse (a string that is not UTF-8) is INVALID_ARGUMENT naming the field.
using GenerationServiceBase = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_GenerateStream<
        v1::Generation::WithRawCallbackMethod_Tokenize<
            v1::Generation::WithCallbackMethod_Detokenize<
                v1::Generation::WithCallbackMethod_ListModels<v1::Generation::Service>>>>>;

class GenerationService final : public GenerationServiceBase {
 public:
  struct Options {
    v1::ModelInfo model;  // name, fingerprint, vocabulary, context
    int64_t max_queued_requests = 1024;
    int max_concurrent_requests = 4096;  // flows in flight at once (not threads)
    // Prompt plus max_tokens summed over the flows in flight; past it, requests wait in the queue
    // (0: no limit). The head of the queue starts when it fits, or alone when nothing runs.
    int64_t max_inflight_tokens = 0;
    absl::Duration request_timeout = absl::Minutes(10);  // deadline of requests that set none
    int32_t max_logprobs = 20;
    // The model's chat template (null: chat requests are refused) and the format tool calls in a
    // chat response are parsed with.
    const chat::ChatTemplate* chat_template = nullptr;
    chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kNone;
    // Null: no API keys asked for. Else every client-facing call needs one (router/api_keys.h).
    ApiKeys* api_keys = nullptr;
    // Request migration (request_flow.h): resumptions a request may take after losing its decode
    // worker (0: off), and the model's EOS id, for whether a lost stream had already ended.
    int32_t max_migrations = 3;
    int64_t eos_token_id = -1;
  };
  // `metrics` may be null.
  GenerationService(const Options& options, Cluster* cluster, const Tokenizer* tokenizer,
                    RouterMetrics* metrics = nullptr);
  ~GenerationService() override;

  // Raw: the request is a GenerateRequest, the writes GenerateStreamResponses.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  // Raw: a GenerateRequest in, a GenerateResponse out.
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // Raw: a TokenizeRequest in, a TokenizeResponse out.
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

  // Another front door (the HTTP API): validates and admits `request` as Generate does and runs it
  // into `sink`, which then gets its deltas and exactly one Finish. A refusal (bad request,
  // overload, draining) is returned and nothing is called on the sink.
  // `api_key` is the caller's key name from Authenticate ("" when keys are off).
  absl::Status SubmitRequest(const v1::GenerateRequest& request, absl::Time deadline,
                             std::shared_ptr<FlowControl> control, std::shared_ptr<FlowSink> sink,
                             const std::string& api_key = "");
  // The caller's API key name from an Authorization value ("" when keys are off); UNAUTHENTICATED
  // (counted) without a valid key.
  absl::StatusOr<std::string> Authenticate(std::string_view authorization);
  const Options& options() const { return options_; }
  bool draining() const;

  int64_t in_flight() const;
  // New requests are refused with UNAVAILABLE; those admitted run to their end.
  void StartDraining();

 private:
  struct Job {
    int32_t priority;
    uint64_t order;
    std::shared_ptr<const FlowRequest> request;
    std::shared_ptr<FlowControl> control;
    std::shared_ptr<FlowSink> sink;
    int64_t tokens;  // prompt plus max_tokens: its share of max_inflight_tokens
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
                      std::shared_ptr<FlowControl> control, const SinkFactory& make_sink,
                      const std::string& api_key);
  // A raw Generate/GenerateStream call: its API key, its request parsed (a refusal counted as
  // Submit's are), then Submit.
  absl::Status SubmitRaw(const grpc::CallbackServerContext& context, const grpc::ByteBuffer& raw,
                         std::shared_ptr<FlowControl> control, const SinkFactory& make_sink);
  // Authenticate on a gRPC call's authorization metadata.
  absl::StatusOr<std::string> AuthenticateCall(const grpc::CallbackServerContext& context);
  // Starts queued flows while fewer than max_concurrent_requests run (one caller at a time: a flow
  // that ends inside it, or a concurrent caller, leaves the starting to it).
  void StartQueued() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a dequeued flow (or ends one cancelled or past its deadline while queued).
  void RunJob(Job job) ABSL_LOCKS_EXCLUDED(mu_);
  void Watchdog();

  Options options_;
  Cluster* cluster_;
  const Tokenizer* tokenizer_;
  RouterMetrics* metrics_;
  FlowEnvironment env_;
  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);  // by priority, then arrival
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t running_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // Job::tokens over the flows running
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool pumping_ ABSL_GUARDED_BY(mu_) = false;  // a StartQueued call is starting flows
  // Flows that ended and are still in their `done` (starting the next): the destructor waits for
  // them as for running ones.
  int64_t finishing_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::string> ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::shared_ptr<FlowControl>> active_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

class RegistrationService final : public v1::Registration::CallbackService {
 public:
  // With `require_client_certificate`, Register and Heartbeat are refused (UNAUTHENTICATED) unless
  // the caller presented a verified certificate (mutual TLS): a stranger cannot join the cluster.
  explicit RegistrationService(Cluster* cluster, bool require_client_certificate = false)
      : cluster_(cluster), require_client_certificate_(require_client_certificate) {}
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
  absl::Status CheckPeer(const grpc::CallbackServerContext& context) const;
  Cluster* cluster_;
  bool require_client_certificate_;
};

}  // namespace tandem::router
