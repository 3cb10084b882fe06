#!/usr/bin/env node
// Self-check of export_gguf.mjs's Q8_0 / Q4_0 blocks, no Tandem involved (the quantized GGUFs are
// what the llama.cpp side of the CPU quantization benchmark runs, so they must hold what we think):
//
//   node check_quant_export.mjs --model HF_DIR [--prompts 2] [--threads 2]
//
// 1. The block formulas on synthetic rows (zeros, one outlier, negative extremes, random): codes in
//    range, the extreme element on its extreme code, every value within the documented rounding
//    error of its reconstruction.
// 2. llama.cpp reads the blocks as we write them: for each type the model is exported quantized and
//    run by llama.cpp, and the float64 reference forward pass runs twice, on the weights
//    dequantized from our blocks and on the original weights. llama.cpp's distributions must sit
//    within 5e-2 of the dequantized weights' (it also rounds activations to 8 bits on this path, so
//    not to 1e-5; a wrong scale or row layout gives differences of order 1), and for Q4_0, whose
//    weight rounding dwarfs the activations', at least 3× closer to them than to the original
//    weights': a wrong nibble order would leave llama.cpp nearer neither.
// Exit status 0 when every check holds, 1 otherwise, 2 on bad usage.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { exportGguf, quantizeBlocks, dequantizeBlocks, GGML_TYPE } from "./export_gguf.mjs";
import { loadReferenceModel } from "./reference_forward.mjs";
import { LlamaOracle } from "./lib/llama_oracle.mjs";
import { openModel, readTensor } from "./lib/hf_model.mjs";
import { makePrompts, maxAbsDiff, parseFlags, seededRandom } from "./lib/compare.mjs";

const USAGE = "usage: node check_quant_export.mjs --model HF_DIR [--prompts N] [--threads N]";
const QK = 32;
const PROJECTION = /^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$/;

function checkBlocks(failures) {
  const rand = seededRandom(7);
  const rows = [
    new Float32Array(QK),
    Float32Array.from({ length: QK }, (_, i) => (i === 5 ? 3.5 : 0.01 * i)),
    Float32Array.from({ length: QK }, (_, i) => (i === 20 ? -2.25 : 0.3 - 0.02 * i)),
    Float32Array.from({ length: QK * 64 }, () => (rand() - 0.5) * 0.2),
  ];
  let checked = 0;
  for (const [name, type, lo, hi] of [
    ["q8_0", GGML_TYPE.q8_0, -127, 127],
    ["q4_0", GGML_TYPE.q4_0, 0, 15],
  ]) {
    const per = type === GGML_TYPE.q8_0 ? 2 + QK : 2 + QK / 2;
    for (const [ri, x] of rows.entries()) {
      const buf = quantizeBlocks(x, type);
      if (buf.length !== (x.length / QK) * per) failures.push(`${name} row ${ri}: ${buf.length} bytes`);
      const y = dequantizeBlocks(buf, type, x.length);
      for (let b = 0; b < x.length / QK; b++) {
        const blk = x.subarray(b * QK, (b + 1) * QK);
        let at = 0;
        for (let i = 1; i < QK; i++) if (Math.abs(blk[i]) > Math.abs(blk[at])) at = i;
        const amax = Math.abs(blk[at]);
        // The step between codes; rounding picks the nearest code (Q4_0's top code 15 stands in
        // for 16, a whole step), plus what the f16 rounding of the scale moves the largest code.
        const step = type === GGML_TYPE.q8_0 ? amax / 127 : amax / 8;
        const bound = (type === GGML_TYPE.q8_0 ? 0.5 : 1) * step + amax * 2 ** -10 + 1e-12;
        for (let i = 0; i < QK; i++) {
          checked++;
          const code = type === GGML_TYPE.q8_0 ? buf.readInt8(b * per + 2 + i) : (buf[b * per + 2 + (i % 16)] >> (i < 16 ? 0 : 4)) & 15;
          if (code < lo || code > hi) failures.push(`${name} row ${ri} block ${b}: code ${code} out of range`);
          if (!(Math.abs(y[b * QK + i] - blk[i]) <= bound)) {
            failures.push(`${name} row ${ri} block ${b} element ${i}: ${blk[i]} came back as ${y[b * QK + i]} (bound ${bound})`);
          }
        }
        if (amax > 0) {
          const code = type === GGML_TYPE.q8_0 ? buf.readInt8(b * per + 2 + at) : (buf[b * per + 2 + (at % 16)] >> (at < 16 ? 0 : 4)) & 15;
          const want = type === GGML_TYPE.q8_0 ? Math.sign(blk[at]) * 127 : 0;
          if (code !== want) failures.push(`${name} row ${ri} block ${b}: the largest element has code ${code}, not ${want}`);
        }
      }
    }
  }
  return checked;
}

// A copy of DIR in F32 whose projections are what `type`'s blocks hold.
function writeDequantized(dir, out, type) {
  const m = openModel(dir);
  fs.mkdirSync(out, { recursive: true });
  for (const f of fs.readdirSync(dir)) {
    if (f.endsWith(".json") && !f.startsWith("model.safetensors")) fs.copyFileSync(path.join(dir, f), path.join(out, f));
  }
  const header = {};
  const parts = [];
  let offset = 0;
  for (const [name, info] of m.tensors) {
    let data = readTensor(info);
    if (PROJECTION.test(name)) data = dequantizeBlocks(quantizeBlocks(data, type), type, data.length);
    const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    header[name] = { dtype: "F32", shape: info.shape, data_offsets: [offset, offset + bytes.length] };
    parts.push(bytes);
    offset += bytes.length;
  }
  let json = Buffer.from(JSON.stringify(header));
  json = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(path.join(out, "model.safetensors"), Buffer.concat([len, json, ...parts]));
}

async function main() {
  let args;
  try {
    args = parseFlags(process.argv.slice(2), { model: "string", prompts: "number", threads: "number" }, { prompts: 2, threads: 2 });
  } catch (e) {
    console.error(`check_quant_export: ${e.message}\n${USAGE}`);
    return 2;
  }
  if (args.help || !args.model) {
    console.error(USAGE);
    return args.help ? 0 : 2;
  }
  const failures = [];
  const checked = checkBlocks(failures);
  console.log(`check_quant_export: block formulas: ${checked} values checked`);
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-check-quant-"));
  try {
    const original = loadReferenceModel(args.model);
    for (const dtype of ["q8_0", "q4_0"]) {
      const gguf = path.join(tmp, `${dtype}.gguf`);
      const summary = exportGguf(args.model, gguf, { dtype });
      const deqDir = path.join(tmp, dtype);
      writeDequantized(args.model, deqDir, GGML_TYPE[dtype]);
      const deq = loadReferenceModel(deqDir);
      const oracle = await LlamaOracle.create(gguf, { contextSize: 128, threads: args.threads });
      let toDeq = 0;
      let toOrig = 0;
      try {
        for (const ids of makePrompts(args.prompts, summary.vocab, 100)) {
          const ll = await oracle.distributions(ids, summary.vocab);
          const rd = deq.forward(ids);
          const ro = original.forward(ids);
          for (let i = 0; i < ids.length; i++) {
            toDeq = Math.max(toDeq, maxAbsDiff(ll[i], rd[i]).max);
            toOrig = Math.max(toOrig, maxAbsDiff(ll[i], ro[i]).max);
          }
        }
      } finally {
        await oracle.dispose();
      }
      console.log(
        `check_quant_export: ${dtype}: llama.cpp vs the dequantized weights max |Δp| ${toDeq.toExponential(3)}, ` +
          `vs the original weights ${toOrig.toExponential(3)}`,
      );
      if (!(toDeq <= 5e-2)) failures.push(`${dtype}: llama.cpp is ${toDeq} from the dequantized weights (> 5e-2)`);
      // At 4 bits the weights' own rounding is far above the activations': llama.cpp must follow
      // the blocks' values. (At 8 bits the two are alike, and the bound above is the check.)
      if (dtype === "q4_0" && !(toDeq * 3 <= toOrig)) {
        failures.push(`${dtype}: llama.cpp is not clearly nearer the dequantized weights (${toDeq}) than the original (${toOrig})`);
      }
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  if (failures.length) {
    console.error(`check_quant_export: FAIL (${failures.length} problems, first 10):\n  ${failures.slice(0, 10).join("\n  ")}`);
    return 1;
  }
  return 0;
}

process.exitCode = await main();
