// The CUDA plugin as processes use it, on any machine: it loads (with the CUDA runtime, cuBLAS and
// NCCL) into a process that then still starts the metrics HTTP server, the failure that linking
// those libraries caused (common/backend/cuda_plugin.h); its factories refuse what they cannot
// serve with clear errors. Without a GPU nothing runs on a device here; tests/gpu/ covers that.
#include "common/backend/cuda_plugin.h"

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/create_backend.h"
#include "common/metrics/metrics.h"
#include "common/transport/nccl/nccl_kv_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

#ifdef TANDEM_HAVE_CUDA

TEST(CudaPluginTest, LoadsAndTheMetricsServerStillStartsAfterwards) {
  ASSERT_TRUE(CudaPluginSymbol("TandemCreateCudaBackend").ok())
      << CudaPluginSymbol("TandemCreateCudaBackend").status();
  ASSERT_TRUE(CudaPluginSymbol("TandemCreateNcclKvLinkFactory").ok());
  // Touch the backend factory too, so the CUDA runtime initialises (it fails without a device).
  (void)CreateBackend({.device = "cuda"});
  Metrics::Options o;
  o.model = "m";
  o.role = "decode";
  o.listen_address = "127.0.0.1:0";
  auto metrics = Metrics::Create(o);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_GT((*metrics)->port(), 0);
}

TEST(CudaPluginTest, UnknownSymbolsAreNamed) {
  auto s = CudaPluginSymbol("NoSuchEntryPoint");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("NoSuchEntryPoint"));
}

TEST(CudaPluginTest, TheNcclLinkRefusesACacheInHostMemory) {
  auto backend = CpuBackend::Create({}).value();
  auto storage = KvCacheStorage::Create(backend.get(), {2, 4, 4, 2, 8}).value();
  auto factory = CreateNcclKvLinkFactory(storage.get());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(factory.status().message(), HasSubstr("CUDA memory"));
}

#else

TEST(CudaPluginTest, ABuildWithoutCudaSaysSo) {
  auto s = CudaPluginSymbol("TandemCreateCudaBackend");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("no CUDA"));
}

#endif

}  // namespace
}  // namespace tandem
