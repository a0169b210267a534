// web.mjs — the chat page of `ember serve` in headless Chromium, driven by Playwright
// (playwright-core with Debian's chromium): the page loads with nothing from other origins and no
// console errors; a prompt typed and sent shows as text (markup in it stays text); the reply
// streams in (the reply's text changes several times while the Stop button shows); Stop ends a
// long reply (the text stops growing, the server's batch empties); the conversation survives a
// reload and "New chat" starts another. A screenshot goes to $SERVE_SCREENSHOT when set.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { test, before, after } from 'node:test';

import { npm, skip, startServer, waitHealth } from './harness.mjs';

const { chromium } = npm('playwright-core');
const exe = [process.env.CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => p && existsSync(p));
if (!exe) skip('no chromium (scripts/bootstrap installs it)');

let server;
let browser;
let page;
const problems = [];

before(async () => {
  server = await startServer(['--max-tokens', '2000']);
  browser = await chromium.launch({
    executablePath: exe,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  page = await browser.newPage();
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('request', (r) => {
    if (!r.url().startsWith(server.url) && !r.url().startsWith('data:')) problems.push(`external request: ${r.url()}`);
  });
});

after(async () => {
  if (browser) await browser.close();
  const r = await server.stop();
  assert.equal(r.code, 0, `ember serve exited with ${r.code}:\n${r.stderr}`);
});

const lastReply = () => page.locator('.msg.assistant .text').last();

// Sets "Max tokens" as a person would: opens Settings when closed, types the value.
async function setMaxTokens(n) {
  if (!(await page.locator('#settings').evaluate((d) => d.open))) await page.click('#settings summary');
  await page.fill('#max-tokens', String(n));
  await page.dispatchEvent('#max-tokens', 'change');
}

test('the page loads from the server alone', async () => {
  await page.goto(server.url);
  assert.equal(await page.title(), 'ember chat');
  await page.waitForFunction(() => document.getElementById('model').textContent.length > 0);
  assert.ok(await page.locator('#send').isEnabled());
  assert.ok(await page.locator('#stop').isHidden());
});

test('a prompt is sent and the reply streams in as text', async () => {
  // Count the reply's text changes as they happen, in the page.
  await page.evaluate(() => {
    window.__changes = 0;
    new MutationObserver(() => { window.__changes += 1; })
      .observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  await setMaxTokens(60);
  const prompt = 'Hello <b>there</b> & <script>alert(1)</script>';
  await page.fill('#prompt', prompt);
  await page.press('#prompt', 'Enter');
  // The user's message is shown exactly as typed: text, not markup.
  const user = page.locator('.msg.user .text').last();
  assert.equal(await user.textContent(), prompt);
  assert.equal(await page.locator('#messages b, #messages script').count(), 0);
  // Tokens arrive while the reply is still going (the Stop button shows).
  await page.waitForFunction(() => {
    const t = [...document.querySelectorAll('.msg.assistant .text')].pop();
    return t && t.textContent.length > 0 && !document.getElementById('stop').hidden;
  }, null, { timeout: 60000 });
  const early = (await lastReply().textContent()).length;
  await page.waitForFunction(() => document.getElementById('stop').hidden, null, { timeout: 60000 });
  const final = await lastReply().textContent();
  assert.ok(final.length >= early, 'the reply only grows');
  const changes = await page.evaluate(() => window.__changes);
  assert.ok(changes >= 4, `the reply came in pieces (${changes} changes)`);
  assert.equal(await page.locator('.msg.assistant .text b, .msg.assistant .text script').count(), 0);
  const status = await page.locator('#status').textContent();
  assert.match(status, /tokens|done/);
});

test('Stop ends a long reply and the server drops it', async () => {
  await setMaxTokens(2000);
  await page.fill('#prompt', 'Tell me a very long story.');
  await page.click('#send');
  await page.waitForFunction(() => {
    const t = [...document.querySelectorAll('.msg.assistant .text')].pop();
    return t && t.textContent.length > 5;
  }, null, { timeout: 60000 });
  assert.ok(await page.locator('#stop').isVisible(), 'still streaming when Stop is pressed');
  await page.click('#stop');
  await page.waitForFunction(() => document.getElementById('stop').hidden, null, { timeout: 10000 });
  const stopped = await lastReply().textContent();
  assert.equal(await page.locator('.msg.assistant .note').last().textContent(), 'stopped');
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal(await lastReply().textContent(), stopped, 'nothing arrives after Stop');
  const h = await waitHealth(server.url, (x) => x.active === 0 && x.queued === 0);
  assert.ok(h.cancelled >= 1, `the server saw the reply cancelled: ${JSON.stringify(h)}`);
  assert.ok(await page.locator('#send').isEnabled());
});

test('the conversation survives a reload; New chat starts another', async () => {
  await page.reload();
  assert.equal(await page.locator('.msg.user').count(), 2);
  assert.equal(await page.locator('.msg.assistant').count(), 2);
  assert.equal(await page.locator('.msg.user .text').first().textContent(),
    'Hello <b>there</b> & <script>alert(1)</script>');
  await page.click('#new-chat');
  assert.equal(await page.locator('.msg').count(), 0);
  assert.ok(await page.locator('#history li').count() >= 2);
  if (process.env.SERVE_SCREENSHOT) {
    await page.click('#history li:nth-child(2) button.open');
    await page.screenshot({ path: process.env.SERVE_SCREENSHOT });
  }
});

test('no console errors, nothing from elsewhere', () => {
  assert.deepEqual(problems, []);
});
