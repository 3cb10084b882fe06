#!/usr/bin/env python3
"""Top-1 agreement of the draft with the target on held-out text: the share of positions where
both models' most likely next token is the same (the ceiling of speculative decoding's acceptance
rate at temperature 0). Both models are evaluated by Tandem on the target's held-out windows.

Usage: agreement.py TANDEM TARGET_DIR DRAFT_DIR [WORK_DIR]
"""
import json
import os
import subprocess
import sys
import tempfile

tandem, target, draft = sys.argv[1:4]
work = sys.argv[4] if len(sys.argv) > 4 else tempfile.mkdtemp(prefix="tandem-agreement-")
windows = json.load(open(os.path.join(target, "heldout_eval.json")))["windows"]
batch = os.path.join(work, "windows.jsonl")
with open(batch, "w") as f:
    for i, w in enumerate(windows):
        f.write(json.dumps({"id": f"w{i}", "token_ids": w}) + "\n")


def top1(model):
    p = subprocess.run([tandem, "generate", "--model", model, "--batch-file", batch, "--max-tokens", "0",
                        "--prompt-logprobs", "1", "--temperature", "0", "--json"], capture_output=True, text=True,
                       check=True)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    # prompt_logprobs[i] is the distribution at position i given tokens 0..i-1; top[0] its argmax.
    return [[e["top"][0]["token_id"] for e in row["prompt_logprobs"][1:]] for row in rows]


a, b = top1(target), top1(draft)
same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
total = sum(len(r) for r in a)
truth = sum(x == w[i + 1] for ra, w in zip(a, windows) for i, x in enumerate(ra))
truth_draft = sum(x == w[i + 1] for rb, w in zip(b, windows) for i, x in enumerate(rb))
print(json.dumps({"positions": total, "top1_agreement": same / total, "target_top1_accuracy": truth / total,
                  "draft_top1_accuracy": truth_draft / total}))
