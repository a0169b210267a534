/* spmd.c — the emitter shared by the GPU code generators (see spmd.h). It checks and names what a
 * kernel uses, then walks the IR once, writing C-like text through the dialect's hooks: lane-wise
 * operations lane by lane (or as whole-line operators where the target has them), integer
 * division that never traps, f16/bf16 rounding and narrow-integer wrapping after each operation,
 * bitcasts through unsigned bit patterns, structured control flow, and the loop lowering of
 * matrix ops. Target specifics live in cuda.c, opencl.c and glsl.c.
 *
 * Text is built from scratch strings (em_spmd_str): each lives until the instruction that made it
 * is written, so expressions compose without bookkeeping. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/spmd.h"

#define MAX_NEST 300 /* deeper than the verifier allows; guards the recursion */

/* ---- scratch strings, errors, lines --------------------------------------------------------- */

static const char *keep(em_spmd *e, char *s)
{
    if (s && e->scratch_len == e->scratch_cap) {
        size_t cap = e->scratch_cap ? 2 * e->scratch_cap : 64;
        char **grown = realloc(e->scratch, cap * sizeof(char *));
        if (grown) {
            e->scratch = grown;
            e->scratch_cap = cap;
        }
    }
    if (!s || e->scratch_len == e->scratch_cap) {
        free(s);
        if (!e->failed) em_set_error(EM_ERR_NOMEM, "%s: out of memory generating code", e->d->name);
        e->failed = true;
        return "";
    }
    e->scratch[e->scratch_len++] = s;
    return s;
}

static const char *take(em_spmd *e, em_strbuf *sb)
{
    return keep(e, em_sb_take(sb));
}

const char *em_spmd_str(em_spmd *e, const char *fmt, ...)
{
    em_strbuf sb;
    em_sb_init(&sb);
    va_list ap;
    va_start(ap, fmt);
    em_sb_vprintf(&sb, fmt, ap);
    va_end(ap);
    return take(e, &sb);
}

static void release(em_spmd *e, size_t mark)
{
    while (e->scratch_len > mark) free(e->scratch[--e->scratch_len]);
}

/* The dialect's text-writing hooks, each kept as a scratch string. */
#define SCRATCH(e, call)                                                                           \
    em_strbuf sb_;                                                                                 \
    em_sb_init(&sb_);                                                                              \
    call;                                                                                          \
    return take((e), &sb_)

static const char *h_literal(em_spmd *e, em_scalar s, em_ir_const c)
{
    SCRATCH(e, e->d->literal(e, s, c, &sb_));
}
static const char *h_lane(em_spmd *e, em_type t, const char *n, unsigned i)
{
    SCRATCH(e, e->d->lane(e, t, n, i, &sb_));
}
static const char *h_decl(em_spmd *e, em_type t, const char *n)
{
    SCRATCH(e, e->d->decl(e, t, n, &sb_));
}
static const char *h_zero(em_spmd *e, em_type t)
{
    SCRATCH(e, e->d->zero(e, t, &sb_));
}
static const char *h_wrap(em_spmd *e, em_scalar s, const char *x)
{
    SCRATCH(e, e->d->wrap(e, s, x, &sb_));
}
static const char *h_convert(em_spmd *e, em_scalar from, em_scalar to, const char *x)
{
    SCRATCH(e, e->d->convert(e, from, to, x, &sb_));
}
static const char *h_bit_count(em_spmd *e, em_ir_op op, em_scalar s, const char *x)
{
    SCRATCH(e, e->d->bit_count(e, op, s, x, &sb_));
}
static const char *h_to_bits(em_spmd *e, em_scalar s, const char *x)
{
    SCRATCH(e, e->d->to_bits(e, s, x, &sb_));
}
static const char *h_from_bits(em_spmd *e, em_scalar s, const char *b)
{
    SCRATCH(e, e->d->from_bits(e, s, b, &sb_));
}
static const char *h_builtin(em_spmd *e, em_builtin b)
{
    SCRATCH(e, e->d->builtin(e, b, &sb_));
}
static const char *h_meta(em_spmd *e, uint32_t off)
{
    SCRATCH(e, e->d->meta(e, off, &sb_));
}
static const char *h_mem_load(em_spmd *e, em_ir_mem m, const char *idx, int l)
{
    SCRATCH(e, e->d->mem_load(e, m, idx, l, &sb_));
}
static const char *h_plane(em_spmd *e, const em_ir_inst *in, em_scalar s, const char *a,
                           const char *b)
{
    SCRATCH(e, e->d->plane(e, in, s, a, b, &sb_));
}
static const char *h_atomic(em_spmd *e, const em_ir_inst *in, const char *idx)
{
    SCRATCH(e, e->d->atomic(e, in, idx, &sb_));
}

void em_spmd_fail(em_spmd *e, const char *fmt, ...)
{
    if (e->failed) return;
    e->failed = true;
    em_strbuf msg;
    em_sb_init(&msg);
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
    em_sb_free(&msg);
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

/* ---- values, literals ------------------------------------------------------------------------ */

const em_ir_value *em_spmd_value(const em_spmd *e, em_ir_val v)
{
    return em_ir_value_at(e->k, v);
}

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

unsigned em_spmd_bits(em_scalar s)
{
    return s == EM_BOOL ? 8 : (unsigned)em_scalar_size(s) * 8;
}

bool em_spmd_narrow(em_scalar s)
{
    return s == EM_I8 || s == EM_I16 || s == EM_U8 || s == EM_U16;
}

/* Kinds whose results are brought back into range after each operation. */
static bool wrapped(em_scalar s)
{
    return em_spmd_narrow(s) || s == EM_F16 || s == EM_BF16;
}

static void need_scalar(em_spmd *e, em_scalar s)
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
    int q = ex - digits < qmin ? qmin : ex - digits;
    double r = nearbyint(fabs(x) / ldexp(1.0, q)) * ldexp(1.0, q);
    return copysign(r > max ? INFINITY : r, x);
}

static const char *lit(em_spmd *e, em_scalar s, em_ir_const c)
{
    if (s == EM_F16) c.f = round_to(c.f, 11, -24, 65504.0);
    if (s == EM_BF16) c.f = round_to(c.f, 8, -133, 3.3895313892515355e38);
    if (s == EM_F32) c.f = (double)(float)c.f;
    return h_literal(e, s, c);
}

static const char *lit_i(em_spmd *e, em_scalar s, int64_t v)
{
    em_ir_const c;
    if (em_scalar_is_float(s))
        c.f = (double)v;
    else
        c.i = v;
    return lit(e, s, c);
}

/* A value as an expression: its identifier, or the literal of a constant. */
static const char *val(em_spmd *e, em_ir_val v)
{
    const em_ir_value *x = em_spmd_value(e, v);
    if (!x) return "0";
    if (x->kind == EM_VAL_CONST) return lit(e, (em_scalar)x->type.scalar, x->c);
    return e->vname[v] ? e->vname[v] : "em_unnamed";
}

/* Lane i of a value (scalars and constants broadcast). */
static const char *lane(em_spmd *e, em_ir_val v, unsigned i)
{
    const em_ir_value *x = em_spmd_value(e, v);
    if (!x || x->type.lanes == 1 || x->kind == EM_VAL_CONST) return val(e, v);
    return h_lane(e, x->type, val(e, v), i);
}

void em_spmd_val(em_spmd *e, em_ir_val v, em_strbuf *sb)
{
    em_sb_append(sb, val(e, v));
}
static const char *convert(em_spmd *e, em_scalar from, em_scalar to, const char *x);

static const char *val_u32(em_spmd *e, em_ir_val v)
{
    return convert(e, (em_scalar)type_of(e, v).scalar, EM_U32, val(e, v));
}

void em_spmd_val_u32(em_spmd *e, em_ir_val v, em_strbuf *sb)
{
    em_sb_append(sb, val_u32(e, v));
}

static const char *index_expr(em_spmd *e, em_ir_val v)
{
    bool wide = em_spmd_bits((em_scalar)type_of(e, v).scalar) == 64;
    return e->d->index32 && wide ? val_u32(e, v) : val(e, v);
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
    em_strbuf sb;
    em_sb_init(&sb);
    for (const char *p = name ? name : ""; *p && sb.len < 40; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!ok) {
            if (sb.len && sb.data[sb.len - 1] != '_') em_sb_appendc(&sb, '_');
            continue;
        }
        if (!sb.len &&
            ((c >= '0' && c <= '9') || ((c == 'g' || c == 'G') && (p[1] == 'l' || p[1] == 'L'))))
            em_sb_appendc(&sb, 'n');
        em_sb_appendc(&sb, c);
    }
    while (sb.len && sb.data[sb.len - 1] == '_') sb.data[--sb.len] = 0;
    if (!sb.len)
        em_sb_printf(&sb, "%s%u", fallback, id);
    else
        em_sb_printf(&sb, "_%s%u", sep, id);
    return em_sb_take(&sb);
}

static void use_val(em_spmd *e, em_ir_val v)
{
    if (!v || v > em_ir_value_count(e->k) || e->vused[v]) return;
    e->vused[v] = 1;
    e->vfirst[v] = e->inst;
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
        for (int a = -1; a < EM_IR_MAX_ARGS; a++) {
            const em_ir_value *x = em_spmd_value(e, a < 0 ? in->dst : in->args[a]);
            if (x) check_dtype(e, (em_scalar)x->type.scalar, -1);
        }
        const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
        if (m) {
            uint8_t f = EM_MEMF_USED;
            bool atomic = in->op >= EM_OP_ATOMIC_ADD && in->op <= EM_OP_ATOMIC_STORE;
            if (atomic) f |= EM_MEMF_ATOMIC;
            if (atomic && em_scalar_is_float((em_scalar)m->elem.scalar) &&
                in->op != EM_OP_ATOMIC_LOAD)
                f |= EM_MEMF_FLOAT_RMW;
            if (in->op == EM_OP_MAT_LOAD || in->op == EM_OP_MAT_STORE) f |= EM_MEMF_MATRIX;
            e->mflags[in->mem] |= f;
            check_dtype(e, (em_scalar)m->elem.scalar, m->space);
        }
        if (in->op == EM_OP_COPY_ASYNC && em_ir_mem_at(e->k, (em_ir_mem)in->imm))
            e->mflags[in->imm] |= EM_MEMF_USED; /* the source */
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
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
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
    e->vfirst = calloc(nv, sizeof(uint32_t));
    e->mflags = calloc(nm, 1);
    e->meta_off = calloc(np + 1, sizeof(uint32_t));
    if (!e->vname || !e->mname || !e->vused || !e->vfirst || !e->mflags || !e->meta_off) {
        em_set_error(EM_ERR_NOMEM, "%s: out of memory generating kernel %s", e->d->name,
                     em_ir_kernel_name(k));
        return false;
    }
    if (!is_identifier(em_ir_kernel_name(k))) {
        em_spmd_fail(e, "the kernel name is not an identifier");
        return false;
    }
    for (size_t i = 0; i < np && !e->failed; i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        e->meta_off[i] = e->meta_words;
        const em_ir_memory *m = p->kind == EM_PARAM_BUFFER ? em_ir_mem_at(k, p->id) : NULL;
        const em_ir_value *v = p->kind == EM_PARAM_BUFFER ? NULL : em_spmd_value(e, p->id);
        if (!m && !v) continue;
        em_scalar s = (em_scalar)(m ? m->elem.scalar : v->type.scalar);
        const char *why =
            e->d->dtype_missing ? e->d->dtype_missing(e, s, m ? EM_MEM_GLOBAL : -1) : NULL;
        if (why)
            em_spmd_fail(e, "parameter %zu '%s' (%s %s): %s", i,
                         (m ? m->name : v->name) ? (m ? m->name : v->name) : "", em_scalar_name(s),
                         m ? "buffer" : "scalar", why);
        if (m) e->meta_words += 1 + 2u * m->rank;
        if (v) use_val(e, p->id);
    }
    scan_block(e, em_ir_body(k), 0);
    e->inst = UINT32_MAX;
    bool ok = true;
    for (size_t v = 1; v < nv; v++) {
        const em_ir_value *x = em_ir_value_at(k, (em_ir_val)v);
        if (!x || x->kind == EM_VAL_CONST || !e->vused[v]) continue;
        if (x->kind != EM_VAL_MATRIX) need_scalar(e, (em_scalar)x->type.scalar);
        static const char *const fallback[] = {"t", "v", "c", "p", "f"};
        e->vname[v] =
            ident(x->name, fallback[x->kind <= EM_VAL_MATRIX ? x->kind : 0], "", (uint32_t)v);
        ok = ok && e->vname[v];
    }
    for (size_t m = 1; m < nm; m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        if (x->space == EM_MEM_GLOBAL || (e->mflags[m] & EM_MEMF_USED))
            need_scalar(e, (em_scalar)x->elem.scalar);
        e->mname[m] = ident(x->name, "mem", "m", (uint32_t)m);
        ok = ok && e->mname[m];
    }
    if (!ok)
        em_set_error(EM_ERR_NOMEM, "%s: out of memory generating kernel %s", e->d->name,
                     em_ir_kernel_name(k));
    return ok && !e->failed;
}

static void teardown(em_spmd *e)
{
    size_t nv = em_ir_value_count(e->k) + 1, nm = em_ir_mem_count(e->k) + 1;
    for (size_t i = 0; e->vname && i < nv; i++) free(e->vname[i]);
    for (size_t i = 0; e->mname && i < nm; i++) free(e->mname[i]);
    release(e, 0);
    free(e->scratch);
    free(e->vname);
    free(e->mname);
    free(e->vused);
    free(e->vfirst);
    free(e->mflags);
    free(e->meta_off);
}

/* ---- destinations ------------------------------------------------------------------------------
 */

static const char *decl(em_spmd *e, em_type t, const char *name)
{
    return h_decl(e, t, name);
}

/* dst = expr for a scalar destination, or a line destination assigned whole (declaring
 * temporaries). */
static void assign(em_spmd *e, em_ir_val dst, const char *expr)
{
    const em_ir_value *x = em_spmd_value(e, dst);
    if (!x) return;
    em_spmd_line(e, "%s = %s;",
                 x->kind == EM_VAL_TEMP ? decl(e, x->type, val(e, dst)) : val(e, dst), expr);
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
        snprintf(ld->name, sizeof ld->name, "%s", val(e, dst));
    em_spmd_line(e, "%s;", decl(e, ld->t, ld->name));
}

static void line_lane(em_spmd *e, const line_dst *ld, unsigned i, const char *expr)
{
    em_spmd_line(e, "%s = %s;", h_lane(e, ld->t, ld->name, i), expr);
}

/* Copies the named line `from` into `to` (both of type t). */
static void copy_line(em_spmd *e, em_type t, const char *to, const char *from)
{
    if (e->d->line_kind(e, t) >= EM_LINE_ASSIGN) {
        em_spmd_line(e, "%s = %s;", to, from);
        return;
    }
    for (unsigned i = 0; i < t.lanes; i++)
        em_spmd_line(e, "%s = %s;", h_lane(e, t, to, i), h_lane(e, t, from, i));
}

static void line_end(em_spmd *e, const line_dst *ld)
{
    if (ld->via_tmp) copy_line(e, ld->t, val(e, ld->dst), ld->name);
}

/* Writes dst from per-lane expressions made by `make` (a scalar destination is one lane). */
typedef const char *(*lane_fn)(em_spmd *e, const em_ir_inst *in, unsigned lane);

static void per_lane(em_spmd *e, const em_ir_inst *in, lane_fn make)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!d) return;
    if (d->type.lanes == 1) {
        const char *x = make(e, in, 0);
        if (!e->failed) assign(e, in->dst, x);
        return;
    }
    line_dst ld;
    line_begin(e, in->dst, &ld);
    for (unsigned l = 0; l < d->type.lanes && !e->failed; l++) line_lane(e, &ld, l, make(e, in, l));
    line_end(e, &ld);
}

/* ---- scalar operations ------------------------------------------------------------------------
 */

/* x without its outer parentheses when they enclose all of it. */
static const char *unparen(em_spmd *e, const char *x)
{
    size_t n = strlen(x);
    if (n < 2 || x[0] != '(' || x[n - 1] != ')') return x;
    int depth = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        depth += x[i] == '(' ? 1 : x[i] == ')' ? -1 : 0;
        if (depth == 0) return x; /* the first '(' closes before the end */
    }
    return em_spmd_str(e, "%.*s", (int)(n - 2), x + 1);
}

static const char *wrap(em_spmd *e, em_scalar s, const char *x)
{
    if (!wrapped(s)) return x;
    x = unparen(e, x);
    return h_wrap(e, s, x);
}

static const char *convert(em_spmd *e, em_scalar from, em_scalar to, const char *x)
{
    if (from == to) return x;
    if (to == EM_BOOL) return em_spmd_str(e, "((%s) != %s)", x, lit_i(e, from, 0));
    if (from == EM_BOOL)
        return em_spmd_str(e, "((%s) ? %s : %s)", x, lit_i(e, to, 1), lit_i(e, to, 0));
    if (!wrapped(to) && !strcmp(e->d->ctype[from], e->d->ctype[to]))
        return x; /* same compute type */
    return h_convert(e, from, to, x);
}

static const char *need_fn(em_spmd *e, em_ir_op op, em_scalar s)
{
    const char *fn = e->d->float_fn(e, op, s);
    if (!fn)
        em_spmd_fail(e, "%s on %s is not available on %s", em_ir_op_name(op), em_scalar_name(s),
                     e->d->name);
    return fn ? fn : "";
}

/* The guarded integer division and remainder (never trapping; see spmd.h). */
static const char *int_divrem(em_spmd *e, bool rem, em_scalar s, const char *a, const char *b)
{
    const char *zero = lit_i(e, s, 0), *body;
    if (!rem)
        body = em_spmd_str(e, "(%s) / (%s)", a, b);
    else if (e->d->rem_via_div && em_scalar_is_signed(s))
        body = em_spmd_str(e, "((%s) - ((%s) / (%s)) * (%s))", a, a, b, b);
    else
        body = em_spmd_str(e, "(%s) %% (%s)", a, b);
    const char *on_zero = rem ? zero : a;
    if (em_scalar_is_signed(s) && !em_spmd_narrow(s)) {
        em_ir_const min = {.i = s == EM_I64 ? INT64_MIN : INT32_MIN};
        return em_spmd_str(e, "((%s) == %s || ((%s) == %s && (%s) == %s) ? %s : %s)", b, zero, a,
                           lit(e, s, min), b, lit_i(e, s, -1), on_zero, body);
    }
    return wrap(e, s, em_spmd_str(e, "((%s) == %s ? %s : %s)", b, zero, on_zero, body));
}

static bool op_wraps(em_ir_op op, bool fl)
{
    switch (op) {
    case EM_OP_ADD:
    case EM_OP_SUB:
    case EM_OP_MUL:
    case EM_OP_POW:
    case EM_OP_SHL:
    case EM_OP_NOT:
    case EM_OP_EXP:
    case EM_OP_EXP2:
    case EM_OP_LOG:
    case EM_OP_LOG2:
    case EM_OP_SQRT:
    case EM_OP_RSQRT:
    case EM_OP_ERF:
    case EM_OP_TANH:
    case EM_OP_SIN:
    case EM_OP_COS:
    case EM_OP_FMA:
        return true;
    case EM_OP_NEG:
    case EM_OP_ABS: /* exact on floats */
        return !fl;
    default:
        return false;
    }
}

/* The expression of a lane-wise op on scalar operand expressions a, b, c, whose operands have
 * kind s (for CAST: from s to the result kind ds). */
static const char *op_expr(em_spmd *e, em_ir_op op, em_scalar s, em_scalar ds, const char *a,
                           const char *b, const char *c)
{
    bool fl = em_scalar_is_float(s), bl = s == EM_BOOL;
    static const char *const infix[] = {
        [EM_OP_ADD] = "+", [EM_OP_SUB] = "-", [EM_OP_MUL] = "*",  [EM_OP_AND] = "&",
        [EM_OP_OR] = "|",  [EM_OP_XOR] = "^", [EM_OP_SHL] = "<<", [EM_OP_SHR] = ">>",
        [EM_OP_EQ] = "==", [EM_OP_NE] = "!=", [EM_OP_LT] = "<",   [EM_OP_LE] = "<=",
        [EM_OP_GT] = ">",  [EM_OP_GE] = ">="};
    const char *r;
    switch (op) {
    case EM_OP_ADD:
    case EM_OP_SUB:
    case EM_OP_MUL:
    case EM_OP_SHL:
    case EM_OP_SHR:
    case EM_OP_EQ:
    case EM_OP_NE:
    case EM_OP_LT:
    case EM_OP_LE:
    case EM_OP_GT:
    case EM_OP_GE:
        r = em_spmd_str(e, "(%s %s %s)", a, infix[op], b);
        break;
    case EM_OP_AND:
    case EM_OP_OR:
    case EM_OP_XOR:
        r = em_spmd_str(e, "(%s %s %s)", a,
                        bl ? (op == EM_OP_AND  ? "&&"
                              : op == EM_OP_OR ? "||"
                                               : "!=")
                           : infix[op],
                        b);
        break;
    case EM_OP_DIV:
        return fl ? wrap(e, s, em_spmd_str(e, "(%s / %s)", a, b)) : int_divrem(e, false, s, a, b);
    case EM_OP_REM:
        if (!fl) return int_divrem(e, true, s, a, b);
        if (e->d->float_rem_expr)
            return wrap(e, s, em_spmd_str(e, "((%s) - (%s) * trunc((%s) / (%s)))", a, b, a, b));
        return wrap(e, s, em_spmd_str(e, "%s(%s, %s)", need_fn(e, op, s), a, b));
    case EM_OP_MIN:
    case EM_OP_MAX:
        if (!fl)
            return em_spmd_str(e, "((%s) %s (%s) ? (%s) : (%s))", a, op == EM_OP_MIN ? "<" : ">", b,
                               a, b);
        return em_spmd_str(e, "%s(%s, %s)", need_fn(e, op, s), a, b);
    case EM_OP_POW:
        r = em_spmd_str(e, "%s(%s, %s)", need_fn(e, op, s), a, b);
        break;
    case EM_OP_NEG:
        r = em_spmd_str(e, "(-%s)", a);
        break;
    case EM_OP_NOT:
        r = em_spmd_str(e, bl ? "(!%s)" : "(~%s)", a);
        break;
    case EM_OP_ABS:
        if (fl)
            r = em_spmd_str(e, "%s(%s)", need_fn(e, op, s), a);
        else if (em_scalar_is_signed(s))
            r = em_spmd_str(e, "((%s) < %s ? -(%s) : (%s))", a, lit_i(e, s, 0), a, a);
        else
            r = a;
        break;
    case EM_OP_POPCOUNT:
    case EM_OP_CLZ:
    case EM_OP_CTZ:
        return h_bit_count(e, op, s, a);
    case EM_OP_FMA:
        r = em_spmd_str(e, "%s(%s, %s, %s)", need_fn(e, op, s), a, b, c);
        break;
    case EM_OP_CLAMP:
        if (!fl)
            return em_spmd_str(e, "((%s) < (%s) ? (%s) : ((%s) > (%s) ? (%s) : (%s)))", a, b, b, a,
                               c, c, a);
        return em_spmd_str(e, "%s(%s(%s, %s), %s)", need_fn(e, EM_OP_MIN, s),
                           need_fn(e, EM_OP_MAX, s), a, b, c);
    case EM_OP_SELECT:
        return em_spmd_str(e, "(%s ? %s : %s)", a, b, c);
    case EM_OP_CAST:
        return convert(e, s, ds, a);
    default: /* float unary functions and ISNAN / ISINF */
        r = em_spmd_str(e, "%s(%s)", need_fn(e, op, s), a);
        break;
    }
    return op_wraps(op, fl) ? wrap(e, s, r) : r;
}

/* Whole-line forms where the target has them: + - * / as operators, float functions on vectors.
 * Never for kinds that wrap, and only with named line operands. Returns NULL when not taken. */
static const char *whole_line(em_spmd *e, const em_ir_inst *in, em_type t)
{
    em_scalar s = (em_scalar)t.scalar;
    em_ir_op op = (em_ir_op)in->op;
    bool fl = em_scalar_is_float(s);
    if (op == EM_OP_CAST && e->d->line_convert && !is_const(e, in->args[0])) {
        em_scalar from = (em_scalar)type_of(e, in->args[0]).scalar;
        em_strbuf sb;
        em_sb_init(&sb);
        if (e->d->line_convert(e, from, s, t.lanes, val(e, in->args[0]), &sb)) return take(e, &sb);
        free(em_sb_take(&sb));
    }
    if (wrapped(s) || s == EM_BOOL || e->d->line_kind(e, t) != EM_LINE_OPS) return NULL;
    if (op == EM_OP_ADD || op == EM_OP_SUB || op == EM_OP_MUL || (op == EM_OP_DIV && fl)) {
        for (int i = 0; i < 2; i++)
            if (is_const(e, in->args[i]) && type_of(e, in->args[i]).lanes > 1) return NULL;
        static const char *const ops[] = {
            [EM_OP_ADD] = "+", [EM_OP_SUB] = "-", [EM_OP_MUL] = "*", [EM_OP_DIV] = "/"};
        e->needs |= EM_NEED_VECOPS;
        return em_spmd_str(e, "%s %s %s", val(e, in->args[0]), ops[op], val(e, in->args[1]));
    }
    if (fl && op == EM_OP_NEG && !is_const(e, in->args[0])) {
        e->needs |= EM_NEED_VECOPS;
        return em_spmd_str(e, "-%s", val(e, in->args[0]));
    }
    bool unary_math = op == EM_OP_ABS || (op >= EM_OP_EXP && op <= EM_OP_ROUND);
    if (fl && e->d->vector_math && unary_math && !is_const(e, in->args[0])) {
        const char *fn = e->d->float_fn(e, op, s);
        if (fn && strncmp(fn, "em_", 3)) return em_spmd_str(e, "%s(%s)", fn, val(e, in->args[0]));
    }
    return NULL;
}

static unsigned op_arity(em_ir_op op)
{
    if (op >= EM_OP_FMA && op <= EM_OP_SELECT) return 3;
    if ((op >= EM_OP_NEG && op <= EM_OP_CTZ) || op == EM_OP_CAST) return 1;
    return 2;
}

static const char *lanewise_lane(em_spmd *e, const em_ir_inst *in, unsigned l)
{
    em_ir_op op = (em_ir_op)in->op;
    /* the operands' kind: b's for SELECT (a is the condition), else a's */
    em_scalar s = (em_scalar)type_of(e, in->args[op == EM_OP_SELECT ? 1 : 0]).scalar;
    em_scalar ds = (em_scalar)type_of(e, in->dst).scalar;
    unsigned n = op_arity(op);
    const char *b = n > 1 ? lane(e, in->args[1], l) : "", *c = n > 2 ? lane(e, in->args[2], l) : "";
    const em_ir_value *bv = em_spmd_value(e, in->args[1]);
    if ((op == EM_OP_SHL || op == EM_OP_SHR) && bv && bv->kind == EM_VAL_CONST) {
        /* a constant shift count is taken modulo the width here */
        em_ir_const k = {.u = bv->c.u & (em_spmd_bits(s) - 1)};
        const char *r = em_spmd_str(e, "(%s %s %s)", lane(e, in->args[0], l),
                                    op == EM_OP_SHL ? "<<" : ">>", lit(e, s, k));
        return op == EM_OP_SHL ? wrap(e, s, r) : r;
    }
    if (op == EM_OP_SHL || op == EM_OP_SHR)
        b = em_spmd_str(e, "(%s & %s)", b, lit_i(e, s, em_spmd_bits(s) - 1));
    return op_expr(e, op, s, ds, lane(e, in->args[0], l), b, c);
}

static void emit_lanewise(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    const char *whole = d && d->type.lanes > 1 ? whole_line(e, in, d->type) : NULL;
    if (whole)
        assign(e, in->dst, whole);
    else
        per_lane(e, in, lanewise_lane);
}

static const char *assign_lane(em_spmd *e, const em_ir_inst *in, unsigned l)
{
    return lane(e, in->args[0], l);
}

static void emit_assign(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_value *d = em_spmd_value(e, in->dst);
    if (!d) return;
    if (d->type.lanes == 1 ||
        (!is_const(e, in->args[0]) && e->d->line_kind(e, d->type) >= EM_LINE_ASSIGN))
        assign(e, in->dst, val(e, in->args[0]));
    else
        per_lane(e, in, assign_lane);
}

/* ---- bitcasts, lines ------------------------------------------------------------------------- */

static const char *to_bits(em_spmd *e, em_scalar s, const char *x)
{
    return h_to_bits(e, s, x);
}

static const char *bitcast_lane(em_spmd *e, const em_ir_inst *in, unsigned j)
{
    em_scalar ss = (em_scalar)type_of(e, in->args[0]).scalar,
              ds = (em_scalar)type_of(e, in->dst).scalar;
    unsigned sw = em_spmd_bits(ss), dw = em_spmd_bits(ds);
    const char *bits;
    if (sw == dw) {
        bits = to_bits(e, ss, lane(e, in->args[0], j));
    } else if (sw < dw) { /* pack r source lanes, lowest first */
        unsigned r = dw / sw;
        em_scalar wide = dw == 64 ? EM_U64 : EM_U32;
        bits = "";
        for (unsigned q = 0; q < r; q++) {
            const char *part =
                convert(e, EM_U32, wide, to_bits(e, ss, lane(e, in->args[0], j * r + q)));
            bits = q ? em_spmd_str(e, "%s | (%s << %u)", bits, part, q * sw) : part;
        }
        bits = em_spmd_str(e, "(%s)", bits);
    } else { /* a slice of one source lane */
        unsigned r = sw / dw;
        em_scalar swide = sw == 64 ? EM_U64 : EM_U32;
        em_ir_const mask = {.u = (1ull << dw) - 1};
        const char *part =
            em_spmd_str(e, "((%s >> %u) & %s)", to_bits(e, ss, lane(e, in->args[0], j / r)),
                        (j % r) * dw, lit(e, swide, mask));
        bits = convert(e, swide, EM_U32, part);
    }
    return h_from_bits(e, ds, bits);
}

/* dst = a[b]: a constant lane directly, a dynamic one through a chain of selects. */
static void emit_extract(em_spmd *e, const em_ir_inst *in)
{
    em_type t = type_of(e, in->args[0]);
    const em_ir_value *lv = em_spmd_value(e, in->args[1]);
    if (!lv) return;
    const char *x;
    if (t.lanes == 1) {
        x = val(e, in->args[0]);
    } else if (lv->kind == EM_VAL_CONST) {
        x = lane(e, in->args[0], (unsigned)(lv->c.u < t.lanes ? lv->c.u : 0));
    } else {
        const char *b = val(e, in->args[1]);
        x = lane(e, in->args[0], t.lanes - 1);
        for (unsigned l = t.lanes - 1; l-- > 0;)
            x = em_spmd_str(e, "(%s) == %s ? %s : %s", b, lit_i(e, (em_scalar)lv->type.scalar, l),
                            lane(e, in->args[0], l), x);
        x = em_spmd_str(e, "(%s)", x);
    }
    assign(e, in->dst, x);
}

static const char *insert_lane(em_spmd *e, const em_ir_inst *in, unsigned l)
{
    const em_ir_value *lv = em_spmd_value(e, in->args[1]);
    const char *a = lane(e, in->args[0], l), *c = val(e, in->args[2]);
    if (lv->kind == EM_VAL_CONST) return lv->c.u == l ? c : a;
    return em_spmd_str(e, "(%s == %s ? %s : %s)", val(e, in->args[1]),
                       lit_i(e, (em_scalar)lv->type.scalar, l), c, a);
}

/* ---- memory, metadata, positions ------------------------------------------------------------- */

static const char *mem_load(em_spmd *e, em_ir_mem m, const char *idx, int l)
{
    return h_mem_load(e, m, idx, l);
}

static const char *load_lane(em_spmd *e, const em_ir_inst *in, unsigned l)
{
    return mem_load(e, in->mem, index_expr(e, in->args[0]), (int)l);
}

static void emit_load(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
    if (!m) return;
    const char *idx = index_expr(e, in->args[0]);
    em_strbuf sb;
    em_sb_init(&sb);
    if (m->elem.lanes == 1)
        assign(e, in->dst, mem_load(e, in->mem, idx, -1));
    else if (e->d->mem_load_line(e, in->mem, idx, &sb))
        assign(e, in->dst, take(e, &sb));
    else
        per_lane(e, in, load_lane);
    em_sb_free(&sb);
}

static void emit_store(em_spmd *e, const em_ir_inst *in)
{
    const em_ir_memory *m = em_ir_mem_at(e->k, in->mem);
    if (!m) return;
    const char *idx = index_expr(e, in->args[0]);
    em_ir_val v = in->args[1];
    if (m->elem.lanes == 1) {
        e->d->mem_store(e, in->mem, idx, -1, val(e, v));
    } else if (is_const(e, v) || !e->d->mem_store_line(e, in->mem, idx, val(e, v))) {
        for (unsigned l = 0; l < m->elem.lanes; l++)
            e->d->mem_store(e, in->mem, idx, (int)l, lane(e, v, l));
    }
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
    assign(e, in->dst, h_meta(e, off));
}

static void emit_builtin(em_spmd *e, const em_ir_inst *in)
{
    static const char *const linear[EM_BUILTIN_COUNT] = {
        [EM_ABSOLUTE_POS] = "em_absolute_pos()",
        [EM_ABSOLUTE_POS_X] = "em_absolute_pos_x()",
        [EM_ABSOLUTE_POS_Y] = "em_absolute_pos_y()",
        [EM_ABSOLUTE_POS_Z] = "em_absolute_pos_z()",
        [EM_UNIT_POS] = "em_unit_pos()",
        [EM_CUBE_POS] = "em_cube_pos()",
        [EM_CUBE_DIM] = "em_cube_dim()",
        [EM_CUBE_COUNT] = "em_cube_count()"};
    em_builtin b = (em_builtin)in->imm;
    const char *x;
    if (b >= EM_BUILTIN_COUNT) {
        em_spmd_fail(e, "unknown built-in");
        return;
    } else if (linear[b]) {
        x = linear[b];
    } else if (b == EM_PLANE_DIM || b == EM_UNIT_POS_PLANE || b == EM_PLANE_POS) {
        if (e->plane_one)
            x = b == EM_PLANE_POS ? "em_unit_pos()" : lit_i(e, EM_U32, b == EM_PLANE_DIM ? 1 : 0);
        else if (b == EM_PLANE_POS)
            x = em_spmd_str(e, "(em_unit_pos() / %s)", h_builtin(e, EM_PLANE_DIM));
        else
            x = h_builtin(e, b);
        if (!e->plane_one) e->needs |= EM_NEED_PLANE;
    } else {
        x = h_builtin(e, b);
    }
    assign(e, in->dst, x);
}

void em_spmd_position_helpers(const em_spmd_dialect *d, const em_caps *caps, void *priv,
                              const char *void_params, em_strbuf *sb)
{
    em_spmd e = {.d = d, .caps = *caps, .priv = priv, .inst = UINT32_MAX};
    static const em_builtin groups[4] = {EM_UNIT_POS_X, EM_CUBE_POS_X, EM_CUBE_DIM_X,
                                         EM_CUBE_COUNT_X};
    const char *ax[4][3];
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 3; i++) ax[g][i] = h_builtin(&e, (em_builtin)(groups[g] + i));
    const char *pre = d->fn_prefix, *u = d->ctype[EM_U32], *vp = void_params;
    em_sb_printf(sb, "%s%s em_unit_pos(%s) { return %s + %s * (%s + %s * %s); }\n", pre, u, vp,
                 ax[0][0], ax[2][0], ax[0][1], ax[2][1], ax[0][2]);
    em_sb_printf(sb, "%s%s em_cube_pos(%s) { return %s + %s * (%s + %s * %s); }\n", pre, u, vp,
                 ax[1][0], ax[3][0], ax[1][1], ax[3][1], ax[1][2]);
    em_sb_printf(sb, "%s%s em_cube_dim(%s) { return %s * %s * %s; }\n", pre, u, vp, ax[2][0],
                 ax[2][1], ax[2][2]);
    em_sb_printf(sb, "%s%s em_cube_count(%s) { return %s * %s * %s; }\n", pre, u, vp, ax[3][0],
                 ax[3][1], ax[3][2]);
    em_sb_printf(
        sb, "%s%s em_absolute_pos(%s) { return em_cube_pos() * em_cube_dim() + em_unit_pos(); }\n",
        pre, u, vp);
    for (int i = 0; i < 3; i++)
        em_sb_printf(sb, "%s%s em_absolute_pos_%c(%s) { return %s * %s + %s; }\n", pre, u, "xyz"[i],
                     vp, ax[1][i], ax[2][i], ax[0][i]);
    release(&e, 0);
    free(e.scratch);
}

/* ---- plane ops, atomics, matrices ------------------------------------------------------------ */

static const char *plane_lane(em_spmd *e, const em_ir_inst *in, unsigned l)
{
    em_scalar s = (em_scalar)type_of(e, in->args[0]).scalar;
    em_ir_op op = (em_ir_op)in->op;
    const char *a = lane(e, in->args[0], l);
    if (e->plane_one) { /* every unit is its own plane */
        if (op == EM_OP_PLANE_EXCLUSIVE_SUM) return lit_i(e, s, 0);
        if (op == EM_OP_PLANE_BALLOT)
            return em_spmd_str(e, "(%s ? %s : %s)", a, lit_i(e, EM_U32, 1), lit_i(e, EM_U32, 0));
        return a;
    }
    const char *b = in->args[1] ? val(e, in->args[1]) : "";
    const char *r = h_plane(e, in, s, a, b);
    bool sums = op == EM_OP_PLANE_SUM || op == EM_OP_PLANE_PROD ||
                op == EM_OP_PLANE_INCLUSIVE_SUM || op == EM_OP_PLANE_EXCLUSIVE_SUM;
    return sums ? wrap(e, s, r) : r;
}

static void emit_atomic(em_spmd *e, const em_ir_inst *in)
{
    const char *x = h_atomic(e, in, index_expr(e, in->args[0]));
    if (e->failed) return;
    if (in->dst)
        assign(e, in->dst, x);
    else
        em_spmd_line(e, "%s;", x);
}

static bool matrix_lowerable(em_spmd *e)
{
    if (e->plane_one) return true;
    em_spmd_fail(
        e,
        "matrix ops are lowered to loops only where PLANE_DIM is 1, and this %s device runs "
        "planes of %u units (caps.plane_ops); cooperative-matrix extensions are not supported yet",
        e->d->name, e->caps.plane_dim);
    return false;
}

static void frag_dims(const em_ir_value *f, unsigned *rows, unsigned *cols)
{
    *rows = f->mat_role == EM_MAT_B ? f->mat_k : f->mat_m;
    *cols = f->mat_role == EM_MAT_A ? f->mat_k : f->mat_n;
}

static void fragment_loops(em_spmd *e, em_ir_val v)
{
    const em_ir_value *f = em_spmd_value(e, v);
    unsigned r, c;
    frag_dims(f, &r, &c);
    em_spmd_line(
        e, "%s;",
        decl(e, em_ty((em_scalar)f->type.scalar), em_spmd_str(e, "%s[%u]", val(e, v), r * c)));
}

static void matrix_loops(em_spmd *e, const em_ir_inst *in)
{
    const char *u = e->d->ctype[EM_U32], *z = lit_i(e, EM_U32, 0);
    if (in->op == EM_OP_MAT_FILL) {
        unsigned r, c;
        frag_dims(em_spmd_value(e, in->args[0]), &r, &c);
        em_spmd_line(e, "for (%s em_i = %s; em_i < %uu; em_i++) %s[em_i] = %s;", u, z, r * c,
                     val(e, in->args[0]), val(e, in->args[1]));
    } else if (in->op == EM_OP_MAT_LOAD || in->op == EM_OP_MAT_STORE) {
        bool load = in->op == EM_OP_MAT_LOAD;
        em_ir_val fv = in->args[load ? 0 : 2];
        unsigned r, c;
        frag_dims(em_spmd_value(e, fv), &r, &c);
        const char *off = val_u32(e, in->args[load ? 1 : 0]),
                   *stride = val_u32(e, in->args[load ? 2 : 1]);
        const char *idx = in->imm == EM_COL_MAJOR
                              ? em_spmd_str(e, "%s + em_c * %s + em_r", off, stride)
                              : em_spmd_str(e, "%s + em_r * %s + em_c", off, stride);
        const char *elem = em_spmd_str(e, "%s[em_r * %uu + em_c]", val(e, fv), c);
        em_spmd_line(e, "for (%s em_r = %s; em_r < %uu; em_r++)", u, z, r);
        em_spmd_line(e, "    for (%s em_c = %s; em_c < %uu; em_c++) {", u, z, c);
        e->depth += 2;
        if (load)
            em_spmd_line(e, "%s = %s;", elem, mem_load(e, in->mem, idx, -1));
        else
            e->d->mem_store(e, in->mem, idx, -1, elem);
        e->depth -= 2;
        em_spmd_line(e, "    }");
    } else if (in->op ==
               EM_OP_MAT_MMA) { /* D = A * B + C; C is read before D is written (they may be one) */
        const em_ir_value *dv = em_spmd_value(e, in->args[0]), *av = em_spmd_value(e, in->args[1]);
        em_scalar acc = (em_scalar)dv->type.scalar, ab = (em_scalar)av->type.scalar;
        unsigned M = dv->mat_m, N = dv->mat_n, K = dv->mat_k;
        const char *a =
            convert(e, ab, acc, em_spmd_str(e, "%s[em_i * %uu + em_k]", val(e, in->args[1]), K));
        const char *b =
            convert(e, ab, acc, em_spmd_str(e, "%s[em_k * %uu + em_j]", val(e, in->args[2]), N));
        const char *sum = wrap(e, acc, em_spmd_str(e, "em_acc + %s * %s", a, b));
        em_spmd_line(e, "for (%s em_i = %s; em_i < %uu; em_i++)", u, z, M);
        em_spmd_line(e, "    for (%s em_j = %s; em_j < %uu; em_j++) {", u, z, N);
        e->depth += 2;
        em_spmd_line(e, "%s = %s[em_i * %uu + em_j];", decl(e, em_ty(acc), "em_acc"),
                     val(e, in->args[3]), N);
        em_spmd_line(e, "for (%s em_k = %s; em_k < %uu; em_k++) em_acc = %s;", u, z, K, sum);
        em_spmd_line(e, "%s[em_i * %uu + em_j] = em_acc;", val(e, in->args[0]), N);
        e->depth -= 2;
        em_spmd_line(e, "    }");
    }
}

static void emit_matrix(em_spmd *e, const em_ir_inst *in)
{
    if (e->d->matrix)
        e->d->matrix(e, in);
    else if (matrix_lowerable(e))
        matrix_loops(e, in);
}

/* ---- debugging, intrinsics ----------------------------------------------------------------------
 */

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

void em_spmd_printf(em_spmd *e, const em_ir_inst *in, bool ll64, const char *float_cast,
                    unsigned max_args)
{
    em_strbuf f, args;
    em_sb_init(&f);
    em_sb_init(&args);
    unsigned nargs = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0, next = 0,
             count = 0;
    for (const char *p = in->str ? in->str : ""; *p; p++) {
        if (*p != '%') {
            c_escape(&f, *p);
            continue;
        }
        if (p[1] != 'v' || next >= nargs) { /* only %v converts; anything else prints as it is */
            em_sb_append(&f, "%%");
            p += p[1] == '%';
            continue;
        }
        em_ir_val v = in->args[next++];
        em_type t = type_of(e, v);
        em_scalar s = (em_scalar)t.scalar;
        em_sb_append(&f, t.lanes > 1 ? "[" : "");
        for (unsigned l = 0; l < t.lanes; l++, count++) {
            const char *x = lane(e, v, l), *arg = x;
            if (l) em_sb_append(&f, ", ");
            if (em_scalar_is_float(s)) {
                em_sb_append(&f, "%g");
                arg = em_spmd_str(e, "%s(%s)", float_cast, x);
            } else if (s == EM_I64 || s == EM_U64) {
                em_sb_append(&f, s == EM_I64 ? (ll64 ? "%lld" : "%ld") : (ll64 ? "%llu" : "%lu"));
            } else {
                bool sg = s == EM_BOOL || em_scalar_is_signed(s);
                em_sb_append(&f, sg ? "%d" : "%u");
                arg = convert(e, s, sg ? EM_I32 : EM_U32, x);
            }
            em_sb_printf(&args, ", %s", arg);
        }
        em_sb_append(&f, t.lanes > 1 ? "]" : "");
        p++;
    }
    if (count > max_args)
        em_spmd_fail(e, "print has %u values; %s's printf takes at most %u", count, e->d->name,
                     max_args);
    else
        em_spmd_line(e, "printf(\"%s\"%s);", f.data, args.data);
    e->needs |= EM_NEED_PRINT;
    em_sb_free(&f);
    em_sb_free(&args);
}

static void emit_print(em_spmd *e, const em_ir_inst *in)
{
    if (e->d->print) {
        e->d->print(e, in);
        return;
    }
    em_strbuf text;
    em_sb_init(&text);
    for (const char *p = in->str ? in->str : ""; *p && text.len < 60; p++)
        em_sb_appendc(&text, (*p == '\n' || *p == '\r' || (*p == '*' && p[1] == '/')) ? ' ' : *p);
    em_spmd_line(e, "/* print dropped (no printf on %s): \"%s\" */", e->d->name, text.data);
    em_sb_free(&text);
}

static void emit_intrinsic(em_spmd *e, const em_ir_inst *in)
{
    const char *name = in->str ? in->str : "";
    size_t nl = strlen(e->d->ns);
    const char *x = NULL;
    if (!strncmp(name, e->d->ns, nl) && !strncmp(name + nl, ".call:", 6) &&
        is_identifier(name + nl + 6)) {
        unsigned nargs = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0;
        x = "";
        for (unsigned i = 0; i < nargs; i++)
            x = em_spmd_str(e, "%s%s%s", x, i ? ", " : "", val(e, in->args[i]));
        x = em_spmd_str(e, "%s(%s)", name + nl + 6, x);
    } else {
        em_strbuf sb;
        em_sb_init(&sb);
        if (e->d->intrinsic && e->d->intrinsic(e, in, &sb))
            x = take(e, &sb);
        else
            em_spmd_fail(
                e, "intrinsic `%s` is not available on %s (this target knows \"%s.call:NAME\"%s)",
                name, e->d->name, e->d->ns, e->d->intrinsic ? " and its own forms" : "");
        em_sb_free(&sb);
    }
    if (e->failed) return;
    if (in->dst)
        assign(e, in->dst, x);
    else
        em_spmd_line(e, "%s;", x);
}

/* ---- control flow ------------------------------------------------------------------------------
 */

static void emit_block(em_spmd *e, uint32_t b, unsigned nest);

static void emit_range(em_spmd *e, const em_ir_inst *in, unsigned nest)
{
    em_ir_val var = in->args[0];
    const em_ir_value *v = em_spmd_value(e, var);
    if (!v) return;
    em_scalar s = (em_scalar)v->type.scalar;
    const char *bound[2] = {val(e, in->args[2]), val(e, in->args[3])}; /* end, step */
    bool hoist = false; /* bounds held in variables are read once, before the loop */
    for (int i = 0; i < 2; i++) {
        const em_ir_value *x = em_spmd_value(e, in->args[2 + i]);
        if (!x || x->kind != EM_VAL_VAR) continue;
        char name[32];
        em_spmd_fresh(e, i ? "step" : "end", name);
        if (!hoist) em_spmd_line(e, "{");
        e->depth += !hoist;
        hoist = true;
        em_spmd_line(e, "%s = %s;", decl(e, x->type, name), bound[i]);
        bound[i] = em_spmd_str(e, "%s", name);
    }
    const char *n = val(e, var);
    const char *inc =
        em_spmd_narrow(s)
            ? em_spmd_str(e, "%s = %s", n, wrap(e, s, em_spmd_str(e, "%s + %s", n, bound[1])))
            : em_spmd_str(e, "%s += %s", n, bound[1]);
    if (in->imm && e->d->unroll) {
        em_spmd_line(e, "%s", e->d->unroll);
        e->needs |= EM_NEED_UNROLL;
    }
    em_spmd_line(e, "for (%s = %s; %s < %s; %s) {", n, val(e, in->args[1]), n, bound[0], inc);
    e->depth++;
    emit_block(e, in->blocks[0], nest + 1);
    e->depth--;
    em_spmd_line(e, "}");
    if (hoist) {
        e->depth--;
        em_spmd_line(e, "}");
    }
}

static void emit_control(em_spmd *e, const em_ir_inst *in, unsigned nest)
{
    switch (in->op) {
    case EM_OP_IF:
        em_spmd_line(e, "if (%s) {", val(e, in->args[0]));
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
    case EM_OP_BREAK:
        em_spmd_line(e, "break;");
        break;
    case EM_OP_CONTINUE:
        em_spmd_line(e, "continue;");
        break;
    case EM_OP_RETURN:
        em_spmd_line(e, "return;");
        break;
    default:
        break;
    }
}

static void emit_inst(em_spmd *e, uint32_t idx, unsigned nest)
{
    const em_ir_inst *in = em_ir_inst_at(e->k, idx);
    if (!in) return;
    size_t mark = e->scratch_len;
    e->inst = idx;
    em_ir_op op = (em_ir_op)in->op;
    if (op == EM_OP_ASSIGN)
        emit_assign(e, in);
    else if (op >= EM_OP_ADD && op <= EM_OP_CAST)
        emit_lanewise(e, in);
    else if (op == EM_OP_BITCAST)
        per_lane(e, in, bitcast_lane);
    else if (op == EM_OP_EXTRACT)
        emit_extract(e, in);
    else if (op == EM_OP_INSERT)
        per_lane(e, in, insert_lane);
    else if (op == EM_OP_LOAD)
        emit_load(e, in);
    else if (op == EM_OP_STORE)
        emit_store(e, in);
    else if (op == EM_OP_LEN || op == EM_OP_SHAPE || op == EM_OP_STRIDE)
        emit_meta(e, in);
    else if (op == EM_OP_BUILTIN)
        emit_builtin(e, in);
    else if (op == EM_OP_SYNC_PLANE && e->plane_one)
        em_spmd_line(e, "/* plane barrier: planes have one unit */");
    else if (op == EM_OP_SYNC_CUBE || op == EM_OP_SYNC_PLANE || op == EM_OP_FENCE)
        e->d->sync(e, in);
    else if (op >= EM_OP_PLANE_SUM && op <= EM_OP_PLANE_SHUFFLE_DOWN)
        per_lane(e, in, plane_lane);
    else if (op >= EM_OP_ATOMIC_ADD && op <= EM_OP_ATOMIC_STORE)
        emit_atomic(e, in);
    else if (op >= EM_OP_MAT_FILL && op <= EM_OP_MAT_STORE)
        emit_matrix(e, in);
    else if (op >= EM_OP_COPY_ASYNC && op <= EM_OP_COPY_WAIT && e->d->copy)
        e->d->copy(e, in);
    else if (op >= EM_OP_IF && op <= EM_OP_RETURN)
        emit_control(e, in, nest);
    else if (op == EM_OP_PRINT)
        emit_print(e, in);
    else if (op == EM_OP_INTRINSIC)
        emit_intrinsic(e, in);
    else
        em_spmd_fail(e, "op %s is not supported by the %s generator", em_ir_op_name(op),
                     e->d->name);
    release(e, mark);
}

static void emit_block(em_spmd *e, uint32_t b, unsigned nest)
{
    const em_ir_block *blk = em_ir_block_at(e->k, b);
    if (!blk || nest > MAX_NEST) return;
    for (size_t i = 0; i < blk->len && !e->failed; i++) emit_inst(e, blk->items[i], nest);
}

/* ---- kernels -----------------------------------------------------------------------------------
 */

static void declare_values(em_spmd *e)
{
    size_t nv = em_ir_value_count(e->k) + 1;
    for (size_t v = 1; v < nv && !e->failed; v++) {
        const em_ir_value *x = em_ir_value_at(e->k, (em_ir_val)v);
        if (!e->vused[v]) continue;
        if (x->kind == EM_VAL_VAR) {
            em_spmd_line(e, "%s%s;", decl(e, x->type, val(e, (em_ir_val)v)), h_zero(e, x->type));
        } else if (x->kind == EM_VAL_MATRIX) {
            e->inst = e->vfirst[v]; /* problems with a fragment name its first use */
            if (e->d->fragment)
                e->d->fragment(e, (em_ir_val)v);
            else if (matrix_lowerable(e))
                fragment_loops(e, (em_ir_val)v);
            e->inst = UINT32_MAX;
        }
        release(e, 0);
    }
}

bool em_spmd_kernel(const em_spmd_dialect *d, const em_ir_kernel *k, const em_caps *caps,
                    void *priv, em_strbuf *out, uint32_t *needs)
{
    if (!k) {
        em_set_error(EM_ERR_INVALID, "%s: no kernel", d->name);
        return false;
    }
    if (em_ir_verify(k, 0) != EM_OK) {
        em_error_context("%s code generator", d->name);
        return false;
    }
    em_spmd e = {.d = d,
                 .k = k,
                 .caps = *caps,
                 .sb = out,
                 .inst = UINT32_MAX,
                 .priv = priv,
                 .needs = needs ? *needs : 0};
    e.plane_one = !caps->plane_ops || caps->plane_dim <= 1;
    size_t mark = out->len;
    bool ok = setup(&e);
    if (ok) {
        d->open(&e);
        release(&e, 0);
        e.depth = 1;
        declare_values(&e);
        emit_block(&e, em_ir_body(k), 0);
        e.inst = UINT32_MAX;
        e.depth = 0;
        em_spmd_line(&e, "}");
        if (out->oom && !e.failed)
            em_set_error(EM_ERR_NOMEM, "%s: out of memory generating code", d->name);
        ok = !e.failed && !out->oom;
    }
    if (!ok && out->len > mark) {
        out->len = mark;
        out->data[mark] = 0;
    }
    if (needs) *needs = e.needs;
    teardown(&e);
    return ok;
}

bool em_spmd_check_batch(const em_spmd_dialect *d, const em_ir_kernel *const *ks, size_t n)
{
    if (!ks || !n) {
        em_set_error(EM_ERR_INVALID, "%s code generator: no kernels", d->name);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!ks[i]) {
            em_set_error(EM_ERR_INVALID, "%s code generator: kernel %zu of the batch is NULL",
                         d->name, i);
            return false;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(em_ir_kernel_name(ks[i]), em_ir_kernel_name(ks[j]))) {
                em_set_error(EM_ERR_INVALID,
                             "%s code generator: two kernels named '%s' in one batch (one source "
                             "cannot hold both)",
                             d->name, em_ir_kernel_name(ks[i]));
                return false;
            }
    }
    return true;
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

/* Writes a float with enough digits to round-trip, always with a '.' or an exponent. */
static void float_digits(em_strbuf *sb, double v, bool single)
{
    char buf[64];
    snprintf(buf, sizeof buf, single ? "%.9g" : "%.17g", v);
    em_sb_append(sb, buf);
    if (!strpbrk(buf, ".eEn")) em_sb_append(sb, ".0");
}

void em_spmd_c_literal(em_spmd *e, em_scalar s, em_ir_const c, const char *sfx_i64,
                       const char *sfx_u64, const char *const special[4], em_strbuf *sb)
{
    (void)e;
    switch (s) {
    case EM_BOOL:
        em_sb_append(sb, c.i ? "true" : "false");
        break;
    case EM_I8:
        em_sb_printf(sb, "%d", (int)(int8_t)c.i);
        break;
    case EM_I16:
        em_sb_printf(sb, "%d", (int)(int16_t)c.i);
        break;
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
    case EM_U8:
        em_sb_printf(sb, "%uu", (unsigned)(uint8_t)c.u);
        break;
    case EM_U16:
        em_sb_printf(sb, "%uu", (unsigned)(uint16_t)c.u);
        break;
    case EM_U32:
        em_sb_printf(sb, "%uu", (unsigned)(uint32_t)c.u);
        break;
    case EM_U64:
        em_sb_printf(sb, "%llu%s", (unsigned long long)c.u, sfx_u64);
        break;
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

char *em_spmd_translation_unit(const em_spmd_dialect *d, const em_ir_kernel *const *ks, size_t n,
                               const em_caps *caps, em_spmd_prelude_fn prelude, const char *label)
{
    if (!em_spmd_check_batch(d, ks, n)) return NULL;
    em_strbuf body, out;
    em_sb_init(&body);
    em_sb_init(&out);
    uint32_t needs = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) em_sb_append(&body, "\n");
        if (!em_spmd_kernel(d, ks[i], caps, NULL, &body, &needs)) {
            em_sb_free(&body);
            em_sb_free(&out);
            return NULL;
        }
    }
    prelude(caps, needs, &out);
    em_sb_append(&out, body.data);
    em_sb_free(&body);
    char *text = em_sb_take(&out);
    if (!text) em_set_error(EM_ERR_NOMEM, "%s code generator: out of memory", label);
    return text;
}

const char *em_spmd_libm_name(em_ir_op op, bool single)
{
    static const char *const f32[EM_OP_COUNT] = {
        [EM_OP_EXP] = "expf",    [EM_OP_EXP2] = "exp2f",   [EM_OP_LOG] = "logf",
        [EM_OP_LOG2] = "log2f",  [EM_OP_SQRT] = "sqrtf",   [EM_OP_RSQRT] = "rsqrtf",
        [EM_OP_ERF] = "erff",    [EM_OP_TANH] = "tanhf",   [EM_OP_SIN] = "sinf",
        [EM_OP_COS] = "cosf",    [EM_OP_FLOOR] = "floorf", [EM_OP_CEIL] = "ceilf",
        [EM_OP_ROUND] = "rintf", [EM_OP_ABS] = "fabsf",    [EM_OP_POW] = "powf",
        [EM_OP_REM] = "fmodf",   [EM_OP_MIN] = "fminf",    [EM_OP_MAX] = "fmaxf",
        [EM_OP_FMA] = "fmaf",    [EM_OP_ISNAN] = "isnan",  [EM_OP_ISINF] = "isinf"};
    static const char *const f64[EM_OP_COUNT] = {
        [EM_OP_EXP] = "exp",    [EM_OP_EXP2] = "exp2",   [EM_OP_LOG] = "log",
        [EM_OP_LOG2] = "log2",  [EM_OP_SQRT] = "sqrt",   [EM_OP_RSQRT] = "rsqrt",
        [EM_OP_ERF] = "erf",    [EM_OP_TANH] = "tanh",   [EM_OP_SIN] = "sin",
        [EM_OP_COS] = "cos",    [EM_OP_FLOOR] = "floor", [EM_OP_CEIL] = "ceil",
        [EM_OP_ROUND] = "rint", [EM_OP_ABS] = "fabs",    [EM_OP_POW] = "pow",
        [EM_OP_REM] = "fmod",   [EM_OP_MIN] = "fmin",    [EM_OP_MAX] = "fmax",
        [EM_OP_FMA] = "fma",    [EM_OP_ISNAN] = "isnan", [EM_OP_ISINF] = "isinf"};
    if ((unsigned)op >= EM_OP_COUNT) return NULL;
    return single ? f32[op] : f64[op];
}
