#!/usr/bin/env node
// The OpenAI-compatible HTTP API driven by the official `openai` npm package (the client most
// services use), against a real cluster (`tandem up --http-port`): models, completions and chat
// completions whole and streamed, n > 1, logprobs, tools in the conversation, structured output
// (tool_choice required and named, response_format), errors in OpenAI's
// shape (a template that refuses the conversation among them), and at temperature 0 the same text
// as the gRPC API for the same prompt. Then raw HTTP for
// what a client library hides: malformed JSON, unknown fields, an oversize body, a wrong method, and
// a client that disconnects mid-stream — its request is cancelled and the decode worker's KV blocks
// return to their baseline.
//
// usage: node openai_http_test.mjs TANDEM_BINARY WORK_DIR
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const { default: OpenAI } = await import(path.join(HERE, '..', 'conformance', 'node_modules', 'openai', 'index.mjs'));

const [TANDEM, WORK] = process.argv.slice(2);
if (!TANDEM || !WORK) {
  console.error('usage: node openai_http_test.mjs TANDEM_BINARY WORK_DIR');
  process.exit(2);
}
const failures = [];
const check = (cond, what) => {
  if (!cond) failures.push(what);
};

// The first of n consecutive TCP ports free now (`tandem up --metrics-port` takes the router's port
// and the ones after it for the workers). Below Linux's ephemeral range (32768 on), so no socket that
// binds port 0 meanwhile (a worker's gRPC port, another test's outgoing connection) can take one.
const canListen = (port) =>
  new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '0.0.0.0', () => s.close(() => resolve(true)));
  });
async function freePort(n = 1) {
  for (let attempt = 0; attempt < 200; ++attempt) {
    const first = 20000 + Math.floor(Math.random() * (32768 - n - 20000));
    let free = true;
    for (let p = first; free && p < first + n; ++p) free = await canListen(p);
    if (free) return first;
  }
  throw new Error(`no ${n} consecutive free ports`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

fs.rmSync(WORK, { recursive: true, force: true });
fs.mkdirSync(WORK, { recursive: true });
const model = path.join(WORK, 'tiny-qwen3');
const made = spawnSync(TANDEM, ['make-model', '--preset', 'tiny-qwen3', '--out', model, '--seed', '5']);
if (made.status !== 0) {
  console.error(`make-model failed: ${made.stderr}`);
  process.exit(1);
}
// The model's template, refusing one role as real templates refuse what they cannot render
// (chat_template.jinja beside the config wins over the config's template).
const config = JSON.parse(fs.readFileSync(path.join(model, 'tokenizer_config.json'), 'utf8'));
fs.writeFileSync(path.join(model, 'chat_template.jinja'),
  "{%- for m in messages %}{%- if m.role == 'forbidden' %}{{ raise_exception('the role forbidden is not allowed') }}" +
  '{%- endif %}{%- endfor %}' + config.chat_template);
const grpcPort = await freePort();
const httpPort = await freePort();
const metricsPort = await freePort(3);
const ready = path.join(WORK, 'ready');
const up = spawn(
  TANDEM,
  ['up', '--model', model, '--port', String(grpcPort), '--http-port', String(httpPort), '--prefill', '1', '--decode',
   '1', '--ready-file', ready, '--log-dir', path.join(WORK, 'logs'), '--metrics-port', String(metricsPort)],
  { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, TANDEM_NUM_THREADS: '1' } },
);
let upOutput = '';
up.stdout.on('data', (d) => (upOutput += d));
up.stderr.on('data', (d) => (upOutput += d));
const stopCluster = async () => {
  if (up.exitCode !== null) return;
  up.kill('SIGINT');
  for (let i = 0; i < 300 && up.exitCode === null; ++i) await sleep(100);
  if (up.exitCode === null) up.kill('SIGKILL');
};
try {
  for (let i = 0; i < 600 && !fs.existsSync(ready); ++i) {
    if (up.exitCode !== null) break;
    await sleep(100);
  }
  if (!fs.existsSync(ready)) throw new Error(`tandem up did not get ready:\n${upOutput}`);
  await run();
} catch (e) {
  failures.push(`unexpected: ${e.stack || e}`);
} finally {
  await stopCluster();
}
if (failures.length > 0) {
  console.log(failures.join('\n'));
  process.exit(1);
}
console.log('openai HTTP API checks passed');

// The gRPC API's answer for the same request, through `tandem generate --server`.
function grpcGenerate(args) {
  const p = spawnSync(TANDEM, ['generate', '--json', '--server', `127.0.0.1:${grpcPort}`, ...args], {
    encoding: 'utf8',
    timeout: 120000,
  });
  if (p.status !== 0) throw new Error(`generate ${args.join(' ')}: ${p.stderr}`);
  return JSON.parse(p.stdout.trim().split('\n')[0]);
}

// The decode worker's KV blocks in use (its /metrics: the router's port + 2, after the prefill
// worker's).
async function decodeBlocksUsed() {
  for (const port of [metricsPort + 1, metricsPort + 2]) {
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    if (!/role="decode"/.test(text)) continue;
    const m = text.match(/^tandem_kv_blocks_used\{[^}]*\} (\S+)$/m);
    if (m) return Number(m[1]);
  }
  throw new Error('no decode worker metrics');
}

async function rawPost(pathName, body, headers = {}) {
  const r = await fetch(`http://127.0.0.1:${httpPort}${pathName}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
  return { status: r.status, json: await r.json().catch(() => null) };
}

async function run() {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${httpPort}/v1`, apiKey: 'unused', maxRetries: 0 });
  const modelName = 'tiny-qwen3';

  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === modelName, `models: ${JSON.stringify(models.data)}`);

  // Completions, whole and streamed, against the gRPC API.
  const prompt = 'The quick brown fox';
  const completion = await client.completions.create({
    model: modelName, prompt, max_tokens: 12, temperature: 0, logprobs: 2,
  });
  const viaGrpc = grpcGenerate(['--prompt', prompt, '--max-tokens', '12', '--temperature', '0', '--logprobs', '2']);
  const choice = completion.choices[0];
  check(choice.text === viaGrpc.text, `completion text ${JSON.stringify(choice.text)} != gRPC ${JSON.stringify(viaGrpc.text)}`);
  check(completion.usage.completion_tokens === 12 && completion.usage.prompt_tokens === viaGrpc.prompt_token_ids.length,
        `completion usage ${JSON.stringify(completion.usage)}`);
  check(choice.finish_reason === 'length', `finish_reason ${choice.finish_reason}`);
  check(choice.logprobs.tokens.length === 12 && choice.logprobs.top_logprobs.every((t) => Object.keys(t).length <= 2 && Object.keys(t).length >= 1),
        `completion logprobs ${JSON.stringify(choice.logprobs).slice(0, 300)}`);
  check(choice.logprobs.token_logprobs.every((l, i) => Math.abs(l - viaGrpc.logprobs[i].logprob) < 1e-5),
        'completion logprobs differ from the gRPC API\'s');
  let streamed = '';
  let usageChunk = null;
  let finish = null;
  const stream = await client.completions.create({
    model: modelName, prompt, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    if (chunk.usage) usageChunk = chunk.usage;
    for (const c of chunk.choices) {
      streamed += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(streamed === viaGrpc.text, `streamed completion ${JSON.stringify(streamed)} != ${JSON.stringify(viaGrpc.text)}`);
  check(finish === 'length' && usageChunk && usageChunk.completion_tokens === 12, `stream end: ${finish} ${JSON.stringify(usageChunk)}`);

  // Chat, whole and streamed, against the gRPC API's chat input.
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Name a colour. Ünïcödé: 你好 😀' },
  ];
  fs.writeFileSync(path.join(WORK, 'messages.json'), JSON.stringify(messages));
  const chatGrpc = grpcGenerate(['--messages-file', path.join(WORK, 'messages.json'), '--max-tokens', '10', '--temperature', '0']);
  const chat = await client.chat.completions.create({
    model: modelName, messages, max_completion_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const message = chat.choices[0].message;
  check(message.role === 'assistant' && message.content === chatGrpc.text,
        `chat content ${JSON.stringify(message.content)} != gRPC ${JSON.stringify(chatGrpc.text)}`);
  check(chat.usage.prompt_tokens === chatGrpc.prompt_token_ids.length, `chat prompt tokens ${chat.usage.prompt_tokens} vs ${chatGrpc.prompt_token_ids.length}`);
  check(chat.choices[0].logprobs.content.length === 10 &&
        chat.choices[0].logprobs.content.every((t) => t.top_logprobs.length === 3 && Array.isArray(t.bytes)),
        `chat logprobs ${JSON.stringify(chat.choices[0].logprobs).slice(0, 300)}`);
  let chatStreamed = '';
  let sawRole = false;
  const chatStream = await client.chat.completions.create({
    model: modelName, messages, max_tokens: 10, temperature: 0, stream: true,
  });
  for await (const chunk of chatStream) {
    for (const c of chunk.choices) {
      if (c.delta.role === 'assistant') sawRole = true;
      chatStreamed += c.delta.content || '';
    }
  }
  check(sawRole && chatStreamed === chatGrpc.text, `streamed chat ${JSON.stringify(chatStreamed)} != ${JSON.stringify(chatGrpc.text)}`);

  // n > 1: seeded samples, each choice its own, reproducible.
  const sampled = async () => client.chat.completions.create({
    model: modelName, messages, max_tokens: 8, temperature: 1, seed: 7, n: 3,
  });
  const [s1, s2] = [await sampled(), await sampled()];
  check(s1.choices.length === 3 && s1.choices.map((c) => c.index).join() === '0,1,2', `n=3 indices ${s1.choices.map((c) => c.index)}`);
  check(JSON.stringify(s1.choices.map((c) => c.message.content)) === JSON.stringify(s2.choices.map((c) => c.message.content)),
        'seeded n=3 is not reproducible');
  check(new Set(s1.choices.map((c) => c.message.content)).size > 1, `n=3 choices are all equal: ${JSON.stringify(s1.choices.map((c) => c.message.content))}`);
  check(s1.usage.completion_tokens === 24, `n=3 usage ${JSON.stringify(s1.usage)}`);

  // Tools in the conversation: rendered into the prompt (longer), a reply comes back.
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
                                                 parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const withTools = await client.chat.completions.create({
    model: modelName, max_tokens: 4, temperature: 0, tools, tool_choice: 'auto',
    messages: [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' },
    ],
  });
  check(withTools.usage.prompt_tokens > chat.usage.prompt_tokens + 20 && withTools.choices[0].message.role === 'assistant',
        `chat with tools: ${JSON.stringify(withTools.usage)}`);
  // Streamed with tools, the content (held back only where a call may start) adds up to the same.
  const toolArgs = { model: modelName, max_tokens: 24, temperature: 0, tools, messages };
  const whole = await client.chat.completions.create(toolArgs);
  let pieces = '';
  let toolFinish = null;
  for await (const chunk of await client.chat.completions.create({ ...toolArgs, stream: true })) {
    for (const c of chunk.choices) {
      pieces += c.delta.content || '';
      if (c.finish_reason) toolFinish = c.finish_reason;
    }
  }
  check(pieces === (whole.choices[0].message.content || '') && toolFinish === whole.choices[0].finish_reason,
        `streamed chat with tools ${JSON.stringify(pieces)} (${toolFinish}) != ${JSON.stringify(whole.choices[0].message.content)} (${whole.choices[0].finish_reason})`);

  // Errors in OpenAI's shape, as the client raises them.
  try {
    await client.chat.completions.create({ model: 'no-such-model', messages });
    failures.push('an unknown model was accepted');
  } catch (e) {
    check(e.status === 404 && e.code === 'model_not_found', `unknown model: ${e.status} ${e.code} ${e.message}`);
  }
  try {
    await client.completions.create({ model: modelName, prompt, temperature: 'hot' });
    failures.push('a string temperature was accepted');
  } catch (e) {
    check(e.status === 400 && /temperature/.test(e.message), `bad temperature: ${e.status} ${e.message}`);
  }
  // Structured output: tool_choice required and named, response_format json_schema and json_object.
  // Every output must parse and follow its schema whatever the (random) model prefers.
  const boundedTools = [{ type: 'function', function: { name: 'get_weather', parameters: {
    type: 'object', properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
    required: ['city'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time' } }];
  const forcedArgs = { model: modelName, messages, tools: boundedTools, max_tokens: 600, temperature: 1, seed: 3 };
  const validWeather = (call) => {
    const a = JSON.parse(call.function.arguments);
    return call.function.name === 'get_weather' && typeof a.city === 'string' && [...a.city].length <= 8 &&
      (a.unit === undefined || ['c', 'f'].includes(a.unit)) && Object.keys(a).every((k) => k === 'city' || k === 'unit');
  };
  const required = await client.chat.completions.create({ ...forcedArgs, tool_choice: 'required' });
  const calls = required.choices[0].message.tool_calls || [];
  check(required.choices[0].finish_reason === 'tool_calls' && calls.length >= 1 &&
        calls.every((c) => (c.function.name === 'get_time' && c.function.arguments === '{}') || validWeather(c)),
        `tool_choice required: ${JSON.stringify(required.choices[0])}`);
  let namedCalls = null;
  let namedContent = '';
  for await (const chunk of await client.chat.completions.create({
    ...forcedArgs, stream: true, tool_choice: { type: 'function', function: { name: 'get_weather' } } })) {
    for (const c of chunk.choices) {
      namedContent += c.delta.content || '';
      if (c.delta.tool_calls) namedCalls = c.delta.tool_calls;
    }
  }
  check(namedContent === '' && namedCalls?.length === 1 && validWeather(namedCalls[0]),
        `streamed named tool_choice: content ${JSON.stringify(namedContent)}, calls ${JSON.stringify(namedCalls)}`);
  const personSchema = { type: 'object', properties: { name: { type: 'string', maxLength: 10 }, age: { enum: [1, 2, 30] },
                                                       ok: { type: 'boolean' } }, required: ['name', 'ok'], additionalProperties: false };
  const shaped = await client.chat.completions.create({
    model: modelName, messages, max_tokens: 600, temperature: 1, seed: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personSchema } } });
  let person = null;
  try { person = JSON.parse(shaped.choices[0].message.content); } catch (e) { /* checked below */ }
  check(shaped.choices[0].finish_reason === 'stop' && person && typeof person.name === 'string' && typeof person.ok === 'boolean' &&
        (person.age === undefined || [1, 2, 30].includes(person.age)),
        `response_format json_schema: ${JSON.stringify(shaped.choices[0])}`);
  const object = await client.completions.create({ model: modelName, prompt, max_tokens: 600, temperature: 0,
                                                   response_format: { type: 'json_object' } });
  let parsed = null;
  try { parsed = JSON.parse(object.choices[0].text); } catch (e) { /* checked below */ }
  check(object.choices[0].finish_reason === 'length' ||
        (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)),
        `completions response_format json_object: ${JSON.stringify(object.choices[0])}`);
  for (const [what, args, pattern] of [
    ['a schema keyword structured output cannot enforce',
     { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } } }, /pattern/],
    ['tool_choice required without tools', { tool_choice: 'required' }, /tool_choice/],
    ['a named tool that is not among the tools', { tools: boundedTools, tool_choice: { type: 'function', function: { name: 'nope' } } }, /nope/],
  ]) {
    try {
      await client.chat.completions.create({ model: modelName, messages, ...args });
      failures.push(`${what} was accepted`);
    } catch (e) {
      check(e.status === 400 && pattern.test(e.message), `${what}: ${e.status} ${e.message}`);
    }
  }

  try {
    await client.chat.completions.create({ model: modelName, messages: [{ role: 'forbidden', content: 'x' }] });
    failures.push('a conversation the template refuses was accepted');
  } catch (e) {
    check(e.status === 400 && /the role forbidden is not allowed/.test(e.message), `template raise: ${e.status} ${e.message}`);
  }

  // What a client library hides.
  const malformed = await rawPost('/v1/chat/completions', '{"messages": [');
  check(malformed.status === 400 && /not valid JSON/.test(malformed.json?.error?.message), `malformed JSON: ${JSON.stringify(malformed)}`);
  const unknown = await rawPost('/v1/completions', JSON.stringify({ prompt: 'x', frobnicate: 1 }));
  check(unknown.status === 400 && /frobnicate/.test(unknown.json?.error?.message), `unknown field: ${JSON.stringify(unknown)}`);
  const wrongType = await rawPost('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 5 }] }));
  check(wrongType.status === 400 && /messages\[0\]\.content/.test(wrongType.json?.error?.message), `wrong type: ${JSON.stringify(wrongType)}`);
  const oversize = await rawPost('/v1/completions', JSON.stringify({ prompt: 'x'.repeat(17 << 20) }));
  check(oversize.status === 413, `oversize body: ${oversize.status}`);
  const wrongMethod = await fetch(`http://127.0.0.1:${httpPort}/v1/chat/completions`);
  check(wrongMethod.status === 400, `GET chat completions: ${wrongMethod.status}`);
  const missing = await fetch(`http://127.0.0.1:${httpPort}/v2/nothing`);
  check(missing.status === 404, `unknown path: ${missing.status}`);
  const health = await fetch(`http://127.0.0.1:${httpPort}/health`);
  check(health.status === 200, `health: ${health.status}`);

  // A client that goes away mid-stream: its request is cancelled, the blocks come back.
  const baseline = await decodeBlocksUsed();
  const controller = new AbortController();
  const long = await client.completions.create(
    { model: modelName, prompt: 'A long story: ', max_tokens: 1500, temperature: 0, ignore_eos: true, stream: true },
    { signal: controller.signal },
  );
  let chunks = 0;
  try {
    for await (const chunk of long) {
      if (++chunks === 3) controller.abort();
    }
  } catch (e) {
    check(e.name === 'APIUserAbortError' || e.name === 'AbortError', `abort: ${e.name} ${e.message}`);
  }
  let used = -1;
  for (let i = 0; i < 40; ++i) {
    used = await decodeBlocksUsed();
    if (used <= baseline) break;
    await sleep(50);
  }
  check(used <= baseline, `after a client disconnect the decode worker holds ${used} blocks (baseline ${baseline})`);
  const router = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
  check(/tandem_requests_total\{[^}]*code="CANCELLED"[^}]*\} [1-9]/.test(router),
        'the disconnected client\'s request was not cancelled (no CANCELLED in tandem_requests_total)');
  check(/tandem_http_requests_total\{[^}]*code="200"[^}]*endpoint="\/v1\/chat\/completions"/.test(router) ||
        /tandem_http_requests_total\{[^}]*endpoint="\/v1\/chat\/completions"[^}]*code="200"/.test(router),
        'the router counts no HTTP chat requests');
}
