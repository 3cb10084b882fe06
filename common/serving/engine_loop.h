// The thread that owns an Engine. Everything that touches the engine runs on it: tasks posted by
// gRPC handlers (add, reserve, admit, abort) run before the next step, then the engine steps while
// it has work, and its outputs go to the output handler, also on this thread. Services keep their
// per-request state on this thread too, so it needs no locks. The loop wakes at least every
// `tick` to run the tick handler (timeouts), and publishes a snapshot of the engine's state for
// heartbeats and metrics.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/metrics/worker_metrics.h"

namespace tandem {

class EngineLoop {
 public:
  struct Handlers {
    std::function<void(std::vector<RequestOutput>& outputs)> on_outputs;
    std::function<void()> on_tick;  // at least every `tick`
    absl::Duration tick = absl::Milliseconds(50);
    WorkerMetrics* metrics = nullptr;  // per-step histograms when set
  };
  // Starts the thread. `engine` must outlive the loop.
  EngineLoop(Engine* engine, Handlers handlers);
  ~EngineLoop();  // Stop()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Runs `task` on the loop thread before the next step. Dropped after Stop().
  void Post(std::function<void(Engine&)> task) ABSL_LOCKS_EXCLUDED(mu_);
  EngineSnapshot snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the remaining tasks, then joins the thread.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  Engine* engine_;
  Handlers handlers_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void(Engine&)>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  EngineSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem
