// A Backend that forwards every op to a CPU backend, for tests that change one thing about a
// backend (what Memory() reports, whether logprobs are computed "on the device") and keep the CPU's
// results.
#pragma once

#include <memory>
#include <string>

#include "common/backend/cpu/cpu_backend.h"

namespace tandem {

class ForwardingBackend : public Backend {
 public:
  ForwardingBackend() : cpu_(CpuBackend::Create({}).value()) {}

  std::string name() const override { return "forwarding"; }
  std::string device_description() const override { return "cpu behind a test backend"; }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override {
    return cpu_->Allocate(bytes);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    cpu_->CopyToDevice(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    cpu_->CopyToHost(dst, src, bytes);
  }
  absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& t) override {
    return cpu_->UploadWeight(t);
  }
  void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) override {
    cpu_->Embedding(table, ids, n, out);
  }
  void RmsNorm(const float* x, const DeviceWeight& w, float eps, int64_t n, int64_t d,
               float* out) override {
    cpu_->RmsNorm(x, w, eps, n, d, out);
  }
  void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
              float* out) override {
    cpu_->Linear(x, n, w, bias, out);
  }
  void Rope(float* q, float* k, const int32_t* pos, const float* inv, int64_t n, int64_t hq,
            int64_t hk, int64_t hd) override {
    cpu_->Rope(q, k, pos, inv, n, hq, hk, hd);
  }
  void PagedAttention(const float* q, const float* k, const float* v, void* kc, void* vc,
                      const KvCacheGeometry& g, int64_t layer, const AttentionMetadata& md,
                      int64_t hq, float scale, float* out) override {
    cpu_->PagedAttention(q, k, v, kc, vc, g, layer, md, hq, scale, out);
  }
  void SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) override {
    cpu_->SiluMul(gate, up, n, d, out);
  }
  void Add(float* x, const float* y, int64_t n) override { cpu_->Add(x, y, n); }
  void GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out) override {
    cpu_->GatherRows(x, rows, m, d, out);
  }
  void ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) override {
    cpu_->ArgmaxRows(x, n, d, out);
  }
  void CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset, int64_t cols,
                   float* out) override {
    cpu_->CopyColumns(x, n, stride, offset, cols, out);
  }
  void SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) override {
    cpu_->SiluMulPacked(x, n, d, out);
  }

 protected:
  std::unique_ptr<CpuBackend> cpu_;
};

}  // namespace tandem
