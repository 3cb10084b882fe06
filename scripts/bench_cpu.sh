#!/usr/bin/env bash
# The CPU backend against llama.cpp, the measures of docs/benchmarks.md's "CPU backend against
# llama.cpp" table, side by side in one run on one machine (same threads, same weights, best of N):
#
#   scripts/bench_cpu.sh [QWEN_DIR [KJV_DIR]]
#     (defaults: models-cache/qwen2.5-0.5b, made with `tandem make-model` when absent, and the
#      trained models/kjv-target)
#
# Rows (Tandem's forward_bench twice, f32 activations then --activation-dtype bf16, against
# llama.cpp's bench_llama_cpp.mjs on a BF16 GGUF of the same checkpoint):
#   prefill-512    qwen2.5-0.5b, one 512-token prompt in one step
#   prefill-1000   kjv-target, one 1,000-token prompt (attention-heavy, small weights)
#   decode-1       qwen2.5-0.5b, batch-1 decode after a 128-token prompt
#   decode-8       qwen2.5-0.5b, 8 sequences decoded together, aggregate tokens/s
# then Tandem's batch-1 decode as a share of the read bandwidth the same threads draw (forward_bench's
# roofline line: each decode step against a read pass right after it, the median), and, unless
# BENCH_QUANT=0, scripts/bench_quant_cpu.sh's INT8 / Q8_0 and INT4 / Q4_0
# rows. llama.cpp's figures are its own llama_decode timer (node-llama-cpp adds its per-call overhead
# to the wall clock, printed on stderr). llama.cpp's BF16 path rounds activations to BF16, so the
# like-for-like column is Tandem's bf16 one; f32 is Tandem's exact default.
#
# Environment: TANDEM_BUILD_DIR (build), BENCH_THREADS (nproc), BENCH_REPEATS (3), BENCH_QUANT (1);
# the sizes (for quick runs): BENCH_PREFILL_LEN (512), BENCH_LONG_PREFILL_LEN (1000),
# BENCH_DECODE_PROMPT_LEN (128), BENCH_DECODE_TOKENS (32), BENCH_DECODE_BATCH (8), BENCH_ROOFLINE_MIB
# (1024: the buffer the read kernel reads, well past the caches).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
THREADS="${BENCH_THREADS:-$(nproc)}"
REPEATS="${BENCH_REPEATS:-3}"
PREFILL_LEN="${BENCH_PREFILL_LEN:-512}"
LONG_PREFILL_LEN="${BENCH_LONG_PREFILL_LEN:-1000}"
DECODE_PROMPT_LEN="${BENCH_DECODE_PROMPT_LEN:-128}"
DECODE_TOKENS="${BENCH_DECODE_TOKENS:-32}"
DECODE_BATCH="${BENCH_DECODE_BATCH:-8}"
ROOFLINE_MIB="${BENCH_ROOFLINE_MIB:-1024}"
FORWARD_BENCH="$BUILD_DIR/tests/bench/forward_bench"
TANDEM="$BUILD_DIR/cli/tandem"
if [[ ! -x "$FORWARD_BENCH" || ! -x "$TANDEM" ]]; then
  echo "bench_cpu: build forward_bench and tandem first (cmake --build $BUILD_DIR --target forward_bench tandem)" >&2
  exit 2
fi
if ! command -v node >/dev/null || [[ ! -d tests/conformance/node_modules/node-llama-cpp ]]; then
  echo "bench_cpu: install the llama.cpp oracle first: (cd tests/conformance && npm ci --ignore-scripts --omit=optional)" >&2
  exit 2
fi
QWEN="${1:-models-cache/qwen2.5-0.5b}"
KJV="${2:-models/kjv-target}"
if [[ ! -f "$QWEN/config.json" ]]; then
  if [[ $# -gt 0 ]]; then
    echo "bench_cpu: $QWEN has no config.json" >&2
    exit 2
  fi
  echo "== making $QWEN (tandem make-model --preset qwen2.5-0.5b)" >&2
  "$TANDEM" make-model --preset qwen2.5-0.5b --out "$QWEN" --seed 0 >&2
fi
if [[ ! -f "$KJV/config.json" ]]; then
  echo "bench_cpu: $KJV has no config.json" >&2
  exit 2
fi

# shellcheck source=scripts/bench_common.sh
source scripts/bench_common.sh  # (the working directory is the repository root)
echo "machine: $(cpu_model), $(nproc) CPUs; threads $THREADS; best of $REPEATS; Tandem KV cache f32," \
  "llama.cpp f16, flash attention off"

roofline() { sed -n 's/^roofline: read kernel \([0-9.]*\) GB\/s.* -> decode at \([0-9.]*\)%.*/\1 \2/p' | head -1; }

status=0
tandem() {  # MODEL FLAGS...
  local model="$1" out
  shift
  echo "== Tandem forward_bench --model $model $*" >&2
  if out="$(TANDEM_LOG_LEVEL=warning TANDEM_NUM_THREADS="$THREADS" "$FORWARD_BENCH" --model "$model" \
    --repeats "$REPEATS" "$@" 2>&1)"; then :; else status=1; fi
  echo "$out" >&2
  printf '%s\n' "$out"
}
llama() {  # MODEL FLAGS...
  local model="$1" out
  shift
  echo "== llama.cpp bench_llama_cpp.mjs --model $model $*" >&2
  if out="$(node tests/conformance/bench_llama_cpp.mjs --model "$model" --dtype bf16 --repeats "$REPEATS" \
    --threads "$THREADS" "$@" 2>&1)"; then :; else status=1; fi
  echo "$out" >&2
  printf '%s\n' "$out"
}

rows=()
add_row() {  # NAME WHAT T_F32 T_BF16 LLAMA
  rows+=("$(printf '%-13s %-34s %10s %10s %10s %8s %8s' "$1" "$2" "${3:--}" "${4:--}" "${5:--}" \
    "$(ratio "$3" "$5")" "$(ratio "$4" "$5")")")
}

# Prefill, 512 tokens (qwen) and 1,000 (kjv-target: its context is 1,024).
for spec in "prefill-$PREFILL_LEN $QWEN $PREFILL_LEN" "prefill-$LONG_PREFILL_LEN $KJV $LONG_PREFILL_LEN"; do
  read -r name model len <<<"$spec"
  steps=2
  f="$(tandem "$model" --prompt-len "$len" --decode-tokens "$steps" --roofline-copy-mib 0)"
  b="$(tandem "$model" --prompt-len "$len" --decode-tokens "$steps" --roofline-copy-mib 0 --activation-dtype bf16)"
  l="$(llama "$model" --prompt-len "$len" --decode-tokens "$steps")"
  add_row "$name" "$(basename "$model"), prompt tokens/s" "$(rate prefill <<<"$f")" "$(rate prefill <<<"$b")" \
    "$(inner_prefill <<<"$l")"
done

# Decode at batch 1 and 8 after a 128-token prompt; the batch-1 f32 run also reads the roofline
# (1 GiB, past any cache).
roof=""
for batch in 1 "$DECODE_BATCH"; do
  f="$(tandem "$QWEN" --prompt-len "$DECODE_PROMPT_LEN" --decode-tokens "$DECODE_TOKENS" --decode-batch "$batch" \
    --roofline-copy-mib "$([[ $batch == 1 ]] && echo "$ROOFLINE_MIB" || echo 0)")"
  [[ $batch == 1 ]] && roof="$(roofline <<<"$f")"
  b="$(tandem "$QWEN" --prompt-len "$DECODE_PROMPT_LEN" --decode-tokens "$DECODE_TOKENS" --decode-batch "$batch" --roofline-copy-mib 0 \
    --activation-dtype bf16)"
  l="$(llama "$QWEN" --prompt-len "$DECODE_PROMPT_LEN" --decode-tokens "$DECODE_TOKENS" --decode-batch "$batch")"
  add_row "decode-$batch" "$(basename "$QWEN"), tokens/s (x$batch)" "$(rate decode <<<"$f")" \
    "$(rate decode <<<"$b")" "$(inner_decode <<<"$l")"
done

echo
echo "tokens/s; T = Tandem (f32: exact default; bf16: --activation-dtype bf16), L = llama.cpp BF16 GGUF"
echo "(its llama_decode timer); ratios T/L (> 1: Tandem faster)"
printf '%-13s %-34s %10s %10s %10s %8s %8s\n' row measure "T f32" "T bf16" "L" "f32/L" "bf16/L"
printf '%s\n' "${rows[@]}"
if [[ -n "$roof" ]]; then
  read -r gbs pct <<<"$roof"
  echo "read bandwidth of $THREADS threads: $gbs GB/s (median of passes each right after a decode step);" \
    "Tandem's batch-1 decode (f32) reads its weights at $pct% of it (the median step's share)"
fi

if [[ "${BENCH_QUANT:-1}" != 0 ]]; then
  echo
  echo "== quantized rows: scripts/bench_quant_cpu.sh $QWEN (BENCH_ROWS=bf16 int8 int4)"
  BENCH_ROWS="bf16 int8 int4" BENCH_REPEATS="$REPEATS" BENCH_THREADS="$THREADS" TANDEM_BUILD_DIR="$BUILD_DIR" \
    bash scripts/bench_quant_cpu.sh "$QWEN" || status=1
fi
exit "$status"
