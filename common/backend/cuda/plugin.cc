// The CUDA plugin's exports (libtandem_cuda_plugin.so; why it is a module: common/backend/cuda_plugin.h).
// Plain C entry points returning objects that implement the interfaces processes know.
#include <cstdio>

#include "common/backend/cuda/cuda_backend.h"
#include "common/transport/nccl/nccl_kv_link_impl.h"

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

extern "C" __attribute__((visibility("default"))) tandem::KvLinkFactory* TandemCreateNcclKvLinkFactory(
    tandem::KvCacheStorage* storage, char* error, size_t error_size) {
  auto factory = tandem::NcclKvLinkFactory::Create(storage);
  if (!factory.ok()) {
    std::snprintf(error, error_size, "%s", std::string(factory.status().message()).c_str());
    return nullptr;
  }
  return factory->release();
}
