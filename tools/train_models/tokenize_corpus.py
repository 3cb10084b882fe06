#!/usr/bin/env python3
"""Tokenizes train.txt and heldout.txt with Tandem's tokenizer (`tandem tokenize --jsonl`), one
chapter at a time, and writes the ids as one stream per split with <|end_of_text|> between
chapters: OUT/train.json, OUT/heldout.json.

Usage: tokenize_corpus.py TANDEM CORPUS_DIR TOKENIZER_DIR OUT_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

tandem, corpus, tok_dir, out = sys.argv[1:5]
tok = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
eos = {t["content"]: t["id"] for t in tok["added_tokens"]}["<|end_of_text|>"]
os.makedirs(out, exist_ok=True)
for split in ("train", "heldout"):
    docs = open(os.path.join(corpus, f"{split}.txt")).read().strip().split("\n\n")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    p = subprocess.run([tandem, "tokenize", "--model", os.path.join(tok_dir, "tokenizer.json"), "--jsonl", f.name],
                       capture_output=True, text=True, check=True)
    os.unlink(f.name)
    ids = []
    for line in p.stdout.splitlines():
        ids.extend(json.loads(line)["ids"])
        ids.append(eos)
    json.dump(ids, open(os.path.join(out, f"{split}.json"), "w"))
    print(f"tokenize: {split}: {len(docs)} chapters, {len(ids)} tokens", file=sys.stderr)
