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
  if (!backend->SupportsKvCacheDType(g.dtype)) {
    std::string kinds = "f32, bf16, f16";
    for (DType d : {DType::kI8, DType::kF8E4M3}) {
      if (backend->SupportsKvCacheDType(d))
        absl::StrAppend(&kinds, ", ", std::string(KvCacheDTypeName(d)));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-dtype ", std::string(KvCacheDTypeName(g.dtype)), ": the ", backend->name(),
        " backend's KV cache stores ", kinds, g.dtype == DType::kF8E4M3 ? " (fp8 is CUDA's)" : ""));
  }
  const int64_t bytes = g.num_layers * g.bytes_per_layer();
  ASSIGN_OR_RETURN(auto k, backend->Allocate(static_cast<size_t>(bytes)));
  ASSIGN_OR_RETURN(auto v, backend->Allocate(static_cast<size_t>(bytes)));
  // Allocated and zeroed before it is returned: KV transfers write blocks off the backend's stream
  // of ops (Backend::ScatterFromHost, the NCCL link), unordered with what Allocate enqueued there
  // (on a GPU the allocation itself is stream-ordered, and the zeroing).
  RETURN_IF_ERROR(backend->CheckErrors());
  return std::unique_ptr<KvCacheStorage>(
      new KvCacheStorage(backend, g, std::move(k), std::move(v)));
}

void KvCacheStorage::ReadBlocks(bool v, int64_t layer, const std::vector<int32_t>& blocks,
                                void* host_out, bool after_enqueued_work) {
  backend_->GatherToHost(layer_data(v, layer), blocks,
                         static_cast<size_t>(geometry_.bytes_per_block()), host_out,
                         after_enqueued_work);
}

void KvCacheStorage::WriteBlocks(bool v, int64_t layer, const std::vector<int32_t>& blocks,
                                 const void* host_in) {
  backend_->ScatterFromHost(layer_data(v, layer), blocks,
                            static_cast<size_t>(geometry_.bytes_per_block()), host_in);
}

}  // namespace tandem
