#include "common/transport/cuda_ipc/cuda_ipc_kv_link.h"

#include "common/backend/cuda_plugin.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateCudaIpcKvLinkFactory(KvCacheStorage* storage) {
  return CallCudaPluginFactory<KvLinkFactory>("TandemCreateCudaIpcKvLinkFactory",
                                              "--kv-transport cuda-ipc", storage);
}

}  // namespace tandem
