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
  // Workers started by `tandem up` get the flag as given (0 included), and resolve it on their device.
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
  EXPECT_NE(bad.status().message().find("--compute-dtype must be auto, bf16 or f16, got 'fp8'"), std::string::npos)
      << bad.status();
  absl::SetFlag(&FLAGS_compute_dtype, "f32");  // the CPU's own arithmetic, but not a GEMM type to ask for
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
  EXPECT_NE(bad.status().message().find("--split-gemm-inputs is for --device cuda"), std::string::npos) << bad.status();
  forwarded = false;
  for (const std::string& a : EngineFlagArguments()) forwarded |= a == "--split-gemm-inputs=true";
  EXPECT_TRUE(forwarded);
}

}  // namespace
}  // namespace tandem
