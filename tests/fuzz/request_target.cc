// libFuzzer target: what clients send. The first byte picks the door: a raw GenerateRequest as the
// router's raw methods parse it (rpc/raw_message.h), or a JSON body of /v1/completions or
// /v1/chat/completions through the HTTP API's parser. Refusals must be INVALID_ARGUMENT or
// NOT_FOUND with a message, and protobuf must not log on the way (the raw parse walks the wire
// format first so that a hostile client cannot make the router log a line per request).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/rpc/raw_message.h"
#include "google/protobuf/stubs/logging.h"
#include "router/openai_api.h"
#include "tandem/v1/generation.pb.h"

namespace {
bool protobuf_logged = false;
void OnProtobufLog(google::protobuf::LogLevel, const char*, int, const std::string&) {
  protobuf_logged = true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  google::protobuf::SetLogHandler(OnProtobufLog);
  protobuf_logged = false;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::Status s;
  switch (data[0] % 3) {
    case 0: {
      tandem::v1::GenerateRequest r;
      s = tandem::rpc::ParseMessageBytes(body, &r);
      if (protobuf_logged) std::abort();
      break;
    }
    case 1:
      s = tandem::router::openai::ParseRequest(tandem::router::openai::Endpoint::kCompletions, body,
                                               "tandem", 20)
              .status();
      break;
    default:
      s = tandem::router::openai::ParseRequest(tandem::router::openai::Endpoint::kChatCompletions,
                                               body, "tandem", 20)
              .status();
      break;
  }
  if (!s.ok()) {
    if (s.code() != absl::StatusCode::kInvalidArgument && s.code() != absl::StatusCode::kNotFound)
      std::abort();
    if (s.message().empty()) std::abort();
  }
  return 0;
}
