#!/usr/bin/env python3
"""Tandem's CUDA forward pass against Hugging Face transformers in BF16, on the GPU machine.

For every tiny preset: writes a random BF16 model (`tandem make-model`), then compares
  - prefill: Tandem's full distribution at every prompt position (`tandem generate --max-tokens 0
    --prompt-logprobs V`) with transformers' softmax over its logits at the same positions;
  - decode: the distribution of every greedy step (`--logprobs V`, through the decode graphs) with
    transformers' logits at those positions of the prompt followed by Tandem's tokens.
Both run BF16 weights on the GPU. It passes when, on every row, max |Δp| <= --tol (1e-2) and the
top-5 token sets agree, except for tokens within --tol of transformers' 5th probability (near-ties
that rounding may order either way).

  python3 tests/gpu/hf_forward_check.py TANDEM_BINARY [--presets tiny-llama,...] [--workdir DIR]
Exit status 0 pass, 1 a mismatch (each listed), 2 bad usage or a failed run.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("tandem")
ap.add_argument("--presets", default="tiny-llama,tiny-mistral,tiny-qwen2,tiny-qwen3")
ap.add_argument("--workdir", default="/tmp/tandem-hf-check")
ap.add_argument("--tol", type=float, default=1e-2)
ap.add_argument("--prompt-lens", default="7,64,700", help="prompt lengths (700 crosses a 512-key attention split)")
ap.add_argument("--greedy", type=int, default=16, help="greedy decode steps compared")
ap.add_argument("--seed", type=int, default=5)
args = ap.parse_args()


def tandem(*flags):
    r = subprocess.run([args.tandem, *flags], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"hf_forward_check: tandem {' '.join(flags[:1])} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def dist_from_entry(entry, vocab):
    """Tandem's distribution from one logprobs entry listing every token."""
    p = torch.zeros(vocab, dtype=torch.float64)
    for t in entry["top"]:
        p[t["token_id"]] = float(torch.tensor(t["logprob"], dtype=torch.float64).exp())
    return p


def compare(tag, ours, ref, problems):
    """ours, ref: [vocab] float64 probabilities. Returns max |Δp|."""
    dp = (ours - ref).abs().max().item()
    if dp > args.tol:
        problems.append(f"{tag}: max |Δp| {dp:.3g} > {args.tol}")
    top_ref = torch.topk(ref, 6)
    fifth = top_ref.values[4].item()
    a, b = set(torch.topk(ours, 5).indices.tolist()), set(top_ref.indices[:5].tolist())
    for t in a ^ b:
        if abs(ref[t].item() - fifth) > args.tol:
            problems.append(f"{tag}: top-5 differ at token {t} (p {ref[t].item():.4f} vs 5th {fifth:.4f})")
    return dp


def load_hf(model_dir):
    kw = {"dtype": torch.bfloat16} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.bfloat16}
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kw).to("cuda").eval()


def main():
    os.makedirs(args.workdir, exist_ok=True)
    g = torch.Generator().manual_seed(args.seed)
    problems = []
    for preset in args.presets.split(","):
        model_dir = os.path.join(args.workdir, preset)
        tandem("make-model", "--preset", preset, "--dtype", "bf16", "--seed", "11", "--out", model_dir)
        vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
        hf = load_hf(model_dir)
        worst_prefill = worst_decode = 0.0
        rows = 0
        for n in (int(x) for x in args.prompt_lens.split(",")):
            ids = torch.randint(0, vocab, (n,), generator=g).tolist()
            common = ["generate", "--model", model_dir, "--device", "cuda", "--token-ids", ",".join(map(str, ids)), "--json"]
            pre = json.loads(tandem(*common, "--max-tokens", "0", "--prompt-logprobs", str(vocab)))
            dec = json.loads(tandem(*common, "--max-tokens", str(args.greedy), "--temperature", "0", "--ignore-eos",
                                    "--logprobs", str(vocab)))
            toks = dec["token_ids"]
            full = ids + toks
            with torch.no_grad():
                logits = hf(torch.tensor([full], device="cuda")).logits[0].double()
            ref = torch.softmax(logits, dim=-1).cpu()
            for i in range(1, n):
                worst_prefill = max(worst_prefill, compare(f"{preset} n={n} prompt position {i}",
                                                           dist_from_entry(pre["prompt_logprobs"][i], vocab), ref[i - 1], problems))
                rows += 1
            for s, entry in enumerate(dec["logprobs"]):
                worst_decode = max(worst_decode, compare(f"{preset} n={n} decode step {s}",
                                                         dist_from_entry(entry, vocab), ref[n - 1 + s], problems))
                rows += 1
        print(f"{preset} BF16 vs transformers {transformers.__version__}: max |Δp| prefill {worst_prefill:.3g}, "
              f"decode {worst_decode:.3g} over {rows} rows", flush=True)
        del hf
        torch.cuda.empty_cache()
    for p in problems[:50]:
        print("MISMATCH", p)
    print(f"hf_forward_check: {'PASSED' if not problems else f'FAILED ({len(problems)} mismatches)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
