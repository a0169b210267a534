/* optimizer.c — what every optimizer shares: the parameter list (from a module tree or a list),
 * the step loop (recording off, a scope per parameter, gradients converted to the compute dtype),
 * learning rate and step count, zeroing gradients, state for checkpoints (visit and load by name),
 * gradient clipping (global L2 norm as torch.nn.utils.clip_grad_norm_, and by value) and gradient
 * scaling for accumulation. The algorithms themselves are in sgd.c and adam.c; the fused kernels
 * the step, the norm and the rescale use where they can run are driven from fused.c.
 *
 * State: created on the first step for every parameter (also those without a gradient then, as
 * zeros), so that a checkpoint always holds the state of every parameter; a tensor of the
 * parameter's compute dtype (f32, or f64 for f64 parameters) on its device, owned by the
 * optimizer and outside any scope. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/tensor_op.h"
#include "optim/internal.h"

/* ---- construction ------------------------------------------------------------------------------
 */

em_optimizer *op_new_params(const char *kind, const em_param_ref *ps, int n)
{
    if (n < 0 || (n > 0 && !ps)) {
        em_set_error(EM_ERR_INVALID, "%s: bad parameter list (%d parameters)", kind, n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const char *name = ps[i].name ? ps[i].name : "(unnamed)";
        if (!ps[i].t) {
            em_set_error(EM_ERR_INVALID, "%s: parameter %d (%s) is NULL", kind, i, name);
            return NULL;
        }
        if (!em_scalar_is_float(em_dtype(ps[i].t)) || !em_is_leaf(ps[i].t)) {
            char d[128];
            em_set_error(EM_ERR_INVALID,
                         "%s: parameter %s (%s) must be a floating-point leaf "
                         "tensor",
                         kind, name, em_describe(ps[i].t, d, sizeof d));
            return NULL;
        }
    }
    em_optimizer *o = calloc(1, sizeof *o);
    if (o) o->ps = calloc((size_t)(n ? n : 1), sizeof *o->ps);
    if (!o || !o->ps) {
        free(o);
        em_set_error(EM_ERR_NOMEM, "%s: out of memory", kind);
        return NULL;
    }
    o->kind = kind;
    for (int i = 0; i < n; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "param%d", i);
        op_param *p = &o->ps[o->n++];
        p->name = strdup(ps[i].name ? ps[i].name : buf);
        p->t = ps[i].t;
        p->decay = ps[i].decay;
        if (!p->name) {
            em_optimizer_free(o);
            em_set_error(EM_ERR_NOMEM, "%s: out of memory", kind);
            return NULL;
        }
    }
    return o;
}

typedef struct refs {
    em_param_ref *items;
    size_t len, cap;
    bool oom;
} refs;

static bool collect(const char *full_name, em_module_entry *e, void *user)
{
    refs *r = user;
    if (!e->is_param) return true;
    /* the names live in the visit's buffers only for the call: copy them */
    em_param_ref p = {strdup(full_name), e->t, e->decay};
    if (!p.name || !EM_VEC_PUSH(r, p)) {
        free((char *)p.name);
        r->oom = true;
        return false;
    }
    return true;
}

em_optimizer *op_new_module(const char *kind, em_module *m)
{
    if (!m) {
        em_set_error(EM_ERR_INVALID, "%s: NULL module", kind);
        return NULL;
    }
    refs r = {0};
    em_module_visit(m, collect, &r);
    em_optimizer *o = NULL;
    if (r.oom)
        em_set_error(EM_ERR_NOMEM, "%s: out of memory", kind);
    else
        o = op_new_params(kind, r.items, (int)r.len);
    for (size_t i = 0; i < r.len; i++) free((char *)r.items[i].name);
    free(r.items);
    return o;
}

void em_optimizer_free(em_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->ps[i].name);
        for (int k = 0; k < OP_MAX_STATE; k++) em_release(o->ps[i].state[k]);
    }
    op_arena_free(o->arena, o->n);
    free(o->ps);
    em_release(o->dscal);
    free(o);
}

/* ---- helpers for the algorithms ---------------------------------------------------------------
 */

em_scalar op_compute_type(const em_tensor *t)
{
    return em_dtype(t) == EM_F64 ? EM_F64 : EM_F32;
}

void op_set_state(op_param *p, int i, em_tensor *v)
{
    em_tensor_untrack(v);
    em_release(p->state[i]);
    p->state[i] = v;
}

em_status op_write_param(op_param *p, const em_tensor *v)
{
    if (!v) return em_last_status();
    const em_tensor *src = v;
    if (em_dtype(v) != em_dtype(p->t)) src = em_cast(v, em_dtype(p->t)); /* scope-owned */
    if (!src) return em_last_status();
    return em_copy_(p->t, src);
}

/* ---- the step ----------------------------------------------------------------------------------
 */

/* Zero state for a parameter that has none yet. */
static em_status init_state(em_optimizer *o, op_param *p)
{
    for (int k = 0; k < o->nstate; k++) {
        if (p->state[k]) continue;
        em_tensor *z = em_zeros(em_tensor_device(p->t), op_compute_type(p->t), em_shape_of(p->t));
        if (!z) return em_last_status();
        op_set_state(p, k, z);
    }
    return EM_OK;
}

/* The mirror of p, when the fused update did not write it: p's value cast to its dtype. */
static em_status write_mirror(op_param *p)
{
    if (!p->mirror || p->mirror_written) return EM_OK;
    em_tensor *c = em_cast(p->t, em_dtype(p->mirror));
    em_status st = c ? em_copy_(p->mirror, c) : em_last_status();
    em_release(c);
    return st;
}

static em_status step_one(em_optimizer *o, op_param *p, int64_t t)
{
    em_tensor *g = em_grad(p->t);
    if (!g) return init_state(o, p);
    p->mirror_written = false;
    if (o->fused) {
        bool ran = false;
        em_status st = o->fused(o, p, g, t, &ran);
        if (st != EM_OK) return st;
        if (ran) return write_mirror(p);
    }
    /* the op-by-op update: the algorithm has no fused kernel (SGD), or the parameter is strided
     * or too large for it (fused.c); a deferred clip's rescale runs first */
    if (o->clip_deferred && o->dscal) {
        em_status st = op_scale_grad_device(o, g, p->name);
        if (st != EM_OK) return st;
    } else if (o->clip_deferred) { /* a host clip's (op_arena_narrow) */
        g = em_mul_scalar(g, o->host_coef);
        if (!g) return em_last_status();
    }
    em_scalar ct = op_compute_type(p->t);
    const em_tensor *gc = em_dtype(g) == ct ? g : em_cast(g, ct);
    if (!gc) return em_last_status();
    em_status st = o->update(o, p, gc, t);
    if (st == EM_OK) st = init_state(o, p); /* in case the update left a slot empty */
    if (st == EM_OK) st = write_mirror(p);
    return st;
}

em_status em_optimizer_set_mirror(em_optimizer *o, const em_tensor *param, em_tensor *mirror)
{
    if (!o || !param) return em_set_error(EM_ERR_INVALID, "optimizer_set_mirror: NULL argument");
    for (int i = 0; i < o->n; i++) {
        op_param *p = &o->ps[i];
        if (p->t != param) continue;
        if (mirror) {
            char a[96], b[96];
            em_shape sp = em_shape_of(param), sm = em_shape_of(mirror);
            bool same = sp.rank == sm.rank && em_scalar_is_float(em_dtype(mirror)) &&
                        em_tensor_device(mirror) == em_tensor_device(param);
            for (int d = 0; same && d < sp.rank; d++) same = sp.d[d] == sm.d[d];
            if (!same)
                return em_set_error(EM_ERR_INVALID,
                                    "optimizer_set_mirror: mirror %s does not match parameter %s "
                                    "%s (expected its shape and device, a float dtype)",
                                    em_describe(mirror, a, sizeof a), p->name,
                                    em_describe(param, b, sizeof b));
        }
        p->mirror = mirror;
        return EM_OK;
    }
    return em_set_error(EM_ERR_NOT_FOUND, "optimizer_set_mirror: not a parameter of this %s",
                        o->kind);
}

em_status em_optimizer_step(em_optimizer *o)
{
    if (!o) return em_set_error(EM_ERR_INVALID, "optimizer_step: NULL optimizer");
    int64_t t = o->steps + 1;
    em_status st = EM_OK;
    em_no_grad_begin();
    bool flat = false;
    if (o->arena) { /* the flat storage: one launch a region (arena.c) */
        em_scope_begin();
        st = op_arena_step(o, t, &flat);
        for (int i = 0; flat && i < o->n && st == EM_OK; i++) st = write_mirror(&o->ps[i]);
        em_scope_end(NULL, 0);
        if (st != EM_OK) em_error_context("%s step", o->kind);
    }
    for (int i = 0; !flat && i < o->n && st == EM_OK; i++) {
        em_scope_begin();
        st = step_one(o, &o->ps[i], t);
        em_scope_end(NULL, 0);
        if (st != EM_OK) em_error_context("%s step: parameter %s", o->kind, o->ps[i].name);
    }
    em_no_grad_end();
    o->clip_deferred = false; /* applied (or the step failed: a new clip starts over) */
    if (st == EM_OK && !o->dscal) o->steps = t; /* device scalars: the caller counts */
    return st;
}

void em_optimizer_zero_grad(em_optimizer *o)
{
    if (o) op_arena_forget_grads(o);
    if (o && !o->dscal) o->clip_deferred = false; /* a host clip's coefficient goes with them */
    for (int i = 0; o && i < o->n; i++) em_zero_grad(o->ps[i].t);
}

void em_optimizer_set_lr(em_optimizer *o, double lr)
{
    if (o) o->lr = lr;
}

double em_optimizer_lr(const em_optimizer *o)
{
    return o ? o->lr : 0;
}

int64_t em_optimizer_steps(const em_optimizer *o)
{
    return o ? o->steps : 0;
}

/* ---- state for checkpoints ---------------------------------------------------------------------
 */

static void state_name(const em_optimizer *o, const op_param *p, int k, char *buf, size_t size)
{
    snprintf(buf, size, "%s.%s", p->name, o->state_names[k]);
}

void em_optimizer_state_visit(em_optimizer *o, em_optim_state_fn fn, void *user)
{
    char name[1024];
    for (int i = 0; o && fn && i < o->n; i++)
        for (int k = 0; k < o->nstate; k++) {
            if (!o->ps[i].state[k]) continue;
            state_name(o, &o->ps[i], k, name, sizeof name);
            if (!fn(name, o->ps[i].state[k], user)) return;
        }
}

/* The looked-up tensor t as state for p: checked shape, compute dtype, p's device. */
static em_tensor *state_from(const op_param *p, const em_tensor *t, const char *name)
{
    em_shape a = em_shape_of(t), b = em_shape_of(p->t);
    bool same = a.rank == b.rank;
    for (int i = 0; same && i < a.rank; i++) same = a.d[i] == b.d[i];
    if (!same) {
        char da[128], db[128];
        em_set_error(EM_ERR_INVALID, "optimizer state %s is %s, the parameter %s", name,
                     em_describe(t, da, sizeof da), em_describe(p->t, db, sizeof db));
        return NULL;
    }
    em_tensor *on = em_to_device(t, em_tensor_device(p->t));
    em_tensor *v = on ? em_cast(on, op_compute_type(p->t)) : NULL;
    em_release(on);
    return v;
}

em_status em_optimizer_state_load(em_optimizer *o, em_optim_state_lookup fn, void *user,
                                  int64_t steps)
{
    if (!o || !fn || steps < 0)
        return em_set_error(EM_ERR_INVALID, "optimizer_state_load: bad argument");
    int n = o->n * o->nstate;
    em_tensor **fresh = calloc((size_t)(n ? n : 1), sizeof *fresh);
    if (!fresh) return em_set_error(EM_ERR_NOMEM, "optimizer_state_load: out of memory");
    em_strbuf missing;
    em_sb_init(&missing);
    int nmissing = 0;
    em_status st = EM_OK;
    char name[1024];
    em_no_grad_begin();
    for (int i = 0; steps > 0 && i < o->n && st == EM_OK; i++)
        for (int k = 0; k < o->nstate && st == EM_OK; k++) {
            state_name(o, &o->ps[i], k, name, sizeof name);
            em_tensor *t = fn(name, user);
            if (!t) {
                if (nmissing++ < 8) em_sb_printf(&missing, "%s%s", nmissing > 1 ? ", " : "", name);
                continue;
            }
            em_tensor *v = state_from(&o->ps[i], t, name);
            if (!v) st = em_last_status();
            em_tensor_untrack(v);
            fresh[i * o->nstate + k] = v;
        }
    em_no_grad_end();
    if (st == EM_OK && nmissing)
        st = em_set_error(EM_ERR_NOT_FOUND, "%s state: %d tensors missing: %s%s", o->kind, nmissing,
                          missing.data, nmissing > 8 ? ", ..." : "");
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k < o->nstate; k++) {
            em_tensor *v = fresh[i * o->nstate + k];
            if (st != EM_OK) {
                em_release(v);
            } else {
                em_release(o->ps[i].state[k]);
                o->ps[i].state[k] = v;
            }
        }
    if (st == EM_OK) o->steps = steps;
    em_sb_free(&missing);
    free(fresh);
    return st;
}

/* ---- gradients: clipping and scaling -----------------------------------------------------------
 */

/* Replaces each parameter's gradient g with f(g, a) (f's result is scope-owned), or, where
 * `inplace` is given and runs (*ran set), updates g in place instead. */
static em_status map_grads(em_optimizer *o, const char *what,
                           em_tensor *(*f)(const em_tensor *g, double a),
                           em_status (*inplace)(em_tensor *g, double a, bool *ran), double a)
{
    if (!o) return em_set_error(EM_ERR_INVALID, "%s: NULL optimizer", what);
    em_no_grad_begin();
    em_tensor *flat;
    em_status st = op_arena_settle(o);
    if (st == EM_OK) st = op_arena_gather(o, &flat);
    if (st == EM_OK && flat) { /* every gradient in one buffer: one op over all of them */
        em_scope_begin();
        em_tensor *ng = f(flat, a);
        st = ng ? em_copy_(flat, ng) : em_last_status();
        em_scope_end(NULL, 0);
        em_no_grad_end();
        return st == EM_OK ? EM_OK : em_error_context("%s", what);
    }
    for (int i = 0; i < o->n && st == EM_OK; i++) {
        em_tensor *g = em_grad(o->ps[i].t);
        if (!g) continue;
        bool ran = false;
        em_scope_begin();
        if (inplace) st = inplace(g, a, &ran);
        if (st == EM_OK && !ran) {
            em_tensor *ng = f(g, a);
            st = ng ? em_set_grad(o->ps[i].t, ng) : em_last_status();
        }
        em_scope_end(NULL, 0);
        if (st != EM_OK) em_error_context("%s: parameter %s", what, o->ps[i].name);
    }
    em_no_grad_end();
    return st;
}

static em_tensor *clamp_sym(const em_tensor *g, double c)
{
    return em_clamp(g, -c, c);
}

em_status em_clip_grad_value(em_optimizer *o, double clip)
{
    if (!(clip >= 0)) return em_set_error(EM_ERR_INVALID, "clip_grad_value: clip %g < 0", clip);
    return map_grads(o, "clip_grad_value", clamp_sym, NULL, clip);
}

/* Multiplies every gradient by s: in place in one launch each (op_scale_grad), or, for a
 * gradient that is strided or shares its buffer, as a new gradient (em_mul_scalar). */
static em_status scale_grads(em_optimizer *o, const char *what, double s)
{
    return map_grads(o, what, em_mul_scalar, op_scale_grad, s);
}

em_status em_scale_grads(em_optimizer *o, double s)
{
    return scale_grads(o, "scale_grads", s);
}

em_status em_clip_grad_norm(em_optimizer *o, double max_norm, double *norm_out)
{
    if (!o) return em_set_error(EM_ERR_INVALID, "clip_grad_norm: NULL optimizer");
    if (!(max_norm >= 0))
        return em_set_error(EM_ERR_INVALID, "clip_grad_norm: max_norm %g < 0", max_norm);
    double sq;
    em_clear_error();
    em_no_grad_begin();
    em_status st = op_grad_sq_sum(o, &sq);
    em_no_grad_end();
    if (st != EM_OK) return em_error_context("clip_grad_norm");
    double norm = sqrt(sq);
    if (norm_out) *norm_out = norm;
    double coef = max_norm / (norm + OP_CLIP_EPS);
    /* a non-finite norm leaves the gradients as they are (the caller sees it and skips the step) */
    if (!(coef < 1.0) || !isfinite(norm)) return EM_OK;
    if (op_arena_narrow(o) && o->fused) { /* the step applies it (flat bf16 slots) */
        o->clip_deferred = true;
        o->host_coef = coef;
        return EM_OK;
    }
    return scale_grads(o, "clip_grad_norm", coef);
}
