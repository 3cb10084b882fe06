#!/usr/bin/env python3
"""Output-token throughput of Tandem against Hugging Face transformers' generate() and llama.cpp's
llama-server on one model.

Tandem: `tandem up --combined 1` on the chosen device, loaded by `tandem bench` in closed loop at each
concurrency (random prompts of --input-len tokens, exactly --output-len output tokens each, EOS
ignored, 2×concurrency requests, at least 8); beside each level, the worker's engine host share (its
engine thread's time outside the forward pass over its busy time, from its Prometheus counters: the
share of the level's steps its device waited for the host) and the share of its forward-pass time
in steps that computed prompt tokens (the rest in decode-only steps). Transformers: the same model in BF16 on
the same device, generate() over static batches of `concurrency` prompts (greedy, min_new_tokens = max_new_tokens =
--output-len), one warm-up batch of 2 first; tokens/s = batch × output-len ÷ wall time. The two
share nothing but the model directory. llama.cpp (with --llama-server and --llama-gguf, the same
model as GGUF, e.g. F16 from llama.cpp's convert_hf_to_gguf.py): one llama-server with a slot per
request of the highest level (--parallel, continuous batching, every layer on the GPU), loaded in
closed loop like Tandem: the same random prompts as token ids, n_predict = --output-len with EOS
ignored, greedy; tokens/s = tokens predicted ÷ wall time. Prints one table (side by side, with the
ratios) and, with --json-out, every figure. --temperature and --top-p sample instead of greedy decoding,
the same way in all three (transformers with top_k 0, llama.cpp with top_k 0 and min_p 0: nothing but
temperature and top-p).

Usage: throughput_vs_hf.py TANDEM MODEL_DIR [--device cuda] [--concurrency 1,16,64,256]
           [--hf-concurrency 1,16,64] [--input-len 512] [--output-len 256] [--skip-hf] [--json-out F]
           [--llama-server BIN --llama-gguf FILE [--llama-args=-fa,on]] [--temperature T --top-p P]
Transformers absent (as on the CPU development machine): its column says so and the run goes on.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from bench_util import PROMPT_FORWARD, free_port_run, host_share, prompt_share, scrape_counters, start_up, stop_up

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
ap.add_argument("--llama-server", default="", help="llama.cpp's llama-server binary (adds a llama.cpp column)")
ap.add_argument("--llama-gguf", default="", help="the model as GGUF for llama-server")
ap.add_argument("--llama-args", default="", help="extra llama-server flags, comma-separated")
ap.add_argument("--llama-port", type=int, default=50181)
ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature for every engine (0 = greedy)")
ap.add_argument("--top-p", type=float, default=1.0, help="top_p for every engine (1 = off)")
args = ap.parse_args()
if args.temperature < 0 or not 0 < args.top_p <= 1:
    sys.exit("--temperature must be >= 0 and --top-p in (0, 1]")
sampled = args.temperature > 0
levels = [int(c) for c in args.concurrency.split(",")]
hf_levels = [int(c) for c in (args.hf_concurrency or args.concurrency).split(",")]


host_shares = {}  # concurrency → the worker's engine host share over that level
prompt_shares = {}  # concurrency → the share of its forward time in steps with prompt tokens


def tandem_throughput():
    work = tempfile.mkdtemp(prefix="tandem-vs-hf-")
    ready = os.path.join(work, "ready")
    metrics_port = free_port_run(2)  # the router's, then the combined worker's
    cmd = [args.tandem, "up", "--model", args.model, "--prefill", "0", "--decode", "0", "--combined", "1", "--port",
           str(args.port), "--ready-file", ready, "--log-dir", work, "--start-timeout-s=900", f"--device={args.device}",
           f"--max-num-seqs={max(levels)}", f"--max-queued-requests={4 * max(levels) + 64}",
           f"--metrics-port={metrics_port}"]
    cmd += [a for a in args.up_args.split(",") if a]
    up = start_up(cmd, ready, f"tandem up (logs in {work})")
    counters = ("tandem_engine_host_seconds_total", "tandem_engine_forward_seconds_total", PROMPT_FORWARD)
    worker_metrics = f"127.0.0.1:{metrics_port + 1}"
    out = {}
    try:
        for c in levels:
            before = scrape_counters(worker_metrics, counters)
            result = os.path.join(work, f"bench-{c}.json")
            p = subprocess.run([args.tandem, "bench", "--server", f"127.0.0.1:{args.port}", "--concurrency", str(c),
                                "--num-requests", str(max(8, 2 * c)), "--workload", "random", "--input-len",
                                str(args.input_len), "--output-len", str(args.output_len), "--json-out", result,
                                f"--bench-temperature={args.temperature}", f"--bench-top-p={args.top_p}"],
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"tandem bench at concurrency {c} failed (logs in {work}): {p.stderr[-2000:]}")
            r = json.load(open(result))
            if r["failed"]:
                sys.exit(f"tandem bench at concurrency {c}: {r['failed']} requests failed: {r['errors']}")
            out[c] = r["output_token_throughput"]
            time.sleep(1.0)  # the worker's counters follow its engine every 0.5 s
            after = scrape_counters(worker_metrics, counters)
            host_shares[c], prompt_shares[c] = host_share(before, after), prompt_share(before, after)
            share = "?" if host_shares[c] is None else f"{100 * host_shares[c]:.1f}%"
            prompt = "?" if prompt_shares[c] is None else f"{100 * prompt_shares[c]:.1f}%"
            print(f"tandem      concurrency {c:4d}: {out[c]:10.1f} output tok/s, engine host share {share}, "
                  f"forward time in steps with prompt tokens {prompt}", file=sys.stderr)
    finally:
        stop_up(up)
    shutil.rmtree(work, ignore_errors=True)  # the logs stay only when something failed
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
    # transformers 5 names the argument `dtype` (an unknown `torch_dtype` would leave the checkpoint's own).
    kw = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.bfloat16}
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, **kw).to(device)
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
            sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0) if sampled \
                else dict(do_sample=False)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.output_len,
                                 min_new_tokens=args.output_len, pad_token_id=0, **sampling)
            if device == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t0
        assert gen.shape[1] - args.input_len == args.output_len, gen.shape
        return batch * args.output_len / dt

    run(2)  # warm-up: kernels, allocator
    for c in hf_levels:
        out[c] = run(c)
        print(f"transformers concurrency {c:4d}: {out[c]:10.1f} output tok/s", file=sys.stderr)
    attn = getattr(model.config, "_attn_implementation", "?")
    return out, f"transformers {transformers.__version__} ({model.dtype}, attention {attn}), torch {torch.__version__}"


def llama_throughput():
    if not args.llama_server:
        return {}, "llama.cpp not run (no --llama-server)"
    import threading
    import urllib.request
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    slots = max(levels)
    work = tempfile.mkdtemp(prefix="tandem-vs-llama-")
    log = open(os.path.join(work, "llama-server.log"), "w")
    cmd = [args.llama_server, "-m", args.llama_gguf, "--port", str(args.llama_port), "--host", "127.0.0.1",
           "-np", str(slots), "-c", str(slots * (args.input_len + args.output_len + 16)), "-ngl", "999",
           "--cont-batching", "--no-warmup"] + [a for a in args.llama_args.split(",") if a]
    try:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    except OSError as e:
        return {}, f"llama.cpp failed to start: {e}"
    base = f"http://127.0.0.1:{args.llama_port}"

    def post(body, timeout=600):
        req = urllib.request.Request(base + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)

    try:
        deadline = time.time() + 900
        while True:
            if server.poll() is not None:
                return {}, f"llama.cpp failed: llama-server exited (log in {work})"
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if time.time() > deadline:
                return {}, f"llama.cpp failed: llama-server did not get ready (log in {work})"
            time.sleep(0.5)
        rng = random.Random(2)

        def body():
            return {"prompt": [rng.randrange(vocab) for _ in range(args.input_len)], "n_predict": args.output_len,
                    "ignore_eos": True, "temperature": args.temperature, "top_p": args.top_p, "top_k": 0, "min_p": 0,
                    "cache_prompt": False, "stream": False}

        post(body())  # warm-up
        out = {}
        for c in levels:
            requests = [body() for _ in range(max(8, 2 * c))]
            predicted, errors, lock = [0], [], threading.Lock()

            def worker():
                while True:
                    with lock:
                        if not requests:
                            return
                        b = requests.pop()
                    try:
                        n = post(b)["tokens_predicted"]
                        with lock:
                            predicted[0] += n
                    except Exception as e:  # noqa: BLE001 (reported below)
                        with lock:
                            errors.append(str(e))

            t0 = time.time()
            threads = [threading.Thread(target=worker) for _ in range(c)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                return out, f"llama.cpp failed at concurrency {c}: {len(errors)} requests failed: {errors[0]}"
            out[c] = predicted[0] / (time.time() - t0)
            print(f"llama.cpp   concurrency {c:4d}: {out[c]:10.1f} output tok/s", file=sys.stderr)
        return out, f"llama.cpp {os.path.basename(args.llama_gguf)}, {' '.join(cmd[3:])}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


tandem = tandem_throughput()
hf, hf_note = hf_throughput()
llama, llama_note = llama_throughput()
decoding = f"temperature {args.temperature}, top_p {args.top_p}" if sampled else "greedy"
print(f"model {args.model} on {args.device}; input {args.input_len}, output {args.output_len} tokens; {decoding}; "
      f"{hf_note}; {llama_note}" + (f"; tandem up {args.up_args}" if args.up_args else ""))
print(f"{'concurrency':>11} {'Tandem tok/s':>13} {'HF tok/s':>10} {'Tandem/HF':>10} {'llama.cpp':>10} {'Tandem/llama':>13}"
      f" {'host share':>11} {'prompt steps':>13}")
for c in levels:
    h, l, s, p = hf.get(c), llama.get(c), host_shares.get(c), prompt_shares.get(c)
    print(f"{c:11d} {tandem[c]:13.1f} {h if h is None else round(h, 1)!s:>10} "
          f"{'' if not h else f'{tandem[c] / h:.2f}x':>10} {l if l is None else round(l, 1)!s:>10} "
          f"{'' if not l else f'{tandem[c] / l:.2f}x':>13} {'?' if s is None else f'{100 * s:.1f}%':>11}"
          f" {'?' if p is None else f'{100 * p:.1f}%':>13}")
if args.json_out:
    json.dump({"model": args.model, "device": args.device, "input_len": args.input_len, "output_len": args.output_len,
               "temperature": args.temperature, "top_p": args.top_p,
               "tandem": tandem, "tandem_host_share": host_shares, "tandem_prompt_forward_share": prompt_shares,
               "hf": hf, "hf_note": hf_note, "llama_cpp": llama, "llama_note": llama_note},
              open(args.json_out, "w"), indent=1)
