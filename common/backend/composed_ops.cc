#include "common/backend/composed_ops.h"

namespace tandem {

void AttendProjectedQkv(Backend& b, const QkvAttentionInput& in, void* k_cache, void* v_cache,
                        const KvCacheGeometry& g, int64_t layer, const AttentionMetadata& md,
                        int64_t num_q_heads, float scale, float* out) {
  const int64_t n = md.num_tokens, hd = g.head_dim, qs = num_q_heads * hd,
                kvs = g.num_kv_heads * hd;
  float *q = in.qkv, *k = in.qkv + qs, *v = in.qkv + qs + kvs;
  if (n != 1) {
    q = in.q;
    k = in.k;
    v = in.v;
    b.CopyColumns(in.qkv, n, qs + 2 * kvs, 0, qs, q);
    b.CopyColumns(in.qkv, n, qs + 2 * kvs, qs, kvs, k);
    b.CopyColumns(in.qkv, n, qs + 2 * kvs, qs + kvs, kvs, v);
  }
  if (in.q_norm != nullptr) {
    b.RmsNorm(q, *in.q_norm, in.eps, n * num_q_heads, hd, q);
    b.RmsNorm(k, *in.k_norm, in.eps, n * g.num_kv_heads, hd, k);
  }
  b.Rope(q, k, md.positions, in.inv_freq, n, num_q_heads, g.num_kv_heads, hd);
  b.PagedAttention(q, k, v, k_cache, v_cache, g, layer, md, num_q_heads, scale, out);
}

void ComposedQkvAttention(Backend& b, const QkvAttentionInput& in, void* k_cache, void* v_cache,
                          const KvCacheGeometry& g, int64_t layer, const AttentionMetadata& md,
                          int64_t num_q_heads, float scale, float* out) {
  if (in.w != nullptr) {
    if (in.norm != nullptr) {
      ComposedRmsNormLinear(b, in.x, md.num_tokens, *in.norm, in.eps, *in.w, in.bias,
                            /*silu_mul=*/false, in.h, in.scratch, in.qkv);
    } else {
      b.Linear(in.x, md.num_tokens, *in.w, in.bias, in.qkv);
    }
  }
  AttendProjectedQkv(b, in, k_cache, v_cache, g, layer, md, num_q_heads, scale, out);
}

void ComposedLinearSiluMul(Backend& b, const float* x, int64_t n, const DeviceWeight& gate_up,
                           float* scratch, float* out) {
  b.Linear(x, n, gate_up, nullptr, scratch);
  b.SiluMulPacked(scratch, n, gate_up.rows / 2, out);
}

void ComposedRmsNormLinear(Backend& b, const float* x, int64_t n, const DeviceWeight& norm,
                           float eps, const DeviceWeight& w, const DeviceWeight* bias,
                           bool silu_mul, float* h, float* scratch, float* out) {
  b.RmsNorm(x, norm, eps, n, w.cols, h);
  if (silu_mul) {
    ComposedLinearSiluMul(b, h, n, w, scratch, out);
  } else {
    b.Linear(h, n, w, bias, out);
  }
}

void ComposedLinearResidual(Backend& b, const float* in, int64_t n, const DeviceWeight& w,
                            float* scratch, float* x) {
  b.Linear(in, n, w, nullptr, scratch);
  b.Add(x, scratch, n * w.rows);
}

void ComposedAddRmsNorm(Backend& b, float* x, const float* y, const DeviceWeight& weight, float eps,
                        int64_t n, int64_t d, float* out) {
  b.Add(x, y, n * d);
  b.RmsNorm(x, weight, eps, n, d, out);
}

}  // namespace tandem
