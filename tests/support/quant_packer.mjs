// A test-side packer of quantized checkpoints, written from the formats' documentation (AutoGPTQ's
// and GPTQModel's QuantLinear.pack, AutoAWQ's WQLinear_GEMM.from_linear, compressed-tensors'
// pack_to_int32), never from Tandem's loader. For a model directory it quantizes every projection
// (q/k/v/o, gate/up/down) with its own round-to-nearest and writes, per variant:
//   OUT/<variant>/      the checkpoint in that format (config.json with its quantization_config)
//   OUT/<variant>-ref/  the same model with each projection as the F32 floats the packed codes stand
//                       for: (q - zero) * scale, computed here in f32
// and hostile variants (OUT/broken-*/) whose one defect Tandem must refuse, naming the tensor.
//
//   node quant_packer.mjs MODEL_DIR OUT_DIR [VARIANT ...]   (default: every variant)
import fs from "node:fs";
import path from "node:path";
import { openSafetensors, readTensor } from "../conformance/lib/hf_model.mjs";

const VARIANTS = {
  "gptq-4-g32-sym": { format: "gptq", bits: 4, group: 32, sym: true, v2: false },
  "gptq-4-g64-asym-act": { format: "gptq", bits: 4, group: 64, sym: false, v2: false, act: true },
  "gptq-8-ch-asym-v2": { format: "gptq", bits: 8, group: -1, sym: false, v2: true },
  "gptq-8-g64-sym-v2-act": { format: "gptq", bits: 8, group: 64, sym: true, v2: true, act: true },
  "awq-4-g64": { format: "awq", bits: 4, group: 64, sym: false },
  "awq-4-g128": { format: "awq", bits: 4, group: 128, sym: false },
  "ct-4-g32-sym": { format: "ct", bits: 4, group: 32, sym: true },
  "ct-8-ch-asym-packedzp": { format: "ct", bits: 8, group: -1, sym: false, zp: "packed" },
  "ct-4-g64-asym-int8zp-act": { format: "ct", bits: 4, group: 64, sym: false, zp: "int8", act: true },
  "ct-8-g64-sym-act": { format: "ct", bits: 8, group: 64, sym: true, act: true },
};
const PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

// --- float formats -------------------------------------------------------------------------------
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
function toBf16Bits(x) {
  f32[0] = x;
  const b = u32[0];
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;  // ties to even (finite inputs)
}
function bf16Value(h) {
  u32[0] = h << 16;
  return f32[0];
}
function toF16Bits(x) {
  // Round to nearest even via the f16 grid: scales here are positive normals of f16.
  const e = Math.floor(Math.log2(x));
  const step = Math.pow(2, e - 10);
  let m = Math.round(x / step);
  if (Math.abs(x / step - Math.trunc(x / step) - 0.5) < 1e-12 && m % 2 === 1) m -= 1;
  let exp = e + 15, mant = m - 1024;
  if (mant === 1024) { exp += 1; mant = 0; }
  if (exp <= 0 || exp >= 31) throw new Error(`scale ${x} outside f16's normal range`);
  return (exp << 10) | mant;
}
function f16Value(h) {
  const exp = (h >> 10) & 31, mant = h & 1023;
  return Math.pow(2, exp - 15) * (1 + mant / 1024);
}

// --- safetensors ---------------------------------------------------------------------------------
function writeSafetensors(file, tensors) {
  const header = {};
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.data.length] };
    offset += t.data.length;
  }
  header.__metadata__ = { format: "pt" };
  let json = JSON.stringify(header);
  while ((8 + json.length) % 8 !== 0) json += " ";
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(json), ...tensors.map((t) => t.data)]));
}
const bytesOf = (typed) => Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength);
function rawTensor(info) {
  const buf = Buffer.alloc(info.nbytes);
  const fd = fs.openSync(info.file, "r");
  fs.readSync(fd, buf, 0, info.nbytes, info.start);
  fs.closeSync(fd);
  return buf;
}

// --- quantization (the packer's own round to nearest) ------------------------------------------
// w: Float32Array [N][K]. Returns codes u[n][k] (unsigned, 0..2^b-1), per (n, g) scale (exact in
// the scale's storage type) and unsigned zero z, the group of each input column, and the f32
// dequantized weights.
function quantize(w, N, K, v, scaleType, rng) {
  const b = v.bits, maxq = (1 << b) - 1, half = 1 << (b - 1);
  const gs = v.group > 0 ? v.group : K;
  const G = K / gs;
  // Act-order: columns in a random order form the groups (as GPTQ's Hessian order would).
  const order = [...Array(K).keys()];
  if (v.act) for (let i = K - 1; i > 0; i--) { const j = Math.floor(rng() * (i + 1)); [order[i], order[j]] = [order[j], order[i]]; }
  const gIdx = new Int32Array(K);
  order.forEach((k, rank) => { gIdx[k] = Math.floor(rank / gs); });
  const u = new Int32Array(N * K), scale = new Float64Array(N * G), scaleBits = new Uint16Array(N * G);
  const zero = new Int32Array(N * G), deq = new Float32Array(N * K);
  for (let n = 0; n < N; n++) {
    for (let g = 0; g < G; g++) {
      const cols = order.slice(g * gs, (g + 1) * gs);
      let lo = 0, hi = 0;
      for (const k of cols) { lo = Math.min(lo, w[n * K + k]); hi = Math.max(hi, w[n * K + k]); }
      let s, z;
      if (v.sym) {
        s = Math.max(-lo, hi) / (half - 0.5);
        z = half;
      } else {
        s = (hi - lo) / maxq;
        z = s > 0 ? Math.round(-lo / s) : half;
        // GPTQ's original format stores zero - 1: a zero of 0 has no encoding there.
        if (v.format === "gptq" && !v.v2) z = Math.max(1, z);
        z = Math.min(maxq, Math.max(0, z));
      }
      if (!(s > 0)) s = 1e-3;
      const bits = scaleType === "F16" ? toF16Bits(s) : toBf16Bits(s);
      s = scaleType === "F16" ? f16Value(bits) : bf16Value(bits);
      scale[n * G + g] = s;
      scaleBits[n * G + g] = bits;
      zero[n * G + g] = z;
      for (const k of cols) {
        const q = Math.min(maxq, Math.max(0, Math.round(w[n * K + k] / s) + z));
        u[n * K + k] = q;
        deq[n * K + k] = Math.fround((q - z) * s);  // (q - z) is exact; one f32 rounding
      }
    }
  }
  return { u, scale, scaleBits, zero, gIdx, deq, G, gs };
}

// --- packing per format --------------------------------------------------------------------------
function packGptq(prefix, N, K, v, q) {
  const b = v.bits, pf = 32 / b;
  const qweight = new Uint32Array((K / pf) * N);
  for (let k = 0; k < K; k++) for (let n = 0; n < N; n++) qweight[Math.floor(k / pf) * N + n] |= q.u[n * K + k] << (b * (k % pf));
  const qzeros = new Uint32Array(q.G * (N / pf));
  for (let g = 0; g < q.G; g++) for (let n = 0; n < N; n++) {
    const stored = v.v2 ? q.zero[n * q.G + g] : q.zero[n * q.G + g] - 1;
    qzeros[g * (N / pf) + Math.floor(n / pf)] |= stored << (b * (n % pf));
  }
  const scales = new Uint16Array(q.G * N);
  for (let g = 0; g < q.G; g++) for (let n = 0; n < N; n++) scales[g * N + n] = q.scaleBits[n * q.G + g];
  return [
    { name: `${prefix}.qweight`, dtype: "I32", shape: [K / pf, N], data: bytesOf(qweight) },
    { name: `${prefix}.qzeros`, dtype: "I32", shape: [q.G, N / pf], data: bytesOf(qzeros) },
    { name: `${prefix}.scales`, dtype: "F16", shape: [q.G, N], data: bytesOf(scales) },
    { name: `${prefix}.g_idx`, dtype: "I32", shape: [K], data: bytesOf(q.gIdx) },
  ];
}

const AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7];  // nibble i of a word holds column 8c + AWQ_ORDER[i]
function packAwq(prefix, N, K, v, q) {
  const nibble = (n) => AWQ_ORDER.indexOf(n % 8);
  const qweight = new Uint32Array(K * (N / 8));
  for (let k = 0; k < K; k++) for (let n = 0; n < N; n++) qweight[k * (N / 8) + Math.floor(n / 8)] |= q.u[n * K + k] << (4 * nibble(n));
  const qzeros = new Uint32Array(q.G * (N / 8));
  for (let g = 0; g < q.G; g++) for (let n = 0; n < N; n++) qzeros[g * (N / 8) + Math.floor(n / 8)] |= q.zero[n * q.G + g] << (4 * nibble(n));
  const scales = new Uint16Array(q.G * N);
  for (let g = 0; g < q.G; g++) for (let n = 0; n < N; n++) scales[g * N + n] = q.scaleBits[n * q.G + g];
  return [
    { name: `${prefix}.qweight`, dtype: "I32", shape: [K, N / 8], data: bytesOf(qweight) },
    { name: `${prefix}.qzeros`, dtype: "I32", shape: [q.G, N / 8], data: bytesOf(qzeros) },
    { name: `${prefix}.scales`, dtype: "F16", shape: [q.G, N], data: bytesOf(scales) },
  ];
}

// compressed-tensors: signed q = u - 2^(b-1), stored offset binary (q + 2^(b-1) = u); the zero
// point zp = z - 2^(b-1) likewise, packed along N, or unpacked int8 (before compressed-tensors 0.9.4).
function packCompressed(prefix, N, K, v, q) {
  const b = v.bits, pf = 32 / b, half = 1 << (b - 1), words = Math.ceil(K / pf);
  const packed = new Uint32Array(N * words);
  for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) packed[n * words + Math.floor(k / pf)] |= q.u[n * K + k] << (b * (k % pf));
  const scales = new Uint16Array(N * q.G);
  scales.set(q.scaleBits);
  const out = [
    { name: `${prefix}.weight_packed`, dtype: "I32", shape: [N, words], data: bytesOf(packed) },
    { name: `${prefix}.weight_scale`, dtype: "BF16", shape: [N, q.G], data: bytesOf(scales) },
    { name: `${prefix}.weight_shape`, dtype: "I64", shape: [2], data: bytesOf(new BigInt64Array([BigInt(N), BigInt(K)])) },
  ];
  if (!v.sym) {
    if (v.zp === "int8") {
      const zp = new Int8Array(N * q.G);
      for (let i = 0; i < N * q.G; i++) zp[i] = q.zero[i] - half;
      out.push({ name: `${prefix}.weight_zero_point`, dtype: "I8", shape: [N, q.G], data: bytesOf(zp) });
    } else {
      const rows = Math.ceil(N / pf);
      const zp = new Uint32Array(rows * q.G);
      for (let n = 0; n < N; n++) for (let g = 0; g < q.G; g++) zp[Math.floor(n / pf) * q.G + g] |= q.zero[n * q.G + g] << (b * (n % pf));
      out.push({ name: `${prefix}.weight_zero_point`, dtype: "I32", shape: [rows, q.G], data: bytesOf(zp) });
    }
  }
  if (v.act) out.push({ name: `${prefix}.weight_g_idx`, dtype: "I32", shape: [K], data: bytesOf(q.gIdx) });
  return out;
}

function quantizationConfig(v) {
  const group = v.group;
  if (v.format === "gptq") {
    return { quant_method: "gptq", bits: v.bits, group_size: group, desc_act: !!v.act, sym: v.sym,
             damp_percent: 0.01, static_groups: false, true_sequential: true,
             checkpoint_format: v.v2 ? "gptq_v2" : "gptq" };
  }
  if (v.format === "awq") return { quant_method: "awq", zero_point: true, group_size: group, bits: 4, version: "gemm", modules_to_not_convert: null };
  return {
    quant_method: "compressed-tensors", format: "pack-quantized", quantization_status: "compressed", ignore: ["lm_head"],
    config_groups: { group_0: { targets: ["Linear"], format: "pack-quantized", input_activations: null, output_activations: null,
      weights: { num_bits: v.bits, type: "int", symmetric: v.sym, strategy: group > 0 ? "group" : "channel",
                 group_size: group > 0 ? group : null, actorder: v.act ? "group" : null, dynamic: false } } },
  };
}

function copyTokenizer(src, dst) {
  for (const f of fs.readdirSync(src)) if (f !== "config.json" && !f.endsWith(".safetensors") && !f.endsWith(".index.json")) fs.copyFileSync(path.join(src, f), path.join(dst, f));
}

function writeVariant(src, out, name, v, breakWith) {
  const tensors = openSafetensors(src);
  const config = JSON.parse(fs.readFileSync(path.join(src, "config.json"), "utf8"));
  let seed = 12345;
  const rng = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
  const quantized = [], reference = [];
  for (const [tname, info] of tensors) {
    const m = tname.match(/^(model\.layers\.\d+\.(self_attn|mlp)\.(\w+))\.weight$/);
    if (!m || !PROJECTIONS.includes(m[3])) {
      const data = rawTensor(info);
      quantized.push({ name: tname, dtype: info.dtype, shape: info.shape, data });
      reference.push({ name: tname, dtype: info.dtype, shape: info.shape, data });
      continue;
    }
    const [N, K] = info.shape;
    const q = quantize(readTensor(info), N, K, v, v.format === "ct" ? "BF16" : "F16", rng);
    const pack = v.format === "gptq" ? packGptq : v.format === "awq" ? packAwq : packCompressed;
    quantized.push(...pack(m[1], N, K, v, q));
    reference.push({ name: tname, dtype: "F32", shape: [N, K], data: bytesOf(q.deq) });
  }
  const qconfig = { ...config, quantization_config: quantizationConfig(v) };
  if (breakWith) breakWith(quantized, qconfig);
  const dir = path.join(out, name);
  fs.mkdirSync(dir, { recursive: true });
  writeSafetensors(path.join(dir, "model.safetensors"), quantized);
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(qconfig, null, 2));
  copyTokenizer(src, dir);
  if (breakWith) return;
  const ref = path.join(out, `${name}-ref`);
  fs.mkdirSync(ref, { recursive: true });
  writeSafetensors(path.join(ref, "model.safetensors"), reference);
  fs.writeFileSync(path.join(ref, "config.json"), JSON.stringify(config, null, 2));
  copyTokenizer(src, ref);
}

// Each breaks one thing; the test expects Tandem to name the tensor or field.
const find = (ts, suffix) => ts.find((t) => t.name.endsWith(suffix));
const BROKEN = {
  "broken-gidx-range": ["gptq-4-g64-asym-act", (ts) => { const t = find(ts, "layers.0.mlp.up_proj.g_idx"); t.data = Buffer.from(t.data); t.data.writeInt32LE(99, 0); }],
  // Column 0 moves to another group: one group has a column too many, another one too few.
  "broken-gidx-unequal": ["gptq-4-g64-asym-act", (ts) => { const t = find(ts, "layers.1.self_attn.o_proj.g_idx"); t.data = Buffer.from(t.data); t.data.writeInt32LE(t.data.readInt32LE(0) === 0 ? 1 : 0, 0); }],
  "broken-qweight-shape": ["awq-4-g64", (ts) => { const t = find(ts, "layers.0.self_attn.k_proj.qweight"); t.shape = [t.shape[0] / 2, t.shape[1] * 2]; }],
  "broken-bits": ["gptq-4-g32-sym", (ts, c) => { c.quantization_config.bits = 3; }],
  "broken-method": ["gptq-4-g32-sym", (ts, c) => { c.quantization_config.quant_method = "exl2"; }],
  "broken-group": ["ct-4-g32-sym", (ts, c) => { c.quantization_config.config_groups.group_0.weights.group_size = 96; }],
  "broken-scale-dtype": ["ct-4-g32-sym", (ts) => { const t = find(ts, "layers.0.mlp.down_proj.weight_scale"); t.dtype = "I32"; t.shape = [t.shape[0], t.shape[1] / 2]; }],
  "broken-unsupported-format": ["gptq-4-g32-sym", (ts, c) => { c.quantization_config.checkpoint_format = "marlin"; }],
};

const [src, out, ...wanted] = process.argv.slice(2);
if (!src || !out) {
  console.error("usage: node quant_packer.mjs MODEL_DIR OUT_DIR [VARIANT ...]");
  process.exit(2);
}
const names = wanted.length ? wanted : [...Object.keys(VARIANTS), ...Object.keys(BROKEN)];
for (const name of names) {
  if (VARIANTS[name]) writeVariant(src, out, name, VARIANTS[name]);
  else if (BROKEN[name]) writeVariant(src, out, name, VARIANTS[BROKEN[name][0]], BROKEN[name][1]);
  else { console.error(`unknown variant ${name}`); process.exit(2); }
}
