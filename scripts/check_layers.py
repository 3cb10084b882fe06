#!/usr/bin/env python3
"""Checks the include graph against the floors of docs/architecture.md ("Floors").

Every quoted include of a product source (common/, router/, prefill_worker/, decode_worker/, cli/) must
name its own module or a module on a lower floor. Two modules on the same floor do not include each
other (tokenizer and kv are neighbours, not a stack); common/backend/cpu and common/backend/cuda may
include common/backend (the device interface) and it may include them (the factory), but the two
backends never include each other. tests/ may include anything; nothing else includes tests/.

Usage: check_layers.py [ROOT]   (ROOT defaults to the repository this script is in)
Prints one line per inverted include and exits 1 if there is any, else prints a summary and exits 0.
"""
import os
import re
import sys

# Lowest first. A module is the first two path components (common/engine), or three under
# common/backend (the backends); generated protobuf headers ("tandem/v1/...") are the module "proto".
FLOORS = [
    ["common/base"],
    ["proto", "common/tensor", "common/kv", "common/tokenizer", "common/chat", "common/sampling", "common/metrics"],
    ["common/sched", "common/rpc", "common/quant", "common/structured"],
    ["common/backend", "common/backend/cpu", "common/backend/cuda"],
    ["common/model"],
    ["common/spec"],
    ["common/engine"],
    ["common/transport"],
    ["common/serving", "common/cuda_plugin"],
    ["router", "prefill_worker", "decode_worker", "cli"],
    ["tests"],
]
FLOOR = {module: level for level, modules in enumerate(FLOORS) for module in modules}
PRODUCT_DIRS = ("common", "router", "prefill_worker", "decode_worker", "cli")
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(path):
    """The module a repository-relative path or include belongs to, or None if it is not ours."""
    if path.startswith("tandem/v1/"):
        return "proto"
    parts = path.split("/")
    if parts[0] in ("tests", "router", "prefill_worker", "decode_worker", "cli"):
        return parts[0] if len(parts) > 1 else None
    if parts[0] != "common" or len(parts) < 3:
        return None
    if parts[1] == "backend" and len(parts) > 3 and parts[2] in ("cpu", "cuda"):
        return "common/backend/" + parts[2]
    return "common/" + parts[1]


def allowed(src, dst):
    if src == dst:
        return True
    backends = ("common/backend/cpu", "common/backend/cuda")
    if src in backends and dst in backends:
        return False
    if {src, dst} <= {"common/backend", *backends}:
        return True
    return FLOOR[dst] < FLOOR[src]


def check(root):
    problems, checked = [], 0
    for top in PRODUCT_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                src = module_of(rel)
                if src is None:
                    continue
                if src not in FLOOR:
                    problems.append(f"{rel}: module {src} has no floor in scripts/check_layers.py")
                    continue
                with open(full, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        dst = module_of(m.group(1))
                        if dst is None:
                            continue
                        checked += 1
                        if dst not in FLOOR:
                            problems.append(f"{rel}:{lineno}: includes {m.group(1)}, whose module {dst} has "
                                            "no floor in scripts/check_layers.py")
                        elif not allowed(src, dst):
                            problems.append(f"{rel}:{lineno}: {src} (floor {FLOOR[src]}) includes {m.group(1)} "
                                            f"({dst}, floor {FLOOR[dst]}): a file includes its own module "
                                            "and lower floors only")
    return problems, checked


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems, checked = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} inverted include(s) (floors: docs/architecture.md)")
        return 1
    print(f"check_layers: {checked} includes between modules, none upward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
