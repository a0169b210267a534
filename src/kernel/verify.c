/* verify.c — the IR verifier: every rule of ember/kernel.h, checked without trusting any id. Each
 * problem is reported as "kernel NAME: inst N `TEXT`: WHAT" so that a builder bug points straight
 * at the instruction. Used before every compilation and after every pass in debug runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/ir_internal.h"

typedef struct checker {
    const em_ir_kernel *k;
    em_strbuf msg;       /* collected messages */
    unsigned errors;     /* count so far */
    unsigned max_errors; /* stop collecting after this many */
    uint8_t *defined;    /* per value: 1 while a temporary is in scope */
    uint8_t *ever;       /* per value: 1 once a temporary was defined */
    uint8_t *inst_seen;  /* per instruction: reached from the body */
    uint8_t *block_seen; /* per block: reached from the body */
    uint32_t *scope;     /* stack of temporaries defined, popped when a block ends */
    size_t scope_len;
    unsigned loop_depth; /* enclosing RANGE/LOOP count */
    uint32_t cur;        /* instruction being checked */
} checker;

static void fail(checker *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(checker *c, const char *fmt, ...)
{
    c->errors++;
    if (c->errors > c->max_errors) return;
    if (c->msg.len) em_sb_append(&c->msg, "\n");
    em_sb_printf(&c->msg, "kernel %s: ", c->k->name);
    if (c->cur != UINT32_MAX) {
        char *text = em_ir_print_inst(c->k, c->cur);
        em_sb_printf(&c->msg, "inst %u `%s`: ", c->cur, text ? text : "?");
        free(text);
    }
    va_list ap;
    va_start(ap, fmt);
    em_sb_vprintf(&c->msg, fmt, ap);
    va_end(ap);
}

static bool type_ok(em_type t) { return t.scalar < EM_SCALAR_COUNT && t.lanes >= 1 && t.lanes <= EM_MAX_LANES; }

static void type_str(char *buf, size_t n, em_type t)
{
    const char *s = em_scalar_name((em_scalar)t.scalar);
    if (t.lanes == 1)
        snprintf(buf, n, "%s", s ? s : "?");
    else
        snprintf(buf, n, "%sx%u", s ? s : "?", t.lanes);
}

static const em_ir_value *val(checker *c, em_ir_val v, const char *role)
{
    const em_ir_value *x = em_ir_value_at(c->k, v);
    if (!x) {
        fail(c, "%s %%?%u is not a value of this kernel", role, v);
        return NULL;
    }
    if (x->kind == EM_VAL_TEMP && !c->defined[v]) {
        fail(c, "%s %%%u is used outside the scope of its definition", role, v);
        return NULL;
    }
    if (x->kind == EM_VAL_MATRIX) return x; /* only matrix ops accept these; they check roles */
    if (!type_ok(x->type)) {
        fail(c, "%s %%%u has an invalid type", role, v);
        return NULL;
    }
    return x;
}

/* An operand that must be an ordinary value (not a matrix fragment). */
static const em_ir_value *operand(checker *c, em_ir_val v, const char *role)
{
    const em_ir_value *x = val(c, v, role);
    if (x && x->kind == EM_VAL_MATRIX) {
        fail(c, "%s %%%u is a matrix fragment; only matrix ops take fragments", role, v);
        return NULL;
    }
    return x;
}

static bool index_ok(checker *c, em_ir_val v, const char *role)
{
    const em_ir_value *x = operand(c, v, role);
    if (!x) return false;
    if (!em_scalar_is_int((em_scalar)x->type.scalar) || x->type.lanes != 1) {
        fail(c, "%s must be an integer scalar", role);
        return false;
    }
    return true;
}

static const em_ir_memory *memory(checker *c, em_ir_mem m)
{
    const em_ir_memory *x = em_ir_mem_at(c->k, m);
    if (!x) fail(c, "memory @?%u is not memory of this kernel", m);
    return x;
}

/* The result type must equal `want`. */
static void expect_dst(checker *c, const em_ir_inst *in, em_type want)
{
    const em_ir_value *d = em_ir_value_at(c->k, in->dst);
    if (!d || !type_ok(want)) return;
    if (!em_type_eq(d->type, want)) {
        char a[32], b[32];
        type_str(a, sizeof a, d->type);
        type_str(b, sizeof b, want);
        fail(c, "result has type %s but the operation produces %s", a, b);
    }
}

static bool same_scalar_broadcast(checker *c, const em_ir_value *a, const em_ir_value *b, em_type *out)
{
    if (a->type.scalar != b->type.scalar) {
        char x[32], y[32];
        type_str(x, sizeof x, a->type);
        type_str(y, sizeof y, b->type);
        fail(c, "operand types differ: %s and %s", x, y);
        return false;
    }
    if (a->type.lanes != b->type.lanes && a->type.lanes != 1 && b->type.lanes != 1) {
        fail(c, "line widths differ: %u and %u", a->type.lanes, b->type.lanes);
        return false;
    }
    *out = a->type;
    if (b->type.lanes > out->lanes) out->lanes = b->type.lanes;
    return true;
}

static void check_binary(checker *c, const em_ir_inst *in, bool compare)
{
    const em_ir_value *a = operand(c, in->args[0], "operand a");
    const em_ir_value *b = operand(c, in->args[1], "operand b");
    em_type t;
    if (!a || !b || !same_scalar_broadcast(c, a, b, &t)) return;
    em_scalar s = (em_scalar)t.scalar;
    bool is_bool = s == EM_BOOL, is_int = em_scalar_is_int(s), is_float = em_scalar_is_float(s);
    switch (in->op) {
    case EM_OP_POW:
        if (!is_float) fail(c, "pow needs floats, not %s", em_scalar_name(s));
        break;
    case EM_OP_AND:
    case EM_OP_OR:
    case EM_OP_XOR:
        if (!is_int && !is_bool) fail(c, "bitwise ops need integers or bool, not %s", em_scalar_name(s));
        break;
    case EM_OP_SHL:
    case EM_OP_SHR:
        if (!is_int) fail(c, "shifts need integers, not %s", em_scalar_name(s));
        break;
    case EM_OP_EQ:
    case EM_OP_NE:
        break;
    default:
        if (is_bool) fail(c, "%s is not defined on bool", em_ir_op_name((em_ir_op)in->op));
        break;
    }
    if (compare) t.scalar = EM_BOOL;
    expect_dst(c, in, t);
}

static void check_unary(checker *c, const em_ir_inst *in)
{
    const em_ir_value *a = operand(c, in->args[0], "operand");
    if (!a) return;
    em_type t = a->type;
    em_scalar s = (em_scalar)t.scalar;
    switch (in->op) {
    case EM_OP_NOT:
        if (!em_scalar_is_int(s) && s != EM_BOOL) fail(c, "not needs integers or bool");
        break;
    case EM_OP_NEG:
    case EM_OP_ABS:
        if (s == EM_BOOL) fail(c, "%s is not defined on bool", em_ir_op_name((em_ir_op)in->op));
        break;
    case EM_OP_POPCOUNT:
    case EM_OP_CLZ:
    case EM_OP_CTZ:
        if (!em_scalar_is_int(s)) fail(c, "bit counts need integers, not %s", em_scalar_name(s));
        t.scalar = EM_U32;
        break;
    case EM_OP_ISNAN:
    case EM_OP_ISINF:
        if (!em_scalar_is_float(s)) fail(c, "%s needs floats", em_ir_op_name((em_ir_op)in->op));
        t.scalar = EM_BOOL;
        break;
    default:
        if (!em_scalar_is_float(s))
            fail(c, "%s needs floats, not %s", em_ir_op_name((em_ir_op)in->op), em_scalar_name(s));
        break;
    }
    expect_dst(c, in, t);
}

static void check_ternary(checker *c, const em_ir_inst *in)
{
    const em_ir_value *a = operand(c, in->args[0], "operand a");
    const em_ir_value *b = operand(c, in->args[1], "operand b");
    const em_ir_value *x = operand(c, in->args[2], "operand c");
    if (!a || !b || !x) return;
    em_type t;
    if (in->op == EM_OP_SELECT) {
        if (a->type.scalar != EM_BOOL) {
            fail(c, "select's condition must be bool");
            return;
        }
        if (!same_scalar_broadcast(c, b, x, &t)) return;
        if (a->type.lanes != 1 && a->type.lanes != t.lanes && t.lanes != 1) {
            fail(c, "select's condition has %u lanes but the values have %u", a->type.lanes, t.lanes);
            return;
        }
        if (a->type.lanes > t.lanes) t.lanes = a->type.lanes;
    } else {
        em_type t2;
        if (!same_scalar_broadcast(c, a, b, &t) || !same_scalar_broadcast(c, b, x, &t2)) return;
        if (t2.lanes > t.lanes) t.lanes = t2.lanes;
        if (in->op == EM_OP_FMA && !em_scalar_is_float((em_scalar)t.scalar)) fail(c, "fma needs floats");
        if (in->op == EM_OP_CLAMP && t.scalar == EM_BOOL) fail(c, "clamp is not defined on bool");
    }
    expect_dst(c, in, t);
}

static void check_convert(checker *c, const em_ir_inst *in)
{
    const em_ir_value *a = operand(c, in->args[0], "operand");
    const em_ir_value *d = em_ir_value_at(c->k, in->dst);
    if (!a || !d) return;
    if (in->op == EM_OP_CAST) {
        if (a->type.lanes != 1 && a->type.lanes != d->type.lanes)
            fail(c, "cast changes the line width from %u to %u", a->type.lanes, d->type.lanes);
    } else {
        size_t from = em_scalar_size((em_scalar)a->type.scalar) * a->type.lanes;
        size_t to = em_scalar_size((em_scalar)d->type.scalar) * d->type.lanes;
        if (a->type.scalar == EM_BOOL || d->type.scalar == EM_BOOL)
            fail(c, "bitcast to or from bool");
        else if (from != to)
            fail(c, "bitcast between %zu and %zu bytes", from, to);
    }
}

static void check_line(checker *c, const em_ir_inst *in)
{
    const em_ir_value *a = operand(c, in->args[0], "line");
    bool idx = index_ok(c, in->args[1], "lane index");
    if (!a || !idx) return;
    const em_ir_value *lane = em_ir_value_at(c->k, in->args[1]);
    if (lane->kind == EM_VAL_CONST && lane->c.u >= a->type.lanes)
        fail(c, "lane %llu is out of range for a line of %u", (unsigned long long)lane->c.u, a->type.lanes);
    em_type t = a->type;
    if (in->op == EM_OP_EXTRACT) {
        t.lanes = 1;
    } else {
        const em_ir_value *v = operand(c, in->args[2], "lane value");
        if (v && (v->type.scalar != a->type.scalar || v->type.lanes != 1))
            fail(c, "inserted value must be a scalar of the line's kind");
    }
    expect_dst(c, in, t);
}

/* COPY_ASYNC: shared destination, global readable source of the same scalar element type, u32
 * count constant with 4, 8 or 16 bytes in all, optional bool condition. */
static void check_copy(checker *c, const em_ir_inst *in)
{
    const em_ir_memory *d = memory(c, in->mem), *s = memory(c, (em_ir_mem)in->imm);
    index_ok(c, in->args[0], "destination index");
    index_ok(c, in->args[1], "source index");
    const em_ir_value *n = operand(c, in->args[2], "count");
    if (in->args[3]) {
        const em_ir_value *v = operand(c, in->args[3], "condition");
        if (v && !em_type_eq(v->type, em_ty(EM_BOOL)))
            fail(c, "the condition must be a bool scalar");
    }
    if (!d || !s || !n) return;
    if (d->space != EM_MEM_SHARED) fail(c, "copy_async writes shared memory");
    if (s->space != EM_MEM_GLOBAL || !(s->access & EM_READ))
        fail(c, "copy_async reads a readable global buffer");
    if (!em_type_eq(d->elem, s->elem) || d->elem.lanes != 1 || d->elem.scalar == EM_BOOL)
        fail(c, "copy_async copies between scalar number memories of one element type");
    if (n->kind != EM_VAL_CONST || !em_type_eq(n->type, em_ty(EM_U32))) {
        fail(c, "the count must be a u32 constant");
        return;
    }
    uint64_t bytes = n->c.u * em_scalar_size((em_scalar)d->elem.scalar);
    if (bytes != 4 && bytes != 8 && bytes != 16)
        fail(c, "copy_async moves 4, 8 or 16 bytes, not %llu", (unsigned long long)bytes);
}

static void check_memory(checker *c, const em_ir_inst *in)
{
    if (in->op == EM_OP_COPY_ASYNC) {
        check_copy(c, in);
        return;
    }
    const em_ir_memory *m = memory(c, in->mem);
    bool idx = index_ok(c, in->args[0], "index");
    if (!m) return;
    if (in->op == EM_OP_LOAD) {
        if (m->space == EM_MEM_GLOBAL && !(m->access & EM_READ)) fail(c, "load from write-only buffer");
        if (idx) expect_dst(c, in, m->elem);
    } else {
        if (m->space == EM_MEM_GLOBAL && !(m->access & EM_WRITE)) fail(c, "store to read-only buffer");
        const em_ir_value *v = operand(c, in->args[1], "stored value");
        if (v && !em_type_eq(v->type, m->elem)) {
            char a[32], b[32];
            type_str(a, sizeof a, v->type);
            type_str(b, sizeof b, m->elem);
            fail(c, "stored value has type %s but the memory holds %s", a, b);
        }
    }
}

static void check_meta(checker *c, const em_ir_inst *in)
{
    const em_ir_memory *m = memory(c, in->mem);
    if (!m) return;
    if (m->space != EM_MEM_GLOBAL) fail(c, "%s is only defined on global buffers", em_ir_op_name((em_ir_op)in->op));
    if (in->op != EM_OP_LEN && (in->imm < 0 || in->imm >= m->rank))
        fail(c, "dimension %d out of range for rank %u", in->imm, m->rank);
    expect_dst(c, in, em_ty(EM_U32));
}

static void check_plane(checker *c, const em_ir_inst *in)
{
    const em_ir_value *a = operand(c, in->args[0], "operand");
    if (!a) return;
    em_type t = a->type;
    switch (in->op) {
    case EM_OP_PLANE_ALL:
    case EM_OP_PLANE_ANY:
    case EM_OP_PLANE_BALLOT:
        if (!em_type_eq(a->type, em_ty(EM_BOOL))) fail(c, "%s needs a bool scalar", em_ir_op_name((em_ir_op)in->op));
        t = in->op == EM_OP_PLANE_BALLOT ? em_ty(EM_U32) : em_ty(EM_BOOL);
        break;
    case EM_OP_PLANE_BROADCAST:
    case EM_OP_PLANE_SHUFFLE:
    case EM_OP_PLANE_SHUFFLE_XOR:
    case EM_OP_PLANE_SHUFFLE_UP:
    case EM_OP_PLANE_SHUFFLE_DOWN:
        index_ok(c, in->args[1], "lane");
        break;
    default:
        if (a->type.scalar == EM_BOOL) fail(c, "%s is not defined on bool", em_ir_op_name((em_ir_op)in->op));
        break;
    }
    expect_dst(c, in, t);
}

static void check_atomic(checker *c, const em_ir_inst *in)
{
    const em_ir_memory *m = memory(c, in->mem);
    index_ok(c, in->args[0], "index");
    if (!m) return;
    if (m->space == EM_MEM_LOCAL) fail(c, "atomics need global or shared memory");
    if (m->space == EM_MEM_GLOBAL && m->access != EM_READ_WRITE && in->op != EM_OP_ATOMIC_LOAD)
        fail(c, "atomic on a buffer that is not read_write");
    if (m->elem.lanes != 1) {
        fail(c, "atomics need scalar memory, not lines");
        return;
    }
    em_scalar s = (em_scalar)m->elem.scalar;
    size_t size = em_scalar_size(s);
    bool is_int = em_scalar_is_int(s) && size >= 4;
    bool ok = true;
    switch (in->op) {
    case EM_OP_ATOMIC_ADD:
    case EM_OP_ATOMIC_SUB:
        ok = is_int || s == EM_F32 || s == EM_F64;
        break;
    case EM_OP_ATOMIC_XCHG:
    case EM_OP_ATOMIC_LOAD:
    case EM_OP_ATOMIC_STORE:
        ok = is_int || s == EM_F32 || s == EM_F64;
        break;
    default:
        ok = is_int;
        break;
    }
    if (!ok) fail(c, "%s is not available on %s memory", em_ir_op_name((em_ir_op)in->op), em_scalar_name(s));
    const em_op_info *info = em_ir_op_info(in->op);
    for (unsigned i = 1; i < info->nargs; i++) {
        const em_ir_value *v = operand(c, in->args[i], "atomic operand");
        if (v && !em_type_eq(v->type, m->elem)) fail(c, "atomic operand %u does not match the memory's type %s", i, em_scalar_name(s));
    }
    if (info->has_dst) expect_dst(c, in, m->elem);
}

static const em_ir_value *fragment(checker *c, em_ir_val v, int role, const char *what)
{
    const em_ir_value *x = val(c, v, what);
    if (!x) return NULL;
    if (x->kind != EM_VAL_MATRIX) {
        fail(c, "%s must be a matrix fragment", what);
        return NULL;
    }
    if (role >= 0 && x->mat_role != role) {
        fail(c, "%s has the wrong role for this operation", what);
        return NULL;
    }
    return x;
}

static void check_matrix(checker *c, const em_ir_inst *in)
{
    if (in->op == EM_OP_MAT_MMA) {
        const em_ir_value *d = fragment(c, in->args[0], EM_MAT_ACC, "D");
        const em_ir_value *a = fragment(c, in->args[1], EM_MAT_A, "A");
        const em_ir_value *b = fragment(c, in->args[2], EM_MAT_B, "B");
        const em_ir_value *x = fragment(c, in->args[3], EM_MAT_ACC, "C");
        if (!d || !a || !b || !x) return;
        const em_ir_value *all[4] = {d, a, b, x};
        for (int i = 1; i < 4; i++)
            if (all[i]->mat_m != d->mat_m || all[i]->mat_n != d->mat_n || all[i]->mat_k != d->mat_k)
                fail(c, "fragments of one mma must share the m, n, k shape");
        if (a->type.scalar != b->type.scalar) fail(c, "A and B must have the same element type");
        if (d->type.scalar != x->type.scalar) fail(c, "C and D must have the same element type");
        return;
    }
    if (in->op == EM_OP_MAT_FILL) {
        const em_ir_value *f = fragment(c, in->args[0], -1, "fragment");
        const em_ir_value *v = operand(c, in->args[1], "fill value");
        if (f && v && (v->type.scalar != f->type.scalar || v->type.lanes != 1))
            fail(c, "fill value must be a scalar of the fragment's type");
        return;
    }
    const em_ir_memory *m = memory(c, in->mem);
    unsigned off = in->op == EM_OP_MAT_LOAD ? 1 : 0;
    const em_ir_value *f = fragment(c, in->args[in->op == EM_OP_MAT_LOAD ? 0 : 2], -1, "fragment");
    index_ok(c, in->args[off], "offset");
    index_ok(c, in->args[off + 1], "stride");
    if (!m || !f) return;
    if (m->space == EM_MEM_LOCAL) fail(c, "matrix memory must be global or shared");
    if (m->elem.lanes != 1 || m->elem.scalar != f->type.scalar)
        fail(c, "memory element type does not match the fragment's");
    if (in->op == EM_OP_MAT_LOAD && m->space == EM_MEM_GLOBAL && !(m->access & EM_READ))
        fail(c, "matrix load from write-only buffer");
    if (in->op == EM_OP_MAT_STORE && f->mat_role != EM_MAT_ACC) fail(c, "only accumulators can be stored");
    if (in->op == EM_OP_MAT_STORE && m->space == EM_MEM_GLOBAL && !(m->access & EM_WRITE))
        fail(c, "matrix store to read-only buffer");
}

static void check_block(checker *c, uint32_t b, unsigned depth);

static void check_control(checker *c, const em_ir_inst *in, unsigned depth)
{
    switch (in->op) {
    case EM_OP_IF: {
        const em_ir_value *cond = operand(c, in->args[0], "condition");
        if (cond && !em_type_eq(cond->type, em_ty(EM_BOOL))) fail(c, "if condition must be a bool scalar");
        break;
    }
    case EM_OP_RANGE: {
        const em_ir_value *v = em_ir_value_at(c->k, in->args[0]);
        if (!v || v->kind != EM_VAL_VAR || !em_scalar_is_int((em_scalar)v->type.scalar) || v->type.lanes != 1) {
            fail(c, "range needs an integer scalar variable (em_ir_var) as its counter");
            break;
        }
        static const char *const roles[] = {"", "start", "end", "step"};
        for (int i = 1; i < 4; i++) {
            const em_ir_value *x = operand(c, in->args[i], roles[i]);
            if (x && !em_type_eq(x->type, v->type)) fail(c, "range %s must have the counter's type", roles[i]);
        }
        const em_ir_value *step = em_ir_value_at(c->k, in->args[3]);
        if (step && step->kind == EM_VAL_CONST && step->c.i <= 0) fail(c, "range step must be positive");
        break;
    }
    case EM_OP_BREAK:
    case EM_OP_CONTINUE:
        if (!c->loop_depth) fail(c, "%s outside a loop", em_ir_op_name((em_ir_op)in->op));
        return;
    default:
        break;
    }
    if (in->op == EM_OP_IF || in->op == EM_OP_RANGE || in->op == EM_OP_LOOP) {
        bool loop = in->op != EM_OP_IF;
        uint32_t self = c->cur;
        if (!in->blocks[0]) fail(c, "%s without a body", em_ir_op_name((em_ir_op)in->op));
        c->loop_depth += loop;
        for (int i = 0; i < 2; i++) {
            if (!in->blocks[i]) continue;
            if (i == 1 && in->op != EM_OP_IF) {
                fail(c, "only if has an else block");
                continue;
            }
            check_block(c, in->blocks[i], depth + 1);
            c->cur = self;
        }
        c->loop_depth -= loop;
    }
}

static void check_dst(checker *c, const em_ir_inst *in, const em_op_info *info)
{
    bool optional = in->op == EM_OP_INTRINSIC;
    if (!in->dst) {
        if (info->has_dst && !optional) fail(c, "%s needs a result value", info->name);
        return;
    }
    if (!info->has_dst && !optional) {
        fail(c, "%s produces no value but has a result", info->name);
        return;
    }
    const em_ir_value *d = em_ir_value_at(c->k, in->dst);
    if (!d) {
        fail(c, "result %%?%u is not a value of this kernel", in->dst);
        return;
    }
    if (d->kind == EM_VAL_CONST || d->kind == EM_VAL_PARAM || d->kind == EM_VAL_MATRIX) {
        fail(c, "result %%%u is a %s and cannot be written", in->dst,
             d->kind == EM_VAL_CONST ? "constant" : d->kind == EM_VAL_PARAM ? "parameter" : "matrix fragment");
        return;
    }
    if (!type_ok(d->type)) fail(c, "result %%%u has an invalid type", in->dst);
    if (in->op == EM_OP_ASSIGN && d->kind != EM_VAL_VAR) fail(c, "assign writes a variable, not a temporary");
}

static void define(checker *c, const em_ir_inst *in)
{
    const em_ir_value *d = em_ir_value_at(c->k, in->dst);
    if (!d || d->kind != EM_VAL_TEMP) return;
    if (c->ever[in->dst]) {
        fail(c, "temporary %%%u is defined twice", in->dst);
        return;
    }
    c->ever[in->dst] = c->defined[in->dst] = 1;
    c->scope[c->scope_len++] = in->dst;
}

static void check_inst(checker *c, uint32_t idx, unsigned depth)
{
    c->cur = idx;
    const em_ir_inst *in = em_ir_inst_at(c->k, idx);
    if (!in) {
        fail(c, "block refers to instruction %u, which does not exist", idx);
        return;
    }
    if (c->inst_seen[idx]) {
        fail(c, "instruction appears in more than one place");
        return;
    }
    c->inst_seen[idx] = 1;
    const em_op_info *info = em_ir_op_info(in->op);
    if (!info) {
        fail(c, "unknown opcode %u", in->op);
        return;
    }
    check_dst(c, in, info);
    switch ((em_op_class)info->cls) {
    case EM_OPC_ASSIGN: {
        const em_ir_value *a = operand(c, in->args[0], "assigned value");
        if (a) expect_dst(c, in, a->type);
        break;
    }
    case EM_OPC_BINARY: check_binary(c, in, false); break;
    case EM_OPC_COMPARE: check_binary(c, in, true); break;
    case EM_OPC_UNARY: check_unary(c, in); break;
    case EM_OPC_TERNARY: check_ternary(c, in); break;
    case EM_OPC_CONVERT: check_convert(c, in); break;
    case EM_OPC_LINE: check_line(c, in); break;
    case EM_OPC_MEMORY: check_memory(c, in); break;
    case EM_OPC_META: check_meta(c, in); break;
    case EM_OPC_BUILTIN:
        if (in->imm < 0 || in->imm >= EM_BUILTIN_COUNT) fail(c, "unknown built-in position %d", in->imm);
        expect_dst(c, in, em_ty(EM_U32));
        break;
    case EM_OPC_SYNC:
        if (in->op == EM_OP_COPY_WAIT && in->imm < 0) fail(c, "copy_wait needs a count >= 0");
        break;
    case EM_OPC_PLANE: check_plane(c, in); break;
    case EM_OPC_ATOMIC: check_atomic(c, in); break;
    case EM_OPC_MATRIX: check_matrix(c, in); break;
    case EM_OPC_CONTROL: check_control(c, in, depth); break;
    case EM_OPC_DEBUG:
        if (in->imm < 0 || in->imm > EM_IR_MAX_ARGS) fail(c, "%s takes at most 4 values", info->name);
        for (int i = 0; i < in->imm && i < EM_IR_MAX_ARGS; i++) operand(c, in->args[i], "argument");
        if (!in->str || !*in->str) {
            if (in->op == EM_OP_INTRINSIC) fail(c, "intrinsic without a name");
        }
        /* an intrinsic may name one memory it works on (the warpgroup MMA's accumulator, the
         * shared array of a descriptor) */
        if (in->mem && in->op == EM_OP_INTRINSIC) memory(c, in->mem);
        if (in->mem && in->op != EM_OP_INTRINSIC) fail(c, "print names no memory");
        break;
    }
    c->cur = idx;
    define(c, in);
}

static void check_block(checker *c, uint32_t b, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(c->k, b);
    if (!blk) {
        fail(c, "block %u does not exist", b);
        return;
    }
    if (c->block_seen[b]) {
        fail(c, "block %u is the body of more than one construct", b);
        return;
    }
    c->block_seen[b] = 1;
    if (depth > EM_IR_MAX_DEPTH) {
        fail(c, "control flow nested deeper than %d levels", EM_IR_MAX_DEPTH);
        return;
    }
    size_t mark = c->scope_len;
    for (size_t i = 0; i < blk->len && c->errors <= c->max_errors; i++) check_inst(c, blk->items[i], depth);
    while (c->scope_len > mark) c->defined[c->scope[--c->scope_len]] = 0;
}

static void check_decls(checker *c)
{
    const em_ir_kernel *k = c->k;
    c->cur = UINT32_MAX;
    if (k->build_error[0]) fail(c, "builder misuse: %s", k->build_error);
    if (k->depth) {
        c->cur = k->open[k->depth - 1].inst;
        fail(c, "never closed with em_ir_end");
        c->cur = UINT32_MAX;
    }
    for (size_t i = 0; i < k->params.len; i++) {
        const em_ir_param *p = &k->params.items[i];
        if (p->kind == EM_PARAM_BUFFER) {
            const em_ir_memory *m = em_ir_mem_at(k, p->id);
            if (!m || m->space != EM_MEM_GLOBAL) fail(c, "parameter %zu is not a global buffer", i);
        } else {
            const em_ir_value *v = em_ir_value_at(k, p->id);
            if (!v || v->kind != EM_VAL_PARAM || v->type.lanes != 1)
                fail(c, "parameter %zu is not a scalar parameter", i);
        }
    }
    for (size_t m = 1; m < k->mems.len; m++) {
        const em_ir_memory *x = &k->mems.items[m];
        const char *name = x->name ? x->name : "?";
        if (!type_ok(x->elem))
            fail(c, "memory @%zu (%s) has an invalid element type", m, name);
        if (x->space > EM_MEM_LOCAL) fail(c, "memory @%zu (%s) has an invalid space", m, name);
        if (x->space != EM_MEM_GLOBAL && x->length == 0)
            fail(c, "shared/local memory @%zu (%s) has length 0", m, name);
        if (x->space == EM_MEM_GLOBAL && (x->access < 1 || x->access > 3))
            fail(c, "buffer @%zu (%s) has an invalid access mode", m, name);
        if (x->rank > EM_MAX_RANK) fail(c, "buffer @%zu (%s) has rank %u > %d", m, name, x->rank, EM_MAX_RANK);
    }
    for (size_t v = 1; v < k->values.len; v++) {
        const em_ir_value *x = &k->values.items[v];
        if (x->kind == EM_VAL_MATRIX) {
            if (!em_scalar_is_float((em_scalar)x->type.scalar) && !em_scalar_is_int((em_scalar)x->type.scalar))
                fail(c, "matrix %%%zu has an invalid element type", v);
            if (!x->mat_m || !x->mat_n || !x->mat_k || x->mat_role > EM_MAT_ACC)
                fail(c, "matrix %%%zu has an invalid shape or role", v);
        } else if (x->kind > EM_VAL_MATRIX) {
            fail(c, "value %%%zu has an invalid kind", v);
        } else if (!type_ok(x->type)) {
            fail(c, "value %%%zu has an invalid type", v);
        }
    }
}

em_status em_ir_verify(const em_ir_kernel *k, unsigned max_errors)
{
    if (!k) return em_set_error(EM_ERR_INVALID, "em_ir_verify: no kernel");
    if (k->oom) return em_set_error(EM_ERR_NOMEM, "kernel %s: out of memory while building", k->name);
    checker c = {.k = k, .max_errors = max_errors ? max_errors : 8, .cur = UINT32_MAX};
    em_sb_init(&c.msg);
    size_t nv = k->values.len, ni = k->insts.len + 1, nb = k->blocks.len;
    c.defined = calloc(nv, 1);
    c.ever = calloc(nv, 1);
    c.inst_seen = calloc(ni, 1);
    c.block_seen = calloc(nb, 1);
    c.scope = calloc(nv, sizeof(uint32_t));
    em_status st = EM_OK;
    if (!c.defined || !c.ever || !c.inst_seen || !c.block_seen || !c.scope) {
        st = em_set_error(EM_ERR_NOMEM, "out of memory verifying kernel %s", k->name);
    } else {
        check_decls(&c);
        if (c.errors <= c.max_errors) check_block(&c, 1, 0);
        if (c.errors) {
            if (c.errors > c.max_errors)
                em_sb_printf(&c.msg, "\n(%u more problems not shown)", c.errors - c.max_errors);
            st = em_set_error(EM_ERR_INVALID, "%s", c.msg.data);
        }
    }
    free(c.defined);
    free(c.ever);
    free(c.inst_seen);
    free(c.block_seen);
    free(c.scope);
    em_sb_free(&c.msg);
    return st;
}
