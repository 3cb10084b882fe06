#!/usr/bin/env bash
# Long fuzzing runs: builds the libFuzzer targets of tests/fuzz with clang under ASan+UBSan in their
# own build tree, then runs each for a bounded time from its seed corpus (tests/fuzz/corpus/NAME),
# keeping what it found interesting in a working corpus and any crash as a file to reproduce with.
#
#   scripts/fuzz.sh [TARGET...]        (default: every target: safetensors config tokenizer request
#                                       chat_template kv_frames)
#
# Environment: FUZZ_SECONDS (per target, default 60), FUZZ_BUILD_DIR (build-fuzz), FUZZ_WORK_DIR
# (fuzz-work: corpora, crash files, logs), FUZZ_JOBS (build jobs, default 2).
# Prints, per target, libFuzzer's executions, coverage (edges) and corpus size, and exits non-zero
# if any target crashed or reported (the crash input is kept under FUZZ_WORK_DIR/NAME/).
# ctest's fuzz.* tests run the same targets briefly in the normal build (a seeded driver, no
# libFuzzer); this script is the long run, before landing changes to the parsers.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-60}"
BUILD="${FUZZ_BUILD_DIR:-build-fuzz}"
WORK="${FUZZ_WORK_DIR:-fuzz-work}"
JOBS="${FUZZ_JOBS:-2}"
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(safetensors config tokenizer request chat_template kv_frames)
command -v clang++ >/dev/null || { echo "fuzz: clang++ is not installed (apt-get install clang)" >&2; exit 2; }

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p "$BUILD"
echo "== configuring $BUILD (clang, ASan+UBSan, libFuzzer)" >&2
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=OFF \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_LIBFUZZER=ON \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN -fsanitize=fuzzer-no-link" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" >"$BUILD/fuzz-configure.log" 2>&1 ||
  { tail -20 "$BUILD/fuzz-configure.log" >&2; exit 1; }
echo "== building ${TARGETS[*]}" >&2
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]/%/_fuzzer}" >"$BUILD/fuzz-build.log" 2>&1 ||
  { grep -E "error|FAILED" "$BUILD/fuzz-build.log" | head -20 >&2; exit 1; }

failed=0
printf '%-14s %12s %10s %8s %s\n' target executions "exec/s" edges result
for t in "${TARGETS[@]}"; do
  dir="$WORK/$t"
  mkdir -p "$dir/corpus"
  log="$dir/fuzz.log"
  set +e
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$BUILD/tests/fuzz/${t}_fuzzer" -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 \
    -timeout=10 -artifact_prefix="$dir/" -print_final_stats=1 "$dir/corpus" "tests/fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  speed=$(grep -oE "stat::average_exec_per_sec: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  edges=$(grep -oE "cov: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+" || echo "?")
  result=ok
  if ((rc != 0)); then
    result="FOUND (rc $rc): $(ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* 2>/dev/null | head -1)"
    failed=1
  fi
  printf '%-14s %12s %10s %8s %s\n' "$t" "$execs" "$speed" "$edges" "$result"
done
exit $failed
