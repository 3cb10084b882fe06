#include "common/quant/checkpoint_packing.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

absl::Status Bad(const std::string& what, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

template <typename T>
std::vector<uint8_t> BytesOf(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// The scales [rows][groups] as `dtype`, transposed to [groups][rows] when `transpose`.
absl::StatusOr<std::vector<uint8_t>> ScaleBytes(const QuantizedMatrix& m, DType dtype,
                                                bool transpose, const std::string& what) {
  const int64_t rows = m.rows, groups = m.num_groups();
  std::vector<uint8_t> out(static_cast<size_t>(rows * groups) * DTypeSize(dtype));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float s = m.scales[r * groups + g];
      const int64_t i = transpose ? g * rows + r : r * groups + g;
      float back = s;
      if (dtype == DType::kF16) {
        const uint16_t h = F32ToF16(s);
        back = F16ToF32(h);
        std::memcpy(&out[i * 2], &h, 2);
      } else if (dtype == DType::kBF16) {
        const uint16_t h = F32ToBf16(s);
        back = Bf16ToF32(h);
        std::memcpy(&out[i * 2], &h, 2);
      } else if (dtype == DType::kF32) {
        std::memcpy(&out[i * 4], &s, 4);
      } else {
        return Bad(what,
                   absl::StrCat("scales cannot be stored as ", std::string(DTypeName(dtype))));
      }
      if (back != s) {
        return Bad(what, absl::StrCat("scale ", s, " of row ", r, " group ", g, " is not exact in ",
                                      std::string(DTypeName(dtype))));
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<PackedTensor>> PackQuantizedLinear(const QuantizedMatrix& m,
                                                              const CheckpointQuantization& q,
                                                              DType scale_dtype,
                                                              const std::string& what) {
  RETURN_IF_ERROR(Validate(m, what));
  if (q.format != CheckpointFormat::kGptq && q.format != CheckpointFormat::kCompressedTensors) {
    return Bad(what, absl::StrCat("cannot write the ", std::string(CheckpointFormatName(q.format)),
                                  " format"));
  }
  const int b = q.bits;
  if (QuantBits(m.type) != b) {
    return Bad(
        what, absl::StrCat(std::string(QuantTypeName(m.type)), " weights in a ", b, "-bit format"));
  }
  const int64_t n_out = m.rows, k_in = m.cols;
  const int64_t gs = q.group_size > 0 ? q.group_size : k_in;
  if (k_in % gs != 0) {
    return Bad(what, absl::StrCat("group size ", gs, " does not divide ", k_in, " input features"));
  }
  if (m.group_size != gs) {
    return Bad(what,
               absl::StrCat("quantized in groups of ", m.group_size, ", the format says ", gs));
  }
  const int64_t groups = k_in / gs;
  const int pf = 32 / b;
  const uint32_t mask = (1u << b) - 1;
  // Both formats store unsigned fields: Tandem's int8 codes are signed (offset 128).
  const int offset = m.type == QuantType::kInt8 ? 128 : 0;
  std::vector<int64_t> col(static_cast<size_t>(k_in));  // stored column of input k
  for (int64_t c = 0; c < k_in; ++c) col[m.perm.empty() ? c : m.perm[c]] = c;
  auto field = [&](int64_t n, int64_t k) {
    return static_cast<uint32_t>(m.Code(n, col[k]) + offset);
  };
  // The unsigned zero point of row n, group g, checked to be an integer field after `shift`.
  auto zero_field = [&](int64_t n, int64_t g, int shift) -> absl::StatusOr<uint32_t> {
    const float z = (m.zeros.empty() ? 0.f : m.zeros[n * groups + g]) + offset - shift;
    if (z != std::nearbyint(z) || z < 0 || z > static_cast<float>(mask)) {
      return Bad(what,
                 absl::StrCat("zero point ", z + shift - offset, " of row ", n, " group ", g,
                              " cannot be stored in this format",
                              shift == 1 ? " (the original GPTQ format stores zero - 1)" : ""));
    }
    return static_cast<uint32_t>(z);
  };
  std::vector<int32_t> g_idx(static_cast<size_t>(k_in));
  for (int64_t k = 0; k < k_in; ++k) g_idx[k] = static_cast<int32_t>(col[k] / gs);

  std::vector<PackedTensor> out;
  if (q.format == CheckpointFormat::kGptq) {
    if (k_in % pf != 0 || n_out % pf != 0) {
      return Bad(what, absl::StrCat(b, "-bit packing needs in and out features divisible by ", pf,
                                    " (", k_in, " x ", n_out, ")"));
    }
    std::vector<uint32_t> qweight(static_cast<size_t>(k_in / pf * n_out), 0);
    for (int64_t k = 0; k < k_in; ++k) {
      for (int64_t n = 0; n < n_out; ++n) {
        qweight[(k / pf) * n_out + n] |= field(n, k) << (b * (k % pf));
      }
    }
    std::vector<uint32_t> qzeros(static_cast<size_t>(groups * (n_out / pf)), 0);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t n = 0; n < n_out; ++n) {
        ASSIGN_OR_RETURN(const uint32_t z, zero_field(n, g, q.gptq_v2 ? 0 : 1));
        qzeros[g * (n_out / pf) + n / pf] |= z << (b * (n % pf));
      }
    }
    ASSIGN_OR_RETURN(std::vector<uint8_t> scales, ScaleBytes(m, scale_dtype, true, what));
    out.push_back({".qweight", DType::kI32, {k_in / pf, n_out}, BytesOf(qweight)});
    out.push_back({".qzeros", DType::kI32, {groups, n_out / pf}, BytesOf(qzeros)});
    out.push_back({".scales", scale_dtype, {groups, n_out}, std::move(scales)});
    out.push_back({".g_idx", DType::kI32, {k_in}, BytesOf(g_idx)});
    return out;
  }
  // compressed-tensors: offset binary, q + 2^(b-1), which is the unsigned field above.
  const int64_t words = (k_in + pf - 1) / pf;
  std::vector<uint32_t> packed(static_cast<size_t>(n_out * words), 0);
  for (int64_t n = 0; n < n_out; ++n) {
    for (int64_t k = 0; k < k_in; ++k) packed[n * words + k / pf] |= field(n, k) << (b * (k % pf));
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> scales, ScaleBytes(m, scale_dtype, false, what));
  out.push_back({".weight_packed", DType::kI32, {n_out, words}, BytesOf(packed)});
  out.push_back({".weight_scale", scale_dtype, {n_out, groups}, std::move(scales)});
  out.push_back({".weight_shape", DType::kI64, {2}, BytesOf(std::vector<int64_t>{n_out, k_in})});
  const uint32_t half = 1u << (b - 1);
  const int64_t zp_rows = (n_out + pf - 1) / pf;
  std::vector<uint32_t> zp(static_cast<size_t>(zp_rows * groups), 0);
  for (int64_t n = 0; n < n_out; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      ASSIGN_OR_RETURN(const uint32_t z, zero_field(n, g, 0));
      if (q.symmetric && z != half) {
        return Bad(what, absl::StrCat("zero point of row ", n, " group ", g,
                                      " is not the symmetric format's"));
      }
      zp[(n / pf) * groups + g] |= z << (b * (n % pf));
    }
  }
  if (!q.symmetric)
    out.push_back({".weight_zero_point", DType::kI32, {zp_rows, groups}, BytesOf(zp)});
  if (!m.perm.empty()) out.push_back({".weight_g_idx", DType::kI32, {k_in}, BytesOf(g_idx)});
  return out;
}

nlohmann::json QuantizationConfigJson(const CheckpointQuantization& q,
                                      const std::vector<std::string>& unquantized) {
  using json = nlohmann::json;
  const int64_t group = q.group_size > 0 ? q.group_size : -1;
  if (q.format == CheckpointFormat::kGptq) {
    bool lm_head = true;
    for (const std::string& name : unquantized) lm_head = lm_head && name != "lm_head";
    return json{{"quant_method", "gptq"},
                {"bits", q.bits},
                {"group_size", group},
                {"desc_act", q.desc_act},
                {"sym", q.symmetric},
                {"static_groups", false},
                {"true_sequential", true},
                {"lm_head", lm_head},
                {"checkpoint_format", q.gptq_v2 ? "gptq_v2" : "gptq"}};
  }
  json weights = {{"num_bits", q.bits},
                  {"type", "int"},
                  {"symmetric", q.symmetric},
                  {"strategy", group > 0 ? "group" : "channel"},
                  {"group_size", group > 0 ? json(group) : json(nullptr)},
                  {"actorder", q.desc_act ? json("group") : json(nullptr)},
                  {"dynamic", false},
                  {"observer", "minmax"}};
  return json{{"quant_method", "compressed-tensors"},
              {"format", "pack-quantized"},
              {"quantization_status", "compressed"},
              {"ignore", unquantized},
              {"config_groups",
               {{"group_0",
                 {{"targets", json::array({"Linear"})},
                  {"format", "pack-quantized"},
                  {"weights", weights},
                  {"input_activations", nullptr},
                  {"output_activations", nullptr}}}}},
              {"kv_cache_scheme", nullptr}};
}

}  // namespace tandem
