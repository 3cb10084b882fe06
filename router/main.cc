// tandem-router: the public gRPC endpoint of a Tandem cluster (tandem.v1.Generation) and the
// registry its workers register with (tandem.v1.Registration). See generation_service.h, cluster.h
// and request_flow.h.
#include <signal.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/command_line.h"
#include "common/base/logging.h"
#include "common/base/signals.h"
#include "common/chat/chat_template.h"
#include "common/chat/tool_calls.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/model/fingerprint.h"
#include "common/rpc/server.h"
#include "common/rpc/tls.h"
#include "common/tokenizer/tokenizer.h"
#include "router/generation_service.h"
#include "router/http_frontend.h"

ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (config.json, tokenizer.json; weights' headers)");
ABSL_FLAG(std::string, model_name, "",
          "name clients use for the model (default: the directory's name)");
ABSL_FLAG(int32_t, port, 50051, "gRPC port (0 = any free port; the chosen one is printed)");
ABSL_FLAG(std::string, bind_address, "0.0.0.0", "address to listen on");
ABSL_FLAG(std::string, workers, "",
          "static workers, comma-separated host:port (polled; they need no --router)");
ABSL_FLAG(
    std::string, workers_dns, "",
    "workers found by DNS, comma-separated NAME:PORT: each name is resolved every "
    "--dns-refresh-ms to all its addresses (a Kubernetes headless Service: one per ready pod) "
    "and each address is polled like a --workers entry; several routers find the same "
    "workers");
ABSL_FLAG(std::string, dns_server, "",
          "IP:PORT of the DNS server for --workers-dns (default: the system's resolver)");
ABSL_FLAG(int32_t, dns_refresh_ms, 5000, "how often --workers-dns names are resolved again");
ABSL_FLAG(int64_t, max_queued_requests, 1024,
          "requests waiting to start (past --max-concurrent-requests or --max-inflight-tokens) "
          "beyond which new ones are refused");
ABSL_FLAG(int32_t, max_concurrent_requests, 4096,
          "requests in flight through the cluster at once (asynchronous flows: each costs tens of "
          "kilobytes of memory, no thread)");
ABSL_FLAG(int64_t, max_inflight_tokens, 0,
          "prompt plus max_tokens summed over the requests in flight, past which new ones wait in "
          "the queue (0: no limit; a request larger than the limit runs alone)");
ABSL_FLAG(double, request_timeout_s, 600, "deadline of requests that set none");
ABSL_FLAG(double, heartbeat_timeout_s, 3,
          "a worker silent this long (no heartbeat, no answered call) receives no new work and its "
          "calls are cancelled");
ABSL_FLAG(int32_t, max_logprobs, 20, "largest logprobs / prompt_logprobs a request may ask for");
ABSL_FLAG(int32_t, worker_keepalive_ms, 2000, "keepalive ping interval on connections to workers");
ABSL_FLAG(int32_t, worker_keepalive_timeout_ms, 2000,
          "a worker connection whose ping is not answered in this time is dropped (its calls fail "
          "UNAVAILABLE)");
ABSL_FLAG(int32_t, metrics_port, -1,
          "port of GET /metrics (Prometheus); 0 = any free port (printed), -1 = off");
ABSL_FLAG(double, drain_grace_s, 30, "seconds requests in flight get to finish after SIGTERM");
ABSL_FLAG(
    int32_t, max_migrations, 3,
    "request migration: when a request's decode worker dies or is drained mid-stream, resume "
    "it on another prefill/decode pair from the prompt and the output already streamed, up to "
    "this many times a request (0 = off: the request fails with UNAVAILABLE)");
ABSL_FLAG(
    int32_t, http_port, -1,
    "port of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
    "/health); 0 = any free port (printed), -1 = off");
ABSL_FLAG(bool, http_tls, true,
          "with --tls-cert-file/--tls-key-file: serve the HTTP API as HTTPS with the same "
          "certificate (reloaded as it changes); false: plaintext HTTP beside TLS gRPC");
ABSL_FLAG(int32_t, http_threads, 2, "I/O threads of the HTTP API (they hold every connection)");
ABSL_FLAG(bool, http_write_through, true,
          "send a streamed event from the thread that produced it when the connection has nothing "
          "queued (plaintext HTTP); false: every event goes by an HTTP I/O thread");
ABSL_FLAG(int64_t, http_max_body_bytes, 16 << 20, "largest HTTP request body (larger: 413)");
ABSL_FLAG(std::string, api_key_file, "",
          "API keys for the client-facing gRPC service and the HTTP API: one per line, "
          "`KEY [name=NAME] [rpm=N] [tpm=N]` (requests and tokens a minute); re-read when it "
          "changes. Empty: no key needed");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "with --tls-cert-file and --tls-ca-file: every client (not only workers registering) "
          "must present a certificate from the CA");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "how tool calls in a chat response are parsed: auto (from the chat template: hermes for "
          "<tool_call>, llama3_json for Llama 3.1's, mistral for [TOOL_CALLS]), hermes, "
          "llama3_json, mistral or "
          "none");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tandem-router --model DIR [--port 50051] [--workers HOST:PORT,...] ...\nRouter of a Tandem "
      "cluster; --helpfull lists every flag.");
  tandem::ParseCommandLine(argc, argv);
  tandem::InstallTerminationHandlers();

  const std::string dir = absl::GetFlag(FLAGS_model);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "tandem-router: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  if (dir.empty()) return fail(absl::InvalidArgumentError("--model DIR is required"));
  auto config = tandem::LoadModelConfig(dir);
  if (!config.ok()) return fail(config.status());
  auto tokenizer = tandem::Tokenizer::Load(dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto fingerprint = tandem::ModelFingerprint(dir);
  if (!fingerprint.ok()) return fail(fingerprint.status());
  // Chat requests need the model's chat template; a model without one serves prompts only.
  std::unique_ptr<tandem::chat::ChatTemplate> chat_template;
  if (auto loaded = tandem::chat::ChatTemplate::Load(dir); loaded.ok()) {
    chat_template = *std::move(loaded);
  } else if (loaded.status().code() != absl::StatusCode::kNotFound) {
    return fail(loaded.status());
  }
  tandem::chat::ToolCallFormat tool_call_format = tandem::chat::ToolCallFormat::kNone;
  if (absl::GetFlag(FLAGS_tool_call_parser) == "auto") {
    if (chat_template)
      tool_call_format = tandem::chat::DetectToolCallFormat(chat_template->ToolTemplateSource());
  } else {
    auto format = tandem::chat::ParseToolCallFormat(absl::GetFlag(FLAGS_tool_call_parser));
    if (!format.ok())
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--tool-call-parser: ", format.status().message())));
    tool_call_format = *format;
  }

  const absl::StatusOr<tandem::rpc::TlsOptions> tls = tandem::rpc::TlsOptionsFromFlags();
  if (!tls.ok()) return fail(tls.status());
  tandem::router::Cluster::Options co;
  co.tls = *tls;
  co.model_fingerprint = *fingerprint;
  co.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  for (absl::string_view w :
       absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipWhitespace())) {
    co.static_workers.emplace_back(w);
  }
  for (absl::string_view w :
       absl::StrSplit(absl::GetFlag(FLAGS_workers_dns), ',', absl::SkipWhitespace())) {
    co.dns_workers.emplace_back(w);
  }
  co.dns_server = absl::GetFlag(FLAGS_dns_server);
  co.dns_refresh = absl::Milliseconds(std::max(100, absl::GetFlag(FLAGS_dns_refresh_ms)));
  co.prefill_policy.block_size = 16;
  co.keepalive = absl::Milliseconds(std::max(10, absl::GetFlag(FLAGS_worker_keepalive_ms)));
  co.keepalive_timeout =
      absl::Milliseconds(std::max(10, absl::GetFlag(FLAGS_worker_keepalive_timeout_ms)));
  tandem::router::Cluster cluster(co);

  tandem::router::GenerationService::Options go;
  std::string name = absl::GetFlag(FLAGS_model_name);
  if (name.empty()) name = tandem::ModelDirName(dir);
  go.model.set_name(name);
  go.model.set_architecture(config->architecture);
  go.model.set_fingerprint(*fingerprint);
  go.model.set_vocab_size(static_cast<int32_t>(config->vocab_size));
  go.model.set_max_position_embeddings(static_cast<int32_t>(config->max_position_embeddings));
  go.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  go.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  go.max_inflight_tokens = absl::GetFlag(FLAGS_max_inflight_tokens);
  go.request_timeout = absl::Seconds(absl::GetFlag(FLAGS_request_timeout_s));
  go.max_logprobs = absl::GetFlag(FLAGS_max_logprobs);
  go.max_migrations = absl::GetFlag(FLAGS_max_migrations);
  go.eos_token_id = config->eos_token_id;
  go.chat_template = chat_template.get();
  go.tool_call_format = tool_call_format;
  std::unique_ptr<tandem::router::ApiKeys> api_keys;
  if (const std::string f = absl::GetFlag(FLAGS_api_key_file); !f.empty()) {
    auto loaded = tandem::router::ApiKeys::Load(f);
    if (!loaded.ok()) return fail(loaded.status());
    api_keys = *std::move(loaded);
    go.api_keys = api_keys.get();
    TANDEM_LOG(INFO) << "router: " << api_keys->size() << " API keys from " << f;
  }
  tandem::Metrics::Options mo;
  mo.model = name;
  mo.role = "router";
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    mo.listen_address =
        absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", absl::GetFlag(FLAGS_metrics_port));
  }
  auto metrics = tandem::Metrics::Create(mo);
  if (!metrics.ok()) return fail(metrics.status());
  (*metrics)->SetBuildInfo("none", "router");
  tandem::router::RouterMetrics router_metrics(metrics->get(), &cluster);
  tandem::router::GenerationService generation(go, &cluster, tokenizer->get(), &router_metrics);
  // With a CA: workers must register with a certificate; clients may show one, or must with
  // --tls-require-client-cert.
  tandem::router::RegistrationService registration(&cluster,
                                                   tls->server_tls() && !tls->ca_file.empty());

  tandem::rpc::ServerOptions so;
  so.listen_address =
      absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", absl::GetFlag(FLAGS_port));
  so.services = {&generation, &registration};
  so.credentials = tandem::rpc::ServerCredentials(*tls, absl::GetFlag(FLAGS_tls_require_client_cert)
                                                            ? tandem::rpc::ClientAuth::kRequired
                                                            : tandem::rpc::ClientAuth::kOptional);
  so.health_service_names = {"tandem.v1.Generation", "tandem.v1.Registration"};
  auto server = tandem::rpc::StartServer(so);
  if (!server.ok()) return fail(server.status());
  std::unique_ptr<tandem::router::HttpFrontend> http;
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    tandem::router::HttpFrontend::Options ho;
    ho.bind_address = absl::GetFlag(FLAGS_bind_address);
    ho.port = absl::GetFlag(FLAGS_http_port);
    ho.threads = absl::GetFlag(FLAGS_http_threads);
    ho.write_through = absl::GetFlag(FLAGS_http_write_through);
    ho.max_body_bytes =
        static_cast<size_t>(std::max<int64_t>(1024, absl::GetFlag(FLAGS_http_max_body_bytes)));
    if (tls->server_tls() && absl::GetFlag(FLAGS_http_tls)) {
      ho.tls_cert_file = tls->cert_file;
      ho.tls_key_file = tls->key_file;
      ho.tls_refresh = absl::Seconds(std::max(1, tls->refresh_s));
    }
    auto started = tandem::router::HttpFrontend::Start(ho, &generation, &cluster, tokenizer->get(),
                                                       &router_metrics);
    if (!started.ok()) return fail(started.status());
    http = *std::move(started);
  }
  server->SetServing(true);
  std::printf("tandem-router: listening on %s:%d\n", absl::GetFlag(FLAGS_bind_address).c_str(),
              server->port);
  if (http) {
    std::printf("tandem-router: OpenAI-compatible HTTP API on %s://%s:%d/v1\n",
                tls->server_tls() && absl::GetFlag(FLAGS_http_tls) ? "https" : "http",
                absl::GetFlag(FLAGS_bind_address).c_str(), http->port());
  }
  if (!mo.listen_address.empty()) {
    std::printf("tandem-router: metrics on %s:%d/metrics\n",
                absl::GetFlag(FLAGS_bind_address).c_str(), (*metrics)->port());
  }
  std::fflush(stdout);
  TANDEM_LOG(INFO) << "router serving " << name << " (" << config->architecture << ", fingerprint "
                   << *fingerprint << ") on port " << server->port << "; chat "
                   << (chat_template
                           ? absl::StrCat("template loaded, tool calls parsed as ",
                                          tandem::chat::ToolCallFormatName(tool_call_format))
                           : std::string("off (the model has no chat template)"));

  tandem::WaitForTerminationSignal();
  TANDEM_LOG(INFO) << "router: draining (" << generation.in_flight() << " requests in flight)";
  server->SetServing(false);
  generation.StartDraining();
  const absl::Time grace_end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_drain_grace_s));
  while (generation.in_flight() > 0 && absl::Now() < grace_end)
    absl::SleepFor(absl::Milliseconds(20));
  if (http) http->Stop();
  // Idle client connections hold Shutdown until its deadline: keep it short once nothing runs.
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  TANDEM_LOG(INFO) << "router: stopped";
  metrics->reset();  // its refresher reads the cluster
  return 0;
}
