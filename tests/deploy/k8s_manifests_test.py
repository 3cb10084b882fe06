#!/usr/bin/env python3
"""The Kubernetes manifests (deploy/k8s), rendered and then run.

1. Every overlay renders with kubectl's kustomize; every object validates against the Kubernetes
   OpenAPI schemas and the Prometheus operator's CRDs (validate_k8s.mjs), and holds what the design
   needs: two
   router replicas behind a Service (gRPC and HTTP), headless worker Services the routers resolve,
   gRPC probes (startup and readiness on "", liveness on "liveness"), a grace period above the drain
   time plus the preStop pause, PodDisruptionBudgets, HPAs whose metrics the adapter rules define
   from metrics the workers export, monitors on ports the pods expose, the dashboard ConfigMap (the
   same JSON as deploy/grafana), a NetworkPolicy that lets only prefill pods reach the decode KV
   port, GPUs in the gpu overlay; every flag in every container's args is one the binary knows
   (its --helpfull), and every $(VAR) is defined.
2. The cpu-demo overlay runs on localhost: each pod's container command, args and env as rendered,
   started as a process at a loopback address of its own (the pod IP; the only change: a
   --bind-address for that IP, and /models/model mapped to models/kjv-target, which the pod's init
   container copies from the image), the headless Services answered by a stand-in DNS server. The
   processes must form a cluster, answer their probes' RPCs, serve a request through each router
   replica, drain a decode worker on SIGTERM within the pod's grace period without failing a stream
   in flight, and keep serving through one router when the other is killed.

usage: k8s_manifests_test.py SOURCE_DIR BUILD_DIR WORK_DIR
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import yaml

SRC, BUILD, WORK = sys.argv[1:4]
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))
from standin_dns import StandInDns, stop_and_report  # noqa: E402

TANDEM = os.path.join(BUILD, "cli", "tandem")
BINARIES = {
    "tandem-router": os.path.join(BUILD, "router", "tandem-router"),
    "tandem-prefill-worker": os.path.join(BUILD, "prefill_worker", "tandem-prefill-worker"),
    "tandem-decode-worker": os.path.join(BUILD, "decode_worker", "tandem-decode-worker"),
    "tandem": TANDEM,
}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)
    return cond


def render(overlay):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        sys.exit("kubectl is not installed (scripts/install_deps.sh installs Debian's kubernetes-client)")
    p = subprocess.run([kubectl, "kustomize", os.path.join(SRC, "deploy", "k8s", "overlays", overlay)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kubectl kustomize {overlay} failed:\n{p.stderr}")
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def known_flags(binary):
    out = subprocess.run([BINARIES[binary], "--helpfull"], capture_output=True, text=True).stdout
    return set(re.findall(r"^\s+--([a-z0-9_]+) ", out, re.M))


def expand(value, env):
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_env(deployment, configmaps, pod_ip):
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {}
    for src in c.get("envFrom", []):
        env.update(configmaps[src["configMapRef"]["name"]]["data"])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[e["name"]] = pod_ip
    return env


def flag_value(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def static_checks(overlay, objects):
    deployments = by_kind(objects, "Deployment")
    services = by_kind(objects, "Service")
    configmaps = by_kind(objects, "ConfigMap")
    where = f"{overlay}:"
    for name in ("tandem-router", "tandem-prefill", "tandem-decode"):
        check(name in deployments, f"{where} no Deployment {name}")
    router = deployments["tandem-router"]
    check(router["spec"]["replicas"] >= 2, f"{where} the router has {router['spec']['replicas']} replicas")
    ports = {p["name"] for p in services["tandem-router"]["spec"]["ports"]}
    check({"grpc", "http"} <= ports, f"{where} the router Service exposes {ports}")
    flags = configmaps["tandem-flags"]["data"]
    drain = float(flags["DRAIN_GRACE_S"])
    flags_of = {}
    for name, d in deployments.items():
        spec = d["spec"]["template"]["spec"]
        c = spec["containers"][0]
        binary = c["command"][0]
        if binary not in flags_of:
            flags_of[binary] = known_flags(binary)
        env = container_env(d, configmaps, "10.0.0.1")
        for a in c["args"]:
            m = re.match(r"--([a-z0-9-]+)=", a)
            check(m and m.group(1).replace("-", "_") in flags_of[binary], f"{where} {name}: {binary} has no flag {a}")
            check("$(" not in expand(a, env), f"{where} {name}: {a} refers to an undefined variable")
        probes = {k: c.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        grpc_port = int(flag_value(c["args"], "port"))
        for k, p in probes.items():
            if not check(p is not None and "grpc" in p, f"{where} {name}: no gRPC {k}"):
                continue
            check(p["grpc"]["port"] == grpc_port, f"{where} {name}: {k} probes port {p['grpc']['port']}")
            want = "liveness" if k == "livenessProbe" else None
            check(p["grpc"].get("service") == want, f"{where} {name}: {k} asks service {p['grpc'].get('service')}")
        pause = 0
        pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if pre[:1] == ["sleep"]:
            pause = float(pre[1])
        grace = spec.get("terminationGracePeriodSeconds", 30)
        check(grace >= drain + pause, f"{where} {name}: grace {grace} s < drain {drain} + preStop {pause}")
        check(float(flag_value(c["args"], "drain-grace-s").replace("$(DRAIN_GRACE_S)", str(drain))) == drain,
              f"{where} {name}: --drain-grace-s is not DRAIN_GRACE_S")
        check("requests" in c.get("resources", {}) and "limits" in c.get("resources", {}),
              f"{where} {name}: no resource requests and limits")
    # The routers find the workers through the headless Services.
    targets = flag_value(router["spec"]["template"]["spec"]["containers"][0]["args"], "workers-dns").split(",")
    for role in ("prefill", "decode"):
        svc = services[f"tandem-{role}"]
        check(svc["spec"].get("clusterIP") == "None", f"{where} tandem-{role} is not headless")
        port = svc["spec"]["ports"][0]["port"]
        check(f"tandem-{role}:{port}" in targets, f"{where} the routers do not resolve tandem-{role}:{port}: {targets}")
    pdbs = by_kind(objects, "PodDisruptionBudget")
    check(set(pdbs) == {"tandem-router", "tandem-prefill", "tandem-decode"}, f"{where} PDBs {sorted(pdbs)}")
    # Only prefill pods reach the decode KV port.
    decode_args = deployments["tandem-decode"]["spec"]["template"]["spec"]["containers"][0]["args"]
    kv_port = int(flag_value(decode_args, "kv-port"))
    policy = by_kind(objects, "NetworkPolicy")["tandem-decode"]["spec"]
    for rule in policy["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        reaches_kv = not ports or kv_port in ports
        sources = [f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") for f in rule["from"]]
        if reaches_kv:
            check(sources == ["prefill"], f"{where} the decode KV port is open to {sources}")
    # HPAs read metrics the adapter rules define, from series the workers export.
    adapter = yaml.safe_load(configmaps["tandem-prometheus-adapter-rules"]["data"]["config.yaml"])["rules"]
    defined = {r["name"]["as"]: re.match(r"\s*([a-z_]+)", r["seriesQuery"]).group(1) for r in adapter}
    for hpa in by_kind(objects, "HorizontalPodAutoscaler").values():
        for m in hpa["spec"]["metrics"]:
            name = m["pods"]["metric"]["name"]
            check(name in defined, f"{where} HPA {hpa['metadata']['name']} reads {name}, which no adapter rule defines")
    # Monitors scrape ports the pods and Services name.
    for pm in by_kind(objects, "PodMonitor").values():
        for ep in pm["spec"]["podMetricsEndpoints"]:
            for d in ("tandem-prefill", "tandem-decode"):
                names = [p["name"] for p in deployments[d]["spec"]["template"]["spec"]["containers"][0]["ports"]]
                check(ep["port"] in names, f"{where} PodMonitor port {ep['port']} not on {d}")
    for sm in by_kind(objects, "ServiceMonitor").values():
        for ep in sm["spec"]["endpoints"]:
            check(ep["port"] in ports_of(services["tandem-router"]), f"{where} ServiceMonitor port {ep['port']}")
    dash = configmaps.get("tandem-grafana-dashboard")
    if check(dash is not None, f"{where} no dashboard ConfigMap"):
        check(dash["metadata"]["labels"].get("grafana_dashboard") == "1", f"{where} dashboard ConfigMap label")
        with open(os.path.join(SRC, "deploy", "grafana", "dashboards", "tandem.json")) as f:
            check(json.loads(dash["data"]["tandem.json"]) == json.load(f), f"{where} the dashboard ConfigMap differs")
    if overlay == "gpu":
        for d in ("tandem-prefill", "tandem-decode"):
            spec = deployments[d]["spec"]["template"]["spec"]
            res = spec["containers"][0]["resources"]
            check(res["limits"].get("nvidia.com/gpu") == "1", f"{where} {d} asks no GPU")
            check(any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), f"{where} {d} tolerates no GPU taint")
        check(flags["DEVICE"] == "cuda" and "nccl" in flags["KV_TRANSPORT"], f"{where} flags {flags}")
    return defined


def ports_of(service):
    return [p["name"] for p in service["spec"]["ports"]]


def scrape(address):
    try:
        return urllib.request.urlopen(f"http://{address}/metrics", timeout=2).read().decode()
    except OSError:
        return ""


procs = {}


def run_pod(name, deployment, configmaps, pod_ip, model_dir):
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    env = container_env(deployment, configmaps, pod_ip)
    args = [expand(a, env).replace("/models/model", model_dir) for a in c["args"]]
    cmd = [BINARIES[c["command"][0]], *args, f"--bind-address={pod_ip}"]
    log = open(os.path.join(WORK, f"{name}.log"), "w")
    procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
    return procs[name]


def health(address, service=""):
    p = subprocess.run([TANDEM, "health", "--server", address, "--service", service], capture_output=True, text=True)
    return p.stdout.strip()


def wait_for(what, cond, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return check(False, f"timed out waiting for {what}")


def live(metrics_address, role):
    m = re.search(r'^tandem_workers_live\{[^}]*worker_role="%s"[^}]*\} (\S+)' % role, scrape(metrics_address), re.M)
    return int(float(m.group(1))) if m else -1


def generate(router, max_tokens=12):
    p = subprocess.run([TANDEM, "generate", "--server", router, "--prompt", "And God said", "--max-tokens",
                        str(max_tokens), "--temperature", "0", "--ignore-eos", "--json"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print(f"generate through {router}: {p.stderr.strip()[-400:]}", flush=True)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_cpu_demo(objects, adapter_series):
    deployments = by_kind(objects, "Deployment")
    configmaps = by_kind(objects, "ConfigMap")
    model_dir = os.path.join(SRC, "models", "kjv-target")
    init = deployments["tandem-decode"]["spec"]["template"]["spec"]["initContainers"][0]["command"]
    check(init[-2].endswith("models/kjv-target") and init[-1] == "/models/model", f"cpu-demo init container {init}")
    dns = StandInDns()
    ips = {"tandem-prefill-0": "127.0.1.2", "tandem-decode-0": "127.0.1.3",
           "tandem-router-0": "127.0.1.10", "tandem-router-1": "127.0.1.11"}
    dns.set("tandem-prefill", [ips["tandem-prefill-0"]])
    dns.set("tandem-decode", [ips["tandem-decode-0"]])
    for pod in ("tandem-prefill-0", "tandem-decode-0"):
        run_pod(pod, deployments[pod[:-2]], configmaps, ips[pod], model_dir)
    router = deployments["tandem-router"]
    for r in range(router["spec"]["replicas"]):
        pod = f"tandem-router-{r}"
        d = json.loads(json.dumps(router))
        d["spec"]["template"]["spec"]["containers"][0]["args"].append(f"--dns-server=127.0.0.1:{dns.port}")
        run_pod(pod, d, configmaps, ips[pod], model_dir)

    def probe_port(d):
        return flag_value(d["spec"]["template"]["spec"]["containers"][0]["args"], "port")

    def metrics_port(d):
        return flag_value(d["spec"]["template"]["spec"]["containers"][0]["args"], "metrics-port")

    # The probes' RPCs, as the kubelet would ask them.
    for pod, ip in ips.items():
        d = deployments[pod.rsplit("-", 1)[0]]
        address = f"{ip}:{probe_port(d)}"
        wait_for(f"{pod} ready (startup/readiness probe: health \"\" SERVING)", lambda: health(address) == "SERVING")
        check(health(address, "liveness") == "SERVING", f"{pod}: liveness probe")
    routers = [f"{ips[f'tandem-router-{r}']}:{probe_port(router)}" for r in range(2)]
    router_metrics = [f"{ips[f'tandem-router-{r}']}:{metrics_port(router)}" for r in range(2)]
    for m in router_metrics:
        wait_for(f"router {m} to find the workers", lambda: live(m, "prefill") == 1 and live(m, "decode") == 1)
    results = [generate(r) for r in routers]
    check(results[0] is not None and results[1] is not None and results[0]["text"] == results[1]["text"],
          f"a request through each router replica: {results}")
    # The series the HPAs' adapter rules read are exported by the workers.
    exposition = "".join(scrape(f"{ips[p]}:{metrics_port(deployments[p[:-2]])}") for p in ("tandem-prefill-0", "tandem-decode-0"))
    for name, series in adapter_series.items():
        check(re.search(rf"^{series}\{{", exposition, re.M) is not None, f"adapter rule {name}: no worker exports {series}")

    # The decode pod terminates mid-stream, as Kubernetes does it: it leaves the Service's endpoints
    # (DNS) at once, its preStop pause runs, then SIGTERM; it drains within its grace period and
    # every stream in flight completes (the routers keep polling it, as draining, until it exits).
    decode = procs["tandem-decode-0"]
    spec = deployments["tandem-decode"]["spec"]["template"]["spec"]
    grace = spec["terminationGracePeriodSeconds"]
    pause = float(spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    streamed = [None] * 6
    threads = [threading.Thread(target=lambda i=i: streamed.__setitem__(i, generate(routers[i % 2], max_tokens=900)))
               for i in range(len(streamed))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    start = time.time()
    dns.set("tandem-decode", [])
    time.sleep(pause)
    decode.send_signal(signal.SIGTERM)
    decode_address = f"{ips['tandem-decode-0']}:{probe_port(deployments['tandem-decode'])}"
    draining = health(decode_address)
    try:
        code = decode.wait(timeout=grace - pause)
    except subprocess.TimeoutExpired:
        code = None
    for t in threads:
        t.join(timeout=120)
    check(code == 0, f"the decode worker did not exit 0 within its {grace} s grace period (code {code})")
    check(draining == "NOT_SERVING" or draining.startswith("UNREACHABLE"),
          f"a draining decode worker reports {draining} to its readiness probe")
    check(all(r is not None and len(r["token_ids"]) == 900 for r in streamed),
          f"streams in flight during the termination: {[r and len(r['token_ids']) for r in streamed]}")
    print(f"termination took {time.time() - start:.1f} s (preStop {pause} s, grace {grace} s)", flush=True)
    wait_for("the routers to count no decode worker", lambda: all(live(m, "decode") == 0 for m in router_metrics))

    # A new decode pod, then one router replica killed: the other serves.
    ips["tandem-decode-1"] = "127.0.1.4"
    run_pod("tandem-decode-1", deployments["tandem-decode"], configmaps, ips["tandem-decode-1"], model_dir)
    dns.set("tandem-decode", [ips["tandem-decode-1"]])
    wait_for("the routers to find the new decode pod", lambda: all(live(m, "decode") == 1 for m in router_metrics))
    procs["tandem-router-0"].kill()
    procs["tandem-router-0"].wait()
    after = generate(routers[1])
    check(after is not None and after["text"] == results[0]["text"], f"the surviving router replica: {after}")


def validate_schemas(overlay, objects):
    """Every object against the Kubernetes OpenAPI schemas and the Prometheus operator's CRDs
    (validate_k8s.mjs, npm kubernetes-models); and a broken copy must be refused."""
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(SRC, "tests", "conformance", "node_modules", "kubernetes-models")):
        sys.exit("node and tests/conformance/node_modules are needed (npm ci in tests/conformance)")
    script = os.path.join(SRC, "tests", "deploy", "validate_k8s.mjs")
    path = os.path.join(WORK, f"{overlay}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(objects, f)
    p = subprocess.run([node, script, path], capture_output=True, text=True)
    check(p.returncode == 0, f"{overlay}: objects fail their schemas:\n{p.stdout}{p.stderr}")
    broken = json.loads(json.dumps(objects))
    for o in broken:
        if o["kind"] == "Deployment":
            o["spec"]["replicas"] = "two"
    with open(path + ".broken", "w") as f:
        yaml.safe_dump_all(broken, f)
    p = subprocess.run([node, script, path + ".broken"], capture_output=True, text=True)
    check(p.returncode != 0 and "INVALID apps/v1 Deployment" in p.stdout,
          f"{overlay}: the schema check accepts a Deployment with replicas 'two'")


def main():
    os.makedirs(WORK, exist_ok=True)
    rendered = {o: render(o) for o in ("cpu-demo", "gpu")}
    series = {}
    for overlay, objects in rendered.items():
        series = static_checks(overlay, objects)
        validate_schemas(overlay, objects)
        print(f"{overlay}: {len(objects)} objects, valid against their schemas", flush=True)
    run_cpu_demo(rendered["cpu-demo"], series)


try:
    main()
finally:
    stop_and_report(list(procs.values()), WORK, failures)
print(f"k8s manifests: {len(failures)} failures")
sys.exit(1 if failures else 0)
