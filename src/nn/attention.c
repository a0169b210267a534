/* attention.c — multi-head self-attention in GPT-2's layout and the key/value cache used for
 * incremental decoding. Everything is composed from tensor ops (so autodiff differentiates the
 * full-sequence path): c_attn's output is split into q | k | v along the last dim, viewed as
 * heads [B, H, T, D]; scores = q k^T / sqrt(D); masked positions (causal, padding) are filled
 * with the dtype's lowest finite value, not -inf, so that a fully masked row gives a uniform
 * distribution instead of NaN (as Hugging Face's GPT-2); softmax, dropout in training, att v,
 * heads merged back, c_proj, residual dropout.
 *
 * For more than one query, without a padding mask and without attention dropout (p = 0 or not
 * training), where em_attention runs its matrix-op kernels (em_attention_fast: f16/bf16 at head
 * size 64 or 128 on CUDA) the scores, mask, softmax and att v are that one fused op instead
 * (tensor.h, docs/attention.md), which keeps no [T, Tk] scores or probabilities for the
 * backward; without a cache it runs on the packed projection itself (em_attention_qkv), so
 * neither q, k, v nor the merged heads nor their gradients are copied.
 *
 * The cache path is for inference: the new keys and values are copied into the cache tensors
 * under no-grad (the cache records no gradient), cache->len advances by T, and attention covers
 * positions [0, len + T). */
#include <stdlib.h>
#include <math.h>

#include "nn/internal.h"

/* ---- the cache ---------------------------------------------------------------------------------
 */

em_kv_cache *em_kv_cache_new(em_device *dev, em_scalar dtype, int64_t batch, int64_t heads,
                             int64_t max_len, int64_t head_dim)
{
    if (batch <= 0 || heads <= 0 || max_len <= 0 || head_dim <= 0) {
        em_set_error(EM_ERR_INVALID,
                     "em_kv_cache_new: sizes must be positive, got batch %lld, heads %lld, "
                     "max_len %lld, head_dim %lld",
                     (long long)batch, (long long)heads, (long long)max_len, (long long)head_dim);
        return NULL;
    }
    em_kv_cache *c = calloc(1, sizeof *c);
    if (!c) {
        em_set_error(EM_ERR_NOMEM, "em_kv_cache_new: out of host memory");
        return NULL;
    }
    em_shape s = EM_SHAPE(batch, heads, max_len, head_dim);
    c->k = nn_own(em_zeros(dev, dtype, s));
    c->v = c->k ? nn_own(em_zeros(dev, dtype, s)) : NULL;
    c->max_len = max_len;
    if (!c->v) {
        em_kv_cache_free(c);
        return NULL;
    }
    return c;
}

void em_kv_cache_free(em_kv_cache *c)
{
    if (!c) return;
    em_release(c->k);
    em_release(c->v);
    free(c);
}

void em_kv_cache_reset(em_kv_cache *c)
{
    if (c) c->len = 0;
}

/* ---- the module --------------------------------------------------------------------------------
 */

em_mha *em_mha_new(em_device *dev, em_scalar dtype, int64_t dim, int64_t heads, bool causal,
                   bool bias, double p_dropout, bool weight_in_out, em_rng *rng)
{
    if (dim <= 0 || heads <= 0 || dim % heads != 0) {
        em_set_error(EM_ERR_INVALID,
                     "em_mha_new: dim (%lld) must be a positive multiple of heads (%lld)",
                     (long long)dim, (long long)heads);
        return NULL;
    }
    if (!(p_dropout >= 0 && p_dropout < 1)) {
        em_set_error(EM_ERR_INVALID, "em_mha_new: p_dropout must be in [0, 1), got %g", p_dropout);
        return NULL;
    }
    em_mha *m = (em_mha *)em_module_new("MultiHeadAttention", dev, sizeof *m);
    if (!m) return NULL;
    m->dim = dim;
    m->heads = heads;
    m->causal = causal;
    m->p_dropout = p_dropout;
    m->c_attn = (em_linear *)em_module_add(
        &m->base, "c_attn",
        (em_module *)em_linear_new(dev, dtype, dim, 3 * dim, bias, weight_in_out, rng));
    if (!m->c_attn) return nn_fail(&m->base);
    m->c_proj = (em_linear *)em_module_add(
        &m->base, "c_proj",
        (em_module *)em_linear_new(dev, dtype, dim, dim, bias, weight_in_out, rng));
    if (!m->c_proj) return nn_fail(&m->base);
    return m;
}

/* [B, T, C] slice `which` (0 q, 1 k, 2 v) of qkv [B, T, 3C] as heads [B, H, T, D] (a view). */
static em_tensor *heads_of(const em_tensor *qkv, int which, int64_t H, int64_t C)
{
    em_shape s = em_shape_of(qkv);
    em_tensor *part = em_narrow(qkv, 2, which * C, C);
    em_tensor *r = em_reshape(part, EM_SHAPE(s.d[0], s.d[1], H, C / H));
    return em_transpose(r, 1, 2);
}

/* Checks the cache against the new keys k [B, H, T, D]. */
static bool check_cache(const em_kv_cache *c, const em_tensor *k)
{
    char b1[96], b2[96];
    em_shape ks = em_shape_of(k), cs = em_shape_of(c->k);
    if (cs.d[0] != ks.d[0] || cs.d[1] != ks.d[1] || cs.d[3] != ks.d[3] ||
        em_dtype(c->k) != em_dtype(k)) {
        em_set_error(EM_ERR_INVALID,
                     "em_mha_forward: cache %s does not match the keys %s [batch, heads, T, "
                     "head_dim]",
                     nn_desc(c->k, b1, sizeof b1), nn_desc(k, b2, sizeof b2));
        return false;
    }
    if (c->len < 0 || c->len + ks.d[2] > c->max_len) {
        em_set_error(
            EM_ERR_INVALID,
            "em_mha_forward: the cache holds %lld of %lld positions, no room for %lld more",
            (long long)c->len, (long long)c->max_len, (long long)ks.d[2]);
        return false;
    }
    return true;
}

/* Appends k, v at cache->len (no-grad) and returns views of positions [0, len + T) in *ka, *va. */
static bool cache_append(em_kv_cache *c, const em_tensor *k, const em_tensor *v, em_tensor **ka,
                         em_tensor **va)
{
    if (!check_cache(c, k)) return false;
    int64_t T = em_dim(k, 2);
    em_no_grad_begin();
    em_tensor *dk = em_narrow(c->k, 2, c->len, T), *dv = em_narrow(c->v, 2, c->len, T);
    bool ok = dk && dv && em_copy_(dk, k) == EM_OK && em_copy_(dv, v) == EM_OK;
    em_no_grad_end();
    em_release(dk);
    em_release(dv);
    if (!ok) return false;
    *ka = em_narrow(c->k, 2, 0, c->len + T);
    *va = em_narrow(c->v, 2, 0, c->len + T);
    c->len += T;
    return *ka && *va;
}

/* The bool mask of disallowed scores, broadcastable to [B, H, T, Tk], or NULL when none (then
 * *none is set). Query t sits at position start + t. */
static em_tensor *score_mask(em_device *dev, bool causal, const em_tensor *pad_mask, int64_t start,
                             int64_t T, int64_t Tk, bool *none)
{
    em_tensor *m = NULL;
    *none = false;
    if (causal && T > 1) { /* one query at the end sees every key */
        em_tensor *rows = em_reshape(em_arange(dev, EM_I64, (double)start, (double)(start + T), 1),
                                     EM_SHAPE(T, 1));
        em_tensor *cols = em_arange(dev, EM_I64, 0, (double)Tk, 1);
        m = em_gt(cols, rows); /* key after query: [T, Tk] */
        if (!m) return NULL;
    }
    if (pad_mask) {
        int64_t B = em_dim(pad_mask, 0);
        em_tensor *pad = em_reshape(em_logical_not(pad_mask), EM_SHAPE(B, 1, 1, Tk));
        m = m ? em_logical_or(m, pad) : pad;
        if (!m) return NULL;
    }
    if (!m) *none = true;
    return m;
}

static bool check_pad(const em_tensor *pad_mask, int64_t B, int64_t Tk)
{
    if (!pad_mask) return true;
    em_shape s = em_shape_of(pad_mask);
    if (em_dtype(pad_mask) != EM_BOOL || s.rank != 2 || s.d[0] != B || s.d[1] != Tk) {
        char b[96];
        em_set_error(EM_ERR_INVALID,
                     "em_mha_forward: pad_mask must be bool[%lld, %lld] (batch, keys), got %s",
                     (long long)B, (long long)Tk, nn_desc(pad_mask, b, sizeof b));
        return false;
    }
    return true;
}

em_tensor *em_mha_forward(em_mha *m, const em_tensor *x, const em_tensor *pad_mask,
                          em_kv_cache *cache, em_rng *rng)
{
    if (!m || !x) return NULL;
    const char *op = "em_mha_forward";
    em_scalar xdt = em_dtype(x);
    bool fl = xdt == EM_F32 || xdt == EM_F64 || xdt == EM_F16 || xdt == EM_BF16;
    if (!fl || em_rank(x) != 3 || em_dim(x, 2) != m->dim) {
        char b[96];
        em_set_error(EM_ERR_INVALID, "%s: expected a float x of shape [B, T, %lld], got %s", op,
                     (long long)m->dim, nn_desc(x, b, sizeof b));
        return NULL;
    }
    int64_t B = em_dim(x, 0), T = em_dim(x, 1), C = m->dim, H = m->heads, D = C / H;
    int64_t start = cache ? cache->len : 0;
    if (!check_pad(pad_mask, B, start + T)) return NULL;
    bool train = m->base.training && m->p_dropout > 0;
    if (train && !rng) {
        em_set_error(EM_ERR_INVALID, "%s: NULL generator with dropout in training mode", op);
        return NULL;
    }

    em_scope_begin();
    em_tensor *y = NULL;
    em_tensor *qkv = em_linear_forward(m->c_attn, x);
    if (!qkv) goto done;
    if (!cache && T > 1 && !pad_mask && !train && em_attention_qkv_fast(qkv, H)) {
        /* the fused op on the packed projection: no copies of q, k, v, the output or their
         * gradients (ops_attention_qkv.c); the same values as the op on the heads below */
        y = em_linear_forward(m->c_proj, em_take(em_attention_qkv(qkv, H, m->causal, 1.0 / sqrt((double)D))));
        goto done;
    }
    em_tensor *q = heads_of(qkv, 0, H, C), *k = heads_of(qkv, 1, H, C), *v = heads_of(qkv, 2, H, C);
    if (!q || !k || !v) goto done;
    if (cache && !cache_append(cache, k, v, &k, &v)) goto done;
    int64_t Tk = em_dim(k, 2);

    em_tensor *o; /* [B, H, T, D] */
    if (T > 1 && !pad_mask && !train && em_attention_fast(q)) {
        /* the fused op: the same result (no row is fully masked: query t sees the keys up to
         * start + t = t + Tk - T, the op's causal alignment), no [T, Tk] scores kept. One query
         * (decoding) keeps the composed path: its scores are one row, and the fused kernels'
         * cube per 64 queries of a head would leave most of a GPU idle. Without the op's
         * matrix-op kernels (em_attention_fast) matmuls and a softmax are faster: on the CPU
         * the SIMT kernels made the tiny preset's training step about 25% slower. */
        o = em_attention(q, k, v, m->causal, 1.0 / sqrt((double)D));
    } else {
        em_tensor *att =
            em_mul_scalar(em_take(em_matmul(q, em_transpose(k, 2, 3))), 1.0 / sqrt((double)D));
        bool none;
        em_tensor *mask = score_mask(m->base.dev, m->causal, pad_mask, start, T, Tk, &none);
        if (!mask && !none) goto done;
        if (mask) att = em_masked_fill(em_take(att), mask, em_scalar_lowest(em_dtype(att)));
        att = em_softmax(em_take(att), -1);
        if (train) att = em_dropout(em_take(att), m->p_dropout, true, rng);
        o = em_matmul(att, v);
    }
    o = em_reshape(em_transpose(em_take(o), 1, 2), EM_SHAPE(B, T, C)); /* heads merged */
    y = em_linear_forward(m->c_proj, o);
    if (train) y = em_dropout(em_take(y), m->p_dropout, true, rng);
done:
    em_scope_end(&y, 1);
    if (!y) em_error_context("%s", op);
    return y;
}
