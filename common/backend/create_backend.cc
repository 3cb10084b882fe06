#include "common/backend/create_backend.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#ifdef TANDEM_HAVE_CUDA
#include "common/backend/cuda/cuda_backend.h"
#endif

namespace tandem {

bool BuiltWithCuda() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  const std::string& device = options.device;
  if (device == "cpu") {
    CpuBackend::Options o;
    o.batch_invariant = options.batch_invariant.value_or(true);
    auto cpu = CpuBackend::Create(o);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<Backend>(std::move(*cpu));
  }
  int ordinal = 0;
  const std::string& name = device;
  if (name == "cuda" || (absl::StartsWith(name, "cuda:") && absl::SimpleAtoi(name.substr(5), &ordinal) &&
                         ordinal >= 0)) {
#ifdef TANDEM_HAVE_CUDA
    CudaBackend::Options o;
    o.device = ordinal;
    o.batch_invariant = options.batch_invariant.value_or(false);
    auto cuda = CudaBackend::Create(o);
    if (!cuda.ok()) return cuda.status();
    return std::unique_ptr<Backend>(std::move(*cuda));
#else
    return absl::FailedPreconditionError(
        "--device cuda: this build has no CUDA backend (configure on a machine with the CUDA toolkit in /usr/local/cuda)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("--device: '", name, "' is not cpu, cuda or cuda:N"));
}

}  // namespace tandem
