// Engine scheduling benchmarks on the CPU backend, side by side in one run:
//  1. continuous batching vs static batching: the same engine and requests, but the static run
//     submits requests in batches of --static-batch and waits for the whole batch (the longest
//     output) before admitting the next;
//  2. a prefix-heavy workload (K shared prefixes × M suffixes) with prefix caching on and off.
// Prints throughput (generated tokens/s, requests/s) and the ratios.
//
//   engine_bench --model DIR [--requests 64] [--static-batch 16] [--prefixes 4] [--suffixes 16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cpu/openblas_setup.h"
#include "common/base/command_line.h"
#include "common/engine/engine.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(int, requests, 64, "requests in the continuous-vs-static comparison");
ABSL_FLAG(int, static_batch, 16, "batch size of the static-batching baseline");
ABSL_FLAG(int, min_output, 4, "shortest output (tokens)");
ABSL_FLAG(int, max_output, 96, "longest output (tokens)");
ABSL_FLAG(int, prompt_len, 48, "prompt length of the first workload");
ABSL_FLAG(int, prefixes, 4, "shared prefixes in the prefix workload");
ABSL_FLAG(int, suffixes, 16, "requests per prefix");
ABSL_FLAG(int, prefix_len, 256, "shared prefix length (tokens)");
ABSL_FLAG(int, suffix_len, 16, "suffix length (tokens)");
ABSL_FLAG(int, prefix_output, 8, "output tokens per request in the prefix workload");
ABSL_FLAG(int64_t, max_num_batched_tokens, 512, "engine token budget per step");
ABSL_FLAG(int64_t, max_num_seqs, 64, "engine sequence cap");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  double seconds = 0;
  int64_t generated = 0;
  int64_t requests = 0;
  EngineStats stats;
};

std::unique_ptr<Engine> MakeEngine(LlamaModel* model, bool caching) {
  EngineOptions o;
  o.enable_prefix_caching = caching;
  o.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  o.scheduler.max_prefill_chunk = 256;
  o.scheduler.max_model_len = std::min<int64_t>(model->config().max_position_embeddings, 2048);
  o.kv_cache_memory = KvCacheStorage::BytesPerBlock(model->KvGeometry(1, 16)) *
                      (o.scheduler.max_num_seqs * 512 / 16);
  return Engine::Create(model, o).value();
}

// Submits `requests` in groups of `group` (all at once when group <= 0), draining between groups.
RunResult Run(LlamaModel* model, const std::vector<EngineRequest>& requests, int group,
              bool caching) {
  auto engine = MakeEngine(model, caching);
  RunResult r;
  const auto t0 = Clock::now();
  const size_t step = group > 0 ? static_cast<size_t>(group) : requests.size();
  for (size_t begin = 0; begin < requests.size(); begin += step) {
    for (size_t i = begin; i < std::min(requests.size(), begin + step); ++i) {
      absl::Status s = engine->AddRequest(requests[i]);
      if (!s.ok()) std::fprintf(stderr, "engine_bench: %s\n", std::string(s.message()).c_str());
    }
    while (engine->HasWork()) {
      auto outs = engine->Step();
      if (!outs.ok()) return r;
      for (const auto& o : *outs) {
        r.generated += static_cast<int64_t>(o.new_token_ids.size());
        r.requests += o.finished;
      }
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.stats = engine->stats();
  return r;
}

void Print(const char* name, const RunResult& r) {
  // The host's share of a step: the engine's time outside the forward pass (scheduling, batch
  // assembly, sampling and stop bookkeeping), which a GPU would spend waiting.
  const double host = r.stats.step_seconds - r.stats.forward_seconds;
  std::printf(
      "  %-28s %8.2f s %9.1f tok/s %7.2f req/s  steps=%lld preemptions=%lld prefix hits %lld/%lld "
      "tokens  host %.0f us/step (%.2f%% of step time)\n",
      name, r.seconds, r.generated / r.seconds, r.requests / r.seconds,
      static_cast<long long>(r.stats.steps), static_cast<long long>(r.stats.preemptions),
      static_cast<long long>(r.stats.prefix_hits), static_cast<long long>(r.stats.prefix_queries),
      r.stats.steps > 0 ? 1e6 * host / r.stats.steps : 0.0,
      r.stats.step_seconds > 0 ? 100 * host / r.stats.step_seconds : 0.0);
}

int Main() {
  auto backend = CpuBackend::Create({}).value();
  auto model_or = LlamaModel::Load(absl::GetFlag(FLAGS_model), backend.get());
  if (!model_or.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", std::string(model_or.status().message()).c_str());
    return 1;
  }
  auto model = std::move(model_or).value();
  const int64_t vocab = model->config().vocab_size;
  std::mt19937 rng(5);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  };

  // 1. Mixed output lengths.
  std::vector<EngineRequest> mixed;
  for (int i = 0; i < absl::GetFlag(FLAGS_requests); ++i) {
    EngineRequest r;
    r.id = "m" + std::to_string(i);
    r.prompt_token_ids = tokens(absl::GetFlag(FLAGS_prompt_len));
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    const int lo = absl::GetFlag(FLAGS_min_output), hi = absl::GetFlag(FLAGS_max_output);
    r.params.max_tokens = lo + static_cast<int>(rng() % (hi - lo + 1));
    mixed.push_back(std::move(r));
  }
  std::printf("model=%s backend=%s\n", absl::GetFlag(FLAGS_model).c_str(),
              backend->device_description().c_str());
  std::printf("workload 1: %zu requests, prompt %d tokens, outputs %d..%d tokens\n", mixed.size(),
              absl::GetFlag(FLAGS_prompt_len), absl::GetFlag(FLAGS_min_output),
              absl::GetFlag(FLAGS_max_output));
  const RunResult continuous = Run(model.get(), mixed, 0, true);
  const RunResult fixed = Run(model.get(), mixed, absl::GetFlag(FLAGS_static_batch), true);
  Print("continuous batching", continuous);
  Print(("static batches of " + std::to_string(absl::GetFlag(FLAGS_static_batch))).c_str(), fixed);
  std::printf("  throughput ratio continuous / static: %.2f\n",
              (continuous.generated / continuous.seconds) / (fixed.generated / fixed.seconds));

  // 2. Prefix-heavy.
  std::vector<EngineRequest> shared;
  for (int p = 0; p < absl::GetFlag(FLAGS_prefixes); ++p) {
    const std::vector<int32_t> prefix = tokens(absl::GetFlag(FLAGS_prefix_len));
    for (int s = 0; s < absl::GetFlag(FLAGS_suffixes); ++s) {
      EngineRequest r;
      r.id = "p" + std::to_string(p) + "_" + std::to_string(s);
      r.prompt_token_ids = prefix;
      for (int32_t t : tokens(absl::GetFlag(FLAGS_suffix_len))) r.prompt_token_ids.push_back(t);
      r.params.temperature = 0;
      r.params.ignore_eos = true;
      r.params.max_tokens = absl::GetFlag(FLAGS_prefix_output);
      shared.push_back(std::move(r));
    }
  }
  std::shuffle(shared.begin(), shared.end(), rng);
  std::printf(
      "workload 2: %d prefixes of %d tokens x %d suffixes of %d tokens, %d output tokens each\n",
      absl::GetFlag(FLAGS_prefixes), absl::GetFlag(FLAGS_prefix_len), absl::GetFlag(FLAGS_suffixes),
      absl::GetFlag(FLAGS_suffix_len), absl::GetFlag(FLAGS_prefix_output));
  const RunResult cached = Run(model.get(), shared, 0, true);
  const RunResult uncached = Run(model.get(), shared, 0, false);
  Print("prefix caching on", cached);
  Print("prefix caching off", uncached);
  std::printf("  request throughput ratio on / off: %.2f\n",
              (cached.requests / cached.seconds) / (uncached.requests / uncached.seconds));
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::MaybeReexecWithFasterOpenBlasCore(argv);
  tandem::ParseCommandLine(argc, argv);
  return tandem::Main();
}
