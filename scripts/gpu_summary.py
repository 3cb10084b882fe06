#!/usr/bin/env python3
"""One short page from a gpu_check.sh output folder: what passed and failed, and the figures, so a
session with little device time (and little room to read logs) sees the results at once.

Usage: gpu_summary.py OUT_DIR   (gpu_check.sh writes OUT_DIR/summary.txt with it at exit)
"""
import glob
import json
import os
import re
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out"
lines = []


def read(name):
    path = os.path.join(out, name)
    return open(path, errors="replace").read() if os.path.exists(path) else None


def section(title):
    lines.append(f"== {title}")


dev = read("device.txt")
if dev:
    lines.append(dev.strip().splitlines()[-1])

section("tests")
for log in ("cuda_smoke.log", "cuda_backend.log", "nccl_link.log"):
    text = read(log)
    if text is None:
        continue
    failed = sorted(set(re.findall(r"^\[  FAILED  \] (\S+)", text, re.M)))
    verdicts = re.findall(r"^(\[  PASSED  \].*|SKIPPED.*)$", text, re.M)
    tail = verdicts[-1] if verdicts else (text.strip().splitlines()[-1] if text.strip() else "(empty)")
    lines.append(f"{log}: " + ("FAILED " + ", ".join(failed) if failed else tail))
    for m in re.findall(r"^abandoned rendezvous.*$|^the same 3 rounds.*$", text, re.M):
        lines.append(f"  {m}")
for log in ("hf_forward_check.log", "hf_forward_check_tc.log"):
    hf = read(log)
    if hf:
        lines += [f"{log[:-4]}: {l}" for l in hf.strip().splitlines()[-4:]]
checks = read("checks.txt")
if checks:
    lines += [l for l in checks.strip().splitlines()]
e2e = read("e2e-cuda-nccl.log")
if e2e:
    ok = re.findall(r"^\[       OK \] (\S+)", e2e, re.M)
    bad = sorted(set(re.findall(r"^\[  FAILED  \] (\S+)", e2e, re.M)))
    lines.append(f"e2e on CUDA + NCCL: {len(ok)} passed, {len(bad)} failed{': ' + ', '.join(bad) if bad else ''}")

plan = [l for f in sorted(glob.glob(os.path.join(out, "generate-cuda*.err")))
        for l in open(f, errors="replace").read().splitlines() if "memory plan" in l]
if plan:
    section("memory plan (tandem generate --device cuda)")
    lines += [l[l.find("memory plan"):][:220] for l in plan[:2]]



def forward_runs(text):
    """One line a forward_bench run, from its closing `json:` record; errors as they were printed."""
    out, model = [], None
    defaults = {"graphs": True, "sampling": "argmax", "fusion": True, "gemv_norm": True, "gemv_heads": True,
                "gemv_columns": 0, "pdl": False, "tc_attention": False}
    for l in text.splitlines():
        if l.startswith("forward_bench:") or l.startswith("graphs failed"):
            out.append("  " + l[:200])
        if not l.startswith("json: "):
            continue
        try:
            r = json.loads(l[len("json: "):])
        except ValueError:
            out.append("  (unreadable record) " + l[:150])
            continue
        if r.get("model") != model:
            model = r.get("model")
            out.append(f"{os.path.basename(str(model))} ({r.get('arch')})")
        settings = " ".join(f"{k}={r[k]}" for k in defaults if k in r and r[k] != defaults[k])
        decode = f"decode {r.get('decode_ms', 0):.2f} ms/step ({r.get('decode_tok_s', 0):.0f} tok/s"
        if "decode_roofline_pct" in r:
            decode += f", {r['decode_roofline_pct']:.1f}% of copy {r.get('copy_gb_s', 0):.0f} GB/s"
        prefill = f"prefill {r.get('prompt_len')}: {r.get('prefill_tok_s', 0):.0f} tok/s"
        if "prefill_peak_pct" in r:
            prefill += f" ({r['prefill_peak_pct']:.1f}% of GEMM {r.get('gemm_tflops', 0):.0f} TFLOP/s)"
        out.append(f"  b={r.get('batch')} kv={r.get('kv')}{' ' + settings if settings else ''}: {decode}); {prefill}")
    return out


section("forward_bench")
lines += forward_runs(read("forward_bench.txt") or "")

section("op profiles (the five costliest ops of each table)")
prof = read("profile.txt") or ""
take = 0
for l in prof.splitlines():
    if l.startswith("ops of") or l.startswith("model="):
        lines.append(l[:160])
        take = 7  # the table's header rows and five ops
    elif l.startswith("all ops"):
        lines.append("  " + l[:160])
    elif take > 0 and l.strip():
        lines.append("  " + l[:160])
        take -= 1

for name, title in (("kv_transfer.txt", "KV transfer"), ("throughput.txt", "throughput"),
                    ("disagg.txt", "TTFT with layer-wise overlap"), ("mixed.txt", "disaggregated vs combined"),
                    ("vs-llama.txt", "vs llama.cpp")):
    text = read(name)
    if not text:
        continue
    section(title)
    keep = [l for l in text.splitlines() if l.strip() and not l.startswith(("I ", "W ", "tandem      ", "transformers "))]
    lines += [l[:200] for l in keep[-40:]]

missing = read("missing-libs.txt")
if missing and missing.strip():
    section("missing libraries")
    lines.append(missing.strip())

# Sections with nothing under them (stages not run) are left out.
groups = [[]]
for l in lines:
    if l.startswith("== "):
        groups.append([l])
    elif l.strip():
        groups[-1].append(l)
text = "\n\n".join("\n".join(g) for g in groups if g and not (len(g) == 1 and g[0].startswith("== "))).strip() + "\n"
with open(os.path.join(out, "summary.txt"), "w") as f:
    f.write(text)
print(text, end="")
