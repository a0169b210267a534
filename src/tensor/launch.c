/* launch.c — binds tensors to the tensor kernels of src/kernels/tensor_*.ek: turns each view into
 * two launch arguments (the whole buffer with the view's shape and strides in scalars, then the
 * view's offset in scalars as a u32), chooses grids, and launches through the kernel language's
 * host API on the built-in module. Before a launch, pending (lazy) tensors among the arguments are
 * realized, and pending computations reading a buffer the kernel writes run first (fusion.h). Each
 * launch counts the bytes of the views it binds: const ones read, the others written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion.h"
#include "tensor/internal.h"

em_scalar tn_compute_type(em_scalar dt)
{
    switch (dt) {
    case EM_F16: case EM_BF16: case EM_F32: return EM_F32;
    case EM_F64: return EM_F64;
    case EM_I64: return EM_I64;
    default: return EM_I32;
    }
}

em_scalar tn_math_type(em_device *dev, em_scalar ct)
{
    const em_caps *c = em_device_caps(dev);
    if (ct == EM_F64 && c && !strcmp(c->target, "glsl")) return EM_F32; /* GLSL has no f64 exp/log */
    return ct;
}

bool tn_preload_ok(em_device *dev, const char *env, const em_tensor *const *ts, int n)
{
    const char *v = getenv(env);
    if (v && !strcmp(v, "0")) return false;
    if (!(v && !strcmp(v, "1")) && strcmp(em_device_caps(dev)->target, "cuda") != 0) return false;
    for (int i = 0; i < n; i++)
        if (!ts[i]->st->buf || !em_buffer_settled(ts[i]->st->buf)) return false;
    return true;
}

em_arg tn_scalar_arg(em_scalar dt, double v)
{
    em_scalar c = tn_compute_type(dt);
    if (em_scalar_is_float(c)) return em_arg_f64(v);
    em_arg a = em_arg_i32(0);
    a.value_class = EM_ARG_INT;
    a.value.i = (int64_t)v;
    return a;
}

tn_arg tn_arg_geom(const em_tensor *t, int rank, const int64_t *shape, const int64_t *stride,
                   int64_t offset)
{
    tn_arg a;
    memset(&a, 0, sizeof a);
    a.t = t;
    a.rank = rank;
    for (int i = 0; i < rank; i++) {
        a.shape[i] = shape[i];
        a.stride[i] = stride[i];
    }
    a.offset = offset;
    return a;
}

tn_arg tn_arg_t(const em_tensor *t) { return tn_arg_geom(t, t->rank, t->shape, t->stride, t->offset); }

tn_arg tn_arg_flat(const em_tensor *t)
{
    tn_arg a = tn_arg_geom(t, 0, NULL, NULL, t->offset);
    a.flat = true;
    return a;
}

tn_arg tn_arg_s(em_arg s)
{
    tn_arg a;
    memset(&a, 0, sizeof a);
    a.scalar = s;
    return a;
}

uint64_t tn_view_bytes(em_scalar dt, int rank, const int64_t *shape, const int64_t *stride)
{
    uint64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0) return 0;
        if (stride[i] != 0) n *= (uint64_t)shape[i];
    }
    return n * em_scalar_size(dt);
}

/* The bytes bound argument a moves (the view the kernel sees). */
static uint64_t arg_bytes(const tn_arg *a)
{
    const em_tensor *t = a->t;
    if (a->flat) return tn_view_bytes(t->dtype, t->rank, t->shape, t->stride);
    return tn_view_bytes(t->dtype, a->rank, a->shape, a->stride);
}

void tn_grid_1d(uint64_t n, uint32_t cubes[3], uint32_t units[3])
{
    uint32_t u = 256;
    if (n < u) u = n < 32 ? 32 : (uint32_t)((n + 31) / 32 * 32);
    units[0] = u;
    units[1] = units[2] = 1;
    cubes[0] = (uint32_t)((n + u - 1) / u);
    cubes[1] = cubes[2] = 1;
}

unsigned tn_cube_for(int64_t n, unsigned *log)
{
    unsigned c = 32, l = 5;
    while (c < 256 && (int64_t)c < n) {
        c *= 2;
        l++;
    }
    if (log) *log = l;
    return c;
}

/* The buffer argument of a tensor: the whole storage, viewed with the tensor's shape and strides
 * (its offset travels as the separate scalar argument that follows it in every tensor kernel). */
em_arg tn_flat_buffer(const em_tensor *t, em_scalar dt, unsigned lanes)
{
    uint64_t len = (uint64_t)(t->st->bytes / em_scalar_size(dt)) / lanes;
    return em_arg_tensor(t->st->buf, 0, len ? len : 1, 0, NULL, NULL);
}

static em_arg to_em_arg(const tn_arg *a, unsigned lw)
{
    const em_tensor *t = a->t;
    size_t esz = em_scalar_size(t->dtype);
    if (a->lanes) lw = a->lanes;
    uint64_t len = (uint64_t)(t->st->bytes / esz) / lw;
    if (len == 0) len = 1;
    if (a->flat) return em_arg_tensor(t->st->buf, 0, len, 0, NULL, NULL);
    if (a->rank == 0) {
        int64_t one = 1;
        return em_arg_tensor(t->st->buf, 0, len, 1, &one, &one);
    }
    return em_arg_tensor(t->st->buf, 0, len, (unsigned)a->rank, a->shape, a->stride);
}

/* Realizes the pending tensors among args (allocating deferred buffers) and, for each buffer the
 * kernel writes, the pending computations that read it (fusion.c), so that lazy results never see
 * a later write. writes[i] says whether args[i] is a buffer the kernel may write (not const). */
static em_status settle_args(const char *op, em_kernel *k, const tn_arg *args, size_t nargs,
                             bool *writes)
{
    const em_ir_kernel *ir = em_kernel_ir(k);
    size_t n = 0;
    for (size_t i = 0; i < nargs; i++) {
        writes[i] = false;
        if (!args[i].t) {
            n++;
            continue;
        }
        tn_storage *st = args[i].t->st;
        if (fu_realize(st) != EM_OK) return em_error_context("%s", op);
        const em_ir_param *p = ir ? em_ir_param_at(ir, n) : NULL;
        const em_ir_memory *m = p && p->kind == EM_PARAM_BUFFER ? em_ir_mem_at(ir, p->id) : NULL;
        writes[i] = !m || (m->access & EM_WRITE);
        if (writes[i] && fu_before_write(st) != EM_OK) return em_error_context("%s", op);
        n += 2;
    }
    return EM_OK;
}

em_status tn_launch(const char *op, em_device *dev, const char *name, const em_lang_bind *binds,
                    size_t nbinds, unsigned lw, const uint32_t cubes[3], const uint32_t units[3],
                    tn_arg *args, size_t nargs)
{
    const em_lang_module *m = em_lang_builtins();
    if (!m) return em_error_context("%s", op);
    em_arg ea[32];
    size_t n = 0;
    if (nargs > 20) return em_set_error(EM_ERR_INTERNAL, "%s: too many arguments", op);
    em_lang_spec spec = {binds, nbinds, lw ? lw : 1, NULL};
    em_kernel *k = em_lang_compile(dev, m, name, &spec);
    if (!k) return em_error_context("%s", op);
    bool writes[20];
    em_status st = settle_args(op, k, args, nargs, writes);
    if (st != EM_OK) return st;
    for (size_t i = 0; i < nargs; i++) {
        if (!args[i].t) {
            ea[n++] = args[i].scalar;
            continue;
        }
        ea[n++] = to_em_arg(&args[i], lw ? lw : 1);
        ea[n++] = em_arg_u32((uint32_t)args[i].offset);
    }
    st = em_launch(k, cubes, units, ea, n);
    if (st != EM_OK) {
        em_error_context("launching kernel '%s'", name);
        em_error_context("%s", op);
    } else {
        uint64_t read = 0, written = 0;
        for (size_t i = 0; i < nargs; i++)
            if (args[i].t) *(writes[i] ? &written : &read) += arg_bytes(&args[i]);
        fu_count_launch(name, read, written);
    }
    return st;
}

em_status tn_launch_prologue(const char *op, fu_prologue *pr, const char *file, const char *name,
                             const em_lang_bind *binds, size_t nbinds, unsigned lw, const uint32_t cubes[3],
                             const uint32_t units[3], tn_arg *args, size_t nargs, const bool *writes)
{
    em_arg ea[24];
    size_t n = 0;
    uint64_t read = 0, written = 0;
    if (nargs > 12) return em_set_error(EM_ERR_INTERNAL, "%s: too many arguments", op);
    ea[n++] = em_arg_u32((uint32_t)args[0].offset); /* the input's offset: its buffer is replaced */
    for (size_t i = 1; i < nargs; i++) {
        if (!args[i].t) {
            ea[n++] = args[i].scalar;
            continue;
        }
        tn_storage *st = args[i].t->st;
        if (fu_realize(st) != EM_OK || (writes[i] && fu_before_write(st) != EM_OK))
            return em_error_context("%s", op);
        ea[n++] = to_em_arg(&args[i], lw ? lw : 1);
        ea[n++] = em_arg_u32((uint32_t)args[i].offset);
        *(writes[i] ? &written : &read) += arg_bytes(&args[i]);
    }
    em_lang_spec spec = {binds, nbinds, lw ? lw : 1, NULL};
    em_status st = fu_prologue_launch(pr, file, name, &spec, cubes, units, ea, n, read, written);
    if (st != EM_OK) em_error_context("%s", op);
    return st;
}
