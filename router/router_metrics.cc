#include "router/router_metrics.h"

#include "absl/status/status.h"
#include "common/rpc/convert.h"

namespace tandem::router {
namespace {

prometheus::Counter& ApiKeyCounter(Metrics* m, const std::string& reason) {
  return m->Counter("tandem_api_key_refusals_total",
                    "Requests refused for their API key: unauthenticated, or rate_limited.",
                    {{"reason", reason}});
}

prometheus::Counter& MigrationCounter(Metrics* m, MigrationOutcome outcome) {
  const char* name = outcome == MigrationOutcome::kResumed     ? "resumed"
                     : outcome == MigrationOutcome::kExhausted ? "exhausted"
                                                               : "no_time";
  return m->Counter(
      "tandem_request_migrations_total",
      "Requests whose decode worker was lost mid-request, by outcome: resumed on another pair, or "
      "not (exhausted: past --max-migrations; no_time: too close to the deadline).",
      {{"outcome", name}});
}

}  // namespace

RouterMetrics::RouterMetrics(Metrics* m, Cluster* cluster)
    : m_(m),
      in_flight_(m->Gauge("tandem_requests_in_flight",
                          "Requests admitted and not finished (queued or running).")),
      ttft_(m->Histogram("tandem_time_to_first_token_seconds",
                         "Arrival at the router to the first token.", Metrics::LatencyBuckets())),
      itl_(m->Histogram("tandem_inter_token_latency_seconds",
                        "Time between consecutive output tokens.", Metrics::TokenLatencyBuckets())),
      tpot_(m->Histogram("tandem_time_per_output_token_seconds",
                         "(end to end - TTFT) / (output tokens - 1), per request.",
                         Metrics::TokenLatencyBuckets())),
      e2e_(m->Histogram("tandem_e2e_request_latency_seconds",
                        "Arrival at the router to the last token.", Metrics::LatencyBuckets())),
      router_queue_(m->Histogram("tandem_router_queue_seconds",
                                 "Time a request waited in the router's queue.",
                                 Metrics::LatencyBuckets())),
      prefill_queue_(m->Histogram("tandem_prefill_queue_seconds",
                                  "TTFT part: waiting in the prefill worker.",
                                  Metrics::LatencyBuckets())),
      prefill_compute_(m->Histogram("tandem_prefill_compute_seconds",
                                    "TTFT part: computing the prompt.", Metrics::LatencyBuckets())),
      kv_transfer_(m->Histogram(
          "tandem_request_kv_transfer_seconds",
          "TTFT part: first token sampled to the decode worker's acknowledgement of the KV.",
          Metrics::LatencyBuckets())),
      decode_queue_(m->Histogram("tandem_decode_queue_seconds",
                                 "After the transfer: waiting for the decode worker's first step.",
                                 Metrics::LatencyBuckets())),
      prompt_tokens_(
          m->Counter("tandem_prompt_tokens_total", "Prompt tokens of finished requests.")),
      generation_tokens_(m->Counter("tandem_generation_tokens_total", "Tokens generated.")) {
  const std::pair<const char*, v1::WorkerRole> roles[] = {{"prefill", v1::WORKER_ROLE_PREFILL},
                                                          {"decode", v1::WORKER_ROLE_DECODE},
                                                          {"combined", v1::WORKER_ROLE_COMBINED}};
  for (const auto& [name, role] : roles) {
    prometheus::Gauge& live = m->Gauge("tandem_workers_live", "Workers receiving work, by role.",
                                       {{"worker_role", name}});
    m->OnRefresh(
        [&live, cluster, role = role] { live.Set(static_cast<double>(cluster->num_live(role))); });
  }
  // The common outcomes exist from the start, so rate() queries have series before traffic.
  for (const char* outcome : {"stop", "length"}) {
    m->Counter("tandem_requests_total", "Requests by outcome and gRPC code.",
               {{"outcome", outcome}, {"code", "OK"}});
  }
  m->Counter("tandem_requests_total", "Requests by outcome and gRPC code.",
             {{"outcome", "error"}, {"code", "UNAVAILABLE"}});
  for (const char* reason : {"unauthenticated", "rate_limited"}) ApiKeyCounter(m, reason);
  for (MigrationOutcome o :
       {MigrationOutcome::kResumed, MigrationOutcome::kExhausted, MigrationOutcome::kNoTime}) {
    MigrationCounter(m, o);
  }
  for (const char* endpoint : {"/v1/completions", "/v1/chat/completions"}) {
    m->Counter("tandem_http_requests_total", "HTTP API requests by endpoint and HTTP status.",
               {{"endpoint", endpoint}, {"code", "200"}});
  }
}

void RouterMetrics::Admitted() { in_flight_.Increment(); }

void RouterMetrics::ApiKeyRefused(const std::string& reason) {
  ApiKeyCounter(m_, reason).Increment();
}

void RouterMetrics::Migration(MigrationOutcome outcome) {
  MigrationCounter(m_, outcome).Increment();
}

void RouterMetrics::HttpResponse(const std::string& endpoint, int status) {
  m_->Counter("tandem_http_requests_total", "HTTP API requests by endpoint and HTTP status.",
              {{"endpoint", endpoint}, {"code", std::to_string(status)}})
      .Increment();
}

void RouterMetrics::Finished(const grpc::Status& status, const v1::GenerateResponse& final,
                             bool admitted) {
  if (admitted) in_flight_.Decrement();
  std::string outcome = status.ok() ? rpc::FinishReasonName(final.finish_reason()) : "error";
  if (outcome.empty()) outcome = "unknown";
  m_->Counter(
        "tandem_requests_total", "Requests by outcome and gRPC code.",
        {{"outcome", outcome},
         {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))}})
      .Increment();
  if (!status.ok()) return;
  const v1::Timings& t = final.timings();
  const int completion = final.usage().completion_tokens();
  prompt_tokens_.Increment(final.usage().prompt_tokens());
  generation_tokens_.Increment(completion);
  router_queue_.Observe(t.router_queue());
  e2e_.Observe(t.end_to_end());
  if (completion > 0) ttft_.Observe(t.time_to_first_token());
  if (completion > 1) tpot_.Observe((t.end_to_end() - t.time_to_first_token()) / (completion - 1));
  prefill_queue_.Observe(t.prefill_queue());
  prefill_compute_.Observe(t.prefill_compute());
  kv_transfer_.Observe(t.kv_transfer());
  decode_queue_.Observe(t.decode_queue());
}

void RouterMetrics::ObserveInterToken(double seconds, int tokens) {
  if (tokens <= 0) return;
  for (int i = 0; i < tokens; ++i) itl_.Observe(seconds / tokens);
}

}  // namespace tandem::router
