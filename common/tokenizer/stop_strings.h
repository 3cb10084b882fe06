// Stop strings over streamed text (OpenAI / vLLM semantics): generation ends at the first
// occurrence of any stop string, which is not part of the output unless include_stop is set. As
// text arrives in deltas, the matcher emits what can no longer be part of a match and holds back
// the longest tail that is still the beginning of some stop string, so a match split across deltas
// is caught and never leaked. Pure logic; one instance per request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

class StopStringMatcher {
 public:
  static constexpr size_t kMaxStopStrings = 16;
  static constexpr size_t kMaxStopStringBytes = 256;
  // INVALID_ARGUMENT for an empty string, too many, too long, or invalid UTF-8.
  static absl::Status Validate(const std::vector<std::string>& stops);

  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  struct Result {
    std::string emit;      // text safe to send now
    bool stopped = false;  // a stop string matched: the request should be cancelled
    std::string matched;   // which one
  };
  // Feeds the next text delta. After a stop, further calls return nothing.
  Result Add(std::string_view delta);
  // End of generation without a stop: the held-back tail.
  std::string Finish();

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem
