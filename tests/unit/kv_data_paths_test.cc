// --kv-transport's list: what it accepts and refuses, and the paths it makes.
#include "common/transport/kv_data_paths.h"

#include "common/backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseKvTransportsTest, TakesOneNameOrAnOrderedList) {
  EXPECT_THAT(ParseKvTransports("tcp").value(), ElementsAre("tcp"));
  EXPECT_THAT(ParseKvTransports("nccl").value(), ElementsAre("nccl"));
  EXPECT_THAT(ParseKvTransports("cuda-ipc,nccl,tcp").value(),
              ElementsAre("cuda-ipc", "nccl", "tcp"));
  EXPECT_THAT(ParseKvTransports("nccl,cuda-ipc").value(), ElementsAre("nccl", "cuda-ipc"));
}

TEST(ParseKvTransportsTest, RefusesUnknownRepeatedAndUnreachableNames) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "'' is not tcp, nccl or cuda-ipc"},
      {"ipc", "'ipc' is not tcp, nccl or cuda-ipc"},
      {"nccl,,tcp", "'' is not"},
      {"nccl,nccl", "names 'nccl' twice"},
      {"tcp,nccl", "'nccl' comes after tcp"},
      {"cuda-ipc, nccl", "' nccl' is not"},
  };
  for (const auto& [value, why] : bad) {
    const absl::StatusOr<std::vector<std::string>> p = ParseKvTransports(value);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(p.status().message(), HasSubstr(why)) << value;
  }
}

TEST(KvDataPathsTest, InlineAloneNeedsNoLinkAndGpuLinksRefuseAHostCache) {
  auto backend = CpuBackend::Create({}).value();
  auto storage = KvCacheStorage::Create(backend.get(), {2, 4, 4, 2, 8}).value();
  const KvDataPaths tcp = KvDataPaths::Create({"tcp"}, storage.get()).value();
  EXPECT_THAT(tcp.order(), ElementsAre(nullptr));
  EXPECT_TRUE(tcp.links().empty());
  EXPECT_EQ(tcp.live_links(), 0);
  EXPECT_EQ(tcp.Describe(), "inline");
  for (const char* gpu : {"nccl", "cuda-ipc"}) {
    // The plugin refuses host memory; a build without CUDA has no plugin: either way a clear
    // refusal.
    const absl::StatusOr<KvDataPaths> p = KvDataPaths::Create({gpu, "tcp"}, storage.get());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << gpu;
    EXPECT_THAT(p.status().message(), HasSubstr(std::string("--kv-transport ") + gpu))
        << gpu << ": " << p.status();
  }
}

}  // namespace
}  // namespace tandem
