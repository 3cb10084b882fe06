#!/usr/bin/env python3
"""Proves Tandem's structured output against Python's jsonschema (Debian python3-jsonschema).

For every schema of corpus.json:
  - Tandem's grammar (structured_cases, the library) must accept exactly the instances jsonschema
    judges valid, each serialized five ways (compact, json.dumps's default spacing, indent 2, a tab
    indent, ASCII escapes); `not_generated` instances are valid but outside what the grammar
    generates on purpose (docs/structured_output.md) and must be refused;
  - every text the grammar generates by random byte walks must parse (json.loads) and be valid;
  - a schema listed as `refused` must be refused with a message containing the given text.
Then, with --tandem and --model, the real CLI (`tandem generate --json-schema`) generates from a
trained model at temperature 1 over several seeds, and every output that ended with EOS must parse
and be valid (and at least one must end so).

Exit status 0 when everything agrees, 1 otherwise. By hand, from tests/conformance:
  python3 structured_output/structured_output_conformance.py \\
      --cases ../../build/tests/conformance/structured_cases \\
      --tandem ../../build/cli/tandem --model ../../models/kjv-target
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))


def serializations(value):
    return [
        json.dumps(value, separators=(",", ":"), ensure_ascii=False),
        json.dumps(value, ensure_ascii=False),
        json.dumps(value, indent=2, ensure_ascii=False),
        json.dumps(value, indent="\t", ensure_ascii=False),
        json.dumps(value),
    ]


def validator_for(case):
    schema = {"type": "object"} if case.get("json_object") else case["schema"]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True, help="the structured_cases binary")
    ap.add_argument("--tandem", help="the tandem binary (for the generate check)")
    ap.add_argument("--model", help="a model directory with a tokenizer (for the generate check)")
    ap.add_argument("--walks", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    with open(os.path.join(HERE, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    failures = []
    plan = []  # (case, [(kind, value, text)])
    tool_cases = []
    for case in corpus["cases"]:
        entry = {"name": case["name"]}
        if case.get("json_object"):
            entry["json_object"] = True
        else:
            entry["schema"] = case["schema"]
        texts = []
        if "refused" not in case:
            v = validator_for(case)
            for kind in ("valid", "invalid", "not_generated"):
                for value in case.get(kind, []):
                    ok = v.is_valid(value)
                    if ok != (kind != "invalid"):
                        failures.append(f"{case['name']}: corpus error, jsonschema says "
                                        f"{'valid' if ok else 'invalid'} for {kind} {value!r}")
                    for text in serializations(value):
                        texts.append((kind, value, text))
            entry["walks"] = args.walks
        entry["instances"] = [t for _, _, t in texts]
        plan.append((case, texts))
        tool_cases.append(entry)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cases.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"cases": tool_cases}, f, ensure_ascii=False)
        out = subprocess.run([args.cases, path, str(args.seed)], capture_output=True, check=True)
        results = json.loads(out.stdout.decode("utf-8"))["results"]

    instances = walks = 0
    for (case, texts), r in zip(plan, results):
        name = case["name"]
        if "refused" in case:
            if "error" not in r:
                failures.append(f"{name}: should be refused ({case['refused']}) but compiled")
            elif case["refused"] not in r["error"]:
                failures.append(f"{name}: refused with {r['error']!r}, expected {case['refused']!r}")
            continue
        if "error" in r:
            failures.append(f"{name}: refused: {r['error']}")
            continue
        v = validator_for(case)
        for (kind, value, text), accepted in zip(texts, r["accepted"]):
            instances += 1
            if accepted != (kind == "valid"):
                failures.append(f"{name}: {kind} instance {text!r} was "
                                f"{'accepted' if accepted else 'refused'}")
        if len(r["walks"]) == 0:
            failures.append(f"{name}: no random walk completed")
        for w in r["walks"]:
            walks += 1
            try:
                value = json.loads(w)
            except ValueError as e:
                failures.append(f"{name}: generated text is not JSON ({e}): {w!r}")
                continue
            if not v.is_valid(value):
                err = next(v.iter_errors(value)).message
                failures.append(f"{name}: generated text is not valid ({err}): {w!r}")

    generated = 0
    if args.tandem and args.model:
        schema = {"type": "object",
                  "properties": {"name": {"type": "string", "maxLength": 12},
                                 "age": {"type": "integer"},
                                 "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
                  "required": ["name", "age"], "additionalProperties": False}
        v = jsonschema.Draft202012Validator(schema)
        with tempfile.TemporaryDirectory() as tmp:
            schema_file = os.path.join(tmp, "schema.json")
            with open(schema_file, "w") as f:
                json.dump(schema, f)
            for seed in range(6):
                cmd = [args.tandem, "generate", "--model", args.model, "--prompt", "And God said",
                       "--max-tokens", "200", "--temperature", "1", "--seed", str(seed),
                       "--json-schema", schema_file, "--json"]
                p = subprocess.run(cmd, capture_output=True)
                if p.returncode != 0:
                    failures.append(f"generate seed {seed}: exit {p.returncode}: {p.stderr.decode()[-500:]}")
                    continue
                res = json.loads(p.stdout.decode("utf-8").strip().splitlines()[-1])
                if res["finish_reason"] != "stop":
                    continue
                generated += 1
                try:
                    value = json.loads(res["text"])
                except ValueError as e:
                    failures.append(f"generate seed {seed}: not JSON ({e}): {res['text']!r}")
                    continue
                if not v.is_valid(value):
                    failures.append(f"generate seed {seed}: not valid: {res['text']!r}")
        if generated == 0:
            failures.append("generate: no output ended with EOS within 200 tokens")

    for f in failures:
        print("FAIL", f)
    print(f"structured output: {len(corpus['cases'])} schemas, {instances} instance texts, "
          f"{walks} generated walks, {generated} model outputs judged by jsonschema "
          f"{jsonschema.__name__}; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
