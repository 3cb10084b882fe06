// llama.cpp (through node-llama-cpp's prebuilt CPU binary) as an oracle: full next-token distributions
// at every prompt position, and greedy continuations. The context is created with flash attention off and
// an F32 KV cache: with the all-F32 GGUF from export_gguf.mjs, llama.cpp then computes in f32 end to end.
//
// Distributions are computed here in float64 from the raw logits llama.cpp returns (the sampler chain is
// greedy-only at temperature 0, so the logits are untouched), which is at least as exact as its own
// float32 softmax.

import { getLlama, LlamaLogLevel } from "node-llama-cpp";

export class LlamaOracle {
  // Use LlamaOracle.create.
  constructor(llama, model, context, logs) {
    this.llama = llama;
    this.model = model;
    this.context = context;
    this.sequence = context.getSequence();
    this.logs = logs;
  }

  static async create(ggufPath, { contextSize = 256, threads = 2 } = {}) {
    const logs = [];
    const llama = await getLlama({
      gpu: false,
      build: "never",
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => logs.push(`[${level}] ${message}`.trimEnd()),
    });
    let model;
    try {
      model = await llama.loadModel({ modelPath: ggufPath, gpuLayers: 0 });
    } catch (e) {
      throw new Error(`llama.cpp could not load ${ggufPath}: ${e.message}\n${logs.join("\n")}`);
    }
    const context = await model.createContext({
      contextSize,
      batchSize: contextSize,
      sequences: 1,
      threads,
      flashAttention: false,
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
    });
    return new LlamaOracle(llama, model, context, logs);
  }

  static toDistribution(logitMap, nVocab) {
    if (logitMap.size !== nVocab) throw new Error(`llama.cpp returned ${logitMap.size} logits for a vocabulary of ${nVocab}`);
    const logits = new Float64Array(nVocab).fill(-Infinity);
    for (const [tok, lg] of logitMap) {
      if (tok < 0 || tok >= nVocab) throw new Error(`llama.cpp returned token ${tok} outside the vocabulary`);
      logits[tok] = lg;
    }
    let max = -Infinity;
    for (let i = 0; i < nVocab; i++) if (logits[i] > max) max = logits[i];
    let sum = 0;
    const p = new Float64Array(nVocab);
    for (let i = 0; i < nVocab; i++) {
      p[i] = Math.exp(logits[i] - max);
      sum += p[i];
    }
    for (let i = 0; i < nVocab; i++) p[i] /= sum;
    return p;
  }

  // Distribution after each token of `ids`, from an empty context: result[i] = p(· | ids[0..i]).
  async distributions(ids, nVocab) {
    await this.sequence.clearHistory();
    const items = ids.map((t) => [t, { generateNext: { logits: true, options: { temperature: 0 } } }]);
    const out = await this.sequence.controlledEvaluate(items);
    return ids.map((_, i) => {
      const r = out[i];
      if (!r || !r.next || !r.next.logits) throw new Error(`llama.cpp returned no logits for position ${i}`);
      return LlamaOracle.toDistribution(r.next.logits, nVocab);
    });
  }

  // Greedy continuation of `ids` for `steps` tokens. Returns {tokens, dists, promptDists}: dists[s] is
  // the distribution token s was chosen from; promptDists are distributions(ids).
  // Exact logit ties go to the lowest token id.
  async greedy(ids, steps, nVocab) {
    const dists = await this.distributions(ids, nVocab);
    let p = dists[dists.length - 1];
    const tokens = [];
    const stepDists = [];
    for (let s = 0; s < steps; s++) {
      let best = 0;
      for (let i = 1; i < nVocab; i++) if (p[i] > p[best]) best = i;
      tokens.push(best);
      stepDists.push(p);
      if (s + 1 === steps) break;
      const out = await this.sequence.controlledEvaluate([[best, { generateNext: { logits: true, options: { temperature: 0 } } }]]);
      if (!out[0] || !out[0].next || !out[0].next.logits) throw new Error(`llama.cpp returned no logits at greedy step ${s + 1}`);
      p = LlamaOracle.toDistribution(out[0].next.logits, nVocab);
    }
    return { tokens, dists: stepDists, promptDists: dists };
  }

  async dispose() {
    await this.context.dispose();
    await this.model.dispose();
    await this.llama.dispose();
  }
}
