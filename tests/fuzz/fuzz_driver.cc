// Runs a libFuzzer target (LLVMFuzzerTestOneInput) without libFuzzer, so every build's test suite
// runs each target a little (the GCC build has no -fsanitize=fuzzer; scripts/fuzz.sh builds the
// same targets with clang's libFuzzer under ASan+UBSan for the long runs). Every seed file goes in
// as is, then mutations of them: bit flips, byte edits, runs inserted, deleted and duplicated,
// splices of two seeds, truncations, "interesting" integers written in place. A crash or a
// sanitizer report kills the process, which is what the test sees.
//   TARGET [--runs N] [--seed S] [--max-len BYTES] SEED_FILE_OR_DIR...
// Prints "TARGET: N inputs (K seeds), no crash" and exits 0; exits 2 when no seed was readable.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

std::string Mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng, size_t max_len) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  std::string s = seeds[pick(seeds.size())];
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 9) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:  // set a byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 2: {  // insert random bytes
        std::string run(1 + pick(16), '\0');
        for (char& c : run) c = static_cast<char>(rng());
        s.insert(pick(s.size() + 1), run);
        break;
      }
      case 3:  // delete a run
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(64, s.size() - at)));
        }
        break;
      case 4:  // duplicate a run
        if (!s.empty()) {
          const size_t at = pick(s.size());
          const std::string run = s.substr(at, 1 + pick(64));
          s.insert(pick(s.size() + 1), run);
        }
        break;
      case 5: {  // splice with another seed
        const std::string& other = seeds[pick(seeds.size())];
        s = s.substr(0, pick(s.size() + 1)) + other.substr(pick(other.size() + 1));
        break;
      }
      case 6:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 7: {  // an interesting integer, little-endian, somewhere
        static const uint64_t kValues[] = {0,          1,          0x7f,       0x80,
                                           0xff,       0x7fff,     0xffff,     0x7fffffff,
                                           0x80000000, 0xffffffff, ~0ull >> 1, ~0ull};
        const uint64_t v = kValues[pick(std::size(kValues))];
        const size_t width = size_t{1} << pick(4);
        if (s.size() >= width) std::memcpy(&s[pick(s.size() - width + 1)], &v, width);
        break;
      }
      default: {  // an ASCII digit run or a JSON/template metacharacter
        static const char* kTokens[] = {"-1",    "99999999999999999999",
                                        "1e308", "null",
                                        "\"",    "{",
                                        "}",     "[",
                                        "]",     ",",
                                        ":",     "\\u0000",
                                        "{%",    "%}",
                                        "{{",    "}}",
                                        "NaN",   "true"};
        s.insert(pick(s.size() + 1), kTokens[pick(std::size(kTokens))]);
        break;
      }
    }
  }
  if (s.size() > max_len) s.resize(max_len);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  long runs = 2000;
  uint64_t seed = 1;
  size_t max_len = 1 << 20;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") {
      runs = std::atol(value("--runs"));
    } else if (a == "--seed") {
      seed = std::strtoull(value("--seed"), nullptr, 10);
    } else if (a == "--max-len") {
      max_len = std::strtoull(value("--max-len"), nullptr, 10);
    } else {
      paths.push_back(a);
    }
  }
  std::vector<std::string> seeds;
  for (const std::string& p : paths) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(p);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in) continue;
      seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  const char* name = argc > 0 ? argv[0] : "fuzz";
  if (seeds.empty()) {
    std::fprintf(stderr, "%s: no readable seed among the paths given\n", name);
    return 2;
  }
  for (const std::string& s : seeds)
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  std::mt19937_64 rng(seed);
  for (long r = 0; r < runs; ++r) {
    const std::string s = Mutate(seeds, rng, max_len);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("%s: %ld inputs (%zu seeds), no crash\n", name,
              runs + static_cast<long>(seeds.size()), seeds.size());
  return 0;
}
