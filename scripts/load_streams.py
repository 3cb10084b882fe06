#!/usr/bin/env python3
"""Many-streams load test of the router: a cluster (tandem-router, one prefill worker, one decode
worker, on the small models/kjv-target) takes --streams concurrent GenerateStream calls from
tandem-stream-load (a client that holds them on a few threads), all opened at once, with short
outputs on a decode worker whose batch runs --max-num-seqs of them at a time, so that they overlap:
the rest wait, open, in the decode worker's queue. Every 0.2 s it samples each process's threads and
resident memory and the router's requests in flight, and prints the peaks.

The router's flows are asynchronous: it holds every stream with a fixed set of threads (gRPC's and
its own few), so its thread count must not grow with the streams. With --check the exit status is 1
unless every stream completed with every token, the router held at least 90% of them at once, and
its threads stayed under --max-router-threads.

usage: scripts/load_streams.py [--streams 10000] [--max-tokens 16] [--prompt-tokens 16]
                               [--build-dir build] [--model models/kjv-target] [--check]
                               [--json-out FILE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "bench"))
from bench_util import free_port_run, proc_stats  # noqa: E402
from bench_util import metric as metric_at  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=128, help="the decode worker's batch (default 128)")
    ap.add_argument("--channels", type=int, default=8, help="client connections (default 8)")
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "kjv-target"))
    ap.add_argument("--work-dir", default="/tmp/tandem-load-streams")
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--max-router-threads", type=int, default=64)
    ap.add_argument("--check", action="store_true", help="exit 1 unless the run met the bars above")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    b = os.path.abspath(args.build_dir)
    binaries = {"router": os.path.join(b, "router", "tandem-router"),
                "prefill": os.path.join(b, "prefill_worker", "tandem-prefill-worker"),
                "decode": os.path.join(b, "decode_worker", "tandem-decode-worker"),
                "load": os.path.join(b, "tests", "load", "tandem-stream-load")}
    for p in binaries.values():
        if not os.access(p, os.X_OK):
            sys.exit(f"load_streams: {p} is not built (cmake --build {args.build_dir})")
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    n = args.streams
    base = free_port_run(4)
    port = base
    metrics = {"router": base + 1, "prefill": base + 2, "decode": base + 3}
    router = f"127.0.0.1:{port}"
    # KV room for every stream at once: kjv-target's bf16 KV is 3 KiB a token, doubled for block rounding.
    tokens = n * (args.prompt_tokens + args.max_tokens + 32)
    kv_mib = max(256, tokens * 3 * 1024 // (1 << 20) * 2)
    common = [f"--model={args.model}", "--bind-address=127.0.0.1"]
    engine = ["--kv-cache-dtype=bf16", f"--max-queued-requests={n + 16}"]
    cmds = {
        "router": [binaries["router"], *common, f"--port={port}", f"--metrics-port={metrics['router']}",
                   f"--max-concurrent-requests={n}", "--max-queued-requests=1024",
                   f"--request-timeout-s={int(args.timeout_s)}"],
        "prefill": [binaries["prefill"], *common, *engine, "--port=0", f"--router={router}",
                    f"--metrics-port={metrics['prefill']}"],
        "decode": [binaries["decode"], *common, *engine, "--port=0", f"--router={router}",
                   f"--metrics-port={metrics['decode']}", f"--kv-cache-memory={kv_mib}M",
                   f"--max-num-seqs={args.max_num_seqs}"],
    }
    procs = {}
    for name, cmd in cmds.items():
        log = open(os.path.join(args.work_dir, f"{name}.log"), "w")
        procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def metric(name, family):
        return metric_at(metrics[name], family)

    try:
        deadline = time.time() + 60
        while (metric("router", "tandem_workers_live") or 0) < 2:
            for name, p in procs.items():
                if p.poll() is not None:
                    sys.exit(f"load_streams: {name} exited ({p.returncode}); logs in {args.work_dir}")
            if time.time() > deadline:
                sys.exit(f"load_streams: the cluster did not start; logs in {args.work_dir}")
            time.sleep(0.2)
        time.sleep(0.5)
        before = {name: proc_stats(p.pid)[:2] for name, p in procs.items()}
        peaks = {name: {"rss_mb": 0.0, "threads": 0} for name in procs}
        peak_in_flight = [0.0]
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                for name, p in procs.items():
                    rss, thr, _ = proc_stats(p.pid)
                    if rss is not None:
                        peaks[name]["rss_mb"] = max(peaks[name]["rss_mb"], rss)
                        peaks[name]["threads"] = max(peaks[name]["threads"], thr)
                f = metric("router", "tandem_requests_in_flight")
                if f is not None:
                    peak_in_flight[0] = max(peak_in_flight[0], f)
                stop.wait(0.2)

        t = threading.Thread(target=sampler, daemon=True)
        t.start()
        print(f"load_streams: {n} streams of {args.prompt_tokens} prompt + {args.max_tokens} output tokens "
              f"(decode batch {args.max_num_seqs}, KV {kv_mib} MiB)", flush=True)
        run = subprocess.run([binaries["load"], f"--server={router}", f"--streams={n}",
                              f"--prompt_tokens={args.prompt_tokens}", f"--max_tokens={args.max_tokens}",
                              f"--channels={args.channels}", f"--timeout_s={args.timeout_s}"],
                             capture_output=True, text=True, timeout=args.timeout_s + 120)
        stop.set()
        t.join()
        after = {name: proc_stats(p.pid)[:2] for name, p in procs.items()}
        try:
            client = json.loads(run.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            sys.exit(f"load_streams: the client printed no result (exit {run.returncode}): {run.stderr[-2000:]}")
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()

    result = {"streams": n, "client": client, "router_peak_in_flight": peak_in_flight[0], "processes": {}}
    for name in procs:
        result["processes"][name] = {
            "threads_before": before[name][1], "threads_peak": peaks[name]["threads"], "threads_after": after[name][1],
            "rss_mb_before": round(before[name][0], 1), "rss_mb_peak": round(peaks[name]["rss_mb"], 1),
            "rss_mb_after": after[name][0] and round(after[name][0], 1)}
    r = result["processes"]["router"]
    result["router_kib_per_stream"] = round((r["rss_mb_peak"] - r["rss_mb_before"]) * 1024 / max(1, n), 1)
    print(f"client: {client['ok']} ok, {client['failed']} failed, {client['tokens']} tokens, "
          f"{client['peak_open']} open at once, opened in {client['open_s']:.1f} s, done in {client['wall_s']:.1f} s")
    if client["failed"]:
        print(f"  errors: {client['errors_by_code']} {client['error_messages']}")
    print(f"router: {peak_in_flight[0]:.0f} requests in flight at the peak")
    for name, p in result["processes"].items():
        print(f"{name:8s} threads {p['threads_before']} -> peak {p['threads_peak']}, "
              f"RSS {p['rss_mb_before']} -> peak {p['rss_mb_peak']} MB (after: {p['rss_mb_after']} MB)")
    print(f"router memory per stream at the peak: {result['router_kib_per_stream']} KiB")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    if args.check:
        problems = []
        if client["ok"] != n or client["failed"] or client["unfinished"]:
            problems.append(f"{n - client['ok']} of {n} streams did not complete")
        if client["tokens"] != n * args.max_tokens:
            problems.append(f"{client['tokens']} tokens streamed, {n * args.max_tokens} expected")
        if peak_in_flight[0] < 0.9 * n:
            problems.append(f"the router held at most {peak_in_flight[0]:.0f} streams at once (< 90% of {n})")
        if r["threads_peak"] > args.max_router_threads:
            problems.append(f"the router ran {r['threads_peak']} threads (> {args.max_router_threads})")
        if problems:
            print("load_streams: FAILED: " + "; ".join(problems))
            return 1
        print("load_streams: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
