// harness.mjs — what the node-driven serve tests share: starting `ember serve` on a free port with
// the fixture's checkpoint, reading its address from the "listening on" line, stopping it with
// SIGTERM (it must exit 0: under the sanitizer build that includes LeakSanitizer's verdict),
// the npm packages from the project-local .cache/npm (scripts/bootstrap installs them), reading a
// stream of server-sent events, and the server's resident memory.
import { spawn } from 'node:child_process';
import { readFileSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '..', '..');
export const npmDir = process.env.NPM_DIR || path.join(repo, '.cache', 'npm');

// Exit code CTest reads as "skipped" (SKIP_RETURN_CODE in tests/serve/CMakeLists.txt).
export const SKIP = 77;

export function skip(why) {
  console.log(`skipped: ${why}`);
  process.exit(SKIP);
}

// An npm package from .cache/npm, or a skip when bootstrap has not installed it.
export function npm(name) {
  const req = createRequire(path.join(npmDir, 'package.json'));
  try {
    return req(name);
  } catch (e) {
    skip(`npm package ${name} is not installed in ${npmDir} (run scripts/bootstrap)`);
  }
  return null;
}

export function need(name) {
  const v = process.env[name];
  if (!v) skip(`$${name} is not set (run through ctest)`);
  return v;
}

// Starts `ember serve` with extra arguments; resolves to { url, proc, port, stop() }.
export async function startServer(args = [], { timeoutMs = 120000 } = {}) {
  const cli = need('EMBER_CLI');
  const model = need('SERVE_MODEL');
  if (!existsSync(model)) skip(`no fixture checkpoint at ${model}`);
  const proc = spawn(cli, ['serve', '--checkpoint', model, '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr.on('data', (d) => {
    stderr += d;
    if (process.env.SERVE_VERBOSE) process.stderr.write(d);
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`ember serve did not start in ${timeoutMs} ms:\n${stderr}`)), timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    exited.then(({ code }) => {
      clearTimeout(timer);
      reject(new Error(`ember serve exited with ${code} before listening:\n${stderr}`));
    });
  });
  return {
    url,
    proc,
    port: Number(new URL(url).port),
    stderr: () => stderr,
    // SIGTERM, then the exit status (0 expected; a sanitizer report makes it non-zero).
    async stop() {
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 30000);
      const r = await exited;
      clearTimeout(timer);
      return { ...r, stderr };
    },
  };
}

// The server's resident set in MiB (Linux /proc).
export function rssMiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}

// Calls onEvent(data) for each server-sent event of a fetch response's body, as it arrives. With
// a signal, its abort ends the read at once (throwing the signal's reason), however the body
// stands: Node's fetch alone can leave a read pending forever when the abort lands after the
// last bytes came but before the body stream closed (nodejs/undici#4089), so the read is raced
// against the signal here, and the body is cancelled (its connection closed) on the way out.
export async function readEvents(res, onEvent, signal = null) {
  const decoder = new TextDecoder();
  const reader = res.body.getReader();
  let onAbort = null;
  const aborted = signal && new Promise((_, reject) => {
    onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
  aborted?.catch(() => {}); // it may never be awaited
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await (aborted ? Promise.race([reader.read(), aborted]) : reader.read());
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (data) await onEvent(data);
        if (signal?.aborted) throw signal.reason;
      }
    }
  } finally {
    if (onAbort) signal.removeEventListener('abort', onAbort);
    reader.cancel().catch(() => {}); // not awaited: a stuck body must not hold the caller
  }
  if (buf.trim()) throw new Error(`stream ended inside an event: ${JSON.stringify(buf.slice(0, 200))}`);
}

export async function health(url) {
  // a server that stops answering fails the caller (after 10 s) rather than hanging it
  const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(10000) });
  return res.json();
}

// Polls /health until pred(h) holds (or throws after timeoutMs).
export async function waitHealth(url, pred, timeoutMs = 15000) {
  const until = Date.now() + timeoutMs;
  let h;
  while (Date.now() < until) {
    h = await health(url);
    if (pred(h)) return h;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`/health never got there: ${JSON.stringify(h)}`);
}
