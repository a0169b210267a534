/* batch_step.c — the forward pass of one batched decode step (batch.c plans it and owns the
 * slots). The rows' new tokens travel as one sequence of `rows` positions through the linear
 * layers (one matmul with rows for M) and as `rows` sequences of one position through attention.
 *
 * The pass is written for few launches, since at small batches a step costs what its launches
 * cost on the host (docs/profiling.md):
 * - every linear layer is one em_matmul_ex with its bias, GELU and residual add in the matmul's
 *   epilogue (7 launches fewer per block than em_linear_forward + em_add + em_activate);
 * - each block's keys and values live in one tensor [slots, 2, heads, max_len, head_dim], so a
 *   row's new key and value (adjacent in the c_attn output) go to the cache in one copy per run
 *   of adjacent rows at the same position;
 * - the embeddings of one row are views of the embedding tables, and the position embedding of
 *   rows that share one position is a view broadcast over them: no upload, no gather, and no
 *   host read-back of indices (em_embedding checks its indices on the host);
 * - a greedy step ends in em_argmax on the device, so one i64 per row comes back instead of the
 *   rows' logits.
 * Unlisted rows below the highest listed slot compute throw-away values and write nothing.
 * Masked scores are filled with the dtype's lowest finite value, as em_mha_forward does, so
 * masked keys weigh exactly zero. */
#include <math.h>

#include "models/gpt/internal.h"

/* The matmul epilogue's form of a module activation; false when it has none. */
static bool epilogue_act(em_activation act, em_matmul_act *out)
{
    switch (act) {
    case EM_ACT_NONE:
        *out = EM_MATMUL_ACT_NONE;
        return true;
    case EM_ACT_RELU:
        *out = EM_MATMUL_ACT_RELU;
        return true;
    case EM_ACT_GELU:
        *out = EM_MATMUL_ACT_GELU;
        return true;
    case EM_ACT_GELU_TANH:
        *out = EM_MATMUL_ACT_GELU_TANH;
        return true;
    default:
        return false;
    }
}

/* act(x W + bias) + residual in one launch: x [..., in] -> [..., out]. residual may be NULL;
 * act is a module activation (one the epilogue lacks runs as a separate op). */
static em_tensor *linear(const em_linear *l, const em_tensor *x, em_activation act,
                         const em_tensor *residual)
{
    em_scope_begin();
    em_tensor *w = l->weight_in_out ? l->weight : em_transpose(l->weight, 0, 1);
    em_matmul_epilogue ep = {.bias = l->bias, .residual = residual};
    bool fused = epilogue_act(act, &ep.act);
    if (!fused) ep.residual = NULL;
    em_tensor *y = em_matmul_ex(x, w, &ep);
    if (!fused) {
        y = em_activate(em_take(y), act);
        if (residual) y = em_add(em_take(y), residual);
    }
    em_scope_end(&y, 1);
    return y;
}

/* [rows, 1, 3C] part `which` (0 q, 1 k, 2 v) as heads [rows, H, 1, D] (a view). */
static em_tensor *heads_of(const em_tensor *qkv, int which, int64_t H, int64_t C)
{
    em_tensor *part = em_narrow(qkv, 2, which * C, C);
    em_tensor *r = em_reshape(part, EM_SHAPE(em_dim(qkv, 0), 1, H, C / H));
    return em_transpose(r, 1, 2);
}

/* Writes each listed row's new key and value (qkv's last 2C, seen as [rows, 2, H, 1, D]) at its
 * slot's next position of kv [slots, 2, H, max_len, D]: one copy per run of adjacent listed rows
 * at the same position. */
static bool write_kv(const gpt_step *s, em_tensor *kv, const em_tensor *qkv, int64_t H, int64_t C)
{
    bool ok = true;
    for (int64_t r = 0; ok && r < s->rows;) {
        if (!s->listed[r]) {
            r++;
            continue;
        }
        int64_t end = r + 1, at = s->pos[r];
        while (end < s->rows && s->listed[end] && s->pos[end] == at) end++;
        em_scope_begin();
        em_tensor *d = em_narrow(em_narrow(kv, 0, r, end - r), 3, at, 1);
        em_tensor *w = em_reshape(em_narrow(em_narrow(qkv, 0, r, end - r), 2, C, 2 * C),
                                  EM_SHAPE(end - r, 2, H, 1, C / H));
        ok = d && w && em_copy_(d, w) == EM_OK;
        em_scope_end(NULL, 0);
        r = end;
    }
    return ok;
}

/* One block for the step: x [1, rows, C] -> [1, rows, C]. */
static em_tensor *block(const gpt_step *s, em_block *blk, int64_t layer, const em_tensor *x)
{
    em_mha *m = blk->attn;
    int64_t C = m->dim, H = m->heads, D = C / H, R = s->rows;
    em_gpt_batch *b = s->b;
    em_scope_begin();
    em_tensor *y = NULL;
    em_tensor *qkv =
        em_reshape(linear(m->c_attn, em_layer_norm_forward(blk->ln_1, x), EM_ACT_NONE, NULL),
                   EM_SHAPE(R, 1, 3 * C));
    em_tensor *q = qkv ? heads_of(qkv, 0, H, C) : NULL;
    if (!q || !write_kv(s, b->kv[layer], qkv, H, C)) goto done;
    em_kv_cache *c = b->layers[layer];
    em_tensor *keys = em_narrow(em_narrow(c->k, 0, 0, R), 2, 0, s->tk);
    em_tensor *vals = em_narrow(em_narrow(c->v, 0, 0, R), 2, 0, s->tk);
    em_tensor *att =
        em_mul_scalar(em_take(em_matmul(q, em_transpose(keys, 2, 3))), 1.0 / sqrt((double)D));
    if (s->mask) att = em_masked_fill(em_take(att), s->mask, em_scalar_lowest(em_dtype(att)));
    att = em_softmax(em_take(att), -1);
    em_tensor *o = em_matmul(att, vals);                               /* [R, H, 1, D] */
    o = em_reshape(em_transpose(em_take(o), 1, 2), EM_SHAPE(1, R, C)); /* heads merged */
    em_tensor *h = linear(m->c_proj, o, EM_ACT_NONE, x);               /* x + attn */
    em_tensor *f = linear(blk->mlp->c_fc, em_layer_norm_forward(blk->ln_2, h), blk->mlp->act, NULL);
    y = linear(blk->mlp->c_proj, f, EM_ACT_NONE, h); /* h + mlp */
done:
    em_scope_end(&y, 1);
    return y;
}

/* The token and position embeddings of the rows: [1, rows, C]. */
static em_tensor *embed(const gpt_step *s, const int64_t *ids, const int64_t *pos)
{
    em_gpt *g = s->b->g;
    int64_t R = s->rows, C = g->cfg.n_embd;
    /* One position for every listed row (sequences in lockstep): one row of wpe, broadcast
     * (unlisted rows' values are thrown away, whatever their position). */
    int64_t at = -1;
    bool shared = true;
    for (int64_t r = 0; r < R; r++) {
        if (!s->listed[r]) continue;
        if (at < 0)
            at = pos[r];
        else if (pos[r] != at)
            shared = false;
    }
    em_tensor *tok, *p;
    if (R == 1) {
        tok = em_reshape(em_narrow(g->wte->weight, 0, ids[0], 1), EM_SHAPE(1, 1, C));
    } else {
        tok = em_embedding(g->wte->weight, em_from_host(g->dev, EM_I64, EM_SHAPE(1, R), ids));
    }
    if (shared)
        p = em_narrow(g->wpe->weight, 0, at, 1); /* [1, C] */
    else
        p = em_embedding(g->wpe->weight, em_from_host(g->dev, EM_I64, EM_SHAPE(1, R), pos));
    return em_add(tok, p);
}

em_tensor *gpt_step_forward(const gpt_step *s, const int64_t *ids, const int64_t *pos, bool greedy)
{
    em_gpt *g = s->b->g;
    em_scope_begin();
    em_tensor *x = embed(s, ids, pos);
    for (int64_t i = 0; x && i < g->cfg.n_layer; i++) x = block(s, g->h[i], i, x);
    x = em_layer_norm_forward(g->ln_f, x);
    em_tensor *out = x ? gpt_head(g, x) : NULL;
    if (greedy) out = em_argmax(em_take(out), -1, false); /* [1, rows] i64 */
    em_scope_end(&out, 1);
    return out;
}
