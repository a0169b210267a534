/* lower_value.c — typed values during lowering: constructors, the implicit conversion rules
 * (untyped literals take the type they meet; a scalar broadcasts to a line of the same scalar
 * kind; nothing else converts implicitly), explicit conversions, comptime folding of arithmetic,
 * comparisons and bit operations (integers wrap to their width, as at run time), and the
 * emission of unary and binary operators. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernel/lang/lower.h"

/* ---- constructors ------------------------------------------------------------------------------
 */

lv em_lang_lv_err(void)
{
    return (lv){.kind = V_ERR};
}
lv em_lang_lv_void(void)
{
    return (lv){.kind = V_VOID};
}
lv em_lang_lv_rt(em_type ty, em_ir_val v)
{
    return (lv){.kind = v ? V_RT : V_ERR, .ty = ty, .v = v};
}

static int bits_of(em_scalar s)
{
    return (int)em_scalar_size(s) * 8;
}

/* Wraps raw bits to the width and signedness of integer kind s (bool: nonzero). */
static em_ir_const wrap(em_scalar s, uint64_t bits)
{
    em_ir_const c = {0};
    if (s == EM_BOOL) {
        c.i = bits != 0;
        return c;
    }
    int w = bits_of(s);
    if (w < 64) bits &= (UINT64_C(1) << w) - 1;
    if (em_scalar_is_signed(s) && w < 64 && (bits >> (w - 1)) & 1)
        bits |= ~((UINT64_C(1) << w) - 1);
    c.u = bits;
    return c;
}

lv em_lang_lv_const_int(em_scalar s, int64_t v)
{
    lv x = {.kind = V_CONST, .ty = em_ty(s)};
    if (em_scalar_is_float(s))
        x.c.f = (double)v;
    else
        x.c = wrap(s, (uint64_t)v);
    return x;
}

lv em_lang_lv_const_uint(em_scalar s, uint64_t v)
{
    lv x = {.kind = V_CONST, .ty = em_ty(s)};
    if (em_scalar_is_float(s))
        x.c.f = (double)v;
    else
        x.c = wrap(s, v);
    return x;
}

static double round_to(em_scalar s, double v)
{
    if (s == EM_F32) return (double)(float)v;
    return v;
}

lv em_lang_lv_const_float(em_scalar s, double v)
{
    lv x = {.kind = V_CONST, .ty = em_ty(s)};
    x.c.f = round_to(s, v);
    return x;
}

lv em_lang_lv_const_bool(bool v)
{
    return em_lang_lv_const_int(EM_BOOL, v ? 1 : 0);
}

bool em_lang_lv_is_untyped(const lv *x)
{
    return x->kind == V_ULIT_INT || x->kind == V_ULIT_FLOAT;
}
bool em_lang_lv_is_comptime(const lv *x)
{
    return x->kind == V_CONST || em_lang_lv_is_untyped(x);
}
bool em_lang_lv_is_value(const lv *x)
{
    return x->kind == V_RT || em_lang_lv_is_comptime(x);
}

/* ---- messages ----------------------------------------------------------------------------------
 */

void em_lang_type_str(em_type t, char *out, size_t outsz)
{
    const char *s = em_scalar_name((em_scalar)t.scalar);
    if (t.lanes > 1)
        snprintf(out, outsz, "line(%s, %u)", s ? s : "?", t.lanes);
    else
        snprintf(out, outsz, "%s", s ? s : "?");
}

void em_lang_lv_desc(const lv *x, char *out, size_t outsz)
{
    char t[48];
    switch (x->kind) {
    case V_ULIT_INT:
        snprintf(out, outsz, "integer literal");
        return;
    case V_ULIT_FLOAT:
        snprintf(out, outsz, "float literal");
        return;
    case V_RT:
    case V_CONST:
        em_lang_type_str(x->ty, out, outsz);
        return;
    case V_MEM:
        snprintf(out, outsz, "%s '%s'",
                 x->space == EM_MEM_GLOBAL   ? (x->rank ? "tensor" : "array")
                 : x->space == EM_MEM_SHARED ? "shared array"
                                             : "local array",
                 x->name ? x->name : "?");
        return;
    case V_MATRIX:
        snprintf(out, outsz, "matrix '%s'", x->name ? x->name : "?");
        return;
    case V_TYPE:
        em_lang_type_str(x->ty, t, sizeof(t));
        snprintf(out, outsz, "type '%s'", t);
        return;
    case V_VOID:
        snprintf(out, outsz, "nothing (void)");
        return;
    case V_LAYOUT:
        snprintf(out, outsz, "a layout");
        return;
    default:
        snprintf(out, outsz, "an invalid value");
        return;
    }
}

lv em_lang_lerr(lower *L, lpos pos, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    em_lang_verror(L->sink, pos, hint, fmt, ap);
    va_end(ap);
    if (em_lang_sink_full(L->sink)) L->abort = true;
    return em_lang_lv_err();
}

bool em_lang_need_value(lower *L, const lv *x, lpos pos, const char *what)
{
    if (em_lang_lv_is_value(x)) return true;
    if (x->kind == V_ERR) return false;
    char d[96];
    em_lang_lv_desc(x, d, sizeof(d));
    const char *hint = x->kind == V_MEM ? "index it to read an element: name[i]" : NULL;
    em_lang_lerr(L, pos, hint, "%s cannot be used as %s", d, what);
    return false;
}

const char *em_lang_op_text(int op)
{
    switch (op) {
    case T_PLUS:
        return "+";
    case T_MINUS:
        return "-";
    case T_STAR:
        return "*";
    case T_SLASH:
        return "/";
    case T_PERCENT:
        return "%";
    case T_AMP:
        return "&";
    case T_PIPE:
        return "|";
    case T_CARET:
        return "^";
    case T_SHL:
        return "<<";
    case T_SHR:
        return ">>";
    case T_EQEQ:
        return "==";
    case T_NE:
        return "!=";
    case T_LT:
        return "<";
    case T_LE:
        return "<=";
    case T_GT:
        return ">";
    case T_GE:
        return ">=";
    case T_ANDAND:
        return "&&";
    case T_OROR:
        return "||";
    case T_BANG:
        return "!";
    case T_TILDE:
        return "~";
    default:
        return "?";
    }
}

/* ---- literals and conversions
 * -------------------------------------------------------------------- */

static bool int_fits(em_scalar s, int64_t v)
{
    int w = bits_of(s);
    if (em_scalar_is_signed(s)) {
        if (w >= 64) return true;
        int64_t lim = INT64_C(1) << (w - 1);
        return v >= -lim && v < lim;
    }
    if (v < 0) return false;
    return w >= 64 || (uint64_t)v < (UINT64_C(1) << w);
}

static bool float_fits(em_scalar s, double v)
{
    if (isnan(v) || isinf(v)) return true;
    double a = fabs(v);
    switch (s) {
    case EM_F16:
        return a <= 65504.0;
    case EM_BF16:
    case EM_F32:
        return a <= 3.4028234663852886e38;
    default:
        return true;
    }
}

/* Gives an untyped literal scalar type s. */
static lv literal_to(lower *L, const lv *x, em_scalar s, lpos pos)
{
    char tn[48];
    em_lang_type_str(em_ty(s), tn, sizeof(tn));
    if (s == EM_BOOL)
        return em_lang_lerr(L, pos, "use true or false", "cannot use %s as 'bool'",
                            x->kind == V_ULIT_INT ? "an integer literal" : "a float literal");
    if (x->kind == V_ULIT_INT) {
        if (em_scalar_is_float(s)) return em_lang_lv_const_float(s, (double)x->c.i);
        if (!int_fits(s, x->c.i))
            return em_lang_lerr(L, pos, NULL, "integer literal %lld does not fit in '%s'",
                                (long long)x->c.i, tn);
        return em_lang_lv_const_int(s, x->c.i);
    }
    if (!em_scalar_is_float(s)) {
        char hint[96];
        snprintf(hint, sizeof(hint), "write %s(%g) to convert it explicitly", tn, x->c.f);
        return em_lang_lerr(L, pos, hint, "cannot use float literal %g as '%s'", x->c.f, tn);
    }
    if (!float_fits(s, x->c.f))
        return em_lang_lerr(L, pos, NULL, "float literal %g does not fit in '%s'", x->c.f, tn);
    return em_lang_lv_const_float(s, x->c.f);
}

lv em_lang_lv_default(lower *L, lv x, lpos pos)
{
    if (x.kind == V_ULIT_INT) {
        if (!int_fits(EM_I32, x.c.i)) return literal_to(L, &x, EM_I64, pos);
        return literal_to(L, &x, EM_I32, pos);
    }
    if (x.kind == V_ULIT_FLOAT) return literal_to(L, &x, EM_F32, pos);
    return x;
}

em_ir_val em_lang_materialize(lower *L, const lv *x)
{
    if (x->kind == V_RT) return x->v;
    if (em_lang_lv_is_untyped(x)) {
        lv d = em_lang_lv_default(L, *x, (lpos){0, 0, 0});
        return d.kind == V_CONST ? em_lang_materialize(L, &d) : EM_IR_NONE;
    }
    if (x->kind != V_CONST) return EM_IR_NONE;
    em_scalar s = (em_scalar)x->ty.scalar;
    if (em_scalar_is_float(s)) return em_ir_const_float(L->k, x->ty, x->c.f);
    if (s == EM_BOOL && x->ty.lanes == 1) return em_ir_const_bool(L->k, x->c.i != 0);
    if (em_scalar_is_signed(s) || s == EM_BOOL) return em_ir_const_int(L->k, x->ty, x->c.i);
    return em_ir_const_uint(L->k, x->ty, x->c.u);
}

lv em_lang_coerce(lower *L, lv x, em_type to, lpos pos, const char *what)
{
    if (x.kind == V_ERR) return x;
    if (!em_lang_need_value(L, &x, pos, what)) return em_lang_lv_err();
    if (em_lang_lv_is_untyped(&x)) {
        x = literal_to(L, &x, (em_scalar)to.scalar, pos);
        if (x.kind == V_CONST) x.ty = to;
        return x;
    }
    char a[48], b[48];
    if (x.ty.scalar != to.scalar || (x.ty.lanes != to.lanes && x.ty.lanes != 1)) {
        em_lang_type_str(x.ty, a, sizeof(a));
        em_lang_type_str(to, b, sizeof(b));
        char hint[96];
        snprintf(hint, sizeof(hint), "convert explicitly: %s(...)", b);
        return em_lang_lerr(L, pos, x.ty.scalar != to.scalar ? hint : NULL,
                            "cannot convert '%s' to '%s' in %s", a, b, what);
    }
    if (x.ty.lanes == to.lanes) return x;
    if (x.kind == V_CONST) {
        x.ty = to;
        return x;
    }
    return em_lang_lv_rt(to, em_ir_cast(L->k, to, x.v));
}

/* Converts a typed comptime constant to another type (explicit cast semantics). */
static lv fold_convert(lower *L, const lv *x, em_type to, lpos pos)
{
    em_scalar from = (em_scalar)x->ty.scalar, s = (em_scalar)to.scalar;
    lv r = {.kind = V_CONST, .ty = to};
    bool from_float = em_scalar_is_float(from),
         from_signed = em_scalar_is_signed(from) || from == EM_BOOL;
    if (s == EM_BOOL) {
        r.c.i = from_float ? x->c.f != 0 : x->c.u != 0;
    } else if (em_scalar_is_float(s)) {
        r.c.f = round_to(s, from_float ? x->c.f : from_signed ? (double)x->c.i : (double)x->c.u);
    } else if (from_float) {
        double v = trunc(x->c.f);
        char tn[48];
        em_lang_type_str(to, tn, sizeof(tn));
        if (isnan(v) || v < -9.2233720368547758e18 || v >= 1.8446744073709552e19)
            return em_lang_lerr(L, pos, NULL, "constant %g is out of range for '%s'", x->c.f, tn);
        bool fits = em_scalar_is_signed(s)
                        ? (v >= -9.2233720368547758e18 && v < 9.2233720368547758e18 &&
                           int_fits(s, (int64_t)v))
                        : (v >= 0 && (bits_of(s) >= 64 ? v < 1.8446744073709552e19
                                                       : v < ldexp(1.0, bits_of(s))));
        if (!fits)
            return em_lang_lerr(L, pos, NULL, "constant %g is out of range for '%s'", x->c.f, tn);
        r.c = wrap(s, v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v);
    } else {
        r.c = wrap(s, x->c.u);
    }
    return r;
}

lv em_lang_convert(lower *L, lv x, em_type to, lpos pos)
{
    if (x.kind == V_ERR) return x;
    if (!em_lang_need_value(L, &x, pos, "a value to convert")) return em_lang_lv_err();
    if (x.kind == V_ULIT_INT) x = (lv){.kind = V_CONST, .ty = em_ty(EM_I64), .c = {.i = x.c.i}};
    if (x.kind == V_ULIT_FLOAT) x = (lv){.kind = V_CONST, .ty = em_ty(EM_F64), .c = {.f = x.c.f}};
    if (x.ty.lanes != to.lanes && x.ty.lanes != 1) {
        char a[48], b[48];
        em_lang_type_str(x.ty, a, sizeof(a));
        em_lang_type_str(to, b, sizeof(b));
        return em_lang_lerr(L, pos, NULL, "cannot convert '%s' to '%s': the line widths differ", a,
                            b);
    }
    if (x.kind == V_CONST) return fold_convert(L, &x, to, pos);
    if (em_type_eq(x.ty, to)) return x;
    return em_lang_lv_rt(to, em_ir_cast(L->k, to, x.v));
}

bool em_lang_comptime_int(lower *L, const lv *x, lpos pos, const char *what, int64_t *out)
{
    if (x->kind == V_ERR) return false;
    if (x->kind == V_ULIT_INT) {
        *out = x->c.i;
        return true;
    }
    if (x->kind == V_CONST && em_scalar_is_int((em_scalar)x->ty.scalar)) {
        if (!em_scalar_is_signed((em_scalar)x->ty.scalar) && x->c.u > (uint64_t)INT64_MAX) {
            em_lang_lerr(L, pos, NULL, "%s is too large", what);
            return false;
        }
        *out = x->c.i;
        return true;
    }
    if (x->kind == V_RT && em_scalar_is_int((em_scalar)x->ty.scalar)) {
        em_lang_lerr(L, pos, "use a literal, a comptime parameter or a comptime constant",
                     "%s must be known at compile time", what);
        return false;
    }
    char d[96];
    em_lang_lv_desc(x, d, sizeof(d));
    em_lang_lerr(L, pos, NULL, "%s must be a comptime integer, got %s", what, d);
    return false;
}

bool em_lang_comptime_bool(lower *L, const lv *x, lpos pos, const char *what, bool *out)
{
    if (x->kind == V_ERR) return false;
    if (x->kind == V_CONST && x->ty.scalar == EM_BOOL && x->ty.lanes == 1) {
        *out = x->c.i != 0;
        return true;
    }
    if (x->kind == V_RT && x->ty.scalar == EM_BOOL) {
        em_lang_lerr(L, pos, "use a plain 'if' for conditions known only at run time",
                     "%s must be known at compile time", what);
        return false;
    }
    char d[96];
    em_lang_lv_desc(x, d, sizeof(d));
    em_lang_lerr(L, pos, NULL, "%s must be a comptime bool, got %s", what, d);
    return false;
}

lv em_lang_to_index(lower *L, lv x, lpos pos, const char *what)
{
    if (x.kind == V_ERR) return x;
    if (!em_lang_need_value(L, &x, pos, what)) return em_lang_lv_err();
    char d[96];
    em_lang_lv_desc(&x, d, sizeof(d));
    if (x.kind == V_ULIT_FLOAT ||
        (!em_lang_lv_is_untyped(&x) && !em_scalar_is_int((em_scalar)x.ty.scalar)))
        return em_lang_lerr(L, pos, NULL, "%s must be an integer, got %s", what, d);
    if (!em_lang_lv_is_untyped(&x) && x.ty.lanes != 1)
        return em_lang_lerr(L, pos, NULL, "%s must be a scalar, got %s", what, d);
    if (x.kind == V_ULIT_INT || x.kind == V_CONST) {
        int64_t v = x.c.i;
        bool neg =
            x.kind == V_ULIT_INT ? v < 0 : em_scalar_is_signed((em_scalar)x.ty.scalar) && v < 0;
        uint64_t u = x.kind == V_ULIT_INT ? (uint64_t)v : x.c.u;
        if (neg) return em_lang_lerr(L, pos, NULL, "%s is negative (%lld)", what, (long long)v);
        if (u > UINT32_MAX)
            return em_lang_lerr(L, pos, NULL, "%s %llu is out of range", what,
                                (unsigned long long)u);
        return em_lang_lv_const_uint(EM_U32, u);
    }
    if (x.ty.scalar == EM_U32) return x;
    return em_lang_lv_rt(em_ty(EM_U32), em_ir_cast(L->k, em_ty(EM_U32), x.v));
}

bool em_lang_need_cond(lower *L, const lv *x, lpos pos, const char *what)
{
    if (x->kind == V_ERR) return false;
    if (!em_lang_need_value(L, x, pos, what)) return false;
    if (!em_lang_lv_is_untyped(x) && x->ty.scalar == EM_BOOL && x->ty.lanes == 1) return true;
    char d[96];
    em_lang_lv_desc(x, d, sizeof(d));
    em_lang_lerr(L, pos, "compare explicitly, e.g. x != 0", "%s must be 'bool', got %s", what, d);
    return false;
}

/* ---- folding ------------------------------------------------------------------------------------
 */

/* For a comparison token, the constant bool it folds to given how a compares with b: -1, 0, 1,
 * or 2 when unordered (a NaN). Returns false for any other token. */
static bool fold_comparison(int op, int order, lv *out)
{
    bool r;
    switch (op) {
    case T_EQEQ: r = order == 0; break;
    case T_NE: r = order != 0; break;
    case T_LT: r = order == -1; break;
    case T_LE: r = order == -1 || order == 0; break;
    case T_GT: r = order == 1; break;
    case T_GE: r = order == 1 || order == 0; break;
    default: return false;
    }
    *out = em_lang_lv_const_bool(r);
    return true;
}

/* Untyped integer arithmetic, with overflow reported. */
static lv fold_untyped_int(lower *L, int op, int64_t a, int64_t b, lpos pos)
{
    int64_t r = 0;
    lv out = {.kind = V_ULIT_INT};
    if (fold_comparison(op, a < b ? -1 : a > b, &out)) return out;
    switch (op) {
    case T_PLUS:
        if (__builtin_add_overflow(a, b, &r)) goto overflow;
        break;
    case T_MINUS:
        if (__builtin_sub_overflow(a, b, &r)) goto overflow;
        break;
    case T_STAR:
        if (__builtin_mul_overflow(a, b, &r)) goto overflow;
        break;
    case T_SLASH:
    case T_PERCENT:
        if (b == 0) return em_lang_lerr(L, pos, NULL, "division by zero in a constant expression");
        if (a == INT64_MIN && b == -1) goto overflow;
        r = op == T_SLASH ? a / b : a % b;
        break;
    case T_AMP:
        r = a & b;
        break;
    case T_PIPE:
        r = a | b;
        break;
    case T_CARET:
        r = a ^ b;
        break;
    case T_SHL:
    case T_SHR:
        if (b < 0 || b > 62)
            return em_lang_lerr(L, pos, NULL,
                                "shift count %lld is out of range in a constant expression",
                                (long long)b);
        if (op == T_SHR) {
            r = a >> b;
        } else {
            if (a < 0 || a > (INT64_MAX >> b)) goto overflow;
            r = a << b;
        }
        break;
    default:
        return em_lang_lv_err();
    }
    out.c.i = r;
    return out;
overflow:
    return em_lang_lerr(L, pos, NULL, "integer overflow in a constant expression");
}

static lv fold_untyped_float(lower *L, int op, double a, double b, lpos pos)
{
    lv out = {.kind = V_ULIT_FLOAT};
    if (fold_comparison(op, a < b ? -1 : a > b ? 1 : a == b ? 0 : 2, &out)) return out;
    switch (op) {
    case T_PLUS:
        out.c.f = a + b;
        break;
    case T_MINUS:
        out.c.f = a - b;
        break;
    case T_STAR:
        out.c.f = a * b;
        break;
    case T_SLASH:
        if (b == 0) return em_lang_lerr(L, pos, NULL, "division by zero in a constant expression");
        out.c.f = a / b;
        break;
    case T_PERCENT:
        if (b == 0) return em_lang_lerr(L, pos, NULL, "division by zero in a constant expression");
        out.c.f = fmod(a, b);
        break;
    default:
        return em_lang_lerr(L, pos, NULL, "'%s' needs integers, got float literal",
                            em_lang_op_text(op));
    }
    if (isinf(out.c.f))
        return em_lang_lerr(L, pos, NULL, "float overflow in a constant expression");
    return out;
}

/* Typed constants of one scalar kind (already unified). */
static lv fold_typed(lower *L, int op, const lv *a, const lv *b, em_type ty, lpos pos)
{
    em_scalar s = (em_scalar)ty.scalar;
    em_type bt = {EM_BOOL, ty.lanes};
    lv r = {.kind = V_CONST, .ty = ty};
    if (em_scalar_is_float(s)) {
        double x = a->c.f, y = b->c.f;
        switch (op) {
        case T_PLUS:
            r.c.f = x + y;
            break;
        case T_MINUS:
            r.c.f = x - y;
            break;
        case T_STAR:
            r.c.f = x * y;
            break;
        case T_SLASH:
            r.c.f = x / y;
            break;
        case T_PERCENT:
            r.c.f = fmod(x, y);
            break;
        case T_EQEQ:
            r.ty = bt;
            r.c.i = x == y;
            return r;
        case T_NE:
            r.ty = bt;
            r.c.i = x != y;
            return r;
        case T_LT:
            r.ty = bt;
            r.c.i = x < y;
            return r;
        case T_LE:
            r.ty = bt;
            r.c.i = x <= y;
            return r;
        case T_GT:
            r.ty = bt;
            r.c.i = x > y;
            return r;
        case T_GE:
            r.ty = bt;
            r.c.i = x >= y;
            return r;
        default:
            return em_lang_lv_err();
        }
        r.c.f = round_to(s, r.c.f);
        return r;
    }
    bool sgn = em_scalar_is_signed(s);
    uint64_t x = a->c.u, y = b->c.u;
    int w = s == EM_BOOL ? 1 : bits_of(s);
    switch (op) {
    case T_PLUS:
        r.c = wrap(s, x + y);
        break;
    case T_MINUS:
        r.c = wrap(s, x - y);
        break;
    case T_STAR:
        r.c = wrap(s, x * y);
        break;
    case T_SLASH:
    case T_PERCENT:
        if (y == 0) return em_lang_lerr(L, pos, NULL, "division by zero in a constant expression");
        if (sgn) {
            int64_t xi = a->c.i, yi = b->c.i;
            if (xi == INT64_MIN && yi == -1)
                r.c = wrap(s, op == T_SLASH ? (uint64_t)xi : 0);
            else
                r.c = wrap(s, (uint64_t)(op == T_SLASH ? xi / yi : xi % yi));
        } else {
            r.c = wrap(s, op == T_SLASH ? x / y : x % y);
        }
        break;
    case T_AMP:
        r.c = wrap(s, x & y);
        break;
    case T_PIPE:
        r.c = wrap(s, x | y);
        break;
    case T_CARET:
        r.c = wrap(s, x ^ y);
        break;
    case T_SHL:
        r.c = wrap(s, x << (y % (uint64_t)w));
        break;
    case T_SHR:
        r.c = sgn ? wrap(s, (uint64_t)(a->c.i >> (y % (uint64_t)w)))
                  : wrap(s, x >> (y % (uint64_t)w));
        break;
    case T_EQEQ:
        r.ty = bt;
        r.c.i = x == y;
        return r;
    case T_NE:
        r.ty = bt;
        r.c.i = x != y;
        return r;
    case T_LT:
        r.ty = bt;
        r.c.i = sgn ? a->c.i < b->c.i : x < y;
        return r;
    case T_LE:
        r.ty = bt;
        r.c.i = sgn ? a->c.i <= b->c.i : x <= y;
        return r;
    case T_GT:
        r.ty = bt;
        r.c.i = sgn ? a->c.i > b->c.i : x > y;
        return r;
    case T_GE:
        r.ty = bt;
        r.c.i = sgn ? a->c.i >= b->c.i : x >= y;
        return r;
    default:
        return em_lang_lv_err();
    }
    return r;
}

/* ---- operators ----------------------------------------------------------------------------------
 */

bool em_lang_unify2(lower *L, lv *a, lv *b, lpos pos, const char *opname)
{
    if (a->kind == V_ERR || b->kind == V_ERR) return false;
    if (em_lang_lv_is_untyped(a) && em_lang_lv_is_untyped(b)) return true;
    if (em_lang_lv_is_untyped(a)) {
        *a = literal_to(L, a, (em_scalar)b->ty.scalar, pos);
        return a->kind != V_ERR;
    }
    if (em_lang_lv_is_untyped(b)) {
        *b = literal_to(L, b, (em_scalar)a->ty.scalar, pos);
        return b->kind != V_ERR;
    }
    char x[48], y[48];
    em_lang_type_str(a->ty, x, sizeof(x));
    em_lang_type_str(b->ty, y, sizeof(y));
    if (a->ty.scalar != b->ty.scalar) {
        char hint[128];
        snprintf(hint, sizeof(hint), "convert one operand explicitly, e.g. %s(...)",
                 em_scalar_name((em_scalar)a->ty.scalar));
        em_lang_lerr(L, pos, hint, "mismatched types '%s' and '%s' in '%s'", x, y, opname);
        return false;
    }
    if (a->ty.lanes != b->ty.lanes && a->ty.lanes != 1 && b->ty.lanes != 1) {
        em_lang_lerr(L, pos, NULL, "mismatched line widths '%s' and '%s' in '%s'", x, y, opname);
        return false;
    }
    return true;
}

static em_ir_op ir_binop(int op)
{
    switch (op) {
    case T_PLUS:
        return EM_OP_ADD;
    case T_MINUS:
        return EM_OP_SUB;
    case T_STAR:
        return EM_OP_MUL;
    case T_SLASH:
        return EM_OP_DIV;
    case T_PERCENT:
        return EM_OP_REM;
    case T_AMP:
        return EM_OP_AND;
    case T_PIPE:
        return EM_OP_OR;
    case T_CARET:
        return EM_OP_XOR;
    case T_SHL:
        return EM_OP_SHL;
    case T_SHR:
        return EM_OP_SHR;
    case T_EQEQ:
        return EM_OP_EQ;
    case T_NE:
        return EM_OP_NE;
    case T_LT:
        return EM_OP_LT;
    case T_LE:
        return EM_OP_LE;
    case T_GT:
        return EM_OP_GT;
    default:
        return EM_OP_GE;
    }
}

static bool is_compare(int op)
{
    return op == T_EQEQ || op == T_NE || op == T_LT || op == T_LE || op == T_GT || op == T_GE;
}

/* Checks that scalar kind s (or an untyped literal when s is EM_SCALAR_COUNT) suits op. */
static bool op_allows(lower *L, int op, const lv *x, lpos pos)
{
    bool untyped = em_lang_lv_is_untyped(x);
    em_scalar s = untyped ? EM_SCALAR_COUNT : (em_scalar)x->ty.scalar;
    bool is_int = untyped ? x->kind == V_ULIT_INT : em_scalar_is_int(s);
    bool is_bool = !untyped && s == EM_BOOL;
    bool ok;
    const char *need;
    switch (op) {
    case T_PLUS:
    case T_MINUS:
    case T_STAR:
    case T_SLASH:
    case T_PERCENT:
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE:
        ok = !is_bool;
        need = "numbers";
        break;
    case T_AMP:
    case T_PIPE:
    case T_CARET:
        ok = is_int || is_bool;
        need = "integers or bools";
        break;
    case T_SHL:
    case T_SHR:
        ok = is_int;
        need = "integers";
        break;
    default:
        ok = true;
        need = "";
    }
    if (ok) return true;
    char d[96];
    em_lang_lv_desc(x, d, sizeof(d));
    em_lang_lerr(L, pos, NULL, "'%s' needs %s, got %s", em_lang_op_text(op), need, d);
    return false;
}

lv em_lang_binop(lower *L, int op, lv a, lv b, lpos pos)
{
    if (a.kind == V_ERR || b.kind == V_ERR) return em_lang_lv_err();
    char what[64];
    snprintf(what, sizeof(what), "an operand of '%s'", em_lang_op_text(op));
    if (!em_lang_need_value(L, &a, pos, what) || !em_lang_need_value(L, &b, pos, what))
        return em_lang_lv_err();
    if (!op_allows(L, op, &a, pos) || !op_allows(L, op, &b, pos)) return em_lang_lv_err();
    bool shift = op == T_SHL || op == T_SHR;
    if (em_lang_lv_is_untyped(&a) && em_lang_lv_is_untyped(&b)) {
        if (a.kind == V_ULIT_INT && b.kind == V_ULIT_INT)
            return fold_untyped_int(L, op, a.c.i, b.c.i, pos);
        double x = a.kind == V_ULIT_INT ? (double)a.c.i : a.c.f;
        double y = b.kind == V_ULIT_INT ? (double)b.c.i : b.c.f;
        return fold_untyped_float(L, op, x, y, pos);
    }
    if (shift) {
        /* the count may be any integer type: it is converted to the shifted value's type */
        /* an untyped value shifted by a comptime count stays untyped (1 << S adapts to where it is
         * used); by a run-time count it is an i32, as in C */
        if (a.kind == V_ULIT_INT && b.kind == V_CONST && em_scalar_is_int((em_scalar)b.ty.scalar)) {
            bool neg = em_scalar_is_signed((em_scalar)b.ty.scalar) && b.c.i < 0;
            int64_t count = neg ? -1 : b.c.u > 63 ? 63 : (int64_t)b.c.u;
            return fold_untyped_int(L, op, a.c.i, count, pos);
        }
        if (em_lang_lv_is_untyped(&a)) a = em_lang_lv_default(L, a, pos);
        if (a.kind == V_ERR) return a;
        if (em_lang_lv_is_untyped(&b)) {
            if (b.c.i < 0)
                return em_lang_lerr(L, pos, NULL, "shift count %lld is negative", (long long)b.c.i);
            b = literal_to(L, &b, (em_scalar)a.ty.scalar, pos);
        } else if (b.ty.scalar != a.ty.scalar) {
            b = em_lang_convert(L, b, (em_type){a.ty.scalar, b.ty.lanes}, pos);
        }
        if (a.kind == V_ERR || b.kind == V_ERR) return em_lang_lv_err();
        if (a.ty.lanes != b.ty.lanes && a.ty.lanes != 1 && b.ty.lanes != 1) {
            char x[48], y[48];
            em_lang_type_str(a.ty, x, sizeof(x));
            em_lang_type_str(b.ty, y, sizeof(y));
            return em_lang_lerr(L, pos, NULL, "mismatched line widths '%s' and '%s' in '%s'", x, y,
                                em_lang_op_text(op));
        }
    } else if (!em_lang_unify2(L, &a, &b, pos, em_lang_op_text(op))) {
        return em_lang_lv_err();
    }
    em_type ty = a.ty;
    if (b.ty.lanes > ty.lanes) ty.lanes = b.ty.lanes;
    if (a.kind == V_CONST && b.kind == V_CONST) return fold_typed(L, op, &a, &b, ty, pos);
    em_type rt = ty;
    if (is_compare(op)) rt.scalar = EM_BOOL;
    em_ir_val va = em_lang_materialize(L, &a), vb = em_lang_materialize(L, &b);
    return em_lang_lv_rt(rt, em_ir_emit(L->k, ir_binop(op), rt, va, vb, 0, 0, 0, 0));
}

lv em_lang_unop(lower *L, int op, lv a, lpos pos)
{
    if (a.kind == V_ERR) return a;
    char what[64];
    snprintf(what, sizeof(what), "the operand of '%s'", op == T_PLUS ? "+" : em_lang_op_text(op));
    if (!em_lang_need_value(L, &a, pos, what)) return em_lang_lv_err();
    char d[96];
    em_lang_lv_desc(&a, d, sizeof(d));
    bool untyped = em_lang_lv_is_untyped(&a);
    em_scalar s = untyped ? EM_SCALAR_COUNT : (em_scalar)a.ty.scalar;
    switch (op) {
    case T_PLUS:
    case T_MINUS:
        if (s == EM_BOOL)
            return em_lang_lerr(L, pos, NULL, "'%s' needs a number, got %s",
                                op == T_PLUS ? "+" : "-", d);
        if (op == T_PLUS) return a;
        if (a.kind == V_ULIT_INT) {
            if (a.c.i == INT64_MIN)
                return em_lang_lerr(L, pos, NULL, "integer overflow in a constant expression");
            a.c.i = -a.c.i;
            return a;
        }
        if (a.kind == V_ULIT_FLOAT) {
            a.c.f = -a.c.f;
            return a;
        }
        if (a.kind == V_CONST) {
            if (em_scalar_is_float(s))
                a.c.f = -a.c.f;
            else
                a.c = wrap(s, (uint64_t)0 - a.c.u);
            return a;
        }
        return em_lang_lv_rt(a.ty, em_ir_unary(L->k, EM_OP_NEG, a.v));
    case T_BANG:
        if (untyped || s != EM_BOOL)
            return em_lang_lerr(
                L, pos,
                s != EM_SCALAR_COUNT && em_scalar_is_int(s) ? "compare explicitly: x == 0" : NULL,
                "'!' needs a bool, got %s", d);
        if (a.kind == V_CONST) {
            a.c.i = !a.c.i;
            return a;
        }
        return em_lang_lv_rt(a.ty, em_ir_unary(L->k, EM_OP_NOT, a.v));
    case T_TILDE:
        if (a.kind == V_ULIT_INT) {
            a.c.i = ~a.c.i;
            return a;
        }
        if (untyped || !em_scalar_is_int(s))
            return em_lang_lerr(L, pos, NULL, "'~' needs an integer, got %s", d);
        if (a.kind == V_CONST) {
            a.c = wrap(s, ~a.c.u);
            return a;
        }
        return em_lang_lv_rt(a.ty, em_ir_unary(L->k, EM_OP_NOT, a.v));
    default:
        return em_lang_lv_err();
    }
}
