// Speculative decoding, side by side in one run (docs/benchmarks.md): the same target and greedy
// requests with speculation off, n-gram, a draft model (k fixed), and the draft with the adaptive
// policy.
//  1. Batch 1: decode tokens/s over KJV prompts (prefill excluded), the ratio to off, proposals
//     kept, tokens per speculating step, and the acceptance rate at each proposal position.
//  2. Throughput at each --concurrency (closed loop: that many requests in flight until
//     2 × concurrency, at least 8, have finished): output tokens/s and the ratio to off.
//
//   spec_bench --model TARGET [--draft DRAFT] [--k 4] [--output-len 128] [--concurrency 1,8,32,64]
//   (engine flags as the workers take them: --device, --kv-cache-memory, ...)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/command_line.h"
#include "common/serving/engine_flags.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "", "target model directory");
ABSL_FLAG(std::string, draft, "", "draft model directory (its rows are skipped without it)");
ABSL_FLAG(int32_t, k, 4, "proposed tokens per step (--num-speculative-tokens)");
ABSL_FLAG(int32_t, output_len, 128, "batch 1: tokens generated per prompt");
ABSL_FLAG(int32_t, prompts, 4, "batch 1: KJV prompts, one after another");
ABSL_FLAG(std::string, concurrency, "1,8,32,64", "throughput levels (empty: skip part 2)");
ABSL_FLAG(int32_t, concurrency_output_len, 128, "throughput: tokens generated per request");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// Openings of well-known chapters (King James Version, public domain): text the trained pair
// knows the style of, held out or not.
constexpr const char* kPrompts[] = {
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures:",
    "In the beginning was the Word, and the Word was with God, and the Word was God.",
    "And God spake all these words, saying, I am the LORD thy God, which have brought thee out of "
    "the land of Egypt,",
    "And seeing the multitudes, he went up into a mountain: and when he was set, his disciples "
    "came unto him:",
    "To every thing there is a season, and a time to every purpose under the heaven:",
    "Though I speak with the tongues of men and of angels, and have not charity,",
    "Now it came to pass in the days when the judges ruled, that there was a famine in the land.",
};

struct Config {
  std::string name;
  SpeculationMethod method = SpeculationMethod::kOff;
  bool adaptive = false;
};

struct Result {
  double seconds = 0;
  int64_t tokens = 0;
  EngineStats stats;
};

std::unique_ptr<Engine> MakeEngine(LlamaModel* target, LlamaModel* draft, const Config& c) {
  EngineOptions o = EngineOptionsFromFlags().value();
  o.speculation.method = c.method;
  o.speculation.num_tokens = absl::GetFlag(FLAGS_k);
  o.speculation.adaptive = c.adaptive;
  o.speculation.draft = c.method == SpeculationMethod::kDraft ? draft : nullptr;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(target, o);
  if (!e.ok()) {
    std::fprintf(stderr, "spec_bench: %s\n", std::string(e.status().message()).c_str());
    std::exit(1);
  }
  return std::move(e).value();
}

EngineRequest Request(const std::string& id, const std::vector<int32_t>& prompt, int32_t tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt_token_ids = prompt;
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = tokens;
  return r;
}

// Batch 1: each prompt alone; the clock runs from its first token (the prefill's) to its last.
Result BatchOne(LlamaModel* target, LlamaModel* draft, const Config& c,
                const std::vector<std::vector<int32_t>>& prompts) {
  auto engine = MakeEngine(target, draft, c);
  Result r;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!engine->AddRequest(Request(std::to_string(i), prompts[i], absl::GetFlag(FLAGS_output_len)))
             .ok())
      std::exit(1);
    Clock::time_point first;
    bool started = false;
    while (engine->HasWork()) {
      const std::vector<RequestOutput> outs = engine->Step().value();
      for (const RequestOutput& o : outs) {
        const int64_t n = static_cast<int64_t>(o.new_token_ids.size());
        if (!started && n > 0) {
          started = true;
          first = Clock::now();
          r.tokens += n - 1;
        } else {
          r.tokens += n;
        }
      }
    }
    r.seconds += std::chrono::duration<double>(Clock::now() - first).count();
  }
  r.stats = engine->stats();
  return r;
}

// Closed loop at `concurrency`.
Result Throughput(LlamaModel* target, LlamaModel* draft, const Config& c, int concurrency,
                  const std::vector<std::vector<int32_t>>& prompts) {
  auto engine = MakeEngine(target, draft, c);
  const int total = std::max(8, 2 * concurrency);
  int sent = 0, done = 0;
  Result r;
  auto send = [&] {
    std::vector<int32_t> p = prompts[sent % prompts.size()];
    p.push_back(static_cast<int32_t>(sent % 7));  // requests differ after the shared prompts
    if (!engine
             ->AddRequest(
                 Request(std::to_string(sent), p, absl::GetFlag(FLAGS_concurrency_output_len)))
             .ok())
      std::exit(1);
    ++sent;
  };
  const auto t0 = Clock::now();
  while (sent < std::min(total, concurrency)) send();
  while (engine->HasWork()) {
    const std::vector<RequestOutput> outs = engine->Step().value();
    for (const RequestOutput& o : outs) {
      r.tokens += static_cast<int64_t>(o.new_token_ids.size());
      if (o.finished) {
        ++done;
        if (sent < total) send();
      }
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.stats = engine->stats();
  return r;
}

void PrintSpeculation(const EngineStats& s) {
  const SpeculationStats& spec = s.speculation;
  if (spec.verify_steps == 0) {
    std::printf("\n");
    return;
  }
  std::printf("  %5lld/%-6lld %5.2f   ", static_cast<long long>(spec.counts.accepted),
              static_cast<long long>(spec.counts.proposed),
              1.0 + static_cast<double>(spec.counts.accepted) / spec.verify_steps);
  for (int i = 0; i < kMaxSpeculativeTokens && spec.proposed_at[i] > 0; ++i) {
    std::printf("%s%.2f", i == 0 ? "" : " ",
                static_cast<double>(spec.accepted_at[i]) / spec.proposed_at[i]);
  }
  std::printf("\n");
}

int Main() {
  auto backend = BackendFromFlags();
  if (!backend.ok()) {
    std::fprintf(stderr, "spec_bench: %s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  auto target = LlamaModel::Load(model_dir, backend->get());
  auto tokenizer = Tokenizer::Load(model_dir);
  if (!target.ok() || !tokenizer.ok()) {
    std::fprintf(
        stderr, "spec_bench: --model %s: %s\n", model_dir.c_str(),
        std::string((target.ok() ? tokenizer.status() : target.status()).message()).c_str());
    return 1;
  }
  std::unique_ptr<LlamaModel> draft;
  if (const std::string d = absl::GetFlag(FLAGS_draft); !d.empty()) {
    auto loaded = LlamaModel::Load(d, backend->get());
    if (!loaded.ok()) {
      std::fprintf(stderr, "spec_bench: --draft %s: %s\n", d.c_str(),
                   std::string(loaded.status().message()).c_str());
      return 1;
    }
    draft = std::move(loaded).value();
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : kPrompts) prompts.push_back((*tokenizer)->Encode(p, true));
  std::vector<std::vector<int32_t>> batch_one(
      prompts.begin(),
      prompts.begin() + std::clamp<int32_t>(absl::GetFlag(FLAGS_prompts), 1, prompts.size()));

  const int32_t k = absl::GetFlag(FLAGS_k);
  std::vector<Config> configs = {
      {"off", SpeculationMethod::kOff, false},
      {"ngram k=" + std::to_string(k), SpeculationMethod::kNgram, false}};
  if (draft) {
    configs.push_back({"draft k=" + std::to_string(k), SpeculationMethod::kDraft, false});
    configs.push_back({"draft adaptive", SpeculationMethod::kDraft, true});
  }
  std::printf("target %s, draft %s, %s\n", model_dir.c_str(),
              draft ? absl::GetFlag(FLAGS_draft).c_str() : "none",
              (*backend)->device_description().c_str());
  std::printf("\n1. batch 1, greedy: %zu KJV prompts, %d tokens each (decode only)\n",
              batch_one.size(), absl::GetFlag(FLAGS_output_len));
  std::printf("  %-16s %9s %6s  %12s %6s  acceptance by position\n", "", "tok/s", "x off",
              "kept/proposed", "tok/step");
  double off_rate = 0;
  for (const Config& c : configs) {
    const Result r = BatchOne(target->get(), draft.get(), c, batch_one);
    const double rate = r.tokens / r.seconds;
    if (c.method == SpeculationMethod::kOff) off_rate = rate;
    std::printf("  %-16s %9.1f %6.2f", c.name.c_str(), rate, rate / off_rate);
    PrintSpeculation(r.stats);
  }

  std::vector<int> levels;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',', absl::SkipWhitespace())) {
    int c = 0;
    if (absl::SimpleAtoi(s, &c) && c > 0) levels.push_back(c);
  }
  if (levels.empty()) return 0;
  std::printf("\n2. throughput, greedy, %d tokens per request (output tok/s; x off)\n",
              absl::GetFlag(FLAGS_concurrency_output_len));
  std::printf("  %-16s", "concurrency");
  for (int c : levels) std::printf(" %16d", c);
  std::printf("\n");
  std::vector<double> off(levels.size());
  for (const Config& c : configs) {
    std::printf("  %-16s", c.name.c_str());
    for (size_t i = 0; i < levels.size(); ++i) {
      const Result r = Throughput(target->get(), draft.get(), c, levels[i], prompts);
      const double rate = r.tokens / r.seconds;
      if (c.method == SpeculationMethod::kOff) off[i] = rate;
      std::printf(" %9.1f (%4.2f)", rate, rate / off[i]);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  setenv("TANDEM_LOG_LEVEL", "warning", 0);  // the engines' set-up lines would split the tables
  tandem::ParseCommandLine(argc, argv);
  return tandem::Main();
}
