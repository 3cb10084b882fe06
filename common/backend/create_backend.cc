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

absl::StatusOr<ActivationDType> ParseActivationDType(std::string_view text) {
  for (ActivationDType t :
       {ActivationDType::kF32, ActivationDType::kBF16, ActivationDType::kInt8}) {
    if (text == ActivationDTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--activation-dtype must be f32, bf16 or int8, got '", std::string(text), "'"));
}

std::string_view ActivationDTypeName(ActivationDType type) {
  switch (type) {
    case ActivationDType::kF32: return "f32";
    case ActivationDType::kBF16: return "bf16";
    case ActivationDType::kInt8: return "int8";
  }
  return "?";
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
    o.activations = options.activations;
    auto cpu = CpuBackend::Create(o);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<Backend>(std::move(*cpu));
  }
  if (options.activations != ActivationDType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activation-dtype ", std::string(ActivationDTypeName(options.activations)),
                     " is for --device cpu: the CUDA backend's activations stay 16-bit or f32"));
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
