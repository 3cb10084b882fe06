// Test helpers shared by the model, engine and disaggregation tests: the tiny presets as a test
// parameter, and a random model of a preset written once per test binary into the test temp dir.
#pragma once

#include <filesystem>
#include <string>

#include "cli/presets.h"
#include "cli/random_model.h"
#include "gtest/gtest.h"

namespace tandem::testing_util {

inline auto TinyPresets() {
  return ::testing::Values("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3");
}

// "tiny-llama" → "tiny_llama" (gtest parameter names must be identifiers).
inline std::string PresetName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (auto& ch : n) {
    if (ch == '-') ch = '_';
  }
  return n;
}

// DIR of a random model of `preset` (created on first use).
inline std::string TinyModel(const std::string& preset, uint64_t seed, DType dtype = DType::kBF16) {
  const std::string dir = ::testing::TempDir() + "/tandem_" + preset + "_s" + std::to_string(seed) +
                          "_" + std::string(DTypeName(dtype));
  if (!std::filesystem::exists(dir + "/config.json")) {
    RandomModelOptions o;
    o.config = FindModelPreset(preset).value().config;
    o.out_dir = dir;
    o.seed = seed;
    o.dtype = dtype;
    EXPECT_TRUE(WriteRandomModel(o).ok());
  }
  return dir;
}

}  // namespace tandem::testing_util
