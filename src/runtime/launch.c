/* launch.c — launch arguments, their checking against a kernel's parameters, the launch itself
 * (through the profiler while it is on: profile.c), and the line-width helper. Every check
 * happens here, once, so drivers receive only resolved, valid arguments (driver.h: em_drv_arg);
 * each error names the kernel and the parameter. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/rt.h"

/* ---- argument helpers ------------------------------------------------------------------------ */

em_arg em_arg_buffer(em_buffer *buf, uint64_t len)
{
    em_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_BUFFER;
    a.buf = buf;
    a.len = len;
    return a;
}

em_arg em_arg_tensor(em_buffer *buf, size_t offset, uint64_t len, unsigned rank,
                     const int64_t *shape, const int64_t *stride)
{
    em_arg a = em_arg_buffer(buf, len);
    a.offset = offset;
    a.rank = rank; /* checked at launch; only EM_MAX_RANK dims are kept */
    for (unsigned i = 0; i < rank && i < EM_MAX_RANK; i++) {
        a.shape[i] = shape ? shape[i] : 0;
        a.stride[i] = stride ? stride[i] : 0;
    }
    return a;
}

static em_arg scalar_arg(em_arg_class cls)
{
    em_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_SCALAR;
    a.value_class = (uint8_t)cls;
    return a;
}

em_arg em_arg_u32(uint32_t v)
{
    em_arg a = scalar_arg(EM_ARG_UINT);
    a.value.u = v;
    return a;
}

em_arg em_arg_i32(int32_t v)
{
    em_arg a = scalar_arg(EM_ARG_INT);
    a.value.i = v;
    return a;
}

em_arg em_arg_f32(float v)
{
    em_arg a = scalar_arg(EM_ARG_FLOAT);
    a.value.f = v;
    return a;
}

em_arg em_arg_f64(double v)
{
    em_arg a = scalar_arg(EM_ARG_FLOAT);
    a.value.f = v;
    return a;
}

/* ---- checking -------------------------------------------------------------------------------- */

static const char *param_name(const em_ir_kernel *ir, size_t i)
{
    const em_ir_param *p = em_ir_param_at(ir, i);
    const char *name = NULL;
    if (p && p->kind == EM_PARAM_BUFFER) {
        const em_ir_memory *m = em_ir_mem_at(ir, p->id);
        name = m ? m->name : NULL;
    } else if (p) {
        const em_ir_value *v = em_ir_value_at(ir, p->id);
        name = v ? v->name : NULL;
    }
    return name ? name : "?";
}

static const char *arg_class_name(uint8_t cls)
{
    switch (cls) {
    case EM_ARG_INT: return "a signed integer";
    case EM_ARG_UINT: return "an unsigned integer";
    case EM_ARG_FLOAT: return "a float";
    default: return "a value";
    }
}

static em_status arg_error(const em_kernel *kern, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static em_status arg_error(const em_kernel *kern, size_t i, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return em_set_error(EM_ERR_INVALID, "kernel %s: argument %zu ('%s'): %s",
                        em_ir_kernel_name(kern->ir), i, param_name(kern->ir, i), what);
}

static em_status check_buffer(const em_kernel *kern, size_t i, const em_ir_memory *mem,
                              const em_arg *a, em_drv_arg *out)
{
    em_device *dev = kern->dev;
    if (a->kind != EM_PARAM_BUFFER)
        return arg_error(kern, i, "expects a buffer, got a scalar");
    if (!a->buf)
        return arg_error(kern, i, "no buffer given");
    if (a->buf->dev != dev)
        return arg_error(kern, i, "the buffer is on device %s, the kernel runs on %s",
                         a->buf->dev->name, dev->name);
    size_t scalar = em_scalar_size((em_scalar)mem->elem.scalar);
    size_t elem = scalar * mem->elem.lanes;
    if (scalar && a->offset % scalar)
        return arg_error(kern, i, "offset %zu is not a multiple of the %s size (%zu bytes)",
                         a->offset, em_scalar_name((em_scalar)mem->elem.scalar), scalar);
    size_t size = a->buf->size;
    if (a->len > UINT32_MAX)
        return arg_error(kern, i, "%llu elements exceed the u32 range of kernel indices",
                         (unsigned long long)a->len);
    uint64_t bytes = a->len * elem;
    if (a->offset > size || bytes > size - a->offset)
        return arg_error(kern, i,
                         "%llu elements of %zu bytes at offset %zu need %llu bytes, but the "
                         "buffer has %zu",
                         (unsigned long long)a->len, elem, a->offset,
                         (unsigned long long)(bytes + a->offset), size);
    if (mem->rank > 0) {
        if (a->rank != mem->rank)
            return arg_error(kern, i, "expects a rank-%u tensor, got rank %u%s", mem->rank,
                             a->rank, a->rank ? "" : " (use em_arg_tensor)");
        /* every reachable scalar must lie inside the len elements */
        uint64_t last = 0;
        bool empty = false;
        for (unsigned d = 0; d < a->rank; d++) {
            if (a->shape[d] < 0 || a->stride[d] < 0)
                return arg_error(kern, i, "dim %u has shape %lld and stride %lld; both must be "
                                 ">= 0", d, (long long)a->shape[d], (long long)a->stride[d]);
            uint64_t step;
            if (a->shape[d] == 0)
                empty = true;
            else if (__builtin_mul_overflow((uint64_t)(a->shape[d] - 1), (uint64_t)a->stride[d],
                                            &step) ||
                     __builtin_add_overflow(last, step, &last))
                last = UINT64_MAX;
        }
        uint64_t scalars = a->len * mem->elem.lanes;
        if (!empty && last >= scalars)
            return arg_error(kern, i,
                             "its shape and strides reach scalar %llu, beyond the %llu scalars "
                             "of its %llu elements",
                             (unsigned long long)last, (unsigned long long)scalars,
                             (unsigned long long)a->len);
    }
    out->kind = EM_PARAM_BUFFER;
    out->type = mem->elem;
    out->mem = a->buf->mem;
    out->offset = a->offset;
    out->len = a->len;
    out->rank = mem->rank ? a->rank : 0;
    out->shape = mem->rank ? a->shape : NULL;
    out->stride = mem->rank ? a->stride : NULL;
    return EM_OK;
}

static em_status check_scalar(const em_kernel *kern, size_t i, const em_ir_value *v,
                              const em_arg *a, em_drv_arg *out)
{
    if (a->kind != EM_PARAM_SCALAR)
        return arg_error(kern, i, "expects a scalar %s, got a buffer",
                         em_scalar_name((em_scalar)v->type.scalar));
    bool is_float = em_scalar_is_float((em_scalar)v->type.scalar);
    out->kind = EM_PARAM_SCALAR;
    out->type = v->type;
    out->value = a->value;
    switch (a->value_class) {
    case EM_ARG_AS_PARAM: break;
    case EM_ARG_INT:
        if (is_float)
            out->value.f = (double)a->value.i;
        break;
    case EM_ARG_UINT:
        if (is_float)
            out->value.f = (double)a->value.u;
        break;
    case EM_ARG_FLOAT:
        if (!is_float)
            return arg_error(kern, i, "expects %s (%s), got %s",
                             v->type.scalar == EM_BOOL ? "a bool" : "an integer",
                             em_scalar_name((em_scalar)v->type.scalar),
                             arg_class_name(a->value_class));
        break;
    default: return arg_error(kern, i, "unknown value class %u", a->value_class);
    }
    return EM_OK;
}

static em_status check_grid(const em_kernel *kern, const uint32_t count[3], const uint32_t dim[3],
                            uint64_t *cubes)
{
    const em_caps *caps = &kern->dev->caps;
    const char *name = em_ir_kernel_name(kern->ir);
    uint64_t units = 1;
    for (int d = 0; d < 3; d++) {
        if (dim[d] == 0 || (caps->max_cube_dim[d] && dim[d] > caps->max_cube_dim[d]))
            return em_set_error(EM_ERR_INVALID,
                                "kernel %s: cube_dim[%d] = %u is outside 1..%u on %s", name, d,
                                dim[d], caps->max_cube_dim[d], kern->dev->name);
        units *= dim[d];
    }
    if (caps->max_cube_units && units > caps->max_cube_units)
        return em_set_error(EM_ERR_INVALID,
                            "kernel %s: a cube of %u x %u x %u = %llu units exceeds the %u units "
                            "per cube of %s",
                            name, dim[0], dim[1], dim[2], (unsigned long long)units,
                            caps->max_cube_units, kern->dev->name);
    uint32_t fixed[3];
    em_ir_cube_dim(kern->ir, fixed);
    if ((fixed[0] || fixed[1] || fixed[2]) &&
        (fixed[0] != dim[0] || fixed[1] != dim[1] || fixed[2] != dim[2]))
        return em_set_error(EM_ERR_INVALID,
                            "kernel %s: was built for cubes of %u x %u x %u units, launched with "
                            "%u x %u x %u",
                            name, fixed[0], fixed[1], fixed[2], dim[0], dim[1], dim[2]);
    uint32_t cl = em_ir_cluster_dim(kern->ir);
    if (count[0] % cl)
        return em_set_error(EM_ERR_INVALID,
                            "kernel %s: its clusters are of %u cubes along x, launched with %u "
                            "cubes along x (not a multiple)",
                            name, cl, count[0]);
    *cubes = (uint64_t)count[0] * count[1] * count[2];
    if (*cubes && units * *cubes > ((uint64_t)1 << 32))
        return em_set_error(EM_ERR_INVALID,
                            "kernel %s: a grid of %llu cubes of %llu units exceeds 2^32 units "
                            "(positions are u32)",
                            name, (unsigned long long)*cubes, (unsigned long long)units);
    return EM_OK;
}

#define STACK_ARGS 16

em_status em_launch(em_kernel *kernel, const uint32_t cube_count[3], const uint32_t cube_dim[3],
                    const em_arg *args, size_t nargs)
{
    /* the profiler's only cost while it is off; a recorded launch runs later, in its graph */
    if (em_rt_profiling() && !(kernel && kernel->dev->recording))
        return em_rt_profile_launch(kernel, cube_count, cube_dim, args, nargs);
    return em_rt_launch(kernel, cube_count, cube_dim, args, nargs);
}

em_status em_rt_launch(em_kernel *kernel, const uint32_t cube_count[3], const uint32_t cube_dim[3],
                       const em_arg *args, size_t nargs)
{
    if (!kernel || !cube_count || !cube_dim)
        return em_set_error(EM_ERR_INVALID, "em_launch: no kernel or grid");
    const em_ir_kernel *ir = kernel->ir;
    size_t np = em_ir_param_count(ir);
    if (nargs != np || (np && !args)) {
        char names[512] = "";
        size_t used = 0;
        for (size_t i = 0; i < np && used < sizeof(names); i++)
            used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s", i ? ", " : "",
                                     param_name(ir, i));
        return em_set_error(EM_ERR_INVALID, "kernel %s: expects %zu argument%s (%s), got %zu",
                            em_ir_kernel_name(ir), np, np == 1 ? "" : "s", names,
                            args ? nargs : 0);
    }
    uint64_t cubes = 0;
    em_status st = check_grid(kernel, cube_count, cube_dim, &cubes);
    if (st != EM_OK)
        return st;
    em_drv_arg stack[STACK_ARGS];
    memset(stack, 0, sizeof(stack));
    em_drv_arg *resolved = np <= STACK_ARGS ? stack : calloc(np, sizeof(*resolved));
    if (!resolved)
        return em_set_error(EM_ERR_NOMEM, "em_launch: out of memory");
    /* the launch's number, stamped on the buffers it may write (em_buffer_settled) */
    em_device *dev = kernel->dev;
    uint64_t seq = __atomic_add_fetch(&dev->launch_seq, 1, __ATOMIC_RELAXED);
    for (size_t i = 0; i < np && st == EM_OK; i++) {
        const em_ir_param *p = em_ir_param_at(ir, i);
        if (p->kind == EM_PARAM_BUFFER) {
            const em_ir_memory *mem = em_ir_mem_at(ir, p->id);
            st = check_buffer(kernel, i, mem, &args[i], &resolved[i]);
            if (st == EM_OK && (mem->access & EM_WRITE))
                __atomic_store_n(&args[i].buf->written, seq, __ATOMIC_RELAXED);
        } else
            st = check_scalar(kernel, i, em_ir_value_at(ir, p->id), &args[i], &resolved[i]);
    }
    if (st == EM_OK && cubes) {
        em_drv_launch launch;
        memcpy(launch.cube_count, cube_count, sizeof(launch.cube_count));
        memcpy(launch.cube_dim, cube_dim, sizeof(launch.cube_dim));
        launch.args = resolved;
        launch.nargs = np;
        em_rt_pool_note_launch(dev, em_ir_kernel_name(ir));
        if (dev->recording)
            st = em_rt_graph_record_launch(dev->recording, kernel->fn, &launch);
        else
            st = dev->drv->launch(dev->state, kernel->fn, &launch);
        if (st != EM_OK)
            em_error_context("kernel %s on %s", em_ir_kernel_name(ir), dev->name);
    }
    if (resolved != stack)
        free(resolved);
    return st;
}

/* ---- line width ------------------------------------------------------------------------------ */

static bool width_fits(unsigned w, unsigned rank, const int64_t *shape, const int64_t *stride,
                       int64_t offset)
{
    if (offset % w)
        return false;
    if (shape[rank - 1] % w)
        return false;
    for (unsigned d = 0; d + 1 < rank; d++)
        if (shape[d] != 1 && stride[d] % w) /* a dim of size 1 never moves by its stride */
            return false;
    return true;
}

unsigned em_pick_line_width(unsigned rank, const int64_t *shape, const int64_t *stride,
                            int64_t offset, const unsigned *candidates, size_t ncandidates)
{
    if (rank == 0 || !shape || !stride || !candidates)
        return 1;
    if (stride[rank - 1] != 1)
        return 1;
    unsigned best = 1;
    for (size_t i = 0; i < ncandidates; i++) {
        unsigned w = candidates[i];
        if (w > best && w <= EM_MAX_LANES && width_fits(w, rank, shape, stride, offset))
            best = w;
    }
    return best;
}
