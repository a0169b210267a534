/* fused.c — the host side of the optimizer's fused kernels (src/kernels/optim_adam.ek), which
 * take a GPT-2 clip + AdamW step from 2,861 launches op by op (1,381 with lazy fusion) to 444
 * (docs/optim.md):
 *
 *   op_adam_fused     one launch per parameter updates the parameter and both moments in place
 *                     (adam.c's formulas, roundings and order); no buffer is allocated
 *   op_grad_sq_sum    clip_grad_norm's sum of squares: one launch per gradient writes its
 *                     cubes' partial sums into slots of one buffer per device, read back once
 *                     and added in double on the host (in slot order: deterministic)
 *   op_scale_grad     g *= s in place (clip_grad_norm's rescale, em_scale_grads)
 *
 * Each runs where its tensors allow (contiguous, small enough for u32 positions, a gradient
 * buffer no one else sees for the in-place rescale) and otherwise tells the caller, which then
 * takes the op-by-op path. The tensor layer's internals (tensor/internal.h) give the buffers, as
 * they do for nn/module.c and dist/dist.c; launches go through the kernel language's host API.
 * Binding buffers outside tn_launch, each launch first runs the lazy fusion's pending work
 * (docs/fusion.md): tn_realize on what it reads, em_realize on what it writes (that also runs
 * pending computations that read the buffer, so they see the values from before the write). */
#include <math.h>
#include <stdlib.h>

#include "optim/internal.h"
#include "tensor/internal.h"

#define SUMSQ_CUBE 256         /* units per cube of optim_sumsq */
#define SUMSQ_PER_CUBE 16384   /* elements per cube (at least) before another cube is added */
#define SUMSQ_MAX_CUBES 256    /* cubes (and slots) per gradient, at most */
#define SUMSQ_FLAT_CUBES 1024  /* cubes for the flat gradients of em_optimizer_flatten */
#define MAX_ELEMS 0x7fffffffLL /* offset + elements of a tensor the kernels index (u32 lines) */

/* ---- launching ------------------------------------------------------------------------------- */

/* True when the kernels can index t: contiguous, and offset + numel within MAX_ELEMS. */
static bool indexable(const em_tensor *t)
{
    return em_is_contiguous(t) && t->offset + em_numel(t) <= MAX_ELEMS;
}

/* The widest line width for elements of esz bytes on dev (em_line_lanes), halved until it
 * divides n and every offset (all in scalars). */
static unsigned pick_width(em_device *dev, size_t esz, int64_t n, const int64_t *offs, int noffs)
{
    unsigned w = em_line_lanes(em_device_caps(dev), (unsigned)esz);
    for (; w > 1; w /= 2) {
        bool ok = n % w == 0;
        for (int i = 0; ok && i < noffs; i++) ok = offs[i] % w == 0;
        if (ok) break;
    }
    return w ? w : 1;
}

/* Appends t as a kernel's buffer argument (the whole storage, in lines of lw) and its offset in
 * scalars, as the tensor kernels take them. */
static size_t push_tensor(em_arg *a, size_t n, const em_tensor *t, unsigned lw)
{
    uint64_t len = (uint64_t)(t->st->bytes / em_scalar_size(t->dtype)) / lw;
    a[n++] = em_arg_buffer(t->st->buf, len ? len : 1);
    a[n++] = em_arg_u32((uint32_t)t->offset);
    return n;
}

static em_status launch(em_device *dev, const char *kernel, const em_lang_bind *binds,
                        size_t nbinds, unsigned lw, const uint32_t cubes[3],
                        const uint32_t units[3], const em_arg *args, size_t nargs)
{
    const em_lang_module *m = em_lang_builtins();
    if (!m) return em_last_status();
    em_lang_spec spec = {binds, nbinds, lw, NULL};
    return em_lang_launch(dev, m, kernel, &spec, cubes, units, args, nargs);
}

/* ---- Adam ------------------------------------------------------------------------------------ */

/* State slot k of p as a contiguous tensor that only the optimizer sees (so it may be written in
 * place): created as zeros, or replaced by a private copy when someone else holds a reference or
 * the loaded state is not contiguous. NULL with the error set. */
static em_tensor *own_state(em_optimizer *o, op_param *p, int k)
{
    em_tensor *s = p->state[k];
    if (s && op_arena_holds(o, s)) return s; /* a view of the flat state: written in place */
    if (!s) {
        s = em_zeros(em_tensor_device(p->t), op_compute_type(p->t), em_shape_of(p->t));
        if (!s) return NULL;
        op_set_state(p, k, s);
    } else if (!em_tensor_exclusive(s) || !indexable(s)) {
        em_tensor *c = em_clone(s);
        if (!c || !em_is_contiguous(c)) {
            em_release(c);
            return NULL;
        }
        op_set_state(p, k, c);
        s = c;
    }
    return s;
}

em_status op_adam_launch(em_optimizer *o, em_tensor *w, const em_tensor *g, em_tensor *m,
                         em_tensor *v, em_tensor *q, int64_t n, bool decay, int64_t t)
{
    bool mirror = q != NULL;
    if (!mirror) q = w; /* a placeholder the kernel never touches */
    const em_adam_config *c = &o->cfg.adam;
    em_scalar pt = em_dtype(w), s = op_compute_type(w);
    em_device *dev = em_tensor_device(w);
    int64_t offs[5] = {w->offset, g->offset, m->offset, v->offset, q->offset};
    size_t esz = em_scalar_size(s) > em_scalar_size(pt) ? em_scalar_size(s) : em_scalar_size(pt);
    unsigned lw = pick_width(dev, esz, n, offs, 5);
    unsigned kind = !(decay && c->weight_decay != 0) ? 0 : c->decoupled ? 2 : 1;
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    double dfac = kind == 2 ? 1.0 - o->lr * c->weight_decay : c->weight_decay;

    em_arg a[20];
    size_t na = 0;
    na = push_tensor(a, na, w, lw);
    na = push_tensor(a, na, g, lw);
    na = push_tensor(a, na, m, lw);
    na = push_tensor(a, na, v, lw);
    na = push_tensor(a, na, q, lw);
    a[na++] = em_arg_u32((uint32_t)(n / lw));
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)(n / lw), cubes, units);
    em_status st;
    if (o->dscal) { /* the per-step scalars from device memory (device_scalars.c) */
        if ((st = em_realize(o->dscal)) != EM_OK) return st;
        na = push_tensor(a, na, o->dscal, 1);
        const double fixed[5] = {c->beta1, 1.0 - c->beta1, c->beta2, 1.0 - c->beta2, c->eps};
        for (int i = 0; i < 5; i++) a[na++] = em_arg_f64(fixed[i]);
        em_lang_bind bd[8] = {
            em_lang_bind_type("P", pt),          em_lang_bind_type("G", em_dtype(g)),
            em_lang_bind_type("S", s),           em_lang_bind_type("A", em_dtype(o->dscal)),
            em_lang_bind_type("Q", em_dtype(q)), em_lang_bind_int("DECAY", kind),
            em_lang_bind_bool("MIRROR", mirror), em_lang_bind_bool("CLIP", o->clip_deferred)};
        return launch(dev, "optim_adam_dev", bd, 8, lw, cubes, units, a, na);
    }
    /* a host clip's coefficient left to the step (op_arena_narrow), else none */
    bool clip = o->clip_deferred;
    const double sc[9] = {c->beta1, 1.0 - c->beta1, c->beta2, 1.0 - c->beta2,           sqrt(bc2),
                          c->eps,   o->lr / bc1,    dfac,     clip ? o->host_coef : 1.0};
    for (int i = 0; i < 9; i++) a[na++] = em_arg_f64(sc[i]);
    em_lang_bind b[7] = {em_lang_bind_type("P", pt),      em_lang_bind_type("G", em_dtype(g)),
                         em_lang_bind_type("S", s),       em_lang_bind_type("Q", em_dtype(q)),
                         em_lang_bind_int("DECAY", kind), em_lang_bind_bool("MIRROR", mirror),
                         em_lang_bind_bool("CLIP", clip)};
    return launch(dev, "optim_adam", b, 7, lw, cubes, units, a, na);
}

em_status op_adam_fused(em_optimizer *o, op_param *p, const em_tensor *grad, int64_t t, bool *ran)
{
    *ran = false;
    em_tensor *w = p->t;
    /* a strided parameter takes the op-by-op path (its update is written back with em_copy_) */
    if (!indexable(w) || em_numel(w) == 0) return EM_OK;
    em_status st = tn_check_write(w, "optimizer_step");
    if (st != EM_OK) return st;
    const em_tensor *g = indexable(grad) ? grad : tn_contig(grad); /* a scope-owned copy */
    em_tensor *m = own_state(o, p, 0), *v = m ? own_state(o, p, 1) : NULL;
    if (!g || !m || !v) return em_last_status();
    if (!indexable(g) || !indexable(m) || !indexable(v)) return EM_OK;
    if ((st = tn_realize(g)) != EM_OK || (st = em_realize(w)) != EM_OK ||
        (st = em_realize(m)) != EM_OK || (st = em_realize(v)) != EM_OK)
        return st;

    /* the mirror in the same launch where the kernel can index it (else step_one casts) */
    em_tensor *q = p->mirror;
    bool mirror = q && indexable(q) && em_numel(q) == em_numel(w) &&
                  em_tensor_device(q) == em_tensor_device(w) &&
                  tn_check_write(q, "optimizer_step") == EM_OK && em_realize(q) == EM_OK;
    em_clear_error();
    st = op_adam_launch(o, w, g, m, v, mirror ? q : NULL, em_numel(w), p->decay, t);
    if (st == EM_OK) *ran = true, p->mirror_written = mirror;
    return st;
}

/* ---- gradient norm --------------------------------------------------------------------------- */

/* Cubes (and partial-sum slots) for a gradient of n elements. */
static uint32_t sumsq_cubes(int64_t n)
{
    int64_t c = (n + SUMSQ_PER_CUBE - 1) / SUMSQ_PER_CUBE;
    return (uint32_t)(c < 1 ? 1 : c > SUMSQ_MAX_CUBES ? SUMSQ_MAX_CUBES : c);
}

/* Launches optim_sumsq for g into part's `cubes` slots from `slot`. */
static em_status sumsq_one(const em_tensor *g, em_tensor *part, int64_t slot, uint32_t cubes)
{
    em_device *dev = em_tensor_device(g);
    if (!indexable(g)) {
        const em_tensor *c = tn_contig(g); /* scope-owned */
        if (!c) return em_last_status();
        if (!indexable(c))
            return em_set_error(EM_ERR_INVALID, "a gradient of %lld elements is too large",
                                (long long)em_numel(g));
        g = c;
    }
    em_status st = tn_realize(g);
    if (st != EM_OK) return st;
    int64_t n = em_numel(g);
    unsigned lw = pick_width(dev, em_scalar_size(g->dtype), n, &g->offset, 1);
    em_arg a[5];
    size_t na = push_tensor(a, 0, g, lw);
    na = push_tensor(a, na, part, 1);
    a[na - 1] = em_arg_u32((uint32_t)slot); /* part_off: the first slot */
    a[na++] = em_arg_u32((uint32_t)(n / lw));
    em_lang_bind b[4] = {em_lang_bind_type("G", g->dtype),
                         em_lang_bind_type("C", op_compute_type(g)),
                         em_lang_bind_type("A", part->dtype), em_lang_bind_int("CUBE", SUMSQ_CUBE)};
    uint32_t grid[3] = {cubes, 1, 1}, units[3] = {SUMSQ_CUBE, 1, 1};
    return launch(dev, "optim_sumsq", b, 4, lw, grid, units, a, na);
}

em_scalar op_scalar_type(em_device *dev)
{
    const em_caps *caps = em_device_caps(dev);
    return caps && caps->dtype[EM_F64] ? EM_F64 : EM_F32;
}

/* Launches optim_sumsq for the gradients of parameters first.. on first's device (and marks them
 * done) into *part, one buffer of *total slots (scope-owned; NULL when there is no gradient). */
static em_status sq_parts(em_optimizer *o, int first, bool *done, em_tensor **part, int64_t *total)
{
    em_device *dev = em_tensor_device(o->ps[first].t);
    em_scalar acc = op_scalar_type(dev);
    *part = NULL;
    *total = 0;
    em_tensor *flat;
    em_status st = op_arena_gather(o, &flat); /* every gradient in one buffer: one launch */
    if (st != EM_OK) return st;
    if (flat) {
        int64_t c = (em_numel(flat) + SUMSQ_PER_CUBE - 1) / SUMSQ_PER_CUBE;
        *total = c > SUMSQ_FLAT_CUBES ? SUMSQ_FLAT_CUBES : c;
        for (int i = 0; i < o->n; i++) done[i] = true;
        if (!(*part = em_empty(dev, acc, EM_SHAPE(*total)))) return em_last_status();
        st = em_realize(*part);
        return st == EM_OK ? sumsq_one(flat, *part, 0, (uint32_t)*total) : st;
    }
    for (int i = first; i < o->n; i++) {
        if (done[i] || em_tensor_device(o->ps[i].t) != dev) continue;
        em_tensor *g = em_grad(o->ps[i].t);
        if (g && em_numel(g) > 0) *total += sumsq_cubes(em_numel(g));
    }
    if (*total > MAX_ELEMS)
        return em_set_error(EM_ERR_INVALID, "%lld partial sums are too many", (long long)*total);
    if (*total > 0 && !(*part = em_empty(dev, acc, EM_SHAPE(*total)))) return em_last_status();
    st = em_realize(*part);
    int64_t slot = 0;
    for (int i = first; i < o->n && st == EM_OK; i++) {
        if (done[i] || em_tensor_device(o->ps[i].t) != dev) continue;
        done[i] = true;
        em_tensor *g = em_grad(o->ps[i].t);
        if (!g || em_numel(g) == 0) continue;
        st = sumsq_one(g, *part, slot, sumsq_cubes(em_numel(g)));
        if (st != EM_OK) em_error_context("parameter %s", o->ps[i].name);
        slot += sumsq_cubes(em_numel(g));
    }
    return st;
}

/* Adds to *out the sums of squares of the gradients of parameters first.. on first's device (and
 * marks them done): one launch per gradient into one buffer of slots, one read. */
static em_status device_sq_sum(em_optimizer *o, int first, bool *done, double *out)
{
    em_tensor *part;
    int64_t total;
    em_status st = sq_parts(o, first, done, &part, &total);
    if (st != EM_OK || total == 0) return st;
    em_scalar acc = em_dtype(part);
    size_t bytes = (size_t)total * em_scalar_size(acc);
    void *host = malloc(bytes);
    if (!host) return em_set_error(EM_ERR_NOMEM, "out of host memory for %zu bytes", bytes);
    st = em_to_host(part, host, bytes);
    for (int64_t i = 0; st == EM_OK && i < total; i++) *out += tn_host_get(acc, host, (size_t)i);
    free(host);
    return st;
}

em_status op_grad_sq_sum(em_optimizer *o, double *out)
{
    *out = 0;
    em_status pst = op_arena_settle(o);
    if (pst != EM_OK) return pst;
    bool *done = calloc((size_t)(o->n ? o->n : 1), sizeof *done);
    if (!done) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_status st = EM_OK;
    for (int first = 0; first < o->n && st == EM_OK; first++) {
        if (done[first]) continue;
        em_scope_begin();
        st = device_sq_sum(o, first, done, out);
        em_scope_end(NULL, 0);
    }
    free(done);
    return st;
}

/* ---- rescaling ------------------------------------------------------------------------------- */

em_status op_scale_grad(em_tensor *g, double s, bool *ran)
{
    *ran = false;
    /* in place only where no one else sees the buffer (a gradient may be shared or a view) */
    if (!g || !indexable(g) || !em_tensor_exclusive(g)) return EM_OK;
    int64_t n = em_numel(g);
    if (n == 0) {
        *ran = true;
        return EM_OK;
    }
    em_status st = em_realize(g);
    if (st != EM_OK) return st;
    em_device *dev = em_tensor_device(g);
    unsigned lw = pick_width(dev, em_scalar_size(g->dtype), n, &g->offset, 1);
    em_arg a[4];
    size_t na = push_tensor(a, 0, g, lw);
    a[na++] = em_arg_u32((uint32_t)(n / lw));
    a[na++] = em_arg_f64(s);
    em_lang_bind b[2] = {em_lang_bind_type("G", g->dtype),
                         em_lang_bind_type("C", op_compute_type(g))};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)(n / lw), cubes, units);
    st = launch(dev, "optim_scale", b, 2, lw, cubes, units, a, na);
    if (st == EM_OK) *ran = true;
    return st;
}

/* ---- clipping on the device ------------------------------------------------------------------ */

/* g *= dscal[OP_SC_COEF] in place (optim_scale_dev), g contiguous and indexable. */
static em_status scale_dev_launch(em_optimizer *o, em_tensor *g)
{
    em_tensor *dscal = o->dscal;
    int64_t n = em_numel(g);
    em_status st = n ? em_realize(g) : EM_OK;
    if (st != EM_OK || n == 0) return st;
    em_device *dev = em_tensor_device(g);
    unsigned lw = pick_width(dev, em_scalar_size(g->dtype), n, &g->offset, 1);
    em_arg a[5];
    size_t na = push_tensor(a, 0, g, lw);
    a[na++] = em_arg_u32((uint32_t)(n / lw));
    na = push_tensor(a, na, dscal, 1);
    em_lang_bind b[3] = {em_lang_bind_type("G", g->dtype),
                         em_lang_bind_type("C", op_compute_type(g)),
                         em_lang_bind_type("A", em_dtype(dscal))};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)(n / lw), cubes, units);
    return launch(dev, "optim_scale_dev", b, 3, lw, cubes, units, a, na);
}

em_status op_scale_grad_device(em_optimizer *o, em_tensor *g, const char *name)
{
    if (!indexable(g) || !em_tensor_exclusive(g))
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "clip on the device: the gradient of %s is strided, shared or too "
                            "large to rescale in place",
                            name);
    return scale_dev_launch(o, g);
}

em_status op_clip_device(em_optimizer *o, double max_norm, bool defer)
{
    o->clip_deferred = false;
    if (o->n == 0) return EM_OK;
    bool *done = calloc((size_t)o->n, sizeof *done);
    if (!done) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_device *dev = em_tensor_device(o->dscal);
    em_scalar acc = em_dtype(o->dscal);
    em_scope_begin();
    em_tensor *part;
    int64_t total;
    em_status st = sq_parts(o, 0, done, &part, &total);
    for (int i = 0; st == EM_OK && i < o->n; i++)
        if (!done[i])
            st = em_set_error(EM_ERR_UNSUPPORTED,
                              "clip on the device: parameter %s is on %s, not on %s", o->ps[i].name,
                              em_device_name(em_tensor_device(o->ps[i].t)), em_device_name(dev));
    if (st == EM_OK && !part) part = em_zeros(dev, acc, EM_SHAPE(1)); /* no gradient: norm 0 */
    if (st == EM_OK && !part) st = em_last_status();
    if (st == EM_OK) st = em_realize(part);
    if (st == EM_OK) st = em_realize(o->dscal);
    if (st == EM_OK) {
        em_arg a[7];
        size_t na = push_tensor(a, 0, part, 1);
        a[na++] = em_arg_u32((uint32_t)total);
        na = push_tensor(a, na, o->dscal, 1);
        a[na++] = em_arg_f64(max_norm);
        a[na++] = em_arg_f64(OP_CLIP_EPS);
        em_lang_bind b[1] = {em_lang_bind_type("A", acc)};
        uint32_t one[3] = {1, 1, 1};
        st = launch(dev, "optim_clip_coef", b, 1, 1, one, one, a, na);
    }
    em_tensor *flat = NULL;
    if (st == EM_OK) st = op_arena_gather(o, &flat); /* gathered by sq_parts already */
    if (st == EM_OK && defer && o->fused) {
        o->clip_deferred = true; /* the step's kernels apply the coefficient */
    } else if (st == EM_OK && flat) {
        st = scale_dev_launch(o, flat); /* every gradient in one launch */
    } else {
        for (int i = 0; st == EM_OK && i < o->n; i++) {
            em_tensor *g = em_grad(o->ps[i].t);
            if (g) st = op_scale_grad_device(o, g, o->ps[i].name);
        }
    }
    em_scope_end(NULL, 0);
    free(done);
    return st;
}
