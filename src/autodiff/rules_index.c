/* rules_index.c — backward rules of the indexing ops. Indices get no gradient. index_select
 * (along other dims than 0) and gather add g into zeros of the input's shape at the indexed places
 * (scatter_add, so repeated indices accumulate); embedding's table and index_select along dim 0
 * (how em_embedding picks rows) get em_embedding_backward (tensor_grad.h: the rows of g summed per
 * index, without scatter_add's search over every index for every element); scatter
 * passes g to the target except at the overwritten places, scatter_add passes all of g to it;
 * both give src the gathered g. */
#include "ember/tensor_grad.h"
#include "autodiff/rules_util.h"

/* index [n] of index_select along dim, shaped and expanded to `shape` (g's) for scatter_add. */
static em_tensor *spread_index(const em_tensor *index, int dim, em_shape shape)
{
    em_shape s = shape;
    for (int i = 0; i < s.rank; i++) s.d[i] = i == dim ? shape.d[dim] : 1;
    return em_contiguous(em_expand(em_reshape(index, s), shape));
}

/* zeros of the input's shape, g added at index along dim. */
static em_tensor *add_into_zeros(const ad_ctx *c, const em_tensor *g, int dim,
                                 const em_tensor *index)
{
    em_tensor *z = em_zeros(em_tensor_device(g), em_dtype(g), c->in_shape[0]);
    return em_scatter_add(z, dim, index, em_contiguous(g));
}

static em_status bw_index_select(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    int dim = (int)c->p->k;
    if (dim < 0) dim += c->in_shape[0].rank;
    if (c->needs[0] && dim == 0) { /* rows picked (em_embedding): summed per index */
        em_shape in = c->in_shape[0];
        int64_t n = em_numel(c->in[1]), rest = ru_numel(in) / (in.d[0] ? in.d[0] : 1);
        em_tensor *rows = em_embedding_backward(em_reshape(g, EM_SHAPE(n, rest)), c->in[1], in.d[0]);
        r[0] = rows ? em_reshape(rows, in) : NULL;
    } else if (c->needs[0]) {
        r[0] = add_into_zeros(c, g, dim, spread_index(c->in[1], dim, em_shape_of(g)));
    }
    return ru_end(c, r, gin, 2, 2u);
}

static em_status bw_gather(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    if (c->needs[0]) r[0] = add_into_zeros(c, g, (int)c->p->k, c->in[1]);
    return ru_end(c, r, gin, 2, 2u);
}

/* weight [V, D], ids [...] -> out [..., D]: rows of g added at ids. */
static em_status bw_embedding(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    if (c->needs[0]) r[0] = em_embedding_backward(g, c->in[1], c->in_shape[0].d[0]);
    return ru_end(c, r, gin, 2, 2u);
}

/* scatter(t, dim, index, src): t's gradient is g with the written places zeroed; src's is g
 * gathered at index (src may be larger than index: the rest of src gets zeros). */
static em_tensor *src_grad(const ad_ctx *c, const em_tensor *g)
{
    int dim = (int)c->p->k;
    em_tensor *part = em_gather(g, dim, c->in[1]);
    em_shape ps = em_shape_of(c->in[1]), ss = c->in_shape[2];
    bool same = true;
    for (int i = 0; i < ss.rank; i++) same = same && ps.d[i] == ss.d[i];
    if (same) return part;
    int64_t pads[2 * EM_MAX_RANK] = {0};
    for (int i = 0; i < ss.rank; i++) pads[2 * (ss.rank - 1 - i) + 1] = ss.d[i] - ps.d[i];
    return em_pad(part, pads, 2 * ss.rank, 0.0);
}

static em_status scatter_rule(const ad_ctx *c, const em_tensor *g, em_tensor **gin, bool add)
{
    em_tensor *r[3];
    ru_begin(r, 3);
    if (c->needs[0]) {
        if (add) {
            r[0] = (em_tensor *)g;
        } else {
            em_tensor *z = em_zeros(em_tensor_device(g), em_dtype(g), em_shape_of(c->in[1]));
            r[0] = em_scatter(g, (int)c->p->k, c->in[1], z);
        }
    }
    if (c->needs[2]) r[2] = src_grad(c, g);
    return ru_end(c, r, gin, 3, 2u);
}

static em_status bw_scatter(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    return scatter_rule(c, g, gin, false);
}

static em_status bw_scatter_add(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    return scatter_rule(c, g, gin, true);
}

void ad_rules_index(ad_rule *t)
{
    t[EM_TOP_INDEX_SELECT] = (ad_rule){bw_index_select, 2u, false};
    t[EM_TOP_GATHER] = (ad_rule){bw_gather, 2u, false};
    t[EM_TOP_SCATTER] = (ad_rule){bw_scatter, 2u, false};
    t[EM_TOP_SCATTER_ADD] = (ad_rule){bw_scatter_add, 2u, false};
    t[EM_TOP_EMBEDDING] = (ad_rule){bw_embedding, 2u, false};
}
