// What every Tandem gRPC server has: the standard grpc.health.v1 health service (NOT_SERVING until
// the process says otherwise) and server reflection (so grpcurl works without .proto files).
//
// Health names: "" and every health_service_name say whether the process takes work (NOT_SERVING
// while it loads and while it drains: a readiness probe); kLivenessService is SERVING from the
// moment the server listens until the process exits, draining included (a liveness probe that
// must not kill a pod finishing its streams).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tandem::rpc {

inline constexpr char kLivenessService[] = "liveness";

struct ServerOptions {
  std::string listen_address = "0.0.0.0:0";  // port 0 picks a free one (see RunningServer::port)
  std::vector<grpc::Service*> services;
  // Services whose health status is reported besides the overall "" entry.
  std::vector<std::string> health_service_names;
  // Null: plaintext. rpc/tls.h's ServerCredentials for TLS.
  std::shared_ptr<grpc::ServerCredentials> credentials = nullptr;
};

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  // Sets the health status of "" and every named service (not kLivenessService).
  void SetServing(bool serving) const;
  std::vector<std::string> health_service_names;
};

absl::StatusOr<RunningServer> StartServer(const ServerOptions& options);

// "host:port" → port; the host part must be non-empty. INVALID_ARGUMENT otherwise.
absl::StatusOr<int> PortOf(const std::string& address);

}  // namespace tandem::rpc
