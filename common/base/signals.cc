#include "common/base/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace tandem {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<int> g_signal{0};

void OnTermination(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) _exit(128 + sig);  // the second one
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_pipe[1], &byte, 1);
}

}  // namespace

void InstallTerminationHandlers() {
  if (g_pipe[0] < 0 && pipe2(g_pipe, O_CLOEXEC) != 0) g_pipe[0] = g_pipe[1] = -1;
  struct sigaction sa {};
  sa.sa_handler = OnTermination;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  char byte = 0;
  while (read(g_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return g_signal.load();
}

bool TerminationRequested() { return g_signal.load() != 0; }

}  // namespace tandem
