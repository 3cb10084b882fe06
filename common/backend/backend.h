// The device boundary. Everything above this interface (model, engine, scheduler, KV bookkeeping)
// is device-independent; the CPU backend (cpu/) and the CUDA backend (cuda/) implement it.
//
// Conventions: activations are f32 and row-major; pointers passed to ops are device pointers of
// this backend (for the CPU backend, host pointers). Ops are enqueued in order on the backend's
// stream and may run asynchronously; CopyToHost synchronises. Shapes are written [outer]...[inner].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sampling/device_sampling.h"
#include "common/tensor/dtype.h"
#include "common/tensor/safetensors.h"

namespace tandem {

// A block of device memory owned by the backend that allocated it.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  float* f32() { return static_cast<float*>(data()); }
  int32_t* i32() { return static_cast<int32_t*>(data()); }
};

// A weight matrix [rows][cols] (PyTorch Linear layout [out_features][in_features]) or vector [cols]
// (rows == 1) in its checkpoint dtype, resident on the device.
struct DeviceWeight {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps converted or uploaded storage alive
};

// Geometry of a paged KV cache. K and V each: [layers][num_blocks][block_size][kv_heads][head_dim].
struct KvCacheGeometry {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  // What the cache stores: F32, or BF16/F16 (half the memory and the attention's reads; keys and
  // values are rounded to it when written, and read back as f32).
  DType dtype = DType::kF32;

  int64_t elements_per_layer() const { return num_blocks * block_size * num_kv_heads * head_dim; }
  int64_t elements_per_block() const { return block_size * num_kv_heads * head_dim; }
  int64_t bytes_per_element() const { return static_cast<int64_t>(DTypeSize(dtype)); }
  // One block of one layer, of K or of V.
  int64_t bytes_per_block() const { return elements_per_block() * bytes_per_element(); }
  int64_t bytes_per_layer() const { return elements_per_layer() * bytes_per_element(); }
};

// Per-step attention metadata, CSR style (flashinfer's layout). All arrays are device pointers.
//   seq_indptr[num_seqs + 1]       : tokens of sequence s are rows [seq_indptr[s], seq_indptr[s+1])
//   positions[num_tokens]          : absolute position of each new token
//   context_lens[num_seqs]         : tokens of sequence s in the cache after this step's writes
//   block_indptr[num_seqs + 1]     : block table of s is block_indices[block_indptr[s] .. [s+1])
//   block_indices[...]             : physical block ids
//   slot_mapping[num_tokens]       : physical slot (block * block_size + offset) for each new token
// Attention is causal: the token at position p sees cached positions 0..p of its own sequence.
struct AttentionMetadata {
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t max_context_len = 0;
  const int32_t* seq_indptr = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_indptr = nullptr;
  const int32_t* block_indices = nullptr;
  const int32_t* slot_mapping = nullptr;
};

// Memory of the device a backend computes on.
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
  // Held by this backend now: what it allocated and has not freed (weights, KV cache, activations,
  // workspaces). Counted by the backend itself, so other processes sharing the device do not show
  // up in it (they do in free_bytes).
  int64_t own_bytes = 0;
};

// A point in a backend's stream of enqueued ops (Backend::Mark). Thread-safe; may outlive nothing
// but its backend.
class WorkMark {
 public:
  virtual ~WorkMark() = default;
  // Returns once every op enqueued before the mark has completed (not those enqueued after it):
  // OK; DEADLINE_EXCEEDED at `deadline`; the device's error if the work failed.
  virtual absl::Status Wait(absl::Time deadline) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  // Human-readable device description for logs and build info.
  virtual std::string device_description() const = 0;
  // Whether buffers of this backend are host memory that other threads may read and write directly
  // (the CPU backend); otherwise data moves only through CopyToHost / CopyToDevice.
  virtual bool host_memory() const { return false; }
  // Whether projections of the same input should run as one Linear over row-stacked weights (q|k|v,
  // gate|up): fewer, larger GEMMs, each input converted once. The CUDA backend's choice.
  virtual bool PrefersFusedProjections() const { return false; }
  // The device queue every op is enqueued on (a cudaStream_t on CUDA, on device
  // `device_ordinal()`), for device-side transports (NCCL) that order their own work after the
  // backend's; nullptr and -1 on the CPU.
  virtual void* native_stream() { return nullptr; }
  virtual int device_ordinal() const { return -1; }

  // A mark after the work enqueued so far on this thread's stream of ops (Backend::WorkMark), so
  // that another thread can wait for that work alone, however much is enqueued after it meanwhile
  // (a KV transfer waiting for one layer's cache writes while the next layers, or the next step,
  // compute). Null where every op is complete when it returns (the CPU).
  virtual std::shared_ptr<WorkMark> Mark() { return nullptr; }

  // Waits for enqueued work and returns the first failure of any of it (a kernel launch, a library
  // call); OK when none. Sticky: a failed backend stays failed. Ops themselves return nothing.
  virtual absl::Status CheckErrors() { return absl::OkStatus(); }

  // --- Graphs (CUDA) ---
  // Work enqueued between BeginCapture() and EndCapture() is recorded instead of run; Replay() runs
  // it again with the same pointers, shapes and scalar arguments (the data behind the pointers may
  // change). Allocation is not allowed while capturing: run the same work once before. A backend
  // drops its graphs when memory they use may have moved (its scratch grew): Replay() then returns
  // NOT_FOUND and the caller captures again. UNIMPLEMENTED where graphs do not exist (the CPU).
  virtual bool SupportsGraphs() const { return false; }
  virtual bool capturing() const { return false; }
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError("graphs need a CUDA backend");
  }
  virtual absl::StatusOr<int64_t> EndCapture() {
    return absl::UnimplementedError("graphs need a CUDA backend");
  }
  virtual absl::Status Replay(int64_t /*graph*/) {
    return absl::UnimplementedError("graphs need a CUDA backend");
  }
  virtual void DropGraphs() {}

  // Per-op device timing (GPU backends; TANDEM_CUDA_OP_PROFILE=1 turns it on at creation): while
  // on, every op enqueued outside a graph capture is timed; the report is a table of what was timed
  // since the last report, the most time first ("" when off or unsupported).
  virtual void SetOpProfiling(bool /*on*/) {}
  virtual std::string OpProfileReport() { return ""; }

  // --- Memory ---
  // Free and total memory of the device (all processes' use counted). UNIMPLEMENTED where the
  // backend computes in host memory (CPU), whose KV cache is sized by --kv-cache-memory instead.
  virtual absl::StatusOr<DeviceMemory> Memory() {
    return absl::UnimplementedError("this backend does not report device memory");
  }
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) = 0;
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Waits for enqueued work, then copies.
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Pieces of `bytes` bytes at src + index[i] * bytes (this backend's memory) to host_out, one
  // after another: a KV layer's blocks. With `after_enqueued_work`, after the ops enqueued before
  // the call; without, the caller has waited for what it reads (a WorkMark). Thread-safe. A GPU
  // backend gathers them on the device, off its stream of ops, and waits once; this default copies
  // piece by piece.
  virtual void GatherToHost(const std::byte* src, const std::vector<int32_t>& index, size_t bytes,
                            void* host_out, bool after_enqueued_work) {
    (void)after_enqueued_work;  // CopyToHost waits for enqueued work anyway
    for (size_t i = 0; i < index.size(); ++i) {
      CopyToHost(static_cast<std::byte*>(host_out) + i * bytes,
                 src + static_cast<size_t>(index[i]) * bytes, bytes);
    }
  }
  // The reverse: dst + index[i] * bytes = host_in's i-th piece, done when it returns. Not ordered
  // after the enqueued ops: for memory none of them uses (KV blocks reserved between steps).
  virtual void ScatterFromHost(std::byte* dst, const std::vector<int32_t>& index, size_t bytes,
                               const void* host_in) {
    for (size_t i = 0; i < index.size(); ++i) {
      CopyToDevice(dst + static_cast<size_t>(index[i]) * bytes,
                   static_cast<const std::byte*>(host_in) + i * bytes, bytes);
    }
  }
  // Makes a checkpoint tensor usable by ops. 1-D tensors (norms, biases) become f32 vectors;
  // 2-D tensors keep their dtype (the CPU backend maps them without copying).
  virtual absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& tensor) = 0;
  // The type UploadWeight keeps a 2-D tensor of `checkpoint` type in: a backend may cast 16-bit
  // weights to the other 16-bit type (CudaBackend::Options::compute_dtype).
  virtual DType StoredWeightDType(DType checkpoint) const { return checkpoint; }

  // --- Ops (f32 activations) ---
  // out[n][cols] = table[ids[i]]; ids are device int32 and must be in range (validated above).
  virtual void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) = 0;
  // out[n][d] = x / sqrt(mean(x^2) + eps) * weight; out may alias x.
  virtual void RmsNorm(const float* x, const DeviceWeight& weight, float eps, int64_t n, int64_t d,
                       float* out) = 0;
  // out[n][w.rows] = x[n][w.cols] · w^T (+ bias[w.rows]).
  virtual void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
                      float* out) = 0;
  // Rotates q[n][num_q_heads][head_dim] and k[n][num_kv_heads][head_dim] in place, rotate-half
  // (Hugging Face) convention; inv_freq[head_dim/2] already includes any rope scaling.
  virtual void Rope(float* q, float* k, const int32_t* positions, const float* inv_freq, int64_t n,
                    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim) = 0;
  // Writes k,v [n][kv_heads][head_dim] into the layer's cache at metadata.slot_mapping (a negative
  // slot: not written, a padding token), rounded to geometry.dtype, then
  // out[n][num_q_heads][head_dim] = causal softmax(q k^T · scale) v over each sequence's blocks.
  // k_cache, v_cache: the whole caches (every layer) in geometry.dtype.
  virtual void PagedAttention(const float* q, const float* k, const float* v, void* k_cache,
                              void* v_cache, const KvCacheGeometry& geometry, int64_t layer,
                              const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                              float* out) = 0;
  // Attention after a fused q|k|v projection. qkv [n][(num_q_heads + 2 kv_heads) head_dim] holds a
  // token's q heads, k heads and v heads; q, k, v are scratch [n][heads][head_dim]. Splits the rows
  // (CopyColumns; a single token's are used in place), normalises every q and k head when the norms
  // are given (RmsNorm over head_dim: Qwen3), rotates q and k (Rope at metadata.positions), then
  // runs PagedAttention. Afterwards qkv, q, k and v hold unspecified values. A backend may do
  // everything before the attention in one pass that writes the cache, with the same results. With
  // `w`, the projection comes first: qkv = Linear(x [n][w.cols], w, bias), or with `norm`
  // RmsNormLinear (h [n][w.cols] and scratch as it takes them); a backend may fuse the two. One eps
  // serves that norm and the q/k norms (the models' single rms_norm_eps).
  struct QkvAttentionInput {
    const float* x = nullptr;
    const DeviceWeight* w = nullptr;
    const DeviceWeight* bias = nullptr;
    const DeviceWeight* norm = nullptr;
    float* h = nullptr;
    float* scratch = nullptr;
    float* qkv = nullptr;
    const DeviceWeight* q_norm = nullptr;  // [head_dim] each, or both null
    const DeviceWeight* k_norm = nullptr;
    float eps = 0.f;
    const float* inv_freq = nullptr;  // [head_dim / 2], rope scaling included
    float* q = nullptr;
    float* k = nullptr;
    float* v = nullptr;
  };
  virtual void QkvAttention(const QkvAttentionInput& in, void* k_cache, void* v_cache,
                            const KvCacheGeometry& geometry, int64_t layer,
                            const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                            float* out) {
    const int64_t n = metadata.num_tokens, hd = geometry.head_dim, qs = num_q_heads * hd,
                  kvs = geometry.num_kv_heads * hd;
    ProjectQkv(in, n);
    float *q = in.qkv, *k = in.qkv + qs, *v = in.qkv + qs + kvs;
    if (n != 1) {
      q = in.q;
      k = in.k;
      v = in.v;
      CopyColumns(in.qkv, n, qs + 2 * kvs, 0, qs, q);
      CopyColumns(in.qkv, n, qs + 2 * kvs, qs, kvs, k);
      CopyColumns(in.qkv, n, qs + 2 * kvs, qs + kvs, kvs, v);
    }
    if (in.q_norm != nullptr) {
      RmsNorm(q, *in.q_norm, in.eps, n * num_q_heads, hd, q);
      RmsNorm(k, *in.k_norm, in.eps, n * geometry.num_kv_heads, hd, k);
    }
    Rope(q, k, metadata.positions, in.inv_freq, n, num_q_heads, geometry.num_kv_heads, hd);
    PagedAttention(q, k, v, k_cache, v_cache, geometry, layer, metadata, num_q_heads, scale, out);
  }
  // QkvAttention's projection, when its input has one.
  void ProjectQkv(const QkvAttentionInput& in, int64_t n) {
    if (in.w == nullptr) return;
    if (in.norm != nullptr) {
      RmsNormLinear(in.x, n, *in.norm, in.eps, *in.w, in.bias, /*silu_mul=*/false, in.h, in.scratch,
                    in.qkv);
    } else {
      Linear(in.x, n, *in.w, in.bias, in.qkv);
    }
  }
  // out[n][d] = silu(gate[n][d]) * up[n][d].
  virtual void SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) = 0;
  // x[n] += y[n].
  virtual void Add(float* x, const float* y, int64_t n) = 0;
  // x[n][d] += y[n][d], then out[n][d] = RmsNorm(x) (the residual add and the next norm in one
  // pass, bit-identical to Add then RmsNorm; out may alias y).
  virtual void AddRmsNorm(float* x, const float* y, const DeviceWeight& weight, float eps,
                          int64_t n, int64_t d, float* out) {
    Add(x, y, n * d);
    RmsNorm(x, weight, eps, n, d, out);
  }
  // Gathers rows: out[m][d] = x[rows[i]][d] (rows is a device int32 array).
  virtual void GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d,
                          float* out) = 0;
  // out[n][cols] = columns [offset, offset + cols) of x[n][stride].
  virtual void CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset, int64_t cols,
                           float* out) = 0;
  // out[n][d] = silu(x[n][j]) * x[n][d + j] for j < d: SiluMul over packed gate|up rows.
  virtual void SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) = 0;
  // out[n][d] = silu(x · gate^T) * (x · up^T) for gate_up = [gate; up], rows [2d][k] (a fused
  // projection): Linear into scratch [n][2d] then SiluMulPacked, the same results; a backend may
  // apply the activation as the product is written, without the scratch.
  virtual void LinearSiluMul(const float* x, int64_t n, const DeviceWeight& gate_up, float* scratch,
                             float* out) {
    Linear(x, n, gate_up, nullptr, scratch);
    SiluMulPacked(scratch, n, gate_up.rows / 2, out);
  }
  // --- Norms and residual adds inside the projections: the model uses the two ops below, in place
  // of AddRmsNorm and the separate norms, where FusesNormsIntoLinear(n, w) says the backend fuses
  // them for n rows over weights like w. The results are the same either way.
  virtual bool FusesNormsIntoLinear(int64_t /*n*/, const DeviceWeight& /*w*/) const {
    return false;
  }
  // out = Linear(RmsNorm(x[n][w.cols], norm, eps), w, bias), or with silu_mul LinearSiluMul of it
  // (w = [gate; up], no bias: out [n][w.rows / 2]). h [n][w.cols] and scratch [n][w.rows] are
  // scratch.
  virtual void RmsNormLinear(const float* x, int64_t n, const DeviceWeight& norm, float eps,
                             const DeviceWeight& w, const DeviceWeight* bias, bool silu_mul,
                             float* h, float* scratch, float* out) {
    RmsNorm(x, norm, eps, n, w.cols, h);
    if (silu_mul) {
      LinearSiluMul(h, n, w, scratch, out);
    } else {
      Linear(h, n, w, bias, out);
    }
  }
  // x[n][w.rows] += in[n][w.cols] · w^T: a projection and its residual add (Linear into scratch
  // [n][w.rows], then Add).
  virtual void LinearResidual(const float* in, int64_t n, const DeviceWeight& w, float* scratch,
                              float* x) {
    Linear(in, n, w, nullptr, scratch);
    Add(x, scratch, n * w.rows);
  }
  // out[i] = the lowest index of the largest value of row x[i][d]; NaN never wins; 0 when nothing
  // beats -inf (common/base/argmax.h: greedy decoding's choice). out is a device int32 array [n].
  virtual void ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) = 0;

  // --- Sampling where the logits are (SupportsSampling(): CUDA; elsewhere rows go to the host) ---
  // The three ops below serve SequenceSampler's DeviceSamplingPlan; all arrays are device arrays.
  virtual bool SupportsSampling() const { return false; }
  // Top-k candidates: ids[i][0..k) and values[i][0..k) = row i's k largest values of x[n][d],
  // largest first, the lower id first among equal values, NaN counted as -inf: the sampler's
  // SelectTopK, whose result SequenceSampler::SampleFromTopK finishes exactly. `row_k` [n]
  // (nullable): rows whose entry is 0 are skipped (their outputs left as they were).
  virtual void TopKRows(const float* /*x*/, int64_t /*n*/, int64_t /*d*/, int32_t /*k*/,
                        const int32_t* /*row_k*/, int32_t* /*ids*/, float* /*values*/) {}
  // logits[e.row][e.token] = ApplyLogitEdit(that logit, e) for every e of edits[count] (at most one
  // edit per row and token): a step's logits processors, bit-identical to the host sampler's.
  virtual void ApplyLogitEdits(float* /*logits*/, int64_t /*d*/, const LogitEdit* /*edits*/,
                               int64_t /*count*/) {}
  // Per row i of logits[n][d], as draws[i] says (RowDraw): kTotal → totals[i] = RowWeightTotal's
  // sum; kDraw → tokens[i] = DrawFromRow's token; kNone → nothing. Equal to the host definitions
  // (in common/sampling/sampler.h) up to the rounding of exp and of the order of the sums.
  virtual void SampleRows(const float* /*logits*/, int64_t /*n*/, int64_t /*d*/,
                          const RowDraw* /*draws*/, int32_t* /*tokens*/, double* /*totals*/) {}
  // Log-probabilities where the logits are, as common/sampling's ComputeLogprobs gives them to
  // rounding (log-softmax with the normaliser summed in double): for row i of logits[n][d],
  // token_out[i] = tokens[i], or the row's argmax (ArgmaxRows' choice) when tokens[i] is -1;
  // logprob[i] and rank[i] (1-based, equal logits rank the lower id first) of that token; and the
  // top_k most likely ids and logprobs, most likely first, top_ids/top_logprobs[n][top_k]. Rows
  // whose token is -2 are skipped. Device arrays. Only where SupportsLogprobs() (CUDA); elsewhere
  // the caller computes them from host logits.
  virtual bool SupportsLogprobs() const { return false; }
  virtual void Logprobs(const float* /*logits*/, int64_t /*n*/, int64_t /*d*/,
                        const int32_t* /*tokens*/, int32_t /*top_k*/, int32_t* /*token_out*/,
                        float* /*logprob*/, int32_t* /*rank*/, int32_t* /*top_ids*/,
                        float* /*top_logprobs*/) {}
};

}  // namespace tandem
