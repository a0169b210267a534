// read_events.mjs — the harness's readEvents, which load.mjs counts on to end every request: a
// client that hangs up (aborts its fetch) mid-stream must get the abort's reason at once, however
// far the body has come. A node HTTP server sends short event streams in a few writes; 16 clients
// read 2,000 of them and hang up after 2 events. Node's fetch alone leaves some of those reads
// pending forever (nodejs/undici#4089: the abort lands after the last bytes but before the body
// closed); any read still pending after 3 s fails this test (5 of them end it). Whole streams read without a hang-up
// must still give every event and end.
import assert from 'node:assert/strict';
import http from 'node:http';

import { readEvents } from './harness.mjs';

const STREAMS = 2000;
const rand = (n) => Math.floor(Math.random() * n);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const server = http.createServer(async (req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/event-stream' });
  const n = Number(new URL(req.url, 'http://x').searchParams.get('n'));
  for (let i = 0; i < n; i++) {
    res.write(`data: ${i} ${'x'.repeat(rand(300))}\n\n`);
    if (rand(2)) await sleep(rand(3));
  }
  res.end('data: [DONE]\n\n');
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${server.address().port}/`;

const count = { hungUp: 0, whole: 0, stuck: 0, wrong: [] };
async function one(t) {
  const hangUp = t % 4 !== 0;
  const n = 2 + rand(6);
  const ac = new AbortController();
  const res = await fetch(`${url}?n=${n}`, { signal: ac.signal });
  const seen = [];
  const read = readEvents(res, async (data) => {
    if (rand(3) === 0) await sleep(rand(4));
    seen.push(data);
    if (hangUp && seen.length >= 2) ac.abort(new Error('hang-up'));
  }, ac.signal).then(() => 'ended', (e) => (e.message === 'hang-up' ? 'hung up' : `threw ${e}`));
  const got = await Promise.race([read, sleep(3000).then(() => 'stuck')]);
  if (got === 'stuck') count.stuck += 1;
  else if (hangUp && got === 'hung up') count.hungUp += 1;
  else if (!hangUp && got === 'ended' && seen.length === n + 1 && seen[n] === '[DONE]') count.whole += 1;
  else if (count.wrong.length < 5) count.wrong.push(`stream ${t} (${n} events, hang-up ${hangUp}): ${got}, ${seen.length} seen`);
  else count.wrong.push('...');
}

await Promise.all(Array.from({ length: 16 }, async (_, c) => {
  for (let t = c; t < STREAMS && count.stuck < 5; t += 16) await one(t);
}));
server.close();
console.log(`read_events: ${count.hungUp} hung up, ${count.whole} read whole, ${count.stuck} stuck, ` +
  `${count.wrong.length} wrong`);
for (const w of count.wrong.slice(0, 6)) console.error(`FAIL: ${w}`);
assert.equal(count.stuck, 0, 'a read stayed pending after its hang-up');
assert.equal(count.wrong.length, 0);
assert.equal(count.hungUp + count.whole, STREAMS);
process.exit(0);
