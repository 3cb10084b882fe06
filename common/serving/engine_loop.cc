#include "common/serving/engine_loop.h"

#include <algorithm>

#include "common/base/logging.h"

namespace tandem {
static_assert(EngineSnapshot::kSpecPositions == kMaxSpeculativeTokens);
static_assert(EngineSnapshot::kSpecDecisions == kNumSpecDecisions);
}  // namespace tandem

namespace tandem {

EngineLoop::EngineLoop(Engine* engine, Handlers handlers)
    : engine_(engine), handlers_(std::move(handlers)) {
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Post(std::function<void(Engine&)> task) {
  absl::MutexLock lock(&mu_);
  if (!stopping_) tasks_.push_back(std::move(task));
}

EngineSnapshot EngineLoop::snapshot() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void EngineLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::Run() {
  absl::Time next_tick = absl::Now();
  bool stalled = false;  // the engine has work but the last step could schedule nothing
  int64_t peak_used_since_publish = 0;
  double host_seconds = 0;  // steps outside the forward pass, and their outputs' handling
  while (true) {
    std::deque<std::function<void(Engine&)>> tasks;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      // Sleep until there is a task, the engine has work, or the next tick.
      auto ready = [this] { return !tasks_.empty() || stopping_; };
      if (!engine_->HasWork()) {
        mu_.AwaitWithDeadline(absl::Condition(&ready), next_tick);
      } else if (stalled) {
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(2));
      }
      tasks.swap(tasks_);
      stopping = stopping_;
    }
    for (auto& task : tasks) task(*engine_);
    if (stopping) break;
    stalled = false;
    if (engine_->HasWork()) {
      const EngineStats before = engine_->stats();
      absl::StatusOr<std::vector<RequestOutput>> outputs = engine_->Step();
      const EngineStats after = engine_->stats();
      const double step_seconds = after.step_seconds - before.step_seconds;
      host_seconds += step_seconds - (after.forward_seconds - before.forward_seconds);
      peak_used_since_publish =
          std::max(peak_used_since_publish, after.num_blocks - after.free_blocks);
      if (handlers_.metrics != nullptr && after.steps > before.steps) {
        handlers_.metrics->ObserveStep(after.last_step_tokens, after.last_step_sequences,
                                       step_seconds);
      }
      if (!outputs.ok()) {
        TANDEM_LOG(ERROR) << "engine step failed: " << outputs.status();
      } else if (!outputs->empty() && handlers_.on_outputs) {
        const absl::Time handled = absl::Now();
        handlers_.on_outputs(*outputs);
        host_seconds += absl::ToDoubleSeconds(absl::Now() - handled);
      }
      stalled = outputs.ok() && outputs->empty() && after.steps == before.steps;
    }
    const absl::Time now = absl::Now();
    if (now >= next_tick) {
      if (handlers_.on_tick) handlers_.on_tick();
      next_tick = now + handlers_.tick;
    }
    const EngineStats s = engine_->stats();
    absl::MutexLock lock(&mu_);
    snapshot_.waiting = s.waiting;
    snapshot_.running = s.running;
    snapshot_.free_blocks = s.free_blocks;
    snapshot_.total_blocks = s.num_blocks;
    snapshot_.prefix_queries = s.prefix_queries;
    snapshot_.prefix_hits = s.prefix_hits;
    snapshot_.preemptions = s.preemptions;
    snapshot_.sampled_on_device = s.sampled_on_device;
    snapshot_.sampled_on_host = s.sampled_on_host;
    snapshot_.sampling_row_copies = s.sampling_row_copies;
    snapshot_.structured_masks_computed = s.structured_masks_computed;
    snapshot_.structured_masks_cached = s.structured_masks_cached;
    snapshot_.structured_mask_seconds = s.structured_mask_seconds;
    snapshot_.forward_seconds = s.forward_seconds;
    snapshot_.prompt_forward_seconds = s.prompt_forward_seconds;
    const SpeculationStats& spec = s.speculation;
    snapshot_.spec_proposed = spec.counts.proposed;
    snapshot_.spec_accepted = spec.counts.accepted;
    snapshot_.spec_verify_steps = spec.verify_steps;
    snapshot_.spec_proposed_at = spec.proposed_at;
    snapshot_.spec_accepted_at = spec.accepted_at;
    snapshot_.spec_decisions = spec.decisions;
    snapshot_.spec_k_in_force = spec.k_in_force;
    snapshot_.host_seconds = host_seconds;
    snapshot_.peak_used_blocks = std::max(
        {snapshot_.peak_used_blocks, peak_used_since_publish, s.num_blocks - s.free_blocks});
  }
}

}  // namespace tandem
