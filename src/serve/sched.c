/* sched.c — continuous batching: one scheduler thread owns the model and loops
 *   1. admit: waiting requests take free slots of the batch (em_gpt_batch_prefill feeds each
 *      prompt, its last max_len tokens when longer);
 *   2. sample: every active sequence picks its next token from its logits (em_sample_token with
 *      the request's temperature, top-p, top-k, seed), which is decoded to text, checked against
 *      the stop strings and stop tokens, and handed to the connection; a sequence that is done
 *      (stop, max_tokens, time limit, its client gone) leaves the batch;
 *   3. step: one batched forward pass (em_gpt_batch_step) feeds the new tokens of all the others.
 *      When every request of a step is greedy (temperature 0, no repetition penalty: what
 *      em_sample_token would pick is the first largest logit), the step and the prefills pick
 *      the next tokens on the device (em_gpt_batch_step_greedy) and bring back one id per
 *      sequence instead of its logits.
 * A slot that fills its context is rebuilt from its last half, as em_gpt_generate does, so each
 * sequence gets exactly the tokens it would get alone. Requests wait in a FIFO queue of at most
 * max_queue while the batch is full; the queue is pruned of requests whose clients left or whose
 * time ran out.
 *
 * Locking: the server's mu guards the queue, the batch membership and the counters; a request's mu
 * guards what it shares with its connection (the released text, done, the error). The order is
 * server, then request; the model, the batch and a request's scheduler fields belong to the
 * scheduler thread alone. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "serve/internal.h"

double serve_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- requests -------------------------------------------------------------------------------- */

serve_req *serve_req_new(void)
{
    serve_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    em_sb_init(&r->text);
    em_sb_init(&r->raw);
    atomic_init(&r->cancel, false);
    r->refs = 1;
    r->slot = -1;
    return r;
}

void serve_req_release(serve_req *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last) return;
    free(r->prompt);
    for (int i = 0; i < r->nstops; i++) free(r->stops[i]);
    em_sb_free(&r->text);
    em_sb_free(&r->raw);
    free(r->hist);
    free(r->logits);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- what the scheduler tells a connection --------------------------------------------------- */

/* Passes raw[released, upto) on to the connection. */
static void release_text(serve_req *r, size_t upto)
{
    if (upto <= r->released) return;
    pthread_mutex_lock(&r->mu);
    em_sb_appendn(&r->text, r->raw.data + r->released, upto - r->released);
    r->completion_tokens = r->made;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    r->released = upto;
}

/* Ends r normally. With flush, what was held back (and the decoder's tail) is released first. */
static void finish(serve_req *r, const char *reason, bool flush)
{
    if (r->finished) return;
    if (flush) {
        char tail[64];
        long k = em_tok_stream_finish(&r->dec, tail, sizeof tail);
        if (k > 0) em_sb_appendn(&r->raw, tail, (size_t)k);
        release_text(r, r->raw.len);
    }
    r->finished = true;
    pthread_mutex_lock(&r->mu);
    r->done = true;
    r->finish_reason = reason;
    r->completion_tokens = r->made;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Ends r with an error. */
static void fail(serve_req *r, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(serve_req *r, int status, const char *type, const char *fmt, ...)
{
    if (r->finished) return;
    r->finished = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&r->mu);
    serve_fail(&r->error, status, type, NULL, NULL, "%s", msg);
    r->done = true;
    r->completion_tokens = r->made;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The earliest stop string in raw that ends past what was released, or -1. */
static long find_stop(const serve_req *r, size_t *longest)
{
    long best = -1;
    *longest = 0;
    for (int i = 0; i < r->nstops; i++) {
        size_t sl = strlen(r->stops[i]);
        if (sl > *longest) *longest = sl;
        size_t from = r->released >= sl ? r->released - sl + 1 : 0;
        if (sl == 0 || from >= r->raw.len) continue;
        const char *hit = memmem(r->raw.data + from, r->raw.len - from, r->stops[i], sl);
        if (hit && (best < 0 || hit - r->raw.data < best)) best = hit - r->raw.data;
    }
    return best;
}

/* A new token of r: into the history, decoded, checked against the stops, released. */
static void deliver(serve_req *r, const em_tokenizer *tok, int64_t id)
{
    r->hist[r->n++] = id;
    r->made++;
    for (int i = 0; i < r->nstop_tokens; i++)
        if (id == r->stop_tokens[i]) {
            finish(r, "stop", true);
            return;
        }
    size_t blen = 0;
    em_tok_token_bytes(tok, (uint32_t)id, &blen);
    char small[256], *buf = small;
    size_t cap = blen * 3 + 64;
    if (cap > sizeof small && !(buf = malloc(cap))) {
        fail(r, 500, "server_error", "out of memory");
        return;
    }
    long k = em_tok_stream_feed(&r->dec, (uint32_t)id, buf, cap);
    if (k > 0) em_sb_appendn(&r->raw, buf, (size_t)k);
    if (buf != small) free(buf);
    if (k < 0 || r->raw.oom) {
        fail(r, 500, "server_error", "decoding token %lld: %s", (long long)id, em_last_error());
        return;
    }
    size_t longest;
    long hit = find_stop(r, &longest);
    if (hit >= 0) { /* the text ends before the stop string */
        r->raw.len = (size_t)hit;
        r->raw.data[hit] = 0;
        release_text(r, (size_t)hit);
        finish(r, "stop", false);
        return;
    }
    /* Hold back what could still begin a stop string, cut on a UTF-8 character boundary. */
    size_t safe =
        longest > 1 ? (r->raw.len >= longest - 1 ? r->raw.len - (longest - 1) : 0) : r->raw.len;
    while (safe > r->released && safe < r->raw.len &&
           ((unsigned char)r->raw.data[safe] & 0xC0) == 0x80)
        safe--;
    release_text(r, safe);
    if (r->made >= r->max_new) finish(r, "length", true);
}

/* ---- the loop -------------------------------------------------------------------------------- */

/* Whether r's next token is the first largest logit, so the device can pick it. */
static bool is_greedy(const serve_req *r)
{
    return r->sc.temperature == 0 && r->sc.repetition_penalty == 1;
}

/* Feeds r's context into its slot (its last max_len tokens, or the last keep when > 0). */
static bool prefill(em_server *s, serve_req *r, int64_t keep)
{
    int64_t L = em_gpt_batch_max_len(s->batch);
    int64_t n = keep > 0 ? keep : (r->n > L ? L : r->n);
    const int64_t *ids = r->hist + r->n - n;
    em_status st = is_greedy(r)
                       ? em_gpt_batch_prefill_greedy(s->batch, r->slot, ids, n, &r->greedy_next)
                       : em_gpt_batch_prefill(s->batch, r->slot, ids, n, r->logits);
    if (st == EM_OK) return true;
    fail(r, 500, "server_error", "the model failed: %s", em_last_error());
    EM_LOGE("serve: prefill failed: %s", em_last_error());
    return false;
}

/* A newly admitted request: its buffers and its prefill. */
static void admit(em_server *s, serve_req *r)
{
    r->hist = malloc((size_t)(r->nprompt + r->max_new + 1) * sizeof *r->hist);
    r->logits = malloc((size_t)s->vocab * sizeof *r->logits);
    if (!r->hist || !r->logits) {
        fail(r, 500, "server_error", "out of memory");
        return;
    }
    memcpy(r->hist, r->prompt, (size_t)r->nprompt * sizeof *r->hist);
    r->n = r->nprompt;
    r->rng = r->sc.seed;
    em_tok_stream_init(&r->dec, s->tok);
    prefill(s, r, 0);
}

/* Under s->mu: drops queued requests whose clients left, fails those past their deadline. */
static void prune_queue(em_server *s, double now)
{
    serve_req **link = &s->qhead, *prev = NULL;
    while (*link) {
        serve_req *r = *link;
        bool gone = atomic_load(&r->cancel), late = now > r->deadline;
        if (!gone && !late) {
            prev = r;
            link = &r->next;
            continue;
        }
        *link = r->next;
        if (s->qtail == r) s->qtail = prev;
        s->nqueued--;
        if (gone) {
            s->stats.cancelled++;
            fail(r, 499, "invalid_request_error", "the client closed the connection");
        } else {
            fail(r, 503, "server_error", "timed out waiting for a place in the batch");
        }
        serve_req_release(r);
    }
}

/* Under s->mu: moves waiting requests into free slots. Returns how many joined. */
static int take_from_queue(em_server *s)
{
    int joined = 0;
    while (s->nactive < s->cfg.max_batch && s->qhead) {
        serve_req *r = s->qhead;
        s->qhead = r->next;
        if (!s->qhead) s->qtail = NULL;
        s->nqueued--;
        r->next = NULL;
        for (int64_t k = 0; k < s->cfg.max_batch; k++)
            if (!s->slot_used[k]) {
                r->slot = k;
                s->slot_used[k] = true;
                break;
            }
        s->active[s->nactive++] = r;
        joined++;
    }
    return joined;
}

/* Under s->mu: finished sequences leave the batch. */
static void retire(em_server *s)
{
    int kept = 0;
    for (int i = 0; i < s->nactive; i++) {
        serve_req *r = s->active[i];
        if (!r->finished) {
            s->active[kept++] = r;
            continue;
        }
        em_gpt_batch_clear(s->batch, r->slot);
        s->slot_used[r->slot] = false;
        if (atomic_load(&r->cancel))
            s->stats.cancelled++;
        else if (r->error.status == 0)
            s->stats.completed++;
        serve_req_release(r);
    }
    s->nactive = kept;
}

typedef struct step_buf {
    int64_t *slots, *tokens; /* the pass's rows */
    serve_req **reqs;        /* whose they are */
    float *logits;           /* [max_batch, vocab] */
} step_buf;

/* Phase 2 for one active request: sample, deliver, and list it for the step when it goes on. */
static void advance(em_server *s, serve_req *r, double now, step_buf *b, int *nl)
{
    if (r->finished) return;
    if (atomic_load(&r->cancel)) {
        fail(r, 499, "invalid_request_error", "the client closed the connection");
        return;
    }
    if (now > r->deadline) {
        finish(r, "length", true);
        return;
    }
    int64_t tok = is_greedy(r) ? r->greedy_next
                               : em_sample_token(r->logits, s->vocab, r->hist, r->n, &r->sc, &r->rng);
    if (tok < 0) {
        fail(r, 500, "server_error", "sampling failed: %s", em_last_error());
        return;
    }
    deliver(r, s->tok, tok);
    if (r->finished) return;
    if (em_gpt_batch_len(s->batch, r->slot) >= em_gpt_batch_max_len(s->batch)) {
        int64_t keep = em_gpt_batch_max_len(s->batch) / 2; /* full: rebuild from the last half */
        prefill(s, r, keep > 0 ? keep : 1);
        return;
    }
    b->slots[*nl] = r->slot;
    b->tokens[*nl] = tok;
    b->reqs[*nl] = r;
    (*nl)++;
}

static void step(em_server *s, step_buf *b, int nl)
{
    if (nl == 0) return;
    bool greedy = true;
    for (int k = 0; k < nl && greedy; k++) greedy = is_greedy(b->reqs[k]);
    em_status st = greedy ? em_gpt_batch_step_greedy(s->batch, b->slots, b->tokens, nl, b->tokens)
                          : em_gpt_batch_step(s->batch, b->slots, b->tokens, nl, b->logits);
    if (st == EM_OK && greedy) {
        for (int k = 0; k < nl; k++) b->reqs[k]->greedy_next = b->tokens[k];
        return;
    }
    if (st != EM_OK) {
        EM_LOGE("serve: batched step failed: %s", em_last_error());
        for (int k = 0; k < nl; k++)
            fail(b->reqs[k], 500, "server_error", "the model failed: %s", em_last_error());
        return;
    }
    for (int k = 0; k < nl; k++) {
        serve_req *r = b->reqs[k];
        const float *row = b->logits + (size_t)k * (size_t)s->vocab;
        if (is_greedy(r)) /* a greedy request in a sampled step: its pick from the logits */
            r->greedy_next = em_sample_token(row, s->vocab, r->hist, r->n, &r->sc, &r->rng);
        else
            memcpy(r->logits, row, (size_t)s->vocab * sizeof(float));
    }
}

static void *sched_main(void *arg)
{
    em_server *s = arg;
    int B = s->cfg.max_batch;
    step_buf b = {malloc((size_t)B * sizeof(int64_t)), malloc((size_t)B * sizeof(int64_t)),
                  malloc((size_t)B * sizeof(serve_req *)),
                  malloc((size_t)B * (size_t)s->vocab * sizeof(float))};
    bool ok = b.slots && b.tokens && b.reqs && b.logits;
    if (!ok) EM_LOGE("serve: the scheduler is out of memory");
    pthread_mutex_lock(&s->mu);
    while (ok) {
        while (!s->stopping && s->nactive == 0 && s->nqueued == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stopping) break;
        prune_queue(s, serve_now());
        int first_new = s->nactive;
        take_from_queue(s);
        int n = s->nactive;
        pthread_mutex_unlock(&s->mu);

        for (int i = first_new; i < n; i++) admit(s, s->active[i]);
        double now = serve_now();
        int nl = 0;
        for (int i = 0; i < n; i++) advance(s, s->active[i], now, &b, &nl);
        step(s, &b, nl);

        pthread_mutex_lock(&s->mu);
        if (nl > 0) {
            s->stats.steps++;
            if (nl > s->stats.max_rows) s->stats.max_rows = nl;
        }
        retire(s);
    }
    /* Stopping (or out of memory): every request still here ends with an error. */
    s->stopping = true;
    for (int i = 0; i < s->nactive; i++) {
        fail(s->active[i], 503, "server_error", "the server is shutting down");
        s->slot_used[s->active[i]->slot] = false;
        serve_req_release(s->active[i]);
    }
    s->nactive = 0;
    while (s->qhead) {
        serve_req *r = s->qhead;
        s->qhead = r->next;
        fail(r, 503, "server_error", "the server is shutting down");
        serve_req_release(r);
    }
    s->qtail = NULL;
    s->nqueued = 0;
    pthread_mutex_unlock(&s->mu);
    free(b.slots);
    free(b.tokens);
    free(b.reqs);
    free(b.logits);
    return NULL;
}

int serve_submit(em_server *s, serve_req *r, serve_error *e)
{
    pthread_mutex_lock(&s->mu);
    int st = 0;
    if (s->stopping) {
        st = serve_fail(e, 503, "server_error", NULL, NULL, "the server is shutting down");
    } else if (s->nactive + s->nqueued >= s->cfg.max_batch + s->cfg.max_queue) {
        s->stats.rejected++;
        st = serve_fail(e, 503, "server_error", "server_overloaded", NULL,
                        "the server is busy (%d requests running, %d waiting); try again later",
                        s->nactive, s->nqueued);
    } else {
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the scheduler's */
        pthread_mutex_unlock(&r->mu);
        r->next = NULL;
        if (s->qtail)
            s->qtail->next = r;
        else
            s->qhead = r;
        s->qtail = r;
        s->nqueued++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- start, warm-up, stop -------------------------------------------------------------------- */

em_status serve_sched_start(em_server *s)
{
    s->active = calloc((size_t)s->cfg.max_batch, sizeof *s->active);
    s->slot_used = calloc((size_t)s->cfg.max_batch, sizeof *s->slot_used);
    if (!s->active || !s->slot_used) return em_set_error(EM_ERR_NOMEM, "serve: out of memory");
    s->batch = em_gpt_batch_new(s->g, s->cfg.max_batch, 0);
    if (!s->batch) return em_error_context("serve: the batch of %d slots", s->cfg.max_batch);
    em_status st = serve_sched_warmup(s);
    if (st != EM_OK) return st;
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0)
        return em_set_error(EM_ERR_INTERNAL, "serve: cannot start the scheduler thread");
    s->thread_started = true;
    return EM_OK;
}

em_status serve_sched_warmup(em_server *s)
{
    /* Two slots of different lengths and one step over both: every kernel of the decode path is
     * compiled (and cached on disk) before the first client waits for it. */
    int64_t ids[2] = {0, s->vocab > 1 ? 1 : 0};
    int64_t slots[2] = {0, 1}, toks[2] = {0, 0};
    int64_t n = s->cfg.max_batch > 1 ? 2 : 1;
    em_status st = EM_OK;
    for (int64_t i = 0; st == EM_OK && i < n; i++)
        st = em_gpt_batch_prefill(s->batch, slots[i], ids, 2 - i, NULL);
    if (st == EM_OK) st = em_gpt_batch_step(s->batch, slots, toks, n, NULL);
    for (int64_t i = 0; i < n; i++) em_gpt_batch_clear(s->batch, slots[i]);
    if (st != EM_OK) em_error_context("serve: warming up the model");
    return st;
}

void serve_sched_stop(em_server *s)
{
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        s->thread_started = false;
    }
    em_gpt_batch_free(s->batch);
    s->batch = NULL;
    free(s->active);
    free(s->slot_used);
    s->active = NULL;
    s->slot_used = NULL;
}
