#include "common/rpc/write_thread.h"

#include <utility>

namespace tandem::rpc {

WriteThread::WriteThread() : thread_([this] { Run(); }) {}

WriteThread::~WriteThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WriteThread::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (!stopping_) tasks_.push_back(std::move(task));
}

WriteThread::Hold::Hold(WriteThread* thread) : thread_(thread) {
  absl::MutexLock lock(&thread_->mu_);
  ++thread_->holds_;
}

WriteThread::Hold::~Hold() {
  absl::MutexLock lock(&thread_->mu_);
  --thread_->holds_;
}

void WriteThread::Run() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return (!tasks_.empty() && holds_ == 0) || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping, and nothing left
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
  }
}

}  // namespace tandem::rpc
