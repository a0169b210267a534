/* rules_elementwise.c — backward rules of the elementwise ops: unary math and activations, the
 * scalar variants, casts, the broadcasting binary ops (gradients summed back to each input's
 * shape here), where and masked_fill. Conventions (PyTorch's): abs'(0) = 0, relu'(0) = 0, clamp
 * passes the gradient where lo <= x <= hi, maximum/minimum split ties half/half, sign / floor /
 * ceil / round have zero gradient, pow(a, b)'s d/db is out * ln(a) (NaN for a < 0, 0 where a == 0
 * and b >= 0), remainder's d/db is -floor(a / b). */
#include <math.h>

#include "autodiff/rules_util.h"
#include "ember/tensor_grad.h"

#define X(c) ((c)->in[0])

/* ---- unary ----------------------------------------------------------------------------------- */

/* Every unary rule has the shape gin[0] = g * d(x), d built from the saved x / out. */
typedef em_tensor *(*unary_deriv)(const ad_ctx *c, const em_tensor *g);

static em_status unary(const ad_ctx *c, const em_tensor *g, em_tensor **gin, unary_deriv f)
{
    em_tensor *r[1];
    ru_begin(r, 1);
    if (c->needs[0]) r[0] = f(c, g);
    return ru_end(c, r, gin, 1, 0);
}

#define UNARY_RULE(name, expr)                                                                     \
    static em_tensor *d_##name(const ad_ctx *c, const em_tensor *g)                                \
    {                                                                                              \
        (void)c;                                                                                   \
        return (expr);                                                                             \
    }                                                                                              \
    static em_status bw_##name(const ad_ctx *c, const em_tensor *g, em_tensor **gin)               \
    {                                                                                              \
        return unary(c, g, gin, d_##name);                                                         \
    }

#define OUT(c) ((c)->out)
#define SQ(t) em_mul((t), (t))

UNARY_RULE(neg, em_neg(g))
UNARY_RULE(abs, em_mul(g, em_sign(X(c))))
UNARY_RULE(exp, em_mul(g, OUT(c)))
UNARY_RULE(ln, em_div(g, X(c)))
UNARY_RULE(log1p, em_div(g, em_add_scalar(X(c), 1.0)))
UNARY_RULE(expm1, em_mul(g, em_add_scalar(OUT(c), 1.0)))
UNARY_RULE(sqrt, em_div(em_mul_scalar(g, 0.5), OUT(c)))
UNARY_RULE(rsqrt, em_mul(em_mul_scalar(g, -0.5), em_mul(OUT(c), SQ(OUT(c)))))
UNARY_RULE(reciprocal, em_mul(em_neg(g), SQ(OUT(c))))
UNARY_RULE(sin, em_mul(g, em_cos(X(c))))
UNARY_RULE(cos, em_neg(em_mul(g, em_sin(X(c)))))
UNARY_RULE(tanh, em_mul(g, em_rsub_scalar(SQ(OUT(c)), 1.0)))
/* erf'(x) = 2 / sqrt(pi) * exp(-x^2) */
UNARY_RULE(erf, em_mul(g, em_mul_scalar(em_exp(em_neg(SQ(X(c)))), 1.1283791670955126)))
UNARY_RULE(sigmoid, em_mul(g, em_mul(OUT(c), em_rsub_scalar(OUT(c), 1.0))))
UNARY_RULE(relu, ru_keep(g, em_gt_scalar(X(c), 0.0)))
/* softplus'(x) = sigmoid(x) */
UNARY_RULE(softplus, em_mul(g, em_sigmoid(X(c))))
UNARY_RULE(add_scalar, (em_tensor *)g)
UNARY_RULE(rsub_scalar, em_neg(g))
UNARY_RULE(mul_scalar, em_mul_scalar(g, c->p->f[0]))
UNARY_RULE(div_scalar, em_div_scalar(g, c->p->f[0]))
/* d(s / x) = -s / x^2 */
UNARY_RULE(rdiv_scalar, em_div(em_mul_scalar(g, -c->p->f[0]), SQ(X(c))))
/* The gradient flows to the input's dtype: the tape casts it. */
UNARY_RULE(cast, (em_tensor *)g)

/* gelu and gelu_tanh: g times the derivative, one op (em_gelu_backward). */
static em_tensor *d_gelu(const ad_ctx *c, const em_tensor *g)
{
    return em_gelu_backward(ad_take_out_grad(c, g), X(c), false);
}
static em_tensor *d_gelu_tanh(const ad_ctx *c, const em_tensor *g)
{
    return em_gelu_backward(ad_take_out_grad(c, g), X(c), true);
}

/* silu(x) = x s(x): s (1 + x (1 - s)) */
static em_tensor *d_silu(const ad_ctx *c, const em_tensor *g)
{
    const em_tensor *x = X(c);
    em_tensor *s = em_sigmoid(x);
    return em_mul(g, em_mul(s, em_add_scalar(em_mul(x, em_rsub_scalar(s, 1.0)), 1.0)));
}

/* Passed where lo <= x <= hi. */
static em_tensor *d_clamp(const ad_ctx *c, const em_tensor *g)
{
    const em_tensor *x = X(c);
    em_tensor *out = em_logical_or(em_lt_scalar(x, c->p->f[0]), em_gt_scalar(x, c->p->f[1]));
    return ru_drop(g, out);
}

/* p x^(p-1); zero for p == 0. */
static em_tensor *d_pow_scalar(const ad_ctx *c, const em_tensor *g)
{
    double p = c->p->f[0];
    if (p == 0) return em_mul_scalar(g, 0.0);
    return em_mul(em_mul_scalar(g, p), em_pow_scalar(X(c), p - 1.0));
}

/* g where gt, g / 2 where eq, 0 elsewhere: the gradient of max/min with ties split. */
static em_tensor *tie_split(const em_tensor *g, const em_tensor *gt, const em_tensor *eq)
{
    em_tensor *half = ru_keep(em_mul_scalar(g, 0.5), eq);
    return em_where(gt, g, half);
}

static em_tensor *d_maximum_scalar(const ad_ctx *c, const em_tensor *g)
{
    return tie_split(g, em_gt_scalar(X(c), c->p->f[0]), em_eq_scalar(X(c), c->p->f[0]));
}

static em_tensor *d_minimum_scalar(const ad_ctx *c, const em_tensor *g)
{
    return tie_split(g, em_lt_scalar(X(c), c->p->f[0]), em_eq_scalar(X(c), c->p->f[0]));
}

#define UNARY_FN(name)                                                                             \
    static em_status bw_##name(const ad_ctx *c, const em_tensor *g, em_tensor **gin)               \
    {                                                                                              \
        return unary(c, g, gin, d_##name);                                                         \
    }
UNARY_FN(gelu)
UNARY_FN(gelu_tanh)
UNARY_FN(silu)
UNARY_FN(clamp)
UNARY_FN(pow_scalar)
UNARY_FN(maximum_scalar)
UNARY_FN(minimum_scalar)

/* sign, floor, ceil, round: the gradient is zero (NULL). */
static em_status bw_zero(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    (void)g;
    for (int i = 0; i < c->nin; i++) gin[i] = NULL;
    return EM_OK;
}

/* ---- binary (broadcasting) ------------------------------------------------------------------- */

#define A(c) ((c)->in[0])
#define B(c) ((c)->in[1])

/* r (of the broadcast shape) summed to input i's shape (borrowed): written into the input's
 * gradient destination (ad_grad_dest) when it has one and the sum is over leading dims only (a
 * bias's gradient, into the optimizer's slot), else as ad_sum_to makes it. */
static em_tensor *sum_to_input(const ad_ctx *c, int i, em_tensor *r, bool add)
{
    em_tensor *d = ad_grad_dest(c, i);
    em_shape rs = r ? em_shape_of(r) : (em_shape){0};
    int lead = rs.rank - c->in_shape[i].rank;
    bool cols = d && r && lead > 0;
    for (int k = 0; cols && k < c->in_shape[i].rank; k++)
        cols = rs.d[lead + k] == c->in_shape[i].d[k];
    if (!cols) return ru_sum_to(r, c->in_shape[i]);
    /* an add's bias beside a matmul's result: the sums go with that matmul's weight gradient */
    if (add && ad_defer_colsum(c, i, 1 - i, r)) return d;
    return em_sum_leading_into(d, r) == EM_OK ? d : NULL;
}

/* Finishes a binary rule: sums r[0], r[1] (of the broadcast shape) to the inputs' shapes (add:
 * the rule is an add's, whose bias's sums may go with a matmul's product: sum_to_input). */
static em_status binary_end_as(const ad_ctx *c, em_tensor **r, em_tensor **gin, bool add)
{
    for (int i = 0; i < 2; i++)
        if (c->needs[i] && r[i]) r[i] = sum_to_input(c, i, r[i], add);
    return ru_end(c, r, gin, 2, 0);
}

static em_status binary_end(const ad_ctx *c, em_tensor **r, em_tensor **gin)
{
    return binary_end_as(c, r, gin, false);
}

static em_status bw_add(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    r[0] = r[1] = (em_tensor *)g;
    return binary_end_as(c, r, gin, true);
}

static em_status bw_sub(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    r[0] = (em_tensor *)g;
    if (c->needs[1]) r[1] = em_neg(g);
    return binary_end(c, r, gin);
}

static em_status bw_mul(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    if (c->needs[0]) r[0] = em_mul(g, B(c));
    if (c->needs[1]) r[1] = em_mul(g, A(c));
    return binary_end(c, r, gin);
}

/* d(a/b)/da = 1/b, d(a/b)/db = -a / b^2 */
static em_status bw_div(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    em_tensor *ga = em_div(g, B(c));
    if (c->needs[0]) r[0] = ga;
    if (c->needs[1]) r[1] = em_neg(em_div(em_mul(ga, A(c)), B(c)));
    return binary_end(c, r, gin);
}

/* d/da = b a^(b-1) (0 where b == 0); d/db = a^b ln(a) (0 where a == 0 and b >= 0). */
static em_status bw_pow(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    const em_tensor *a = A(c), *b = B(c);
    if (c->needs[0]) {
        em_tensor *d = em_mul(b, em_pow(a, em_sub_scalar(b, 1.0)));
        r[0] = ru_drop(em_mul(g, d), em_eq_scalar(b, 0.0));
    }
    if (c->needs[1]) {
        em_tensor *d = em_mul(c->out, em_ln(a));
        em_tensor *zero =
            em_logical_and(em_eq_scalar(a, 0.0), em_logical_not(em_lt_scalar(b, 0.0)));
        r[1] = ru_drop(em_mul(g, d), zero);
    }
    return binary_end(c, r, gin);
}

static em_status bw_maximum(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    em_tensor *eq = em_eq(A(c), B(c));
    if (c->needs[0]) r[0] = tie_split(g, em_gt(A(c), B(c)), eq);
    if (c->needs[1]) r[1] = tie_split(g, em_lt(A(c), B(c)), eq);
    return binary_end(c, r, gin);
}

static em_status bw_minimum(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    em_tensor *eq = em_eq(A(c), B(c));
    if (c->needs[0]) r[0] = tie_split(g, em_lt(A(c), B(c)), eq);
    if (c->needs[1]) r[1] = tie_split(g, em_gt(A(c), B(c)), eq);
    return binary_end(c, r, gin);
}

/* a - b * floor(a / b): d/da = 1, d/db = -floor(a / b) */
static em_status bw_remainder(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    r[0] = (em_tensor *)g;
    if (c->needs[1]) r[1] = em_neg(em_mul(g, em_floor(em_div(A(c), B(c)))));
    return binary_end(c, r, gin);
}

/* ---- where, masked_fill ---------------------------------------------------------------------- */

static em_status bw_where(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[3];
    ru_begin(r, 3);
    const em_tensor *cond = c->in[0];
    if (c->needs[1]) r[1] = ru_sum_to(ru_keep(g, cond), c->in_shape[1]);
    if (c->needs[2]) r[2] = ru_sum_to(ru_drop(g, cond), c->in_shape[2]);
    return ru_end(c, r, gin, 3, 1u); /* cond gets no gradient */
}

static em_status bw_masked_fill(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    em_tensor *r[2];
    ru_begin(r, 2);
    if (c->needs[0]) r[0] = ru_sum_to(ru_drop(g, c->in[1]), c->in_shape[0]);
    return ru_end(c, r, gin, 2, 2u); /* the mask gets no gradient */
}

/* ---- the table ------------------------------------------------------------------------------- */

#define SAVE_X 1u
#define SAVE_AB 3u

void ad_rules_elementwise(ad_rule *t)
{
    t[EM_TOP_NEG] = (ad_rule){bw_neg, 0, false};
    t[EM_TOP_ABS] = (ad_rule){bw_abs, SAVE_X, false};
    t[EM_TOP_SIGN] = (ad_rule){bw_zero, 0, false};
    t[EM_TOP_EXP] = (ad_rule){bw_exp, 0, true};
    t[EM_TOP_LN] = (ad_rule){bw_ln, SAVE_X, false};
    t[EM_TOP_LOG1P] = (ad_rule){bw_log1p, SAVE_X, false};
    t[EM_TOP_EXPM1] = (ad_rule){bw_expm1, 0, true};
    t[EM_TOP_SQRT] = (ad_rule){bw_sqrt, 0, true};
    t[EM_TOP_RSQRT] = (ad_rule){bw_rsqrt, 0, true};
    t[EM_TOP_RECIPROCAL] = (ad_rule){bw_reciprocal, 0, true};
    t[EM_TOP_SIN] = (ad_rule){bw_sin, SAVE_X, false};
    t[EM_TOP_COS] = (ad_rule){bw_cos, SAVE_X, false};
    t[EM_TOP_TANH] = (ad_rule){bw_tanh, 0, true};
    t[EM_TOP_ERF] = (ad_rule){bw_erf, SAVE_X, false};
    t[EM_TOP_SIGMOID] = (ad_rule){bw_sigmoid, 0, true};
    t[EM_TOP_RELU] = (ad_rule){bw_relu, SAVE_X, false};
    t[EM_TOP_GELU] = (ad_rule){bw_gelu, SAVE_X, false};
    t[EM_TOP_GELU_TANH] = (ad_rule){bw_gelu_tanh, SAVE_X, false};
    t[EM_TOP_SILU] = (ad_rule){bw_silu, SAVE_X, false};
    t[EM_TOP_SOFTPLUS] = (ad_rule){bw_softplus, SAVE_X, false};
    t[EM_TOP_FLOOR] = (ad_rule){bw_zero, 0, false};
    t[EM_TOP_CEIL] = (ad_rule){bw_zero, 0, false};
    t[EM_TOP_ROUND] = (ad_rule){bw_zero, 0, false};
    t[EM_TOP_CLAMP] = (ad_rule){bw_clamp, SAVE_X, false};
    t[EM_TOP_POW_SCALAR] = (ad_rule){bw_pow_scalar, SAVE_X, false};
    t[EM_TOP_ADD_SCALAR] = (ad_rule){bw_add_scalar, 0, false};
    t[EM_TOP_MUL_SCALAR] = (ad_rule){bw_mul_scalar, 0, false};
    t[EM_TOP_DIV_SCALAR] = (ad_rule){bw_div_scalar, 0, false};
    t[EM_TOP_RSUB_SCALAR] = (ad_rule){bw_rsub_scalar, 0, false};
    t[EM_TOP_RDIV_SCALAR] = (ad_rule){bw_rdiv_scalar, SAVE_X, false};
    t[EM_TOP_MAXIMUM_SCALAR] = (ad_rule){bw_maximum_scalar, SAVE_X, false};
    t[EM_TOP_MINIMUM_SCALAR] = (ad_rule){bw_minimum_scalar, SAVE_X, false};
    t[EM_TOP_CAST] = (ad_rule){bw_cast, 0, false};
    t[EM_TOP_ADD] = (ad_rule){bw_add, 0, false};
    t[EM_TOP_SUB] = (ad_rule){bw_sub, 0, false};
    t[EM_TOP_MUL] = (ad_rule){bw_mul, SAVE_AB, false};
    t[EM_TOP_DIV] = (ad_rule){bw_div, SAVE_AB, false};
    t[EM_TOP_POW] = (ad_rule){bw_pow, SAVE_AB, true};
    t[EM_TOP_MAXIMUM] = (ad_rule){bw_maximum, SAVE_AB, false};
    t[EM_TOP_MINIMUM] = (ad_rule){bw_minimum, SAVE_AB, false};
    t[EM_TOP_REMAINDER] = (ad_rule){bw_remainder, SAVE_AB, false};
    t[EM_TOP_WHERE] = (ad_rule){bw_where, 1u, false};
    t[EM_TOP_MASKED_FILL] = (ad_rule){bw_masked_fill, 2u, false};
}
