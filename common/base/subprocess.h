// Child processes for `tandem up` and the end-to-end tests: spawn with output to a log file,
// signal, and wait with a timeout. A child gets SIGTERM when its parent dies (PR_SET_PDEATHSIG), so
// a crashed `tandem up` or test leaves no cluster behind.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

class Subprocess {
 public:
  // Starts argv[0] (a path) with stdout and stderr appended to `log_path` ("" = inherited).
  static absl::StatusOr<Subprocess> Spawn(const std::vector<std::string>& argv,
                                          const std::string& log_path);

  pid_t pid() const { return pid_; }
  // Sends `sig`, except a second SIGTERM/SIGINT (the child's drain would be cut short) and
  // anything after the child ended.
  void Signal(int sig);
  // The exit status (as from waitpid) once the child ended; nullopt after `timeout`.
  std::optional<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL after `grace`; returns the exit status.
  int Stop(absl::Duration grace);
  bool running();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> status_;
  bool terminated_ = false;
};

// The directory of the running executable (/proc/self/exe).
std::string ExecutableDir();

// Text of a log file from `offset` (for waiting on a line a child prints).
std::string ReadFileFrom(const std::string& path, size_t offset = 0);

}  // namespace tandem
