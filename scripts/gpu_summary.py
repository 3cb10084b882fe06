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
for log in ("cuda_smoke.log", "cuda_backend.log", "nccl_link.log", "cuda_ipc_link.log"):
    text = read(log)
    if text is None:
        continue
    failed = sorted(set(re.findall(r"^\[  FAILED  \] (\S+)", text, re.M)))
    verdicts = re.findall(r"^(\[  PASSED  \].*|SKIPPED.*)$", text, re.M)
    tail = verdicts[-1] if verdicts else (text.strip().splitlines()[-1] if text.strip() else "(empty)")
    lines.append(f"{log}: " + ("FAILED " + ", ".join(failed) if failed else tail))
    for m in re.findall(r"^abandoned rendezvous.*$|^the same 3 rounds.*$", text, re.M):
        lines.append(f"  {m}")
for log in ("hf_forward_check.log", "hf_forward_check_f16.log", "hf_forward_check_split.log", "hf_forward_check_tc.log"):
    hf = read(log)
    if hf:
        lines += [f"{log[:-4]}: {l}" for l in hf.strip().splitlines()[-4:]]
checks = read("checks.txt")
if checks:
    lines += [l for l in checks.strip().splitlines()]
for log, what in (("e2e-cuda-nccl.log", "NCCL"), ("e2e-cuda-ipc.log", "CUDA IPC")):
    e2e = read(log)
    if e2e:
        ok = re.findall(r"^\[       OK \] (\S+)", e2e, re.M)
        bad = sorted(set(re.findall(r"^\[  FAILED  \] (\S+)", e2e, re.M)))
        lines.append(f"e2e on CUDA + {what}: {len(ok)} passed, {len(bad)} failed{': ' + ', '.join(bad) if bad else ''}")

plan = [l for f in sorted(glob.glob(os.path.join(out, "generate-cuda*.err")))
        for l in open(f, errors="replace").read().splitlines() if "memory plan" in l]
if plan:
    section("memory plan (tandem generate --device cuda)")
    lines += [l[l.find("memory plan"):][:220] for l in plan[:2]]



# forward_bench's settings at their defaults (a record's 0 for gemv_columns or grid_split_keys is the backend's default).
DEFAULTS = {"kv_cache_dtype": "auto", "compute_dtype": "auto", "split_gemm_inputs": False, "graphs": True, "sampling": "argmax", "fusion": True, "gemv_norm": True,
            "gemv_heads": True, "gemv_columns": 1, "grid_split_keys": 256, "pdl": False, "tc_attention": False}


def num(r, key):
    """A figure of a record, 0 when it is missing or not a number (NaN is written as null)."""
    v = r.get(key)
    return v if isinstance(v, (int, float)) and v == v else 0


def records(text):
    """forward_bench's closing `json:` records, in order; a line that does not parse is None."""
    out = []
    for l in text.splitlines():
        if not l.startswith("json: "):
            continue
        try:
            r = json.loads(l[len("json: "):])
            r["gemv_columns"] = r.get("gemv_columns") or 1
            r["grid_split_keys"] = r.get("grid_split_keys") or 256
            out.append(r)
        except (ValueError, AttributeError, TypeError):
            out.append(None)
    return out


def tunings(r):
    return {k: r[k] for k, v in DEFAULTS.items() if r.get(k, v) != v}


def forward_runs(text):
    """One line a forward_bench run; errors as they were printed."""
    out, model = [], None
    recs = iter(records(text))
    for l in text.splitlines():
        if l.startswith("forward_bench:") or l.startswith("graphs failed"):
            out.append("  " + l[:200])
        if not l.startswith("json: "):
            continue
        r = next(recs)
        if r is None:
            out.append("  (unreadable record) " + l[:150])
            continue
        if r.get("model") != model:
            model = r.get("model")
            out.append(f"{os.path.basename(str(model))} ({r.get('arch')})")
        settings = " ".join(f"{k}={v}" for k, v in tunings(r).items())
        decode = f"decode {num(r, 'decode_ms'):.2f} ms/step ({num(r, 'decode_tok_s'):.0f} tok/s"
        if "decode_roofline_pct" in r:
            decode += f", {num(r, 'decode_roofline_pct'):.1f}% of copy {num(r, 'copy_gb_s'):.0f} GB/s"
        prefill = f"prefill {r.get('prompt_len')}: {num(r, 'prefill_tok_s'):.0f} tok/s"
        if "prefill_peak_pct" in r:
            prefill += f" ({num(r, 'prefill_peak_pct'):.1f}% of GEMM {num(r, 'gemm_tflops'):.0f} TFLOP/s)"
        out.append(f"  b={r.get('batch')} kv={r.get('kv')}{' ' + settings if settings else ''}: {decode}); {prefill}")
    return out


def side_by_side(text):
    """Each tuning against the first run with the defaults on the same model, batch and prompt: the
    ratio of decode step times and of prefill rates (below 1 and above 1, respectively, favour the
    tuning), which is what flipping a default is decided on."""
    recs = [r for r in records(text) if r is not None]
    where = lambda r: (r.get("model"), r.get("batch"), r.get("prompt_len"))
    base = {}
    for r in recs:
        if not tunings(r):
            base.setdefault(where(r), r)
    out = []
    for r in recs:
        b = base.get(where(r))
        if b is None or b is r or not num(b, "decode_ms") or not num(b, "prefill_tok_s"):
            continue
        tuned = tunings(r)
        if not tuned:
            continue
        out.append(f"  {os.path.basename(str(r.get('model')))} b={r.get('batch')} prompt {r.get('prompt_len')} "
                   f"{' '.join(f'{k}={v}' for k, v in tuned.items())}: decode x{num(r, 'decode_ms') / num(b, 'decode_ms'):.3f}, "
                   f"prefill x{num(r, 'prefill_tok_s') / num(b, 'prefill_tok_s'):.3f} of the defaults'")
    return out


section("forward_bench")
fb = read("forward_bench.txt") or ""
lines += forward_runs(fb)
section("tunings side by side (decode time ratio < 1 and prefill rate ratio > 1 favour the tuning)")
lines += side_by_side(fb)

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
