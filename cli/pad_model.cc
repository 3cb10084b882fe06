#include "cli/pad_model.h"

#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/checkpoint_writer.h"
#include "common/base/status_macros.h"
#include "common/model/config.h"
#include "common/tensor/safetensors.h"

namespace tandem {

namespace fs = std::filesystem;

absl::Status PadModel(const PadModelOptions& o) {
  std::error_code ec;
  if (o.out_dir.empty() ||
      fs::absolute(o.out_dir).lexically_normal() == fs::absolute(o.from_dir).lexically_normal()) {
    return absl::InvalidArgumentError("--out must name a directory other than --pad-from");
  }
  ASSIGN_OR_RETURN(const ModelConfig src, LoadModelConfig(o.from_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(o.from_dir));
  const int64_t inter = o.intermediate_size > 0 ? o.intermediate_size : src.intermediate_size;
  if (inter < src.intermediate_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--intermediate-size ", inter, " is narrower than the model's ", src.intermediate_size));
  }
  if (o.extra_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--extra-layers must be 0 or more, got ", o.extra_layers));
  }
  ModelConfig dst = src;
  dst.intermediate_size = inter;
  dst.num_hidden_layers = src.num_hidden_layers + o.extra_layers;
  // The written config must load: the same range checks as any config.json.
  RETURN_IF_ERROR(ParseModelConfig(ModelConfigToJson(dst), "the padded config").status());

  fs::create_directories(o.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(o.out_dir, ": cannot create: ", ec.message()));
  RETURN_IF_ERROR(CopyTokenizerFiles(o.from_dir, o.out_dir));
  RETURN_IF_ERROR(
      WriteTextFile((fs::path(o.out_dir) / "config.json").string(), ModelConfigToJson(dst)));

  const int64_t old_inter = src.intermediate_size;
  const std::string last = absl::StrCat("model.layers.", src.num_hidden_layers - 1, ".");
  // `t` written as `name`: gate/up rows repeated to the new width, down columns zero-padded, and
  // with `zero` all zeros.
  auto spec = [&](const std::string& name, const TensorView* t, bool zero) {
    TensorSpec s;
    s.name = name;
    s.dtype = t->dtype;
    s.shape = t->shape;
    const size_t es = DTypeSize(t->dtype);
    const bool rows =
        name.ends_with("mlp.gate_proj.weight") || name.ends_with("mlp.up_proj.weight");
    const bool cols = name.ends_with("mlp.down_proj.weight");
    if (rows) s.shape[0] = inter;
    if (cols) s.shape[1] = inter;
    s.fill = [t, rows, cols, zero, es, inter, old_inter, bytes = s.bytes()](std::byte* out) {
      if (zero) {
        std::memset(out, 0, bytes);
      } else if (rows) {  // [inter][hidden]: row r is the model's row r % old_inter
        const size_t row = static_cast<size_t>(t->shape[1]) * es;
        for (int64_t r = 0; r < inter; ++r)
          std::memcpy(out + r * row, t->data + (r % old_inter) * row, row);
      } else if (cols) {  // [hidden][inter]: the model's columns, then zeros
        const size_t in_row = static_cast<size_t>(old_inter) * es;
        const size_t out_row = static_cast<size_t>(inter) * es;
        for (int64_t h = 0; h < t->shape[0]; ++h) {
          std::memcpy(out + h * out_row, t->data + h * in_row, in_row);
          std::memset(out + h * out_row + in_row, 0, out_row - in_row);
        }
      } else {
        std::memcpy(out, t->data, t->nbytes);
      }
    };
    return s;
  };
  std::vector<TensorSpec> tensors;
  for (const auto& [name, t] : ckpt->tensors()) tensors.push_back(spec(name, t, false));
  for (int64_t l = src.num_hidden_layers; l < dst.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (const auto& [name, t] : ckpt->tensors()) {
      if (!name.starts_with(last)) continue;
      const std::string part = name.substr(last.size());
      const bool zero = part == "self_attn.o_proj.weight" || part == "mlp.down_proj.weight";
      tensors.push_back(spec(p + part, t, zero));
    }
  }
  return WriteCheckpointWeights(o.out_dir, tensors, o.max_shard_bytes, o.progress);
}

}  // namespace tandem
