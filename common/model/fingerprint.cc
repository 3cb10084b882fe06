#include "common/model/fingerprint.h"

#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/tensor/safetensors.h"

namespace tandem {
namespace {

struct Fnv128 {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  void Add(std::string_view s) {
    for (unsigned char c : s) {
      a = (a ^ c) * 0x100000001b3ull;
      b = (b ^ c) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
    }
    a = (a ^ 0xff) * 0x100000001b3ull;  // separator: "ab","c" differs from "a","bc"
    b = (b ^ 0xff) * 0x100000001b3ull;
  }
};

}  // namespace

std::string ModelDirName(const std::string& model_dir) {
  std::string trimmed = model_dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  return trimmed.substr(trimmed.find_last_of('/') + 1);
}

absl::StatusOr<std::string> ModelFingerprint(const std::string& model_dir) {
  const std::string config_path = model_dir + "/config.json";
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(config_path, ": cannot open"));
  std::stringstream config;
  config << in.rdbuf();
  Fnv128 h;
  h.Add(config.str());
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(model_dir));
  for (const auto& [name, view] : checkpoint->tensors()) {  // std::map: sorted by name
    h.Add(name);
    h.Add(DTypeName(view->dtype));
    for (int64_t d : view->shape) h.Add(absl::StrCat(d));
  }
  return absl::StrFormat("%016x%016x", h.a, h.b);
}

}  // namespace tandem
