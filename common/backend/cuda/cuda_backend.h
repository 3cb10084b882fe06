// The CUDA backend: the Backend interface on one NVIDIA GPU. Weights stay in their checkpoint dtype
// on the device (BF16/F16/F32); activations are f32 as the interface defines, the paged KV cache
// f32, BF16 or F16 (KvCacheGeometry::dtype). Linear runs on cuBLAS: 16-bit weights take their
// activations rounded to the same 16-bit type and multiply on the tensor cores with f32
// accumulation; F32 weights use SGEMM (no TF32). A decode step's few rows (up to
// cuda::kGemvMaxRows) over 16-bit weights go through this backend's GEMV instead (gemv.h: one pass
// over the weights, f32 activations), except in the batch-invariant mode. The other ops are this
// backend's own kernels (kernels.cu; attention: paged_attention.cu and the prompt kernels of
// prefill_attention.h). Every op is enqueued on one stream; CopyToHost waits
// for it. A failed launch or cuBLAS call is kept as the backend's sticky error
// (Backend::CheckErrors).
//
// Thread-compatible: one thread drives a backend at a time (the engine loop).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/backend/backend.h"
#include "common/backend/composed_ops.h"
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/op_profiler.h"
#include "common/backend/cuda/paged_attention.h"
#include "common/backend/cuda_tunings.h"
#include "common/backend/device_sampler.h"
#include "common/backend/transformer.h"

namespace tandem {

// Also the device sampler (DeviceSampler: top-k, logit edits, draws and logprobs on the device).
class CudaBackend final : public Backend, public DeviceSampler {
 public:
  struct Options {
    int device = 0;  // CUDA device ordinal
    // Every Linear runs as GEMMs of exactly kInvariantRows activation rows (the last chunk padded),
    // so a row's result never depends on how many rows share the batch: a sequence gets
    // bit-identical logits alone or batched (what the service's equivalence tests need). Costs
    // compute at small batches; off by default.
    bool batch_invariant = false;
    // The 16-bit type of the GEMMs: 16-bit weights are cast to it at upload, and GEMM inputs are
    // rounded to it (unset: each weight's own type). F16 over BF16 weights (as vLLM's --dtype half)
    // rounds activations 8× finer than BF16 at the same speed: BF16 keeps 8 significant bits,
    // F16 11. But F16 ends at 65504: a weight beyond it is refused at upload, and an activation
    // beyond it becomes infinite (models with such activations need BF16).
    std::optional<DType> compute_dtype = std::nullopt;
    // Each GEMM input over 16-bit weights is split into two 16-bit terms, hi = round(x) and
    // lo = round(x - hi), and the GEMM runs on both, accumulating in f32: activations keep about 16
    // significant bits (as f32 does to the tiny presets' logprobs: max |Δp| 1.5e-5 against the CPU,
    // where rounding to BF16 alone moves them by up to 1.45e-2), with no range limit beyond the
    // type's, for twice the GEMM arithmetic: steps of more than kSplitPairRows rows (prefill) run
    // each GEMM twice; steps of up to that many run one GEMM of twice the columns, reading the
    // weights once (decode is bound by those reads); the GEMV's steps keep f32 activations already,
    // unchanged.
    bool split_gemm_inputs = false;
    // Kernel choices GPU runs decide (cuda_tunings.h); TANDEM_CUDA_* variables override them.
    CudaTunings tunings = {};
  };
  static constexpr int64_t kInvariantRows = 64;
  // Split GEMM inputs (Options::split_gemm_inputs) of up to this many rows run as one GEMM of 2n
  // columns (the weights read once, as decode steps are bound by); more, as two GEMMs (prefill,
  // bound by arithmetic, where the [2n][m] output would be large). (And while that output stays
  // within kSplitPairOutputBytes: an LM head's rows are wide.)
  static constexpr int64_t kSplitPairRows = 128;
  static constexpr int64_t kSplitPairOutputBytes = int64_t{64} << 20;
  // FAILED_PRECONDITION when there is no driver or no such device.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const Options& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  DType StoredWeightDType(DType checkpoint) const override;
  // f32, BF16, F16, FP8 E4M3 (written saturating to ±448, rounded to nearest even) and int8 with
  // a scale per token and head (the CPU's layout and arithmetic: the same bytes).
  bool SupportsKvCacheDType(DType dtype) const override {
    return IsFloat(dtype) || dtype == DType::kF8E4M3 || dtype == DType::kI8;
  }
  // Keeps INT8/INT4 codes where the layout allows (quant_gemv.h: k and the group size multiples of
  // 32): decode steps read them in a dequantizing GEMV, larger steps dequantize into scratch for
  // cuBLAS. Other layouts run dequantized (DequantizedWeightDType).
  absl::StatusOr<DeviceWeight> UploadQuantizedWeight(
      std::shared_ptr<const QuantizedMatrix> matrix) override;
  bool ReadsQuantizedWeights(QuantType type) const override { return type != QuantType::kNone; }
  // What quantized weights are dequantized to: the compute type (BF16 unless --compute-dtype or
  // the 16-bit weights already uploaded say otherwise).
  DType DequantizedWeightDType() const override {
    return compute_dtype_.value_or(gemm_dtype_ != DType::kF32 ? gemm_dtype_ : DType::kBF16);
  }
  std::string device_description() const override { return description_; }
  absl::Status CheckErrors() override;
  void* native_stream() override { return stream_; }
  int device_ordinal() const override { return device_; }

  absl::StatusOr<DeviceMemory> Memory() override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  // On a stream of their own (the copy stream): the index and the pieces through device staging,
  // one gather or scatter kernel, one copy each way and one wait, instead of a copy and a wait of
  // the backend's stream a piece.
  void GatherToHost(const std::byte* src, const std::vector<int32_t>& index, size_t bytes,
                    void* host_out, bool after_enqueued_work) override;
  void ScatterFromHost(std::byte* dst, const std::vector<int32_t>& index, size_t bytes,
                       const void* host_in) override;
  // On the thread that enqueues ops (null while it captures a graph).
  std::shared_ptr<WorkMark> Mark() override;
  absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& tensor) override;

  void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) override;
  void RmsNorm(const float* x, const DeviceWeight& weight, float eps, int64_t n, int64_t d,
               float* out) override;
  void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
              float* out) override;
  void Rope(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t n,
            int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim) override;
  void PagedAttention(const float* q, const float* k, const float* v, void* k_cache, void* v_cache,
                      const KvCacheGeometry& geometry, int64_t layer,
                      const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                      float* out) override;
  // The attention kernels' arguments for PagedAttention's (the launch mode and workspace left to
  // the caller); tests launch them in each mode.
  static cuda::PagedAttentionArgs AttentionArgs(const float* q, const float* k, const float* v,
                                                void* k_cache, void* v_cache,
                                                const KvCacheGeometry& geometry, int64_t layer,
                                                const AttentionMetadata& metadata,
                                                int64_t num_q_heads, float scale, float* out);
  void SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) override;
  void Add(float* x, const float* y, int64_t n) override;
  void GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d, float* out) override;
  void ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) override;
  bool SupportsSampling() const override { return true; }
  void TopKRows(const float* x, int64_t n, int64_t d, int32_t k, const int32_t* row_k, int32_t* ids,
                float* values) override;
  void ApplyLogitEdits(float* logits, int64_t d, const LogitEdit* edits, int64_t count) override;
  void SampleRows(const float* logits, int64_t n, int64_t d, const RowDraw* draws, int32_t* tokens,
                  double* totals) override;
  bool SupportsLogprobs() const override { return true; }
  void Logprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens, int32_t top_k,
                int32_t* token_out, float* logprob, int32_t* rank, int32_t* top_ids,
                float* top_logprobs) override;
  void CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset, int64_t cols,
                   float* out) override;
  void SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) override;
  bool PrefersStackedProjections() const override { return true; }
  DeviceSampler* sampler() override { return this; }
  // A CudaModelRunner (cuda_model_runner.h), which runs the fusions below.
  std::unique_ptr<ModelRunner> CreateModelRunner(TransformerWeights weights) override;

  // --- Fusions: what CudaModelRunner runs in place of the compositions of composed_ops.h, with
  // the same results (bit for bit: FusionsChangeNoBit); each falls back to its composition where
  // its kernel does not take the shape or Options::tunings.fusion is off.
  // ComposedQkvAttention with the split, the q/k norms, RoPE and the cache write in one kernel
  // (paged_attention.h: LaunchQkvPrologue), which the q|k|v GEMV's last blocks may run.
  void QkvAttention(const QkvAttentionInput& in, void* k_cache, void* v_cache,
                    const KvCacheGeometry& geometry, int64_t layer,
                    const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                    float* out);
  // QkvAttention's projection alone, into in.qkv (nothing when in.w is null): RmsNormLinear or
  // Linear.
  void ProjectQkv(const QkvAttentionInput& in, int64_t n);
  // ComposedLinearSiluMul where the GEMV takes the rows: one kernel, silu · up applied as it
  // writes (gemv.h: GemvEpilogue).
  void LinearSiluMul(const float* x, int64_t n, const DeviceWeight& gate_up, float* scratch,
                     float* out);
  // Where RmsNormLinear and LinearResidual run as one GEMV each, for n rows over weights like w:
  // the GEMV's shapes (fusions on, one column a warp, not batch-invariant), the norm as its
  // prologue, the residual add as its epilogue (gemv.h). The model runner then uses those two in
  // place of AddRmsNorm and the separate norms.
  bool FusesNormsIntoLinear(int64_t n, const DeviceWeight& w) const;
  void RmsNormLinear(const float* x, int64_t n, const DeviceWeight& norm, float eps,
                     const DeviceWeight& w, const DeviceWeight* bias, bool silu_mul, float* h,
                     float* scratch, float* out);
  void LinearResidual(const float* in, int64_t n, const DeviceWeight& w, float* scratch, float* x);
  // ComposedAddRmsNorm in one kernel (bit-identical).
  void AddRmsNorm(float* x, const float* y, const DeviceWeight& weight, float eps, int64_t n,
                  int64_t d, float* out);
  void SetOpProfiling(bool on) override;
  std::string OpProfileReport() override;

  // CUDA graphs over this backend's stream (thread-local capture mode). A captured attention launch
  // splits keys by the metadata's max_context_len, which a replayed step must not exceed (the model
  // passes its context limit); without a workspace allocated beforehand it merges splits in-block,
  // with the same bits. A capture that fails leaves the backend as it was.
  bool SupportsGraphs() const override { return true; }
  bool capturing() const override { return capturing_; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int64_t> EndCapture() override;
  absl::Status Replay(int64_t graph) override;
  void DropGraphs() override;

 private:
  CudaBackend(int device, bool batch_invariant, std::string description,
              std::shared_ptr<CUstream_st> stream, cublasHandle_t cublas)
      : device_(device),
        batch_invariant_(batch_invariant),
        description_(std::move(description)),
        stream_owner_(std::move(stream)),
        stream_(stream_owner_.get()),
        cublas_(cublas) {}
  // Makes this backend's device current on the calling thread.
  void Bind();
  // Keeps the first failure; later ops still enqueue (their results are discarded by the caller).
  void Check(cudaError_t e, const char* what);
  void Check(cublasStatus_t s, const char* what);
  // Device scratch `slot` of at least `bytes` (kept and grown); nullptr (and a sticky error) on
  // failure.
  enum ScratchSlot {
    kHalfInput,
    kHalfInputLow,  // split GEMM inputs' lo term ([n][k]), or hi and lo ([2n][k]) for a GEMM of few
                    // rows
    kSplitOutput,   // a split GEMM of few rows: [2n][m], W·hi then W·lo
    kPaddedInput,
    kPaddedOutput,
    kAttentionPartials,
    kPermutedInput,      // an act-order quantized weight's input in its column order ([n][k] f32)
    kDequantizedWeight,  // a quantized weight dequantized for cuBLAS ([m][k] 16-bit)
    kNumScratch
  };
  // `optional`: failing to allocate is not an error of the backend (the caller has a fallback).
  void* Scratch(ScratchSlot slot, size_t bytes, bool optional = false);
  // Launches the attention kernels for `a` in this backend's mode, with split workspace where it
  // pays.
  void Attend(cuda::PagedAttentionArgs a);
  // QkvAttention's projection (in.w) as the GEMV that runs the prologue p (whose qkv is in.qkv) on
  // each head as it completes; false, with nothing launched, where the GEMV does not take it.
  bool ProjectQkvWithPrologue(const QkvAttentionInput& in, const cuda::QkvPrologueArgs& p);
  // Whether the GEMV runs x [n][w.cols] · w^T with this epilogue and prologue: its shapes and
  // rules, and with a norm prologue (of norm_cols elements, w.cols) or a residual add,
  // FusesNormsIntoLinear.
  bool FusedGemvRuns(const float* x, int64_t n, const DeviceWeight& w,
                     const cuda::GemvEpilogue& epilogue, const cuda::GemvPrologue& prologue,
                     int64_t norm_cols) const;
  // The GEMV FusedGemvRuns accepted: LaunchGemv over a 16-bit weight, LaunchQuantGemv over a
  // quantized one (its fusion from the epilogue and prologue).
  cudaError_t LaunchFusedGemv(const float* x, int64_t n, const DeviceWeight& w, float* out,
                              const cuda::GemvEpilogue& epilogue,
                              const cuda::GemvPrologue& prologue);
  // out[n][w.rows] = x[n][w.cols] · w^T with whatever GEMM cuBLAS picks for n.
  void Gemm(const float* x, int64_t n, const DeviceWeight& w, float* out);
  // Linear over a weight UploadQuantizedWeight kept as codes.
  void QuantizedLinear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
                       float* out);
  // Where an op producing `out` [n][d] also writes the 16-bit copy a GEMM reading it next would
  // convert (in the GEMM input scratch), recorded in rounded_; none (data null) when no GEMM of
  // 16-bit weights is likely to read it (the GEMV takes n rows, fusions off, batch-invariant) or no
  // scratch.
  cuda::RoundedCopy RoundOutput(const float* out, int64_t n, int64_t d);

  int device_;
  bool batch_invariant_;
  std::optional<DType> compute_dtype_;  // Options::compute_dtype
  bool split_gemm_inputs_ = false;      // Options::split_gemm_inputs
  // Options::tunings after the TANDEM_CUDA_* overrides (cuda_tunings.h); grid_split_keys is not
  // used batch-invariant (a token's bits then match the in-block mode's).
  CudaTunings tunings_;
  static constexpr int64_t kHeadCounters = 4096;
  unsigned* head_counters_ = nullptr;  // [kHeadCounters], zero between launches
  // The 16-bit type of the 2-D weights uploaded (kF32: none yet, or both 16-bit types: no rounded
  // copies).
  DType gemm_dtype_ = DType::kF32;
  bool gemm_dtype_mixed_ = false;
  // The rounded copy the last op wrote of its output (RoundOutput): good for the op right after it
  // on the same thread only, which Bind()'s per-thread op count tells (a Gemm of `of` then converts
  // nothing).
  struct RoundedOutput {
    const float* of = nullptr;
    int64_t count = 0;
    void* data = nullptr;
    DType dtype = DType::kF32;
    std::thread::id thread;
    uint64_t op = 0;
  } rounded_;
  std::string description_;
  // The compute stream, destroyed with the last of this backend and the buffers allocated on it
  // (each is freed in its order: CudaBuffer). Its memory (buffers, scratch; the copy staging on the
  // copy stream) comes from the stream-ordered pool, so that growing or freeing it never waits for
  // other streams of the device; weights are cudaMalloc'd once.
  std::shared_ptr<CUstream_st> stream_owner_;
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  // Bytes this backend holds in device memory (buffers and weights decrement it when freed, which
  // may be after the backend is gone: hence shared).
  std::shared_ptr<std::atomic<int64_t>> live_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  void* scratch_[kNumScratch] = {};
  size_t scratch_bytes_[kNumScratch] = {};
  size_t scratch_refused_[kNumScratch] = {};  // optional sizes the allocator refused
  void* cublas_workspace_ = nullptr;  // set once, so cuBLAS never allocates inside a capture
  bool capturing_ = false;
  // Held from BeginCapture to EndCapture (one thread); copies from other threads take it.
  std::mutex capture_mu_;
  std::unique_lock<std::mutex> capture_lock_;
  std::vector<cudaGraphExec_t> graphs_;         // by id; nullptr once dropped
  std::unique_ptr<cuda::OpProfiler> profiler_;  // set while ops are being timed
  std::mutex mu_;
  absl::Status error_;  // guarded by mu_
  // GatherToHost / ScatterFromHost: their stream, the event that orders a gather after the ops, and
  // device staging ([pieces] int32 index, [bytes] pieces), grown as needed. Guarded by copy_mu_.
  std::mutex copy_mu_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copy_after_ = nullptr;
  void* copy_staging_ = nullptr;
  size_t copy_staging_bytes_ = 0;
  // Device staging for `index` (copied there on the copy stream) and `total` bytes of pieces, grown
  // as needed (copy_mu_ held); pieces null when it cannot be had.
  struct CopyStaging {
    int32_t* index = nullptr;
    float* pieces = nullptr;
  };
  CopyStaging StageCopy(const std::vector<int32_t>& index, size_t total);
};

}  // namespace tandem
