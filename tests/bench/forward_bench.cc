// Forward-pass throughput: prefill tokens/s for a prompt and decode tokens/s at batch 1 (and
// optionally batch N), plus the effective weight bandwidth of decode (bytes of weights read per
// token ÷ time per token), which is what batch-1 decode is bound by. On CUDA it also measures the
// device's ceilings in the same run (copy-kernel bandwidth, BF16 cuBLAS GEMM throughput) and prints
// decode's share of the memory roofline and prefill's share of tensor-core peak.
//
//   forward_bench --model DIR [--device cpu|cuda] [--prompt-len 128] [--decode-tokens 32]
//                 [--decode-batch 1] [--repeats 3] [--cuda-graphs] [--sampling
//                 argmax|host|draw|nucleus]
//                 [--profile-ops] [--tc-attention] [--gemv-columns 1|2|4] [--pdl] [--fusion=false]
//                 [--gemv-norm=false] [--gemv-heads=false] [--grid-split-keys 32|64|128|256]
//                 [--roofline-copy-mib 1024] [--roofline-gemm 8192]
//                 [--kv-cache-dtype auto|f32|bf16|f16|int8|fp8] [--quantization none|int8|int4]
//                 [--activation-dtype f32|bf16|int8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/types/optional.h"
#include "common/backend/create_backend.h"
#include "nlohmann/json.hpp"
#ifdef TANDEM_HAVE_CUDA
#include "common/backend/cuda/roofline.h"
#endif
#include "common/backend/cpu/openblas_setup.h"
#include "common/base/command_line.h"
#include "common/model/llama_model.h"
#include "common/quant/quantized_matrix.h"
#include "tests/bench/cpu_roofline.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(int64_t, prompt_len, 128, "prompt tokens for the prefill measurement");
ABSL_FLAG(int64_t, decode_tokens, 32, "decode steps measured");
ABSL_FLAG(int64_t, decode_batch, 1, "sequences decoded together per step");
ABSL_FLAG(int, repeats, 3, "repetitions; the best is reported");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, compute_dtype, "auto",
          "CUDA: 16-bit type of the weights and GEMMs: auto (the weights' own), bf16 or f16 (the "
          "engine's flag)");
ABSL_FLAG(bool, split_gemm_inputs, false,
          "CUDA: GEMM inputs over 16-bit weights split into two 16-bit terms, about 16 significant "
          "bits for twice the GEMM arithmetic (the engine's flag)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "what the KV cache stores: f32, bf16, f16, int8, fp8 (CUDA) or auto (on a GPU the "
          "model's "
          "16-bit dtype, else f32), as the engine's flag");
ABSL_FLAG(std::string, quantization, "none",
          "quantize the projections on load: none, int8 (per output channel) or int4 (groups of "
          "128), as the engine's flag; a checkpoint that is already quantized loads as it is");
ABSL_FLAG(bool, quantize_lm_head, false,
          "with --quantization, quantize the LM head too (the engine's flag)");
ABSL_FLAG(std::string, activation_dtype, "f32",
          "CPU: f32, bf16 (BF16 weights' activations rounded to BF16 for vdpbf16ps) or int8 "
          "(quantized weights' activations rounded to int8 for VNNI), as the engine's flag");
ABSL_FLAG(bool, profile_ops, false,
          "after the measurement, time every op of one prefill and of the decode steps (GPU "
          "backends; op by op, so without graphs) and print a table per phase");
ABSL_FLAG(bool, cuda_graphs, true,
          "decode steps as CUDA graphs (GPU backends), as the engine runs them");
ABSL_FLAG(bool, tc_attention, false,
          "prompt attention on the tensor cores where it can (CUDA, 16-bit KV cache, head_dim 64 "
          "or 128): sets TANDEM_CUDA_TC_ATTENTION=1 for the backend");
ABSL_FLAG(bool, pdl, false,
          "CUDA: launch the decode path's kernels with programmatic dependent launch (sets "
          "TANDEM_CUDA_PDL=1)");
ABSL_FLAG(
    bool, fusion, true,
    "CUDA: the fusions (bias and silu-mul in the GEMV; the q|k|v split, q/k norms, RoPE and the KV "
    "cache write in one kernel); false sets TANDEM_CUDA_FUSION=0, for a side-by-side run");
ABSL_FLAG(bool, gemv_norm, true,
          "CUDA: the RMSNorm and the residual add inside the decode GEMV (with --fusion); false "
          "sets TANDEM_CUDA_GEMV_NORM=0");
ABSL_FLAG(bool, gemv_heads, true,
          "CUDA: the q|k|v prologue run by the q|k|v GEMV's last block of each head (with "
          "--fusion, over a KV cache of the weights' 16-bit type); false sets "
          "TANDEM_CUDA_GEMV_HEADS=0 (the prologue kernel instead)");
ABSL_FLAG(int, gemv_columns, 0,
          "output columns a GEMV warp computes on CUDA (1, 2 or 4; sets TANDEM_CUDA_GEMV_COLUMNS; "
          "0: the backend's default)");
ABSL_FLAG(int, grid_split_keys, 0,
          "CUDA: keys of an attention split where the splits take blocks of their own (32, 64, 128 "
          "or 256; sets TANDEM_CUDA_GRID_SPLIT_KEYS; 0: the backend's default, 256)");
ABSL_FLAG(std::string, sampling, "argmax",
          "what a decode step returns per row: argmax (taken on the device, as greedy steps), host "
          "(the row's logits copied to the host, as sampling without a device sampler), draw (a "
          "token drawn on the device at temperature 1, as temperature and min-p steps), nucleus "
          "(256 candidates and the row's weight total, as top-p steps); draw and nucleus need a "
          "GPU backend (elsewhere rows come to the host)");
ABSL_FLAG(int64_t, roofline_copy_mib, 1024,
          "MiB the copy kernel of the bandwidth ceiling copies (CUDA), or the read kernel reads "
          "(CPU: decode's share of it is printed; 0 skips it on the CPU)");
ABSL_FLAG(int, roofline_gemm, 8192,
          "CUDA: m = n = k of the cuBLAS BF16 GEMM of the tensor-core ceiling");
ABSL_FLAG(absl::optional<bool>, stack_projections, absl::nullopt,
          "load q|k|v and gate|up as one stacked weight each (default: the backend's choice)");
ABSL_FLAG(absl::optional<bool>, batch_invariant, absl::nullopt,
          "batch-invariant Linear (default: the backend's own, on for the CPU, off for CUDA); "
          "false on the CPU uses OpenBLAS GEMM for large batches");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  const int64_t prompt_len = absl::GetFlag(FLAGS_prompt_len);
  const int64_t decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  const int64_t batch = absl::GetFlag(FLAGS_decode_batch);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  if (absl::GetFlag(FLAGS_roofline_copy_mib) < 0 || absl::GetFlag(FLAGS_roofline_gemm) < 16) {
    std::fprintf(stderr,
                 "forward_bench: --roofline-copy-mib must be >= 0 and --roofline-gemm >= 16\n");
    return 1;
  }
  if (absl::GetFlag(FLAGS_tc_attention)) ::setenv("TANDEM_CUDA_TC_ATTENTION", "1", 1);
  if (absl::GetFlag(FLAGS_pdl)) ::setenv("TANDEM_CUDA_PDL", "1", 1);
  if (!absl::GetFlag(FLAGS_fusion)) ::setenv("TANDEM_CUDA_FUSION", "0", 1);
  if (!absl::GetFlag(FLAGS_gemv_norm)) ::setenv("TANDEM_CUDA_GEMV_NORM", "0", 1);
  if (!absl::GetFlag(FLAGS_gemv_heads)) ::setenv("TANDEM_CUDA_GEMV_HEADS", "0", 1);
  if (const int c = absl::GetFlag(FLAGS_gemv_columns); c != 0) {
    ::setenv("TANDEM_CUDA_GEMV_COLUMNS", std::to_string(c).c_str(), 1);
  }
  if (const int k = absl::GetFlag(FLAGS_grid_split_keys); k != 0) {
    ::setenv("TANDEM_CUDA_GRID_SPLIT_KEYS", std::to_string(k).c_str(), 1);
  }
  BackendOptions o;
  o.device = absl::GetFlag(FLAGS_device);
  if (const absl::optional<bool> b = absl::GetFlag(FLAGS_batch_invariant); b.has_value())
    o.batch_invariant = *b;
  absl::StatusOr<std::optional<DType>> compute =
      ParseComputeDType(absl::GetFlag(FLAGS_compute_dtype));
  if (!compute.ok()) {
    std::fprintf(stderr, "forward_bench: %s\n", std::string(compute.status().message()).c_str());
    return 1;
  }
  o.compute_dtype = *compute;
  o.split_gemm_inputs = absl::GetFlag(FLAGS_split_gemm_inputs);
  const std::string activation = absl::GetFlag(FLAGS_activation_dtype);
  absl::StatusOr<ActivationDType> activations = ParseActivationDType(activation);
  if (!activations.ok()) {
    std::fprintf(stderr, "forward_bench: %s\n",
                 std::string(activations.status().message()).c_str());
    return 1;
  }
  o.activations = *activations;
  LlamaLoadOptions load;
  if (const absl::optional<bool> st = absl::GetFlag(FLAGS_stack_projections); st.has_value())
    load.stack_projections = *st;
  if (const std::optional<QuantType> q = ParseQuantType(absl::GetFlag(FLAGS_quantization))) {
    load.quantization = *q;
    load.quantize_lm_head = absl::GetFlag(FLAGS_quantize_lm_head);
  } else {
    std::fprintf(stderr, "forward_bench: --quantization must be none, int8 or int4\n");
    return 1;
  }
  auto backend_or = CreateBackend(o);
  if (!backend_or.ok()) {
    std::fprintf(stderr, "forward_bench: %s\n", std::string(backend_or.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<Backend> backend = std::move(backend_or).value();
  auto model_or = LlamaModel::Load(dir, backend.get(), load);
  if (!model_or.ok()) {
    std::fprintf(stderr, "forward_bench: %s\n", std::string(model_or.status().message()).c_str());
    return 1;
  }
  auto model = std::move(model_or).value();
  const ModelConfig& c = model->config();
  // The bytes the backend holds (quantized codes, scales and zero points where quantized).
  const double weight_bytes = static_cast<double>(model->weight_bytes());
  // Decode reads every weight once per step except the embedding table (one row per token), which
  // is read whole only when it is the LM head too (tied, and not quantized into a copy).
  const double dtype_bytes = static_cast<double>(DTypeSize(c.torch_dtype));
  const bool embed_is_head =
      c.tie_word_embeddings && !(load.quantize_lm_head && load.quantization != QuantType::kNone);
  const double step_bytes =
      weight_bytes - (embed_is_head ? 0.0 : c.vocab_size * c.hidden_size * dtype_bytes);

  const int64_t block_size = 16;
  const int64_t per_seq_blocks = (prompt_len + decode_tokens + block_size) / block_size + 1;
  std::optional<DType> requested_kv;
  if (!ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype), &requested_kv)) {
    std::fprintf(stderr,
                 "forward_bench: --kv-cache-dtype must be auto, f32, bf16, f16, int8 or fp8\n");
    return 1;
  }
  const DType kv_dtype = model->KvCacheDType(requested_kv);
  auto kv = KvCacheStorage::Create(backend.get(),
                                   model->KvGeometry(per_seq_blocks * batch, block_size, kv_dtype))
                .value();
  std::mt19937 rng(1);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
  std::vector<std::vector<int32_t>> tables(batch);
  for (int64_t s = 0; s < batch; ++s) {
    tables[s].resize(per_seq_blocks);
    std::iota(tables[s].begin(), tables[s].end(), static_cast<int32_t>(s * per_seq_blocks));
  }
  const std::string sampling = absl::GetFlag(FLAGS_sampling);
  if (sampling != "argmax" && sampling != "host" && sampling != "draw" && sampling != "nucleus") {
    std::fprintf(stderr, "forward_bench: --sampling must be argmax, host, draw or nucleus\n");
    return 1;
  }
  std::vector<float> logits;
  std::vector<int32_t> argmax;
  DeviceSamples samples;
  model->runner().set_use_graphs(absl::GetFlag(FLAGS_cuda_graphs));
  const auto prefill = [&](int64_t s) {
    ForwardInput in;
    in.token_ids = prompt;
    in.seqs.push_back({prompt_len, 0, tables[s]});
    in.logits_rows = {static_cast<int32_t>(prompt_len - 1)};
    const absl::Status st = model->runner().Forward(in, kv.get(), &logits);
    if (!st.ok()) std::fprintf(stderr, "forward_bench: prefill: %s\n", st.ToString().c_str());
    return st.ok();
  };
  // after_step (optional) is called with each step's seconds.
  const auto decode = [&](const std::function<void(double)>& after_step = nullptr) {
    for (int64_t step = 0; step < decode_tokens; ++step) {
      const auto step_start = Clock::now();
      ForwardInput in;
      in.allow_graph = true;
      for (int64_t s = 0; s < batch; ++s) {
        in.token_ids.push_back(static_cast<int32_t>((step * 31 + s) % c.vocab_size));
        in.seqs.push_back({1, prompt_len + step, tables[s]});
        in.logits_rows.push_back(static_cast<int32_t>(s));
        if (sampling == "argmax") in.argmax_only.push_back(1);
        if (sampling == "draw" || sampling == "nucleus") {
          RowDraw d;
          d.mode = sampling == "draw" ? RowDraw::kDraw : RowDraw::kTotal;
          d.u = static_cast<double>((step * 7919 + s * 104729) % 1000003) / 1000003.0;
          in.sample_draws.push_back(d);
          in.sample_top_k.push_back(
              sampling == "nucleus" ? std::min<int32_t>(ModelRunner::kMaxSampleTopK, c.vocab_size)
                                    : 0);
        }
      }
      const absl::Status st =
          model->runner().Forward(in, kv.get(), &logits, &argmax, nullptr, &samples);
      if (!st.ok()) {
        std::fprintf(stderr, "forward_bench: decode step %lld: %s\n", static_cast<long long>(step),
                     st.ToString().c_str());
        return false;
      }
      if (after_step) after_step(std::chrono::duration<double>(Clock::now() - step_start).count());
    }
    return true;
  };
  // The CPU's read ceiling (the same pool as the backend's, TANDEM_NUM_THREADS, reading a buffer
  // past the caches): on a shared machine the bandwidth moves from minute to minute, so it is read
  // between the decode repeats and, below, right after every step of one more decode pass; the
  // median of those per-step shares is the figure.
  std::unique_ptr<bench::ReadBandwidthProbe> read_probe;
  if (backend->name() == "cpu" && absl::GetFlag(FLAGS_roofline_copy_mib) > 0) {
    read_probe = std::make_unique<bench::ReadBandwidthProbe>(
        ThreadPool::Default(), static_cast<size_t>(absl::GetFlag(FLAGS_roofline_copy_mib)) << 20);
  }
  double best_prefill = 1e30, best_decode = 1e30;
  for (int r = 0; r < repeats; ++r) {
    // Prefill every sequence's prompt (timed for sequence 0 only).
    for (int64_t s = 0; s < batch; ++s) {
      const auto t0 = Clock::now();
      if (!prefill(s)) return 1;
      if (s == 0)
        best_prefill =
            std::min(best_prefill, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const auto t0 = Clock::now();
    if (!decode()) return 1;
    best_decode = std::min(best_decode, std::chrono::duration<double>(Clock::now() - t0).count());
    if (read_probe) read_probe->Measure(2);
  }
  // And step by step: each decode step's weight bandwidth over a read pass right after it, which
  // sees the same neighbours; the median of those is the share least moved by them.
  std::vector<double> paired_shares, paired_reads;
  if (read_probe) {
    for (int64_t s = 0; s < batch; ++s) {
      if (!prefill(s)) return 1;
    }
    if (!decode([&](double step_s) {
          paired_reads.push_back(read_probe->Measure(1));
          paired_shares.push_back(100.0 * step_bytes / step_s / 1e9 / paired_reads.back());
        })) {
      return 1;
    }
    std::sort(paired_shares.begin(), paired_shares.end());
    std::sort(paired_reads.begin(), paired_reads.end());
  }
  const double step_seconds = best_decode / decode_tokens;
  const bool measured_with_graphs =
      model->runner().use_graphs();  // --profile-ops turns them off below
  std::printf(
      "model=%s arch=%s dtype=%s quantization=%s activations=%s weights=%.1f MB kv=%s "
      "backend=%s\n",
      dir.c_str(), c.architecture.c_str(), std::string(DTypeName(c.torch_dtype)).c_str(),
      absl::GetFlag(FLAGS_quantization).c_str(), activation.c_str(), weight_bytes / 1e6,
      std::string(DTypeName(kv_dtype)).c_str(), backend->device_description().c_str());
  std::printf("prefill: %lld tokens in %.4f s = %.1f tokens/s%s\n",
              static_cast<long long>(prompt_len), best_prefill, prompt_len / best_prefill,
              absl::GetFlag(FLAGS_tc_attention) && backend->name() == "cuda"
                  ? " (attention on the tensor cores)"
                  : "");
  if (const int c = absl::GetFlag(FLAGS_gemv_columns); c != 0)
    std::printf("gemv: %d output columns a warp\n", c);
  if (absl::GetFlag(FLAGS_pdl)) std::printf("pdl: programmatic dependent launch on\n");
  if (!absl::GetFlag(FLAGS_fusion)) std::printf("fusion: off\n");
  if (!absl::GetFlag(FLAGS_gemv_norm)) std::printf("gemv norm: off\n");
  if (!absl::GetFlag(FLAGS_gemv_heads))
    std::printf("gemv heads: off (the q|k|v prologue kernel)\n");
  std::printf(
      "decode:  batch %lld, %.2f ms/step = %.1f tokens/s (effective weight bandwidth %.2f "
      "GB/s)%s%s\n",
      static_cast<long long>(batch), step_seconds * 1e3, batch / step_seconds,
      step_bytes / step_seconds / 1e9, measured_with_graphs ? ", CUDA graphs" : "",
      sampling == "argmax"                                         ? ", argmax on the device"
      : sampling == "host" || !model->runner().samples_on_device() ? ", logits to the host"
      : sampling == "draw"                                         ? ", tokens drawn on the device"
                           : ", top-p candidates on the device");
  if (!model->runner().graph_error().empty())
    std::printf("graphs failed: %s\n", model->runner().graph_error().c_str());
  if (absl::GetFlag(FLAGS_profile_ops)) {
    // Once more, op by op with every op timed: sequence 0's prefill, then the decode steps.
    backend->SetOpProfiling(true);
    model->runner().set_use_graphs(false);
    if (!prefill(0)) return 1;
    const std::string prefill_ops = backend->OpProfileReport();
    if (prefill_ops.empty()) {
      std::printf("--profile-ops: this backend does not time its ops\n");
    } else {
      for (int64_t s = 1; s < batch; ++s) {
        if (!prefill(s)) return 1;
      }
      (void)backend->OpProfileReport();
      if (!decode()) return 1;
      std::printf("ops of one %lld-token prefill:\n%s", static_cast<long long>(prompt_len),
                  prefill_ops.c_str());
      std::printf("ops of %lld decode steps of batch %lld (op by op):\n%s",
                  static_cast<long long>(decode_tokens), static_cast<long long>(batch),
                  backend->OpProfileReport().c_str());
    }
    backend->SetOpProfiling(false);
  }
  // One line with every setting and figure of the run, for scripts (gpu_summary.py,
  // gpu_runs_test.sh).
  nlohmann::json record = {{"model", dir},
                           {"arch", c.architecture},
                           {"device", backend->name()},
                           {"backend", backend->device_description()},
                           {"kv", std::string(DTypeName(kv_dtype))},
                           {"kv_cache_dtype", absl::GetFlag(FLAGS_kv_cache_dtype)},
                           {"quantization", absl::GetFlag(FLAGS_quantization)},
                           {"activation_dtype", activation},
                           {"compute_dtype", absl::GetFlag(FLAGS_compute_dtype)},
                           {"split_gemm_inputs", absl::GetFlag(FLAGS_split_gemm_inputs)},
                           {"prompt_len", prompt_len},
                           {"batch", batch},
                           {"graphs", measured_with_graphs},
                           {"sampling", sampling},
                           {"fusion", absl::GetFlag(FLAGS_fusion)},
                           {"gemv_norm", absl::GetFlag(FLAGS_gemv_norm)},
                           {"gemv_heads", absl::GetFlag(FLAGS_gemv_heads)},
                           {"gemv_columns", absl::GetFlag(FLAGS_gemv_columns)},
                           {"grid_split_keys", absl::GetFlag(FLAGS_grid_split_keys)},
                           {"pdl", absl::GetFlag(FLAGS_pdl)},
                           {"tc_attention", absl::GetFlag(FLAGS_tc_attention)},
                           {"prefill_tok_s", prompt_len / best_prefill},
                           {"decode_ms", step_seconds * 1e3},
                           {"decode_tok_s", batch / step_seconds},
                           {"weight_gb_s", step_bytes / step_seconds / 1e9},
                           {"graph_error", model->runner().graph_error()}};
#ifdef TANDEM_HAVE_CUDA
  if (backend->name() == "cuda") {
    // Prefill does 2 FLOPs per weight per token (attention's share is small at these lengths),
    // except the LM head, which it runs for the last token only.
    const double params =
        step_bytes / dtype_bytes - static_cast<double>(c.vocab_size) * c.hidden_size;
    const int64_t copy_mib = absl::GetFlag(FLAGS_roofline_copy_mib);
    const int gemm = absl::GetFlag(FLAGS_roofline_gemm);
    auto bandwidth = cuda::MeasureCopyBandwidth(static_cast<size_t>(copy_mib) << 20);
    auto tflops = cuda::MeasureBf16GemmTflops(gemm, gemm, gemm);
    if (!bandwidth.ok() || !tflops.ok()) {
      std::fprintf(
          stderr, "forward_bench: roofline measurement failed: %s\n",
          std::string((bandwidth.ok() ? tflops.status() : bandwidth.status()).message()).c_str());
      return 1;
    }
    const double decode_pct = 100.0 * step_bytes / step_seconds / 1e9 / *bandwidth;
    const double prefill_pct = 100.0 * 2.0 * params * prompt_len / best_prefill / 1e12 / *tflops;
    std::printf(
        "roofline: copy kernel %.0f GB/s -> decode at %.1f%% of it; BF16 GEMM %.0f TFLOP/s -> "
        "prefill at %.1f%% of it\n",
        *bandwidth, decode_pct, *tflops, prefill_pct);
    record["copy_gb_s"] = *bandwidth;
    record["decode_roofline_pct"] = decode_pct;
    record["gemm_tflops"] = *tflops;
    record["prefill_peak_pct"] = prefill_pct;
  }
#endif
  if (read_probe && !paired_shares.empty()) {
    const auto quantile = [](const std::vector<double>& v, double q) {
      return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
    };
    const double best_read = read_probe->best();
    const double best_pct = 100.0 * step_bytes / step_seconds / 1e9 / best_read;
    std::printf(
        "roofline: read kernel %.1f GB/s (median of %zu passes, each right after a decode step) "
        "-> decode at %.1f%% of it (step by step: P10 %.1f%%, P90 %.1f%%; the fastest repeat's "
        "mean step against the best read, %.1f GB/s: %.1f%%)\n",
        quantile(paired_reads, 0.5), paired_reads.size(), quantile(paired_shares, 0.5),
        quantile(paired_shares, 0.1), quantile(paired_shares, 0.9), best_read, best_pct);
    record["read_gb_s"] = quantile(paired_reads, 0.5);
    record["decode_roofline_pct"] = quantile(paired_shares, 0.5);
    record["best_read_gb_s"] = best_read;
    record["decode_best_roofline_pct"] = best_pct;
  }
  std::printf("json: %s\n", record.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::MaybeReexecWithFasterOpenBlasCore(argv);
  tandem::ParseCommandLine(argc, argv);
  return tandem::Run();
}
