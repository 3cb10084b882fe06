// What structured output costs the sampler: for each tokenizer given, the time to build the token
// vocabulary, to compile a schema, and the token masks of one generation that follows the schema
// (a canonical instance, tokenized, each token accepted after its step's mask): the first request
// computes its parser states' masks, a second request with the same schema finds them cached.
//
//   structured_bench [--schema FILE --instance FILE] TOKENIZER.json [TOKENIZER.json...]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/base/command_line.h"
#include "common/base/file.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/structured_output.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, schema, "", "a JSON Schema file (default: a tool call's arguments)");
ABSL_FLAG(std::string, instance, "", "JSON valid against --schema, generated step by step");

namespace {

constexpr char kSchema[] = R"({"type": "object", "properties": {
  "location": {"type": "string", "description": "City and country"},
  "unit": {"enum": ["celsius", "fahrenheit"]},
  "days": {"type": "integer"},
  "include": {"type": "array", "items": {"enum": ["wind", "rain", "humidity", "uv"]}, "maxItems": 4},
  "notes": {"type": "string", "maxLength": 200}},
  "required": ["location", "unit"], "additionalProperties": false})";
constexpr char kInstance[] =
    R"({"location": "Saint-Étienne, France", "unit": "celsius", "days": 14, "include": ["wind", "rain"], "notes": "Outdoor event planning for the weekend; please flag any storm warnings early."})";

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args = tandem::ParseCommandLine(argc, argv);
  std::string schema = kSchema, instance = kInstance;
  if (!absl::GetFlag(FLAGS_schema).empty()) {
    schema = tandem::ReadFileToString(absl::GetFlag(FLAGS_schema)).value();
    instance = tandem::ReadFileToString(absl::GetFlag(FLAGS_instance)).value();
  }
  tandem::StructuredOutput spec;
  spec.kind = tandem::StructuredOutput::Kind::kJsonSchema;
  spec.json_schema = schema;
  std::printf("%-28s %8s %8s %8s %7s | %-24s | %-24s\n", "tokenizer", "vocab", "vocab ms",
              "schema ms", "tokens", "1st request: ms/token", "2nd request: ms/token");
  for (size_t i = 1; i < args.size(); ++i) {
    auto tok = tandem::Tokenizer::Load(args[i]);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", args[i].c_str(),
                   std::string(tok.status().message()).c_str());
      return 1;
    }
    // The schema alone (what the router and a worker pay once per schema)...
    const auto s0 = Clock::now();
    if (auto g = tandem::structured::CompileStructuredOutput(spec); !g.ok()) {
      std::fprintf(stderr, "schema: %s\n", std::string(g.status().message()).c_str());
      return 1;
    }
    const double schema_ms = Ms(s0, Clock::now());
    // ...and the vocabulary (once per worker).
    const auto t0 = Clock::now();
    auto vocab = tandem::structured::TokenVocabulary::FromTokenizer(**tok, (*tok)->vocab_size());
    const auto t1 = Clock::now();
    tandem::structured::StructuredOutputCompiler compiler(vocab);
    auto automaton = compiler.Automaton(spec);
    if (!automaton.ok()) return 1;
    const std::vector<int32_t> ids = (*tok)->Encode(instance, false);
    double request_ms[2] = {0, 0}, worst_ms[2] = {0, 0};
    for (int round = 0; round < 2; ++round) {
      tandem::structured::GrammarConstraint c(*automaton);
      std::vector<uint64_t> bits;
      for (int32_t id : ids) {
        const auto a = Clock::now();
        c.AllowedTokens(&bits);
        const auto b = Clock::now();
        request_ms[round] += Ms(a, b);
        worst_ms[round] = std::max(worst_ms[round], Ms(a, b));
        if (!((bits[id >> 6] >> (id & 63)) & 1) || !c.Accept(id)) {
          std::fprintf(stderr,
                       "token %d of the instance is not allowed: the instance is not valid\n", id);
          return 1;
        }
      }
      if (!c.CanEnd()) {
        std::fprintf(stderr, "the instance is not complete JSON for the schema\n");
        return 1;
      }
    }
    const auto stats = (*automaton)->stats();
    std::string name = args[i];
    if (name.size() > 28) name = "…" + name.substr(name.size() - 27);
    char first[64], second[64];
    std::snprintf(first, sizeof first, "%.3f (max %.1f)", request_ms[0] / ids.size(), worst_ms[0]);
    std::snprintf(second, sizeof second, "%.4f (max %.3f)", request_ms[1] / ids.size(),
                  worst_ms[1]);
    std::printf("%-28s %8lld %8.1f %8.2f %7zu | %-24s | %-24s  [%zu states, %lld masks computed]\n",
                name.c_str(), static_cast<long long>(vocab->size()), Ms(t0, t1), schema_ms,
                ids.size(), first, second, stats.states,
                static_cast<long long>(stats.masks_computed));
  }
  return 0;
}
