// The servers every Tandem process starts (common/rpc/server.h): health status, and the keepalive
// policy that lets peers ping a silent stream (a decode stream while its prefill runs) without the
// server cutting the connection with GOAWAY "too_many_pings". And the streams that an engine loop
// drives through a write thread (common/rpc/write_thread.h).
#include "common/rpc/server.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc/reactors.h"
#include "common/rpc/write_thread.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::rpc {
namespace {

// A Decode service whose stream stays silent for `silence`, then sends one event.
class SilentDecode final : public v1::Decode::CallbackService {
 public:
  explicit SilentDecode(absl::Duration silence) : silence_(silence) {}
  ~SilentDecode() override {
    for (auto& t : threads_) t.join();
  }
  grpc::ServerWriteReactor<v1::DecodeEvent>* Decode(grpc::CallbackServerContext*,
                                                    const v1::DecodeRequest*) override {
    std::shared_ptr<ServerStream<v1::DecodeEvent>> stream;
    auto* reactor = ServerStream<v1::DecodeEvent>::Start(nullptr, &stream);
    threads_.emplace_back([stream, this] {
      absl::SleepFor(silence_);
      v1::DecodeEvent e;
      e.mutable_tokens()->add_token_ids(7);
      stream->Write(e);
      stream->Finish(grpc::Status::OK);
    });
    return reactor;
  }

 private:
  absl::Duration silence_;
  std::vector<std::thread> threads_;
};

TEST(RpcServerTest, FrequentKeepalivePingsOnASilentStreamDoNotCutIt) {
  SilentDecode service(absl::Milliseconds(4000));
  auto server = StartServer({"127.0.0.1:0", {&service}, {"tandem.v1.Decode"}});
  ASSERT_TRUE(server.ok()) << server.status();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 100);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server->port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Decode::NewStub(channel);
  grpc::ClientContext ctx;
  auto reader = stub->Decode(&ctx, v1::DecodeRequest());
  v1::DecodeEvent e;
  EXPECT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.tokens().token_ids_size(), 1);
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  server->server->Shutdown(std::chrono::system_clock::now());
}

TEST(RpcServerTest, HealthIsNotServingUntilSaidOtherwise) {
  SilentDecode service(absl::ZeroDuration());
  auto server = StartServer({"127.0.0.1:0", {&service}, {"tandem.v1.Decode"}});
  ASSERT_TRUE(server.ok());
  grpc::HealthCheckServiceInterface* health = server->server->GetHealthCheckService();
  ASSERT_NE(health, nullptr);
  server->SetServing(true);
  server->SetServing(false);
  server->server->Shutdown(std::chrono::system_clock::now());
  EXPECT_EQ(PortOf("host:80").value(), 80);
  EXPECT_FALSE(PortOf("nope").ok());
  EXPECT_FALSE(PortOf(":80").ok());
}

TEST(WriteThreadTest, RunsTasksInOrderAndThoseLeftWhenDestroyed) {
  std::vector<int> ran;
  absl::Notification release;
  {
    WriteThread thread;
    thread.Post([&] { release.WaitForNotification(); });
    for (int i = 0; i < 100; ++i) thread.Post([&ran, i] { ran.push_back(i); });
    EXPECT_TRUE(ran.empty());
    release.Notify();
  }  // the destructor runs the 100 posted behind the blocked task
  ASSERT_EQ(ran.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[i], i);
}

TEST(WriteThreadTest, TasksPostedDuringAHoldRunWhenItEnds) {
  WriteThread thread;
  absl::Notification ran;
  {
    WriteThread::Hold hold(&thread);
    {
      WriteThread::Hold nested(&thread);
      thread.Post([&] { ran.Notify(); });
    }
    EXPECT_FALSE(ran.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
        << "ran inside the outer hold";
  }
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// A Decode service whose stream is written by a thread of its own through a WriteThread: 200
// events, then a Finish with a status of its own.
class WriteThreadDecode final : public v1::Decode::CallbackService {
 public:
  explicit WriteThreadDecode(WriteThread* write_thread) : write_thread_(write_thread) {}
  ~WriteThreadDecode() override {
    for (auto& t : threads_) t.join();
  }
  grpc::ServerWriteReactor<v1::DecodeEvent>* Decode(grpc::CallbackServerContext*,
                                                    const v1::DecodeRequest*) override {
    std::shared_ptr<ServerStream<v1::DecodeEvent>> stream;
    auto* reactor = ServerStream<v1::DecodeEvent>::Start(nullptr, &stream, write_thread_);
    threads_.emplace_back([stream, this] {
      for (int i = 0; i < 200; ++i) {
        v1::DecodeEvent e;
        e.mutable_tokens()->add_token_ids(i);
        stream->Write(e);
      }
      stream->Finish(grpc::Status(grpc::StatusCode::ABORTED, "after 200"));
      owner_done_.Notify();
    });
    return reactor;
  }
  absl::Notification owner_done_;

 private:
  WriteThread* write_thread_;
  std::vector<std::thread> threads_;
};

TEST(WriteThreadTest, AStreamsWritesAndFinishGoOutFromTheWriteThreadInOrder) {
  WriteThread write_thread;
  // Held: nothing the stream queues can go out until released, though its owner has written
  // everything and finished.
  absl::Notification release;
  write_thread.Post([&] { release.WaitForNotification(); });
  WriteThreadDecode service(&write_thread);
  auto server = StartServer({"127.0.0.1:0", {&service}, {"tandem.v1.Decode"}});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Decode::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port),
                                                      grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Decode(&ctx, v1::DecodeRequest());
  std::atomic<int> received{0};
  std::vector<int32_t> ids;
  std::thread client([&] {
    v1::DecodeEvent e;
    while (reader->Read(&e)) {
      for (int32_t id : e.tokens().token_ids()) ids.push_back(id);
      ++received;
    }
  });
  ASSERT_TRUE(service.owner_done_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(received.load(), 0) << "a write went out from the owner's thread";
  release.Notify();
  client.join();
  ASSERT_EQ(ids.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(ids[i], i);
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(s.error_message(), "after 200");
  server->server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace tandem::rpc
