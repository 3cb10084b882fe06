// Weight-only quantization, side by side in one run (docs/benchmarks.md, "Quantization"): the same
// model loaded as stored, and quantized on load to INT8 and to INT4, decoding greedily at batch 1.
// Rounds alternate the configurations (so drift in the machine's speed hits all alike); each
// configuration's figure is its median round: decode tokens/s (prefill excluded), the ratio to as
// stored, and the bytes of its weights.
//
//   quant_bench --model DIR [--output-len 128] [--rounds 3] [--types none,int8,int4]
//   (engine flags as the workers take them: --device, --kv-cache-memory, ...)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/base/command_line.h"
#include "common/serving/engine_flags.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "", "model directory");
ABSL_FLAG(int32_t, output_len, 128, "tokens generated per round");
ABSL_FLAG(int32_t, rounds, 3, "rounds; each configuration's figure is its median");
ABSL_FLAG(std::string, types, "none,int8,int4", "the --quantization values compared");
ABSL_FLAG(std::string, prompt,
          "And it came to pass, when men began to multiply on the face of the earth,",
          "the prompt");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "quant_bench: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  std::exit(1);
}

// Decode tokens/s of one greedy request, from its first token to its last.
double DecodeRate(Engine* engine, const std::vector<int32_t>& prompt, int32_t tokens) {
  EngineRequest r;
  r.id = "q";
  r.prompt_token_ids = prompt;
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = tokens;
  if (absl::Status s = engine->AddRequest(r); !s.ok()) Die("request", s);
  Clock::time_point first;
  int64_t decoded = -1;  // the prefill's token is not a decode step's
  while (engine->HasWork()) {
    auto outs = engine->Step();
    if (!outs.ok()) Die("step", outs.status());
    for (const RequestOutput& o : *outs) {
      if (decoded < 0 && !o.new_token_ids.empty()) first = Clock::now();
      decoded += static_cast<int64_t>(o.new_token_ids.size());
    }
  }
  return decoded / std::chrono::duration<double>(Clock::now() - first).count();
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  auto backend = BackendFromFlags();
  if (!backend.ok()) Die("--device", backend.status());
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) Die(dir, tokenizer.status());
  const std::vector<int32_t> prompt = (*tokenizer)->Encode(absl::GetFlag(FLAGS_prompt), true);
  struct Config {
    QuantType type;
    std::unique_ptr<LlamaModel> model;
    std::unique_ptr<Engine> engine;
    std::vector<double> rates;
  };
  std::vector<Config> configs;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_types), ',')) {
    const std::optional<QuantType> t = ParseQuantType(std::string(name));
    if (!t) Die("--types", absl::InvalidArgumentError(std::string(name) + " is not a type"));
    LlamaLoadOptions o;
    o.quantization = *t;
    auto model = LlamaModel::Load(dir, backend->get(), o);
    if (!model.ok()) Die(dir, model.status());
    auto options = EngineOptionsFromFlags();
    if (!options.ok()) Die("engine flags", options.status());
    auto engine = Engine::Create(model->get(), *options);
    if (!engine.ok()) Die("engine", engine.status());
    configs.push_back({*t, std::move(model).value(), std::move(engine).value(), {}});
  }
  const int32_t tokens = absl::GetFlag(FLAGS_output_len);
  for (Config& c : configs) DecodeRate(c.engine.get(), prompt, 8);  // warm-up
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (Config& c : configs) c.rates.push_back(DecodeRate(c.engine.get(), prompt, tokens));
  }
  std::printf("%s, %s, batch 1, %d tokens, median of %d rounds\n", dir.c_str(),
              (*backend)->device_description().c_str(), tokens, absl::GetFlag(FLAGS_rounds));
  std::printf("%-6s %14s %10s %9s\n", "weights", "weight bytes", "tok/s", "vs first");
  double base = 0;
  for (Config& c : configs) {
    std::sort(c.rates.begin(), c.rates.end());
    const double median = c.rates[c.rates.size() / 2];
    if (base == 0) base = median;
    std::printf("%-7s %14lld %10.1f %8.2fx\n", std::string(QuantTypeName(c.type)).c_str(),
                static_cast<long long>(c.model->weight_bytes()), median, median / base);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseCommandLine(argc, argv);
  return tandem::Main();
}
