/* server.c — the HTTP side, on libmicrohttpd with one thread per connection: routing, the API key,
 * request bodies (limited in size and in the time they may take to arrive), turning a parsed
 * request into token ids for the scheduler, and the answers — whole JSON bodies, or server-sent
 * events written by a content reader that waits for the scheduler's text. A connection that waits
 * for its request (in the queue, or for a whole answer) watches its socket, so a client that
 * leaves takes its sequence out of the batch at once; one that leaves while tokens stream is
 * noticed when the next write fails (MHD's completed callback). While a request is being
 * answered, MHD's idle timeout is off (the request's own time limit applies); it is back on for
 * the next request of a kept-alive connection. */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "base/log.h"
#include "serve/internal.h"

typedef enum route {
    R_NONE,
    R_ASSET,       /* GET /, the web page's files */
    R_HEALTH,      /* GET /health */
    R_MODELS,      /* GET /v1/models */
    R_MODEL,       /* GET /v1/models/{id} */
    R_COMPLETIONS, /* POST /v1/completions */
    R_CHAT,        /* POST /v1/chat/completions */
} route;

/* One request on a connection (MHD's con_cls). */
typedef struct conn {
    em_server *srv;
    struct MHD_Connection *mc;
    route route;
    double started; /* monotonic seconds at the headers */
    em_strbuf body; /* the request body */
    int fd;         /* the client socket (watched for hang-ups), or -1 */
    int status;     /* the status answered (for the log) */
    char what[96];  /* "POST /v1/completions" (for the log) */
    /* A generation. */
    serve_params params;
    serve_req *req; /* shared with the scheduler (one reference is ours) */
    char id[48];    /* "cmpl-..." / "chatcmpl-..." */
    long created;   /* Unix seconds */
    int64_t prompt_tokens;
    char *echo; /* completions with echo: the prompt text (malloc'd) */
    bool gone;  /* the client hung up */
    /* Streaming. */
    em_strbuf out;  /* bytes staged for the socket */
    size_t out_off; /* of them, already handed to MHD */
    size_t sent;    /* bytes of req->text already made into chunks */
    bool opened;    /* the opening chunk is staged */
    bool closed;    /* the last event is staged */
} conn;

static const char OOM_JSON[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
    "\"param\":null,\"code\":null}}";

/* ---- answers --------------------------------------------------------------------------------- */

static enum MHD_Result queue(conn *c, int status, struct MHD_Response *resp)
{
    if (!resp) return MHD_NO;
    c->status = status;
    enum MHD_Result r = MHD_queue_response(c->mc, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

/* A JSON body (json is malloc'd and taken; NULL answers 500 out of memory). */
static enum MHD_Result send_json(conn *c, int status, char *json)
{
    struct MHD_Response *resp;
    if (!json) {
        status = 500;
        resp = MHD_create_response_from_buffer(sizeof OOM_JSON - 1, (void *)OOM_JSON,
                                               MHD_RESPMEM_PERSISTENT);
    } else {
        resp = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
        if (!resp) free(json);
    }
    if (resp) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (resp && status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (resp && status == 405)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                                c->route == R_COMPLETIONS || c->route == R_CHAT ? "POST"
                                                                                : "GET, HEAD");
    return queue(c, status, resp);
}

static enum MHD_Result send_error(conn *c, const serve_error *e)
{
    return send_json(c, e->status, serve_error_json(e));
}

static enum MHD_Result fail_with(conn *c, int status, const char *type, const char *code,
                                 const char *param, const char *msg)
{
    serve_error e;
    serve_fail(&e, status, type, code, param, "%s", msg);
    return send_error(c, &e);
}

static enum MHD_Result send_asset(conn *c, const serve_asset *a)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(a->size, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    /* Nothing but the page's own files: no external assets, no inline script. */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; "
                            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                            "form-action 'none'; frame-ancestors 'none'");
    return queue(c, 200, resp);
}

static const serve_asset *find_asset(const char *url)
{
    if (strcmp(url, "/") == 0) url = "/index.html";
    for (const serve_asset *a = em_serve_web_assets; a->path; a++)
        if (strcmp(a->path, url) == 0) return a;
    return NULL;
}

/* ---- routing and the API key ----------------------------------------------------------------- */

static route route_of(const char *url, const char **model_id)
{
    if (strcmp(url, "/health") == 0) return R_HEALTH;
    if (strcmp(url, "/v1/models") == 0) return R_MODELS;
    if (strncmp(url, "/v1/models/", 11) == 0) {
        *model_id = url + 11;
        return R_MODEL;
    }
    if (strcmp(url, "/v1/completions") == 0) return R_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0) return R_CHAT;
    if (find_asset(url)) return R_ASSET;
    return R_NONE;
}

/* Constant-time comparison of the presented key with the server's. */
static bool key_ok(em_server *s, struct MHD_Connection *mc)
{
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h), m = strlen(s->api_key);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < m; i++) diff |= (unsigned char)(h[i < n ? i : 0] ^ s->api_key[i]);
    return diff == 0;
}

static enum MHD_Result health(conn *c)
{
    em_server_stats st;
    em_server_stats_get(c->srv, &st);
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"status\":\"ok\",\"active\":%lld,\"queued\":%lld,\"completed\":%lld,"
             "\"rejected\":%lld,\"cancelled\":%lld,\"steps\":%lld,\"max_batch_rows\":%lld}",
             (long long)st.active, (long long)st.queued, (long long)st.completed,
             (long long)st.rejected, (long long)st.cancelled, (long long)st.steps,
             (long long)st.max_rows);
    return send_json(c, 200, strdup(buf));
}

/* The first call for a request: everything that needs no body is answered here. */
static enum MHD_Result on_headers(conn *c, const char *url, const char *method)
{
    em_server *s = c->srv;
    const char *model_id = NULL;
    c->route = route_of(url, &model_id);
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;
    if (c->route == R_NONE)
        return fail_with(c, 404, "invalid_request_error", "not_found", NULL,
                         "no such endpoint; this server has POST /v1/completions, POST "
                         "/v1/chat/completions, GET /v1/models and GET /health");
    bool wants_post = c->route == R_COMPLETIONS || c->route == R_CHAT;
    if (wants_post ? !post : !get)
        return fail_with(c, 405, "invalid_request_error", "method_not_allowed", NULL,
                         wants_post ? "use POST" : "use GET");
    if (c->route == R_ASSET) return send_asset(c, find_asset(url));
    if (c->route == R_HEALTH) return health(c);
    if (!key_ok(s, c->mc))
        return fail_with(c, 401, "invalid_request_error", "invalid_api_key", NULL,
                         "a valid API key is required (Authorization: Bearer KEY)");
    if (c->route == R_MODELS)
        return send_json(c, 200, serve_models_json(s->model_name, s->created));
    if (c->route == R_MODEL) {
        if (strcmp(model_id, s->model_name) != 0)
            return fail_with(c, 404, "invalid_request_error", "model_not_found", "model",
                             "no such model; GET /v1/models lists the one this server has");
        return send_json(c, 200, serve_model_json(s->model_name, s->created));
    }
    const char *len =
        MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (len && strtoull(len, NULL, 10) > s->cfg.max_body) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than this server's limit of %zu bytes",
                 s->cfg.max_body);
        return fail_with(c, 413, "invalid_request_error", "request_too_large", NULL, msg);
    }
    return MHD_YES; /* the body follows */
}

/* ---- waiting for the scheduler --------------------------------------------------------------- */

/* True when the client has hung up (or the socket failed). */
static bool hung_up(conn *c)
{
    if (c->fd < 0) return false;
    struct pollfd p = {c->fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Waits until the request has text past `have`, or is done, or `secs` pass. False when the
 * client hung up meanwhile (the request is then cancelled). */
static bool wait_for(conn *c, size_t have, double secs)
{
    serve_req *r = c->req;
    double until = serve_now() + secs;
    pthread_mutex_lock(&r->mu);
    while (!r->done && r->text.len <= have) {
        double now = serve_now();
        if (now >= until) break;
        double t = now + (until - now < 0.25 ? until - now : 0.25);
        struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (!r->done && r->text.len <= have && hung_up(c)) {
            c->gone = true;
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (c->gone) atomic_store(&r->cancel, true);
    return !c->gone;
}

/* ---- streaming (server-sent events) ---------------------------------------------------------- */

static bool stage_event(conn *c, char *json)
{
    if (!json) return false;
    em_sb_append(&c->out, "data: ");
    em_sb_append(&c->out, json);
    em_sb_append(&c->out, "\n\n");
    free(json);
    return !c->out.oom;
}

/* Stages the next events: new text, the end, or a keep-alive comment. False on failure (the
 * connection is then closed). */
static bool fill(conn *c)
{
    em_server *s = c->srv;
    serve_params *p = &c->params;
    if (!c->opened) {
        c->opened = true;
        if (p->chat) /* the role comes first, as OpenAI sends it */
            return stage_event(
                c, serve_chunk_json(p, c->id, c->created, s->model_name, NULL, 0, true, NULL));
        if (c->echo)
            return stage_event(c, serve_chunk_json(p, c->id, c->created, s->model_name, c->echo,
                                                   strlen(c->echo), false, NULL));
    }
    if (!wait_for(c, c->sent, 10.0)) return false;
    serve_req *r = c->req;
    pthread_mutex_lock(&r->mu);
    size_t n = r->text.len - c->sent;
    char *delta = n ? malloc(n) : NULL;
    if (delta) memcpy(delta, r->text.data + c->sent, n);
    bool done = r->done;
    serve_error err = r->error;
    const char *reason = r->finish_reason;
    serve_usage u = {c->prompt_tokens, r->completion_tokens};
    pthread_mutex_unlock(&r->mu);
    if (n && !delta) return false;
    bool ok = true;
    if (delta) {
        ok = stage_event(
            c, serve_chunk_json(p, c->id, c->created, s->model_name, delta, n, false, NULL));
        c->sent += n;
        free(delta);
    }
    if (ok && done) {
        c->closed = true;
        if (err.status) {
            c->status = err.status;
            return stage_event(c, serve_error_json(&err));
        }
        ok = stage_event(c, serve_chunk_json(p, c->id, c->created, s->model_name,
                                             p->chat ? NULL : "", 0, false, reason));
        if (ok && p->include_usage)
            ok = stage_event(c, serve_usage_chunk_json(p, c->id, c->created, s->model_name, &u));
        em_sb_append(&c->out, "data: [DONE]\n\n");
    } else if (ok && !delta) {
        em_sb_append(&c->out, ": keep-alive\n\n");
    }
    return ok && !c->out.oom;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    conn *c = cls;
    for (;;) {
        if (c->out_off < c->out.len) {
            size_t n = c->out.len - c->out_off;
            if (n > max) n = max;
            memcpy(buf, c->out.data + c->out_off, n);
            c->out_off += n;
            if (c->out_off == c->out.len) {
                em_sb_clear(&c->out);
                c->out_off = 0;
            }
            return (ssize_t)n;
        }
        if (c->closed) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!fill(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* ---- a generation request -------------------------------------------------------------------- */

static void make_id(em_server *s, conn *c)
{
    uint64_t z = atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    snprintf(c->id, sizeof c->id, "%s-%016llx", c->route == R_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)(z ^ (z >> 31)));
    c->created = (long)time(NULL);
}

/* The prompt's ids into r (and the count for the usage). 0, or a status with e filled. */
static int encode_prompt(em_server *s, conn *c, serve_req *r, serve_error *e)
{
    serve_params *p = &c->params;
    if (p->chat) {
        int64_t room = r->max_new < s->ctx / 2 ? r->max_new : s->ctx / 2;
        if (serve_template_encode(&s->tpl, s->tok, p->msgs, p->nmsgs, s->ctx, room, &r->prompt,
                                  &r->nprompt) != EM_OK)
            return serve_fail(e, 500, "server_error", NULL, NULL, "%s", em_last_error());
    } else if (p->prompt[0]) {
        em_tokens t = {0};
        if (em_tok_encode(s->tok, p->prompt, strlen(p->prompt), true, &t) != EM_OK) {
            em_tokens_free(&t);
            return serve_fail(e, 400, "invalid_request_error", NULL, "prompt",
                              "the model's tokenizer cannot encode the prompt: %s",
                              em_last_error());
        }
        r->prompt = malloc((t.len ? t.len : 1) * sizeof *r->prompt);
        for (size_t i = 0; r->prompt && i < t.len; i++) r->prompt[i] = t.ids[i];
        r->nprompt = (int64_t)t.len;
        em_tokens_free(&t);
        if (!r->prompt) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    c->prompt_tokens = r->nprompt;
    if (r->nprompt == 0) { /* nothing to continue: start from <|endoftext|> (or a newline) */
        free(r->prompt);
        r->prompt = malloc(sizeof *r->prompt);
        if (!r->prompt) return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        int64_t eot = em_tok_eot(s->tok);
        em_tokens t = {0};
        if (eot < 0 && em_tok_encode(s->tok, "\n", 1, false, &t) == EM_OK && t.len) eot = t.ids[0];
        em_tokens_free(&t);
        em_clear_error();
        r->prompt[0] = eot >= 0 ? eot : 0;
        r->nprompt = 1;
    }
    return 0;
}

/* Fills r from the parsed request. 0, or a status with e filled. */
static int prepare(em_server *s, conn *c, serve_req *r, serve_error *e)
{
    serve_params *p = &c->params;
    int64_t limit = s->cfg.max_tokens;
    if (p->max_tokens > limit)
        return serve_fail(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                          "max_tokens is %lld; this server allows at most %lld",
                          (long long)p->max_tokens, (long long)limit);
    r->max_new = p->max_tokens > 0 ? p->max_tokens : p->chat ? limit : (limit < 16 ? limit : 16);
    int st = encode_prompt(s, c, r, e);
    if (st) return st;
    r->sc = p->sc;
    if (!p->seeded)
        r->sc.seed =
            atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
    for (int i = 0; i < p->nstops; i++) {
        r->stops[r->nstops] = strdup(p->stops[i]);
        if (!r->stops[r->nstops++])
            return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int64_t eot = em_tok_eot(s->tok);
    if (eot >= 0) r->stop_tokens[r->nstop_tokens++] = eot;
    if (p->chat) {
        int n;
        const char *const *ts = serve_template_stops(&s->tpl, &n);
        for (int i = 0; i < n && r->nstops < SERVE_MAX_REQ_STOPS; i++) {
            r->stops[r->nstops] = strdup(ts[i]);
            if (!r->stops[r->nstops++])
                return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        if (s->tpl.im_end >= 0) r->stop_tokens[r->nstop_tokens++] = s->tpl.im_end;
    }
    r->deadline = c->started + s->cfg.request_timeout;
    if (!p->chat && p->echo && !(c->echo = strdup(p->prompt)))
        return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static enum MHD_Result answer_whole(conn *c)
{
    em_server *s = c->srv;
    serve_req *r = c->req;
    for (;;) { /* until done (the request's deadline bounds it), or the client leaves */
        if (!wait_for(c, SIZE_MAX, 3600.0)) return MHD_NO;
        pthread_mutex_lock(&r->mu);
        bool done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (done) break;
    }
    pthread_mutex_lock(&r->mu);
    serve_error err = r->error;
    const char *reason = r->finish_reason;
    serve_usage u = {c->prompt_tokens, r->completion_tokens};
    em_strbuf text;
    em_sb_init(&text);
    if (c->echo) em_sb_append(&text, c->echo);
    em_sb_appendn(&text, r->text.data, r->text.len);
    pthread_mutex_unlock(&r->mu);
    if (err.status) {
        em_sb_free(&text);
        return send_error(c, &err);
    }
    char *json = text.oom ? NULL
                          : serve_completion_json(&c->params, c->id, c->created, s->model_name,
                                                  text.data, text.len, reason, &u);
    em_sb_free(&text);
    return send_json(c, 200, json);
}

static enum MHD_Result answer_stream(conn *c)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, c, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    return queue(c, 200, resp);
}

/* The whole body is in: parse, encode, queue for the scheduler, answer. */
static enum MHD_Result on_body(conn *c)
{
    em_server *s = c->srv;
    serve_error e;
    int st = serve_parse_request(c->body.data, c->body.len, c->route == R_CHAT, &c->params, &e);
    if (st) return send_error(c, &e);
    make_id(s, c);
    serve_req *r = serve_req_new();
    if (!r) return fail_with(c, 500, "server_error", NULL, NULL, "out of memory");
    st = prepare(s, c, r, &e);
    if (!st) st = serve_submit(s, r, &e);
    if (st) {
        serve_req_release(r);
        return send_error(c, &e);
    }
    c->req = r;
    atomic_fetch_add(&s->inflight, 1);
    /* The request has its own time limit from here; the idle timeout would cut a long wait. */
    MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    return c->params.stream ? answer_stream(c) : answer_whole(c);
}

/* ---- MHD's callbacks ------------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    em_server *s = cls;
    conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->srv = s;
        c->mc = mc;
        c->started = serve_now();
        c->fd = -1;
        em_sb_init(&c->body);
        em_sb_init(&c->out);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) c->fd = ci->connect_fd;
        snprintf(c->what, sizeof c->what, "%s %.80s", method, url);
        *con_cls = c;
        return on_headers(c, url, method);
    }
    if (*upload_data_size) {
        /* A body that trickles in past the read timeout, or outgrows the limit without a
         * Content-Length saying so up front: the connection is closed. */
        if (serve_now() - c->started > s->cfg.read_timeout) return MHD_NO;
        if (c->body.len + *upload_data_size > s->cfg.max_body) return MHD_NO;
        em_sb_appendn(&c->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return c->body.oom ? MHD_NO : MHD_YES;
    }
    return on_body(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    em_server *s = cls;
    conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    char tokens[64] = "";
    if (c->req) {
        pthread_mutex_lock(&c->req->mu);
        bool done = c->req->done;
        int64_t made = c->req->completion_tokens;
        pthread_mutex_unlock(&c->req->mu);
        if (!done) atomic_store(&c->req->cancel, true); /* leaves the batch at the next step */
        snprintf(tokens, sizeof tokens, ", %lld+%lld tokens, %s", (long long)c->prompt_tokens,
                 (long long)made, c->id);
        serve_req_release(c->req);
        atomic_fetch_sub(&s->inflight, 1);
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, s->cfg.conn_timeout);
    }
    if (s->cfg.log_requests) /* one line, one call: lines of several threads do not mix */
        fprintf(stderr, "ember serve: %s %d %.3f s%s%s\n", c->what, c->status,
                serve_now() - c->started, tokens,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (closed early)");
    serve_params_free(&c->params);
    em_sb_free(&c->body);
    em_sb_free(&c->out);
    free(c->echo);
    free(c);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    EM_LOGD("serve: libmicrohttpd: %s", msg);
}

/* ---- start and stop -------------------------------------------------------------------------- */

void em_serve_config_init(em_serve_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->model_name = "ember-gpt";
    c->max_batch = 8;
    c->max_queue = 32;
    c->max_body = 1 << 20;
    c->max_tokens = 1024;
    c->request_timeout = 300;
    c->conn_timeout = 15;
    c->read_timeout = 30;
    c->max_connections = 256;
}

static em_status check_config(const em_serve_config *c)
{
    const char *bad = NULL;
    if (c->max_batch < 1 || c->max_batch > 1024)
        bad = "max_batch must be in [1, 1024]";
    else if (c->max_queue < 0)
        bad = "max_queue must not be negative";
    else if (c->max_body < 64)
        bad = "max_body must be at least 64 bytes";
    else if (c->max_tokens < 1)
        bad = "max_tokens must be at least 1";
    else if (!(c->request_timeout > 0) || !(c->read_timeout > 0))
        bad = "the timeouts must be positive";
    else if (c->port < 0 || c->port > 65535)
        bad = "the port must be in [0, 65535]";
    else if (c->max_connections < 4)
        bad = "max_connections must be at least 4";
    return bad ? em_set_error(EM_ERR_INVALID, "em_server_start: %s", bad) : EM_OK;
}

static char *dup_or_null(const char *s)
{
    return s && *s ? strdup(s) : NULL;
}

/* host:port as a socket address. */
static em_status resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    int rc = getaddrinfo(host, p, &hints, &res);
    if (rc != 0 || !res)
        return em_set_error(EM_ERR_INVALID, "em_server_start: cannot resolve host '%s': %s", host,
                            gai_strerror(rc));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return EM_OK;
}

static em_status start_http(em_server *s)
{
    struct sockaddr_storage addr;
    socklen_t alen = 0;
    em_status st = resolve(s->host, s->cfg.port, &addr, &alen);
    if (st != EM_OK) return st;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.conn_timeout, MHD_OPTION_CONNECTION_LIMIT,
        s->cfg.max_connections, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!s->mhd)
        return em_set_error(EM_ERR_IO,
                            "em_server_start: cannot listen on %s port %d (in use, or "
                            "not an address of this machine?)",
                            s->host, s->cfg.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    return EM_OK;
}

em_server *em_server_start(em_gpt *g, const em_tokenizer *tok, const em_serve_config *cfg)
{
    em_serve_config def;
    if (!cfg) em_serve_config_init(&def), cfg = &def;
    if (!g || !tok) {
        em_set_error(EM_ERR_INVALID, "em_server_start: no model or tokenizer");
        return NULL;
    }
    if (check_config(cfg) != EM_OK) return NULL;
    em_server *s = calloc(1, sizeof *s);
    if (!s) {
        em_set_error(EM_ERR_NOMEM, "em_server_start: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->host = strdup(cfg->host && *cfg->host ? cfg->host : "127.0.0.1");
    s->api_key = dup_or_null(cfg->api_key);
    s->model_name = strdup(cfg->model_name && *cfg->model_name ? cfg->model_name : "ember-gpt");
    s->cfg.host = s->host;
    s->cfg.api_key = s->api_key;
    s->cfg.model_name = s->model_name;
    s->g = g;
    s->tok = tok;
    s->ctx = em_gpt_config_of(g)->block_size;
    s->vocab = em_gpt_config_of(g)->vocab_size;
    s->created = (long)time(NULL);
    atomic_init(&s->next_id, (uint64_t)time(NULL));
    atomic_init(&s->inflight, 0);
    serve_template_init(&s->tpl, tok);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!s->host || !s->model_name || (cfg->api_key && *cfg->api_key && !s->api_key)) {
        em_set_error(EM_ERR_NOMEM, "em_server_start: out of memory");
        em_server_stop(s);
        return NULL;
    }
    if (serve_sched_start(s) != EM_OK || start_http(s) != EM_OK) {
        em_status st = em_last_status();
        char msg[512];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_server_stop(s);
        em_set_error(st != EM_OK ? st : EM_ERR_INTERNAL, "%s", msg);
        return NULL;
    }
    return s;
}

int em_server_port(const em_server *s)
{
    return s ? s->port : 0;
}

void em_server_stats_get(em_server *s, em_server_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->active = s->nactive;
    out->queued = s->nqueued;
    pthread_mutex_unlock(&s->mu);
}

void em_server_stop(em_server *s)
{
    if (!s) return;
    /* The scheduler first: every waiting connection is answered (with an error) and no new
     * request is taken, so the connection threads that MHD joins all finish. They get two
     * seconds to send those last words before MHD closes their sockets. */
    serve_sched_stop(s);
    for (int i = 0; i < 200 && atomic_load(&s->inflight) > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (s->mhd) MHD_stop_daemon(s->mhd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    free(s);
}
