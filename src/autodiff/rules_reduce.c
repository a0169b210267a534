/* rules_reduce.c — backward rules of the reductions (sum, mean, prod, max, min, logsumexp, var,
 * std), cumsum, softmax / log_softmax and the norms (layer_norm, rms_norm). A reduction's g is
 * first given back its reduced dims (size 1) and then broadcasts against the input. max/min split
 * the gradient evenly among tied maxima (PyTorch's amax); prod is exact at zeros (the product of
 * the other elements where exactly one is zero, 0 where more are); the norms' gradients are
 * em_norm_backward's, which recomputes mean and 1/std from the saved input. */
#include "autodiff/rules_util.h"
#include "ember/tensor_grad.h"

/* The reduced dims of c (all of them when the op recorded none) into dims; returns how many. */
static int reduced_dims(const ad_ctx *c, int *dims)
{
    int rank = c->in_shape[0].rank;
    if (c->p->ni == 0) {
        for (int i = 0; i < rank; i++) dims[i] = i;
        return rank;
    }
    for (int i = 0; i < c->p->ni; i++) dims[i] = (int)c->p->i[i];
    return c->p->ni;
}

/* t (of the reduction's output shape) with the reduced dims back as size 1 (a view). */
static em_tensor *unreduce(const ad_ctx *c, const em_tensor *t)
{
    if (!t) return NULL;
    if (c->p->flag) return (em_tensor *)t;
    em_shape s = c->in_shape[0];
    int dims[EM_MAX_RANK];
    int nd = reduced_dims(c, dims);
    for (int i = 0; i < nd; i++) s.d[dims[i]] = 1;
    return em_reshape(t, s);
}

/* The number of elements each output of the reduction summarizes. */
static int64_t reduced_count(const ad_ctx *c)
{
    int dims[EM_MAX_RANK];
    int nd = reduced_dims(c, dims);
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= c->in_shape[0].d[dims[i]];
    return n;
}

#define X(c) ((c)->in[0])

#define RULE(name) RU_ONE_RULE(name)

static em_tensor *d_sum(const ad_ctx *c, const em_tensor *g)
{
    return em_expand(unreduce(c, g), c->in_shape[0]);
}

static em_tensor *d_mean(const ad_ctx *c, const em_tensor *g)
{
    double n = (double)reduced_count(c);
    return em_expand(em_div_scalar(unreduce(c, g), n), c->in_shape[0]);
}

/* With z zeros among the reduced elements and P the product of the non-zero ones:
 * z == 0: P / x; z == 1: P at the zero, 0 elsewhere; z > 1: 0. */
static em_tensor *d_prod(const ad_ctx *c, const em_tensor *g)
{
    const em_tensor *x = X(c);
    int dims[EM_MAX_RANK];
    int nd = reduced_dims(c, dims);
    em_tensor *is0 = em_eq_scalar(x, 0.0);
    em_tensor *one_t = ru_scalar_like(x, 1.0);
    em_tensor *x1 = em_where(is0, one_t, x);
    em_tensor *p = em_prod(x1, dims, nd, true);
    em_tensor *z = em_sum(is0, dims, nd, true); /* i64 */
    em_tensor *no_zero = em_eq_scalar(z, 0.0);
    em_tensor *one_zero = em_logical_and(em_eq_scalar(z, 1.0), is0);
    em_tensor *d =
        em_where(no_zero, em_div(p, x1), ru_keep(em_expand(p, c->in_shape[0]), one_zero));
    return em_mul(unreduce(c, g), d);
}

/* The gradient goes to the elements equal to the result, split evenly among them. */
static em_tensor *d_extreme(const ad_ctx *c, const em_tensor *g)
{
    const em_tensor *x = X(c);
    int dims[EM_MAX_RANK];
    int nd = reduced_dims(c, dims);
    em_tensor *hit = em_eq(x, unreduce(c, c->out));
    em_tensor *count = em_sum(hit, dims, nd, true);
    em_tensor *share = em_div(unreduce(c, g), count);
    return ru_keep(em_expand(share, c->in_shape[0]), hit);
}

static em_tensor *d_logsumexp(const ad_ctx *c, const em_tensor *g)
{
    em_tensor *w = em_exp(em_sub(X(c), unreduce(c, c->out)));
    return em_mul(unreduce(c, g), w);
}

/* var = sum((x - mean)^2) / (n - correction): 2 (x - mean) / (n - correction) */
static em_tensor *d_var(const ad_ctx *c, const em_tensor *g)
{
    int dims[EM_MAX_RANK];
    int nd = reduced_dims(c, dims);
    double den = (double)(reduced_count(c) - c->p->k);
    em_tensor *xc = em_sub(X(c), em_mean(X(c), dims, nd, true));
    return em_mul(em_mul_scalar(unreduce(c, g), 2.0 / den), xc);
}

/* std = sqrt(var): (x - mean) / ((n - correction) std) */
static em_tensor *d_std(const ad_ctx *c, const em_tensor *g)
{
    int dims[EM_MAX_RANK];
    int nd = reduced_dims(c, dims);
    double den = (double)(reduced_count(c) - c->p->k);
    em_tensor *xc = em_sub(X(c), em_mean(X(c), dims, nd, true));
    em_tensor *s = em_div(em_div_scalar(unreduce(c, g), den), unreduce(c, c->out));
    return em_mul(s, xc);
}

/* The reverse cumulative sum: flip, cumsum, flip. */
static em_tensor *d_cumsum(const ad_ctx *c, const em_tensor *g)
{
    if (c->in_shape[0].rank == 0) return (em_tensor *)g;
    int dim = (int)c->p->k;
    return em_flip(em_cumsum(em_flip(g, &dim, 1), dim), &dim, 1);
}

/* y (g - sum(g y)) */
static em_tensor *d_softmax(const ad_ctx *c, const em_tensor *g)
{
    if (c->in_shape[0].rank == 0) return em_mul_scalar(g, 0.0);
    int dim = (int)c->p->k;
    const em_tensor *y = c->out;
    return em_mul(y, em_sub(g, em_sum(em_mul(g, y), &dim, 1, true)));
}

/* g - exp(y) sum(g) */
static em_tensor *d_log_softmax(const ad_ctx *c, const em_tensor *g)
{
    if (c->in_shape[0].rank == 0) return em_mul_scalar(g, 0.0);
    int dim = (int)c->p->k;
    return em_sub(g, em_mul(em_exp(c->out), em_sum(g, &dim, 1, true)));
}

RULE(sum)
RULE(mean)
RULE(prod)
RULE(extreme)
RULE(logsumexp)
RULE(var)
RULE(std)
RULE(cumsum)
RULE(softmax)
RULE(log_softmax)

/* ---- norms ------------------------------------------------------------------------------------
 */

/* layer_norm and rms_norm: em_norm_backward (tensor_grad.h) computes the three gradients in one
 * pass over the rows where it can (its formulas are in ops_norm_backward.c), adding what x has
 * received from its other consumers to x's. */
static em_status norm(const ad_ctx *c, const em_tensor *g, em_tensor **gin, bool rms)
{
    int n = rms ? 2 : 3;
    const em_tensor *w = c->in_present[1] ? c->in[1] : NULL;
    em_tensor *r[3] = {NULL, NULL, NULL};
    /* x's gradient so far (a residual connection's) is added in the same pass */
    em_tensor *resid = ad_take_grad(c, 0);
    /* the weight's and bias's sums go straight into their gradient destinations where they have
     * them (ad_grad_dest: the optimizer's slots) */
    em_status st = em_norm_backward_into(
        g, c->in[0], (int)c->p->k, w, c->p->f[0], rms, resid, c->needs[0] ? &r[0] : NULL,
        n > 1 && c->needs[1] ? &r[1] : NULL, n > 2 && c->needs[2] ? &r[2] : NULL,
        n > 1 ? ad_grad_dest(c, 1) : NULL, n > 2 ? ad_grad_dest(c, 2) : NULL);
    em_release(resid);
    for (int i = 0; i < n; i++) gin[i] = st == EM_OK && c->needs[i] ? r[i] : NULL;
    return st;
}

static em_status bw_layer_norm(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    return norm(c, g, gin, false);
}

static em_status bw_rms_norm(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    return norm(c, g, gin, true);
}

void ad_rules_reduce(ad_rule *t)
{
    t[EM_TOP_SUM] = (ad_rule){bw_sum, 0, false};
    t[EM_TOP_MEAN] = (ad_rule){bw_mean, 0, false};
    t[EM_TOP_PROD] = (ad_rule){bw_prod, 1u, false};
    t[EM_TOP_MAX] = (ad_rule){bw_extreme, 1u, true};
    t[EM_TOP_MIN] = (ad_rule){bw_extreme, 1u, true};
    t[EM_TOP_LOGSUMEXP] = (ad_rule){bw_logsumexp, 1u, true};
    t[EM_TOP_VAR] = (ad_rule){bw_var, 1u, false};
    t[EM_TOP_STD] = (ad_rule){bw_std, 1u, true};
    t[EM_TOP_CUMSUM] = (ad_rule){bw_cumsum, 0, false};
    t[EM_TOP_SOFTMAX] = (ad_rule){bw_softmax, 0, true};
    t[EM_TOP_LOG_SOFTMAX] = (ad_rule){bw_log_softmax, 0, true};
    t[EM_TOP_LAYER_NORM] = (ad_rule){bw_layer_norm, 3u, false};
    t[EM_TOP_RMS_NORM] = (ad_rule){bw_rms_norm, 3u, false};
}
