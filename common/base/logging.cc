#include "common/base/logging.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace tandem {

LogLevel MinLogLevel() {
  static const LogLevel level = [] {
    const char* env = std::getenv("TANDEM_LOG_LEVEL");
    if (env && std::strcmp(env, "warning") == 0) return LogLevel::kWarning;
    if (env && std::strcmp(env, "error") == 0) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm;
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const char tag = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  stream_ << tag << ' ' << stamp << '.' << (ms < 100 ? (ms < 10 ? "00" : "0") : "") << ms << ' '
          << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
}

}  // namespace tandem
