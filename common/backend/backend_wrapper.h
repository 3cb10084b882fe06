// A Backend that forwards the device interface's required parts (memory, copies, weights as
// stored, the core ops) to an inner backend, for a backend that changes one thing and keeps the
// inner one's results: the calibration of `tandem quantize` (it watches Linear's inputs), and the
// tests' backends (what Memory() reports, counting rows, ...). What is not forwarded keeps
// Backend's defaults: no device sampler, the generic model runner, quantized weights dequantized
// to f32 on upload, projections not stacked.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "common/backend/backend.h"

namespace tandem {

class BackendWrapper : public Backend {
 public:
  explicit BackendWrapper(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  Backend* inner() const { return inner_.get(); }

  std::string name() const override { return inner_->name(); }
  std::string device_description() const override { return inner_->device_description(); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToDevice(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToHost(dst, src, bytes);
  }
  absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& t) override {
    return inner_->UploadWeight(t);
  }
  void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) override {
    inner_->Embedding(table, ids, n, out);
  }
  void RmsNorm(const float* x, const DeviceWeight& w, float eps, int64_t n, int64_t d,
               float* out) override {
    inner_->RmsNorm(x, w, eps, n, d, out);
  }
  void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
              float* out) override {
    inner_->Linear(x, n, w, bias, out);
  }
  void Rope(float* q, float* k, const int32_t* pos, const float* inv, int64_t n, int64_t hq,
            int64_t hk, int64_t hd) override {
    inner_->Rope(q, k, pos, inv, n, hq, hk, hd);
  }
  void PagedAttention(const float* q, const float* k, const float* v, void* kc, void* vc,
                      const KvCacheGeometry& g, int64_t layer, const AttentionMetadata& md,
                      int64_t hq, float scale, float* out) override {
    inner_->PagedAttention(q, k, v, kc, vc, g, layer, md, hq, scale, out);
  }
  void SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) override {
    inner_->SiluMul(gate, up, n, d, out);
  }
  void Add(float* x, const float* y, int64_t n) override { inner_->Add(x, y, n); }
  void GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out) override {
    inner_->GatherRows(x, rows, m, d, out);
  }
  void ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) override {
    inner_->ArgmaxRows(x, n, d, out);
  }
  void CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset, int64_t cols,
                   float* out) override {
    inner_->CopyColumns(x, n, stride, offset, cols, out);
  }
  void SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) override {
    inner_->SiluMulPacked(x, n, d, out);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace tandem
