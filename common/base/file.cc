#include "common/base/file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return content.str();
}

}  // namespace tandem
