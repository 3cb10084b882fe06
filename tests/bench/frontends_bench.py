#!/usr/bin/env python3
"""The two front doors side by side: the same workload through the gRPC API and the OpenAI HTTP API
of one `tandem up --http-port` cluster, at each concurrency level, TTFT and inter-token latency
percentiles from `tandem bench --frontend grpc|http` (both asking logprobs 0, which the HTTP side
uses to count tokens per event, so the two do the same work), one door after the other and then,
above concurrency 1, both at once with half the streams each (the same contention for both: the
fair comparison on a machine the client shares); then N concurrent HTTP streams held
open at once, with the router's thread count sampled from /proc while they run (the router's
flows are asynchronous, holding no thread; the HTTP side holds every connection on --http-threads
I/O threads).

usage: frontends_bench.py TANDEM MODEL_DIR [--concurrency 1,16,64] [--num-requests N]
         [--input-len N] [--output-len N] [--streams 1000] [--stream-output-len N] [--port P]
         [--json-out F]
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def router_pid(log_dir):
    """The router's pid, from `pgrep` on its command line (tandem up names --port)."""
    out = subprocess.run(["pgrep", "-f", "tandem-router"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def threads_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def start_bench(tandem, grpc_address, http_address, frontend, concurrency, args, out_json, seed=1):
    cmd = [tandem, "bench", "--server", grpc_address, "--frontend", frontend, "--http-server", http_address,
           "--concurrency", str(concurrency), "--num-requests", str(args.num_requests), "--input-len",
           str(args.input_len), "--output-len", str(args.output_len), "--bench-logprobs", "0",
           "--bench-seed", str(seed), "--json-out", out_json]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), frontend, concurrency, out_json


def finish_bench(started):
    p, frontend, concurrency, out_json = started
    _, err = p.communicate(timeout=3600)
    if p.returncode != 0:
        sys.exit(f"tandem bench --frontend {frontend} -c {concurrency} failed:\n{err[-2000:]}")
    with open(out_json) as f:
        return json.load(f)


def bench(*a, **k):
    return finish_bench(start_bench(*a, **k))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tandem")
    ap.add_argument("model")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--stream-output-len", type=int, default=64)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--up-arg", action="append", default=[], help="extra flag for tandem up (repeatable)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c]
    work = tempfile.mkdtemp(prefix="tandem-frontends.")
    grpc_port = args.port or free_port()
    http_port = free_port()
    ready = os.path.join(work, "ready")
    up = subprocess.Popen([args.tandem, "up", "--model", args.model, "--port", str(grpc_port), "--http-port",
                           str(http_port), "--prefill", "1", "--decode", "1", "--ready-file", ready, "--log-dir",
                           os.path.join(work, "logs"),
                           # Every request computes its whole prompt: no cache hit flatters either side.
                           "--enable-prefix-caching=false", *args.up_arg],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not os.path.exists(ready) and time.time() < deadline and up.poll() is None:
            time.sleep(0.1)
        if not os.path.exists(ready):
            sys.exit(f"tandem up did not get ready: {up.stderr.read()[-2000:] if up.poll() is not None else ''}")
        grpc_address, http_address = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"
        pid = router_pid(os.path.join(work, "logs"))
        results = {"levels": [], "model": args.model}
        # Warm-up: caches, first connections.
        bench(args.tandem, grpc_address, http_address, "grpc", 1, argparse.Namespace(
            num_requests=2, input_len=args.input_len, output_len=4), os.path.join(work, "warm.json"))
        print(f"{'concurrency':>11}  {'front door':>10}  {'req/s':>7}  {'TTFT P50':>9}  {'TTFT P99':>9}  "
              f"{'ITL P50':>8}  {'ITL P99':>8}   (ms)")
        for c in levels:
            row = {"concurrency": c}
            for frontend in ("grpc", "http"):
                # Prompts of their own for each run (same lengths): no run reuses another's KV.
                r = bench(args.tandem, grpc_address, http_address, frontend, c, args,
                          os.path.join(work, f"{frontend}-{c}.json"), seed=c * 2 + (frontend == "http") + 10)
                if r["failed"]:
                    sys.exit(f"{frontend} at concurrency {c}: {r['failed']} requests failed")
                row[frontend] = {k: r[k] for k in ("request_throughput", "ttft", "itl", "completed")}
                print(f"{c:>11}  {frontend:>10}  {r['request_throughput']:>7.2f}  {r['ttft']['p50_ms']:>9.2f}  "
                      f"{r['ttft']['p99_ms']:>9.2f}  {r['itl']['p50_ms']:>8.2f}  {r['itl']['p99_ms']:>8.2f}")
            d_ttft = row["http"]["ttft"]["p50_ms"] - row["grpc"]["ttft"]["p50_ms"]
            d_itl = row["http"]["itl"]["p50_ms"] - row["grpc"]["itl"]["p50_ms"]
            row["http_minus_grpc_p50_ms"] = {"ttft": d_ttft, "itl": d_itl}
            print(f"{c:>11}  {'http-grpc':>10}  {'':>7}  {d_ttft:>+9.2f}  {'':>9}  {d_itl:>+8.2f}")
            if c >= 2:
                # Both doors at once, c/2 streams each: they share the machine's contention alike, so
                # the difference is the doors' own (the sequential rows above compare two runs).
                half = argparse.Namespace(num_requests=args.num_requests // 2, input_len=args.input_len,
                                          output_len=args.output_len)
                started = [start_bench(args.tandem, grpc_address, http_address, frontend, c // 2, half,
                                       os.path.join(work, f"mixed-{frontend}-{c}.json"),
                                       seed=c * 4 + (frontend == "http") + 1000)
                           for frontend in ("grpc", "http")]
                mixed = {frontend: finish_bench(st) for frontend, st in zip(("grpc", "http"), started)}
                for frontend, r in mixed.items():
                    if r["failed"]:
                        sys.exit(f"mixed {frontend} at concurrency {c}: {r['failed']} requests failed")
                    print(f"{c:>11}  {'mixed ' + frontend:>10}  {r['request_throughput']:>7.2f}  "
                          f"{r['ttft']['p50_ms']:>9.2f}  {r['ttft']['p99_ms']:>9.2f}  {r['itl']['p50_ms']:>8.2f}  "
                          f"{r['itl']['p99_ms']:>8.2f}")
                m_ttft = mixed["http"]["ttft"]["p50_ms"] - mixed["grpc"]["ttft"]["p50_ms"]
                m_itl = mixed["http"]["itl"]["p50_ms"] - mixed["grpc"]["itl"]["p50_ms"]
                print(f"{c:>11}  {'mixed h-g':>10}  {'':>7}  {m_ttft:>+9.2f}  {'':>9}  {m_itl:>+8.2f}")
                row["mixed"] = {f: {k: r[k] for k in ("request_throughput", "ttft", "itl", "completed")}
                                for f, r in mixed.items()}
                row["mixed_http_minus_grpc_p50_ms"] = {"ttft": m_ttft, "itl": m_itl}
            results["levels"].append(row)

        # N streams held open at once through HTTP; the router's threads sampled while they run.
        idle_threads = threads_of(pid)
        peak = {"threads": idle_threads or 0}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                t = threads_of(pid)
                if t is not None:
                    peak["threads"] = max(peak["threads"], t)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        r = bench(args.tandem, grpc_address, http_address, "http", args.streams, argparse.Namespace(
            num_requests=args.streams, input_len=16, output_len=args.stream_output_len),
            os.path.join(work, "streams.json"))
        stop.set()
        sampler.join()
        results["streams"] = {"concurrent_http_streams": args.streams, "completed": r["completed"],
                              "failed": r["failed"], "router_threads_idle": idle_threads,
                              "router_threads_peak": peak["threads"]}
        print(f"{args.streams} concurrent HTTP streams: {r['completed']} completed, {r['failed']} failed; "
              f"router threads {idle_threads} idle, {peak['threads']} at peak")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(results, f, indent=2)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    main()
