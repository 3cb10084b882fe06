// Runs Tandem's structured-output grammars over the cases of a corpus, for
// structured_output_conformance.py to judge with Python's jsonschema.
//
// Input (argv[1]): {"cases": [{"name", "schema" | "json_object": true, "instances": [text...],
// "walks": N}]}. Output (stdout): {"results": [{"name", "error"?, "accepted": [bool...], "walks":
// [text...]}]}: whether each instance's bytes are a complete sentence of the grammar, and N texts
// the grammar generates by random walks (each step a random byte the automaton allows; a walk
// stops at random once complete, and is dropped if it reaches kMaxWalkBytes first).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/base/file.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/structured_output.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::ordered_json;
using tandem::StructuredOutput;
using tandem::structured::GrammarAutomaton;

constexpr size_t kMaxWalkBytes = 4000;

std::string Walk(GrammarAutomaton& a, std::mt19937_64& rng, bool* complete) {
  std::string out;
  uint32_t state = a.start();
  *complete = false;
  while (out.size() < kMaxWalkBytes) {
    const bool accepting = a.IsAccepting(state);
    if (accepting && std::uniform_real_distribution<double>(0, 1)(rng) < 0.3) break;
    std::vector<std::pair<uint8_t, double>> choices;
    double total = 0;
    for (int b = 0; b < 256; ++b) {
      if (a.Next(state, static_cast<uint8_t>(b)) == GrammarAutomaton::kDead) continue;
      // Printable ASCII is likelier than the rest, so strings end and UTF-8 shows up now and then.
      const double w = (b >= 0x20 && b < 0x7F) ? 1.0 : 0.2;
      choices.emplace_back(static_cast<uint8_t>(b), w);
      total += w;
    }
    if (choices.empty()) break;
    double u = std::uniform_real_distribution<double>(0, total)(rng);
    uint8_t pick = choices.back().first;
    for (const auto& [b, w] : choices) {
      if (u < w) {
        pick = b;
        break;
      }
      u -= w;
    }
    out.push_back(static_cast<char>(pick));
    state = a.Next(state, pick);
  }
  *complete = a.IsAccepting(state);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: structured_cases CASES.json [SEED]\n");
    return 2;
  }
  absl::StatusOr<std::string> text = tandem::ReadFileToString(argv[1]);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", std::string(text.status().message()).c_str());
    return 2;
  }
  const ordered_json corpus = ordered_json::parse(*text);
  std::mt19937_64 rng(argc > 2 ? std::stoull(argv[2]) : 1);
  // Grammars alone: a vocabulary is not needed to match bytes.
  auto vocabulary = tandem::structured::TokenVocabulary::Create({});
  ordered_json results = ordered_json::array();
  for (const ordered_json& c : corpus["cases"]) {
    ordered_json r = {{"name", c["name"]}};
    StructuredOutput spec;
    if (c.value("json_object", false)) {
      spec.kind = StructuredOutput::Kind::kJsonObject;
    } else {
      spec.kind = StructuredOutput::Kind::kJsonSchema;
      spec.json_schema = c["schema"].dump();
    }
    absl::StatusOr<tandem::structured::Grammar> g =
        tandem::structured::CompileStructuredOutput(spec);
    if (!g.ok()) {
      r["error"] = std::string(g.status().message());
      results.push_back(r);
      continue;
    }
    GrammarAutomaton a(*std::move(g), vocabulary);
    ordered_json accepted = ordered_json::array();
    for (const ordered_json& instance : c.value("instances", ordered_json::array())) {
      const uint32_t end = a.NextBytes(a.start(), instance.get<std::string>());
      accepted.push_back(end != GrammarAutomaton::kDead && a.IsAccepting(end));
    }
    r["accepted"] = accepted;
    ordered_json walks = ordered_json::array();
    const int n = c.value("walks", 0);
    for (int i = 0; i < n; ++i) {
      bool complete = false;
      std::string w = Walk(a, rng, &complete);
      if (complete) walks.push_back(w);
    }
    r["walks"] = walks;
    results.push_back(r);
  }
  // Walks may hold any valid UTF-8; instances too. Invalid UTF-8 never comes out of a walk (the
  // grammar spells UTF-8 out), and dump() would throw on it: that is a failure worth seeing.
  std::printf("%s\n", ordered_json{{"results", results}}.dump().c_str());
  return 0;
}
