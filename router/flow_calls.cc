#include "router/flow_calls.h"

#include <utility>

#include "common/rpc/status.h"

namespace tandem::router {

void SerialExecutor::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    if (running_) return;
    running_ = true;
  }
  while (true) {
    std::function<void()> next;
    {
      absl::MutexLock lock(&mu_);
      if (tasks_.empty()) {
        running_ = false;
        return;
      }
      next = std::move(tasks_.front());
      tasks_.pop_front();
    }
    next();
  }
}

DecodeCall::DecodeCall(FlowControl* control, const std::string& worker, absl::Time deadline,
                       ReadHandler on_read, DoneHandler on_done)
    : control_(control), on_read_(std::move(on_read)), on_done_(std::move(on_done)) {
  rpc::SetDeadline(&context_, deadline);
  control_->Attach(&context_, worker);
}

void DecodeCall::Start(v1::Decode::Stub* stub, v1::DecodeRequest request) {
  request_ = std::move(request);
  stub->async()->Decode(&context_, &request_, this);
  AddHold();  // released when the flow lets go: OnDone waits for it
  held_ = true;
  reading_ = true;
  StartRead(&event_);
  StartCall();
}

bool DecodeCall::Arrived(bool ok) {
  reading_ = false;
  if (ok && !abandoned_) return true;
  Release();
  return false;
}

void DecodeCall::Next() {
  reading_ = true;
  StartRead(&event_);
}

void DecodeCall::Abandon() {
  abandoned_ = true;
  context_.TryCancel();
  if (!reading_) Release();  // else the read's result releases it
}

void DecodeCall::Release() {
  if (!held_) return;
  held_ = false;
  RemoveHold();
}

void DecodeCall::OnReadDone(bool ok) { on_read_(ok); }

void DecodeCall::OnDone(const grpc::Status& status) {
  const bool lost = control_->lost(&context_);
  control_->Detach(&context_);
  // The flow may delete this call while on_done runs (on this thread or another): touch nothing
  // of it afterwards.
  DoneHandler done = std::move(on_done_);
  on_read_ = nullptr;
  done(status, lost);
}

PrefillCall::PrefillCall(FlowControl* control, const std::string& worker, absl::Time deadline)
    : control_(control) {
  rpc::SetDeadline(&context_, deadline);
  control_->Attach(&context_, worker);
}

void PrefillCall::Start(v1::Prefill::Stub* stub, DoneHandler on_done) {
  stub->async()->Prefill(&context_, &request, &response,
                         [this, on_done = std::move(on_done)](grpc::Status status) {
                           const bool lost = control_->lost(&context_);
                           control_->Detach(&context_);
                           on_done(std::move(status), lost);  // may delete this
                         });
}

bool PrefillCall::kv_failure() const {
  const auto& trailers = context_.GetServerTrailingMetadata();
  return trailers.find("tandem-kv-failure") != trailers.end();
}

}  // namespace tandem::router
