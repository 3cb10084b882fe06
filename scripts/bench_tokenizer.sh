#!/usr/bin/env bash
# Tokenizer encode throughput, Tandem beside the reference JavaScript implementation, on the same
# ~1 MB texts (mixed English/code, and Chinese), one core each.
#   scripts/bench_tokenizer.sh [names...]   (default: qwen3 llama3 llama2 gemma3 deepseek_v3)
# Needs a build (scripts/test.sh or cmake --build build) and tests/conformance/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
BENCH="$BUILD_DIR/tests/bench/tokenizer_bench"
if [[ ! -x "$BENCH" || ! -d tests/conformance/node_modules ]]; then
  echo "bench_tokenizer: run scripts/test.sh first (needs $BENCH and tests/conformance/node_modules)" >&2
  exit 2
fi
NAMES=("$@")
if ((${#NAMES[@]} == 0)); then NAMES=(qwen3 llama3 llama2 gemma3 deepseek_v3); fi
WORK="${TMPDIR:-/tmp}/tandem-tokenizer-bench"
mkdir -p "$WORK"
(cd tests/conformance && node tokenizer/extract_tokenizers.mjs --out "$WORK/tokenizers" >/dev/null)
printf '%-12s %10s %10s %7s %10s %10s %7s %8s\n' tokenizer "tandem mix" "ref mix" ratio "tandem zh" "ref zh" ratio "load s"
for name in "${NAMES[@]}"; do
  ref=$(cd tests/conformance && node tokenizer/bench_reference.mjs --tokenizers "$WORK/tokenizers" \
          --names "$name" --out "$WORK" --repeats 3 | grep '^reference encode')
  ref_mix=$(sed -E 's/.*mixed ([0-9.]+) MB\/s.*/\1/' <<<"$ref")
  ref_zh=$(sed -E 's/.*chinese ([0-9.]+) MB\/s.*/\1/' <<<"$ref")
  out=$(taskset -c 0 "$BENCH" --tokenizer "$WORK/tokenizers/$name" --repeats 3 "$WORK/bench_mixed.txt" "$WORK/bench_chinese.txt")
  load=$(sed -nE 's/^load: ([0-9.]+) s.*/\1/p' <<<"$out")
  mix=$(sed -nE 's/^encode .*bench_mixed.txt: .* = ([0-9.]+) MB\/s.*/\1/p' <<<"$out")
  zh=$(sed -nE 's/^encode .*bench_chinese.txt: .* = ([0-9.]+) MB\/s.*/\1/p' <<<"$out")
  printf '%-12s %10s %10s %7.1f %10s %10s %7.1f %8s\n' "$name" "$mix" "$ref_mix" "$(awk -v a="$mix" -v b="$ref_mix" 'BEGIN{print a/b}')" \
    "$zh" "$ref_zh" "$(awk -v a="$zh" -v b="$ref_zh" 'BEGIN{print a/b}')" "$load"
done
echo "(MB/s of UTF-8 input, best of 3, one core; ratio = Tandem / reference)"
