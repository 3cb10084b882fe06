// The CUDA backend as a loadable module (libtandem_cuda_plugin.so): processes link no CUDA library
// and load this, with the CUDA runtime and cuBLAS, only when --device cuda asks for it
// (common/backend/create_backend.cc). Keeps CPU processes free of cuBLAS (over 500 MB of code, and on
// this project's Debian machines its presence breaks the metrics HTTP server's start-up).
#include <cstdio>

#include "common/backend/cuda/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) tandem::Backend* TandemCreateCudaBackend(int device,
                                                                                         bool batch_invariant,
                                                                                         char* error,
                                                                                         size_t error_size) {
  tandem::CudaBackend::Options o;
  o.device = device;
  o.batch_invariant = batch_invariant;
  auto backend = tandem::CudaBackend::Create(o);
  if (!backend.ok()) {
    std::snprintf(error, error_size, "%s", std::string(backend.status().message()).c_str());
    return nullptr;
  }
  return backend->release();
}
