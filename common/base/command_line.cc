#include "common/base/command_line.h"

#include <cstdlib>
#include <string_view>

#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

std::vector<std::string> ParseCommandLine(int argc, char** argv) {
  const char* detection = std::getenv("TANDEM_MUTEX_DEADLOCK_DETECTION");
  if (detection == nullptr || std::string_view(detection) != "1") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      for (size_t j = 2; j < std::min(eq, a.size()); ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
    args.push_back(std::move(a));
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  return std::vector<std::string>(rest.begin(), rest.end());
}

}  // namespace tandem
