#!/usr/bin/env python3
"""Metrics, dashboard and alerts against a real Prometheus.

Starts a local cluster with `tandem up --metrics-port` (router, 1 prefill, 1 decode worker), checks
every process's /metrics with `promtool check metrics`, starts Prometheus (Debian's package)
scraping them with deploy/prometheus/alerts.yml loaded, runs a short `tandem bench` (random and
shared-prefix workloads), then through Prometheus's HTTP API: every query of the Grafana dashboard
returns data, every alerting rule's expression evaluates and the rule group is healthy. Every
tandem_ metric the dashboard and rules name exists in some process's /metrics. The prefill side's
KV transfer count and the decode side's landed reservations agree.

Usage: metrics_e2e_test.py TANDEM SOURCE_DIR WORK_DIR
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench_util import free_port_run  # noqa: E402

TANDEM, SRC, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


for tool in ("prometheus", "promtool"):
    if shutil.which(tool) is None:
        sys.exit(f"{tool} is not installed (scripts/install_deps.sh installs Debian's prometheus package)")

shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(os.path.join(WORK, "targets"))
model = os.path.join(WORK, "tiny-llama")
subprocess.run([TANDEM, "make-model", "--preset", "tiny-llama", "--out", model, "--seed", "4"], check=True,
               capture_output=True)
port = free_port()
metrics_port = free_port_run(3)  # the router's and two workers' (consecutive, none ephemeral)
ready = os.path.join(WORK, "ready")
env = dict(os.environ, TANDEM_NUM_THREADS="1")
up = subprocess.Popen([TANDEM, "up", "--model", model, "--port", str(port), "--metrics-port", str(metrics_port),
                       "--prometheus-targets", os.path.join(WORK, "targets", "tandem.json"), "--ready-file", ready,
                       "--log-dir", os.path.join(WORK, "logs"), "--speculative-method", "ngram"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
prom = None
try:
    deadline = time.time() + 60
    while not os.path.exists(ready):
        if up.poll() is not None or time.time() > deadline:
            sys.exit(f"tandem up did not start: {up.stderr.read() if up.poll() is not None else 'timeout'}")
        time.sleep(0.05)
    targets = json.load(open(os.path.join(WORK, "targets", "tandem.json")))
    addresses = [t["targets"][0] for t in targets]
    check(len(addresses) == 3, f"expected 3 scrape targets, got {addresses}")

    # promtool on every process's exposition.
    expositions = {}
    for a in addresses:
        text = get(f"http://{a}/metrics")
        expositions[a] = text
        p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        check(p.returncode == 0, f"promtool check metrics {a}: {p.stdout}{p.stderr}")
        for line in text.splitlines():
            m = re.match(r"^(tandem_[a-z0-9_]+)\{([^}]*)\}", line)
            if m:
                check('model="' in m.group(2) and 'role="' in m.group(2), f"{a}: {m.group(1)} lacks model/role labels")

    # Prometheus scraping the cluster every second, with the alerting rules.
    config = os.path.join(WORK, "prometheus.yml")
    shutil.copy(os.path.join(SRC, "deploy", "prometheus", "alerts.yml"), os.path.join(WORK, "alerts.yml"))
    text = open(os.path.join(SRC, "deploy", "prometheus", "prometheus.yml")).read()
    text = text.replace("scrape_interval: 5s", "scrape_interval: 1s").replace("evaluation_interval: 15s",
                                                                                 "evaluation_interval: 1s")
    text = text.replace("refresh_interval: 10s", "refresh_interval: 1s")
    open(config, "w").write(text)
    prom_port = free_port()
    prom = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={WORK}/tsdb",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "prometheus.log"), "w"))
    api = f"http://127.0.0.1:{prom_port}/api/v1"

    def query(expr):
        return json.loads(get(f"{api}/query?" + urllib.parse.urlencode({"query": expr})))

    deadline = time.time() + 60
    while True:
        try:
            if len(query("up")["data"]["result"]) >= 3:
                break
        except Exception:
            pass
        if time.time() > deadline or prom.poll() is not None:
            sys.exit("Prometheus did not scrape the cluster:\n" + open(os.path.join(WORK, "prometheus.log")).read())
        time.sleep(0.2)

    server = f"127.0.0.1:{port}"
    for extra in (["--workload", "random", "--concurrency", "4", "--num-requests", "40"],
                  ["--workload", "shared-prefix", "--request-rate", "40", "--num-requests", "40", "--prefix-len", "64"]):
        p = subprocess.run([TANDEM, "bench", "--server", server, "--input-len", "32", "--output-len", "24", *extra],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0 and "Successful requests:               40" in p.stdout,
              f"tandem bench {' '.join(extra)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    time.sleep(4)  # a few scrapes after the traffic

    # The two sides of the KV transfer agree: each of the 80 requests' transfers was sent once by the
    # prefill worker and landed once in a decode worker's reservation; none failed, timed out or was
    # cancelled.
    def total(expr):
        result = query(expr)["data"]["result"]
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in result}

    sent = total('sum(tandem_kv_transfers_total{role="prefill"})')
    check(list(sent.values()) == [80.0], f"prefill side: KV transfers {sent}, expected 80")
    outcomes = total('sum by (outcome) (tandem_kv_reservations_total{role="decode"})')
    by_outcome = {dict(k).get("outcome"): v for k, v in outcomes.items()}
    check(by_outcome == {"landed": 80.0, "failed": 0.0, "timed_out": 0.0, "cancelled": 0.0},
          f"decode side: KV reservations by outcome {by_outcome}, expected 80 landed and no others")

    # Every worker's engine thread spent time in forward passes and around them (the host's share).
    for family in ("tandem_engine_forward_seconds_total", "tandem_engine_host_seconds_total"):
        by_role = {dict(k).get("role"): v for k, v in total(f"sum by (role) ({family})").items()}
        check(set(by_role) == {"prefill", "decode"} and all(v > 0 for v in by_role.values()),
              f"{family} by role: {by_role}, expected time on the prefill and the decode workers")
    # By step: a prefill worker's steps all compute prompt tokens, a decode worker's (the KV comes
    # over the transfer) none.
    by_step = {(dict(k).get("role"), dict(k).get("step")): v
               for k, v in total("sum by (role, step) (tandem_engine_forward_seconds_total)").items()}
    check(by_step.get(("prefill", "prompt"), 0) > 0 and by_step.get(("prefill", "decode"), -1) == 0 and
          by_step.get(("decode", "decode"), 0) > 0 and by_step.get(("decode", "prompt"), -1) == 0,
          f"forward seconds by role and step: {by_step}, expected prefill workers all prompt, decode workers all decode")

    # The decode worker speculates (n-gram): its counters count, per position too, and its policy's
    # decisions; kept <= proposed everywhere.
    proposed = sum(total('sum(tandem_spec_decode_draft_tokens_total{role="decode"})').values())
    kept = sum(total('sum(tandem_spec_decode_accepted_tokens_total{role="decode"})').values())
    at_first = sum(total('sum(tandem_spec_decode_draft_tokens_at_position_total{position="1"})').values())
    decisions = sum(total('sum(tandem_spec_decode_decisions_total)').values())
    steps = sum(total('sum(tandem_spec_decode_verify_steps_total)').values())
    check(proposed > 0 and 0 <= kept <= proposed and at_first == steps > 0 and decisions >= steps,
          f"speculation counters: proposed {proposed}, kept {kept}, proposed at position 1 {at_first}, "
          f"verification steps {steps}, decisions {decisions}")

    dashboard = json.load(open(os.path.join(SRC, "deploy", "grafana", "dashboards", "tandem.json")))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    check(len(exprs) >= 20, f"only {len(exprs)} dashboard queries")
    for expr in exprs:
        e = expr.replace("$__rate_interval", "30s")
        r = query(e)
        check(r.get("status") == "success", f"dashboard query failed: {e}: {r}")
        check(len(r.get("data", {}).get("result", [])) > 0, f"dashboard query returned no data: {e}")

    rules_text = open(os.path.join(SRC, "deploy", "prometheus", "alerts.yml")).read()
    rule_exprs = []
    rules = json.loads(get(f"{api}/rules"))["data"]["groups"]
    check(len(rules) == 1 and len(rules[0]["rules"]) >= 6, f"alert rules not loaded: {rules}")
    deadline = time.time() + 10
    for g in rules:
        for rule in g["rules"]:
            rule_exprs.append(rule["query"])
            while rule.get("health") == "unknown" and time.time() < deadline:  # not evaluated yet
                time.sleep(0.5)
                rule = [x for x in json.loads(get(f"{api}/rules"))["data"]["groups"][0]["rules"] if x["name"] == rule["name"]][0]
            check(rule.get("health") == "ok", f"alert {rule['name']}: health {rule.get('health')} {rule.get('lastError')}")
    for e in rule_exprs:
        r = query(e)
        check(r.get("status") == "success", f"alert expression failed: {e}: {r}")

    # Every tandem_ metric named by the dashboard and the rules exists in some exposition.
    exposed = set()
    for text in expositions.values():
        exposed |= set(re.findall(r"^# TYPE (tandem_[a-z0-9_]+)", text, re.M))
    for a in addresses:  # counters created lazily (by outcome) appear after traffic
        exposed |= set(re.findall(r"^# TYPE (tandem_[a-z0-9_]+)", get(f"http://{a}/metrics"), re.M))
    named = set(re.findall(r"tandem_[a-z0-9_]+", " ".join(exprs) + " " + rules_text))
    for name in sorted(named):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        check(name in exposed or base in exposed, f"{name} is referenced but no process exposes it")
finally:
    if prom is not None:
        prom.terminate()
        prom.wait(timeout=30)
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout=60)
    except subprocess.TimeoutExpired:
        up.kill()

if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"metrics checks passed: {len(exprs)} dashboard queries, {len(rule_exprs)} alert rules, {len(named)} metric names")
