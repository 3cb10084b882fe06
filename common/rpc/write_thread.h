// A thread that starts streams' queued writes for their owners. gRPC's callback API serialises a
// message and hands it to the transport on the thread that calls StartWrite: a sendmsg system call
// a write, tens of microseconds each. An engine loop that streams one token to each of 256 requests
// a step would spend milliseconds a step on that, with the accelerator idle. A ServerStream given a
// WriteThread (ServerStream::Start) only queues the message on the caller's thread and leaves the
// StartWrite to this one, which runs while the next step computes.
//
// Tasks run one at a time, in the order posted. The destructor runs the tasks already posted, then
// joins; Post after that is dropped. An owner that posts many at once (a step's streams) holds the
// thread meanwhile (Hold), so that it is woken once for all of them, not once a post.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::rpc {

class WriteThread {
 public:
  WriteThread();
  ~WriteThread();
  WriteThread(const WriteThread&) = delete;
  WriteThread& operator=(const WriteThread&) = delete;

  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  // While a Hold lives, posted tasks wait (from any thread); they run from its end on. Holds nest.
  class Hold {
   public:
    explicit Hold(WriteThread* thread);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    WriteThread* thread_;
  };

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tandem::rpc
