// Float64 reference forward pass for the Llama family as Hugging Face transformers defines it
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM), read straight from the
// model directory. It shares nothing with the GGUF path but the safetensors reader, so agreement between
// llama.cpp (through export_gguf.mjs) and this code checks the exporter, and either can grade Tandem.
//
//   import { loadReferenceModel } from "./reference_forward.mjs";
//   const ref = loadReferenceModel(dir);
//   const probs = ref.forward(tokenIds);   // probs[i]: Float64Array(vocab), next-token distribution
//                                          // after tokens 0..i
//   referenceForward(dir, tokenIds)        // the same in one call
//
// Per layer (HF): h = rmsnorm(x)·w_in; q,k,v = h·W^T (+b); Qwen3: per-head rmsnorm of q and k; RoPE in
// rotate-half form (x_i, x_{i+d/2}) by pos·inv_freq_i, inv_freq_i = θ^(−2i/d), divided by the llama3
// factors when configured; causal softmax(q·k/√d) over the kv head h/(n_heads/n_kv_heads); x += o·Wo^T;
// x += Wdown(silu(Wgate h) ⊙ Wup h) with h = rmsnorm(x)·w_post; logits = rmsnorm(x)·w_norm · W_lm^T.

import { openModel, readTensor, llama3RopeDivisors } from "./lib/hf_model.mjs";

// y[r] = b[r] + Σ_c W[r, c]·x[c] for a row-major [rows, cols] W.
function matvec(W, x, rows, cols, bias) {
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    const o = r * cols;
    for (let c = 0; c < cols; c++) s += W[o + c] * x[c];
    y[r] = bias ? s + bias[r] : s;
  }
  return y;
}

function rmsnorm(x, w, eps, off = 0, n = x.length) {
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[off + i] * x[off + i];
  const inv = 1 / Math.sqrt(ss / n + eps);
  const y = new Float64Array(n);
  for (let i = 0; i < n; i++) y[i] = x[off + i] * inv * w[i];
  return y;
}

function softmaxInPlace(v, n = v.length) {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (v[i] > max) max = v[i];
  let sum = 0;
  for (let i = 0; i < n; i++) {
    v[i] = Math.exp(v[i] - max);
    sum += v[i];
  }
  for (let i = 0; i < n; i++) v[i] /= sum;
  return v;
}

export function loadReferenceModel(dir) {
  const m = openModel(dir);
  const c = m.config;
  const W = (name) => readTensor(m.tensors.get(name), Float64Array);
  const embed = W("model.embed_tokens.weight");
  const lmHead = c.tied ? embed : W("lm_head.weight");
  const finalNorm = W("model.norm.weight");
  const layers = [];
  for (let l = 0; l < c.layers; l++) {
    const p = `model.layers.${l}.`;
    layers.push({
      inNorm: W(p + "input_layernorm.weight"),
      wq: W(p + "self_attn.q_proj.weight"),
      wk: W(p + "self_attn.k_proj.weight"),
      wv: W(p + "self_attn.v_proj.weight"),
      wo: W(p + "self_attn.o_proj.weight"),
      bq: c.family === "qwen2" ? W(p + "self_attn.q_proj.bias") : null,
      bk: c.family === "qwen2" ? W(p + "self_attn.k_proj.bias") : null,
      bv: c.family === "qwen2" ? W(p + "self_attn.v_proj.bias") : null,
      qNorm: c.family === "qwen3" ? W(p + "self_attn.q_norm.weight") : null,
      kNorm: c.family === "qwen3" ? W(p + "self_attn.k_norm.weight") : null,
      postNorm: W(p + "post_attention_layernorm.weight"),
      gate: W(p + "mlp.gate_proj.weight"),
      up: W(p + "mlp.up_proj.weight"),
      down: W(p + "mlp.down_proj.weight"),
    });
  }
  const d = c.headDim;
  const half = d / 2;
  const invFreq = new Float64Array(half);
  const divisors = c.ropeScaling ? llama3RopeDivisors(d, c.theta, c.ropeScaling) : null;
  for (let i = 0; i < half; i++) invFreq[i] = c.theta ** (-(2 * i) / d) / (divisors ? divisors[i] : 1);

  // Rotates every head of `v` ([nHeads][d]) in place for position `pos`.
  function rope(v, nHeads, pos) {
    for (let h = 0; h < nHeads; h++) {
      const o = h * d;
      for (let i = 0; i < half; i++) {
        const a = pos * invFreq[i];
        const cs = Math.cos(a);
        const sn = Math.sin(a);
        const x1 = v[o + i];
        const x2 = v[o + i + half];
        v[o + i] = x1 * cs - x2 * sn;
        v[o + i + half] = x2 * cs + x1 * sn;
      }
    }
  }

  function headNorm(v, nHeads, w) {
    for (let h = 0; h < nHeads; h++) v.set(rmsnorm(v, w, c.eps, h * d, d), h * d);
  }

  // Returns per-position next-token distributions (Float64Array(vocab) each); with {logits: true},
  // {probs, logits}.
  function forward(ids, { logits: wantLogits = false } = {}) {
    for (const t of ids) {
      if (!Number.isInteger(t) || t < 0 || t >= c.vocab) throw new RangeError(`token id ${t} outside [0, ${c.vocab})`);
    }
    const n = ids.length;
    const xs = ids.map((t) => embed.slice(t * c.hidden, (t + 1) * c.hidden)); // [n][hidden]
    const group = c.heads / c.kvHeads;
    for (const L of layers) {
      const K = []; // [n][kvHeads * d]
      const V = [];
      const Q = [];
      for (let t = 0; t < n; t++) {
        const h = rmsnorm(xs[t], L.inNorm, c.eps);
        const q = matvec(L.wq, h, c.heads * d, c.hidden, L.bq);
        const k = matvec(L.wk, h, c.kvHeads * d, c.hidden, L.bk);
        const v = matvec(L.wv, h, c.kvHeads * d, c.hidden, L.bv);
        if (L.qNorm) {
          headNorm(q, c.heads, L.qNorm);
          headNorm(k, c.kvHeads, L.kNorm);
        }
        rope(q, c.heads, t);
        rope(k, c.kvHeads, t);
        Q.push(q);
        K.push(k);
        V.push(v);
      }
      const scale = 1 / Math.sqrt(d);
      const scores = new Float64Array(n);
      for (let t = 0; t < n; t++) {
        const attn = new Float64Array(c.heads * d);
        for (let h = 0; h < c.heads; h++) {
          const kvh = Math.floor(h / group);
          const qo = h * d;
          const ko = kvh * d;
          for (let s = 0; s <= t; s++) {
            let dot = 0;
            for (let i = 0; i < d; i++) dot += Q[t][qo + i] * K[s][ko + i];
            scores[s] = dot * scale;
          }
          softmaxInPlace(scores, t + 1);
          for (let s = 0; s <= t; s++) {
            const p = scores[s];
            for (let i = 0; i < d; i++) attn[qo + i] += p * V[s][ko + i];
          }
        }
        const o = matvec(L.wo, attn, c.hidden, c.heads * d);
        for (let i = 0; i < c.hidden; i++) xs[t][i] += o[i];
      }
      for (let t = 0; t < n; t++) {
        const h = rmsnorm(xs[t], L.postNorm, c.eps);
        const g = matvec(L.gate, h, c.ffn, c.hidden);
        const u = matvec(L.up, h, c.ffn, c.hidden);
        for (let i = 0; i < c.ffn; i++) g[i] = (g[i] / (1 + Math.exp(-g[i]))) * u[i];
        const dn = matvec(L.down, g, c.hidden, c.ffn);
        for (let i = 0; i < c.hidden; i++) xs[t][i] += dn[i];
      }
    }
    const probs = [];
    const allLogits = [];
    for (let t = 0; t < n; t++) {
      const h = rmsnorm(xs[t], finalNorm, c.eps);
      const lg = matvec(lmHead, h, c.vocab, c.hidden);
      if (wantLogits) allLogits.push(Float64Array.from(lg));
      probs.push(softmaxInPlace(lg));
    }
    return wantLogits ? { probs, logits: allLogits } : probs;
  }

  // Greedy continuation: argmax (lowest id on exact ties) fed back, `steps` tokens.
  function greedy(ids, steps) {
    const seq = [...ids];
    const out = [];
    for (let s = 0; s < steps; s++) {
      const probs = forward(seq);
      const p = probs[probs.length - 1];
      let best = 0;
      for (let i = 1; i < p.length; i++) if (p[i] > p[best]) best = i;
      out.push(best);
      seq.push(best);
    }
    return out;
  }

  return { config: c, forward, greedy };
}

export function referenceForward(dir, ids) {
  return loadReferenceModel(dir).forward(ids);
}
