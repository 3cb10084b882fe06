#include "common/backend/cuda/cuda_model_runner.h"

#include <cmath>

#include "common/backend/composed_ops.h"

namespace tandem {

std::unique_ptr<ModelRunner> CudaBackend::CreateModelRunner(TransformerWeights weights) {
  return std::make_unique<CudaModelRunner>(this, std::move(weights));
}

CudaModelRunner::CudaModelRunner(CudaBackend* backend, TransformerWeights weights)
    : ModelRunner(backend, std::move(weights)), cuda_(backend) {}

void CudaModelRunner::Enqueue(const StepBuffers& buf, KvCacheStorage* kv,
                              const std::function<void(int64_t)>& on_layer_done, bool argmax) {
  const TransformerShape& c = shape();
  const TransformerWeights& weights = this->weights();
  const KvCacheGeometry& g = kv->geometry();
  const int64_t n = buf.md.num_tokens, m = buf.num_rows;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  const AttentionMetadata& md = buf.md;
  float *x = buf.x, *h = buf.h, *q = buf.q, *k = buf.k, *v = buf.v, *attn = buf.attn,
        *gate = buf.gate, *up = buf.up;
  CudaBackend* b = cuda_;
  // Where the backend runs the norms and residual adds inside the projections (its GEMV's shapes),
  // h is scratch; elsewhere h = input_norm(x) at the top of each layer: the first layer's below,
  // the others' fused with the last residual add.
  const bool norms_in_linear =
      weights.stacked && c.num_layers > 0 && b->FusesNormsIntoLinear(n, weights.layers[0].qkv);
  b->Embedding(weights.embed, buf.ids, n, x);
  if (c.num_layers > 0 && !norms_in_linear)
    b->RmsNorm(x, weights.layers[0].input_norm, eps, n, hidden, h);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const TransformerLayerWeights& w = weights.layers[l];
    if (weights.stacked) {
      // One GEMM for q|k|v, whose rows the backend splits into heads on the way to attention.
      QkvAttentionInput in;
      in.w = &w.qkv;
      in.bias = c.attention_bias ? &w.qkv_bias : nullptr;
      if (norms_in_linear) {
        in.x = x;
        in.norm = &w.input_norm;
        in.h = h;
        in.scratch = buf.gate_up;
      } else {
        in.x = h;
      }
      in.qkv = buf.qkv;
      if (c.qk_norm) {
        in.q_norm = &w.q_norm;
        in.k_norm = &w.k_norm;
      }
      in.eps = eps;
      in.inv_freq = inv_freq();
      in.q = buf.q;
      in.k = buf.k;
      in.v = buf.v;
      b->QkvAttention(in, kv->k_data(), kv->v_data(), g, l, md, c.num_q_heads, scale, attn);
    } else {
      b->Linear(h, n, w.q, c.attention_bias ? &w.q_bias : nullptr, q);
      b->Linear(h, n, w.k, c.attention_bias ? &w.k_bias : nullptr, k);
      b->Linear(h, n, w.v, c.attention_bias ? &w.v_bias : nullptr, v);
      if (c.qk_norm) {
        b->RmsNorm(q, w.q_norm, eps, n * c.num_q_heads, c.head_dim, q);
        b->RmsNorm(k, w.k_norm, eps, n * c.num_kv_heads, c.head_dim, k);
      }
      b->Rope(q, k, md.positions, inv_freq(), n, c.num_q_heads, c.num_kv_heads, c.head_dim);
      b->PagedAttention(q, k, v, kv->k_data(), kv->v_data(), g, l, md, c.num_q_heads, scale, attn);
    }
    if (on_layer_done) on_layer_done(l);
    if (norms_in_linear) {
      b->LinearResidual(attn, n, w.o, h, x);
      b->RmsNormLinear(x, n, w.post_norm, eps, w.gate_up, nullptr, /*silu_mul=*/true, h,
                       buf.gate_up, gate);
      b->LinearResidual(gate, n, w.down, h, x);
      continue;
    }
    b->Linear(attn, n, w.o, nullptr, h);
    b->AddRmsNorm(x, h, w.post_norm, eps, n, hidden, h);
    if (weights.stacked) {
      b->LinearSiluMul(h, n, w.gate_up, buf.gate_up, gate);
    } else {
      b->Linear(h, n, w.gate, nullptr, gate);
      b->Linear(h, n, w.up, nullptr, up);
      b->SiluMul(gate, up, n, inter, gate);
    }
    b->Linear(gate, n, w.down, nullptr, h);
    if (l + 1 < c.num_layers) {
      b->AddRmsNorm(x, h, weights.layers[l + 1].input_norm, eps, n, hidden, h);
    } else {
      b->Add(x, h, n * hidden);
    }
  }
  if (m == 0) return;
  b->GatherRows(x, buf.out_rows, m, hidden, buf.rows);
  if (weights.stacked && b->FusesNormsIntoLinear(m, weights.lm_head)) {
    b->RmsNormLinear(buf.rows, m, weights.final_norm, eps, weights.lm_head, nullptr,
                     /*silu_mul=*/false, buf.logit_in, nullptr, buf.logits);
  } else {
    b->RmsNorm(buf.rows, weights.final_norm, eps, m, hidden, buf.logit_in);
    b->Linear(buf.logit_in, m, weights.lm_head, nullptr, buf.logits);
  }
  if (argmax) b->ArgmaxRows(buf.logits, m, c.vocab_size, buf.argmax);
}

}  // namespace tandem
