#!/usr/bin/env python3
"""Extracts the King James Bible (Debian packages bible-kjv, bible-kjv-text) as plain text and splits
it by a fixed rule: every 20th chapter (chapters 19, 39, 59, ... in canonical order, 0-based) is
held out, the rest is training text. One chapter is one document: its title line ("Genesis 1")
and its verses, one per line, without verse numbers.

Usage: corpus.py OUT_DIR   → OUT_DIR/train.txt, OUT_DIR/heldout.txt (documents separated by a blank line)
"""
import os
import re
import subprocess
import sys


def chapters():
    raw = subprocess.run(["bible", "-l100000", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    doc, verse = None, None
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^ +(\d+) (.*)$", line)
        if m:
            if verse is not None:
                doc.append(verse)
            verse = m.group(2).strip()
        elif re.match(r"^[1-3A-Z][A-Za-z ]* \d+$", line.strip()) and not line.startswith(" "):
            if doc is not None:
                if verse is not None:
                    doc.append(verse)
                yield doc
            doc, verse = [line.strip()], None
        elif verse is not None:  # a wrapped continuation
            verse += " " + line.strip()
    if doc is not None:
        if verse is not None:
            doc.append(verse)
        yield doc


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    train, held = [], []
    for i, doc in enumerate(chapters()):
        (held if i % 20 == 19 else train).append("\n".join(doc))
    with open(os.path.join(out, "train.txt"), "w") as f:
        f.write("\n\n".join(train) + "\n")
    with open(os.path.join(out, "heldout.txt"), "w") as f:
        f.write("\n\n".join(held) + "\n")
    print(f"corpus: {len(train)} training chapters, {len(held)} held out -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
