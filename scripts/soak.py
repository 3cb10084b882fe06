#!/usr/bin/env python3
"""Soak test: a cluster under steady load for a long time, with cancellations, deadlines, a decode
worker restart and a router restart mixed in. Every minute it prints each process's resident memory,
threads and open file descriptors, the router's requests in flight and the decode workers' KV blocks
in use; at the end, with the load stopped, the KV blocks must be back at their baseline (0) and the
threads and descriptors no higher than after the warm-up (a small allowance). Exit status 0 when
they are, 1 otherwise.

The cluster is started process by process (tandem-router, one prefill worker, two decode workers,
registered with the router), so that one of them can be restarted under load:
  - steady load: `tandem bench --server` at --concurrency, in rounds of at most a minute (a round
    the router restart breaks is started again);
  - cancellations: streamed HTTP requests (/v1/completions) closed after their first events;
  - deadlines: `tandem generate --server --timeout-s 0.05` on 1,000-token outputs, which end with
    DEADLINE_EXCEEDED;
  - at a third of the run, decode worker 0 gets SIGTERM (it drains; the router migrates what is
    left) and is started again; at two thirds, the router gets SIGTERM and is started again on the
    same ports (the workers register again).

usage: scripts/soak.py [--minutes 30] [--concurrency 16] [--build-dir build] [--model DIR]
                       [--json-out FILE]
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
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
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "kjv-target"))
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--work-dir", default="/tmp/tandem-soak")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--sample-s", type=float, default=60, help="seconds between samples (default 60)")
    args = ap.parse_args()
    b = os.path.abspath(args.build_dir)
    tandem = os.path.join(b, "cli", "tandem")
    binaries = {"router": os.path.join(b, "router", "tandem-router"),
                "prefill": os.path.join(b, "prefill_worker", "tandem-prefill-worker"),
                "decode": os.path.join(b, "decode_worker", "tandem-decode-worker")}
    for p in [tandem, *binaries.values()]:
        if not os.access(p, os.X_OK):
            sys.exit(f"soak: {p} is not built (cmake --build {args.build_dir})")
    # Copies: a rebuild during the run must not change (or remove for a moment) what it starts.
    bin_dir = os.path.join(args.work_dir, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    for name, p in [("tandem", tandem), *binaries.items()]:
        shutil.copy2(p, os.path.join(bin_dir, os.path.basename(p)))
    tandem = os.path.join(bin_dir, "tandem")
    binaries = {role: os.path.join(bin_dir, os.path.basename(p)) for role, p in binaries.items()}
    base = free_port_run(6)
    port, http_port = base, base + 1
    metrics = {"router": base + 2, "prefill": base + 3, "decode-0": base + 4, "decode-1": base + 5}
    router = f"127.0.0.1:{port}"
    procs = {}

    def start(name):
        role = name.split("-")[0]
        cmd = [binaries[role], f"--model={args.model}", "--bind-address=127.0.0.1",
               f"--metrics-port={metrics[name]}"]
        if role == "router":
            cmd += [f"--port={port}", f"--http-port={http_port}", "--drain-grace-s=5"]
        else:
            cmd += ["--port=0", f"--router={router}", "--drain-grace-s=5"]
        log = open(os.path.join(args.work_dir, f"{name}.log"), "a")
        procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def stop(name, sig=signal.SIGTERM, timeout=30):
        p = procs[name]
        p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def metric(name, family):
        return metric_at(metrics[name], family)

    def live_workers():
        return metric("router", "tandem_workers_live") or 0

    for name in ["router", "prefill", "decode-0", "decode-1"]:
        start(name)
    deadline = time.time() + 60
    while live_workers() < 3:
        if time.time() > deadline:
            sys.exit(f"soak: the cluster did not start; logs in {args.work_dir}")
        time.sleep(0.2)

    stopping = threading.Event()
    counts = {"bench_rounds": 0, "bench_failed_rounds": 0, "cancelled": 0, "cancel_errors": 0,
              "deadlines": 0, "deadline_other": 0, "load_errors": 0}
    lock = threading.Lock()

    def count(key):
        with lock:
            counts[key] += 1

    def forever(f):  # a load thread runs rounds of `f` and survives anything one throws
        def loop():
            while not stopping.is_set():
                try:
                    f()
                except Exception as e:  # noqa: BLE001
                    count("load_errors")
                    print(f"soak: load thread: {e!r}", flush=True)
                    time.sleep(1)
        return loop

    def bench_round():
        seconds = max(5, min(45, t0 + total - time.time()))  # a round ends with the run
        r = subprocess.run([tandem, "bench", "--server", router, "--concurrency", str(args.concurrency),
                            "--duration-s", str(seconds), "--input-len", str(args.input_len),
                            "--output-len", str(args.output_len), "--range-ratio", "0.5", "--bench-seed",
                            str(random.randrange(1 << 30))], capture_output=True, text=True)
        count("bench_rounds")
        if r.returncode != 0:
            count("bench_failed_rounds")
            time.sleep(1)

    body = json.dumps({"model": "kjv-target", "prompt": "In the beginning", "max_tokens": 200,
                       "stream": True})

    def cancel_round():
        try:
            c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read1(64)
            c.close()  # mid-stream: the router cancels the request
            count("cancelled")
        except OSError:
            count("cancel_errors")
        time.sleep(random.uniform(0.2, 0.6))

    def deadline_round():
        r = subprocess.run([tandem, "generate", "--server", router, "--token-ids", "5,6,7,8",
                            "--max-tokens", "1000", "--ignore-eos", "--timeout-s", "0.05"],
                           capture_output=True, text=True)
        expired = r.returncode != 0 and re.search("deadline exceeded", r.stderr, re.I)
        count("deadlines" if expired else "deadline_other")
        time.sleep(random.uniform(1, 3))

    t0 = time.time()
    total = args.minutes * 60
    threads = [threading.Thread(target=forever(f), daemon=True) for f in (bench_round, cancel_round, deadline_round)]
    for t in threads:
        t.start()

    def sample(minute):
        row = {"minute": round(minute, 1)}
        for name, p in procs.items():
            rss, thr, fds = proc_stats(p.pid)
            row[name] = {"rss_mb": rss and round(rss, 1), "threads": thr, "fds": fds}
        row["in_flight"] = metric("router", "tandem_requests_in_flight")
        row["kv_blocks_used"] = sum(metric(n, "tandem_kv_blocks_used") or 0 for n in ("decode-0", "decode-1"))
        with lock:
            row["counts"] = dict(counts)
        return row

    def show(row):
        cells = [f"{row['minute']:6.1f}"]
        for name in ("router", "prefill", "decode-0", "decode-1"):
            p = row[name]
            cells.append(f"{name} {p['rss_mb']}MB {p['threads']}t {p['fds']}fd")
        cells.append(f"in flight {row['in_flight']}, KV blocks {row['kv_blocks_used']}")
        print(" | ".join(cells), flush=True)

    rows = []
    restarted_worker = restarted_router = False
    next_sample = t0
    while time.time() - t0 < total:
        now = time.time()
        if now >= next_sample:
            rows.append(sample((now - t0) / 60))
            show(rows[-1])
            next_sample += args.sample_s
        if not restarted_worker and now - t0 >= total / 3:
            print("-- SIGTERM to decode-0, then started again", flush=True)
            stop("decode-0")
            start("decode-0")
            restarted_worker = True
        if not restarted_router and now - t0 >= 2 * total / 3:
            print("-- SIGTERM to the router, then started again", flush=True)
            stop("router")
            start("router")
            restarted_router = True
        time.sleep(0.5)
    stopping.set()
    for t in threads:
        t.join(timeout=120)
    # Idle: every request finished or cancelled; the KV blocks come back.
    settle = time.time() + 60
    while time.time() < settle:
        last = sample((time.time() - t0) / 60)
        if last["kv_blocks_used"] == 0 and (last["in_flight"] or 0) == 0:
            break
        time.sleep(1)
    rows.append(last)
    show(last)
    failures = []
    if last["kv_blocks_used"] != 0:
        failures.append(f"KV blocks in use after the load stopped: {last['kv_blocks_used']}")
    warm = rows[min(2, len(rows) - 1)]
    for name in ("prefill", "decode-1"):  # never restarted: comparable from warm-up to the end
        w, e = warm[name], last[name]
        if e["threads"] is None or e["threads"] > w["threads"] + 4:
            failures.append(f"{name}: threads {w['threads']} after warm-up, {e['threads']} at the end")
        if e["fds"] is None or e["fds"] > w["fds"] + 8:
            failures.append(f"{name}: open fds {w['fds']} after warm-up, {e['fds']} at the end")
    with lock:
        final_counts = dict(counts)
    summary = {"minutes": args.minutes, "concurrency": args.concurrency, "samples": rows,
               "counts": final_counts, "failures": failures}
    print(json.dumps(final_counts), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    for name in list(procs):
        stop(name)
    for f in failures:
        print("SOAK FAILED: " + f, flush=True)
    if final_counts["deadline_other"] > 0:
        print(f"note: {final_counts['deadline_other']} deadline probes did not end with DEADLINE_EXCEEDED "
              "(the router restart refuses some)", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
