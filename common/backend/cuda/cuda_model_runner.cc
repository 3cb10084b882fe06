#include "common/backend/cuda/cuda_model_runner.h"

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
  const int64_t n = buf.md.num_tokens, m = buf.num_rows, hidden = c.hidden_size;
  const float eps = c.rms_norm_eps;
  float *x = buf.x, *h = buf.h, *attn = buf.attn, *gate = buf.gate;
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
      QkvAttentionInput in = StackedQkvInput(w, buf, norms_in_linear ? x : h);
      if (norms_in_linear) {
        in.norm = &w.input_norm;
        in.h = h;
        in.scratch = buf.gate_up;
      }
      b->QkvAttention(in, kv->k_data(), kv->v_data(), kv->geometry(), l, buf.md, c.num_q_heads,
                      attention_scale(), attn);
    } else {
      SeparateQkvAttention(w, buf, kv, l);
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
      SeparateGateUp(w, buf);
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
