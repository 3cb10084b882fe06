#!/usr/bin/env bash
# The test suites under sanitizers, each build in its own tree (the CPU build; CUDA off):
#
#   scripts/sanitize.sh asan [CTEST_ARGS...]   AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/sanitize.sh tsan [CTEST_ARGS...]   ThreadSanitizer
#
# Runs the unit, integration and e2e labels (ctest -L 'unit|integration|e2e'), or what CTEST_ARGS
# select (e.g. -R KvControl). A sanitizer report fails the test it happens in (halt_on_error), and
# the script exits with ctest's status. Run both before landing changes to the transport, the
# engine or the router (README, "Tests"); CI's 30-minute budget leaves them out of .ci/run.
# Environment: SANITIZE_BUILD_DIR (build-asan / build-tsan), SANITIZE_JOBS (build jobs, 2),
# SANITIZE_TARGETS (space-separated targets to build instead of everything, for a quick run),
# CTEST_PARALLEL_LEVEL (ctest jobs, 2). Suppressions: scripts/sanitizers/*.supp (each entry says
# why it is not Tandem's).
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-}"
shift || true
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
  tsan) flags="-fsanitize=thread -fno-omit-frame-pointer" ;;
  *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
if [[ $kind == tsan ]]; then
  # Debian's Abseil and gRPC are not built with TSan: their mutexes' synchronisation is invisible to
  # it, so it reports races on correctly locked data (docs/security.md, "Sanitizers").
  echo "sanitize: warning: ThreadSanitizer cannot see the synchronisation inside Debian's Abseil" \
    "and gRPC (not built with -fsanitize=thread); expect false reports on data under absl::Mutex" >&2
fi
build="${SANITIZE_BUILD_DIR:-build-$kind}"
supp="$PWD/scripts/sanitizers"
mkdir -p "$build"
echo "== configuring $build ($kind)" >&2
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags -Wl,--as-needed" \
  >"$build/sanitize-configure.log" 2>&1 || { tail -20 "$build/sanitize-configure.log" >&2; exit 1; }
echo "== building (log: $build/sanitize-build.log)" >&2
targets=()
for t in ${SANITIZE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j"${SANITIZE_JOBS:-2}" "${targets[@]}" >"$build/sanitize-build.log" 2>&1 ||
  { grep -E "error|FAILED" "$build/sanitize-build.log" | head -20 >&2; exit 1; }
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1:suppressions=$supp/asan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
export TANDEM_NUM_THREADS="${TANDEM_NUM_THREADS:-2}"
args=("$@")
((${#args[@]})) || args=(-L 'unit|integration|e2e')
echo "== ctest ${args[*]}" >&2
cd "$build"
ctest -j"${CTEST_PARALLEL_LEVEL:-2}" --output-on-failure --timeout 900 "${args[@]}"
