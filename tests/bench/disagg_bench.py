#!/usr/bin/env python3
"""Where TTFT goes in a disaggregated cluster, with layer-wise KV transfer on and off.

Starts `tandem up` (1 prefill + 1 decode worker) twice — prefill workers with
--layerwise-transfer=true, then false — sends the same prompts one at a time through
`tandem generate --server --json`, and prints the router's TTFT breakdown: prefill queue, prefill
compute, KV transfer (first token sampled → the decode worker acknowledged every layer) and the
transfer's share of TTFT. Distinct random prompts, so the prefix cache never shortens a prefill.

Usage: disagg_bench.py TANDEM MODEL_DIR [--prompt-len 512] [--requests 6] [--port 50151]
                       [--up-arg=--device=cuda --up-arg=--kv-transport=nccl ...]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_util import start_up, stop_up

ap = argparse.ArgumentParser()
ap.add_argument("tandem")
ap.add_argument("model")
ap.add_argument("--prompt-len", type=int, default=512)
ap.add_argument("--requests", type=int, default=6)
ap.add_argument("--port", type=int, default=50151)
ap.add_argument("--vocab", type=int, default=0, help="token ids are drawn below this (default: from config.json)")
ap.add_argument("--up-arg", action="append", default=[],
                help="extra flag for `tandem up` (repeatable), e.g. --up-arg=--device=cuda --up-arg=--kv-transport=nccl")
args = ap.parse_args()
vocab = args.vocab or json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
rng = random.Random(1)
prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.requests + 1)]


def run(layerwise):
    work = tempfile.mkdtemp(prefix="tandem-disagg-bench-")
    ready = os.path.join(work, "ready")
    up = start_up([args.tandem, "up", "--model", args.model, "--port", str(args.port), "--prefill", "1", "--decode",
                   "1", "--ready-file", ready, "--log-dir", work,
                   f"--prefill-worker-args=--layerwise-transfer={'true' if layerwise else 'false'}", *args.up_arg],
                  ready, f"tandem up (logs in {work})", timeout_s=300)
    rows = []
    try:
        for i, p in enumerate(prompts):
            out = subprocess.run([args.tandem, "generate", "--server", f"127.0.0.1:{args.port}", "--json",
                                  "--token-ids", ",".join(map(str, p)), "--max-tokens", "2", "--temperature", "0"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"request {i} failed: {out.stderr}\nlogs in {work}")
            if i == 0:
                continue  # warm-up
            rows.append(json.loads(out.stdout)["timings"])
    finally:
        stop_up(up, timeout_s=60)
    shutil.rmtree(work, ignore_errors=True)  # the logs stay only when something failed
    return rows


def summary(rows):
    m = lambda k: statistics.mean(r[k] for r in rows) * 1e3
    ttft, transfer = m("time_to_first_token"), m("kv_transfer")
    return ttft, m("prefill_queue"), m("prefill_compute"), transfer, transfer / ttft


print(f"model {args.model}, prompt {args.prompt_len} tokens, {args.requests} requests one at a time"
      + (f", tandem up {' '.join(args.up_arg)}" if args.up_arg else ""))
print(f"{'layer-wise':>10} {'TTFT ms':>9} {'queue ms':>9} {'compute ms':>11} {'transfer ms':>12} {'transfer/TTFT':>14}")
results = {}
for layerwise in (True, False):
    results[layerwise] = summary(run(layerwise))
    t = results[layerwise]
    print(f"{'on' if layerwise else 'off':>10} {t[0]:9.1f} {t[1]:9.2f} {t[2]:11.1f} {t[3]:12.2f} {t[4]:14.1%}")
print(f"transfer time after the first token, off/on: {results[False][3] / max(results[True][3], 1e-9):.2f}x; "
      f"TTFT off/on: {results[False][0] / results[True][0]:.3f}x")
