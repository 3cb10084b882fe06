// The worker registry with a fake clock: registration checks, liveness within the heartbeat
// timeout, health-check failures, and role filtering.
#include "router/worker_registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistryTest() : registry_({"model-A", absl::Seconds(3), [this] { return now_; }}) {}
  WorkerRegistration Worker(const std::string& address, WorkerRole role) {
    WorkerRegistration w;
    w.address = address;
    w.role = role;
    w.model_fingerprint = "model-A";
    w.num_layers = 2;
    w.num_kv_heads = 4;
    w.head_dim = 64;
    w.block_size = 16;
    w.total_blocks = 100;
    return w;
  }
  absl::Time now_ = absl::FromUnixSeconds(1000);
  WorkerRegistry registry_;
};

TEST_F(WorkerRegistryTest, LivenessFollowsHeartbeats) {
  ASSERT_TRUE(registry_.Register(Worker("p1:1", WorkerRole::kPrefill)).ok());
  ASSERT_TRUE(registry_.Register(Worker("d1:1", WorkerRole::kDecode)).ok());
  EXPECT_EQ(registry_.num_live(WorkerRole::kPrefill), 1);
  now_ += absl::Seconds(2);
  ASSERT_TRUE(registry_.Heartbeat("d1:1", {1, 2, 40}).ok());
  now_ += absl::Milliseconds(1500);  // p1 silent for 3.5 s, d1 for 1.5 s
  EXPECT_EQ(registry_.num_live(WorkerRole::kPrefill), 0);
  auto decode = registry_.Snapshot(WorkerRole::kDecode);
  ASSERT_EQ(decode.size(), 1u);
  EXPECT_TRUE(decode[0].healthy);
  EXPECT_EQ(decode[0].free_blocks, 40);
  EXPECT_EQ(decode[0].running, 2);
  ASSERT_TRUE(registry_.Heartbeat("p1:1", {}).ok());  // heard again: back in service
  EXPECT_EQ(registry_.num_live(WorkerRole::kPrefill), 1);
}

TEST_F(WorkerRegistryTest, FailedHealthCheckRemovesFromServiceUntilNextHeartbeat) {
  ASSERT_TRUE(registry_.Register(Worker("d1:1", WorkerRole::kDecode)).ok());
  registry_.MarkUnhealthy("d1:1");
  EXPECT_EQ(registry_.num_live(WorkerRole::kDecode), 0);
  ASSERT_TRUE(registry_.Heartbeat("d1:1", {}).ok());
  EXPECT_EQ(registry_.num_live(WorkerRole::kDecode), 1);
  registry_.Remove("d1:1");
  EXPECT_TRUE(registry_.Snapshot(WorkerRole::kDecode).empty());
  EXPECT_EQ(registry_.Heartbeat("d1:1", {}).code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, AnsweredCallsKeepAWorkerAliveButDoNotClearAFailedCheck) {
  ASSERT_TRUE(registry_.Register(Worker("d1:1", WorkerRole::kDecode)).ok());
  ASSERT_TRUE(registry_.Heartbeat("d1:1", {1, 2, 40}).ok());
  // Its heartbeats stop reaching the router, but its Decode streams keep answering.
  for (int i = 0; i < 5; ++i) {
    now_ += absl::Seconds(2);
    registry_.Heard("d1:1");
    EXPECT_TRUE(registry_.IsHealthy("d1:1")) << "10 s without a heartbeat, heard 2 s ago";
  }
  EXPECT_EQ(registry_.Snapshot(WorkerRole::kDecode)[0].free_blocks, 40)
      << "the load is the heartbeat's";
  now_ += absl::Milliseconds(3100);  // neither for 3.1 s
  EXPECT_FALSE(registry_.IsHealthy("d1:1"));
  registry_.Heard("d1:1");
  EXPECT_TRUE(registry_.IsHealthy("d1:1"));
  registry_.MarkUnhealthy("d1:1");  // a failed call or health check: only a heartbeat clears it
  registry_.Heard("d1:1");
  EXPECT_FALSE(registry_.IsHealthy("d1:1"));
  ASSERT_TRUE(registry_.Heartbeat("d1:1", {}).ok());
  EXPECT_TRUE(registry_.IsHealthy("d1:1"));
  registry_.Heard("nobody:1");  // an unknown worker is not registered by it
  EXPECT_FALSE(registry_.IsHealthy("nobody:1"));
}

TEST_F(WorkerRegistryTest, RefusesOtherModelsAndGeometries) {
  auto w = Worker("p1:1", WorkerRole::kPrefill);
  w.model_fingerprint = "model-B";
  EXPECT_THAT(registry_.Register(w).message(), HasSubstr("model-B"));
  ASSERT_TRUE(registry_.Register(Worker("p1:1", WorkerRole::kPrefill)).ok());
  auto odd = Worker("d1:1", WorkerRole::kDecode);
  odd.head_dim = 128;
  EXPECT_EQ(registry_.Register(odd).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Register(Worker("", WorkerRole::kDecode)).code(),
            absl::StatusCode::kInvalidArgument);
  // A decode worker whose KV cache stores another type than the prefill worker's: refused, naming
  // the flag; a combined worker exchanges no KV, so its cache type is its own business.
  auto bf16 = Worker("d2:1", WorkerRole::kDecode);
  bf16.kv_dtype = "BF16";
  const absl::Status refused = registry_.Register(bf16);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("--kv-cache-dtype"));
  auto combined = Worker("c1:1", WorkerRole::kCombined);
  combined.kv_dtype = "BF16";
  EXPECT_TRUE(registry_.Register(combined).ok());
}

TEST_F(WorkerRegistryTest, CombinedWorkersServeBothRoles) {
  ASSERT_TRUE(registry_.Register(Worker("c1:1", WorkerRole::kCombined)).ok());
  ASSERT_TRUE(registry_.Register(Worker("p1:1", WorkerRole::kPrefill)).ok());
  EXPECT_EQ(registry_.Snapshot(WorkerRole::kPrefill).size(), 2u);
  EXPECT_EQ(registry_.Snapshot(WorkerRole::kDecode).size(), 1u);
}

TEST_F(WorkerRegistryTest, DrainingWorkersStayHealthyButSayTheyDrain) {
  ASSERT_TRUE(registry_.Register(Worker("d1:1", WorkerRole::kDecode)).ok());
  router::Heartbeat h{0, 3, 50};
  h.draining = true;
  ASSERT_TRUE(registry_.Heartbeat("d1:1", h).ok());
  auto decode = registry_.Snapshot(WorkerRole::kDecode);
  ASSERT_EQ(decode.size(), 1u);
  EXPECT_TRUE(decode[0].healthy);  // its streams in flight must not be cut
  EXPECT_TRUE(decode[0].draining);
}

}  // namespace
}  // namespace tandem::router
