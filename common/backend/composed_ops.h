// The fused operations a transformer layer is made of, written as compositions of the Backend's
// core ops: what every fused kernel must equal (bit for bit where the fusion says so), what the
// generic model runner runs (model_runner.h), and what a backend's fusion falls back to where its
// kernel does not cover a shape. The fused kernels themselves belong to their backend (cuda/), and
// only its runner calls them.
#pragma once

#include <cstdint>

#include "common/backend/backend.h"

namespace tandem {

// Attention after a q|k|v projection. qkv [n][(num_q_heads + 2 kv_heads) head_dim] holds a token's
// q heads, k heads and v heads; q, k, v are scratch [n][heads][head_dim]. With `w`, the projection
// comes first: qkv = Linear(x [n][w.cols], w, bias), or with `norm` RmsNormLinear (h [n][w.cols]
// and scratch as it takes them). One eps serves that norm and the q/k norms (the models' single
// rms_norm_eps). Afterwards qkv, q, k and v hold unspecified values.
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

// Everything after the projection: splits the rows of in.qkv (CopyColumns; a single token's are
// used in place), normalises every q and k head when the norms are given (RmsNorm over head_dim:
// Qwen3), rotates q and k (Rope at metadata.positions), then runs PagedAttention (writing the
// cache) into out [n][num_q_heads][head_dim].
void AttendProjectedQkv(Backend& b, const QkvAttentionInput& in, void* k_cache, void* v_cache,
                        const KvCacheGeometry& geometry, int64_t layer,
                        const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                        float* out);
// The projection of `in` into in.qkv (nothing when in.w is null), then AttendProjectedQkv.
void ComposedQkvAttention(Backend& b, const QkvAttentionInput& in, void* k_cache, void* v_cache,
                          const KvCacheGeometry& geometry, int64_t layer,
                          const AttentionMetadata& metadata, int64_t num_q_heads, float scale,
                          float* out);
// out[n][d] = silu(x · gate^T) * (x · up^T) for gate_up = [gate; up], rows [2d][k]: Linear into
// scratch [n][2d], then SiluMulPacked.
void ComposedLinearSiluMul(Backend& b, const float* x, int64_t n, const DeviceWeight& gate_up,
                           float* scratch, float* out);
// out = Linear(RmsNorm(x[n][w.cols], norm, eps), w, bias), or with silu_mul
// ComposedLinearSiluMul of it (w = [gate; up], no bias: out [n][w.rows / 2]). h [n][w.cols] and
// scratch [n][w.rows] are scratch.
void ComposedRmsNormLinear(Backend& b, const float* x, int64_t n, const DeviceWeight& norm,
                           float eps, const DeviceWeight& w, const DeviceWeight* bias,
                           bool silu_mul, float* h, float* scratch, float* out);
// x[n][w.rows] += in[n][w.cols] · w^T: Linear into scratch [n][w.rows], then Add.
void ComposedLinearResidual(Backend& b, const float* in, int64_t n, const DeviceWeight& w,
                            float* scratch, float* x);
// x[n][d] += y[n][d], then out[n][d] = RmsNorm(x); out may alias y.
void ComposedAddRmsNorm(Backend& b, float* x, const float* y, const DeviceWeight& weight, float eps,
                        int64_t n, int64_t d, float* out);

}  // namespace tandem
