// The servers every Tandem process starts (common/rpc/server.h): health status, and the keepalive
// policy that lets peers ping a silent stream (a decode stream while its prefill runs) without the
// server cutting the connection with GOAWAY "too_many_pings".
#include "common/rpc/server.h"

#include <thread>

#include "absl/time/clock.h"
#include "common/rpc/reactors.h"
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
  grpc::ServerWriteReactor<v1::DecodeEvent>* Decode(grpc::CallbackServerContext*, const v1::DecodeRequest*) override {
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

}  // namespace
}  // namespace tandem::rpc
