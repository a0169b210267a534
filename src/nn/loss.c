/* loss.c — losses composed from tensor ops (so autodiff differentiates them): cross-entropy from
 * log_softmax + gather with ignore_index and label smoothing as PyTorch defines them, mean
 * squared error, and binary cross-entropy on logits in its numerically stable form with
 * PyTorch's pos_weight. Reductions: mean, sum or none (per element). */
#include <math.h>

#include "nn/internal.h"

static bool is_float(em_scalar dt)
{
    return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16;
}

static bool check_reduction(const char *op, em_reduction r)
{
    if (r == EM_REDUCE_MEAN || r == EM_REDUCE_SUM || r == EM_REDUCE_NONE) return true;
    em_set_error(EM_ERR_INVALID, "%s: unknown reduction %d", op, (int)r);
    return false;
}

static bool same_shape(const em_tensor *a, const em_tensor *b)
{
    em_shape x = em_shape_of(a), y = em_shape_of(b);
    if (x.rank != y.rank) return false;
    for (int i = 0; i < x.rank; i++)
        if (x.d[i] != y.d[i]) return false;
    return true;
}

/* Applies the reduction to per-element losses (sum / mean over every element). */
static em_tensor *reduce(const em_tensor *l, em_reduction r)
{
    switch (r) {
    case EM_REDUCE_SUM:
        return em_sum(l, NULL, 0, false);
    case EM_REDUCE_MEAN:
        return em_mean(l, NULL, 0, false);
    default:
        return em_reshape(l, em_shape_of(l));
    }
}

em_tensor *em_cross_entropy(const em_tensor *logits, const em_tensor *targets, int64_t ignore_index,
                            double label_smoothing, em_reduction reduction)
{
    const char *op = "em_cross_entropy";
    if (!logits || !targets) return NULL;
    if (!check_reduction(op, reduction)) return NULL;
    char b1[96], b2[96];
    em_shape ls = em_shape_of(logits), ts = em_shape_of(targets);
    bool shape_ok = ls.rank >= 1 && ts.rank == ls.rank - 1;
    for (int i = 0; shape_ok && i < ts.rank; i++) shape_ok = ts.d[i] == ls.d[i];
    em_scalar tdt = em_dtype(targets);
    if (!is_float(em_dtype(logits)) || (tdt != EM_I32 && tdt != EM_I64) || !shape_ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: logits %s and targets %s do not match (expected float logits [..., C] "
                     "and i32/i64 targets [...])",
                     op, nn_desc(logits, b1, sizeof b1), nn_desc(targets, b2, sizeof b2));
        return NULL;
    }
    if (!(label_smoothing >= 0 && label_smoothing < 1)) {
        em_set_error(EM_ERR_INVALID, "%s: label_smoothing must be in [0, 1), got %g", op,
                     label_smoothing);
        return NULL;
    }
    em_scope_begin();
    /* the fused classifier over rows: [..., C] as [N, C], the targets as [N] */
    int64_t valid = 0;
    em_tensor *rows = em_cross_entropy_rows(em_reshape(logits, EM_SHAPE(-1, ls.d[ls.rank - 1])),
                                            em_reshape(targets, EM_SHAPE(-1)), ignore_index,
                                            label_smoothing, &valid);
    em_tensor *loss = rows ? em_reshape(rows, ts) : NULL; /* per element, 0 where ignored */
    em_tensor *out = NULL;
    if (reduction == EM_REDUCE_MEAN) /* over the rows not ignored: NaN when there are none */
        out = em_mul_scalar(em_take(em_sum(loss, NULL, 0, false)),
                            valid ? 1.0 / (double)valid : NAN);
    else
        out = reduce(loss, reduction);
    em_scope_end(&out, 1);
    if (!out) em_error_context("%s", op);
    return out;
}

em_tensor *em_mse_loss(const em_tensor *pred, const em_tensor *target, em_reduction reduction)
{
    const char *op = "em_mse_loss";
    if (!pred || !target) return NULL;
    if (!check_reduction(op, reduction)) return NULL;
    if (!is_float(em_dtype(pred)) || !same_shape(pred, target)) {
        char b1[96], b2[96];
        em_set_error(EM_ERR_INVALID, "%s: pred %s and target %s must be float tensors of one shape",
                     op, nn_desc(pred, b1, sizeof b1), nn_desc(target, b2, sizeof b2));
        return NULL;
    }
    em_scope_begin();
    em_tensor *d = em_sub(pred, target);
    em_tensor *out = reduce(em_mul(d, d), reduction);
    em_scope_end(&out, 1);
    if (!out) em_error_context("%s", op);
    return out;
}

em_tensor *em_bce_with_logits(const em_tensor *logits, const em_tensor *target,
                              const em_tensor *pos_weight, em_reduction reduction)
{
    const char *op = "em_bce_with_logits";
    if (!logits || !target) return NULL;
    if (!check_reduction(op, reduction)) return NULL;
    char b1[96], b2[96];
    if (!is_float(em_dtype(logits)) || !same_shape(logits, target)) {
        em_set_error(EM_ERR_INVALID,
                     "%s: logits %s and target %s must be float tensors of one shape", op,
                     nn_desc(logits, b1, sizeof b1), nn_desc(target, b2, sizeof b2));
        return NULL;
    }
    em_scope_begin();
    const em_tensor *x = logits, *y = target;
    /* log(1 + exp(-|x|)) + max(-x, 0) = -log sigmoid(x), without overflow for any x. */
    em_tensor *sp = em_add(em_take(em_log1p(em_take(em_exp(em_take(em_neg(em_take(em_abs(x)))))))),
                           em_take(em_relu(em_take(em_neg(x)))));
    em_tensor *l;
    if (pos_weight) {
        /* PyTorch: (1 - y) x + (1 + (pw - 1) y) (-log sigmoid(x)) */
        em_tensor *lw = em_add_scalar(em_take(em_mul(em_take(em_sub_scalar(pos_weight, 1)), y)), 1);
        l = em_add(em_take(em_mul(em_take(em_rsub_scalar(y, 1)), x)), em_take(em_mul(lw, sp)));
        if (l && !same_shape(l, logits)) {
            em_set_error(EM_ERR_INVALID, "pos_weight %s does not broadcast to logits %s",
                         nn_desc(pos_weight, b1, sizeof b1), nn_desc(logits, b2, sizeof b2));
            l = NULL;
        }
    } else {
        l = em_add(em_take(em_mul(em_take(em_rsub_scalar(y, 1)), x)), sp);
    }
    em_tensor *out = l ? reduce(l, reduction) : NULL;
    em_scope_end(&out, 1);
    if (!out) em_error_context("%s", op);
    return out;
}
