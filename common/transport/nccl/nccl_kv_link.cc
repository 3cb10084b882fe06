#include "common/transport/nccl/nccl_kv_link.h"

#include "common/backend/cuda_plugin.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateNcclKvLinkFactory(KvCacheStorage* storage) {
  return CallCudaPluginFactory<KvLinkFactory>("TandemCreateNcclKvLinkFactory",
                                              "--kv-transport nccl", storage);
}

}  // namespace tandem
