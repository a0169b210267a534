/* c_ops.c — the C for one IR instruction inside a region (the body of a unit loop): lane-wise
 * arithmetic on lines (a loop over .v[l_], scalars broadcast), f16/bf16 computed in float and
 * rounded back, wrapping integer arithmetic without undefined behaviour, conversions, memory,
 * atomics, plane ops for a plane of one unit, matrix fragments as plain loops, and print.
 * Control flow and regions are c.c's business. */
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/c_internal.h"

static bool is_half(em_scalar s)
{
    return s == EM_F16 || s == EM_BF16;
}
static unsigned bits_of(em_scalar s)
{
    return (unsigned)em_scalar_size(s) * 8u;
}

/* The unsigned type of the same width, and the unsigned type wrapping arithmetic runs in. */
static const char *same_utype(em_scalar s)
{
    switch (em_scalar_size(s)) {
    case 1:
        return "uint8_t";
    case 2:
        return "uint16_t";
    case 8:
        return "uint64_t";
    default:
        return "uint32_t";
    }
}
static const char *wide_utype(em_scalar s)
{
    return em_scalar_size(s) == 8 ? "uint64_t" : "uint32_t";
}

static em_scalar scalar_of(const cg *g, em_ir_val v)
{
    const em_ir_value *x = cg_val(g, v);
    return x ? (em_scalar)x->type.scalar : EM_I32;
}

static unsigned lanes_of(const cg *g, em_ir_val v)
{
    const em_ir_value *x = cg_val(g, v);
    return x ? x->type.lanes : 1;
}

static void remat_expr(cg *g, em_strbuf *sb, const cg_value *c);

void cg_operand(cg *g, em_strbuf *sb, em_ir_val v, bool lane)
{
    const em_ir_value *x = cg_val(g, v);
    if (!x) {
        cg_fail(g, EM_ERR_INTERNAL, UINT32_MAX, "operand %%%u does not exist", v);
        em_sb_append(sb, "0");
        return;
    }
    if (x->kind == EM_VAL_CONST) {
        cg_literal(sb, (em_scalar)x->type.scalar, x->c);
        return;
    }
    const cg_value *c = &g->vals[v];
    if (c->store == CG_REMAT) {
        remat_expr(g, sb, c);
        return;
    }
    if (!c->name) {
        cg_fail(g, EM_ERR_INTERNAL, UINT32_MAX, "value %%%u has no storage", v);
        em_sb_append(sb, "0");
        return;
    }
    em_sb_append(sb, c->name);
    if (c->store == CG_UNIT) em_sb_append(sb, g->at_cube ? (g->state ? "[lead_]" : "[0]") : "[u_]");
    if (lane && x->type.lanes > 1) em_sb_append(sb, ".v[l_]");
}

/* The operand as a float: half kinds are widened (constants become float literals). */
static void operand_f(cg *g, em_strbuf *sb, em_ir_val v, bool lane)
{
    const em_ir_value *x = cg_val(g, v);
    em_scalar s = x ? (em_scalar)x->type.scalar : EM_F32;
    if (!is_half(s)) {
        cg_operand(g, sb, v, lane);
        return;
    }
    if (x->kind == EM_VAL_CONST) {
        cg_half_literal_f(sb, s, x->c);
        return;
    }
    if (s == EM_F16)
        g->needs->f16 = true;
    else
        g->needs->bf16 = true;
    em_sb_append(sb, s == EM_F16 ? "em_h2f(" : "em_b2f(");
    cg_operand(g, sb, v, lane);
    em_sb_append(sb, ")");
}

/* Opens / closes the rounding of a float result back to a half kind. */
static void round_open(cg *g, em_strbuf *sb, em_scalar s)
{
    if (s == EM_F16) {
        g->needs->f16 = true;
        em_sb_append(sb, "em_f2h(");
    } else if (s == EM_BF16) {
        g->needs->bf16 = true;
        em_sb_append(sb, "em_f2b(");
    }
}
static void round_close(em_strbuf *sb, em_scalar s)
{
    if (is_half(s)) em_sb_append(sb, ")");
}

/* ---- conversions ---------------------------------------------------------------------------- */

void cg_convert(cg *g, em_strbuf *sb, em_scalar from, em_scalar to, const char *e)
{
    if (from == to) {
        em_sb_append(sb, e);
        return;
    }
    if (from == EM_F16) g->needs->f16 = true;
    if (from == EM_BF16) g->needs->bf16 = true;
    const char *widen = from == EM_F16 ? "em_h2f" : "em_b2f";
    if (to == EM_BOOL) {
        em_sb_printf(sb, is_half(from) ? "((%s & 0x7fffu) != 0)" : "(%s != 0)", e);
        return;
    }
    if (from == EM_BOOL) {
        if (to == EM_F16)
            em_sb_printf(sb, "(%s ? 0x3c00u : 0x0000u)", e);
        else if (to == EM_BF16)
            em_sb_printf(sb, "(%s ? 0x3f80u : 0x0000u)", e);
        else
            em_sb_printf(sb, "(%s)%s", cg_ctype(to), e);
        return;
    }
    if (em_scalar_is_int(to)) {
        if (em_scalar_is_int(from)) {
            em_sb_printf(sb, "(%s)%s", cg_ctype(to), e);
            return;
        }
        g->needs->sat[to] = true;
        if (is_half(from))
            em_sb_printf(sb, "em_sat_%s(%s(%s))", em_scalar_name(to), widen, e);
        else
            em_sb_printf(sb, "em_sat_%s(%s)", em_scalar_name(to), e);
        return;
    }
    switch (to) {
    case EM_F32:
        if (is_half(from))
            em_sb_printf(sb, "%s(%s)", widen, e);
        else
            em_sb_printf(sb, "(float)%s", e);
        return;
    case EM_F64:
        if (is_half(from))
            em_sb_printf(sb, "(double)%s(%s)", widen, e);
        else
            em_sb_printf(sb, "(double)%s", e);
        return;
    case EM_F16:
        g->needs->f16 = true;
        if (from == EM_F32)
            em_sb_printf(sb, "em_f2h(%s)", e);
        else if (from == EM_F64) {
            g->needs->d2h = true;
            em_sb_printf(sb, "em_d2h(%s)", e);
        } else if (from == EM_BF16)
            em_sb_printf(sb, "em_f2h(em_b2f(%s))", e);
        else /* integers: exact in float below 2^24, and f16 overflows long before */
            em_sb_printf(sb, "em_f2h((float)%s)", e);
        return;
    case EM_BF16:
        g->needs->bf16 = true;
        if (from == EM_F32) {
            em_sb_printf(sb, "em_f2b(%s)", e);
        } else if (from == EM_F16) {
            em_sb_printf(sb, "em_f2b(em_h2f(%s))", e);
        } else if (em_scalar_size(from) <= 2) {
            em_sb_printf(sb, "em_f2b((float)%s)", e);
        } else {
            g->needs->d2b = true;
            if (from == EM_F64 || em_scalar_size(from) == 4) {
                em_sb_printf(sb, from == EM_F64 ? "em_d2b(%s)" : "em_d2b((double)%s)", e);
            } else {
                g->needs->i64odd = true;
                em_sb_printf(sb, "em_d2b(em_%s64_odd(%s))", from == EM_I64 ? "i" : "u", e);
            }
        }
        return;
    default:
        em_sb_printf(sb, "(%s)%s", cg_ctype(to), e);
        return;
    }
}

/* ---- expressions ---------------------------------------------------------------------------- */

typedef void (*lane_fn)(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane);

#define OP(i) cg_operand(g, sb, in->args[i], lane)
#define OPF(i) operand_f(g, sb, in->args[i], lane)
#define S(text) em_sb_append(sb, text)

/* A position; `@` in the templates stands for the unit index (u_ in regions, the first running
 * unit at cube level). */
static void builtin_expr(em_strbuf *sb, int b, const char *unit)
{
    const char *t;
    switch ((em_builtin)b) {
    case EM_ABSOLUTE_POS:
        t = "(uint32_t)cube_ * units_ + @";
        break;
    case EM_ABSOLUTE_POS_X:
        t = "(uint32_t)(cube_ % cnt_x_) * dim_x_ + @ % dim_x_";
        break;
    case EM_ABSOLUTE_POS_Y:
        t = "(uint32_t)(cube_ / cnt_x_ % cnt_y_) * dim_y_ + @ / dim_x_ % dim_y_";
        break;
    case EM_ABSOLUTE_POS_Z:
        t = "(uint32_t)(cube_ / ((uint64_t)cnt_x_ * cnt_y_)) * dim_z_ + @ / (dim_x_ * dim_y_)";
        break;
    case EM_UNIT_POS:
        t = "@";
        break;
    case EM_UNIT_POS_X:
        t = "@ % dim_x_";
        break;
    case EM_UNIT_POS_Y:
        t = "@ / dim_x_ % dim_y_";
        break;
    case EM_UNIT_POS_Z:
        t = "@ / (dim_x_ * dim_y_)";
        break;
    case EM_CUBE_POS:
        t = "(uint32_t)cube_";
        break;
    case EM_CUBE_POS_X:
        t = "(uint32_t)(cube_ % cnt_x_)";
        break;
    case EM_CUBE_POS_Y:
        t = "(uint32_t)(cube_ / cnt_x_ % cnt_y_)";
        break;
    case EM_CUBE_POS_Z:
        t = "(uint32_t)(cube_ / ((uint64_t)cnt_x_ * cnt_y_))";
        break;
    case EM_CUBE_DIM:
        t = "units_";
        break;
    case EM_CUBE_DIM_X:
        t = "dim_x_";
        break;
    case EM_CUBE_DIM_Y:
        t = "dim_y_";
        break;
    case EM_CUBE_DIM_Z:
        t = "dim_z_";
        break;
    case EM_CUBE_COUNT:
        t = "(uint32_t)cubes_";
        break;
    case EM_CUBE_COUNT_X:
        t = "cnt_x_";
        break;
    case EM_CUBE_COUNT_Y:
        t = "cnt_y_";
        break;
    case EM_CUBE_COUNT_Z:
        t = "cnt_z_";
        break;
    case EM_PLANE_DIM:
        t = "1u";
        break;
    case EM_UNIT_POS_PLANE:
        t = "0u";
        break;
    case EM_PLANE_POS:
        t = "@";
        break;
    default:
        t = "0u";
        break;
    }
    for (; *t; t++) {
        if (*t == '@')
            em_sb_append(sb, unit);
        else
            em_sb_appendc(sb, *t);
    }
}

static void meta_expr(cg *g, em_strbuf *sb, const em_ir_inst *in);

bool cg_rematerializable(uint16_t op)
{
    switch (op) {
    case EM_OP_BUILTIN:
    case EM_OP_LEN:
    case EM_OP_SHAPE:
    case EM_OP_STRIDE:
    case EM_OP_ADD:
    case EM_OP_SUB:
    case EM_OP_MUL:
    case EM_OP_DIV:
    case EM_OP_REM:
    case EM_OP_MIN:
    case EM_OP_MAX:
    case EM_OP_AND:
    case EM_OP_OR:
    case EM_OP_XOR:
    case EM_OP_SHL:
    case EM_OP_SHR:
    case EM_OP_EQ:
    case EM_OP_NE:
    case EM_OP_LT:
    case EM_OP_LE:
    case EM_OP_GT:
    case EM_OP_GE:
    case EM_OP_NEG:
    case EM_OP_NOT:
    case EM_OP_SELECT:
    case EM_OP_CAST:
        return true;
    default:
        return false;
    }
}

static void value_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane);

/* True when the expression needs no parentheses: a name, a literal, a call or a parenthesized
 * whole. */
static bool is_atomic(const char *e)
{
    size_t n = strlen(e), i = 0;
    if (!n) return false;
    while (i < n && (e[i] == '_' || e[i] == '.' || (e[i] >= '0' && e[i] <= '9') ||
                     (e[i] >= 'a' && e[i] <= 'z') || (e[i] >= 'A' && e[i] <= 'Z')))
        i++;
    if (i == n) return true;
    if (e[i] != '(' || e[n - 1] != ')') return false;
    int depth = 0;
    for (size_t j = i; j < n; j++) {
        if (e[j] == '(')
            depth++;
        else if (e[j] == ')' && --depth == 0 && j != n - 1)
            return false;
    }
    return true;
}

/* The expression of a recomputed value (its operands are recomputed too), in parentheses unless
 * it is atomic. */
static void remat_expr(cg *g, em_strbuf *sb, const cg_value *c)
{
    const em_ir_inst *in = em_ir_inst_at(g->k, c->def);
    em_strbuf e;
    em_sb_init(&e);
    if (in) value_expr(g, &e, in, false);
    if (is_atomic(e.data)) {
        em_sb_append(sb, e.data);
    } else {
        em_sb_append(sb, "(");
        em_sb_append(sb, e.data);
        em_sb_append(sb, ")");
    }
    em_sb_free(&e);
}

bool cg_strip_parens(char *e)
{
    size_t n = strlen(e);
    if (n < 2 || e[0] != '(' || !is_atomic(e)) return false;
    int depth = 0;
    for (size_t j = 1; j + 1 < n; j++) { /* a comma expression keeps its parentheses */
        if (e[j] == '(')
            depth++;
        else if (e[j] == ')')
            depth--;
        else if (e[j] == ',' && depth == 0)
            return false;
    }
    memmove(e, e + 1, n - 2);
    e[n - 2] = 0;
    return true;
}

/* a OP b on integers, wrapping (computed in an unsigned type, so no signed overflow). */
static void int_arith(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane, const char *op,
                      em_scalar s)
{
    if (s == EM_U32 || s == EM_U64) {
        OP(0);
        em_sb_printf(sb, " %s ", op);
        OP(1);
        return;
    }
    const char *u = wide_utype(s);
    em_sb_printf(sb, "(%s)((%s)", cg_ctype(s), u);
    OP(0);
    em_sb_printf(sb, " %s (%s)", op, u);
    OP(1);
    S(")");
}

static const char *float_fn(em_ir_op op)
{
    switch (op) {
    case EM_OP_EXP:
        return "exp";
    case EM_OP_EXP2:
        return "exp2";
    case EM_OP_LOG:
        return "log";
    case EM_OP_LOG2:
        return "log2";
    case EM_OP_SQRT:
        return "sqrt";
    case EM_OP_ERF:
        return "erf";
    case EM_OP_TANH:
        return "tanh";
    case EM_OP_SIN:
        return "sin";
    case EM_OP_COS:
        return "cos";
    case EM_OP_FLOOR:
        return "floor";
    case EM_OP_CEIL:
        return "ceil";
    case EM_OP_ROUND:
        return "rint"; /* half to even in the default rounding mode */
    case EM_OP_MIN:
        return "fmin";
    case EM_OP_MAX:
        return "fmax";
    case EM_OP_POW:
        return "pow";
    case EM_OP_REM:
        return "fmod";
    case EM_OP_FMA:
        return "fma";
    default:
        return NULL;
    }
}

/* fn(a[, b[, c]]) on floats: f32 fnf(...), f64 fn(...), halves computed in float and rounded. */
static void float_call(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane, const char *fn,
                       unsigned nargs, em_scalar s)
{
    round_open(g, sb, s);
    em_sb_printf(sb, "%s%s(", fn, s == EM_F64 ? "" : "f");
    for (unsigned i = 0; i < nargs; i++) {
        if (i) S(", ");
        OPF(i);
    }
    S(")");
    round_close(sb, s);
}

static void binary_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane, em_scalar s,
                        bool *ok)
{
    static const char *const sym[] = {
        [EM_OP_ADD] = "+", [EM_OP_SUB] = "-", [EM_OP_MUL] = "*", [EM_OP_DIV] = "/",
        [EM_OP_AND] = "&", [EM_OP_OR] = "|",  [EM_OP_XOR] = "^", [EM_OP_EQ] = "==",
        [EM_OP_NE] = "!=", [EM_OP_LT] = "<",  [EM_OP_LE] = "<=", [EM_OP_GT] = ">",
        [EM_OP_GE] = ">="};
    bool flt = em_scalar_is_float(s), integer = em_scalar_is_int(s);
    em_ir_op op = (em_ir_op)in->op;
    switch (op) {
    case EM_OP_ADD:
    case EM_OP_SUB:
    case EM_OP_MUL:
    case EM_OP_DIV:
        if (flt) {
            round_open(g, sb, s);
            OPF(0);
            em_sb_printf(sb, " %s ", sym[op]);
            OPF(1);
            round_close(sb, s);
        } else if (integer && op == EM_OP_DIV) {
            g->needs->div[s] = true;
            em_sb_printf(sb, "em_div_%s(", em_scalar_name(s));
            OP(0);
            S(", ");
            OP(1);
            S(")");
        } else if (integer) {
            int_arith(g, sb, in, lane, sym[op], s);
        } else {
            *ok = false;
        }
        return;
    case EM_OP_REM:
        if (flt) {
            float_call(g, sb, in, lane, "fmod", 2, s);
        } else if (integer) {
            g->needs->rem[s] = true;
            em_sb_printf(sb, "em_rem_%s(", em_scalar_name(s));
            OP(0);
            S(", ");
            OP(1);
            S(")");
        } else {
            *ok = false;
        }
        return;
    case EM_OP_MIN:
    case EM_OP_MAX:
        if (flt) {
            float_call(g, sb, in, lane, float_fn(op), 2, s);
        } else if (integer) { /* a helper call: no self-comparison when a and b coincide */
            g->needs->minmax[s] = true;
            em_sb_printf(sb, "em_%s_%s(", op == EM_OP_MIN ? "min" : "max", em_scalar_name(s));
            OP(0);
            S(", ");
            OP(1);
            S(")");
        } else {
            *ok = false;
        }
        return;
    case EM_OP_POW:
        if (flt)
            float_call(g, sb, in, lane, "pow", 2, s);
        else
            *ok = false;
        return;
    case EM_OP_AND:
    case EM_OP_OR:
    case EM_OP_XOR:
        if (s == EM_BOOL) {
            em_strbuf a, b;
            em_sb_init(&a);
            em_sb_init(&b);
            cg_operand(g, &a, in->args[0], lane);
            cg_operand(g, &b, in->args[1], lane);
            if (strcmp(a.data, b.data) ==
                0) /* x op x: keep the compiler from calling it tautological */
                em_sb_printf(sb, op == EM_OP_XOR ? "((void)%s, false)" : "%s", a.data);
            else
                em_sb_printf(sb, "(%s %s %s)", a.data,
                             op == EM_OP_AND  ? "&&"
                             : op == EM_OP_OR ? "||"
                                              : "!=",
                             b.data);
            em_sb_free(&a);
            em_sb_free(&b);
        } else if (integer) {
            em_sb_printf(sb, "(%s)(", cg_ctype(s));
            OP(0);
            em_sb_printf(sb, " %s ", sym[op]);
            OP(1);
            S(")");
        } else {
            *ok = false;
        }
        return;
    case EM_OP_SHL:
    case EM_OP_SHR:
        if (!integer) {
            *ok = false;
            return;
        }
        if (op == EM_OP_SHL)
            em_sb_printf(sb, "(%s)((%s)", cg_ctype(s), wide_utype(s));
        else
            em_sb_printf(sb, "(%s)(", cg_ctype(s));
        OP(0);
        S(op == EM_OP_SHL ? " << (" : " >> (");
        OP(1);
        em_sb_printf(sb, " & %u))", bits_of(s) - 1);
        return;
    case EM_OP_EQ:
    case EM_OP_NE:
    case EM_OP_LT:
    case EM_OP_LE:
    case EM_OP_GT:
    case EM_OP_GE: {
        em_strbuf a, b;
        em_sb_init(&a);
        em_sb_init(&b);
        operand_f(g, &a, in->args[0], lane);
        operand_f(g, &b, in->args[1], lane);
        if (strcmp(a.data, b.data) != 0) {
            em_sb_printf(sb, "%s %s %s", a.data, sym[op], b.data);
        } else { /* x CMP x, written out so that no compiler calls it tautological */
            bool holds = op == EM_OP_EQ || op == EM_OP_LE || op == EM_OP_GE;
            if (!flt || op == EM_OP_LT ||
                op == EM_OP_GT) /* still evaluated: it may be its only use */
                em_sb_printf(sb, "((void)%s, %s)", a.data, flt || !holds ? "false" : "true");
            else
                em_sb_printf(sb, "%sisnan(%s)", holds ? "!" : "", a.data);
        }
        em_sb_free(&a);
        em_sb_free(&b);
        return;
    }
    default:
        *ok = false;
        return;
    }
}

static void unary_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane, em_scalar s, bool *ok)
{
    bool flt = em_scalar_is_float(s), integer = em_scalar_is_int(s);
    em_ir_op op = (em_ir_op)in->op;
    const char *t = cg_ctype(s);
    unsigned w = bits_of(s);
    switch (op) {
    case EM_OP_NEG:
        if (is_half(s)) {
            em_sb_printf(sb, "(%s)(", t);
            OP(0);
            S(" ^ 0x8000u)");
        } else if (flt) {
            S("-");
            OP(0);
        } else if (integer) {
            em_sb_printf(sb, "(%s)(0u - (%s)", t, wide_utype(s));
            OP(0);
            S(")");
        } else {
            *ok = false;
        }
        return;
    case EM_OP_NOT:
        if (s == EM_BOOL) {
            S("!");
            OP(0);
        } else if (integer) {
            em_sb_printf(sb, "(%s)~", t);
            OP(0);
        } else {
            *ok = false;
        }
        return;
    case EM_OP_ABS:
        if (is_half(s)) {
            em_sb_printf(sb, "(%s)(", t);
            OP(0);
            S(" & 0x7fffu)");
        } else if (flt) {
            S(s == EM_F64 ? "fabs(" : "fabsf(");
            OP(0);
            S(")");
        } else if (integer && em_scalar_is_signed(s)) {
            S("(");
            OP(0);
            em_sb_printf(sb, " < 0 ? (%s)(0u - (%s)", t, wide_utype(s));
            OP(0);
            S(") : ");
            OP(0);
            S(")");
        } else if (integer) {
            OP(0);
        } else {
            *ok = false;
        }
        return;
    case EM_OP_RSQRT:
        if (!flt) {
            *ok = false;
            return;
        }
        round_open(g, sb, s);
        S(s == EM_F64 ? "1.0 / sqrt(" : "1.0f / sqrtf(");
        OPF(0);
        S(")");
        round_close(sb, s);
        return;
    case EM_OP_ISNAN:
    case EM_OP_ISINF:
        if (flt) {
            S(op == EM_OP_ISNAN ? "isnan(" : "isinf(");
            OPF(0);
            S(")");
        } else {
            *ok = false;
        }
        return;
    case EM_OP_POPCOUNT:
    case EM_OP_CLZ:
    case EM_OP_CTZ: {
        if (!integer) {
            *ok = false;
            return;
        }
        const char *u = same_utype(s);
        if (w == 64) {
            if (op == EM_OP_POPCOUNT) {
                S("(uint32_t)__builtin_popcountll((uint64_t)");
                OP(0);
                S(")");
            } else {
                S("((uint64_t)");
                OP(0);
                em_sb_printf(sb, " != 0u ? (uint32_t)__builtin_%sll((uint64_t)",
                             op == EM_OP_CLZ ? "clz" : "ctz");
                OP(0);
                S(") : 64u)");
            }
        } else if (op == EM_OP_POPCOUNT) {
            em_sb_printf(sb, "(uint32_t)__builtin_popcount((uint32_t)(%s)", u);
            OP(0);
            S(")");
        } else {
            em_sb_printf(sb, "((%s)", u);
            OP(0);
            em_sb_printf(sb, " != 0u ? (uint32_t)__builtin_%s((uint32_t)(%s)",
                         op == EM_OP_CLZ ? "clz" : "ctz", u);
            OP(0);
            if (op == EM_OP_CLZ && w < 32)
                em_sb_printf(sb, ") - %uu : %uu)", 32 - w, w);
            else
                em_sb_printf(sb, ") : %uu)", w);
        }
        return;
    }
    default: {
        const char *fn = float_fn(op);
        if (!fn || !flt) {
            *ok = false;
            return;
        }
        float_call(g, sb, in, lane, fn, 1, s);
        return;
    }
    }
}

static void ternary_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane, bool *ok)
{
    em_scalar s = scalar_of(g, in->args[1]);
    switch (in->op) {
    case EM_OP_SELECT:
        S("(");
        OP(0);
        S(" ? ");
        OP(1);
        S(" : ");
        OP(2);
        S(")");
        return;
    case EM_OP_FMA:
        if (s == EM_F32 || s == EM_F64) {
            float_call(g, sb, in, lane, "fma", 3, s);
        } else if (is_half(s)) { /* exact product in double, one rounding (through odd) to half */
            g->needs->d2h |= s == EM_F16;
            g->needs->d2b |= s == EM_BF16;
            S(s == EM_F16 ? "em_d2h(fma((double)" : "em_d2b(fma((double)");
            OPF(0);
            S(", (double)");
            OPF(1);
            S(", (double)");
            OPF(2);
            S("))");
        } else {
            *ok = false;
        }
        return;
    case EM_OP_CLAMP:
        if (em_scalar_is_float(s)) {
            const char *f = s == EM_F64 ? "" : "f";
            round_open(g, sb, s);
            em_sb_printf(sb, "fmin%s(fmax%s(", f, f);
            OPF(0);
            S(", ");
            OPF(1);
            S("), ");
            OPF(2);
            S(")");
            round_close(sb, s);
        } else if (em_scalar_is_int(s)) {
            g->needs->minmax[s] = true;
            em_sb_printf(sb, "em_clamp_%s(", em_scalar_name(s));
            OP(0);
            S(", ");
            OP(1);
            S(", ");
            OP(2);
            S(")");
        } else {
            *ok = false;
        }
        return;
    default:
        *ok = false;
        return;
    }
}

static void plane_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane)
{
    /* A plane is one unit: reductions and scans over it are the value itself, shuffles and
     * broadcasts read the unit's own value (every other lane is out of range). */
    switch (in->op) {
    case EM_OP_PLANE_EXCLUSIVE_SUM:
        cg_zero(sb, scalar_of(g, in->args[0]));
        return;
    case EM_OP_PLANE_BALLOT:
        S("(");
        OP(0);
        S(" ? 1u : 0u)");
        return;
    default:
        OP(0);
        return;
    }
}

static void meta_expr(cg *g, em_strbuf *sb, const em_ir_inst *in)
{
    const em_ir_memory *m = cg_mem_at(g, in->mem);
    unsigned p = m ? m->param : 0;
    if (in->op == EM_OP_LEN) {
        em_sb_printf(sb, "(uint32_t)launch_->bufs[%u].len", p);
        return;
    }
    g->needs->meta = true;
    em_sb_printf(sb, "em_%s(&launch_->bufs[%u], %du)", in->op == EM_OP_SHAPE ? "shape" : "stride",
                 p, in->imm);
}

/* The expression of one lane (or of the scalar) of a value-producing instruction. */
static void value_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane)
{
    bool ok = true;
    em_scalar s = scalar_of(g, in->args[0]);
    switch (in->op) {
    case EM_OP_ASSIGN:
        OP(0);
        break;
    case EM_OP_CAST: {
        em_strbuf e;
        em_sb_init(&e);
        cg_operand(g, &e, in->args[0], lane);
        const em_ir_value *x = cg_val(g, in->args[0]);
        if (x && x->kind == EM_VAL_CONST && is_half(s)) { /* keep the literal readable */
            em_sb_clear(&e);
            em_sb_printf(&e, "(%s)", cg_ctype(s));
            cg_literal(&e, s, x->c);
        }
        cg_convert(g, sb, s, scalar_of(g, in->dst), e.data);
        em_sb_free(&e);
        break;
    }
    case EM_OP_BUILTIN:
        builtin_expr(sb, in->imm, g->at_cube ? (g->state ? "lead_" : "0u") : "u_");
        break;
    case EM_OP_LEN:
    case EM_OP_SHAPE:
    case EM_OP_STRIDE:
        meta_expr(g, sb, in);
        break;
    default: {
        if (in->op >= EM_OP_ADD && in->op <= EM_OP_GE)
            binary_expr(g, sb, in, lane, s, &ok);
        else if (in->op >= EM_OP_NEG && in->op <= EM_OP_CTZ)
            unary_expr(g, sb, in, lane, s, &ok);
        else if (in->op >= EM_OP_FMA && in->op <= EM_OP_SELECT)
            ternary_expr(g, sb, in, lane, &ok);
        else if (in->op >= EM_OP_PLANE_SUM && in->op <= EM_OP_PLANE_SHUFFLE_DOWN)
            plane_expr(g, sb, in, lane);
        else
            ok = false;
        break;
    }
    }
    if (!ok) {
        cg_fail(g, EM_ERR_UNSUPPORTED, g->cur_inst, "%s on %s is not supported by the C target",
                em_ir_op_name((em_ir_op)in->op), em_scalar_name(s) ? em_scalar_name(s) : "?");
    }
}

/* ---- statements ----------------------------------------------------------------------------- */

/* Writes dst = fn(...) lane by lane, declaring dst when it is a local temporary. */
static void assign_lanes(cg *g, em_ir_val dst, const em_ir_inst *in, lane_fn fn)
{
    const em_ir_value *d = cg_val(g, dst);
    if (!d) return;
    const cg_value *c = &g->vals[dst];
    if (c->store == CG_NONE || c->store == CG_REMAT) return; /* unused, or recomputed where used */
    char tb[32];
    const char *vt = cg_vtype(g, d->type, tb);
    bool decl = d->kind == EM_VAL_TEMP && c->store == CG_LOCAL;
    bool line = d->type.lanes > 1;
    em_strbuf e, lv;
    em_sb_init(&e);
    em_sb_init(&lv);
    fn(g, &e, in, line);
    cg_operand(g, &lv, dst, line);
    if (!decl && strcmp(lv.data, e.data) == 0) {
        /* x = x: nothing to do (and compilers warn about it) */
    } else if (!line) {
        if (decl)
            cg_line(g, "%s %s = %s;", vt, c->name, e.data);
        else
            cg_line(g, "%s = %s;", lv.data, e.data);
    } else {
        if (decl) cg_line(g, "%s %s;", vt, c->name);
        cg_line(g, "for (int l_ = 0; l_ < %u; l_++) %s = %s;", d->type.lanes, lv.data, e.data);
    }
    em_sb_free(&e);
    em_sb_free(&lv);
}

static void load_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane)
{
    const em_ir_memory *m = cg_mem_at(g, in->mem);
    if (!m) return;
    const char *p = g->mems[in->mem].name ? g->mems[in->mem].name : "0";
    bool b = m->elem.scalar == EM_BOOL;
    if (b) S("(");
    em_sb_printf(sb, "%s[", p);
    if (lane) {
        S("(size_t)");
        OP(0);
        em_sb_printf(sb, " * %u + l_]", m->elem.lanes);
    } else {
        OP(0);
        S("]");
    }
    if (b) S(" != 0)");
}

static void extract_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane)
{
    (void)lane;
    unsigned n = lanes_of(g, in->args[0]);
    const em_ir_value *a = cg_val(g, in->args[0]);
    if (n > 1 && a && a->kind != EM_VAL_CONST) {
        cg_operand(g, sb, in->args[0], false);
        S(".v[(size_t)");
        cg_operand(g, sb, in->args[1], false);
        em_sb_printf(sb, " %% %u]", n);
    } else { /* every lane holds the same value: the index only needs evaluating */
        S("((void)");
        cg_operand(g, sb, in->args[1], false);
        S(", ");
        cg_operand(g, sb, in->args[0], false);
        S(")");
    }
}

static void copy_lane_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane)
{
    cg_operand(g, sb, in->args[0], lane);
}

static void insert_scalar_expr(cg *g, em_strbuf *sb, const em_ir_inst *in, bool lane)
{
    (void)lane;
    S("((void)");
    cg_operand(g, sb, in->args[0], false);
    S(", (void)");
    cg_operand(g, sb, in->args[1], false);
    S(", ");
    cg_operand(g, sb, in->args[2], false);
    S(")");
}

static void emit_store(cg *g, const em_ir_inst *in)
{
    const em_ir_memory *m = cg_mem_at(g, in->mem);
    if (!m) return;
    const char *p = g->mems[in->mem].name ? g->mems[in->mem].name : "0";
    em_strbuf idx, v;
    em_sb_init(&idx);
    em_sb_init(&v);
    cg_operand(g, &idx, in->args[0], false);
    bool line = m->elem.lanes > 1;
    if (m->elem.scalar == EM_BOOL) em_sb_append(&v, "(uint8_t)");
    cg_operand(g, &v, in->args[1], line);
    if (line)
        cg_line(g, "for (int l_ = 0; l_ < %u; l_++) %s[(size_t)%s * %u + l_] = %s;", m->elem.lanes,
                p, idx.data, m->elem.lanes, v.data);
    else
        cg_line(g, "%s[%s] = %s;", p, idx.data, v.data);
    em_sb_free(&idx);
    em_sb_free(&v);
}

static void emit_insert(cg *g, const em_ir_inst *in)
{
    const em_ir_value *d = cg_val(g, in->dst);
    if (!d || g->vals[in->dst].store == CG_NONE) return;
    if (d->type.lanes == 1) { /* inserting into a scalar replaces it */
        assign_lanes(g, in->dst, in, insert_scalar_expr);
        return;
    }
    assign_lanes(g, in->dst, in, copy_lane_expr);
    em_strbuf lv, idx, v;
    em_sb_init(&lv);
    em_sb_init(&idx);
    em_sb_init(&v);
    cg_operand(g, &lv, in->dst, false);
    cg_operand(g, &idx, in->args[1], false);
    cg_operand(g, &v, in->args[2], false);
    cg_line(g, "%s.v[(size_t)%s %% %u] = %s;", lv.data, idx.data, d->type.lanes, v.data);
    em_sb_free(&lv);
    em_sb_free(&idx);
    em_sb_free(&v);
}

static void emit_bitcast(cg *g, const em_ir_inst *in)
{
    const em_ir_value *d = cg_val(g, in->dst), *a = cg_val(g, in->args[0]);
    if (!d || !a || g->vals[in->dst].store == CG_NONE) return;
    const cg_value *c = &g->vals[in->dst];
    char tb[32], sb2[32];
    const char *vt = cg_vtype(g, d->type, tb);
    if (d->kind == EM_VAL_TEMP && c->store == CG_LOCAL) cg_line(g, "%s %s;", vt, c->name);
    em_strbuf lv, src;
    em_sb_init(&lv);
    em_sb_init(&src);
    cg_operand(g, &lv, in->dst, false);
    if (a->kind == EM_VAL_CONST) { /* a literal has no address: copy it to a temporary first */
        const char *st = cg_vtype(g, a->type, sb2);
        cg_line(g, "{");
        g->indent++;
        if (a->type.lanes > 1) {
            cg_line(g, "%s bits_;", st);
            cg_literal(&src, (em_scalar)a->type.scalar, a->c);
            cg_line(g, "for (int l_ = 0; l_ < %u; l_++) bits_.v[l_] = %s;", a->type.lanes,
                    src.data);
        } else {
            cg_literal(&src, (em_scalar)a->type.scalar, a->c);
            cg_line(g, "%s bits_ = %s;", st, src.data);
        }
        cg_line(g, "memcpy(&%s, &bits_, sizeof %s);", lv.data, lv.data);
        g->indent--;
        cg_line(g, "}");
    } else if (g->vals[in->args[0]].store == CG_REMAT) { /* an expression: no address either */
        cg_operand(g, &src, in->args[0], false);
        cg_line(g, "{");
        g->indent++;
        cg_line(g, "%s bits_ = %s;", cg_vtype(g, a->type, sb2), src.data);
        cg_line(g, "memcpy(&%s, &bits_, sizeof %s);", lv.data, lv.data);
        g->indent--;
        cg_line(g, "}");
    } else {
        cg_operand(g, &src, in->args[0], false);
        cg_line(g, "memcpy(&%s, &%s, sizeof %s);", lv.data, src.data, lv.data);
    }
    em_sb_free(&lv);
    em_sb_free(&src);
}

static void emit_atomic(cg *g, const em_ir_inst *in)
{
    const em_ir_memory *m = cg_mem_at(g, in->mem);
    if (!m) return;
    em_scalar s = (em_scalar)m->elem.scalar;
    unsigned o = (unsigned)(in->op - EM_OP_ATOMIC_ADD);
    if (o >= 11 || m->elem.lanes != 1 || s == EM_BOOL || is_half(s) ||
        (em_scalar_is_float(s) && in->op != EM_OP_ATOMIC_ADD && in->op != EM_OP_ATOMIC_SUB &&
         in->op != EM_OP_ATOMIC_XCHG && in->op != EM_OP_ATOMIC_LOAD &&
         in->op != EM_OP_ATOMIC_STORE && in->op != EM_OP_ATOMIC_CAS)) {
        cg_fail(g, EM_ERR_UNSUPPORTED, g->cur_inst,
                "%s on %s memory is not supported by the C target", em_ir_op_name((em_ir_op)in->op),
                em_scalar_name(s) ? em_scalar_name(s) : "?");
        return;
    }
    static const char *const names[11] = {"add", "sub",  "min", "max",  "and",  "or",
                                          "xor", "xchg", "cas", "load", "store"};
    g->needs->atomic[o][s] = true;
    em_strbuf call;
    em_sb_init(&call);
    em_sb_printf(&call, "em_atomic_%s_%s(&%s[", names[o], em_scalar_name(s),
                 g->mems[in->mem].name ? g->mems[in->mem].name : "0");
    cg_operand(g, &call, in->args[0], false);
    em_sb_append(&call, "]");
    unsigned nargs = in->op == EM_OP_ATOMIC_LOAD ? 0 : in->op == EM_OP_ATOMIC_CAS ? 2 : 1;
    for (unsigned i = 0; i < nargs; i++) {
        em_sb_append(&call, ", ");
        cg_operand(g, &call, in->args[1 + i], false);
    }
    em_sb_append(&call, ")");
    const cg_value *c = in->dst && in->dst < g->nvals ? &g->vals[in->dst] : NULL;
    if (c && c->store != CG_NONE && c->name) {
        em_strbuf lv;
        em_sb_init(&lv);
        cg_operand(g, &lv, in->dst, false);
        if (c->store == CG_LOCAL)
            cg_line(g, "%s %s = %s;", cg_ctype(s), c->name, call.data);
        else
            cg_line(g, "%s = %s;", lv.data, call.data);
        em_sb_free(&lv);
    } else {
        cg_line(g, "%s;", call.data);
    }
    em_sb_free(&call);
}

/* ---- matrices ------------------------------------------------------------------------------- */

static void frag_dims(const em_ir_value *f, unsigned *rows, unsigned *cols)
{
    switch (f->mat_role) {
    case EM_MAT_A:
        *rows = f->mat_m, *cols = f->mat_k;
        break;
    case EM_MAT_B:
        *rows = f->mat_k, *cols = f->mat_n;
        break;
    default:
        *rows = f->mat_m, *cols = f->mat_n;
        break;
    }
}

static const char *frag_name(cg *g, em_ir_val v)
{
    return v < g->nvals && g->vals[v].name ? g->vals[v].name : "0";
}

static void emit_matrix(cg *g, const em_ir_inst *in)
{
    const em_ir_value *f = cg_val(g, in->op == EM_OP_MAT_STORE ? in->args[2] : in->args[0]);
    if (!f || f->kind != EM_VAL_MATRIX) return;
    unsigned rows, cols;
    frag_dims(f, &rows, &cols);
    em_strbuf a, b;
    em_sb_init(&a);
    em_sb_init(&b);
    switch (in->op) {
    case EM_OP_MAT_FILL:
        cg_operand(g, &a, in->args[1], false);
        cg_line(g, "for (int i_ = 0; i_ < %u; i_++) %s[i_] = %s;", rows * cols,
                frag_name(g, in->args[0]), a.data);
        break;
    case EM_OP_MAT_LOAD:
    case EM_OP_MAT_STORE: {
        bool load = in->op == EM_OP_MAT_LOAD;
        unsigned off = load ? 1 : 0;
        const char *p = in->mem < g->nmems && g->mems[in->mem].name ? g->mems[in->mem].name : "0";
        cg_operand(g, &a, in->args[off], false);
        cg_operand(g, &b, in->args[off + 1], false);
        const char *fr = frag_name(g, load ? in->args[0] : in->args[2]);
        cg_line(g, "for (uint32_t mi_ = 0; mi_ < %u; mi_++)", rows);
        g->indent++;
        cg_line(g, "for (uint32_t mj_ = 0; mj_ < %u; mj_++)", cols);
        g->indent++;
        const char *at = in->imm == EM_COL_MAJOR ? "(size_t)%s + (size_t)mj_ * %s + mi_"
                                                 : "(size_t)%s + (size_t)mi_ * %s + mj_";
        em_strbuf idx;
        em_sb_init(&idx);
        em_sb_printf(&idx, at, a.data, b.data);
        if (load)
            cg_line(g, "%s[mi_ * %u + mj_] = %s[%s];", fr, cols, p, idx.data);
        else
            cg_line(g, "%s[%s] = %s[mi_ * %u + mj_];", p, idx.data, fr, cols);
        em_sb_free(&idx);
        g->indent -= 2;
        break;
    }
    case EM_OP_MAT_MMA: {
        const em_ir_value *fa = cg_val(g, in->args[1]), *fd = f;
        if (!fa) break;
        em_scalar sd = (em_scalar)fd->type.scalar, sa = (em_scalar)fa->type.scalar;
        em_scalar ct = EM_U64; /* integers accumulate wrapping in 64 bits */
        if (em_scalar_is_float(sd) || em_scalar_is_float(sa))
            ct = sd == EM_F64 || sa == EM_F64 ? EM_F64 : EM_F32;
        unsigned m = fd->mat_m, n = fd->mat_n, kk = fd->mat_k;
        const char *D = frag_name(g, in->args[0]), *A = frag_name(g, in->args[1]);
        const char *B = frag_name(g, in->args[2]), *C = frag_name(g, in->args[3]);
        em_strbuf e;
        em_sb_init(&e);
        cg_line(g, "for (uint32_t mi_ = 0; mi_ < %u; mi_++) {", m);
        g->indent++;
        cg_line(g, "for (uint32_t mj_ = 0; mj_ < %u; mj_++) {", n);
        g->indent++;
        em_sb_printf(&a, "%s[mi_ * %u + mj_]", C, n);
        cg_convert(g, &e, sd, ct, a.data);
        cg_line(g, "%s acc_ = %s;", cg_ctype(ct), e.data);
        em_sb_clear(&a);
        em_sb_clear(&e);
        em_sb_printf(&a, "%s[mi_ * %u + mk_]", A, kk);
        em_sb_printf(&b, "%s[mk_ * %u + mj_]", B, n);
        cg_convert(g, &e, sa, ct, a.data);
        em_sb_append(&e, " * ");
        cg_convert(g, &e, sa, ct, b.data);
        cg_line(g, "for (uint32_t mk_ = 0; mk_ < %u; mk_++) acc_ += %s;", kk, e.data);
        em_sb_clear(&e);
        cg_convert(g, &e, ct, sd, "acc_");
        cg_line(g, "%s[mi_ * %u + mj_] = %s;", D, n, e.data);
        g->indent--;
        cg_line(g, "}");
        g->indent--;
        cg_line(g, "}");
        em_sb_free(&e);
        break;
    }
    default:
        break;
    }
    em_sb_free(&a);
    em_sb_free(&b);
}

/* ---- print ---------------------------------------------------------------------------------- */

static void print_value(cg *g, em_strbuf *fmt, em_strbuf *args, em_ir_val v)
{
    const em_ir_value *x = cg_val(g, v);
    if (!x) return;
    em_scalar s = (em_scalar)x->type.scalar;
    unsigned n = x->type.lanes;
    if (n > 1) em_sb_append(fmt, "[");
    for (unsigned l = 0; l < n; l++) {
        em_strbuf e;
        em_sb_init(&e);
        cg_operand(g, &e, v, false);
        if (n > 1 && x->kind != EM_VAL_CONST) em_sb_printf(&e, ".v[%u]", l);
        if (l) em_sb_append(fmt, ", ");
        if (s == EM_BOOL) {
            em_sb_append(fmt, "%s");
            em_sb_printf(args, ", %s ? \"true\" : \"false\"", e.data);
        } else if (em_scalar_is_int(s) && em_scalar_is_signed(s)) {
            em_sb_append(fmt, "%lld");
            em_sb_printf(args, ", (long long)%s", e.data);
        } else if (em_scalar_is_int(s)) {
            em_sb_append(fmt, "%llu");
            em_sb_printf(args, ", (unsigned long long)%s", e.data);
        } else {
            em_strbuf f;
            em_sb_init(&f);
            cg_convert(g, &f, s, EM_F64, e.data);
            em_sb_append(fmt, "%g");
            em_sb_printf(args, ", %s", f.data);
            em_sb_free(&f);
        }
        em_sb_free(&e);
    }
    if (n > 1) em_sb_append(fmt, "]");
}

static void emit_print(cg *g, const em_ir_inst *in)
{
    em_strbuf fmt, args;
    em_sb_init(&fmt);
    em_sb_init(&args);
    unsigned next = 0, nargs = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0;
    for (const unsigned char *s = (const unsigned char *)(in->str ? in->str : ""); *s; s++) {
        if (s[0] == '%' && s[1] == 'v') {
            s++;
            if (next < nargs)
                print_value(g, &fmt, &args, in->args[next++]);
            else
                em_sb_append(&fmt, "%%v");
        } else if (s[0] == '%') {
            em_sb_append(&fmt, "%%");
            if (s[1] == '%') s++;
        } else if (*s == '\n') {
            em_sb_append(&fmt, "\\n");
        } else if (*s == '\t') {
            em_sb_append(&fmt, "\\t");
        } else if (*s == '"' || *s == '\\' || *s == '?') {
            em_sb_appendc(&fmt, '\\');
            em_sb_appendc(&fmt, (char)*s);
        } else if (*s < 32 || *s >= 127) {
            em_sb_printf(&fmt, "\\%03o", *s);
        } else {
            em_sb_appendc(&fmt, (char)*s);
        }
    }
    cg_line(g, "fprintf(stderr, \"%s\"%s);", fmt.data, args.data);
    em_sb_free(&fmt);
    em_sb_free(&args);
}

/* ---- dispatch ------------------------------------------------------------------------------- */

void cg_emit_op(cg *g, uint32_t idx, const em_ir_inst *in)
{
    g->cur_inst = idx;
    switch (in->op) {
    case EM_OP_STORE:
        emit_store(g, in);
        return;
    case EM_OP_LOAD:
        assign_lanes(g, in->dst, in, load_expr);
        return;
    case EM_OP_EXTRACT:
        assign_lanes(g, in->dst, in, extract_expr);
        return;
    case EM_OP_INSERT:
        emit_insert(g, in);
        return;
    case EM_OP_BITCAST:
        emit_bitcast(g, in);
        return;
    case EM_OP_SYNC_CUBE:
        cg_line(g, "/* sync_cube */");
        return;
    case EM_OP_SYNC_PLANE:
        cg_line(g, "/* sync_plane: a plane is one unit here */");
        return;
    case EM_OP_FENCE:
        if (in->imm)
            cg_line(g, "__atomic_thread_fence(__ATOMIC_SEQ_CST);");
        else
            cg_line(g, "/* fence: the cube runs on one thread */");
        return;
    case EM_OP_MAT_FILL:
    case EM_OP_MAT_LOAD:
    case EM_OP_MAT_MMA:
    case EM_OP_MAT_STORE:
        emit_matrix(g, in);
        return;
    case EM_OP_PRINT:
        emit_print(g, in);
        return;
    case EM_OP_INTRINSIC:
        cg_fail(g, EM_ERR_UNSUPPORTED, idx, "intrinsic '%s' is not available on the C target",
                in->str ? in->str : "");
        return;
    default:
        break;
    }
    if (in->op >= EM_OP_ATOMIC_ADD && in->op <= EM_OP_ATOMIC_STORE) {
        emit_atomic(g, in);
        return;
    }
    if (in->op == EM_OP_ASSIGN) {
        assign_lanes(g, in->dst, in, value_expr);
        return;
    }
    if (!in->dst) {
        cg_fail(g, EM_ERR_INTERNAL, idx, "no code for this instruction");
        return;
    }
    assign_lanes(g, in->dst, in, value_expr);
}

/* ---- what an instruction reads and writes ------------------------------------------------- */

unsigned cg_reads(const em_ir_inst *in, em_ir_val out[EM_IR_MAX_ARGS])
{
    unsigned n = 0;
#define R(i) (out[n++] = in->args[i])
    switch (in->op) {
    case EM_OP_ASSIGN:
    case EM_OP_CAST:
    case EM_OP_BITCAST:
    case EM_OP_LOAD:
    case EM_OP_IF:
    case EM_OP_ATOMIC_LOAD:
        R(0);
        break;
    case EM_OP_EXTRACT:
    case EM_OP_STORE:
    case EM_OP_ATOMIC_STORE:
        R(0), R(1);
        break;
    case EM_OP_INSERT:
    case EM_OP_ATOMIC_CAS:
        R(0), R(1), R(2);
        break;
    case EM_OP_LEN:
    case EM_OP_SHAPE:
    case EM_OP_STRIDE:
    case EM_OP_BUILTIN:
    case EM_OP_SYNC_CUBE:
    case EM_OP_SYNC_PLANE:
    case EM_OP_FENCE:
    case EM_OP_LOOP:
    case EM_OP_BREAK:
    case EM_OP_CONTINUE:
    case EM_OP_RETURN:
    case EM_OP_INTRINSIC:
    case EM_OP_PLANE_EXCLUSIVE_SUM:
        break;
    case EM_OP_RANGE:
        R(0), R(1), R(2), R(3);
        break;
    case EM_OP_MAT_FILL:
        R(1);
        break;
    case EM_OP_MAT_LOAD:
        R(1), R(2);
        break;
    case EM_OP_MAT_MMA:
        R(1), R(2), R(3);
        break;
    case EM_OP_MAT_STORE:
        R(0), R(1), R(2);
        break;
    case EM_OP_PRINT:
        for (int i = 0; i < in->imm && i < EM_IR_MAX_ARGS; i++) R(i);
        break;
    default:
        if (in->op >= EM_OP_ADD && in->op <= EM_OP_GE) {
            R(0), R(1);
        } else if (in->op >= EM_OP_NEG && in->op <= EM_OP_CTZ) {
            R(0);
        } else if (in->op >= EM_OP_FMA && in->op <= EM_OP_SELECT) {
            R(0), R(1), R(2);
        } else if (in->op >= EM_OP_PLANE_SUM && in->op <= EM_OP_PLANE_SHUFFLE_DOWN) {
            R(0); /* the lane operand is never needed with one unit per plane */
        } else if (in->op >= EM_OP_ATOMIC_ADD && in->op <= EM_OP_ATOMIC_XCHG) {
            R(0), R(1);
        }
        break;
    }
#undef R
    return n;
}

em_ir_val cg_writes(const em_ir_inst *in)
{
    switch (in->op) {
    case EM_OP_MAT_FILL:
    case EM_OP_MAT_LOAD:
    case EM_OP_MAT_MMA:
    case EM_OP_RANGE:
        return in->args[0];
    default:
        return EM_IR_NONE;
    }
}
