#!/usr/bin/env python3
"""`tandem` with `--device cuda` on the CUDA emulator (tests/support/cuda_emu, loaded as the CUDA
plugin through TANDEM_CUDA_PLUGIN): the CUDA backend's kernels, CUDA graphs, the memory plan and
sampling on the device, run end to end on the CPU, against the CPU backend and against themselves
(the memory plan in the first generate and the combined worker; the other runs take a fixed KV pool,
as the plan's profile step is most of an emulated start).

On models/kjv-target (a trained model: greedy choices have clear margins):
- greedy tokens on the emulated GPU equal the CPU backend's;
- with --batch-invariant, decode graphs on and off give the same tokens and logprobs bit for bit;
- seeded top-k sampling with penalties: tokens drawn on the device equal the host sampler's over the
  same logits (--device-sampling=false), logprobs within 1e-5;
- a combined `tandem up --device cuda` worker streams what in-process generation gives;
- a prefill and a decode worker moving KV over the emulated NCCL (emu/nccl.cc) stream the same greedy
  tokens as in-process generation, and each then counts one link in tandem_kv_links; so do a pair
  moving it over CUDA IPC (the emulator's IPC: the exporter's memfd mapped through /proc), `tandem up
  --device cuda`'s default, and a pair whose decode worker offers NCCL alone, where the prefill worker
  asking for `cuda-ipc,nccl` passes CUDA IPC over (and logs why) for NCCL.

Usage: cuda_emu_cli_test.py PATH_TO_TANDEM PATH_TO_EMU_PLUGIN MODEL_DIR WORK_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

TANDEM, PLUGIN, MODEL, WORK = sys.argv[1:5]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench_util import free_port_run, scrape_counters  # noqa: E402
failures = []
# The emulated device's memory is host memory: keep the KV pool small.
ENV = dict(os.environ, TANDEM_CUDA_PLUGIN=PLUGIN, TANDEM_CUDA_EMU_MEMORY_MB="768", TANDEM_NUM_THREADS="1")


def check(cond, what):
    if not cond:
        failures.append(what)


# The memory plan's profile step (the largest step the scheduler can build, run once) takes most of an
# emulated start: the first generate and the combined worker plan their KV pool, the other runs get a
# fixed one.
FIXED_KV = "--kv-cache-memory=64M"


def generate(*args, device="cuda", plan=False):
    cmd = [TANDEM, "generate", "--model", MODEL, "--json", "--device", device, *args]
    if device == "cuda" and not plan:
        cmd.append(FIXED_KV)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    if p.returncode != 0:
        failures.append(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
        return None
    return json.loads(p.stdout)


def lp_close(a, b, tol):
    """Two generate logprobs lists: same tokens and tops, values within tol."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x["token_id"] != y["token_id"] or abs(x["logprob"] - y["logprob"]) > tol:
            return False
        if [t["token_id"] for t in x["top"]] != [t["token_id"] for t in y["top"]]:
            return False
        if any(abs(s["logprob"] - t["logprob"]) > tol for s, t in zip(x["top"], y["top"])):
            return False
    return True


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
started = time.time()

greedy = ["--prompt", "And God said", "--max-tokens", "24", "--temperature", "0"]
gpu, cpu = generate(*greedy, plan=True), generate(*greedy, device="cpu")
if gpu and cpu:
    check(gpu["token_ids"] == cpu["token_ids"],
          f"greedy tokens differ between the emulated GPU and the CPU:\n cuda {gpu['token_ids']}\n cpu  {cpu['token_ids']}")

# An int8 KV cache: the emulated GPU writes the CPU's bytes, so their greedy choices agree (a few
# tokens: emulated decode steps are what this test spends its time on).
short = ["--prompt", "And God said", "--max-tokens", "6", "--temperature", "0"]
i8 = ["--kv-cache-dtype", "int8"]
gpu_i8, cpu_i8 = generate(*short, *i8), generate(*short, *i8, device="cpu")
if gpu_i8 and cpu_i8:
    check(gpu_i8["token_ids"] == cpu_i8["token_ids"],
          f"int8 KV greedy tokens differ:\n cuda {gpu_i8['token_ids']}\n cpu  {cpu_i8['token_ids']}")
# An FP8 E4M3 KV cache is CUDA's: it generates on the emulated GPU, close to the default cache's
# greedy choices; the CPU refuses it at start, saying so.
fp8 = generate(*short, "--kv-cache-dtype", "fp8")
if fp8 and gpu:
    check(len(fp8["token_ids"]) == 6 and fp8["token_ids"][:4] == gpu["token_ids"][:4],
          f"--kv-cache-dtype fp8 greedy {fp8['token_ids']} vs {gpu['token_ids']}")
p = subprocess.run([TANDEM, "generate", "--model", MODEL, "--prompt", "x", "--device", "cpu",
                    "--kv-cache-dtype", "fp8"], capture_output=True, text=True, timeout=600, env=ENV)
check(p.returncode == 2 and "fp8 is CUDA's" in p.stderr, f"--device cpu --kv-cache-dtype fp8: {p.returncode} {p.stderr[-500:]!r}")

# Decode graphs replay exactly what the ops compute one by one.
exact = [*greedy, "--logprobs", "3", "--batch-invariant=true"]
graphs, eager = generate(*exact, "--cuda-graphs=true"), generate(*exact, "--cuda-graphs=false")
if graphs and eager:
    check(graphs["token_ids"] == eager["token_ids"] and graphs["logprobs"] == eager["logprobs"],
          "decode graphs and op-by-op decode differ (tokens or logprobs)")

# Sampling on the device against the host sampler over the same device logits.
sampled = ["--prompt", "In the beginning", "--max-tokens", "24", "--temperature", "0.9", "--top-k", "20",
           "--seed", "7", "--repetition-penalty", "1.2", "--presence-penalty", "0.3", "--logprobs", "2"]
device, host = generate(*sampled, "--device-sampling=true"), generate(*sampled, "--device-sampling=false")
if device and host:
    check(device["token_ids"] == host["token_ids"],
          f"top-k sampling on the device differs from the host sampler:\n device {device['token_ids']}\n"
          f" host   {host['token_ids']}")
    check(lp_close(device["logprobs"], host["logprobs"], 1e-5), "logprobs of device-sampled tokens differ")

def serve(name, topology, request, expected, what, links=None, log_has=None, plan=False):
    """Starts `tandem up --device cuda` with `topology`, sends `request` through the router and checks
    the streamed tokens against `expected` (in-process generation's). With `links`, the workers'
    tandem_kv_links gauges (metrics ports after the router's, in start order) must then read that;
    with `log_has` ({process: text}), each process's log must then hold its text. Without `plan` the
    workers get a fixed KV pool."""
    port = free_port_run(1)
    metrics = free_port_run(3)
    ready, logs = os.path.join(WORK, name + "-ready"), os.path.join(WORK, name + "-logs")
    up = subprocess.Popen([TANDEM, "up", "--model", MODEL, "--port", str(port), *topology, "--device", "cuda",
                           "--ready-file", ready, "--log-dir", logs, f"--metrics-port={metrics}",
                           *([] if plan else [f"--worker-args={FIXED_KV}"])],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.time() + 300
    while not os.path.exists(ready) and time.time() < deadline and up.poll() is None:
        time.sleep(0.1)
    if not os.path.exists(ready):
        up.kill()
        out, err = up.communicate()
        failures.append(f"tandem up ({name}) did not get ready:\n{out[-1000:]}\n{err[-2000:]}")
        for log in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            failures.append(f"{log}:\n{open(os.path.join(logs, log)).read()[-1500:]}")
        return
    address = open(ready).read().strip()
    cmd = [TANDEM, "generate", "--json", "--server", address, *request]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    check(p.returncode == 0, f"generate --server ({name}): exit {p.returncode}\n{p.stderr[-2000:]}")
    if p.returncode == 0 and expected:
        remote = json.loads(p.stdout.splitlines()[0])
        check(remote["token_ids"] == expected["token_ids"],
              f"{what} streamed other tokens than in-process generation:\n server  {remote['token_ids']}\n"
              f" in-proc {expected['token_ids']}")
    for i, want in enumerate(links or []):
        got = None
        for _ in range(50):  # gauges refresh every half second
            got = scrape_counters(f"127.0.0.1:{metrics + 1 + i}", ["tandem_kv_links"]).get("tandem_kv_links")
            if got == want:
                break
            time.sleep(0.1)
        check(got == want, f"{name}: worker {i} (metrics port {metrics + 1 + i}) has tandem_kv_links {got}, want {want}")
    for process, text in (log_has or {}).items():
        path = os.path.join(logs, process + ".log")
        log = open(path, errors="replace").read() if os.path.exists(path) else ""
        check(text in log, f"{name}: the {process} log lacks {text!r}:\n{log[-1500:]}")
    up.send_signal(signal.SIGINT)
    try:
        up.communicate(timeout=60)
        check(up.returncode == 0, f"tandem up ({name}) exited with {up.returncode}")
    except subprocess.TimeoutExpired:
        up.kill()
        failures.append(f"tandem up ({name}) did not stop within 60 s of Ctrl-C")


# A combined CUDA worker behind the router streams what in-process generation gives.
serve("combined", ["--prefill", "0", "--decode", "0", "--combined", "1"], sampled, device, "the CUDA worker",
      plan=True)
# So do a prefill and a decode worker moving the KV cache over NCCL (the emulated NCCL, emu/nccl.cc:
# loopback TCP between the two processes), each counting the link in tandem_kv_links. The emulated
# steps are slow: the KV timeouts are widened.
serve("nccl", ["--prefill", "1", "--decode", "1", "--kv-transport", "nccl", "--prefill-worker-args=--kv-io-timeout-s=120",
               "--decode-worker-args=--kv-transfer-timeout-s=120"], greedy, gpu, "a prefill and a decode worker over NCCL",
      links=[1, 1])  # the pair's communicator, kept at both ends for the next transfer
# `tandem up --device cuda` without --kv-transport: CUDA IPC, then inline TCP.
serve("cuda-ipc", ["--prefill", "1", "--decode", "1",
                   "--prefill-worker-args=--kv-io-timeout-s=120", "--decode-worker-args=--kv-transfer-timeout-s=120"],
      greedy, gpu, "a prefill and a decode worker over CUDA IPC", links=[1, 1],
      log_has={"prefill-0": "KV layers go over cuda-ipc, then inline", "decode-0": "layers inline or over cuda-ipc)"})
# A decode worker that offers NCCL alone (its own flag comes last): the prefill worker's cuda-ipc is
# refused for its data path and it takes NCCL, the next on its list, saying why.
serve("fallback", ["--prefill", "1", "--decode", "1", "--kv-transport", "cuda-ipc,nccl",
                   "--prefill-worker-args=--kv-io-timeout-s=120",
                   "--decode-worker-args=--kv-transfer-timeout-s=120,--kv-transport=nccl"],
      greedy, gpu, "a prefill worker falling back from CUDA IPC to NCCL", links=[1, 1],
      log_has={"prefill-0": "layers go over nccl-chunks (cuda-ipc: KV receiver at",
               "decode-0": "layers inline or over nccl-chunks"})

print(f"cuda_emu_cli_test: {time.time() - started:.0f} s")
if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("OK")
