/* test_serve.c — the serve layer in process: a tiny random GPT with a character tokenizer served
 * on a free loopback port, talked to over plain sockets (HTTP/1.0, so every answer ends with the
 * connection). What is checked: the routes (health, models, the page's files, 404, 405), OpenAI's
 * response shapes and usage counts; that a completion — whole or streamed, alone or sharing the
 * batch with others — has exactly the text of em_gpt_generate run alone (greedy and seeded);
 * stop strings and finish reasons; chat through the template; the API key; a full queue answered
 * 503; a client that leaves (streaming, waiting for a whole answer, or still queued) taking its
 * sequence out of the batch; the time limit; and bad requests (invalid JSON, wrong types, values
 * out of range, huge bodies, a body trickling in, garbage on the socket) answered 4xx or closed,
 * with the server still serving afterwards. Also the chat template on its own. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "serve/internal.h"

static const char ALPHABET[] =
    "In the beginning was the word. User: Assistant: hello, how are you? fine thanks!\n"
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 <>\"'{}[]:;,.-_";

static em_device *dev;
static em_tokenizer *tok;
static em_gpt *model;

/* ---- a minimal HTTP/1.0 client -------------------------------------------------------------- */

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {60, 0}; /* nothing in these tests waits that long */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const char *data, size_t n)
{
    while (n) {
        ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server may close first: the answer says what happened */
        data += w;
        n -= (size_t)w;
    }
}

static void send_request(int fd, const char *method, const char *path, const char *body,
                         const char *headers)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, headers ? headers : "", body ? strlen(body) : 0);
    send_all(fd, head, (size_t)n);
    if (body) send_all(fd, body, strlen(body));
}

typedef struct reply {
    int status;  /* 0: the connection closed without an answer */
    char *head;  /* status line and headers */
    char *body;  /* NUL-terminated */
    cJSON *json; /* the body parsed, when it is JSON */
} reply;

/* Reads until the server closes the connection. */
static reply read_reply(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1024 > cap) buf = realloc(buf, cap *= 2);
        ssize_t r = recv(fd, buf + len, cap - len - 1, 0);
        if (r <= 0) break;
        len += (size_t)r;
    }
    buf[len] = 0;
    close(fd);
    reply rp = {0};
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &rp.status) != 1 || !sep) {
        rp.status = 0;
        rp.head = buf;
        rp.body = strdup("");
        return rp;
    }
    *sep = 0;
    rp.head = buf;
    rp.body = strdup(sep + 4);
    rp.json = cJSON_Parse(rp.body);
    return rp;
}

static reply request(int port, const char *method, const char *path, const char *body,
                     const char *headers)
{
    int fd = dial(port);
    send_request(fd, method, path, body, headers);
    return read_reply(fd);
}

static void reply_free(reply *r)
{
    free(r->head);
    free(r->body);
    cJSON_Delete(r->json);
}

static const char *str_at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double num_at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const cJSON *choice0(const cJSON *o)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
}

/* An OpenAI error object with this status (and param, when given). */
static void expect_error(reply *r, int status, const char *param)
{
    if (r->status != status) fail_msg("expected %d, got %d: %s", status, r->status, r->body);
    assert_non_null(r->json);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(r->json, "error");
    assert_true(cJSON_IsObject(e));
    assert_non_null(str_at(e, "message", NULL));
    assert_non_null(str_at(e, "type", NULL));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(e, "code"));
    if (param) {
        const char *p = str_at(e, "param", NULL);
        if (!p || strcmp(p, param) != 0)
            fail_msg("error param '%s', expected '%s' (%s)", p ? p : "(null)", param, r->body);
    }
    reply_free(r);
}

/* Streamed events: the text of every chunk concatenated; the last chunk's finish reason; the
 * usage chunk's counts; whether [DONE] closed it. */
typedef struct events {
    char text[8192];
    char finish[32];
    int n_chunks;
    bool done, role_first;
    double prompt_tokens, completion_tokens;
} events;

static events parse_events(const char *body, bool chat)
{
    events ev = {0};
    ev.prompt_tokens = ev.completion_tokens = -1;
    const char *p = body;
    bool first = true;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        char *data = strndup(p, (size_t)(end - p));
        p = end + 2;
        assert_false(ev.done); /* nothing after [DONE] */
        if (strcmp(data, "[DONE]") == 0) {
            ev.done = true;
            free(data);
            continue;
        }
        cJSON *o = cJSON_Parse(data);
        if (!o) fail_msg("event is not JSON: %s", data);
        free(data);
        assert_string_equal(str_at(o, "object", NULL),
                            chat ? "chat.completion.chunk" : "text_completion");
        const cJSON *c = choice0(o);
        if (c) {
            ev.n_chunks++;
            const char *t = chat ? str_at(c, "delta", "content") : str_at(c, "text", NULL);
            if (first && chat) ev.role_first = str_at(c, "delta", "role") != NULL;
            first = false;
            if (t) strncat(ev.text, t, sizeof ev.text - strlen(ev.text) - 1);
            const char *f = str_at(c, "finish_reason", NULL);
            if (f) snprintf(ev.finish, sizeof ev.finish, "%s", f);
        } else {
            ev.prompt_tokens = num_at(o, "usage", "prompt_tokens");
            ev.completion_tokens = num_at(o, "usage", "completion_tokens");
            assert_int_equal(num_at(o, "usage", "total_tokens"),
                             ev.prompt_tokens + ev.completion_tokens);
        }
        cJSON_Delete(o);
    }
    return ev;
}

/* ---- the model, references and servers ------------------------------------------------------- */

enum { CTX = 64 };

static int setup(void **state)
{
    (void)state;
    const char *name = getenv("EMBER_TEST_DEVICE");
    dev = em_device_open(name && *name ? name : "cpu");
    const char *specials[] = {"<|endoftext|>"};
    tok = em_tok_char_from_text(ALPHABET, sizeof ALPHABET - 1, specials, 1);
    if (!dev || !tok) return -1;
    em_gpt_config c = {.vocab_size = em_tok_vocab_size(tok),
                       .block_size = CTX,
                       .n_layer = 2,
                       .n_head = 2,
                       .n_embd = 32,
                       .dropout = 0.0,
                       .bias = true,
                       .tied = true};
    model = em_gpt_new(dev, EM_F32, &c, 99);
    return model ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_gpt_free(model);
    em_tok_free(tok);
    em_device_close(dev);
    return 0;
}

static em_server *start(em_serve_config *cfg)
{
    cfg->host = "127.0.0.1";
    cfg->port = 0;
    cfg->model_name = "tiny";
    em_server *s = em_server_start(model, tok, cfg);
    if (!s) fail_msg("em_server_start: %s", em_last_error());
    assert_true(em_server_port(s) > 0);
    return s;
}

static em_server *start_default(void)
{
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    cfg.max_tokens = 200;
    return start(&cfg);
}

typedef struct collect {
    int64_t *ids;
    int64_t n;
} collect;

static bool collect_tok(int64_t t, void *user)
{
    collect *c = user;
    c->ids[c->n++] = t;
    return true;
}

/* What the server should answer: em_gpt_generate alone on the ids, <|endoftext|> ending the text,
 * decoded, cut before the first of the stop strings. Must run while no server has the model. */
static char *reference(const int64_t *ids, int64_t n, int64_t max_new, em_sample_config sc,
                       const char *const *stops, int nstops)
{
    int64_t *out = malloc((size_t)(max_new + 1) * sizeof *out);
    collect c = {out, 0};
    int64_t eot = em_tok_eot(tok);
    assert_int_equal(em_gpt_generate(model, ids, n, max_new, &sc, eot, collect_tok, &c, NULL),
                     EM_OK);
    if (c.n > 0 && out[c.n - 1] == eot) c.n--;
    uint32_t *u = malloc((size_t)(c.n + 1) * sizeof *u);
    for (int64_t i = 0; i < c.n; i++) u[i] = (uint32_t)out[i];
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(em_tok_decode(tok, u, (size_t)c.n, &text, &len), EM_OK);
    for (int i = 0; i < nstops; i++) {
        char *hit = strstr(text, stops[i]);
        if (hit) *hit = 0;
    }
    free(u);
    free(out);
    return text;
}

static char *reference_text(const char *prompt, int64_t max_new, em_sample_config sc)
{
    em_tokens t = {0};
    assert_int_equal(em_tok_encode(tok, prompt, strlen(prompt), true, &t), EM_OK);
    int64_t *ids = malloc(t.len * sizeof *ids);
    for (size_t i = 0; i < t.len; i++) ids[i] = t.ids[i];
    char *r = reference(ids, (int64_t)t.len, max_new, sc, NULL, 0);
    free(ids);
    em_tokens_free(&t);
    return r;
}

static int64_t count_tokens(const char *text)
{
    em_tokens t = {0};
    assert_int_equal(em_tok_encode(tok, text, strlen(text), true, &t), EM_OK);
    int64_t n = (int64_t)t.len;
    em_tokens_free(&t);
    return n;
}

static cJSON *health(int port)
{
    reply r = request(port, "GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    cJSON *o = r.json;
    r.json = NULL;
    reply_free(&r);
    return o;
}

/* Waits (up to secs) until /health's `key` satisfies the comparison. */
static bool wait_health(int port, const char *key, int op, double value, double secs)
{
    for (int i = 0; i < (int)(secs * 20); i++) {
        cJSON *h = health(port);
        double v = num_at(h, key, NULL);
        cJSON_Delete(h);
        if ((op == 0 && v == value) || (op > 0 && v >= value)) return true;
        usleep(50000);
    }
    cJSON *h = health(port);
    char *txt = cJSON_PrintUnformatted(h);
    fprintf(stderr, "[serve] waited for %s %s %g: %s\n", key, op ? ">=" : "==", value, txt);
    free(txt);
    cJSON_Delete(h);
    return false;
}

/* ---- routes ---------------------------------------------------------------------------------- */

static void test_routes(void **state)
{
    (void)state;
    em_server *s = start_default();
    int port = em_server_port(s);
    cJSON *h = health(port);
    assert_string_equal(str_at(h, "status", NULL), "ok");
    cJSON_Delete(h);

    reply r = request(port, "GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_at(r.json, "object", NULL), "list");
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r.json, "data"), 0);
    assert_string_equal(str_at(m, "id", NULL), "tiny");
    assert_string_equal(str_at(m, "object", NULL), "model");
    reply_free(&r);
    r = request(port, "GET", "/v1/models/tiny", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_at(r.json, "id", NULL), "tiny");
    reply_free(&r);
    r = request(port, "GET", "/v1/models/gpt-9", NULL, NULL);
    expect_error(&r, 404, "model");

    r = request(port, "GET", "/", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/html"));
    assert_non_null(strstr(r.head, "Content-Security-Policy"));
    assert_non_null(strstr(r.body, "<title>ember chat</title>"));
    assert_null(strstr(r.body, "http://")); /* no external assets */
    assert_null(strstr(r.body, "https://"));
    reply_free(&r);
    r = request(port, "GET", "/app.js", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/javascript"));
    assert_null(strstr(r.body, "innerHTML")); /* output is text, never HTML */
    assert_null(strstr(r.body, "https://"));
    reply_free(&r);
    r = request(port, "GET", "/style.css", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/css"));
    reply_free(&r);

    r = request(port, "GET", "/nowhere", NULL, NULL);
    expect_error(&r, 404, NULL);
    r = request(port, "GET", "/v1/completions", NULL, NULL);
    expect_error(&r, 405, NULL);
    r = request(port, "DELETE", "/v1/models", NULL, NULL);
    expect_error(&r, 405, NULL);
    r = request(port, "POST", "/health", "{}", NULL);
    expect_error(&r, 405, NULL);
    em_server_stop(s);
}

/* ---- completions ----------------------------------------------------------------------------- */

static void test_completion_matches_generate(void **state)
{
    (void)state;
    const char *prompt = "In the beginning";
    em_sample_config greedy = {0, 0, 1, 1, 0}, seeded = {0.9, 0, 0.9, 1, 42};
    char *want_greedy = reference_text(prompt, 24, greedy);
    char *want_seeded = reference_text(prompt, 24, seeded);
    int64_t np = count_tokens(prompt);
    em_server *s = start_default();
    int port = em_server_port(s);

    reply r = request(port, "POST", "/v1/completions",
                      "{\"model\": \"tiny\", \"prompt\": \"In the beginning\", \"max_tokens\": 24, "
                      "\"temperature\": 0}",
                      NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "application/json"));
    assert_string_equal(str_at(r.json, "object", NULL), "text_completion");
    assert_string_equal(str_at(r.json, "model", NULL), "tiny");
    assert_int_equal(strncmp(str_at(r.json, "id", NULL), "cmpl-", 5), 0);
    assert_true(num_at(r.json, "created", NULL) > 1.6e9);
    const cJSON *c = choice0(r.json);
    assert_string_equal(str_at(c, "text", NULL), want_greedy);
    assert_int_equal(num_at(c, "index", NULL), 0);
    char finish[16];
    snprintf(finish, sizeof finish, "%s", str_at(c, "finish_reason", NULL));
    bool ended = strlen(want_greedy) < 24; /* <|endoftext|> came first */
    assert_string_equal(finish, ended ? "stop" : "length");
    assert_int_equal(num_at(r.json, "usage", "prompt_tokens"), np);
    if (!ended) assert_int_equal(num_at(r.json, "usage", "completion_tokens"), 24);
    assert_int_equal(num_at(r.json, "usage", "total_tokens"),
                     np + num_at(r.json, "usage", "completion_tokens"));
    reply_free(&r);

    /* A seed reproduces a sample, and it is em_gpt_generate's. */
    const char *body = "{\"prompt\": [\"In the beginning\"], \"max_tokens\": 24, \"temperature\": "
                       "0.9, \"top_p\": 0.9, \"seed\": 42}";
    for (int i = 0; i < 2; i++) {
        r = request(port, "POST", "/v1/completions", body, NULL);
        assert_int_equal(r.status, 200);
        assert_string_equal(str_at(choice0(r.json), "text", NULL), want_seeded);
        reply_free(&r);
    }

    /* echo puts the prompt first. */
    r = request(port, "POST", "/v1/completions",
                "{\"prompt\": \"In the beginning\", \"max_tokens\": 24, \"temperature\": 0, "
                "\"echo\": true}",
                NULL);
    assert_int_equal(r.status, 200);
    char both[512];
    snprintf(both, sizeof both, "%s%s", prompt, want_greedy);
    assert_string_equal(str_at(choice0(r.json), "text", NULL), both);
    reply_free(&r);

    /* Streamed: the same text in chunks, the finish reason last, the usage, then [DONE]. */
    r = request(port, "POST", "/v1/completions",
                "{\"prompt\": \"In the beginning\", \"max_tokens\": 24, \"temperature\": 0, "
                "\"stream\": true, \"stream_options\": {\"include_usage\": true}}",
                NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/event-stream"));
    events ev = parse_events(r.body, false);
    assert_true(ev.done);
    assert_string_equal(ev.text, want_greedy);
    assert_string_equal(ev.finish, finish);
    assert_true(ev.n_chunks >= 2);
    assert_int_equal(ev.prompt_tokens, np);
    reply_free(&r);

    /* An empty prompt starts from <|endoftext|>. */
    r = request(port, "POST", "/v1/completions", "{\"prompt\": \"\", \"max_tokens\": 3}", NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    free(want_greedy);
    free(want_seeded);
    em_server_stop(s);
}

/* Four streams of different lengths at once: the batch carries several rows, and each text is
 * the one it gets alone. */
static void test_batched_streams_match_alone(void **state)
{
    (void)state;
    static const char *prompts[] = {"hello", "In the beginning was the word.", "fine", "User: hi"};
    static const int max_new[] = {30, 12, 40, 20};
    enum { N = 4 };
    em_sample_config greedy = {0, 0, 1, 1, 0};
    char *want[N];
    for (int i = 0; i < N; i++) want[i] = reference_text(prompts[i], max_new[i], greedy);
    em_server *s = start_default();
    int port = em_server_port(s);
    int fds[N];
    for (int i = 0; i < N; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"stream\": %s}",
                 prompts[i], max_new[i], i % 2 ? "true" : "false");
        fds[i] = dial(port);
        send_request(fds[i], "POST", "/v1/completions", body, NULL);
    }
    for (int i = 0; i < N; i++) {
        reply r = read_reply(fds[i]);
        assert_int_equal(r.status, 200);
        if (i % 2) {
            events ev = parse_events(r.body, false);
            assert_true(ev.done);
            assert_string_equal(ev.text, want[i]);
        } else {
            assert_string_equal(str_at(choice0(r.json), "text", NULL), want[i]);
        }
        reply_free(&r);
        free(want[i]);
    }
    /* The scheduler retires a sequence just after its last text went out. */
    assert_true(wait_health(port, "completed", 0, N, 10));
    assert_true(wait_health(port, "active", 0, 0, 10));
    em_server_stats st;
    em_server_stats_get(s, &st);
    assert_true(st.max_rows >= 2);
    em_server_stop(s);
}

/* ---- chat ------------------------------------------------------------------------------------ */

static void test_chat(void **state)
{
    (void)state;
    serve_template tpl;
    serve_template_init(&tpl, tok);
    assert_int_equal(tpl.kind, SERVE_TPL_PLAIN);
    serve_msg msgs[3] = {{"system", "be fine"}, {"user", "hello"}, {"assistant", " fine"}};
    serve_msg last = {"user", "how are you?"};
    serve_msg all[4] = {msgs[0], msgs[1], msgs[2], last};
    int64_t *ids, n;
    assert_int_equal(serve_template_encode(&tpl, tok, all, 4, CTX, 16, &ids, &n), EM_OK);
    int nstops;
    const char *const *stops = serve_template_stops(&tpl, &nstops);
    em_sample_config greedy = {0, 0, 1, 1, 0};
    char *want = reference(ids, n, 20, greedy, stops, nstops);
    int64_t np = n;
    free(ids);

    em_server *s = start_default();
    int port = em_server_port(s);
    const char *body =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be fine\"}, {\"role\": \"user\", "
        "\"content\": \"hello\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", "
        "\"text\": \" fine\"}]}, {\"role\": \"user\", \"content\": \"how are you?\"}], "
        "\"max_tokens\": 20, \"temperature\": 0%s}";
    char req[1024];
    snprintf(req, sizeof req, body, "");
    reply r = request(port, "POST", "/v1/chat/completions", req, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_at(r.json, "object", NULL), "chat.completion");
    assert_int_equal(strncmp(str_at(r.json, "id", NULL), "chatcmpl-", 9), 0);
    const cJSON *c = choice0(r.json);
    assert_string_equal(str_at(c, "message", "role"), "assistant");
    assert_string_equal(str_at(c, "message", "content"), want);
    assert_int_equal(num_at(r.json, "usage", "prompt_tokens"), np);
    reply_free(&r);

    snprintf(req, sizeof req, body,
             ", \"stream\": true, \"stream_options\": {\"include_usage\": true}");
    r = request(port, "POST", "/v1/chat/completions", req, NULL);
    assert_int_equal(r.status, 200);
    events ev = parse_events(r.body, true);
    assert_true(ev.done);
    assert_true(ev.role_first);
    assert_string_equal(ev.text, want);
    assert_int_equal(ev.prompt_tokens, np);
    assert_true(ev.finish[0]);
    reply_free(&r);

    /* A stop string from the middle of the reply cuts it there, with finish_reason "stop". */
    if (strlen(want) >= 8) {
        char stop[4] = {want[5], want[6], want[7], 0};
        char *cut = strstr(want, stop);
        *cut = 0;
        char extra[128];
        cJSON *js = cJSON_CreateString(stop);
        char *jstop = cJSON_PrintUnformatted(js);
        cJSON_Delete(js);
        snprintf(extra, sizeof extra, ", \"stop\": [%s, \"zzzz\"]", jstop);
        free(jstop);
        snprintf(req, sizeof req, body, extra);
        for (int stream = 0; stream < 2; stream++) {
            char req2[1200];
            snprintf(req2, sizeof req2, "%.*s%s}", (int)strlen(req) - 1, req,
                     stream ? ", \"stream\": true" : "");
            r = request(port, "POST", "/v1/chat/completions", req2, NULL);
            assert_int_equal(r.status, 200);
            if (stream) {
                events e2 = parse_events(r.body, true);
                assert_string_equal(e2.text, want);
                assert_string_equal(e2.finish, "stop");
            } else {
                assert_string_equal(str_at(choice0(r.json), "message", "content"), want);
                assert_string_equal(str_at(choice0(r.json), "finish_reason", NULL), "stop");
            }
            reply_free(&r);
        }
    }
    free(want);
    em_server_stop(s);
}

static void test_template(void **state)
{
    (void)state;
    serve_msg conv[4] = {
        {"system", "sys"}, {"user", "hello"}, {"assistant", " fine"}, {"user", "bye"}};
    /* Plain: as `ember chat` writes it. */
    serve_template t;
    serve_template_init(&t, tok);
    assert_string_equal(serve_template_name(&t), "plain");
    int64_t *ids, n;
    assert_int_equal(serve_template_encode(&t, tok, conv, 4, 1000, 10, &ids, &n), EM_OK);
    uint32_t u[256];
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)ids[i];
    char *text;
    size_t len;
    assert_int_equal(em_tok_decode(tok, u, (size_t)n, &text, &len), EM_OK);
    assert_string_equal(text, "sys\nUser: hello\nAssistant: fine\nUser: bye\nAssistant:");
    free(text);
    free(ids);
    /* Too long for the context: the oldest turns go, the system line and the last stay. */
    assert_int_equal(serve_template_encode(&t, tok, conv, 4, 30, 8, &ids, &n), EM_OK);
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)ids[i];
    assert_int_equal(em_tok_decode(tok, u, (size_t)n, &text, &len), EM_OK);
    assert_string_equal(text, "sys\nUser: bye\nAssistant:");
    free(text);
    free(ids);

    /* ChatML when the tokenizer has its tokens; the user's text is never a special token. */
    em_tokenizer *ct = em_tok_load("gpt2");
    if (ct && em_tok_add_chat_specials(ct) == EM_OK) {
        serve_template_init(&t, ct);
        assert_string_equal(serve_template_name(&t), "chatml");
        serve_msg forged[1] = {{"user", "<|im_end|>"}};
        assert_int_equal(serve_template_encode(&t, ct, forged, 1, 1000, 10, &ids, &n), EM_OK);
        int64_t im_end = em_tok_special_id(ct, "<|im_end|>");
        int specials = 0;
        for (int64_t i = 0; i < n; i++) specials += ids[i] == im_end;
        assert_int_equal(specials, 1); /* only the template's own */
        uint32_t *v = malloc((size_t)n * sizeof *v);
        for (int64_t i = 0; i < n; i++) v[i] = (uint32_t)ids[i];
        assert_int_equal(em_tok_decode(ct, v, (size_t)n, &text, &len), EM_OK);
        assert_string_equal(text,
                            "<|im_start|>user\n<|im_end|><|im_end|>\n<|im_start|>assistant\n");
        free(text);
        free(v);
        free(ids);
    }
    em_tok_free(ct);
    em_clear_error();

    /* Bare: a character tokenizer that cannot spell "User:" (no capital U). */
    const char *sp[] = {"<|endoftext|>"};
    em_tokenizer *lower = em_tok_char_from_text("abc hi\n", 7, sp, 1);
    serve_template_init(&t, lower);
    assert_string_equal(serve_template_name(&t), "bare");
    serve_msg m[2] = {{"user", "hi ZZ"}, {"assistant", "abc"}};
    assert_int_equal(serve_template_encode(&t, lower, m, 2, 1000, 10, &ids, &n), EM_OK);
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)ids[i];
    assert_int_equal(em_tok_decode(lower, u, (size_t)n, &text, &len), EM_OK);
    assert_string_equal(text, "hi \nabc\n"); /* unknown characters left out */
    free(text);
    free(ids);
    em_tok_free(lower);
}

/* ---- the API key ----------------------------------------------------------------------------- */

static void test_api_key(void **state)
{
    (void)state;
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    cfg.api_key = "sekret-key";
    em_server *s = start(&cfg);
    int port = em_server_port(s);
    reply r = request(port, "GET", "/v1/models", NULL, NULL);
    expect_error(&r, 401, NULL);
    r = request(port, "GET", "/v1/models", NULL, "Authorization: Bearer wrong-key\r\n");
    expect_error(&r, 401, NULL);
    r = request(port, "GET", "/v1/models", NULL, "Authorization: Bearer sekret-ke\r\n");
    expect_error(&r, 401, NULL);
    r = request(port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", NULL);
    assert_non_null(strstr(r.head, "WWW-Authenticate"));
    expect_error(&r, 401, NULL);
    r = request(port, "GET", "/v1/models", NULL, "Authorization: Bearer sekret-key\r\n");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    r = request(port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}",
                "Authorization: Bearer sekret-key\r\n");
    assert_int_equal(r.status, 200);
    reply_free(&r);
    /* The page and the health check stay open (the page asks for the key itself). */
    r = request(port, "GET", "/", NULL, NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    cJSON_Delete(health(port));
    em_server_stop(s);
}

/* ---- limits ---------------------------------------------------------------------------------- */

static void test_bad_requests(void **state)
{
    (void)state;
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    cfg.max_tokens = 100;
    cfg.max_body = 4096;
    cfg.read_timeout = 1.0;
    cfg.conn_timeout = 2;
    em_server *s = start(&cfg);
    int port = em_server_port(s);
    static const struct {
        const char *path, *body, *param;
    } cases[] = {
        {"/v1/completions", "{\"prompt\": \"hi\"", NULL},              /* invalid JSON */
        {"/v1/completions", "", NULL},                                 /* empty */
        {"/v1/completions", "[1, 2]", NULL},                           /* not an object */
        {"/v1/completions", "{\"max_tokens\": 5}", "prompt"},          /* missing */
        {"/v1/completions", "{\"prompt\": 7}", "prompt"},              /* wrong type */
        {"/v1/completions", "{\"prompt\": [\"a\", \"b\"]}", "prompt"}, /* several prompts */
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"5\"}", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2.5}", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 101}", "max_tokens"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": 2.5}", "temperature"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", "temperature"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_p\": -1}", "top_p"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"seed\": \"x\"}", "seed"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stream\": 1}", "stream"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": 3}", "stop"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}",
         "stop"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", "n"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 3}", "logprobs"},
        {"/v1/completions", "{\"prompt\": \"hi\", \"model\": 5}", "model"},
        {"/v1/completions", "{\"prompt\": \"\\u00e9t\\u00e9 \\u4e2d\"}",
         "prompt"}, /* not in the alphabet */
        {"/v1/chat/completions", "{\"prompt\": \"hi\"}", "messages"},
        {"/v1/chat/completions", "{\"messages\": []}", "messages"},
        {"/v1/chat/completions", "{\"messages\": {}}", "messages"},
        {"/v1/chat/completions", "{\"messages\": [\"hi\"]}", "messages[0]"},
        {"/v1/chat/completions", "{\"messages\": [{\"content\": \"hi\"}]}", "messages[0].role"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}",
         "messages[0].role"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "messages[0].content"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages[0].content"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream_options\": 1}",
         "stream_options"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        reply r = request(port, "POST", cases[i].path, cases[i].body, NULL);
        if (r.status != 400) fail_msg("case %zu (%s): status %d", i, cases[i].body, r.status);
        expect_error(&r, 400, cases[i].param);
    }

    /* A body over the limit, announced by Content-Length: 413 before it is read. */
    char *big = malloc(8192);
    memset(big, ' ', 8191);
    big[0] = '{';
    big[8190] = '}';
    big[8191] = 0;
    reply r = request(port, "POST", "/v1/completions", big, NULL);
    expect_error(&r, 413, NULL);
    /* The same without a length (chunked): the connection is closed once it passes the limit. */
    int fd = dial(port);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                       "Content-Type: application/json\r\n\r\n";
    send_all(fd, head, strlen(head));
    for (int i = 0; i < 3; i++) {
        char chunk[16];
        snprintf(chunk, sizeof chunk, "%x\r\n", 4000);
        send_all(fd, chunk, strlen(chunk));
        send_all(fd, big, 4000);
        send_all(fd, "\r\n", 2);
    }
    r = read_reply(fd);
    assert_true(r.status == 0 || r.status == 413);
    reply_free(&r);
    free(big);

    /* A body trickling in: cut once the read timeout (1 s) has passed. */
    fd = dial(port);
    const char *thead = "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                        "Content-Length: 200\r\n\r\n{\"prompt\": \"";
    send_all(fd, thead, strlen(thead));
    double t0 = (double)time(NULL);
    bool closed = false;
    for (int i = 0; i < 40 && !closed; i++) {
        usleep(100000);
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) closed = true;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) closed = true; /* an answer or the close */
    }
    assert_true(closed);
    assert_true((double)time(NULL) - t0 < 6);
    close(fd);
    /* A client that sends headers and then nothing: the idle timeout (2 s) closes it. */
    fd = dial(port);
    send_all(fd, "POST /v1/completions HTTP/1.0\r\nContent-Length: 50\r\n\r\n", 52);
    r = read_reply(fd);
    assert_true(r.status == 0 || (r.status >= 400 && r.status < 500));
    reply_free(&r);
    /* Garbage instead of HTTP. */
    fd = dial(port);
    send_all(fd, "HELLO THERE\r\n\r\n", 15);
    r = read_reply(fd);
    assert_true(r.status == 0 || (r.status >= 400 && r.status < 500));
    reply_free(&r);
    fd = dial(port);
    send_all(fd, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11); /* a TLS hello */
    r = read_reply(fd);
    assert_true(r.status == 0 || (r.status >= 400 && r.status < 500));
    reply_free(&r);

    /* Still serving. */
    r = request(port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 3}", NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    assert_true(wait_health(port, "active", 0, 0, 5));
    assert_true(wait_health(port, "queued", 0, 0, 5));
    em_server_stop(s);
}

/* max_batch 1, max_queue 1: one runs, one waits, the third is answered 503 at once. */
static void test_queue_full(void **state)
{
    (void)state;
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    cfg.max_batch = 1;
    cfg.max_queue = 1;
    cfg.max_tokens = 100000;
    em_server *s = start(&cfg);
    int port = em_server_port(s);
    const char *slow =
        "{\"prompt\": \"hello\", \"max_tokens\": 100000, \"stream\": true, \"temperature\": 0}";
    int a = dial(port);
    send_request(a, "POST", "/v1/completions", slow, NULL);
    assert_true(wait_health(port, "active", 0, 1, 20));
    int b = dial(port);
    send_request(b, "POST", "/v1/completions", slow, NULL);
    assert_true(wait_health(port, "queued", 0, 1, 20));
    reply r =
        request(port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", NULL);
    expect_error(&r, 503, NULL);
    cJSON *h = health(port);
    assert_true(num_at(h, "rejected", NULL) >= 1);
    cJSON_Delete(h);
    /* The waiting one leaves (its client closes): the queue empties. */
    close(b);
    assert_true(wait_health(port, "queued", 0, 0, 20));
    /* The running one leaves mid-stream: its sequence leaves the batch. */
    char buf[512];
    assert_true(recv(a, buf, sizeof buf, 0) > 0);
    close(a);
    assert_true(wait_health(port, "active", 0, 0, 20));
    assert_true(wait_health(port, "cancelled", 1, 2, 5));
    /* A whole-answer request whose client leaves is dropped too. */
    a = dial(port);
    send_request(a, "POST", "/v1/completions",
                 "{\"prompt\": \"hello\", \"max_tokens\": 100000, \"temperature\": 0}", NULL);
    assert_true(wait_health(port, "active", 0, 1, 20));
    close(a);
    assert_true(wait_health(port, "active", 0, 0, 20));
    assert_true(wait_health(port, "cancelled", 1, 3, 5));
    /* And it serves the next one. */
    r = request(port, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    em_server_stop(s);
}

/* The per-request time limit ends a long generation with finish_reason "length"; stopping the
 * server ends a running one with an error event. */
static void test_time_limit_and_stop(void **state)
{
    (void)state;
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    cfg.request_timeout = 1.0;
    cfg.max_tokens = 1000000;
    em_server *s = start(&cfg);
    int port = em_server_port(s);
    time_t t0 = time(NULL);
    reply r = request(port, "POST", "/v1/completions",
                      "{\"prompt\": \"hello\", \"max_tokens\": 1000000, \"temperature\": 0}", NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_at(choice0(r.json), "finish_reason", NULL), "length");
    assert_true(num_at(r.json, "usage", "completion_tokens") < 1000000);
    assert_true(time(NULL) - t0 < 10);
    reply_free(&r);
    em_server_stop(s);

    cfg.request_timeout = 300;
    s = start(&cfg);
    port = em_server_port(s);
    int fd = dial(port);
    send_request(
        fd, "POST", "/v1/completions",
        "{\"prompt\": \"hello\", \"max_tokens\": 1000000, \"stream\": true, \"temperature\": 0}",
        NULL);
    assert_true(wait_health(port, "active", 0, 1, 20));
    em_server_stop(s); /* answers the running request with an error event, then closes */
    r = read_reply(fd);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"error\""));
    assert_non_null(strstr(r.body, "shutting down"));
    reply_free(&r);
}

static void test_bad_config(void **state)
{
    (void)state;
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    cfg.max_batch = 0;
    assert_null(em_server_start(model, tok, &cfg));
    assert_non_null(strstr(em_last_error(), "max_batch"));
    em_serve_config_init(&cfg);
    cfg.host = "192.0.2.1"; /* TEST-NET-1: not an address of this machine */
    cfg.port = 0;
    cfg.model_name = "tiny";
    assert_null(em_server_start(model, tok, &cfg));
    assert_non_null(strstr(em_last_error(), "cannot listen"));
    em_serve_config_init(&cfg);
    assert_null(em_server_start(NULL, tok, &cfg));
    /* A port in use. */
    em_server *s = start_default();
    em_serve_config_init(&cfg);
    cfg.port = em_server_port(s);
    em_server_stop(s); /* the model is free again for the next server */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    cfg.port = ntohs(a.sin_port);
    assert_null(em_server_start(model, tok, &cfg));
    assert_non_null(strstr(em_last_error(), "cannot listen"));
    close(fd);
    em_server_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_completion_matches_generate),
        cmocka_unit_test(test_batched_streams_match_alone),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_template),
        cmocka_unit_test(test_api_key),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_time_limit_and_stop),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests_name("serve", tests, setup, teardown);
}
