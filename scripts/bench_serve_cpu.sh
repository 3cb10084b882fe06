#!/usr/bin/env bash
# `tandem up` against llama.cpp's llama-server on the CPU, end to end, side by side in one run: the
# same client (`tandem bench --frontend http`: /v1/completions streamed, random token-id prompts,
# ignore_eos), the same prompts and output lengths, concurrency 1, 4 and 8, both servers with the
# same threads and the same BF16 weights. Prints output tokens/s and TTFT P50/P99 for each.
#
#   scripts/bench_serve_cpu.sh [MODEL_DIR]      (default: models/kjv-target)
#
# llama-server: $LLAMA_SERVER, else built once (a few minutes) into $TANDEM_BUILD_DIR/llama.cpp from
# the llama.cpp source node-llama-cpp ships (tests/conformance/node_modules/node-llama-cpp/llama/
# gitRelease.bundle, the release its prebuilt binaries come from), for this CPU (GGML_NATIVE).
# The GGUF is written by tests/conformance/export_gguf.mjs (BF16, as stored). Tandem runs one combined
# worker (prefill and decode in one process, as llama-server is one); llama-server runs --parallel 8
# slots. Both keep their default KV cache types (Tandem f32, llama.cpp f16) and prefix caches
# (random prompts share nothing).
#
# Then, with BENCH_RATES (e.g. 8,16: requests a second), the same servers under open-loop Poisson
# arrivals at each rate (`tandem bench --request-rate`, BENCH_RATE_REQUESTS requests): a closed loop
# whose requests all have one length keeps them in step (a wave of concurrency-many prompts arrives
# together each time the last wave finishes), so its TTFT is the time to prefill a whole wave;
# independent arrivals show what a request waits for its first token among running ones.
#
# Environment: TANDEM_BUILD_DIR (build), BENCH_THREADS (nproc), BENCH_LEVELS (1,4,8),
# BENCH_INPUT_LEN (128), BENCH_OUTPUT_LEN (128), BENCH_REQUESTS (48 a level), BENCH_RATES (none),
# BENCH_RATE_REQUESTS (96), BENCH_PORT (base port, 47100), LLAMA_SERVER (a llama-server binary to
# use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
THREADS="${BENCH_THREADS:-$(nproc)}"
LEVELS="${BENCH_LEVELS:-1,4,8}"
INPUT_LEN="${BENCH_INPUT_LEN:-128}"
OUTPUT_LEN="${BENCH_OUTPUT_LEN:-128}"
REQUESTS="${BENCH_REQUESTS:-48}"
RATES="${BENCH_RATES:-}"
RATE_REQUESTS="${BENCH_RATE_REQUESTS:-96}"
PORT="${BENCH_PORT:-47100}"
MODEL="${1:-models/kjv-target}"
TANDEM="$BUILD_DIR/cli/tandem"
[[ -x "$TANDEM" ]] || { echo "bench_serve_cpu: build tandem first (cmake --build $BUILD_DIR --target tandem)" >&2; exit 2; }
[[ -f "$MODEL/config.json" ]] || { echo "bench_serve_cpu: $MODEL has no config.json" >&2; exit 2; }
NODE_LLAMA=tests/conformance/node_modules/node-llama-cpp
[[ -d "$NODE_LLAMA" ]] || { echo "bench_serve_cpu: install the llama.cpp oracle first: (cd tests/conformance && npm ci --ignore-scripts --omit=optional)" >&2; exit 2; }

LLAMA_SERVER="${LLAMA_SERVER:-$BUILD_DIR/llama.cpp/build/bin/llama-server}"
if [[ ! -x "$LLAMA_SERVER" ]]; then
  src="$BUILD_DIR/llama.cpp/src"
  echo "== building llama-server from $NODE_LLAMA/llama/gitRelease.bundle into $BUILD_DIR/llama.cpp (once)" >&2
  rm -rf "$src"
  git clone -q "$NODE_LLAMA/llama/gitRelease.bundle" "$src" 2>/dev/null
  cmake -S "$src" -B "$BUILD_DIR/llama.cpp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
  cmake --build "$BUILD_DIR/llama.cpp/build" -j"$(nproc)" --target llama-server >&2
fi

out="$(mktemp -d /tmp/tandem-bench-serve.XXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n "${KEEP_OUT:-}" ]] || rm -rf "$out"
}
trap cleanup EXIT

vocab="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$MODEL/config.json")"
common=(--frontend http --workload random --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
  --num-requests "$REQUESTS" --sweep-concurrency "$LEVELS" --bench-seed 1)
# shellcheck source=scripts/bench_common.sh
source scripts/bench_common.sh
echo "machine: $(cpu_model), $(nproc) CPUs; model $MODEL; threads $THREADS; $REQUESTS requests a level," \
  "$INPUT_LEN-token prompts, $OUTPUT_LEN output tokens (ignore_eos)"

# 1. Tandem: a router with the HTTP API and one combined worker.
echo "== tandem up --combined 1 (TANDEM_NUM_THREADS=$THREADS)" >&2
TANDEM_NUM_THREADS="$THREADS" "$TANDEM" up --model "$MODEL" --prefill 0 --decode 0 --combined 1 \
  --port "$PORT" --http-port "$((PORT + 1))" --log-dir "$out/tandem-logs" --ready-file "$out/ready" \
  > "$out/up.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do [[ -f "$out/ready" ]] && break; sleep 0.1; done
[[ -f "$out/ready" ]] || { echo "bench_serve_cpu: tandem up did not become ready: $(tail -5 "$out/up.log")" >&2; exit 1; }
"$TANDEM" bench "${common[@]}" --server "127.0.0.1:$PORT" --http-server "127.0.0.1:$((PORT + 1))" \
  --json-out "$out/tandem" --chart "$out/tandem.svg" >&2
open_loop() {  # SIDE SERVER_FLAGS...: each of RATES, Poisson arrivals
  local side="$1" r
  shift
  for r in ${RATES//,/ }; do
    "$TANDEM" bench --frontend http --workload random --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
      --num-requests "$RATE_REQUESTS" --request-rate "$r" --bench-seed 1 "$@" \
      --json-out "$out/$side.r$r.json" >&2
  done
}
open_loop tandem --server "127.0.0.1:$PORT" --http-server "127.0.0.1:$((PORT + 1))"
kill -TERM "${pids[0]}"
wait "${pids[0]}" || true

# 2. llama.cpp: llama-server with 8 slots, each with the context a request needs.
echo "== llama-server ($LLAMA_SERVER)" >&2
node tests/conformance/export_gguf.mjs --model "$MODEL" --out "$out/model.gguf" --dtype bf16 >&2
slots=8
# A port free now (one near PORT may still be held by a Tandem worker that is shutting down).
LLAMA_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$LLAMA_SERVER" -m "$out/model.gguf" -t "$THREADS" -tb "$THREADS" --parallel "$slots" \
  -c "$((slots * (INPUT_LEN + OUTPUT_LEN + 16)))" --port "$LLAMA_PORT" --host 127.0.0.1 --no-webui \
  > "$out/llama-server.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$LLAMA_PORT/health" > /dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$LLAMA_PORT/health" > /dev/null ||
  { echo "bench_serve_cpu: llama-server did not come up: $(tail -5 "$out/llama-server.log")" >&2; exit 1; }
"$TANDEM" bench "${common[@]}" --http-server "127.0.0.1:$LLAMA_PORT" --vocab-size "$vocab" \
  --json-out "$out/llama" --chart "$out/llama.svg" >&2
open_loop llama --http-server "127.0.0.1:$LLAMA_PORT" --vocab-size "$vocab"

python3 - "$out" "$LEVELS" "$RATES" <<'PY'
import json, os, sys
out, levels = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
rates = [r for r in sys.argv[3].split(",") if r]
def load(side, c, kind="c"):
    path = os.path.join(out, f"{side}.{kind}{c}.json")
    return json.load(open(path)) if os.path.exists(path) else None
print()
print("output tokens/s and TTFT (ms), through /v1/completions streamed; T = tandem up, L = llama-server")
print(f"{'concurrency':>11} {'T tok/s':>9} {'L tok/s':>9} {'T/L':>6} {'T TTFT P50':>11} {'L TTFT P50':>11}"
      f" {'T TTFT P99':>11} {'L TTFT P99':>11} {'T done':>7} {'L done':>7}")
bad = False
for c in levels:
    t, l = load("tandem", c), load("llama", c)
    if not t or not l:
        print(f"{c:>11} (missing results)")
        bad = True
        continue
    tt, lt = t["output_token_throughput"], l["output_token_throughput"]
    print(f"{c:>11} {tt:9.1f} {lt:9.1f} {tt / lt if lt else 0:6.2f} {t['ttft']['p50_ms']:11.1f}"
          f" {l['ttft']['p50_ms']:11.1f} {t['ttft']['p99_ms']:11.1f} {l['ttft']['p99_ms']:11.1f}"
          f" {t['completed']:>7} {l['completed']:>7}")
    bad |= t["completed"] == 0 or l["completed"] == 0
if rates:
    print()
    print("open loop, Poisson arrivals: output tokens/s, TTFT and ITL (ms); T = tandem up, L = llama-server")
    print(f"{'req/s':>6} {'T tok/s':>9} {'L tok/s':>9} {'T TTFT P50':>11} {'L TTFT P50':>11} {'T TTFT P99':>11}"
          f" {'L TTFT P99':>11} {'T ITL P50':>10} {'L ITL P50':>10} {'T done':>7} {'L done':>7}")
for r in rates:
    t, l = load("tandem", r, "r"), load("llama", r, "r")
    if not t or not l:
        print(f"{r:>6} (missing results)")
        bad = True
        continue
    print(f"{r:>6} {t['output_token_throughput']:9.1f} {l['output_token_throughput']:9.1f}"
          f" {t['ttft']['p50_ms']:11.1f} {l['ttft']['p50_ms']:11.1f} {t['ttft']['p99_ms']:11.1f}"
          f" {l['ttft']['p99_ms']:11.1f} {t['itl']['p50_ms']:10.2f} {l['itl']['p50_ms']:10.2f}"
          f" {t['completed']:>7} {l['completed']:>7}")
    bad |= t["completed"] == 0 or l["completed"] == 0
sys.exit(1 if bad else 0)
PY
