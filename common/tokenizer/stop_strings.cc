#include "common/tokenizer/stop_strings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace tandem {

absl::Status StopStringMatcher::Validate(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxStopStrings, " stop strings, got ", stops.size()));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is empty"));
    if (stops[i].size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop[", i, "] is longer than ", kMaxStopStringBytes, " bytes"));
    }
    if (!unicode::IsValidUtf8(stops[i]))
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is not valid UTF-8"));
  }
  return absl::OkStatus();
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {}

StopStringMatcher::Result StopStringMatcher::Add(std::string_view delta) {
  Result r;
  if (stopped_) return r;
  held_.append(delta);
  // Earliest complete match (ties: the longer string, so "ab" beats "a" at the same position).
  size_t best = std::string::npos;
  const std::string* match = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    if (pos < best || (pos == best && s.size() > match->size())) {
      best = pos;
      match = &s;
    }
  }
  if (match != nullptr) {
    r.emit = held_.substr(0, best + (include_stop_ ? match->size() : 0));
    r.stopped = true;
    r.matched = *match;
    stopped_ = true;
    held_.clear();
    return r;
  }
  // Hold back the longest tail that begins some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  r.emit = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopStringMatcher::Finish() {
  std::string rest;
  if (!stopped_) rest.swap(held_);
  return rest;
}

}  // namespace tandem
