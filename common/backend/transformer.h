// The description of a decoder-only transformer that a model runner executes (model_runner.h):
// its shape and its weights on the device. A model family (common/model/) reads its checkpoint and
// config into this; the runners consume it and never see the family or the checkpoint. The layer
// it describes is the pre-norm Llama block: RMSNorm → attention (q, k, v projections with optional
// biases, optional per-head q/k RMSNorm, rotary embedding, grouped-query paged attention, o
// projection) → residual add → RMSNorm → SwiGLU MLP (silu(gate) · up → down) → residual add.
#pragma once

#include <cstdint>
#include <vector>

#include "common/backend/backend.h"

namespace tandem {

struct TransformerShape {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_positions = 0;  // longest context, in tokens
  float rms_norm_eps = 1e-6f;
  bool attention_bias = false;  // q/k/v projections carry a bias
  bool qk_norm = false;         // per-head RMSNorm on q and k before the rotation

  int64_t q_size() const { return num_q_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
};

// One layer's weights. With stacked projections (TransformerWeights::stacked) q|k|v and gate|up
// are one row-stacked matrix each (qkv [q + 2 kv][hidden], gate_up [2 inter][hidden]) and the
// separate ones are empty; otherwise the reverse. Biases and q/k norms are empty where the shape
// says there are none.
struct TransformerLayerWeights {
  DeviceWeight input_norm, post_norm;  // [hidden]
  DeviceWeight q, k, v, o;
  DeviceWeight q_bias, k_bias, v_bias;
  DeviceWeight q_norm, k_norm;  // [head_dim]
  DeviceWeight gate, up, down;
  DeviceWeight qkv, qkv_bias, gate_up;
};

struct TransformerWeights {
  TransformerShape shape;
  DeviceWeight embed;       // [vocab][hidden]
  DeviceWeight final_norm;  // [hidden]
  DeviceWeight lm_head;     // [vocab][hidden] (may share the embedding's storage)
  std::vector<TransformerLayerWeights> layers;
  // Rotary inverse frequencies [head_dim / 2] (f32), any scaling (Llama 3.1's) already applied.
  DeviceWeight rope_inv_freq;
  bool stacked = false;  // q|k|v and gate|up as one matrix each
};

}  // namespace tandem
