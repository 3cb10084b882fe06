#!/usr/bin/env python3
"""End-to-end checks of the `tandem` command: make-model output, generate's JSON contract, seeded
determinism, chunked prefill, and clear errors with exit code 2 for bad input.

Usage: cli_test.py PATH_TO_TANDEM WORK_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

TANDEM, WORK = sys.argv[1], sys.argv[2]
failures = []


def run(*args, expect_rc=0):
    p = subprocess.run([TANDEM, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != expect_rc:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, expected {expect_rc}\n{p.stderr}")
    return p


def check(cond, what):
    if not cond:
        failures.append(what)


shutil.rmtree(WORK, ignore_errors=True)
model = os.path.join(WORK, "tiny-qwen2")
run("make-model", "--preset", "tiny-qwen2", "--out", model, "--seed", "5")
for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json"]:
    check(os.path.exists(os.path.join(model, f)), f"make-model did not write {f}")
config = json.load(open(os.path.join(model, "config.json")))
check(config["architectures"] == ["Qwen2ForCausalLM"], "config.json architecture")
check(config["tie_word_embeddings"] is True, "tiny-qwen2 is tied")

# Same seed → same bytes.
model2 = os.path.join(WORK, "tiny-qwen2-again")
run("make-model", "--preset", "tiny-qwen2", "--out", model2, "--seed", "5")
check(open(os.path.join(model, "model.safetensors"), "rb").read()
      == open(os.path.join(model2, "model.safetensors"), "rb").read(), "make-model is not deterministic")


def generate(*extra):
    p = run("generate", "--model", model, "--json", *extra)
    return json.loads(p.stdout) if p.returncode == 0 else None


ids = "3,14,15,92,65,35,89,79,32,38,46"
a = generate("--token-ids", ids, "--max-tokens", "12", "--temperature", "0.8", "--seed", "42",
             "--logprobs", "3", "--prompt-logprobs", "2")
b = generate("--token-ids", ids, "--max-tokens", "12", "--temperature", "0.8", "--seed", "42",
             "--prefill-chunk", "4", "--block-size", "4")
if a and b:
    check(a["prompt_token_ids"] == [int(x) for x in ids.split(",")], "prompt_token_ids echo")
    check(len(a["token_ids"]) == 12 and a["finish_reason"] == "length", "12 tokens, finish length")
    check(a["token_ids"] == b["token_ids"], f"seeded sampling differs with chunked prefill: {a['token_ids']} vs {b['token_ids']}")
    check(a["prompt_logprobs"][0] is None and len(a["prompt_logprobs"]) == 11, "prompt_logprobs shape")
    for i, e in enumerate(a["prompt_logprobs"][1:], start=1):
        check(e["token_id"] == int(ids.split(",")[i]), f"prompt_logprobs[{i}] token")
        check(len(e["top"]) == 2 and e["top"][0]["logprob"] >= e["top"][1]["logprob"], "top sorted")
        check(e["rank"] >= 1 and e["logprob"] <= e["top"][0]["logprob"] + 1e-6, "rank/logprob")
    check(len(a["logprobs"]) == 12 and all(len(e["top"]) == 3 for e in a["logprobs"]), "logprobs shape")
    check(b["logprobs"] is None and b["prompt_logprobs"] is None, "logprobs null when not asked")
    for e in a["logprobs"]:
        check(math.exp(e["logprob"]) <= 1.0 + 1e-6, "probability <= 1")
# The random models are peaked (logit std ~4); a high temperature makes seeds matter.
hot = [generate("--token-ids", ids, "--max-tokens", "12", "--temperature", "3", "--seed", s)
       for s in ("42", "42", "43")]
if all(hot):
    check(hot[0]["token_ids"] == hot[1]["token_ids"], "same seed gave different samples")
    check(hot[0]["token_ids"] != hot[2]["token_ids"], "different seeds gave identical samples")
z = generate("--token-ids", ids, "--max-tokens", "0")
if z:
    check(z["token_ids"] == [] and z["text"] == "", "--max-tokens 0 evaluates the prompt only")
t = generate("--prompt", "Hello", "--max-tokens", "3", "--seed", "1")
p = run("tokenize", "--model", model, "--text", "Hello", "--add-special-tokens", "--json")
if t and p.returncode == 0:
    check(t["prompt_token_ids"] == json.loads(p.stdout)["ids"],
          f"text prompt: {t['prompt_token_ids']} is not Encode('Hello', add_special_tokens=True)")
# The streamed text (incremental detokenization) is the prompt followed by the JSON "text".
streamed = run("generate", "--model", model, "--prompt", "Hello", "--max-tokens", "12",
               "--temperature", "0")
g = generate("--prompt", "Hello", "--max-tokens", "12", "--temperature", "0")
if g and streamed.returncode == 0:
    check(streamed.stdout == "Hello" + g["text"] + "\n",
          f"streamed {streamed.stdout!r} != 'Hello' + {g['text']!r}")
# Without tokenizer.json, --prompt fails naming it and --token-ids still works.
bare = os.path.join(WORK, "no-tokenizer")
os.makedirs(bare, exist_ok=True)
for f in ["config.json", "model.safetensors", "generation_config.json"]:
    shutil.copy(os.path.join(model, f), bare)
p = run("generate", "--model", bare, "--prompt", "Hello", "--max-tokens", "1", expect_rc=1)
check("tokenizer.json" in p.stderr, f"missing tokenizer.json not named: {p.stderr!r}")
p = run("generate", "--model", bare, "--token-ids", "1,2", "--max-tokens", "2", "--json")
if p.returncode == 0:
    check(len(json.loads(p.stdout)["token_ids"]) == 2, "--token-ids without tokenizer.json")


# tokenize / detokenize: round trips (a model directory or the tokenizer.json file itself).
def tokenize(text, *extra, path=model):
    p = run("tokenize", "--model", path, "--text", text, "--json", *extra)
    return json.loads(p.stdout)["ids"] if p.returncode == 0 else None


texts = ["Hello, world!", " leading space", "naïve café", "日本語🙂", "tabs\tand\nnewlines"]
for text in texts:
    ids = tokenize(text)
    if ids is None:
        continue
    check(ids == tokenize(text, path=os.path.join(model, "tokenizer.json")),
          "tokenize: directory and tokenizer.json file disagree")
    plain = run("tokenize", "--model", model, "--text", text).stdout.strip()
    check(plain == ",".join(map(str, ids)), f"tokenize plain output {plain!r}")
    p = run("detokenize", "--model", model, "--ids", ",".join(map(str, ids)), "--json")
    if p.returncode == 0:
        check(json.loads(p.stdout)["text"] == text, f"round trip of {text!r}: {p.stdout!r}")
    p = run("detokenize", "--model", model, "--ids", ",".join(map(str, ids)))
    check(p.stdout == text + "\n", f"detokenize plain output {p.stdout!r}")

text_file = os.path.join(WORK, "text.txt")
with open(text_file, "w") as f:
    f.write(texts[-1])
p = run("tokenize", "--model", model, "--file", text_file, "--json")
if p.returncode == 0:
    check(json.loads(p.stdout)["ids"] == tokenize(texts[-1]), "tokenize --file differs from --text")

# --jsonl: one line out per line in, in order; "stream" (incremental) equals "text".
texts_file = os.path.join(WORK, "texts.jsonl")
with open(texts_file, "w") as f:
    for text in texts:
        f.write(json.dumps(text) + "\n")
p = run("tokenize", "--model", model, "--jsonl", texts_file)
if p.returncode == 0:
    lines = [json.loads(line)["ids"] for line in p.stdout.splitlines()]
    check(lines == [tokenize(text) for text in texts], "tokenize --jsonl differs from --text")
bos, eos = config["bos_token_id"], config["eos_token_id"]
id_lists = [[72, 105], [230, 151, 165, 230], [bos, 72, eos], [255, 104, 240, 159, 153, 130], []]
ids_file = os.path.join(WORK, "ids.jsonl")
with open(ids_file, "w") as f:
    for ids in id_lists:
        f.write(json.dumps(ids) + "\n")
for skip in [False, True]:
    p = run("detokenize", "--model", model, "--jsonl", ids_file,
            *(["--skip-special-tokens"] if skip else []))
    if p.returncode != 0:
        continue
    out = [json.loads(line) for line in p.stdout.splitlines()]
    check(len(out) == len(id_lists), "detokenize --jsonl: one line per input")
    for ids, o in zip(id_lists, out):
        check(o["stream"] == o["text"], f"{ids}: stream {o['stream']!r} != text {o['text']!r}")
    expected = ["Hi", "日\ufffd", "H" if skip else "<|begin_of_text|>H<|end_of_text|>",
                "\ufffdh🙂", ""]
    check([o["text"] for o in out] == expected,
          f"detokenize --jsonl skip_special_tokens={skip}: {[o['text'] for o in out]}")

# --batch-file: all requests submitted together through the engine; greedy outputs equal the
# same requests run one by one, whatever the batching (small budget, chunks and pool force
# chunked prefill and preemption).
batch = os.path.join(WORK, "batch.jsonl")
lines = [{"id": f"b{i}", "token_ids": [(7 * i + k) % 500 for k in range(3 + 5 * i)], "max_tokens": 4 + i}
         for i in range(8)]
lines.append({"id": "text", "prompt": "Hello, world", "max_tokens": 6})
with open(batch, "w") as f:
    for line in lines:
        f.write(json.dumps(line) + "\n")
p = run("generate", "--model", model, "--batch-file", batch, "--temperature", "0", "--ignore-eos",
        "--max-num-batched-tokens", "16", "--max-prefill-chunk", "8", "--block-size", "4",
        "--kv-cache-memory", "256K")
if p.returncode == 0:
    results = [json.loads(l) for l in p.stdout.splitlines()]
    check([r["id"] for r in results] == [l["id"] for l in lines], "batch output order follows the file")
    check("requests/s" in p.stderr and "preemptions" in p.stderr, f"batch summary on stderr: {p.stderr!r}")
    for r, line in zip(results, lines):
        check(len(r["token_ids"]) == line["max_tokens"], f"{r['id']}: {len(r['token_ids'])} tokens")
        args = ["--token-ids", ",".join(map(str, line["token_ids"]))] if "token_ids" in line else ["--prompt", line["prompt"]]
        alone = generate(*args, "--max-tokens", str(line["max_tokens"]), "--temperature", "0", "--ignore-eos")
        if alone:
            check(alone["token_ids"] == r["token_ids"], f"{r['id']}: batched {r['token_ids']} != alone {alone['token_ids']}")
            check(alone["text"] == r["text"], f"{r['id']}: text differs")
# Stop strings in-process (--stop, a batch line's "stop"): the same matcher as the router's. The text
# ends before the first match, finish_reason is "stop", and the ids are a prefix of the unstopped run's.
# (On the trained model, whose greedy text is words, not one repeated byte.)
kjv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "kjv-target")
prompt = "And God said"


def generate_kjv(*extra):
    p = run("generate", "--model", kjv, "--json", "--prompt", prompt, "--temperature", "0", "--ignore-eos", *extra)
    return json.loads(p.stdout) if p.returncode == 0 else None


full = generate_kjv("--max-tokens", "24")
if full:
    text = full["text"]
    stop = next((text[p:p + 2] for p in range(len(text) // 3, len(text) - 2)
                 if text.find(text[p:p + 2]) == p and text[p:p + 2].isprintable()
                 and "," not in text[p:p + 2] and "\ufffd" not in text[p:p + 2]), None)
    check(stop is not None, f"no usable stop string in {text!r}")
    if stop:
        cut = generate_kjv("--max-tokens", "24", "--stop", stop)
        if cut:
            check(cut["text"] == text[:text.find(stop)], f"--stop {stop!r}: text {cut['text']!r} of {text!r}")
            check(cut["finish_reason"] == "stop", f"--stop: finish_reason {cut['finish_reason']}")
            n = len(cut["token_ids"])
            check(0 < n < len(full["token_ids"]) and cut["token_ids"] == full["token_ids"][:n],
                  f"--stop: ids {cut['token_ids']} are not a shorter prefix of {full['token_ids']}")
            stop_batch = os.path.join(WORK, "stop.jsonl")
            with open(stop_batch, "w") as f:
                f.write(json.dumps({"id": "s", "prompt": prompt, "max_tokens": 24, "stop": [stop]}) + "\n")
                f.write(json.dumps({"id": "bad", "prompt": prompt, "max_tokens": 2, "stop": [""]}) + "\n")
                f.write(json.dumps({"id": "plain", "prompt": prompt, "max_tokens": 24}) + "\n")
            p = run("generate", "--model", kjv, "--batch-file", stop_batch, "--temperature", "0", "--ignore-eos")
            if p.returncode == 0:
                rs = {r["id"]: r for r in map(json.loads, p.stdout.splitlines())}
                check(rs["s"]["text"] == cut["text"] and rs["s"]["token_ids"] == cut["token_ids"]
                      and rs["s"]["finish_reason"] == "stop", f"batch line's stop: {rs['s']}")
                check(rs["bad"]["finish_reason"] == "refused" and "stop[0] is empty" in p.stderr,
                      f"a batch line with a bad stop is refused by itself: {rs['bad']}, {p.stderr!r}")
                check(rs["plain"]["text"] == text and rs["plain"]["finish_reason"] == "length",
                      f"a batch line without stop is not cut: {rs['plain']}")
# Speculative decoding (n-gram proposals, k = 1, 4, 8): the same greedy tokens and stop cut, with the
# request's counts in "speculation"; none without it.
long_full = generate_kjv("--max-tokens", "80")
if long_full:
    check("speculation" not in long_full, f"no speculation asked, yet counts: {long_full.get('speculation')}")
    for k in ["1", "4", "8"]:
        spec = generate_kjv("--max-tokens", "80", "--speculative-method", "ngram", "--num-speculative-tokens", k)
        if spec:
            check(spec["token_ids"] == long_full["token_ids"], f"ngram k={k}: greedy tokens differ")
            counts = spec.get("speculation", {})
            check(0 < counts.get("accepted", 0) <= counts.get("proposed", 0),
                  f"ngram k={k}: counts {counts}")
    kjv_draft = os.path.join(os.path.dirname(kjv), "kjv-draft")
    for k in ["2", "5"]:
        spec = generate_kjv("--max-tokens", "80", "--speculative-model", kjv_draft, "--num-speculative-tokens", k)
        if spec:
            check(spec["token_ids"] == long_full["token_ids"], f"kjv-draft k={k}: greedy tokens differ")
            counts = spec.get("speculation", {})
            check(0 < counts.get("accepted", 0) <= counts.get("proposed", 0), f"kjv-draft k={k}: counts {counts}")
    if full and stop:
        spec_cut = generate_kjv("--max-tokens", "24", "--stop", stop, "--speculative-method", "ngram",
                                "--num-speculative-tokens", "8")
        if spec_cut and cut:
            check(spec_cut["token_ids"] == cut["token_ids"] and spec_cut["text"] == cut["text"],
                  f"--stop with speculation: {spec_cut['token_ids']} vs {cut['token_ids']}")
for bad, named in [(["--speculative-method", "medusa"], "--speculative-method"),
                   (["--speculative-method", "ngram", "--num-speculative-tokens", "17"], "--num-speculative-tokens"),
                   (["--speculative-method", "ngram", "--ngram-min", "3", "--ngram-max", "2"], "--ngram-min"),
                   (["--speculative-method", "draft"], "--speculative-model"),
                   (["--speculative-model", kjv], "tokenizer")]:
    p = run("generate", "--model", model, "--prompt", "Hi", *bad, expect_rc=2)
    check(named in p.stderr, f"{bad}: the error names {named}: {p.stderr!r}")
# --quantization: the trained target quantized on load still writes its text, and says how much
# smaller it got; a value that is not a type is refused naming the flag.
for q in ("int8", "int4"):
    p = run("generate", "--model", kjv, "--json", "--prompt", prompt, "--temperature", "0", "--ignore-eos",
            "--max-tokens", "24", "--quantization", q)
    if p.returncode == 0 and full:
        out = json.loads(p.stdout)
        check(len(out["token_ids"]) == 24, f"--quantization {q}: 24 tokens")
        check(f"to {q} on load" in p.stderr and "bytes as stored ->" in p.stderr,
              f"--quantization {q} logs the bytes before and after: {p.stderr!r}")
        if q == "int8":
            # Per-channel int8 keeps this model's greedy choices for the first tokens.
            check(out["token_ids"][:8] == full["token_ids"][:8],
                  f"int8 greedy start {out['token_ids'][:8]} vs {full['token_ids'][:8]}")
p = run("generate", "--model", model, "--prompt", "Hi", "--quantization", "int3", expect_rc=2)
check("--quantization" in p.stderr, f"bad --quantization named: {p.stderr!r}")
p = run("generate", "--model", model, "--prompt", "Hi", "--quantize-lm-head", expect_rc=2)
check("--quantize-lm-head needs --quantization" in p.stderr, f"--quantize-lm-head alone refused: {p.stderr!r}")

# tandem eval on the trained target's held-out windows: unquantized, its perplexity is PyTorch's
# (heldout_eval.json, computed by the training code); quantized, close to it, with agreement and KL
# against the unquantized model.
heldout = os.path.join(kjv, "heldout_eval.json")
torch_ppl = json.load(open(heldout))["perplexity"]


def evaluate(*extra):
    p = run("eval", "--model", kjv, "--windows-file", heldout, "--json", "--progress=false", *extra)
    return json.loads(p.stdout) if p.returncode == 0 else None


plain = evaluate()
if plain:
    check(abs(plain["perplexity"] / torch_ppl - 1) < 1e-4, f"eval perplexity {plain['perplexity']} vs PyTorch {torch_ppl}")
    check(plain["tokens"] == 64 * 127, f"eval scored {plain['tokens']} tokens")
    check(plain["top1_agreement"] is None and plain["mean_kl"] is None, "no reference without a change")
for q, ppl_bound, top1_bound in (("int8", 1.005, 0.98), ("int4", 1.03, 0.9)):
    r = evaluate("--quantization", q)
    if r and plain:
        check(r["reference_perplexity"] == plain["perplexity"], f"{q}: reference is the unquantized model")
        check(r["perplexity"] <= plain["perplexity"] * ppl_bound, f"{q}: perplexity {r['perplexity']} vs {plain['perplexity']}")
        check(top1_bound <= r["top1_agreement"] < 1, f"{q}: top-1 agreement {r['top1_agreement']}")
        check(0 < r["mean_kl"] < 0.05, f"{q}: mean KL {r['mean_kl']}")
# --activation-dtype int8 (W8A8 / W4A8): close to the weight-only path's quality.
for q, kl_bound in (("int8", 1e-3), ("int4", 2e-2)):
    r = evaluate("--quantization", q, "--activation-dtype", "int8")
    if r:
        check(r["mean_kl"] < kl_bound and r["top1_agreement"] >= 0.9, f"eval {q} with int8 activations: {r}")
# --activation-dtype bf16 (BF16 weights' activations rounded to BF16): judged against f32
# activations, close but not identical.
r = evaluate("--activation-dtype", "bf16")
if r and plain:
    check(r["activation_dtype"] == "bf16" and r["reference_perplexity"] == plain["perplexity"],
          f"eval bf16 activations: the reference is the f32 path: {r}")
    check(0 < r["mean_kl"] < 1e-4 and r["top1_agreement"] >= 0.99, f"eval bf16 activations: {r}")
# --quantize-lm-head: the LM head quantized too costs a little more quality, and the plan counts it.
r = evaluate("--quantization", "int8", "--quantize-lm-head")
if r:
    check(r["quantize_lm_head"] and r["top1_agreement"] >= 0.98 and 0 < r["mean_kl"] < 1e-3,
          f"eval int8 with the LM head quantized: {r}")
p = run("plan", "--model", kjv, "--memory", "1G", "--quantization", "int8", "--quantize-lm-head", "--json")
q = run("plan", "--model", kjv, "--memory", "1G", "--quantization", "int8", "--json")
if p.returncode == 0 and q.returncode == 0:
    head, plain_plan = json.loads(p.stdout), json.loads(q.stdout)
    check(head["quantize_lm_head"] and head["weight_bytes"] != plain_plan["weight_bytes"],
          f"plan --quantize-lm-head: {head['weight_bytes']} vs {plain_plan['weight_bytes']}")
p = run("generate", "--model", kjv, "--prompt", "x", "--activation-dtype", "int4", expect_rc=2)
check("--activation-dtype" in p.stderr, f"bad --activation-dtype named: {p.stderr!r}")
p = run("generate", "--model", kjv, "--prompt", "x", "--device", "cuda", "--activation-dtype", "int8",
        expect_rc=2)
check("--device cpu" in p.stderr, f"--activation-dtype int8 on cuda refused: {p.stderr!r}")
# An int8 KV cache (a scale per token and head): close to the f32 cache's predictions, and
# `tandem plan` counts its bytes (kjv-target: 2 x 6 layers x 4 KV heads x (32 + a 4-byte scale)).
r = evaluate("--kv-cache-dtype", "int8")
if r:
    check(r["kv_cache_dtype"] == "I8" and r["top1_agreement"] >= 0.99 and r["mean_kl"] < 1e-4,
          f"eval --kv-cache-dtype int8: {r}")
p = run("plan", "--model", kjv, "--memory", "1G", "--kv-cache-dtype", "int8", "--json")
if p.returncode == 0:
    check(json.loads(p.stdout)["kv_bytes_per_token"] == 2 * 6 * 4 * 36, f"plan with int8 KV: {p.stdout}")
# A text file: tokenized with BOS, windows overlapping by one token.
text_file = os.path.join(WORK, "eval.txt")
with open(text_file, "w") as f:
    f.write("In the beginning God created the heaven and the earth.\n" * 12)
r = run("eval", "--model", kjv, "--text-file", text_file, "--context", "32", "--json", "--reference-model",
        os.path.join(os.path.dirname(kjv), "kjv-draft"))
if r.returncode == 0:
    j = json.loads(r.stdout)
    check(j["context"] == 32 and j["tokens"] > 32 and 0 <= j["top1_agreement"] <= 1, f"eval --text-file: {j}")
    check("eval [" in r.stderr and "100%" in r.stderr, f"eval draws a progress bar: {r.stderr[-200:]!r}")
bad_windows = os.path.join(WORK, "bad_windows.json")
for content, needle in (('{"windows": [[1, 2, 99999]]}', "outside the vocabulary"),
                        ('{"windows": [[1, "a"]]}', "not a token id"),
                        ('[1, 2]', "not JSON of the form")):
    with open(bad_windows, "w") as f:
        f.write(content)
    p = run("eval", "--model", kjv, "--windows-file", bad_windows, expect_rc=2)
    check(needle in p.stderr and p.stderr.startswith("tandem eval: "), f"eval {content}: {p.stderr!r}")
p = run("eval", "--model", kjv, expect_rc=2)
check("--text-file" in p.stderr, f"eval without input: {p.stderr!r}")
p = run("eval", "--model", kjv, "--text-file", os.path.join(WORK, "missing.txt"), expect_rc=1)
check("cannot open" in p.stderr, f"eval missing file: {p.stderr!r}")
p = run("generate", "--model", model, "--prompt", "Hi", "--stop", ",".join(["x"] * 17), expect_rc=2)
check("--stop" in p.stderr and "at most 16" in p.stderr, f"too many stop strings named: {p.stderr!r}")

bad_batch = os.path.join(WORK, "bad.jsonl")
with open(bad_batch, "w") as f:
    f.write('{"id": "x"}\n')
p = run("generate", "--model", model, "--batch-file", bad_batch, expect_rc=2)
check("bad.jsonl:1" in p.stderr and "token_ids" in p.stderr, f"bad batch line named: {p.stderr!r}")
p = run("generate", "--model", model, "--token-ids", "1", "--kv-cache-memory", "lots", expect_rc=2)
check("kv-cache-memory" in p.stderr, "bad --kv-cache-memory named")

# Bad input: exit code 2 and a message naming the problem.
for args, needle in [
    (["--token-ids", "1,99999"], "outside the vocabulary"),
    (["--token-ids", "1,x"], "not an integer"),
    (["--token-ids", "1", "--top-p", "1.5"], "top_p"),
    (["--token-ids", "1", "--temperature", "-1"], "temperature"),
    (["--token-ids", "1", "--max-tokens", "100000"], "context"),
    (["--token-ids", "1", "--block-size", "0"], "block-size"),
    (["--prompt", "a", "--token-ids", "1"], "exactly one"),
]:
    p = run("generate", "--model", model, *args, expect_rc=2)
    check(needle in p.stderr, f"{args}: stderr lacks '{needle}': {p.stderr!r}")
for args, needle in [
    (["--ids", "1,x"], "not an integer"),
    (["--ids", "1,99999"], "vocabulary"),
    ([], "exactly one"),
]:
    p = run("detokenize", "--model", model, *args, expect_rc=2)
    check(needle in p.stderr and p.stderr.startswith("tandem detokenize: "),
          f"detokenize {args}: stderr lacks '{needle}': {p.stderr!r}")
bad_jsonl = os.path.join(WORK, "bad.jsonl")
with open(bad_jsonl, "w") as f:
    f.write("[1, 2]\n[1, \"a\"]\n")
p = run("detokenize", "--model", model, "--jsonl", bad_jsonl, expect_rc=2)
check("bad.jsonl:2" in p.stderr, f"detokenize --jsonl error names the line: {p.stderr!r}")
p = run("tokenize", "--model", model, "--text", "a", "--file", texts_file, expect_rc=2)
check("exactly one" in p.stderr, f"tokenize with two inputs: {p.stderr!r}")
p = run("tokenize", "--model", os.path.join(WORK, "missing"), "--text", "a", expect_rc=1)
check(p.stderr.startswith("tandem tokenize: "), f"tokenize missing model: {p.stderr!r}")
p = run("generate", "--model", os.path.join(WORK, "missing"), "--token-ids", "1", expect_rc=1)
check("config.json" in p.stderr, "missing model dir names config.json")
p = run("make-model", "--preset", "nope", "--out", os.path.join(WORK, "x"), expect_rc=2)
check("tiny-llama" in p.stderr, "unknown preset lists the known ones")
# The workers are told the router's port before it binds: 0 (any port) is refused at once.
p = run("up", "--model", model, "--port", "0", "--log-dir", os.path.join(WORK, "up-port-0"), expect_rc=2)
check("--port must be a port number" in p.stderr, f"tandem up --port 0: {p.stderr!r}")
# A decode worker refuses a KV timeout that is not positive before it loads anything.
decode_worker = os.path.join(os.path.dirname(TANDEM), "..", "decode_worker", "tandem-decode-worker")
for flag in ("--kv-io-timeout-s=0", "--kv-transfer-timeout-s=-1"):
    p = subprocess.run([decode_worker, "--model", model, flag], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "must be positive" in p.stderr, f"tandem-decode-worker {flag}: exit {p.returncode}, {p.stderr!r}")
p = subprocess.run([decode_worker, "--model", model, "--kv-idle-connection-s=-1"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--kv-idle-connection-s must be >= 0" in p.stderr,
      f"tandem-decode-worker --kv-idle-connection-s=-1: exit {p.returncode}, {p.stderr!r}")
# --kv-transport lists: unknown names, repeats and names after tcp are refused before anything loads.
for flag, why in (("--kv-transport=ipc", "'ipc' is not tcp, nccl or cuda-ipc"),
                  ("--kv-transport=nccl,nccl", "names 'nccl' twice"),
                  ("--kv-transport=tcp,cuda-ipc", "'cuda-ipc' comes after tcp")):
    p = subprocess.run([decode_worker, "--model", model, flag], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and why in p.stderr, f"tandem-decode-worker {flag}: exit {p.returncode}, {p.stderr!r}")
p = subprocess.run([TANDEM, "up", "--model", model, "--kv-transport=tcp,nccl"], capture_output=True, text=True, timeout=60)
check(p.returncode != 0 and "'nccl' comes after tcp" in p.stderr, f"tandem up --kv-transport=tcp,nccl: exit {p.returncode}, {p.stderr!r}")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    print(f"0 passed, {len(failures)} failed")
    sys.exit(1)
print("cli_test: all checks passed")
