#include "common/model/llama_model.h"

#include <algorithm>

#include <cmath>
#include <numbers>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Scratch buffer slots used by Forward.
enum Slot : size_t {
  kIds, kMeta, kX, kH, kQ, kK, kV, kAttn, kGate, kUp, kRows, kLogitIn, kLogits, kArgmax, kNumSlots
};

}  // namespace

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
    if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
      const RopeScaling& s = c.rope_scaling;
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = old_len / s.low_freq_factor;
      const double high_freq_wavelen = old_len / s.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

LlamaModel::~LlamaModel() = default;

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                             Backend* backend) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->backend_ = backend;
  ASSIGN_OR_RETURN(m->config_, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(m->checkpoint_, Checkpoint::Open(model_dir));
  RETURN_IF_ERROR(m->LoadWeights());
  const std::vector<float> inv = RopeInverseFrequencies(m->config_);
  ASSIGN_OR_RETURN(m->inv_freq_, backend->Allocate(inv.size() * sizeof(float)));
  backend->CopyToDevice(m->inv_freq_->data(), inv.data(), inv.size() * sizeof(float));
  m->scratch_.resize(kNumSlots);
  return m;
}

absl::Status LlamaModel::LoadWeights() {
  const ModelConfig& c = config_;
  std::set<std::string> used;
  auto load = [&](const std::string& name, std::vector<int64_t> shape,
                  DeviceWeight* out) -> absl::Status {
    ASSIGN_OR_RETURN(const TensorView* t, checkpoint_->Get(name));
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor ", name, " has shape ",
                                                     ShapeString(t->shape), ", expected ",
                                                     ShapeString(shape), " from config.json"));
    }
    used.insert(name);
    ASSIGN_OR_RETURN(*out, backend_->UploadWeight(*t));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, &embed_));
  RETURN_IF_ERROR(load("model.norm.weight", {c.hidden_size}, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
    // Some tied checkpoints store the shared matrix twice; accept it when the shape matches.
    if (checkpoint_->tensors().contains("lm_head.weight")) {
      DeviceWeight ignored;
      RETURN_IF_ERROR(load("lm_head.weight", {c.vocab_size, c.hidden_size}, &ignored));
    }
  } else {
    RETURN_IF_ERROR(load("lm_head.weight", {c.vocab_size, c.hidden_size}, &lm_head_));
  }
  layers_.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights& w = layers_[l];
    RETURN_IF_ERROR(load(p + "input_layernorm.weight", {c.hidden_size}, &w.input_norm));
    RETURN_IF_ERROR(load(p + "post_attention_layernorm.weight", {c.hidden_size}, &w.post_norm));
    RETURN_IF_ERROR(load(p + "self_attn.q_proj.weight", {c.q_size(), c.hidden_size}, &w.q));
    RETURN_IF_ERROR(load(p + "self_attn.k_proj.weight", {c.kv_size(), c.hidden_size}, &w.k));
    RETURN_IF_ERROR(load(p + "self_attn.v_proj.weight", {c.kv_size(), c.hidden_size}, &w.v));
    RETURN_IF_ERROR(load(p + "self_attn.o_proj.weight", {c.hidden_size, c.q_size()}, &w.o));
    if (c.attention_bias) {
      RETURN_IF_ERROR(load(p + "self_attn.q_proj.bias", {c.q_size()}, &w.q_bias));
      RETURN_IF_ERROR(load(p + "self_attn.k_proj.bias", {c.kv_size()}, &w.k_bias));
      RETURN_IF_ERROR(load(p + "self_attn.v_proj.bias", {c.kv_size()}, &w.v_bias));
    }
    if (c.qk_norm) {
      RETURN_IF_ERROR(load(p + "self_attn.q_norm.weight", {c.head_dim}, &w.q_norm));
      RETURN_IF_ERROR(load(p + "self_attn.k_norm.weight", {c.head_dim}, &w.k_norm));
    }
    RETURN_IF_ERROR(load(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, &w.gate));
    RETURN_IF_ERROR(load(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, &w.up));
    RETURN_IF_ERROR(load(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, &w.down));
  }
  for (const auto& [name, t] : checkpoint_->tensors()) {
    if (used.contains(name)) continue;
    // Older checkpoints store the RoPE table; it is recomputed from the config.
    if (name.ends_with(".self_attn.rotary_emb.inv_freq")) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        t->file, ": unexpected tensor ", name, " (not part of a ", c.architecture,
        " with this config.json; is the checkpoint for a different model?)"));
  }
  return absl::OkStatus();
}

KvCacheGeometry LlamaModel::KvGeometry(int64_t num_blocks, int64_t block_size) const {
  KvCacheGeometry g;
  g.num_layers = config_.num_hidden_layers;
  g.num_blocks = num_blocks;
  g.block_size = block_size;
  g.num_kv_heads = config_.num_key_value_heads;
  g.head_dim = config_.head_dim;
  return g;
}

absl::Status LlamaModel::Validate(const ForwardInput& in, const KvCacheStorage& kv) const {
  const KvCacheGeometry& g = kv.geometry();
  if (g.num_layers != config_.num_hidden_layers || g.num_kv_heads != config_.num_key_value_heads ||
      g.head_dim != config_.head_dim) {
    return absl::InvalidArgumentError("KV cache geometry does not match the model");
  }
  if (in.token_ids.empty()) return absl::InvalidArgumentError("forward step with no tokens");
  for (size_t i = 0; i < in.token_ids.size(); ++i) {
    if (in.token_ids[i] < 0 || in.token_ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", in.token_ids[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  int64_t total = 0;
  for (size_t s = 0; s < in.seqs.size(); ++s) {
    const SequenceStep& seq = in.seqs[s];
    if (seq.num_new_tokens <= 0 || seq.num_cached_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": bad token counts"));
    }
    const int64_t context = seq.num_cached_tokens + seq.num_new_tokens;
    if (context > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": ", context, " tokens exceed max_position_embeddings (",
          config_.max_position_embeddings, ")"));
    }
    if (static_cast<int64_t>(seq.block_table.size()) * g.block_size < context) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table of ",
                                                     seq.block_table.size(), " blocks cannot hold ",
                                                     context, " tokens"));
    }
    for (int32_t b : seq.block_table) {
      if (b < 0 || b >= g.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block id ", b, " outside the pool of ", g.num_blocks));
      }
    }
    total += seq.num_new_tokens;
  }
  if (total != static_cast<int64_t>(in.token_ids.size())) {
    return absl::InvalidArgumentError("sequence token counts do not add up to the batch size");
  }
  for (int32_t r : in.logits_rows) {
    if (r < 0 || r >= total) return absl::InvalidArgumentError("logits row outside the batch");
  }
  if (!in.argmax_only.empty() && in.argmax_only.size() != in.logits_rows.size()) {
    return absl::InvalidArgumentError("argmax_only needs one flag per logits row");
  }
  return absl::OkStatus();
}

float* LlamaModel::Scratch(size_t index, size_t elements) {
  auto& buf = scratch_[index];
  const size_t bytes = std::max<size_t>(elements, 1) * sizeof(float);
  if (!buf || buf->size() < bytes) {
    auto fresh = backend_->Allocate(bytes + bytes / 4);
    if (!fresh.ok()) return nullptr;
    buf = std::move(fresh).value();
  }
  return buf->f32();
}

absl::Status LlamaModel::Forward(const ForwardInput& in, KvCacheStorage* kv, std::vector<float>* logits,
                                 std::vector<int32_t>* argmax) {
  RETURN_IF_ERROR(Validate(in, *kv));
  const ModelConfig& c = config_;
  const KvCacheGeometry& g = kv->geometry();
  const int64_t n = static_cast<int64_t>(in.token_ids.size());
  const int64_t num_seqs = static_cast<int64_t>(in.seqs.size());
  const int64_t m = static_cast<int64_t>(in.logits_rows.size());

  // Host-side metadata, packed into one int32 upload:
  // seq_indptr[S+1] positions[n] context_lens[S] block_indptr[S+1] block_indices[B] slot_mapping[n]
  std::vector<int32_t> meta;
  std::vector<int32_t> seq_indptr{0}, positions, context_lens, block_indptr{0}, blocks, slots;
  int64_t max_context = 0;
  for (const SequenceStep& s : in.seqs) {
    seq_indptr.push_back(seq_indptr.back() + static_cast<int32_t>(s.num_new_tokens));
    const int64_t context = s.num_cached_tokens + s.num_new_tokens;
    context_lens.push_back(static_cast<int32_t>(context));
    max_context = std::max(max_context, context);
    for (int64_t i = 0; i < s.num_new_tokens; ++i) {
      const int64_t pos = s.num_cached_tokens + i;
      positions.push_back(static_cast<int32_t>(pos));
      slots.push_back(static_cast<int32_t>(s.block_table[pos / g.block_size] * g.block_size +
                                           pos % g.block_size));
    }
    blocks.insert(blocks.end(), s.block_table.begin(), s.block_table.end());
    block_indptr.push_back(static_cast<int32_t>(blocks.size()));
  }
  size_t off_positions, off_context, off_block_indptr, off_blocks, off_slots, off_rows;
  meta.insert(meta.end(), seq_indptr.begin(), seq_indptr.end());
  off_positions = meta.size();
  meta.insert(meta.end(), positions.begin(), positions.end());
  off_context = meta.size();
  meta.insert(meta.end(), context_lens.begin(), context_lens.end());
  off_block_indptr = meta.size();
  meta.insert(meta.end(), block_indptr.begin(), block_indptr.end());
  off_blocks = meta.size();
  meta.insert(meta.end(), blocks.begin(), blocks.end());
  off_slots = meta.size();
  meta.insert(meta.end(), slots.begin(), slots.end());
  off_rows = meta.size();
  meta.insert(meta.end(), in.logits_rows.begin(), in.logits_rows.end());

  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  const int64_t inter = c.intermediate_size;
  auto* ids = reinterpret_cast<int32_t*>(Scratch(kIds, n));
  auto* md_dev = reinterpret_cast<int32_t*>(Scratch(kMeta, meta.size()));
  float* x = Scratch(kX, n * hidden);
  float* h = Scratch(kH, n * hidden);
  float* q = Scratch(kQ, n * qs);
  float* k = Scratch(kK, n * kvs);
  float* v = Scratch(kV, n * kvs);
  float* attn = Scratch(kAttn, n * qs);
  float* gate = Scratch(kGate, n * inter);
  float* up = Scratch(kUp, n * inter);
  float* rows = Scratch(kRows, std::max<int64_t>(m, 1) * hidden);
  float* logit_in = Scratch(kLogitIn, std::max<int64_t>(m, 1) * hidden);
  float* logits_dev = Scratch(kLogits, std::max<int64_t>(m, 1) * c.vocab_size);
  if (!ids || !md_dev || !x || !h || !q || !k || !v || !attn || !gate || !up || !rows ||
      !logit_in || !logits_dev) {
    return absl::ResourceExhaustedError("cannot allocate activation memory for the forward pass");
  }
  backend_->CopyToDevice(ids, in.token_ids.data(), n * sizeof(int32_t));
  backend_->CopyToDevice(md_dev, meta.data(), meta.size() * sizeof(int32_t));

  AttentionMetadata md;
  md.num_seqs = num_seqs;
  md.num_tokens = n;
  md.max_context_len = max_context;
  md.seq_indptr = md_dev;
  md.positions = md_dev + off_positions;
  md.context_lens = md_dev + off_context;
  md.block_indptr = md_dev + off_block_indptr;
  md.block_indices = md_dev + off_blocks;
  md.slot_mapping = md_dev + off_slots;

  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  Backend* b = backend_;
  b->Embedding(embed_, ids, n, x);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = layers_[l];
    b->RmsNorm(x, w.input_norm, eps, n, hidden, h);
    b->Linear(h, n, w.q, c.attention_bias ? &w.q_bias : nullptr, q);
    b->Linear(h, n, w.k, c.attention_bias ? &w.k_bias : nullptr, k);
    b->Linear(h, n, w.v, c.attention_bias ? &w.v_bias : nullptr, v);
    if (c.qk_norm) {
      b->RmsNorm(q, w.q_norm, eps, n * c.num_attention_heads, c.head_dim, q);
      b->RmsNorm(k, w.k_norm, eps, n * c.num_key_value_heads, c.head_dim, k);
    }
    b->Rope(q, k, md.positions, inv_freq_->f32(), n, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim);
    b->PagedAttention(q, k, v, kv->k(), kv->v(), g, l, md, c.num_attention_heads, scale, attn);
    if (in.on_layer_done) in.on_layer_done(l);
    b->Linear(attn, n, w.o, nullptr, h);
    b->Add(x, h, n * hidden);
    b->RmsNorm(x, w.post_norm, eps, n, hidden, h);
    b->Linear(h, n, w.gate, nullptr, gate);
    b->Linear(h, n, w.up, nullptr, up);
    b->SiluMul(gate, up, n, inter, gate);
    b->Linear(gate, n, w.down, nullptr, h);
    b->Add(x, h, n * hidden);
  }
  // Rows flagged argmax-only come back as one id each; the logits are copied only when some row
  // needs them (then all of them: one copy).
  const bool want_argmax = argmax != nullptr && !in.argmax_only.empty();
  const bool want_logits =
      !want_argmax || std::any_of(in.argmax_only.begin(), in.argmax_only.end(), [](uint8_t a) { return a == 0; });
  logits->assign(want_logits ? static_cast<size_t>(m * c.vocab_size) : 0, 0.f);
  if (argmax != nullptr) argmax->assign(want_argmax ? static_cast<size_t>(m) : 0, -1);
  if (m == 0) return b->CheckErrors();
  b->GatherRows(x, md_dev + off_rows, m, hidden, rows);
  b->RmsNorm(rows, final_norm_, eps, m, hidden, logit_in);
  b->Linear(logit_in, m, lm_head_, nullptr, logits_dev);
  if (want_argmax) {
    auto* ids_dev = reinterpret_cast<int32_t*>(Scratch(kArgmax, m));
    if (ids_dev == nullptr) return absl::ResourceExhaustedError("cannot allocate the argmax buffer");
    b->ArgmaxRows(logits_dev, m, c.vocab_size, ids_dev);
    b->CopyToHost(argmax->data(), ids_dev, static_cast<size_t>(m) * sizeof(int32_t));
  }
  if (want_logits) b->CopyToHost(logits->data(), logits_dev, logits->size() * sizeof(float));
  return b->CheckErrors();
}

}  // namespace tandem
