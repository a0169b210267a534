/* batch.c — batched decoding for continuous batching: a KV cache of `slots` rows in which each
 * slot (one sequence) has its own length. A prefill runs the prompt through the model's blocks
 * with each layer's cache seen through a one-slot view, so the keys and values land in the
 * slot's rows directly, and computes the logits of the last position only (the LM head over
 * every prompt position would cost prompt x vocab for one row that is used).
 * A step feeds one new token per listed slot. It goes: plan on the host (check the listed slots
 * and tokens, each row's token and position, the rows and the bucketed keys of the pass) -> one
 * queued write of the tokens and positions into the batch's device inputs -> the shape-static
 * forward pass of batch_step.c (gpt_step_forward_static, the part a CUDA graph can capture:
 * its kernels' arguments depend only on rows, keys and greedy) -> one read of the result. The
 * step runs over rows [0, highest listed slot]; rows of unlisted slots compute throw-away values
 * and write nothing, so a server that hands out the lowest free slot keeps the pass as small as
 * its active set. The greedy variants (em_gpt_batch_prefill_greedy, em_gpt_batch_step_greedy)
 * pick the next tokens on the device and bring back one id per row instead of the logits. A step
 * allocates nothing on the host: its scratch arrays belong to the batch. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "models/gpt/internal.h"
#include "tensor/internal.h" /* the inputs' buffer, written in place each step */

/* Layer i's keys and values in one zeroed tensor [slots, 2, heads, max_len, head_dim], and the
 * em_kv_cache of its two halves (views) that prefills hand to em_block_forward. Each tensor holds
 * exactly the batch's reference. false with the error set. */
static bool new_layer(em_gpt_batch *b, int64_t i)
{
    em_gpt *g = b->g;
    int64_t H = g->cfg.n_head, D = g->cfg.n_embd / H;
    em_kv_cache *c = calloc(1, sizeof *c);
    if (!c) {
        em_set_error(EM_ERR_NOMEM, "em_gpt_batch_new: out of memory");
        return false;
    }
    b->layers[i] = c;
    c->max_len = b->max_len;
    em_scope_begin();
    em_tensor *kv = em_zeros(g->dev, g->dtype, EM_SHAPE(b->slots, 2, H, b->max_len, D));
    em_tensor *k = em_select(kv, 1, 0), *v = em_select(kv, 1, 1);
    if (k && v) {
        b->kv[i] = em_retain(kv);
        c->k = em_retain(k);
        c->v = em_retain(v);
    }
    em_scope_end(NULL, 0);
    return c->v != NULL;
}

em_gpt_batch *em_gpt_batch_new(em_gpt *g, int64_t slots, int64_t max_len)
{
    if (!g || slots <= 0) {
        em_set_error(EM_ERR_INVALID, "em_gpt_batch_new: no model or slots <= 0");
        return NULL;
    }
    if (max_len <= 0 || max_len > g->cfg.block_size) max_len = g->cfg.block_size;
    em_gpt_batch *b = calloc(1, sizeof *b);
    size_t L = (size_t)g->cfg.n_layer, S = (size_t)slots;
    if (b) {
        b->g = g;
        b->kv = calloc(L, sizeof *b->kv);
        b->layers = calloc(L, sizeof *b->layers);
        b->len = calloc(S, sizeof *b->len);
        b->ids = calloc(2 * S, sizeof *b->ids);
        b->listed = calloc(S, 1);
        b->next = calloc(S, sizeof *b->next);
    }
    if (!b || !b->kv || !b->layers || !b->len || !b->ids || !b->listed || !b->next) {
        em_gpt_batch_free(b);
        em_set_error(EM_ERR_NOMEM, "em_gpt_batch_new: out of memory");
        return NULL;
    }
    b->slots = slots;
    b->max_len = max_len;
    for (int64_t i = 0; i < g->cfg.n_layer; i++) {
        if (!new_layer(b, i)) {
            em_gpt_batch_free(b);
            return NULL;
        }
    }
    /* from_host, not zeros: the buffer exists now (no pending fill) for write_inputs */
    b->inputs = em_from_host(g->dev, EM_I64, EM_SHAPE(2, slots), b->ids);
    b->counters = em_zeros(g->dev, EM_I32, EM_SHAPE(slots * g->cfg.n_head));
    if (!b->inputs || !b->counters || em_realize(b->counters) != EM_OK) {
        em_error_context("em_gpt_batch_new");
        em_gpt_batch_free(b);
        return NULL;
    }
    return b;
}

void em_gpt_batch_free(em_gpt_batch *b)
{
    if (!b) return;
    for (int64_t i = 0; b->layers && i < b->g->cfg.n_layer; i++) em_kv_cache_free(b->layers[i]);
    for (int64_t i = 0; b->kv && i < b->g->cfg.n_layer; i++) em_release(b->kv[i]);
    em_release(b->inputs);
    em_release(b->counters);
    for (int i = 0; i < b->ngraphs; i++) {
        em_graph_free(b->graphs[i].g);
        em_release(b->graphs[i].out);
    }
    free(b->graphs);
    free(b->kv);
    free(b->layers);
    free(b->len);
    free(b->ids);
    free(b->listed);
    free(b->next);
    free(b);
}

int64_t em_gpt_batch_slots(const em_gpt_batch *b)
{
    return b ? b->slots : 0;
}

int64_t em_gpt_batch_max_len(const em_gpt_batch *b)
{
    return b ? b->max_len : 0;
}

int64_t em_gpt_batch_len(const em_gpt_batch *b, int64_t slot)
{
    return b && slot >= 0 && slot < b->slots ? b->len[slot] : 0;
}

void em_gpt_batch_clear(em_gpt_batch *b, int64_t slot)
{
    if (b && slot >= 0 && slot < b->slots) b->len[slot] = 0;
}

/* Eval mode and no-grad around a pass; restores the mode afterwards. */
static bool enter(em_gpt *g)
{
    bool was = g->root->training;
    if (was) em_module_train(g->root, false);
    em_no_grad_begin();
    return was;
}

static void leave(em_gpt *g, bool was_training)
{
    em_no_grad_end();
    if (was_training) em_module_train(g->root, true);
}

static em_status failed(const char *op)
{
    em_status st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_INTERNAL;
    em_error_context("%s", op);
    return st;
}

/* ---- prefill --------------------------------------------------------------------------------- */

/* ids [0, n) through the blocks, each layer's keys and values appended to the slot's rows (a
 * one-slot view of the layer's cache), then ln_f and the head on the last position only:
 * logits [1, 1, vocab] (f32), or NULL. */
static em_tensor *prefill_forward(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n)
{
    em_gpt *g = b->g;
    em_scope_begin();
    em_tensor *tid = em_from_host(g->dev, EM_I64, EM_SHAPE(1, n), ids);
    em_tensor *tpos = em_arange(g->dev, EM_I64, 0, (double)n, 1);
    em_tensor *x = em_add(em_embedding_forward(g->wte, tid), em_embedding_forward(g->wpe, tpos));
    for (int64_t i = 0; x && i < g->cfg.n_layer; i++) {
        em_kv_cache view = {em_narrow(b->layers[i]->k, 0, slot, 1),
                            em_narrow(b->layers[i]->v, 0, slot, 1), 0, b->max_len};
        x = view.k && view.v ? em_block_forward(g->h[i], x, NULL, &view, &g->rng) : NULL;
    }
    x = em_layer_norm_forward(g->ln_f, em_narrow(x, 1, n - 1, 1));
    em_tensor *logits = x ? gpt_head(g, x) : NULL;
    em_scope_end(&logits, 1);
    return logits;
}

/* Prefill with the last position's logits to `logits` (may be NULL), or with greedy its first
 * largest logit's index to *next. */
static em_status prefill(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n,
                         float *logits, int64_t *next, const char *op)
{
    if (!b || !ids) return em_set_error(EM_ERR_INVALID, "%s: NULL argument", op);
    if (slot < 0 || slot >= b->slots)
        return em_set_error(EM_ERR_INVALID, "%s: slot %lld outside [0, %lld)", op, (long long)slot,
                            (long long)b->slots);
    b->len[slot] = 0;
    if (n <= 0 || n > b->max_len)
        return em_set_error(EM_ERR_INVALID, "%s: %lld tokens, a slot holds 1 to %lld", op,
                            (long long)n, (long long)b->max_len);
    em_gpt *g = b->g;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= g->cfg.vocab_size)
            return em_set_error(EM_ERR_INVALID,
                                "%s: token %lld at %lld is outside the vocabulary of %lld", op,
                                (long long)ids[i], (long long)i, (long long)g->cfg.vocab_size);
    bool was = enter(g);
    em_status st = EM_OK;
    em_scope_begin();
    em_tensor *last = prefill_forward(b, slot, ids, n);
    if (next && last) last = em_argmax(last, -1, false); /* [1, 1] i64 */
    if (!last)
        st = failed(op);
    else if (next)
        st = em_to_host(last, next, sizeof *next);
    else if (logits)
        st = em_to_host(last, logits, (size_t)g->cfg.vocab_size * sizeof(float));
    em_scope_end(NULL, 0);
    leave(g, was);
    if (st == EM_OK) b->len[slot] = n;
    return st;
}

em_status em_gpt_batch_prefill(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n,
                               float *logits)
{
    return prefill(b, slot, ids, n, logits, NULL, "em_gpt_batch_prefill");
}

em_status em_gpt_batch_prefill_greedy(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n,
                                      int64_t *next)
{
    if (!next) return em_set_error(EM_ERR_INVALID, "em_gpt_batch_prefill_greedy: NULL argument");
    return prefill(b, slot, ids, n, NULL, next, "em_gpt_batch_prefill_greedy");
}

/* ---- one batched decode step ----------------------------------------------------------------- */

/* Checks the listed slots and fills the batch's scratch: ids (each slot's token, then its
 * position: max_len for a slot not listed) and listed. Returns the keys attended (the longest
 * listed slot after the step), or -1 with the error set. */
static int64_t plan(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens, int64_t n,
                    const char *op)
{
    int64_t *ids = b->ids, *pos = b->ids + b->slots;
    for (int64_t r = 0; r < b->slots; r++) {
        ids[r] = 0;
        pos[r] = b->max_len;
    }
    memset(b->listed, 0, (size_t)b->slots);
    int64_t tk = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = slots[i];
        if (b->listed[s]) {
            em_set_error(EM_ERR_INVALID, "%s: slot %lld is listed twice", op, (long long)s);
            return -1;
        }
        b->listed[s] = 1;
        if (b->len[s] <= 0 || b->len[s] >= b->max_len) {
            em_set_error(EM_ERR_INVALID,
                         "%s: slot %lld holds %lld of %lld positions (a step needs a prefilled "
                         "slot with room for one more)",
                         op, (long long)s, (long long)b->len[s], (long long)b->max_len);
            return -1;
        }
        if (tokens[i] < 0 || tokens[i] >= b->g->cfg.vocab_size) {
            em_set_error(EM_ERR_INVALID, "%s: token %lld (slot %lld) is outside the vocabulary", op,
                         (long long)tokens[i], (long long)s);
            return -1;
        }
        ids[s] = tokens[i];
        pos[s] = b->len[s];
        if (b->len[s] + 1 > tk) tk = b->len[s] + 1;
    }
    return tk;
}

/* plan() after checking that every listed slot exists; *rows: the rows of the pass (highest
 * listed slot + 1). */
static int64_t plan_rows(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens, int64_t n,
                         const char *op, int64_t *rows)
{
    *rows = 0;
    for (int64_t i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= b->slots) {
            em_set_error(EM_ERR_INVALID, "%s: slot %lld outside [0, %lld)", op,
                         (long long)slots[i], (long long)b->slots);
            return -1;
        }
        if (slots[i] + 1 > *rows) *rows = slots[i] + 1;
    }
    return plan(b, slots, tokens, n, op);
}

/* The keys a step attends: tk rounded up to a multiple of GPT_STEP_KEYS_BUCKET, at most max_len
 * (the keys past a row's position are masked, so the bucket changes nothing but the shapes). */
static int64_t bucket_keys(int64_t tk, int64_t max_len)
{
    int64_t keys = (tk + GPT_STEP_KEYS_BUCKET - 1) / GPT_STEP_KEYS_BUCKET * GPT_STEP_KEYS_BUCKET;
    return keys < max_len ? keys : max_len;
}

/* Queues the planned tokens and positions (the host scratch ids: tokens [0, slots), positions
 * [slots, 2 slots)) from entry `first` on into the device inputs: one host -> device write into
 * the existing buffer, in stream order, no new tensor and no wait. */
static em_status write_inputs_from(em_gpt_batch *b, int64_t first)
{
    em_tensor *t = b->inputs;
    em_status st = em_realize(t); /* pending work that reads the previous inputs runs first */
    if (st != EM_OK) return st;
    return em_buffer_write(t->st->buf, (size_t)(t->offset + first) * sizeof *b->ids,
                           b->ids + first, (size_t)(2 * b->slots - first) * sizeof *b->ids);
}

static em_status write_inputs(em_gpt_batch *b)
{
    return write_inputs_from(b, 0);
}

/* Whether decode steps are recorded and replayed as graphs ($EMBER_DECODE_GRAPHS=0: never). */
static bool graphs_on(void)
{
    const char *v = getenv("EMBER_DECODE_GRAPHS");
    return !v || strcmp(v, "0") != 0;
}

/* The graph entry of s's key, created (evicting the least recently used) when missing; NULL when
 * graphs are off or host memory is short. */
static gpt_graph *graph_entry(em_gpt_batch *b, const gpt_step *s)
{
    if (!graphs_on()) return NULL;
    for (int i = 0; i < b->ngraphs; i++) {
        gpt_graph *e = &b->graphs[i];
        if (e->rows == s->rows && e->keys == s->keys && e->greedy == s->greedy) return e;
    }
    if (!b->graphs && !(b->graphs = calloc(GPT_STEP_GRAPHS, sizeof *b->graphs))) return NULL;
    gpt_graph *e = &b->graphs[b->ngraphs];
    if (b->ngraphs == GPT_STEP_GRAPHS) {
        e = &b->graphs[0];
        for (int i = 1; i < b->ngraphs; i++)
            if (b->graphs[i].used < e->used) e = &b->graphs[i];
        em_graph_free(e->g);
        em_release(e->out);
    } else {
        b->ngraphs++;
    }
    *e = (gpt_graph){.rows = s->rows, .keys = s->keys, .greedy = s->greedy};
    return e;
}

/* The step's forward pass: replayed when its key was recorded, recorded on the key's second run
 * (the first compiled and tuned its kernels), eager otherwise or when recording fails (a failed
 * recording ran nothing: the eager pass follows). The result is borrowed from the entry when it
 * comes from a graph, else scoped. */
static em_tensor *step_forward(em_gpt_batch *b, const gpt_step *s)
{
    gpt_graph *e = graph_entry(b, s);
    if (e) e->used = ++b->clock;
    if (e && e->g) return em_tensor_graph_launch(e->g) == EM_OK ? e->out : NULL;
    if (e && !e->failed && e->seen >= 1) {
        em_device *dev = b->g->dev;
        if (em_tensor_graph_begin(dev) == EM_OK) {
            em_tensor *out = gpt_step_forward_static(s);
            if (out) em_keep(out);
            em_graph *g = NULL;
            if (em_tensor_graph_end(dev, &g) == EM_OK && out &&
                em_tensor_graph_launch(g) == EM_OK) {
                e->g = g;
                e->out = out;
                return out;
            }
            EM_LOGD("em_gpt_batch: step of %lld rows, %lld keys not recorded: %s",
                    (long long)s->rows, (long long)s->keys, em_last_error());
            em_graph_free(g);
            em_release(out);
            em_clear_error();
        }
        e->failed = true;
    }
    if (e) e->seen++;
    return gpt_step_forward_static(s);
}

/* A step; the listed rows' logits go to `logits` (may be NULL) in the caller's order, or with
 * greedy their next tokens to next[n]. */
static em_status step(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens, int64_t n,
                      float *logits, int64_t *next, const char *op)
{
    if (!b || (n > 0 && (!slots || !tokens)))
        return em_set_error(EM_ERR_INVALID, "%s: NULL argument", op);
    if (n <= 0) return EM_OK;
    int64_t rows = 0, tk = plan_rows(b, slots, tokens, n, op, &rows);
    if (tk < 0) return em_last_status();
    em_gpt *g = b->g;
    int64_t V = g->cfg.vocab_size;
    /* Rows in the caller's order (slots 0, 1, ... listed in turn) go straight to its logits. */
    bool in_order = n == rows;
    for (int64_t i = 0; in_order && i < n; i++) in_order = slots[i] == i;
    float *host = !logits || next ? NULL
                  : in_order      ? logits
                                  : malloc((size_t)(rows * V) * sizeof *host);
    if (logits && !next && !host) return em_set_error(EM_ERR_NOMEM, "%s: out of memory", op);

    em_status st = EM_OK;
    bool was = enter(g);
    em_scope_begin();
    gpt_step s = {b, rows, bucket_keys(tk, b->max_len), next != NULL};
    em_tensor *out = write_inputs(b) == EM_OK ? step_forward(b, &s) : NULL;
    if (!out)
        st = failed(op);
    else if (next)
        st = em_to_host(out, b->next, (size_t)rows * sizeof *b->next);
    else if (host)
        st = em_to_host(out, host, (size_t)(rows * V) * sizeof *host);
    em_scope_end(NULL, 0);
    leave(g, was);
    if (st == EM_OK) {
        for (int64_t i = 0; i < n; i++) {
            b->len[slots[i]]++;
            if (next) next[i] = b->next[slots[i]];
            if (host && host != logits)
                memcpy(logits + i * V, host + slots[i] * V, (size_t)V * sizeof *logits);
        }
    } else {
        /* A layer may have written some keys already: the listed slots are no longer usable. */
        for (int64_t i = 0; i < n; i++) b->len[slots[i]] = 0;
    }
    if (host != logits) free(host);
    return st;
}

/* ---- greedy steps without a read-back between them ------------------------------------------ */

/* A buffer and byte offset of a realized tensor's first element. */
static em_buffer *buffer_of(const em_tensor *t, size_t *offset)
{
    *offset = (size_t)t->offset * em_scalar_size(em_dtype(t));
    return t->st ? t->st->buf : NULL;
}

/* The positions of the listed slots k steps after the planned ones (b->ids' second half), queued
 * into the device inputs' second half. */
static em_status write_positions(em_gpt_batch *b, int64_t k)
{
    int64_t *pos = b->ids + b->slots;
    for (int64_t r = 0; r < b->slots; r++)
        if (b->listed[r]) pos[r] = b->len[r] + k;
    return write_inputs_from(b, b->slots); /* the positions: the second half */
}

/* `steps` greedy steps in a row (see gpt.h). Step k > 0 takes its tokens from step k - 1's result
 * on the device (a queued device copy into the inputs' first half) and its positions from a
 * queued write, each step's result is copied into a device log, and the log comes back in one
 * read at the end: the host queues every step before it waits for any. */
static em_status steps_greedy(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens,
                              int64_t n, int64_t steps, int64_t *next, const char *op)
{
    int64_t rows = 0, tk = plan_rows(b, slots, tokens, n, op, &rows);
    if (tk < 0) return em_last_status();
    for (int64_t i = 0; i < n; i++)
        if (b->len[slots[i]] + steps > b->max_len)
            return em_set_error(EM_ERR_INVALID,
                                "%s: slot %lld holds %lld of %lld positions, too few left for %lld "
                                "steps",
                                op, (long long)slots[i], (long long)b->len[slots[i]],
                                (long long)b->max_len, (long long)steps);
    em_gpt *g = b->g;
    size_t row_bytes = (size_t)rows * sizeof(int64_t);
    int64_t *host = malloc((size_t)steps * row_bytes);
    em_buffer *log = host ? em_buffer_alloc(g->dev, (size_t)steps * row_bytes) : NULL;
    if (!log) {
        free(host);
        return host ? em_error_context("%s", op)
                    : em_set_error(EM_ERR_NOMEM, "%s: out of memory", op);
    }
    em_status st = EM_OK;
    bool was = enter(g);
    size_t ids_off = 0;
    em_buffer *ids = NULL;
    for (int64_t k = 0; k < steps && st == EM_OK; k++) {
        em_scope_begin();
        gpt_step s = {b, rows, bucket_keys(tk + k, b->max_len), true};
        st = k == 0 ? write_inputs(b) : write_positions(b, k);
        em_tensor *out = st == EM_OK ? step_forward(b, &s) : NULL;
        size_t out_off = 0;
        em_buffer *ob = out ? buffer_of(out, &out_off) : NULL;
        if (!ob) st = failed(op);
        if (st == EM_OK && !ids) ids = buffer_of(b->inputs, &ids_off);
        if (st == EM_OK) st = em_buffer_copy(log, (size_t)k * row_bytes, ob, out_off, row_bytes);
        if (st == EM_OK && k + 1 < steps) st = em_buffer_copy(ids, ids_off, ob, out_off, row_bytes);
        em_scope_end(NULL, 0);
    }
    if (st == EM_OK) st = em_buffer_read(log, 0, host, (size_t)steps * row_bytes);
    leave(g, was);
    em_buffer_free(log);
    if (st == EM_OK) {
        for (int64_t i = 0; i < n; i++) {
            b->len[slots[i]] += steps;
            for (int64_t k = 0; k < steps; k++) next[k * n + i] = host[k * rows + slots[i]];
        }
    } else {
        for (int64_t i = 0; i < n; i++) b->len[slots[i]] = 0;
    }
    free(host);
    return st;
}

em_status em_gpt_batch_steps_greedy(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens,
                                    int64_t n, int64_t steps, int64_t *next)
{
    const char *op = "em_gpt_batch_steps_greedy";
    if (!b || (n > 0 && (!slots || !tokens || !next)))
        return em_set_error(EM_ERR_INVALID, "%s: NULL argument", op);
    if (steps < 1)
        return em_set_error(EM_ERR_INVALID, "%s: %lld steps (at least 1)", op, (long long)steps);
    if (n <= 0) return EM_OK;
    return steps_greedy(b, slots, tokens, n, steps, next, op);
}

em_status em_gpt_batch_step(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens, int64_t n,
                            float *logits)
{
    return step(b, slots, tokens, n, logits, NULL, "em_gpt_batch_step");
}

em_status em_gpt_batch_step_greedy(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens,
                                   int64_t n, int64_t *next)
{
    if (!next && n > 0)
        return em_set_error(EM_ERR_INVALID, "em_gpt_batch_step_greedy: NULL argument");
    return step(b, slots, tokens, n, NULL, next, "em_gpt_batch_step_greedy");
}
