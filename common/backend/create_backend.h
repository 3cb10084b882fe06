// Picks a Backend by name: "cpu", "cuda" (device 0) or "cuda:N". The one place that knows which
// backends this build has; everything else takes a Backend*.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"

namespace tandem {

// INVALID_ARGUMENT for an unknown name; FAILED_PRECONDITION for "cuda" in a build without the CUDA
// backend or on a machine without a usable device.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device);

// Whether this build includes the CUDA backend (it may still find no device at run time).
bool BuiltWithCuda();

}  // namespace tandem
