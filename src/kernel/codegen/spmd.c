/* spmd.c — the emitter shared by the GPU code generators (see spmd.h). It checks and names what a
 * kernel uses, then walks the IR once, writing C-like text through the dialect's hooks: lane-wise
 * operations lane by lane (or as whole-line operators where the target has them), integer
 * division that never traps, f16/bf16 rounding and narrow-integer wrapping after each operation,
 * bitcasts through unsigned bit patterns, structured control flow, and the loop lowering of
 * matrix ops. Target specifics live in cuda.c, opencl.c and glsl.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/spmd.h"

#define MAX_NEST 300 /* deeper than the verifier allows; guards the recursion */

/* A scratch string; every SB must be freed with sb_done. */
#define SB(x)                                                                                      \
    em_strbuf x;                                                                                   \
    em_sb_init(&x)
static void sb_done(em_strbuf *a) { em_sb_free(a); }

/* ---- errors, lines, values ------------------------------------------------------------------ */

void em_spmd_fail(em_spmd *e, const char *fmt, ...)
{
    if (e->failed) return;
    e->failed = true;
    SB(msg);
    em_sb_printf(&msg, "%s: kernel %s: ", e->d->name, e->k ? em_ir_kernel_name(e->k) : "?");
    if (e->k && e->inst != UINT32_MAX) {
        char *text = em_ir_print_inst(e->k, e->inst);
        em_sb_printf(&msg, "inst %u `%s`: ", e->inst, text ? text : "?");
        free(text);
    }
    va_list ap;
    va_start(ap, fmt);
    em_sb_vprintf(&msg, fmt, ap);
    va_end(ap);
    em_set_error(EM_ERR_UNSUPPORTED, "%s", msg.data);
    sb_done(&msg);
}

void em_spmd_line(em_spmd *e, const char *fmt, ...)
{
    em_sb_indent(e->sb, e->depth);
    va_list ap;
    va_start(ap, fmt);
    em_sb_vprintf(e->sb, fmt, ap);
    va_end(ap);
    em_sb_appendc(e->sb, '\n');
}

const em_ir_value *em_spmd_value(const em_spmd *e, em_ir_val v) { return em_ir_value_at(e->k, v); }

static em_type type_of(const em_spmd *e, em_ir_val v)
{
    const em_ir_value *x = em_spmd_value(e, v);
    return x ? x->type : em_ty(EM_I32);
}

static bool is_const(const em_spmd *e, em_ir_val v)
{
    const em_ir_value *x = em_spmd_value(e, v);
    return x && x->kind == EM_VAL_CONST;
}

unsigned em_spmd_bits(em_scalar s) { return s == EM_BOOL ? 8 : (unsigned)em_scalar_size(s) * 8; }

bool em_spmd_narrow(em_scalar s) { return s == EM_I8 || s == EM_I16 || s == EM_U8 || s == EM_U16; }

void em_spmd_need_scalar(em_spmd *e, em_scalar s)
{
    if (s == EM_F16) e->needs |= EM_NEED_F16;
    if (s == EM_BF16) e->needs |= EM_NEED_BF16;
    if (s == EM_F64) e->needs |= EM_NEED_F64;
    if (s == EM_I64 || s == EM_U64) e->needs |= EM_NEED_INT64;
}

/* Rounds x to a float format with `digits` significant bits, smallest quantum 2^qmin and largest
 * finite value `max` (round to nearest even, overflow to infinity). */
static double round_to(double x, int digits, int qmin, double max)
{
    if (!isfinite(x) || x == 0) return x;
    int ex;
    frexp(fabs(x), &ex);
    int q = ex - digits;
    if (q < qmin) q = qmin;
    double r = nearbyint(fabs(x) / ldexp(1.0, q)) * ldexp(1.0, q);
    if (r > max) r = INFINITY;
    return copysign(r, x);
}

/* A constant's payload as its kind holds it (f16/bf16/f32 rounded to their precision). */
static em_ir_const const_value(em_scalar s, em_ir_const c)
{
    if (s == EM_F16) c.f = round_to(c.f, 11, -24, 65504.0);
    if (s == EM_BF16) c.f = round_to(c.f, 8, -133, 3.3895313892515355e38);
    if (s == EM_F32) c.f = (double)(float)c.f;
    return c;
}

static void lit(em_spmd *e, em_scalar s, em_ir_const c, em_strbuf *sb) { e->d->literal(e, s, const_value(s, c), sb); }

static void lit_i(em_spmd *e, em_scalar s, int64_t v, em_strbuf *sb)
{
    em_ir_const c;
    if (em_scalar_is_float(s))
        c.f = (double)v;
    else
        c.i = v;
    lit(e, s, c, sb);
}

void em_spmd_val(em_spmd *e, em_ir_val v, em_strbuf *sb)
{
    const em_ir_value *x = em_spmd_value(e, v);
    if (!x) {
        em_sb_append(sb, "0");
        return;
    }
    if (x->kind == EM_VAL_CONST)
        lit(e, (em_scalar)x->type.scalar, x->c, sb);
    else
        em_sb_append(sb, e->vname[v] ? e->vname[v] : "em_unnamed");
}

void em_spmd_val_lane(em_spmd *e, em_ir_val v, unsigned i, em_strbuf *sb)
{
    const em_ir_value *x = em_spmd_value(e, v);
    if (!x || x->type.lanes == 1 || x->kind == EM_VAL_CONST) {
        em_spmd_val(e, v, sb);
        return;
    }
    e->d->lane(e, x->type, e->vname[v] ? e->vname[v] : "em_unnamed", i, sb);
}

static void convert_expr(em_spmd *e, em_scalar from, em_scalar to, const char *x, em_strbuf *sb);

void em_spmd_val_u32(em_spmd *e, em_ir_val v, em_strbuf *sb)
{
    SB(x);
    em_spmd_val(e, v, &x);
    convert_expr(e, (em_scalar)type_of(e, v).scalar, EM_U32, x.data, sb);
    sb_done(&x);
}

void em_spmd_index(em_spmd *e, em_ir_val v, em_strbuf *sb)
{
    em_scalar s = (em_scalar)type_of(e, v).scalar;
    if (e->d->index32 && em_spmd_bits(s) == 64)
        em_spmd_val_u32(e, v, sb);
    else
        em_spmd_val(e, v, sb);
}

void em_spmd_fresh(em_spmd *e, const char *prefix, char buf[32])
{
    snprintf(buf, 32, "em_%s%u", prefix, e->fresh++);
}

/* ---- names and the scan before emission ------------------------------------------------------ */

/* An identifier from an IR name: letters, digits and single underscores, never starting with a
 * digit or "gl", always ending in a suffix that keeps it unique ("_12", "_m3"). */
static char *ident(const char *name, const char *fallback, const char *sep, uint32_t id)
{
    SB(sb);
    size_t start = 0;
    for (const char *p = name ? name : ""; *p && sb.len - start < 40; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!ok) {
            if (sb.len > start && sb.data[sb.len - 1] != '_') em_sb_appendc(&sb, '_');
            continue;
        }
        if (sb.len == start && ((c >= '0' && c <= '9') || ((c == 'g' || c == 'G') && (p[1] == 'l' || p[1] == 'L'))))
            em_sb_appendc(&sb, 'n');
        em_sb_appendc(&sb, c);
    }
    while (sb.len > start && sb.data[sb.len - 1] == '_') sb.data[--sb.len] = 0;
    if (sb.len == start)
        em_sb_printf(&sb, "%s%u", fallback, id);
    else
        em_sb_printf(&sb, "_%s%u", sep, id);
    return em_sb_take(&sb);
}

static void use_val(em_spmd *e, em_ir_val v)
{
    if (v && v <= em_ir_value_count(e->k)) e->vused[v] = 1;
}

static void check_dtype(em_spmd *e, em_scalar s, int space)
{
    if (!e->d->dtype_missing || s >= EM_SCALAR_COUNT) return;
    const char *why = e->d->dtype_missing(e, s, space);
    if (why) em_spmd_fail(e, "%s", why);
}

static void scan_block(em_spmd *e, uint32_t b, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(e->k, b);
    if (!blk || depth > MAX_NEST) return;
    for (size_t i = 0; i < blk->len && !e->failed; i++) {
        const em_ir_inst *in = em_ir_inst_at(e->k, blk->items[i]);
        if (!in) continue;
        e->inst = blk->items[i];
        use_val(e, in->dst);
        for (int a = 0; a < EM_IR_MAX_ARGS; a++) use_val(e, in->args[a]);
        const em_ir_value *dv = em_spmd_value(e, in->dst);
        if (dv && dv->kind != EM_VAL_MATRIX) check_dtype(e, (em_scalar)dv->type.scalar, -1);
        for (int a = 0; a < EM_IR_MAX_ARGS; a++) {
            const em_ir_value *av = em_spmd_value(e, in->args[a]);
            if (av && av->kind != EM_VAL_MATRIX) check_dtype(e, (em_scalar)av->type.scalar, -1);
            if (av && av->kind == EM_VAL_MATRIX) check_dtype(e, (em_scalar)av->type.scalar, -1);
        }
        const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
        if (m) {
            uint8_t f = EM_MEMF_USED;
            bool is_atomic = in->op >= EM_OP_ATOMIC_ADD && in->op <= EM_OP_ATOMIC_STORE;
            if (is_atomic) f |= EM_MEMF_ATOMIC;
            if (is_atomic && em_scalar_is_float((em_scalar)m->elem.scalar) && in->op != EM_OP_ATOMIC_LOAD)
                f |= EM_MEMF_FLOAT_RMW;
            if (in->op == EM_OP_MAT_LOAD || in->op == EM_OP_MAT_STORE) f |= EM_MEMF_MATRIX;
            e->mflags[in->mem] |= f;
            check_dtype(e, (em_scalar)m->elem.scalar, m->space);
        }
        if (in->op == EM_OP_IF || in->op == EM_OP_RANGE || in->op == EM_OP_LOOP) {
            scan_block(e, in->blocks[0], depth + 1);
            if (in->op == EM_OP_IF) scan_block(e, in->blocks[1], depth + 1);
        }
    }
}

static bool is_identifier(const char *s)
{
    if (!s || !*s || (*s >= '0' && *s <= '9')) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

static bool setup(em_spmd *e)
{
    const em_ir_kernel *k = e->k;
    size_t nv = em_ir_value_count(k) + 1, nm = em_ir_mem_count(k) + 1, np = em_ir_param_count(k);
    e->vname = calloc(nv, sizeof(char *));
    e->mname = calloc(nm, sizeof(char *));
    e->vused = calloc(nv, 1);
    e->mflags = calloc(nm, 1);
    e->meta_off = calloc(np + 1, sizeof(uint32_t));
    if (!e->vname || !e->mname || !e->vused || !e->mflags || !e->meta_off) {
        em_set_error(EM_ERR_NOMEM, "%s: out of memory generating kernel %s", e->d->name, em_ir_kernel_name(k));
        return false;
    }
    if (!is_identifier(em_ir_kernel_name(k))) {
        em_spmd_fail(e, "the kernel name is not an identifier");
        return false;
    }
    for (size_t i = 0; i < np && !e->failed; i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        e->meta_off[i] = e->meta_words;
        if (p->kind == EM_PARAM_BUFFER) {
            const em_ir_memory *m = em_ir_mem_at(k, p->id);
            if (!m) continue;
            e->meta_words += 1 + 2u * m->rank;
            check_dtype(e, (em_scalar)m->elem.scalar, EM_MEM_GLOBAL);
        } else {
            e->vused[p->id] = 1;
            check_dtype(e, (em_scalar)type_of(e, p->id).scalar, -1);
        }
    }
    scan_block(e, em_ir_body(k), 0);
    e->inst = UINT32_MAX;
    bool ok = true;
    for (size_t v = 1; v < nv; v++) {
        const em_ir_value *x = em_ir_value_at(k, (em_ir_val)v);
        if (!x || x->kind == EM_VAL_CONST || !e->vused[v]) continue;
        if (x->kind != EM_VAL_MATRIX) em_spmd_need_scalar(e, (em_scalar)x->type.scalar);
        static const char *const fallback[] = {"t", "v", "c", "p", "f"};
        e->vname[v] = ident(x->name, fallback[x->kind <= EM_VAL_MATRIX ? x->kind : 0], "", (uint32_t)v);
        ok = ok && e->vname[v];
    }
    for (size_t m = 1; m < nm; m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        if (x->space == EM_MEM_GLOBAL || (e->mflags[m] & EM_MEMF_USED)) em_spmd_need_scalar(e, (em_scalar)x->elem.scalar);
        e->mname[m] = ident(x->name, "mem", "m", (uint32_t)m);
        ok = ok && e->mname[m];
    }
    if (!ok) em_set_error(EM_ERR_NOMEM, "%s: out of memory generating kernel %s", e->d->name, em_ir_kernel_name(k));
    return ok && !e->failed;
}

static void teardown(em_spmd *e)
{
    size_t nv = em_ir_value_count(e->k) + 1, nm = em_ir_mem_count(e->k) + 1;
    for (size_t i = 0; e->vname && i < nv; i++) free(e->vname[i]);
    for (size_t i = 0; e->mname && i < nm; i++) free(e->mname[i]);
    free(e->vname);
    free(e->mname);
    free(e->vused);
    free(e->mflags);
    free(e->meta_off);
}

/* ---- destinations ------------------------------------------------------------------------------ */

/* dst = expr for a scalar destination (declaring a temporary). */
static void assign_scalar(em_spmd *e, em_ir_val dst, const char *expr)
{
    const em_ir_value *x = em_spmd_value(e, dst);
    if (!x) return;
    if (x->kind == EM_VAL_TEMP) {
        SB(decl);
        e->d->decl(e, x->type, e->vname[dst], &decl);
        em_spmd_line(e, "%s = %s;", decl.data, expr);
        sb_done(&decl);
    } else {
        em_spmd_line(e, "%s = %s;", e->vname[dst], expr);
    }
}

/* A line destination written lane by lane: temporaries are declared and written directly;
 * variables get a fresh temporary, copied in by line_end (operands may alias the variable). */
typedef struct line_dst {
    em_ir_val dst;
    em_type t;
    char name[64];
    bool via_tmp;
} line_dst;

static void line_begin(em_spmd *e, em_ir_val dst, line_dst *ld)
{
    const em_ir_value *x = em_spmd_value(e, dst);
    ld->dst = dst;
    ld->t = x ? x->type : em_ty(EM_I32);
    ld->via_tmp = x && x->kind != EM_VAL_TEMP;
    if (ld->via_tmp)
        em_spmd_fresh(e, "l", ld->name);
    else
        snprintf(ld->name, sizeof ld->name, "%s", x && e->vname[dst] ? e->vname[dst] : "em_unnamed");
    SB(decl);
    e->d->decl(e, ld->t, ld->name, &decl);
    em_spmd_line(e, "%s;", decl.data);
    sb_done(&decl);
}

static void line_lane(em_spmd *e, const line_dst *ld, unsigned i, const char *expr)
{
    SB(l);
    e->d->lane(e, ld->t, ld->name, i, &l);
    em_spmd_line(e, "%s = %s;", l.data, expr);
    sb_done(&l);
}

/* Copies line `from` (a named value of type t) into variable `to`. */
static void copy_line(em_spmd *e, em_type t, const char *to, const char *from)
{
    if (e->d->line_kind(e, t) >= EM_LINE_ASSIGN) {
        em_spmd_line(e, "%s = %s;", to, from);
        return;
    }
    for (unsigned i = 0; i < t.lanes; i++) {
        SB(a);
        SB(b);
        e->d->lane(e, t, to, i, &a);
        e->d->lane(e, t, from, i, &b);
        em_spmd_line(e, "%s = %s;", a.data, b.data);
        sb_done(&a);
        sb_done(&b);
    }
}

static void line_end(em_spmd *e, const line_dst *ld)
{
    if (ld->via_tmp) copy_line(e, ld->t, e->vname[ld->dst], ld->name);
}

/* ---- scalar operations ------------------------------------------------------------------------ */

static void convert_expr(em_spmd *e, em_scalar from, em_scalar to, const char *x, em_strbuf *sb)
{
    if (from == to) {
        em_sb_append(sb, x);
    } else if (to == EM_BOOL) {
        SB(z);
        lit_i(e, from, 0, &z);
        em_sb_printf(sb, "((%s) != %s)", x, z.data);
        sb_done(&z);
    } else if (from == EM_BOOL) {
        SB(one);
        SB(zero);
        lit_i(e, to, 1, &one);
        lit_i(e, to, 0, &zero);
        em_sb_printf(sb, "((%s) ? %s : %s)", x, one.data, zero.data);
        sb_done(&one);
        sb_done(&zero);
    } else {
        e->d->convert(e, from, to, x, sb);
    }
}

static void wrap(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb) { e->d->wrap(e, s, x, sb); }

static const char *need_fn(em_spmd *e, em_ir_op op, em_scalar s)
{
    const char *fn = e->d->float_fn(e, op, s);
    if (!fn) em_spmd_fail(e, "%s on %s is not available on %s", em_ir_op_name(op), em_scalar_name(s), e->d->name);
    return fn;
}

/* The guarded integer division and remainder (never trapping; see spmd.h). */
static void int_divrem(em_spmd *e, bool rem, em_scalar s, const char *a, const char *b, em_strbuf *sb)
{
    SB(zero);
    SB(body);
    lit_i(e, s, 0, &zero);
    if (!rem)
        em_sb_printf(&body, "(%s) / (%s)", a, b);
    else if (e->d->rem_via_div && em_scalar_is_signed(s))
        em_sb_printf(&body, "((%s) - ((%s) / (%s)) * (%s))", a, a, b, b);
    else
        em_sb_printf(&body, "(%s) %% (%s)", a, b);
    const char *on_zero = rem ? zero.data : a;
    if (em_scalar_is_signed(s) && !em_spmd_narrow(s)) {
        SB(min);
        SB(m1);
        em_ir_const c = {.i = s == EM_I64 ? INT64_MIN : INT32_MIN};
        lit(e, s, c, &min);
        lit_i(e, s, -1, &m1);
        em_sb_printf(sb, "((%s) == %s || ((%s) == %s && (%s) == %s) ? %s : %s)", b, zero.data, a, min.data, b,
                     m1.data, on_zero, body.data);
        sb_done(&min);
        sb_done(&m1);
    } else {
        SB(raw);
        em_sb_printf(&raw, "((%s) == %s ? %s : %s)", b, zero.data, on_zero, body.data);
        wrap(e, s, raw.data, sb);
        sb_done(&raw);
    }
    sb_done(&zero);
    sb_done(&body);
}

static bool op_wraps(em_ir_op op)
{
    switch (op) {
    case EM_OP_ADD: case EM_OP_SUB: case EM_OP_MUL: case EM_OP_POW: case EM_OP_SHL: case EM_OP_NOT:
    case EM_OP_EXP: case EM_OP_EXP2: case EM_OP_LOG: case EM_OP_LOG2: case EM_OP_SQRT:
    case EM_OP_RSQRT: case EM_OP_ERF: case EM_OP_TANH: case EM_OP_SIN: case EM_OP_COS: case EM_OP_FMA:
        return true;
    default:
        return false;
    }
}

/* The expression of a lane-wise op on scalar operand expressions a, b, c, whose operands have
 * kind s (for CAST: from s to the result kind ds). */
static void op_expr(em_spmd *e, em_ir_op op, em_scalar s, em_scalar ds, const char *a, const char *b,
                    const char *c, em_strbuf *sb)
{
    bool fl = em_scalar_is_float(s), bl = s == EM_BOOL, sg = em_scalar_is_signed(s);
    SB(raw);
    const char *fn = NULL;
    static const char *const infix[] = {[EM_OP_ADD] = "+", [EM_OP_SUB] = "-", [EM_OP_MUL] = "*",
                                        [EM_OP_EQ] = "==", [EM_OP_NE] = "!=", [EM_OP_LT] = "<",
                                        [EM_OP_LE] = "<=", [EM_OP_GT] = ">", [EM_OP_GE] = ">="};
    switch (op) {
    case EM_OP_ADD: case EM_OP_SUB: case EM_OP_MUL:
    case EM_OP_EQ: case EM_OP_NE: case EM_OP_LT: case EM_OP_LE: case EM_OP_GT: case EM_OP_GE:
        em_sb_printf(&raw, "(%s %s %s)", a, infix[op], b);
        break;
    case EM_OP_DIV:
        if (fl) {
            SB(q);
            em_sb_printf(&q, "(%s / %s)", a, b);
            wrap(e, s, q.data, &raw);
            sb_done(&q);
        } else {
            int_divrem(e, false, s, a, b, &raw);
        }
        break;
    case EM_OP_REM:
        if (!fl) {
            int_divrem(e, true, s, a, b, &raw);
        } else if (e->d->float_rem_expr) {
            SB(q);
            em_sb_printf(&q, "((%s) - (%s) * trunc((%s) / (%s)))", a, b, a, b);
            wrap(e, s, q.data, &raw);
            sb_done(&q);
        } else if ((fn = need_fn(e, op, s))) {
            SB(q);
            em_sb_printf(&q, "%s(%s, %s)", fn, a, b);
            wrap(e, s, q.data, &raw);
            sb_done(&q);
        }
        break;
    case EM_OP_MIN: case EM_OP_MAX:
        if (!fl)
            em_sb_printf(&raw, "((%s) %s (%s) ? (%s) : (%s))", a, op == EM_OP_MIN ? "<" : ">", b, a, b);
        else if ((fn = need_fn(e, op, s)))
            em_sb_printf(&raw, "%s(%s, %s)", fn, a, b);
        break;
    case EM_OP_POW:
        if ((fn = need_fn(e, op, s))) em_sb_printf(&raw, "%s(%s, %s)", fn, a, b);
        break;
    case EM_OP_AND: case EM_OP_OR: case EM_OP_XOR: {
        static const char *const bool_ops[] = {"&&", "||", "!="}, *const int_ops[] = {"&", "|", "^"};
        int i = op - EM_OP_AND;
        em_sb_printf(&raw, "(%s %s %s)", a, bl ? bool_ops[i] : int_ops[i], b);
        break;
    }
    case EM_OP_SHL: case EM_OP_SHR: {
        SB(mask);
        lit_i(e, s, em_spmd_bits(s) - 1, &mask);
        em_sb_printf(&raw, "(%s %s ((%s) & %s))", a, op == EM_OP_SHL ? "<<" : ">>", b, mask.data);
        sb_done(&mask);
        break;
    }
    case EM_OP_NEG:
        em_sb_printf(&raw, "(-(%s))", a);
        break;
    case EM_OP_NOT:
        em_sb_printf(&raw, bl ? "(!(%s))" : "(~(%s))", a);
        break;
    case EM_OP_ABS:
        if (fl) {
            if ((fn = need_fn(e, op, s))) em_sb_printf(&raw, "%s(%s)", fn, a);
        } else if (sg) {
            SB(z);
            lit_i(e, s, 0, &z);
            em_sb_printf(&raw, "((%s) < %s ? -(%s) : (%s))", a, z.data, a, a);
            sb_done(&z);
        } else {
            em_sb_printf(&raw, "(%s)", a);
        }
        break;
    case EM_OP_POPCOUNT: case EM_OP_CLZ: case EM_OP_CTZ:
        e->d->bit_count(e, op, s, a, &raw);
        break;
    case EM_OP_FMA:
        if ((fn = need_fn(e, op, s))) em_sb_printf(&raw, "%s(%s, %s, %s)", fn, a, b, c);
        break;
    case EM_OP_CLAMP:
        if (!fl) {
            em_sb_printf(&raw, "((%s) < (%s) ? (%s) : ((%s) > (%s) ? (%s) : (%s)))", a, b, b, a, c, c, a);
        } else {
            const char *mn = need_fn(e, EM_OP_MIN, s), *mx = need_fn(e, EM_OP_MAX, s);
            if (mn && mx) em_sb_printf(&raw, "%s(%s(%s, %s), %s)", mn, mx, a, b, c);
        }
        break;
    case EM_OP_SELECT:
        em_sb_printf(&raw, "((%s) ? (%s) : (%s))", a, b, c);
        break;
    case EM_OP_CAST:
        convert_expr(e, s, ds, a, &raw);
        break;
    default: /* float unary functions and ISNAN / ISINF */
        if ((fn = need_fn(e, op, s))) em_sb_printf(&raw, "%s(%s)", fn, a);
        break;
    }
    bool w = op_wraps(op) || (op == EM_OP_NEG && !fl) || (op == EM_OP_ABS && !fl);
    if (w && (em_spmd_narrow(s) || s == EM_F16 || s == EM_BF16) && op != EM_OP_DIV && op != EM_OP_REM)
        wrap(e, s, raw.data, sb);
    else
        em_sb_append(sb, raw.data);
    sb_done(&raw);
}

/* Whole-line operators apply when the target has them, no lane needs wrapping or a guard, and
 * every line operand is a named value. */
static bool fast_line(em_spmd *e, const em_ir_inst *in, em_type t)
{
    em_scalar s = (em_scalar)t.scalar;
    bool fl = em_scalar_is_float(s);
    bool op_ok = in->op == EM_OP_ADD || in->op == EM_OP_SUB || in->op == EM_OP_MUL || (in->op == EM_OP_DIV && fl);
    if (!op_ok || em_spmd_narrow(s) || s == EM_F16 || s == EM_BF16 || s == EM_BOOL) return false;
    if (e->d->line_kind(e, t) != EM_LINE_OPS) return false;
    for (int i = 0; i < 2; i++)
        if (is_const(e, in->args[i]) && type_of(e, in->args[i]).lanes > 1) return false;
    return true;
}

static unsigned op_arity(em_ir_op op)
{
    if (op >= EM_OP_FMA && op <= EM_OP_SELECT) return 3;
    if (op >= EM_OP_NEG && op <= EM_OP_CTZ) return 1;
    if (op == EM_OP_CAST || op == EM_OP_ASSIGN) return 1;
    return 2;
}

static void emit_lanewise(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!d) return;
    em_ir_op op = (em_ir_op)in->op;
    /* the operands' kind: b's for SELECT (a is the condition), else a's */
    em_scalar s = (em_scalar)type_of(e, in->args[op == EM_OP_SELECT ? 1 : 0]).scalar;
    unsigned n = op_arity(op);
    if (d->type.lanes > 1 && fast_line(e, in, d->type)) {
        SB(a);
        SB(b);
        SB(x);
        em_spmd_val(e, in->args[0], &a);
        em_spmd_val(e, in->args[1], &b);
        static const char *const ops[] = {[EM_OP_ADD] = "+", [EM_OP_SUB] = "-", [EM_OP_MUL] = "*", [EM_OP_DIV] = "/"};
        em_sb_printf(&x, "%s %s %s", a.data, ops[op], b.data);
        e->needs |= EM_NEED_VECOPS;
        assign_scalar(e, in->dst, x.data);
        sb_done(&a);
        sb_done(&b);
        sb_done(&x);
        return;
    }
    line_dst ld;
    if (d->type.lanes > 1) line_begin(e, in->dst, &ld);
    for (unsigned l = 0; l < d->type.lanes && !e->failed; l++) {
        SB(a);
        SB(b);
        SB(c);
        SB(x);
        em_spmd_val_lane(e, in->args[0], l, &a);
        if (n > 1) em_spmd_val_lane(e, in->args[1], l, &b);
        if (n > 2) em_spmd_val_lane(e, in->args[2], l, &c);
        op_expr(e, op, s, (em_scalar)d->type.scalar, a.data, b.data, c.data, &x);
        if (d->type.lanes > 1)
            line_lane(e, &ld, l, x.data);
        else
            assign_scalar(e, in->dst, x.data);
        sb_done(&a);
        sb_done(&b);
        sb_done(&c);
        sb_done(&x);
    }
    if (d->type.lanes > 1) line_end(e, &ld);
}

static void emit_assign(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!d) return;
    em_ir_val src = in->args[0];
    if (d->type.lanes == 1 || (!is_const(e, src) && e->d->line_kind(e, d->type) >= EM_LINE_ASSIGN)) {
        SB(x);
        em_spmd_val(e, src, &x);
        assign_scalar(e, in->dst, x.data);
        sb_done(&x);
        return;
    }
    line_dst ld;
    line_begin(e, in->dst, &ld);
    for (unsigned l = 0; l < d->type.lanes; l++) {
        SB(x);
        em_spmd_val_lane(e, src, l, &x);
        line_lane(e, &ld, l, x.data);
        sb_done(&x);
    }
    line_end(e, &ld);
}

/* ---- bitcasts, lines ------------------------------------------------------------------------- */

static void emit_bitcast(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!d) return;
    em_type ts = type_of(e, in->args[0]), td = d->type;
    em_scalar ss = (em_scalar)ts.scalar, ds = (em_scalar)td.scalar;
    unsigned sw = em_spmd_bits(ss), dw = em_spmd_bits(ds);
    em_scalar wide = dw == 64 ? EM_U64 : EM_U32, swide = sw == 64 ? EM_U64 : EM_U32;
    line_dst ld;
    if (td.lanes > 1) line_begin(e, in->dst, &ld);
    for (unsigned j = 0; j < td.lanes; j++) {
        SB(bits);
        if (sw == dw) {
            SB(a);
            em_spmd_val_lane(e, in->args[0], j, &a);
            e->d->to_bits(e, ss, a.data, &bits);
            sb_done(&a);
        } else if (sw < dw) {
            unsigned r = dw / sw;
            em_sb_append(&bits, "(");
            for (unsigned q = 0; q < r; q++) {
                SB(a);
                SB(b);
                SB(w);
                em_spmd_val_lane(e, in->args[0], j * r + q, &a);
                e->d->to_bits(e, ss, a.data, &b);
                convert_expr(e, EM_U32, wide, b.data, &w);
                if (q) em_sb_append(&bits, " | ");
                if (q)
                    em_sb_printf(&bits, "(%s << %u)", w.data, q * sw);
                else
                    em_sb_append(&bits, w.data);
                sb_done(&a);
                sb_done(&b);
                sb_done(&w);
            }
            em_sb_append(&bits, ")");
        } else {
            unsigned r = sw / dw;
            SB(a);
            SB(b);
            SB(mask);
            SB(part);
            em_spmd_val_lane(e, in->args[0], j / r, &a);
            e->d->to_bits(e, ss, a.data, &b);
            em_ir_const mc = {.u = (1ull << dw) - 1};
            lit(e, swide, mc, &mask);
            em_sb_printf(&part, "((%s >> %u) & %s)", b.data, (j % r) * dw, mask.data);
            convert_expr(e, swide, EM_U32, part.data, &bits);
            sb_done(&a);
            sb_done(&b);
            sb_done(&mask);
            sb_done(&part);
        }
        SB(x);
        e->d->from_bits(e, ds, bits.data, &x);
        if (td.lanes > 1)
            line_lane(e, &ld, j, x.data);
        else
            assign_scalar(e, in->dst, x.data);
        sb_done(&bits);
        sb_done(&x);
    }
    if (td.lanes > 1) line_end(e, &ld);
}

static void emit_extract(em_spmd *e, const em_ir_inst *in)
{
    em_type t = type_of(e, in->args[0]);
    em_ir_val lane = in->args[1];
    const em_ir_value *lv = em_spmd_value(e, lane);
    SB(x);
    if (t.lanes == 1) {
        em_spmd_val(e, in->args[0], &x);
    } else if (lv && lv->kind == EM_VAL_CONST) {
        em_spmd_val_lane(e, in->args[0], (unsigned)(lv->c.u < t.lanes ? lv->c.u : 0), &x);
    } else {
        SB(b);
        em_spmd_val(e, lane, &b);
        em_sb_append(&x, "(");
        for (unsigned l = 0; l + 1 < t.lanes; l++) {
            SB(li);
            em_spmd_val_lane(e, in->args[0], l, &li);
            SB(k);
            lit_i(e, (em_scalar)lv->type.scalar, l, &k);
            em_sb_printf(&x, "(%s) == %s ? %s : ", b.data, k.data, li.data);
            sb_done(&li);
            sb_done(&k);
        }
        em_spmd_val_lane(e, in->args[0], t.lanes - 1, &x);
        em_sb_append(&x, ")");
        sb_done(&b);
    }
    assign_scalar(e, in->dst, x.data);
    sb_done(&x);
}

static void emit_insert(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    const em_ir_value *lv = em_spmd_value(e, in->args[1]);
    if (!d || !lv) return;
    line_dst ld;
    if (d->type.lanes > 1) line_begin(e, in->dst, &ld);
    for (unsigned l = 0; l < d->type.lanes; l++) {
        SB(x);
        SB(a);
        SB(c);
        em_spmd_val_lane(e, in->args[0], l, &a);
        em_spmd_val(e, in->args[2], &c);
        if (lv->kind == EM_VAL_CONST) {
            em_sb_append(&x, lv->c.u == l ? c.data : a.data);
        } else {
            SB(b);
            SB(k);
            em_spmd_val(e, in->args[1], &b);
            lit_i(e, (em_scalar)lv->type.scalar, l, &k);
            em_sb_printf(&x, "((%s) == %s ? %s : %s)", b.data, k.data, c.data, a.data);
            sb_done(&b);
            sb_done(&k);
        }
        if (d->type.lanes > 1)
            line_lane(e, &ld, l, x.data);
        else
            assign_scalar(e, in->dst, x.data);
        sb_done(&x);
        sb_done(&a);
        sb_done(&c);
    }
    if (d->type.lanes > 1) line_end(e, &ld);
}

/* ---- memory, metadata, positions ------------------------------------------------------------- */

static void emit_load(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!m || !d) return;
    SB(idx);
    SB(x);
    em_spmd_index(e, in->args[0], &idx);
    if (m->elem.lanes == 1) {
        e->d->mem_load(e, in->mem, idx.data, -1, &x);
        assign_scalar(e, in->dst, x.data);
    } else if (e->d->mem_load_line(e, in->mem, idx.data, &x)) {
        assign_scalar(e, in->dst, x.data);
    } else {
        line_dst ld;
        line_begin(e, in->dst, &ld);
        for (unsigned l = 0; l < m->elem.lanes; l++) {
            em_sb_clear(&x);
            e->d->mem_load(e, in->mem, idx.data, (int)l, &x);
            line_lane(e, &ld, l, x.data);
        }
        line_end(e, &ld);
    }
    sb_done(&idx);
    sb_done(&x);
}

static void emit_store(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
    if (!m) return;
    SB(idx);
    SB(v);
    em_spmd_index(e, in->args[0], &idx);
    em_ir_val val = in->args[1];
    if (m->elem.lanes == 1) {
        em_spmd_val(e, val, &v);
        e->d->mem_store(e, in->mem, idx.data, -1, v.data);
    } else {
        bool whole = false;
        if (!is_const(e, val)) {
            em_spmd_val(e, val, &v);
            whole = e->d->mem_store_line(e, in->mem, idx.data, v.data);
        }
        for (unsigned l = 0; !whole && l < m->elem.lanes; l++) {
            em_sb_clear(&v);
            em_spmd_val_lane(e, val, l, &v);
            e->d->mem_store(e, in->mem, idx.data, (int)l, v.data);
        }
    }
    sb_done(&idx);
    sb_done(&v);
}

static void emit_meta(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
    const em_ir_param *p = m ? em_ir_param_at(e->k, m->param) : NULL;
    if (!p || p->kind != EM_PARAM_BUFFER || p->id != in->mem) {
        em_spmd_fail(e, "metadata of memory that is not a buffer parameter");
        return;
    }
    uint32_t off = e->meta_off[m->param];
    if (in->op == EM_OP_SHAPE) off += 1 + (uint32_t)in->imm;
    if (in->op == EM_OP_STRIDE) off += 1 + m->rank + (uint32_t)in->imm;
    SB(x);
    e->d->meta(e, off, &x);
    assign_scalar(e, in->dst, x.data);
    sb_done(&x);
}

static void emit_builtin(em_spmd *e, const em_ir_inst *in)
{
    static const char *const linear[EM_BUILTIN_COUNT] = {
        [EM_ABSOLUTE_POS] = "em_absolute_pos()", [EM_ABSOLUTE_POS_X] = "em_absolute_pos_x()",
        [EM_ABSOLUTE_POS_Y] = "em_absolute_pos_y()", [EM_ABSOLUTE_POS_Z] = "em_absolute_pos_z()",
        [EM_UNIT_POS] = "em_unit_pos()", [EM_CUBE_POS] = "em_cube_pos()", [EM_CUBE_DIM] = "em_cube_dim()",
        [EM_CUBE_COUNT] = "em_cube_count()"};
    em_builtin b = (em_builtin)in->imm;
    SB(x);
    if (b >= EM_BUILTIN_COUNT) {
        em_spmd_fail(e, "unknown built-in");
    } else if (linear[b]) {
        em_sb_append(&x, linear[b]);
    } else if (b == EM_PLANE_DIM || b == EM_UNIT_POS_PLANE || b == EM_PLANE_POS) {
        if (e->plane_one) {
            if (b == EM_PLANE_POS)
                em_sb_append(&x, "em_unit_pos()");
            else
                lit_i(e, EM_U32, b == EM_PLANE_DIM ? 1 : 0, &x);
        } else {
            e->needs |= EM_NEED_PLANE;
            if (b == EM_PLANE_POS) {
                em_sb_append(&x, "(em_unit_pos() / ");
                e->d->builtin(e, EM_PLANE_DIM, &x);
                em_sb_append(&x, ")");
            } else {
                e->d->builtin(e, b, &x);
            }
        }
    } else {
        e->d->builtin(e, b, &x);
    }
    assign_scalar(e, in->dst, x.data);
    sb_done(&x);
}

void em_spmd_position_helpers(const em_spmd_dialect *d, const em_caps *caps, void *priv,
                              const char *void_params, em_strbuf *sb)
{
    em_spmd e = {.d = d, .caps = *caps, .priv = priv, .inst = UINT32_MAX};
    const char *u = d->ctype[EM_U32];
    static const em_builtin groups[4] = {EM_UNIT_POS_X, EM_CUBE_POS_X, EM_CUBE_DIM_X, EM_CUBE_COUNT_X};
    em_strbuf ax[4][3];
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 3; i++) {
            em_sb_init(&ax[g][i]);
            d->builtin(&e, (em_builtin)(groups[g] + i), &ax[g][i]);
        }
    const char *pre = d->fn_prefix;
#define AX(g, i) ax[g][i].data
    em_sb_printf(sb, "%s%s em_unit_pos(%s) { return %s + %s * (%s + %s * %s); }\n", pre, u, void_params,
                 AX(0, 0), AX(2, 0), AX(0, 1), AX(2, 1), AX(0, 2));
    em_sb_printf(sb, "%s%s em_cube_pos(%s) { return %s + %s * (%s + %s * %s); }\n", pre, u, void_params,
                 AX(1, 0), AX(3, 0), AX(1, 1), AX(3, 1), AX(1, 2));
    em_sb_printf(sb, "%s%s em_cube_dim(%s) { return %s * %s * %s; }\n", pre, u, void_params, AX(2, 0), AX(2, 1),
                 AX(2, 2));
    em_sb_printf(sb, "%s%s em_cube_count(%s) { return %s * %s * %s; }\n", pre, u, void_params, AX(3, 0),
                 AX(3, 1), AX(3, 2));
    em_sb_printf(sb, "%s%s em_absolute_pos(%s) { return em_cube_pos() * em_cube_dim() + em_unit_pos(); }\n",
                 pre, u, void_params);
    static const char axis[3] = {'x', 'y', 'z'};
    for (int i = 0; i < 3; i++)
        em_sb_printf(sb, "%s%s em_absolute_pos_%c(%s) { return %s * %s + %s; }\n", pre, u, axis[i], void_params,
                     AX(1, i), AX(2, i), AX(0, i));
#undef AX
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 3; i++) em_sb_free(&ax[g][i]);
}

/* ---- plane ops, atomics, matrices, debugging ------------------------------------------------ */

static void plane_one_expr(em_spmd *e, em_ir_op op, em_scalar s, const char *a, em_strbuf *sb)
{
    if (op == EM_OP_PLANE_EXCLUSIVE_SUM) {
        lit_i(e, s, 0, sb);
    } else if (op == EM_OP_PLANE_BALLOT) {
        SB(one);
        SB(zero);
        lit_i(e, EM_U32, 1, &one);
        lit_i(e, EM_U32, 0, &zero);
        em_sb_printf(sb, "((%s) ? %s : %s)", a, one.data, zero.data);
        sb_done(&one);
        sb_done(&zero);
    } else {
        em_sb_append(sb, a);
    }
}

static void emit_plane(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!d) return;
    em_scalar s = (em_scalar)type_of(e, in->args[0]).scalar;
    em_ir_op op = (em_ir_op)in->op;
    bool sums = op == EM_OP_PLANE_SUM || op == EM_OP_PLANE_PROD || op == EM_OP_PLANE_INCLUSIVE_SUM ||
                op == EM_OP_PLANE_EXCLUSIVE_SUM;
    SB(b);
    if (in->args[1]) em_spmd_val(e, in->args[1], &b);
    line_dst ld;
    if (d->type.lanes > 1) line_begin(e, in->dst, &ld);
    for (unsigned l = 0; l < d->type.lanes && !e->failed; l++) {
        SB(a);
        SB(x);
        em_spmd_val_lane(e, in->args[0], l, &a);
        if (e->plane_one) {
            plane_one_expr(e, op, s, a.data, &x);
        } else {
            SB(raw);
            e->d->plane(e, in, s, a.data, b.data, &raw);
            if (sums)
                wrap(e, s, raw.data, &x);
            else
                em_sb_append(&x, raw.data);
            sb_done(&raw);
        }
        if (d->type.lanes > 1)
            line_lane(e, &ld, l, x.data);
        else
            assign_scalar(e, in->dst, x.data);
        sb_done(&a);
        sb_done(&x);
    }
    if (d->type.lanes > 1) line_end(e, &ld);
    sb_done(&b);
}

static void emit_atomic(em_spmd *e, const em_ir_inst *in)
{
    SB(idx);
    SB(x);
    em_spmd_index(e, in->args[0], &idx);
    e->d->atomic(e, in, idx.data, &x);
    if (!e->failed) {
        if (in->dst)
            assign_scalar(e, in->dst, x.data);
        else
            em_spmd_line(e, "%s;", x.data);
    }
    sb_done(&idx);
    sb_done(&x);
}

static bool matrix_lowerable(em_spmd *e)
{
    if (e->plane_one) return true;
    em_spmd_fail(e, "matrix ops are lowered to loops only where PLANE_DIM is 1, and this %s device runs "
                    "planes of %u units (caps.plane_ops); cooperative-matrix extensions are not supported yet",
                 e->d->name, e->caps.plane_dim);
    return false;
}

static void emit_matrix(em_spmd *e, const em_ir_inst *in)
{
    if (e->d->matrix)
        e->d->matrix(e, in);
    else if (matrix_lowerable(e))
        em_spmd_matrix_loops(e, in);
}

static void frag_dims(const em_ir_value *f, unsigned *rows, unsigned *cols)
{
    *rows = f->mat_role == EM_MAT_B ? f->mat_k : f->mat_m;
    *cols = f->mat_role == EM_MAT_A ? f->mat_k : f->mat_n;
}

void em_spmd_fragment_loops(em_spmd *e, em_ir_val v)
{
    const em_ir_value *f = em_spmd_value(e, v);
    unsigned r, c;
    frag_dims(f, &r, &c);
    SB(name);
    SB(decl);
    em_sb_printf(&name, "%s[%u]", e->vname[v], r * c);
    e->d->decl(e, em_ty((em_scalar)f->type.scalar), name.data, &decl);
    em_spmd_line(e, "%s;", decl.data);
    sb_done(&name);
    sb_done(&decl);
}

void em_spmd_matrix_loops(em_spmd *e, const em_ir_inst *in)
{
    const char *u = e->d->ctype[EM_U32];
    SB(zero);
    lit_i(e, EM_U32, 0, &zero);
    const char *z = zero.data;
    if (in->op == EM_OP_MAT_FILL) {
        const em_ir_value *f = em_spmd_value(e, in->args[0]);
        unsigned r, c;
        frag_dims(f, &r, &c);
        SB(v);
        em_spmd_val(e, in->args[1], &v);
        em_spmd_line(e, "for (%s em_i = %s; em_i < %uu; em_i++) %s[em_i] = %s;", u, z, r * c, e->vname[in->args[0]],
                     v.data);
        sb_done(&v);
    } else if (in->op == EM_OP_MAT_LOAD || in->op == EM_OP_MAT_STORE) {
        bool load = in->op == EM_OP_MAT_LOAD;
        em_ir_val fv = in->args[load ? 0 : 2];
        const em_ir_value *f = em_spmd_value(e, fv);
        unsigned r, c;
        frag_dims(f, &r, &c);
        SB(off);
        SB(stride);
        SB(idx);
        SB(x);
        em_spmd_val_u32(e, in->args[load ? 1 : 0], &off);
        em_spmd_val_u32(e, in->args[load ? 2 : 1], &stride);
        if (in->imm == EM_COL_MAJOR)
            em_sb_printf(&idx, "%s + em_c * %s + em_r", off.data, stride.data);
        else
            em_sb_printf(&idx, "%s + em_r * %s + em_c", off.data, stride.data);
        em_spmd_line(e, "for (%s em_r = %s; em_r < %uu; em_r++)", u, z, r);
        e->depth++;
        em_spmd_line(e, "for (%s em_c = %s; em_c < %uu; em_c++) {", u, z, c);
        e->depth++;
        if (load) {
            e->d->mem_load(e, in->mem, idx.data, -1, &x);
            em_spmd_line(e, "%s[em_r * %uu + em_c] = %s;", e->vname[fv], c, x.data);
        } else {
            em_sb_printf(&x, "%s[em_r * %uu + em_c]", e->vname[fv], c);
            e->d->mem_store(e, in->mem, idx.data, -1, x.data);
        }
        e->depth--;
        em_spmd_line(e, "}");
        e->depth--;
        sb_done(&off);
        sb_done(&stride);
        sb_done(&idx);
        sb_done(&x);
    } else if (in->op == EM_OP_MAT_MMA) {
        const em_ir_value *dv = em_spmd_value(e, in->args[0]), *av = em_spmd_value(e, in->args[1]);
        em_scalar acc = (em_scalar)dv->type.scalar, ab = (em_scalar)av->type.scalar;
        const char *D = e->vname[in->args[0]], *A = e->vname[in->args[1]], *B = e->vname[in->args[2]],
                   *C = e->vname[in->args[3]];
        unsigned M = dv->mat_m, N = dv->mat_n, K = dv->mat_k;
        SB(decl);
        SB(ax);
        SB(bx);
        SB(sum);
        SB(ca);
        SB(cb);
        e->d->decl(e, em_ty(acc), "em_acc", &decl);
        em_sb_printf(&ax, "%s[em_i * %uu + em_k]", A, K);
        em_sb_printf(&bx, "%s[em_k * %uu + em_j]", B, N);
        convert_expr(e, ab, acc, ax.data, &ca);
        convert_expr(e, ab, acc, bx.data, &cb);
        SB(raw);
        em_sb_printf(&raw, "em_acc + %s * %s", ca.data, cb.data);
        wrap(e, acc, raw.data, &sum);
        em_spmd_line(e, "for (%s em_i = %s; em_i < %uu; em_i++)", u, z, M);
        e->depth++;
        em_spmd_line(e, "for (%s em_j = %s; em_j < %uu; em_j++) {", u, z, N);
        e->depth++;
        em_spmd_line(e, "%s = %s[em_i * %uu + em_j];", decl.data, C, N);
        em_spmd_line(e, "for (%s em_k = %s; em_k < %uu; em_k++) em_acc = %s;", u, z, K, sum.data);
        em_spmd_line(e, "%s[em_i * %uu + em_j] = em_acc;", D, N);
        e->depth--;
        em_spmd_line(e, "}");
        e->depth--;
        sb_done(&decl);
        sb_done(&ax);
        sb_done(&bx);
        sb_done(&sum);
        sb_done(&ca);
        sb_done(&cb);
        sb_done(&raw);
    }
    sb_done(&zero);
}

static void c_escape(em_strbuf *sb, char ch)
{
    unsigned char c = (unsigned char)ch;
    if (c == '"' || c == '\\')
        em_sb_printf(sb, "\\%c", c);
    else if (c == '\n')
        em_sb_append(sb, "\\n");
    else if (c == '\t')
        em_sb_append(sb, "\\t");
    else if (c < 0x20 || c >= 0x7f)
        em_sb_printf(sb, "\\%03o", c);
    else
        em_sb_appendc(sb, (char)c);
}

/* One printf conversion and its argument for a scalar expression x of kind s. */
static void print_conv(em_spmd *e, em_scalar s, const char *x, bool ll64, const char *float_cast, em_strbuf *f,
                       em_strbuf *args)
{
    em_sb_append(args, ", ");
    if (em_scalar_is_float(s)) {
        em_sb_append(f, "%g");
        em_sb_printf(args, "%s(%s)", float_cast, x);
    } else if (s == EM_I64 || s == EM_U64) {
        em_sb_append(f, s == EM_I64 ? (ll64 ? "%lld" : "%ld") : (ll64 ? "%llu" : "%lu"));
        em_sb_append(args, x);
    } else if (s == EM_BOOL || em_scalar_is_signed(s)) {
        em_sb_append(f, "%d");
        convert_expr(e, s, EM_I32, x, args);
    } else {
        em_sb_append(f, "%u");
        convert_expr(e, s, EM_U32, x, args);
    }
}

void em_spmd_printf(em_spmd *e, const em_ir_inst *in, bool ll64, const char *float_cast, unsigned max_args)
{
    SB(f);
    SB(args);
    unsigned nargs = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0, next = 0, count = 0;
    for (const char *p = in->str ? in->str : ""; *p; p++) {
        if (*p != '%') {
            c_escape(&f, *p);
            continue;
        }
        if (p[1] == 'v' && next < nargs) {
            em_ir_val v = in->args[next++];
            em_type t = type_of(e, v);
            if (t.lanes > 1) em_sb_append(&f, "[");
            for (unsigned l = 0; l < t.lanes; l++) {
                SB(x);
                em_spmd_val_lane(e, v, l, &x);
                if (l) em_sb_append(&f, ", ");
                print_conv(e, (em_scalar)t.scalar, x.data, ll64, float_cast, &f, &args);
                count++;
                sb_done(&x);
            }
            if (t.lanes > 1) em_sb_append(&f, "]");
            p++;
        } else {
            em_sb_append(&f, "%%");
            if (p[1] == '%') p++;
        }
    }
    if (count > max_args)
        em_spmd_fail(e, "print has %u values; %s's printf takes at most %u", count, e->d->name, max_args);
    else
        em_spmd_line(e, "printf(\"%s\"%s);", f.data, args.data);
    e->needs |= EM_NEED_PRINT;
    sb_done(&f);
    sb_done(&args);
}

static void emit_print(em_spmd *e, const em_ir_inst *in)
{
    if (e->d->print) {
        e->d->print(e, in);
        return;
    }
    SB(text);
    for (const char *p = in->str ? in->str : ""; *p && text.len < 60; p++)
        em_sb_appendc(&text, (*p == '\n' || *p == '\r' || (*p == '*' && p[1] == '/')) ? ' ' : *p);
    em_spmd_line(e, "/* print dropped (no printf on %s): \"%s\" */", e->d->name, text.data);
    sb_done(&text);
}

static void emit_intrinsic(em_spmd *e, const em_ir_inst *in)
{
    const char *name = in->str ? in->str : "";
    size_t nl = strlen(e->d->ns);
    SB(x);
    if (!strncmp(name, e->d->ns, nl) && !strncmp(name + nl, ".call:", 6) && is_identifier(name + nl + 6)) {
        em_sb_printf(&x, "%s(", name + nl + 6);
        unsigned nargs = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0;
        for (unsigned i = 0; i < nargs; i++) {
            if (i) em_sb_append(&x, ", ");
            em_spmd_val(e, in->args[i], &x);
        }
        em_sb_append(&x, ")");
    } else if (!e->d->intrinsic || !e->d->intrinsic(e, in, &x)) {
        em_spmd_fail(e, "intrinsic `%s` is not available on %s (this target knows \"%s.call:NAME\"%s)", name,
                     e->d->name, e->d->ns, e->d->intrinsic ? " and its own forms" : "");
    }
    if (!e->failed) {
        if (in->dst)
            assign_scalar(e, in->dst, x.data);
        else
            em_spmd_line(e, "%s;", x.data);
    }
    sb_done(&x);
}

/* ---- control flow ------------------------------------------------------------------------------ */

static void emit_block(em_spmd *e, uint32_t b, unsigned nest);

static void emit_range(em_spmd *e, const em_ir_inst *in, unsigned nest)
{
    em_ir_val var = in->args[0];
    const em_ir_value *v = em_spmd_value(e, var);
    if (!v) return;
    em_scalar s = (em_scalar)v->type.scalar;
    SB(start);
    SB(end);
    SB(step);
    em_spmd_val(e, in->args[1], &start);
    em_spmd_val(e, in->args[2], &end);
    em_spmd_val(e, in->args[3], &step);
    /* bounds held in variables are read once, before the loop */
    bool hoist = false;
    for (int i = 2; i <= 3; i++) {
        const em_ir_value *x = em_spmd_value(e, in->args[i]);
        if (!x || x->kind != EM_VAL_VAR) continue;
        char name[32];
        em_spmd_fresh(e, i == 2 ? "end" : "step", name);
        if (!hoist) em_spmd_line(e, "{");
        if (!hoist) e->depth++;
        hoist = true;
        SB(decl);
        e->d->decl(e, x->type, name, &decl);
        em_spmd_line(e, "%s = %s;", decl.data, i == 2 ? end.data : step.data);
        sb_done(&decl);
        em_strbuf *target = i == 2 ? &end : &step;
        em_sb_clear(target);
        em_sb_append(target, name);
    }
    const char *n = e->vname[var];
    SB(inc);
    if (em_spmd_narrow(s)) {
        SB(raw);
        em_sb_printf(&raw, "%s + %s", n, step.data);
        em_sb_printf(&inc, "%s = ", n);
        wrap(e, s, raw.data, &inc);
        sb_done(&raw);
    } else {
        em_sb_printf(&inc, "%s += %s", n, step.data);
    }
    if (in->imm && e->d->unroll) {
        em_spmd_line(e, "%s", e->d->unroll);
        e->needs |= EM_NEED_UNROLL;
    }
    em_spmd_line(e, "for (%s = %s; %s < %s; %s) {", n, start.data, n, end.data, inc.data);
    e->depth++;
    emit_block(e, in->blocks[0], nest + 1);
    e->depth--;
    em_spmd_line(e, "}");
    if (hoist) {
        e->depth--;
        em_spmd_line(e, "}");
    }
    sb_done(&start);
    sb_done(&end);
    sb_done(&step);
    sb_done(&inc);
}

static void emit_control(em_spmd *e, const em_ir_inst *in, unsigned nest)
{
    switch (in->op) {
    case EM_OP_IF: {
        SB(c);
        em_spmd_val(e, in->args[0], &c);
        em_spmd_line(e, "if (%s) {", c.data);
        sb_done(&c);
        e->depth++;
        emit_block(e, in->blocks[0], nest + 1);
        e->depth--;
        if (in->blocks[1]) {
            em_spmd_line(e, "} else {");
            e->depth++;
            emit_block(e, in->blocks[1], nest + 1);
            e->depth--;
        }
        em_spmd_line(e, "}");
        break;
    }
    case EM_OP_RANGE:
        emit_range(e, in, nest);
        break;
    case EM_OP_LOOP:
        em_spmd_line(e, "for (;;) {");
        e->depth++;
        emit_block(e, in->blocks[0], nest + 1);
        e->depth--;
        em_spmd_line(e, "}");
        break;
    case EM_OP_BREAK: em_spmd_line(e, "break;"); break;
    case EM_OP_CONTINUE: em_spmd_line(e, "continue;"); break;
    case EM_OP_RETURN: em_spmd_line(e, "return;"); break;
    default: break;
    }
}

static void emit_inst(em_spmd *e, uint32_t idx, unsigned nest)
{
    const em_ir_inst *in = em_ir_inst_at(e->k, idx);
    if (!in) return;
    e->inst = idx;
    em_ir_op op = (em_ir_op)in->op;
    if (op == EM_OP_ASSIGN) {
        emit_assign(e, in);
    } else if ((op >= EM_OP_ADD && op <= EM_OP_CAST)) {
        emit_lanewise(e, in);
    } else if (op == EM_OP_BITCAST) {
        emit_bitcast(e, in);
    } else if (op == EM_OP_EXTRACT) {
        emit_extract(e, in);
    } else if (op == EM_OP_INSERT) {
        emit_insert(e, in);
    } else if (op == EM_OP_LOAD) {
        emit_load(e, in);
    } else if (op == EM_OP_STORE) {
        emit_store(e, in);
    } else if (op == EM_OP_LEN || op == EM_OP_SHAPE || op == EM_OP_STRIDE) {
        emit_meta(e, in);
    } else if (op == EM_OP_BUILTIN) {
        emit_builtin(e, in);
    } else if (op == EM_OP_SYNC_CUBE || op == EM_OP_SYNC_PLANE || op == EM_OP_FENCE) {
        if (op == EM_OP_SYNC_PLANE && e->plane_one)
            em_spmd_line(e, "/* plane barrier: planes have one unit */");
        else
            e->d->sync(e, in);
    } else if (op >= EM_OP_PLANE_SUM && op <= EM_OP_PLANE_SHUFFLE_DOWN) {
        emit_plane(e, in);
    } else if (op >= EM_OP_ATOMIC_ADD && op <= EM_OP_ATOMIC_STORE) {
        emit_atomic(e, in);
    } else if (op >= EM_OP_MAT_FILL && op <= EM_OP_MAT_STORE) {
        emit_matrix(e, in);
    } else if (op >= EM_OP_IF && op <= EM_OP_RETURN) {
        emit_control(e, in, nest);
    } else if (op == EM_OP_PRINT) {
        emit_print(e, in);
    } else if (op == EM_OP_INTRINSIC) {
        emit_intrinsic(e, in);
    } else {
        em_spmd_fail(e, "op %s is not supported by the %s generator", em_ir_op_name(op), e->d->name);
    }
}

static void emit_block(em_spmd *e, uint32_t b, unsigned nest)
{
    const em_ir_block *blk = em_ir_block_at(e->k, b);
    if (!blk || nest > MAX_NEST) return;
    for (size_t i = 0; i < blk->len && !e->failed; i++) emit_inst(e, blk->items[i], nest);
}

/* ---- kernels ----------------------------------------------------------------------------------- */

static void declare_values(em_spmd *e)
{
    size_t nv = em_ir_value_count(e->k) + 1;
    for (size_t v = 1; v < nv && !e->failed; v++) {
        const em_ir_value *x = em_ir_value_at(e->k, (em_ir_val)v);
        if (!e->vused[v]) continue;
        if (x->kind == EM_VAL_VAR) {
            SB(decl);
            e->d->decl(e, x->type, e->vname[v], &decl);
            e->d->zero(e, x->type, &decl);
            em_spmd_line(e, "%s;", decl.data);
            sb_done(&decl);
        } else if (x->kind == EM_VAL_MATRIX) {
            if (e->d->fragment)
                e->d->fragment(e, (em_ir_val)v);
            else if (matrix_lowerable(e))
                em_spmd_fragment_loops(e, (em_ir_val)v);
        }
    }
}

bool em_spmd_kernel(const em_spmd_dialect *d, const em_ir_kernel *k, const em_caps *caps, void *priv,
                    em_strbuf *out, uint32_t *needs)
{
    if (!k) {
        em_set_error(EM_ERR_INVALID, "%s: no kernel", d->name);
        return false;
    }
    if (em_ir_verify(k, 0) != EM_OK) {
        em_error_context("%s code generator", d->name);
        return false;
    }
    em_spmd e = {.d = d, .k = k, .caps = *caps, .sb = out, .inst = UINT32_MAX, .priv = priv,
                 .needs = needs ? *needs : 0};
    e.plane_one = !caps->plane_ops || caps->plane_dim <= 1;
    bool ok = setup(&e);
    if (ok) {
        size_t mark = out->len;
        d->open(&e);
        e.depth = 1;
        declare_values(&e);
        emit_block(&e, em_ir_body(k), 0);
        e.inst = UINT32_MAX;
        e.depth = 0;
        em_spmd_line(&e, "}");
        ok = !e.failed && !out->oom;
        if (out->oom && !e.failed) em_set_error(EM_ERR_NOMEM, "%s: out of memory generating code", d->name);
        if (!ok) {
            out->len = mark;
            if (out->data) out->data[mark] = 0;
        }
    }
    if (needs) *needs = e.needs;
    teardown(&e);
    return ok;
}

em_caps em_spmd_default_caps(const char *target, uint32_t plane_dim)
{
    em_caps c;
    memset(&c, 0, sizeof c);
    snprintf(c.target, sizeof c.target, "%s", target);
    snprintf(c.arch, sizeof c.arch, "%s", !strcmp(target, "cuda") ? "sm_80" : "generic");
    snprintf(c.device_name, sizeof c.device_name, "default %s device", target);
    c.plane_dim = plane_dim;
    c.plane_ops = plane_dim > 1;
    c.max_cube_units = 1024;
    c.max_cube_dim[0] = c.max_cube_dim[1] = 1024;
    c.max_cube_dim[2] = 64;
    c.max_shared = 48 * 1024;
    for (int s = 0; s < EM_SCALAR_COUNT; s++) c.dtype[s] = true;
    c.float_atomic_add = !strcmp(target, "cuda");
    c.matrix = !strcmp(target, "cuda");
    c.print = strcmp(target, "glsl") != 0;
    return c;
}

/* ---- C-like literals (CUDA, OpenCL) ----------------------------------------------------------- */

/* Writes a float with enough digits to round-trip, always with a '.' or exponent. */
static void float_digits(em_strbuf *sb, double v, bool single)
{
    char buf[64];
    snprintf(buf, sizeof buf, single ? "%.9g" : "%.17g", v);
    em_sb_append(sb, buf);
    if (!strpbrk(buf, ".eEn")) em_sb_append(sb, ".0");
}

void em_spmd_c_literal(em_spmd *e, em_scalar s, em_ir_const c, const char *sfx_i64, const char *sfx_u64,
                       const char *const special[4], em_strbuf *sb)
{
    (void)e;
    switch (s) {
    case EM_BOOL: em_sb_append(sb, c.i ? "true" : "false"); break;
    case EM_I8: case EM_I16: em_sb_printf(sb, "%d", (int)(s == EM_I8 ? (int8_t)c.i : (int16_t)c.i)); break;
    case EM_I32:
        if ((int32_t)c.i == INT32_MIN)
            em_sb_append(sb, "(-2147483647 - 1)");
        else
            em_sb_printf(sb, "%d", (int)(int32_t)c.i);
        break;
    case EM_I64:
        if (c.i == INT64_MIN)
            em_sb_printf(sb, "(-9223372036854775807%s - 1%s)", sfx_i64, sfx_i64);
        else
            em_sb_printf(sb, "%lld%s", (long long)c.i, sfx_i64);
        break;
    case EM_U8: em_sb_printf(sb, "%uu", (unsigned)(uint8_t)c.u); break;
    case EM_U16: em_sb_printf(sb, "%uu", (unsigned)(uint16_t)c.u); break;
    case EM_U32: em_sb_printf(sb, "%uu", (unsigned)(uint32_t)c.u); break;
    case EM_U64: em_sb_printf(sb, "%llu%s", (unsigned long long)c.u, sfx_u64); break;
    case EM_F64:
    default: { /* f16, bf16, f32 as float; f64 as double */
        bool single = s != EM_F64;
        if (isnan(c.f)) {
            em_sb_append(sb, special[single ? 1 : 3]);
        } else if (isinf(c.f)) {
            em_sb_printf(sb, "%s%s", c.f < 0 ? "-" : "", special[single ? 0 : 2]);
        } else {
            float_digits(sb, c.f, single);
            if (single) em_sb_append(sb, "f");
        }
        break;
    }
    }
}
