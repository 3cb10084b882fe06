#!/usr/bin/env bash
# Tandem vs llama.cpp forward-pass throughput on the CPU, side by side, in one run on one machine
# (compare the ratios; absolute figures on a shared CPU mean little).
#
#   scripts/bench_forward.sh [MODEL_DIR ...]
#
# For each Hugging Face model directory (default: models-cache/tiny-llama and
# models-cache/qwen2.5-0.5b, written with `tandem make-model` when absent) it runs, one after the other,
#   - Tandem:    BUILD/tests/bench/forward_bench (TANDEM_NUM_THREADS=THREADS)
#   - llama.cpp: tests/conformance/bench_llama_cpp.mjs (node-llama-cpp's prebuilt CPU build, a GGUF
#                exported with 2-D weights in BENCH_DTYPE, --threads THREADS)
# with the same prompt length, decode steps and repeats, and prints a table of prefill tokens/s (one
# prompt in one forward step) and batch-1 decode tokens/s, with Tandem ÷ llama.cpp ratios (> 1: Tandem
# is faster).
#
# Environment: TANDEM_BUILD_DIR (build), BENCH_THREADS (nproc), BENCH_DTYPE (bf16),
# BENCH_PROMPT_LEN (128), BENCH_DECODE_TOKENS (32), BENCH_REPEATS (3).
# It builds nothing: it expects the build and tests/conformance/node_modules to exist (see below).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
THREADS="${BENCH_THREADS:-$(nproc)}"
DTYPE="${BENCH_DTYPE:-bf16}"
PROMPT_LEN="${BENCH_PROMPT_LEN:-128}"
DECODE_TOKENS="${BENCH_DECODE_TOKENS:-32}"
REPEATS="${BENCH_REPEATS:-3}"

FORWARD_BENCH="$BUILD_DIR/tests/bench/forward_bench"
TANDEM="$BUILD_DIR/cli/tandem"
if [[ ! -x "$FORWARD_BENCH" || ! -x "$TANDEM" ]]; then
  cat >&2 <<EOF
bench_forward: $FORWARD_BENCH or $TANDEM is missing. Build them first:
  cmake -S . -B $BUILD_DIR -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build $BUILD_DIR --target forward_bench tandem
(scripts/install_deps.sh installs the build dependencies; TANDEM_BUILD_DIR picks another build directory.)
EOF
  exit 2
fi
if ! command -v node >/dev/null || [[ ! -d tests/conformance/node_modules/node-llama-cpp ]]; then
  cat >&2 <<EOF
bench_forward: node or tests/conformance/node_modules is missing. Install the llama.cpp oracle with:
  (cd tests/conformance && npm ci --ignore-scripts --omit=optional)
EOF
  exit 2
fi

if [[ $# -gt 0 ]]; then
  MODELS=("$@")
else
  MODELS=()
  for preset in tiny-llama qwen2.5-0.5b; do
    dir="models-cache/$preset"
    if [[ ! -f "$dir/config.json" ]]; then
      echo "== making $dir (tandem make-model --preset $preset)" >&2
      "$TANDEM" make-model --preset "$preset" --out "$dir" --seed 0 >&2
    fi
    MODELS+=("$dir")
  done
fi

# shellcheck source=scripts/bench_common.sh
source scripts/bench_common.sh  # (the working directory is the repository root)
cpu_model="$(cpu_model)"
echo "machine: ${cpu_model:-unknown CPU}, $(nproc) CPUs; threads $THREADS; prompt $PROMPT_LEN tokens," \
  "decode $DECODE_TOKENS steps at batch 1, best of $REPEATS; llama.cpp weights $DTYPE, KV cache f16," \
  "flash attention off; Tandem KV cache f32"


rows=()
status=0
for model in "${MODELS[@]}"; do
  name="$(basename "$model")"
  echo "== $name: Tandem forward_bench" >&2
  if t_out="$(TANDEM_NUM_THREADS="$THREADS" "$FORWARD_BENCH" --model "$model" --prompt-len "$PROMPT_LEN" \
    --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" 2>&1)"; then :; else status=1; fi
  echo "$t_out" >&2
  echo "== $name: llama.cpp bench_llama_cpp.mjs ($DTYPE GGUF)" >&2
  if l_out="$(node tests/conformance/bench_llama_cpp.mjs --model "$model" --dtype "$DTYPE" --prompt-len "$PROMPT_LEN" \
    --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" --threads "$THREADS" 2>&1)"; then :; else status=1; fi
  echo "$l_out" >&2
  tp="$(rate prefill <<<"$t_out")"
  td="$(rate decode <<<"$t_out")"
  lp="$(rate prefill <<<"$l_out")"
  ld="$(rate decode <<<"$l_out")"
  rows+=("$(printf '%-16s %12s %12s %7s %12s %12s %7s' "$name" "${tp:--}" "${lp:--}" "$(ratio "$tp" "$lp")" \
    "${td:--}" "${ld:--}" "$(ratio "$td" "$ld")")")
done

echo
echo "tokens/s; ratio = Tandem / llama.cpp (> 1: Tandem faster)"
printf '%-16s %12s %12s %7s %12s %12s %7s\n' model "tandem pre" "llama pre" ratio "tandem dec" "llama dec" ratio
printf '%s\n' "${rows[@]}"
exit "$status"
