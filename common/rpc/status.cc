#include "common/rpc/status.h"

#include <chrono>

namespace tandem::rpc {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Time DeadlineOf(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

void SetDeadline(grpc::ClientContext* context, absl::Time deadline) {
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace tandem::rpc
