// Seeded mutation fuzzing of the chat-template engine (common/chat): real chat templates and the
// conformance snippets, cut, spliced and sprinkled with Jinja syntax, are parsed and rendered over
// a few conversations. Every outcome must be a template or an error — never a crash, a hang or
// unbounded memory (the engine's nesting, step and output limits hold). Also renders deeply nested
// and very large inputs.
//   jinja_fuzz [--iterations N] [--seed S] FILE...
// Each FILE is a JSON array of template strings (chat_template/snippets.json) or a
// tokenizer_config.json whose chat_template is a string. Prints "N parsed, M rendered, K refused"
// and exits non-zero when an input file is missing or holds no template.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/base/command_line.h"
#include "common/base/file.h"
#include "common/chat/jinja.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, iterations, 2000, "mutated templates to try");
ABSL_FLAG(uint64_t, seed, 1, "random seed");

namespace tandem {
namespace {

using nlohmann::ordered_json;

const std::vector<std::string> kPieces = {"{{",
                                          "}}",
                                          "{%",
                                          "%}",
                                          "{#",
                                          "#}",
                                          "{%-",
                                          "-%}",
                                          "{{-",
                                          "-}}",
                                          "(",
                                          ")",
                                          "[",
                                          "]",
                                          "{",
                                          "}",
                                          "|",
                                          "'",
                                          "\"",
                                          "\\",
                                          "\n",
                                          " ",
                                          "for x in ",
                                          " if ",
                                          "endif",
                                          "endfor",
                                          "else",
                                          "elif",
                                          "macro m(a, b=1)",
                                          "endmacro",
                                          "set ",
                                          "loop.",
                                          "not ",
                                          " in ",
                                          " is ",
                                          ".",
                                          ",",
                                          ":",
                                          "**",
                                          "//",
                                          "~",
                                          "+",
                                          "-",
                                          "*",
                                          "%",
                                          "==",
                                          "<",
                                          "namespace(",
                                          "ns.x",
                                          "messages",
                                          "messages[0]",
                                          "tools",
                                          "raise_exception('x')",
                                          "range(99999)",
                                          "|tojson",
                                          "|length",
                                          "|join",
                                          "|map(attribute='role')",
                                          "|selectattr('role')",
                                          "|items",
                                          "|trim",
                                          "|indent(2)",
                                          "[::-1]",
                                          "[1:]",
                                          "1e308",
                                          "9223372036854775807",
                                          "-9223372036854775808",
                                          "'\\u00e9'",
                                          "'\\x00'",
                                          "é",
                                          "😀",
                                          "\xff",
                                          "\x00",
                                          "{% raw %}",
                                          "{% endraw %}",
                                          "{% filter upper %}",
                                          "{% endfilter %}",
                                          "{% generation %}",
                                          "{% endgeneration %}",
                                          "{% break %}",
                                          "{% continue %}",
                                          "caller()",
                                          "varargs",
                                          "kwargs",
                                          "dict(a=1)",
                                          "joiner()",
                                          "strftime_now('%Y')"};

std::vector<std::string> LoadTemplates(const std::string& path) {
  const absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    std::fprintf(stderr, "jinja_fuzz: %s\n", std::string(text.status().message()).c_str());
    std::exit(2);
  }
  const ordered_json j = ordered_json::parse(*text, nullptr, false);
  std::vector<std::string> out;
  if (j.is_array()) {
    for (const auto& t : j) {
      if (t.is_string()) out.push_back(t.get<std::string>());
    }
  } else if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
    out.push_back(j["chat_template"].get<std::string>());
  }
  if (out.empty()) {
    std::fprintf(stderr, "jinja_fuzz: %s holds no template\n", path.c_str());
    std::exit(2);
  }
  return out;
}

std::vector<ordered_json> Contexts() {
  const ordered_json tools = ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  const ordered_json conversation = ordered_json::parse(R"([
    {"role": "system", "content": "sys"}, {"role": "user", "content": "hi é 😀"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
    {"role": "tool", "content": "42"}, {"role": "assistant", "content": "<think>r</think>done"}])");
  std::vector<ordered_json> out;
  out.push_back({{"messages", conversation},
                 {"tools", tools},
                 {"add_generation_prompt", true},
                 {"bos_token", "<s>"}});
  out.push_back(
      {{"messages", ordered_json::array()}, {"tools", nullptr}, {"add_generation_prompt", false}});
  ordered_json deep = "x";
  for (int i = 0; i < 700; ++i) deep = ordered_json::array({deep});
  out.push_back({{"messages", ordered_json::array({{{"role", "user"}, {"content", deep}}})}});
  out.push_back({{"messages", ordered_json::array(
                                  {{{"role", "user"}, {"content", std::string(64 << 10, 'a')}}})}});
  return out;
}

std::string Mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& corpus) {
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0:  // delete a range
        if (!s.empty()) s.erase(pos, rng() % 40);
        break;
      case 1:  // insert a piece of syntax
        s.insert(pos, kPieces[rng() % kPieces.size()]);
        break;
      case 2: {  // splice in a piece of another template
        const std::string& other = corpus[rng() % corpus.size()];
        if (!other.empty()) {
          const size_t from = rng() % other.size();
          s.insert(pos, other.substr(from, rng() % 200));
        }
        break;
      }
      case 3:  // duplicate a range (repetition, deep nesting)
        if (!s.empty()) s.insert(pos, s.substr(rng() % s.size(), rng() % 120));
        break;
      default:  // truncate
        s.resize(pos);
    }
  }
  return s;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const std::vector<std::string> files = tandem::ParseCommandLine(argc, argv);
  if (files.size() < 2) {
    std::fprintf(stderr, "usage: jinja_fuzz [--iterations N] [--seed S] FILE...\n");
    return 2;
  }
  std::vector<std::string> corpus;
  for (size_t i = 1; i < files.size(); ++i) {
    for (std::string& t : tandem::LoadTemplates(files[i])) corpus.push_back(std::move(t));
  }
  const auto contexts = tandem::Contexts();
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  int parsed = 0, rendered = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < absl::GetFlag(FLAGS_iterations); ++i) {
    const std::string source = i < static_cast<int>(corpus.size())
                                   ? corpus[i]
                                   : tandem::Mutate(corpus[rng() % corpus.size()], rng, corpus);
    auto t = tandem::chat::JinjaTemplate::Create(source);
    if (!t.ok()) {
      ++refused;
      continue;
    }
    ++parsed;
    for (const auto& context : contexts) rendered += (*t)->Render(context).ok();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d parsed, %d rendered, %d refused (%zu seed templates, %.1f s)\n", parsed, rendered,
              refused, corpus.size(), seconds);
  if (parsed < static_cast<int>(corpus.size()) / 2) {
    std::fprintf(stderr,
                 "jinja_fuzz: fewer than half the seed templates parse: the inputs are wrong\n");
    return 1;
  }
  return 0;
}
