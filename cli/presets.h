// Named model shapes for `tandem make-model`: tiny ones covering every supported family and
// attention layout (for tests), and real shapes (for speed and memory benchmarks).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace tandem {

struct ModelPreset {
  std::string name;
  std::string description;
  ModelConfig config;
};

const std::vector<ModelPreset>& ModelPresets();
// NOT_FOUND listing the known names when `name` is unknown.
absl::StatusOr<ModelPreset> FindModelPreset(const std::string& name);

}  // namespace tandem
