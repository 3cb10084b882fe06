#include "common/backend/create_backend.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "common/backend/cpu/cpu_backend.h"
#include "common/base/subprocess.h"

namespace tandem {

namespace {

#ifdef TANDEM_HAVE_CUDA
// Loads libtandem_cuda_plugin.so from $TANDEM_CUDA_PLUGIN, beside the program, or from the build tree,
// and asks it for a backend. Loaded once and never unloaded (backends run its code).
absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(int device, bool batch_invariant) {
  using Factory = Backend* (*)(int, bool, char*, size_t);
  static Factory factory = nullptr;
  static std::string load_error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("TANDEM_CUDA_PLUGIN")) candidates.push_back(env);
    candidates.push_back(ExecutableDir() + "/libtandem_cuda_plugin.so");
    candidates.push_back(std::string(TANDEM_CUDA_PLUGIN_DIR) + "/libtandem_cuda_plugin.so");
    for (const std::string& path : candidates) {
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        absl::StrAppend(&load_error, load_error.empty() ? "" : "; ", ::dlerror());
        continue;
      }
      factory = reinterpret_cast<Factory>(::dlsym(handle, "TandemCreateCudaBackend"));
      if (factory != nullptr) break;
      absl::StrAppend(&load_error, "; ", path, " has no TandemCreateCudaBackend");
    }
  }
  if (factory == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("--device cuda: cannot load the CUDA backend: ", load_error));
  }
  char error[512] = {0};
  Backend* backend = factory(device, batch_invariant, error, sizeof(error));
  if (backend == nullptr) return absl::FailedPreconditionError(error);
  return std::unique_ptr<Backend>(backend);
}
#endif

}  // namespace

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
    return LoadCudaBackend(ordinal, options.batch_invariant.value_or(false));
#else
    return absl::FailedPreconditionError(
        "--device cuda: this build has no CUDA backend (configure on a machine with the CUDA toolkit in /usr/local/cuda)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("--device: '", name, "' is not cpu, cuda or cuda:N"));
}

}  // namespace tandem
