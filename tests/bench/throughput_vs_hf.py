#!/usr/bin/env python3
"""Output-token throughput of Tandem against Hugging Face transformers' generate() on one model.

Tandem: `tandem up --combined 1` on the chosen device, loaded by `tandem bench` in closed loop at each
concurrency (random prompts of --input-len tokens, exactly --output-len output tokens each, EOS
ignored, 2×concurrency requests, at least 8). Transformers: the same model in BF16 on the same device,
generate() over static batches of `concurrency` prompts (greedy, min_new_tokens = max_new_tokens =
--output-len), one warm-up batch of 2 first; tokens/s = batch × output-len ÷ wall time. The two
share nothing but the model directory. Prints one table (side by side, with the ratio) and, with
--json-out, every figure.

Usage: throughput_vs_hf.py TANDEM MODEL_DIR [--device cuda] [--concurrency 1,16,64,256]
           [--hf-concurrency 1,16,64] [--input-len 512] [--output-len 256] [--skip-hf] [--json-out F]
Transformers absent (as on the CPU development machine): its column says so and the run goes on.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("tandem")
ap.add_argument("model")
ap.add_argument("--device", default="cuda")
ap.add_argument("--concurrency", default="1,16,64,256")
ap.add_argument("--hf-concurrency", default="", help="levels run with transformers (default: --concurrency)")
ap.add_argument("--input-len", type=int, default=512)
ap.add_argument("--output-len", type=int, default=256)
ap.add_argument("--port", type=int, default=50171)
ap.add_argument("--skip-hf", action="store_true")
ap.add_argument("--json-out", default="")
ap.add_argument("--up-args", default="", help="extra flags for `tandem up`, comma-separated")
args = ap.parse_args()
levels = [int(c) for c in args.concurrency.split(",")]
hf_levels = [int(c) for c in (args.hf_concurrency or args.concurrency).split(",")]


def tandem_throughput():
    work = tempfile.mkdtemp(prefix="tandem-vs-hf-")
    ready = os.path.join(work, "ready")
    cmd = [args.tandem, "up", "--model", args.model, "--prefill", "0", "--decode", "0", "--combined", "1", "--port",
           str(args.port), "--ready-file", ready, "--log-dir", work, "--start-timeout-s=900", f"--device={args.device}",
           f"--max-num-seqs={max(levels)}", f"--max-queued-requests={4 * max(levels) + 64}"]
    cmd += [a for a in args.up_args.split(",") if a]
    up = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 960
    while not os.path.exists(ready):
        if up.poll() is not None:
            sys.exit(f"tandem up failed (logs in {work}): {up.stderr.read()}")
        if time.time() > deadline:
            up.kill()
            sys.exit(f"tandem up did not get ready in time (logs in {work})")
        time.sleep(0.2)
    out = {}
    try:
        for c in levels:
            result = os.path.join(work, f"bench-{c}.json")
            p = subprocess.run([args.tandem, "bench", "--server", f"127.0.0.1:{args.port}", "--concurrency", str(c),
                                "--num-requests", str(max(8, 2 * c)), "--workload", "random", "--input-len",
                                str(args.input_len), "--output-len", str(args.output_len), "--json-out", result],
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"tandem bench at concurrency {c} failed (logs in {work}): {p.stderr[-2000:]}")
            r = json.load(open(result))
            if r["failed"]:
                sys.exit(f"tandem bench at concurrency {c}: {r['failed']} requests failed: {r['errors']}")
            out[c] = r["output_token_throughput"]
            print(f"tandem      concurrency {c:4d}: {out[c]:10.1f} output tok/s", file=sys.stderr)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
    return out


def hf_throughput():
    if args.skip_hf:
        return {}, "skipped (--skip-hf)"
    try:
        import torch
        import transformers
    except ImportError as e:
        return {}, f"transformers not importable here ({e})"
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to(device)
    model.eval()
    vocab = model.config.vocab_size
    rng = random.Random(1)
    out = {}

    def run(batch):
        ids = torch.tensor([[rng.randrange(vocab) for _ in range(args.input_len)] for _ in range(batch)], device=device)
        with torch.no_grad():
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.time()
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.output_len,
                                 min_new_tokens=args.output_len, do_sample=False, pad_token_id=0)
            if device == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t0
        assert gen.shape[1] - args.input_len == args.output_len, gen.shape
        return batch * args.output_len / dt

    run(2)  # warm-up: kernels, allocator
    for c in hf_levels:
        out[c] = run(c)
        print(f"transformers concurrency {c:4d}: {out[c]:10.1f} output tok/s", file=sys.stderr)
    return out, f"transformers {transformers.__version__}, torch {torch.__version__}"


tandem = tandem_throughput()
hf, hf_note = hf_throughput()
print(f"model {args.model} on {args.device}; input {args.input_len}, output {args.output_len} tokens; {hf_note}")
print(f"{'concurrency':>11} {'Tandem tok/s':>13} {'HF tok/s':>10} {'Tandem/HF':>10}")
for c in levels:
    h = hf.get(c)
    print(f"{c:11d} {tandem[c]:13.1f} {h if h is None else round(h, 1)!s:>10} "
          f"{'' if not h else f'{tandem[c] / h:.2f}x':>10}")
if args.json_out:
    json.dump({"model": args.model, "device": args.device, "input_len": args.input_len, "output_len": args.output_len,
               "tandem": tandem, "hf": hf, "hf_note": hf_note}, open(args.json_out, "w"), indent=1)
