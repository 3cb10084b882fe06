#!/usr/bin/env bash
# Every tracked C++ and CUDA file as clang-format writes it (.clang-format at the root): exits 1 naming
# the files that differ, with the first lines of each difference. --fix formats them in place instead.
#   scripts/check_format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/install_deps.sh)"; exit 1; }
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
# One process for every file; on a difference, the offending lines (file:line) and a summary.
if ! out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1); then
  printf '%s\n' "$out" | grep -E '^[^ ].*: (error|warning):' | head -40
  n=$(printf '%s\n' "$out" | grep -E '^[^ ].*: (error|warning):' | cut -d: -f1 | sort -u | wc -l)
  echo "check_format: $n of ${#files[@]} files differ from clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1) (scripts/check_format.sh --fix)"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
