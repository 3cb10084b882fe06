// Reading a Hugging Face model directory: config.json, safetensors (single file or sharded), and the
// architecture facts both the GGUF exporter and the float64 reference need. Model files are hostile
// input: every offset, length and shape is checked before it is used, and anything this module does
// not understand is refused with a message naming the file and the problem.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";

// Safetensors and GGUF are little-endian; the typed-array views below assume the host is too.
if (os.endianness() !== "LE") throw new Error("hf_model.mjs needs a little-endian host");

export class ModelError extends Error {}

function fail(msg) {
  throw new ModelError(msg);
}

const DTYPE_BYTES = { F32: 4, F16: 2, BF16: 2 };
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

// Exact IEEE half → float conversion (every f16 value is representable in f32/f64).
export function f16ToNumber(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24; // zero or subnormal
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1024 + frac) * 2 ** (exp - 25);
}

// Parses one .safetensors header. Returns Map name → {dtype, shape, file, start, nbytes}; start is the
// absolute file offset of the tensor's bytes.
function readSafetensorsHeader(file) {
  const fd = fs.openSync(file, "r");
  try {
    const size = fs.fstatSync(fd).size;
    if (size < 8) fail(`${file}: too short to be a safetensors file`);
    const lenBuf = Buffer.alloc(8);
    fs.readSync(fd, lenBuf, 0, 8, 0);
    const headerLen = lenBuf.readBigUInt64LE(0);
    if (headerLen > BigInt(MAX_HEADER_BYTES) || headerLen > BigInt(size - 8)) {
      fail(`${file}: header length ${headerLen} is larger than the file or the ${MAX_HEADER_BYTES}-byte limit`);
    }
    const hbuf = Buffer.alloc(Number(headerLen));
    fs.readSync(fd, hbuf, 0, hbuf.length, 8);
    let header;
    try {
      header = JSON.parse(hbuf.toString("utf8"));
    } catch (e) {
      fail(`${file}: header is not valid JSON (${e.message})`);
    }
    if (header === null || typeof header !== "object" || Array.isArray(header)) fail(`${file}: header is not a JSON object`);
    const dataStart = 8 + Number(headerLen);
    const dataLen = size - dataStart;
    const out = new Map();
    for (const [name, info] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      if (!info || typeof info !== "object") fail(`${file}: tensor ${name}: entry is not an object`);
      const { dtype, shape, data_offsets: offs } = info;
      if (!(dtype in DTYPE_BYTES)) fail(`${file}: tensor ${name}: dtype ${dtype} is not supported (F32, F16, BF16 only)`);
      if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
        fail(`${file}: tensor ${name}: bad shape ${JSON.stringify(shape)}`);
      }
      if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && o >= 0) || offs[0] > offs[1]) {
        fail(`${file}: tensor ${name}: bad data_offsets ${JSON.stringify(offs)}`);
      }
      if (offs[1] > dataLen) fail(`${file}: tensor ${name}: data_offsets ${offs} run past the end of the file`);
      const numel = shape.reduce((a, b) => a * b, 1);
      const nbytes = numel * DTYPE_BYTES[dtype];
      if (offs[1] - offs[0] !== nbytes) {
        fail(`${file}: tensor ${name}: ${offs[1] - offs[0]} bytes for shape ${JSON.stringify(shape)} ${dtype} (expected ${nbytes})`);
      }
      out.set(name, { dtype, shape, file, start: dataStart + offs[0], nbytes, numel });
    }
    return out;
  } finally {
    fs.closeSync(fd);
  }
}

// All tensors of a model directory, from model.safetensors or model.safetensors.index.json.
export function openSafetensors(dir) {
  const single = path.join(dir, "model.safetensors");
  const index = path.join(dir, "model.safetensors.index.json");
  const tensors = new Map();
  if (fs.existsSync(single)) {
    for (const [k, v] of readSafetensorsHeader(single)) tensors.set(k, v);
  } else if (fs.existsSync(index)) {
    let idx;
    try {
      idx = JSON.parse(fs.readFileSync(index, "utf8"));
    } catch (e) {
      fail(`${index}: not valid JSON (${e.message})`);
    }
    const wm = idx && idx.weight_map;
    if (!wm || typeof wm !== "object") fail(`${index}: no weight_map object`);
    const files = [...new Set(Object.values(wm))];
    for (const f of files) {
      if (typeof f !== "string" || f.includes("/") || f.includes("\\") || f.startsWith(".")) fail(`${index}: bad shard name ${JSON.stringify(f)}`);
      for (const [k, v] of readSafetensorsHeader(path.join(dir, f))) {
        if (tensors.has(k)) fail(`${index}: tensor ${k} appears in more than one shard`);
        if (wm[k] !== f) fail(`${index}: tensor ${k} found in ${f} but weight_map says ${wm[k]}`);
        tensors.set(k, v);
      }
    }
    for (const k of Object.keys(wm)) if (!tensors.has(k)) fail(`${index}: weight_map names ${k} but no shard holds it`);
  } else {
    fail(`${dir}: neither model.safetensors nor model.safetensors.index.json exists`);
  }
  return tensors;
}

// Reads a tensor into a Float32Array (exact for F32/F16/BF16) or Float64Array when asked.
export function readTensor(info, Out = Float32Array) {
  const buf = Buffer.alloc(info.nbytes);
  const fd = fs.openSync(info.file, "r");
  try {
    let done = 0;
    while (done < info.nbytes) {
      const n = fs.readSync(fd, buf, done, info.nbytes - done, info.start + done);
      if (n <= 0) fail(`${info.file}: short read`);
      done += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  // Buffer.alloc never hands out pooled memory, so the views below start at offset 0 (aligned).
  const out = new Out(info.numel);
  if (info.dtype === "F32") {
    out.set(new Float32Array(buf.buffer, buf.byteOffset, info.numel));
  } else if (info.dtype === "BF16") {
    // bf16 is the top half of an f32: shifting the bits up is an exact conversion.
    const src = new Uint16Array(buf.buffer, buf.byteOffset, info.numel);
    const f32 = Out === Float32Array ? out : new Float32Array(info.numel);
    const u32 = new Uint32Array(f32.buffer);
    for (let i = 0; i < info.numel; i++) u32[i] = src[i] << 16;
    if (f32 !== out) out.set(f32);
  } else {
    const src = new Uint16Array(buf.buffer, buf.byteOffset, info.numel);
    for (let i = 0; i < info.numel; i++) out[i] = f16ToNumber(src[i]);
  }
  return out;
}

export function readJson(file) {
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    fail(`${file}: cannot read (${e.code || e.message})`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    fail(`${file}: not valid JSON (${e.message})`);
  }
}

const ARCHS = {
  LlamaForCausalLM: "llama",
  MistralForCausalLM: "llama",
  Qwen2ForCausalLM: "qwen2",
  Qwen3ForCausalLM: "qwen3",
};

function posInt(cfg, key, file) {
  const v = cfg[key];
  if (!Number.isSafeInteger(v) || v <= 0) fail(`${file}: ${key} must be a positive integer (got ${JSON.stringify(v)})`);
  return v;
}

// Validated architecture hyper-parameters. `family` is the GGUF architecture (llama, qwen2, qwen3).
export function loadConfig(dir) {
  const file = path.join(dir, "config.json");
  const cfg = readJson(file);
  const hfArch = Array.isArray(cfg.architectures) ? cfg.architectures[0] : undefined;
  if (!(hfArch in ARCHS)) {
    fail(`${file}: architectures[0] is ${JSON.stringify(hfArch)}; supported: ${Object.keys(ARCHS).join(", ")}`);
  }
  const family = ARCHS[hfArch];
  const hidden = posInt(cfg, "hidden_size", file);
  const layers = posInt(cfg, "num_hidden_layers", file);
  const heads = posInt(cfg, "num_attention_heads", file);
  const kvHeads = cfg.num_key_value_heads == null ? heads : posInt(cfg, "num_key_value_heads", file);
  const ffn = posInt(cfg, "intermediate_size", file);
  const vocab = posInt(cfg, "vocab_size", file);
  if (heads % kvHeads !== 0) fail(`${file}: num_attention_heads ${heads} is not a multiple of num_key_value_heads ${kvHeads}`);
  let headDim;
  if (cfg.head_dim != null) headDim = posInt(cfg, "head_dim", file);
  else {
    if (hidden % heads !== 0) fail(`${file}: hidden_size ${hidden} is not a multiple of num_attention_heads ${heads} and no head_dim is given`);
    headDim = hidden / heads;
  }
  if (headDim % 2 !== 0) fail(`${file}: head_dim ${headDim} must be even for RoPE`);
  const act = cfg.hidden_act ?? "silu";
  if (act !== "silu") fail(`${file}: hidden_act ${JSON.stringify(act)} is not supported (silu only)`);
  const eps = cfg.rms_norm_eps ?? 1e-6;
  const theta = cfg.rope_theta ?? 10000;
  if (!(eps > 0) || !(theta > 0)) fail(`${file}: rms_norm_eps and rope_theta must be positive`);
  if (cfg.partial_rotary_factor != null && cfg.partial_rotary_factor !== 1) fail(`${file}: partial_rotary_factor is not supported`);
  if (cfg.mlp_bias) fail(`${file}: mlp_bias is not supported`);
  if (family === "llama" && cfg.attention_bias) fail(`${file}: attention_bias is not supported for ${hfArch}`);
  if (family === "qwen3" && cfg.attention_bias) fail(`${file}: attention_bias is not supported for Qwen3`);
  if ((family === "qwen2" || family === "qwen3") && cfg.use_sliding_window) {
    fail(`${file}: use_sliding_window is not supported (llama.cpp's ${family} ignores it)`);
  }
  let ropeScaling = null;
  const rs = cfg.rope_scaling;
  if (rs != null) {
    const type = rs.rope_type ?? rs.type;
    if (type === "default") {
      // no scaling
    } else if (type === "llama3") {
      if (family !== "llama") fail(`${file}: llama3 rope scaling is only supported for Llama/Mistral`);
      const factor = rs.factor;
      const low = rs.low_freq_factor ?? 1;
      const high = rs.high_freq_factor ?? 4;
      const orig = rs.original_max_position_embeddings ?? 8192;
      if (!(factor > 0) || !(low > 0) || !(high > low) || !(orig > 0)) {
        fail(`${file}: llama3 rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0`);
      }
      ropeScaling = { type: "llama3", factor, lowFreqFactor: low, highFreqFactor: high, originalMaxPositions: orig };
    } else {
      fail(`${file}: rope_scaling type ${JSON.stringify(type)} is not supported (llama3 only)`);
    }
  }
  let eos = cfg.eos_token_id;
  const eosList = eos == null ? [] : Array.isArray(eos) ? eos : [eos];
  return {
    hfArch,
    family,
    hidden,
    layers,
    heads,
    kvHeads,
    headDim,
    ffn,
    vocab,
    eps,
    theta,
    ropeScaling,
    tied: cfg.tie_word_embeddings === true,
    maxPositions: cfg.max_position_embeddings ?? 4096,
    slidingWindow: family === "llama" ? cfg.sliding_window ?? null : null,
    bosTokenId: Number.isSafeInteger(cfg.bos_token_id) ? cfg.bos_token_id : null,
    eosTokenIds: eosList.filter((x) => Number.isSafeInteger(x)),
    raw: cfg,
  };
}

// Per-frequency divisors of llama3 rope scaling: inv_freq_scaled[i] = inv_freq[i] / divisor[i].
// Formula of the Llama 3.1 reference implementation.
export function llama3RopeDivisors(headDim, theta, rs) {
  const out = new Float64Array(headDim / 2);
  const lowWavelen = rs.originalMaxPositions / rs.lowFreqFactor;
  const highWavelen = rs.originalMaxPositions / rs.highFreqFactor;
  for (let i = 0; i < headDim / 2; i++) {
    const freq = theta ** (-(2 * i) / headDim);
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = rs.factor;
    else {
      const smooth = (rs.originalMaxPositions / wavelen - rs.lowFreqFactor) / (rs.highFreqFactor - rs.lowFreqFactor);
      out[i] = 1 / ((1 - smooth) / rs.factor + smooth);
    }
  }
  return out;
}

// The tensors an architecture must (and may) have, with their expected PyTorch shapes.
// Returns [{hf, shape, required}]; lm_head is required only when embeddings are not tied.
export function expectedTensors(c) {
  const q = c.heads * c.headDim;
  const kv = c.kvHeads * c.headDim;
  const list = [
    { hf: "model.embed_tokens.weight", shape: [c.vocab, c.hidden] },
    { hf: "model.norm.weight", shape: [c.hidden] },
  ];
  if (!c.tied) list.push({ hf: "lm_head.weight", shape: [c.vocab, c.hidden] });
  for (let l = 0; l < c.layers; l++) {
    const p = `model.layers.${l}.`;
    list.push(
      { hf: p + "input_layernorm.weight", shape: [c.hidden] },
      { hf: p + "self_attn.q_proj.weight", shape: [q, c.hidden] },
      { hf: p + "self_attn.k_proj.weight", shape: [kv, c.hidden] },
      { hf: p + "self_attn.v_proj.weight", shape: [kv, c.hidden] },
      { hf: p + "self_attn.o_proj.weight", shape: [c.hidden, q] },
      { hf: p + "post_attention_layernorm.weight", shape: [c.hidden] },
      { hf: p + "mlp.gate_proj.weight", shape: [c.ffn, c.hidden] },
      { hf: p + "mlp.up_proj.weight", shape: [c.ffn, c.hidden] },
      { hf: p + "mlp.down_proj.weight", shape: [c.hidden, c.ffn] },
    );
    if (c.family === "qwen2") {
      list.push(
        { hf: p + "self_attn.q_proj.bias", shape: [q] },
        { hf: p + "self_attn.k_proj.bias", shape: [kv] },
        { hf: p + "self_attn.v_proj.bias", shape: [kv] },
      );
    }
    if (c.family === "qwen3") {
      list.push({ hf: p + "self_attn.q_norm.weight", shape: [c.headDim] }, { hf: p + "self_attn.k_norm.weight", shape: [c.headDim] });
    }
  }
  return list;
}

// Opens a model directory: validated config plus checked tensor table. Tensors the architecture does not
// use are refused (silently ignoring one would hide a model this code cannot run), except
// lm_head.weight when embeddings are tied (Hugging Face then uses the embedding matrix) and rotary
// inv_freq buffers.
export function openModel(dir) {
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) fail(`${dir}: not a directory`);
  const config = loadConfig(dir);
  const tensors = openSafetensors(dir);
  const expected = expectedTensors(config);
  const want = new Set(expected.map((e) => e.hf));
  for (const e of expected) {
    const t = tensors.get(e.hf);
    if (!t) fail(`${dir}: tensor ${e.hf} is missing`);
    if (t.shape.length !== e.shape.length || t.shape.some((d, i) => d !== e.shape[i])) {
      fail(`${dir}: tensor ${e.hf} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(e.shape)}`);
    }
  }
  for (const name of tensors.keys()) {
    if (want.has(name)) continue;
    if (config.tied && name === "lm_head.weight") continue;
    if (name.endsWith("rotary_emb.inv_freq")) continue;
    fail(`${dir}: tensor ${name} is not used by ${config.hfArch} as supported here; refusing rather than ignoring it`);
  }
  return { dir, config, tensors };
}
