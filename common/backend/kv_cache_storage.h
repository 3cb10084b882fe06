// Device memory of a paged KV cache: K and V, each
// [layers][num_blocks][block_size][kv_heads][head_dim] in the geometry's dtype (f32, bf16 or f16;
// int8 blocks also hold their scales, KvCacheGeometry).
// Which blocks belong to which sequence is host-side bookkeeping (common/kv/); this object only
// owns the memory, and moves blocks between it and the host for KV transfer. Non-copyable.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

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
  // The backend whose memory this is (device-side transports order their work after its stream).
  Backend* backend() const { return backend_; }
  // Whether k() and v() may be read from host threads directly (the CPU backend's memory): then a
  // sender can write blocks to a socket without copying them out first (ReadBlocks).
  bool host_accessible() const { return backend_->host_memory() && !staging_forced_; }
  // Makes host_accessible() false: transfers copy blocks through host staging buffers even when the
  // cache is host memory, as GPU workers always do (--kv-host-staging; the staged path on the CPU).
  void ForceHostStaging() { staging_forced_ = true; }
  // host_out[i] = layer `layer` of block blocks[i] of K (v = false) or V (v = true), each
  // [block_size][kv_heads][head_dim] in the cache's dtype (bytes_per_block bytes); waits for work
  // enqueued on the backend before reading, unless the caller has waited for the layer's writes
  // (`after_enqueued_work` false: a WorkMark). One gather and one copy on a GPU
  // (Backend::GatherToHost).
  void ReadBlocks(bool v, int64_t layer, const std::vector<int32_t>& blocks, void* host_out,
                  bool after_enqueued_work = true);
  // The reverse: block blocks[i] of the layer = host_in[i]; done when it returns. Not ordered after
  // the backend's enqueued work: for blocks no running sequence uses (reserved between steps).
  void WriteBlocks(bool v, int64_t layer, const std::vector<int32_t>& blocks, const void* host_in);
  // The whole K or V memory, every layer, in the geometry's dtype.
  void* k_data() { return k_->data(); }
  void* v_data() { return v_->data(); }
  // Layer `layer` of K or V: [num_blocks][block_size][kv_heads][head_dim] in the geometry's dtype.
  std::byte* layer_data(bool v, int64_t layer) {
    return static_cast<std::byte*>(v ? v_->data() : k_->data()) +
           layer * geometry_.bytes_per_layer();
  }
  // Bytes of K plus V.
  size_t bytes() const { return k_->size() + v_->size(); }
  // Bytes of K and V of one block across every layer.
  static int64_t BytesPerBlock(const KvCacheGeometry& g) {
    return 2 * g.num_layers * g.bytes_per_block();
  }

 private:
  KvCacheStorage(Backend* backend, const KvCacheGeometry& g, std::unique_ptr<DeviceBuffer> k,
                 std::unique_ptr<DeviceBuffer> v)
      : backend_(backend), geometry_(g), k_(std::move(k)), v_(std::move(v)) {}
  Backend* backend_;
  bool staging_forced_ = false;
  KvCacheGeometry geometry_;
  std::unique_ptr<DeviceBuffer> k_;
  std::unique_ptr<DeviceBuffer> v_;
};

}  // namespace tandem
