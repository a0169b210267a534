// openai.mjs — `ember serve` through OpenAI's own client library (npm `openai`), pointed at the
// local server: the model list, completions and chat completions whole and streamed (the same
// text both ways for a seed, the usage in the last chunk), stop strings, and the errors the
// library turns into its exception classes (400, 401, 404), a stream aborted by the client, and
// a clean exit on SIGTERM.
import assert from 'node:assert/strict';
import { test, before, after } from 'node:test';

import { npm, startServer, waitHealth } from './harness.mjs';

const OpenAI = npm('openai').default ?? npm('openai');
const KEY = 'test-key-123';
let server;
let client;
let model;

before(async () => {
  server = await startServer(['--api-key', KEY, '--max-tokens', '128', '--model-name', 'tiny-gpt']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60000 });
});

after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, `ember serve exited with ${r.code} (${r.signal}):\n${r.stderr}`);
});

test('models', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m);
  assert.equal(ids.length, 1);
  assert.equal(ids[0].id, 'tiny-gpt');
  assert.equal(ids[0].object, 'model');
  model = ids[0].id;
  const one = await client.models.retrieve('tiny-gpt');
  assert.equal(one.id, 'tiny-gpt');
  await assert.rejects(client.models.retrieve('gpt-4o'), (e) => e instanceof OpenAI.NotFoundError);
});

test('completions, whole and streamed', async () => {
  const args = { model, prompt: 'In the beginning', max_tokens: 20, temperature: 0.7, seed: 7 };
  const whole = await client.completions.create(args);
  assert.equal(whole.object, 'text_completion');
  assert.match(whole.id, /^cmpl-/);
  assert.equal(whole.choices.length, 1);
  const text = whole.choices[0].text;
  assert.equal(typeof text, 'string');
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
  assert.ok(whole.usage.prompt_tokens > 0);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  if (whole.choices[0].finish_reason === 'length') assert.equal(whole.usage.completion_tokens, 20);

  const stream = await client.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
  let streamed = '';
  let chunks = 0;
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      streamed += c.text;
      chunks += 1;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(streamed, text, 'a seed gives the same text streamed and whole');
  assert.ok(chunks >= 2);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
});

test('chat completions, whole and streamed', async () => {
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Hello!' },
  ];
  const args = { model, messages, max_tokens: 24, temperature: 0 };
  const whole = await client.chat.completions.create(args);
  assert.equal(whole.object, 'chat.completion');
  assert.match(whole.id, /^chatcmpl-/);
  const msg = whole.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.equal(typeof msg.content, 'string');
  assert.ok(whole.usage.prompt_tokens > 0);

  const stream = await client.chat.completions.create({ ...args, stream: true });
  let streamed = '';
  let first = true;
  let finish = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    const c = chunk.choices[0];
    if (first) assert.equal(c.delta.role, 'assistant');
    first = false;
    streamed += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(streamed, msg.content);
  assert.equal(finish, whole.choices[0].finish_reason);

  // The library's stream helper assembles the same message.
  const runner = client.chat.completions.stream({ ...args });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, msg.content);
});

test('stop strings', async () => {
  const base = { model, prompt: 'Hello', max_tokens: 30, temperature: 0 };
  const whole = (await client.completions.create(base)).choices[0].text;
  if (whole.length < 6) return; // the model ended early: nothing to cut
  const stop = whole.slice(3, 5);
  const cut = await client.completions.create({ ...base, stop: [stop] });
  assert.equal(cut.choices[0].text, whole.slice(0, whole.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
});

test('errors as the library expects them', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'messages',
  );
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_tokens',
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], temperature: 9 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature',
  );
  const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

test('a stream aborted by the client leaves the batch', async () => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model, messages: [{ role: 'user', content: 'Talk.' }], max_tokens: 128, temperature: 0, stream: true },
    { signal: ac.signal },
  );
  let got = 0;
  try {
    for await (const chunk of stream) {
      got += (chunk.choices[0]?.delta?.content ?? '').length;
      if (got > 0) ac.abort();
    }
  } catch (e) {
    // Depending on where the abort lands, the library ends the iteration or throws.
    assert.ok(e.name === 'AbortError' || e instanceof OpenAI.APIUserAbortError, String(e));
  }
  assert.ok(got > 0 && ac.signal.aborted, 'some text came before the abort');
  await waitHealth(server.url, (h) => h.active === 0 && h.queued === 0);
});
