// SerialExecutor (router/flow_calls.h): tasks run one at a time, in the order posted; a task posted
// from inside a task runs after it, on the same thread, not nested inside it; tasks posted from
// many threads at once never overlap.
#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "router/flow_calls.h"

namespace tandem::router {
namespace {

TEST(SerialExecutorTest, ATaskPostedFromATaskRunsAfterItNotInsideIt) {
  SerialExecutor ex;
  std::vector<int> order;
  ex.Post([&] {
    order.push_back(1);
    ex.Post([&] { order.push_back(3); });
    order.push_back(2);  // the inner task has not run yet
  });
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(SerialExecutorTest, TasksFromManyThreadsNeverOverlapAndAllRun) {
  SerialExecutor ex;
  std::atomic<int> inside{0}, overlaps{0};
  int count = 0;  // touched only inside tasks: no lock needed if they never overlap
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        ex.Post([&] {
          if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
          ++count;
          inside.fetch_sub(1);
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(count, 8 * 2000);
}

}  // namespace
}  // namespace tandem::router
