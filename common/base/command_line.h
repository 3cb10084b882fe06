// Command-line parsing on top of Abseil flags that accepts both --max-tokens and --max_tokens.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Parses argv with absl::ParseCommandLine after rewriting dashes in flag names to underscores.
// Returns the positional arguments (argv[0] first). Exits with a message on unknown flags.
std::vector<std::string> ParseCommandLine(int argc, char** argv);

}  // namespace tandem
