#include "common/base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem {

absl::StatusOr<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                             const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  if (::access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(argv[0], ": not an executable (", std::strerror(errno), ")"));
  }
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
      return absl::UnavailableError(absl::StrCat(log_path, ": ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    // Its own process group: a terminal's Ctrl-C reaches the parent only, which then stops its
    // children in order (a second signal would skip their drain).
    ::setpgid(0, 0);
    // Signals blocked by the parent (sigwait-based servers) must not stay blocked in the child.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  return Subprocess(pid);
}

void Subprocess::Signal(int sig) {
  if (pid_ <= 0 || status_) return;
  if (sig == SIGTERM || sig == SIGINT) {
    if (terminated_) return;
    terminated_ = true;
  }
  ::kill(pid_, sig);
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  if (status_) return status_;
  const absl::Time end = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      status_ = status;
      return status_;
    }
    if (r < 0) {
      status_ = -1;
      return status_;
    }
    if (absl::Now() >= end) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int Subprocess::Stop(absl::Duration grace) {
  if (status_) return *status_;
  Signal(SIGCONT);  // a stopped child cannot handle SIGTERM
  Signal(SIGTERM);  // not again when already sent: a second one would skip the child's drain
  if (auto s = Wait(grace)) return *s;
  Signal(SIGKILL);
  return Wait(absl::Seconds(5)).value_or(-1);
}

bool Subprocess::running() { return !Wait(absl::ZeroDuration()).has_value(); }

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.find_last_of('/'));
}

std::string ReadFileFrom(const std::string& path, size_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tandem
