#!/usr/bin/env python3
"""Trains one Llama-architecture model on the tokenized corpus and exports it as a Hugging Face
directory: config.json, model.safetensors (BF16), tokenizer files, generation_config.json, a model
card (README.md) and heldout_eval.json — PyTorch's negative log-likelihood of held-out windows,
computed with the exported (BF16-rounded) weights, for Tandem's conformance test to match.

Deterministic given --seed on one machine (single-threaded data order; torch CPU kernels).

Usage: train.py --ids DIR --tokenizer DIR --out DIR --size target|draft [--steps N] [--max-minutes M]
"""
import argparse
import hashlib
import json
import math
import os
import random
import shutil
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Llama  # noqa: E402

SIZES = {
    # ~6.5M parameters (untied): the main model.
    "target": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=32, tie_word_embeddings=False),
    # ~1M parameters (tied embeddings): the speculative-decoding draft, same tokenizer.
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
}


def config_for(size, vocab, bos, eos):
    c = dict(SIZES[size])
    c.update(vocab_size=vocab, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
             bos_token_id=bos, eos_token_id=eos)
    return c


def hf_config(c):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16", **c}


def write_safetensors(path, tensors):
    """tensors: name → float tensor; written as BF16, sorted by name."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.bfloat16).contiguous()
        data = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def windows(ids, length):
    """Non-overlapping windows of `length` tokens."""
    return [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)]


@torch.no_grad()
def heldout_nll(model, wins):
    """Per window: summed NLL of tokens 1..n-1 given their prefix (token 0 has no prediction)."""
    model.eval()
    out = []
    for w in wins:
        x = torch.tensor([w])
        logp = F.log_softmax(model(x)[0, :-1].double(), dim=-1)
        out.append(-float(logp.gather(1, x[0, 1:].unsqueeze(1)).sum()))
    model.train()
    return out


def param_digest(model):
    """SHA-256 of every parameter's float32 bytes, in name order: the determinism witness."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


TRACE_EVERY = 100


def cpu_description():
    """The processor model and its widest vector extension: PyTorch's CPU kernels depend on both."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "unknown")
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    vec = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "no avx2"
    return f"{model} ({vec})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids", required=True, help="DIR with train.json and heldout.json token ids")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop early after this long (0 = no limit)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (same recipe, minutes)")
    ap.add_argument("--check-trace", metavar="FILE",
                    help="re-run the first --check-steps steps and compare the parameter digests recorded every "
                         f"{TRACE_EVERY} steps in FILE (a model's training_trace.json); exports nothing")
    ap.add_argument("--check-steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)

    tok = json.load(open(os.path.join(args.tokenizer, "tokenizer.json")))
    vocab = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    bos, eos = specials["<|begin_of_text|>"], specials["<|end_of_text|>"]
    train_ids = json.load(open(os.path.join(args.ids, "train.json")))
    held_ids = json.load(open(os.path.join(args.ids, "heldout.json")))
    train = torch.tensor(train_ids, dtype=torch.long)
    c = config_for(args.size, vocab, bos, eos)
    model = Llama(c).to(args.device)
    n_params = model.num_parameters()
    print(f"train {args.size}: {n_params / 1e6:.2f}M parameters, {len(train)} training tokens, "
          f"{args.threads} threads", file=sys.stderr)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)
    gen = torch.Generator().manual_seed(args.seed)
    expected = None
    if args.check_trace:
        traced = json.load(open(args.check_trace))
        expected = {int(k): v for k, v in traced["digests"].items()}
        if int(traced["steps"]) != args.steps:
            sys.exit("--steps must equal the traced run's steps (the learning-rate schedule depends on it)")
        if not any(k <= args.check_steps for k in expected):
            sys.exit(f"--check-steps {args.check_steps} reaches no recorded digest (every {TRACE_EVERY} steps)")
        args.check_steps = min(args.check_steps, max(expected))
        here = {"torch": torch.__version__, "threads": args.threads, "device": args.device, "cpu": cpu_description()}
    trace = {}
    t0 = time.time()
    step = 0
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, args.steps - warmup)))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([train[s:s + args.seq_len + 1] for s in starts.tolist()]).to(args.device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.time() - t0
        if step % TRACE_EVERY == 0:
            trace[step] = {"loss": round(loss.item(), 6), "params_sha256": param_digest(model)}
            if expected is not None:
                want = expected.get(step, {}).get("params_sha256")
                if want != trace[step]["params_sha256"]:
                    setting = "; ".join(f"{k}: traced {traced.get(k)!r}, here {v!r}" for k, v in here.items())
                    sys.exit(f"step {step}: parameters differ from the trace ({trace[step]['params_sha256']} vs "
                             f"{want}). {setting}")
                print(f"step {step}: parameters identical to the trace", file=sys.stderr)
                if step >= args.check_steps:
                    return
        if step % 50 == 0 or step == 1:
            print(f"step {step}/{args.steps} loss {loss.item():.3f} lr {lr:.2e} {elapsed / 60:.1f} min", file=sys.stderr)
        if args.max_minutes > 0 and elapsed > args.max_minutes * 60:
            print(f"stopping at step {step}: --max-minutes reached", file=sys.stderr)
            break

    # Export, then evaluate the exported BF16 weights (what every engine loads), on the CPU.
    model = model.cpu()
    os.makedirs(args.out, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items() if not (c["tie_word_embeddings"] and k == "lm_head.weight")}
    write_safetensors(os.path.join(args.out, "model.safetensors"), state)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    wins = windows(held_ids, args.seq_len)[:args.eval_windows]
    nll = heldout_nll(model, wins)
    tokens = sum(len(w) - 1 for w in wins)
    ppl = math.exp(sum(nll) / tokens)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": True, "temperature": 0.8, "top_p": 0.95}, f,
                  indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    with open(os.path.join(args.out, "training_trace.json"), "w") as f:
        json.dump({"size": args.size, "steps": args.steps, "steps_run": step, "batch": args.batch,
                   "seq_len": args.seq_len, "lr": args.lr, "seed": args.seed, "threads": args.threads,
                   "device": args.device, "cpu": cpu_description(),
                   "torch": torch.__version__, "digests": trace}, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "heldout_eval.json"), "w") as f:
        json.dump({"reference": f"PyTorch {torch.__version__}, float32 compute over the BF16 weights",
                   "windows": wins, "nll": nll, "tokens": tokens, "perplexity": ppl}, f)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(f"""# kjv-{args.size}

A {'target' if args.size == 'target' else 'speculative-decoding draft'} model for Tandem's tests and demos: Llama
architecture, {n_params / 1e6:.2f}M parameters ({c['num_hidden_layers']} layers, hidden {c['hidden_size']},
{c['num_attention_heads']} heads / {c['num_key_value_heads']} KV heads of {c['head_dim']}, SwiGLU {c['intermediate_size']},
{'tied' if c['tie_word_embeddings'] else 'untied'} embeddings), BF16 weights, context 1024.

- Data: the King James Bible (Debian packages bible-kjv, bible-kjv-text; public domain), every 20th
  chapter held out ({len(train_ids)} training tokens).
- Tokenizer: byte-level BPE with {vocab} tokens trained on the training chapters (tools/train_models/bpe.py).
- Training: {step} steps of {args.batch} × {args.seq_len} tokens, AdamW (lr {args.lr}, cosine, weight decay 0.1),
  seed {args.seed}, PyTorch {torch.__version__} on {args.device} ({(time.time() - t0) / 60:.1f} min).
- Held-out perplexity: **{ppl:.2f}** over {tokens} tokens ({len(wins)} windows of {args.seq_len}), PyTorch on the
  exported BF16 weights (heldout_eval.json holds the per-window values Tandem is tested against).

Made by `tools/train_models/train_all.sh`; not a model for any other purpose.
""")
    print(f"exported {args.out}: held-out perplexity {ppl:.3f} over {tokens} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
