// The engine flags' defaults that depend on the device, and their refusals.
#include "common/serving/engine_flags.h"

#include <gtest/gtest.h>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "common/backend/create_backend.h"

ABSL_DECLARE_FLAG(int64_t, max_num_seqs);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, compute_dtype);
ABSL_DECLARE_FLAG(bool, split_gemm_inputs);
ABSL_DECLARE_FLAG(bool, cuda_fusion);
ABSL_DECLARE_FLAG(bool, cuda_tc_attention);
ABSL_DECLARE_FLAG(int32_t, cuda_gemv_columns);
ABSL_DECLARE_FLAG(int32_t, cuda_grid_split_keys);
ABSL_DECLARE_FLAG(bool, cuda_pdl);

namespace tandem {
namespace {

int64_t MaxNumSeqs(const std::string& device, int64_t flag) {
  absl::SetFlag(&FLAGS_device, device);
  absl::SetFlag(&FLAGS_max_num_seqs, flag);
  auto o = EngineOptionsFromFlags();
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? o->scheduler.max_num_seqs : -1;
}

TEST(EngineFlagsTest, MaxNumSeqsDefaultsToTheDevice) {
  absl::FlagSaver restore;  // the flags as they were, however the test ends
  EXPECT_EQ(MaxNumSeqs("cpu", 0), 128);
  EXPECT_EQ(MaxNumSeqs("cuda", 0), 256);
  EXPECT_EQ(MaxNumSeqs("cuda:1", 0), 256);
  EXPECT_EQ(MaxNumSeqs("cuda", 64), 64);  // an explicit value wins
  EXPECT_EQ(MaxNumSeqs("cpu", 300), 300);
  // Workers started by `tandem up` get the flag as given (0 included), and resolve it on their
  // device.
  absl::SetFlag(&FLAGS_max_num_seqs, 0);
  bool forwarded = false;
  for (const std::string& a : EngineFlagArguments()) forwarded |= a == "--max-num-seqs=0";
  EXPECT_TRUE(forwarded);
}

TEST(EngineFlagsTest, NegativeMaxNumSeqsIsRefusedByName) {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_device, "cpu");
  absl::SetFlag(&FLAGS_max_num_seqs, -1);
  auto o = EngineOptionsFromFlags();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--max-num-seqs"), absl::string_view::npos) << o.status();
}

TEST(EngineFlagsTest, ComputeDTypeIsParsedRefusedByNameAndForwarded) {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_device, "cpu");
  EXPECT_TRUE(BackendFromFlags().ok());  // auto: the CPU takes it
  absl::SetFlag(&FLAGS_compute_dtype, "fp8");
  absl::StatusOr<std::unique_ptr<Backend>> bad = BackendFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--compute-dtype must be auto, bf16 or f16, got 'fp8'"),
            std::string::npos)
      << bad.status();
  absl::SetFlag(&FLAGS_compute_dtype,
                "f32");  // the CPU's own arithmetic, but not a GEMM type to ask for
  EXPECT_FALSE(BackendFromFlags().ok());
  absl::SetFlag(&FLAGS_compute_dtype, "F16");
  bad = BackendFromFlags();  // a 16-bit compute type is the GPU's
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("is for --device cuda"), std::string::npos) << bad.status();
  bool forwarded = false;
  for (const std::string& a : EngineFlagArguments()) forwarded |= a == "--compute-dtype=F16";
  EXPECT_TRUE(forwarded);
  absl::StatusOr<std::optional<DType>> d = ParseComputeDType("bf16");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, DType::kBF16);
  d = ParseComputeDType("Auto");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->has_value());
  EXPECT_FALSE(ParseComputeDType("").ok());
}

TEST(EngineFlagsTest, SplitGemmInputsIsRefusedOnTheCpuAndForwarded) {
  absl::FlagSaver restore;
  absl::SetFlag(&FLAGS_device, "cpu");
  bool forwarded = false;
  for (const std::string& a : EngineFlagArguments()) forwarded |= a == "--split-gemm-inputs=false";
  EXPECT_TRUE(forwarded);
  absl::SetFlag(&FLAGS_split_gemm_inputs, true);
  absl::StatusOr<std::unique_ptr<Backend>> bad = BackendFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--split-gemm-inputs is for --device cuda"),
            std::string::npos)
      << bad.status();
  forwarded = false;
  for (const std::string& a : EngineFlagArguments()) forwarded |= a == "--split-gemm-inputs=true";
  EXPECT_TRUE(forwarded);
}

// The CUDA tunings are flags: they reach BackendOptions (and so CudaBackend::Options), a value
// outside a tuning's choices is refused by name, and `tandem up` forwards them to its workers.
TEST(EngineFlagsTest, CudaTuningsAreFlagsRefusedByNameAndForwarded) {
  absl::FlagSaver restore;
  absl::StatusOr<BackendOptions> defaults = BackendOptionsFromFlags();
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  const CudaTunings d;
  EXPECT_EQ(defaults->cuda_tunings.fusion, d.fusion);
  EXPECT_EQ(defaults->cuda_tunings.gemv_columns, d.gemv_columns);
  EXPECT_EQ(defaults->cuda_tunings.grid_split_keys, d.grid_split_keys);
  EXPECT_EQ(defaults->cuda_tunings.programmatic_launch, d.programmatic_launch);
  absl::SetFlag(&FLAGS_cuda_fusion, false);
  absl::SetFlag(&FLAGS_cuda_tc_attention, true);
  absl::SetFlag(&FLAGS_cuda_gemv_columns, 4);
  absl::SetFlag(&FLAGS_cuda_grid_split_keys, 64);
  absl::SetFlag(&FLAGS_cuda_pdl, true);
  absl::StatusOr<BackendOptions> o = BackendOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->cuda_tunings.fusion);
  EXPECT_TRUE(o->cuda_tunings.tensor_core_attention);
  EXPECT_EQ(o->cuda_tunings.gemv_columns, 4);
  EXPECT_EQ(o->cuda_tunings.grid_split_keys, 64);
  EXPECT_TRUE(o->cuda_tunings.programmatic_launch);
  int forwarded = 0;
  for (const std::string& a : EngineFlagArguments()) {
    forwarded += a == "--cuda-fusion=false" || a == "--cuda-gemv-columns=4" ||
                 a == "--cuda-grid-split-keys=64" || a == "--cuda-pdl=true";
  }
  EXPECT_EQ(forwarded, 4);
  absl::SetFlag(&FLAGS_cuda_gemv_columns, 3);
  absl::StatusOr<BackendOptions> bad = BackendOptionsFromFlags();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--cuda-gemv-columns must be 1, 2 or 4, not 3"),
            std::string::npos)
      << bad.status();
  absl::SetFlag(&FLAGS_cuda_gemv_columns, 2);
  absl::SetFlag(&FLAGS_cuda_grid_split_keys, 100);
  EXPECT_FALSE(BackendOptionsFromFlags().ok());
}

}  // namespace
}  // namespace tandem
