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
# tsan first builds Debian's Abseil and gRPC sources with TSan (scripts/build_tsan_deps.sh: once,
# about 25 minutes on two cores, needs deb.debian.org) and loads them in place of the system's.
# Environment: SANITIZE_BUILD_DIR (build-asan / build-tsan), SANITIZE_JOBS (build jobs, 2),
# SANITIZE_TARGETS (space-separated targets to build instead of everything, for a quick run; with no
# CTEST_ARGS only their tests run), CTEST_PARALLEL_LEVEL (ctest jobs, 2). Suppressions:
# scripts/sanitizers/*.supp (each entry says why it is not Tandem's).
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-}"
shift || true
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
  tsan) flags="-fsanitize=thread -fno-omit-frame-pointer" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
tsan_libs=""
if [[ $kind == tsan ]]; then
  # Debian's Abseil and gRPC are not built with TSan, which then cannot see absl::Mutex's
  # synchronisation or gRPC's lock-free queues and reports races on correctly ordered data. The same
  # libraries built with TSan stand in for them at run time (scripts/build_tsan_deps.sh, about 25
  # minutes the first time; docs/security.md, "Sanitizers").
  echo "== Abseil and gRPC with ThreadSanitizer (scripts/build_tsan_deps.sh)" >&2
  tsan_libs="$(scripts/build_tsan_deps.sh)"
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
[[ -n $tsan_libs ]] && export LD_LIBRARY_PATH="$tsan_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TANDEM_NUM_THREADS="${TANDEM_NUM_THREADS:-2}"
args=("$@")
cd "$build"
if ((${#args[@]} == 0)) && [[ -n ${SANITIZE_TARGETS:-} ]]; then
  # Only the tests of the programs named (of the unit, integration and e2e labels; a test run by
  # an interpreter needs the whole tree).
  regex="$(ctest --show-only=json-v1 | SANITIZE_TARGETS="$SANITIZE_TARGETS" python3 -c '
import json, os, re, sys
names = []
targets = set(os.environ["SANITIZE_TARGETS"].split())
for t in json.load(sys.stdin)["tests"]:
    labels = set()
    for p in t.get("properties", []):
        if p["name"] == "LABELS":
            labels.update(p["value"] if isinstance(p["value"], list) else [p["value"]])
    program = os.path.realpath((t.get("command") or [""])[0])
    if labels & {"unit", "integration", "e2e"} and program.startswith(os.getcwd() + "/") and \
            os.path.basename(program) in targets:
        names.append(re.escape(t["name"]))
print("^(" + "|".join(names) + ")$" if names else "^$")')"
  args=(-R "$regex")
fi
if ((${#args[@]} == 0)); then
  args=(-L 'unit|integration|e2e')
  # Under TSan everything runs 5-20x slower; these check time or load, not correctness, and cannot
  # pass at that speed (docs/security.md, "Sanitizers"): GPTQ over calibration text and the CLI's
  # two dozen model runs (past their 300 and 600 s limits), 1,000 streams at once and six 900-token
  # streams through the Kubernetes pods (the decode worker's heartbeats starve: "no live decode
  # worker"), and two tests that time what they check.
  [[ $kind == tsan ]] && args+=(-E '^(integration\.quantize_cli|integration\.cli|load\.streams|deploy\.k8s_manifests|e2e\.ServiceTest\.ASlowReaderDoesNotStallOtherStreams|.*AnIdleConnectionIsClosedOnlyWhenNoTransferOfItsOwnWaits.*)$')
fi
if [[ -n ${regex:-} ]]; then
  echo "== ctest: the tests of $SANITIZE_TARGETS ($(ctest -N "${args[@]}" | tail -1))" >&2
else
  echo "== ctest ${args[*]}" >&2
fi
ctest -j"${CTEST_PARALLEL_LEVEL:-2}" --output-on-failure --no-tests=error --timeout 900 "${args[@]}"
