#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs system packages and the conformance
# oracles (npm, from the committed lockfile), builds everything, runs every ctest suite.
# GPU tests (label gpu) are reported as skipped where no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
JOBS="${TANDEM_JOBS:-$(nproc)}"

bash scripts/install_deps.sh
echo "== npm ci (tests/conformance)" >&2
(cd tests/conformance && npm ci --ignore-scripts --omit=optional --no-audit --no-fund --loglevel=error)
echo "== configure and build ($BUILD_DIR, $JOBS jobs)" >&2
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"
echo "== ctest" >&2
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" "$@"
