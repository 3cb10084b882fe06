#include "common/serving/engine_flags.h"

#include <cctype>
#include <fstream>
#include <iterator>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "common/backend/create_backend.h"
#include "common/base/status_macros.h"

ABSL_FLAG(int64_t, prefill_chunk, 0, "engine: alias of --max-prefill-chunk");
ABSL_FLAG(int64_t, max_prefill_chunk, 512,
          "engine: prompt tokens of one request per step (chunked prefill; 0 = whole prompt)");
ABSL_FLAG(int64_t, max_num_batched_tokens, 2048, "engine: token budget of one step");
ABSL_FLAG(int64_t, max_num_seqs, 0,
          "engine: sequences in one step (0 = 256 on a GPU, 128 on the CPU)");
ABSL_FLAG(int64_t, max_queued_requests, 1024,
          "engine: waiting requests beyond which new ones are refused");
ABSL_FLAG(int64_t, max_model_len, 0, "engine: prompt + output tokens (0 = the model's context)");
ABSL_FLAG(std::string, kv_cache_memory, "0",
          "engine: bytes of KV cache, e.g. 512M or 2G (0 = on a GPU, from "
          "--gpu-memory-utilization; on the CPU, room for 8 sequences of max_model_len)");
ABSL_FLAG(double, gpu_memory_utilization, 0.9,
          "engine: share of the GPU's memory this process takes for weights, activations and KV "
          "cache when --kv-cache-memory is 0 (GPU backends only; other processes' memory does not "
          "count against it)");
ABSL_FLAG(bool, cuda_graphs, true,
          "engine: run decode steps as CUDA graphs (captured once per bucketed batch size, "
          "replayed after; bit-identical to op by op with --batch-invariant); GPU backends only");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "engine: reuse cached KV blocks of shared prompt prefixes");
ABSL_FLAG(bool, device_sampling, true,
          "engine: sample where the logits are when the backend can (GPU backends: penalties, "
          "top-k, top-p, min-p and temperature there, a token or candidates copied back); false "
          "copies every sampled row's logits to the host sampler");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "engine: what the KV cache stores: f32, bf16, f16, int8, fp8 (CUDA: E4M3, "
          "saturating at +-448), or auto (on a GPU the model's dtype when it is bf16 or f16, else "
          "f32); bf16/f16 halve the cache's memory and the attention's reads, int8 (a scale per "
          "token and head) and fp8 quarter them. Prefill and decode workers exchanging KV must "
          "agree");
ABSL_FLAG(int64_t, block_size, 16, "engine: KV cache block size in tokens");
ABSL_FLAG(std::string, quantization, "none",
          "engine: quantize the projection weights (q/k/v/o, gate/up/down) on load, round to "
          "nearest: none, int8 (per output channel, symmetric) or int4 (groups of 128, "
          "asymmetric); embeddings, norms and lm_head stay as stored, and so does a draft "
          "model's. Linear dequantizes inside its dot products (CPU); prefill and decode workers "
          "exchanging KV must agree");
ABSL_FLAG(bool, quantize_lm_head, false,
          "engine: with --quantization, quantize the LM head too (the output projection, "
          "vocab x hidden: on a model with a large vocabulary the largest single weight read "
          "every step); a tied LM head gets a quantized copy of its own beside the embedding "
          "table");
ABSL_FLAG(
    std::string, speculative_method, "",
    "engine, decode and combined roles: speculative decoding for requests that do not choose: "
    "off, ngram (prompt lookup: the continuation of the latest earlier occurrence of the "
    "sequence's last --ngram-min..--ngram-max tokens) or draft (a draft model, "
    "--speculative-model); default draft with --speculative-model, else off");
ABSL_FLAG(std::string, speculative_model, "",
          "engine, decode and combined roles: directory of a draft model for speculative decoding, "
          "small, with the target's tokenizer (refused otherwise); its KV cache shares the pool's "
          "blocks");
ABSL_FLAG(int32_t, num_speculative_tokens, 4,
          "engine: k, the most tokens proposed per sequence and step when speculating, in [1, 16] "
          "(a request's speculation.num_tokens overrides it)");
ABSL_FLAG(int32_t, ngram_min, 1, "engine: --speculative-method ngram: shortest suffix matched");
ABSL_FLAG(
    int32_t, ngram_max, 4,
    "engine: --speculative-method ngram: longest suffix matched (at most 32); the longest that "
    "occurs earlier wins");
ABSL_FLAG(bool, speculative_adaptive, true,
          "engine: adapt speculation to load: proposals only while a step holds fewer than "
          "--speculative-step-rows rows, and fewer (or none, for a few steps) for a sequence whose "
          "proposals are rarely kept; false: always k");
ABSL_FLAG(
    int32_t, speculative_step_rows, 0,
    "engine, --speculative-adaptive: rows (tokens) of decoding sequences a step may hold with "
    "proposals added; past it speculation costs throughput (0 = by device: 6 on the CPU, whose "
    "steps turn compute-bound within a few rows, 64 on a GPU)");
// The CUDA backend's tunings (common/backend/cuda_tunings.h); TANDEM_CUDA_* variables override
// them.
ABSL_FLAG(bool, cuda_fusion, true,
          "--device cuda: fused kernels (bias and silu*up in the GEMV; the q|k|v split, q/k norms, "
          "RoPE and the cache write in one kernel); the same bits either way");
ABSL_FLAG(bool, cuda_gemv_norm, true,
          "--device cuda: norms and residual adds inside the GEMV (with --cuda-fusion)");
ABSL_FLAG(bool, cuda_gemv_heads, true,
          "--device cuda: the q|k|v prologue run by the q|k|v GEMV's last block of each head (with "
          "--cuda-fusion)");
ABSL_FLAG(bool, cuda_tc_attention, false,
          "--device cuda: prompt attention on the tensor cores (queries and probabilities rounded "
          "to the cache's 16-bit type)");
ABSL_FLAG(int32_t, cuda_gemv_columns, 1,
          "--device cuda: output columns a GEMV warp computes: 1, 2 or 4");
ABSL_FLAG(
    int32_t, cuda_grid_split_keys, 256,
    "--device cuda: keys of an attention split that takes blocks of its own: 32, 64, 128 or 256");
ABSL_FLAG(bool, cuda_pdl, false,
          "--device cuda: programmatic dependent launch (compute capability 9 and newer)");
ABSL_FLAG(bool, cuda_op_profile, false,
          "--device cuda: per-op device time from the start (the op profile of forward_bench)");
ABSL_FLAG(std::string, device, "cpu", "engine: where the model runs: cpu, cuda (GPU 0) or cuda:N");
ABSL_FLAG(std::string, compute_dtype, "auto",
          "engine, --device cuda: 16-bit type of the weights and GEMMs: auto (the weights' own), "
          "bf16 or f16. f16 over BF16 weights (as vLLM's --dtype half) rounds GEMM inputs 8x finer "
          "at the same speed, but overflows past 65504 (a weight beyond it is refused at load)");
ABSL_FLAG(std::string, activation_dtype, "f32",
          "engine, --device cpu: f32 (exact); bf16 to round the activations of BF16 weights' "
          "Linear to BF16 and multiply with AVX-512 BF16 dot products (as llama.cpp's BF16 path); "
          "or int8 to quantize the activations of quantized weights' Linear to int8 (per row and "
          "weight group, symmetric) and multiply in integers (W8A8 / W4A8 with AVX-512 VNNI). "
          "bf16 and int8 are faster and less exact (docs/benchmarks.md). Prefill and decode "
          "workers exchanging KV must agree");
ABSL_FLAG(bool, split_gemm_inputs, false,
          "engine, --device cuda: run each GEMM over 16-bit weights on its input split into two "
          "16-bit terms (x = hi + lo): activations keep about 16 significant bits where rounding "
          "keeps 8 (BF16) or 11 (F16), close to f32 results, for twice the prefill GEMMs' "
          "arithmetic (steps of 9 to 128 rows read the weights once; steps of up to 8 rows are "
          "unchanged: their GEMV reads f32 activations)");
ABSL_FLAG(
    absl::optional<bool>, batch_invariant, absl::nullopt,
    "engine: Linear results independent of the batch, so a request's outputs do not depend on what "
    "it is batched with (default: true on the CPU, false on CUDA, where it costs throughput)");

namespace tandem {

absl::StatusOr<int64_t> ParseBytes(const std::string& flag, const std::string& text) {
  std::string digits = text;
  int64_t scale = 1;
  if (!digits.empty()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    if (unit == 'K' || unit == 'M' || unit == 'G') {
      scale = unit == 'K' ? (1 << 10) : unit == 'M' ? (1 << 20) : (int64_t{1} << 30);
      digits.pop_back();
    }
  }
  int64_t v;
  if (!absl::SimpleAtoi(digits, &v) || v < 0 || v > (int64_t{1} << 50) / scale) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", text, "' is not a size like 512M or 2G"));
  }
  return v * scale;
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags() {
  EngineOptions o;
  o.block_size = absl::GetFlag(FLAGS_block_size);
  auto memory = ParseBytes("--kv-cache-memory", absl::GetFlag(FLAGS_kv_cache_memory));
  if (!memory.ok()) return memory.status();
  o.kv_cache_memory = *memory;
  o.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.device_sampling = absl::GetFlag(FLAGS_device_sampling);
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", o.gpu_memory_utilization));
  }
  o.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  if (const std::string kv = absl::GetFlag(FLAGS_kv_cache_dtype);
      !ParseKvCacheDType(kv, &o.kv_cache_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-dtype must be auto, f32, bf16, f16 or int8, got '", kv, "'"));
  }
  SchedulerConfig& sc = o.scheduler;
  sc.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  sc.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  if (sc.max_num_seqs < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--max-num-seqs must be >= 0, got ", sc.max_num_seqs));
  // A GPU's decode step reads the weights once for the whole batch, so a wider batch costs little
  // more (256 concurrent requests share one step); the CPU's cost grows with the batch sooner.
  if (sc.max_num_seqs == 0)
    sc.max_num_seqs = absl::StartsWith(DeviceFromFlags(), "cuda") ? 256 : 128;
  sc.max_prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk) > 0
                             ? absl::GetFlag(FLAGS_prefill_chunk)
                             : absl::GetFlag(FLAGS_max_prefill_chunk);
  sc.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  sc.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  SpeculationOptions& so = o.speculation;
  if (const std::string m = absl::GetFlag(FLAGS_speculative_method); !m.empty()) {
    absl::StatusOr<SpeculationMethod> method = ParseSpeculationMethod(m);
    if (!method.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative-method: ", method.status().message()));
    so.method = *method;
  } else if (!absl::GetFlag(FLAGS_speculative_model).empty()) {
    so.method = SpeculationMethod::kDraft;
  }
  so.num_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  so.ngram_min = absl::GetFlag(FLAGS_ngram_min);
  so.ngram_max = absl::GetFlag(FLAGS_ngram_max);
  so.adaptive = absl::GetFlag(FLAGS_speculative_adaptive);
  so.step_rows = absl::GetFlag(FLAGS_speculative_step_rows);
  if (so.step_rows == 0) so.step_rows = absl::StartsWith(DeviceFromFlags(), "cuda") ? 64 : 6;
  return o;
}

std::string DeviceFromFlags() { return absl::GetFlag(FLAGS_device); }

absl::StatusOr<BackendOptions> BackendOptionsFromFlags() {
  BackendOptions o;
  o.device = DeviceFromFlags();
  if (const absl::optional<bool> b = absl::GetFlag(FLAGS_batch_invariant); b.has_value())
    o.batch_invariant = *b;
  absl::StatusOr<std::optional<DType>> compute =
      ParseComputeDType(absl::GetFlag(FLAGS_compute_dtype));
  if (!compute.ok()) return compute.status();
  o.compute_dtype = *compute;
  o.split_gemm_inputs = absl::GetFlag(FLAGS_split_gemm_inputs);
  absl::StatusOr<ActivationDType> activations =
      ParseActivationDType(absl::GetFlag(FLAGS_activation_dtype));
  if (!activations.ok()) return activations.status();
  o.activations = *activations;
  CudaTunings& t = o.cuda_tunings;
  t.fusion = absl::GetFlag(FLAGS_cuda_fusion);
  t.gemv_norm = absl::GetFlag(FLAGS_cuda_gemv_norm);
  t.gemv_heads = absl::GetFlag(FLAGS_cuda_gemv_heads);
  t.tensor_core_attention = absl::GetFlag(FLAGS_cuda_tc_attention);
  t.gemv_columns = absl::GetFlag(FLAGS_cuda_gemv_columns);
  t.grid_split_keys = absl::GetFlag(FLAGS_cuda_grid_split_keys);
  t.programmatic_launch = absl::GetFlag(FLAGS_cuda_pdl);
  t.op_profile = absl::GetFlag(FLAGS_cuda_op_profile);
  RETURN_IF_ERROR(ValidateCudaTunings(t));
  return o;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendFromFlags() {
  ASSIGN_OR_RETURN(const BackendOptions o, BackendOptionsFromFlags());
  return CreateBackend(o);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> DraftModelFromFlags(const std::string& target_dir,
                                                                const LlamaModel& target) {
  const std::string dir = absl::GetFlag(FLAGS_speculative_model);
  if (dir.empty()) return nullptr;
  // The same tokenizer: the draft's token ids must mean what the target's do.
  auto read = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::optional<std::string> a = read(target_dir + "/tokenizer.json"),
                                   b = read(dir + "/tokenizer.json");
  if (a.has_value() != b.has_value() || (a && *a != *b)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-model ", dir, ": its tokenizer.json ",
                     b ? "differs from" : "is missing, unlike", " the target's (", target_dir,
                     "): a draft model must share the target's tokenizer"));
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> draft = LlamaModel::Load(dir, target.backend());
  if (!draft.ok()) {
    return absl::Status(draft.status().code(),
                        absl::StrCat("--speculative-model ", dir, ": ", draft.status().message()));
  }
  if ((*draft)->config().vocab_size != target.config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-model ", dir, ": a vocabulary of ", (*draft)->config().vocab_size,
        " tokens, the target's has ", target.config().vocab_size,
        ": a draft model must share the target's tokenizer"));
  }
  return draft;
}

absl::StatusOr<LlamaLoadOptions> ModelLoadOptionsFromFlags() {
  LlamaLoadOptions o;
  const std::string text = absl::GetFlag(FLAGS_quantization);
  const std::optional<QuantType> q = ParseQuantType(text);
  if (!q.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization: '", text, "' is not none, int8 or int4"));
  }
  o.quantization = *q;
  o.quantize_lm_head = absl::GetFlag(FLAGS_quantize_lm_head);
  if (o.quantize_lm_head && o.quantization == QuantType::kNone) {
    return absl::InvalidArgumentError(
        "--quantize-lm-head needs --quantization int8 or int4 (it quantizes the LM head as the "
        "projections are)");
  }
  return o;
}

std::vector<std::string> EngineFlagArguments() {
  return {
      absl::StrCat("--quantization=", absl::GetFlag(FLAGS_quantization)),
      absl::StrCat("--quantize-lm-head=", absl::GetFlag(FLAGS_quantize_lm_head) ? "true" : "false"),
      absl::StrCat("--device=", absl::GetFlag(FLAGS_device)),
      absl::StrCat("--batch-invariant=",
                   absl::GetFlag(FLAGS_batch_invariant).has_value()
                       ? (*absl::GetFlag(FLAGS_batch_invariant) ? "true" : "false")
                       : ""),
      absl::StrCat("--max-prefill-chunk=", absl::GetFlag(FLAGS_prefill_chunk) > 0
                                               ? absl::GetFlag(FLAGS_prefill_chunk)
                                               : absl::GetFlag(FLAGS_max_prefill_chunk)),
      absl::StrCat("--max-num-batched-tokens=", absl::GetFlag(FLAGS_max_num_batched_tokens)),
      absl::StrCat("--max-num-seqs=", absl::GetFlag(FLAGS_max_num_seqs)),
      absl::StrCat("--max-queued-requests=", absl::GetFlag(FLAGS_max_queued_requests)),
      absl::StrCat("--max-model-len=", absl::GetFlag(FLAGS_max_model_len)),
      absl::StrCat("--kv-cache-memory=", absl::GetFlag(FLAGS_kv_cache_memory)),
      absl::StrCat("--gpu-memory-utilization=", absl::GetFlag(FLAGS_gpu_memory_utilization)),
      absl::StrCat("--enable-prefix-caching=",
                   absl::GetFlag(FLAGS_enable_prefix_caching) ? "true" : "false"),
      absl::StrCat("--cuda-graphs=", absl::GetFlag(FLAGS_cuda_graphs) ? "true" : "false"),
      absl::StrCat("--device-sampling=", absl::GetFlag(FLAGS_device_sampling) ? "true" : "false"),
      absl::StrCat("--block-size=", absl::GetFlag(FLAGS_block_size)),
      absl::StrCat("--speculative-method=", absl::GetFlag(FLAGS_speculative_method)),
      absl::StrCat("--speculative-model=", absl::GetFlag(FLAGS_speculative_model)),
      absl::StrCat("--num-speculative-tokens=", absl::GetFlag(FLAGS_num_speculative_tokens)),
      absl::StrCat("--ngram-min=", absl::GetFlag(FLAGS_ngram_min)),
      absl::StrCat("--ngram-max=", absl::GetFlag(FLAGS_ngram_max)),
      absl::StrCat("--speculative-adaptive=",
                   absl::GetFlag(FLAGS_speculative_adaptive) ? "true" : "false"),
      absl::StrCat("--speculative-step-rows=", absl::GetFlag(FLAGS_speculative_step_rows)),
      absl::StrCat("--kv-cache-dtype=", absl::GetFlag(FLAGS_kv_cache_dtype)),
      absl::StrCat("--compute-dtype=", absl::GetFlag(FLAGS_compute_dtype)),
      absl::StrCat("--activation-dtype=", absl::GetFlag(FLAGS_activation_dtype)),
      absl::StrCat("--split-gemm-inputs=",
                   absl::GetFlag(FLAGS_split_gemm_inputs) ? "true" : "false"),
      absl::StrCat("--cuda-fusion=", absl::GetFlag(FLAGS_cuda_fusion) ? "true" : "false"),
      absl::StrCat("--cuda-gemv-norm=", absl::GetFlag(FLAGS_cuda_gemv_norm) ? "true" : "false"),
      absl::StrCat("--cuda-gemv-heads=", absl::GetFlag(FLAGS_cuda_gemv_heads) ? "true" : "false"),
      absl::StrCat("--cuda-tc-attention=",
                   absl::GetFlag(FLAGS_cuda_tc_attention) ? "true" : "false"),
      absl::StrCat("--cuda-gemv-columns=", absl::GetFlag(FLAGS_cuda_gemv_columns)),
      absl::StrCat("--cuda-grid-split-keys=", absl::GetFlag(FLAGS_cuda_grid_split_keys)),
      absl::StrCat("--cuda-pdl=", absl::GetFlag(FLAGS_cuda_pdl) ? "true" : "false"),
      absl::StrCat("--cuda-op-profile=", absl::GetFlag(FLAGS_cuda_op_profile) ? "true" : "false"),
  };
}

}  // namespace tandem
