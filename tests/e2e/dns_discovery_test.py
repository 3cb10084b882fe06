#!/usr/bin/env python3
"""Worker discovery by DNS with several routers, as on Kubernetes (headless Services), on localhost.

A stand-in DNS server answers the workers' Service names with loopback addresses (127.0.0.N), each
worker listening on the same port at its own address as pods do. Two routers started with
`--workers-dns prefill.tandem.test:P,decode.tandem.test:P --dns-server ...` must:
  - find the prefill and the decode worker, and serve the same greedy text through either router;
  - find a second decode worker once DNS names it, and drop one DNS no longer names (it is
    SIGTERMed: it drains), still serving;
  - go on serving through one router when the other is killed.

usage: dns_discovery_test.py BUILD_DIR MODEL_DIR WORK_DIR
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from standin_dns import StandInDns, stop_and_report  # noqa: E402

BUILD, MODEL, WORK = sys.argv[1:4]
TANDEM = os.path.join(BUILD, "cli", "tandem")
ROUTER = os.path.join(BUILD, "router", "tandem-router")
PREFILL = os.path.join(BUILD, "prefill_worker", "tandem-prefill-worker")
DECODE = os.path.join(BUILD, "decode_worker", "tandem-decode-worker")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


procs = []


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=open(os.path.join(WORK, log), "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def worker(binary, ip, port, log, extra=()):
    return start([binary, "--model", MODEL, "--port", str(port), "--bind-address", ip, "--advertise-host", ip,
                  "--kv-cache-memory", "64M", "--metrics-port", "-1", "--drain-grace-s", "5", *extra], log)


def live(metrics_port, role):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1
    m = re.search(r'^tandem_workers_live\{[^}]*worker_role="%s"[^}]*\} (\S+)' % role, text, re.M)
    return int(float(m.group(1))) if m else -1


def wait_for(what, cond, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    check(False, f"timed out waiting for {what}")
    return False


def generate(router_port):
    p = subprocess.run([TANDEM, "generate", "--server", f"127.0.0.1:{router_port}", "--prompt", "And God said",
                        "--max-tokens", "12", "--temperature", "0", "--json"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return None, p.stderr.strip()[-300:]
    return json.loads(p.stdout.strip().splitlines()[-1])["text"], ""


def main():
    os.makedirs(WORK, exist_ok=True)
    dns = StandInDns()
    port = free_port()  # every worker's gRPC port, at its own address
    kv_port = free_port()
    dns.set("prefill.tandem.test", ["127.0.0.2"])
    dns.set("decode.tandem.test", ["127.0.0.3"])
    worker(PREFILL, "127.0.0.2", port, "prefill.log")
    decode_a = worker(DECODE, "127.0.0.3", port, "decode_a.log", ["--kv-port", str(kv_port)])
    routers = []
    for r in range(2):
        rp, mp = free_port(), free_port()
        proc = start([ROUTER, "--model", MODEL, "--port", str(rp), "--bind-address", "127.0.0.1",
                      "--metrics-port", str(mp), "--dns-server", f"127.0.0.1:{dns.port}", "--dns-refresh-ms", "300",
                      "--workers-dns", f"prefill.tandem.test:{port},decode.tandem.test:{port}"], f"router{r}.log")
        routers.append((proc, rp, mp))
    for _, rp, mp in routers:
        wait_for(f"router {rp} to find both workers",
                 lambda: live(mp, "prefill") == 1 and live(mp, "decode") == 1, timeout=60)
    texts = [generate(rp) for _, rp, _ in routers]
    check(texts[0][0] is not None and texts[0] == texts[1], f"the two routers' texts: {texts}")

    # Scale out: a second decode worker appears in DNS.
    decode_b = worker(DECODE, "127.0.0.4", port, "decode_b.log", ["--kv-port", str(kv_port)])
    dns.set("decode.tandem.test", ["127.0.0.3", "127.0.0.4"])
    for _, rp, mp in routers:
        wait_for(f"router {rp} to find the second decode worker", lambda: live(mp, "decode") == 2)
    # Scale in: the first leaves DNS (its pod is terminating) and drains.
    dns.set("decode.tandem.test", ["127.0.0.4"])
    decode_a.send_signal(signal.SIGTERM)
    check(decode_a.wait(timeout=20) == 0, "the drained decode worker did not exit 0")
    for _, rp, mp in routers:
        wait_for(f"router {rp} to drop the gone decode worker", lambda: live(mp, "decode") == 1)
    after = [generate(rp) for _, rp, _ in routers]
    check(all(t == texts[0] for t in after), f"after scaling: {after} (before: {texts[0]})")

    # One router replica dies; the other serves.
    routers[0][0].kill()
    routers[0][0].wait()
    check(generate(routers[1][1]) == texts[0], "the surviving router does not serve")
    check(dns.queries > 0, "the stand-in DNS server was never asked")
    del decode_b


try:
    main()
finally:
    stop_and_report(list(procs), WORK, failures)
print(f"dns discovery: {len(failures)} failures")
sys.exit(1 if failures else 0)
