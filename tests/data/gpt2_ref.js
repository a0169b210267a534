// gpt2_ref.js — reference GPT-2 token ids for tests/data/test_bpe.c and bench/bench_tokenizer.c,
// from the npm packages gpt-3-encoder and js-tiktoken (installed by scripts/bootstrap into
// .cache/npm). Usage: node gpt2_ref.js NPM_MODULES_DIR TEXTFILE [encode|special|bench N]
//   encode:  line 1 gpt-3-encoder's ids, line 2 js-tiktoken's ids (specials as ordinary text)
//   special: js-tiktoken's ids with every special token allowed
//   bench:   js-tiktoken's encode throughput over the file, best of N runs, as "MB/s tokens"
'use strict';
const fs = require('fs');
const path = require('path');
const [mods, file, mode = 'encode', reps = '5'] = process.argv.slice(2);
const text = fs.readFileSync(file, 'utf8');
const { getEncoding } = require(path.join(mods, 'js-tiktoken'));
const tk = getEncoding('gpt2');
if (mode === 'encode') {
  const g3 = require(path.join(mods, 'gpt-3-encoder'));
  console.log(g3.encode(text).join(' '));
  console.log(tk.encode(text, [], []).join(' '));
} else if (mode === 'special') {
  console.log(tk.encode(text, 'all').join(' '));
} else if (mode === 'bench') {
  const bytes = Buffer.byteLength(text, 'utf8');
  let best = Infinity, n = 0;
  tk.encode(text, [], []); // warm up the JIT
  for (let i = 0; i < Number(reps); i++) {
    const t0 = process.hrtime.bigint();
    n = tk.encode(text, [], []).length;
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt < best) best = dt;
  }
  console.log(`${(bytes / best / 1e6).toFixed(3)} ${n}`);
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
