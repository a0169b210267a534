/* rules_layout.c — backward rules of the layout ops and matmul: reshape back, the inverse
 * permutation, expand -> sum over the broadcast dims, slice and select -> the gradient padded
 * with zeros into the input's place, flip, cat -> slices of the gradient, tril / triu, pad -> the
 * unpadded slice, and matmul (batch broadcasting and torch.matmul's 1-D promotions). */
#include "autodiff/rules_util.h"

#define RULE(name) RU_ONE_RULE(name)

static em_tensor *d_reshape(const ad_ctx *c, const em_tensor *g)
{
    return em_reshape(g, c->in_shape[0]);
}

static em_tensor *d_permute(const ad_ctx *c, const em_tensor *g)
{
    int inv[EM_MAX_RANK];
    int n = c->p->ni;
    for (int i = 0; i < n; i++) inv[c->p->i[i]] = i;
    return em_permute(g, inv, n);
}

static em_tensor *d_expand(const ad_ctx *c, const em_tensor *g)
{
    return ru_sum_to((em_tensor *)g, c->in_shape[0]);
}

/* The slice start:end:step of dim: g's elements are spread step apart (zeros between, through a
 * new dim of size step), then padded with zeros to the input's size. */
static em_tensor *d_slice(const ad_ctx *c, const em_tensor *g)
{
    int dim = (int)c->p->k;
    int64_t start = c->p->i[0], step = c->p->i[2] > 0 ? c->p->i[2] : 1;
    int64_t size = c->in_shape[0].d[dim], len = c->out_shape.d[dim];
    if (len == 0) return em_zeros(em_tensor_device(g), em_dtype(g), c->in_shape[0]);
    em_tensor *t = (em_tensor *)g;
    if (step > 1) {
        em_shape s = c->out_shape, s2 = c->out_shape;
        for (int i = s.rank; i > dim + 1; i--) s.d[i] = s.d[i - 1];
        s.d[dim + 1] = 1;
        s.rank++;
        t = ru_pad_dim(em_reshape(t, s), dim + 1, 0, step - 1); /* [.., len, step, ..] */
        s2.d[dim] = len * step;
        t = em_slice(em_reshape(t, s2), dim, 0, (len - 1) * step + 1, 1);
    }
    int64_t span = (len - 1) * step + 1;
    return ru_pad_dim(t, dim, start, size - start - span);
}

static em_tensor *d_select(const ad_ctx *c, const em_tensor *g)
{
    int dim = (int)c->p->k;
    int64_t index = c->p->i[0], size = c->in_shape[0].d[dim];
    return ru_pad_dim(em_unsqueeze(g, dim), dim, index, size - index - 1);
}

static em_tensor *d_flip(const ad_ctx *c, const em_tensor *g)
{
    int dims[EM_MAX_RANK];
    for (int i = 0; i < c->p->ni; i++) dims[i] = (int)c->p->i[i];
    return em_flip(g, dims, c->p->ni);
}

static em_tensor *d_tril(const ad_ctx *c, const em_tensor *g)
{
    return em_tril(g, c->p->k);
}
static em_tensor *d_triu(const ad_ctx *c, const em_tensor *g)
{
    return em_triu(g, c->p->k);
}

/* pads[2j], pads[2j+1] are before/after of the j-th dim from the last. */
static em_tensor *d_pad(const ad_ctx *c, const em_tensor *g)
{
    em_tensor *t = (em_tensor *)g;
    int rank = c->in_shape[0].rank;
    for (int j = 0; 2 * j + 1 < c->p->ni && t; j++) {
        int dim = rank - 1 - j;
        int64_t before = c->p->i[2 * j];
        if (before != 0 || c->p->i[2 * j + 1] != 0)
            t = em_slice(t, dim, before, before + c->in_shape[0].d[dim], 1);
    }
    return t;
}

RULE(reshape)
RULE(permute)
RULE(expand)
RULE(slice)
RULE(select)
RULE(flip)
RULE(tril)
RULE(triu)
RULE(pad)

/* cat: input i gets its slice of g along the cat dim. */
static em_status bw_cat(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[EM_TOP_MAX_INPUTS];
    ru_begin(r, c->nin);
    int dim = (int)c->p->k;
    int64_t off = 0;
    for (int i = 0; i < c->nin; i++) {
        int64_t n = c->in_shape[i].d[dim];
        if (c->needs[i]) r[i] = em_slice(g, dim, off, off + n, 1);
        off += n;
    }
    return ru_end(c, r, gin, c->nin, 0);
}

/* The product of a shape's batch dims (all but the last two). */
static int64_t shape_batch(em_shape s)
{
    int64_t n = 1;
    for (int d = 0; d < s.rank - 2; d++) n *= s.d[d];
    return n;
}

/* a [.., M, K] @ b [.., K, N]: d a = g b^T, d b = a^T g, each summed over the batch dims its
 * operand was broadcast along. A 1-D a is [1, K] (the M dim dropped from out), a 1-D b [K, 1]. */
static em_status bw_matmul(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    em_shape sa = c->in_shape[0], sb = c->in_shape[1], so = c->out_shape;
    const em_tensor *a = c->in[0], *b = c->in[1];
    bool a1 = sa.rank == 1, b1 = sb.rank == 1;
    if (a1) sa = EM_SHAPE(1, sa.d[0]);
    if (b1) sb = EM_SHAPE(sb.d[0], 1);
    if (b1) so.d[so.rank++] = 1;
    if (a1) {
        so.d[so.rank] = so.d[so.rank - 1];
        so.d[so.rank - 1] = 1;
        so.rank++;
    }
    em_tensor *g2 = em_reshape(g, so);
    if (c->needs[0]) {
        em_tensor *b2 = em_reshape(b, sb);
        em_tensor *ga = ru_sum_to(em_matmul(g2, em_transpose(b2, -1, -2)), sa);
        r[0] = em_reshape(ga, c->in_shape[0]);
    }
    /* a bias's gradient handed on by the add after this product (ad_defer_colsum): g's column
     * sums, taken in the weight gradient's product, which then runs now into the weight's
     * destination where it has one */
    em_tensor *bsum = c->needs[1] && sb.rank == 2 && (sa.rank == 2 || shape_batch(sb) == 1)
                          ? ad_take_colsum(c, g)
                          : NULL;
    if (c->needs[1] && (bsum || (sa.rank > 2 && shape_batch(sb) == 1))) {
        /* b shared by every batch (a Linear's or LM head's weight): fold the batch dims into
         * one K of a single matmul, never the per-batch products [.., K, N] summed after */
        int64_t k = sa.d[sa.rank - 1], n = sb.d[sb.rank - 1];
        em_tensor *af = em_reshape(a, EM_SHAPE(-1, k)), *gf = em_reshape(g2, EM_SHAPE(-1, n));
        em_tensor *at = em_transpose(af, 0, 1), *dest = bsum && !b1 ? ad_grad_dest(c, 1) : NULL;
        if (dest)
            r[1] = em_matmul_sum_b_into(dest, at, gf, bsum) == EM_OK ? dest : NULL;
        else
            r[1] = em_reshape(em_take(bsum ? em_matmul_sum_b(at, gf, bsum) : em_matmul(at, gf)),
                              c->in_shape[1]);
    } else if (c->needs[1]) {
        em_tensor *a2 = em_reshape(a, sa);
        em_tensor *gb = ru_sum_to(em_matmul(em_transpose(a2, -1, -2), g2), sb);
        r[1] = em_reshape(gb, c->in_shape[1]);
    }
    return ru_end(c, r, gin, 2, 0);
}

void ad_rules_layout(ad_rule *t)
{
    t[EM_TOP_RESHAPE] = (ad_rule){bw_reshape, 0, false};
    t[EM_TOP_PERMUTE] = (ad_rule){bw_permute, 0, false};
    t[EM_TOP_EXPAND] = (ad_rule){bw_expand, 0, false};
    t[EM_TOP_SLICE] = (ad_rule){bw_slice, 0, false};
    t[EM_TOP_SELECT] = (ad_rule){bw_select, 0, false};
    t[EM_TOP_FLIP] = (ad_rule){bw_flip, 0, false};
    t[EM_TOP_CAT] = (ad_rule){bw_cat, 0, false};
    t[EM_TOP_TRIL] = (ad_rule){bw_tril, 0, false};
    t[EM_TOP_TRIU] = (ad_rule){bw_triu, 0, false};
    t[EM_TOP_PAD] = (ad_rule){bw_pad, 0, false};
    t[EM_TOP_MATMUL] = (ad_rule){bw_matmul, 3u, false};
}
