// The CPU backend: f32 compute over F32/F16/BF16 weights (and INT8/INT4 weight-only quantized),
// multi-threaded with a ThreadPool. Linear runs register-blocked dot-product tiles that read the
// weights in their stored type, for every batch (batch-invariant; cpu_kernels.h), or OpenBLAS GEMM
// over converted tiles for large batches when batch invariance is off; paged attention is
// attention.h's. Opt-in rounded activations: BF16 (bf16_kernels.h) and int8 (quant_a8_kernels.h).
#pragma once

#include <memory>

#include "common/backend/backend.h"
#include "common/base/thread_pool.h"

namespace tandem {
namespace cpu {
struct QuantRows;
}  // namespace cpu

class CpuBackend final : public Backend {
 public:
  struct Options {
    ThreadPool* pool = nullptr;  // nullptr: ThreadPool::Default()
    // Every Linear output is computed by the same dot-product kernel whatever the batch, so a
    // sequence gets bit-identical logits alone, batched, chunked or recomputed after preemption
    // (the engine's batch invariance). Off: large batches use OpenBLAS SGEMM (faster prefill,
    // results differ in the last bits with batch composition).
    bool batch_invariant = true;
    // kInt8: quantized weights' Linear quantizes its activations to int8 (per row and weight
    // group) and multiplies in integers (quant_a8_kernels.h: VNNI). kBF16: BF16 weights' Linear
    // rounds its activations to BF16 and multiplies with vdpbf16ps (bf16_kernels.h). Faster, less
    // exact; other weights keep f32.
    ActivationDType activations = ActivationDType::kF32;
  };
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const Options& options);

  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  std::string device_description() const override;

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& tensor) override;
  // Keeps the codes: Linear widens INT8/INT4 in registers (quant_kernels.h).
  absl::StatusOr<DeviceWeight> UploadQuantizedWeight(
      std::shared_ptr<const QuantizedMatrix> matrix) override;
  bool ReadsQuantizedWeights(QuantType type) const override { return type != QuantType::kNone; }
  bool SupportsKvCacheDType(DType dtype) const override {
    return IsFloat(dtype) || dtype == DType::kI8;
  }

  void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) override;
  void RmsNorm(const float* x, const DeviceWeight& weight, float eps, int64_t n, int64_t d,
               float* out) override;
  void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
              float* out) override;
  // Up to cpu::kStreamedMaxRows rows over weights alike (one dtype or quantization, one row
  // length, no column order of their own) read them as one job (StreamedRows below); the others
  // one Linear each.
  void LinearEach(const float* x, int64_t n, absl::Span<const Projection> projections) override;
  void Rope(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t n,
            int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim) override;
  void PagedAttention(const float* q, const float* k, const float* v, void* k_cache, void* v_cache,
                      const KvCacheGeometry& geometry, int64_t layer,
                      const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                      float* out) override;
  void SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) override;
  void Add(float* x, const float* y, int64_t n) override;
  void GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out) override;
  void ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) override;
  void CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset, int64_t cols,
                   float* out) override;
  void SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) override;

 private:
  CpuBackend(ThreadPool* pool, bool batch_invariant)
      : pool_(pool), batch_invariant_(batch_invariant) {}
  // Whether LinearEach reads these weights as n rows' job (StreamedRows serves them all).
  bool StreamsTogether(int64_t n, absl::Span<const Projection> projections) const;
  // The Linear of a few rows (up to cpu::kStreamedMaxRows: batch 1, a verification step, a few
  // sequences) over weights ReadAlike accepts, biases aside: every weight row read once, in runs
  // streamed by one pass of the pool over all the projections (cpu::DotRowsStreamed,
  // QuantDotRowsStreamed and its int8-activation twin, cpu::Bf16DotRowsStreamed). Each output is
  // the bits the tiles give its row in a batch.
  void StreamedRows(const float* x, int64_t n, absl::Span<const Projection> projections);
  void QuantizedStreamedRows(const float* x, int64_t n, absl::Span<const Projection> projections);
  // BF16 activations over BF16 weights (with AVX-512 BF16): the rows rounded once for all.
  void Bf16StreamedRows(const float* x, int64_t n, absl::Span<const Projection> projections);
  bool ReadAlike(absl::Span<const Projection> projections) const;
  // Whether w's Linear rounds its activations to BF16 (Options::activations kBF16 over BF16
  // weights): LinearBf16.
  bool RoundsToBf16(const DeviceWeight& w) const {
    return activations_ == ActivationDType::kBF16 && w.quant == QuantType::kNone &&
           w.dtype == DType::kBF16;
  }
  // Linear over 16-bit or f32 weights with f32 activations.
  void LinearF32(const float* x, int64_t n, const DeviceWeight& w, float* out);
  // Linear over BF16 weights with BF16 activations (Options::activations kBF16).
  void LinearBf16(const float* x, int64_t n, const DeviceWeight& w, float* out);
  // Linear over quantized weights with int8 activations (Options::activations kInt8).
  void QuantizedLinearA8(const float* x, int64_t n, int64_t m, const cpu::QuantRows& q, float* out);
  // Linear over a weight-only quantized weight.
  void QuantizedLinear(const float* x, int64_t n, const DeviceWeight& w, float* out);
  ThreadPool* pool_;
  bool batch_invariant_;
  ActivationDType activations_ = ActivationDType::kF32;
};

}  // namespace tandem
