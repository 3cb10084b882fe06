#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer and writes it as a Hugging Face tokenizer.json.

The format is the standard one (GPT-2 family): ByteLevel pre-tokenizer with the GPT-2 split regex,
BPE model with `vocab` and `merges`, ByteLevel decoder; two special tokens at the end of the
vocabulary, <|begin_of_text|> and <|end_of_text|>. Training: words are the regex's pieces of the
training text, mapped to the 256 byte-level symbols; merges are learned greedily by pair frequency
(ties broken by the pair itself, so the result is deterministic).

Usage: bpe.py TRAIN_TEXT OUT_DIR [--vocab-size 4096]
"""
import argparse
import collections
import heapq
import json
import os
import sys

import regex

# GPT-2's pre-tokenization pattern, as the ByteLevel pre-tokenizer applies it (use_regex: true).
SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]


def byte_alphabet():
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def train(text, vocab_size):
    alphabet = byte_alphabet()
    counts = collections.Counter(SPLIT.findall(text))
    words = [[alphabet[b] for b in w.encode("utf-8")] for w in counts]
    freqs = list(counts.values())
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)
    for i, (w, f) in enumerate(zip(words, freqs)):
        for a, b in zip(w, w[1:]):
            pair_counts[(a, b)] += f
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    vocab = [alphabet[b] for b in range(256)]
    known = set(vocab)
    merges = []
    target = vocab_size - len(SPECIALS)
    while len(vocab) < target and heap:
        neg, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg or -neg <= 0:
            continue  # stale entry
        a, b = pair
        merged = a + b
        merges.append(f"{a} {b}")
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        changed = collections.Counter()
        for i in list(where[pair]):
            w, f = words[i], freqs[i]
            j, out = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            for x, y in zip(w, w[1:]):
                changed[(x, y)] -= f
            for x, y in zip(out, out[1:]):
                changed[(x, y)] += f
                where[(x, y)].add(i)
            words[i] = out
        for p, d in changed.items():
            if d == 0:
                continue
            pair_counts[p] += d
            if pair_counts[p] > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
        pair_counts.pop(pair, None)
        if len(merges) % 500 == 0:
            print(f"bpe: {len(vocab)} / {target} tokens", file=sys.stderr)
    return vocab, merges


def tokenizer_json(vocab, merges):
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(vocab)}, "merges": merges},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_text")
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args()
    text = open(args.train_text, encoding="utf-8").read()
    vocab, merges = train(text, args.vocab_size)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges), f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
                   "model_max_length": 1024, "clean_up_tokenization_spaces": False}, f, indent=2)
        f.write("\n")
    print(f"bpe: {len(vocab) + len(SPECIALS)} tokens, {len(merges)} merges -> {args.out_dir}/tokenizer.json",
          file=sys.stderr)


if __name__ == "__main__":
    main()
