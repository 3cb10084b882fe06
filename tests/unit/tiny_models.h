// Test helpers shared by the model, engine and disaggregation tests: the tiny presets as a test
// parameter, and a random model of a preset written once per test binary into the test temp dir.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

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

// DIR of a random model of `preset` (created on first use). ctest runs every test as its own
// process, many at once, all sharing the temp dir: a model is written under a name of this
// process's own and renamed into place, so no test ever reads one half written.
inline std::string TinyModel(const std::string& preset, uint64_t seed, DType dtype = DType::kBF16) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/tandem_" + preset + "_s" + std::to_string(seed) +
                          "_" + std::string(DTypeName(dtype));
  if (!fs::exists(dir)) {
    const std::string staging = dir + ".partial." + std::to_string(::getpid());
    fs::remove_all(staging);
    RandomModelOptions o;
    o.config = FindModelPreset(preset).value().config;
    o.out_dir = staging;
    o.seed = seed;
    o.dtype = dtype;
    EXPECT_TRUE(WriteRandomModel(o).ok());
    std::error_code ec;
    fs::rename(staging, dir, ec);  // fails when another process got there first: use theirs
    if (ec) fs::remove_all(staging);
  }
  return dir;
}

}  // namespace tandem::testing_util
