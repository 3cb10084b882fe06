#!/usr/bin/env python3
"""End-to-end checks of `tandem quantize` on the trained kjv-target model.

- GPTQ beats round to nearest on held-out perplexity: the held-out windows (heldout_eval.json) are
  split in two, GPTQ calibrates on the first half and both are scored on the second.
- What it writes is the format as documented, read here by a decoder of this file's own (pure
  Python, from the GPTQ and compressed-tensors layouts, not Tandem's reader): for round to nearest
  every weight lies within half a step of the BF16 original.
- The written checkpoints load and generate; bad flags exit 2 naming the flag.

Usage: quantize_cli_test.py PATH_TO_TANDEM MODELS_DIR WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
from array import array

TANDEM, MODELS, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
KJV = os.path.join(MODELS, "kjv-target")
failures = []
ENV = dict(os.environ, TANDEM_LOG_LEVEL="warning")


def run(*args, expect_rc=0):
    p = subprocess.run([TANDEM, *args], capture_output=True, text=True, timeout=300, env=ENV)
    if p.returncode != expect_rc:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, expected {expect_rc}\n{p.stderr}")
    return p


def check(cond, what):
    if not cond:
        failures.append(what)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of one .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], blob[8 + n + a:8 + n + b])
    return out


def floats(dtype, data):
    if dtype == "BF16":
        raw = array("H", data)
        return [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in raw]
    if dtype == "F16":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    return list(array("f", data))


def words(data):
    return array("I", data)


def decode_gptq(t, prefix, bits, v2):
    """[out][in] weights and [out][in] step sizes of a GPTQ Linear, per the AutoGPTQ layout."""
    mask, pf = (1 << bits) - 1, 32 // bits
    _, (kw, n_out), qweight = t[prefix + ".qweight"]
    _, (groups, _), qzeros = t[prefix + ".qzeros"]
    sdtype, _, sbytes = t[prefix + ".scales"]
    scales = floats(sdtype, sbytes)
    g_idx = array("i", t[prefix + ".g_idx"][2])
    qw, qz = words(qweight), words(qzeros)
    k_in = kw * pf
    w = [[0.0] * k_in for _ in range(n_out)]
    step = [[0.0] * k_in for _ in range(n_out)]
    for k in range(k_in):
        g = g_idx[k]
        for n in range(n_out):
            q = (qw[(k // pf) * n_out + n] >> (bits * (k % pf))) & mask
            z = ((qz[g * (n_out // pf) + n // pf] >> (bits * (n % pf))) & mask) + (0 if v2 else 1)
            s = scales[g * n_out + n]
            w[n][k] = s * (q - z)
            step[n][k] = s
    return w, step


def decode_compressed(t, prefix, bits, group):
    """[out][in] weights and step sizes of a compressed-tensors pack-quantized Linear."""
    mask, pf, half = (1 << bits) - 1, 32 // bits, 1 << (bits - 1)
    _, (n_out, nwords), packed = t[prefix + ".weight_packed"]
    n_out2, k_in = array("q", t[prefix + ".weight_shape"][2])
    assert n_out2 == n_out
    sdtype, (_, groups), sbytes = t[prefix + ".weight_scale"]
    scales = floats(sdtype, sbytes)
    pk = words(packed)
    zp = None
    if prefix + ".weight_zero_point" in t:
        zp = words(t[prefix + ".weight_zero_point"][2])
    w = [[0.0] * k_in for _ in range(n_out)]
    step = [[0.0] * k_in for _ in range(n_out)]
    for n in range(n_out):
        for k in range(k_in):
            g = k // group
            q = ((pk[n * nwords + k // pf] >> (bits * (k % pf))) & mask) - half
            z = 0 if zp is None else ((zp[(n // pf) * groups + g] >> (bits * (n % pf))) & mask) - half
            s = scales[n * groups + g]
            w[n][k] = s * (q - z)
            step[n][k] = s
    return w, step


def within_half_step(original, decoded, what):
    dt, (n_out, k_in), data = original
    w0 = floats(dt, data)
    w, step = decoded
    worst = 0.0
    for n in range(n_out):
        for k in range(k_in):
            err = abs(w[n][k] - w0[n * k_in + k]) - step[n][k] / 2 * (1 + 1e-3)
            worst = max(worst, err)
    check(worst <= 1e-7, f"{what}: a weight is {worst} more than half a step from the original")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
heldout = json.load(open(os.path.join(KJV, "heldout_eval.json")))["windows"]
calib, evalset = os.path.join(WORK, "calib.json"), os.path.join(WORK, "eval.json")
json.dump({"windows": heldout[:32]}, open(calib, "w"))
json.dump({"windows": heldout[32:]}, open(evalset, "w"))


def perplexity(model):
    p = run("eval", "--model", model, "--windows-file", evalset, "--json", "--progress=false")
    return json.loads(p.stdout)["perplexity"] if p.returncode == 0 else float("nan")


def quantize(out, *args):
    p = run("quantize", "--model", KJV, "--out", os.path.join(WORK, out), "--json", *args)
    return json.loads(p.stdout) if p.returncode == 0 else {}, p


base = perplexity(KJV)
rtn, _ = quantize("rtn", "--method", "rtn", "--progress=false")
gptq, p = quantize("gptq", "--calibration-windows-file", calib)
check("calibrate [" in p.stderr and "quantize [" in p.stderr and "100%" in p.stderr,
      f"quantize draws progress bars: {p.stderr[-300:]!r}")
if rtn and gptq:
    ppl_rtn, ppl_gptq = perplexity(os.path.join(WORK, "rtn")), perplexity(os.path.join(WORK, "gptq"))
    print(f"held-out perplexity: bf16 {base:.4f}, int4 rtn {ppl_rtn:.4f}, int4 gptq {ppl_gptq:.4f}")
    check(ppl_gptq < ppl_rtn, f"GPTQ {ppl_gptq} does not beat RTN {ppl_rtn} (bf16 {base})")
    check(base < ppl_gptq < base * 1.01, f"GPTQ perplexity {ppl_gptq} vs bf16 {base}")
    check(gptq["output_error"] < 0.7 * gptq["rtn_output_error"], f"GPTQ output error: {gptq}")
    check(gptq["calibration_tokens"] == 32 * 128 and gptq["linears"] == 42, f"quantize summary: {gptq}")
    check(gptq["bytes_after"] * 3 < gptq["bytes_before"], f"int4 bytes: {gptq}")
    config = json.load(open(os.path.join(WORK, "gptq", "config.json")))
    qc = config.get("quantization_config", {})
    check(qc.get("quant_method") == "gptq" and qc.get("bits") == 4 and qc.get("group_size") == 128
          and qc.get("sym") is True and qc.get("desc_act") is False and qc.get("checkpoint_format") == "gptq",
          f"GPTQ quantization_config: {qc}")
    check(config["hidden_size"] == 256 and os.path.exists(os.path.join(WORK, "gptq", "tokenizer.json")),
          "the rest of the config and the tokenizer are kept")

# The written layouts, decoded here: round to nearest puts every weight within half a step.
orig = read_safetensors(os.path.join(KJV, "model.safetensors"))
if rtn:
    t = read_safetensors(os.path.join(WORK, "rtn", "model.safetensors"))
    check("model.layers.0.self_attn.q_proj.weight" not in t and "lm_head.weight" in t
          and t["model.embed_tokens.weight"] == orig["model.embed_tokens.weight"],
          "projections replaced, the rest as stored")
    for prefix in ("model.layers.0.self_attn.k_proj", "model.layers.3.mlp.down_proj"):
        within_half_step(orig[prefix + ".weight"], decode_gptq(t, prefix, 4, v2=False), f"gptq {prefix}")
        check(list(array("i", t[prefix + ".g_idx"][2]))[:130:129] == [0, 1], f"{prefix}.g_idx is k // 128")
ct, _ = quantize("ct_rtn", "--method", "rtn", "--format", "compressed-tensors", "--sym=false",
                 "--bits", "4", "--group-size", "64", "--progress=false")
if ct:
    qc = json.load(open(os.path.join(WORK, "ct_rtn", "config.json")))["quantization_config"]
    w = qc["config_groups"]["group_0"]["weights"]
    check(qc["format"] == "pack-quantized" and qc["ignore"] == ["lm_head"] and w["num_bits"] == 4
          and w["group_size"] == 64 and w["symmetric"] is False and w["strategy"] == "group",
          f"compressed-tensors quantization_config: {qc}")
    t = read_safetensors(os.path.join(WORK, "ct_rtn", "model.safetensors"))
    check(t["model.layers.0.mlp.up_proj.weight_scale"][0] == "BF16", "compressed-tensors scales in the model dtype")
    for prefix in ("model.layers.0.self_attn.o_proj", "model.layers.5.mlp.up_proj"):
        within_half_step(orig[prefix + ".weight"], decode_compressed(t, prefix, 4, 64), f"ct {prefix}")
    check(perplexity(os.path.join(WORK, "ct_rtn")) < base * 1.03, "compressed-tensors checkpoint scores")
ct8, _ = quantize("ct_gptq8", "--format", "compressed-tensors", "--bits", "8", "--group-size", "-1",
                  "--act-order", "--calibration-windows-file", calib, "--calibration-tokens", "1000",
                  "--progress=false")
if ct8:
    check(ct8["calibration_tokens"] == 1000, f"--calibration-tokens caps: {ct8}")
    check(abs(perplexity(os.path.join(WORK, "ct_gptq8")) / base - 1) < 0.002, "8-bit GPTQ is near bf16")
    t = read_safetensors(os.path.join(WORK, "ct_gptq8", "model.safetensors"))
    g_idx = list(array("i", t["model.layers.0.mlp.down_proj.weight_g_idx"][2]))
    check(g_idx == [0] * 768, "per channel: one group")
# Calibration in passes (--calibration-memory smaller than the Hessians) writes the same bytes.
one, _ = quantize("one_pass", "--calibration-windows-file", calib, "--calibration-tokens", "300", "--progress=false")
many, p = quantize("many_passes", "--calibration-windows-file", calib, "--calibration-tokens", "300",
                   "--calibration-memory", "1M", "--progress=false")
check("in 13 passes" in p.stderr, f"passes reported: {p.stderr!r}")
if one and many:
    check(open(os.path.join(WORK, "one_pass", "model.safetensors"), "rb").read()
          == open(os.path.join(WORK, "many_passes", "model.safetensors"), "rb").read(),
          "calibration in passes changes the checkpoint")
# A calibration text file, and the quantized checkpoints generate.
text = os.path.join(WORK, "calib.txt")
with open(text, "w") as f:
    f.write("And God said, Let there be light: and there was light.\n" * 40)
tx, _ = quantize("text_gptq", "--calibration-file", text, "--context", "128", "--progress=false")
check(tx.get("calibration_tokens", 0) > 400, f"--calibration-file is tokenized: {tx}")
for name in ("gptq", "ct_rtn"):
    p = run("generate", "--model", os.path.join(WORK, name), "--prompt", "And God said", "--max-tokens", "8",
            "--json")
    if p.returncode == 0:
        check(len(json.loads(p.stdout)["token_ids"]) == 8, f"{name} generates")

# Bad flags: exit 2, the flag named.
for args, needle in [
    (["--bits", "3"], "--bits"),
    (["--group-size", "96", "--method", "rtn"], "does not divide"),
    (["--group-size", "0"], "--group-size"),
    (["--method", "awq"], "--method"),
    (["--format", "awq", "--method", "rtn"], "--format"),
    ([], "calibration"),
    (["--method", "rtn", "--act-order"], "GPTQ"),
    (["--method", "rtn", "--damp", "2"], "--damp"),
    (["--calibration-memory", "lots"], "--calibration-memory"),
    (["--calibration-tokens", "0"], "--calibration-tokens"),
]:
    p = run("quantize", "--model", KJV, "--out", os.path.join(WORK, "bad"), *args, expect_rc=2)
    check(needle in p.stderr and p.stderr.startswith("tandem quantize: "), f"quantize {args}: {p.stderr!r}")
p = run("quantize", "--model", KJV, "--out", KJV, "--method", "rtn", expect_rc=2)
check("other than --model" in p.stderr, f"--out == --model: {p.stderr!r}")
p = run("quantize", "--model", os.path.join(WORK, "rtn"), "--out", os.path.join(WORK, "again"), "--method", "rtn",
        expect_rc=2)
check("already quantized" in p.stderr, f"quantizing a quantized checkpoint: {p.stderr!r}")
p = run("quantize", "--model", KJV, "--out", os.path.join(WORK, "bad"), "--calibration-file",
        os.path.join(WORK, "missing.txt"), expect_rc=1)
check("cannot open" in p.stderr, f"missing calibration file: {p.stderr!r}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("quantize_cli_test: all checks passed")
