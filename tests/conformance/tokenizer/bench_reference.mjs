#!/usr/bin/env node
// The reference tokenizer's encode throughput on one core (node runs JavaScript on one thread), on
// two texts built from the conformance corpus with a fixed seed and written to --out so that Tandem's
// C++ benchmark can encode the same bytes:
//   bench_mixed.txt    English prose and source code: the corpus's ASCII entries (prose, C++,
//                      Python, JSON, shell, SQL, numbers), shuffled and concatenated, ≥ --mb MB;
//   bench_chinese.txt  Chinese: random 2–24-character windows of the corpus's Chinese sentences,
//                      joined by Chinese punctuation and line breaks, ≥ --mb MB. (Whole sentences
//                      repeated would make every pre-token a cache hit; real text rarely repeats.)
// Each of --repeats runs builds a fresh tokenizer (empty BPE cache), warms the JIT on 64 KB of the
// other text, then times one encode(text, add_special_tokens=false) call; the best run is reported.
//
// usage: node tokenizer/bench_reference.mjs --tokenizers DIR [--names qwen3] [--out DIR (.)]
//          [--mb 1] [--seed 7] [--repeats 3]
// prints: reference encode: mixed X MB/s, chinese Y MB/s (tokenizer qwen3, N tokens)
//         where N is the token count of the two texts together.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { ALL_NAMES, extract } from './extract_tokenizers.mjs';
import { loadCorpus, rng } from './corpus.mjs';
import { Reference } from './reference.mjs';

const { values: opt } = parseArgs({
  options: {
    tokenizers: { type: 'string' },
    names: { type: 'string', default: 'qwen3' },
    out: { type: 'string', default: '.' },
    mb: { type: 'string', default: '1' },
    seed: { type: 'string', default: '7' },
    repeats: { type: 'string', default: '3' },
    help: { type: 'boolean', default: false },
  },
});
if (opt.help || !opt.tokenizers) {
  console.error(
    'usage: node bench_reference.mjs --tokenizers DIR [--names qwen3] [--out DIR] [--mb 1] [--seed 7] [--repeats 3]',
  );
  process.exit(opt.help ? 0 : 2);
}
const names = opt.names.split(',');
for (const n of names) {
  if (!ALL_NAMES.includes(n)) {
    console.error(`unknown tokenizer '${n}' (known: ${ALL_NAMES.join(', ')})`);
    process.exit(2);
  }
}
const TARGET = Math.ceil(Number(opt.mb) * 1e6);
const utf8Len = (s) => Buffer.byteLength(s, 'utf8');

function shuffled(arr, r) {
  const a = arr.slice();
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

// English prose and code: ASCII entries of at least 20 characters that are not whitespace alone
// and hold no special-token text, whole, in seeded shuffled rounds, separated by a newline (prose)
// or a blank line (multi-line code).
const SPECIAL_TEXT = /<\|[^|]*\|>|<\/?s>|<(bos|eos|pad|unk|start_of_turn|end_of_turn|tool_call|think)>/;
export function buildMixed(corpus, seed, target) {
  const pool = corpus.filter(
    (s) => s.length >= 20 && /^[\x09\x0a\x0d\x20-\x7e]*$/.test(s) && /\S/.test(s) && !SPECIAL_TEXT.test(s),
  );
  const r = rng(seed);
  const parts = [];
  let bytes = 0;
  while (bytes < target) {
    for (const s of shuffled(pool, r)) {
      const piece = s + (s.includes('\n') ? '\n\n' : '\n');
      parts.push(piece);
      bytes += utf8Len(piece);
    }
  }
  return parts.join('');
}

// Chinese: windows of the corpus entries that are mostly Han characters, with no Latin letters or
// digits.
export function buildChinese(corpus, seed, target) {
  const han = /\p{Script=Han}/u;
  const pool = corpus.filter((s) => {
    const cps = [...s];
    return cps.length >= 8 && !/[A-Za-z0-9]/.test(s) && cps.filter((c) => han.test(c)).length >= 0.6 * cps.length;
  });
  const source = [...pool.join('')];
  const r = rng(seed);
  const punct = ['，', '，', '，', '。', '、', '；', '：', '！', '？', '。\n'];
  const parts = [];
  let bytes = 0;
  while (bytes < target) {
    const len = 2 + Math.floor(r() * 23);
    const at = Math.floor(r() * (source.length - len));
    const piece = source.slice(at, at + len).join('') + punct[Math.floor(r() * punct.length)];
    parts.push(piece);
    bytes += utf8Len(piece);
  }
  return parts.join('');
}

function bench(dir, text, warmup, repeats) {
  let best = Infinity;
  let tokens = 0;
  for (let k = 0; k < repeats; k++) {
    const ref = new Reference(dir); // a fresh BPE cache for every run
    ref.encode(warmup, false);
    const t0 = process.hrtime.bigint();
    const ids = ref.encode(text, false);
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    tokens = ids.length;
    best = Math.min(best, s);
  }
  return { seconds: best, tokens, mbps: utf8Len(text) / 1e6 / best };
}

async function main() {
  const corpus = loadCorpus();
  const seed = Number(opt.seed);
  const mixed = buildMixed(corpus, seed, TARGET);
  const chinese = buildChinese(corpus, seed, TARGET);
  fs.mkdirSync(opt.out, { recursive: true });
  const mixedFile = path.join(opt.out, 'bench_mixed.txt');
  const chineseFile = path.join(opt.out, 'bench_chinese.txt');
  fs.writeFileSync(mixedFile, mixed);
  fs.writeFileSync(chineseFile, chinese);
  console.log(`${mixedFile}: ${utf8Len(mixed)} bytes; ${chineseFile}: ${utf8Len(chinese)} bytes`);
  const cut = (s) => [...s.slice(0, 65536)].slice(0, -1).join(''); // no split surrogate pair
  for (const name of names) {
    let dir = path.join(opt.tokenizers, name);
    if (!fs.existsSync(path.join(dir, 'tokenizer.json'))) dir = await extract(name, opt.tokenizers);
    const repeats = Number(opt.repeats);
    const m = bench(dir, mixed, cut(chinese), repeats);
    const c = bench(dir, chinese, cut(mixed), repeats);
    console.log(`  mixed:   ${m.tokens} tokens in ${m.seconds.toFixed(3)} s (best of ${repeats})`);
    console.log(`  chinese: ${c.tokens} tokens in ${c.seconds.toFixed(3)} s (best of ${repeats})`);
    console.log(
      `reference encode: mixed ${m.mbps.toFixed(2)} MB/s, chinese ${c.mbps.toFixed(2)} MB/s ` +
        `(tokenizer ${name}, ${m.tokens + c.tokens} tokens)`,
    );
  }
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
