// `tandem eval`: a model's quality on a text, measured, not assumed. Perplexity over the text's
// tokens, and against a reference model (by default the same checkpoint unquantized, with the
// default KV cache) the share of positions whose most likely next token agrees (top-1) and the mean
// KL divergence KL(reference || model) per token. For judging --quantization, --kv-cache-dtype and
// --activation-dtype (whose reference runs with f32 activations).
//
// The text is tokenized once (with the tokenizer's special tokens, e.g. BOS) and cut into windows
// of --context tokens; consecutive windows share one token, so every token after the first is
// predicted exactly once, from its own window's context. Windows run as chunked prefills with
// logits for every row.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/token_windows.h"
#include "common/base/argmax.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/llama_model.h"
#include "common/serving/engine_flags.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, text_file, "", "eval: the text to score (UTF-8)");
ABSL_FLAG(std::string, windows_file, "",
          "eval: instead of --text-file, token windows to score each on its own: JSON "
          "{\"windows\": [[id, ...], ...]} (the trained models' heldout_eval.json)");
ABSL_FLAG(std::string, reference_model, "",
          "eval: the model to compare against (default: --model itself, unquantized, with the "
          "default KV cache)");
ABSL_FLAG(
    int64_t, context, 0,
    "eval and quantize: tokens per window (default: the smaller of 1024 and the model's context)");
ABSL_FLAG(int64_t, max_eval_tokens, 0, "eval: score at most this many tokens (0: the whole text)");
ABSL_FLAG(bool, progress, true, "eval and quantize: progress bars on stderr");

namespace tandem::cli {
namespace {

int EvalFail(const absl::Status& s) {
  std::fprintf(stderr, "tandem eval: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// log-softmax of one row, in double: logp[v] = x[v] - logsumexp(x).
void LogSoftmax(const float* x, int64_t vocab, std::vector<double>* logp) {
  logp->resize(static_cast<size_t>(vocab));
  double mx = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, double{x[v]});
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double{x[v]} - mx);
  const double lse = mx + std::log(sum);
  for (int64_t v = 0; v < vocab; ++v) (*logp)[v] = double{x[v]} - lse;
}

struct Totals {
  double nll = 0, ref_nll = 0, kl = 0;
  int64_t tokens = 0, agree = 0;
};

}  // namespace

int EvalCommand() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string text_file = absl::GetFlag(FLAGS_text_file);
  const std::string windows_file = absl::GetFlag(FLAGS_windows_file);
  if (model_dir.empty()) return EvalFail(absl::InvalidArgumentError("--model DIR is required"));
  if (text_file.empty() == windows_file.empty()) {
    return EvalFail(absl::InvalidArgumentError("give one of --text-file F or --windows-file F"));
  }
  auto engine = EngineOptionsFromFlags();
  if (!engine.ok()) return EvalFail(engine.status());
  auto load = ModelLoadOptionsFromFlags();
  if (!load.ok()) return EvalFail(load.status());
  auto backend_options = BackendOptionsFromFlags();
  if (!backend_options.ok()) return EvalFail(backend_options.status());
  auto backend = CreateBackend(*backend_options);
  if (!backend.ok()) return EvalFail(backend.status());
  auto model = LlamaModel::Load(model_dir, backend->get(), *load);
  if (!model.ok()) return EvalFail(model.status());
  auto context_or = WindowContext(**model, absl::GetFlag(FLAGS_context));
  if (!context_or.ok()) return EvalFail(context_or.status());
  const int64_t context = *context_or;
  const int64_t vocab = (*model)->config().vocab_size;
  // The token windows to score; row i of a window predicts its token i + 1.
  auto loaded = LoadTokenWindows(model_dir, text_file, windows_file, context, vocab,
                                 absl::GetFlag(FLAGS_max_eval_tokens));
  if (!loaded.ok()) return EvalFail(loaded.status());
  const std::vector<std::vector<int32_t>>& windows = loaded->windows;
  const int64_t total = loaded->predicted;
  auto scorer = WindowRunner::Create(std::move(model).value(), engine->kv_cache_dtype, context);
  if (!scorer.ok()) return EvalFail(scorer.status());

  // The reference: another directory, or this one as stored, when anything differs from that.
  std::unique_ptr<WindowRunner> reference;
  const std::string reference_dir = absl::GetFlag(FLAGS_reference_model);
  const bool self_reference = reference_dir.empty() || reference_dir == model_dir;
  const bool rounded_activations = backend_options->activations != ActivationDType::kF32;
  // Rounded activations are judged against the exact (f32) ones: the reference gets a backend of
  // its own.
  std::unique_ptr<Backend> reference_backend;
  if (rounded_activations) {
    BackendOptions exact = *backend_options;
    exact.activations = ActivationDType::kF32;
    auto b = CreateBackend(exact);
    if (!b.ok()) return EvalFail(b.status());
    reference_backend = std::move(b).value();
  }
  if (!self_reference || load->quantization != QuantType::kNone ||
      engine->kv_cache_dtype.has_value() || rounded_activations) {
    const std::string dir = reference_dir.empty() ? model_dir : reference_dir;
    auto ref = LlamaModel::Load(dir, reference_backend ? reference_backend.get() : backend->get());
    if (!ref.ok()) return EvalFail(ref.status());
    if ((*ref)->config().vocab_size != vocab) {
      return EvalFail(absl::InvalidArgumentError(
          absl::StrCat("--reference-model ", dir, ": a vocabulary of ", (*ref)->config().vocab_size,
                       " tokens, the model's has ", vocab)));
    }
    auto r = WindowRunner::Create(std::move(ref).value(), std::nullopt, context);
    if (!r.ok()) return EvalFail(r.status());
    reference = std::move(r).value();
  }

  ProgressBar progress("eval", "tokens", total, absl::GetFlag(FLAGS_progress));
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  constexpr int64_t kChunk = 128;
  Totals sum;
  std::vector<float> logits, ref_logits;
  for (const std::vector<int32_t>& window : windows) {
    const int64_t len = static_cast<int64_t>(window.size());
    for (int64_t begin = 0; begin < len - 1; begin += kChunk) {
      // Rows whose next token is in the window (the window's last token predicts nothing here).
      const int64_t n = std::min(kChunk, len - 1 - begin);
      if (absl::Status s = (*scorer)->Chunk(window, begin, n, &logits); !s.ok()) return EvalFail(s);
      if (reference) {
        if (absl::Status s = reference->Chunk(window, begin, n, &ref_logits); !s.ok()) {
          return EvalFail(s);
        }
      }
      // Rows are independent: scored in parallel, summed in row order.
      std::vector<Totals> rows(static_cast<size_t>(n));
      ThreadPool::Default().ParallelFor(n, 4, [&](int64_t b, int64_t e) {
        std::vector<double> lp, lq;
        for (int64_t i = b; i < e; ++i) {
          const int32_t next = window[begin + i + 1];
          const float* row = logits.data() + i * vocab;
          LogSoftmax(row, vocab, &lq);
          Totals& t = rows[i];
          t.nll = -lq[next];
          if (reference) {
            const float* ref_row = ref_logits.data() + i * vocab;
            LogSoftmax(ref_row, vocab, &lp);
            t.ref_nll = -lp[next];
            double kl = 0;
            for (int64_t v = 0; v < vocab; ++v) {
              if (lp[v] > -745) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
            }
            t.kl = std::max(0.0, kl);
            t.agree = ArgmaxRow(row, vocab) == ArgmaxRow(ref_row, vocab) ? 1 : 0;
          }
        }
      });
      for (const Totals& t : rows) {
        sum.nll += t.nll;
        sum.ref_nll += t.ref_nll;
        sum.kl += t.kl;
        sum.agree += t.agree;
      }
      sum.tokens += n;
      progress.Update(sum.tokens);
    }
  }
  progress.Finish();

  const double ppl = std::exp(sum.nll / sum.tokens);
  nlohmann::ordered_json j;
  j["perplexity"] = ppl;
  j["top1_agreement"] = nullptr;
  j["mean_kl"] = nullptr;
  if (reference) {
    j["top1_agreement"] = static_cast<double>(sum.agree) / sum.tokens;
    j["mean_kl"] = sum.kl / sum.tokens;
    j["reference_perplexity"] = std::exp(sum.ref_nll / sum.tokens);
  }
  j["tokens"] = sum.tokens;
  j["context"] = context;
  j["quantization"] = std::string(QuantTypeName(load->quantization));
  j["quantize_lm_head"] = load->quantize_lm_head;
  // A checkpoint stored quantized (GPTQ, AWQ, compressed-tensors): "none" otherwise.
  j["checkpoint_format"] =
      std::string(CheckpointFormatName((*scorer)->model().config().quantization.format));
  j["activation_dtype"] = std::string(ActivationDTypeName(backend_options->activations));
  j["kv_cache_dtype"] =
      std::string(DTypeName((*scorer)->model().KvCacheDType(engine->kv_cache_dtype)));
  j["seconds"] = seconds();
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("perplexity %.4f over %lld tokens (windows of %lld)\n", ppl,
              static_cast<long long>(sum.tokens), static_cast<long long>(context));
  if (reference) {
    std::printf("reference perplexity %.4f; top-1 agreement %.4f; mean KL %.6f nats/token\n",
                j["reference_perplexity"].get<double>(), j["top1_agreement"].get<double>(),
                j["mean_kl"].get<double>());
  } else {
    std::printf(
        "no reference: the model is as stored with the default KV cache and f32 activations "
        "(give --quantization, --kv-cache-dtype, --activation-dtype or --reference-model to "
        "compare)\n");
  }
  return 0;
}

}  // namespace tandem::cli
