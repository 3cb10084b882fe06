// The CUDA plugin, libtandem_cuda_plugin.so: all device code (the CUDA backend, the NCCL KV link)
// lives in this module, which a process loads only when --device cuda or --kv-transport nccl asks
// for it. Linking the CUDA libraries into every process instead breaks the metrics HTTP server:
// Debian's civetweb starts its threads with 100 KiB stacks, glibc carves the static TLS of every
// library loaded at start-up out of each thread's stack, and cuBLASLt alone has 92 KiB of TLS, so
// pthread_create fails with EINVAL. A library loaded later with dlopen gets its TLS allocated on
// first use instead, off the stack (tests/unit/cuda_plugin_test.cc holds this).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// The address of the plugin's exported `symbol`. The plugin is loaded once, on first use, from
// $TANDEM_CUDA_PLUGIN, beside the executable, or from the build tree, and never unloaded (objects
// it made run its code). FAILED_PRECONDITION naming every place tried when it cannot be loaded or
// lacks the symbol, or when this build has no CUDA.
absl::StatusOr<void*> CudaPluginSymbol(const std::string& symbol);

// Calls the plugin's factory `symbol`, a C function `T* (Args..., char* error, size_t error_size)`
// that returns an object the caller then owns, or nullptr with the reason in `error`. Failures
// (plugin, symbol, factory) are FAILED_PRECONDITION prefixed with `what` (the flag that asked).
template <typename T, typename... Args>
absl::StatusOr<std::unique_ptr<T>> CallCudaPluginFactory(const std::string& symbol,
                                                         const std::string& what, Args... args) {
  absl::StatusOr<void*> address = CudaPluginSymbol(symbol);
  if (!address.ok())
    return absl::FailedPreconditionError(what + ": " + std::string(address.status().message()));
  char error[512] = {0};
  T* made =
      reinterpret_cast<T* (*)(Args..., char*, size_t)>(*address)(args..., error, sizeof(error));
  if (made == nullptr) return absl::FailedPreconditionError(error);
  return std::unique_ptr<T>(made);
}

}  // namespace tandem
