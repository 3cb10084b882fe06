// `tandem quantize`: writes a quantized checkpoint in a real format (GPTQ, or compressed-tensors
// pack-quantized) that Tandem and other engines load, by round to nearest or by GPTQ over
// calibration text. Every projection of the layers is quantized (embeddings, norms and lm_head are
// written as stored); the config gets its quantization_config; tokenizer files are copied.
//
// GPTQ's calibration (cli/calibration.h) runs the model once over the calibration windows with
// every projection's inputs watched; then each projection is quantized from its Hessian, and the
// relative output error on the calibration inputs is reported beside what RTN would give, so that
// the gain is seen where it is made.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/calibration.h"
#include "cli/checkpoint_writer.h"
#include "cli/commands.h"
#include "cli/token_windows.h"
#include "common/base/status_macros.h"
#include "common/model/config.h"
#include "common/model/llama_model.h"
#include "common/model/memory_plan.h"
#include "common/quant/checkpoint_packing.h"
#include "common/quant/gptq.h"
#include "common/quant/rtn.h"
#include "common/serving/engine_flags.h"
#include "common/tensor/safetensors.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(bool, progress);
ABSL_DECLARE_FLAG(int64_t, context);
ABSL_DECLARE_FLAG(uint64_t, shard_size_mb);
ABSL_FLAG(int32_t, bits, 4, "quantize: bits per weight, 4 or 8");
ABSL_FLAG(int64_t, group_size, 128,
          "quantize: input columns per scale (a divisor of every projection's in_features); -1: "
          "one scale per output channel");
ABSL_FLAG(std::string, method, "gptq",
          "quantize: gptq (needs --calibration-file or --calibration-windows-file) or rtn (round "
          "to nearest)");
ABSL_FLAG(std::string, format, "gptq",
          "quantize: the checkpoint format written: gptq (AutoGPTQ/GPTQModel's, zero points "
          "stored minus one) or compressed-tensors (llm-compressor's pack-quantized)");
ABSL_FLAG(bool, sym, true,
          "quantize: symmetric grids (zero point in the middle of the codes); false: asymmetric, "
          "a zero point per group");
ABSL_FLAG(bool, act_order, false,
          "quantize: GPTQ takes input columns in decreasing Hessian diagonal (desc_act); the "
          "checkpoint's g_idx then holds the order");
ABSL_FLAG(double, damp, 0.01,
          "quantize: GPTQ's dampening, a fraction of the Hessian's mean diagonal");
ABSL_FLAG(std::string, calibration_file, "", "quantize: calibration text (UTF-8) for GPTQ");
ABSL_FLAG(std::string, calibration_windows_file, "",
          "quantize: instead of --calibration-file, token windows JSON {\"windows\": [[id, ...]]}");
ABSL_FLAG(std::string, calibration_memory, "4G",
          "quantize: memory for GPTQ's Hessians (in_features^2 x 4 bytes per distinct input); "
          "inputs past it are calibrated in further passes over the calibration text");
ABSL_FLAG(int64_t, calibration_tokens, 65536,
          "quantize: calibration tokens at most (windows of --context tokens)");

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int QuantizeFail(const absl::Status& s) {
  std::fprintf(stderr, "tandem quantize: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

enum class Method : uint8_t { kRtn, kGptq };

struct QuantizeOptions {
  std::string model_dir, out_dir;
  Method method = Method::kGptq;
  CheckpointQuantization format;
  RtnOptions grid;
  GptqOptions gptq;
  int64_t calibration_memory = 0;  // bytes of Hessians a calibration pass holds
};

absl::StatusOr<QuantizeOptions> OptionsFromFlags() {
  QuantizeOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.out_dir = absl::GetFlag(FLAGS_out);
  if (o.model_dir.empty()) return absl::InvalidArgumentError("--model DIR is required");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out DIR is required");
  if (fs::absolute(o.out_dir).lexically_normal() == fs::absolute(o.model_dir).lexically_normal()) {
    return absl::InvalidArgumentError("--out must name a directory other than --model");
  }
  const int bits = absl::GetFlag(FLAGS_bits);
  if (bits != 4 && bits != 8) {
    return absl::InvalidArgumentError(absl::StrCat("--bits ", bits, ": 4 or 8"));
  }
  const int64_t group = absl::GetFlag(FLAGS_group_size);
  if (group == 0 || group < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--group-size ", group, ": a positive divisor of in_features, or -1"));
  }
  if (absl::GetFlag(FLAGS_calibration_tokens) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--calibration-tokens ", absl::GetFlag(FLAGS_calibration_tokens), ": at least 1"));
  }
  const std::string method = absl::GetFlag(FLAGS_method);
  if (method == "gptq") {
    o.method = Method::kGptq;
  } else if (method == "rtn") {
    o.method = Method::kRtn;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--method '", method, "': gptq or rtn"));
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "gptq") {
    o.format.format = CheckpointFormat::kGptq;
  } else if (format == "compressed-tensors") {
    o.format.format = CheckpointFormat::kCompressedTensors;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--format '", format, "': gptq or compressed-tensors"));
  }
  o.format.bits = bits;
  o.format.group_size = group;
  o.format.symmetric = absl::GetFlag(FLAGS_sym);
  o.format.desc_act = absl::GetFlag(FLAGS_act_order);
  if (o.format.desc_act && o.method != Method::kGptq) {
    return absl::InvalidArgumentError("--act-order is GPTQ's (--method gptq)");
  }
  o.grid.type = bits == 8 ? QuantType::kInt8 : QuantType::kInt4;
  o.grid.group_size = group > 0 ? group : 0;
  o.grid.symmetric = o.format.symmetric;
  // The original GPTQ storage holds zero − 1: an asymmetric zero at the lowest code cannot be.
  o.grid.zero_above_min_code = o.format.format == CheckpointFormat::kGptq && !o.format.gptq_v2;
  o.gptq.act_order = o.format.desc_act;
  o.gptq.damp = absl::GetFlag(FLAGS_damp);
  if (!(o.gptq.damp > 0 && o.gptq.damp <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--damp ", o.gptq.damp, ": in (0, 1]"));
  }
  ASSIGN_OR_RETURN(o.calibration_memory,
                   ParseBytes("--calibration-memory", absl::GetFlag(FLAGS_calibration_memory)));
  const bool calibrated = !absl::GetFlag(FLAGS_calibration_file).empty() ||
                          !absl::GetFlag(FLAGS_calibration_windows_file).empty();
  if (o.method == Method::kGptq && !calibrated) {
    return absl::InvalidArgumentError(
        "--method gptq needs calibration text: --calibration-file F (or "
        "--calibration-windows-file F)");
  }
  if (!absl::GetFlag(FLAGS_calibration_file).empty() &&
      !absl::GetFlag(FLAGS_calibration_windows_file).empty()) {
    return absl::InvalidArgumentError(
        "give one of --calibration-file and --calibration-windows-file");
  }
  return o;
}

// The input a projection multiplies: its layer and which of the four ("attn" for q/k/v, "o",
// "mlp" for gate/up, "down").
std::string InputOf(const std::string& name) {
  const size_t dot = name.find('.', std::string_view("model.layers.").size());
  const std::string layer = name.substr(0, dot);
  for (const char* p : {".q_proj.", ".k_proj.", ".v_proj."}) {
    if (name.find(p) != std::string::npos) return layer + ".attn";
  }
  if (name.find(".o_proj.") != std::string::npos) return layer + ".o";
  if (name.find(".down_proj.") != std::string::npos) return layer + ".down";
  return layer + ".mlp";
}

// The checkpoint's projection weights, checked against the format before any work is done.
absl::StatusOr<std::vector<const TensorView*>> Projections(const Checkpoint& ckpt,
                                                           const QuantizeOptions& o) {
  std::vector<const TensorView*> out;
  for (const auto& [name, t] : ckpt.tensors()) {
    if (!IsProjectionWeight(name)) continue;
    if (t->shape.size() != 2 || !IsFloat(t->dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(t->file, ": ", name, " is not a 2-D floating-point weight"));
    }
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const int64_t group = o.format.group_size > 0 ? o.format.group_size : cols;
    if (cols % group != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": --group-size ", group, " does not divide its ", cols, " input features"));
    }
    if (o.grid.type == QuantType::kInt4 && (cols % 32 != 0 || (group < cols && group % 32 != 0))) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": 4-bit weights need in_features (",
                                                     cols, ") and the group size (", group,
                                                     ") to be multiples of 32"));
    }
    const int64_t pack = 32 / o.format.bits;
    if (o.format.format == CheckpointFormat::kGptq && (cols % pack != 0 || rows % pack != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": the GPTQ format packs ", pack,
                                                     " weights a word; ", rows, " x ", cols,
                                                     " does not divide"));
    }
    out.push_back(t);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ckpt.dir(), ": no projection weights (model.layers.N.*_proj.weight)"));
  }
  return out;
}

// GPTQ's calibration: the model as stored on a CalibrationBackend, and the windows it runs over.
struct Calibration {
  std::unique_ptr<CalibrationBackend> backend;  // declared first: outlives the model on it
  std::unique_ptr<WindowRunner> runner;
  TokenWindows windows;
  int64_t tokens = 0;  // run a pass
};

absl::StatusOr<Calibration> LoadCalibration(const QuantizeOptions& o,
                                            const std::vector<const TensorView*>& projections,
                                            const std::map<std::string, int>& inputs) {
  std::vector<std::vector<std::string>> names(inputs.size());
  std::vector<int64_t> cols(inputs.size());
  for (const TensorView* t : projections) {
    const int i = inputs.at(InputOf(t->name));
    names[i].push_back(t->name);
    cols[i] = t->shape[1];
  }
  Calibration c;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> inner, BackendFromFlags());
  c.backend = std::make_unique<CalibrationBackend>(std::move(inner), names, cols);
  LlamaLoadOptions load;
  load.stack_projections = false;  // one uploaded weight per checkpoint tensor, watched by name
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                   LlamaModel::Load(o.model_dir, c.backend.get(), load));
  ASSIGN_OR_RETURN(const int64_t context, WindowContext(*model, absl::GetFlag(FLAGS_context)));
  ASSIGN_OR_RETURN(c.windows,
                   LoadTokenWindows(o.model_dir, absl::GetFlag(FLAGS_calibration_file),
                                    absl::GetFlag(FLAGS_calibration_windows_file), context,
                                    model->config().vocab_size, /*max_predicted=*/0));
  // At most --calibration-tokens run, the last window cut.
  const int64_t cap = absl::GetFlag(FLAGS_calibration_tokens);
  std::vector<std::vector<int32_t>>& windows = c.windows.windows;
  for (size_t i = 0; i < windows.size(); ++i) {
    if (c.tokens + static_cast<int64_t>(windows[i].size()) >= cap) {
      windows[i].resize(static_cast<size_t>(cap - c.tokens));
      windows.resize(i + 1);
      c.tokens = cap;
      break;
    }
    c.tokens += static_cast<int64_t>(windows[i].size());
  }
  ASSIGN_OR_RETURN(c.runner, WindowRunner::Create(std::move(model), std::nullopt, context));
  return c;
}

// One pass over the calibration windows, accumulating the watched inputs' Hessians.
absl::Status RunCalibration(Calibration& c, const std::string& label, bool progress) {
  ProgressBar bar(label.c_str(), "tokens", c.tokens, progress);
  constexpr int64_t kChunk = 256;
  int64_t done = 0;
  for (const std::vector<int32_t>& window : c.windows.windows) {
    const int64_t len = static_cast<int64_t>(window.size());
    for (int64_t begin = 0; begin < len; begin += kChunk) {
      const int64_t n = std::min(kChunk, len - begin);
      RETURN_IF_ERROR(c.runner->Chunk(window, begin, n, nullptr));
      done += n;
      bar.Update(done);
    }
  }
  bar.Finish();
  return absl::OkStatus();
}

// Input groups in passes whose Hessians fit `budget` bytes (a group larger than it on its own).
std::vector<std::vector<int>> Passes(const CalibrationBackend& backend, int groups,
                                     int64_t budget) {
  std::vector<std::vector<int>> passes(1);
  int64_t bytes = 0;
  for (int g = 0; g < groups; ++g) {
    const int64_t b = backend.hessian_bytes(g);
    if (!passes.back().empty() && bytes + b > budget) {
      passes.emplace_back();
      bytes = 0;
    }
    passes.back().push_back(g);
    bytes += b;
  }
  return passes;
}

struct Report {
  int64_t linears = 0;
  int64_t bytes_before = 0, bytes_after = 0;
  double output_error = 0, rtn_output_error = 0;  // means over the linears (GPTQ only)
};

// The Hessian of one input and its GPTQ factor, shared by the projections that read that input.
struct InputHessian {
  std::vector<double> h;
  GptqFactor factor;
};

// Quantizes and packs one projection (GPTQ with its input's Hessian, or RTN when null).
absl::Status QuantizeProjection(const TensorView& t, const InputHessian* hessian,
                                const GptqOptions& gptq, const CheckpointQuantization& format,
                                DType scale_dtype, Report* report,
                                std::vector<PackedTensor>* packed) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<float> w(static_cast<size_t>(rows * cols));
  ConvertToF32(t.dtype, t.data, w.data(), w.size());
  QuantizedMatrix m;
  if (hessian != nullptr) {
    const std::vector<double>& h = hessian->h;
    absl::StatusOr<QuantizedMatrix> q = QuantizeGptq(w.data(), rows, cols, hessian->factor, gptq);
    if (!q.ok()) {
      return absl::Status(q.status().code(), absl::StrCat(t.name, ": ", q.status().message()));
    }
    m = std::move(q).value();
    report->output_error += RelativeOutputError(w.data(), m, h);
    report->rtn_output_error +=
        RelativeOutputError(w.data(), QuantizeRtn(w.data(), rows, cols, gptq.grid), h);
  } else {
    m = QuantizeRtn(w.data(), rows, cols, gptq.grid);
  }
  const std::string prefix = t.name.substr(0, t.name.size() - std::string_view(".weight").size());
  ASSIGN_OR_RETURN(*packed, PackQuantizedLinear(m, format, scale_dtype, prefix));
  report->bytes_before += static_cast<int64_t>(t.nbytes);
  for (const PackedTensor& p : *packed) report->bytes_after += static_cast<int64_t>(p.bytes.size());
  ++report->linears;
  return absl::OkStatus();
}

absl::Status Quantize(const QuantizeOptions& o, bool progress, nlohmann::ordered_json* summary) {
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(o.model_dir));
  if (config.quantization.format != CheckpointFormat::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.model_dir, " is already quantized (",
                     std::string(CheckpointFormatName(config.quantization.format)), ")"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(o.model_dir));
  ASSIGN_OR_RETURN(const std::vector<const TensorView*> projections, Projections(*ckpt, o));
  std::map<std::string, int> inputs;
  for (const TensorView* t : projections) inputs.emplace(InputOf(t->name), 0);
  int next = 0;
  for (auto& [input, index] : inputs) index = next++;
  // compressed-tensors stores scales in the model's dtype; GPTQ in F16.
  const DType scale_dtype =
      o.format.format == CheckpointFormat::kGptq ? DType::kF16 : projections[0]->dtype;
  GptqOptions gptq = o.gptq;
  gptq.grid = o.grid;
  gptq.grid.scale_dtype = scale_dtype;

  // Each projection quantized and packed: with RTN at once; with GPTQ a pass of calibration for
  // the inputs whose Hessians fit --calibration-memory, then their projections, and so on.
  Report report;
  std::map<std::string, std::vector<PackedTensor>> packed;
  int64_t calibration_tokens = 0;
  std::vector<std::vector<int>> passes = {{}};
  std::optional<Calibration> calibration;
  if (o.method == Method::kGptq) {
    ASSIGN_OR_RETURN(calibration, LoadCalibration(o, projections, inputs));
    calibration_tokens = calibration->tokens;
    passes = Passes(*calibration->backend, static_cast<int>(inputs.size()), o.calibration_memory);
    int64_t total = 0;
    for (int g = 0; g < static_cast<int>(inputs.size()); ++g) {
      total += calibration->backend->hessian_bytes(g);
    }
    std::fprintf(stderr,
                 "calibration: %lld tokens; Hessians of %zu inputs, %.1f MB, in %zu pass%s "
                 "(--calibration-memory %s)\n",
                 static_cast<long long>(calibration_tokens), inputs.size(),
                 static_cast<double>(total) / 1e6, passes.size(), passes.size() == 1 ? "" : "es",
                 absl::GetFlag(FLAGS_calibration_memory).c_str());
  }
  ProgressBar bar("quantize", "projections", static_cast<int64_t>(projections.size()), progress);
  int64_t done = 0;
  for (size_t pass = 0; pass < passes.size(); ++pass) {
    const std::set<int> watched(passes[pass].begin(), passes[pass].end());
    if (calibration.has_value()) {
      calibration->backend->Watch(passes[pass]);
      RETURN_IF_ERROR(RunCalibration(*calibration,
                                     passes.size() == 1
                                         ? "calibrate"
                                         : absl::StrCat("calibrate ", pass + 1, "/", passes.size()),
                                     progress));
    }
    // The projections of each input together: GPTQ factors that input's Hessian once for them all
    // (q, k and v share one; gate and up another).
    std::map<int, std::vector<const TensorView*>> by_input;
    for (const TensorView* t : projections) {
      const int g = inputs.at(InputOf(t->name));
      if (calibration.has_value() && !watched.contains(g)) continue;
      by_input[g].push_back(t);
    }
    for (const auto& [g, ts] : by_input) {
      std::optional<InputHessian> hessian;
      if (calibration.has_value()) {
        hessian.emplace();
        hessian->h = calibration->backend->hessian(g).Hessian();
        absl::StatusOr<GptqFactor> f = FactorGptq(hessian->h, ts.front()->shape[1], gptq);
        if (!f.ok()) {
          return absl::Status(
              f.status().code(),
              absl::StrCat(ts.front()->name,
                           " (and the projections sharing its input): ", f.status().message()));
        }
        hessian->factor = std::move(f).value();
      }
      for (const TensorView* t : ts) {
        RETURN_IF_ERROR(QuantizeProjection(*t, hessian.has_value() ? &*hessian : nullptr, gptq,
                                           o.format, scale_dtype, &report, &packed[t->name]));
        bar.Update(++done);
      }
    }
    bar.Finish();
  }
  if (report.linears > 0) {
    report.output_error /= static_cast<double>(report.linears);
    report.rtn_output_error /= static_cast<double>(report.linears);
  }

  // The checkpoint: every other tensor as stored, the projections as packed.
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : ckpt->tensors()) {
    const auto it = packed.find(name);
    if (it == packed.end()) {
      const TensorView* view = t;
      specs.push_back({name, t->dtype, t->shape,
                       [view](std::byte* out) { std::memcpy(out, view->data, view->nbytes); }});
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
    for (const PackedTensor& p : it->second) {
      const PackedTensor* src = &p;
      specs.push_back({prefix + p.suffix, p.dtype, p.shape, [src](std::byte* out) {
                         std::memcpy(out, src->bytes.data(), src->bytes.size());
                       }});
    }
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(o.out_dir, ": cannot create: ", ec.message()));
  RETURN_IF_ERROR(CopyTokenizerFiles(o.model_dir, o.out_dir));
  std::ifstream config_in(fs::path(o.model_dir) / "config.json", std::ios::binary);
  std::ostringstream config_text;
  config_text << config_in.rdbuf();
  nlohmann::ordered_json out_config = nlohmann::ordered_json::parse(config_text.str());
  std::vector<std::string> unquantized;
  if (ckpt->tensors().contains("lm_head.weight")) unquantized.push_back("lm_head");
  out_config["quantization_config"] = QuantizationConfigJson(o.format, unquantized);
  RETURN_IF_ERROR(
      WriteTextFile((fs::path(o.out_dir) / "config.json").string(), out_config.dump(2) + "\n"));
  const uint64_t shard = std::max<uint64_t>(absl::GetFlag(FLAGS_shard_size_mb), 1) << 20;
  RETURN_IF_ERROR(WriteCheckpointWeights(o.out_dir, specs, shard, nullptr));

  (*summary)["out"] = o.out_dir;
  (*summary)["method"] = o.method == Method::kGptq ? "gptq" : "rtn";
  (*summary)["format"] = std::string(CheckpointFormatName(o.format.format));
  (*summary)["bits"] = o.format.bits;
  (*summary)["group_size"] = o.format.group_size;
  (*summary)["sym"] = o.format.symmetric;
  (*summary)["act_order"] = o.format.desc_act;
  (*summary)["linears"] = report.linears;
  (*summary)["bytes_before"] = report.bytes_before;
  (*summary)["bytes_after"] = report.bytes_after;
  (*summary)["calibration_tokens"] = calibration_tokens;
  if (o.method == Method::kGptq) {
    (*summary)["output_error"] = report.output_error;
    (*summary)["rtn_output_error"] = report.rtn_output_error;
  }
  (*summary)["seconds"] = std::chrono::duration<double>(Clock::now() - t0).count();
  return absl::OkStatus();
}

}  // namespace

int QuantizeCommand() {
  auto options = OptionsFromFlags();
  if (!options.ok()) return QuantizeFail(options.status());
  nlohmann::ordered_json summary;
  if (absl::Status s = Quantize(*options, absl::GetFlag(FLAGS_progress), &summary); !s.ok()) {
    return QuantizeFail(s);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", summary.dump().c_str());
    return 0;
  }
  std::printf("wrote %s: %lld projections to %d bits (%s, %s format), %.1f MB -> %.1f MB\n",
              options->out_dir.c_str(), static_cast<long long>(summary["linears"].get<int64_t>()),
              options->format.bits, summary["method"].get<std::string>().c_str(),
              summary["format"].get<std::string>().c_str(),
              static_cast<double>(summary["bytes_before"].get<int64_t>()) / 1e6,
              static_cast<double>(summary["bytes_after"].get<int64_t>()) / 1e6);
  if (summary.contains("output_error")) {
    std::printf(
        "relative output error on the calibration inputs (mean over projections): GPTQ %.6f, "
        "round to nearest %.6f (%lld calibration tokens)\n",
        summary["output_error"].get<double>(), summary["rtn_output_error"].get<double>(),
        static_cast<long long>(summary["calibration_tokens"].get<int64_t>()));
  }
  return 0;
}

}  // namespace tandem::cli
