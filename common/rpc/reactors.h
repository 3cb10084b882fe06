// Server-side reactors of the gRPC callback API that another thread can drive. The owner (an engine
// loop, a router orchestration thread) keeps a shared_ptr and calls Write()/Finish() whenever it
// likes; writes are queued and started one at a time, and Finish() goes out after the queued
// writes. Each reactor keeps itself alive until gRPC's OnDone, and calls after that (or after
// Finish) are ignored, so the owner never races the call's end. OnCancel (client cancelled,
// deadline passed) runs the callback given at construction, on a gRPC thread: keep it short (post
// to the owner). Given a WriteThread, Write() and Finish() only queue on the owner's thread and the
// StartWrite (and the Finish) that sends it runs on the WriteThread, which must outlive the
// stream's owner's calls.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/rpc/write_thread.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_callback.h"

namespace tandem::rpc {

template <class Message>
class ServerStream : public grpc::ServerWriteReactor<Message>,
                     public std::enable_shared_from_this<ServerStream<Message>> {
 public:
  // Returns the reactor to hand to gRPC and (through `owner`) the owner's handle.
  static grpc::ServerWriteReactor<Message>* Start(std::function<void()> on_cancel,
                                                  std::shared_ptr<ServerStream>* owner,
                                                  WriteThread* write_thread = nullptr) {
    auto s = std::shared_ptr<ServerStream>(new ServerStream(std::move(on_cancel), write_thread));
    s->self_ = s;
    *owner = s;
    return s.get();
  }

  void Write(Message message) {
    bool post;
    {
      absl::MutexLock lock(&mu_);
      if (finish_ || done_) return;
      queue_.push_back(std::move(message));
      post = PostPumpLocked();
    }
    PumpHere(post);
  }
  // Ends the call after the queued writes. Only the first call counts.
  void Finish(grpc::Status status) {
    bool post;
    {
      absl::MutexLock lock(&mu_);
      if (finish_ || done_) return;
      finish_ = std::move(status);
      post = PostPumpLocked();
    }
    PumpHere(post);
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  size_t queued() const {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  ServerStream(std::function<void()> on_cancel, WriteThread* write_thread)
      : on_cancel_(std::move(on_cancel)), write_thread_(write_thread) {}

  // With a write thread: whether this call must post a Pump there (none is pending yet).
  bool PostPumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_thread_ == nullptr || pump_posted_) return false;
    pump_posted_ = true;
    return true;
  }
  // After Write/Finish queued: pump on this thread, or post one pump to the write thread.
  void PumpHere(bool post) {
    if (write_thread_ == nullptr) return Pump();
    if (!post) return;
    write_thread_->Post([self = this->shared_from_this()] {
      {
        absl::MutexLock lock(&self->mu_);
        self->pump_posted_ = false;
      }
      self->Pump();
    });
  }

  void Pump() {
    bool write = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finish_called_ || done_) return;
      if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = write = true;
      } else if (finish_) {
        finish_called_ = true;
        status = *finish_;
      } else {
        return;
      }
    }
    if (write) {
      this->StartWrite(&current_);
    } else {
      grpc::ServerWriteReactor<Message>::Finish(status);
    }
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {  // the client is gone: nothing more can be written
        queue_.clear();
        if (!finish_) finish_ = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
    }
    Pump();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    if (on_cancel_) on_cancel_();
  }
  void OnDone() override {
    std::shared_ptr<ServerStream> self;  // released last: may delete this
    absl::MutexLock lock(&mu_);
    done_ = true;
    queue_.clear();
    self.swap(self_);
  }

  mutable absl::Mutex mu_;
  std::function<void()> on_cancel_;
  WriteThread* const write_thread_;
  std::shared_ptr<ServerStream> self_;
  std::deque<Message> queue_;
  Message current_;
  std::optional<grpc::Status> finish_;
  bool writing_ = false;
  bool finish_called_ = false;
  bool cancelled_ = false;
  bool done_ = false;
  bool pump_posted_ = false;  // a Pump waits on write_thread_
};

// A unary call finished by its owner: Finish(status, response) copies the response into gRPC's
// and ends the call; only the first Finish counts.
template <class Response>
class UnaryCall : public grpc::ServerUnaryReactor,
                  public std::enable_shared_from_this<UnaryCall<Response>> {
 public:
  static grpc::ServerUnaryReactor* Start(Response* response, std::function<void()> on_cancel,
                                         std::shared_ptr<UnaryCall>* owner) {
    auto c = std::shared_ptr<UnaryCall>(new UnaryCall(response, std::move(on_cancel)));
    c->self_ = c;
    *owner = c;
    return c.get();
  }
  void Finish(grpc::Status status, const Response* response = nullptr) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || done_) return;
      finished_ = true;
      if (response != nullptr && status.ok()) *response_ = *response;
    }
    grpc::ServerUnaryReactor::Finish(status);
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  UnaryCall(Response* response, std::function<void()> on_cancel)
      : response_(response), on_cancel_(std::move(on_cancel)) {}
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    if (on_cancel_) on_cancel_();
  }
  void OnDone() override {
    std::shared_ptr<UnaryCall> self;
    absl::MutexLock lock(&mu_);
    done_ = true;
    self.swap(self_);
  }

  mutable absl::Mutex mu_;
  Response* response_;
  std::function<void()> on_cancel_;
  std::shared_ptr<UnaryCall> self_;
  bool finished_ = false;
  bool cancelled_ = false;
  bool done_ = false;
};

}  // namespace tandem::rpc
