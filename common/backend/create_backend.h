// Picks a Backend by name: "cpu", "cuda" (device 0) or "cuda:N". The one place that knows which
// backends this build has; everything else takes a Backend*.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"
#include "common/backend/cuda_tunings.h"
#include "common/tensor/dtype.h"

namespace tandem {

struct BackendOptions {
  std::string device = "cpu";
  // Linear results independent of the batch (see CpuBackend / CudaBackend Options). Unset: the
  // backend's default (on for the CPU, where it is cheap; off for CUDA, where it costs throughput).
  std::optional<bool> batch_invariant = std::nullopt;
  // The 16-bit type of a GPU's weights and GEMMs (CudaBackend::Options::compute_dtype); unset: the
  // weights' own. Not for the CPU, which computes in f32.
  std::optional<DType> compute_dtype = std::nullopt;
  // GEMM inputs as two 16-bit terms (CudaBackend::Options::split_gemm_inputs). Not for the CPU.
  bool split_gemm_inputs = false;
  // What the CPU's Linear rounds activations to (CpuBackend::Options::activations). CPU only.
  ActivationDType activations = ActivationDType::kF32;
  // The CUDA backend's kernel choices (cuda_tunings.h). Not for the CPU.
  CudaTunings cuda_tunings = {};
};

// --compute-dtype's value: "auto" (unset), "bf16" or "f16", any case; INVALID_ARGUMENT naming the
// flag and the value for anything else.
absl::StatusOr<std::optional<DType>> ParseComputeDType(std::string_view text);

// --activation-dtype's value: "f32", "bf16" or "int8"; INVALID_ARGUMENT naming the flag and the
// value for anything else.
absl::StatusOr<ActivationDType> ParseActivationDType(std::string_view text);
// Its name, as the flag spells it.
std::string_view ActivationDTypeName(ActivationDType type);

// INVALID_ARGUMENT for an unknown name; FAILED_PRECONDITION for "cuda" in a build without the CUDA
// backend or on a machine without a usable device.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace tandem
