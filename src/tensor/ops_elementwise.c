/* ops_elementwise.c — unary, scalar, binary (NumPy broadcasting), where, masked_fill and cast,
 * all through the kernels of src/kernels/tensor_elementwise.ek. The host side broadcasts the
 * operands by strides (stride 0 on broadcast dims), merges dims that are contiguous for every
 * operand so that a contiguous op becomes a rank-1 walk, and picks the widest line width that
 * every operand allows. With fusion on (tensor/fusion.h), an op whose output is a fresh buffer
 * (or a donated input's) is recorded instead of launched; a fresh output's buffer is deferred
 * (tn_new_deferred): allocated when the op or its fused tree runs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tensor/fusion.h"
#include "tensor/internal.h"

/* ---- geometry -------------------------------------------------------------------------------- */

void tn_expand_geom(const em_tensor *t, int rank, const int64_t *shape, int64_t *stride)
{
    int off = rank - t->rank;
    for (int i = 0; i < rank; i++) {
        int j = i - off;
        stride[i] = (j < 0 || (t->shape[j] == 1 && shape[i] != 1)) ? 0 : t->stride[j];
    }
}

bool tn_broadcast(const char *op, const em_tensor *a, const em_tensor *b, int *rank, int64_t *shape)
{
    int r = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            em_set_error(EM_ERR_INVALID, "%s: shapes %s and %s cannot be broadcast", op,
                         em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb));
            return false;
        }
        shape[i] = da == 1 ? db : da;
    }
    *rank = r;
    return true;
}

void fu_walk_build(fu_walk *w, int rank, const int64_t *shape, int n, int64_t (*strides)[EM_MAX_RANK])
{
    w->rank = 0;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 1) continue;
        int r = w->rank;
        if (r > 0) {
            bool merge = true;
            for (int k = 0; k < n; k++)
                if (w->stride[k][r - 1] != strides[k][i] * shape[i]) merge = false;
            if (merge) {
                w->shape[r - 1] *= shape[i];
                for (int k = 0; k < n; k++) w->stride[k][r - 1] = strides[k][i];
                continue;
            }
        }
        w->shape[r] = shape[i];
        for (int k = 0; k < n; k++) w->stride[k][r] = strides[k][i];
        w->rank++;
    }
    if (w->rank == 0) {
        w->rank = 1;
        w->shape[0] = 1;
        for (int k = 0; k < n; k++) w->stride[k][0] = 1;
    }
}

unsigned fu_walk_width(const fu_walk *w, em_device *dev, const em_scalar *dts, int n,
                       const int64_t *offsets)
{
    unsigned esize = 1;
    for (int k = 0; k < n; k++)
        if (em_scalar_size(dts[k]) > esize) esize = (unsigned)em_scalar_size(dts[k]);
    unsigned cands[5], nc = 0;
    for (unsigned x = em_line_lanes(em_device_caps(dev), esize); x >= 1 && nc < 5; x /= 2)
        cands[nc++] = x;
    unsigned lw = cands[0];
    for (int k = 0; k < n; k++) {
        unsigned x = em_pick_line_width((unsigned)w->rank, w->shape, w->stride[k], offsets[k], cands, nc);
        if (x < lw) lw = x;
    }
    return lw;
}

/* Launches `kernel` over the walk: operands ts[0..n-1] (the last is the output). */
static em_status run_walk(const char *op, const char *kernel, const em_lang_bind *binds, size_t nb,
                          const em_tensor *const *ts, int n, int rank, const int64_t *shape,
                          int64_t (*strides)[EM_MAX_RANK], const em_arg *scalars, int ns)
{
    int64_t numel = tn_numel(rank, shape);
    if (numel == 0) return EM_OK;
    fu_walk w;
    fu_walk_build(&w, rank, shape, n, strides);
    int64_t offs[4];
    em_scalar dts[4];
    for (int k = 0; k < n; k++) {
        offs[k] = ts[k]->offset;
        dts[k] = ts[k]->dtype;
    }
    unsigned lw = fu_walk_width(&w, ts[0]->st->dev, dts, n, offs);
    em_lang_bind b[8];
    memcpy(b, binds, nb * sizeof *b);
    b[nb++] = em_lang_bind_int("R", w.rank);
    tn_arg args[8];
    int na = 0;
    for (int k = 0; k < n; k++) args[na++] = tn_arg_geom(ts[k], w.rank, w.shape, w.stride[k], offs[k]);
    for (int k = 0; k < ns; k++) args[na++] = tn_arg_s(scalars[k]);
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)numel / lw, cubes, units);
    return tn_launch(op, ts[0]->st->dev, kernel, b, nb, lw, cubes, units, args, (size_t)na);
}

/* ---- unary ----------------------------------------------------------------------------------- */

static bool is_float_only(int code)
{
    return (code >= TN_U_EXP && code <= TN_U_ERF) || code == TN_U_SIGMOID || code == TN_U_GELU ||
           code == TN_U_GELU_TANH || code == TN_U_SILU || code == TN_U_SOFTPLUS || code == TN_U_POWS;
}

static bool is_predicate(int code)
{
    return code == TN_U_ISNAN || code == TN_U_ISINF || code == TN_U_NOT || code == TN_U_EQS ||
           code == TN_U_LTS || code == TN_U_GTS;
}

/* out = OP(t) into an existing output view of t's shape; `record`: recorded for fusion where it
 * can be (fu_record), else launched now. */
static em_status unary_launch(const char *op, const em_tensor *t, em_tensor *out, int code,
                              double p0, double p1, bool record)
{
    em_scalar ct = tn_compute_type(t->dtype);
    if (code == TN_U_COPY) ct = t->dtype == EM_BOOL ? EM_I32 : t->dtype; /* exact copies and casts */
    em_lang_bind b[5] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("U", out->dtype),
                         em_lang_bind_type("C", ct), em_lang_bind_int("OP", code),
                         em_lang_bind_type("M", tn_math_type(t->st->dev, ct))};
    int64_t strides[2][EM_MAX_RANK];
    tn_expand_geom(t, out->rank, out->shape, strides[0]);
    memcpy(strides[1], out->stride, sizeof strides[1]);
    em_arg sc[2] = {tn_scalar_arg(ct, p0), tn_scalar_arg(ct, p1)};
    if (!em_scalar_is_float(ct)) {
        sc[0].value_class = sc[1].value_class = EM_ARG_INT;
        sc[0].value.i = (int64_t)p0;
        sc[1].value.i = (int64_t)p1;
    }
    fu_desc d = {op, code == TN_U_FILL ? FU_FILL : is_predicate(code) ? FU_UPRED : FU_UNARY, code, ct,
                 b[4].type, {sc[0], sc[1]}, 0};
    int rec = record ? fu_record(&d, &t, code == TN_U_FILL ? 0 : 1, strides, out) : 0;
    if (rec) return rec > 0 ? EM_OK : em_last_status();
    const em_tensor *ts[2] = {t, out};
    return run_walk(op, "tensor_unary", b, 5, ts, 2, out->rank, out->shape, strides, sc, 2);
}

static em_status unary_into(const char *op, const em_tensor *t, em_tensor *out, int code, double p0,
                            double p1)
{
    return unary_launch(op, t, out, code, p0, p1, true);
}

em_status tn_unary_run(const char *op, const em_tensor *t, em_tensor *out, int code)
{
    return unary_launch(op, t, out, code, 0, 0, false);
}

/* The recorded op of a unary code (EM_TOP_NONE: not differentiable), with its parameters. */
static em_tensor_op unary_top(int code, double p0, double p1, em_top_params *p)
{
    static const em_tensor_op direct[] = {
        [TN_U_NEG] = EM_TOP_NEG, [TN_U_ABS] = EM_TOP_ABS, [TN_U_SIGN] = EM_TOP_SIGN,
        [TN_U_EXP] = EM_TOP_EXP, [TN_U_LOG] = EM_TOP_LN, [TN_U_LOG1P] = EM_TOP_LOG1P,
        [TN_U_EXPM1] = EM_TOP_EXPM1, [TN_U_SQRT] = EM_TOP_SQRT, [TN_U_RSQRT] = EM_TOP_RSQRT,
        [TN_U_RECIP] = EM_TOP_RECIPROCAL, [TN_U_SIN] = EM_TOP_SIN, [TN_U_COS] = EM_TOP_COS,
        [TN_U_TANH] = EM_TOP_TANH, [TN_U_ERF] = EM_TOP_ERF, [TN_U_SIGMOID] = EM_TOP_SIGMOID,
        [TN_U_RELU] = EM_TOP_RELU, [TN_U_GELU] = EM_TOP_GELU, [TN_U_GELU_TANH] = EM_TOP_GELU_TANH,
        [TN_U_SILU] = EM_TOP_SILU, [TN_U_SOFTPLUS] = EM_TOP_SOFTPLUS, [TN_U_FLOOR] = EM_TOP_FLOOR,
        [TN_U_CEIL] = EM_TOP_CEIL, [TN_U_ROUND] = EM_TOP_ROUND, [TN_U_CLAMP] = EM_TOP_CLAMP,
        [TN_U_POWS] = EM_TOP_POW_SCALAR, [TN_U_COPY] = EM_TOP_CAST, [TN_U_ADDS] = EM_TOP_ADD_SCALAR,
        [TN_U_SUBS] = EM_TOP_ADD_SCALAR, [TN_U_MULS] = EM_TOP_MUL_SCALAR,
        [TN_U_DIVS] = EM_TOP_DIV_SCALAR, [TN_U_RSUBS] = EM_TOP_RSUB_SCALAR,
        [TN_U_RDIVS] = EM_TOP_RDIV_SCALAR, [TN_U_MAXS] = EM_TOP_MAXIMUM_SCALAR,
        [TN_U_MINS] = EM_TOP_MINIMUM_SCALAR,
    };
    *p = tn_params_k(0);
    p->f[0] = code == TN_U_SUBS ? -p0 : p0;
    p->f[1] = p1;
    return code >= 0 && code < (int)(sizeof direct / sizeof *direct) ? direct[code] : EM_TOP_NONE;
}

em_tensor *tn_unary(const char *op, const em_tensor *t, int code, double p0, double p1)
{
    if (!t) return NULL;
    if (is_float_only(code) && !em_scalar_is_float(t->dtype)) {
        em_set_error(EM_ERR_INVALID, "%s: needs a floating-point tensor, got %s", op, em_scalar_name(t->dtype));
        tn_done(t);
        return NULL;
    }
    if (t->dtype == EM_BOOL && code != TN_U_NOT && code != TN_U_COPY && code != TN_U_FILL &&
        code != TN_U_EQS && code != TN_U_ISNAN && code != TN_U_ISINF) {
        em_set_error(EM_ERR_INVALID, "%s: not defined for bool tensors", op);
        tn_done(t);
        return NULL;
    }
    em_scalar odt = is_predicate(code) ? EM_BOOL : t->dtype;
    em_tensor *out;
    bool reuse = odt == t->dtype && tn_reusable(t);
    if (reuse) {
        out = (em_tensor *)t;
        out->taken = false; /* the result: no longer donated */
        if (!out->scope) tn_scope_track(out);
    } else {
        out = tn_new_deferred(t->st->dev, odt, t->rank, t->shape);
    }
    if (!out) {
        tn_done(t);
        return NULL;
    }
    em_status st = unary_into(op, t, out, code, p0, p1);
    if (st == EM_OK && !reuse) {
        em_top_params p;
        em_tensor_op top = unary_top(code, p0, p1, &p);
        if (top != EM_TOP_NONE) tn_record(top, &p, &t, 1, out);
    }
    if (!reuse) tn_done(t);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

#define UNARY(name, code)                                                                          \
    em_tensor *em_##name(const em_tensor *t) { return tn_unary(#name, t, code, 0, 0); }
UNARY(neg, TN_U_NEG)
UNARY(abs, TN_U_ABS)
UNARY(sign, TN_U_SIGN)
UNARY(exp, TN_U_EXP)
UNARY(ln, TN_U_LOG)
UNARY(log1p, TN_U_LOG1P)
UNARY(expm1, TN_U_EXPM1)
UNARY(sqrt, TN_U_SQRT)
UNARY(rsqrt, TN_U_RSQRT)
UNARY(reciprocal, TN_U_RECIP)
UNARY(sin, TN_U_SIN)
UNARY(cos, TN_U_COS)
UNARY(tanh, TN_U_TANH)
UNARY(erf, TN_U_ERF)
UNARY(sigmoid, TN_U_SIGMOID)
UNARY(relu, TN_U_RELU)
UNARY(gelu, TN_U_GELU)
UNARY(gelu_tanh, TN_U_GELU_TANH)
UNARY(silu, TN_U_SILU)
UNARY(softplus, TN_U_SOFTPLUS)
UNARY(floor, TN_U_FLOOR)
UNARY(ceil, TN_U_CEIL)
UNARY(round, TN_U_ROUND)
UNARY(isnan, TN_U_ISNAN)
UNARY(isinf, TN_U_ISINF)
UNARY(logical_not, TN_U_NOT)

em_tensor *em_clamp(const em_tensor *t, double lo, double hi)
{
    return tn_unary("clamp", t, TN_U_CLAMP, lo, hi);
}

static em_tensor *promote_cast(const em_tensor *t, em_scalar dtype);

/* Scalar ops keep t's dtype, except that an integer or bool tensor with a non-integral scalar
 * runs in the default float dtype (f32), as in PyTorch. */
static em_tensor *scalar_op(const char *op, const em_tensor *t, int code, double s)
{
    if (!t || em_scalar_is_float(t->dtype) || (isfinite(s) && s == trunc(s)))
        return tn_unary(op, t, code, s, 0);
    em_tensor *x = promote_cast(t, EM_F32);
    tn_done(t);
    return x ? tn_unary(op, em_take(x), code, s, 0) : NULL;
}

em_tensor *em_pow_scalar(const em_tensor *t, double e) { return scalar_op("pow", t, TN_U_POWS, e); }

#define SCALAR(name, code)                                                                         \
    em_tensor *em_##name(const em_tensor *t, double s) { return scalar_op(#name, t, code, s); }
SCALAR(add_scalar, TN_U_ADDS)
SCALAR(sub_scalar, TN_U_SUBS)
SCALAR(rsub_scalar, TN_U_RSUBS)
SCALAR(mul_scalar, TN_U_MULS)
SCALAR(div_scalar, TN_U_DIVS)
SCALAR(rdiv_scalar, TN_U_RDIVS)
SCALAR(maximum_scalar, TN_U_MAXS)
SCALAR(minimum_scalar, TN_U_MINS)
SCALAR(eq_scalar, TN_U_EQS)
SCALAR(lt_scalar, TN_U_LTS)
SCALAR(gt_scalar, TN_U_GTS)

/* ---- copies and casts ------------------------------------------------------------------------ */

em_status tn_copy_into(const char *op, em_tensor *dst, const em_tensor *src)
{
    return unary_into(op, src, dst, TN_U_COPY, 0, 0);
}

/* em_copy_ but for the release of a donated src. */
static em_status copy_checked(em_tensor *dst, const em_tensor *src)
{
    if (!tn_same_device("copy_", dst, src)) return EM_ERR_INVALID;
    em_status ws = tn_check_write(dst, "copy_");
    if (ws != EM_OK) return ws;
    int r;
    int64_t shape[EM_MAX_RANK];
    if (!tn_broadcast("copy_", dst, src, &r, shape)) return EM_ERR_INVALID;
    if (r != dst->rank || memcmp(shape, dst->shape, sizeof(int64_t) * (size_t)r) != 0) {
        char sa[128], sb[128];
        return em_set_error(EM_ERR_INVALID, "copy_: source %s does not broadcast to destination %s",
                            em_describe(src, sb, sizeof sb), em_describe(dst, sa, sizeof sa));
    }
    /* a donated pending matmul result writes dst itself (fu_run_into) */
    int into = fu_run_into(src, dst);
    if (into > 0) return EM_OK;
    return into < 0 ? em_error_context("copy_") : tn_copy_into("copy_", dst, src);
}

em_status em_copy_(em_tensor *dst, const em_tensor *src)
{
    if (!dst || !src) {
        tn_done(src);
        return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INVALID;
    }
    em_status st = copy_checked(dst, src);
    tn_done(src);
    return st;
}

em_tensor *em_cast(const em_tensor *t, em_scalar dtype)
{
    if (!t) return NULL;
    if (!tn_check_dtype_supported("cast", dtype)) {
        tn_done(t);
        return NULL;
    }
    em_tensor *out = tn_new_deferred(t->st->dev, dtype, t->rank, t->shape);
    if (out && tn_copy_into("cast", out, t) != EM_OK) {
        em_release(out);
        out = NULL;
    }
    tn_record1(EM_TOP_CAST, t, out);
    tn_done(t);
    return out;
}

em_tensor *em_clone(const em_tensor *t) { return t ? em_cast(t, t->dtype) : NULL; }

em_tensor *em_contiguous(const em_tensor *t)
{
    if (!t) return NULL;
    if (em_is_contiguous(t)) {
        if (t->taken && !t->annotation) {
            em_tensor *r = (em_tensor *)t;
            r->taken = false;
            if (!r->scope) tn_scope_track(r);
            return r; /* the donated reference becomes the result */
        }
        em_tensor *v = tn_view(t, t->rank, t->shape, t->stride, t->offset);
        tn_record1(EM_TOP_CAST, t, v);
        tn_done(t);
        return v;
    }
    return em_clone(t);
}

/* Whether binary op `code` is a comparison or a logical op (a bool result). */
static bool is_pred(int code)
{
    return code >= TN_B_EQ && code <= TN_B_XOR;
}

/* ---- type promotion -------------------------------------------------------------------------- */

static bool is_unsigned_int(em_scalar t)
{
    return t == EM_U8 || t == EM_U16 || t == EM_U32 || t == EM_U64;
}

em_scalar em_promote_types(em_scalar a, em_scalar b)
{
    if ((unsigned)a >= EM_SCALAR_COUNT || (unsigned)b >= EM_SCALAR_COUNT) return EM_SCALAR_COUNT;
    if (a == b) return a;
    if (a == EM_BOOL) return b;
    if (b == EM_BOOL) return a;
    bool fa = em_scalar_is_float(a), fb = em_scalar_is_float(b);
    if (fa && fb) {
        if ((a == EM_F16 && b == EM_BF16) || (a == EM_BF16 && b == EM_F16)) return EM_F32;
        return em_scalar_size(a) >= em_scalar_size(b) ? a : b;
    }
    if (fa) return a;
    if (fb) return b;
    bool ua = is_unsigned_int(a), ub = is_unsigned_int(b);
    size_t sa = em_scalar_size(a), sb = em_scalar_size(b);
    if (ua == ub) return sa >= sb ? a : b;
    em_scalar s = ua ? b : a;
    size_t su = ua ? sa : sb, ss = ua ? sb : sa;
    if (ss > su) return s;
    /* the smallest signed type wider than the unsigned one (i64 for u64, which PyTorch refuses) */
    if (su == 1) return EM_I16;
    if (su == 2) return EM_I32;
    return EM_I64;
}

/* t converted to dtype as a new tensor; t is not consumed (em_cast would release a donated t). */
static em_tensor *promote_cast(const em_tensor *t, em_scalar dtype)
{
    if (!tn_check_dtype_supported("cast", dtype)) return NULL;
    em_tensor *out = tn_new_deferred(t->st->dev, dtype, t->rank, t->shape);
    if (out && tn_copy_into("cast", out, t) != EM_OK) {
        em_release(out);
        out = NULL;
    }
    tn_record1(EM_TOP_CAST, t, out);
    return out;
}

/* Converts those of a and b whose dtype differs from dt; on success *pa / *pb are the operands to
 * use (a cast one is new and donated, so the op consuming it releases or reuses it). */
static bool promote_pair(const em_tensor *a, const em_tensor *b, em_scalar dt, const em_tensor **pa,
                         const em_tensor **pb, bool *ca, bool *cb)
{
    *pa = a;
    *pb = b;
    *ca = *cb = false;
    if (a->dtype != dt) {
        em_tensor *x = promote_cast(a, dt);
        if (!x) return false;
        *pa = em_take(x);
        *ca = true;
    }
    if (b == a) {
        *pb = *pa;
        *cb = *ca;
    } else if (b->dtype != dt) {
        em_tensor *x = promote_cast(b, dt);
        if (!x) {
            if (*ca) em_release((em_tensor *)*pa);
            return false;
        }
        *pb = em_take(x);
        *cb = true;
    }
    return true;
}

/* ---- binary ---------------------------------------------------------------------------------- */

static em_tensor *binary(const char *op, const em_tensor *a, const em_tensor *b, int code);

/* Runs the op on a and b converted to their promoted dtype (true division of integers: f32). */
static em_tensor *binary_promoted(const char *op, const em_tensor *a, const em_tensor *b, int code,
                                  em_scalar dt)
{
    const em_tensor *xa, *xb;
    bool ca, cb;
    if (!promote_pair(a, b, dt, &xa, &xb, &ca, &cb)) {
        tn_done(a);
        if (b != a) tn_done(b);
        return NULL;
    }
    /* consumes the cast operands and the passed-through ones */
    em_tensor *out = binary(op, xa, xb, code);
    if (ca) tn_done(a);
    if (cb && b != a) tn_done(b);
    return out;
}

static em_tensor *binary(const char *op, const em_tensor *a, const em_tensor *b, int code)
{
    if (!a || !b) {
        tn_done(a);
        tn_done(b);
        return NULL;
    }
    em_tensor *out = NULL;
    int rank;
    int64_t shape[EM_MAX_RANK];
    if (!tn_same_device(op, a, b)) goto done;
    {
        em_scalar pt = em_promote_types(a->dtype, b->dtype);
        if (code == TN_B_DIV && !em_scalar_is_float(pt)) pt = EM_F32;
        if (pt != a->dtype || pt != b->dtype) return binary_promoted(op, a, b, code, pt);
    }
    if (a->dtype != b->dtype) {
        em_set_error(EM_ERR_INVALID, "%s: dtypes %s and %s differ (cast one first)", op,
                     em_scalar_name(a->dtype), em_scalar_name(b->dtype));
        goto done;
    }
    bool logical = code >= TN_B_AND && code <= TN_B_XOR;
    if (a->dtype == EM_BOOL && !logical && code != TN_B_EQ && code != TN_B_NE && code != TN_B_MAX &&
        code != TN_B_MIN) {
        em_set_error(EM_ERR_INVALID, "%s: not defined for bool tensors", op);
        goto done;
    }
    if (!tn_broadcast(op, a, b, &rank, shape)) goto done;
    em_scalar odt = is_pred(code) ? EM_BOOL : a->dtype;
    const em_tensor *ins[2] = {a, b};
    bool rec = tn_recording(ins, 2); /* a recorded op may need its inputs: no reuse */
    bool reuse_a = !rec && odt == a->dtype && tn_reusable(a) && a->rank == rank &&
                   memcmp(a->shape, shape, sizeof(int64_t) * (size_t)rank) == 0;
    bool reuse_b = !rec && !reuse_a && a != b && odt == b->dtype && tn_reusable(b) &&
                   b->rank == rank &&
                   memcmp(b->shape, shape, sizeof(int64_t) * (size_t)rank) == 0;
    if (reuse_a || reuse_b) {
        out = (em_tensor *)(reuse_a ? a : b);
        out->taken = false;
        if (!out->scope) tn_scope_track(out);
    } else {
        out = tn_new_deferred(a->st->dev, odt, rank, shape);
    }
    if (!out) goto done;
    em_scalar ct = tn_compute_type(a->dtype);
    em_lang_bind bd[5] = {em_lang_bind_type("T", a->dtype), em_lang_bind_type("U", odt),
                          em_lang_bind_type("C", ct), em_lang_bind_int("OP", code),
                          em_lang_bind_type("M", tn_math_type(a->st->dev, ct))};
    int64_t strides[3][EM_MAX_RANK];
    tn_expand_geom(a, rank, shape, strides[0]);
    tn_expand_geom(b, rank, shape, strides[1]);
    memcpy(strides[2], out->stride, sizeof strides[2]);
    fu_desc fd = {op, is_pred(code) ? FU_BPRED : FU_BINARY, code, ct, bd[4].type, {{0}, {0}}, 0};
    if (code == TN_B_ADD) /* an add's inputs are not kept by autodiff: a matmul may take it over */
        for (int k = 0; k < 2; k++)
            if (!rec || !tn_record_keeps_input(EM_TOP_ADD, k)) fd.movable |= 1u << k;
    int fr = fu_record(&fd, ins, 2, strides, out);
    em_status st = fr > 0 ? EM_OK : fr < 0 ? em_last_status() : EM_OK;
    if (fr == 0) {
        const em_tensor *ts[3] = {a, b, out};
        st = run_walk(op, "tensor_binary", bd, 5, ts, 3, rank, shape, strides, NULL, 0);
    }
    if (st == EM_OK && rec && code <= TN_B_REM)
        tn_record((em_tensor_op)(EM_TOP_ADD + code), NULL, ins, 2, out);
    if (out == a || out == b) {
        tn_done(out == a ? b : a);
        if (st != EM_OK) {
            em_release(out);
            return NULL;
        }
        return out;
    }
    if (st != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    tn_done(a);
    if (b != a) tn_done(b);
    return out;
}

#define BINARY(name, code)                                                                         \
    em_tensor *em_##name(const em_tensor *a, const em_tensor *b) { return binary(#name, a, b, code); }
BINARY(add, TN_B_ADD)
BINARY(sub, TN_B_SUB)
BINARY(mul, TN_B_MUL)
BINARY(div, TN_B_DIV)
BINARY(pow, TN_B_POW)
BINARY(maximum, TN_B_MAX)
BINARY(minimum, TN_B_MIN)
BINARY(remainder, TN_B_REM)
BINARY(eq, TN_B_EQ)
BINARY(ne, TN_B_NE)
BINARY(lt, TN_B_LT)
BINARY(le, TN_B_LE)
BINARY(gt, TN_B_GT)
BINARY(ge, TN_B_GE)
BINARY(logical_and, TN_B_AND)
BINARY(logical_or, TN_B_OR)
BINARY(logical_xor, TN_B_XOR)

em_tensor *em_gelu_backward(const em_tensor *grad_out, const em_tensor *x, bool tanh_approx)
{
    const char *op = tanh_approx ? "gelu_tanh backward" : "gelu backward";
    if (grad_out && x && (!em_scalar_is_float(grad_out->dtype) || !em_scalar_is_float(x->dtype))) {
        em_set_error(EM_ERR_INVALID, "%s: needs floating-point tensors, got %s and %s", op,
                     em_scalar_name(grad_out->dtype), em_scalar_name(x->dtype));
        tn_done(grad_out);
        if (x != grad_out) tn_done(x);
        return NULL;
    }
    return binary(op, grad_out, x, tanh_approx ? TN_B_GELU_TANH_GRAD : TN_B_GELU_GRAD);
}

/* ---- where and masked_fill ------------------------------------------------------------------- */

static em_tensor *where3(const char *op, const em_tensor *c, const em_tensor *a, const em_tensor *b)
{
    em_tensor *out = NULL;
    int r1, rank;
    int64_t s1[EM_MAX_RANK], shape[EM_MAX_RANK];
    if (!tn_same_device(op, c, a) || !tn_same_device(op, a, b)) return NULL;
    if (c->dtype != EM_BOOL) {
        em_set_error(EM_ERR_INVALID, "%s: the condition must be bool, got %s", op, em_scalar_name(c->dtype));
        return NULL;
    }
    if (a->dtype != b->dtype) {
        em_set_error(EM_ERR_INVALID, "%s: dtypes %s and %s differ (cast one first)", op,
                     em_scalar_name(a->dtype), em_scalar_name(b->dtype));
        return NULL;
    }
    if (!tn_broadcast(op, a, b, &r1, s1)) return NULL;
    em_tensor tmp = *a; /* only its shape is read */
    tmp.rank = r1;
    memcpy(tmp.shape, s1, sizeof s1);
    if (!tn_broadcast(op, c, &tmp, &rank, shape)) return NULL;
    out = tn_new_deferred(a->st->dev, a->dtype, rank, shape);
    if (!out) return NULL;
    em_lang_bind bd[1] = {em_lang_bind_type("T", a->dtype)};
    int64_t strides[4][EM_MAX_RANK];
    tn_expand_geom(c, rank, shape, strides[0]);
    tn_expand_geom(a, rank, shape, strides[1]);
    tn_expand_geom(b, rank, shape, strides[2]);
    memcpy(strides[3], out->stride, sizeof strides[3]);
    const em_tensor *ts[4] = {c, a, b, out};
    fu_desc fd = {op, FU_WHERE, 0, a->dtype, a->dtype, {{0}, {0}}, 0};
    int fr = fu_record(&fd, ts, 3, strides, out);
    if (fr < 0 || (fr == 0 && run_walk(op, "tensor_where", bd, 1, ts, 4, rank, shape, strides, NULL, 0) != EM_OK)) {
        em_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b)
{
    em_tensor *out = NULL;
    if (cond && a && b && a->dtype != b->dtype && tn_same_device("where", cond, a) &&
        tn_same_device("where", a, b)) {
        const em_tensor *xa, *xb;
        bool ca, cb;
        if (promote_pair(a, b, em_promote_types(a->dtype, b->dtype), &xa, &xb, &ca, &cb)) {
            out = where3("where", cond, xa, xb);
            const em_tensor *ins[3] = {cond, xa, xb};
            tn_record(EM_TOP_WHERE, NULL, ins, 3, out);
            if (ca) em_release((em_tensor *)xa);
            if (cb) em_release((em_tensor *)xb);
        }
    } else if (cond && a && b) {
        out = where3("where", cond, a, b);
        const em_tensor *ins[3] = {cond, a, b};
        tn_record(EM_TOP_WHERE, NULL, ins, 3, out);
    }
    tn_done(cond);
    if (a != cond) tn_done(a);
    if (b != a && b != cond) tn_done(b);
    return out;
}

em_tensor *em_masked_fill(const em_tensor *t, const em_tensor *mask, double value)
{
    em_tensor *out = NULL;
    if (t && mask) {
        em_tensor *v = em_scalar_tensor(t->st->dev, t->dtype, value);
        if (v) out = where3("masked_fill", mask, v, t);
        em_release(v);
        if (out && (out->rank != t->rank || memcmp(out->shape, t->shape, sizeof(int64_t) * (size_t)t->rank))) {
            char sa[128], sb[128];
            em_set_error(EM_ERR_INVALID, "masked_fill: mask %s does not broadcast to %s",
                         em_describe(mask, sa, sizeof sa), em_describe(t, sb, sizeof sb));
            em_release(out);
            out = NULL;
        }
        em_top_params p = tn_params_k(0);
        p.f[0] = value;
        const em_tensor *ins[2] = {t, mask};
        tn_record(EM_TOP_MASKED_FILL, &p, ins, 2, out);
    }
    tn_done(t);
    if (mask != t) tn_done(mask);
    return out;
}

em_status tn_fill(em_tensor *out, double value)
{
    return unary_into("fill", out, out, TN_U_FILL, value, 0);
}

em_tensor *tn_contig(const em_tensor *t)
{
    if (em_is_contiguous(t)) {
        if (tn_realize(t) != EM_OK) return NULL;
        return tn_view(t, t->rank, t->shape, t->stride, t->offset);
    }
    em_tensor *out = tn_new(t->st->dev, t->dtype, t->rank, t->shape);
    if (out && (tn_copy_into("contiguous", out, t) != EM_OK || tn_realize(out) != EM_OK)) {
        em_release(out);
        return NULL;
    }
    return out;
}
