// Command-line parsing on top of Abseil flags that accepts both --max-tokens and --max_tokens.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// Parses argv with absl::ParseCommandLine after rewriting dashes in flag names to underscores.
// Returns the positional arguments (argv[0] first). Exits with a message on unknown flags.
//
// Every Tandem program calls it first, so it also sets what a program needs of the process before
// its threads start: Abseil's mutex deadlock detection goes off. Debian builds Abseil without
// NDEBUG, so every absl::Mutex::Lock of a program otherwise updates a process-wide lock graph under
// one global lock (about 60 ns a lock here, and a point where all threads meet) and aborts the
// process on a lock-order inversion that never deadlocked. TANDEM_MUTEX_DEADLOCK_DETECTION=1 keeps
// it on (debugging); the unit tests, which do not call this, keep it on too.
std::vector<std::string> ParseCommandLine(int argc, char** argv);

}  // namespace tandem
