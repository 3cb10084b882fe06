#!/usr/bin/env bash
# Quantized CPU inference, Tandem against llama.cpp on the same model, side by side in one run on one
# machine (docs/benchmarks.md, "Quantization on the CPU"):
#
#   scripts/bench_quant_cpu.sh [MODEL_DIR]     (default: models-cache/qwen2.5-0.5b, made when absent)
#
# For each precision it runs Tandem's forward_bench (prefill of one prompt, batch-1 decode) and
# llama.cpp's bench_llama_cpp.mjs (node-llama-cpp's prebuilt CPU build) on the same checkpoint:
#   BF16               Tandem as stored                    llama.cpp BF16 GGUF
#   8-bit              --quantization int8                 Q8_0 projections
#   8-bit + LM head    ... --quantize-lm-head              Q8_0 projections, embeddings and output
#   4-bit              --quantization int4                 Q4_0 projections
#   4-bit + LM head    ... --quantize-lm-head              Q4_0 projections, embeddings and output
# (embeddings and the LM head otherwise stay BF16 on both sides). Tandem's quantized rows run twice:
# weight-only (f32 activations) and with --activation-dtype int8, which is what llama.cpp's Q8_0 and
# Q4_0 paths do (they round activations to 8-bit blocks). The llama.cpp figure compared is its own
# llama_decode timer (the node addon's per-step overhead left out; the wall-clock figure is printed
# beside it). Ratios: each engine against its own BF16, and Tandem's best against llama.cpp.
#
# Environment: TANDEM_BUILD_DIR (build), BENCH_THREADS (nproc), BENCH_PROMPT_LEN (128),
# BENCH_DECODE_TOKENS (32), BENCH_REPEATS (3), BENCH_ROWS (all: "bf16 int8 int8-head int4 int4-head").
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
THREADS="${BENCH_THREADS:-$(nproc)}"
PROMPT_LEN="${BENCH_PROMPT_LEN:-128}"
DECODE_TOKENS="${BENCH_DECODE_TOKENS:-32}"
REPEATS="${BENCH_REPEATS:-3}"
ROWS="${BENCH_ROWS:-bf16 int8 int8-head int4 int4-head}"
FORWARD_BENCH="$BUILD_DIR/tests/bench/forward_bench"
TANDEM="$BUILD_DIR/cli/tandem"
if [[ ! -x "$FORWARD_BENCH" || ! -x "$TANDEM" ]]; then
  echo "bench_quant_cpu: build forward_bench and tandem first (cmake --build $BUILD_DIR --target forward_bench tandem)" >&2
  exit 2
fi
if ! command -v node >/dev/null || [[ ! -d tests/conformance/node_modules/node-llama-cpp ]]; then
  echo "bench_quant_cpu: install the llama.cpp oracle first: (cd tests/conformance && npm ci --ignore-scripts --omit=optional)" >&2
  exit 2
fi
MODEL="${1:-models-cache/qwen2.5-0.5b}"
if [[ ! -f "$MODEL/config.json" ]]; then
  if [[ $# -gt 0 ]]; then
    echo "bench_quant_cpu: $MODEL has no config.json" >&2
    exit 2
  fi
  echo "== making $MODEL (tandem make-model --preset qwen2.5-0.5b)" >&2
  "$TANDEM" make-model --preset qwen2.5-0.5b --out "$MODEL" --seed 0 >&2
fi

# shellcheck source=scripts/bench_common.sh
source scripts/bench_common.sh  # (the working directory is the repository root)
cpu_model="$(cpu_model)"
echo "machine: ${cpu_model:-unknown CPU}, $(nproc) CPUs; model $MODEL; threads $THREADS; prompt $PROMPT_LEN" \
  "tokens, decode $DECODE_TOKENS steps at batch 1, best of $REPEATS; Tandem KV cache f32, llama.cpp f16"


status=0
tandem() {
  local out
  echo "== Tandem forward_bench $*" >&2
  if out="$(TANDEM_LOG_LEVEL=warning TANDEM_NUM_THREADS="$THREADS" "$FORWARD_BENCH" --model "$MODEL" \
    --prompt-len "$PROMPT_LEN" --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" "$@" 2>&1)"; then :; else status=1; fi
  echo "$out" >&2
  printf '%s\n' "$out"
}
llama() {
  local out
  echo "== llama.cpp bench_llama_cpp.mjs $*" >&2
  if out="$(node tests/conformance/bench_llama_cpp.mjs --model "$MODEL" --prompt-len "$PROMPT_LEN" \
    --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" --threads "$THREADS" "$@" 2>&1)"; then :; else status=1; fi
  echo "$out" >&2
  printf '%s\n' "$out"
}

rows=()
t_base="" l_base=""
for row in $ROWS; do
  case "$row" in
    bf16) t_flags=() l_flags=(--dtype bf16) ;;
    int8) t_flags=(--quantization int8) l_flags=(--dtype q8_0) ;;
    int8-head) t_flags=(--quantization int8 --quantize-lm-head) l_flags=(--dtype q8_0 --quantize-head) ;;
    int4) t_flags=(--quantization int4) l_flags=(--dtype q4_0) ;;
    int4-head) t_flags=(--quantization int4 --quantize-lm-head) l_flags=(--dtype q4_0 --quantize-head) ;;
    *) echo "bench_quant_cpu: unknown row $row" >&2; exit 2 ;;
  esac
  t_out="$(tandem "${t_flags[@]}")"
  td="$(rate decode <<<"$t_out")" tp="$(rate prefill <<<"$t_out")"
  ta8="" tpa8=""
  if [[ $row != bf16 ]]; then
    a8_out="$(tandem "${t_flags[@]}" --activation-dtype int8)"
    ta8="$(rate decode <<<"$a8_out")" tpa8="$(rate prefill <<<"$a8_out")"
  fi
  l_out="$(llama "${l_flags[@]}")"
  ld="$(inner_decode <<<"$l_out")" lwall="$(rate decode <<<"$l_out")" lp="$(inner_prefill <<<"$l_out")"
  tbest="$(best "$td" "$ta8")"
  if [[ $row == bf16 ]]; then t_base="$td" l_base="$ld"; fi
  rows+=("$(printf '%-10s %9s %9s %9s %7s %9s %9s %7s %7s | %9s %9s %9s' "$row" "${td:--}" "${ta8:--}" \
    "${ld:--}" "(${lwall:--})" "$(ratio "$tbest" "$t_base")" "$(ratio "$ld" "$l_base")" \
    "$(ratio "$tbest" "$ld")" "" "${tp:--}" "${tpa8:--}" "${lp:--}")")
done

echo
echo "decode tokens/s at batch 1 (T = Tandem, f32 or int8 activations; L = llama.cpp's llama_decode timer, wall clock"
echo "in parentheses); ×BF16 against the engine's own BF16 row (Tandem's best column); T/L = Tandem's best ÷ llama.cpp;"
echo "then prefill tokens/s of a $PROMPT_LEN-token prompt"
printf '%-10s %9s %9s %9s %7s %9s %9s %7s %7s | %9s %9s %9s\n' row "T f32" "T int8" "L" "(wall)" "T×BF16" "L×BF16" "T/L" "" \
  "T pre" "T pre i8" "L pre"
printf '%s\n' "${rows[@]}"
exit "$status"
