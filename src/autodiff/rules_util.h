/* rules_util.h — small helpers the backward rules of rules_*.c share: the scope a rule computes in
 * (ru_begin / ru_end), a 0-d tensor of a gradient's dtype, masking by a bool tensor, padding along
 * one dim, ad_sum_to inside a scope. Header-only (static inline). The tensor helpers are used
 * inside a rule's scope: what they return belongs to that scope (or is one of their arguments),
 * never an extra reference; NULL (with the error set) on failure or for a NULL input. */
#ifndef EM_AUTODIFF_RULES_UTIL_H
#define EM_AUTODIFF_RULES_UTIL_H

#include "autodiff/internal.h"

/* A 0-d tensor holding v, with t's dtype and device. */
static inline em_tensor *ru_scalar_like(const em_tensor *t, double v)
{
    return t ? em_scalar_tensor(em_tensor_device(t), em_dtype(t), v) : NULL;
}

/* g where mask holds, 0 elsewhere (mask broadcasts with g). */
static inline em_tensor *ru_keep(const em_tensor *g, const em_tensor *mask)
{
    if (!g || !mask) return NULL;
    em_tensor *z = ru_scalar_like(g, 0);
    em_tensor *r = em_where(mask, g, z);
    em_release(z);
    return r;
}

/* g where mask does not hold, 0 elsewhere. */
static inline em_tensor *ru_drop(const em_tensor *g, const em_tensor *mask)
{
    if (!g || !mask) return NULL;
    em_tensor *z = ru_scalar_like(g, 0);
    em_tensor *r = em_where(mask, z, g);
    em_release(z);
    return r;
}

/* Zero padding of `before` and `after` elements along dim (0 <= dim < rank). */
static inline em_tensor *ru_pad_dim(const em_tensor *t, int dim, int64_t before, int64_t after)
{
    if (!t) return NULL;
    if (before == 0 && after == 0) return (em_tensor *)t;
    int rank = em_rank(t);
    int64_t pads[2 * EM_MAX_RANK] = {0};
    int j = rank - 1 - dim; /* em_pad counts dims from the last */
    pads[2 * j] = before;
    pads[2 * j + 1] = after;
    return em_pad(t, pads, 2 * (j + 1), 0.0);
}

/* The number of elements of shape. */
static inline int64_t ru_numel(em_shape s)
{
    int64_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= s.d[i];
    return n;
}

/* Rules compute inside a scope (ru_begin) where every tensor is borrowed: ops' results belong to
 * the scope, saved inputs and g to the tape. ru_end turns the wanted results r[0..n) into new
 * references in gin and closes the scope. A wanted result left NULL fails the rule (the failing
 * op's error is kept; the tape names the rule's op) unless bit i of may_be_zero says NULL is a zero
 * gradient there. */
static inline void ru_begin(em_tensor **r, int n)
{
    for (int i = 0; i < n; i++) r[i] = NULL;
    em_scope_begin();
}

static inline em_status ru_end(const ad_ctx *c, em_tensor *const *r, em_tensor **gin, int n,
                               unsigned may_be_zero)
{
    em_status st = EM_OK;
    for (int i = 0; i < n && st == EM_OK; i++)
        if (c->needs[i] && !r[i] && !(may_be_zero >> i & 1u)) {
            st = em_last_status();
            if (st == EM_OK) st = em_set_error(EM_ERR_INTERNAL, "no gradient for input %d", i);
        }
    for (int i = 0; i < n; i++) gin[i] = st == EM_OK && c->needs[i] ? em_retain(r[i]) : NULL;
    em_scope_end(NULL, 0);
    return st;
}

/* A rule with one input: its gradient computed by f inside a scope (RU_ONE_RULE(name) defines
 * bw_name from d_name). */
typedef em_tensor *(*ru_grad_fn)(const ad_ctx *c, const em_tensor *g);

static inline em_status ru_one(const ad_ctx *c, const em_tensor *g, em_tensor **gin, ru_grad_fn f)
{
    em_tensor *r[1];
    ru_begin(r, 1);
    if (c->needs[0]) r[0] = f(c, g);
    return ru_end(c, r, gin, 1, 0);
}

#define RU_ONE_RULE(name)                                                                          \
    static em_status bw_##name(const ad_ctx *c, const em_tensor *g, em_tensor **gin)               \
    {                                                                                              \
        return ru_one(c, g, gin, d_##name);                                                        \
    }

/* ad_sum_to for use inside a scope: the result is borrowed (a retained t is given back). */
static inline em_tensor *ru_sum_to(em_tensor *t, em_shape shape)
{
    em_tensor *s = ad_sum_to(t, shape);
    if (s && s == t) em_release(s);
    return s;
}

#endif
