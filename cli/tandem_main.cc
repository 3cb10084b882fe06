// `tandem SUBCOMMAND [--flags]`: the command-line entry point. Flags are Abseil flags; both
// --max-tokens and --max_tokens spellings are accepted.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/commands.h"

namespace {

constexpr char kUsage[] = R"(tandem — LLM inference server tools

Usage: tandem COMMAND [--flags]

Commands:
  make-model   Write a random-initialised model as a Hugging Face directory.
               --preset P --out DIR [--seed N] [--dtype bf16|f16|f32] [--tokenizer FILE]
               --list-presets prints the presets.
  generate     Generate in-process from a Hugging Face model directory.
               --model DIR (--prompt TEXT | --token-ids 1,2,3) [--max-tokens N]
               [--temperature T] [--top-p P] [--top-k K] [--seed S] [--ignore-eos]
               [--prompt-logprobs K] [--logprobs K] [--prefill-chunk N] [--block-size N] [--json]
  help         This text. `tandem COMMAND --helpfull` lists every flag with its default.
)";

// Rewrites "--foo-bar[=x]" to "--foo_bar[=x]" so both spellings work with Abseil flags.
std::vector<std::string> NormaliseFlags(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      for (size_t j = 2; j < std::min(eq, a.size()); ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args = NormaliseFlags(argc - 1, argv + 1);
  args[0] = std::string(argv[0]) + " " + command;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "tandem %s: unexpected argument '%s'\n", command.c_str(), positional[1]);
    return 2;
  }
  if (command == "make-model") return tandem::cli::MakeModelCommand();
  if (command == "generate") return tandem::cli::GenerateCommand();
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
