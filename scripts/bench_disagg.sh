#!/usr/bin/env bash
# Disaggregation benchmarks: TCP KV-transfer bandwidth on loopback (kv_transfer_bench) and the share
# of TTFT spent in KV transfer with layer-wise overlap on and off (disagg_bench.py, through
# `tandem up`). Results go in docs/benchmarks.md.
#   scripts/bench_disagg.sh [PRESET] [PROMPT_LEN]     (default qwen2.5-0.5b, 512)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
PRESET="${1:-qwen2.5-0.5b}"
PROMPT_LEN="${2:-512}"
MODEL="models-cache/$PRESET"

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem tandem-router tandem-prefill-worker tandem-decode-worker \
  kv_transfer_bench
if [[ ! -f "$MODEL/config.json" ]]; then
  "$BUILD_DIR/cli/tandem" make-model --preset "$PRESET" --out "$MODEL" --seed 0
fi
echo "== KV transfer bandwidth (TCP, loopback)"
"$BUILD_DIR/tests/bench/kv_transfer_bench" --iterations 10
echo "== TTFT breakdown, layer-wise transfer on and off ($PRESET)"
python3 tests/bench/disagg_bench.py "$BUILD_DIR/cli/tandem" "$MODEL" --prompt-len "$PROMPT_LEN"
