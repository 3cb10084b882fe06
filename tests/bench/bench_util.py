"""What the benchmark scripts share: a `tandem up` cluster started, waited for and stopped, and its
processes' Prometheus counters read."""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def start_up(cmd, ready, what, timeout_s=960):
    """Runs `cmd` (a `tandem up ... --ready-file READY` command line) and returns the process once READY
    exists; exits the script, killing it, if it dies or is not ready in time (`what` names it)."""
    up = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout_s
    while not os.path.exists(ready):
        if up.poll() is not None or time.time() > deadline:
            up.kill()
            sys.exit(f"{what} failed to get ready: {up.stderr.read()[-2000:]}")
        time.sleep(0.2)
    return up


def stop_up(up, timeout_s=120):
    """Stops a cluster as Ctrl-C would (draining), killing it if it does not stop in time."""
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        up.kill()


def free_port_run(n):
    """The first of n consecutive TCP ports free on 127.0.0.1 now (`tandem up --metrics-port` takes the
    router's port and the ones after it for the workers). Below Linux's ephemeral range (32768 on), so
    no socket that binds port 0 meanwhile (a worker's gRPC port, an outgoing connection) can take one."""
    for _ in range(200):
        first = random.randrange(20000, 32768 - n)
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    sys.exit(f"no {n} consecutive free ports")


def scrape_counters(address, names):
    """The sum over every series of each counter in `names` in the /metrics exposition at `address`
    (host:port); {} when it does not answer. A name may select series by labels, as in PromQL:
    'tandem_engine_forward_seconds_total{step="prompt"}' sums only the series with that label."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    wanted = {}
    for n in names:
        base, _, selector = n.partition("{")
        wanted[n] = (base, dict(label.findall(selector)))
    out = {n: 0.0 for n in names}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:][a-z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|[+-]Inf)$", line)
        if not m:
            continue
        labels = dict(label.findall(m.group(2) or ""))
        for n, (base, selector) in wanted.items():
            if m.group(1) == base and all(labels.get(k) == v for k, v in selector.items()):
                out[n] += float(m.group(3))
    return out


def metric(port, family):
    """A family's sum on 127.0.0.1:PORT/metrics; None when the process does not answer."""
    return scrape_counters(f"127.0.0.1:{port}", [family]).get(family)


def proc_stats(pid):
    """(resident MiB, threads, open descriptors) of a process from /proc; Nones when it is gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
        threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
        return rss, threads, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, AttributeError):
        return None, None, None


PROMPT_FORWARD = 'tandem_engine_forward_seconds_total{step="prompt"}'


def prompt_share(before, after):
    """The share of the forward pass's time in steps that computed prompt tokens, between two scrapes of
    tandem_engine_forward_seconds_total and its step="prompt" series; None without both."""
    f = "tandem_engine_forward_seconds_total"
    if not all(k in d for d in (before, after) for k in (f, PROMPT_FORWARD)):
        return None
    dp, df = after[PROMPT_FORWARD] - before[PROMPT_FORWARD], after[f] - before[f]
    return dp / df if df > 0 else None


def host_share(before, after):
    """The engine host share between two scrapes of tandem_engine_{host,forward}_seconds_total: the
    engine thread's time outside the forward pass over its busy time; None without both."""
    h, f = "tandem_engine_host_seconds_total", "tandem_engine_forward_seconds_total"
    if not all(k in d for d in (before, after) for k in (h, f)):
        return None
    dh, df = after[h] - before[h], after[f] - before[f]
    return dh / (dh + df) if dh + df > 0 else None
