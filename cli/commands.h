// Subcommands of the `tandem` command. Each returns a process exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

// "1,2,3" → ids; INVALID_ARGUMENT naming `flag` for a piece that is not an integer.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& flag, const std::string& text);

int MakeModelCommand();
int GenerateCommand();
int TokenizeCommand();
int DetokenizeCommand();
int UpCommand();
int BenchCommand();
int EvalCommand();
int PlanCommand();
int QuantizeCommand();
int ChatTemplateCommand();
int HealthCommand();

}  // namespace tandem::cli
