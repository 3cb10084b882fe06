// `tandem health`: asks a Tandem process (or any gRPC server) its grpc.health.v1 status, as
// Kubernetes' gRPC probes do; exit 0 when SERVING. For scripts, tests, and exec probes on clusters
// without native gRPC probes.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/rpc/tls.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_FLAG(std::string, service, "",
          "health: the service name asked about (\"\": the whole process, ready to take work; "
          "\"liveness\": alive, draining included; or a gRPC service's full name)");
ABSL_FLAG(double, health_timeout_s, 2, "health: seconds to wait for the answer");

namespace tandem::cli {
namespace {

// grpc.health.v1.HealthCheckRequest {string service = 1}, encoded by hand: one length-delimited
// field, so the CLI needs no generated code for it.
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0A);
  for (size_t n = service.size();; n >>= 7) {
    const unsigned char b = n & 0x7F;
    if (n < 0x80) {
      out.push_back(static_cast<char>(b));
      break;
    }
    out.push_back(static_cast<char>(b | 0x80));
  }
  return out + service;
}

// HealthCheckResponse {ServingStatus status = 1}: 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING,
// 3 SERVICE_UNKNOWN. An empty message is UNKNOWN.
int DecodeStatus(const std::string& bytes) {
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x08) {
    return static_cast<unsigned char>(bytes[1]) & 0x7F;
  }
  return 0;
}

}  // namespace

int HealthCommand() {
  const std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) {
    std::fprintf(stderr, "tandem health: --server HOST:PORT is required\n");
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::ChannelFromFlags(server);
  if (!channel.ok()) {
    std::fprintf(stderr, "tandem health: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  grpc::GenericStub stub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(
                       1000 * std::max(0.01, absl::GetFlag(FLAGS_health_timeout_s)))));
  const std::string request = EncodeRequest(absl::GetFlag(FLAGS_service));
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  grpc::ByteBuffer resp;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_one();
                 });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    std::printf("SERVICE_UNKNOWN\n");  // the server has no such name
    return 1;
  }
  if (!status.ok()) {
    std::printf("UNREACHABLE (%s: %s)\n", std::to_string(status.error_code()).c_str(),
                status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  (void)resp.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  static const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  const int code = DecodeStatus(bytes);
  std::printf("%s\n", code >= 0 && code < 4 ? kNames[code] : "UNKNOWN");
  return code == 1 ? 0 : 1;
}

}  // namespace tandem::cli
