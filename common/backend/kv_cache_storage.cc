#include "common/backend/kv_cache_storage.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvCacheStorage>> KvCacheStorage::Create(Backend* backend,
                                                                       const KvCacheGeometry& g) {
  if (g.num_layers <= 0 || g.num_blocks <= 0 || g.block_size <= 0 || g.num_kv_heads <= 0 ||
      g.head_dim <= 0) {
    return absl::InvalidArgumentError("KV cache geometry must be positive in every dimension");
  }
  const int64_t elements = g.num_layers * g.elements_per_layer();
  ASSIGN_OR_RETURN(auto k, backend->Allocate(static_cast<size_t>(elements) * sizeof(float)));
  ASSIGN_OR_RETURN(auto v, backend->Allocate(static_cast<size_t>(elements) * sizeof(float)));
  return std::unique_ptr<KvCacheStorage>(new KvCacheStorage(backend, g, std::move(k), std::move(v)));
}

void KvCacheStorage::ReadBlocks(bool v, int64_t layer, const std::vector<int32_t>& blocks, float* host_out) {
  const int64_t n = geometry_.elements_per_block();
  const float* base = (v ? this->v() : k()) + layer * geometry_.elements_per_layer();
  for (size_t i = 0; i < blocks.size(); ++i) {
    backend_->CopyToHost(host_out + i * n, base + blocks[i] * n, static_cast<size_t>(n) * sizeof(float));
  }
}

void KvCacheStorage::WriteBlocks(bool v, int64_t layer, const std::vector<int32_t>& blocks, const float* host_in) {
  const int64_t n = geometry_.elements_per_block();
  float* base = (v ? this->v() : k()) + layer * geometry_.elements_per_layer();
  for (size_t i = 0; i < blocks.size(); ++i) {
    backend_->CopyToDevice(base + blocks[i] * n, host_in + i * n, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace tandem
