// The conformance corpus (corpus.jsonl: one JSON string per line) and a seeded generator of extra
// strings that mix its character classes.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const CORPUS_FILE = path.join(HERE, 'corpus.jsonl');
// Prompts rendered by jinja2 from real chat templates (written by chat_template_conformance.py).
export const CHAT_PROMPTS_FILE = path.join(HERE, 'chat_prompts.jsonl');

export function loadCorpus(file = CORPUS_FILE) {
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.length > 0)
    .map((line, i) => {
      const v = JSON.parse(line);
      if (typeof v !== 'string') throw new Error(`${file}:${i + 1}: not a JSON string`);
      return v;
    });
}

// mulberry32: a small, fast, well-mixed 32-bit PRNG; the same seed gives the same strings everywhere.
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const range = (lo, hi) => Array.from({ length: hi - lo + 1 }, (_, i) => String.fromCodePoint(lo + i));
// Character classes the generator draws single characters from (code points, never lone surrogates).
const CLASSES = {
  lower: range(0x61, 0x7a),
  upper: range(0x41, 0x5a),
  digit: range(0x30, 0x39),
  punct: [...`!"#$%&'()*+,-./:;<=>?@[\\]^_\`{|}~`],
  space: [' ', ' ', ' ', '\t', '\n', '\r\n', '\r', '\u00a0', '\u3000', '\u2028', '\u000b', '\u000c'],
  latin1: range(0xc0, 0xff),
  combining: range(0x300, 0x36f),
  greek: range(0x391, 0x3c9).filter((c) => c !== '\u03a2'),
  cyrillic: range(0x410, 0x44f),
  arabic: range(0x621, 0x64a),
  devanagari: range(0x905, 0x939).concat(range(0x93e, 0x94d)),
  thai: range(0xe01, 0xe3a),
  hangul: range(0xac00, 0xac00 + 400),
  jamo: range(0x1100, 0x1112).concat(range(0x1161, 0x1175)),
  kana: range(0x3041, 0x3096).concat(range(0x30a1, 0x30fa)),
  cjk: range(0x4e00, 0x4e00 + 2000),
  fullwidth: range(0xff01, 0xff5e),
  emoji: range(0x1f600, 0x1f64f).concat(range(0x1f300, 0x1f320), ['\u2764', '\u2600', '\u2b50']),
  modifier: range(0x1f3fb, 0x1f3ff),
  zwj: ['\u200d', '\u200c', '\u200b', '\ufe0f', '\ufe0e'],
  astral: range(0x1d400, 0x1d433).concat(range(0x1f000, 0x1f02b), ['\u{20000}', '\u{2a6d6}', '\u{10348}']),
  private: ['\ue000', '\uf8ff', '\u{f0000}'],
  special: ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|begin_of_text|>', '<|eot_id|>', '<s>', '</s>',
    '<unk>', '<bos>', '<eos>', '<start_of_turn>', '<end_of_turn>', '<｜begin▁of▁sentence｜>', '<tool_call>', '▁', 'Ġ'],
};
const CLASS_NAMES = Object.keys(CLASSES);

// `count` long documents (tens of KB): corpus entries joined by spaces and newlines in a seeded
// order. They exercise what short strings cannot: whole-text pieces in tokenizers without a
// pre-tokenizer (SentencePiece style), long merge chains, and the encoder's caches.
export function longDocuments(corpus, seed = 99, count = 4) {
  const r = rng(seed);
  const nonEmpty = corpus.filter((s) => s.length > 0);
  const out = [];
  for (let n = 0; n < count; n++) {
    let s = '';
    while (s.length < 20000 + n * 10000) {
      s += nonEmpty[Math.floor(r() * nonEmpty.length)];
      s += r() < 0.8 ? ' ' : '\n';
    }
    out.push(s);
  }
  return out;
}

// `count` strings, each a concatenation of 1..12 runs; a run is a slice of a corpus entry, a run of
// 1..8 characters of one class, a contraction, a number of 1..25 digits, or a whitespace run.
export function randomStrings(corpus, seed = 1234, count = 200) {
  const r = rng(seed);
  const pick = (arr) => arr[Math.floor(r() * arr.length)];
  const nonEmpty = corpus.filter((s) => s.length > 0);
  const out = [];
  for (let n = 0; n < count; n++) {
    const runs = 1 + Math.floor(r() * 12);
    let s = '';
    for (let k = 0; k < runs; k++) {
      const kind = r();
      if (kind < 0.25) {
        const cps = [...pick(nonEmpty)];
        const a = Math.floor(r() * cps.length);
        const b = a + 1 + Math.floor(r() * Math.min(40, cps.length - a));
        s += cps.slice(a, b).join('');
      } else if (kind < 0.7) {
        const cls = CLASSES[pick(CLASS_NAMES)];
        const len = 1 + Math.floor(r() * 8);
        for (let i = 0; i < len; i++) s += pick(cls);
      } else if (kind < 0.78) {
        s += pick(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "n't", "N'T"]);
      } else if (kind < 0.88) {
        const len = 1 + Math.floor(r() * 25);
        for (let i = 0; i < len; i++) s += String(Math.floor(r() * 10));
      } else {
        const len = 1 + Math.floor(r() * 20);
        const ch = pick([' ', '\t', '\n', '\r\n', ' \n']);
        s += ch.repeat(len);
      }
    }
    out.push(s);
  }
  return out;
}
