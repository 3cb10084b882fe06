#!/usr/bin/env bash
# The router's two front doors side by side (tests/bench/frontends_bench.py): the same workload
# through gRPC and through the OpenAI HTTP API at concurrency 1, 16 and 64 (TTFT and inter-token
# latency percentiles), then 1,000 HTTP streams open at once with the router's thread count. Results
# go in docs/benchmarks.md ("Front doors"). The workers get 1 GiB of KV cache (BENCH_KV_CACHE_MEMORY):
# every stream must find room, or it is refused rather than queued.
#   scripts/bench_http.sh [MODEL_DIR]     (default the embedded models/kjv-target)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
MODEL="${1:-models/kjv-target}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem tandem-router tandem-prefill-worker tandem-decode-worker
source scripts/bench_common.sh
echo "== front doors on $(cpu_model), $(nproc) cores, model $MODEL"
python3 tests/bench/frontends_bench.py "$BUILD_DIR/cli/tandem" "$MODEL" --concurrency "${BENCH_CONCURRENCY:-1,16,64}" \
  --num-requests "${BENCH_REQUESTS:-128}" --input-len "${BENCH_INPUT_LEN:-128}" --output-len "${BENCH_OUTPUT_LEN:-64}" \
  --streams "${BENCH_STREAMS:-1000}" --stream-output-len "${BENCH_STREAM_OUTPUT_LEN:-64}" \
  --up-arg=--kv-cache-memory="${BENCH_KV_CACHE_MEMORY:-1G}" ${BENCH_JSON_OUT:+--json-out "$BENCH_JSON_OUT"}
