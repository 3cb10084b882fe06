#!/usr/bin/env bash
# The main job on an embedded default: builds Tandem, creates the default model if it is absent
# (a random-initialised tiny Llama, until trained models ship), starts a local cluster with
# `tandem up` (a router, one prefill and one decode worker), streams a completion from it through the
# router over gRPC, and stops the cluster.
#   scripts/demo.sh ["prompt text"]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
MODEL="${TANDEM_DEFAULT_MODEL:-models-cache/tiny-llama}"
PROMPT="${1:-Once upon a time}"
PORT="${TANDEM_PORT:-50051}"

bash scripts/install_deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem tandem-router tandem-prefill-worker tandem-decode-worker
if [[ ! -f "$MODEL/config.json" ]]; then
  "$BUILD_DIR/cli/tandem" make-model --preset tiny-llama --out "$MODEL" --seed 0
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
"$BUILD_DIR/cli/tandem" generate --server "$(cat "$READY")" --prompt "$PROMPT" --max-tokens 48 --seed 0
