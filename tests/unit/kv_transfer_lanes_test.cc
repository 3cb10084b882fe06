// The prefill worker's transfer lanes against a real TCP receiver on loopback: jobs in order per
// lane, a failure failing the rest of its request, cancellation, and isolation between lanes.
#include "prefill_worker/kv_transfer_lanes.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/transport/kv_control.h"
#include "gtest/gtest.h"
#include "tests/unit/loopback_kv_link.h"

namespace tandem {
namespace {

// Waits for End's callback and returns its status.
absl::Status Ended(KvTransferLanes* lanes, const std::string& address, const std::string& id) {
  absl::Notification done;
  absl::Status result;
  lanes->End(address, id, 5, [&](const absl::Status& s, double) {
    result = s;
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  return result;
}

class KvTransferLanesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = CpuBackend::Create({}).value();
    geometry_ = {/*num_layers=*/2, /*num_blocks=*/8, /*block_size=*/4, /*num_kv_heads=*/2,
                 /*head_dim=*/8};
    src_ = KvCacheStorage::Create(backend_.get(), geometry_).value();
    dst_ = KvCacheStorage::Create(backend_.get(), geometry_).value();
    std::mt19937 rng(2);
    for (int64_t i = 0; i < geometry_.num_layers * geometry_.elements_per_layer(); ++i) {
      static_cast<float*>(src_->k_data())[i] = static_cast<float>(rng() % 1000);
      static_cast<float*>(src_->v_data())[i] = static_cast<float>(rng() % 1000);
    }
    info_ = {"m", geometry_};
    receiver_ =
        KvControlReceiver::Create({"127.0.0.1", 0, dst_.get(), info_, absl::Seconds(2)}).value();
    address_ = absl::StrCat("127.0.0.1:", receiver_->port());
    lanes_ = std::make_unique<KvTransferLanes>(
        KvTransferLanes::Options{info_, src_.get(), absl::Seconds(2)});
  }

  // Sends a whole transfer of `blocks` and returns End's status.
  absl::Status Transfer(const std::string& address, const std::string& id,
                        std::vector<int32_t> blocks) {
    lanes_->Begin(address, id, 4, "");
    for (int32_t l = 0; l < geometry_.num_layers; ++l) lanes_->SendLayer(address, id, l, blocks);
    return Ended(lanes_.get(), address, id);
  }

  std::unique_ptr<CpuBackend> backend_;
  KvCacheGeometry geometry_;
  std::unique_ptr<KvCacheStorage> src_, dst_;
  KvEndpointInfo info_;
  std::unique_ptr<KvControlReceiver> receiver_;
  std::string address_;
  std::unique_ptr<KvTransferLanes> lanes_;
};

TEST_F(KvTransferLanesTest, DeliversInOrderAndReportsTheAcknowledgement) {
  ASSERT_TRUE(receiver_->Expect("a", {6}, "").ok());
  EXPECT_TRUE(Transfer(address_, "a", {1}).ok());
  EXPECT_EQ(receiver_->Wait("a", absl::Seconds(1)).value(), 5);
  const int64_t e = geometry_.elements_per_block();
  for (int64_t l = 0; l < geometry_.num_layers; ++l) {
    const int64_t base = l * geometry_.elements_per_layer();
    EXPECT_TRUE(std::equal(static_cast<float*>(src_->k_data()) + base + 1 * e,
                           static_cast<float*>(src_->k_data()) + base + 2 * e,
                           static_cast<float*>(dst_->k_data()) + base + 6 * e));
    EXPECT_TRUE(std::equal(static_cast<float*>(src_->v_data()) + base + 1 * e,
                           static_cast<float*>(src_->v_data()) + base + 2 * e,
                           static_cast<float*>(dst_->v_data()) + base + 6 * e));
  }
}

// A decode worker that goes away while its lane is idle: the lane drops the connection and its side
// link (on a GPU an NCCL communicator and its staging memory) at its next idle check, not at a next
// transfer that may never come; left with no connection, the lane then retires its thread.
TEST_F(KvTransferLanesTest, AnIdleLaneDropsADeadReceiversLinkAndThenRetires) {
  LoopbackKvHub hub;
  LoopbackKvLinkFactory src_link(src_.get(), &hub), dst_link(dst_.get(), &hub);
  KvControlReceiver::Options ro{"127.0.0.1", 0, dst_.get(), info_, absl::Seconds(2)};
  ro.link_factories = {&dst_link};
  auto receiver = KvControlReceiver::Create(ro).value();
  const std::string address = absl::StrCat("127.0.0.1:", receiver->port());
  KvTransferLanes::Options lo{info_, src_.get(), absl::Seconds(2), {&src_link}};
  lo.idle_check = absl::Milliseconds(50);
  lo.retire_idle_lane = absl::Milliseconds(400);
  KvTransferLanes lanes(lo);
  ASSERT_TRUE(receiver->Expect("a", {6}, "").ok());
  lanes.Begin(address, "a", 4, "");
  for (int32_t l = 0; l < geometry_.num_layers; ++l) lanes.SendLayer(address, "a", l, {1});
  EXPECT_TRUE(Ended(&lanes, address, "a").ok());
  EXPECT_EQ(hub.live_links.load(), 2);  // one link, both ends, kept for the next transfer
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(hub.live_links.load(), 2) << "a healthy idle connection was dropped";
  EXPECT_EQ(lanes.lanes(), 1u) << "a lane with a live connection retired";
  receiver.reset();  // the decode worker dies
  const absl::Time gone = absl::Now();
  while (hub.live_links.load() > 0 && absl::Now() - gone < absl::Seconds(3))
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(hub.live_links.load(), 0) << "the lane kept a dead receiver's link";
  EXPECT_LT(absl::Now() - gone, absl::Milliseconds(500));
  while (lanes.lanes() > 0 && absl::Now() - gone < absl::Seconds(3))
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(lanes.lanes(), 0u) << "an idle lane with no connection kept its thread";
  // A new lane for the next decode worker (the retired thread is joined on the way).
  auto again = KvControlReceiver::Create(ro).value();
  const std::string address2 = absl::StrCat("127.0.0.1:", again->port());
  ASSERT_TRUE(again->Expect("b", {3}, "").ok());
  lanes.Begin(address2, "b", 4, "");
  for (int32_t l = 0; l < geometry_.num_layers; ++l) lanes.SendLayer(address2, "b", l, {2});
  EXPECT_TRUE(Ended(&lanes, address2, "b").ok());
  EXPECT_EQ(again->Wait("b", absl::Seconds(1)).value(), 5);
}

TEST_F(KvTransferLanesTest, ARefusedTransferFailsItsEndAndTheLaneRecovers) {
  // No reservation for "x": the receiver refuses at End; the next request on the lane succeeds.
  absl::Status s = Transfer(address_, "x", {1});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("no reservation"), std::string::npos) << s;
  ASSERT_TRUE(receiver_->Expect("y", {2}, "").ok());
  EXPECT_TRUE(Transfer(address_, "y", {3}).ok());
}

TEST_F(KvTransferLanesTest, AnUnreachableReceiverFailsOnlyItsLane) {
  const absl::Status dead = Transfer("127.0.0.1:1", "d", {1});
  EXPECT_EQ(dead.code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(receiver_->Expect("ok", {2}, "").ok());
  EXPECT_TRUE(Transfer(address_, "ok", {3}).ok());
}

TEST_F(KvTransferLanesTest, CancelledTransfersEndWithCancelled) {
  ASSERT_TRUE(receiver_->Expect("c", {2}, "").ok());
  lanes_->Cancel("c");
  EXPECT_EQ(Transfer(address_, "c", {1}).code(), absl::StatusCode::kCancelled);
}

TEST_F(KvTransferLanesTest, ARefusedTransferLeavesTheOthersOnItsConnectionAlone) {
  // "b" is begun, then "x" (a reservation the decode worker dropped: a cancelled request) is
  // refused at its End. The connection is sound: "b" goes on over it and completes.
  ASSERT_TRUE(receiver_->Expect("b", {4}, "").ok());
  lanes_->Begin(address_, "b", 4, "");
  lanes_->SendLayer(address_, "b", 0, {1});
  EXPECT_EQ(Transfer(address_, "x", {2}).code(), absl::StatusCode::kUnavailable);
  lanes_->SendLayer(address_, "b", 1, {1});
  EXPECT_TRUE(Ended(lanes_.get(), address_, "b").ok());
  EXPECT_EQ(receiver_->Wait("b", absl::Seconds(1)).value(), 5);
}

TEST_F(KvTransferLanesTest, ALayerRefusedBeforeTheWireStillEndsTheTransferAtTheReceiver) {
  // A block outside the sender's pool fails the layer before anything is sent; the End still goes
  // out, so the receiver fails the reservation at once (a layer missing), not at its timeout.
  ASSERT_TRUE(receiver_->Expect("v", {4}, "").ok());
  lanes_->Begin(address_, "v", 4, "");
  lanes_->SendLayer(address_, "v", 0, {static_cast<int32_t>(geometry_.num_blocks)});
  lanes_->SendLayer(address_, "v", 1, {1});
  const absl::Status v = Ended(lanes_.get(), address_, "v");
  EXPECT_EQ(v.code(), absl::StatusCode::kUnavailable) << v;
  EXPECT_NE(v.message().find("block out of range"), std::string::npos) << v;
  const absl::StatusOr<int32_t> waited = receiver_->Wait("v", absl::Milliseconds(500));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kUnavailable) << waited.status();
  EXPECT_NE(waited.status().message().find("ended after"), std::string::npos) << waited.status();
  ASSERT_TRUE(receiver_->Expect("w", {5}, "").ok());
  EXPECT_TRUE(Transfer(address_, "w", {2}).ok());
}

TEST_F(KvTransferLanesTest, ALostConnectionFailsEveryTransferBegunOnIt) {
  // "a"'s layer names more blocks than the receiver's pool holds: the receiver drops the
  // connection. "b", begun on it, fails at once with that cause, and sends nothing more over a new
  // connection.
  ASSERT_TRUE(receiver_->Expect("a", {4}, "").ok());
  ASSERT_TRUE(receiver_->Expect("b", {5}, "").ok());
  lanes_->Begin(address_, "b", 4, "");
  lanes_->Begin(address_, "a", 4, "");
  lanes_->SendLayer(address_, "a", 0, std::vector<int32_t>(geometry_.num_blocks + 1, 1));
  const absl::Status a = Ended(lanes_.get(), address_, "a");
  EXPECT_EQ(a.code(), absl::StatusCode::kUnavailable) << a;
  for (int32_t l = 0; l < geometry_.num_layers; ++l) lanes_->SendLayer(address_, "b", l, {1});
  const absl::Status b = Ended(lanes_.get(), address_, "b");
  EXPECT_EQ(b.code(), absl::StatusCode::kUnavailable) << b;
  EXPECT_NE(b.message().find("connection was lost"), std::string::npos) << b;
  EXPECT_EQ(b.message().find("not begun on this connection"), std::string::npos) << b;
  // The lane reconnects for the next request.
  ASSERT_TRUE(receiver_->Expect("c", {6}, "").ok());
  EXPECT_TRUE(Transfer(address_, "c", {3}).ok());
}

}  // namespace
}  // namespace tandem
