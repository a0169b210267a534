/* fold.c — evaluation of IR operations on constants, for the constant-folding pass: integer ops
 * wrap to the type's width, float ops round to the type (f16/bf16 results are left unfolded, since
 * their rounding belongs to the target), and anything that would trap (division by zero) is left
 * for run time. */
#include <math.h>
#include <string.h>

#include "kernel/passes/passes.h"

static int bits_of(em_scalar s) { return (int)em_scalar_size(s) * 8; }

/* Normalizes an integer payload to its type: wraps to the width, sign-extends signed kinds. */
static em_ir_const wrap_int(em_scalar s, em_ir_const c)
{
    int bits = bits_of(s);
    if (s == EM_BOOL) {
        c.i = c.i != 0;
        return c;
    }
    if (bits < 64) {
        uint64_t mask = (1ull << bits) - 1;
        c.u &= mask;
        if (em_scalar_is_signed(s) && (c.u >> (bits - 1)) & 1) c.u |= ~mask;
    }
    return c;
}

static double round_float(em_scalar s, double v) { return s == EM_F32 ? (double)(float)v : v; }

static bool fold_float_binary(em_ir_op op, double a, double b, double *r)
{
    switch (op) {
    case EM_OP_ADD: *r = a + b; return true;
    case EM_OP_SUB: *r = a - b; return true;
    case EM_OP_MUL: *r = a * b; return true;
    case EM_OP_DIV: *r = a / b; return true;
    case EM_OP_REM: *r = fmod(a, b); return true;
    case EM_OP_MIN: *r = fmin(a, b); return true;
    case EM_OP_MAX: *r = fmax(a, b); return true;
    case EM_OP_POW: *r = pow(a, b); return true;
    default: return false;
    }
}

static bool fold_int_binary(em_ir_op op, em_scalar s, em_ir_const a, em_ir_const b, em_ir_const *r)
{
    bool sg = em_scalar_is_signed(s);
    unsigned bits = (unsigned)bits_of(s);
    switch (op) {
    case EM_OP_ADD: r->u = a.u + b.u; return true;
    case EM_OP_SUB: r->u = a.u - b.u; return true;
    case EM_OP_MUL: r->u = a.u * b.u; return true;
    case EM_OP_DIV:
    case EM_OP_REM:
        if (b.u == 0) return false;
        if (sg && b.i == -1) return false; /* INT_MIN / -1 traps; leave it for run time */
        if (op == EM_OP_DIV) {
            if (sg) r->i = a.i / b.i; else r->u = a.u / b.u;
        } else {
            if (sg) r->i = a.i % b.i; else r->u = a.u % b.u;
        }
        return true;
    case EM_OP_MIN: *r = sg ? (a.i < b.i ? a : b) : (a.u < b.u ? a : b); return true;
    case EM_OP_MAX: *r = sg ? (a.i > b.i ? a : b) : (a.u > b.u ? a : b); return true;
    case EM_OP_AND: r->u = a.u & b.u; return true;
    case EM_OP_OR: r->u = a.u | b.u; return true;
    case EM_OP_XOR: r->u = a.u ^ b.u; return true;
    case EM_OP_SHL: r->u = a.u << (b.u % bits); return true;
    case EM_OP_SHR:
        if (sg) r->i = a.i >> (b.u % bits); else r->u = a.u >> (b.u % bits);
        return true;
    default: return false;
    }
}

static int compare(em_scalar s, em_ir_const a, em_ir_const b)
{
    if (em_scalar_is_float(s)) return a.f < b.f ? -1 : a.f > b.f ? 1 : a.f == b.f ? 0 : 2; /* 2: NaN */
    if (em_scalar_is_signed(s) || s == EM_BOOL) return a.i < b.i ? -1 : a.i > b.i;
    return a.u < b.u ? -1 : a.u > b.u;
}

static bool fold_compare(em_ir_op op, int cmp, em_ir_const *r)
{
    bool v;
    switch (op) {
    case EM_OP_EQ: v = cmp == 0; break;
    case EM_OP_NE: v = cmp != 0; break;
    case EM_OP_LT: v = cmp == -1; break;
    case EM_OP_LE: v = cmp == -1 || cmp == 0; break;
    case EM_OP_GT: v = cmp == 1; break;
    case EM_OP_GE: v = cmp == 1 || cmp == 0; break;
    default: return false;
    }
    r->i = v;
    return true;
}

static bool fold_float_unary(em_ir_op op, double a, double *r)
{
    switch (op) {
    case EM_OP_NEG: *r = -a; return true;
    case EM_OP_ABS: *r = fabs(a); return true;
    case EM_OP_EXP: *r = exp(a); return true;
    case EM_OP_EXP2: *r = exp2(a); return true;
    case EM_OP_LOG: *r = log(a); return true;
    case EM_OP_LOG2: *r = log2(a); return true;
    case EM_OP_SQRT: *r = sqrt(a); return true;
    case EM_OP_RSQRT: *r = 1.0 / sqrt(a); return true;
    case EM_OP_ERF: *r = erf(a); return true;
    case EM_OP_TANH: *r = tanh(a); return true;
    case EM_OP_SIN: *r = sin(a); return true;
    case EM_OP_COS: *r = cos(a); return true;
    case EM_OP_FLOOR: *r = floor(a); return true;
    case EM_OP_CEIL: *r = ceil(a); return true;
    case EM_OP_ROUND: *r = nearbyint(a); return true;
    default: return false;
    }
}

static em_ir_const convert(em_scalar from, em_scalar to, em_ir_const a)
{
    em_ir_const r = {0};
    if (em_scalar_is_float(to)) {
        r.f = em_scalar_is_float(from) ? a.f : (em_scalar_is_signed(from) || from == EM_BOOL) ? (double)a.i : (double)a.u;
        r.f = round_float(to, r.f);
        return r;
    }
    if (to == EM_BOOL) {
        r.i = em_scalar_is_float(from) ? a.f != 0.0 : a.u != 0;
        return r;
    }
    if (em_scalar_is_float(from)) {
        /* out-of-range float-to-int conversion is undefined in C; clamp like most GPUs do */
        double lo = em_scalar_is_signed(to) ? -ldexp(1.0, bits_of(to) - 1) : 0.0;
        double hi = em_scalar_is_signed(to) ? ldexp(1.0, bits_of(to) - 1) - 1 : ldexp(1.0, bits_of(to)) - 1;
        double v = isnan(a.f) ? 0.0 : fmin(fmax(trunc(a.f), lo), hi);
        if (em_scalar_is_signed(to)) r.i = (int64_t)v; else r.u = v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
    } else {
        r = a;
    }
    return wrap_int(to, r);
}

bool em_ir_fold_inst(const em_ir_kernel *k, const em_ir_inst *in, em_type *type, em_ir_const *out)
{
    const em_op_info *info = em_ir_op_info(in->op);
    const em_ir_value *d = em_ir_value_at(k, in->dst);
    if (!info || !d || d->kind != EM_VAL_TEMP) return false;
    const em_ir_value *a[3] = {0};
    for (unsigned i = 0; i < 3 && i < info->nargs; i++) {
        if (!em_ir_is_const(k, in->args[i])) return false;
        a[i] = em_ir_value_at(k, in->args[i]);
    }
    em_scalar rs = (em_scalar)d->type.scalar;
    if (rs == EM_F16 || rs == EM_BF16) return false;
    em_scalar s = a[0] ? (em_scalar)a[0]->type.scalar : rs;
    if (s == EM_F16 || s == EM_BF16) return false;
    *type = d->type;
    memset(out, 0, sizeof(*out));
    bool fl = em_scalar_is_float(s);
    switch ((em_op_class)info->cls) {
    case EM_OPC_BINARY:
        if (fl) {
            if (!fold_float_binary((em_ir_op)in->op, a[0]->c.f, a[1]->c.f, &out->f)) return false;
            out->f = round_float(s, out->f);
            return true;
        }
        if (!fold_int_binary((em_ir_op)in->op, s, a[0]->c, a[1]->c, out)) return false;
        *out = wrap_int(s, *out);
        return true;
    case EM_OPC_COMPARE:
        return fold_compare((em_ir_op)in->op, compare(s, a[0]->c, a[1]->c), out);
    case EM_OPC_UNARY:
        if (fl && fold_float_unary((em_ir_op)in->op, a[0]->c.f, &out->f)) {
            out->f = round_float(s, out->f);
            return true;
        }
        if (fl && (in->op == EM_OP_ISNAN || in->op == EM_OP_ISINF)) {
            out->i = in->op == EM_OP_ISNAN ? isnan(a[0]->c.f) != 0 : isinf(a[0]->c.f) != 0;
            return true;
        }
        if (!fl && in->op == EM_OP_NEG && s != EM_BOOL) {
            out->u = 0 - a[0]->c.u;
            *out = wrap_int(s, *out);
            return true;
        }
        if (!fl && in->op == EM_OP_NOT) {
            if (s == EM_BOOL) out->i = !a[0]->c.i; else out->u = ~a[0]->c.u;
            *out = wrap_int(s, *out);
            return true;
        }
        return false;
    case EM_OPC_TERNARY:
        if (in->op == EM_OP_SELECT) {
            *out = a[0]->c.i ? a[1]->c : a[2]->c;
            return true;
        }
        return false;
    case EM_OPC_CONVERT:
        if (in->op != EM_OP_CAST) return false;
        *out = convert(s, rs, a[0]->c);
        return true;
    default:
        return false;
    }
}
