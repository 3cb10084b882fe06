#include "cli/client_auth.h"

#include <cstdlib>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, api_key, "",
          "generate --server, bench: the API key a router with --api-key-file asks for (default: "
          "$TANDEM_API_KEY)");

namespace tandem::cli {

std::string ApiKey() {
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (key.empty()) {
    if (const char* env = std::getenv("TANDEM_API_KEY")) key = env;
  }
  return key;
}

void AddApiKey(grpc::ClientContext* context) {
  if (const std::string key = ApiKey(); !key.empty())
    context->AddMetadata("authorization", "Bearer " + key);
}

}  // namespace tandem::cli
