#!/usr/bin/env node
// Self-check of the oracle chain, no Tandem involved: exports a Hugging Face model directory to GGUF,
// runs it in llama.cpp, and compares every position's next-token distribution with the float64
// reference forward pass (reference_forward.mjs). Agreement to ~1e-5 shows the exporter's Q/K
// permutation, rope_freqs and per-architecture keys are right; a wrong permutation or missing rope
// scaling shows up as differences of order 1e-1.
//
//   node check_exporter.mjs --model HF_DIR [--prompts 3] [--tol 1e-4] [--greedy 8] [--threads 2]
//
// Exit status 0 when every position agrees within --tol, top-5 orders agree (near-ties excused) and the
// greedy continuations match; 1 otherwise; 2 on bad usage.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { exportGguf } from "./export_gguf.mjs";
import { loadReferenceModel } from "./reference_forward.mjs";
import { LlamaOracle } from "./lib/llama_oracle.mjs";
import { ModelError } from "./lib/hf_model.mjs";
import { compareTopK, makePrompts, maxAbsDiff, parseFlags } from "./lib/compare.mjs";

const USAGE = "usage: node check_exporter.mjs --model HF_DIR [--prompts N] [--tol P] [--greedy N] [--threads N] [--keep-gguf FILE]";

async function main() {
  let args;
  try {
    args = parseFlags(
      process.argv.slice(2),
      { model: "string", prompts: "number", tol: "number", greedy: "number", threads: "number", "keep-gguf": "string" },
      { prompts: 3, tol: 1e-4, greedy: 8, threads: 2 },
    );
  } catch (e) {
    console.error(`check_exporter: ${e.message}\n${USAGE}`);
    return 2;
  }
  if (args.help || !args.model) {
    console.error(USAGE);
    return args.help ? 0 : 2;
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-check-exporter-"));
  const gguf = args["keep-gguf"] ?? path.join(tmp, "model.gguf");
  let oracle;
  try {
    const summary = exportGguf(args.model, gguf);
    const c = summary.config;
    const ref = loadReferenceModel(args.model);
    const contextSize = 256;
    oracle = await LlamaOracle.create(gguf, { contextSize, threads: args.threads });
    const prompts = makePrompts(args.prompts, c.vocab, contextSize - args.greedy - 1);
    let worst = { max: 0 };
    let positions = 0;
    const failures = [];
    let swaps = 0;
    let greedyOk = 0;
    let maxP = 0; // how peaked the test model is: on a flat distribution |Δp| would mean little
    for (const [pi, ids] of prompts.entries()) {
      const ll = await oracle.distributions(ids, c.vocab);
      const rf = ref.forward(ids);
      for (let i = 0; i < ids.length; i++) {
        positions++;
        for (const x of rf[i]) maxP = Math.max(maxP, x);
        const d = maxAbsDiff(ll[i], rf[i]);
        if (d.max > worst.max) worst = { ...d, prompt: pi, pos: i };
        if (!(d.max <= args.tol)) failures.push(`prompt ${pi} position ${i}: max |Δp| ${d.max.toExponential(3)} at token ${d.at} > ${args.tol}`);
        const t = compareTopK(ll[i], rf[i]);
        swaps += t.swaps.length;
        if (!t.ok) {
          failures.push(`prompt ${pi} position ${i}: top-5 differ at rank ${t.mismatch.rank}: llama.cpp ${t.mismatch.testTop} vs reference ${t.mismatch.oracleTop}`);
        }
      }
      if (args.greedy > 0) {
        const g = await oracle.greedy(ids, args.greedy, c.vocab);
        const r = ref.greedy(ids, args.greedy);
        const k = g.tokens.findIndex((t, i) => t !== r[i]);
        if (k < 0) greedyOk++;
        else failures.push(`prompt ${pi}: greedy differs at step ${k}: llama.cpp ${g.tokens} vs reference ${r}`);
      }
    }
    console.log(
      `check_exporter: ${path.basename(path.resolve(args.model))} (${c.hfArch} → ${c.family}, vocab ${c.vocab}, head_dim ${c.headDim}, ` +
        `GQA ${c.heads}/${c.kvHeads}${c.tied ? ", tied" : ""}${c.ropeScaling ? ", llama3 rope" : ""}): ` +
        `max |Δp| llama.cpp vs float64 reference ${worst.max.toExponential(3)} over ${positions} positions` +
        `${worst.max > 0 ? ` (prompt ${worst.prompt}, position ${worst.pos}, token ${worst.at})` : ""}; ` +
        `largest reference probability ${maxP.toFixed(3)}; top-5 near-tie swaps ${swaps}; ` +
        `greedy ${greedyOk}/${args.greedy > 0 ? prompts.length : 0} prompts agree over ${args.greedy} tokens`,
    );
    if (failures.length) {
      console.error(`check_exporter: FAIL (${failures.length} problems, first 10):\n  ${failures.slice(0, 10).join("\n  ")}`);
      return 1;
    }
    return 0;
  } catch (e) {
    if (e instanceof ModelError) {
      console.error(`check_exporter: refusing model: ${e.message}`);
      return 1;
    }
    console.error(`check_exporter: FAIL: ${e.stack || e.message}`);
    return 1;
  } finally {
    if (oracle) await oracle.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

process.exitCode = await main();
