// The CUDA backend's ops (Backend's compute interface): each binds the device, records its
// profiling scope and enqueues its kernels or cuBLAS GEMMs on the backend's stream; failures become
// the sticky error CheckErrors reports. What the backend owns (memory, weights, copies, graphs) is
// in cuda_backend.cc. A GEMM whose input the op before it wrote already rounded to the GEMM's
// 16-bit type takes that copy instead of converting again (RoundOutput).
#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/cuda/gemv.h"
#include "common/backend/cuda/kernels.h"
#include "common/backend/cuda/paged_attention.h"
#include "common/backend/cuda/quant_gemv.h"
#include "common/backend/cuda/sampling.h"

namespace tandem {

namespace {
// Ops begun on this thread, by any CUDA backend (Bind), so that a rounded output is taken only by
// the op right after its producer.
thread_local uint64_t ops_begun = 0;

// A weight UploadQuantizedWeight kept as codes, as the quantized kernels take it.
cuda::QuantWeight QuantWeightOf(const DeviceWeight& w) {
  return cuda::MakeQuantWeight(w.quant, w.rows, w.cols, w.group_size, w.data, w.scales, w.zeros,
                               w.perm);
}

// The 16-bit GEMV's fusion as the quantized GEMV takes it (the bias stays its own argument).
cuda::QuantGemvFusion QuantFusionOf(const cuda::GemvEpilogue& epilogue,
                                    const cuda::GemvPrologue& prologue) {
  cuda::QuantGemvFusion f;
  f.norm = prologue.norm;
  f.eps = prologue.eps;
  f.accumulate = epilogue.accumulate;
  f.silu_mul = epilogue.silu_mul;
  f.heads = epilogue.heads;
  f.head_counters = epilogue.heads != nullptr ? epilogue.head_counters : nullptr;
  return f;
}

}  // namespace

void CudaBackend::Bind() {
  ++ops_begun;
  // The current device is per host thread, and the engine loop is not the thread that created us.
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_)
    Check(cudaSetDevice(device_), "cudaSetDevice");
}

void CudaBackend::Embedding(const DeviceWeight& table, const int32_t* ids, int64_t n, float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "embedding", 0, stream_);
  Check(cuda::LaunchEmbedding(table.dtype, table.data, table.cols, ids, n, out, stream_),
        "embedding");
}

void CudaBackend::RmsNorm(const float* x, const DeviceWeight& weight, float eps, int64_t n,
                          int64_t d, float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "rms_norm", 0, stream_);
  Check(cuda::LaunchRmsNorm(x, static_cast<const float*>(weight.data), eps, n, d, out, stream_,
                            RoundOutput(out, n, d)),
        "rms norm");
}

void CudaBackend::AddRmsNorm(float* x, const float* y, const DeviceWeight& weight, float eps,
                             int64_t n, int64_t d, float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "add_rms_norm", 0, stream_);
  Check(cuda::LaunchAddRmsNorm(x, y, static_cast<const float*>(weight.data), eps, n, d, out,
                               stream_, RoundOutput(out, n, d)),
        "add + rms norm");
}

void CudaBackend::Gemm(const float* x, int64_t n, const DeviceWeight& w, float* out) {
  // Row-major out[n][rows] = x[n][cols] · W^T is column-major out^T = W^T(op T of W's column-major
  // [cols][rows] view) · x^T (x's column-major [cols][n] view).
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols), nn = static_cast<int>(n);
  const float alpha = 1.f, beta = 0.f;
  if (w.dtype == DType::kF32) {
    Check(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha,
                      static_cast<const float*>(w.data), k, x, k, &beta, out, m),
          "cublasSgemm");
    return;
  }
  void* xh = Scratch(kHalfInput, static_cast<size_t>(n) * k * 2);
  if (!xh) return;
  const RoundedOutput& r = rounded_;
  const bool rounded = r.data == xh && r.of == x && r.count == n * k && r.dtype == w.dtype &&
                       r.thread == std::this_thread::get_id() && r.op + 1 == ops_begun;
  if (!rounded)
    Check(cuda::LaunchConvertF32(w.dtype, x, n * k, xh, stream_), "converting GEMM input");
  const cudaDataType type = w.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  // Split inputs (the part of x that rounding to `type` lost, through the same weights, added to
  // the result), few rows (memory-bound): hi and lo as the 2n columns of one GEMM, so the weights
  // are read once, then the two halves of its output summed.
  if (split_gemm_inputs_ && n <= kSplitPairRows &&
      2 * n * m * static_cast<int64_t>(sizeof(float)) <= kSplitPairOutputBytes) {
    auto* pair =
        static_cast<std::byte*>(Scratch(kHalfInputLow, static_cast<size_t>(2 * n) * k * 2));
    auto* both =
        static_cast<float*>(Scratch(kSplitOutput, static_cast<size_t>(2 * n) * m * sizeof(float)));
    if (!pair || !both) return;
    Check(cudaMemcpyAsync(pair, xh, static_cast<size_t>(n) * k * 2, cudaMemcpyDeviceToDevice,
                          stream_),
          "splitting GEMM input");
    Check(cuda::LaunchConvertF32Remainder(w.dtype, x, n * k, xh,
                                          pair + static_cast<size_t>(n) * k * 2, stream_),
          "splitting GEMM input");
    Check(
        cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, 2 * nn, k, &alpha, w.data, type, k, pair,
                     type, k, &beta, both, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (split input)");
    Check(cudaMemcpyAsync(out, both, static_cast<size_t>(n) * m * sizeof(float),
                          cudaMemcpyDeviceToDevice, stream_),
          "split GEMM output");
    Check(cuda::LaunchAdd(out, both + n * m, n * m, stream_), "split GEMM output");
    return;
  }
  Check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, type, k, xh, type,
                     k, &beta, out, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  if (!split_gemm_inputs_) return;
  // Split inputs, many rows (compute-bound): a second GEMM over lo accumulating into the first's
  // output.
  void* lo = Scratch(kHalfInputLow, static_cast<size_t>(n) * k * 2);
  if (!lo) return;
  Check(cuda::LaunchConvertF32Remainder(w.dtype, x, n * k, xh, lo, stream_),
        "splitting GEMM input");
  const float one = 1.f;
  Check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, type, k, lo, type,
                     k, &one, out, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (low term)");
}

cuda::RoundedCopy CudaBackend::RoundOutput(const float* out, int64_t n, int64_t d) {
  rounded_ = {};
  if (!tunings_.fusion || batch_invariant_ || n <= cuda::kGemvMaxRows ||
      gemm_dtype_ == DType::kF32 || gemm_dtype_mixed_) {
    return {};
  }
  void* data = Scratch(kHalfInput, static_cast<size_t>(n * d) * 2, /*optional=*/true);
  if (data == nullptr) return {};
  rounded_ = {out, n * d, data, gemm_dtype_, std::this_thread::get_id(), ops_begun};
  return {data, gemm_dtype_};
}

void CudaBackend::QuantizedLinear(const float* x, int64_t n, const DeviceWeight& w,
                                  const DeviceWeight* bias, float* out) {
  const int64_t m = w.rows, k = w.cols;
  const cuda::QuantWeight q = QuantWeightOf(w);
  const bool gemv = n <= cuda::kGemvMaxRows && !batch_invariant_;
  // More rows (or batch invariance): the weight dequantized to 16 bits, then the GEMM path (timed
  // as its own op).
  DeviceWeight dense;
  {
    cuda::OpScope op(profiler_.get(), capturing_,
                     profiler_ ? absl::StrCat(gemv ? "quantized gemv " : "dequantize ", m, "x", k,
                                              n > 1 ? " (batched)" : "")
                               : "",
                     w.bytes(), stream_);
    if (w.perm != nullptr) {  // act-order: the input in the codes' column order
      auto* xp =
          static_cast<float*>(Scratch(kPermutedInput, static_cast<size_t>(n * k) * sizeof(float)));
      if (xp == nullptr) return;
      Check(cuda::LaunchGatherColumns(x, n, k, w.perm, xp, stream_), "act-order gather");
      x = xp;
    }
    if (gemv) {
      // A decode step: the codes read once, dequantized in registers, f32 activations.
      Check(cuda::LaunchQuantGemv(x, n, q,
                                  bias != nullptr ? static_cast<const float*>(bias->data) : nullptr,
                                  out, stream_),
            "quantized gemv");
      return;
    }
    dense.dtype = DequantizedWeightDType();
    dense.rows = m;
    dense.cols = k;
    dense.data = Scratch(kDequantizedWeight, static_cast<size_t>(m * k) * 2);
    if (dense.data == nullptr) return;
    Check(cuda::LaunchDequantize(q, dense.dtype, const_cast<void*>(dense.data), stream_),
          "dequantizing a weight");
  }
  Linear(x, n, dense, bias, out);
}

void CudaBackend::Linear(const float* x, int64_t n, const DeviceWeight& w, const DeviceWeight* bias,
                         float* out) {
  Bind();
  if (n == 0) return;
  if (w.quant != QuantType::kNone) return QuantizedLinear(x, n, w, bias, out);
  const int64_t m = w.rows, k = w.cols;
  const bool gemv = !batch_invariant_ && cuda::GemvCovers(n, w.dtype, k, x, w.data);
  cuda::OpScope op(
      profiler_.get(), capturing_,
      profiler_ ? absl::StrCat(gemv ? "gemv " : "gemm ", m, "x", k, n > 1 ? " (batched)" : "") : "",
      m * k * static_cast<int64_t>(DTypeSize(w.dtype)), stream_);
  if (gemv) {
    // A decode step's few rows: one pass over the weights at memory bandwidth, f32 activations, the
    // bias added as each column is written.
    cuda::GemvEpilogue epilogue;
    if (tunings_.fusion && bias != nullptr) epilogue.bias = static_cast<const float*>(bias->data);
    Check(cuda::LaunchGemv(x, n, w.dtype, w.data, m, k, out, stream_, tunings_.gemv_columns,
                           epilogue),
          "gemv");
    if (epilogue.bias != nullptr) return;
  } else if (!batch_invariant_) {
    Gemm(x, n, w, out);
  } else {
    // Same-shaped GEMMs only: full chunks in place, the last one through zero-padded scratch.
    constexpr int64_t c = kInvariantRows;
    for (int64_t r0 = 0; r0 < n; r0 += c) {
      const int64_t rows = std::min(c, n - r0);
      if (rows == c) {
        Gemm(x + r0 * k, c, w, out + r0 * m);
        continue;
      }
      auto* xp = static_cast<float*>(Scratch(kPaddedInput, c * k * sizeof(float)));
      auto* op = static_cast<float*>(Scratch(kPaddedOutput, c * m * sizeof(float)));
      if (!xp || !op) return;
      Check(cudaMemsetAsync(xp, 0, c * k * sizeof(float), stream_), "padding GEMM input");
      Check(cudaMemcpyAsync(xp, x + r0 * k, rows * k * sizeof(float), cudaMemcpyDeviceToDevice,
                            stream_),
            "padding GEMM input");
      Gemm(xp, c, w, op);
      Check(cudaMemcpyAsync(out + r0 * m, op, rows * m * sizeof(float), cudaMemcpyDeviceToDevice,
                            stream_),
            "GEMM output");
    }
  }
  if (bias)
    Check(cuda::LaunchAddBias(out, static_cast<const float*>(bias->data), n, m, stream_), "bias");
}

void CudaBackend::Rope(float* q, float* k, const int32_t* positions, const float* inv_freq,
                       int64_t n, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "rope", 0, stream_);
  Check(
      cuda::LaunchRope(q, k, positions, inv_freq, n, num_q_heads, num_kv_heads, head_dim, stream_),
      "rope");
}

cuda::PagedAttentionArgs CudaBackend::AttentionArgs(const float* q, const float* k, const float* v,
                                                    void* k_cache, void* v_cache,
                                                    const KvCacheGeometry& g, int64_t layer,
                                                    const AttentionMetadata& md,
                                                    int64_t num_q_heads, float scale, float* out) {
  cuda::PagedLayer pl;
  pl.k_cache = static_cast<std::byte*>(k_cache) + layer * g.bytes_per_layer();
  pl.v_cache = static_cast<std::byte*>(v_cache) + layer * g.bytes_per_layer();
  pl.dtype = g.dtype;
  pl.block_size = g.block_size;
  pl.num_kv_heads = g.num_kv_heads;
  pl.head_dim = g.head_dim;
  cuda::PagedAttentionArgs a;
  a.layer = pl;
  a.q = q;
  a.k = k;
  a.v = v;
  a.slot_mapping = md.slot_mapping;
  a.num_tokens = md.num_tokens;
  a.num_seqs = md.num_seqs;
  a.num_q_heads = num_q_heads;
  a.scale = scale;
  a.seq_indptr = md.seq_indptr;
  a.positions = md.positions;
  a.context_lens = md.context_lens;
  a.block_indptr = md.block_indptr;
  a.block_indices = md.block_indices;
  a.out = out;
  a.max_context_len = md.max_context_len;
  return a;
}

void CudaBackend::PagedAttention(const float* q, const float* k, const float* v, void* k_cache,
                                 void* v_cache, const KvCacheGeometry& g, int64_t layer,
                                 const AttentionMetadata& md, int64_t num_q_heads, float scale,
                                 float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "attention", 0, stream_);
  Attend(AttentionArgs(q, k, v, k_cache, v_cache, g, layer, md, num_q_heads, scale, out));
}

void CudaBackend::Attend(cuda::PagedAttentionArgs a) {
  a.rounded = RoundOutput(a.out, a.num_tokens, a.num_q_heads * a.layer.head_dim);
  a.allow_tiled = !batch_invariant_;
  a.tensor_core_prefill = tunings_.tensor_core_attention;
  a.grid_split_keys = batch_invariant_ ? 0 : tunings_.grid_split_keys;
  // Split partials when a small batch spreads long contexts over blocks of their own. The workspace
  // is optional: without it (over 64 MiB, out of memory, or not allocated before a capture) the
  // splits merge in-block, with the same bits. A captured launch is split for the context its graph
  // serves (the metadata's max_context_len).
  if (const int64_t floats = cuda::SplitAttentionWorkspaceFloats(a);
      floats > 0 && floats <= (int64_t{16} << 20)) {
    a.workspace =
        static_cast<float*>(Scratch(kAttentionPartials, static_cast<size_t>(floats) * sizeof(float),
                                    /*optional=*/true));
    a.workspace_floats = a.workspace != nullptr ? floats : 0;
  }
  Check(cuda::LaunchPagedAttention(a, stream_), "paged attention");
}

void CudaBackend::QkvAttention(const QkvAttentionInput& in, void* k_cache, void* v_cache,
                               const KvCacheGeometry& g, int64_t layer, const AttentionMetadata& md,
                               int64_t num_q_heads, float scale, float* out) {
  // (An int8 row's scale needs the whole row: the attention's own write takes it.)
  if (!tunings_.fusion || g.head_dim % 2 != 0 || g.head_dim > cuda::kMaxPrologueHeadDim ||
      g.dtype == DType::kI8) {
    ProjectQkv(in, md.num_tokens);
    AttendProjectedQkv(*this, in, k_cache, v_cache, g, layer, md, num_q_heads, scale, out);
    return;
  }
  cuda::PagedAttentionArgs a = AttentionArgs(in.q, nullptr, nullptr, k_cache, v_cache, g, layer, md,
                                             num_q_heads, scale, out);
  {
    cuda::QkvPrologueArgs p;
    p.layer = a.layer;
    p.qkv = in.qkv;
    p.num_tokens = md.num_tokens;
    p.num_q_heads = num_q_heads;
    p.q_norm = in.q_norm != nullptr ? static_cast<const float*>(in.q_norm->data) : nullptr;
    p.k_norm = in.k_norm != nullptr ? static_cast<const float*>(in.k_norm->data) : nullptr;
    p.eps = in.eps;
    p.positions = md.positions;
    p.inv_freq = in.inv_freq;
    p.slot_mapping = md.slot_mapping;
    p.q_out = in.q;
    // The projection's GEMV may run the prologue on each head as it completes; else the prologue
    // kernel follows the projection. (No Bind() before the projection: a GEMM there may take the
    // rounded copy of its input that the op before wrote.)
    if (in.w == nullptr || !ProjectQkvWithPrologue(in, p)) {
      ProjectQkv(in, md.num_tokens);
      Bind();
      cuda::OpScope op(profiler_.get(), capturing_, "qkv prologue", 0, stream_);
      Check(cuda::LaunchQkvPrologue(p, stream_), "q|k|v prologue");
    }
  }
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "attention", 0, stream_);
  a.kv_written = true;
  Attend(a);
}

void CudaBackend::ProjectQkv(const QkvAttentionInput& in, int64_t n) {
  if (in.w == nullptr) return;
  if (in.norm != nullptr) {
    RmsNormLinear(in.x, n, *in.norm, in.eps, *in.w, in.bias, /*silu_mul=*/false, in.h, in.scratch,
                  in.qkv);
  } else {
    Linear(in.x, n, *in.w, in.bias, in.qkv);
  }
}

bool CudaBackend::ProjectQkvWithPrologue(const QkvAttentionInput& in,
                                         const cuda::QkvPrologueArgs& p) {
  const DeviceWeight& w = *in.w;
  const int64_t n = p.num_tokens;
  cuda::GemvEpilogue epilogue;
  epilogue.bias = in.bias != nullptr ? static_cast<const float*>(in.bias->data) : nullptr;
  epilogue.heads = &p;
  epilogue.head_counters = head_counters_;
  cuda::GemvPrologue prologue;
  if (in.norm != nullptr) {
    prologue.norm = static_cast<const float*>(in.norm->data);
    prologue.eps = in.eps;
  }
  // The cache: of the 16-bit weights' type or FP8 (quantized weights: any but int8's).
  const bool cache_taken = w.quant != QuantType::kNone
                               ? p.layer.dtype != DType::kI8
                               : p.layer.dtype == w.dtype || p.layer.dtype == DType::kF8E4M3;
  if (!tunings_.fusion || !tunings_.gemv_heads || batch_invariant_ || !cache_taken ||
      p.num_q_heads + 2 * p.layer.num_kv_heads > kHeadCounters ||
      !FusedGemvRuns(in.x, n, w, epilogue, prologue, in.norm != nullptr ? in.norm->cols : 0)) {
    return false;
  }
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_,
                   profiler_ ? absl::StrCat(w.quant != QuantType::kNone ? "quantized " : "",
                                            in.norm != nullptr ? "norm+" : "", "gemv+qkv prologue ",
                                            w.rows, "x", w.cols, n > 1 ? " (batched)" : "")
                             : "",
                   w.bytes(), stream_);
  Check(LaunchFusedGemv(in.x, n, w, in.qkv, epilogue, prologue), "gemv (q|k|v prologue)");
  return true;
}

void CudaBackend::LinearSiluMul(const float* x, int64_t n, const DeviceWeight& gate_up,
                                float* scratch, float* out) {
  const int64_t k = gate_up.cols;
  cuda::GemvEpilogue epilogue;
  epilogue.silu_mul = true;
  if (!tunings_.fusion || batch_invariant_ || !FusedGemvRuns(x, n, gate_up, epilogue, {}, 0)) {
    ComposedLinearSiluMul(*this, x, n, gate_up, scratch, out);
    return;
  }
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_,
                   profiler_
                       ? absl::StrCat(gate_up.quant != QuantType::kNone ? "quantized " : "",
                                      "gemv+silu ", gate_up.rows, "x", k, n > 1 ? " (batched)" : "")
                       : "",
                   gate_up.bytes(), stream_);
  Check(LaunchFusedGemv(x, n, gate_up, out, epilogue, {}), "gemv (silu-mul)");
}

bool CudaBackend::FusedGemvRuns(const float* x, int64_t n, const DeviceWeight& w,
                                const cuda::GemvEpilogue& epilogue,
                                const cuda::GemvPrologue& prologue, int64_t norm_cols) const {
  if ((prologue.norm != nullptr || epilogue.accumulate) &&
      (!FusesNormsIntoLinear(n, w) || (prologue.norm != nullptr && norm_cols != w.cols))) {
    return false;
  }
  if (w.quant != QuantType::kNone) {
    // The quantized GEMV's rules (act-order inputs are gathered by QuantizedLinear alone).
    return tunings_.fusion && !batch_invariant_ && w.perm == nullptr &&
           cuda::QuantGemvTakes(n, QuantWeightOf(w), x, epilogue.bias,
                                QuantFusionOf(epilogue, prologue));
  }
  return cuda::GemvCovers(n, w.dtype, w.cols, x, w.data) &&
         cuda::GemvTakes(epilogue, prologue, tunings_.gemv_columns);
}

bool CudaBackend::FusesNormsIntoLinear(int64_t n, const DeviceWeight& w) const {
  if (!tunings_.fusion || !tunings_.gemv_norm || batch_invariant_ || tunings_.gemv_columns != 1 ||
      n < 1 || n > cuda::kGemvMaxRows) {
    return false;
  }
  if (w.quant != QuantType::kNone) {
    return w.perm == nullptr && cuda::QuantLayoutCovered(w.quant, w.cols, w.group_size);
  }
  return (w.dtype == DType::kBF16 || w.dtype == DType::kF16) && w.cols % 8 == 0;
}

cudaError_t CudaBackend::LaunchFusedGemv(const float* x, int64_t n, const DeviceWeight& w,
                                         float* out, const cuda::GemvEpilogue& epilogue,
                                         const cuda::GemvPrologue& prologue) {
  if (w.quant != QuantType::kNone) {
    return cuda::LaunchQuantGemv(x, n, QuantWeightOf(w), epilogue.bias, out, stream_, 0,
                                 QuantFusionOf(epilogue, prologue));
  }
  return cuda::LaunchGemv(x, n, w.dtype, w.data, epilogue.silu_mul ? w.rows / 2 : w.rows, w.cols,
                          out, stream_, tunings_.gemv_columns, epilogue, prologue);
}

void CudaBackend::RmsNormLinear(const float* x, int64_t n, const DeviceWeight& norm, float eps,
                                const DeviceWeight& w, const DeviceWeight* bias, bool silu_mul,
                                float* h, float* scratch, float* out) {
  cuda::GemvEpilogue epilogue;
  epilogue.silu_mul = silu_mul;
  epilogue.bias = bias != nullptr ? static_cast<const float*>(bias->data) : nullptr;
  cuda::GemvPrologue prologue;
  prologue.norm = static_cast<const float*>(norm.data);
  prologue.eps = eps;
  if (!FusedGemvRuns(x, n, w, epilogue, prologue, norm.cols)) {
    // ComposedRmsNormLinear, with this backend's LinearSiluMul.
    RmsNorm(x, norm, eps, n, w.cols, h);
    if (silu_mul) {
      LinearSiluMul(h, n, w, scratch, out);
    } else {
      Linear(h, n, w, bias, out);
    }
    return;
  }
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_,
                   profiler_ ? absl::StrCat(w.quant != QuantType::kNone ? "quantized " : "",
                                            "norm+gemv", silu_mul ? "+silu " : " ", w.rows, "x",
                                            w.cols, n > 1 ? " (batched)" : "")
                             : "",
                   w.bytes(), stream_);
  Check(LaunchFusedGemv(x, n, w, out, epilogue, prologue), "gemv (norm prologue)");
}

void CudaBackend::LinearResidual(const float* in, int64_t n, const DeviceWeight& w, float* scratch,
                                 float* x) {
  cuda::GemvEpilogue epilogue;
  epilogue.accumulate = true;
  if (!FusedGemvRuns(in, n, w, epilogue, {}, 0)) {
    ComposedLinearResidual(*this, in, n, w, scratch, x);
    return;
  }
  Bind();
  cuda::OpScope op(
      profiler_.get(), capturing_,
      profiler_ ? absl::StrCat(w.quant != QuantType::kNone ? "quantized " : "", "gemv+residual ",
                               w.rows, "x", w.cols, n > 1 ? " (batched)" : "")
                : "",
      w.bytes(), stream_);
  Check(LaunchFusedGemv(in, n, w, x, epilogue, {}), "gemv (residual)");
}

void CudaBackend::SiluMul(const float* gate, const float* up, int64_t n, int64_t d, float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "silu_mul", 0, stream_);
  Check(cuda::LaunchSiluMul(gate, up, n * d, out, stream_), "silu-mul");
}

void CudaBackend::Add(float* x, const float* y, int64_t n) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "add", 0, stream_);
  Check(cuda::LaunchAdd(x, y, n, stream_), "add");
}

void CudaBackend::CopyColumns(const float* x, int64_t n, int64_t stride, int64_t offset,
                              int64_t cols, float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "copy_columns", 0, stream_);
  Check(cuda::LaunchCopyColumns(x, n, stride, offset, cols, out, stream_), "copy columns");
}

void CudaBackend::SiluMulPacked(const float* x, int64_t n, int64_t d, float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "silu_mul", 0, stream_);
  Check(cuda::LaunchSiluMulPacked(x, n, d, out, stream_, RoundOutput(out, n, d)),
        "silu-mul (packed)");
}

void CudaBackend::Logprobs(const float* logits, int64_t n, int64_t d, const int32_t* tokens,
                           int32_t top_k, int32_t* token_out, float* logprob, int32_t* rank,
                           int32_t* top_ids, float* top_logprobs) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "logprobs", 0, stream_);
  Check(cuda::LaunchLogprobs(logits, n, d, tokens, top_k, token_out, logprob, rank, top_ids,
                             top_logprobs, stream_),
        "logprobs");
}

void CudaBackend::ArgmaxRows(const float* x, int64_t n, int64_t d, int32_t* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "argmax", 0, stream_);
  Check(cuda::LaunchArgmaxRows(x, n, d, out, stream_), "argmax rows");
}

void CudaBackend::TopKRows(const float* x, int64_t n, int64_t d, int32_t k, const int32_t* row_k,
                           int32_t* ids, float* values) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "top_k", 0, stream_);
  Check(cuda::LaunchTopKRows(x, n, d, k, row_k, ids, values, stream_), "top-k rows");
}

void CudaBackend::ApplyLogitEdits(float* logits, int64_t d, const LogitEdit* edits, int64_t count) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "logit_edits", 0, stream_);
  Check(cuda::LaunchApplyLogitEdits(logits, d, edits, count, stream_), "logit edits");
}

void CudaBackend::SampleRows(const float* logits, int64_t n, int64_t d, const RowDraw* draws,
                             int32_t* tokens, double* totals) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "sample_rows", 0, stream_);
  Check(cuda::LaunchSampleRows(logits, n, d, draws, tokens, totals, stream_), "sample rows");
}

void CudaBackend::GatherRows(const float* x, const int32_t* rows, int64_t m, int64_t d,
                             float* out) {
  Bind();
  cuda::OpScope op(profiler_.get(), capturing_, "gather_rows", 0, stream_);
  Check(cuda::LaunchGatherRows(x, rows, m, d, out, stream_), "gather rows");
}

}  // namespace tandem
