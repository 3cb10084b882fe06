#include "common/transport/nccl/nccl_kv_link.h"

#include "absl/strings/str_cat.h"
#include "common/backend/cuda_plugin.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvLinkFactory>> CreateNcclKvLinkFactory(KvCacheStorage* storage) {
  using Factory = KvLinkFactory* (*)(KvCacheStorage*, char*, size_t);
  absl::StatusOr<void*> symbol = CudaPluginSymbol("TandemCreateNcclKvLinkFactory");
  if (!symbol.ok()) return absl::FailedPreconditionError(absl::StrCat("--kv-transport nccl: ", symbol.status().message()));
  char error[512] = {0};
  KvLinkFactory* factory = reinterpret_cast<Factory>(*symbol)(storage, error, sizeof(error));
  if (factory == nullptr) return absl::FailedPreconditionError(error);
  return std::unique_ptr<KvLinkFactory>(factory);
}

}  // namespace tandem
