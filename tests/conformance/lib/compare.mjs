// Shared pieces of the conformance scripts: seeded prompts, distribution comparison, argument parsing.

// mulberry32: small, seedable, the same on every platform.
export function seededRandom(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export const PROMPT_LENGTHS = [7, 33, 64, 17, 50, 3, 100, 1];

// `count` deterministic prompts of pseudo-random token ids in [0, vocab), lengths from PROMPT_LENGTHS
// capped at maxLen.
export function makePrompts(count, vocab, maxLen, seed = 20240601) {
  const rand = seededRandom(seed);
  const prompts = [];
  for (let i = 0; i < count; i++) {
    const len = Math.min(PROMPT_LENGTHS[i % PROMPT_LENGTHS.length], maxLen);
    prompts.push(Array.from({ length: len }, () => Math.floor(rand() * vocab)));
  }
  return prompts;
}

// Token ids ordered by probability, highest first (ties by lower id).
export function topK(p, k) {
  const idx = [];
  for (let i = 0; i < p.length; i++) idx.push(i);
  idx.sort((a, b) => p[b] - p[a] || a - b);
  return idx.slice(0, k);
}

export function maxAbsDiff(a, b) {
  let m = 0;
  let at = -1;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (d > m || Number.isNaN(d)) {
      m = Number.isNaN(d) ? Infinity : d;
      at = i;
    }
  }
  return { max: m, at };
}

// Compares the top-k order of `test` against `oracle`. A position where the ids differ is excused when
// the two candidates are within `tieEps` probability of each other in the oracle's distribution (a
// reordering of near-ties is rounding, not a bug). Returns {ok, swaps: [...], mismatch?}.
export function compareTopK(test, oracle, k = 5, tieEps = 1e-6, testOrder = null) {
  const a = testOrder ?? topK(test, k);
  const b = topK(oracle, k);
  const swaps = [];
  for (let i = 0; i < k && i < b.length; i++) {
    if (a[i] === b[i]) continue;
    const gap = Math.abs(oracle[a[i]] - oracle[b[i]]);
    if (gap <= tieEps) swaps.push({ rank: i + 1, test: a[i], oracle: b[i], gap });
    else return { ok: false, swaps, mismatch: { rank: i + 1, testTop: a, oracleTop: b, gap } };
  }
  return { ok: true, swaps };
}

// Minimal flag parser: spec maps flag → "string" | "number" | "boolean".
export function parseFlags(argv, spec, defaults = {}) {
  const out = { ...defaults };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-h" || a === "--help") {
      out.help = true;
      continue;
    }
    if (!a.startsWith("--") || !(a.slice(2) in spec)) throw new Error(`unknown argument ${a}`);
    const key = a.slice(2);
    const kind = spec[key];
    if (kind === "boolean") {
      out[key] = true;
      continue;
    }
    if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
    const v = argv[++i];
    if (kind === "number") {
      const n = Number(v);
      if (!Number.isFinite(n)) throw new Error(`${a} needs a number, got ${v}`);
      out[key] = n;
    } else out[key] = v;
  }
  return out;
}
