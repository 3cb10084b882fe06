#include "common/backend/cuda_plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/subprocess.h"

namespace tandem {

absl::StatusOr<void*> CudaPluginSymbol(const std::string& symbol) {
#ifdef TANDEM_HAVE_CUDA
  static std::once_flag once;
  static void* handle = nullptr;
  static std::string load_error;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("TANDEM_CUDA_PLUGIN")) candidates.push_back(env);
    candidates.push_back(ExecutableDir() + "/libtandem_cuda_plugin.so");
    candidates.push_back(std::string(TANDEM_CUDA_PLUGIN_DIR) + "/libtandem_cuda_plugin.so");
    for (const std::string& path : candidates) {
      handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) return;
      absl::StrAppend(&load_error, load_error.empty() ? "" : "; ", ::dlerror());
    }
  });
  if (handle == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("cannot load the CUDA plugin: ", load_error));
  void* address = ::dlsym(handle, symbol.c_str());
  if (address == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA plugin has no ", symbol, " (a plugin from another build?)"));
  }
  return address;
#else
  return absl::FailedPreconditionError(
      absl::StrCat("this build has no CUDA (configure on a machine with the CUDA toolkit in "
                   "/usr/local/cuda); wanted ",
                   symbol));
#endif
}

}  // namespace tandem
