#!/usr/bin/env bash
# curl.sh — `ember serve` checked with curl: the binary started on a free loopback port with the
# fixture's checkpoint and an API key; health, models, completions and chat completions whole and
# streamed (server-sent events read by curl -N as they come), OpenAI error objects for bad
# requests (401, 400, 404, 405, 413), a client that hangs up mid-stream (its sequence leaves the
# batch), and a clean exit on SIGTERM (status 0, which under the sanitizer build includes
# LeakSanitizer's verdict). JSON is checked with node, never with text matching.
set -euo pipefail
: "${EMBER_CLI:?run through ctest}" "${SERVE_MODEL:?run through ctest}"
command -v curl >/dev/null || { echo "skipped: no curl"; exit 77; }
command -v node >/dev/null || { echo "skipped: no node"; exit 77; }

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  echo "--- server stderr:" >&2
  cat "$work/err" >&2 || true
  exit 1
}

KEY=curl-test-key
"$EMBER_CLI" serve --checkpoint "$SERVE_MODEL" --port 0 --api-key "$KEY" --max-tokens 64 \
  --max-body 65536 --model-name tiny >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 1 1200); do
  grep -q "listening on" "$work/out" && break
  kill -0 "$pid" 2>/dev/null || fail "ember serve exited before listening"
  sleep 0.1
done
url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$work/out")
[ -n "$url" ] || fail "no address in: $(cat "$work/out")"
echo "server at $url"
auth=(-H "Authorization: Bearer $KEY")
passed=0

# call NAME EXPECTED_STATUS CURL_ARGS... : the body goes to $work/body, the status is checked.
call() {
  local name=$1 want=$2
  shift 2
  local got
  got=$(curl -sS -o "$work/body" -w '%{http_code}' --max-time 60 "$@") || fail "$name: curl failed"
  [ "$got" = "$want" ] || fail "$name: status $got, expected $want: $(head -c 500 "$work/body")"
  passed=$((passed + 1))
}

# js NAME EXPRESSION : evaluates EXPRESSION with `b` bound to the parsed body; it must be true.
js() {
  local name=$1 expr=$2
  node -e '
    const fs = require("fs");
    const b = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    if (!('"$expr"')) { console.error(JSON.stringify(b)); process.exit(1); }
  ' "$work/body" || fail "$name: $expr"
  passed=$((passed + 1))
}

# The OpenAI error object.
is_error='typeof b.error.message === "string" && typeof b.error.type === "string" && "code" in b.error && "param" in b.error'

call health 200 "$url/health"
js health 'b.status === "ok" && b.active === 0'
call "models without key" 401 "$url/v1/models"
js "models without key" "$is_error && b.error.code === \"invalid_api_key\""
call "models with a wrong key" 401 -H "Authorization: Bearer nope" "$url/v1/models"
call models 200 "${auth[@]}" "$url/v1/models"
js models 'b.object === "list" && b.data.length === 1 && b.data[0].id === "tiny" && b.data[0].object === "model"'
call "page" 200 "$url/"
grep -q "<title>ember chat</title>" "$work/body" || fail "the page has no title"

# Completions.
call completion 200 "${auth[@]}" -H "Content-Type: application/json" "$url/v1/completions" \
  -d '{"model": "tiny", "prompt": "Hello, world", "max_tokens": 12, "temperature": 0}'
js completion 'b.object === "text_completion" && /^cmpl-/.test(b.id) && b.model === "tiny" &&
  typeof b.choices[0].text === "string" && ["stop", "length"].includes(b.choices[0].finish_reason) &&
  b.usage.prompt_tokens > 0 && b.usage.total_tokens === b.usage.prompt_tokens + b.usage.completion_tokens'
cp "$work/body" "$work/whole.json"

# Streamed: every event is JSON, the text is the whole answer's, [DONE] closes it.
call "completion stream" 200 -N "${auth[@]}" "$url/v1/completions" \
  -d '{"prompt": "Hello, world", "max_tokens": 12, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}'
node -e '
  const fs = require("fs");
  const body = fs.readFileSync(process.argv[1], "utf8");
  const whole = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const events = body.split("\n\n").filter((e) => e.trim()).map((e) => {
    if (!e.startsWith("data: ")) throw new Error("not an event: " + e);
    return e.slice(6);
  });
  if (events.pop() !== "[DONE]") throw new Error("no [DONE] at the end");
  const chunks = events.map((e) => JSON.parse(e));
  const usage = chunks.pop().usage;
  const text = chunks.map((c) => c.choices[0].text).join("");
  if (text !== whole.choices[0].text) throw new Error(`streamed ${JSON.stringify(text)} != ${JSON.stringify(whole.choices[0].text)}`);
  if (chunks.at(-1).choices[0].finish_reason !== whole.choices[0].finish_reason) throw new Error("finish_reason differs");
  if (JSON.stringify(usage) !== JSON.stringify(whole.usage)) throw new Error("usage differs");
' "$work/body" "$work/whole.json" || fail "completion stream"
passed=$((passed + 1))

# Chat.
call chat 200 "${auth[@]}" "$url/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10, "temperature": 0.8, "seed": 3}'
js chat 'b.object === "chat.completion" && /^chatcmpl-/.test(b.id) && b.choices[0].message.role === "assistant" &&
  typeof b.choices[0].message.content === "string" && b.usage.completion_tokens <= 10'
call "chat stream" 200 -N "${auth[@]}" "$url/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10, "stream": true}'
grep -q '"delta":{"role":"assistant"' "$work/body" || fail "chat stream: no role delta first"
tail -c 20 "$work/body" | grep -q 'data: \[DONE\]' || fail "chat stream: no [DONE]"

# Bad requests: OpenAI error objects with the right status.
call "invalid JSON" 400 "${auth[@]}" "$url/v1/completions" -d '{"prompt": '
js "invalid JSON" "$is_error && b.error.type === \"invalid_request_error\""
call "wrong type" 400 "${auth[@]}" "$url/v1/chat/completions" -d '{"messages": "hi"}'
js "wrong type" "$is_error && b.error.param === \"messages\""
call "out of range" 400 "${auth[@]}" "$url/v1/completions" -d '{"prompt": "x", "top_p": 7}'
js "out of range" "$is_error && b.error.param === \"top_p\""
call "too many tokens" 400 "${auth[@]}" "$url/v1/completions" -d '{"prompt": "x", "max_tokens": 65}'
js "too many tokens" "$is_error && b.error.param === \"max_tokens\""
call "unknown route" 404 "${auth[@]}" "$url/v1/embeddings" -d '{}'
js "unknown route" "$is_error"
call "wrong method" 405 "${auth[@]}" -X PUT "$url/v1/chat/completions" -d '{}'
head -c 70000 /dev/zero | tr '\0' 'a' >"$work/big"
call "huge body" 413 "${auth[@]}" "$url/v1/completions" --data-binary @"$work/big"
js "huge body" "$is_error"

# A client that hangs up mid-stream (curl gives up after a second): the sequence leaves.
curl -sS -N --max-time 1 "${auth[@]}" "$url/v1/completions" \
  -d '{"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stream": true}' \
  >/dev/null 2>&1 || true
for _ in $(seq 1 100); do
  curl -sS -o "$work/body" "$url/health"
  node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); process.exit(b.active === 0 && b.queued === 0 ? 0 : 1)' "$work/body" && break
  sleep 0.1
done
js "hang-up leaves the batch" 'b.active === 0 && b.queued === 0'
call "still serving" 200 "${auth[@]}" "$url/v1/completions" -d '{"prompt": "x", "max_tokens": 2}'

# SIGTERM: a clean exit.
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
[ "$status" -eq 0 ] || fail "ember serve exited with $status on SIGTERM"
passed=$((passed + 1))
echo "$passed passed, 0 failed"
