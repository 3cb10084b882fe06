// The one conversion between absl::Status (the domain) and grpc::Status (the wire). Codes map one
// to one (both follow google.rpc.Code); messages pass through.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace tandem::rpc {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

// A call context's deadline; absl::InfiniteFuture() when the client set none.
absl::Time DeadlineOf(const grpc::ServerContextBase& context);
// Sets `deadline` on a client context unless it is infinite.
void SetDeadline(grpc::ClientContext* context, absl::Time deadline);

}  // namespace tandem::rpc
