// The device boundary. Everything above this interface (model, engine, scheduler, KV bookkeeping)
// is device-independent; the CPU backend (cpu/) and the CUDA backend (cuda/) implement it: the
// device (device.h), the core ops below, a device sampler where it has one (device_sampler.h) and
// the model runner of a transformer description (model_runner.h, transformer.h).
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
#include "absl/types/span.h"
#include "common/backend/device.h"
#include "common/backend/device_sampler.h"
#include "common/quant/quantized_matrix.h"
#include "common/tensor/dtype.h"
#include "common/tensor/safetensors.h"

namespace tandem {

class ModelRunner;
struct TransformerWeights;

// A weight matrix [rows][cols] (PyTorch Linear layout [out_features][in_features]) or vector [cols]
// (rows == 1) in its checkpoint dtype, resident on the device: the descriptor Linear and the other
// ops take. A new storage format is new fields here, which each backend's upload fills and its
// Linear reads, not a new op.
// What the CPU backend rounds a Linear's activations to (`--activation-dtype`): f32 (exact, the
// default); BF16 for BF16 weights (AVX-512 BF16 dot products, cpu/bf16_kernels.h); int8 for
// quantized weights (VNNI, cpu/quant_a8_kernels.h). Other weights keep f32 activations.
enum class ActivationDType { kF32, kBF16, kInt8 };

struct DeviceWeight {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps converted or uploaded storage alive

  // Weight-only quantized (quant != kNone; UploadQuantizedWeight): data is the codes and the
  // fields below the rest of quantized_matrix.h's layout, all device pointers; dtype is unused.
  QuantType quant = QuantType::kNone;
  int64_t group_size = 0;
  const float* scales = nullptr;  // [rows][groups]
  const float* zeros = nullptr;   // [rows][groups], or null (all 0)
  const int32_t* perm = nullptr;  // [cols], or null (identity)
  // Bytes this weight holds on the device (codes, scales, zeros, perm; or rows × cols × dtype).
  int64_t bytes() const;
};

// Geometry of a paged KV cache. K and V each: [layers][num_blocks][block_size][kv_heads][head_dim].
struct KvCacheGeometry {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  // What the cache stores: F32, BF16/F16 (half the memory and the attention's reads; keys and
  // values are rounded to it when written, and read back as f32), or I8 (a quarter, plus scales):
  // each token's key (and value) of each head as int8 codes q = round(x / s), |q| ≤ 127, with one
  // f32 scale s = max|x| / 127 (Backend::SupportsKvCacheDType says which a backend keeps). An I8
  // block of one layer, of K or of V, is [block_size][kv_heads][head_dim] codes followed by
  // [block_size][kv_heads] scales, so a block is still one run of bytes to transfer.
  DType dtype = DType::kF32;

  int64_t elements_per_layer() const { return num_blocks * elements_per_block(); }
  int64_t elements_per_block() const { return block_size * num_kv_heads * head_dim; }
  int64_t bytes_per_element() const { return static_cast<int64_t>(DTypeSize(dtype)); }
  // The scales of one block of one layer (I8; 0 otherwise).
  int64_t scale_bytes_per_block() const {
    return dtype == DType::kI8 ? block_size * num_kv_heads * static_cast<int64_t>(sizeof(float))
                               : 0;
  }
  // One block of one layer, of K or of V.
  int64_t bytes_per_block() const {
    return elements_per_block() * bytes_per_element() + scale_bytes_per_block();
  }
  int64_t bytes_per_layer() const { return num_blocks * bytes_per_block(); }
  // Where `slot` (block · block_size + offset) keeps its [kv_heads][head_dim] elements, and (I8)
  // its [kv_heads] scales, in bytes from the start of a layer.
  int64_t slot_offset(int64_t slot) const {
    return (slot / block_size) * bytes_per_block() +
           (slot % block_size) * num_kv_heads * head_dim * bytes_per_element();
  }
  int64_t scale_offset(int64_t slot) const {
    return (slot / block_size) * bytes_per_block() + elements_per_block() +
           (slot % block_size) * num_kv_heads * static_cast<int64_t>(sizeof(float));
  }
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

// The device (device.h: memory, copies, marks, graphs, profiling), the weights uploaded to it, and
// the core ops a model runner composes a layer from. Sampling on the device is the sampler's
// (device_sampler.h); fused ops are a backend's own, run by its own runner (model_runner.h).
class Backend : public Device {
 public:
  // --- Weights ---
  // Makes a checkpoint tensor usable by ops. 1-D tensors (norms, biases) become f32 vectors;
  // 2-D tensors keep their dtype (the CPU backend maps them without copying).
  virtual absl::StatusOr<DeviceWeight> UploadWeight(const TensorView& tensor) = 0;
  // The type UploadWeight keeps a 2-D tensor of `checkpoint` type in: a backend may cast 16-bit
  // weights to the other 16-bit type (CudaBackend::Options::compute_dtype).
  virtual DType StoredWeightDType(DType checkpoint) const { return checkpoint; }
  // Whether its model runner wants the projections of one input as one row-stacked weight (q|k|v,
  // gate|up; TransformerWeights::stacked): fewer, larger GEMMs, each input converted once. The
  // CUDA backend's choice; a model asks before it uploads its weights.
  virtual bool PrefersStackedProjections() const { return false; }
  // Makes a weight-only quantized matrix usable by Linear. Backends whose Linear reads the codes
  // (the CPU's) keep them; the default dequantizes to DequantizedWeightDType and uploads that
  // (correct; no saving over 16-bit weights).
  virtual absl::StatusOr<DeviceWeight> UploadQuantizedWeight(
      std::shared_ptr<const QuantizedMatrix> matrix);
  // What the default UploadQuantizedWeight dequantizes to: f32, or a GPU's 16-bit compute type.
  virtual DType DequantizedWeightDType() const { return DType::kF32; }
  // Whether UploadQuantizedWeight keeps `type`'s codes (Linear dequantizes as it reads them).
  virtual bool ReadsQuantizedWeights(QuantType type) const { return false; }
  // Whether its PagedAttention keeps a KV cache of `dtype` (KvCacheGeometry::dtype): the float
  // types everywhere; I8 where the backend says so (the CPU's).
  virtual bool SupportsKvCacheDType(DType dtype) const { return IsFloat(dtype); }

  // --- Ops (f32 activations) ---
  // out[n][cols] = table[ids[i]]; ids are device int32 and must be in range (validated above).
  virtual void Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) = 0;
  // out[n][d] = x / sqrt(mean(x^2) + eps) * weight; out may alias x.
  virtual void RmsNorm(const float* x, const DeviceWeight& weight, float eps, int64_t n, int64_t d,
                       float* out) = 0;
  // out[n][w.rows] = x[n][w.cols] · w^T (+ bias[w.rows]).
  virtual void Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
                      float* out) = 0;
  // One input's projections (q, k, v; gate, up): each out[n][w->rows] = x[n][w->cols] · w^T
  // (+ bias), bit for bit what Linear gives it. By default Linear once each; a backend may read
  // them as one job (the CPU's batch 1: one pass of its threads over all their rows, and one end
  // of the op to wait for instead of one a weight).
  struct Projection {
    const DeviceWeight* w = nullptr;
    const DeviceWeight* bias = nullptr;  // null: none
    float* out = nullptr;
  };
  virtual void LinearEach(const float* x, int64_t n, absl::Span<const Projection> projections);
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
  // out[n][d] = silu(gate[n][d]) * up[n][d].
  virtual void SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) = 0;
  // x[n] += y[n].
  virtual void Add(float* x, const float* y, int64_t n) = 0;
  // Gathers rows: out[m][d] = x[rows[i]][d] (rows is a device int32 array).
  virtual void GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d,
                          float* out) = 0;
  // out[n][cols] = columns [offset, offset + cols) of x[n][stride].
  virtual void CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset, int64_t cols,
                           float* out) = 0;
  // out[n][d] = silu(x[n][j]) * x[n][d + j] for j < d: SiluMul over packed gate|up rows.
  virtual void SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) = 0;
  // out[i] = the lowest index of the largest value of row x[i][d]; NaN never wins; 0 when nothing
  // beats -inf (common/base/argmax.h: greedy decoding's choice). out is a device int32 array [n].
  virtual void ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) = 0;

  // --- Sampling where the logits are (device_sampler.h): null where rows go to the host ---
  virtual DeviceSampler* sampler() { return nullptr; }

  // --- The model runner (model_runner.h) ---
  // The runner of `weights` on this backend: the generic one (the core ops composed), or the
  // backend's own with its fused kernels. Defined in model_runner.cc.
  virtual std::unique_ptr<ModelRunner> CreateModelRunner(TransformerWeights weights);
};

}  // namespace tandem
