// Device memory of a paged KV cache: K and V, each [layers][num_blocks][block_size][kv_heads][head_dim]
// in f32. Which blocks belong to which sequence is host-side bookkeeping (common/kv/); this object only
// owns the memory. Non-copyable.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/backend/backend.h"

namespace tandem {

class KvCacheStorage {
 public:
  static absl::StatusOr<std::unique_ptr<KvCacheStorage>> Create(Backend* backend,
                                                                const KvCacheGeometry& geometry);
  KvCacheStorage(const KvCacheStorage&) = delete;
  KvCacheStorage& operator=(const KvCacheStorage&) = delete;

  const KvCacheGeometry& geometry() const { return geometry_; }
  float* k() { return k_->f32(); }
  float* v() { return v_->f32(); }
  // Bytes of K plus V.
  size_t bytes() const { return k_->size() + v_->size(); }
  static int64_t BytesPerBlock(const KvCacheGeometry& g) {
    return 2 * g.num_layers * g.elements_per_block() * static_cast<int64_t>(sizeof(float));
  }

 private:
  KvCacheStorage(const KvCacheGeometry& g, std::unique_ptr<DeviceBuffer> k,
                 std::unique_ptr<DeviceBuffer> v)
      : geometry_(g), k_(std::move(k)), v_(std::move(v)) {}
  KvCacheGeometry geometry_;
  std::unique_ptr<DeviceBuffer> k_;
  std::unique_ptr<DeviceBuffer> v_;
};

}  // namespace tandem
