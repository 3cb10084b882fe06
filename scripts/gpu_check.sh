#!/usr/bin/env bash
# The GPU checks, run on the GPU machine from the repository root over a bundle made by
# scripts/gpu_bundle.sh (carried as .gpu_bundle). Writes logs to $OUT (or ./gpu-check-out) as it
# goes, so a run cut short still returns what it finished. Stages, in order (STAGES picks; default
# all three):
#   tests  the CUDA smoke test, the CUDA backend test (every op and every tiny preset vs the CPU), the
#          NCCL and CUDA IPC link tests (two processes on this GPU), every tiny preset in BF16 against transformers
#          (tests/gpu/hf_forward_check.py, as is, with --compute-dtype f16 and with --split-gemm-inputs;
#          with HF_TC=1 again over a
#          BF16 cache with tensor-core prompt attention, reported only), and `tandem generate` on models/kjv-target with
#          --device cuda vs --device cpu (greedy, 64 tokens);
#   e2e    the end-to-end service suite with every worker on CUDA and KV over NCCL, one process per
#          test (E2E_FILTER picks tests, default all), then the disaggregated equivalence and
#          mid-transfer fault tests with KV over CUDA IPC (E2E_IPC_FILTER);
#   bench  kv_transfer_bench (TCP staging vs NCCL vs CUDA IPC, two processes), disagg_bench.py (TTFT
#          with layer-wise overlap on and off, over each of DISAGG_TRANSPORTS, default "cuda-ipc nccl";
#          the mixed workload over MIXED_TRANSPORT, default cuda-ipc), forward_bench (prefill and batch-1 decode against
#          the device's measured ceilings; with --profile-ops, the time of every op) and
#          throughput_vs_hf.py (a combined CUDA worker against transformers' generate()) over random
#          BF16 weights of qwen2.5-0.5b and, with TANDEM_GPU_BIG=1, qwen2.5-7b and llama-3-8b (each
#          7-8B model takes ~16 GB of disk). BENCH_PRESETS names the models instead, BENCH_STEPS picks
#          among kv, forward, profile, throughput, budget (Tandem's throughput with 8192-token steps and
#          2048-token prompt chunks), sampled (Tandem's throughput at temperature 0.8,
#          top-p 0.95), disagg and mixed (disaggregated vs combined on long and short prompts,
#          tests/bench/disagg_vs_combined.py), spec (speculative decoding, spec_bench on a padded
#          kjv-target with kjv-draft, and its decode steps of 1, 5 and 8 rows) and quant (the FP8 KV
#          cache's eval and speed, quant_bench's INT8/INT4 against BF16, an INT4 op profile),
#          DECODE_BATCHES the forward batches (FORWARD_TUNINGS=0: those alone, without the tuning
#          runs).
#   llama  (not in the default STAGES) takes llama.cpp's llama-server built for sm_90 on the build
#          machine (.gpu_bundle/llama-server.tar.xz, scripts/llama_cpp_server.sh), or else builds it here
#          from .gpu_bundle/llama.cpp-src.tar.xz (scripts/llama_cpp_source.sh; about 6 minutes), converts
#          the benchmark models to F16 GGUF with its convert_hf_to_gguf.py, and runs
#          throughput_vs_hf.py with the llama.cpp column (concurrency 1, 16, 64).
#          LLAMA_BUILD_EARLY=1 on an earlier call (any stages but llama) starts that build in the
#          background, in a process session of its own (the device machine keeps such a process
#          running between calls while it stays warm), niced, on all but 4 cores; the llama stage then
#          waits for it (at most LLAMA_WAIT_S seconds, default 480) instead of spending its six minutes
#          of device time. Timings taken while it builds share the CPU with it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check-out}"
# The device tool returns at most 8 files from $OUT: with GPU_CHECK_TAR=1 the logs go to a folder
# that is packed into $OUT/gpu-check-<stages>.tgz when the script exits.
if [[ "${GPU_CHECK_TAR:-0}" == 1 ]]; then
  TAR_TO="$OUT/gpu-check-$(echo "${STAGES:-all}" | tr ' ' '-').tgz"
  OUT=$(mktemp -d /tmp/gpu-check.XXXX)
  # The summary also comes back on its own, as a plain file beside the archive.
  trap 'python3 scripts/gpu_summary.py "$OUT" >/dev/null 2>&1; cp "$OUT/summary.txt" "${TAR_TO%.tgz}-summary.txt" 2>/dev/null;
        tar -C "$OUT" -czf "$TAR_TO" . 2>/dev/null' EXIT
fi
mkdir -p "$OUT" .gpu_bundle/run
tar -C .gpu_bundle/run -xJf .gpu_bundle/bundle.tar.xz
BIN=.gpu_bundle/run/bin
# Debian 12's libstdc++ in the bundle needs glibc 2.36; on an older system use the system's own
# (the binaries need GLIBCXX_3.4.29 at most, which GCC 11's libstdc++ provides).
glibc=$(ldd --version | head -1 | grep -o "[0-9]*\.[0-9]*$")
if [[ "$(printf '%s\n' "$glibc" 2.36 | sort -V | head -1)" != 2.36 ]]; then
  rm -f .gpu_bundle/run/lib/libstdc++.so.6 .gpu_bundle/run/lib/libgcc_s.so.1
fi
# CUDA 13's runtime and cuBLAS from the toolkit, or from PyTorch's nvidia-* wheels. Only Tandem's
# programs get the bundle's libraries (through wrappers): Python keeps the system's own.
CUDA_DIRS=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for d in site.getsitepackages():
    for p in sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib"))):
        if any(glob.glob(os.path.join(p, f"{n}*.so*")) for n in ("libcublas", "libcudart", "libnccl")):
            dirs.append(p)
print(":".join(dirs))
PY
)
TLD="$PWD/.gpu_bundle/run/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${CUDA_DIRS:+:$CUDA_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p .gpu_bundle/run/wrap
for b in "$BIN"/*; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$TLD" "$PWD/$b" > ".gpu_bundle/run/wrap/$(basename "$b")"
  chmod +x ".gpu_bundle/run/wrap/$(basename "$b")"
done
W=.gpu_bundle/run/wrap
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
LD_LIBRARY_PATH="$TLD" ldd "$BIN/cuda_backend_test" "$BIN/tandem" "$BIN/libtandem_cuda_plugin.so" | grep "not found" | tee "$OUT/missing-libs.txt"
status=0
STAGES="${STAGES:-tests e2e bench}"
# Processes on this one GPU pair through NCCL's socket transport (distinct NCCL_HOSTIDs): over loopback,
# with no InfiniBand probing.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
# A random model of preset $1 in $2, written once (a .done marker, so a cut-short write is redone).
make_model() {
  [[ -f $2/.done ]] && return 0
  rm -rf "$2" && lim 600 "$W/tandem" make-model --preset "$1" --out "$2" >/dev/null && touch "$2/.done"
}
stage() { [[ " $STAGES " == *" $1 "* ]]; }
source scripts/gpu_forward_runs.sh
# forward_bench on model $2 with each argument list function $1 prints, appending to $OUT/$3.
bench_runs() {
  local runs=() args
  mapfile -t runs < <("$1")
  for args in "${runs[@]}"; do
    # shellcheck disable=SC2086 # each line is an argument list
    lim 300 "$W/forward_bench" --model "$2" --device cuda $args 2>&1 | tee -a "$OUT/$3" || status=1
  done
}
# Every program runs under a time limit (seconds; TO_PCT scales them all, in percent), so one hang costs its own step only.
lim() { local s=$1; shift; timeout -k 10 "$(( s * ${TO_PCT:-100} / 100 ))" "$@"; }
# The bench stage's steps (BENCH_STEPS picks; default all).
step() { [[ " ${BENCH_STEPS:-kv forward profile throughput budget sampled disagg mixed spec quant} " == *" $1 "* ]]; }
# The benchmark models of the bench and llama stages.
presets=(qwen2.5-0.5b)
[[ "${TANDEM_GPU_BIG:-0}" == 1 ]] && presets+=(qwen2.5-7b llama-3-8b)
[[ -n "${BENCH_PRESETS:-}" ]] && read -r -a presets <<< "$BENCH_PRESETS"
if stage tests; then
lim 60 "$W/cuda_smoke_test" 2>&1 | tee "$OUT/cuda_smoke.log" || status=1
lim 150 "$W/cuda_backend_test" 2>&1 | tee "$OUT/cuda_backend.log" || status=1
lim 120 "$W/kv_link_test" --link=nccl 2>&1 | tee "$OUT/nccl_link.log" || status=1
lim 120 "$W/kv_link_test" --link=cuda-ipc 2>&1 | tee "$OUT/cuda_ipc_link.log" || status=1
gen() { local d="$1"; shift; lim 120 env ${GEN_ENV:-} "$W/tandem" generate --model models/kjv-target --prompt "And God said" --max-tokens 64 --temperature 0 --json --device "$d" "$@"; }
gen cpu > "$OUT/generate-cpu.json" 2> "$OUT/generate-cpu.err" || status=1
gen cuda > "$OUT/generate-cuda.json" 2> "$OUT/generate-cuda.err" || status=1
# Decode graphs against op by op, both batch-invariant: the same tokens exactly.
gen cuda --batch-invariant=true --cuda-graphs=true > "$OUT/generate-cuda-graphs.json" 2> "$OUT/generate-cuda-graphs.err" || status=1
gen cuda --batch-invariant=true --cuda-graphs=false > "$OUT/generate-cuda-eager.json" 2> "$OUT/generate-cuda-eager.err" || status=1
# Programmatic dependent launch (TANDEM_CUDA_PDL=1) changes scheduling, not arithmetic: the same tokens
# and logprobs bit for bit, through decode graphs and op by op, twice each (a race would show).
for graphs in true false; do
  GEN_ENV="-u TANDEM_CUDA_PDL" gen cuda --logprobs 5 --cuda-graphs=$graphs > "$OUT/generate-cuda-lp-$graphs.json" \
    2> "$OUT/generate-cuda-lp-$graphs.err" || status=1
  for run in 1 2; do
    GEN_ENV=TANDEM_CUDA_PDL=1 gen cuda --logprobs 5 --cuda-graphs=$graphs > "$OUT/generate-cuda-pdl-$graphs-$run.json" \
      2> "$OUT/generate-cuda-pdl-$graphs-$run.err" || status=1
  done
done
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/checks.txt" || status=1
import json, sys
out = sys.argv[1]
bad = 0
for graphs in ("true", "false"):
    a = json.load(open(f"{out}/generate-cuda-lp-{graphs}.json"))
    for run in (1, 2):
        b = json.load(open(f"{out}/generate-cuda-pdl-{graphs}-{run}.json"))
        same = a.get("token_ids") == b.get("token_ids") and a.get("logprobs") == b.get("logprobs")
        bad += not same
        print(f"programmatic dependent launch (graphs {graphs}, run {run}) vs plain launches: "
              f"{'identical' if same else 'DIFFERENT'} tokens and logprobs")
sys.exit(0 if bad == 0 else "programmatic dependent launch changed the results")
PY
# The whole forward pass (prefill and decode graphs) in BF16 against transformers on this GPU.
lim 300 python3 tests/gpu/hf_forward_check.py "$W/tandem" 2>&1 | tee "$OUT/hf_forward_check.log" || status=1
# The same with the BF16 weights computed in F16 (--compute-dtype f16): on the CUDA emulator against
# the CPU backend the default rounding moved 700-token prompts' rows by up to 1.45e-2, over the 1e-2
# bound, and F16 by 1.8e-3; this says what the GPU gives.
lim 300 python3 tests/gpu/hf_forward_check.py "$W/tandem" --compute-dtype f16 2>&1 | tee "$OUT/hf_forward_check_f16.log" ||
  status=1
# And in BF16 with GEMM inputs split into two BF16 terms (--split-gemm-inputs): about f32 results from
# BF16 arithmetic (emulated: 1.8e-5 against the CPU).
lim 300 python3 tests/gpu/hf_forward_check.py "$W/tandem" --split-gemm-inputs 2>&1 |
  tee "$OUT/hf_forward_check_split.log" || status=1
# With HF_TC=1, the same over a BF16 cache with prompt attention on the tensor cores (opt-in until
# checked): how far the two roundings take the whole model (reported, not failed on).
if [[ "${HF_TC:-0}" == 1 ]]; then
  lim 300 env TANDEM_CUDA_TC_ATTENTION=1 python3 tests/gpu/hf_forward_check.py "$W/tandem" --kv-cache-dtype bf16 --tol 3e-2 \
    2>&1 | tee "$OUT/hf_forward_check_tc.log" || true
fi
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/checks.txt" || status=1
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/generate-cuda-{m}.json"))["token_ids"] for m in ("graphs", "eager"))
print(f"CUDA graphs vs op by op: {'identical' if a == b else 'DIFFERENT'} over {len(a)} tokens")
sys.exit(0 if a == b else "decode graphs changed the greedy tokens")
PY
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/checks.txt" || status=1
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/generate-{d}.json")) for d in ("cpu", "cuda"))
ta, tb = a["token_ids"], b["token_ids"]
same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
print(f"greedy tokens identical for the first {same} of {len(ta)}")
# BF16 activations on the GPU against f32 on the CPU: near-ties may part them later, not at once.
sys.exit(0 if same >= 8 else f"CUDA and CPU part after {same} tokens: expected at least 8 in common")
PY
fi
if stage e2e; then
  # One process per test: a test that aborts (or hangs to its limit) costs itself, not the rest.
  tests=$("$W/service_e2e_test" --gtest_list_tests --gtest_filter="${E2E_FILTER:-*}" |
          awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
  for t in $tests; do
    TANDEM_E2E_BIN_DIR="$PWD/$W" TANDEM_E2E_DEVICE=cuda TANDEM_E2E_KV_TRANSPORT=nccl \
      lim 120 "$W/service_e2e_test" --gtest_filter="$t" >> "$OUT/e2e-cuda-nccl.log" 2>&1 || { status=1; echo "[  FAILED  ] $t (exit)"; }
  done
  grep -E "^\[ +(OK|FAILED) " "$OUT/e2e-cuda-nccl.log"
  ipc_tests=$("$W/service_e2e_test" --gtest_list_tests \
    --gtest_filter="${E2E_IPC_FILTER:-*OnePrefillOneDecodeMatches*:*Bf16KvCacheDisaggregated*:*HungOrKilledMidTransfer*}" |
    awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
  for t in $ipc_tests; do
    TANDEM_E2E_BIN_DIR="$PWD/$W" TANDEM_E2E_DEVICE=cuda TANDEM_E2E_KV_TRANSPORT=cuda-ipc \
      lim 120 "$W/service_e2e_test" --gtest_filter="$t" >> "$OUT/e2e-cuda-ipc.log" 2>&1 || { status=1; echo "[  FAILED  ] $t (exit)"; }
  done
  grep -E "^\[ +(OK|FAILED) " "$OUT/e2e-cuda-ipc.log"
fi
if stage bench; then
! step kv || lim 180 "$W/kv_transfer_bench" --device cuda --presets qwen2.5-0.5b,llama-3-8b --tokens 512,4096 --iterations 5 \
  2>&1 | tee "$OUT/kv_transfer.txt" || status=1
! step kv || lim 180 "$W/kv_transfer_bench" --device cuda --presets llama-3-8b --tokens 4096 --iterations 3 --kv-dtype bf16 \
  2>&1 | tee -a "$OUT/kv_transfer.txt" || status=1
# NCCL's socket path with more sockets and threads (one socket, one thread by default): with one
# message a chunk the link may now be bound by a single socket's copy rate.
! step kv || NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 lim 180 "$W/kv_transfer_bench" --device cuda --presets llama-3-8b \
  --tokens 4096 --iterations 3 --kv-dtype bf16 --transports nccl 2>&1 | sed 's/^/NCCL 4x4 sockets: /' |
  tee -a "$OUT/kv_transfer.txt" || status=1
# Speculative decoding (issue 29): kjv-target padded to 1.6 GB (same function, a real model's
# weight reads) with kjv-draft, off / n-gram / draft / adaptive side by side.
if step spec; then
  pad=/tmp/tandem-models/kjv-pad
  [[ -f $pad/config.json ]] || lim 300 "$W/tandem" make-model --pad-from models/kjv-target --intermediate-size 65536 \
    --extra-layers 10 --out "$pad" > "$OUT/spec.txt" 2>&1 || status=1
  lim 600 "$W/spec_bench" --device cuda --model "$pad" --draft models/kjv-draft --k 4 --output-len 128 \
    --concurrency 1,8,32,64 2>&1 | grep -v "^[IW] " | tee -a "$OUT/spec.txt" || status=1
  # What a verification step costs: decode steps of 1, 5 and 8 rows (the goal: 5 rows <= 1.3x one).
  for b in 1 5 8; do
    lim 120 "$W/forward_bench" --device cuda --model "$pad" --prompt-len 128 --decode-tokens 32 --decode-batch $b \
      2>&1 | grep "^decode:" | sed "s/^/rows $b: /" | tee -a "$OUT/spec.txt" || status=1
  done
fi
# Quality of the FP8 KV cache on the device (on the emulator: perplexity -0.00%, mean KL 5.7e-4).
! step quant || lim 300 "$W/tandem" eval --device cuda --model models/kjv-target \
  --windows-file models/kjv-target/heldout_eval.json --kv-cache-dtype fp8 --json --progress=false 2>&1 |
  grep -v "^[IW] " | sed 's/^/eval kv fp8: /' | tee -a "$OUT/quant.txt" || status=1
for p in "${presets[@]}"; do
  dir=/tmp/tandem-models/$p
  make_model "$p" "$dir" || status=1
  # forward_runs and profile_runs: scripts/gpu_forward_runs.sh (also run on the emulator by ctest).
  ! step forward || bench_runs forward_runs "$dir" forward_bench.txt
  ! step profile || bench_runs profile_runs "$dir" profile.txt
  # Weight-only INT8/INT4 (quantized on load; the dequantizing GEMV, quant_gemv.cu) against BF16,
  # batch-1 decode, side by side.
  ! step quant || lim 600 "$W/quant_bench" --device cuda --model "$dir" --types none,int8,int4 --output-len 128 \
    --kv-cache-memory=2G 2>&1 | grep -v "^[IW] " | tee -a "$OUT/quant.txt" || status=1
  # Where an INT4 batch-1 step's time goes, op by op.
  ! step quant || lim 300 "$W/forward_bench" --device cuda --model "$dir" --quantization int4 --prompt-len 128 \
    --decode-tokens 16 --decode-batch 1 --repeats 1 --profile-ops 2>&1 | grep -v "^[IW] " |
    sed 's/^/int4 profile: /' | tee -a "$OUT/quant.txt" || status=1
  # The FP8 E4M3 KV cache against the model's BF16 one: decode and prefill with long contexts.
  ! step quant || for kv in bf16 fp8; do
    lim 300 "$W/forward_bench" --device cuda --model "$dir" --kv-cache-dtype $kv --prompt-len 2048 \
      --decode-tokens 64 --decode-batch 16 2>&1 | grep -v "^[IW] " | sed "s/^/kv $kv: /" | tee -a "$OUT/quant.txt" || status=1
  done
  levels=1,16,64; hf_levels=1,16
  [[ "${TANDEM_GPU_BIG:-0}" == 1 ]] && levels=1,16,64,256 && hf_levels=1,16,64,256
  ! step throughput || lim 900 python3 tests/bench/throughput_vs_hf.py "$W/tandem" "$dir" --device cuda --concurrency $levels \
    --hf-concurrency $hf_levels --json-out "$OUT/throughput-$p.json" 2>&1 | tee -a "$OUT/throughput.txt" || status=1
  # Larger steps (vLLM's GPU budget: 8192 tokens, prompt chunks of 2048) than the defaults (2048, 512),
  # Tandem alone at 16 and 64.
  ! step budget || lim 600 python3 tests/bench/throughput_vs_hf.py "$W/tandem" "$dir" --device cuda --concurrency 16,64 \
    --skip-hf --up-args=--max-num-batched-tokens=8192,--max-prefill-chunk=2048 \
    --json-out "$OUT/throughput-budget-$p.json" 2>&1 | tee -a "$OUT/throughput.txt" || status=1
  # Sampled (temperature 0.8, top-p 0.95: the device's candidates and draws), Tandem alone at 16 and 64.
  ! step sampled || lim 600 python3 tests/bench/throughput_vs_hf.py "$W/tandem" "$dir" --device cuda --concurrency 16,64 \
    --skip-hf --temperature 0.8 --top-p 0.95 --json-out "$OUT/throughput-sampled-$p.json" 2>&1 |
    tee -a "$OUT/throughput.txt" || status=1
  for kv in ${DISAGG_TRANSPORTS:-cuda-ipc nccl}; do
    ! step disagg || { echo "== disagg_bench over $kv"; lim 600 python3 tests/bench/disagg_bench.py "$W/tandem" "$dir" \
      --prompt-len 2048 --up-arg=--device=cuda --up-arg=--kv-transport=$kv 2>&1; } | tee -a "$OUT/disagg.txt" || status=1
  done
  # Disaggregated against combined on a mix of long and short prompts (open loop): TTFT and ITL.
  ! step mixed || lim 600 python3 tests/bench/disagg_vs_combined.py "$W/tandem" "$dir" --request-rate 16 --num-requests 128 \
    --long-len 2048 --short-len 128 --output-len 128 --up-arg=--device=cuda --up-arg=--kv-transport=${MIXED_TRANSPORT:-cuda-ipc} \
    --json-out "$OUT/mixed-$p.json" 2>&1 | tee -a "$OUT/mixed.txt" || status=1
done
fi
# llama.cpp's llama-server for sm_90 from the source tarball, built in $L/build on $1 cores; the log is
# $L/build.log and the exit status goes to $L/build.rc. The source is unpacked beforehand (llama_unpack).
L=/tmp/tandem-llama.cpp
llama_unpack() {
  [[ -d $L/llama.cpp ]] || { rm -rf "$L" && mkdir -p "$L" && tar -C "$L" -xJf .gpu_bundle/llama.cpp-src.tar.xz; }
}
llama_build() {
  cmake -S "$L/llama.cpp" -B "$L/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$L/build.log" 2>&1 &&
    cmake --build "$L/build" -j"$1" --target llama-server >> "$L/build.log" 2>&1
  echo $? > "$L/build.rc"
}
llama_building() { [[ -f $L/build.pid && ! -f $L/build.rc ]] && kill -0 "$(cat "$L/build.pid")" 2>/dev/null; }
if [[ "${LLAMA_BUILD_EARLY:-0}" == 1 ]] && ! stage llama && [[ ! -f .gpu_bundle/llama-server.tar.xz &&
      -f .gpu_bundle/llama.cpp-src.tar.xz && ! -x $L/build/bin/llama-server ]] && ! llama_building; then
  if llama_unpack; then
    rm -f "$L/build.rc" "$L/build.pid"
    cores=$(nproc); cores=$(( cores > 6 ? cores - 4 : 2 ))
    setsid nice -n 19 bash -c "L=$L; $(declare -f llama_build); llama_build $cores" < /dev/null > /dev/null 2>&1 &
    echo $! > "$L/build.pid"
    echo "gpu_check: building llama-server in the background on $cores cores (pid $!, log $L/build.log)"
  else
    echo "gpu_check: could not unpack .gpu_bundle/llama.cpp-src.tar.xz; no early llama-server build"
  fi
fi
if stage llama; then
  if llama_building; then
    waited=0
    echo "gpu_check: waiting for the background llama-server build (at most ${LLAMA_WAIT_S:-480} s)"
    while llama_building && (( waited < ${LLAMA_WAIT_S:-480} )); do
      sleep 5; waited=$(( waited + 5 ))
      (( waited % 60 == 0 )) && echo "  ${waited} s: $(tail -c 300 "$L/build.log" | tr '\r' '\n' | grep -o '\[[0-9]*/[0-9]*\]' | tail -1)"
    done
    llama_building && echo "gpu_check: the background build is still running after $waited s"
  fi
  [[ -f $L/build.log ]] && cp "$L/build.log" "$OUT/llama-build.log"
  if [[ -f .gpu_bundle/llama-server.tar.xz && ! -x $L/build/bin/llama-server ]]; then
    # Prebuilt: the binary and the libraries it needs beyond the C library and CUDA's, run through a
    # wrapper with them (and CUDA's) on the library path; the converter and tokenizers come with it.
    rm -rf "$L" && mkdir -p "$L/prebuilt" "$L/build/bin" && tar -C "$L/prebuilt" -xJf .gpu_bundle/llama-server.tar.xz
    ln -s "$L/prebuilt/llama.cpp" "$L/llama.cpp" && ln -s "$L/prebuilt/tokenizers" "$L/tokenizers"
    # As for the Tandem bundle: Debian 12's libstdc++ only on glibc 2.36 and newer.
    if [[ "$(printf '%s\n' "$glibc" 2.36 | sort -V | head -1)" != 2.36 ]]; then
      rm -f "$L/prebuilt/lib/libstdc++.so.6" "$L/prebuilt/lib/libgcc_s.so.1"
    fi
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$L/prebuilt/lib:$TLD" "$L/prebuilt/bin/llama-server" \
      > "$L/build/bin/llama-server"
    chmod +x "$L/build/bin/llama-server"
    "$L/build/bin/llama-server" --version 2>&1 | tail -2 | tee "$OUT/llama-build.log"
  fi
  if [[ ! -x $L/build/bin/llama-server ]] && ! llama_building; then
    llama_unpack && llama_build "$(nproc)"
    cp "$L/build.log" "$OUT/llama-build.log" 2>/dev/null
    [[ "$(cat "$L/build.rc" 2>/dev/null)" == 0 ]] || status=1
    tail -3 "$OUT/llama-build.log"
  fi
  if [[ ! -x $L/build/bin/llama-server ]]; then
    echo "gpu_check: llama-server did not build (see $OUT/llama-build.log); llama stage skipped"
    status=1
  else
    for p in "${presets[@]}"; do
      # The same random weights (links to the bench stage's files, no second copy on disk) with a real
      # tokenizer of the family, which convert_hf_to_gguf.py needs.
      tok=qwen3 && [[ $p == llama* ]] && tok=llama3
      make_model "$p" "/tmp/tandem-models/$p" || { status=1; continue; }
      dir=/tmp/tandem-models/$p-$tok
      rm -rf "$dir" && mkdir -p "$dir"
      for f in /tmp/tandem-models/$p/*; do ln -s "$f" "$dir/"; done
      rm -f "$dir/tokenizer.json" "$dir/tokenizer_config.json"
      cp "$L/tokenizers/$tok/tokenizer.json" "$L/tokenizers/$tok/tokenizer_config.json" "$dir/"
      gguf=/tmp/tandem-models/$p.f16.gguf
      if [[ ! -f $gguf ]]; then
        PYTHONPATH="$L/llama.cpp/gguf-py" python3 "$L/llama.cpp/convert_hf_to_gguf.py" "$dir" --outtype f16 \
          --outfile "$gguf.part" > "$OUT/llama-convert-$p.log" 2>&1 && mv "$gguf.part" "$gguf" ||
          { status=1; echo "gpu_check: converting $p failed (see $OUT/llama-convert-$p.log)"; continue; }
      fi
      python3 tests/bench/throughput_vs_hf.py "$W/tandem" "$dir" --device cuda --concurrency 1,16,64 --skip-hf \
        --llama-server "$L/build/bin/llama-server" --llama-gguf "$gguf" \
        --json-out "$OUT/vs-llama-$p.json" 2>&1 | tee -a "$OUT/vs-llama.txt" || status=1
    done
  fi
fi
# One page of results (scripts/gpu_summary.py; also written to $OUT/summary.txt).
python3 scripts/gpu_summary.py "$OUT" || true
echo "gpu_check: $([[ $status == 0 ]] && echo PASSED || echo FAILED)"
exit $status
