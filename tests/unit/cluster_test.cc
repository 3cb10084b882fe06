// The router's cluster view without a network: registration checks, role filtering, draining and
// KV-full workers taking no new work, refusal when every decode worker is full, and the router's
// own accounting between heartbeats spreading requests over idle workers.
#include "router/cluster.h"

#include <map>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

v1::WorkerDescription Worker(const std::string& address, v1::WorkerRole role) {
  v1::WorkerDescription d;
  d.set_address(address);
  d.set_role(role);
  d.mutable_model()->set_fingerprint("fp");
  d.mutable_kv_geometry()->set_num_layers(2);
  d.mutable_kv_geometry()->set_num_kv_heads(1);
  d.mutable_kv_geometry()->set_head_dim(64);
  d.mutable_kv_geometry()->set_block_size(16);
  d.set_total_blocks(100);
  d.set_max_model_len(1024);
  if (role == v1::WORKER_ROLE_DECODE) d.set_kv_address(address + "-kv");
  return d;
}

v1::WorkerLoad Load(int64_t free_blocks, bool kv_full = false, bool draining = false) {
  v1::WorkerLoad l;
  l.set_free_blocks(free_blocks);
  l.set_total_blocks(100);
  l.set_kv_full(kv_full);
  l.set_draining(draining);
  return l;
}

class ClusterTest : public ::testing::Test {
 protected:
  ClusterTest() : cluster_({"fp"}) {}
  Cluster cluster_;
};

TEST_F(ClusterTest, RegistrationIsChecked) {
  EXPECT_FALSE(cluster_.Register(v1::WorkerDescription()).ok());
  v1::WorkerDescription d = Worker("d:1", v1::WORKER_ROLE_DECODE);
  d.clear_kv_address();
  EXPECT_EQ(cluster_.Register(d).code(), absl::StatusCode::kInvalidArgument);
  d = Worker("d:1", v1::WORKER_ROLE_DECODE);
  d.mutable_model()->set_fingerprint("other");
  EXPECT_EQ(cluster_.Register(d).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster_.UseDisaggregated().status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(cluster_.Register(Worker("p:1", v1::WORKER_ROLE_PREFILL)).ok());
  ASSERT_TRUE(cluster_.Register(Worker("d:1", v1::WORKER_ROLE_DECODE)).ok());
  EXPECT_TRUE(cluster_.UseDisaggregated().value());
  EXPECT_EQ(cluster_.max_model_len(), 1024);
  EXPECT_EQ(cluster_.ChoosePrefill({1, 2, 3}, {}).value().address, "p:1");
  EXPECT_EQ(cluster_.ChooseDecode({3, 8}, false, {}).value().address, "d:1");
  EXPECT_EQ(cluster_.ChooseDecode({3, 8}, true, {}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ClusterTest, FullAndDrainingWorkersTakeNothingNewAndAllFullIsRefused) {
  ASSERT_TRUE(cluster_.Register(Worker("d:1", v1::WORKER_ROLE_DECODE)).ok());
  ASSERT_TRUE(cluster_.Register(Worker("d:2", v1::WORKER_ROLE_DECODE)).ok());
  ASSERT_TRUE(cluster_.Heartbeat("d:1", Load(90, /*kv_full=*/true)).ok());
  ASSERT_TRUE(cluster_.Heartbeat("d:2", Load(10)).ok());
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(cluster_.ChooseDecode({3, 8}, false, {}).value().address, "d:2");
  ASSERT_TRUE(cluster_.Heartbeat("d:2", Load(2, /*kv_full=*/true)).ok());
  EXPECT_EQ(cluster_.ChooseDecode({3, 8}, false, {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(cluster_.Heartbeat("d:1", Load(90, false, /*draining=*/true)).ok());
  EXPECT_TRUE(cluster_.IsHealthy("d:1"));  // draining: its streams continue
  EXPECT_EQ(cluster_.num_live(v1::WORKER_ROLE_DECODE), 1);
  cluster_.MarkUnhealthy("d:2");
  EXPECT_FALSE(cluster_.IsHealthy("d:2"));
  EXPECT_EQ(cluster_.ChooseDecode({3, 8}, false, {}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ClusterTest, AssignmentsSpreadRequestsBetweenHeartbeats) {
  ASSERT_TRUE(cluster_.Register(Worker("d:1", v1::WORKER_ROLE_DECODE)).ok());
  ASSERT_TRUE(cluster_.Register(Worker("d:2", v1::WORKER_ROLE_DECODE)).ok());
  std::vector<std::unique_ptr<Cluster::Assignment>> held;
  std::map<std::string, int> count;
  for (int i = 0; i < 8; ++i) {
    const std::string a = cluster_.ChooseDecode({20, 8}, false, {}).value().address;
    ++count[a];
    held.push_back(std::make_unique<Cluster::Assignment>(&cluster_, a, 2));
  }
  EXPECT_EQ(count["d:1"], 4);
  EXPECT_EQ(count["d:2"], 4);
}

}  // namespace
}  // namespace tandem::router
