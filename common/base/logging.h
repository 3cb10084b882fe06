// Minimal leveled logging to stderr. Debian 12's Abseil (20220623) predates absl/log, so Tandem
// keeps this small facility: one line per call, prefixed with level, time and source location.
//   TANDEM_LOG(INFO) << "loaded " << n << " tensors";
#pragma once

#include <sstream>

namespace tandem {

enum class LogLevel { kInfo, kWarning, kError };

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

struct LogVoidify {
  void operator&(std::ostream&) {}
};

// Messages below this level are dropped (TANDEM_LOG_LEVEL=info|warning|error; default info).
LogLevel MinLogLevel();

}  // namespace tandem

#define TANDEM_LOG_LEVEL_INFO ::tandem::LogLevel::kInfo
#define TANDEM_LOG_LEVEL_WARNING ::tandem::LogLevel::kWarning
#define TANDEM_LOG_LEVEL_ERROR ::tandem::LogLevel::kError
// A conditional expression, not an if: `if (c) TANDEM_LOG(INFO) << ...; else ...` binds the else to
// the caller's if. The message's << bind tighter than LogVoidify's &, which makes the whole void.
#define TANDEM_LOG(level)                              \
  (TANDEM_LOG_LEVEL_##level < ::tandem::MinLogLevel()) \
      ? (void)0                                        \
      : ::tandem::LogVoidify() &                       \
            ::tandem::LogMessage(TANDEM_LOG_LEVEL_##level, __FILE__, __LINE__).stream()
