#!/usr/bin/env python3
"""Disaggregated (1 prefill + 1 decode worker) against the combined role (one worker doing both) on a
mixed workload of long and short prompts: TTFT and ITL, P50 and P99, side by side.

Both clusters are `tandem up` on the same device with the same engine flags, loaded by the same
`tandem bench` run: open loop at --request-rate requests/s (Poisson arrivals, seeded), --num-requests
requests drawn once from a seeded mix (a --long-share of prompts of --long-len tokens, the rest of
--short-len; every request --output-len tokens, EOS ignored), as token ids, so no tokenizer is needed
and both clusters see the same requests at the same times. Distinct random prompts: the prefix cache
never shortens a prefill. In the combined role a long prefill shares steps with everyone's decode
(chunked to the scheduler's prefill chunk), so short requests' ITL pays for it; disaggregated, decode
steps never wait for a prefill, and a request pays the KV transfer in its TTFT instead.

Usage: disagg_vs_combined.py TANDEM MODEL_DIR [--request-rate 4] [--num-requests 64] [--long-len 2048]
           [--short-len 128] [--long-share 0.25] [--output-len 64] [--port 50191] [--json-out F]
           [--up-arg=--device=cuda --up-arg=--kv-transport=nccl ...]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from bench_util import start_up, stop_up

ap = argparse.ArgumentParser()
ap.add_argument("tandem")
ap.add_argument("model")
ap.add_argument("--request-rate", type=float, default=4.0)
ap.add_argument("--num-requests", type=int, default=64)
ap.add_argument("--long-len", type=int, default=2048)
ap.add_argument("--short-len", type=int, default=128)
ap.add_argument("--long-share", type=float, default=0.25)
ap.add_argument("--output-len", type=int, default=64)
ap.add_argument("--port", type=int, default=50191)
ap.add_argument("--vocab", type=int, default=0, help="token ids are drawn below this (default: from config.json)")
ap.add_argument("--json-out", default="")
ap.add_argument("--up-arg", action="append", default=[],
                help="extra flag for both clusters' `tandem up` (repeatable), e.g. --up-arg=--device=cuda")
args = ap.parse_args()
if args.request_rate <= 0 or args.num_requests <= 0 or not 0 <= args.long_share <= 1:
    sys.exit("--request-rate and --num-requests must be positive, --long-share in [0, 1]")
if min(args.long_len, args.short_len, args.output_len) <= 0:
    sys.exit("--long-len, --short-len and --output-len must be positive")
vocab = args.vocab or json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]

work = tempfile.mkdtemp(prefix="tandem-disagg-vs-combined-")
rng = random.Random(1)
dataset = os.path.join(work, "mixed.jsonl")
with open(dataset, "w") as f:
    for _ in range(args.num_requests):
        n = args.long_len if rng.random() < args.long_share else args.short_len
        f.write(json.dumps({"token_ids": [rng.randrange(vocab) for _ in range(n)], "max_tokens": args.output_len}) + "\n")


def percentile(values, p):
    """Linear interpolation between closest ranks (numpy's default), as `tandem bench` reports them."""
    if not values:
        return float("nan")
    v = sorted(values)
    x = (len(v) - 1) * p / 100
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def run(name, topology):
    log_dir = os.path.join(work, name)
    ready = os.path.join(work, f"{name}.ready")
    up = start_up([args.tandem, "up", "--model", args.model, "--port", str(args.port), *topology, "--ready-file",
                   ready, "--log-dir", log_dir, "--start-timeout-s=900", *args.up_arg],
                  ready, f"tandem up ({name}, logs in {log_dir})")
    result = os.path.join(work, f"{name}.json")
    try:
        # One request first, outside the measurement: kernels, graphs, the KV link.
        warm = subprocess.run([args.tandem, "generate", "--server", f"127.0.0.1:{args.port}", "--token-ids",
                               ",".join(str(t) for t in range(1, 17)), "--max-tokens", "4", "--temperature", "0"],
                              capture_output=True, text=True)
        if warm.returncode != 0:
            sys.exit(f"warm-up request ({name}) failed (logs in {log_dir}): {warm.stderr[-2000:]}")
        p = subprocess.run([args.tandem, "bench", "--server", f"127.0.0.1:{args.port}", "--workload", "jsonl",
                            "--dataset", dataset, "--num-requests", str(args.num_requests), "--request-rate",
                            str(args.request_rate), "--bench-seed", "1", "--json-out", result],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"tandem bench ({name}) failed (logs in {log_dir}): {p.stderr[-2000:]}")
    finally:
        stop_up(up)
    r = json.load(open(result))
    if r["failed"]:
        sys.exit(f"{name}: {r['failed']} requests failed: {r['errors']}")
    ok = [q for q in r["requests"] if q["ok"]]
    by_class = {c: [q["ttft_s"] * 1e3 for q in ok if (q["input_tokens"] >= args.long_len) == (c == "long")]
                for c in ("short", "long")}
    return {
        "ttft_p50_ms": r["ttft"]["p50_ms"], "ttft_p99_ms": r["ttft"]["p99_ms"],
        "short_ttft_p50_ms": percentile(by_class["short"], 50), "short_ttft_p99_ms": percentile(by_class["short"], 99),
        "long_ttft_p50_ms": percentile(by_class["long"], 50), "long_ttft_p99_ms": percentile(by_class["long"], 99),
        "itl_p50_ms": r["itl"]["p50_ms"], "itl_p99_ms": r["itl"]["p99_ms"],
        "output_tok_s": r["output_token_throughput"], "requests": len(ok),
        "long_requests": len(by_class["long"]),
    }


results = {
    "combined": run("combined", ["--prefill", "0", "--decode", "0", "--combined", "1"]),
    "disaggregated": run("disaggregated", ["--prefill", "1", "--decode", "1"]),
}
c, d = results["combined"], results["disaggregated"]
print(f"model {args.model}; {args.num_requests} requests at {args.request_rate}/s (Poisson), "
      f"{d['long_requests']} of {args.long_len} prompt tokens and the rest of {args.short_len}, "
      f"{args.output_len} output tokens each" + (f"; tandem up {' '.join(args.up_arg)}" if args.up_arg else ""))
rows = [("TTFT P50 ms", "ttft_p50_ms"), ("TTFT P99 ms", "ttft_p99_ms"),
        ("short-prompt TTFT P50 ms", "short_ttft_p50_ms"), ("short-prompt TTFT P99 ms", "short_ttft_p99_ms"),
        ("long-prompt TTFT P50 ms", "long_ttft_p50_ms"), ("long-prompt TTFT P99 ms", "long_ttft_p99_ms"),
        ("ITL P50 ms", "itl_p50_ms"), ("ITL P99 ms", "itl_p99_ms"), ("output tok/s", "output_tok_s")]
print(f"{'':26} {'combined':>10} {'disaggregated':>14} {'disagg/combined':>16}")
for label, key in rows:
    ratio = d[key] / c[key] if c[key] else float("nan")
    print(f"{label:26} {c[key]:10.1f} {d[key]:14.1f} {ratio:15.2f}x")
if args.json_out:
    json.dump({"model": args.model, "up_args": args.up_arg, "request_rate": args.request_rate,
               "num_requests": args.num_requests, "long_len": args.long_len, "short_len": args.short_len,
               "long_share": args.long_share, "output_len": args.output_len, **results},
              open(args.json_out, "w"), indent=1)
shutil.rmtree(work, ignore_errors=True)  # the logs and the dataset stay only when something failed
