#!/usr/bin/env python3
"""The reference for chat-template rendering: Python's jinja2 set up the way Hugging Face
transformers sets it up for `tokenizer.apply_chat_template(..., tokenize=False)`, with no
transformers import.

What this module reproduces (transformers' src/transformers/utils/chat_template_utils.py and
tokenization_utils_base.py; written from their documented behaviour, not copied):
  - the environment: jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
    lstrip_blocks=True, extensions=[an AssistantTracker-like `{% generation %}` extension,
    jinja2.ext.loopcontrols]);
  - the `tojson` filter replaced by json.dumps(x, ensure_ascii=False, indent=indent,
    separators=separators, sort_keys=sort_keys) (jinja's own escapes HTML and cannot indent);
  - globals raise_exception(message) (raises jinja2's TemplateError with the message) and
    strftime_now(format) (datetime.now().strftime(format));
  - the call: template.render(messages=..., tools=tools or None, documents=None,
    add_generation_prompt=..., **special_tokens_map, **kwargs); the caller's kwargs win over the
    special tokens;
  - the template choice: tokenizer_config.json's `chat_template` is one string or a list of
    {"name", "template"}; with a list, "tool_use" when tools are given and it exists, else "default"
    (else transformers raises); a chat_template.jinja file beside the config wins over the config.

special_tokens_map (see special_tokens_map() below for the order chosen and why).

Run by hand (prints each case's prompt, or the error jinja2 raised):
  python3 reference_render.py --model DIR [--jinja FILE] [--corpus corpus.json] [--case ID]
DIR holds tokenizer_config.json (and maybe chat_template.jinja).
"""
import argparse
import datetime
import functools
import json
import os
import sys

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox
except ImportError:
    sys.exit("Python's jinja2 is missing: apt-get install python3-jinja2 (scripts/install_deps.sh)")
# transformers refuses jinja2 older than 3.1.0.
if tuple(int(p) for p in jinja2.__version__.split(".")[:2]) < (3, 1):
    sys.exit(f"jinja2 {jinja2.__version__} is older than 3.1, which transformers requires")

HERE = os.path.dirname(os.path.abspath(__file__))

# The named special tokens, in the order transformers' SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES
# lists them.
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What raise_exception raises. transformers raises TemplateError itself; a subclass behaves the
    same for the template (templates cannot catch) and lets the runner tell a template's own
    refusal, whose message Tandem must keep, from a render error."""


class GenerationTracker(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers' AssistantTracker. With no tracker
    active (apply_chat_template without return_assistant_tokens_mask) the block renders its body
    unchanged, which is all that matters for the prompt text."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    raise RaisedByTemplate(message)


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)


@functools.lru_cache(maxsize=None)
def environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=None)
def compile_template(source):
    """jinja2.Template; raises jinja2.TemplateSyntaxError (or another TemplateError) when jinja2
    itself cannot parse the source."""
    return environment().from_string(source)


def _token_string(value):
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object
    ({"__type": "AddedToken", "content": ...} or just {"content": ...}); None when absent."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens_map(config):
    """The special tokens transformers passes to every rendering, from a tokenizer_config.json.

    Chosen order and content (transformers 4.x, the `special_tokens_map` property that
    apply_chat_template spreads into the template's variables):
      1. bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token: each when
         present, not null and not the empty string (4.x keeps only truthy values), as its string;
      2. additional_special_tokens: the list of strings, when present and non-empty;
      3. extra_special_tokens when it is a dict ({"image_token": "<image>", ...}; Gemma 3's config
         has one): transformers >= 4.47 appends its keys to SPECIAL_TOKENS_ATTRIBUTES
         (_set_model_specific_special_tokens), so they follow, in the dict's order, as strings.
    Not reproduced, documented here: transformers 5.x's special_tokens_map holds only the named
    tokens (1., with `is not None`, so an empty string stays) plus the model-specific named tokens
    (3., and also any other top-level string `*_token` key of the config); its additional/extra
    special-token *list* is no longer a template variable. A list-valued extra_special_tokens (the
    5.x spelling of additional_special_tokens) is therefore not passed here either. No template in
    this corpus reads additional_special_tokens, so 4.x and 5.x render the corpus the same except
    where a token is "" (none here).
    """
    tokens = {}
    for name in NAMED_SPECIAL_TOKENS:
        value = _token_string(config.get(name))
        if value:
            tokens[name] = value
    additional = config.get("additional_special_tokens")
    if isinstance(additional, list) and additional:
        tokens["additional_special_tokens"] = [_token_string(t) for t in additional]
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        for name, value in extra.items():
            value = _token_string(value)
            if value:
                tokens[name] = value
    return tokens


def template_source(config, jinja_file, tools):
    """The template text transformers would use, or raises ValueError as it does."""
    if jinja_file is not None:
        return jinja_file
    template = config.get("chat_template")
    if template is None:
        raise ValueError("the tokenizer has no chat template")
    if isinstance(template, str):
        return template
    named = {t["name"]: t["template"] for t in template}
    if tools is not None and "tool_use" in named:
        return named["tool_use"]
    if "default" in named:
        return named["default"]
    raise ValueError("This model has multiple chat templates with no default specified!")


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def render_case(config, jinja_file, case):
    """One case of the corpus rendered: {"output": str} or {"error": str, "raised": str|None} where
    "raised" is raise_exception's message when the template refused the conversation itself.
    Template parse errors propagate (the caller reports the template as unparseable)."""
    tools = case.get("tools")
    template = compile_template(template_source(config, jinja_file, tools))
    variables = dict(special_tokens_map(config))
    variables.update(case.get("kwargs") or {})
    try:
        output = template.render(messages=case["messages"], tools=tools, documents=None,
                                 add_generation_prompt=bool(case.get("add_generation_prompt")),
                                 **variables)
    except RaisedByTemplate as exc:
        return {"output": None, "error": error_text(exc), "raised": str(exc.message)}
    except Exception as exc:  # jinja2 errors and the Python errors a template can cause
        return {"output": None, "error": error_text(exc), "raised": None}
    return {"output": output, "error": None, "raised": None}


def load_model_dir(model_dir):
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    jinja_file = None
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            jinja_file = f.read()
    return config, jinja_file


def load_corpus(path=os.path.join(HERE, "corpus.json")):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["cases"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="directory with tokenizer_config.json")
    parser.add_argument("--jinja", help="a chat_template.jinja to use instead of the directory's")
    parser.add_argument("--corpus", default=os.path.join(HERE, "corpus.json"))
    parser.add_argument("--case", help="only this case id")
    args = parser.parse_args()
    config, jinja_file = load_model_dir(args.model)
    if args.jinja:
        with open(args.jinja, encoding="utf-8") as f:
            jinja_file = f.read()
    for case in load_corpus(args.corpus):
        if args.case and case["id"] != args.case:
            continue
        result = render_case(config, jinja_file, case)
        print(f"=== {case['id']}")
        if result["error"] is not None:
            print(f"ERROR {result['error']}")
        else:
            print(repr(result["output"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
