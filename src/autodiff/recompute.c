/* recompute.c — what a node keeps for its backward rule (ad_saved): a held, detached alias of a
 * tensor, or under EM_RECOMPUTE_ELEMENTWISE a recipe (op, params, inputs) from which the tensor
 * is recomputed when a rule needs it. Recomputation replays the same public op on the same
 * inputs under no-grad, so it gives the same bits as the forward pass did; a reshape or permute
 * of such a tensor is replayed as the same view of the recomputed tensor. Also the tape stats'
 * byte counting of held tensors. */
#include <stdlib.h>

#include "autodiff/tape.h"

ad_saved *ad_saved_hold(const em_tensor *t)
{
    ad_saved *s = calloc(1, sizeof *s);
    if (!s) {
        em_set_error(EM_ERR_NOMEM, "autodiff: out of host memory");
        return NULL;
    }
    s->t = em_tensor_alias(t);
    if (!s->t) {
        free(s);
        return NULL;
    }
    atomic_init(&s->refs, 1);
    s->dtype = em_dtype(t);
    s->bytes = em_numel(t) * (int64_t)em_scalar_size(em_dtype(t));
    ad_stats_bytes(s->bytes);
    return s;
}

ad_saved *ad_saved_retain(ad_saved *s)
{
    if (s) atomic_fetch_add(&s->refs, 1);
    return s;
}

void ad_saved_release(ad_saved *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    if (s->t) {
        ad_stats_bytes(-s->bytes);
        em_release(s->t);
    }
    for (int i = 0; i < s->nin; i++) ad_saved_release(s->in[i]);
    free(s);
}

em_tensor *ad_saved_get(const ad_saved *s)
{
    if (!s) return NULL;
    if (s->t) return em_retain(s->t);
    em_tensor *in[EM_TOP_MAX_INPUTS] = {NULL};
    em_tensor *out = NULL;
    for (int i = 0; i < s->nin; i++) {
        if (s->in[i] && !(in[i] = ad_saved_get(s->in[i]))) goto done;
    }
    em_no_grad_begin();
    if (s->op == EM_TOP_RESHAPE) {
        out = em_reshape(in[0], s->shape);
    } else if (s->op == EM_TOP_PERMUTE) {
        int perm[EM_MAX_RANK];
        for (int d = 0; d < s->p.ni && d < EM_MAX_RANK; d++) perm[d] = (int)s->p.i[d];
        out = em_permute(in[0], perm, s->p.ni);
    } else {
        out = ad_replay(s->op, &s->p, (const em_tensor *const *)in, s->nin, s->dtype);
    }
    em_no_grad_end();
    if (out) em_tensor_untrack(out);
done:
    for (int i = 0; i < s->nin; i++) em_release(in[i]);
    return out;
}

/* Adds are kept, not recomputed: a residual stream's add would hold both operands for a result
 * of the size of one, and an add kept is free to take a pending matmul over (its bias or
 * residual in the matmul's epilogue: the recorder keeps neither input, docs/fusion.md). */
bool ad_recomputable(em_tensor_op op)
{
    if (op == EM_TOP_ADD) return false;
    return (op >= EM_TOP_NEG && op <= EM_TOP_MASKED_FILL) || op == EM_TOP_SOFTMAX ||
           op == EM_TOP_LOG_SOFTMAX || op == EM_TOP_LAYER_NORM || op == EM_TOP_RMS_NORM;
}

typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef em_tensor *(*scalar_fn)(const em_tensor *, double);
typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);

em_tensor *ad_replay(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
                     em_scalar out_dtype)
{
    static const unary_fn unary[EM_TOP_COUNT] = {
        [EM_TOP_NEG] = em_neg,         [EM_TOP_ABS] = em_abs,
        [EM_TOP_SIGN] = em_sign,       [EM_TOP_EXP] = em_exp,
        [EM_TOP_LN] = em_ln,           [EM_TOP_LOG1P] = em_log1p,
        [EM_TOP_EXPM1] = em_expm1,     [EM_TOP_SQRT] = em_sqrt,
        [EM_TOP_RSQRT] = em_rsqrt,     [EM_TOP_RECIPROCAL] = em_reciprocal,
        [EM_TOP_SIN] = em_sin,         [EM_TOP_COS] = em_cos,
        [EM_TOP_TANH] = em_tanh,       [EM_TOP_ERF] = em_erf,
        [EM_TOP_SIGMOID] = em_sigmoid, [EM_TOP_RELU] = em_relu,
        [EM_TOP_GELU] = em_gelu,       [EM_TOP_GELU_TANH] = em_gelu_tanh,
        [EM_TOP_SILU] = em_silu,       [EM_TOP_SOFTPLUS] = em_softplus,
        [EM_TOP_FLOOR] = em_floor,     [EM_TOP_CEIL] = em_ceil,
        [EM_TOP_ROUND] = em_round,
    };
    static const scalar_fn scalar[EM_TOP_COUNT] = {
        [EM_TOP_POW_SCALAR] = em_pow_scalar,         [EM_TOP_ADD_SCALAR] = em_add_scalar,
        [EM_TOP_MUL_SCALAR] = em_mul_scalar,         [EM_TOP_DIV_SCALAR] = em_div_scalar,
        [EM_TOP_RSUB_SCALAR] = em_rsub_scalar,       [EM_TOP_RDIV_SCALAR] = em_rdiv_scalar,
        [EM_TOP_MAXIMUM_SCALAR] = em_maximum_scalar, [EM_TOP_MINIMUM_SCALAR] = em_minimum_scalar,
    };
    static const binary_fn binary[EM_TOP_COUNT] = {
        [EM_TOP_ADD] = em_add,         [EM_TOP_SUB] = em_sub,
        [EM_TOP_MUL] = em_mul,         [EM_TOP_DIV] = em_div,
        [EM_TOP_POW] = em_pow,         [EM_TOP_MAXIMUM] = em_maximum,
        [EM_TOP_MINIMUM] = em_minimum, [EM_TOP_REMAINDER] = em_remainder,
    };
    if ((int)op <= EM_TOP_NONE || (int)op >= EM_TOP_COUNT || nin < 1) goto bad;
    if (unary[op]) return unary[op](in[0]);
    if (scalar[op]) return scalar[op](in[0], p->f[0]);
    if (binary[op] && nin >= 2) return binary[op](in[0], in[1]);
    switch (op) {
    case EM_TOP_CLAMP:
        return em_clamp(in[0], p->f[0], p->f[1]);
    case EM_TOP_CAST:
        return em_cast(in[0], out_dtype);
    case EM_TOP_WHERE:
        return nin >= 3 ? em_where(in[0], in[1], in[2]) : NULL;
    case EM_TOP_MASKED_FILL:
        return nin >= 2 ? em_masked_fill(in[0], in[1], p->f[0]) : NULL;
    case EM_TOP_SOFTMAX:
        return em_softmax(in[0], (int)p->k);
    case EM_TOP_LOG_SOFTMAX:
        return em_log_softmax(in[0], (int)p->k);
    case EM_TOP_LAYER_NORM:
        return em_layer_norm(in[0], (int)p->k, nin > 1 ? in[1] : NULL, nin > 2 ? in[2] : NULL,
                             p->f[0]);
    case EM_TOP_RMS_NORM:
        return em_rms_norm(in[0], (int)p->k, nin > 1 ? in[1] : NULL, p->f[0]);
    default:
        break;
    }
bad:
    em_set_error(EM_ERR_INTERNAL, "autodiff: cannot recompute the output of %s", em_top_name(op));
    return NULL;
}
