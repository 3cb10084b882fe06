// Tokenizer throughput on one core: load time of tokenizer.json, then encode MB/s over whole files
// (each file encoded as one text, best of --repeats). Pair it with
// tests/conformance/tokenizer/bench_reference.mjs on the same files for a side-by-side ratio.
//
//   tokenizer_bench --tokenizer PATH FILE [FILE...]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "common/base/command_line.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json or a directory containing one");
ABSL_FLAG(int, repeats, 3, "repetitions per file; the best is reported");

int main(int argc, char** argv) {
  const std::vector<std::string> files = tandem::ParseCommandLine(argc, argv);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto tok = tandem::Tokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  std::printf("load: %.3f s (vocabulary %lld)\n",
              std::chrono::duration<double>(Clock::now() - t0).count(),
              static_cast<long long>((*tok)->vocab_size()));
  for (size_t f = 1; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_repeats)); ++r) {
      const auto t = Clock::now();
      tokens = (*tok)->Encode(text, false).size();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
    }
    std::printf("encode %s: %.2f MB in %.3f s = %.2f MB/s (%zu tokens)\n", files[f].c_str(),
                text.size() / 1e6, best, text.size() / 1e6 / best, tokens);
  }
  return 0;
}
