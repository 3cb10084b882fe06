// Termination signals (common/base/signals.h): the waiter wakes whatever the process's other
// threads are doing, and a second signal ends the process at once.
#include "common/base/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// Threads started after InstallTerminationHandlers, asleep on a condition variable as an idle
// thread pool's are, do not take the signal: the waiter wakes with it.
TEST(SignalsTest, ASignalToTheProcessWakesTheWaiterWhileOtherThreadsSleep) {
  InstallTerminationHandlers();
  absl::Mutex mu;
  absl::CondVar cv;
  bool done = false;
  std::vector<std::thread> sleepers;
  for (int i = 0; i < 4; ++i) {
    sleepers.emplace_back([&] {
      absl::MutexLock lock(&mu);
      while (!done) cv.Wait(&mu);
    });
  }
  EXPECT_FALSE(TerminationRequested());
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  EXPECT_TRUE(sigismember(&mask, SIGTERM) && sigismember(&mask, SIGINT))
      << "the installing thread (and the threads it starts) should block the signals";
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ(WaitForTerminationSignal(), SIGTERM);
  EXPECT_TRUE(TerminationRequested());
  {
    absl::MutexLock lock(&mu);
    done = true;
    cv.SignalAll();
  }
  for (std::thread& t : sleepers) t.join();
}

TEST(SignalsDeathTest, ASecondSignalEndsTheProcessAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InstallTerminationHandlers();
        kill(getpid(), SIGINT);
        if (WaitForTerminationSignal() != SIGINT) _exit(1);
        kill(getpid(), SIGINT);
        for (;;) pause();
      },
      ::testing::ExitedWithCode(128 + SIGINT), "");
}

}  // namespace
}  // namespace tandem
