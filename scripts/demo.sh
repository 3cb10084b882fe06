#!/usr/bin/env bash
# The main job on an embedded default: builds Tandem, takes the default model — the small trained
# kjv-target in models/ (a random tiny Llama is made when it is absent), starts a local cluster with
# `tandem up` (a router, one prefill and one decode worker), streams a completion from it through the
# router over gRPC, and stops the cluster.
#   scripts/demo.sh ["prompt text"]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
MODEL="${TANDEM_DEFAULT_MODEL:-models/kjv-target}"
PROMPT="${1:-And God said unto Moses,}"
PORT="${TANDEM_PORT:-50051}"

bash scripts/install_deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem tandem-router tandem-prefill-worker tandem-decode-worker
if [[ ! -f "$MODEL/config.json" ]]; then
  MODEL=models-cache/tiny-llama
  [[ -f "$MODEL/config.json" ]] || "$BUILD_DIR/cli/tandem" make-model --preset tiny-llama --out "$MODEL" --seed 0
fi

READY="$(mktemp -u /tmp/tandem-demo-ready.XXXXXX)"
"$BUILD_DIR/cli/tandem" up --model "$MODEL" --port "$PORT" --ready-file "$READY" &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null; rm -f "$READY"' EXIT
for _ in $(seq 600); do
  [[ -f "$READY" ]] && break
  kill -0 $UP 2>/dev/null || { echo "tandem up failed" >&2; exit 1; }
  sleep 0.1
done
[[ -f "$READY" ]] || { echo "the cluster did not start in 60 s" >&2; exit 1; }
"$BUILD_DIR/cli/tandem" generate --server "$(cat "$READY")" --prompt "$PROMPT" --max-tokens 64 --seed 0 \
  --temperature 0.8 --top-p 0.95
