#!/usr/bin/env node
// llama.cpp's CPU forward-pass throughput on a Hugging Face model directory, measured the way Tandem's
// forward_bench (tests/bench/forward_bench.cc) measures its own, so the two can be compared side by side
// on one machine (scripts/bench_forward.sh does that):
//
//   node bench_llama_cpp.mjs --model HF_DIR [--dtype bf16] [--prompt-len 128] [--decode-tokens 32]
//                            [--decode-batch 1] [--repeats 3] [--threads 2] [--kv-type f16]
//                            [--keep-gguf FILE] [--quantize-head]
//
// The model is exported to a temporary GGUF with its 2-D weights in --dtype (export_gguf.mjs; bf16 from a
// bf16 checkpoint is a plain copy of the bits; q8_0 / q4_0 quantize the layers' projections, and with
// --quantize-head the embedding table and lm_head too) and run by node-llama-cpp's prebuilt CPU llama.cpp with
// flash attention off, a KV cache of --kv-type (f16 by default, llama.cpp's own default; Tandem's CPU KV
// cache is f32 — at these lengths the KV cache is a tiny fraction of the bytes a step reads), --threads
// threads, and batch = ubatch = context size ≥ prompt length, so the prompt is one llama_decode.
//
// Per repeat (the best of --repeats is reported, the sequence cleared between repeats):
// - prefill: one controlledEvaluate of a --prompt-len random prompt with output (logits) for the last
//   token only, as forward_bench asks for the last row only;
// - decode: --decode-tokens single-token controlledEvaluate calls, each producing that token's logits;
//   with --decode-batch B, B sequences (each prefilled with the prompt first, as forward_bench does)
//   each evaluate one token per step, issued together so node-llama-cpp runs them as one llama_decode
//   of B tokens (llama.cpp's timer then counts the steps as "prompt eval" of B tokens each).
// controlledEvaluate is the thinnest public path to llama_decode: it queues exactly the given tokens,
// and with one sequence in the context it dispatches the batch at once (no next-tick batching wait).
// sequence.evaluate() would add the generator, token predictor and repeat-penalty machinery. What is
// timed beyond the model is the addon's async hop (llama_decode runs on a libuv worker) and a greedy
// argmax over the vocabulary, which node-llama-cpp needs in order to mark the token as an output;
// llama.cpp's own timer (performanceTracking + printTimings, pure llama_decode time) is printed on a
// second line per phase so that overhead can be read off (about 0.5 ms a step with a 512-token
// vocabulary, 2–3 ms with a 152k one).
//
// Caveat: node-llama-cpp attaches no ggml threadpool, so with --threads > 1 every llama_decode creates
// its worker threads afresh (one clone() per step, seen with strace). On a small VM a new thread can take
// milliseconds to start running; that shows in llama.cpp's own timer too and dominates decode of a tiny
// model (llama.cpp's own CLI tools attach a persistent, polling threadpool and do not pay it).
//
// Output lines match forward_bench's:
//   prefill: N tokens in X s = Y tokens/s
//   decode:  batch B, Z ms/step = W tokens/s (W = B / step: all sequences' tokens)
// Exit status 0 on success, 1 on failure, 2 on bad usage.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { exportGguf, EXPORT_DTYPES } from "./export_gguf.mjs";
import { ModelError } from "./lib/hf_model.mjs";
import { parseFlags, seededRandom } from "./lib/compare.mjs";

const USAGE =
  "usage: node bench_llama_cpp.mjs --model HF_DIR [--dtype f32|f16|bf16] [--prompt-len 128] [--decode-tokens 32] " +
  "[--decode-batch 1] [--repeats 3] [--threads 2] [--kv-type f16|f32|bf16] [--keep-gguf FILE] [--quantize-head]";

const KV_TYPES = { f16: "F16", f32: "F32", bf16: "BF16" };

// llama_perf_context_print lines, e.g.
//   "llama_perf_context_print: prompt eval time =  12.34 ms /   128 tokens (...)"
//   "llama_perf_context_print:        eval time =  45.67 ms /    31 runs   (...)"
function parsePerf(lines) {
  const out = {};
  for (const l of lines) {
    const m = /(prompt eval|\beval) time\s*=\s*([\d.]+)\s*ms\s*\/\s*(\d+)/.exec(l);
    if (m) out[m[1] === "prompt eval" ? "prompt" : "eval"] = { ms: Number(m[2]), n: Number(m[3]) };
  }
  return out;
}

function nodeLlamaCppVersion() {
  try {
    const pkg = new URL("./node_modules/node-llama-cpp/package.json", import.meta.url);
    return JSON.parse(fs.readFileSync(pkg, "utf8")).version;
  } catch {
    return "?";
  }
}

async function main() {
  let args;
  try {
    args = parseFlags(
      process.argv.slice(2),
      {
        model: "string",
        dtype: "string",
        "prompt-len": "number",
        "decode-tokens": "number",
        "decode-batch": "number",
        repeats: "number",
        threads: "number",
        "kv-type": "string",
        "keep-gguf": "string",
        "quantize-head": "boolean",
      },
      { dtype: "bf16", "prompt-len": 128, "decode-tokens": 32, "decode-batch": 1, repeats: 3, threads: 2, "kv-type": "f16" },
    );
    if (!args.help && !args.model) throw new Error("--model is required");
    if (!EXPORT_DTYPES.includes(args.dtype)) throw new Error(`--dtype must be one of ${EXPORT_DTYPES.join(", ")}`);
    if (!(args["kv-type"] in KV_TYPES)) throw new Error(`--kv-type must be one of ${Object.keys(KV_TYPES).join(", ")}`);
    for (const k of ["prompt-len", "decode-tokens", "decode-batch", "repeats", "threads"]) {
      if (!Number.isInteger(args[k]) || args[k] < 1) throw new Error(`--${k} must be a positive integer`);
    }
  } catch (e) {
    console.error(`bench_llama_cpp: ${e.message}\n${USAGE}`);
    return 2;
  }
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  const promptLen = args["prompt-len"];
  const decodeTokens = args["decode-tokens"];
  const batch = args["decode-batch"];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-bench-llama-"));
  const gguf = args["keep-gguf"] ?? path.join(tmp, `model-${args.dtype}.gguf`);
  let llama, model, context;
  try {
    const summary = exportGguf(args.model, gguf, { dtype: args.dtype, quantizeHead: !!args["quantize-head"], warn: (s) => console.error(`bench_llama_cpp: export: ${s}`) });
    const vocab = summary.vocab;

    // Info-level logs are captured (printTimings reports at info), never printed unless loading fails.
    const logs = [];
    llama = await getLlama({
      gpu: false,
      build: "never",
      maxThreads: args.threads,
      logLevel: LlamaLogLevel.info,
      logger: (level, message) => logs.push(`[${level}] ${message}`.trimEnd()),
    });
    try {
      model = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
    } catch (e) {
      throw new Error(`llama.cpp could not load ${gguf}: ${e.message}\n${logs.join("\n")}`);
    }
    // Context: prompt + decode steps + room for the one token node-llama-cpp keeps free, rounded up.
    const contextSize = Math.ceil((promptLen + decodeTokens + 2) / 256) * 256;
    context = await model.createContext({
      contextSize,
      batchSize: contextSize,
      sequences: batch,
      threads: args.threads,
      flashAttention: false,
      performanceTracking: true,
      experimentalKvCacheKeyType: KV_TYPES[args["kv-type"]],
      experimentalKvCacheValueType: KV_TYPES[args["kv-type"]],
    });
    if (context.batchSize < promptLen) throw new Error(`batch size ${context.batchSize} < prompt length ${promptLen}`);
    const seqs = Array.from({ length: batch }, () => context.getSequence());
    const seq = seqs[0];
    const perf = async () => {
      const start = logs.length;
      await context.printTimings(); // prints and resets llama.cpp's counters
      return parsePerf(logs.slice(start));
    };

    const rand = seededRandom(1);
    const prompt = Array.from({ length: promptLen }, () => Math.floor(rand() * vocab));
    const out = { generateNext: { token: true, options: { temperature: 0 } } };
    // The prompt is plain token ids except the last, which asks for the next token (so its logits exist).
    const promptItems = prompt.map((t, i) => (i === promptLen - 1 ? [t, out] : t));

    let bestPrefill = Infinity;
    let bestDecode = Infinity;
    let bestPrefillInternal = Infinity;
    let bestDecodeInternal = Infinity;
    for (let r = 0; r < args.repeats; r++) {
      for (const s of seqs) await s.clearHistory();
      await perf(); // reset the counters
      let t0 = process.hrtime.bigint();
      const res = await seq.controlledEvaluate(promptItems);
      bestPrefill = Math.min(bestPrefill, Number(process.hrtime.bigint() - t0) / 1e9);
      if (!res[promptLen - 1]?.next || res[promptLen - 1].next.token === undefined) throw new Error("prefill produced no output");
      const p = await perf();
      if (p.prompt && p.prompt.n === promptLen) bestPrefillInternal = Math.min(bestPrefillInternal, p.prompt.ms / 1e3);
      // The other sequences' prompts (untimed).
      for (const s of seqs.slice(1)) await s.controlledEvaluate(promptItems);
      await perf();

      t0 = process.hrtime.bigint();
      for (let step = 0; step < decodeTokens; step++) {
        // Same token ids as forward_bench's decode loop (its choice does not affect the cost).
        const results = await Promise.all(seqs.map((s, i) => s.controlledEvaluate([[(step * 31 + i) % vocab, out]])));
        if (results.some((r1) => !r1[0]?.next)) throw new Error(`decode step ${step} produced no output`);
      }
      bestDecode = Math.min(bestDecode, Number(process.hrtime.bigint() - t0) / 1e9);
      // llama.cpp counts single-token decodes as "eval" runs (and prints "prompt eval … / 1 tokens" when
      // there was none); a step of B > 1 tokens counts as B tokens of "prompt eval".
      const d = await perf();
      if (batch === 1 && d.eval && d.eval.n === decodeTokens) bestDecodeInternal = Math.min(bestDecodeInternal, d.eval.ms / 1e3);
      if (batch > 1 && d.prompt && d.prompt.n === batch * decodeTokens) bestDecodeInternal = Math.min(bestDecodeInternal, d.prompt.ms / 1e3);
    }

    // The feature flags of the ggml CPU variant node-llama-cpp loaded (it picks the best for this CPU).
    const cpuFeatures = (/CPU\s*:(.*?)(\||$)/.test(llama.systemInfo) ? llama.systemInfo : "")
      .split("|")
      .map((x) => x.replace(/^\s*CPU\s*:/, "").trim())
      .filter((x) => /= 1$/.test(x))
      .map((x) => x.replace(/\s*= 1$/, ""))
      .join(",");
    console.log(
      `model=${args.model} arch=${summary.family} gguf=${args.dtype}${args["quantize-head"] ? "+head" : ""} (${(summary.bytes / 1e6).toFixed(1)} MB) ` +
        `backend=node-llama-cpp ${nodeLlamaCppVersion()} (llama.cpp ${llama.llamaCppRelease.release}; ${cpuFeatures || "?"}) ` +
        `threads=${context.currentThreads} kv=${args["kv-type"]} flash_attn=off batch=${context.batchSize}`,
    );
    const step = bestDecode / decodeTokens;
    console.log(`prefill: ${promptLen} tokens in ${bestPrefill.toFixed(4)} s = ${(promptLen / bestPrefill).toFixed(1)} tokens/s`);
    console.log(`decode:  batch ${batch}, ${(step * 1e3).toFixed(2)} ms/step = ${(batch / step).toFixed(1)} tokens/s`);
    const fmt = (s, n) => (Number.isFinite(s) ? `${(s * 1e3).toFixed(2)} ms (${(n / s).toFixed(1)} tokens/s)` : "n/a");
    console.log(
      `llama.cpp internal timer (llama_decode only, best of ${args.repeats}): prefill ${fmt(bestPrefillInternal, promptLen)}, ` +
        `decode ${fmt(bestDecodeInternal / decodeTokens, batch)} per step`,
    );
    return 0;
  } catch (e) {
    console.error(e instanceof ModelError ? `bench_llama_cpp: refusing: ${e.message}` : `bench_llama_cpp: error: ${e.stack ?? e.message}`);
    return 1;
  } finally {
    await context?.dispose();
    await model?.dispose();
    await llama?.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

process.exitCode = await main();
