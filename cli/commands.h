// Subcommands of the `tandem` command. Each returns a process exit code.
#pragma once

namespace tandem::cli {

int MakeModelCommand();
int GenerateCommand();
int TokenizeCommand();
int DetokenizeCommand();

}  // namespace tandem::cli
