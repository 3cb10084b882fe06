#!/usr/bin/env node
// Conformance of Tandem against llama.cpp: the same model, the same token ids, the full next-token
// distribution at every prompt position and at every greedy decode step, and the greedy continuation.
//
//   node llama_conformance.mjs --tandem PATH_TO_tandem --model HF_DIR
//        [--prompts 3] [--greedy 32] [--tol 2e-3] [--threads 2] [--logprobs-k K] [--also-reference]
//        [--timeout 300] [--keep-gguf FILE]
//
// The model directory is exported to a temporary all-F32 GGUF (export_gguf.mjs) and evaluated by
// llama.cpp with flash attention off and an F32 KV cache. Tandem is run as a subprocess:
//   tandem generate --model DIR --token-ids a,b,c --max-tokens 0 --prompt-logprobs K --json
//     prompt_logprobs[i] (i ≥ 1) is Tandem's distribution at position i given tokens 0..i−1 (vLLM
//     convention), i.e. llama.cpp's distribution after evaluating token i−1;
//   tandem generate --model DIR --token-ids a,b,c --max-tokens G --temperature 0 --ignore-eos --logprobs K --json
//     logprobs[0] is the distribution after the last prompt token, logprobs[s] the one after greedy
//     token s−1 (compared while the greedy tokens agree), token_ids the greedy continuation.
// K defaults to the vocabulary size, so the whole distribution comes back; with a smaller K the listed
// tokens are compared exactly and every unlisted token must have llama.cpp probability at most the
// smallest listed one (+ tol).
//
// A position passes when the top-5 token ids agree in order (a swap of two candidates within 1e-6
// probability is allowed and reported) and max over tokens |p_tandem − p_llama| ≤ tol. Greedy passes
// when all G tokens agree (a divergence at a near-tie of the oracle is excused and reported; an early
// stop must be at an end-of-sequence token). Exit status: 0 pass, 1 failure, 2 bad usage.

import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { exportGguf } from "./export_gguf.mjs";
import { LlamaOracle } from "./lib/llama_oracle.mjs";
import { ModelError } from "./lib/hf_model.mjs";
import { compareTopK, makePrompts, maxAbsDiff, parseFlags } from "./lib/compare.mjs";

const USAGE =
  "usage: node llama_conformance.mjs --tandem PATH --model HF_DIR [--prompts N] [--greedy N] [--tol P] [--threads N]\n" +
  "                                  [--logprobs-k K] [--also-reference] [--timeout SECONDS] [--keep-gguf FILE]";
const TIE_EPS = 1e-6;

class TandemError extends Error {}

// Runs Tandem; resolves to the parsed JSON object or throws TandemError with its stderr.
function runTandem(bin, args, timeoutS) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    const out = [];
    const err = [];
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, timeoutS * 1000);
    child.stdout.on("data", (b) => out.push(b));
    child.stderr.on("data", (b) => err.push(b));
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(new TandemError(`cannot run ${bin}: ${e.message}`));
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      const stdout = Buffer.concat(out).toString("utf8");
      const stderr = Buffer.concat(err).toString("utf8");
      const cmd = `${bin} ${args.map((a) => (a.length > 80 ? a.slice(0, 77) + "..." : a)).join(" ")}`;
      const tail = (s) => (s.length > 4000 ? "…" + s.slice(-4000) : s);
      if (timedOut || code !== 0) {
        const why = timedOut ? `timed out after ${timeoutS}s` : signal ? `was killed by ${signal}` : `exited with status ${code}`;
        reject(new TandemError(`Tandem ${why}: ${cmd}\n--- stderr ---\n${tail(stderr)}`));
        return;
      }
      try {
        const obj = JSON.parse(stdout);
        if (obj === null || typeof obj !== "object" || Array.isArray(obj)) throw new Error("not a JSON object");
        resolve(obj);
      } catch (e) {
        reject(new TandemError(`Tandem printed no single JSON object (${e.message}): ${cmd}\n--- stdout ---\n${tail(stdout)}\n--- stderr ---\n${tail(stderr)}`));
      }
    });
  });
}

// Validates one logprob entry {token_id, logprob, rank, top: [{token_id, logprob}]} and turns it into a
// probability vector: p[t] for listed tokens, NaN for unlisted. Throws TandemError on malformed input.
function entryToDistribution(e, vocab, expectedToken, where) {
  const bad = (msg) => {
    throw new TandemError(`${where}: ${msg}: ${JSON.stringify(e).slice(0, 300)}`);
  };
  if (e === null || typeof e !== "object") bad("entry is not an object");
  if (!Array.isArray(e.top) || e.top.length === 0) bad("no top list");
  if (e.token_id !== expectedToken) bad(`token_id ${e.token_id}, expected ${expectedToken}`);
  if (typeof e.logprob !== "number") bad("logprob is not a number");
  const p = new Float64Array(vocab).fill(NaN);
  const order = [];
  let prev = Infinity;
  for (const t of e.top) {
    if (!t || !Number.isInteger(t.token_id) || t.token_id < 0 || t.token_id >= vocab) bad(`top entry with bad token_id ${t && t.token_id}`);
    if (typeof t.logprob !== "number" || !(t.logprob <= 1e-6)) bad(`top entry for ${t.token_id} has logprob ${t.logprob}`);
    if (!Number.isNaN(p[t.token_id])) bad(`token ${t.token_id} listed twice in top`);
    if (t.logprob > prev) bad(`top is not sorted by logprob descending at token ${t.token_id}`);
    prev = t.logprob;
    p[t.token_id] = Math.exp(t.logprob);
    order.push(t.token_id);
  }
  const own = e.top.find((t) => t.token_id === e.token_id);
  if (own && Math.abs(own.logprob - e.logprob) > 1e-5 * (1 + Math.abs(e.logprob))) {
    bad(`logprob ${e.logprob} disagrees with its own top entry ${own.logprob}`);
  }
  if (e.rank !== undefined) {
    // vLLM convention: rank 1 is the most likely token; tied tokens may be ranked either way.
    const higher = e.top.filter((t) => t.logprob > e.logprob + 1e-6).length;
    const notLower = e.top.filter((t) => t.logprob >= e.logprob - 1e-6).length;
    const ok = own ? e.rank >= higher + 1 && e.rank <= notLower : e.rank >= e.top.length + 1;
    if (!Number.isInteger(e.rank) || !ok) {
      bad(`rank ${e.rank} is inconsistent with the listed logprobs (expected ${own ? (higher + 1 === notLower ? higher + 1 : `${higher + 1}..${notLower}`) : `> ${e.top.length}`}, 1-based)`);
    }
  }
  return { p, order, full: e.top.length === vocab };
}

// Compares Tandem's (possibly partial) distribution with the oracle's. Returns {maxDiff, at, problems[], swaps}.
function compareDistribution(t, oracle, tol) {
  const problems = [];
  let maxDiff = 0;
  let at = -1;
  let minListed = Infinity;
  let sum = 0;
  for (let i = 0; i < oracle.length; i++) {
    if (Number.isNaN(t.p[i])) continue;
    sum += t.p[i];
    minListed = Math.min(minListed, t.p[i]);
    const d = Math.abs(t.p[i] - oracle[i]);
    if (d > maxDiff) {
      maxDiff = d;
      at = i;
    }
  }
  if (t.full) {
    if (Math.abs(sum - 1) > tol) problems.push(`probabilities sum to ${sum}`);
  } else {
    for (let i = 0; i < oracle.length; i++) {
      if (Number.isNaN(t.p[i]) && oracle[i] > minListed + tol) {
        problems.push(`token ${i} (oracle p ${oracle[i].toExponential(3)}) is missing from Tandem's top list, whose smallest p is ${minListed.toExponential(3)}`);
        break;
      }
    }
  }
  if (!(maxDiff <= tol)) problems.push(`max |Δp| ${maxDiff.toExponential(3)} at token ${at} (Tandem ${t.p[at]}, oracle ${oracle[at]}) > tol ${tol}`);
  const k = Math.min(5, t.order.length);
  const topk = compareTopK(null, oracle, k, TIE_EPS, t.order.slice(0, k));
  if (!topk.ok) {
    problems.push(`top-${k} differ at rank ${topk.mismatch.rank}: Tandem [${topk.mismatch.testTop}] vs oracle [${topk.mismatch.oracleTop}]`);
  }
  return { maxDiff, at, problems, swaps: topk.swaps };
}

class Report {
  constructor(tol) {
    this.tol = tol;
    this.failures = [];
    this.notes = [];
    this.worst = { maxDiff: 0 };
    this.prefillPositions = 0;
    this.decodePositions = 0;
    this.refWorst = 0;
  }
  position(kind, where, t, oracle) {
    const r = compareDistribution(t, oracle, this.tol);
    if (kind === "prefill") this.prefillPositions++;
    else this.decodePositions++;
    if (r.maxDiff > this.worst.maxDiff) this.worst = { maxDiff: r.maxDiff, where, token: r.at };
    for (const s of r.swaps) this.notes.push(`${where}: near-tie swap at rank ${s.rank} (tokens ${s.test}/${s.oracle}, Δp ${s.gap.toExponential(2)})`);
    for (const p of r.problems) this.failures.push(`${where}: ${p}`);
  }
}

async function main() {
  let args;
  try {
    args = parseFlags(
      process.argv.slice(2),
      {
        tandem: "string",
        model: "string",
        prompts: "number",
        greedy: "number",
        tol: "number",
        threads: "number",
        "logprobs-k": "number",
        "also-reference": "boolean",
        timeout: "number",
        "keep-gguf": "string",
      },
      { prompts: 3, greedy: 32, tol: 2e-3, threads: 2, timeout: 300 },
    );
    if (!args.help && (!args.tandem || !args.model)) throw new Error("--tandem and --model are required");
    if (!Number.isInteger(args.prompts) || args.prompts < 1) throw new Error("--prompts must be a positive integer");
    if (!Number.isInteger(args.greedy) || args.greedy < 0) throw new Error("--greedy must be a non-negative integer");
    if (!(args.tol > 0)) throw new Error("--tol must be positive");
  } catch (e) {
    console.error(`llama_conformance: ${e.message}\n${USAGE}`);
    return 2;
  }
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  const name = path.basename(path.resolve(args.model));
  try {
    if (!fs.statSync(args.tandem).isFile()) throw new Error("not a regular file");
    fs.accessSync(args.tandem, fs.constants.X_OK);
  } catch (e) {
    console.error(`llama_conformance: FAIL ${name}: --tandem ${args.tandem} is not an executable file (${e.code || e.message})`);
    return 1;
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-llama-conformance-"));
  const gguf = args["keep-gguf"] ?? path.join(tmp, "model.gguf");
  let oracle;
  try {
    const summary = exportGguf(args.model, gguf);
    const c = summary.config;
    const V = c.vocab;
    const K = Math.min(args["logprobs-k"] ?? V, V);
    const steps = Math.max(args.greedy, 1);
    const maxPrompt = 64;
    const contextSize = Math.max(256, maxPrompt + steps + 1);
    if (c.slidingWindow != null && c.slidingWindow < contextSize) {
      throw new ModelError(`sliding_window ${c.slidingWindow} is shorter than the ${contextSize}-token context this check uses`);
    }
    oracle = await LlamaOracle.create(gguf, { contextSize, threads: args.threads });
    const ref = args["also-reference"] ? (await import("./reference_forward.mjs")).loadReferenceModel(args.model) : null;
    const prompts = makePrompts(args.prompts, V, maxPrompt);
    const rep = new Report(args.tol);
    const eos = new Set(c.eosTokenIds);
    let greedyAgree = 0;
    const common = ["generate", "--model", args.model];

    for (const [pi, ids] of prompts.entries()) {
      const tag = `prompt ${pi} (${ids.length} tokens)`;
      const n = ids.length;
      const llamaGreedy = await oracle.greedy(ids, steps, V);
      const dists = llamaGreedy.promptDists;
      const refDists = ref ? ref.forward(ids) : null;

      // Prefill: prompt logprobs.
      try {
        const r = await runTandem(args.tandem, [...common, "--token-ids", ids.join(","), "--max-tokens", "0", "--prompt-logprobs", String(K), "--json"], args.timeout);
        const pids = r.prompt_token_ids;
        if (!Array.isArray(pids) || pids.length !== n || pids.some((t, i) => t !== ids[i])) {
          throw new TandemError(`${tag}: prompt_token_ids ${JSON.stringify(pids)?.slice(0, 200)} do not echo the prompt`);
        }
        const pl = r.prompt_logprobs;
        if (!Array.isArray(pl) || pl.length !== n) throw new TandemError(`${tag}: prompt_logprobs has ${Array.isArray(pl) ? pl.length : "no"} entries, expected ${n}`);
        if (pl[0] !== null) throw new TandemError(`${tag}: prompt_logprobs[0] must be null (no distribution before the first token)`);
        if (Array.isArray(r.token_ids) && r.token_ids.length !== 0) rep.failures.push(`${tag}: --max-tokens 0 generated ${r.token_ids.length} tokens`);
        for (let i = 1; i < n; i++) {
          const t = entryToDistribution(pl[i], V, ids[i], `${tag} prompt_logprobs[${i}]`);
          rep.position("prefill", `${tag} position ${i}`, t, dists[i - 1]);
          if (refDists) rep.refWorst = Math.max(rep.refWorst, compareDistribution(t, refDists[i - 1], args.tol).maxDiff);
        }
      } catch (e) {
        if (!(e instanceof TandemError)) throw e;
        rep.failures.push(`${tag} prefill: ${e.message}`);
      }

      // Decode: greedy continuation with the distribution at each step.
      try {
        const r = await runTandem(
          args.tandem,
          [...common, "--token-ids", ids.join(","), "--max-tokens", String(steps), "--temperature", "0", "--ignore-eos", "--logprobs", String(K), "--json"],
          args.timeout,
        );
        const toks = r.token_ids;
        const lps = r.logprobs;
        if (!Array.isArray(toks) || toks.some((t) => !Number.isInteger(t))) throw new TandemError(`${tag}: token_ids missing or not integers`);
        if (toks.length === 0) throw new TandemError(`${tag}: no token generated (finish_reason ${JSON.stringify(r.finish_reason)})`);
        if (!Array.isArray(lps) || lps.length !== toks.length) {
          throw new TandemError(`${tag}: logprobs has ${Array.isArray(lps) ? lps.length : "no"} entries for ${toks.length} tokens`);
        }
        const L = llamaGreedy.tokens;
        let agreed = 0;
        let verdict = null;
        for (let s = 0; s < toks.length && s < steps; s++) {
          const t = entryToDistribution(lps[s], V, toks[s], `${tag} logprobs[${s}]`);
          rep.position(s === 0 ? "prefill" : "decode", `${tag} ${s === 0 ? "last prompt position" : `decode step ${s}`}`, t, llamaGreedy.dists[s]);
          if (refDists && s === 0) rep.refWorst = Math.max(rep.refWorst, compareDistribution(t, refDists[n - 1], args.tol).maxDiff);
          if (toks[s] !== L[s]) {
            const p = llamaGreedy.dists[s];
            const gap = Math.abs(p[toks[s]] - p[L[s]]);
            if (gap <= TIE_EPS) {
              rep.notes.push(`${tag}: greedy diverges at step ${s} on a near-tie (tokens ${toks[s]}/${L[s]}, Δp ${gap.toExponential(2)}); later steps not compared`);
              verdict = "tie";
            } else {
              rep.failures.push(`${tag}: greedy token ${s} is ${toks[s]} (p_llama ${p[toks[s]].toFixed(6)}), llama.cpp chose ${L[s]} (p ${p[L[s]].toFixed(6)}); Tandem [${toks}] vs llama.cpp [${L}]`);
              verdict = "fail";
            }
            break;
          }
          agreed++;
        }
        if (verdict === null && args.greedy > 0 && toks.length < args.greedy) {
          const stoppedOnEos = eos.has(toks[toks.length - 1]) || eos.has(L[toks.length]);
          if (r.finish_reason === "stop" && stoppedOnEos) rep.notes.push(`${tag}: Tandem stopped at end-of-sequence after ${toks.length} tokens, as llama.cpp's greedy path reaches it`);
          else {
            rep.failures.push(`${tag}: Tandem produced ${toks.length} of ${args.greedy} tokens (finish_reason ${JSON.stringify(r.finish_reason)}) without an end-of-sequence token`);
            verdict = "fail";
          }
        }
        if (toks.length > steps) rep.failures.push(`${tag}: Tandem produced ${toks.length} tokens for --max-tokens ${steps}`);
        if (verdict !== "fail" && args.greedy > 0) greedyAgree++;
      } catch (e) {
        if (!(e instanceof TandemError)) throw e;
        rep.failures.push(`${tag} decode: ${e.message}`);
      }
    }

    const w = rep.worst;
    console.log(
      `llama_conformance: ${name} (${c.hfArch} → ${c.family}, vocab ${V}, K ${K}): max |Δp| Tandem vs llama.cpp ${w.maxDiff.toExponential(3)}` +
        `${w.where ? ` (${w.where}, token ${w.token})` : ""} over ${rep.prefillPositions} prompt + ${rep.decodePositions} decode positions, tol ${args.tol}; ` +
        `greedy ${args.greedy > 0 ? `${greedyAgree}/${prompts.length} prompts agree over ${args.greedy} tokens` : "not run"}` +
        `${ref ? `; max |Δp| Tandem vs float64 reference ${rep.refWorst.toExponential(3)}` : ""}`,
    );
    for (const note of rep.notes.slice(0, 20)) console.log(`  note: ${note}`);
    if (rep.failures.length) {
      console.error(`llama_conformance: FAIL ${name}: ${rep.failures.length} problem(s):`);
      for (const f of rep.failures.slice(0, 20)) console.error(`  - ${f}`);
      if (rep.failures.length > 20) console.error(`  … and ${rep.failures.length - 20} more`);
      return 1;
    }
    console.log(`llama_conformance: PASS ${name}`);
    return 0;
  } catch (e) {
    if (e instanceof ModelError) console.error(`llama_conformance: FAIL ${name}: cannot use the model: ${e.message}`);
    else console.error(`llama_conformance: FAIL ${name}: ${e.stack || e.message}`);
    return 1;
  } finally {
    if (oracle) await oracle.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

process.exitCode = await main();
