/* batch_step.c — the forward pass of one batched decode step (batch.c plans it and owns the
 * slots). The rows' new tokens travel as one sequence of `rows` positions through the linear
 * layers (one matmul with rows for M) and as `rows` sequences of one position through attention.
 *
 * The pass is shape-static, so that a step can be captured as a graph and replayed: its tokens
 * and positions are read from the batch's device inputs (written by batch.c before the pass), and
 * nothing of it depends on their values on the host. So the pass gathers the embeddings on the
 * device (em_embedding_clamped: the planner checked every token and position, so the ids need no
 * read-back), and attends a bucketed number of keys with em_attention_decode_append, which reads
 * each row's position on the device (row r sees the keys j <= pos[r]), computes q k^T, the
 * softmax and the product with v, and writes the row's new key and value into the cache at its
 * position, all in one launch (an unlisted row's position max_len is out of range and writes
 * nothing; the batch's counters let the last cube of each (row, head) merge the key splits in
 * that launch where the device allows); the logits are em_gpt_forward's up to rounding.
 *
 * It is also written for few launches, since at small batches a step costs what its launches
 * cost on the host (docs/profiling.md):
 * - every linear layer is one em_matmul_ex with its bias, GELU and residual add in the matmul's
 *   epilogue (7 launches fewer per block than em_linear_forward + em_add + em_activate), and the
 *   layer norms before c_attn and c_fc are asked of that matmul as its prologue
 *   (em_matmul_epilogue.ln: the skinny kernel normalizes the rows itself where that is cheap, at
 *   one row; elsewhere the norm is its own launch), so a block is 5 launches at one row (the
 *   four matmuls and attention);
 * - attention stores the new keys and values itself and merges its splits itself: one launch
 *   per block where a scatter, the attention and its combine were three;
 * - a greedy step ends in em_argmax on the device, so one i64 per row comes back instead of the
 *   rows' logits.
 * Unlisted rows below the highest listed slot compute throw-away values and write nothing. */
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

/* act(ln(x) W + bias) + residual in one launch: x [..., in] -> [..., out]. ln (NULL: none) is
 * the layer norm before the layer, residual may be NULL; act is a module activation (one the
 * epilogue lacks runs as a separate op). */
static em_tensor *linear(const em_linear *l, const em_layer_norm_mod *ln, const em_tensor *x,
                         em_activation act, const em_tensor *residual)
{
    em_scope_begin();
    em_tensor *w = l->weight_in_out ? l->weight : em_transpose(l->weight, 0, 1);
    em_matmul_epilogue ep = {.bias = l->bias, .residual = residual};
    if (ln) {
        ep.ln = true;
        ep.ln_weight = ln->weight;
        ep.ln_bias = ln->bias;
        ep.ln_eps = ln->eps;
    }
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

/* One block for the step: x [1, rows, C] -> [1, rows, C]; pos [rows] the rows' positions, mask
 * bool [rows, 1, 1, keys] (true: masked). */
static em_tensor *block(const gpt_step *s, em_block *blk, int64_t layer, const em_tensor *x,
                        const em_tensor *pos)
{
    em_mha *m = blk->attn;
    int64_t C = m->dim, H = m->heads, D = C / H, R = s->rows;
    em_gpt_batch *b = s->b;
    em_scope_begin();
    em_tensor *y = NULL;
    em_tensor *qkv = em_reshape(linear(m->c_attn, blk->ln_1, x, EM_ACT_NONE, NULL),
                                EM_SHAPE(R, 1, 3 * C));
    em_tensor *q = qkv ? heads_of(qkv, 0, H, C) : NULL;
    em_tensor *k_new = qkv ? heads_of(qkv, 1, H, C) : NULL; /* the rows' new keys and values */
    em_tensor *v_new = qkv ? heads_of(qkv, 2, H, C) : NULL;
    em_kv_cache *c = b->layers[layer];
    em_tensor *keys = em_narrow(em_narrow(c->k, 0, 0, R), 2, 0, s->keys);
    em_tensor *vals = em_narrow(em_narrow(c->v, 0, 0, R), 2, 0, s->keys);
    /* row r sees the keys j <= pos[r], read on the device, its new key and value among them,
     * which the same launch stores at pos[r] (an unlisted row's max_len: nowhere) */
    em_tensor *o = em_attention_decode_append(q, k_new, v_new, keys, vals, pos, b->counters,
                                              1.0 / sqrt((double)D)); /* [R, H, 1, D] */
    if (!o) goto done;
    o = em_reshape(em_transpose(em_take(o), 1, 2), EM_SHAPE(1, R, C)); /* heads merged */
    em_tensor *h = linear(m->c_proj, NULL, o, EM_ACT_NONE, x);         /* x + attn */
    em_tensor *f = linear(blk->mlp->c_fc, blk->ln_2, h, blk->mlp->act, NULL);
    y = linear(blk->mlp->c_proj, NULL, f, EM_ACT_NONE, h); /* h + mlp */
done:
    em_scope_end(&y, 1);
    return y;
}

em_tensor *gpt_step_forward_static(const gpt_step *s)
{
    em_gpt_batch *b = s->b;
    em_gpt *g = b->g;
    int64_t R = s->rows;
    em_scope_begin();
    em_tensor *ids = em_narrow(em_select(b->inputs, 0, 0), 0, 0, R); /* [R] */
    em_tensor *pos = em_narrow(em_select(b->inputs, 0, 1), 0, 0, R); /* [R] */
    /* an unlisted row's position max_len clamps into wpe: a throw-away row */
    em_tensor *x = em_add(em_embedding_clamped(g->wte->weight, em_reshape(ids, EM_SHAPE(1, R))),
                          em_embedding_clamped(g->wpe->weight, em_reshape(pos, EM_SHAPE(1, R))));
    for (int64_t i = 0; x && i < g->cfg.n_layer; i++) x = block(s, g->h[i], i, x, pos);
    x = em_layer_norm_forward(g->ln_f, x); /* its own launch: the head's 25,000 cubes would each
                                             * normalize the row again (docs/matmul.md) */
    em_tensor *out = x ? gpt_head(g, x) : NULL;
    if (s->greedy) out = em_argmax(em_take(out), -1, false); /* [1, rows] i64 */
    if (out && em_realize(out) != EM_OK) out = NULL;         /* launched, not waited for */
    em_scope_end(&out, 1);
    return out;
}
