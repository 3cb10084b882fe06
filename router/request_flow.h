// One request's path through the cluster (request_flow.cc), asynchronous (StartFlow below):
//   disaggregated: choose a decode worker and open its Decode stream (it reserves KV blocks and
//     answers Reserved); choose a prefill worker (prefix affinity) and call Prefill naming the
//     decode worker's KV receiver; the first token comes back from the prefill worker (TTFT); then
//     the decode stream delivers the rest. A prefill worker that dies or hangs before the transfer
//     completed is marked unhealthy and the prefill retried on another one while the deadline
//     allows.
//   combined: one Decode stream with local_prefill.
// Request migration: a decode worker lost mid-request (killed, drained, or its KV transfer failed)
// is left, and the request resumed on another pair (another combined worker) from the prompt plus
// the output already streamed (resumed_output_tokens: the workers count it as generated, and a
// seeded sampler skips the draws it took), up to max_migrations times and while the deadline
// leaves prefill_retry_min_time_left; then it fails with UNAVAILABLE (DEADLINE_EXCEEDED past its
// deadline). The client sees one stream: no token repeated or lost.
// The router detokenizes incrementally, applies stop strings (cancelling the decode stream on a
// match), and reports text deltas and a final response to the sink. Client cancellation and the
// deadline propagate to every child call; every exit cancels what is still open, so the workers
// free the request's blocks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/chat/tool_calls.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "router/cluster.h"
#include "router/router_metrics.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

struct FlowRequest {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  v1::SamplingParameters proto_params;  // as forwarded to the workers
  std::vector<std::string> stop;
  bool skip_special_tokens = false;
  bool chat = false;  // the prompt is a rendered conversation: the response carries ChatOutput
  // A chat's tool calls: the format its output is parsed with (tool_choice decides).
  chat::ToolCallFormat tool_call_format = chat::ToolCallFormat::kNone;
  absl::Time arrival;
  absl::Time deadline = absl::InfiniteFuture();
};

// Receives a flow's output. Delta() may be called many times, then Finish() exactly once.
class FlowSink {
 public:
  virtual ~FlowSink() = default;
  virtual void Delta(v1::TextDelta delta) = 0;
  // `final` is meaningful when `status` is OK.
  virtual void Finish(const grpc::Status& status, v1::GenerateResponse final) = 0;
};

// Cancellation shared between the client's call (which may cancel at any time, from a gRPC thread),
// the router's watchdog (which cancels calls to workers that stopped being healthy: a hung worker
// must not hold a request until its deadline) and the flow's child calls.
class FlowControl {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Registers a child call to `worker`; it is cancelled at once when the flow already is.
  void Attach(grpc::ClientContext* context, const std::string& worker) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the child calls to workers `healthy` rejects, remembering them as lost.
  void CancelUnhealthy(const std::function<bool(const std::string&)>& healthy)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the watchdog cancelled this child call because its worker was lost.
  bool lost(const grpc::ClientContext* context) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Child {
    grpc::ClientContext* context;
    std::string worker;
  };
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Child> children_ ABSL_GUARDED_BY(mu_);
  std::vector<const grpc::ClientContext*> lost_ ABSL_GUARDED_BY(mu_);
};

struct FlowEnvironment {
  Cluster* cluster;
  const Tokenizer* tokenizer;
  absl::Duration prefill_retry_min_time_left = absl::Milliseconds(200);
  // Request migration (above): resumptions a request may take; 0 turns it off.
  int32_t max_migrations = 3;
  // The model's EOS (-1: none): whether the output streamed before a loss had already ended.
  int64_t eos_token_id = -1;
  RouterMetrics* metrics = nullptr;  // may be null
};

// Starts the request and returns at once. The flow runs on the threads gRPC completes its child
// calls on (flow_calls.h), one step at a time, and holds no thread while it waits: ten thousand
// streams in flight are ten thousand small state machines, not threads. `sink` gets Finish exactly
// once; then `done` runs, with no child call of the flow left open. `env` must outlive `done`.
void StartFlow(const FlowEnvironment& env, std::shared_ptr<const FlowRequest> request,
               std::shared_ptr<FlowControl> control, std::shared_ptr<FlowSink> sink,
               std::function<void()> done);

}  // namespace tandem::router
