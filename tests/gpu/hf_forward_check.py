#!/usr/bin/env python3
"""Tandem's CUDA forward pass on BF16 weights against Hugging Face transformers, on the GPU machine.

For every tiny preset: writes a random BF16 model (`tandem make-model`), then compares
  - prefill: Tandem's full distribution at every prompt position (`tandem generate --max-tokens 0
    --prompt-logprobs V`) with transformers' softmax over its logits at the same positions;
  - decode: the distribution of every greedy step (`--logprobs V`, through the decode graphs) with
    transformers' logits at those positions of the prompt followed by Tandem's tokens.
The oracle is transformers computing in float32 over the same BF16 weights (exactly upcast): the
function those weights define. It passes when, on every row, max |Δp| <= --tol (1e-2) and the top-5
token sets agree, except for tokens within --tol of the oracle's 5th probability (near-ties that
rounding may order either way). Also printed, not checked: Tandem against transformers computing in
BF16, and transformers' BF16 against its own float32, which says how far BF16 arithmetic itself
moves these small random models (on an H200, 2026-11-30: Tandem against transformers' BF16 up to
2e-2..4.6e-2, the reason the float32 oracle is the one checked).

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
ap.add_argument("--prompt-lens", default="7,64,700", help="prompt lengths (700 crosses 256-key attention splits)")
ap.add_argument("--greedy", type=int, default=16, help="greedy decode steps compared")
ap.add_argument("--seed", type=int, default=5)
ap.add_argument("--compute-dtype", default="auto",
                help="Tandem's --compute-dtype (f16: the BF16 weights cast to F16 at load, GEMM inputs rounded to "
                     "F16, 8x finer than BF16; on the CUDA emulator against the CPU backend, 2026-11-30, max |Δp| "
                     "1.3e-3..1.8e-3 where auto gave 9.2e-3..1.45e-2 at 700-token prompts)")
ap.add_argument("--split-gemm-inputs", action="store_true",
                help="Tandem's --split-gemm-inputs (GEMM inputs as two BF16 terms, about 16 significant bits: on the "
                     "CUDA emulator against the CPU backend, 2026-11-30, max |Δp| 1.5e-5..1.8e-5 at 700-token prompts)")
ap.add_argument("--kv-cache-dtype", default="f32",
                help="Tandem's KV cache (f32: the forward pass alone is checked; bf16 adds the cache's rounding)")
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


def load_hf(model_dir, dtype):
    kw = {"dtype": dtype} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": dtype}
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kw).to("cuda").eval()


def probs(model, ids):
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([ids], device="cuda")).logits[0].double(), dim=-1).cpu()


def main():
    os.makedirs(args.workdir, exist_ok=True)
    g = torch.Generator().manual_seed(args.seed)
    problems = []
    for preset in args.presets.split(","):
        model_dir = os.path.join(args.workdir, preset)
        tandem("make-model", "--preset", preset, "--dtype", "bf16", "--seed", "11", "--out", model_dir)
        vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
        hf32, hf16 = load_hf(model_dir, torch.float32), load_hf(model_dir, torch.bfloat16)
        torch.backends.cuda.matmul.allow_tf32 = False
        worst_prefill = worst_decode = worst_vs16 = worst_16vs32 = 0.0
        rows = 0
        info = []  # Tandem vs transformers' BF16: printed only
        for n in (int(x) for x in args.prompt_lens.split(",")):
            ids = torch.randint(0, vocab, (n,), generator=g).tolist()
            common = ["generate", "--model", model_dir, "--device", "cuda", "--token-ids", ",".join(map(str, ids)), "--json",
                      f"--kv-cache-dtype={args.kv_cache_dtype}", f"--compute-dtype={args.compute_dtype}",
                      f"--split-gemm-inputs={'true' if args.split_gemm_inputs else 'false'}"]
            pre = json.loads(tandem(*common, "--max-tokens", "0", "--prompt-logprobs", str(vocab)))
            dec = json.loads(tandem(*common, "--max-tokens", str(args.greedy), "--temperature", "0", "--ignore-eos",
                                    "--logprobs", str(vocab)))
            toks = dec["token_ids"]
            full = ids + toks
            ref, ref16 = probs(hf32, full), probs(hf16, full)
            worst_16vs32 = max(worst_16vs32, (ref16 - ref).abs().max().item())
            ours = [(f"prompt position {i}", dist_from_entry(pre["prompt_logprobs"][i], vocab), i - 1) for i in range(1, n)]
            ours += [(f"decode step {s}", dist_from_entry(e, vocab), n - 1 + s) for s, e in enumerate(dec["logprobs"])]
            for tag, dist, row in ours:
                dp = compare(f"{preset} n={n} {tag}", dist, ref[row], problems)
                if tag.startswith("prompt"):
                    worst_prefill = max(worst_prefill, dp)
                else:
                    worst_decode = max(worst_decode, dp)
                worst_vs16 = max(worst_vs16, compare("", dist, ref16[row], info))
                rows += 1
        split = ", --split-gemm-inputs" if args.split_gemm_inputs else ""
        print(f"{preset}: Tandem BF16 (--compute-dtype={args.compute_dtype}{split}) vs transformers {transformers.__version__} float32 on the same weights: max |Δp| "
              f"prefill {worst_prefill:.3g}, decode {worst_decode:.3g} over {rows} rows; not checked: Tandem vs "
              f"transformers BF16 {worst_vs16:.3g}, transformers BF16 vs float32 {worst_16vs32:.3g}", flush=True)
        del hf32, hf16
        torch.cuda.empty_cache()
    for p in problems[:50]:
        print("MISMATCH", p)
    print(f"hf_forward_check: {'PASSED' if not problems else f'FAILED ({len(problems)} mismatches)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
