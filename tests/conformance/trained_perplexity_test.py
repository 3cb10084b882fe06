#!/usr/bin/env python3
"""Tandem's held-out perplexity of a trained model against PyTorch's.

models/<name>/heldout_eval.json holds held-out windows of token ids and PyTorch's summed negative
log-likelihood of each (tools/train_models/train.py, float32 compute over the exported BF16
weights). Tandem evaluates the same windows (`tandem generate --max-tokens 0 --prompt-logprobs 0`:
the log-probability of every prompt token given its prefix); the perplexities must agree within 1%
and every window's NLL within 1%.

Usage: trained_perplexity_test.py TANDEM MODEL_DIR WORK_DIR
"""
import json
import math
import os
import subprocess
import sys
import tempfile

tandem, model, work = sys.argv[1:4]
ref = json.load(open(os.path.join(model, "heldout_eval.json")))
os.makedirs(work, exist_ok=True)
batch = os.path.join(work, "windows.jsonl")
with open(batch, "w") as f:
    for i, w in enumerate(ref["windows"]):
        f.write(json.dumps({"id": f"w{i}", "token_ids": w}) + "\n")
p = subprocess.run([tandem, "generate", "--model", model, "--batch-file", batch, "--max-tokens", "0",
                    "--prompt-logprobs", "0", "--temperature", "0", "--json"], capture_output=True, text=True,
                   timeout=1200)
if p.returncode != 0:
    sys.exit(f"tandem generate failed: {p.stderr}")
rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
failures = []
nll = []
for i, row in enumerate(rows):
    entries = row["prompt_logprobs"]
    if entries is None or len(entries) != len(ref["windows"][i]):
        failures.append(f"window {i}: {0 if entries is None else len(entries)} prompt logprobs")
        continue
    nll.append(-sum(e["logprob"] for e in entries[1:]))
    want = ref["nll"][i]
    if abs(nll[-1] - want) > 0.01 * abs(want):
        failures.append(f"window {i}: Tandem NLL {nll[-1]:.4f}, PyTorch {want:.4f}")
tokens = ref["tokens"]
ppl = math.exp(sum(nll) / tokens) if len(nll) == len(rows) else float("nan")
print(f"{os.path.basename(model.rstrip('/'))}: held-out perplexity Tandem {ppl:.4f}, PyTorch {ref['perplexity']:.4f} "
      f"({tokens} tokens, {len(rows)} windows; max window |ΔNLL|/NLL "
      f"{max(abs(a - b) / b for a, b in zip(nll, ref['nll'])) if nll else float('nan'):.2e})")
if not abs(ppl - ref["perplexity"]) <= 0.01 * ref["perplexity"]:
    failures.append(f"perplexity differs by more than 1%: {ppl} vs {ref['perplexity']}")
if failures:
    print("\n".join(failures[:20]))
    sys.exit(1)
