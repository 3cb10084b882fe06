// The API key the `tandem` commands that call a router send (generate --server, bench):
// --api-key KEY, or $TANDEM_API_KEY when the flag is not given. gRPC calls carry it as
// `authorization: Bearer KEY` metadata, HTTP requests as the Authorization header.
#pragma once

#include <string>

#include "grpcpp/grpcpp.h"

namespace tandem::cli {

// The key ("" when none is given).
std::string ApiKey();
// Adds the key's metadata to a call (nothing without a key).
void AddApiKey(grpc::ClientContext* context);

}  // namespace tandem::cli
