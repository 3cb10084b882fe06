#include "common/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/quant/rtn.h"

namespace tandem {
namespace {

// "", or how a backend that keeps no codes of `type` runs quantized weights.
std::string DequantizedNote(const Backend& backend, QuantType type) {
  if (backend.ReadsQuantizedWeights(type)) return "";
  return absl::StrCat("; the ", backend.name(), " backend runs them dequantized to ",
                      std::string(DTypeName(backend.DequantizedWeightDType())),
                      " (no memory saved over 16-bit weights)");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

TransformerShape TransformerShapeOf(const ModelConfig& c) {
  TransformerShape s;
  s.vocab_size = c.vocab_size;
  s.hidden_size = c.hidden_size;
  s.intermediate_size = c.intermediate_size;
  s.num_layers = c.num_hidden_layers;
  s.num_q_heads = c.num_attention_heads;
  s.num_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.max_positions = c.max_position_embeddings;
  s.rms_norm_eps = static_cast<float>(c.rms_norm_eps);
  s.attention_bias = c.attention_bias;
  s.qk_norm = c.qk_norm;
  return s;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                             Backend* backend,
                                                             const LlamaLoadOptions& options) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->backend_ = backend;
  m->quantization_ = options.quantization;
  m->quantize_lm_head_ = options.quantize_lm_head;
  ASSIGN_OR_RETURN(m->config_, LoadModelConfig(model_dir));
  if (options.quantization != QuantType::kNone &&
      m->config_.quantization.format != CheckpointFormat::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization ", std::string(QuantTypeName(options.quantization)), ": ",
                     model_dir, " is already quantized (",
                     std::string(CheckpointFormatName(m->config_.quantization.format)),
                     ", config.json quantization_config); it loads as stored without the flag"));
  }
  ASSIGN_OR_RETURN(m->checkpoint_, Checkpoint::Open(model_dir));
  TransformerWeights weights;
  RETURN_IF_ERROR(m->LoadWeights(
      options.stack_projections.value_or(backend->PrefersStackedProjections()), &weights));
  m->runner_ = backend->CreateModelRunner(std::move(weights));
  return m;
}

absl::Status LlamaModel::LoadWeights(bool stacked, TransformerWeights* out) {
  const ModelConfig& c = config_;
  TransformerWeights& tw = *out;
  tw.shape = TransformerShapeOf(c);
  std::set<std::string> used;
  // The checkpoint's tensor `name`, which must have `shape`; marked as used.
  auto get = [&](const std::string& name,
                 const std::vector<int64_t>& shape) -> absl::StatusOr<const TensorView*> {
    ASSIGN_OR_RETURN(const TensorView* t, checkpoint_->Get(name));
    if (!IsFloat(t->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          t->file, ": tensor ", name, " is ", std::string(DTypeName(t->dtype)),
          ", not a floating-point weight (a quantized checkpoint needs its quantization_config in "
          "config.json)"));
    }
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor ", name, " has shape ",
                                                     ShapeString(t->shape), ", expected ",
                                                     ShapeString(shape), " from config.json"));
    }
    used.insert(name);
    return t;
  };
  int64_t stored_bytes = 0, quantized_bytes = 0, num_quantized = 0, num_read = 0;
  const CheckpointQuantization& cq = c.quantization;
  auto load = [&](const std::string& name, std::vector<int64_t> shape,
                  DeviceWeight* out) -> absl::Status {
    ASSIGN_OR_RETURN(const TensorView* t, get(name, shape));
    ASSIGN_OR_RETURN(*out, backend_->UploadWeight(*t));
    weight_bytes_ += out->bytes();
    return absl::OkStatus();
  };
  // A host tensor the backend may map rather than copy: `bytes` stay alive with the weight.
  auto upload_owned = [&](const TensorView& t, std::shared_ptr<void> bytes,
                          DeviceWeight* out) -> absl::Status {
    ASSIGN_OR_RETURN(*out, backend_->UploadWeight(t));
    if (out->data == t.data) out->owner = std::move(bytes);  // a backend computing in host memory
    weight_bytes_ += out->bytes();
    return absl::OkStatus();
  };
  // A projection's weight: uploaded as stored, or quantized on load (--quantization).
  auto upload_linear = [&](const TensorView& t, std::shared_ptr<void> bytes,
                           DeviceWeight* out) -> absl::Status {
    if (quantization_ == QuantType::kNone) return upload_owned(t, std::move(bytes), out);
    const int64_t rows = t.shape[0], cols = t.shape[1];
    if (quantization_ == QuantType::kInt4 && cols % 32 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(t.file, ": cannot quantize ", t.name, " to int4: its ", cols,
                       " input features are not a multiple of 32 (use --quantization int8)"));
    }
    std::vector<float> f32(static_cast<size_t>(rows * cols));
    ConvertToF32(t.dtype, t.data, f32.data(), f32.size());
    auto matrix = std::make_shared<QuantizedMatrix>(
        QuantizeRtn(f32.data(), rows, cols, DefaultRtnOptions(quantization_)));
    stored_bytes += static_cast<int64_t>(t.nbytes);
    quantized_bytes += matrix->bytes();
    ++num_quantized;
    ASSIGN_OR_RETURN(*out, backend_->UploadQuantizedWeight(std::move(matrix)));
    weight_bytes_ += out->bytes();
    return absl::OkStatus();
  };
  // A Linear the checkpoint stores quantized (GPTQ, AWQ, compressed-tensors), read into Tandem's
  // layout with its tensors marked used; nullopt when it is stored as a plain `name` (.weight).
  auto read_quantized =
      [&](const std::string& name,
          const std::vector<int64_t>& shape) -> absl::StatusOr<std::optional<QuantizedMatrix>> {
    if (cq.format == CheckpointFormat::kNone || !name.ends_with(".weight")) return std::nullopt;
    const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
    const std::vector<std::string> names = QuantizedTensorNames(*checkpoint_, cq, prefix);
    if (names.empty()) return std::nullopt;
    ASSIGN_OR_RETURN(QuantizedMatrix m,
                     ReadQuantizedLinear(*checkpoint_, cq, prefix, shape[0], shape[1]));
    used.insert(names.begin(), names.end());
    ++num_read;
    return m;
  };
  auto upload_quantized = [&](QuantizedMatrix m, DeviceWeight* out) -> absl::Status {
    ASSIGN_OR_RETURN(
        *out, backend_->UploadQuantizedWeight(std::make_shared<QuantizedMatrix>(std::move(m))));
    weight_bytes_ += out->bytes();
    return absl::OkStatus();
  };
  auto load_linear = [&](const std::string& name, std::vector<int64_t> shape,
                         DeviceWeight* out) -> absl::Status {
    ASSIGN_OR_RETURN(std::optional<QuantizedMatrix> q, read_quantized(name, shape));
    if (q.has_value()) return upload_quantized(*std::move(q), out);
    if (quantization_ == QuantType::kNone) return load(name, std::move(shape), out);
    ASSIGN_OR_RETURN(const TensorView* t, get(name, shape));
    return upload_linear(*t, nullptr, out);
  };
  // Tensors stacked by rows into one weight; they share one dtype (checked below, before `stacked`
  // is relied on).
  auto load_stacked = [&](const std::vector<std::pair<std::string, std::vector<int64_t>>>& parts,
                          DeviceWeight* out) -> absl::Status {
    // Parts the checkpoint stores quantized stack in Tandem's layout.
    std::vector<QuantizedMatrix> quantized;
    for (const auto& [name, shape] : parts) {
      ASSIGN_OR_RETURN(std::optional<QuantizedMatrix> q, read_quantized(name, shape));
      if (q.has_value()) quantized.push_back(*std::move(q));
    }
    if (!quantized.empty()) {
      if (quantized.size() != parts.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            parts[0].first, ": stacked with projections some of which are quantized and some not"));
      }
      ASSIGN_OR_RETURN(QuantizedMatrix m, StackQuantizedRows(quantized, parts[0].first));
      return upload_quantized(std::move(m), out);
    }
    auto bytes = std::make_shared<std::vector<std::byte>>();
    TensorView stacked;
    for (const auto& [name, shape] : parts) {
      ASSIGN_OR_RETURN(const TensorView* t, get(name, shape));
      if (stacked.shape.empty()) {
        stacked.dtype = t->dtype;
        stacked.shape = shape;
        stacked.shape[0] = 0;
        stacked.file = t->file;
      }
      stacked.shape[0] += shape[0];
      absl::StrAppend(&stacked.name, stacked.name.empty() ? "" : "|", name);
      bytes->insert(bytes->end(), t->data, t->data + t->nbytes);
    }
    stacked.data = bytes->data();
    stacked.nbytes = bytes->size();
    return stacked.shape.size() == 2 ? upload_linear(stacked, bytes, out)
                                     : upload_owned(stacked, bytes, out);
  };
  RETURN_IF_ERROR(load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, &tw.embed));
  RETURN_IF_ERROR(load("model.norm.weight", {c.hidden_size}, &tw.final_norm));
  const bool quantize_head = quantize_lm_head_ && quantization_ != QuantType::kNone;
  if (c.tie_word_embeddings) {
    tw.lm_head = tw.embed;
    // Some tied checkpoints store the shared matrix twice; accept it when the shape matches.
    if (checkpoint_->tensors().contains("lm_head.weight")) {
      DeviceWeight ignored;
      RETURN_IF_ERROR(load("lm_head.weight", {c.vocab_size, c.hidden_size}, &ignored));
    }
    if (quantize_head) {
      ASSIGN_OR_RETURN(const TensorView* t,
                       get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
      RETURN_IF_ERROR(upload_linear(*t, nullptr, &tw.lm_head));
    }
  } else {
    // As stored: quantized when the checkpoint quantized it (GPTQModel's lm_head option), and by
    // --quantization only with quantize_lm_head.
    ASSIGN_OR_RETURN(std::optional<QuantizedMatrix> q,
                     read_quantized("lm_head.weight", {c.vocab_size, c.hidden_size}));
    if (q.has_value()) {
      RETURN_IF_ERROR(upload_quantized(*std::move(q), &tw.lm_head));
    } else if (quantize_head) {
      ASSIGN_OR_RETURN(const TensorView* t, get("lm_head.weight", {c.vocab_size, c.hidden_size}));
      RETURN_IF_ERROR(upload_linear(*t, nullptr, &tw.lm_head));
    } else {
      RETURN_IF_ERROR(load("lm_head.weight", {c.vocab_size, c.hidden_size}, &tw.lm_head));
    }
  }
  // Stacking needs one dtype per group; a checkpoint that mixes them keeps separate projections.
  auto same_dtype = [&](const std::vector<std::string>& names) {
    std::optional<DType> dtype;
    for (const std::string& name : names) {
      absl::StatusOr<const TensorView*> t = checkpoint_->Get(name);
      if (!t.ok()) return true;  // reported by the loads below
      if (dtype.has_value() && *dtype != (*t)->dtype) return false;
      dtype = (*t)->dtype;
    }
    return true;
  };
  for (int64_t l = 0; stacked && l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".self_attn.");
    const std::string m = absl::StrCat("model.layers.", l, ".mlp.");
    stacked = same_dtype({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"}) &&
              same_dtype({m + "gate_proj.weight", m + "up_proj.weight"}) &&
              (!c.attention_bias ||
               same_dtype({p + "q_proj.bias", p + "k_proj.bias", p + "v_proj.bias"}));
  }
  tw.stacked = stacked;
  tw.layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    TransformerLayerWeights& w = tw.layers[l];
    RETURN_IF_ERROR(load(p + "input_layernorm.weight", {c.hidden_size}, &w.input_norm));
    RETURN_IF_ERROR(load(p + "post_attention_layernorm.weight", {c.hidden_size}, &w.post_norm));
    if (stacked) {
      RETURN_IF_ERROR(load_stacked({{p + "self_attn.q_proj.weight", {c.q_size(), c.hidden_size}},
                                    {p + "self_attn.k_proj.weight", {c.kv_size(), c.hidden_size}},
                                    {p + "self_attn.v_proj.weight", {c.kv_size(), c.hidden_size}}},
                                   &w.qkv));
      if (c.attention_bias) {
        RETURN_IF_ERROR(load_stacked({{p + "self_attn.q_proj.bias", {c.q_size()}},
                                      {p + "self_attn.k_proj.bias", {c.kv_size()}},
                                      {p + "self_attn.v_proj.bias", {c.kv_size()}}},
                                     &w.qkv_bias));
      }
    } else {
      RETURN_IF_ERROR(
          load_linear(p + "self_attn.q_proj.weight", {c.q_size(), c.hidden_size}, &w.q));
      RETURN_IF_ERROR(
          load_linear(p + "self_attn.k_proj.weight", {c.kv_size(), c.hidden_size}, &w.k));
      RETURN_IF_ERROR(
          load_linear(p + "self_attn.v_proj.weight", {c.kv_size(), c.hidden_size}, &w.v));
      if (c.attention_bias) {
        RETURN_IF_ERROR(load(p + "self_attn.q_proj.bias", {c.q_size()}, &w.q_bias));
        RETURN_IF_ERROR(load(p + "self_attn.k_proj.bias", {c.kv_size()}, &w.k_bias));
        RETURN_IF_ERROR(load(p + "self_attn.v_proj.bias", {c.kv_size()}, &w.v_bias));
      }
    }
    RETURN_IF_ERROR(load_linear(p + "self_attn.o_proj.weight", {c.hidden_size, c.q_size()}, &w.o));
    if (c.qk_norm) {
      RETURN_IF_ERROR(load(p + "self_attn.q_norm.weight", {c.head_dim}, &w.q_norm));
      RETURN_IF_ERROR(load(p + "self_attn.k_norm.weight", {c.head_dim}, &w.k_norm));
    }
    if (stacked) {
      RETURN_IF_ERROR(
          load_stacked({{p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}},
                        {p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}}},
                       &w.gate_up));
    } else {
      RETURN_IF_ERROR(
          load_linear(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, &w.gate));
      RETURN_IF_ERROR(
          load_linear(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, &w.up));
    }
    RETURN_IF_ERROR(
        load_linear(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, &w.down));
  }
  if (num_read > 0) {
    TANDEM_LOG(INFO) << "read " << num_read << " Linear weights quantized as "
                     << CheckpointFormatName(cq.format) << " (" << cq.bits << "-bit, "
                     << (cq.group_size > 0 ? absl::StrCat("groups of ", cq.group_size)
                                           : std::string("per output channel"))
                     << ")"
                     << DequantizedNote(*backend_,
                                        cq.bits == 8 ? QuantType::kInt8 : QuantType::kInt4);
  }
  if (num_quantized > 0) {
    TANDEM_LOG(INFO) << "quantized " << num_quantized << " weights to "
                     << QuantTypeName(quantization_)
                     << " on load (round to nearest): " << stored_bytes << " bytes as stored -> "
                     << quantized_bytes << " bytes with scales and zeros; "
                     << (quantize_head ? "the LM head quantized too, embeddings and norms"
                                       : "embeddings, norms and lm_head")
                     << " as stored" << DequantizedNote(*backend_, quantization_);
  }
  // The rotary table, computed from the config.
  auto inv = std::make_shared<std::vector<float>>(RopeInverseFrequencies(c));
  TensorView rope;
  rope.name = "rope_inv_freq";
  rope.dtype = DType::kF32;
  rope.shape = {static_cast<int64_t>(inv->size())};
  rope.data = reinterpret_cast<const std::byte*>(inv->data());
  rope.nbytes = inv->size() * sizeof(float);
  RETURN_IF_ERROR(upload_owned(rope, inv, &tw.rope_inv_freq));
  for (const auto& [name, t] : checkpoint_->tensors()) {
    if (used.contains(name)) continue;
    // Older checkpoints store the RoPE table; it is recomputed from the config.
    if (name.ends_with(".self_attn.rotary_emb.inv_freq")) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(t->file, ": unexpected tensor ", name, " (not part of a ", c.architecture,
                     " with this config.json; is the checkpoint for a different model?)"));
  }
  return absl::OkStatus();
}

DType LlamaModel::KvCacheDType(std::optional<DType> requested) const {
  if (requested.has_value()) return *requested;
  const DType w = backend_->StoredWeightDType(config_.torch_dtype);
  return backend_->name() == "cuda" && w != DType::kF32 ? w : DType::kF32;
}

KvCacheGeometry LlamaModel::KvGeometry(int64_t num_blocks, int64_t block_size,
                                       DType kv_dtype) const {
  KvCacheGeometry g;
  g.dtype = kv_dtype;
  g.num_layers = config_.num_hidden_layers;
  g.num_blocks = num_blocks;
  g.block_size = block_size;
  g.num_kv_heads = config_.num_key_value_heads;
  g.head_dim = config_.head_dim;
  return g;
}

}  // namespace tandem
