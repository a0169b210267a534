// load.mjs — `ember serve` under load on loopback: 32 streaming clients (more than the batch of 8
// and its queue of 16 hold, so some requests are answered 503) for 60 s ($SERVE_LOAD_SECONDS),
// mixing completions and chat, whole and streamed, some hanging up mid-stream, some sending bad
// JSON, and a few raw sockets that trickle bytes, send garbage or announce huge bodies. Every
// request must complete (a well-formed stream ending in [DONE], or a whole answer) or get 503 —
// none may hang (60 s each at most) — bad ones get a 4xx or a closed connection, and the server's
// resident memory must stay flat (the last third of the run against the middle third). The server
// then empties its batch and exits 0 on SIGTERM.
import assert from 'node:assert/strict';
import net from 'node:net';

import { readEvents, rssMiB, startServer, waitHealth } from './harness.mjs';

const SECONDS = Number(process.env.SERVE_LOAD_SECONDS || 60);
const CLIENTS = Number(process.env.SERVE_LOAD_CLIENTS || 32);
const HANG_MS = 60000;

const server = await startServer([
  '--max-batch', '8', '--max-queue', '16', '--max-tokens', '64', '--max-body', '65536',
  '--conn-timeout', '5', '--read-timeout', '5', '--timeout', '60',
]);
const { url } = server;
const stats = { ok: 0, streamed: 0, busy: 0, aborted: 0, bad: 0, raw: 0, tokens: 0 };
const failures = [];
const rss = [];
const t0 = Date.now();
const deadline = t0 + SECONDS * 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pending = new Map(); // the clients' requests in flight, for the watchdog below

function fail(what) {
  if (failures.length < 20) failures.push(what);
}

// One request of client `id`, iteration `n`.
async function once(id, n) {
  const chat = (id + n) % 2 === 0;
  const stream = n % 4 !== 3;
  const hangUp = stream && n % 7 === 5;
  const bad = n % 11 === 10;
  const body = bad ? '{"prompt": "unterminated' : JSON.stringify({
    ...(chat ? { messages: [{ role: 'user', content: `Client ${id} says hello, round ${n}.` }] }
      : { prompt: `Client ${id}, round ${n}:` }),
    max_tokens: 4 + ((id * 7 + n * 13) % 40),
    temperature: n % 3 === 0 ? 0 : 0.8,
    seed: id * 1000 + n,
    stream,
    ...(stream && n % 2 ? { stream_options: { include_usage: true } } : {}),
  });
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new Error('hang')), HANG_MS);
  const path = chat ? '/v1/chat/completions' : '/v1/completions';
  const key = `client ${id} round ${n}`;
  pending.set(key, { path, stream, since: Date.now(), phase: 'request' });
  try {
    const res = await fetch(url + path, {
      method: 'POST', body, headers: { 'Content-Type': 'application/json' }, signal: ac.signal,
    });
    if (res.status === 503) {
      const e = await res.json();
      if (!e.error || !e.error.message) fail(`503 without an error object: ${JSON.stringify(e)}`);
      stats.busy += 1;
      return 'busy';
    }
    if (bad) {
      if (res.status !== 400) fail(`bad JSON answered ${res.status}`);
      await res.text();
      stats.bad += 1;
      return;
    }
    if (res.status !== 200) {
      fail(`${path} answered ${res.status}: ${await res.text()}`);
      return;
    }
    if (!stream) {
      const j = await res.json();
      const c = j.choices[0];
      if (!['stop', 'length'].includes(c.finish_reason)) fail(`finish_reason ${c.finish_reason}`);
      stats.tokens += j.usage.completion_tokens;
      stats.ok += 1;
      return;
    }
    pending.get(key).phase = 'stream';
    let done = false;
    let finish = null;
    let chunks = 0;
    await readEvents(res, (data) => {
      if (done) throw new Error('an event after [DONE]');
      if (data === '[DONE]') {
        done = true;
        return;
      }
      const j = JSON.parse(data);
      if (j.error) throw new Error(`error event: ${j.error.message}`);
      if (j.usage) stats.tokens += j.usage.completion_tokens;
      const c = j.choices[0];
      if (c && c.finish_reason) finish = c.finish_reason;
      chunks += 1;
      if (hangUp && chunks >= 2) ac.abort(new Error('hang-up'));
    }, ac.signal);
    if (!done || !['stop', 'length'].includes(finish)) fail(`stream ended without [DONE] (${finish})`);
    stats.streamed += 1;
  } catch (e) {
    if (hangUp && ac.signal.aborted && ac.signal.reason?.message === 'hang-up') {
      stats.aborted += 1;
    } else if (ac.signal.aborted && ac.signal.reason?.message === 'hang') {
      fail(`a request hung for ${HANG_MS / 1000} s: ${path} ${body}`);
    } else {
      fail(`${path}: ${e.stack || e}`);
    }
  } finally {
    clearTimeout(timer);
    pending.delete(key);
  }
}

async function client(id) {
  for (let n = 0; Date.now() < deadline; n++) {
    if ((await once(id, n)) === 'busy') await sleep(100 + ((id * 37 + n * 11) % 200)); // back off
  }
}

// A raw socket doing something wrong; resolves when the server answered 4xx or closed it.
function misbehave(kind) {
  return new Promise((resolve) => {
    const s = net.connect(server.port, '127.0.0.1');
    let got = '';
    let timer = null;
    const finish = (why) => {
      clearInterval(timer);
      s.destroy();
      const status = Number((got.match(/^HTTP\/1\.\d (\d{3})/) || [])[1] || 0);
      if (status && (status < 400 || status >= 500)) fail(`${kind}: answered ${status}`);
      resolve(why);
    };
    s.setTimeout(30000, () => {
      fail(`${kind}: neither answered nor closed in 30 s`);
      finish('timeout');
    });
    // the idle timeout above never fires for a trickle (a byte every 500 ms): a deadline too
    const deadline = setTimeout(() => {
      fail(`${kind}: not closed within 40 s of connecting`);
      finish('deadline');
    }, 40000);
    s.on('close', () => clearTimeout(deadline));
    s.on('data', (d) => { got += d; });
    s.on('error', () => {});
    s.on('close', () => finish('closed'));
    s.on('connect', () => {
      if (kind === 'trickle') {
        s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"prompt": "');
        timer = setInterval(() => s.write('a'), 500);
      } else if (kind === 'garbage') {
        s.write('\x00\xff GARBAGE / HTTP/9.9\r\n\r\n');
      } else if (kind === 'huge') {
        s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{');
      } else if (kind === 'silent') {
        // connects and says nothing: the idle timeout closes it
      }
    });
  });
}

async function rawClient(kind) {
  while (Date.now() < deadline) {
    await misbehave(kind);
    stats.raw += 1;
    await sleep(100);
  }
}

const sampler = setInterval(() => {
  try { rss.push({ t: (Date.now() - t0) / 1000, mib: rssMiB(server.proc.pid) }); } catch { /* exiting */ }
}, 1000);

console.log(`load: ${CLIENTS} clients + 4 raw sockets for ${SECONDS} s against ${url}`);
// every request ends within HANG_MS of the deadline, a raw socket within 40 s: past that a hang
// is reported here, with what is still in flight, rather than left to CTest's timeout
const watchdog = setTimeout(() => {
  const now = Date.now();
  console.error(`FAIL: the clients still run ${(now - deadline) / 1000} s after the deadline; ` +
    `in flight: ${JSON.stringify([...pending].map(([k, v]) => ({ k, ...v, s: (now - v.since) / 1000 })))}`);
  server.proc.kill('SIGKILL');
  process.exit(1);
}, SECONDS * 1000 + HANG_MS + 45000);
await Promise.all([
  ...Array.from({ length: CLIENTS }, (_, i) => client(i)),
  ...['trickle', 'garbage', 'huge', 'silent'].map(rawClient),
]);
clearInterval(sampler);
clearTimeout(watchdog);

const h = await waitHealth(url, (x) => x.active === 0 && x.queued === 0, 30000);
const elapsed = (Date.now() - t0) / 1000;
const third = (lo, hi) => {
  const xs = rss.filter((s) => s.t >= SECONDS * lo && s.t < SECONDS * hi).map((s) => s.mib);
  return xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
};
const middle = third(1 / 3, 2 / 3);
const last = third(2 / 3, 1.01);
const peak = Math.max(...rss.map((s) => s.mib));
console.log(`load: ${elapsed.toFixed(1)} s: ${stats.streamed} streams and ${stats.ok} whole answers completed, ` +
  `${stats.aborted} hung up on purpose, ${stats.busy} answered 503, ${stats.bad} bad requests answered 400, ` +
  `${stats.raw} misbehaving sockets dealt with; ${stats.tokens} tokens counted in usage`);
console.log(`load: server: ${h.completed} completed, ${h.cancelled} cancelled, ${h.rejected} rejected, ` +
  `${h.steps} batched steps, up to ${h.max_batch_rows} rows in one`);
console.log(`load: resident memory: ${rss[0]?.mib.toFixed(1)} MiB at start, ${middle.toFixed(1)} MiB ` +
  `(middle third), ${last.toFixed(1)} MiB (last third), peak ${peak.toFixed(1)} MiB`);

const r = await server.stop();
for (const f of failures) console.error(`FAIL: ${f}`);
const checks = [
  [elapsed >= SECONDS, `ran ${elapsed} s`],
  [stats.streamed + stats.ok >= 50, 'at least 50 requests completed'],
  [h.max_batch_rows >= 8, 'the batch filled up (8 rows in one step)'],
  [stats.aborted > 0 && h.cancelled > 0, 'hang-ups cancelled their sequences'],
  [last - middle < Math.max(16, middle * 0.15), `memory flat (${middle.toFixed(1)} -> ${last.toFixed(1)} MiB)`],
  [r.code === 0, `clean exit on SIGTERM (status ${r.code}, signal ${r.signal})`],
];
checks.push([failures.length === 0, 'every request completed, got 503, or was refused as it should']);
for (const [ok, what] of checks) if (!ok) console.error(`FAIL: ${what}`);
if (r.code !== 0) console.error(r.stderr.slice(-4000));
const passed = checks.filter(([ok]) => ok).length;
console.log(`${passed} passed, ${checks.length - passed} failed`);
assert.equal(passed, checks.length);
