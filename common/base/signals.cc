#include "common/base/signals.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>

namespace tandem {
namespace {

int g_pipe[2] = {-1, -1};
std::atomic<int> g_signal{0};

// The first termination signal is recorded and wakes WaitForTerminationSignal; a second one ends
// the process. Async-signal-safe (it also runs as a handler).
void Terminate(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) _exit(128 + sig);  // the second one
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_pipe[1], &byte, 1);
}

}  // namespace

void InstallTerminationHandlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  if (pipe2(g_pipe, O_CLOEXEC) != 0) g_pipe[0] = g_pipe[1] = -1;
  // Handlers, for the threads libraries started before this call (they do not block the signals).
  struct sigaction sa {};
  sa.sa_handler = Terminate;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Every thread started from here on (the caller's, gRPC's, the pool's) blocks them, and one
  // thread waits for them: a signal goes to a thread that is waiting for it, never to one asleep
  // in a system call. (Under ThreadSanitizer a handler runs at its thread's next intercepted call:
  // an idle pool thread asleep on a futex took a worker's SIGTERM and held its drain back.)
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) Terminate(sig);
    }
  }).detach();
}

int WaitForTerminationSignal() {
  char byte = 0;
  while (read(g_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return g_signal.load();
}

bool TerminationRequested() { return g_signal.load() != 0; }

}  // namespace tandem
