// The TCP KV transport on loopback: layer-by-layer transfer into reserved blocks, handshake
// refusals, incomplete and cancelled transfers, dead and silent peers — all bounded in time. Every
// case runs with layers inline from host memory, inline through staged copies, and over a side link
// (the in-process loopback link standing in for NCCL); link-only cases follow at the end.
#include "common/transport/kv_control.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/rpc/dtype_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/kv_transfer.pb.h"
#include "tests/support/loopback.h"
#include "tests/unit/loopback_kv_link.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// kStaged: the caches pretend to be device memory, so layers go through the staged copies
// (ReadBlocks / WriteBlocks) the CUDA backend needs instead of direct host access. kLink: senders
// ask for the loopback side link, which receivers offer.
enum class Mode { kHost, kStaged, kLink };

class TransportFixture : public ::testing::Test {
 protected:
  virtual Mode mode() const = 0;
  virtual DType kv_dtype() const { return DType::kF32; }
  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    geometry_ = {/*num_layers=*/3, /*num_blocks=*/8, /*block_size=*/4, /*num_kv_heads=*/2,
                 /*head_dim=*/8};
    geometry_.dtype = kv_dtype();
    src_ = KvCacheStorage::Create(backend_.get(), geometry_).value();
    dst_ = KvCacheStorage::Create(backend_.get(), geometry_).value();
    if (mode() == Mode::kStaged) {
      src_->ForceHostStaging();
      dst_->ForceHostStaging();
    }
    // Random nonzero bytes in the source, zeros in the destination: blocks compare byte for byte.
    std::mt19937 rng(1);
    const int64_t n = geometry_.num_layers * geometry_.bytes_per_layer();
    for (int64_t i = 0; i < n; ++i) {
      Bytes(src_.get(), false)[i] = static_cast<char>(1 + rng() % 255);
      Bytes(src_.get(), true)[i] = static_cast<char>(1 + rng() % 255);
      Bytes(dst_.get(), false)[i] = Bytes(dst_.get(), true)[i] = 0;
    }
    info_ = {"model-A", geometry_};
    src_link_ = std::make_unique<LoopbackKvLinkFactory>(src_.get(), &hub_);
    dst_link_ = std::make_unique<LoopbackKvLinkFactory>(dst_.get(), &hub_);
    receiver_ = KvControlReceiver::Create(ReceiverOptions()).value();
    address_ = absl::StrCat("127.0.0.1:", receiver_->port());
  }

  KvControlReceiver::Options ReceiverOptions() {
    KvControlReceiver::Options o{"127.0.0.1", 0, dst_.get(), info_, absl::Seconds(2)};
    if (mode() == Mode::kLink) o.link_factories = {dst_link_.get()};
    return o;
  }
  absl::StatusOr<std::unique_ptr<KvControlSender>> Connect(const std::string& address) {
    return KvControlSender::Connect(address, info_, absl::Seconds(2),
                                    mode() == Mode::kLink ? src_link_.get() : nullptr);
  }

  static char* Bytes(KvCacheStorage* s, bool v) {
    return static_cast<char*>(v ? s->v_data() : s->k_data());
  }
  // True when dst block `d` of layers [first, last) holds src block `s` (K and V).
  bool SameBlock(int32_t s, int32_t d, int64_t first = 0, int64_t last = -1) const {
    const int64_t e = geometry_.bytes_per_block();
    for (int64_t l = first; l < (last < 0 ? geometry_.num_layers : last); ++l) {
      const int64_t base = l * geometry_.bytes_per_layer();
      for (bool v : {false, true}) {
        if (std::memcmp(Bytes(src_.get(), v) + base + s * e, Bytes(dst_.get(), v) + base + d * e,
                        e) != 0)
          return false;
      }
    }
    return true;
  }
  // True when dst block `d` of layers [first, last) is all zeros (K and V).
  bool BlockIsZero(int32_t d, int64_t first = 0, int64_t last = -1) const {
    const int64_t e = geometry_.bytes_per_block();
    for (int64_t l = first; l < (last < 0 ? geometry_.num_layers : last); ++l) {
      for (bool v : {false, true}) {
        const char* p = Bytes(dst_.get(), v) + l * geometry_.bytes_per_layer() + d * e;
        if (std::any_of(p, p + e, [](char c) { return c != 0; })) return false;
      }
    }
    return true;
  }

  std::unique_ptr<CpuBackend> backend_;
  KvCacheGeometry geometry_;
  std::unique_ptr<KvCacheStorage> src_, dst_;
  KvEndpointInfo info_;
  LoopbackKvHub hub_;
  std::unique_ptr<LoopbackKvLinkFactory> src_link_, dst_link_;
  std::unique_ptr<KvControlReceiver> receiver_;
  std::string address_;
};

class TcpKvTransportTest : public TransportFixture,
                           public ::testing::WithParamInterface<std::tuple<Mode, DType>> {
 protected:
  Mode mode() const override { return std::get<0>(GetParam()); }
  DType kv_dtype() const override { return std::get<1>(GetParam()); }
};

TEST_P(TcpKvTransportTest, LayerByLayerIntoReservedBlocks) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2, 7}, "").ok());
  auto sender = Connect(address_);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE((*sender)->Begin("r1", 10, "").ok());
  for (int32_t l = 0; l < 3; ++l)
    ASSERT_TRUE((*sender)->SendLayer("r1", l, {0, 1, 3}, src_.get()).ok());
  ASSERT_TRUE((*sender)->End("r1", 42).ok());
  auto token = receiver_->Wait("r1", absl::Seconds(2));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, 42);
  EXPECT_TRUE(SameBlock(0, 5));
  EXPECT_TRUE(SameBlock(1, 2));
  EXPECT_TRUE(SameBlock(3, 7));
  for (int32_t d : {0, 1, 3, 4, 6}) EXPECT_TRUE(BlockIsZero(d)) << d;
  // The connection is reused for the next transfer.
  ASSERT_TRUE(receiver_->Expect("r2", {0}, "").ok());
  ASSERT_TRUE((*sender)->Begin("r2", 4, "").ok());
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE((*sender)->SendLayer("r2", l, {6}, src_.get()).ok());
  ASSERT_TRUE((*sender)->End("r2", 7).ok());
  EXPECT_EQ(receiver_->Wait("r2", absl::Seconds(2)).value(), 7);
  EXPECT_TRUE(SameBlock(6, 0));
  if (mode() == Mode::kLink) {
    EXPECT_EQ(hub_.joins.load(), 2);  // one link, both ends, made once and kept for the connection
    sender->reset();                  // closing the connection tears the link down at both ends
    for (int i = 0; i < 100 && hub_.live_links.load() > 0; ++i)
      absl::SleepFor(absl::Milliseconds(10));
    EXPECT_EQ(hub_.live_links.load(), 0);
  }
}

// The KV plane's capabilities: a transfer into a reservation must present the capability the
// receiver issued for it. A sender without it, or with another reservation's, or replaying a used
// one, writes nothing and its End is refused; the rightful sender then completes as usual.
TEST_P(TcpKvTransportTest, OnlyTheReservationsCapabilityWritesIntoIt) {
  const std::string cap = NewKvCapability(), other = NewKvCapability();
  EXPECT_EQ(cap.size(), 32u);
  EXPECT_NE(cap, other);
  EXPECT_TRUE(KvCapabilityMatches(cap, cap));
  EXPECT_FALSE(KvCapabilityMatches(cap, other));
  EXPECT_FALSE(KvCapabilityMatches(cap, ""));
  EXPECT_FALSE(KvCapabilityMatches(cap, cap.substr(0, 31)));
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2, 7}, cap).ok());
  ASSERT_TRUE(receiver_->Expect("r2", {4}, other).ok());
  for (const std::string& presented :
       {std::string(), other, cap.substr(0, 16) + other.substr(16)}) {
    auto stranger = Connect(address_);
    ASSERT_TRUE(stranger.ok()) << stranger.status();
    ASSERT_TRUE((*stranger)->Begin("r1", 10, presented).ok());
    for (int32_t l = 0; l < 3; ++l)
      ASSERT_TRUE((*stranger)->SendLayer("r1", l, {0, 1, 3}, src_.get()).ok());
    const absl::Status end = (*stranger)->End("r1", 13);
    EXPECT_FALSE(end.ok());
    EXPECT_THAT(std::string(end.message()), HasSubstr("capability")) << end;
    for (int32_t d : {5, 2, 7}) EXPECT_TRUE(BlockIsZero(d)) << "a stranger wrote block " << d;
  }
  // The rightful sender, on its own connection.
  auto sender = Connect(address_);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE((*sender)->Begin("r1", 10, cap).ok());
  for (int32_t l = 0; l < 3; ++l)
    ASSERT_TRUE((*sender)->SendLayer("r1", l, {0, 1, 3}, src_.get()).ok());
  ASSERT_TRUE((*sender)->End("r1", 42).ok());
  EXPECT_EQ(receiver_->Wait("r1", absl::Seconds(2)).value(), 42);
  EXPECT_TRUE(SameBlock(0, 5));
  // Replayed once used: the reservation is gone, nothing lands.
  ASSERT_TRUE((*sender)->Begin("r1", 10, cap).ok());
  ASSERT_TRUE((*sender)->SendLayer("r1", 0, {6, 6, 6}, src_.get()).ok());
  EXPECT_FALSE((*sender)->End("r1", 9).ok());
  EXPECT_TRUE(SameBlock(0, 5));
  receiver_->Cancel("r2");
}

TEST_P(TcpKvTransportTest, HandshakeRefusesOtherModelsAndGeometries) {
  KvEndpointInfo other = info_;
  other.model_fingerprint = "model-B";
  auto s = KvControlSender::Connect(address_, other, absl::Seconds(2));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("fingerprint"));
  other = info_;
  other.geometry.head_dim = 16;
  s = KvControlSender::Connect(address_, other, absl::Seconds(2));
  EXPECT_THAT(s.status().message(), HasSubstr("geometry"));
  // A cache of another element type: refused, naming the flag that sets it.
  other = info_;
  other.geometry.dtype = info_.geometry.dtype == DType::kF32 ? DType::kBF16 : DType::kF32;
  s = KvControlSender::Connect(address_, other, absl::Seconds(2));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("--kv-cache-dtype"));
  EXPECT_EQ(KvControlSender::Connect("127.0.0.1:1", info_, absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(KvControlSender::Connect("nonsense", info_, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TcpKvTransportTest, IncompleteTransferFailsBothSides) {
  ASSERT_TRUE(receiver_->Expect("r", {1}, "").ok());
  auto sender = Connect(address_).value();
  ASSERT_TRUE(sender->Begin("r", 4, "").ok());
  ASSERT_TRUE(sender->SendLayer("r", 0, {0}, src_.get()).ok());
  absl::Status end = sender->End("r", 1);
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(end.message(), HasSubstr("1 of 3 layers"));
  EXPECT_EQ(receiver_->Wait("r", absl::Seconds(1)).status().code(), absl::StatusCode::kUnavailable);
}

TEST_P(TcpKvTransportTest, WrongBlockCountFailsTheTransfer) {
  ASSERT_TRUE(receiver_->Expect("r", {1, 2}, "").ok());
  auto sender = Connect(address_).value();
  ASSERT_TRUE(sender->Begin("r", 12, "").ok());
  for (int32_t l = 0; l < 3; ++l)
    ASSERT_TRUE(sender->SendLayer("r", l, {0, 1, 2}, src_.get()).ok());
  EXPECT_FALSE(sender->End("r", 1).ok());
  auto w = receiver_->Wait("r", absl::Seconds(1));
  EXPECT_THAT(w.status().message(), HasSubstr("does not fit the reservation"));
  EXPECT_TRUE(BlockIsZero(1));
}

TEST_P(TcpKvTransportTest, DeadSenderFailsTheTransferPromptly) {
  ASSERT_TRUE(receiver_->Expect("r", {1}, "").ok());
  {
    auto sender = Connect(address_).value();
    ASSERT_TRUE(sender->Begin("r", 4, "").ok());
    ASSERT_TRUE(sender->SendLayer("r", 0, {0}, src_.get()).ok());
  }  // the sender goes away mid-transfer
  const absl::Time t0 = absl::Now();
  auto w = receiver_->Wait("r", absl::Seconds(5));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
}

// A connection may sit idle between transfers (and between a transfer's frames) far longer than the
// receiver's io_timeout, which bounds only the reading of a frame begun: a cached connection is not
// dropped by a lull in traffic (it was, and the first request after 10 idle seconds failed). Once
// the receiver is gone the sender says so, for a cache of connections to reconnect.
TEST_P(TcpKvTransportTest, AnIdleConnectionOutlivesTheIoTimeout) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.io_timeout = absl::Milliseconds(150);
  auto receiver = KvControlReceiver::Create(o).value();
  const std::string address = absl::StrCat("127.0.0.1:", receiver->port());
  auto sender = Connect(address).value();
  EXPECT_TRUE(sender->Connected());
  for (const std::string id : {"r1", "r2"}) {
    absl::SleepFor(absl::Milliseconds(500));  // idle between transfers
    ASSERT_TRUE(receiver->Expect(id, {1}, "").ok());
    ASSERT_TRUE(sender->Connected()) << id;
    ASSERT_TRUE(sender->Begin(id, 4, "").ok()) << id;
    absl::SleepFor(
        absl::Milliseconds(400));  // idle between a transfer's frames (a prompt computing)
    for (int32_t l = 0; l < 3; ++l)
      ASSERT_TRUE(sender->SendLayer(id, l, {2}, src_.get()).ok()) << id;
    ASSERT_TRUE(sender->End(id, 9).ok()) << id;
    EXPECT_EQ(receiver->Wait(id, absl::Seconds(2)).value(), 9);
    EXPECT_TRUE(SameBlock(2, 1));
  }
  receiver.reset();  // closes its connections
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !sender->Connected();
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone) << "a sender whose receiver closed the connection still says it is connected";
}

// Polls `done` for up to `limit`; true once it holds.
bool Eventually(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(3)) {
  for (const absl::Time end = absl::Now() + limit; absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(10))) {
    if (done()) return true;
  }
  return done();
}

// With an idle timeout the receiver closes a connection that brings nothing for that long, but
// never one on which a transfer it began still waits (a long prompt computing between frames), and
// the link goes with it. A sender that went silent mid-transfer (stopped) loses its connection once
// the reservation has timed out. Either way the sender sees it closed, and a new connection works.
TEST_P(TcpKvTransportTest, AnIdleConnectionIsClosedOnlyWhenNoTransferOfItsOwnWaits) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.idle_timeout = absl::Milliseconds(300);
  auto receiver = KvControlReceiver::Create(o).value();
  const std::string address = absl::StrCat("127.0.0.1:", receiver->port());
  const int links_before = hub_.live_links.load();
  auto sender = Connect(address).value();
  ASSERT_TRUE(receiver->Expect("r1", {1}, "").ok());
  ASSERT_TRUE(sender->Begin("r1", 4, "").ok());
  absl::SleepFor(absl::Milliseconds(800));  // a prompt computing: idle, but r1 waits
  ASSERT_TRUE(sender->Connected()) << "closed while a transfer begun on it still waited";
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(sender->SendLayer("r1", l, {2}, src_.get()).ok());
  ASSERT_TRUE(sender->End("r1", 9).ok());
  EXPECT_EQ(receiver->Wait("r1", absl::Seconds(2)).value(), 9);
  EXPECT_TRUE(SameBlock(2, 1));
  if (mode() == Mode::kLink) {
    EXPECT_EQ(hub_.live_links.load(), links_before + 2);
  }
  const absl::Time idle_from = absl::Now();
  EXPECT_TRUE(Eventually([&] { return !sender->Connected(); })) << "an idle connection was kept";
  EXPECT_GE(absl::Now() - idle_from, absl::Milliseconds(250)) << "closed before its idle timeout";
  if (mode() == Mode::kLink) {
    EXPECT_TRUE(Eventually([&] { return hub_.live_links.load() == links_before + 1; }))
        << "the receiver's end of the link outlived its connection";
  }
  sender.reset();

  // A sender stopped mid-transfer: its connection outlives the reservation's deadline, not more.
  sender = Connect(address).value();
  ASSERT_TRUE(receiver->Expect("r2", {3}, "").ok());
  ASSERT_TRUE(sender->Begin("r2", 4, "").ok());
  ASSERT_TRUE(sender->SendLayer("r2", 0, {4}, src_.get()).ok());
  absl::SleepFor(absl::Milliseconds(600));
  ASSERT_TRUE(sender->Connected()) << "closed while the reservation still waited";
  EXPECT_EQ(receiver->Wait("r2", absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Eventually([&] { return !sender->Connected(); }, absl::Seconds(1)))
      << "the stopped sender's connection outlived its reservation";
  sender.reset();
  if (mode() == Mode::kLink) {
    EXPECT_TRUE(Eventually([&] { return hub_.live_links.load() == links_before; }));
  }

  // And a new connection serves the next transfer.
  sender = Connect(address).value();
  ASSERT_TRUE(receiver->Expect("r3", {5}, "").ok());
  ASSERT_TRUE(sender->Begin("r3", 4, "").ok());
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(sender->SendLayer("r3", l, {6}, src_.get()).ok());
  ASSERT_TRUE(sender->End("r3", 7).ok());
  EXPECT_EQ(receiver->Wait("r3", absl::Seconds(2)).value(), 7);
  EXPECT_TRUE(SameBlock(6, 5));
}

TEST_P(TcpKvTransportTest, SilentSenderHitsTheDeadline) {
  ASSERT_TRUE(receiver_->Expect("r", {1}, "").ok());
  auto sender = Connect(address_).value();
  ASSERT_TRUE(sender->Begin("r", 4, "").ok());
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(receiver_->Wait("r", absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
}

TEST_P(TcpKvTransportTest, CancelledReservationDiscardsData) {
  ASSERT_TRUE(receiver_->Expect("r", {1}, "").ok());
  EXPECT_EQ(receiver_->Expect("r", {2}, "").code(), absl::StatusCode::kAlreadyExists);
  receiver_->Cancel("r");
  auto sender = Connect(address_).value();
  ASSERT_TRUE(sender->Begin("r", 4, "").ok());
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(sender->SendLayer("r", l, {0}, src_.get()).ok());
  absl::Status end = sender->End("r", 1);
  EXPECT_THAT(end.message(), HasSubstr("no reservation"));
  EXPECT_TRUE(BlockIsZero(1));
  EXPECT_EQ(receiver_->Wait("r", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kNotFound);
}

// Frames by hand, as a hostile or buggy peer would send them.
void RawFrame(int fd, uint8_t type, const std::string& payload, uint32_t claimed_len) {
  unsigned char header[5];
  std::memcpy(header, &claimed_len, 4);
  header[4] = type;
  ASSERT_EQ(::send(fd, header, 5, MSG_NOSIGNAL), 5);
  if (!payload.empty()) {
    ASSERT_EQ(::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(payload.size()));
  }
}

TEST_P(TcpKvTransportTest, HostileFramesDropTheConnectionWithoutLargeAllocations) {
  ASSERT_TRUE(receiver_->Expect("r", {1}, "").ok());
  const int fd = ::tandem::test_support::ConnectLoopback(receiver_->port());
  ASSERT_GE(fd, 0);
  v1::KvHandshake hello;
  hello.set_model_fingerprint("model-A");
  hello.mutable_geometry()->set_num_layers(3);
  hello.mutable_geometry()->set_num_kv_heads(2);
  hello.mutable_geometry()->set_head_dim(8);
  hello.mutable_geometry()->set_block_size(4);
  // An f32 cache is announced as senders from before 16-bit caches did (no dtype, 4-byte elements).
  hello.mutable_geometry()->set_bytes_per_element(static_cast<int32_t>(DTypeSize(kv_dtype())));
  if (kv_dtype() != DType::kF32) hello.mutable_geometry()->set_dtype(ToProto(kv_dtype()));
  const std::string h = hello.SerializeAsString();
  RawFrame(fd, 1, h, static_cast<uint32_t>(h.size()));
  unsigned char reply_header[5];
  ASSERT_EQ(::recv(fd, reply_header, 5, MSG_WAITALL), 5);
  uint32_t reply_len;
  std::memcpy(&reply_len, reply_header, 4);
  std::string reply(reply_len, '\0');
  ASSERT_EQ(::recv(fd, reply.data(), reply_len, MSG_WAITALL), static_cast<ssize_t>(reply_len));
  v1::KvTransferBegin begin;
  begin.set_request_id("r");
  RawFrame(fd, 3, begin.SerializeAsString(), static_cast<uint32_t>(begin.ByteSizeLong()));
  v1::KvLayerHeader layer;
  layer.set_request_id("r");
  layer.set_layer(0);
  layer.set_num_blocks(1);
  layer.set_payload_bytes(int64_t{3} << 30);  // 3 GiB claimed
  RawFrame(fd, 4, layer.SerializeAsString(), static_cast<uint32_t>(layer.ByteSizeLong()));
  RawFrame(fd, 5, "", 3u << 30);
  const absl::Time t0 = absl::Now();
  auto w = receiver_->Wait("r", absl::Seconds(5));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(w.status().message(), HasSubstr("does not match"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  ::close(fd);
}

TEST_P(TcpKvTransportTest, AReservationCanOutliveItsSenderAndTakeARetry) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.keep_reservation_on_sender_loss = true;
  auto receiver = KvControlReceiver::Create(o).value();
  std::atomic<int> completions{0};
  receiver->SetCompletionCallback([&](const std::string& id) {
    EXPECT_EQ(id, "r");
    ++completions;
  });
  const std::string address = absl::StrCat("127.0.0.1:", receiver->port());
  ASSERT_TRUE(receiver->Expect("r", {4, 1}, "").ok());
  {
    auto dying = Connect(address).value();
    ASSERT_TRUE(dying->Begin("r", 8, "").ok());
    ASSERT_TRUE(dying->SendLayer("r", 0, {2, 3}, src_.get()).ok());
    ASSERT_TRUE(dying->SendLayer("r", 1, {2, 3}, src_.get()).ok());
  }  // a prefill worker dies mid-transfer: the reservation waits for another sender
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(completions.load(), 0);
  auto retry = Connect(address).value();
  ASSERT_TRUE(retry->Begin("r", 8, "").ok());  // starts again from layer 0
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(retry->SendLayer("r", l, {2, 3}, src_.get()).ok());
  ASSERT_TRUE(retry->End("r", 11).ok());
  EXPECT_EQ(completions.load(),
            1);  // before Wait: the callback lets the owner poll without blocking
  EXPECT_EQ(receiver->Wait("r", absl::ZeroDuration()).value(), 11);
  EXPECT_TRUE(SameBlock(2, 4));
  EXPECT_TRUE(SameBlock(3, 1));
}

TEST_P(TcpKvTransportTest, ARetryThatSendsTooFewLayersStillFails) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.keep_reservation_on_sender_loss = true;
  auto receiver = KvControlReceiver::Create(o).value();
  const std::string address = absl::StrCat("127.0.0.1:", receiver->port());
  ASSERT_TRUE(receiver->Expect("r", {4}, "").ok());
  auto first = Connect(address).value();
  ASSERT_TRUE(first->Begin("r", 4, "").ok());
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(first->SendLayer("r", l, {2}, src_.get()).ok());
  ASSERT_TRUE(first->Begin("r", 4, "").ok());  // a new Begin forgets the layers already received
  ASSERT_TRUE(first->SendLayer("r", 0, {2}, src_.get()).ok());
  EXPECT_FALSE(first->End("r", 1).ok());
  EXPECT_EQ(receiver->Wait("r", absl::Seconds(1)).status().code(), absl::StatusCode::kUnavailable);
}

TEST_P(TcpKvTransportTest, ADyingSenderDoesNotDisturbTheRetryThatTookItsTransferOver) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.keep_reservation_on_sender_loss = true;
  auto receiver = KvControlReceiver::Create(o).value();
  const std::string address = absl::StrCat("127.0.0.1:", receiver->port());
  ASSERT_TRUE(receiver->Expect("r", {4, 1}, "").ok());
  auto first = Connect(address).value();
  ASSERT_TRUE(first->Begin("r", 8, "").ok());
  ASSERT_TRUE(first->SendLayer("r", 0, {2, 3}, src_.get()).ok());
  // An acknowledged End (of nothing) makes sure the receiver has taken in everything sent before
  // it: connections are served by threads of their own, in no order between them.
  EXPECT_FALSE(first->End("sync", 0).ok());
  auto retry = Connect(address).value();  // the router retried the prefill elsewhere
  ASSERT_TRUE(retry->Begin("r", 8, "").ok());
  ASSERT_TRUE(retry->SendLayer("r", 0, {2, 3}, src_.get()).ok());
  ASSERT_TRUE(retry->SendLayer("r", 1, {2, 3}, src_.get()).ok());
  first.reset();  // the first sender's connection ends now, mid-way through the retry
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(retry->SendLayer("r", 2, {2, 3}, src_.get()).ok());
  ASSERT_TRUE(retry->End("r", 9).ok());
  EXPECT_EQ(receiver->Wait("r", absl::Seconds(1)).value(), 9);
  EXPECT_TRUE(SameBlock(2, 4));
  EXPECT_TRUE(SameBlock(3, 1));
}

// A mark whose work finishes when the test says so.
class ManualMark final : public WorkMark {
 public:
  absl::Status Wait(absl::Time deadline) override {
    waits.fetch_add(1);
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&done_), deadline)) {
      return absl::DeadlineExceededError("manual mark: not done");
    }
    return absl::OkStatus();
  }
  void Finish() {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  std::atomic<int> waits{0};

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

TEST_P(TcpKvTransportTest,
       ALayerWaitsForItsMarkBeforeAnyByteAndAMarkThatNeverCompletesFailsOnlyThatLayer) {
  ASSERT_TRUE(receiver_->Expect("r1", {5, 2}, "").ok());
  auto sender = Connect(address_);  // io timeout 2 s
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE((*sender)->Begin("r1", 10, "").ok());
  // The layer goes out only once its work is done: 300 ms here.
  ManualMark slow;
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(300));
    slow.Finish();
  });
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*sender)->SendLayer("r1", 0, {0, 1}, src_.get(), &slow).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));
  finisher.join();
  EXPECT_GE(slow.waits.load(), 1);
  // Work that never completes: the layer fails at the io timeout, before its header, so the
  // connection stays sound and the receiver has nothing half-read.
  ManualMark never;
  const absl::Status hung = (*sender)->SendLayer("r1", 1, {0, 1}, src_.get(), &never);
  EXPECT_EQ(hung.code(), absl::StatusCode::kDeadlineExceeded) << hung;
  EXPECT_TRUE((*sender)->Connected());
  ManualMark done;
  done.Finish();
  for (int32_t l = 1; l < 3; ++l)
    ASSERT_TRUE((*sender)->SendLayer("r1", l, {0, 1}, src_.get(), &done).ok());
  ASSERT_TRUE((*sender)->End("r1", 9).ok());
  EXPECT_EQ(receiver_->Wait("r1", absl::Seconds(2)).value(), 9);
  EXPECT_TRUE(SameBlock(0, 5));
  EXPECT_TRUE(SameBlock(1, 2));
}

// Every KV cache type names itself in the handshake's geometry, and only with its element size.
TEST(KvGeometryProtoTest, EveryCacheTypeRoundTripsWithItsElementSize) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3}) {
    v1::KvGeometry g;
    g.set_dtype(ToProto(dt));
    g.set_bytes_per_element(static_cast<int64_t>(DTypeSize(dt)));
    EXPECT_EQ(KvDTypeFromProto(g), dt) << DTypeName(dt);
    g.set_bytes_per_element(g.bytes_per_element() + 1);
    EXPECT_FALSE(KvDTypeFromProto(g).has_value()) << DTypeName(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(
    DataPaths, TcpKvTransportTest,
    ::testing::Combine(::testing::Values(Mode::kHost, Mode::kStaged, Mode::kLink),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kI8)),
    [](const ::testing::TestParamInfo<std::tuple<Mode, DType>>& i) {
      const Mode m = std::get<0>(i.param);
      return std::string(m == Mode::kHost     ? "host"
                         : m == Mode::kStaged ? "staged"
                                              : "link") +
             "_" + std::string(KvCacheDTypeName(std::get<1>(i.param)));
    });

// ---------------------------------------------------------------- side link only

class TcpKvLinkTest : public TransportFixture {
 protected:
  Mode mode() const override { return Mode::kLink; }
};

TEST_F(TcpKvLinkTest, AReceiverRefusesADataPathItDoesNotOffer) {
  auto plain =
      KvControlReceiver::Create({"127.0.0.1", 0, dst_.get(), info_, absl::Seconds(2)}).value();
  auto s = KvControlSender::Connect(absl::StrCat("127.0.0.1:", plain->port()), info_,
                                    absl::Seconds(2), src_link_.get());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("does not offer the 'loopback' KV data path"));
  EXPECT_EQ(hub_.joins.load(), 0);
}

// ConnectFirst (a prefill worker's --kv-transport list) takes the first data path the receiver
// offers and whose link forms, in the list's order, and says why it passed the others over.
TEST_F(TcpKvLinkTest, ASenderTakesTheFirstDataPathThatWorks) {
  LoopbackKvLinkFactory other_src(src_.get(), &hub_, "other"),
      other_dst(dst_.get(), &hub_, "other");
  auto transfer = [&](KvControlSender* sender, const std::string& id, int32_t src, int32_t dst) {
    ASSERT_TRUE(receiver_->Expect(id, {dst}, "").ok());
    ASSERT_TRUE(sender->Begin(id, 4, "").ok());
    for (int32_t l = 0; l < geometry_.num_layers; ++l)
      ASSERT_TRUE(sender->SendLayer(id, l, {src}, src_.get()).ok());
    ASSERT_TRUE(sender->End(id, 3).ok());
    EXPECT_EQ(receiver_->Wait(id, absl::Seconds(2)).value(), 3);
    EXPECT_TRUE(SameBlock(src, dst)) << id;
  };
  // The receiver offers "loopback" only: "other" is refused for its data path alone, and the next
  // is taken.
  std::string refused;
  auto s = KvControlSender::ConnectFirst(address_, info_, absl::Seconds(2),
                                         {&other_src, src_link_.get(), nullptr}, &refused);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->data_path(), "loopback");
  EXPECT_THAT(refused, HasSubstr("other: KV receiver at"));
  EXPECT_THAT(
      refused,
      HasSubstr("does not offer the 'other' KV data path (it offers 'loopback', inline TCP)"));
  transfer(s->get(), "a", 1, 2);
  EXPECT_EQ(hub_.live_links.load(), 2);
  s->reset();

  // A receiver offering both: the sender's first choice.
  KvControlReceiver::Options o = ReceiverOptions();
  o.link_factories = {dst_link_.get(), &other_dst};
  auto both = KvControlReceiver::Create(o).value();
  s = KvControlSender::ConnectFirst(absl::StrCat("127.0.0.1:", both->port()), info_,
                                    absl::Seconds(2), {&other_src, src_link_.get()}, &refused);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->data_path(), "other");
  EXPECT_EQ(refused, "");
  s->reset();

  // A link that does not form (its join times out) gives way to inline TCP, and the receiver gives
  // up the rendezvous.
  src_link_->never_join_ = true;
  s = KvControlSender::ConnectFirst(address_, info_, absl::Milliseconds(300),
                                    {src_link_.get(), nullptr}, &refused);
  src_link_->never_join_ = false;
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->data_path(), "inline");
  EXPECT_THAT(refused, HasSubstr("loopback: KV transfer to"));
  EXPECT_THAT(refused, HasSubstr("joining the loopback link"));
  transfer(s->get(), "b", 4, 5);
  for (int i = 0; i < 200 && hub_.abandoned().empty(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(hub_.abandoned().size(), 1u);

  // Without inline TCP in the list, nothing works: the error names every path's reason.
  auto none = KvControlSender::ConnectFirst(address_, info_, absl::Seconds(2), {&other_src});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("does not offer the 'other'"));
  auto neither =
      KvControlSender::ConnectFirst(address_, info_, absl::Seconds(2), {&other_src, &other_src});
  EXPECT_THAT(neither.status().message(), HasSubstr("no KV data path worked (other: "));
}

// A receiver that refuses the sender's model, or cannot be reached, is not asked again by path.
TEST_F(TcpKvLinkTest, ARefusedModelOrAnUnreachableReceiverEndsTheSearch) {
  const int joins = hub_.joins.load();
  KvEndpointInfo other_model = info_;
  other_model.model_fingerprint = "model-B";
  auto s = KvControlSender::ConnectFirst(address_, other_model, absl::Seconds(2),
                                         {src_link_.get(), nullptr});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), Not(HasSubstr("inline:")));
  EXPECT_EQ(hub_.joins.load(), joins);
  receiver_.reset();  // nobody listens on that port now
  s = KvControlSender::ConnectFirst(address_, info_, absl::Seconds(2), {src_link_.get(), nullptr});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_THAT(s.status().message(), Not(HasSubstr("inline:")));
}

TEST_F(TcpKvLinkTest, APeerThatNeverJoinsFailsTheConnectWithinTheTimeout) {
  dst_link_->never_join_ = true;
  const absl::Time t0 = absl::Now();
  auto s = KvControlSender::Connect(address_, info_, absl::Milliseconds(300), src_link_.get());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.status().message(), HasSubstr("joining the loopback link"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(hub_.live_links.load(), 0);
}

// A receiver whose link never forms gives its rendezvous up, naming the rank that never came
// (NCCL's bootstrap root would otherwise wait for it for ever); a handshake that forms its link
// gives nothing up.
TEST_F(TcpKvLinkTest, AReceiverAbandonsTheRendezvousOfALinkThatNeverForms) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.io_timeout = absl::Milliseconds(300);
  auto receiver = KvControlReceiver::Create(o).value();
  src_link_->never_join_ = true;  // the sender's join never completes
  auto s = KvControlSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), info_,
                                    absl::Milliseconds(300), src_link_.get());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded);
  for (int i = 0; i < 200 && hub_.abandoned().empty(); ++i) absl::SleepFor(absl::Milliseconds(10));
  auto abandoned = hub_.abandoned();
  ASSERT_EQ(abandoned.size(), 1u);
  EXPECT_THAT(abandoned[0].first, HasSubstr("loopback-"));
  EXPECT_EQ(abandoned[0].second, std::vector<int>{0});

  src_link_->never_join_ = false;
  auto ok = KvControlSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), info_,
                                     absl::Seconds(2), src_link_.get());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(hub_.abandoned().size(), 1u);
}

TEST_F(TcpKvLinkTest, AHungLinkFailsTheTransferWithinTheTimeoutAndDropsTheConnection) {
  KvControlReceiver::Options o = ReceiverOptions();
  o.io_timeout = absl::Milliseconds(300);
  auto receiver = KvControlReceiver::Create(o).value();
  ASSERT_TRUE(receiver->Expect("r", {1}, "").ok());
  auto sender = KvControlSender::Connect(absl::StrCat("127.0.0.1:", receiver->port()), info_,
                                         absl::Milliseconds(300), src_link_.get())
                    .value();
  src_link_->stall_sends_ = true;
  ASSERT_TRUE(sender->Begin("r", 4, "").ok());
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(sender->SendLayer("r", 0, {0}, src_.get()).code(), absl::StatusCode::kDeadlineExceeded);
  auto w = receiver->Wait("r", absl::Seconds(5));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_TRUE(BlockIsZero(1));
  // The aborted link fails every later call rather than hanging.
  EXPECT_FALSE(sender->SendLayer("r", 1, {0}, src_.get()).ok());
}

TEST_F(TcpKvLinkTest, ACancelDuringAReceiveReturnsAtOnceAndNothingLandsAfterIt) {
  ASSERT_TRUE(receiver_->Expect("r", {1}, "").ok());
  auto sender = Connect(address_).value();
  ASSERT_TRUE(sender->Begin("r", 4, "").ok());
  ASSERT_TRUE(sender->SendLayer("r", 0, {0}, src_.get()).ok());  // lands
  src_link_->send_delay_ms_ = 300;  // the receiver now waits in RecvLayer for layer 1
  std::thread send([&] { EXPECT_TRUE(sender->SendLayer("r", 1, {0}, src_.get()).ok()); });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time t0 = absl::Now();
  receiver_->Cancel(
      "r");  // the blocks may go back to the pool now: nothing may write them any more
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(50));
  send.join();
  src_link_->send_delay_ms_ = 0;
  ASSERT_TRUE(sender->SendLayer("r", 2, {0}, src_.get()).ok());  // drained: the pair stays in step
  EXPECT_THAT(sender->End("r", 1).message(), HasSubstr("no reservation"));
  // Block 1 holds layer 0 of source block 0 and nothing of the layers that arrived after the
  // cancel.
  EXPECT_TRUE(SameBlock(0, 1, 0, 1));
  EXPECT_TRUE(BlockIsZero(1, 1, 3));
  // The connection is still good for the next transfer.
  ASSERT_TRUE(receiver_->Expect("r2", {3}, "").ok());
  ASSERT_TRUE(sender->Begin("r2", 4, "").ok());
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(sender->SendLayer("r2", l, {5}, src_.get()).ok());
  ASSERT_TRUE(sender->End("r2", 2).ok());
  EXPECT_TRUE(SameBlock(5, 3));
}

}  // namespace
}  // namespace tandem
