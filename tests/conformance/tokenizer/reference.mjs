// The reference tokenizer: @lenml/tokenizers (a dependency-free fork of transformers.js's
// tokenizers), built from a tokenizer.json + tokenizer_config.json pair exactly as the
// @lenml/tokenizer-* packages build it (TokenizerLoader.fromPreTrained).
import fs from 'node:fs';
import path from 'node:path';
import { TokenizerLoader } from '@lenml/tokenizers';

export function readTokenizerFiles(dir) {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  return { tokenizerJSON, tokenizerConfig };
}

export class Reference {
  constructor(dir) {
    const { tokenizerJSON, tokenizerConfig } = readTokenizerFiles(dir);
    this.tokenizerJSON = tokenizerJSON;
    this.tokenizerConfig = tokenizerConfig;
    this.tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  }
  encode(text, addSpecialTokens) {
    if (typeof addSpecialTokens !== 'boolean') throw new Error('encode: addSpecialTokens must be true or false');
    return this.tok.encode(text, { add_special_tokens: addSpecialTokens });
  }
  // clean_up_tokenization_spaces is forced off: it is a transformers (Python) post-step driven by
  // tokenizer_config.json, not part of the tokenizer.json decoder chain Tandem implements.
  decode(ids, skipSpecialTokens = false) {
    if (ids.length === 0) return ''; // the reference throws on an empty list
    return this.tok.decode(ids, {
      skip_special_tokens: skipSpecialTokens,
      clean_up_tokenization_spaces: false,
    });
  }
  // The token strings of `ids` (vocabulary entries, byte-level or ▁ forms), for reports.
  pieces(ids) {
    return this.tok.model.convert_ids_to_tokens(ids);
  }
}

// The original Rust implementation (Hugging Face `tokenizers`, npm `tokenizers`, prebuilt N-API
// binaries inside the package), reading tokenizer.json alone. Used as a second oracle to cross-check
// the reference; null when the package cannot be loaded on this platform.
export async function loadHfTokenizer(dir) {
  let Tokenizer;
  try {
    const mod = await import('tokenizers');
    Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;
  } catch {
    return null;
  }
  const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  return {
    async encode(text, addSpecialTokens) {
      return (await tok.encode(text, null, { addSpecialTokens })).getIds();
    },
    async decode(ids, skipSpecialTokens = false) {
      return ids.length === 0 ? '' : tok.decode(ids, skipSpecialTokens);
    },
  };
}
