// The pieces an asynchronous request flow (request_flow.cc) is made of: a serial executor that runs
// a flow's handlers one at a time, and its child calls to workers as gRPC callback-API calls whose
// completions are handed to that executor. No thread waits on a call: a flow costs memory, not a
// thread, while its calls are out.
//
// Threading contract: gRPC runs reactions on its own threads, sometimes inline inside the call that
// started an operation. The reactions here only post to the flow's executor (SerialExecutor), and
// the flow drives the calls (Start, Next, Abandon, Release) only from inside its executor, so a
// flow's state is touched by one thread at a time and never under a lock that a reaction needs.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "router/request_flow.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// Runs posted tasks one at a time, in the order posted, on the posting threads: a task posted while
// another runs is run after it by the thread running that one. So a reaction that gRPC runs inline,
// inside a call a task made, waits its turn instead of re-entering the flow or deadlocking.
class SerialExecutor {
 public:
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

// One Decode stream to a worker. Its context carries the flow's deadline and is attached to the
// flow's FlowControl (client cancellation and the watchdog cancel it) until the stream ends.
// The flow reads events one at a time: Start reads the first, Next each following one, after the
// flow handled the last (on_read(ok), then Arrived(ok)). The stream's end (on_done(status, lost),
// `lost`: the watchdog cancelled it because its worker stopped being healthy) is reported only
// after the flow let go of it: a read that found no more events, Abandon, or Release.
class DecodeCall final : public grpc::ClientReadReactor<v1::DecodeEvent> {
 public:
  using ReadHandler = std::function<void(bool ok)>;
  using DoneHandler = std::function<void(grpc::Status status, bool lost)>;
  DecodeCall(FlowControl* control, const std::string& worker, absl::Time deadline,
             ReadHandler on_read, DoneHandler on_done);
  DecodeCall(const DecodeCall&) = delete;
  DecodeCall& operator=(const DecodeCall&) = delete;

  void Start(v1::Decode::Stub* stub, v1::DecodeRequest request);
  // A read's result arrived: whether event() holds one to handle. False when the stream has no
  // more or the flow abandoned it (the call is then released).
  bool Arrived(bool ok);
  const v1::DecodeEvent& event() const { return event_; }
  void Next();
  // Cancels the stream (the worker frees the request's blocks); the flow reads nothing more.
  void Abandon();
  // The flow reads nothing more (the stream ended by itself).
  void Release();

 private:
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  FlowControl* control_;
  grpc::ClientContext context_;
  v1::DecodeRequest request_;
  v1::DecodeEvent event_;
  ReadHandler on_read_;
  DoneHandler on_done_;
  // Touched only from the flow's executor.
  bool held_ = false;
  bool reading_ = false;
  bool abandoned_ = false;
};

// One Prefill call to a worker, attached to the flow's FlowControl while it runs. on_done(status,
// lost) reports its end; the response and the trailing metadata are read from here afterwards.
class PrefillCall {
 public:
  using DoneHandler = std::function<void(grpc::Status status, bool lost)>;
  PrefillCall(FlowControl* control, const std::string& worker, absl::Time deadline);
  PrefillCall(const PrefillCall&) = delete;
  PrefillCall& operator=(const PrefillCall&) = delete;

  void Start(v1::Prefill::Stub* stub, DoneHandler on_done);
  v1::PrefillRequest request;
  v1::PrefillResponse response;
  // After on_done: whether the prefill worker said the KV transfer itself failed (the decode side).
  bool kv_failure() const;

 private:
  FlowControl* control_;
  grpc::ClientContext context_;
};

}  // namespace tandem::router
