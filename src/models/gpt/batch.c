/* batch.c — batched decoding for continuous batching: a KV cache of `slots` rows in which each
 * slot (one sequence) has its own length. A prefill runs the prompt through the model's blocks
 * with each layer's cache seen through a one-slot view, so the keys and values land in the
 * slot's rows directly, and computes the logits of the last position only (the LM head over
 * every prompt position would cost prompt x vocab for one row that is used).
 * A step feeds one new token per listed slot: as one sequence of `rows` positions through the
 * linear layers (one matmul with rows for M, far faster than rows matmuls of one row), and as
 * `rows` sequences of one position through attention, written here per row: each row's key and
 * value go to its own slot at its own position (one copy per run of adjacent rows at the same
 * position, so sequences decoding in lockstep cost one copy per layer), the position embeddings
 * come from each row's position, and the scores of keys past a row's length are masked (filled
 * with the dtype's lowest finite value, as em_mha_forward does, so that masked keys weigh
 * exactly zero). The step runs over rows [0, highest listed slot]; rows of unlisted slots compute
 * throw-away values and write nothing, so a server that hands out the lowest free slot keeps the
 * pass as small as its active set. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt/internal.h"

em_gpt_batch *em_gpt_batch_new(em_gpt *g, int64_t slots, int64_t max_len)
{
    if (!g || slots <= 0) {
        em_set_error(EM_ERR_INVALID, "em_gpt_batch_new: no model or slots <= 0");
        return NULL;
    }
    if (max_len <= 0 || max_len > g->cfg.block_size) max_len = g->cfg.block_size;
    em_gpt_batch *b = calloc(1, sizeof *b);
    if (b) {
        b->layers = calloc((size_t)g->cfg.n_layer, sizeof *b->layers);
        b->len = calloc((size_t)slots, sizeof *b->len);
    }
    if (!b || !b->layers || !b->len) {
        if (b) free(b->layers), free(b->len);
        free(b);
        em_set_error(EM_ERR_NOMEM, "em_gpt_batch_new: out of memory");
        return NULL;
    }
    b->g = g;
    b->slots = slots;
    b->max_len = max_len;
    int64_t hd = g->cfg.n_embd / g->cfg.n_head;
    for (int64_t i = 0; i < g->cfg.n_layer; i++) {
        b->layers[i] = em_kv_cache_new(g->dev, g->dtype, slots, g->cfg.n_head, max_len, hd);
        if (!b->layers[i]) {
            em_gpt_batch_free(b);
            return NULL;
        }
    }
    return b;
}

void em_gpt_batch_free(em_gpt_batch *b)
{
    if (!b) return;
    for (int64_t i = 0; b->layers && i < b->g->cfg.n_layer; i++) em_kv_cache_free(b->layers[i]);
    free(b->layers);
    free(b->len);
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

em_status em_gpt_batch_prefill(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n,
                               float *logits)
{
    const char *op = "em_gpt_batch_prefill";
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
    if (!last)
        st = failed(op);
    else if (logits)
        st = em_to_host(last, logits, (size_t)g->cfg.vocab_size * sizeof(float));
    em_scope_end(NULL, 0);
    leave(g, was);
    if (st == EM_OK) b->len[slot] = n;
    return st;
}

/* ---- one batched decode step ----------------------------------------------------------------- */

/* The lowest finite value of a float dtype (the fill of masked scores, as em_mha_forward's). */
static double lowest(em_scalar dt)
{
    switch (dt) {
    case EM_F16:
        return -65504.0;
    case EM_F64:
        return -DBL_MAX;
    case EM_BF16:
        return -3.3895313892515355e38;
    default:
        return -FLT_MAX;
    }
}

/* What every layer of one step shares. */
typedef struct step_ctx {
    em_gpt_batch *b;
    const int64_t *slots;  /* listed slots */
    int64_t n;             /* how many */
    int64_t rows;          /* rows of the pass: highest listed slot + 1 */
    int64_t tk;            /* keys attended: the longest listed slot after this step */
    const uint8_t *listed; /* per row: its slot is listed */
    const int64_t *pos;    /* per listed row: the position its new key goes to */
    em_tensor *mask;       /* bool [rows, 1, 1, tk]: true = masked; NULL when none is */
} step_ctx;

/* [rows, 1, 3C] part `which` (0 q, 1 k, 2 v) as heads [rows, H, 1, D] (a view). */
static em_tensor *heads_of(const em_tensor *qkv, int which, int64_t H, int64_t C)
{
    em_tensor *part = em_narrow(qkv, 2, which * C, C);
    em_tensor *r = em_reshape(part, EM_SHAPE(em_dim(qkv, 0), 1, H, C / H));
    return em_transpose(r, 1, 2);
}

/* Writes each listed row's new key and value at its slot's next position: one copy per run of
 * adjacent listed rows at the same position. */
static bool write_kv(const step_ctx *s, em_kv_cache *c, const em_tensor *k, const em_tensor *v)
{
    bool ok = true;
    for (int64_t r = 0; ok && r < s->rows;) {
        if (!s->listed[r]) {
            r++;
            continue;
        }
        int64_t end = r + 1, at = s->pos[r];
        while (end < s->rows && s->listed[end] && s->pos[end] == at) end++;
        const em_tensor *src[2] = {k, v};
        em_tensor *dst[2] = {c->k, c->v};
        for (int j = 0; ok && j < 2; j++) {
            em_scope_begin();
            em_tensor *d = em_narrow(em_narrow(dst[j], 0, r, end - r), 2, at, 1);
            em_tensor *w = em_narrow(src[j], 0, r, end - r);
            ok = d && w && em_copy_(d, w) == EM_OK;
            em_scope_end(NULL, 0);
        }
        r = end;
    }
    return ok;
}

/* Self-attention of one block for the step: x [1, rows, C] -> [1, rows, C]. The rows travel as
 * one sequence through the linear layers (one matmul with rows for M, much faster than rows
 * matmuls of one row) and as a batch of rows of one position through attention. */
static em_tensor *attend(const step_ctx *s, em_mha *m, em_kv_cache *c, const em_tensor *x)
{
    int64_t C = m->dim, H = m->heads, D = C / H, R = s->rows;
    em_scope_begin();
    em_tensor *y = NULL;
    em_tensor *qkv = em_reshape(em_linear_forward(m->c_attn, x), EM_SHAPE(R, 1, 3 * C));
    em_tensor *q = heads_of(qkv, 0, H, C), *k = heads_of(qkv, 1, H, C), *v = heads_of(qkv, 2, H, C);
    if (!q || !k || !v || !write_kv(s, c, k, v)) goto done;
    em_tensor *keys = em_narrow(em_narrow(c->k, 0, 0, R), 2, 0, s->tk);
    em_tensor *vals = em_narrow(em_narrow(c->v, 0, 0, R), 2, 0, s->tk);
    em_tensor *att =
        em_mul_scalar(em_take(em_matmul(q, em_transpose(keys, 2, 3))), 1.0 / sqrt((double)D));
    if (s->mask) att = em_masked_fill(em_take(att), s->mask, lowest(em_dtype(att)));
    att = em_softmax(em_take(att), -1);
    em_tensor *o = em_matmul(att, vals);                               /* [R, H, 1, D] */
    o = em_reshape(em_transpose(em_take(o), 1, 2), EM_SHAPE(1, R, C)); /* heads merged */
    y = em_linear_forward(m->c_proj, o);
done:
    em_scope_end(&y, 1);
    return y;
}

/* The whole pass over ids_pos [2, rows] (the rows' tokens, then their positions): logits
 * [1, rows, vocab] (f32). */
static em_tensor *step_forward(const step_ctx *s, const int64_t *ids_pos)
{
    em_gpt *g = s->b->g;
    em_scope_begin();
    /* ids and pos lie one after the other (plan): one upload for both. */
    em_tensor *both = em_from_host(g->dev, EM_I64, EM_SHAPE(2, s->rows), ids_pos);
    em_tensor *tid = em_narrow(both, 0, 0, 1), *tpos = em_narrow(both, 0, 1, 1);
    em_tensor *x = em_add(em_embedding_forward(g->wte, tid), em_embedding_forward(g->wpe, tpos));
    for (int64_t i = 0; x && i < g->cfg.n_layer; i++) {
        em_block *blk = g->h[i];
        em_tensor *a = attend(s, blk->attn, s->b->layers[i], em_layer_norm_forward(blk->ln_1, x));
        em_tensor *h = em_add(x, em_take(a));
        em_tensor *f = em_mlp_forward(blk->mlp, em_layer_norm_forward(blk->ln_2, h), NULL);
        x = em_add(em_take(h), em_take(f));
    }
    x = em_layer_norm_forward(g->ln_f, x);
    em_tensor *logits = x ? gpt_head(g, x) : NULL;
    em_scope_end(&logits, 1);
    return logits;
}

/* Checks the listed slots; fills ids/pos for the rows and returns the keys attended (or -1). */
static int64_t plan(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens, int64_t n,
                    int64_t *ids, int64_t *pos, uint8_t *listed)
{
    const char *op = "em_gpt_batch_step";
    int64_t tk = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = slots[i];
        if (listed[s]) {
            em_set_error(EM_ERR_INVALID, "%s: slot %lld is listed twice", op, (long long)s);
            return -1;
        }
        listed[s] = 1;
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

em_status em_gpt_batch_step(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens, int64_t n,
                            float *logits)
{
    const char *op = "em_gpt_batch_step";
    if (!b || (n > 0 && (!slots || !tokens)))
        return em_set_error(EM_ERR_INVALID, "%s: NULL argument", op);
    if (n <= 0) return EM_OK;
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= b->slots)
            return em_set_error(EM_ERR_INVALID, "%s: slot %lld outside [0, %lld)", op,
                                (long long)slots[i], (long long)b->slots);
        if (slots[i] + 1 > rows) rows = slots[i] + 1;
    }
    em_gpt *g = b->g;
    int64_t V = g->cfg.vocab_size;
    int64_t *ids = calloc((size_t)rows * 2, sizeof *ids);
    uint8_t *listed = calloc((size_t)rows, 1);
    if (!ids || !listed) {
        free(ids);
        free(listed);
        return em_set_error(EM_ERR_NOMEM, "%s: out of memory", op);
    }
    int64_t *pos = ids + rows;
    int64_t tk = plan(b, slots, tokens, n, ids, pos, listed);
    if (tk < 0) {
        free(ids), free(listed);
        return em_last_status();
    }
    uint8_t *mask = calloc((size_t)(rows * tk), 1);
    /* Rows in the caller's order (slots 0, 1, ... listed in turn) go straight to its logits. */
    bool in_order = n == rows;
    for (int64_t i = 0; in_order && i < n; i++) in_order = slots[i] == i;
    float *host = !logits ? NULL : in_order ? logits : malloc((size_t)(rows * V) * sizeof *host);
    if (!mask || (logits && !host)) {
        if (host == logits) host = NULL;
        free(ids), free(listed), free(mask), free(host);
        return em_set_error(EM_ERR_NOMEM, "%s: out of memory", op);
    }
    /* A listed row sees keys [0, len]; an unlisted row's output is thrown away. Sequences in
     * lockstep (every row listed, all at the last position) need no mask. */
    bool masked = false;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < tk; j++) {
            mask[r * tk + j] = listed[r] && j > pos[r];
            masked = masked || mask[r * tk + j];
        }

    em_status st = EM_OK;
    bool was = enter(g);
    em_scope_begin();
    step_ctx s = {b, slots, n, rows, tk, listed, pos, NULL};
    if (masked) s.mask = em_from_host(g->dev, EM_BOOL, EM_SHAPE(rows, 1, 1, tk), mask);
    em_tensor *out = !masked || s.mask ? step_forward(&s, ids) : NULL;
    if (!out)
        st = failed(op);
    else if (host)
        st = em_to_host(out, host, (size_t)(rows * V) * sizeof *host);
    em_scope_end(NULL, 0);
    leave(g, was);
    if (st == EM_OK) {
        for (int64_t i = 0; i < n; i++) {
            b->len[slots[i]]++;
            if (host && host != logits)
                memcpy(logits + i * V, host + slots[i] * V, (size_t)V * sizeof *logits);
        }
    } else {
        /* A layer may have written some keys already: the listed slots are no longer usable. */
        for (int64_t i = 0; i < n; i++) b->len[slots[i]] = 0;
    }
    if (host != logits) free(host);
    free(ids), free(listed), free(mask);
    return st;
}
