// The CUDA plugin's exports (libtandem_cuda_plugin.so; why it is a module:
// common/backend/cuda_plugin.h). Plain C entry points returning objects that implement the
// interfaces processes know.
#include <cstdio>

#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/kv_cache_storage.h"
#include "common/transport/cuda_ipc/cuda_ipc_kv_link_impl.h"
#include "common/transport/kv_link.h"
#include "common/transport/nccl/nccl_kv_link_impl.h"

namespace {

// The C side of tandem::CallCudaPluginFactory: the object, released to the caller, or nullptr with
// the reason in `error`.
template <typename T>
T* Release(absl::StatusOr<std::unique_ptr<T>> made, char* error, size_t error_size) {
  if (!made.ok()) {
    std::snprintf(error, error_size, "%s", std::string(made.status().message()).c_str());
    return nullptr;
  }
  return made->release();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) tandem::Backend* TandemCreateCudaBackend(
    int device, bool batch_invariant, int compute_dtype, bool split_gemm_inputs,
    const tandem::CudaTunings* tunings, char* error, size_t error_size) {
  tandem::CudaBackend::Options o;
  o.tunings = *tunings;
  o.device = device;
  o.batch_invariant = batch_invariant;
  if (compute_dtype >= 0) o.compute_dtype = static_cast<tandem::DType>(compute_dtype);
  o.split_gemm_inputs = split_gemm_inputs;
  return Release<tandem::Backend>(tandem::CudaBackend::Create(o), error, error_size);
}

extern "C" __attribute__((visibility("default"))) tandem::KvLinkFactory*
TandemCreateNcclKvLinkFactory(tandem::KvCacheStorage* storage, char* error, size_t error_size) {
  // (The CUDA emulator's plugin, emu/, links the emulated NCCL in place of libnccl.)
  return Release<tandem::KvLinkFactory>(tandem::NcclKvLinkFactory::Create(storage), error,
                                        error_size);
}

extern "C" __attribute__((visibility("default"))) tandem::KvLinkFactory*
TandemCreateCudaIpcKvLinkFactory(tandem::KvCacheStorage* storage, char* error, size_t error_size) {
  return Release<tandem::KvLinkFactory>(tandem::CudaIpcKvLinkFactory::Create(storage), error,
                                        error_size);
}
