#include "common/quant/checkpoint_formats.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& what, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The tensor `name`, of one of `dtypes` and exactly `shape`.
absl::StatusOr<const TensorView*> Tensor(const Checkpoint& ckpt, const std::string& name,
                                         std::initializer_list<DType> dtypes,
                                         const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const TensorView* t, ckpt.Get(name));
  if (std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end()) {
    std::vector<std::string> names;
    for (DType d : dtypes) names.emplace_back(DTypeName(d));
    return Bad(absl::StrCat(t->file, ": tensor ", name),
               absl::StrCat("dtype ", std::string(DTypeName(t->dtype)), ", expected ",
                            absl::StrJoin(names, " or ")));
  }
  if (t->shape != shape) {
    return Bad(absl::StrCat(t->file, ": tensor ", name),
               absl::StrCat("shape ", ShapeString(t->shape), ", expected ", ShapeString(shape)));
  }
  return t;
}

uint32_t Word(const TensorView& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, t.data + i * 4, 4);
  return w;
}
int64_t Int(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kI8: return static_cast<int8_t>(t.data[i]);
    case DType::kI32: return static_cast<int32_t>(Word(t, i));
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, t.data + i * 8, 8);
      return v;
    }
    default: return 0;
  }
}
float Float(const TensorView& t, int64_t i) {
  float v;
  ConvertToF32(t.dtype, t.data + i * DTypeSize(t.dtype), &v, 1);
  return v;
}

constexpr std::initializer_list<DType> kFloats = {DType::kF16, DType::kBF16, DType::kF32};

// The stored column order from a g_idx (the group of each input column): empty when it is the
// plain k / group_size, else the columns sorted by group (stable), which must give groups of
// group_size columns each.
absl::StatusOr<std::vector<int32_t>> OrderFromGroups(const std::string& what,
                                                     const std::vector<int64_t>& g_idx,
                                                     int64_t group_size, int64_t groups) {
  bool plain = true;
  for (size_t k = 0; k < g_idx.size(); ++k) {
    if (g_idx[k] < 0 || g_idx[k] >= groups) {
      return Bad(what,
                 absl::StrCat("g_idx[", k, "] = ", g_idx[k], " is outside [0, ", groups, ")"));
    }
    plain = plain && g_idx[k] == static_cast<int64_t>(k) / group_size;
  }
  if (plain) return std::vector<int32_t>();
  std::vector<int32_t> perm(g_idx.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int32_t a, int32_t b) { return g_idx[a] < g_idx[b]; });
  for (size_t c = 0; c < perm.size(); ++c) {
    if (g_idx[perm[c]] != static_cast<int64_t>(c) / group_size) {
      return Bad(what, absl::StrCat("g_idx puts a number of columns other than the group size ",
                                    group_size, " in group ", g_idx[perm[c]],
                                    " (act-order groups must be of one size)"));
    }
  }
  return perm;
}

// Fills codes (stored column order: perm) from field(k, n), the b-bit unsigned value of input k,
// output n; `offset` is subtracted for int8's signed codes.
template <typename Field>
void FillCodes(QuantizedMatrix* m, const std::vector<int32_t>& perm, const Field& field) {
  const int offset = m->type == QuantType::kInt8 ? 128 : 0;
  for (int64_t n = 0; n < m->rows; ++n) {
    for (int64_t c = 0; c < m->cols; ++c) {
      const int64_t k = perm.empty() ? c : perm[c];
      m->SetCode(n, c, static_cast<int>(field(k, n)) - offset);
    }
  }
}

absl::StatusOr<QuantizedMatrix> ReadGptq(const Checkpoint& ckpt, const CheckpointQuantization& q,
                                         const std::string& p, int64_t n_out, int64_t k_in) {
  const int b = q.bits, pf = 32 / b;
  const uint32_t mask = (1u << b) - 1;
  const int64_t gs = q.group_size > 0 ? q.group_size : k_in;
  if (k_in % pf != 0 || n_out % pf != 0) {
    return Bad(p, absl::StrCat(b, "-bit packing needs in and out features divisible by ", pf, " (",
                               k_in, " x ", n_out, ")"));
  }
  if (k_in % gs != 0) {
    return Bad(p, absl::StrCat("group size ", gs, " does not divide ", k_in, " input features"));
  }
  const int64_t groups = k_in / gs;
  ASSIGN_OR_RETURN(const TensorView* qweight,
                   Tensor(ckpt, p + ".qweight", {DType::kI32}, {k_in / pf, n_out}));
  ASSIGN_OR_RETURN(const TensorView* qzeros,
                   Tensor(ckpt, p + ".qzeros", {DType::kI32}, {groups, n_out / pf}));
  ASSIGN_OR_RETURN(const TensorView* scales, Tensor(ckpt, p + ".scales", kFloats, {groups, n_out}));
  std::vector<int32_t> perm;
  if (ckpt.tensors().contains(p + ".g_idx")) {
    ASSIGN_OR_RETURN(const TensorView* g,
                     Tensor(ckpt, p + ".g_idx", {DType::kI32, DType::kI64}, {k_in}));
    std::vector<int64_t> g_idx(static_cast<size_t>(k_in));
    for (int64_t k = 0; k < k_in; ++k) g_idx[k] = Int(*g, k);
    ASSIGN_OR_RETURN(perm, OrderFromGroups(p + ".g_idx", g_idx, gs, groups));
  }
  QuantizedMatrix m =
      MakeQuantizedMatrix(b == 8 ? QuantType::kInt8 : QuantType::kInt4, n_out, k_in, gs);
  m.perm = perm;
  FillCodes(&m, perm, [&](int64_t k, int64_t n) {
    return (Word(*qweight, (k / pf) * n_out + n) >> (b * (k % pf))) & mask;
  });
  m.zeros.resize(m.scales.size());
  const int zero_offset = (q.gptq_v2 ? 0 : 1) - (b == 8 ? 128 : 0);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t n = 0; n < n_out; ++n) {
      const uint32_t z = (Word(*qzeros, g * (n_out / pf) + n / pf) >> (b * (n % pf))) & mask;
      m.zeros[n * groups + g] = static_cast<float>(static_cast<int>(z) + zero_offset);
      m.scales[n * groups + g] = Float(*scales, g * n_out + n);
    }
  }
  return m;
}

absl::StatusOr<QuantizedMatrix> ReadAwq(const Checkpoint& ckpt, const CheckpointQuantization& q,
                                        const std::string& p, int64_t n_out, int64_t k_in) {
  // Nibble of output column j within its word (AutoAWQ packs columns 0,2,4,6,1,3,5,7).
  static constexpr int kShift[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const int64_t gs = q.group_size > 0 ? q.group_size : k_in;
  if (n_out % 8 != 0)
    return Bad(p, absl::StrCat(n_out, " output features are not a multiple of 8"));
  if (k_in % gs != 0) {
    return Bad(p, absl::StrCat("group size ", gs, " does not divide ", k_in, " input features"));
  }
  const int64_t groups = k_in / gs;
  ASSIGN_OR_RETURN(const TensorView* qweight,
                   Tensor(ckpt, p + ".qweight", {DType::kI32}, {k_in, n_out / 8}));
  ASSIGN_OR_RETURN(const TensorView* qzeros,
                   Tensor(ckpt, p + ".qzeros", {DType::kI32}, {groups, n_out / 8}));
  ASSIGN_OR_RETURN(const TensorView* scales, Tensor(ckpt, p + ".scales", kFloats, {groups, n_out}));
  auto field = [&](const TensorView& t, int64_t row, int64_t n) {
    return (Word(t, row * (n_out / 8) + n / 8) >> (4 * kShift[n % 8])) & 0xF;
  };
  QuantizedMatrix m = MakeQuantizedMatrix(QuantType::kInt4, n_out, k_in, gs);
  FillCodes(&m, {}, [&](int64_t k, int64_t n) { return field(*qweight, k, n); });
  m.zeros.resize(m.scales.size());
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t n = 0; n < n_out; ++n) {
      m.zeros[n * groups + g] = static_cast<float>(field(*qzeros, g, n));
      m.scales[n * groups + g] = Float(*scales, g * n_out + n);
    }
  }
  return m;
}

absl::StatusOr<QuantizedMatrix> ReadCompressed(const Checkpoint& ckpt,
                                               const CheckpointQuantization& q,
                                               const std::string& p, int64_t n_out, int64_t k_in) {
  const int b = q.bits, pf = 32 / b, half = 1 << (b - 1);
  const uint32_t mask = (1u << b) - 1;
  const int64_t gs = q.group_size > 0 ? q.group_size : k_in;
  if (k_in % gs != 0) {
    return Bad(p, absl::StrCat("group size ", gs, " does not divide ", k_in, " input features"));
  }
  const int64_t groups = k_in / gs, words = (k_in + pf - 1) / pf;
  ASSIGN_OR_RETURN(const TensorView* shape,
                   Tensor(ckpt, p + ".weight_shape", {DType::kI64, DType::kI32}, {2}));
  if (Int(*shape, 0) != n_out || Int(*shape, 1) != k_in) {
    return Bad(p + ".weight_shape", absl::StrCat("[", Int(*shape, 0), ", ", Int(*shape, 1),
                                                 "], expected [", n_out, ", ", k_in, "]"));
  }
  ASSIGN_OR_RETURN(const TensorView* packed,
                   Tensor(ckpt, p + ".weight_packed", {DType::kI32}, {n_out, words}));
  ASSIGN_OR_RETURN(const TensorView* scales,
                   Tensor(ckpt, p + ".weight_scale", kFloats, {n_out, groups}));
  std::vector<int32_t> perm;
  if (ckpt.tensors().contains(p + ".weight_g_idx")) {
    ASSIGN_OR_RETURN(const TensorView* g,
                     Tensor(ckpt, p + ".weight_g_idx", {DType::kI32, DType::kI64}, {k_in}));
    std::vector<int64_t> g_idx(static_cast<size_t>(k_in));
    bool unset = true;  // initialised to -1: plain order
    for (int64_t k = 0; k < k_in; ++k) {
      g_idx[k] = Int(*g, k);
      unset = unset && g_idx[k] == -1;
    }
    if (!unset) {
      ASSIGN_OR_RETURN(perm, OrderFromGroups(p + ".weight_g_idx", g_idx, gs, groups));
    }
  }
  // Zero points in the signed code range (0 when symmetric).
  std::vector<int64_t> zp(static_cast<size_t>(n_out * groups), 0);
  if (!q.symmetric) {
    const std::string name = p + ".weight_zero_point";
    ASSIGN_OR_RETURN(const TensorView* t, ckpt.Get(name));
    if (t->dtype == DType::kI32 &&
        t->shape == std::vector<int64_t>{(n_out + pf - 1) / pf, groups}) {
      for (int64_t n = 0; n < n_out; ++n) {
        for (int64_t g = 0; g < groups; ++g) {
          const uint32_t f = (Word(*t, (n / pf) * groups + g) >> (b * (n % pf))) & mask;
          zp[n * groups + g] = static_cast<int64_t>(f) - half;
        }
      }
    } else {
      ASSIGN_OR_RETURN(t, Tensor(ckpt, name, {DType::kI8, DType::kI32}, {n_out, groups}));
      for (int64_t i = 0; i < n_out * groups; ++i) zp[i] = Int(*t, i);
    }
  }
  QuantizedMatrix m =
      MakeQuantizedMatrix(b == 8 ? QuantType::kInt8 : QuantType::kInt4, n_out, k_in, gs);
  m.perm = perm;
  // Stored offset binary: field = q + 2^(b-1). Tandem's int8 codes are q; int4 codes the field,
  // whose zero is then zp + 8.
  FillCodes(&m, perm, [&](int64_t k, int64_t n) {
    return (Word(*packed, n * words + k / pf) >> (b * (k % pf))) & mask;
  });
  m.zeros.resize(m.scales.size());
  for (int64_t n = 0; n < n_out; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      m.zeros[n * groups + g] = static_cast<float>(zp[n * groups + g] + (b == 4 ? half : 0));
      m.scales[n * groups + g] = Float(*scales, n * groups + g);
    }
  }
  return m;
}

int64_t IntField(const json& o, std::initializer_list<const char*> keys, int64_t fallback) {
  for (const char* k : keys) {
    if (o.contains(k) && o[k].is_number_integer()) return o[k].get<int64_t>();
  }
  return fallback;
}
std::string StringField(const json& o, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (o.contains(k) && o[k].is_string()) return absl::AsciiStrToLower(o[k].get<std::string>());
  }
  return "";
}
bool BoolField(const json& o, const char* key, bool fallback) {
  return o.contains(key) && o[key].is_boolean() ? o[key].get<bool>() : fallback;
}

}  // namespace

std::string_view CheckpointFormatName(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::kNone: return "none";
    case CheckpointFormat::kGptq: return "gptq";
    case CheckpointFormat::kAwq: return "awq";
    case CheckpointFormat::kCompressedTensors: return "compressed-tensors";
  }
  return "?";
}

absl::StatusOr<CheckpointQuantization> ParseQuantizationConfig(const json& qc) {
  CheckpointQuantization q;
  if (qc.is_null()) return q;
  const std::string where = "config.json quantization_config";
  if (!qc.is_object()) return Bad(where, "not an object");
  const std::string method = StringField(qc, {"quant_method", "method"});
  const int64_t group = IntField(qc, {"group_size", "q_group_size"}, -1);
  if (group == 0 || group < -1) return Bad(where, absl::StrCat("group_size ", group));
  q.group_size = group;
  if (method == "gptq") {
    q.format = CheckpointFormat::kGptq;
    q.bits = static_cast<int>(IntField(qc, {"bits"}, 0));
    q.symmetric = BoolField(qc, "sym", true);
    q.desc_act = BoolField(qc, "desc_act", false);
    const std::string fmt = StringField(qc, {"checkpoint_format", "format"});
    if (fmt == "gptq_v2") {
      q.gptq_v2 = true;
    } else if (!fmt.empty() && fmt != "gptq") {
      return Bad(where, absl::StrCat("GPTQ checkpoint_format '", fmt,
                                     "' is not read (gptq and gptq_v2 are)"));
    }
  } else if (method == "awq") {
    q.format = CheckpointFormat::kAwq;
    q.bits = static_cast<int>(IntField(qc, {"bits", "w_bit"}, 0));
    q.symmetric = false;
    const std::string version = StringField(qc, {"version"});
    if (!version.empty() && version != "gemm") {
      return Bad(where, absl::StrCat("AWQ version '", version, "' is not read (gemm is)"));
    }
    if (!BoolField(qc, "zero_point", true))
      return Bad(where, "AWQ without zero points is not read");
    if (q.bits != 4) return Bad(where, absl::StrCat("AWQ with ", q.bits, " bits (4 is read)"));
  } else if (method == "compressed-tensors") {
    q.format = CheckpointFormat::kCompressedTensors;
    const std::string fmt = StringField(qc, {"format"});
    if (fmt != "pack-quantized") {
      return Bad(where, absl::StrCat("compressed-tensors format '", fmt,
                                     "' is not read (pack-quantized is)"));
    }
    if (!qc.contains("config_groups") || !qc["config_groups"].is_object() ||
        qc["config_groups"].empty()) {
      return Bad(where, "compressed-tensors without config_groups");
    }
    bool first = true;
    for (const auto& [name, group_cfg] : qc["config_groups"].items()) {
      const std::string g = absl::StrCat(where, ".config_groups.", name);
      if (!group_cfg.is_object() || !group_cfg.contains("weights") ||
          !group_cfg["weights"].is_object()) {
        return Bad(g, "no weights scheme");
      }
      if (group_cfg.contains("input_activations") && !group_cfg["input_activations"].is_null()) {
        return Bad(g, "activation quantization is not read (weight-only schemes are)");
      }
      const json& w = group_cfg["weights"];
      const std::string type = StringField(w, {"type"});
      if (type != "int") return Bad(g, absl::StrCat("weights of type '", type, "' (int is read)"));
      const std::string strategy = StringField(w, {"strategy"});
      CheckpointQuantization gq = q;
      gq.bits = static_cast<int>(IntField(w, {"num_bits"}, 0));
      gq.symmetric = BoolField(w, "symmetric", true);
      if (strategy == "group") {
        gq.group_size = IntField(w, {"group_size"}, 0);
        if (gq.group_size <= 0) return Bad(g, "group strategy without a group_size");
      } else if (strategy == "channel") {
        gq.group_size = -1;
      } else {
        return Bad(g, absl::StrCat("strategy '", strategy, "' (group and channel are read)"));
      }
      if (!first &&
          (gq.bits != q.bits || gq.group_size != q.group_size || gq.symmetric != q.symmetric)) {
        return Bad(g, "config groups with different schemes are not read");
      }
      q = gq;
      first = false;
    }
  } else {
    return Bad(where, absl::StrCat("quant_method '", method,
                                   "' is not read (gptq, awq and compressed-tensors are)"));
  }
  if (q.bits != 4 && q.bits != 8) {
    return Bad(where, absl::StrCat(q.bits, "-bit weights are not read (4 and 8 are)"));
  }
  return q;
}

std::vector<std::string> QuantizedTensorNames(const Checkpoint& ckpt,
                                              const CheckpointQuantization& q,
                                              const std::string& p) {
  std::vector<std::string> names;
  switch (q.format) {
    case CheckpointFormat::kNone: break;
    case CheckpointFormat::kGptq:
    case CheckpointFormat::kAwq:
      if (!ckpt.tensors().contains(p + ".qweight")) break;
      names = {p + ".qweight", p + ".qzeros", p + ".scales"};
      if (ckpt.tensors().contains(p + ".g_idx")) names.push_back(p + ".g_idx");
      break;
    case CheckpointFormat::kCompressedTensors:
      if (!ckpt.tensors().contains(p + ".weight_packed")) break;
      names = {p + ".weight_packed", p + ".weight_scale", p + ".weight_shape"};
      for (const char* extra : {".weight_zero_point", ".weight_g_idx"}) {
        if (ckpt.tensors().contains(p + extra)) names.push_back(p + extra);
      }
      break;
  }
  return names;
}

absl::StatusOr<QuantizedMatrix> ReadQuantizedLinear(const Checkpoint& ckpt,
                                                    const CheckpointQuantization& q,
                                                    const std::string& prefix, int64_t out_features,
                                                    int64_t in_features) {
  absl::StatusOr<QuantizedMatrix> m;
  switch (q.format) {
    case CheckpointFormat::kGptq: m = ReadGptq(ckpt, q, prefix, out_features, in_features); break;
    case CheckpointFormat::kAwq: m = ReadAwq(ckpt, q, prefix, out_features, in_features); break;
    case CheckpointFormat::kCompressedTensors:
      m = ReadCompressed(ckpt, q, prefix, out_features, in_features);
      break;
    case CheckpointFormat::kNone: return Bad(prefix, "the checkpoint is not quantized");
  }
  if (!m.ok()) return m.status();
  RETURN_IF_ERROR(Validate(*m, prefix));
  return m;
}

absl::StatusOr<int64_t> QuantizedLinearBytes(const Checkpoint& ckpt,
                                             const CheckpointQuantization& q,
                                             const std::string& prefix, int64_t n_out,
                                             int64_t k_in) {
  const int64_t gs = q.group_size > 0 ? q.group_size : k_in;
  const int64_t groups = (k_in + gs - 1) / gs;
  const int64_t codes = q.bits == 4 ? n_out * (k_in / 2) : n_out * k_in;
  int64_t bytes = codes + 2 * n_out * groups * static_cast<int64_t>(sizeof(float));
  // A column order when g_idx is not the plain one.
  const std::string g_name =
      prefix + (q.format == CheckpointFormat::kCompressedTensors ? ".weight_g_idx" : ".g_idx");
  if (q.format != CheckpointFormat::kAwq && ckpt.tensors().contains(g_name)) {
    ASSIGN_OR_RETURN(const TensorView* g, Tensor(ckpt, g_name, {DType::kI32, DType::kI64}, {k_in}));
    for (int64_t k = 0; k < k_in; ++k) {
      const int64_t v = Int(*g, k);
      if (v != k / gs && !(q.format == CheckpointFormat::kCompressedTensors && v == -1)) {
        bytes += k_in * static_cast<int64_t>(sizeof(int32_t));
        break;
      }
    }
  }
  return bytes;
}

absl::StatusOr<QuantizedMatrix> StackQuantizedRows(const std::vector<QuantizedMatrix>& parts,
                                                   const std::string& what) {
  QuantizedMatrix out = parts.at(0);
  out.zeros.clear();
  const bool zeros = std::any_of(parts.begin(), parts.end(),
                                 [](const QuantizedMatrix& m) { return !m.zeros.empty(); });
  for (size_t i = 0; i < parts.size(); ++i) {
    const QuantizedMatrix& m = parts[i];
    if (m.type != out.type || m.cols != out.cols || m.group_size != out.group_size ||
        m.perm != out.perm) {
      return Bad(what,
                 "stacked projections differ in bits, group size or act-order g_idx "
                 "(they must share one layout)");
    }
    if (i > 0) {
      out.rows += m.rows;
      out.codes.insert(out.codes.end(), m.codes.begin(), m.codes.end());
      out.scales.insert(out.scales.end(), m.scales.begin(), m.scales.end());
    }
    if (zeros) {
      if (m.zeros.empty()) {
        out.zeros.insert(out.zeros.end(), m.scales.size(), 0.f);
      } else {
        out.zeros.insert(out.zeros.end(), m.zeros.begin(), m.zeros.end());
      }
    }
  }
  return out;
}

}  // namespace tandem
