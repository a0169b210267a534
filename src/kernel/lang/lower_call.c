/* lower_call.c — builtin function calls during lowering: math, bit counts, min/max/clamp/fma/
 * select, memory metadata (len, shape, stride, rank), lanes, barriers and fences, plane ops,
 * atomics, cooperative matrices, print, and the comptime queries has(), sizeof(), is_float(). Each
 * checks its operands' types and emits the IR op of the builtin table. */
#include <stdio.h>
#include <string.h>

#include "kernel/lang/lower.h"

typedef struct call {
    lower *L;              /* the lowering */
    const ast_expr *e;     /* the call */
    const lang_builtin *b; /* the builtin */
    lv a[LANG_MAX_ARGS];   /* lowered arguments */
} call;

static lpos argpos(const call *c, unsigned i)
{
    return c->e->args[i]->pos;
}

/* Describes argument i for messages: "argument 1 of 'exp'". */
static const char *argname(const call *c, unsigned i, char *buf, size_t n)
{
    snprintf(buf, n, "argument %u of '%s'", i + 1, c->b->name);
    return buf;
}

/* Requires argument i to be a typed value (literals get `lit` when given, else their default). */
static bool value_arg(call *c, unsigned i, const em_type *lit)
{
    char w[96];
    lv *x = &c->a[i];
    if (x->kind == V_ERR || !em_lang_need_value(c->L, x, argpos(c, i), argname(c, i, w, sizeof(w))))
        return false;
    if (em_lang_lv_is_untyped(x))
        *x = lit ? em_lang_coerce(c->L, *x, *lit, argpos(c, i), argname(c, i, w, sizeof(w)))
                 : em_lang_lv_default(c->L, *x, argpos(c, i));
    return x->kind != V_ERR;
}

static bool kind_error(call *c, unsigned i, const char *need)
{
    char d[96];
    em_lang_lv_desc(&c->a[i], d, sizeof(d));
    em_lang_lerr(c->L, argpos(c, i), NULL, "'%s' needs %s, got %s", c->b->name, need, d);
    return false;
}

/* Unifies arguments [from, to) of a lane-wise op to one type (broadcasting) and returns it. */
static bool unify_args(call *c, unsigned from, unsigned to, em_type *out)
{
    for (unsigned i = from + 1; i < to; i++) {
        for (unsigned j = from; j < i; j++)
            if (!em_lang_unify2(c->L, &c->a[j], &c->a[i], argpos(c, i), c->b->name)) return false;
    }
    bool all_untyped = true;
    for (unsigned i = from; i < to; i++) all_untyped &= em_lang_lv_is_untyped(&c->a[i]);
    if (all_untyped) {
        bool fl = false;
        for (unsigned i = from; i < to; i++) fl |= c->a[i].kind == V_ULIT_FLOAT;
        em_type t = em_ty(fl ? EM_F32 : EM_I32);
        for (unsigned i = from; i < to; i++)
            c->a[i] = em_lang_coerce(c->L, c->a[i], t, argpos(c, i), "an argument");
    }
    em_type t = {0, 0};
    for (unsigned i = from; i < to; i++) {
        if (c->a[i].kind == V_ERR) return false;
        if (i == from || c->a[i].ty.lanes > t.lanes) t = c->a[i].ty;
    }
    *out = t;
    return true;
}

static em_ir_val mat(call *c, unsigned i)
{
    return em_lang_materialize(c->L, &c->a[i]);
}

static lv emit1(call *c, em_type t, em_ir_val a)
{
    return em_lang_lv_rt(t, em_ir_emit(c->L->k, (em_ir_op)c->b->ir_op, t, a, 0, 0, 0, 0, 0));
}

/* ---- math
 * ---------------------------------------------------------------------------------------- */

static lv math1(call *c)
{
    em_type f32 = em_ty(EM_F32);
    if (!value_arg(c, 0, &f32)) return em_lang_lv_err();
    em_scalar s = (em_scalar)c->a[0].ty.scalar;
    switch (c->b->cls) {
    case BI_MATH1:
        if (!em_scalar_is_float(s)) return kind_error(c, 0, "a float"), em_lang_lv_err();
        return emit1(c, c->a[0].ty, mat(c, 0));
    case BI_ABS:
        if (s == EM_BOOL) return kind_error(c, 0, "a number"), em_lang_lv_err();
        return emit1(c, c->a[0].ty, mat(c, 0));
    case BI_FLOATPRED:
        if (!em_scalar_is_float(s)) return kind_error(c, 0, "a float"), em_lang_lv_err();
        return emit1(c, (em_type){EM_BOOL, c->a[0].ty.lanes}, mat(c, 0));
    default: /* BI_BITCOUNT */
        if (!em_scalar_is_int(s)) return kind_error(c, 0, "an integer"), em_lang_lv_err();
        return emit1(c, (em_type){EM_U32, c->a[0].ty.lanes}, mat(c, 0));
    }
}

static lv math_n(call *c)
{
    unsigned n = c->b->max_args;
    for (unsigned i = 0; i < n; i++) {
        char w[96];
        if (c->a[i].kind == V_ERR ||
            !em_lang_need_value(c->L, &c->a[i], argpos(c, i), argname(c, i, w, sizeof(w))))
            return em_lang_lv_err();
    }
    em_type t;
    if (c->b->cls == BI_SELECT) {
        lv *cond = &c->a[0];
        if (em_lang_lv_is_untyped(cond) || cond->ty.scalar != EM_BOOL)
            return kind_error(c, 0, "a bool condition"), em_lang_lv_err();
        if (!unify_args(c, 1, 3, &t)) return em_lang_lv_err();
        if (cond->ty.lanes > 1 && t.lanes > 1 && cond->ty.lanes != t.lanes)
            return em_lang_lerr(c->L, argpos(c, 0), NULL,
                                "select: the condition has %u lanes but the values have %u",
                                cond->ty.lanes, t.lanes);
        if (cond->ty.lanes > t.lanes) t.lanes = cond->ty.lanes;
        return em_lang_lv_rt(
            t, em_ir_emit(c->L->k, EM_OP_SELECT, t, mat(c, 0), mat(c, 1), mat(c, 2), 0, 0, 0));
    }
    if (!unify_args(c, 0, n, &t)) return em_lang_lv_err();
    em_scalar s = (em_scalar)t.scalar;
    bool need_float = c->b->cls == BI_POW || c->b->cls == BI_FMA;
    if (need_float && !em_scalar_is_float(s)) return kind_error(c, 0, "floats"), em_lang_lv_err();
    if (s == EM_BOOL) return kind_error(c, 0, "numbers"), em_lang_lv_err();
    if (c->b->cls == BI_MINMAX && c->a[0].kind == V_CONST && c->a[1].kind == V_CONST) {
        /* fold min/max of constants so that they stay comptime */
        lv lt = em_lang_binop(c->L, T_LT, c->a[0], c->a[1], c->e->pos);
        if (lt.kind != V_CONST) return em_lang_lv_err();
        bool pick_first = (c->b->ir_op == EM_OP_MIN) == (lt.c.i != 0);
        lv r = pick_first ? c->a[0] : c->a[1];
        r.ty = t;
        return r;
    }
    em_ir_val v[3] = {0};
    for (unsigned i = 0; i < n; i++) v[i] = mat(c, i);
    return em_lang_lv_rt(t,
                         em_ir_emit(c->L->k, (em_ir_op)c->b->ir_op, t, v[0], v[1], v[2], 0, 0, 0));
}

/* ---- memory -------------------------------------------------------------------------------------
 */

static bool mem_arg(call *c, unsigned i)
{
    if (c->a[i].kind == V_MEM) return true;
    if (c->a[i].kind != V_ERR) kind_error(c, i, "a tensor or array");
    return false;
}

static lv metadata(call *c)
{
    if (c->b->cls == BI_LANES) {
        if (!value_arg(c, 0, NULL)) return em_lang_lv_err();
        return em_lang_lv_const_uint(EM_U32, c->a[0].ty.lanes);
    }
    if (!mem_arg(c, 0)) return em_lang_lv_err();
    lv *m = &c->a[0];
    switch (c->b->cls) {
    case BI_LEN:
        if (m->space != EM_MEM_GLOBAL) return em_lang_lv_const_uint(EM_U32, m->length);
        return em_lang_lv_rt(em_ty(EM_U32), em_ir_len(c->L->k, m->mem));
    case BI_RANK:
        return em_lang_lv_const_uint(EM_U32, m->rank);
    default: { /* shape, stride */
        if (m->space != EM_MEM_GLOBAL || m->rank == 0)
            return em_lang_lerr(c->L, argpos(c, 0),
                                "declare it as tensor(T, RANK) to get its shape and strides",
                                "'%s' needs a tensor, but '%s' is an array without shape",
                                c->b->name, m->name ? m->name : "?");
        int64_t d;
        if (!em_lang_comptime_int(c->L, &c->a[1], argpos(c, 1), "the dimension", &d))
            return em_lang_lv_err();
        if (d < 0 || d >= m->rank)
            return em_lang_lerr(c->L, argpos(c, 1), NULL,
                                "dimension %lld is out of range for tensor '%s' of rank %u",
                                (long long)d, m->name ? m->name : "?", m->rank);
        em_ir_val v = c->b->ir_op == EM_OP_SHAPE ? em_ir_shape(c->L->k, m->mem, (unsigned)d)
                                                 : em_ir_stride(c->L->k, m->mem, (unsigned)d);
        return em_lang_lv_rt(em_ty(EM_U32), v);
    }
    }
}

/* ---- plane ops
 * ------------------------------------------------------------------------------------ */

static lv plane(call *c)
{
    em_ir_kernel *k = c->L->k;
    em_ir_op op = (em_ir_op)c->b->ir_op;
    if (c->b->cls == BI_PLANE_BOOL) {
        if (!value_arg(c, 0, NULL)) return em_lang_lv_err();
        if (c->a[0].ty.scalar != EM_BOOL || c->a[0].ty.lanes != 1)
            return kind_error(c, 0, "a bool"), em_lang_lv_err();
        return em_lang_lv_rt(op == EM_OP_PLANE_BALLOT ? em_ty(EM_U32) : em_ty(EM_BOOL),
                             em_ir_plane(k, op, mat(c, 0), 0));
    }
    if (!value_arg(c, 0, NULL)) return em_lang_lv_err();
    em_type t = c->a[0].ty;
    if (c->b->cls == BI_PLANE1) {
        if (t.scalar == EM_BOOL) return kind_error(c, 0, "a number"), em_lang_lv_err();
        return em_lang_lv_rt(t, em_ir_plane(k, op, mat(c, 0), 0));
    }
    lv lane = em_lang_to_index(c->L, c->a[1], argpos(c, 1),
                               op == EM_OP_PLANE_BROADCAST || op == EM_OP_PLANE_SHUFFLE
                                   ? "the source lane"
                                   : "the lane offset");
    if (lane.kind == V_ERR) return lane;
    return em_lang_lv_rt(t, em_ir_plane(k, op, mat(c, 0), em_lang_materialize(c->L, &lane)));
}

/* ---- atomics
 * -------------------------------------------------------------------------------------- */

static lv atomic(call *c)
{
    em_ir_op op = (em_ir_op)c->b->ir_op;
    if (!mem_arg(c, 0)) return em_lang_lv_err();
    lv *m = &c->a[0];
    const char *mname = m->name ? m->name : "?";
    if (m->space == EM_MEM_LOCAL)
        return em_lang_lerr(c->L, argpos(c, 0), NULL,
                            "atomics need global or shared memory, but '%s' is a local array",
                            mname);
    if (!m->writable && op != EM_OP_ATOMIC_LOAD)
        return em_lang_lerr(c->L, argpos(c, 0), NULL, "cannot write to read-only tensor '%s'",
                            mname);
    em_scalar s = (em_scalar)m->ty.scalar;
    char tn[48];
    em_lang_type_str(m->ty, tn, sizeof(tn));
    bool float_ok = op == EM_OP_ATOMIC_ADD || op == EM_OP_ATOMIC_XCHG || op == EM_OP_ATOMIC_LOAD ||
                    op == EM_OP_ATOMIC_STORE;
    bool int32_64 = em_scalar_is_int(s) && em_scalar_size(s) >= 4;
    if (m->ty.lanes != 1 || !(int32_64 || (s == EM_F32 && float_ok)))
        return em_lang_lerr(
            c->L, argpos(c, 0), NULL, "'%s' cannot work on elements of type '%s' (%s)", c->b->name,
            tn, float_ok ? "32/64-bit integers and f32 only" : "32/64-bit integers only");
    lv ix = em_lang_to_index(c->L, c->a[1], argpos(c, 1), "an index");
    if (ix.kind == V_ERR) return ix;
    em_ir_val v[2] = {0, 0};
    for (unsigned i = 2; i < c->e->nargs; i++) {
        char w[96];
        lv x = em_lang_coerce(c->L, c->a[i], m->ty, argpos(c, i), argname(c, i, w, sizeof(w)));
        if (x.kind == V_ERR) return x;
        v[i - 2] = em_lang_materialize(c->L, &x);
    }
    em_ir_val r = em_ir_atomic(c->L->k, op, m->mem, em_lang_materialize(c->L, &ix), v[0], v[1]);
    return op == EM_OP_ATOMIC_STORE ? em_lang_lv_void() : em_lang_lv_rt(m->ty, r);
}

/* ---- matrices
 * ------------------------------------------------------------------------------------- */

static const em_ir_value *frag(call *c, unsigned i)
{
    if (c->a[i].kind != V_MATRIX) {
        if (c->a[i].kind != V_ERR) kind_error(c, i, "a matrix fragment");
        return NULL;
    }
    return em_ir_value_at(c->L->k, c->a[i].v);
}

static bool layout_arg(call *c, unsigned i, em_mat_layout *out)
{
    *out = EM_ROW_MAJOR;
    if (i >= c->e->nargs) return true;
    if (c->a[i].kind != V_LAYOUT) {
        if (c->a[i].kind != V_ERR) kind_error(c, i, "a layout (row_major or col_major)");
        return false;
    }
    *out = (em_mat_layout)c->a[i].c.i;
    return true;
}

static lv matrix_op(call *c)
{
    em_ir_kernel *k = c->L->k;
    if (c->b->cls == BI_MAT_MMA) {
        static const uint8_t roles[4] = {EM_MAT_ACC, EM_MAT_A, EM_MAT_B, EM_MAT_ACC};
        static const char *const role_names[3] = {"a", "b", "acc"};
        const em_ir_value *f[4];
        for (unsigned i = 0; i < 4; i++) {
            if (!(f[i] = frag(c, i))) return em_lang_lv_err();
            if (f[i]->mat_role != roles[i])
                return em_lang_lerr(c->L, argpos(c, i),
                                    "mat_mma(d, a, b, c) computes d = a * b + c",
                                    "argument %u of 'mat_mma' must be a matrix of role '%s'", i + 1,
                                    role_names[roles[i]]);
        }
        for (unsigned i = 1; i < 4; i++)
            if (f[i]->mat_m != f[0]->mat_m || f[i]->mat_n != f[0]->mat_n ||
                f[i]->mat_k != f[0]->mat_k)
                return em_lang_lerr(c->L, argpos(c, i), NULL,
                                    "matrix '%s' has shape %ux%ux%u, but '%s' has %ux%ux%u",
                                    c->a[i].name ? c->a[i].name : "?", f[i]->mat_m, f[i]->mat_n,
                                    f[i]->mat_k, c->a[0].name ? c->a[0].name : "?", f[0]->mat_m,
                                    f[0]->mat_n, f[0]->mat_k);
        if (f[0]->type.scalar != f[3]->type.scalar || f[1]->type.scalar != f[2]->type.scalar)
            return em_lang_lerr(
                c->L, c->e->op_pos, NULL,
                "mat_mma: a and b must share one element type, and so must c and d");
        em_ir_mat_mma(k, c->a[0].v, c->a[1].v, c->a[2].v, c->a[3].v);
        return em_lang_lv_void();
    }
    const em_ir_value *f = frag(c, 0);
    if (!f) return em_lang_lv_err();
    em_type et = em_ty((em_scalar)f->type.scalar);
    if (c->b->cls == BI_MAT_FILL) {
        lv x = em_lang_coerce(c->L, c->a[1], et, argpos(c, 1), "the fill value");
        if (x.kind == V_ERR) return x;
        em_ir_mat_fill(k, c->a[0].v, em_lang_materialize(c->L, &x));
        return em_lang_lv_void();
    }
    /* mat_load(frag, mem, offset, stride[, layout]) / mat_store(frag, mem, offset, stride[,
     * layout]) */
    if (!mem_arg(c, 1)) return em_lang_lv_err();
    lv *m = &c->a[1];
    if (!em_type_eq(m->ty, et)) {
        char x[48], y[48];
        em_lang_type_str(m->ty, x, sizeof(x));
        em_lang_type_str(et, y, sizeof(y));
        return em_lang_lerr(c->L, argpos(c, 1), NULL,
                            "'%s' holds '%s' elements, but the matrix holds '%s'",
                            m->name ? m->name : "?", x, y);
    }
    bool store = c->b->cls == BI_MAT_STORE;
    if (store && !m->writable)
        return em_lang_lerr(c->L, argpos(c, 1), NULL, "cannot write to read-only tensor '%s'",
                            m->name ? m->name : "?");
    lv off = em_lang_to_index(c->L, c->a[2], argpos(c, 2), "the offset");
    lv stride = em_lang_to_index(c->L, c->a[3], argpos(c, 3), "the stride");
    em_mat_layout layout;
    if (off.kind == V_ERR || stride.kind == V_ERR || !layout_arg(c, 4, &layout))
        return em_lang_lv_err();
    /* one by one: the IR's order must not hang on the C compiler's order of arguments */
    em_ir_val voff = em_lang_materialize(c->L, &off), vstride = em_lang_materialize(c->L, &stride);
    if (store)
        em_ir_mat_store(k, m->mem, voff, vstride, c->a[0].v, layout);
    else
        em_ir_mat_load(k, c->a[0].v, m->mem, voff, vstride, layout);
    return em_lang_lv_void();
}

/* ---- asynchronous copies
 * --------------------------------------------------------------------------- */

/* Whether the target copies global to shared memory asynchronously (CUDA: cp.async from sm_80 on;
 * the CUDA code generator falls back to plain copies for older devices itself). Elsewhere
 * copy_async becomes loads and stores, and commit / wait disappear. */
static bool async_copies(const lower *L)
{
    return L->b->caps && !strcmp(L->b->caps->target, "cuda");
}

/* prefetch(t, i): t[i] will be read soon. On CUDA its cache line is fetched into L2
 * ("cuda.prefetch_l2@M"); elsewhere, and for shared memory, nothing happens: a hint with no
 * effect on results. */
static lv prefetch(call *c)
{
    if (!mem_arg(c, 0)) return em_lang_lv_err();
    lv i = em_lang_to_index(c->L, c->a[1], argpos(c, 1), "the index");
    if (i.kind == V_ERR) return em_lang_lv_err();
    if (async_copies(c->L) && c->a[0].space == EM_MEM_GLOBAL) {
        em_ir_val idx = em_lang_materialize(c->L, &i);
        char name[40];
        snprintf(name, sizeof name, "cuda.prefetch_l2@%u", (unsigned)c->a[0].mem);
        em_ir_intrinsic_mem(c->L->k, name, (em_type){0, 0}, c->a[0].mem, &idx, 1);
    }
    return em_lang_lv_void();
}

/* dependency_wait(): waits until the launches this one depends on (the kernels before it on its
 * queue) have completed and their writes are visible. Every kernel waits so at its start unless
 * it calls this itself; before the call it may compute and prefetch but must not read memory
 * that earlier launches write, nor write any. So it must run in every unit: it is accepted only
 * in the kernel's top-level statements (outside branches and loops). On CUDA for sm_90 it is
 * "cuda.griddep_wait" (griddepcontrol.wait: programmatic dependent launch, codegen/cuda.c);
 * elsewhere launches run one after another anyway and it is nothing. */
static lv dependency_wait(call *c)
{
    if (c->L->ir_depth != 0)
        return em_lang_lerr(c->L, c->e->pos, "call it among the kernel's top-level statements",
                            "dependency_wait() inside a branch or loop: every unit must wait");
    if (async_copies(c->L)) em_ir_intrinsic(c->L->k, "cuda.griddep_wait", (em_type){0, 0}, NULL, 0);
    return em_lang_lv_void();
}

/* The zero of scalar kind s as an IR constant. */
static em_ir_val zero_of(em_ir_kernel *k, em_scalar s)
{
    if (em_scalar_is_float(s)) return em_ir_const_float(k, em_ty(s), 0.0);
    return em_ir_const_int(k, em_ty(s), 0);
}

/* dst[i + j] = valid ? src[s + j] : 0 for j < n, as plain loads and stores. */
static void copy_plain(call *c, em_ir_mem dst, em_ir_val i, em_ir_mem src, em_ir_val s, unsigned n,
                       em_scalar elem, const lv *valid)
{
    em_ir_kernel *k = c->L->k;
    bool cond = valid && valid->kind != V_CONST;
    if (valid && valid->kind == V_CONST && !valid->c.i) {
        for (unsigned j = 0; j < n; j++) {
            em_ir_val at = em_ir_binary(k, EM_OP_ADD, i, em_ir_u32(k, j));
            em_ir_store(k, dst, at, zero_of(k, elem));
        }
        return;
    }
    if (cond) {
        if (!em_lang_ir_open(c->L, c->e->op_pos)) return;
        em_ir_if_begin(k, em_lang_materialize(c->L, valid));
    }
    for (unsigned j = 0; j < n; j++) {
        em_ir_val x = em_ir_load(k, src, em_ir_binary(k, EM_OP_ADD, s, em_ir_u32(k, j)));
        em_ir_val at = em_ir_binary(k, EM_OP_ADD, i, em_ir_u32(k, j));
        em_ir_store(k, dst, at, x);
    }
    if (cond) {
        em_ir_else(k);
        for (unsigned j = 0; j < n; j++) {
            em_ir_val at = em_ir_binary(k, EM_OP_ADD, i, em_ir_u32(k, j));
            em_ir_store(k, dst, at, zero_of(k, elem));
        }
        em_lang_ir_close(c->L);
    }
}

/* copy_async(dst, i, src, j, count[, valid]), copy_async_commit(), copy_async_wait(pending). */
static lv copy_op(call *c)
{
    em_ir_kernel *k = c->L->k;
    bool async = async_copies(c->L);
    if (c->b->cls == BI_COPY_SYNC) {
        int64_t n = 0;
        if (c->b->ir_op == EM_OP_COPY_WAIT) {
            if (!em_lang_comptime_int(c->L, &c->a[0], argpos(c, 0), "the number of pending groups",
                                      &n))
                return em_lang_lv_err();
            if (n < 0 || n > 64)
                return em_lang_lerr(c->L, argpos(c, 0), NULL,
                                    "copy_async_wait takes 0 to 64 pending groups, got %lld",
                                    (long long)n);
        }
        if (async && c->b->ir_op == EM_OP_COPY_WAIT) em_ir_copy_wait(k, (unsigned)n);
        if (async && c->b->ir_op == EM_OP_COPY_COMMIT) em_ir_copy_commit(k);
        return em_lang_lv_void();
    }
    if (!mem_arg(c, 0) || !mem_arg(c, 2)) return em_lang_lv_err();
    lv *d = &c->a[0], *s = &c->a[2];
    if (d->space != EM_MEM_SHARED)
        return em_lang_lerr(c->L, argpos(c, 0), NULL,
                            "copy_async copies into shared memory, but '%s' is not shared",
                            d->name ? d->name : "?");
    if (s->space != EM_MEM_GLOBAL)
        return em_lang_lerr(c->L, argpos(c, 2), NULL,
                            "copy_async copies from a tensor or array parameter, but '%s' is not "
                            "one",
                            s->name ? s->name : "?");
    em_scalar elem = (em_scalar)d->ty.scalar;
    if (!em_type_eq(d->ty, s->ty) || d->ty.lanes != 1 || elem == EM_BOOL) {
        char x[48], y[48];
        em_lang_type_str(d->ty, x, sizeof(x));
        em_lang_type_str(s->ty, y, sizeof(y));
        return em_lang_lerr(c->L, argpos(c, 2), NULL,
                            "copy_async copies numbers between memories of one scalar type, got "
                            "'%s' and '%s'",
                            x, y);
    }
    lv di = em_lang_to_index(c->L, c->a[1], argpos(c, 1), "the destination index");
    lv si = em_lang_to_index(c->L, c->a[3], argpos(c, 3), "the source index");
    if (di.kind == V_ERR || si.kind == V_ERR) return em_lang_lv_err();
    int64_t n = 0;
    if (!em_lang_comptime_int(c->L, &c->a[4], argpos(c, 4), "the count", &n))
        return em_lang_lv_err();
    int64_t bytes = n * (int64_t)em_scalar_size(elem);
    if (n < 1 || (bytes != 4 && bytes != 8 && bytes != 16))
        return em_lang_lerr(c->L, argpos(c, 4), "copy 4, 8 or 16 bytes at once",
                            "copy_async of %lld '%s' elements moves %lld bytes", (long long)n,
                            em_scalar_name(elem), (long long)bytes);
    lv valid = {0};
    bool has_valid = c->e->nargs > 5;
    if (has_valid) {
        valid = em_lang_coerce(c->L, c->a[5], em_ty(EM_BOOL), argpos(c, 5), "the condition");
        if (valid.kind == V_ERR ||
            !em_lang_need_cond(c->L, &valid, argpos(c, 5), "the condition of copy_async"))
            return em_lang_lv_err();
    }
    em_ir_val i = em_lang_materialize(c->L, &di), j = em_lang_materialize(c->L, &si);
    if (async) {
        em_ir_val v = 0;
        if (has_valid && valid.kind != V_CONST) v = em_lang_materialize(c->L, &valid);
        if (has_valid && valid.kind == V_CONST) v = valid.c.i ? 0 : em_ir_const_bool(k, false);
        em_ir_copy_async(k, d->mem, i, s->mem, j, (unsigned)n, v);
    } else {
        copy_plain(c, d->mem, i, s->mem, j, (unsigned)n, elem, has_valid ? &valid : NULL);
    }
    return em_lang_lv_void();
}

/* ---- print, queries -----------------------------------------------------------------------------
 */

static lv print(call *c)
{
    const char *fmt = c->e->args[0]->str;
    unsigned holes = 0;
    for (const char *p = fmt; (p = strstr(p, "%v")) != NULL; p += 2) holes++;
    unsigned n = c->e->nargs - 1;
    if (holes != n)
        return em_lang_lerr(c->L, argpos(c, 0), "write one %v in the format for each value",
                            "print format has %u '%%v' but %u value%s given", holes, n,
                            n == 1 ? " is" : "s are");
    if (n > EM_IR_MAX_ARGS)
        return em_lang_lerr(c->L, c->e->op_pos, NULL, "print takes at most %d values",
                            EM_IR_MAX_ARGS);
    em_ir_val v[EM_IR_MAX_ARGS];
    for (unsigned i = 0; i < n; i++) {
        if (!value_arg(c, i + 1, NULL)) return em_lang_lv_err();
        v[i] = mat(c, i + 1);
    }
    em_ir_print(c->L->k, fmt, v, n);
    return em_lang_lv_void();
}

static bool caps_has(const em_caps *caps, const char *name)
{
    if (!caps) return false;
    if (!strcmp(name, "plane_ops")) return caps->plane_ops;
    if (!strcmp(name, "matrix")) return caps->matrix;
    if (!strcmp(name, "float_atomic_add")) return caps->float_atomic_add;
    if (!strcmp(name, "print")) return caps->print;
    if (!strcmp(name, "wgmma")) return em_lang_wgmma_native(caps);
    if (!strcmp(name, "mbarrier")) return em_lang_mbarrier_native(caps);
    if (!strcmp(name, "tma")) return em_lang_mbarrier_native(caps);
    return !strcmp(caps->target, name);
}

static lv query(call *c)
{
    if (c->b->cls == BI_HAS)
        return em_lang_lv_const_bool(caps_has(c->L->b->caps, c->e->args[0]->name));
    lv *x = &c->a[0];
    em_type t;
    if (x->kind == V_TYPE) {
        t = x->ty;
    } else if (value_arg(c, 0, NULL)) {
        t = x->ty;
    } else {
        return em_lang_lv_err();
    }
    em_scalar s = (em_scalar)t.scalar;
    if (c->b->cls == BI_SIZEOF) return em_lang_lv_const_uint(EM_U32, em_scalar_size(s) * t.lanes);
    switch (c->b->imm) {
    case 0:
        return em_lang_lv_const_bool(em_scalar_is_float(s));
    case 1:
        return em_lang_lv_const_bool(em_scalar_is_int(s));
    default:
        return em_lang_lv_const_bool(em_scalar_is_signed(s));
    }
}

lv em_lang_lower_builtin(lower *L, const ast_expr *e)
{
    call c = {L, e, &em_lang_builtins_table[e->slot], {{0}}};
    bool ok = true;
    unsigned from = c.b->cls == BI_PRINT ? 1 : 0;
    if (c.b->cls != BI_HAS) {
        for (unsigned i = from; i < e->nargs && i < LANG_MAX_ARGS; i++) {
            c.a[i] = em_lang_lower_expr(L, e->args[i], NULL);
            ok &= c.a[i].kind != V_ERR;
        }
    }
    if (!ok) return em_lang_lv_err();
    switch (c.b->cls) {
    case BI_MATH1:
    case BI_ABS:
    case BI_FLOATPRED:
    case BI_BITCOUNT:
        return math1(&c);
    case BI_MINMAX:
    case BI_POW:
    case BI_CLAMP:
    case BI_FMA:
    case BI_SELECT:
        return math_n(&c);
    case BI_LEN:
    case BI_SHAPE:
    case BI_RANK:
    case BI_LANES:
        return metadata(&c);
    case BI_SYNC:
        if (c.b->ir_op == EM_OP_SYNC_CUBE)
            em_ir_sync_cube(L->k);
        else if (c.b->ir_op == EM_OP_SYNC_PLANE)
            em_ir_sync_plane(L->k);
        else
            em_ir_fence(L->k, c.b->imm);
        return em_lang_lv_void();
    case BI_PLANE1:
    case BI_PLANE_BOOL:
    case BI_PLANE2:
        return plane(&c);
    case BI_ATOMIC:
        return atomic(&c);
    case BI_MAT_FILL:
    case BI_MAT_LOAD:
    case BI_MAT_MMA:
    case BI_MAT_STORE:
        return matrix_op(&c);
    case BI_COPY_ASYNC:
    case BI_COPY_SYNC:
        return copy_op(&c);
    case BI_WGMMA:
        return em_lang_lower_wgmma(L, e, c.b, c.a);
    case BI_MBARRIER:
        return em_lang_lower_mbarrier(L, e, c.b, c.a);
    case BI_PREFETCH:
        return prefetch(&c);
    case BI_DEPWAIT:
        return dependency_wait(&c);
    case BI_TMA:
        return em_lang_lower_tma(L, e, c.b, c.a);
    case BI_PRINT:
        return print(&c);
    case BI_HAS:
    case BI_SIZEOF:
    case BI_TYPEPRED:
        return query(&c);
    default:
        return em_lang_lv_err();
    }
}
