#!/usr/bin/env bash
# The benchmark scripts of gpu_check.sh's bench stage, run on the CPU at small sizes with the arguments
# that stage gives them (device and KV transport aside): throughput_vs_hf.py (plain, with the larger
# step budget, sampled), disagg_bench.py, disagg_vs_combined.py and kv_transfer_bench; each must finish
# with its figures, and scripts/gpu_summary.py must read their outputs. Figures are not checked (2
# shared cores), only that every level and every side came back. With the CUDA emulator's plugin as a
# fourth argument, kv_transfer_bench also runs as that stage runs it (--device cuda: two processes,
# TCP staging and NCCL side by side) on the emulator, whose NCCL is emulated over loopback TCP.
#   bench_scripts_test.sh TANDEM KV_TRANSFER_BENCH SOURCE_DIR [CUDA_EMU_PLUGIN]
set -euo pipefail
tandem=$1 kvb=$2 src=$3 emu_plugin=${4:-}
out=$(mktemp -d /tmp/tandem-bench-scripts.XXXX)
trap '[[ -n ${KEEP_OUT:-} ]] || rm -rf "$out"' EXIT
model="$src/models/kjv-target"
# Router ports away from the scripts' defaults and from other tests running beside this one, and
# below Linux's ephemeral range (32768 and up), where any test's outgoing connection may hold a port
# (30000 + ... reached into it: one run failed "cannot listen on 0.0.0.0:39192").
port=$((20000 + $$ % 6000 * 2))
fail() { echo "FAILED: $*"; exit 1; }
cd "$src"
common=(--device cpu --input-len 24 --output-len 6 --skip-hf)
python3 tests/bench/throughput_vs_hf.py "$tandem" "$model" "${common[@]}" --concurrency 1,4 --port "$port" \
  --json-out "$out/throughput.json" >> "$out/throughput.txt" 2>&1 || fail "throughput_vs_hf.py ($(tail -3 "$out/throughput.txt"))"
python3 tests/bench/throughput_vs_hf.py "$tandem" "$model" "${common[@]}" --concurrency 4 --port "$port" \
  --up-args=--max-num-batched-tokens=8192,--max-prefill-chunk=2048 --json-out "$out/budget.json" \
  >> "$out/throughput.txt" 2>&1 || fail "throughput_vs_hf.py --up-args"
python3 tests/bench/throughput_vs_hf.py "$tandem" "$model" "${common[@]}" --concurrency 4 --port "$port" \
  --temperature 0.8 --top-p 0.95 --json-out "$out/sampled.json" >> "$out/throughput.txt" 2>&1 ||
  fail "throughput_vs_hf.py --temperature"
python3 tests/bench/disagg_bench.py "$tandem" "$model" --prompt-len 48 --requests 2 --port "$port" \
  --up-arg=--device=cpu >> "$out/disagg.txt" 2>&1 || fail "disagg_bench.py ($(tail -3 "$out/disagg.txt"))"
python3 tests/bench/disagg_vs_combined.py "$tandem" "$model" --request-rate 20 --num-requests 8 --long-len 96 \
  --short-len 16 --output-len 4 --port "$port" --up-arg=--device=cpu --json-out "$out/mixed.json" \
  >> "$out/mixed.txt" 2>&1 || fail "disagg_vs_combined.py ($(tail -3 "$out/mixed.txt"))"
"$kvb" --device cpu --presets qwen2.5-0.5b --tokens 64 --iterations 1 --transports tcp --two-processes >> "$out/kv_transfer.txt" 2>&1 ||
  fail "kv_transfer_bench ($(tail -3 "$out/kv_transfer.txt"))"
if [[ -n $emu_plugin ]]; then
  TANDEM_CUDA_PLUGIN=$emu_plugin TANDEM_CUDA_EMU_MEMORY_MB=512 "$kvb" --device cuda --presets qwen2.5-0.5b --tokens 64 \
    --iterations 1 --kv-dtype bf16 > "$out/kv_transfer_cuda.txt" 2>&1 ||
    fail "kv_transfer_bench --device cuda on the emulator ($(tail -3 "$out/kv_transfer_cuda.txt"))"
  # The 8-bit caches (int8 with its scales inside the blocks, fp8) over the same three transports:
  # the receiver checks every byte.
  for kvd in int8 fp8; do
    TANDEM_CUDA_PLUGIN=$emu_plugin TANDEM_CUDA_EMU_MEMORY_MB=512 "$kvb" --device cuda --presets qwen2.5-0.5b \
      --tokens 64 --iterations 1 --kv-dtype $kvd > "$out/kv_transfer_$kvd.txt" 2>&1 ||
      fail "kv_transfer_bench --device cuda --kv-dtype $kvd on the emulator ($(tail -3 "$out/kv_transfer_$kvd.txt"))"
    [[ $(grep -c '^qwen2.5-0.5b' "$out/kv_transfer_$kvd.txt") == 1 ]] ||
      fail "kv_transfer_bench --kv-dtype $kvd: no result row ($(tail -3 "$out/kv_transfer_$kvd.txt"))"
  done
fi
# scripts/bench_http.sh's driver, tiny: both front doors at one level, and a few concurrent HTTP streams.
python3 tests/bench/frontends_bench.py "$tandem" "$model" --concurrency 2 --num-requests 4 --input-len 16 \
  --output-len 4 --streams 8 --stream-output-len 4 --port "$port" --json-out "$out/frontends.json" \
  > "$out/frontends.txt" 2>&1 || fail "frontends_bench.py ($(tail -3 "$out/frontends.txt"))"
python3 - "$out/frontends.json" <<'PY' || fail "frontends_bench.py: incomplete figures ($(tail -3 "$out/frontends.txt"))"
import json, sys
r = json.load(open(sys.argv[1]))
level = r["levels"][0]
assert level["grpc"]["completed"] == 4 and level["http"]["completed"] == 4, level
assert level["mixed"]["grpc"]["completed"] == 2 and level["mixed"]["http"]["completed"] == 2, level
assert r["streams"]["completed"] == 8 and r["streams"]["router_threads_peak"] > 0, r["streams"]
PY
# gpu_check.sh's spec step: spec_bench (beside kv_transfer_bench) with every configuration, tiny.
"$(dirname "$kvb")/spec_bench" --model "$model" --draft "$src/models/kjv-draft" --prompts 1 --output-len 8 \
  --concurrency 2 --concurrency-output-len 4 > "$out/spec.txt" 2>&1 || fail "spec_bench ($(tail -3 "$out/spec.txt"))"
grep -q "draft adaptive" "$out/spec.txt" || fail "spec_bench: no draft rows ($(tail -3 "$out/spec.txt"))"
# scripts/bench_quant_cpu.sh (Tandem's quantized CPU path against llama.cpp's Q8_0/Q4_0), tiny: every
# side of every row asked for must come back with a figure. (The llama.cpp oracle is installed by the
# test command, as for the conformance tests.)
TANDEM_BUILD_DIR="$(cd "$(dirname "$kvb")/../.." && pwd)" BENCH_ROWS="bf16 int4-head" BENCH_PROMPT_LEN=8 \
  BENCH_DECODE_TOKENS=2 BENCH_REPEATS=1 BENCH_THREADS=1 scripts/bench_quant_cpu.sh "$model" > "$out/quant.txt" \
  2> "$out/quant.err" || fail "bench_quant_cpu.sh ($(tail -3 "$out/quant.err"))"
for row in bf16 int4-head; do
  want=$([[ $row == bf16 ]] && echo 8 || echo 10)  # bf16 has no int8-activation figures ("-")
  got=$(awk -v r="$row" '$1 == r { n = 0; for (i = 2; i <= NF; i++) if ($i ~ /^\(?[0-9.]+\)?$/) n++; print n }' "$out/quant.txt")
  [[ $got == "$want" ]] || fail "bench_quant_cpu.sh: row $row has $got figures, want $want: $(grep "^$row " "$out/quant.txt")"
done
# scripts/bench_cpu.sh (issue 33's table), tiny, kjv-target in every row: each row has its five
# figures, and the roofline line its share.
TANDEM_BUILD_DIR="$(cd "$(dirname "$kvb")/../.." && pwd)" BENCH_QUANT=0 BENCH_REPEATS=1 BENCH_THREADS=1 \
  BENCH_PREFILL_LEN=16 BENCH_LONG_PREFILL_LEN=24 BENCH_DECODE_PROMPT_LEN=8 BENCH_DECODE_TOKENS=2 \
  BENCH_DECODE_BATCH=2 BENCH_ROOFLINE_MIB=64 scripts/bench_cpu.sh "$model" "$model" > "$out/cpu.txt" 2> "$out/cpu.err" ||
  fail "bench_cpu.sh ($(tail -3 "$out/cpu.err"))"
for row in prefill-16 prefill-24 decode-1 decode-2; do
  got=$(awk -v r="$row" '$1 == r { n = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9.]+$/) n++; print n }' "$out/cpu.txt")
  [[ $got == 5 ]] || fail "bench_cpu.sh: row $row has ${got:-no} figures, want 5: $(cat "$out/cpu.txt")"
done
grep -q "reads its weights at [0-9.]*% of it" "$out/cpu.txt" || fail "bench_cpu.sh: no roofline share: $(cat "$out/cpu.txt")"
# scripts/bench_serve_cpu.sh (tandem up against llama-server through one client), tiny, against a
# stand-in llama-server (one token an event, no logprobs, as the real one streams): both sides must
# complete every request at every level, and the stand-in's tokens be counted one an event.
LLAMA_SERVER="$src/tests/bench/standin_llama_server.py" TANDEM_BUILD_DIR="$(cd "$(dirname "$kvb")/../.." && pwd)" \
  BENCH_LEVELS=1,2 BENCH_REQUESTS=2 BENCH_INPUT_LEN=8 BENCH_OUTPUT_LEN=4 BENCH_THREADS=1 BENCH_PORT=$((port + 5)) \
  BENCH_RATES=40 BENCH_RATE_REQUESTS=3 scripts/bench_serve_cpu.sh "$model" > "$out/serve.txt" 2> "$out/serve.err" ||
  fail "bench_serve_cpu.sh ($(tail -3 "$out/serve.err"))"
for c in 1 2; do
  awk -v c="$c" '$1 == c && $2 > 0 && $3 > 0 && $(NF - 1) == 2 && $NF == 2 { ok = 1 } END { exit !ok }' \
    "$out/serve.txt" || fail "bench_serve_cpu.sh: level $c incomplete: $(cat "$out/serve.txt")"
done
# Its open-loop row (BENCH_RATES): both sides' throughput, TTFTs and ITLs, every request done.
awk '$1 == 40 && NF == 11 && $2 > 0 && $3 > 0 && $4 > 0 && $5 > 0 && $10 == 3 && $11 == 3 { ok = 1 } END { exit !ok }' \
  "$out/serve.txt" || fail "bench_serve_cpu.sh: open-loop row incomplete: $(cat "$out/serve.txt")"
python3 scripts/gpu_summary.py "$out" > /dev/null || fail "gpu_summary.py"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
bad = []
for name, levels in (("throughput", ["1", "4"]), ("budget", ["4"]), ("sampled", ["4"])):
    r = json.load(open(f"{out}/{name}.json"))
    got = {k: v for k, v in r["tandem"].items() if isinstance(v, (int, float)) and v > 0}
    if sorted(got) != levels:
        bad.append(f"{name}: Tandem figures for levels {sorted(r['tandem'])}, want {levels} all > 0")
    for key, what in (("tandem_host_share", "engine host shares"),
                      ("tandem_prompt_forward_share", "shares of forward time in steps with prompt tokens")):
        shares = r.get(key, {})
        if sorted(shares) != levels or not all(isinstance(v, float) and 0 < v < 1 for v in shares.values()):
            bad.append(f"{name}: {what} {shares}, want one in (0, 1) for each of {levels}")
    if "skipped" not in r.get("hf_note", ""):
        bad.append(f"{name}: transformers column says {r.get('hf_note')!r}")
mixed = json.load(open(f"{out}/mixed.json"))
for side in ("disaggregated", "combined"):
    m = mixed.get(side, {})
    if m.get("requests") != 8 or not m.get("output_tok_s", 0) > 0 or not m.get("ttft_p50_ms", 0) > 0:
        bad.append(f"disagg_vs_combined.py, {side}: {m.get('requests')} of 8 requests answered, "
                   f"{m.get('output_tok_s')} output tok/s, TTFT P50 {m.get('ttft_p50_ms')} ms")
disagg = open(f"{out}/disagg.txt").read()
for words in ("layer-wise", "TTFT"):
    if words not in disagg:
        bad.append(f"disagg_bench.py printed no '{words}'")
if "GB/s" not in open(f"{out}/kv_transfer.txt").read():
    bad.append("kv_transfer_bench printed no GB/s")
try:
    cuda = open(f"{out}/kv_transfer_cuda.txt").read()
except FileNotFoundError:
    cuda = None  # built without CUDA: no emulator
if cuda is not None:
    # geometry, tokens, MiB, then a GB/s figure for each of TCP staging, NCCL and CUDA IPC
    rows = [l.split() for l in cuda.splitlines() if l.startswith("qwen2.5-0.5b")]
    if ("nccl GB/s" not in cuda or "cuda-ipc GB/s" not in cuda or len(rows) != 1 or len(rows[0]) != 6
            or not all(float(x) > 0 for x in rows[0][3:])):
        bad.append(f"kv_transfer_bench --device cuda on the emulator: no TCP, NCCL and CUDA IPC figures:\n{cuda[-600:]}")
summary = open(f"{out}/summary.txt").read()
for title in ("== throughput", "== TTFT with layer-wise overlap", "== disaggregated vs combined", "== KV transfer"):
    if title not in summary:
        bad.append(f"gpu_summary.py has no '{title}' section")
for b in bad:
    print(b)
print("bench scripts: " + ("every script came back with its figures" if not bad else f"{len(bad)} problems"))
sys.exit(1 if bad else 0)
PY
