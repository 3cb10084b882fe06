// The router's OpenAI-compatible HTTP API (--http-port): GET /v1/models, POST /v1/completions and
// /v1/chat/completions (whole responses, or server-sent events with `stream: true`), GET /health.
// Requests go through GenerationService::SubmitRequest — the same validation, admission, flows and
// metrics as the gRPC API — one flow per choice (`n`, or a list of prompts). A client that closes
// its connection cancels its flows, so their KV blocks come back at once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "router/generation_service.h"
#include "router/http_server.h"
#include "router/router_metrics.h"

namespace tandem::router {

class HttpFrontend {
 public:
  struct Options {
    std::string bind_address = "0.0.0.0";
    int port = 0;
    int threads = 2;
    size_t max_body_bytes = 16u << 20;
    bool write_through = true;  // HttpServer::Options::write_through
    // HTTPS with this certificate and key (empty: plaintext); see HttpServer::Options.
    std::string tls_cert_file, tls_key_file;
    absl::Duration tls_refresh = absl::Seconds(10);
  };
  // `metrics` may be null. Everything passed must outlive the frontend.
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(const Options& options,
                                                             GenerationService* service,
                                                             Cluster* cluster,
                                                             const Tokenizer* tokenizer,
                                                             RouterMetrics* metrics);
  ~HttpFrontend();
  int port() const { return server_->port(); }
  int threads() const { return server_->threads(); }
  int64_t open_connections() const { return server_->open_connections(); }
  void Stop() { server_->Stop(); }

 private:
  HttpFrontend(GenerationService* service, Cluster* cluster, const Tokenizer* tokenizer,
               RouterMetrics* metrics)
      : service_(service), cluster_(cluster), tokenizer_(tokenizer), metrics_(metrics) {}
  void Handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);

  GenerationService* service_;
  Cluster* cluster_;
  const Tokenizer* tokenizer_;
  RouterMetrics* metrics_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace tandem::router
