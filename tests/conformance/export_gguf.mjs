#!/usr/bin/env node
// Converts a Hugging Face model directory (Llama, Mistral, Qwen2, Qwen3; safetensors in F32/F16/BF16;
// byte-level BPE tokenizer.json) into a GGUF v3 file. By default every tensor is F32, so that llama.cpp
// computes in f32 and can serve as an independent oracle for Tandem; `--dtype f16|bf16` stores the 2-D
// weight matrices in that type instead (for benchmarking llama.cpp at the precision Tandem runs), while
// 1-D tensors (norms, biases) and rope_freqs stay F32, as llama.cpp expects.
//
//   node export_gguf.mjs --model DIR --out FILE.gguf [--dtype f32|f16|bf16|q8_0|q4_0] [--quantize-head]
//
// `--dtype q8_0|q4_0` quantizes the layers' projection weights (attention q/k/v/o, MLP gate/up/down)
// to llama.cpp's Q8_0 or Q4_0 blocks and keeps the embedding table and lm_head in BF16 — the split
// Tandem's `--quantization` makes (embeddings and lm_head as stored) — for benchmarking llama.cpp's
// quantized CPU path on the same weights (quantizeBlocks below gives the block formats).
// `--quantize-head` quantizes the embedding table and lm_head to the same type as well (what Tandem's
// `--quantize-lm-head` does to the LM head; llama.cpp reads embedding rows from quantized blocks).
//
// Conversions are exact where the target can hold the source (bf16 → bf16 and f16 → f16 reproduce the
// source bits; anything → f32 is exact) and round to nearest, ties to even otherwise (f32 → f16/bf16,
// f16 → bf16, bf16 → f16; a finite value beyond the target range becomes ±inf and is reported).
//
// GGUF layout (little-endian): "GGUF", u32 version 3, u64 tensor count, u64 metadata count, metadata
// key/value pairs, tensor infos (name, n_dims, dims fastest-first, ggml type, offset), zero padding to
// general.alignment, then the tensor data, each tensor at an offset (relative to the data section)
// that is a multiple of the alignment.
//
// Conventions llama.cpp expects and Hugging Face does not share:
// - GGUF dims are listed fastest-varying first: a PyTorch [out, in] weight is GGUF [in, out], same bytes.
// - The `llama` architecture applies RoPE to interleaved pairs (x0,x1),(x2,x3)…, while HF Llama/Mistral
//   rotate halves (x_i, x_{i+d/2}); so Q and K rows are permuted per head: new row 2j+t takes old row
//   t*d/2+j. `qwen2`/`qwen3` use rotate-half (NEOX) RoPE in llama.cpp and take the rows unchanged.
// - Llama 3.1 rope scaling travels as `rope_freqs.weight`: one divisor per frequency.

import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { ModelError, f16ToNumber, openModel, readTensor, readJson, llama3RopeDivisors } from "./lib/hf_model.mjs";

const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
const GGUF_VERSION = 3;
const ALIGNMENT = 32;
const T = { UINT32: 4, INT32: 5, FLOAT32: 6, BOOL: 7, STRING: 8, ARRAY: 9 };
// ggml_type ids (ggml.h / GGUF spec) and the matching general.file_type (llama_ftype) values.
const GGML_TYPE = { f32: 0, f16: 1, bf16: 30, q8_0: 8, q4_0: 2 };
// Bytes per element (f32, f16, bf16) or per block of QK = 32 elements (q8_0, q4_0).
const GGML_TYPE_BYTES = { 0: 4, 1: 2, 30: 2 };
const QK = 32;
const GGML_BLOCK_BYTES = { 8: 2 + QK, 2: 2 + QK / 2 };
// ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0, MOSTLY_Q4_0 (1-D tensors stay F32).
const FILE_TYPE = { f32: 0, f16: 1, bf16: 32, q8_0: 7, q4_0: 2 };
const QUANT_DTYPES = new Set(["q8_0", "q4_0"]);
export const EXPORT_DTYPES = Object.keys(GGML_TYPE);
// llama.cpp token types.
const TOKEN_NORMAL = 1;
const TOKEN_CONTROL = 3;
const TOKEN_USER_DEFINED = 4;
const TOKEN_UNUSED = 5;

function fail(msg) {
  throw new ModelError(msg);
}

class ByteWriter {
  constructor() {
    this.parts = [];
    this.length = 0;
  }
  push(buf) {
    this.parts.push(buf);
    this.length += buf.length;
  }
  u32(v) {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  i32(v) {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.push(b);
  }
  u64(v) {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  f32(v) {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.push(b);
  }
  str(s) {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.push(b);
  }
  concat() {
    return Buffer.concat(this.parts, this.length);
  }
}

// Metadata values carry their GGUF type explicitly: {type, value} or {type: ARRAY, elem, value: []}.
const kv = {
  u32: (v) => ({ type: T.UINT32, value: v }),
  f32: (v) => ({ type: T.FLOAT32, value: v }),
  str: (v) => ({ type: T.STRING, value: v }),
  bool: (v) => ({ type: T.BOOL, value: v }),
  strs: (v) => ({ type: T.ARRAY, elem: T.STRING, value: v }),
  i32s: (v) => ({ type: T.ARRAY, elem: T.INT32, value: v }),
};

function writeValue(w, type, value) {
  switch (type) {
    case T.UINT32:
      if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) fail(`metadata value ${value} does not fit u32`);
      return w.u32(value);
    case T.INT32:
      return w.i32(value);
    case T.FLOAT32:
      return w.f32(value);
    case T.BOOL:
      return w.push(Buffer.from([value ? 1 : 0]));
    case T.STRING:
      return w.str(value);
    default:
      fail(`internal: cannot write metadata type ${type}`);
  }
}

// GPT-2's reversible byte → printable-character map: the 188 printable Latin-1 bytes stand for
// themselves, the rest are shifted to U+0100 onwards in byte order.
function gpt2ByteChars() {
  const chars = [];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    chars.push(String.fromCodePoint(printable ? b : 256 + n++));
  }
  return chars;
}

function containsType(node, type) {
  if (!node || typeof node !== "object") return false;
  if (node.type === type) return true;
  for (const v of Object.values(node)) {
    if (Array.isArray(v) ? v.some((x) => containsType(x, type)) : typeof v === "object" && containsType(v, type)) return true;
  }
  return false;
}

// tokenizer.json → GGUF vocabulary arrays, padded to the model's vocab_size.
export function buildVocab(dir, config, warn = () => {}) {
  const file = path.join(dir, "tokenizer.json");
  const tok = readJson(file);
  const model = tok.model;
  if (!model || model.type !== "BPE") fail(`${file}: model.type is ${JSON.stringify(model && model.type)}; only BPE is supported`);
  if (!containsType(tok.pre_tokenizer, "ByteLevel") && !containsType(tok.decoder, "ByteLevel")) {
    fail(`${file}: not a byte-level (GPT-2 style) BPE tokenizer: no ByteLevel pre-tokenizer or decoder`);
  }
  if (!model.vocab || typeof model.vocab !== "object") fail(`${file}: model.vocab is missing`);
  const n = config.vocab;
  const tokens = new Array(n).fill(null);
  const types = new Array(n).fill(TOKEN_NORMAL);
  const place = (content, id, type, what) => {
    if (!Number.isSafeInteger(id) || id < 0) fail(`${file}: ${what} ${JSON.stringify(content)} has bad id ${id}`);
    if (id >= n) fail(`${file}: ${what} ${JSON.stringify(content)} has id ${id} >= config vocab_size ${n}`);
    if (typeof content !== "string" || content.length === 0) fail(`${file}: ${what} with id ${id} has empty or non-string content`);
    if (tokens[id] !== null && tokens[id] !== content) {
      fail(`${file}: id ${id} is both ${JSON.stringify(tokens[id])} and ${JSON.stringify(content)}`);
    }
    tokens[id] = content;
    types[id] = type;
  };
  for (const [content, id] of Object.entries(model.vocab)) place(content, id, TOKEN_NORMAL, "vocab token");
  for (const at of tok.added_tokens ?? []) {
    place(at.content, at.id, at.special ? TOKEN_CONTROL : TOKEN_USER_DEFINED, "added token");
  }
  const seen = new Map();
  let pads = 0;
  for (let i = 0; i < n; i++) {
    if (tokens[i] === null) {
      tokens[i] = `[PAD${i}]`;
      types[i] = TOKEN_UNUSED;
      pads++;
    }
    if (seen.has(tokens[i])) fail(`${file}: token ${JSON.stringify(tokens[i])} has two ids (${seen.get(tokens[i])}, ${i})`);
    seen.set(tokens[i], i);
  }
  if (pads) warn(`vocab: ${pads} ids without a token (config vocab_size ${n}) written as [PAD<id>] (unused)`);
  const missingBytes = gpt2ByteChars().filter((c) => !seen.has(c));
  if (missingBytes.length) warn(`vocab: ${missingBytes.length} of the 256 byte tokens are missing; llama.cpp may fail to tokenize text`);

  const merges = [];
  for (const m of model.merges ?? []) {
    let a, b;
    if (typeof m === "string") {
      const sp = m.indexOf(" ");
      if (sp <= 0 || sp !== m.lastIndexOf(" ") || sp === m.length - 1) fail(`${file}: merge ${JSON.stringify(m)} is not "a b"`);
      a = m.slice(0, sp);
      b = m.slice(sp + 1);
    } else if (Array.isArray(m) && m.length === 2 && typeof m[0] === "string" && typeof m[1] === "string") {
      [a, b] = m;
    } else fail(`${file}: merge ${JSON.stringify(m)} is neither "a b" nor [a, b]`);
    if (a.includes(" ") || b.includes(" ") || !a || !b) fail(`${file}: merge ${JSON.stringify(m)} has a part with a space; GGUF merges cannot carry it`);
    merges.push(`${a} ${b}`);
  }
  if (merges.length === 0) {
    // llama.cpp's BPE loader refuses an empty merge list. A merge only affects text tokenization, which
    // conformance runs never use (they feed token ids).
    const sp = gpt2ByteChars()[0x20];
    merges.push(`${sp} ${sp}`);
    warn(`tokenizer has no merges; wrote the placeholder merge "${sp} ${sp}" (text tokenization will differ)`);
  }
  return { tokens, types, merges };
}

// Row permutation for the `llama` architecture: per head, [2, d/2] → [d/2, 2].
function permuteRows(data, rows, cols, nHead) {
  const d = rows / nHead;
  const half = d / 2;
  const out = new Float32Array(data.length);
  for (let h = 0; h < nHead; h++) {
    for (let j = 0; j < half; j++) {
      for (let t = 0; t < 2; t++) {
        const src = (h * d + t * half + j) * cols;
        const dst = (h * d + 2 * j + t) * cols;
        out.set(data.subarray(src, src + cols), dst);
      }
    }
  }
  return out;
}

// f32 bit patterns → bf16 bit patterns, round to nearest, ties to even (NaN stays a quiet NaN). A value
// that came from bf16 has zero low bits, so this is then a plain copy of the source bits.
export function toBf16(data) {
  const src = new Uint32Array(data.buffer, data.byteOffset, data.length);
  const out = new Uint16Array(data.length);
  let overflows = 0;
  for (let i = 0; i < src.length; i++) {
    const x = src[i];
    const ax = x & 0x7fffffff;
    if (ax > 0x7f800000) out[i] = (x >>> 16) | 0x40;
    else {
      out[i] = (x + 0x7fff + ((x >>> 16) & 1)) >>> 16; // the sum stays below 2^32
      if (ax < 0x7f800000 && (out[i] & 0x7fff) === 0x7f80) overflows++;
    }
  }
  return { bits: out, overflows };
}

// f32 bit patterns → IEEE half bit patterns, round to nearest, ties to even, with subnormals; finite
// values beyond the f16 range become ±inf (counted in `overflows`). Exact for values that came from f16.
export function toF16(data) {
  const src = new Uint32Array(data.buffer, data.byteOffset, data.length);
  const out = new Uint16Array(data.length);
  let overflows = 0;
  for (let i = 0; i < src.length; i++) {
    const x = src[i];
    const sign = (x >>> 16) & 0x8000;
    const exp = (x >>> 23) & 0xff;
    const mant = x & 0x7fffff;
    let h;
    if (exp === 0xff) {
      h = mant ? 0x7e00 | (mant >>> 13) : 0x7c00; // NaN (quiet) or inf
    } else {
      const e = exp - 112; // rebias 127 → 15
      if (e >= 0x1f) {
        h = 0x7c00;
      } else if (e <= 0) {
        // f16 subnormal (or zero): value / 2^-24 = (1.mant × 2^23) × 2^(e-14).
        if (e < -10) h = 0;
        else {
          const m = mant | 0x800000;
          const shift = 14 - e;
          h = m >>> shift;
          const rem = m & ((1 << shift) - 1);
          const half = 1 << (shift - 1);
          if (rem > half || (rem === half && h & 1)) h++; // may carry into the smallest normal: still right
        }
      } else {
        h = (e << 10) | (mant >>> 13);
        const rem = mant & 0x1fff;
        if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++; // a carry out of the top exponent gives inf: right
      }
      if (h >= 0x7c00) overflows++;
    }
    out[i] = sign | h;
  }
  return { bits: out, overflows };
}

// llama.cpp's 8- and 4-bit blocks (ggml-common.h's block_q8_0 / block_q4_0, as ggml-quants.c's
// reference quantizers fill them), over rows whose length is a multiple of QK = 32:
// - Q8_0: per block an f16 scale d = max|x| / 127, then 32 int8 codes round(x / d); x ≈ d·q.
// - Q4_0: per block an f16 scale d = m / −8, where m is the block's value of largest magnitude (sign
//   kept), then 16 bytes: byte j holds element j's code in its low nibble and element j+16's in its
//   high nibble, code = min(15, trunc(x / d + 8.5)); x ≈ d·(code − 8).
// Codes are chosen with the f32 scale and the f16-rounded scale is stored, as llama.cpp does.
export function quantizeBlocks(data, type) {
  if (data.length % QK !== 0) fail(`internal: ${data.length} values do not split into blocks of ${QK}`);
  const blocks = data.length / QK;
  const per = GGML_BLOCK_BYTES[type];
  const scales = new Float32Array(blocks);
  const out = Buffer.alloc(blocks * per);
  for (let b = 0; b < blocks; b++) {
    const x = data.subarray(b * QK, (b + 1) * QK);
    const o = b * per + 2;
    if (type === GGML_TYPE.q8_0) {
      let amax = 0;
      for (let i = 0; i < QK; i++) amax = Math.max(amax, Math.abs(x[i]));
      const d = Math.fround(amax / 127);
      const id = d ? Math.fround(1 / d) : 0;
      for (let i = 0; i < QK; i++) {
        const v = Math.fround(x[i] * id);
        out.writeInt8(Math.sign(v) * Math.round(Math.abs(v)), o + i); // roundf: halves away from zero
      }
      scales[b] = d;
    } else {
      let amax = 0;
      let max = 0;
      for (let i = 0; i < QK; i++) {
        if (Math.abs(x[i]) > amax) {
          amax = Math.abs(x[i]);
          max = x[i];
        }
      }
      const d = Math.fround(max / -8);
      const id = d ? Math.fround(1 / d) : 0;
      const code = (v) => Math.min(15, Math.trunc(Math.fround(Math.fround(v * id) + 8.5)));
      for (let j = 0; j < QK / 2; j++) out[o + j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
      scales[b] = d;
    }
  }
  const { bits } = toF16(scales);
  for (let b = 0; b < blocks; b++) out.writeUInt16LE(bits[b], b * per);
  return out;
}

// The values a Q8_0 / Q4_0 buffer holds (the inverse of quantizeBlocks), for tests.
export function dequantizeBlocks(buf, type, numel) {
  const per = GGML_BLOCK_BYTES[type];
  const out = new Float32Array(numel);
  for (let b = 0; b < numel / QK; b++) {
    const d = f16ToNumber(buf.readUInt16LE(b * per));
    const o = b * per + 2;
    for (let j = 0; j < QK; j++) {
      if (type === GGML_TYPE.q8_0) out[b * QK + j] = d * buf.readInt8(o + j);
      else {
        const byte = buf[o + (j % (QK / 2))];
        out[b * QK + j] = d * ((j < QK / 2 ? byte & 15 : byte >> 4) - 8);
      }
    }
  }
  return out;
}

export { GGML_TYPE };

// The layers' projection weights, which q8_0 / q4_0 quantize.
const PROJECTION = /^blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight$/;

// Builds the GGUF tensor list: [{name, dims (GGUF order), numel, load() → Float32Array}]. The data are
// always produced in f32 (exact for every source dtype) and converted to the output type when written.
function planTensors(m) {
  const c = m.config;
  const list = [];
  const hf = (name, transform) => {
    const info = m.tensors.get(name);
    return {
      dims: [...info.shape].reverse(),
      numel: info.numel,
      load: () => (transform ? transform(readTensor(info), info) : readTensor(info)),
    };
  };
  const add = (name, src) => list.push({ name, ...src });
  add("token_embd.weight", hf("model.embed_tokens.weight"));
  add("output_norm.weight", hf("model.norm.weight"));
  if (!c.tied) add("output.weight", hf("lm_head.weight"));
  if (c.ropeScaling) {
    const divisors = Float32Array.from(llama3RopeDivisors(c.headDim, c.theta, c.ropeScaling));
    add("rope_freqs.weight", { dims: [divisors.length], numel: divisors.length, load: () => divisors });
  }
  const permute = c.family === "llama";
  const qPerm = permute ? (d, info) => permuteRows(d, info.shape[0], info.shape[1], c.heads) : null;
  const kPerm = permute ? (d, info) => permuteRows(d, info.shape[0], info.shape[1], c.kvHeads) : null;
  for (let l = 0; l < c.layers; l++) {
    const p = `model.layers.${l}.`;
    const b = `blk.${l}.`;
    add(b + "attn_norm.weight", hf(p + "input_layernorm.weight"));
    add(b + "attn_q.weight", hf(p + "self_attn.q_proj.weight", qPerm));
    add(b + "attn_k.weight", hf(p + "self_attn.k_proj.weight", kPerm));
    add(b + "attn_v.weight", hf(p + "self_attn.v_proj.weight"));
    add(b + "attn_output.weight", hf(p + "self_attn.o_proj.weight"));
    if (c.family === "qwen2") {
      add(b + "attn_q.bias", hf(p + "self_attn.q_proj.bias"));
      add(b + "attn_k.bias", hf(p + "self_attn.k_proj.bias"));
      add(b + "attn_v.bias", hf(p + "self_attn.v_proj.bias"));
    }
    if (c.family === "qwen3") {
      add(b + "attn_q_norm.weight", hf(p + "self_attn.q_norm.weight"));
      add(b + "attn_k_norm.weight", hf(p + "self_attn.k_norm.weight"));
    }
    add(b + "ffn_norm.weight", hf(p + "post_attention_layernorm.weight"));
    add(b + "ffn_gate.weight", hf(p + "mlp.gate_proj.weight"));
    add(b + "ffn_up.weight", hf(p + "mlp.up_proj.weight"));
    add(b + "ffn_down.weight", hf(p + "mlp.down_proj.weight"));
  }
  return list;
}

function buildMetadata(m, vocab, dtype) {
  const c = m.config;
  const a = c.family;
  const name = typeof c.raw._name_or_path === "string" && c.raw._name_or_path ? c.raw._name_or_path : path.basename(path.resolve(m.dir));
  const md = [
    ["general.architecture", kv.str(a)],
    ["general.name", kv.str(name)],
    ["general.alignment", kv.u32(ALIGNMENT)],
    ["general.file_type", kv.u32(FILE_TYPE[dtype])],
    [`${a}.context_length`, kv.u32(c.maxPositions)],
    [`${a}.embedding_length`, kv.u32(c.hidden)],
    [`${a}.block_count`, kv.u32(c.layers)],
    [`${a}.feed_forward_length`, kv.u32(c.ffn)],
    [`${a}.attention.head_count`, kv.u32(c.heads)],
    [`${a}.attention.head_count_kv`, kv.u32(c.kvHeads)],
    [`${a}.attention.layer_norm_rms_epsilon`, kv.f32(c.eps)],
    [`${a}.attention.key_length`, kv.u32(c.headDim)],
    [`${a}.attention.value_length`, kv.u32(c.headDim)],
    [`${a}.rope.freq_base`, kv.f32(c.theta)],
    [`${a}.rope.dimension_count`, kv.u32(c.headDim)],
    [`${a}.vocab_size`, kv.u32(c.vocab)],
    ["tokenizer.ggml.model", kv.str("gpt2")],
    ["tokenizer.ggml.pre", kv.str("default")],
    ["tokenizer.ggml.tokens", kv.strs(vocab.tokens)],
    ["tokenizer.ggml.token_type", kv.i32s(vocab.types)],
    ["tokenizer.ggml.merges", kv.strs(vocab.merges)],
    // Conformance runs feed token ids; never let llama.cpp add a BOS of its own.
    ["tokenizer.ggml.add_bos_token", kv.bool(false)],
  ];
  if (c.bosTokenId !== null && c.bosTokenId < c.vocab) md.push(["tokenizer.ggml.bos_token_id", kv.u32(c.bosTokenId)]);
  const eos = c.eosTokenIds.filter((x) => x < c.vocab);
  if (eos.length) md.push(["tokenizer.ggml.eos_token_id", kv.u32(eos[0])]);
  return md;
}

function writeAll(fd, buf) {
  let off = 0;
  while (off < buf.length) off += fs.writeSync(fd, buf, off, buf.length - off);
}

// Exports DIR to OUT. `dtype` (f32, f16, bf16) is the type of the 2-D weight matrices, or (q8_0,
// q4_0) of the projections with the other 2-D weights in BF16; 1-D tensors are always F32. Returns a summary {arch, family, vocab, tensors, bytes, dtype}.
export function exportGguf(
  modelDir,
  outPath,
  { dtype = "f32", quantizeHead = false, warn = (s) => process.stderr.write(`export_gguf: ${s}\n`) } = {},
) {
  if (!EXPORT_DTYPES.includes(dtype)) fail(`--dtype ${JSON.stringify(dtype)} is not one of ${EXPORT_DTYPES.join(", ")}`);
  if (quantizeHead && !QUANT_DTYPES.has(dtype)) fail(`--quantize-head needs --dtype ${[...QUANT_DTYPES].join(" or ")}`);
  const m = openModel(modelDir);
  const c = m.config;
  if (c.slidingWindow != null && c.slidingWindow < c.maxPositions) {
    warn(`sliding_window ${c.slidingWindow} is not exported (llama.cpp's llama ignores it); compare only prompts shorter than it`);
  }
  const vocab = buildVocab(modelDir, c, warn);
  const tensors = planTensors(m);
  for (const t of tensors) {
    t.type = t.dims.length < 2 ? GGML_TYPE.f32 : GGML_TYPE[dtype];
    if (QUANT_DTYPES.has(dtype) && t.dims.length >= 2 && !PROJECTION.test(t.name) && !quantizeHead) t.type = GGML_TYPE.bf16;
    if (t.type in GGML_BLOCK_BYTES) {
      if (t.dims[0] % QK !== 0) fail(`${t.name}: rows of ${t.dims[0]} values do not split into ${dtype}'s blocks of ${QK}`);
      t.nbytes = (t.numel / QK) * GGML_BLOCK_BYTES[t.type];
    } else t.nbytes = t.numel * GGML_TYPE_BYTES[t.type];
  }
  const md = buildMetadata(m, vocab, dtype);

  const w = new ByteWriter();
  w.u32(GGUF_MAGIC);
  w.u32(GGUF_VERSION);
  w.u64(tensors.length);
  w.u64(md.length);
  for (const [key, v] of md) {
    w.str(key);
    w.u32(v.type);
    if (v.type === T.ARRAY) {
      w.u32(v.elem);
      w.u64(v.value.length);
      for (const x of v.value) writeValue(w, v.elem, x);
    } else writeValue(w, v.type, v.value);
  }
  let offset = 0;
  const align = (x) => Math.ceil(x / ALIGNMENT) * ALIGNMENT;
  for (const t of tensors) {
    t.offset = offset;
    w.str(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(t.type);
    w.u64(offset);
    offset = align(offset + t.nbytes);
  }
  const header = w.concat();
  const dataStart = align(header.length);

  const tmp = `${outPath}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, "w");
  try {
    writeAll(fd, header);
    writeAll(fd, Buffer.alloc(dataStart - header.length));
    let pos = 0;
    for (const t of tensors) {
      if (pos < t.offset) writeAll(fd, Buffer.alloc(t.offset - pos));
      let data = t.load();
      if (data.length !== t.numel) fail(`internal: ${t.name} produced ${data.length} values, expected ${t.numel}`);
      if (t.type in GGML_BLOCK_BYTES) {
        data = quantizeBlocks(data, t.type);
      } else if (t.type !== GGML_TYPE.f32) {
        const { bits, overflows } = t.type === GGML_TYPE.bf16 ? toBf16(data) : toF16(data);
        if (overflows) warn(`${t.name}: ${overflows} finite values are outside the ${dtype} range and became ±inf`);
        data = bits;
      }
      if (data.byteLength !== t.nbytes) fail(`internal: ${t.name} is ${data.byteLength} bytes, expected ${t.nbytes}`);
      writeAll(fd, Buffer.from(data.buffer, data.byteOffset, data.byteLength));
      pos = t.offset + t.nbytes;
    }
    if (pos < offset) writeAll(fd, Buffer.alloc(offset - pos));
  } catch (e) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  fs.closeSync(fd);
  fs.renameSync(tmp, outPath);
  return { arch: c.hfArch, family: c.family, vocab: c.vocab, tensors: tensors.length, bytes: dataStart + offset, dtype, config: c };
}

function parseArgs(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--model" || a === "--out" || a === "--dtype") {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      args[a.slice(2)] = argv[++i];
    } else if (a === "--quantize-head") args.quantizeHead = true;
    else if (a === "-h" || a === "--help") args.help = true;
    else throw new Error(`unknown argument ${a}`);
  }
  return args;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`export_gguf: ${e.message}`);
    process.exit(2);
  }
  if (args.dtype !== undefined && !EXPORT_DTYPES.includes(args.dtype)) {
    console.error(`export_gguf: --dtype must be one of ${EXPORT_DTYPES.join(", ")} (got ${JSON.stringify(args.dtype)})`);
    process.exit(2);
  }
  if (args.help || !args.model || !args.out) {
    console.error("usage: node export_gguf.mjs --model HF_DIR --out FILE.gguf [--dtype f32|f16|bf16|q8_0|q4_0] [--quantize-head]");
    process.exit(args.help ? 0 : 2);
  }
  try {
    const s = exportGguf(args.model, args.out, { dtype: args.dtype ?? "f32", quantizeHead: !!args.quantizeHead });
    console.log(`export_gguf: ${args.model} (${s.arch} → ${s.family}) → ${args.out}: ${s.tensors} tensors, ${s.dtype} weights, vocab ${s.vocab}, ${s.bytes} bytes`);
  } catch (e) {
    console.error(e instanceof ModelError ? `export_gguf: refusing: ${e.message}` : `export_gguf: error: ${e.message}`);
    process.exit(1);
  }
}
