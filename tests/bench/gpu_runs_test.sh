#!/usr/bin/env bash
# gpu_check.sh's forward_bench runs (scripts/gpu_forward_runs.sh) on the CUDA emulator, with small
# sizes: every run must finish and close with a record whose settings are the ones its flags ask for
# (the side-by-side tunings are worth nothing if a flag does not reach the backend), the profile runs
# must print both tables, and scripts/gpu_summary.py must give one line a run. A GPU session then
# spends its minutes on figures, not on a flag that does not parse.
#   gpu_runs_test.sh FORWARD_BENCH_EMU EMU_PLUGIN TANDEM SOURCE_DIR
set -euo pipefail
bench=$1 plugin=$2 tandem=$3 src=$4
work=$(mktemp -d /tmp/tandem-gpu-runs.XXXX)
trap 'rm -rf "$work"' EXIT
"$tandem" make-model --preset tiny-llama --out "$work/model" --dtype bf16 > /dev/null
# shellcheck source=../../scripts/gpu_forward_runs.sh
source "$src/scripts/gpu_forward_runs.sh"
unset DECODE_BATCHES  # the default batches, whatever the caller's environment says
mapfile -t runs < <(forward_runs)
mapfile -t prof < <(profile_runs)
# Later flags win: the device's sizes become the emulator's.
small="--prompt-len 32 --decode-tokens 2 --repeats 1 --roofline-copy-mib 1 --roofline-gemm 64"
run() {
  local sizes=$small
  # Prompt attention's tiled and tensor-core kernels take steps of at least 64 new tokens.
  [[ $1 == *--tc-attention* ]] && sizes="$small --prompt-len 72"
  # shellcheck disable=SC2086 # argument lists
  if ! TANDEM_CUDA_PLUGIN=$plugin "$bench" --model "$work/model" --device cuda $1 $sizes >> "$2" 2>&1; then
    echo "FAILED: forward_bench $1 (log below)"
    tail -20 "$2"
    exit 1
  fi
}
for args in "${runs[@]}"; do run "$args" "$work/forward_bench.txt"; done
for args in "${prof[@]}"; do run "$args" "$work/profile.txt"; done
printf '%s\n' "${runs[@]}" > "$work/runs.txt"
printf '%s\n' "${prof[@]}" > "$work/prof.txt"
python3 "$src/scripts/gpu_summary.py" "$work" > /dev/null
python3 - "$work" <<'PY'
import json, shlex, sys
work = sys.argv[1]

def records(name):
    return [json.loads(l[len("json: "):]) for l in open(f"{work}/{name}") if l.startswith("json: ")]

def expected(args):
    """The record's settings the argument list asks for (the defaults otherwise)."""
    want = {"device": "cuda", "kv": "BF16", "kv_cache_dtype": "auto", "compute_dtype": "auto", "split_gemm_inputs": False, "graphs": True, "sampling": "argmax", "fusion": True, "gemv_norm": True,
            "gemv_heads": True, "gemv_columns": 0, "grid_split_keys": 0, "pdl": False, "tc_attention": False}
    a = shlex.split(args)
    for i, f in enumerate(a):
        name, _, val = f.partition("=")
        nxt = a[i + 1] if i + 1 < len(a) else ""
        if name == "--decode-batch":
            want["batch"] = int(nxt)
        elif name == "--kv-cache-dtype":
            want["kv"] = nxt.upper()
            want["kv_cache_dtype"] = nxt
        elif name == "--compute-dtype":
            want["compute_dtype"] = nxt
            if want["kv_cache_dtype"] == "auto":
                want["kv"] = nxt.upper()  # an auto cache takes the weights' stored type
        elif name == "--sampling":
            want["sampling"] = nxt
        elif name == "--gemv-columns":
            want["gemv_columns"] = int(nxt)
        elif name == "--grid-split-keys":
            want["grid_split_keys"] = int(nxt)
        elif name in ("--pdl", "--split-gemm-inputs"):
            want[name[2:].replace("-", "_")] = val != "false"
        elif name in ("--fusion", "--gemv-norm", "--gemv-heads", "--tc-attention", "--cuda-graphs"):
            key = {"--cuda-graphs": "graphs"}.get(name, name[2:].replace("-", "_"))
            want[key] = val != "false"
    return want

bad = 0
for runs, name in (("runs.txt", "forward_bench.txt"), ("prof.txt", "profile.txt")):
    args = [l.strip() for l in open(f"{work}/{runs}") if l.strip()]
    recs = records(name)
    if len(recs) != len(args):
        print(f"{name}: {len(recs)} records for {len(args)} runs")
        bad += 1
        continue
    for a, r in zip(args, recs):
        want = expected(a)
        diff = {k: (r.get(k), v) for k, v in want.items() if r.get(k) != v}
        for k in ("decode_ms", "prefill_tok_s", "copy_gb_s", "gemm_tflops", "decode_roofline_pct"):
            if not isinstance(r.get(k), (int, float)) or r[k] <= 0:
                diff[k] = (r.get(k), "> 0")
        # What the backend says it runs (its description names every tuning off its default).
        desc = r.get("backend", "")
        tunings = {"fusion off": not want["fusion"],
                   "GEMV norm off": want["fusion"] and not want["gemv_norm"],
                   "GEMV heads off": want["fusion"] and not want["gemv_heads"],
                   f"GEMV columns {want['gemv_columns']}": want["gemv_columns"] not in (0, 1),
                   f"grid splits of {want['grid_split_keys']} keys": want["grid_split_keys"] not in (0, 256),
                   "programmatic dependent launch": want["pdl"],
                   "tensor-core prompt attention": want["tc_attention"],
                   f"16-bit weights and GEMMs in {want['compute_dtype'].upper()}": want["compute_dtype"] != "auto",
                   "GEMM inputs split into two 16-bit terms": want["split_gemm_inputs"]}
        for words, on in tunings.items():
            if (words in desc) != on:
                diff[f"backend says '{words}'"] = (words in desc, on)
        if "GEMV columns" in desc and want["gemv_columns"] in (0, 1):
            diff["backend's GEMV columns"] = (desc, "default")
        if r.get("graph_error"):
            diff["graph_error"] = (r["graph_error"], "")
        if diff:
            print(f"run '{a}': record differs from its flags (got, want): {diff}")
            bad += 1
text = open(f"{work}/profile.txt").read()
for a in open(f"{work}/prof.txt"):
    b = expected(a)["batch"]
    if f"decode steps of batch {b} (op by op)" not in text:
        print(f"profile of batch {b}: no decode table")
        bad += 1
profiles = sum(1 for l in open(f"{work}/prof.txt") if l.strip())
if text.count("ops of one 32-token prefill") != profiles:
    print(f"profiles: {text.count('ops of one 32-token prefill')} prefill tables for {profiles} runs")
    bad += 1
summary = open(f"{work}/summary.txt").read().splitlines()
runs_in_summary = sum(1 for l in summary if l.startswith("  b="))
forward = [l.strip() for l in open(f"{work}/runs.txt") if l.strip()]
total = len(forward)
if runs_in_summary != total:
    print(f"gpu_summary.py: {runs_in_summary} run lines for {total} forward runs")
    bad += 1
# Every run with a tuning (the sizes here make every run's baseline the plain run of its batch).
plain = expected("")
tuned = sum(1 for a in forward
            if any(v != plain[k] and not (k == "gemv_columns" and v in (0, 1)) and
                   not (k == "grid_split_keys" and v in (0, 256)) for k, v in expected(a).items()
                   if k in plain))
side = summary[summary.index(next(l for l in summary if l.startswith("== tunings side by side"))) + 1:] \
    if any(l.startswith("== tunings side by side") for l in summary) else []
side = [l for l in side[:next((i for i, l in enumerate(side) if l.startswith("== ")), len(side))] if l.strip()]
if len(side) != tuned or not all(" decode x" in l and " prefill x" in l for l in side):
    print(f"gpu_summary.py: {len(side)} side-by-side lines for {tuned} tuned runs")
    bad += 1
print(f"{total} forward runs ({tuned} tuned, each side by side with its baseline) and "
      f"{len(records('profile.txt'))} profile runs on the emulator: "
      f"{'every record matches its flags' if not bad else f'{bad} problems'}")
sys.exit(1 if bad else 0)
PY
