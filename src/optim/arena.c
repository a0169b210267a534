/* arena.c — the optimizer's flat storage (em_optimizer_flatten, docs/optim.md "Flat storage").
 *
 * Every parameter is moved into one buffer (tn_rebase: the parameter stays the same tensor, now
 * a view), the parameters in the weight-decay group first; the two Adam moments, the mirrors
 * (the trainer's bf16 weights) and a gradient slot per parameter sit at the same offsets in
 * buffers of their own. Each parameter's offset is a multiple of the grain (flat_grain), and the
 * gaps stay zero in every buffer (a zero gradient, moment and weight is left zero by the update),
 * so one launch can cover a whole region:
 *
 *   gradient norm   one optim_sumsq over every slot (instead of one per parameter)
 *   clip rescale    one optim_scale_dev over every slot
 *   AdamW           one optim_adam(_dev) over the decay group, one over the rest
 *
 * GPT-2 124M has 148 parameter tensors: a step goes from about 3 x 148 launches to 4.
 *
 * The slots hold the step's gradients either because the caller wrote them there and said so
 * (em_optimizer_grads_written: the trainer's bf16 gradients, cast as they are copied) or because
 * every parameter has a gradient (em_grad) and op_arena_gather copied it in; in that case, where
 * the slot's dtype is the parameter's, the slot becomes the parameter's gradient, so that a clip
 * is seen through em_grad. Anything else (a parameter without a gradient, state replaced by a
 * checkpoint or by the op-by-op update) takes the per-parameter path, or is copied back in. */
#include <stdlib.h>
#include <string.h>

#include "ember/autodiff.h"
#include "optim/internal.h"
#include "tensor/internal.h"

/* The fewest elements between parameter offsets: a multiple of any line. */
#define ALIGN 256
#define MAX_ELEMS 0x7fffffffLL /* as fused.c: the kernels index with u32 */

struct op_arena {
    em_tensor *param, *grad, *mirror; /* [total] each (mirror NULL: the parameters have none) */
    em_tensor *state[OP_MAX_STATE];   /* [total] each, the compute dtype */
    em_tensor **slot;                 /* per parameter: its gradient slot (a view of grad) */
    em_tensor **mview;                /* per parameter: its mirror as moved (to check it is kept) */
    int64_t *off;                     /* per parameter: its offset */
    int64_t ndecay, total;            /* the decay group is [0, ndecay), the rest [ndecay, total) */
    int64_t grain;                    /* elements between parameter offsets (flat_grain) */
    bool written;                     /* the caller wrote every slot (em_optimizer_grads_written) */
};

void op_arena_free(op_arena *a, int n)
{
    if (!a) return;
    em_release(a->param);
    em_release(a->grad);
    em_release(a->mirror);
    for (int k = 0; k < OP_MAX_STATE; k++) em_release(a->state[k]);
    for (int i = 0; a->slot && i < n; i++) em_release(a->slot[i]);
    for (int i = 0; a->mview && i < n; i++) em_release(a->mview[i]);
    free(a->slot);
    free(a->mview);
    free(a->off);
    free(a);
}

/* A view of whole (1-D) at off with shape s (contiguous), untracked; NULL with the error set. */
static em_tensor *view_at(const em_tensor *whole, int64_t off, em_shape s)
{
    int64_t stride[EM_MAX_RANK];
    tn_contig_strides(s.rank, s.d, stride);
    em_tensor *v = tn_view(whole, s.rank, s.d, stride, off);
    em_tensor_untrack(v);
    return v;
}

/* The region [lo, hi) of whole as a 1-D view (scope-owned). */
static em_tensor *region(const em_tensor *whole, int64_t lo, int64_t hi)
{
    int64_t n = hi - lo, one = 1;
    return tn_view(whole, 1, &n, &one, lo);
}

static em_tensor *persistent_zeros(em_device *dev, em_scalar dt, int64_t n)
{
    em_tensor *z = em_zeros(dev, dt, EM_SHAPE(n));
    if (z) em_tensor_untrack(z);
    if (z && em_realize(z) != EM_OK) {
        em_release(z);
        return NULL;
    }
    return z;
}

int64_t op_flat_grain(size_t elem, uint64_t align)
{
    /* the least multiple of ALIGN elements whose bytes are a multiple of align: lcm(ALIGN *
     * elem, align) bytes */
    uint64_t x = (uint64_t)ALIGN * elem, y = align > 1 ? align : 1;
    while (y) {
        uint64_t r = x % y;
        x = y, y = r;
    }
    return align > 1 ? (int64_t)((uint64_t)ALIGN * (align / x)) : ALIGN;
}

/* o's grain: op_flat_grain of the narrowest of its buffers' dtypes (the parameters', the
 * state's, the mirrors', the slots') and its device's buffer_align. */
static int64_t flat_grain(const em_optimizer *o, em_scalar grad_dtype)
{
    const em_tensor *p0 = o->ps[0].t;
    size_t es = em_scalar_size(em_dtype(p0));
    size_t sizes[3] = {em_scalar_size(grad_dtype), em_scalar_size(op_compute_type(p0)),
                       o->ps[0].mirror ? em_scalar_size(em_dtype(o->ps[0].mirror)) : es};
    for (int i = 0; i < 3; i++) es = sizes[i] < es ? sizes[i] : es;
    const em_caps *c = em_device_caps(em_tensor_device(p0));
    return op_flat_grain(es, c ? c->buffer_align : 0);
}

/* Why o cannot be flattened (the error set), or EM_OK: Adam's fused update, one device, one
 * parameter dtype, contiguous parameters, mirrors on all or none (one dtype), a size the kernels
 * index. *total gets the buffers' length with parameters `grain` elements apart. */
static em_status check_flat(em_optimizer *o, int64_t grain, int64_t *total)
{
    if (o->fused != op_adam_fused)
        return em_set_error(EM_ERR_UNSUPPORTED, "flatten: %s has no fused update (Adam has)",
                            o->kind);
    if (o->n == 0) return em_set_error(EM_ERR_UNSUPPORTED, "flatten: no parameters");
    const em_tensor *p0 = o->ps[0].t, *q0 = o->ps[0].mirror;
    *total = 0;
    for (int i = 0; i < o->n; i++) {
        const op_param *p = &o->ps[i];
        char d[128];
        if (em_tensor_device(p->t) != em_tensor_device(p0) || em_dtype(p->t) != em_dtype(p0) ||
            !em_is_contiguous(p->t))
            return em_set_error(EM_ERR_UNSUPPORTED,
                                "flatten: parameter %s (%s) is not contiguous, or not of the "
                                "first parameter's dtype and device",
                                p->name, em_describe(p->t, d, sizeof d));
        if (!p->mirror != !q0 ||
            (q0 && (em_dtype(p->mirror) != em_dtype(q0) || !em_is_contiguous(p->mirror))))
            return em_set_error(EM_ERR_UNSUPPORTED,
                                "flatten: the mirrors differ (parameter %s), or one is strided",
                                p->name);
        *total += (em_numel(p->t) + grain - 1) / grain * grain;
    }
    if (*total > MAX_ELEMS)
        return em_set_error(EM_ERR_UNSUPPORTED, "flatten: %lld elements are too many",
                            (long long)*total);
    return EM_OK;
}

/* Lays out the offsets (decay group first) and allocates the buffers. */
static em_status layout(em_optimizer *o, op_arena *a, em_scalar grad_dtype)
{
    int64_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < o->n; i++) {
            if (o->ps[i].decay != (pass == 0)) continue;
            a->off[i] = at;
            at += (em_numel(o->ps[i].t) + a->grain - 1) / a->grain * a->grain;
        }
        if (pass == 0) a->ndecay = at;
    }
    em_device *dev = em_tensor_device(o->ps[0].t);
    em_scalar ct = op_compute_type(o->ps[0].t);
    if (!(a->param = persistent_zeros(dev, em_dtype(o->ps[0].t), a->total)) ||
        !(a->grad = persistent_zeros(dev, grad_dtype, a->total)))
        return em_last_status();
    for (int k = 0; k < o->nstate; k++)
        if (!(a->state[k] = persistent_zeros(dev, ct, a->total))) return em_last_status();
    if (o->ps[0].mirror &&
        !(a->mirror = persistent_zeros(dev, em_dtype(o->ps[0].mirror), a->total)))
        return em_last_status();
    return EM_OK;
}

/* Moves parameter i (its value, mirror and state) into a; makes its gradient slot. */
static em_status move_in(em_optimizer *o, op_arena *a, int i)
{
    op_param *p = &o->ps[i];
    em_shape s = em_shape_of(p->t);
    em_scope_begin();
    em_status st = tn_rebase(p->t, region(a->param, a->off[i], a->off[i] + em_numel(p->t)));
    if (st == EM_OK && p->mirror) {
        st = tn_rebase(p->mirror, region(a->mirror, a->off[i], a->off[i] + em_numel(p->t)));
        a->mview[i] = st == EM_OK ? em_retain(p->mirror) : NULL;
    }
    em_scope_end(NULL, 0);
    if (st == EM_OK && !(a->slot[i] = view_at(a->grad, a->off[i], s))) st = em_last_status();
    for (int k = 0; st == EM_OK && k < o->nstate; k++) {
        em_tensor *v = view_at(a->state[k], a->off[i], s);
        if (!v) return em_last_status();
        if (p->state[k]) st = em_copy_(v, p->state[k]); /* a loaded or earlier state */
        if (st == EM_OK)
            op_set_state(p, k, v);
        else
            em_release(v);
    }
    return st == EM_OK ? EM_OK : em_error_context("parameter %s", p->name);
}

em_status em_optimizer_flatten(em_optimizer *o, em_scalar grad_dtype)
{
    if (!o) return em_set_error(EM_ERR_INVALID, "optimizer_flatten: NULL optimizer");
    if (o->arena) return EM_OK;
    if (!em_scalar_is_float(grad_dtype))
        return em_set_error(EM_ERR_INVALID, "optimizer_flatten: gradient dtype %s is not a float",
                            em_scalar_name(grad_dtype));
    int64_t total = 0, grain = o->n > 0 ? flat_grain(o, grad_dtype) : ALIGN;
    em_status st = check_flat(o, grain, &total);
    if (st != EM_OK) return em_error_context("optimizer_flatten");
    op_arena *a = calloc(1, sizeof *a);
    if (a) {
        a->slot = calloc((size_t)o->n, sizeof *a->slot);
        a->mview = calloc((size_t)o->n, sizeof *a->mview);
        a->off = calloc((size_t)o->n, sizeof *a->off);
    }
    if (!a || !a->slot || !a->mview || !a->off) {
        op_arena_free(a, o->n);
        return em_set_error(EM_ERR_NOMEM, "optimizer_flatten: out of memory");
    }
    a->total = total;
    a->grain = grain;
    em_no_grad_begin();
    st = layout(o, a, grad_dtype);
    for (int i = 0; st == EM_OK && i < o->n; i++) st = move_in(o, a, i);
    em_no_grad_end();
    if (st != EM_OK) {
        /* the parameters moved so far stay valid where they are (their views hold the buffer) */
        op_arena_free(a, o->n);
        return em_error_context("optimizer_flatten");
    }
    o->arena = a;
    return EM_OK;
}

em_tensor *em_optimizer_grad_slot(em_optimizer *o, const em_tensor *param)
{
    for (int i = 0; o && o->arena && i < o->n; i++)
        if (o->ps[i].t == param) return o->arena->slot[i];
    return NULL;
}

em_status em_optimizer_grads_written(em_optimizer *o)
{
    if (!o || !o->arena)
        return em_set_error(EM_ERR_INVALID, "optimizer_grads_written: %s",
                            o ? "the optimizer is not flattened" : "NULL optimizer");
    o->arena->written = true;
    return EM_OK;
}

void op_arena_forget_grads(em_optimizer *o)
{
    if (o->arena) o->arena->written = false;
}

bool op_arena_holds(const em_optimizer *o, const em_tensor *s)
{
    for (int k = 0; o->arena && k < o->nstate; k++)
        if (s->st == o->arena->state[k]->st) return true;
    return false;
}

em_status op_arena_gather(em_optimizer *o, em_tensor **grads)
{
    op_arena *a = o->arena;
    *grads = NULL;
    if (!a) return EM_OK;
    if (a->written) {
        *grads = a->grad;
        return EM_OK;
    }
    for (int i = 0; i < o->n; i++)
        if (!em_grad(o->ps[i].t)) return EM_OK; /* the per-parameter path skips it */
    em_status st = EM_OK;
    for (int i = 0; st == EM_OK && i < o->n; i++) {
        em_tensor *g = em_grad(o->ps[i].t);
        if (g == a->slot[i]) continue; /* gathered before, or written there (em_set_grad_into) */
        if (em_dtype(a->slot[i]) == em_dtype(o->ps[i].t)) {
            /* the slot becomes the gradient: the old one is donated to the copy, so a weight's
             * gradient whose matmul has not run yet runs straight into the slot */
            em_tensor *own = em_retain(g);
            em_zero_grad(o->ps[i].t);
            st = em_copy_(a->slot[i], em_take(own));
            if (st == EM_OK) st = em_set_grad(o->ps[i].t, a->slot[i]);
        } else {
            st = em_copy_(a->slot[i], g);
        }
        if (st != EM_OK) em_error_context("parameter %s", o->ps[i].name);
    }
    if (st == EM_OK) *grads = a->grad;
    return st;
}

/* Copies back into the flat state any state that left it (a checkpoint's, the op-by-op
 * update's); false where a parameter's mirror is no longer the one moved in. */
static em_status adopt_state(em_optimizer *o, bool *mirrors)
{
    op_arena *a = o->arena;
    em_status st = EM_OK;
    *mirrors = a->mirror != NULL;
    for (int i = 0; st == EM_OK && i < o->n; i++) {
        op_param *p = &o->ps[i];
        if (p->mirror != a->mview[i]) *mirrors = false;
        for (int k = 0; st == EM_OK && k < o->nstate; k++) {
            if (p->state[k] && op_arena_holds(o, p->state[k])) continue;
            em_tensor *v = view_at(a->state[k], a->off[i], em_shape_of(p->t));
            if (!v) return em_last_status();
            st = p->state[k] ? em_copy_(v, p->state[k]) : EM_OK; /* none yet: zeros */
            if (st == EM_OK)
                op_set_state(p, k, v);
            else
                em_release(v);
        }
    }
    return st;
}

em_status op_arena_step(em_optimizer *o, int64_t t, bool *ran)
{
    *ran = false;
    em_tensor *grads;
    bool mirrors;
    em_status st = op_arena_gather(o, &grads);
    if (st != EM_OK || !grads) return st;
    op_arena *a = o->arena;
    if ((st = adopt_state(o, &mirrors)) != EM_OK) return st;
    for (int part = 0; part < 2 && st == EM_OK; part++) {
        int64_t lo = part ? a->ndecay : 0, hi = part ? a->total : a->ndecay;
        if (hi == lo) continue;
        em_tensor *w = region(a->param, lo, hi), *g = region(grads, lo, hi);
        em_tensor *m = region(a->state[0], lo, hi), *v = region(a->state[1], lo, hi);
        em_tensor *q = mirrors ? region(a->mirror, lo, hi) : NULL;
        if (!w || !g || !m || !v || (mirrors && !q)) return em_last_status();
        st = op_adam_launch(o, w, g, m, v, q, hi - lo, part == 0, t);
    }
    for (int i = 0; st == EM_OK && i < o->n; i++) o->ps[i].mirror_written = mirrors;
    if (st == EM_OK) *ran = true;
    return st;
}

bool op_arena_narrow(const em_optimizer *o)
{
    const op_arena *a = o->arena;
    return a && a->written && !o->dscal && em_dtype(a->grad) != em_dtype(o->ps[0].t);
}

em_status op_arena_settle(em_optimizer *o)
{
    if (!o->clip_deferred || o->dscal || !o->arena) return EM_OK;
    o->clip_deferred = false;
    em_scope_begin();
    em_tensor *g = o->arena->grad, *s = em_mul_scalar(g, o->host_coef);
    em_status st = s ? em_copy_(g, s) : em_last_status();
    em_scope_end(NULL, 0);
    return st;
}
