// The router's metrics: requests by outcome and gRPC code, latency histograms (TTFT, inter-token
// latency, time per output token, end to end, router queue) and TTFT taken apart (prefill queue,
// prefill compute, KV transfer, decode queue — one histogram each, so a dashboard can stack them),
// prompt and generation tokens, requests in flight, live workers by role, API-key refusals and
// request migrations.
#pragma once

#include "common/metrics/metrics.h"
#include "grpcpp/grpcpp.h"
#include "router/cluster.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

// What the router did with a request whose decode worker was lost (request_flow.h).
enum class MigrationOutcome {
  kResumed,    // resumed on another pair
  kExhausted,  // not: the request had used its --max-migrations
  kNoTime,     // not: too close to its deadline
};

class RouterMetrics {
 public:
  // Registers a refresher for the live-worker gauges; `cluster` must outlive `metrics`' refresher.
  RouterMetrics(Metrics* metrics, Cluster* cluster);

  void Admitted();
  // A request's end. `final` is meaningful when status is OK; `admitted` requests leave the
  // in-flight gauge.
  void Finished(const grpc::Status& status, const v1::GenerateResponse& final, bool admitted);
  // Time between two streamed deltas, spread over the tokens of the later one.
  void ObserveInterToken(double seconds, int tokens);
  // An HTTP API response (its status line) by endpoint ("/v1/chat/completions", "other", ...).
  void HttpResponse(const std::string& endpoint, int status);
  // A request refused for its API key: reason "unauthenticated" (none, or not valid) or
  // "rate_limited" (over the key's requests or tokens a minute).
  void ApiKeyRefused(const std::string& reason);
  // A request's decode worker was lost mid-request (tandem_request_migrations_total{outcome}).
  void Migration(MigrationOutcome outcome);

 private:
  Metrics* m_;
  prometheus::Gauge& in_flight_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& tpot_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& router_queue_;
  prometheus::Histogram& prefill_queue_;
  prometheus::Histogram& prefill_compute_;
  prometheus::Histogram& kv_transfer_;
  prometheus::Histogram& decode_queue_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
};

}  // namespace tandem::router
