// Whole-file reads for the small files Tandem takes from users and model directories (JSON configs,
// templates, prompts).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// The file's bytes. NotFound ("PATH: cannot open") when it cannot be opened, DataLoss on a read
// error.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace tandem
