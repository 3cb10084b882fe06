#include "common/backend/create_backend.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda_plugin.h"

namespace tandem {

absl::StatusOr<std::optional<DType>> ParseComputeDType(std::string_view text) {
  std::optional<DType> d;
  if (!ParseKvCacheDType(text, &d) || d == DType::kF32 || d == DType::kI8 || d == DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute-dtype must be auto, bf16 or f16, got '", std::string(text), "'"));
  }
  return d;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  const std::string& device = options.device;
  if (device == "cpu") {
    if (options.compute_dtype.has_value()) {
      return absl::InvalidArgumentError(
          "--compute-dtype is for --device cuda: the CPU backend computes in f32");
    }
    if (options.split_gemm_inputs) {
      return absl::InvalidArgumentError(
          "--split-gemm-inputs is for --device cuda: the CPU backend's GEMM inputs are f32 "
          "already");
    }
    CpuBackend::Options o;
    o.batch_invariant = options.batch_invariant.value_or(true);
    o.int8_activations = options.int8_activations;
    auto cpu = CpuBackend::Create(o);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<Backend>(std::move(*cpu));
  }
  if (options.int8_activations) {
    return absl::InvalidArgumentError(
        "--activation-dtype int8 is for --device cpu: the CUDA backend's activations stay 16-bit "
        "or f32");
  }
  int ordinal = 0;
  const std::string& name = device;
  if (name == "cuda" || (absl::StartsWith(name, "cuda:") &&
                         absl::SimpleAtoi(name.substr(5), &ordinal) && ordinal >= 0)) {
    // (-1: the weights' own type; else a DType's value.)
    const int compute_dtype =
        options.compute_dtype.has_value() ? static_cast<int>(*options.compute_dtype) : -1;
    return CallCudaPluginFactory<Backend>("TandemCreateCudaBackend", "--device cuda", ordinal,
                                          options.batch_invariant.value_or(false), compute_dtype,
                                          options.split_gemm_inputs, &options.cuda_tunings);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device: '", name, "' is not cpu, cuda or cuda:N"));
}

}  // namespace tandem
