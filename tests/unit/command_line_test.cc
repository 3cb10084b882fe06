// ParseCommandLine (common/base/command_line.h): dashes in flag names, and Abseil's mutex deadlock
// detection turned off for the program unless TANDEM_MUTEX_DEADLOCK_DETECTION=1.
#include "common/base/command_line.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, command_line_test_value, 0, "a flag of this test");

namespace tandem {
namespace {

// Takes two mutexes in one order, then in the other: a potential deadlock that never happens.
void LockInBothOrders() {
  absl::Mutex a, b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

std::vector<std::string> Parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(CommandLineTest, FlagNamesTakeDashesAndPositionalArgumentsStay) {
  const std::vector<std::string> rest = Parse({"prog", "--command-line-test-value=7", "file.txt"});
  EXPECT_EQ(absl::GetFlag(FLAGS_command_line_test_value), 7);
  EXPECT_EQ(rest, (std::vector<std::string>{"prog", "file.txt"}));
}

// Each case runs in a child process (the mode is process-wide).
class DeadlockDetectionTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DeadlockDetectionTest, WithoutParseCommandLineAnInversionAbortsThisAbseil) {
  // What the programs are spared: Debian's Abseil checks lock order on every lock.
  EXPECT_DEATH(
      {
        absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
        LockInBothOrders();
      },
      "deadlock");
}

TEST_F(DeadlockDetectionTest, AfterParseCommandLineItIsOff) {
  EXPECT_EXIT(
      {
        ::unsetenv("TANDEM_MUTEX_DEADLOCK_DETECTION");
        absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
        Parse({"prog"});
        LockInBothOrders();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(DeadlockDetectionTest, TheEnvironmentKeepsItOn) {
  EXPECT_DEATH(
      {
        ::setenv("TANDEM_MUTEX_DEADLOCK_DETECTION", "1", 1);
        absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
        Parse({"prog"});
        LockInBothOrders();
      },
      "deadlock");
}

}  // namespace
}  // namespace tandem
