#include "common/rpc/server.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace tandem::rpc {

void RunningServer::SetServing(bool serving) const {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  // By name: the overload without one sets every name, kLivenessService included.
  health->SetServingStatus("", serving);
  for (const std::string& name : health_service_names) health->SetServingStatus(name, serving);
}

absl::StatusOr<RunningServer> StartServer(const ServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(
      options.listen_address,
      options.credentials ? options.credentials : grpc::InsecureServerCredentials(), &running.port);
  // Peers ping idle connections to detect dead ones (the router its workers, every few seconds,
  // also while a long prefill keeps a stream silent). gRPC's default policy answers pings without
  // data more often than every 5 minutes with GOAWAY "too_many_pings", which kills the streams.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 50);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  for (grpc::Service* s : options.services) builder.RegisterService(s);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  running.health_service_names = options.health_service_names;
  running.SetServing(false);
  if (grpc::HealthCheckServiceInterface* health = running.server->GetHealthCheckService()) {
    health->SetServingStatus(kLivenessService, true);
  }
  return running;
}

absl::StatusOr<int> PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  return port;
}

}  // namespace tandem::rpc
