// The engine flags' defaults that depend on the device, and their refusals.
#include "common/serving/engine_flags.h"

#include <gtest/gtest.h>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

ABSL_DECLARE_FLAG(int64_t, max_num_seqs);
ABSL_DECLARE_FLAG(std::string, device);

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

}  // namespace
}  // namespace tandem
