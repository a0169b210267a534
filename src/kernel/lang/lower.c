/* lower.c — statements during lowering, and the entry point em_lang_lower: kernel parameters
 * (comptime values, buffers, scalars), declarations (variables, constants, shared and local
 * arrays, matrix fragments), assignments to places (variables, memory elements, lanes), structured
 * control flow (comptime if is resolved; comptime for is unrolled; for becomes an IR range; while
 * an IR loop), and returns from inlined helpers (a result variable and a "done" flag that guards
 * the statements after a return). The finished kernel is verified before it is handed out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/lower.h"

static void lower_stmt(lower *L, const ast_stmt *s);

static bool is_ir_var(lower *L, em_ir_val v)
{
    const em_ir_value *val = em_ir_value_at(L->k, v);
    return val && val->kind == EM_VAL_VAR;
}

lv em_lang_bind_local(lower *L, lv value, em_type ty, bool assigned, const char *name)
{
    if (value.kind == V_ERR) return value;
    /* a value that is itself a variable is copied, so that later writes to it do not show here */
    if (!assigned && !(value.kind == V_RT && is_ir_var(L, value.v))) {
        value.is_var = false;
        return value;
    }
    em_ir_val var = em_ir_var(L->k, ty, name);
    em_ir_assign(L->k, var, em_lang_materialize(L, &value));
    lv x = em_lang_lv_rt(ty, var);
    x.is_var = assigned;
    return x;
}

/* ---- places ------------------------------------------------------------------------------------
 */

typedef enum place_kind { P_VAR, P_MEM, P_VAR_LANE, P_MEM_LANE } place_kind;

typedef struct place {
    uint8_t kind;    /* a place_kind */
    em_type ty;      /* type of what is written */
    em_type whole;   /* lanes places: the line's type */
    em_ir_val var;   /* P_VAR, P_VAR_LANE */
    em_ir_mem mem;   /* P_MEM, P_MEM_LANE */
    em_ir_val index; /* P_MEM, P_MEM_LANE */
    em_ir_val lane;  /* lane places */
} place;

static bool lower_place(lower *L, const ast_expr *e, place *p)
{
    if (e->kind == EX_NAME) {
        lv x = e->slot >= 0 && (uint32_t)e->slot < L->fr->fn->nslots ? L->fr->slots[e->slot]
                                                                     : em_lang_lv_err();
        if (x.kind == V_ERR) return false;
        if (x.kind == V_RT && x.is_var) {
            *p = (place){.kind = P_VAR, .ty = x.ty, .var = x.v};
            return true;
        }
        em_lang_lerr(L, e->pos, NULL, "cannot assign to '%s'", e->name);
        return false;
    }
    if (e->kind != EX_INDEX) {
        em_lang_lerr(L, e->pos, NULL, "this expression cannot be assigned to");
        return false;
    }
    const ast_expr *base = e->a;
    if (base->kind == EX_NAME && base->slot >= 0 && (uint32_t)base->slot < L->fr->fn->nslots &&
        L->fr->slots[base->slot].kind == V_MEM) {
        lv m = L->fr->slots[base->slot];
        if (!m.writable) {
            em_lang_lerr(L, base->pos, NULL, "cannot write to read-only tensor '%s'", base->name);
            return false;
        }
        lv ix = em_lang_to_index(L, em_lang_lower_expr(L, e->b, NULL), e->b->pos, "an index");
        if (ix.kind == V_ERR) return false;
        if (ix.kind == V_CONST && m.space != EM_MEM_GLOBAL && ix.c.u >= m.length) {
            em_lang_lerr(L, e->b->pos, NULL,
                         "index %llu is out of bounds for %s '%s' of %u elements",
                         (unsigned long long)ix.c.u,
                         m.space == EM_MEM_SHARED ? "shared array" : "local array",
                         m.name ? m.name : "?", m.length);
            return false;
        }
        *p = (place){.kind = P_MEM, .ty = m.ty, .mem = m.mem, .index = em_lang_materialize(L, &ix)};
        return true;
    }
    place inner;
    if (!lower_place(L, base, &inner)) return false;
    char t[48];
    em_lang_type_str(inner.ty, t, sizeof(t));
    if (inner.kind != P_VAR && inner.kind != P_MEM) {
        em_lang_lerr(L, e->op_pos, "only tensors, arrays and lines can be indexed",
                     "cannot index '%s'", t);
        return false;
    }
    lv lane = em_lang_to_index(L, em_lang_lower_expr(L, e->b, NULL), e->b->pos, "a lane index");
    if (lane.kind == V_ERR) return false;
    if (lane.kind == V_CONST && lane.c.u >= inner.ty.lanes) {
        em_lang_lerr(L, e->b->pos, NULL, "lane %llu is out of range for '%s' (%u lane%s)",
                     (unsigned long long)lane.c.u, t, inner.ty.lanes,
                     inner.ty.lanes == 1 ? "" : "s");
        return false;
    }
    *p = inner;
    if (inner.ty.lanes == 1) return true; /* lane 0 of a scalar is the scalar */
    p->kind = inner.kind == P_VAR ? P_VAR_LANE : P_MEM_LANE;
    p->whole = inner.ty;
    p->ty = em_ty((em_scalar)inner.ty.scalar);
    p->lane = em_lang_materialize(L, &lane);
    return true;
}

static lv read_place(lower *L, const place *p)
{
    em_ir_kernel *k = L->k;
    switch (p->kind) {
    case P_VAR:
        return em_lang_lv_rt(p->ty, p->var);
    case P_MEM:
        return em_lang_lv_rt(p->ty, em_ir_load(k, p->mem, p->index));
    case P_VAR_LANE:
        return em_lang_lv_rt(p->ty, em_ir_extract(k, p->var, p->lane));
    default:
        return em_lang_lv_rt(p->ty, em_ir_extract(k, em_ir_load(k, p->mem, p->index), p->lane));
    }
}

static void write_place(lower *L, const place *p, em_ir_val v)
{
    em_ir_kernel *k = L->k;
    switch (p->kind) {
    case P_VAR:
        em_ir_assign(k, p->var, v);
        break;
    case P_MEM:
        em_ir_store(k, p->mem, p->index, v);
        break;
    case P_VAR_LANE:
        em_ir_assign(k, p->var, em_ir_insert(k, p->var, p->lane, v));
        break;
    default:
        em_ir_store(k, p->mem, p->index,
                    em_ir_insert(k, em_ir_load(k, p->mem, p->index), p->lane, v));
    }
}

static int compound_op(int op)
{
    switch (op) {
    case T_PLUSEQ:
        return T_PLUS;
    case T_MINUSEQ:
        return T_MINUS;
    case T_STAREQ:
        return T_STAR;
    case T_SLASHEQ:
        return T_SLASH;
    case T_PERCENTEQ:
        return T_PERCENT;
    case T_AMPEQ:
        return T_AMP;
    case T_PIPEEQ:
        return T_PIPE;
    case T_CARETEQ:
        return T_CARET;
    case T_SHLEQ:
        return T_SHL;
    case T_SHREQ:
        return T_SHR;
    default:
        return 0;
    }
}

static void lower_assign(lower *L, const ast_stmt *s)
{
    place p;
    if (!lower_place(L, s->lhs, &p)) return;
    lv rhs = em_lang_lower_expr(L, s->init, &p.ty);
    if (s->op != T_ASSIGN)
        rhs = em_lang_binop(L, compound_op(s->op), read_place(L, &p), rhs, s->name_pos);
    lv v = em_lang_coerce(L, rhs, p.ty, s->op == T_ASSIGN ? s->init->pos : s->name_pos,
                          "an assignment");
    if (v.kind != V_ERR) write_place(L, &p, em_lang_materialize(L, &v));
}

/* ---- declarations
 * --------------------------------------------------------------------------------- */

static void lower_array(lower *L, const ast_stmt *s)
{
    em_type elem;
    if (!em_lang_lower_type(L, s->type, &elem)) return;
    lv n = em_lang_lower_expr(L, s->array_len, NULL);
    int64_t len;
    if (!em_lang_comptime_int(L, &n, s->array_len->pos, "an array length", &len)) return;
    if (len < 1 || len > (int64_t)LANG_MAX_ARRAY) {
        em_lang_lerr(L, s->array_len->pos, NULL,
                     "an array length must be between 1 and %u, got %lld", LANG_MAX_ARRAY,
                     (long long)len);
        return;
    }
    bool shared = s->storage == STORE_SHARED;
    uint64_t bytes = (uint64_t)len * em_scalar_size((em_scalar)elem.scalar) * elem.lanes;
    const em_caps *caps = L->b->caps;
    if (shared && caps && caps->max_shared && bytes > caps->max_shared) {
        em_lang_lerr(L, s->array_len->pos, NULL,
                     "shared array '%s' needs %llu bytes, but the target has %llu", s->name,
                     (unsigned long long)bytes, (unsigned long long)caps->max_shared);
        return;
    }
    em_ir_mem m = shared ? em_ir_shared(L->k, s->name, elem, (uint32_t)len)
                         : em_ir_local(L->k, s->name, elem, (uint32_t)len);
    L->fr->slots[s->slot] = (lv){.kind = V_MEM,
                                 .space = shared ? EM_MEM_SHARED : EM_MEM_LOCAL,
                                 .writable = true,
                                 .ty = elem,
                                 .mem = m,
                                 .length = (uint32_t)len,
                                 .name = s->name};
}

static void lower_decl(lower *L, const ast_stmt *s)
{
    if (s->array_len) {
        lower_array(L, s);
        return;
    }
    bool is_auto = s->type->kind == TY_AUTO;
    em_type ty = {0, 0};
    if (!is_auto && !em_lang_lower_type(L, s->type, &ty)) return;
    lv x;
    if (s->init) {
        x = em_lang_lower_expr(L, s->init, is_auto ? NULL : &ty);
        if (x.kind == V_ERR) return;
        if (!em_lang_need_value(L, &x, s->init->pos, "an initial value")) return;
        if (s->is_comptime && !em_lang_lv_is_comptime(&x)) {
            em_lang_lerr(L, s->init->pos, NULL,
                         "the value of comptime constant '%s' must be known at compile time",
                         s->name);
            return;
        }
        if (is_auto) {
            if (s->is_comptime &&
                em_lang_lv_is_untyped(&x)) { /* comptime auto keeps an untyped literal */
                L->fr->slots[s->slot] = x;
                return;
            }
            x = em_lang_lv_default(L, x, s->init->pos);
            ty = x.ty;
        } else {
            x = em_lang_coerce(L, x, ty, s->init->pos, "an initialization");
        }
        if (x.kind == V_ERR) return;
    } else {
        x = em_lang_coerce(L, em_lang_lv_const_int((em_scalar)ty.scalar, 0), ty, s->name_pos,
                           "an initialization");
    }
    if (s->is_comptime || (s->is_const && x.kind == V_CONST)) {
        x.name = s->name;
        L->fr->slots[s->slot] = x;
        return;
    }
    if (x.kind == V_CONST)
        x = em_lang_lv_rt(ty, em_lang_materialize(L, &x)); /* a variable is never comptime */
    L->fr->slots[s->slot] = em_lang_bind_local(L, x, ty, s->assigned || !s->init, s->name);
    L->fr->slots[s->slot].is_var = s->assigned;
}

static void lower_matrix(lower *L, const ast_stmt *s)
{
    em_type elem;
    if (!em_lang_lower_type(L, s->type, &elem)) return;
    if (elem.lanes != 1 || elem.scalar == EM_BOOL) {
        em_lang_lerr(L, s->type->pos, NULL, "matrix elements must be numbers");
        return;
    }
    int64_t d[3];
    static const char *const names[3] = {"m", "n", "k"};
    for (int i = 0; i < 3; i++) {
        lv x = em_lang_lower_expr(L, s->dims[i], NULL);
        char what[48];
        snprintf(what, sizeof(what), "the matrix size %s", names[i]);
        if (!em_lang_comptime_int(L, &x, s->dims[i]->pos, what, &d[i])) return;
        if (d[i] < 1 || d[i] > 256) {
            em_lang_lerr(L, s->dims[i]->pos, NULL,
                         "the matrix size %s must be between 1 and 256, got %lld", names[i],
                         (long long)d[i]);
            return;
        }
    }
    em_mat_layout layout = (em_mat_layout)s->layout;
    if (s->layout_expr) {
        lv x = em_lang_lower_expr(L, s->layout_expr, NULL);
        if (x.kind == V_ERR) return;
        if (x.kind != V_LAYOUT) {
            em_lang_lerr(L, s->layout_expr->pos,
                         "write row_major, col_major, or COND ? col_major : row_major",
                         "the matrix layout must be a layout known when compiling");
            return;
        }
        layout = (em_mat_layout)x.c.i;
    }
    em_ir_val v = em_ir_matrix(L->k, (em_mat_role)s->role, (em_scalar)elem.scalar, (unsigned)d[0],
                               (unsigned)d[1], (unsigned)d[2], layout, s->name);
    L->fr->slots[s->slot] = (lv){.kind = V_MATRIX, .v = v, .ty = elem, .name = s->name};
}

/* ---- control flow
 * ---------------------------------------------------------------------------------- */

static void lower_if(lower *L, const ast_stmt *s)
{
    lv c = em_lang_lower_expr(L, s->cond, NULL);
    if (s->is_comptime) {
        bool v;
        if (!em_lang_comptime_bool(L, &c, s->cond->pos, "the condition of a comptime if", &v))
            return;
        if (v)
            lower_stmt(L, s->body);
        else if (s->els)
            lower_stmt(L, s->els);
        return;
    }
    if (!em_lang_need_cond(L, &c, s->cond->pos, "an if condition")) return;
    if (!em_lang_ir_open(L, s->pos)) return;
    em_ir_if_begin(L->k, em_lang_materialize(L, &c));
    lower_stmt(L, s->body);
    if (s->els) {
        em_ir_else(L->k);
        lower_stmt(L, s->els);
    }
    em_lang_ir_close(L);
}

/* Lowers the bounds of a range loop and picks the loop variable's type. */
static bool range_bounds(lower *L, const ast_stmt *s, lv b[3], em_type *ty)
{
    b[0] = s->cond ? em_lang_lower_expr(L, s->cond, NULL) : (lv){.kind = V_ULIT_INT};
    b[1] = em_lang_lower_expr(L, s->end, NULL);
    b[2] = s->step ? em_lang_lower_expr(L, s->step, NULL) : (lv){.kind = V_ULIT_INT, .c = {.i = 1}};
    if (b[0].kind == V_ERR || b[1].kind == V_ERR || b[2].kind == V_ERR) return false;
    if (s->type) {
        if (!em_lang_lower_type(L, s->type, ty)) return false;
    } else {
        *ty = em_ty(EM_I32);
        for (int i = 2; i >= 0; i--)
            if (em_lang_lv_is_value(&b[i]) && !em_lang_lv_is_untyped(&b[i])) *ty = b[i].ty;
    }
    if (!em_scalar_is_int((em_scalar)ty->scalar) || ty->lanes != 1) {
        char t[48];
        em_lang_type_str(*ty, t, sizeof(t));
        em_lang_lerr(L, s->type ? s->type->pos : s->name_pos, NULL,
                     "a loop variable must be a scalar integer, got '%s'", t);
        return false;
    }
    static const char *const what[3] = {"the start of a range", "the end of a range",
                                        "the step of a range"};
    const ast_expr *src[3] = {s->cond ? s->cond : s->end, s->end, s->step ? s->step : s->end};
    for (int i = 0; i < 3; i++) {
        b[i] = em_lang_coerce(L, b[i], *ty, src[i]->pos, what[i]);
        if (b[i].kind == V_ERR) return false;
    }
    if (b[2].kind == V_CONST &&
        (em_scalar_is_signed((em_scalar)ty->scalar) ? b[2].c.i <= 0 : b[2].c.u == 0)) {
        em_lang_lerr(L, src[2]->pos, NULL, "the step of a range must be positive");
        return false;
    }
    return true;
}

static void lower_comptime_for(lower *L, const ast_stmt *s, lv b[3], em_type ty)
{
    int64_t v[3];
    static const char *const what[3] = {"the start of a comptime for", "the end of a comptime for",
                                        "the step of a comptime for"};
    const ast_expr *src[3] = {s->cond ? s->cond : s->end, s->end, s->step ? s->step : s->end};
    for (int i = 0; i < 3; i++)
        if (!em_lang_comptime_int(L, &b[i], src[i]->pos, what[i], &v[i])) return;
    bool sgn = em_scalar_is_signed((em_scalar)ty.scalar);
    uint64_t count = 0;
    if (sgn ? v[1] > v[0] : (uint64_t)v[1] > (uint64_t)v[0]) {
        uint64_t span = (uint64_t)v[1] - (uint64_t)v[0];
        count = span / (uint64_t)v[2] + (span % (uint64_t)v[2] != 0);
    }
    if (count > LANG_MAX_UNROLL) {
        em_lang_lerr(L, s->pos, "use a runtime 'for' loop",
                     "comptime for would unroll %llu iterations (the limit is %d)",
                     (unsigned long long)count, LANG_MAX_UNROLL);
        return;
    }
    /* inside a helper that returns from the loop, wrap the iterations in a loop to break out of */
    frame *fr = L->fr;
    bool wrap = fr->done_var && s->body->may_return;
    if (wrap) {
        if (!em_lang_ir_open(L, s->pos)) return;
        em_ir_loop_begin(L->k);
        fr->loops++;
    }
    for (uint64_t i = 0; i < count && !L->abort; i++) {
        uint64_t x = (uint64_t)v[0] + i * (uint64_t)v[2];
        lv it = em_lang_lv_const_uint((em_scalar)ty.scalar, x);
        it.name = s->name;
        fr->slots[s->slot] = it;
        lower_stmt(L, s->body);
    }
    if (wrap) {
        em_ir_break(L->k);
        fr->loops--;
        em_lang_ir_close(L);
    }
}

static void lower_for(lower *L, const ast_stmt *s)
{
    lv b[3];
    em_type ty;
    if (!range_bounds(L, s, b, &ty)) return;
    if (s->is_comptime) {
        lower_comptime_for(L, s, b, ty);
        return;
    }
    em_ir_val var = em_ir_var(L->k, ty, s->name);
    if (!em_lang_ir_open(L, s->pos)) return;
    /* materialized one by one: the IR's order must not depend on the C compiler's order of a
     * call's arguments */
    em_ir_val from = em_lang_materialize(L, &b[0]), to = em_lang_materialize(L, &b[1]);
    em_ir_val step = em_lang_materialize(L, &b[2]);
    em_ir_range_begin(L->k, var, from, to, step, false);
    L->fr->loops++;
    L->fr->slots[s->slot] = em_lang_lv_rt(ty, var);
    lower_stmt(L, s->body);
    L->fr->loops--;
    em_lang_ir_close(L);
}

static void lower_while(lower *L, const ast_stmt *s)
{
    if (!em_lang_ir_open(L, s->pos)) return;
    em_ir_loop_begin(L->k);
    L->fr->loops++;
    lv c = em_lang_lower_expr(L, s->cond, NULL);
    if (em_lang_need_cond(L, &c, s->cond->pos, "a while condition")) {
        if (c.kind == V_CONST) {
            if (!c.c.i) em_ir_break(L->k);
        } else if (em_lang_ir_open(L, s->pos)) {
            em_ir_if_begin(L->k, em_ir_unary(L->k, EM_OP_NOT, c.v));
            em_ir_break(L->k);
            em_lang_ir_close(L);
        }
    }
    lower_stmt(L, s->body);
    L->fr->loops--;
    em_lang_ir_close(L);
}

static void lower_return(lower *L, const ast_stmt *s)
{
    frame *fr = L->fr;
    if (fr->fn->is_kernel) {
        em_ir_return(L->k);
        return;
    }
    if (s->init) {
        lv v = em_lang_coerce(L, em_lang_lower_expr(L, s->init, &fr->ret_type), fr->ret_type,
                              s->init->pos, "the return value");
        if (v.kind == V_ERR) return;
        if (fr->ret_var) em_ir_assign(L->k, fr->ret_var, em_lang_materialize(L, &v));
    }
    if (fr->done_var) em_ir_assign(L->k, fr->done_var, em_ir_const_bool(L->k, true));
    if (fr->loops) em_ir_break(L->k);
}

/* True when a return inside s sits in a loop of s (so that it only left that loop). */
static bool returns_from_inner_loop(const ast_stmt *s)
{
    if (!s || !s->may_return) return false;
    switch (s->kind) {
    case ST_FOR:
    case ST_WHILE:
        return true;
    case ST_IF:
        return returns_from_inner_loop(s->body) || returns_from_inner_loop(s->els);
    case ST_BLOCK:
        for (uint32_t i = 0; i < s->nstmts; i++)
            if (returns_from_inner_loop(s->stmts[i])) return true;
        return false;
    default:
        return false;
    }
}

void em_lang_lower_stmts(lower *L, ast_stmt *const *stmts, uint32_t n)
{
    frame *fr = L->fr;
    for (uint32_t i = 0; i < n && !L->abort; i++) {
        const ast_stmt *s = stmts[i];
        lower_stmt(L, s);
        if (!s->may_return || !fr->done_var || s->kind == ST_RETURN || L->abort) continue;
        if (fr->loops) {
            if (!returns_from_inner_loop(s)) continue; /* its return already left this loop */
            /* a return inside left an inner loop: leave this one too */
            if (!em_lang_ir_open(L, s->pos)) return;
            em_ir_if_begin(L->k, fr->done_var);
            em_ir_break(L->k);
            em_lang_ir_close(L);
        } else if (i + 1 < n) {
            /* the rest of the block runs only when no return happened */
            if (!em_lang_ir_open(L, s->pos)) return;
            em_ir_if_begin(L->k, em_ir_unary(L->k, EM_OP_NOT, fr->done_var));
            em_lang_lower_stmts(L, stmts + i + 1, n - i - 1);
            em_lang_ir_close(L);
            return;
        }
    }
}

static void lower_stmt(lower *L, const ast_stmt *s)
{
    if (!s || !em_lang_tick(L, s->pos)) return;
    em_ir_set_loc(L->k, s->pos.line, s->pos.col);
    switch (s->kind) {
    case ST_BLOCK:
        em_lang_lower_stmts(L, s->stmts, s->nstmts);
        break;
    case ST_DECL:
        lower_decl(L, s);
        break;
    case ST_MATRIX:
        lower_matrix(L, s);
        break;
    case ST_EXPR: em_lang_lower_expr(L, s->init, NULL); break;
    case ST_ASSIGN:
        lower_assign(L, s);
        break;
    case ST_IF:
        lower_if(L, s);
        break;
    case ST_FOR:
        lower_for(L, s);
        break;
    case ST_WHILE:
        lower_while(L, s);
        break;
    case ST_BREAK:
        em_ir_break(L->k);
        break;
    case ST_CONTINUE:
        em_ir_continue(L->k);
        break;
    case ST_RETURN:
        lower_return(L, s);
        break;
    default:
        break;
    }
}

/* ---- kernels
 * ------------------------------------------------------------------------------------------ */

static lv comptime_param(lower *L, const ast_param *q, uint32_t i)
{
    em_scalar s = (em_scalar)q->type->scalar;
    const lang_binding *b = L->b;
    if (b->have_comptime[i])
        return (lv){.kind = V_CONST, .ty = em_ty(s), .c = b->comptime[i], .name = q->name};
    if (q->def) {
        lv x = em_lang_lower_expr(L, q->def, NULL);
        if (x.kind != V_ERR && !em_lang_lv_is_comptime(&x))
            return em_lang_lerr(
                L, q->def->pos, NULL,
                "the default of comptime parameter '%s' must be known at compile time", q->name);
        x = em_lang_coerce(L, x, em_ty(s), q->def->pos, "a comptime parameter's default");
        x.name = q->name;
        return x;
    }
    if (b->check_mode) {
        lv x = s == EM_BOOL            ? em_lang_lv_const_bool(false)
               : em_scalar_is_float(s) ? em_lang_lv_const_float(s, 1)
                                       : em_lang_lv_const_int(s, 1);
        x.name = q->name;
        return x;
    }
    return em_lang_lerr(
        L, q->pos, "bind it when specializing, or give it a default: comptime u32 N = 16",
        "no value given for comptime parameter '%s' of kernel '%s'", q->name, L->fr->fn->name);
}

static void lower_param(lower *L, const ast_param *q, uint32_t i)
{
    frame *fr = L->fr;
    if (q->is_comptime) {
        fr->slots[i] = comptime_param(L, q, i);
        return;
    }
    if (q->type->kind == TY_TENSOR || q->type->kind == TY_ARRAY) {
        em_type elem;
        if (!em_lang_lower_type(L, q->type->elem, &elem)) return;
        int64_t rank = 0; /* tensor(T) without a rank has a length only, like array(T) */
        if (q->type->arg) {
            lv r = em_lang_lower_expr(L, q->type->arg, NULL);
            if (!em_lang_comptime_int(L, &r, q->type->arg->pos, "a tensor rank", &rank)) return;
            if (rank < 1 || rank > EM_MAX_RANK) {
                em_lang_lerr(L, q->type->arg->pos, NULL,
                             "a tensor rank must be between 1 and %d, got %lld", EM_MAX_RANK,
                             (long long)rank);
                return;
            }
        }
        em_ir_mem m = em_ir_param_buffer(L->k, q->name, elem, q->is_const ? EM_READ : EM_READ_WRITE,
                                         (unsigned)rank);
        fr->slots[i] = (lv){.kind = V_MEM,
                            .space = EM_MEM_GLOBAL,
                            .writable = !q->is_const,
                            .rank = (uint8_t)rank,
                            .ty = elem,
                            .mem = m,
                            .name = q->name};
        return;
    }
    em_type ty;
    if (!em_lang_lower_type(L, q->type, &ty)) return;
    em_ir_val v = em_ir_param_scalar(L->k, q->name, ty);
    fr->slots[i] = em_lang_bind_local(L, em_lang_lv_rt(ty, v), ty, q->assigned, q->name);
}

static void set_cluster_dim(lower *L, const ast_func *f)
{
    if (!f->cluster_dim) return;
    lv x = em_lang_lower_expr(L, f->cluster_dim, NULL);
    int64_t v;
    if (!em_lang_comptime_int(L, &x, f->cluster_dim->pos, "a cluster size", &v)) return;
    if (v < 1 || v > 8) {
        em_lang_lerr(L, f->cluster_dim->pos, "CUDA's portable cluster sizes are 1 to 8",
                     "a cluster size must be between 1 and 8, got %lld", (long long)v);
        return;
    }
    em_ir_set_cluster_dim(L->k, (uint32_t)v);
}

static void set_cube_dim(lower *L, const ast_func *f)
{
    uint32_t dim[3] = {1, 1, 1};
    set_cluster_dim(L, f);
    if (!f->cube_dim[0]) return;
    for (int d = 0; d < 3 && f->cube_dim[d]; d++) {
        lv x = em_lang_lower_expr(L, f->cube_dim[d], NULL);
        int64_t v;
        if (!em_lang_comptime_int(L, &x, f->cube_dim[d]->pos, "a cube size", &v)) return;
        if (v < 1 || v > 65535) {
            em_lang_lerr(L, f->cube_dim[d]->pos, NULL,
                         "a cube size must be between 1 and 65535, got %lld", (long long)v);
            return;
        }
        dim[d] = (uint32_t)v;
    }
    em_ir_set_cube_dim(L->k, dim[0], dim[1], dim[2]);
}


em_ir_kernel *em_lang_lower(const ast_module *mod, const ast_func *f, const lang_binding *b,
                            lang_sink *sink)
{
    unsigned errors_before = sink->errors;
    lower Lw = {.mod = mod, .b = b, .sink = sink};
    lower *L = &Lw;
    L->k = em_ir_kernel_new(f->name);
    size_t ng = mod->globals.len;
    L->globals = calloc(ng ? ng : 1, sizeof(lv));
    L->global_state = calloc(ng ? ng : 1, 1);
    frame kf = {.fn = f, .width = b->line_width ? b->line_width : 1};
    kf.slots = calloc(f->nslots ? f->nslots : 1, sizeof(lv));
    if (!L->k || !L->globals || !L->global_state || !kf.slots) {
        em_ir_kernel_free(L->k);
        free(L->globals);
        free(L->global_state);
        free(kf.slots);
        em_set_error(EM_ERR_NOMEM, "out of memory lowering kernel '%s'", f->name);
        return NULL;
    }
    for (uint32_t g = 0; g < f->ngenerics && g < LANG_MAX_GENERICS; g++)
        kf.generics[g] = b->generic[g];
    L->fr = &kf;
    for (uint32_t i = 0; i < f->nparams && !L->abort; i++) lower_param(L, &f->params[i], i);
    if (!L->abort) set_cube_dim(L, f);
    if (!L->abort) em_lang_lower_stmts(L, f->body->stmts, f->body->nstmts);
    free(kf.slots);
    free(L->globals);
    free(L->global_state);
    if (L->oom) {
        em_ir_kernel_free(L->k);
        em_set_error(EM_ERR_NOMEM, "out of memory lowering kernel '%s'", f->name);
        return NULL;
    }
    if (sink->errors != errors_before) {
        em_ir_kernel_free(L->k);
        return NULL;
    }
    if (em_ir_verify(L->k, 4) != EM_OK) {
        em_lang_error(sink, f->pos, NULL, "internal error: kernel '%s' lowered to invalid IR: %s",
                      f->name, em_last_error());
        em_ir_kernel_free(L->k);
        return NULL;
    }
    return L->k;
}
