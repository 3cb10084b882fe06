#!/usr/bin/env python3
"""`tandem up` and `tandem generate --server` end to end: the cluster starts and reports ready, the
streamed results (ids, text, logprobs, prompt logprobs, seeded sampling, a batch file) equal the
in-process `tandem generate --json` output, and Ctrl-C stops every process cleanly.

Usage: cluster_cli_test.py PATH_TO_TANDEM WORK_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench_util import free_port_run  # noqa: E402

TANDEM, WORK = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
model = os.path.join(WORK, "tiny-llama")
subprocess.run([TANDEM, "make-model", "--preset", "tiny-llama", "--out", model, "--seed", "3"],
               check=True, capture_output=True)
ready = os.path.join(WORK, "ready")
logs = os.path.join(WORK, "logs")
port = free_port_run(1)
env = dict(os.environ, TANDEM_NUM_THREADS="1")
# Its stdout goes to a file, as a script's would: what it prints must be there while it runs (flushed).
up_out_path = os.path.join(WORK, "up.out")
up_out = open(up_out_path, "w")
up = subprocess.Popen([TANDEM, "up", "--model", model, "--port", str(port), "--prefill", "2", "--decode", "1",
                       "--ready-file", ready, "--log-dir", logs, "--metrics-port", str(free_port_run(4))],
                      stdout=up_out, stderr=subprocess.PIPE, text=True, env=env)
deadline = time.time() + 60
while not os.path.exists(ready) and time.time() < deadline and up.poll() is None:
    time.sleep(0.05)
if not os.path.exists(ready):
    up.kill()
    _, err = up.communicate()
    print(f"tandem up did not get ready:\n{open(up_out_path).read()}\n{err}")
    sys.exit(1)
address = open(ready).read().strip()
check(address == f"127.0.0.1:{port}", f"ready file holds {address}")
running_out = open(up_out_path).read()
check("Tandem cluster serving" in running_out and "Metrics: GET /metrics on ports" in running_out,
      f"tandem up's stdout, redirected to a file, lacks its endpoints while it runs: {running_out!r}")


def generate(*args, server=True):
    cmd = [TANDEM, "generate", "--json", *args]
    cmd += ["--server", address] if server else ["--model", model]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        failures.append(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
        return None
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


cases = [
    ["--prompt", "The quick brown fox", "--max-tokens", "24", "--temperature", "0", "--logprobs", "2",
     "--prompt-logprobs", "1", "--ignore-eos"],
    ["--token-ids", "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21", "--max-tokens", "16",
     "--temperature", "0.9", "--seed", "11", "--top-k", "50", "--ignore-eos"],
    ["--token-ids", "1,2,3", "--max-tokens", "1", "--temperature", "0"],
]
for args in cases:
    remote, local = generate(*args), generate(*args, server=False)
    if not remote or not local:
        continue
    r, l = remote[0], local[0]
    for key in ["prompt_token_ids", "token_ids", "text", "finish_reason", "logprobs", "prompt_logprobs"]:
        check(r.get(key) == l.get(key), f"{args}: {key} differs:\n server  {r.get(key)}\n in-proc {l.get(key)}")
    check(r["timings"]["time_to_first_token"] > 0, f"{args}: no TTFT in the server timings")

batch = os.path.join(WORK, "batch.jsonl")
with open(batch, "w") as f:
    for i in range(12):
        f.write(json.dumps({"id": f"b{i}", "token_ids": [i + 1, 2 * i + 3, 7], "max_tokens": 5 + i,
                            "temperature": 0, "ignore_eos": True}) + "\n")
remote, local = generate("--batch-file", batch), generate("--batch-file", batch, server=False)
if remote and local:
    check([x["id"] for x in remote] == [x["id"] for x in local], "batch ids/order differ")
    for r, l in zip(remote, local):
        check(r["token_ids"] == l["token_ids"], f"batch {r['id']}: token ids differ")

# A request that asks to speculate (n-gram) gets the same greedy tokens as in-process without, and
# its counts.
spec_args = ["--prompt", "The quick brown fox jumps over the lazy dog. The quick brown fox", "--max-tokens",
             "40", "--temperature", "0", "--ignore-eos"]
remote = generate(*spec_args, "--speculative-method", "ngram", "--num-speculative-tokens", "5")
local = generate(*spec_args, server=False)
if remote and local:
    check(remote[0]["token_ids"] == local[0]["token_ids"], "speculating through the router: tokens differ")
    counts = remote[0].get("speculation", {})
    check(counts.get("accepted", -1) <= counts.get("proposed", 0) and counts.get("proposed", 0) > 0,
          f"server speculation counts {counts}")

# A conversation: the router renders it with the model's chat template (make-model writes a ChatML
# one with Hermes tool calls) and tokenizes it without added special tokens, as in-process generate
# does; its prompt is what `tandem chat-template` prints, encoded by `tandem tokenize`.
messages = os.path.join(WORK, "messages.json")
tools = os.path.join(WORK, "tools.json")
with open(messages, "w") as f:
    json.dump([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "20 °C"}], f)
with open(tools, "w") as f:
    json.dump([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}], f)
chat_args = ["--messages-file", messages, "--tools-file", tools, "--max-tokens", "12", "--temperature", "0",
             "--ignore-eos"]
remote, local = generate(*chat_args), generate(*chat_args, server=False)
if remote and local:
    for key in ["prompt_token_ids", "token_ids", "text", "chat"]:
        check(remote[0].get(key) == local[0].get(key),
              f"chat: {key} differs:\n server  {remote[0].get(key)}\n in-proc {local[0].get(key)}")
    check(remote[0]["chat"]["content"] == remote[0]["text"] and remote[0]["chat"]["tool_calls"] == [],
          f"chat output of a reply without tool calls: {remote[0]['chat']}")
    # The router hands tool-call arguments to the template as an object (as vLLM does).
    with open(messages) as f:
        parsed_args = json.load(f)
    parsed_args[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    as_object = os.path.join(WORK, "messages_object_args.json")
    with open(as_object, "w") as f:
        json.dump(parsed_args, f)
    rendered = subprocess.run([TANDEM, "chat-template", "--model", model, "--messages-file", as_object,
                               "--tools-file", tools, "--add-generation-prompt"], capture_output=True, timeout=60)
    prompt_file = os.path.join(WORK, "chat_prompt.txt")
    with open(prompt_file, "wb") as f:
        f.write(rendered.stdout)
    ids = subprocess.run([TANDEM, "tokenize", "--model", model, "--file", prompt_file, "--json"],
                         capture_output=True, text=True, timeout=60)
    check(rendered.returncode == 0 and ids.returncode == 0 and
          json.loads(ids.stdout)["ids"] == remote[0]["prompt_token_ids"],
          f"chat prompt ids differ from chat-template + tokenize: {rendered.stderr!r} {ids.stderr!r}")
bad_messages = os.path.join(WORK, "bad_messages.json")
with open(bad_messages, "w") as f:
    json.dump([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{broken"}}]}], f)
p = subprocess.run([TANDEM, "generate", "--server", address, "--messages-file", bad_messages],
                   capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "chat.messages[0].tool_calls[0].arguments" in p.stderr,
      f"bad chat request: exit {p.returncode}, stderr {p.stderr!r}")

# A bad request is refused with exit code 2 and a message.
p = subprocess.run([TANDEM, "generate", "--server", address, "--token-ids", "1,2", "--top-p", "0"],
                   capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "top_p" in p.stderr, f"bad request: exit {p.returncode}, stderr {p.stderr!r}")

up.send_signal(signal.SIGINT)
try:
    _, err = up.communicate(timeout=30)
    check(up.returncode == 0, f"tandem up exited with {up.returncode}: {err}")
except subprocess.TimeoutExpired:
    up.kill()
    failures.append("tandem up did not stop within 30 s of Ctrl-C")
for name in sorted(os.listdir(logs)):
    text = open(os.path.join(logs, name)).read()
    if name != "router.log":
        check("stopped" in text, f"{name} does not end with a clean stop:\n{text[-500:]}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("cluster CLI checks passed")
