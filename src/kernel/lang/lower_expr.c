/* lower_expr.c — expressions during lowering: names, operators (short-circuit && and || and the
 * conditional ?: become control flow so that guarded loads stay guarded), indexing of memory and
 * of line lanes, casts, line constructors, bitcasts, intrinsics, module constants (evaluated once
 * per specialization), written types, and the inlining of helper functions with generic inference
 * from their arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/lower.h"

#define IR_MAX_OPEN 240 /* below the builder's limit of 256 nested blocks */

bool em_lang_tick(lower *L, lpos pos)
{
    if (L->abort) return false;
    if (++L->work > LANG_MAX_WORK || em_ir_inst_count(L->k) > LANG_MAX_INSTS) {
        em_lang_lerr(L, pos, "reduce comptime unrolling or the number of helper calls",
                     "kernel '%s' is too large after inlining and unrolling",
                     em_ir_kernel_name(L->k));
        L->abort = true;
        return false;
    }
    return true;
}

bool em_lang_ir_open(lower *L, lpos pos)
{
    if (L->ir_depth >= IR_MAX_OPEN) {
        em_lang_lerr(L, pos, NULL,
                     "control flow nested too deeply (more than %d levels after inlining)",
                     IR_MAX_OPEN);
        L->abort = true;
        return false;
    }
    L->ir_depth++;
    return true;
}

void em_lang_ir_close(lower *L)
{
    em_ir_end(L->k);
    L->ir_depth--;
}

/* ---- types -------------------------------------------------------------------------------------
 */

bool em_lang_lower_type(lower *L, const ast_type *t, em_type *out)
{
    if (!t) return false;
    switch (t->kind) {
    case TY_SCALAR:
        *out = em_ty((em_scalar)t->scalar);
        return true;
    case TY_NAME:
        if (t->generic < 0 || t->generic >= LANG_MAX_GENERICS) return false;
        *out = em_ty(L->fr->generics[t->generic]);
        return true;
    case TY_LINE: {
        em_type e;
        if (!em_lang_lower_type(L, t->elem, &e)) return false;
        unsigned w = L->fr->width;
        if (t->arg) {
            lv x = em_lang_lower_expr(L, t->arg, NULL);
            int64_t v;
            if (!em_lang_comptime_int(L, &x, t->arg->pos, "a line width", &v)) return false;
            if (v < 1 || v > EM_MAX_LANES) {
                em_lang_lerr(L, t->arg->pos, NULL,
                             "a line width must be between 1 and %d, got %lld", EM_MAX_LANES,
                             (long long)v);
                return false;
            }
            w = (unsigned)v;
        }
        *out = em_line((em_scalar)e.scalar, w);
        return true;
    }
    default:
        em_lang_lerr(L, t->pos, NULL, "this type cannot be used here");
        return false;
    }
}

/* ---- names -------------------------------------------------------------------------------------
 */

static lv eval_global(lower *L, ast_global *g)
{
    uint32_t i = g->index;
    if (L->global_state[i] == 2) return L->globals[i];
    if (L->global_state[i] == 1)
        return em_lang_lerr(L, g->pos, NULL, "constant '%s' depends on itself", g->name);
    L->global_state[i] = 1;
    lv x = em_lang_lower_expr(L, g->init, NULL);
    if (x.kind != V_ERR && !em_lang_lv_is_comptime(&x))
        x = em_lang_lerr(L, g->init->pos, NULL,
                         "the value of constant '%s' must be known at compile time", g->name);
    if (x.kind != V_ERR && g->type->kind == TY_SCALAR)
        x = em_lang_coerce(L, x, em_ty((em_scalar)g->type->scalar), g->init->pos,
                           "a constant's initialization");
    x.name = g->name;
    L->globals[i] = x;
    L->global_state[i] = 2;
    return x;
}

static lv lower_name(lower *L, const ast_expr *e)
{
    if (e->type) {
        em_type t;
        if (!em_lang_lower_type(L, e->type, &t)) return em_lang_lv_err();
        return (lv){.kind = V_TYPE, .ty = t};
    }
    switch (e->sym) {
    case SYM_LOCAL: {
        if (e->slot < 0 || (uint32_t)e->slot >= L->fr->fn->nslots) return em_lang_lv_err();
        lv x = L->fr->slots[e->slot];
        x.name = e->name;
        return x;
    }
    case SYM_GLOBAL:
        return eval_global(L, e->global);
    case SYM_POS:
        return em_lang_lv_rt(em_ty(EM_U32), em_ir_builtin(L->k, (em_builtin)e->slot));
    case SYM_LINE_WIDTH:
        return em_lang_lv_const_uint(EM_U32, L->b->line_width);
    case SYM_LAYOUT:
        return (lv){.kind = V_LAYOUT, .c = {.i = e->slot}};
    case SYM_GENERIC:
        return (lv){.kind = V_TYPE, .ty = em_ty(L->fr->generics[e->slot])};
    default:
        return em_lang_lv_err();
    }
}

/* ---- operators with control flow
 * ----------------------------------------------------------------- */

static lv lower_logic(lower *L, const ast_expr *e)
{
    bool is_and = e->op == T_ANDAND;
    char what[64];
    snprintf(what, sizeof(what), "the left operand of '%s'", is_and ? "&&" : "||");
    lv a = em_lang_lower_expr(L, e->a, NULL);
    if (!em_lang_need_cond(L, &a, e->a->pos, what)) return em_lang_lv_err();
    snprintf(what, sizeof(what), "the right operand of '%s'", is_and ? "&&" : "||");
    if (a.kind == V_CONST) {
        if (is_and != (a.c.i != 0))
            return em_lang_lv_const_bool(!is_and); /* decided by the left side */
        lv b = em_lang_lower_expr(L, e->b, NULL);
        return em_lang_need_cond(L, &b, e->b->pos, what) ? b : em_lang_lv_err();
    }
    em_ir_val t = em_ir_var(L->k, em_ty(EM_BOOL), NULL);
    em_ir_assign(L->k, t, a.v);
    em_ir_val cond = is_and ? t : em_ir_unary(L->k, EM_OP_NOT, t);
    if (!em_lang_ir_open(L, e->op_pos)) return em_lang_lv_err();
    em_ir_if_begin(L->k, cond);
    lv b = em_lang_lower_expr(L, e->b, NULL);
    bool ok = em_lang_need_cond(L, &b, e->b->pos, what);
    if (ok) em_ir_assign(L->k, t, em_lang_materialize(L, &b));
    em_lang_ir_close(L);
    return ok ? em_lang_lv_rt(em_ty(EM_BOOL), t) : em_lang_lv_err();
}

/* The common type of the two arms of ?: (after literals took a type). */
static bool arms_type(lower *L, lv *a, lv *b, const em_type *hint, lpos pos, em_type *out)
{
    if (em_lang_lv_is_untyped(a) && em_lang_lv_is_untyped(b)) {
        if (hint) {
            *a = em_lang_coerce(L, *a, *hint, pos, "a conditional expression");
            *b = em_lang_coerce(L, *b, *hint, pos, "a conditional expression");
        } else {
            bool fl = a->kind == V_ULIT_FLOAT || b->kind == V_ULIT_FLOAT;
            em_type t = em_ty(fl ? EM_F32 : EM_I32);
            *a = em_lang_coerce(L, *a, t, pos, "a conditional expression");
            *b = em_lang_coerce(L, *b, t, pos, "a conditional expression");
        }
        if (a->kind == V_ERR || b->kind == V_ERR) return false;
    }
    if (!em_lang_unify2(L, a, b, pos, "?:")) return false;
    if (a->ty.lanes != b->ty.lanes) {
        char x[48], y[48];
        em_lang_type_str(a->ty, x, sizeof(x));
        em_lang_type_str(b->ty, y, sizeof(y));
        em_lang_lerr(L, pos, NULL, "mismatched types '%s' and '%s' in '?:'", x, y);
        return false;
    }
    *out = a->ty;
    return true;
}

/* True when evaluating e can neither fault nor have an effect, so that both arms of a
 * conditional may run: literals, names, casts, and operators other than division. */
static bool safe_to_evaluate(const ast_expr *e)
{
    switch (e->kind) {
    case EX_INT:
    case EX_FLOAT:
    case EX_BOOL:
    case EX_NAME:
        return true;
    case EX_UNARY:
        return safe_to_evaluate(e->a);
    case EX_BINARY:
        if (e->op == T_SLASH || e->op == T_PERCENT || e->op == T_ANDAND || e->op == T_OROR)
            return false;
        return safe_to_evaluate(e->a) && safe_to_evaluate(e->b);
    case EX_CAST:
        for (uint32_t i = 0; i < e->nargs; i++)
            if (!safe_to_evaluate(e->args[i])) return false;
        return true;
    case EX_CALL:
        return e->sym == SYM_TYPE_CAST && safe_to_evaluate(e->args[0]);
    default:
        return false;
    }
}

static lv lower_ternary(lower *L, const ast_expr *e, const em_type *hint)
{
    lv c = em_lang_lower_expr(L, e->a, NULL);
    if (c.kind == V_ERR || !em_lang_need_value(L, &c, e->a->pos, "a condition"))
        return em_lang_lv_err();
    if (c.kind == V_CONST && c.ty.scalar == EM_BOOL && c.ty.lanes == 1)
        return em_lang_lower_expr(L, c.c.i ? e->b : e->c, hint);
    bool line_cond = !em_lang_lv_is_untyped(&c) && c.ty.scalar == EM_BOOL && c.ty.lanes > 1;
    if (line_cond || (safe_to_evaluate(e->b) && safe_to_evaluate(e->c))) {
        /* a bool line selects lane by lane, and arms that cannot fault need no branch: both arms
         * are evaluated */
        if (!line_cond && !em_lang_need_cond(L, &c, e->a->pos, "the condition of '?:'"))
            return em_lang_lv_err();
        lv a = em_lang_lower_expr(L, e->b, hint), b = em_lang_lower_expr(L, e->c, hint);
        em_type t;
        if (!em_lang_need_value(L, &a, e->b->pos, "an arm of '?:'") ||
            !em_lang_need_value(L, &b, e->c->pos, "an arm of '?:'"))
            return em_lang_lv_err();
        if (!arms_type(L, &a, &b, hint, e->op_pos, &t)) return em_lang_lv_err();
        if (line_cond && t.lanes != 1 && t.lanes != c.ty.lanes) {
            char x[48], y[48];
            em_lang_type_str(c.ty, x, sizeof(x));
            em_lang_type_str(t, y, sizeof(y));
            return em_lang_lerr(L, e->op_pos, NULL,
                                "a '%s' condition cannot select between '%s' values", x, y);
        }
        if (line_cond) t.lanes = c.ty.lanes;
        a = em_lang_coerce(L, a, t, e->b->pos, "an arm of '?:'");
        b = em_lang_coerce(L, b, t, e->c->pos, "an arm of '?:'");
        if (a.kind == V_ERR || b.kind == V_ERR) return em_lang_lv_err();
        /* one by one: the IR's order must not hang on the C compiler's order of arguments */
        em_ir_val vc = em_lang_materialize(L, &c), va = em_lang_materialize(L, &a);
        em_ir_val vb = em_lang_materialize(L, &b);
        return em_lang_lv_rt(t, em_ir_emit(L->k, EM_OP_SELECT, t, vc, va, vb, 0, 0, 0));
    }
    if (!em_lang_need_cond(L, &c, e->a->pos, "the condition of '?:'")) return em_lang_lv_err();
    /* a scalar condition evaluates one arm only: if (c) r = a; else r = b; */
    if (!em_lang_ir_open(L, e->op_pos)) return em_lang_lv_err();
    em_ir_if_begin(L->k, c.v);
    lv a = em_lang_lower_expr(L, e->b, hint);
    em_ir_val r = 0;
    em_type t = {0, 0};
    if (a.kind != V_ERR && em_lang_need_value(L, &a, e->b->pos, "an arm of '?:'") &&
        !em_lang_lv_is_comptime(&a)) {
        t = a.ty;
        r = em_ir_var(L->k, t, NULL);
        em_ir_assign(L->k, r, a.v);
    }
    em_ir_else(L->k);
    lv b = em_lang_lower_expr(L, e->c, hint);
    if (a.kind == V_ERR || b.kind == V_ERR ||
        !em_lang_need_value(L, &b, e->c->pos, "an arm of '?:'")) {
        em_lang_ir_close(L);
        return em_lang_lv_err();
    }
    if (r) {
        b = em_lang_coerce(L, b, t, e->c->pos, "the other arm of '?:'");
        if (b.kind != V_ERR) em_ir_assign(L->k, r, em_lang_materialize(L, &b));
        em_lang_ir_close(L);
        return b.kind == V_ERR ? em_lang_lv_err() : em_lang_lv_rt(t, r);
    }
    /* the first arm is a constant: emit no code for it, select it after the if */
    if (!arms_type(L, &a, &b, hint, e->op_pos, &t)) {
        em_lang_ir_close(L);
        return em_lang_lv_err();
    }
    r = em_ir_var(L->k, t, NULL);
    em_ir_assign(L->k, r, em_lang_materialize(L, &b));
    em_lang_ir_close(L);
    return em_lang_lv_rt(
        t, em_ir_emit(L->k, EM_OP_SELECT, t, c.v, em_lang_materialize(L, &a), r, 0, 0, 0));
}

/* ---- indexing, casts
 * ------------------------------------------------------------------------------ */

static lv lower_index(lower *L, const ast_expr *e)
{
    lv base = em_lang_lower_expr(L, e->a, NULL);
    if (base.kind == V_ERR) return base;
    lv ix = em_lang_lower_expr(L, e->b, NULL);
    if (base.kind == V_MEM) {
        ix = em_lang_to_index(L, ix, e->b->pos, "an index");
        if (ix.kind == V_ERR) return ix;
        if (ix.kind == V_CONST && base.space != EM_MEM_GLOBAL && ix.c.u >= base.length)
            return em_lang_lerr(L, e->b->pos, NULL,
                                "index %llu is out of bounds for %s '%s' of %u elements",
                                (unsigned long long)ix.c.u,
                                base.space == EM_MEM_SHARED ? "shared array" : "local array",
                                base.name ? base.name : "?", base.length);
        return em_lang_lv_rt(base.ty, em_ir_load(L->k, base.mem, em_lang_materialize(L, &ix)));
    }
    if (em_lang_lv_is_value(&base) && !em_lang_lv_is_untyped(&base)) {
        /* a line's lane; a scalar is a line of one lane, so that kernels work at every width */
        ix = em_lang_to_index(L, ix, e->b->pos, "a lane index");
        if (ix.kind == V_ERR) return ix;
        em_type st = em_ty((em_scalar)base.ty.scalar);
        if (ix.kind == V_CONST) {
            if (ix.c.u >= base.ty.lanes) {
                char tn[48];
                em_lang_type_str(base.ty, tn, sizeof(tn));
                return em_lang_lerr(
                    L, e->b->pos, NULL, "lane %llu is out of range for '%s' (%u lane%s)",
                    (unsigned long long)ix.c.u, tn, base.ty.lanes, base.ty.lanes == 1 ? "" : "s");
            }
            if (base.kind == V_CONST) {
                base.ty = st;
                return base;
            }
        }
        if (base.ty.lanes == 1) return base;
        em_ir_val vbase = em_lang_materialize(L, &base), vix = em_lang_materialize(L, &ix);
        return em_lang_lv_rt(st, em_ir_extract(L->k, vbase, vix));
    }
    char d[96];
    em_lang_lv_desc(&base, d, sizeof(d));
    return em_lang_lerr(L, e->op_pos, "only tensors, arrays and lines can be indexed",
                        "cannot index %s", d);
}

static lv lower_cast(lower *L, const ast_expr *e)
{
    em_type to;
    if (!em_lang_lower_type(L, e->type, &to)) return em_lang_lv_err();
    if (e->nargs == 1)
        return em_lang_convert(L, em_lang_lower_expr(L, e->args[0], NULL), to, e->args[0]->pos);
    char tn[48];
    em_lang_type_str(to, tn, sizeof(tn));
    if (e->nargs != to.lanes)
        return em_lang_lerr(L, e->pos, NULL, "'%s' is built from 1 or %u values, got %u", tn,
                            to.lanes, e->nargs);
    em_type st = em_ty((em_scalar)to.scalar);
    em_ir_val cur = 0;
    for (uint32_t i = 0; i < e->nargs; i++) {
        lv x = em_lang_coerce(L, em_lang_lower_expr(L, e->args[i], NULL), st, e->args[i]->pos,
                              "a line constructor");
        if (x.kind == V_ERR) return x;
        em_ir_val v = em_lang_materialize(L, &x);
        cur = i == 0 ? em_ir_cast(L->k, to, v) : em_ir_insert(L->k, cur, em_ir_u32(L->k, i), v);
    }
    return em_lang_lv_rt(to, cur);
}

static lv lower_bitcast(lower *L, const ast_expr *e)
{
    em_type to;
    if (!em_lang_lower_type(L, e->type, &to)) return em_lang_lv_err();
    lv x = em_lang_lv_default(L, em_lang_lower_expr(L, e->args[0], NULL), e->args[0]->pos);
    if (x.kind == V_ERR || !em_lang_need_value(L, &x, e->args[0]->pos, "a bitcast operand"))
        return em_lang_lv_err();
    size_t from_size = em_scalar_size((em_scalar)x.ty.scalar) * x.ty.lanes;
    size_t to_size = em_scalar_size((em_scalar)to.scalar) * to.lanes;
    if (from_size != to_size) {
        char a[48], b[48];
        em_lang_type_str(x.ty, a, sizeof(a));
        em_lang_type_str(to, b, sizeof(b));
        return em_lang_lerr(L, e->pos, NULL,
                            "bitcast from '%s' (%zu bytes) to '%s' (%zu bytes): the sizes differ",
                            a, from_size, b, to_size);
    }
    return em_lang_lv_rt(to, em_ir_bitcast(L->k, to, em_lang_materialize(L, &x)));
}

static lv lower_intrinsic(lower *L, const ast_expr *e)
{
    em_ir_val args[EM_IR_MAX_ARGS] = {0};
    unsigned n = 0;
    for (uint32_t i = 1; i < e->nargs && n < EM_IR_MAX_ARGS; i++) {
        lv x = em_lang_lv_default(L, em_lang_lower_expr(L, e->args[i], NULL), e->args[i]->pos);
        if (x.kind == V_ERR || !em_lang_need_value(L, &x, e->args[i]->pos, "an intrinsic argument"))
            return em_lang_lv_err();
        args[n++] = em_lang_materialize(L, &x);
    }
    if (!e->type || e->type->kind == TY_VOID) {
        em_ir_intrinsic(L->k, e->args[0]->str, (em_type){0, 0}, args, n);
        return em_lang_lv_void();
    }
    em_type t;
    if (!em_lang_lower_type(L, e->type, &t)) return em_lang_lv_err();
    return em_lang_lv_rt(t, em_ir_intrinsic(L->k, e->args[0]->str, t, args, n));
}

/* ---- helpers ------------------------------------------------------------------------------------
 */

typedef struct infer {
    em_scalar gen[LANG_MAX_GENERICS]; /* inferred generic types */
    bool bound[LANG_MAX_GENERICS];    /* which are inferred */
    unsigned width;                   /* widest line argument (0 = no line parameter) */
    const ast_func *f;                /* the callee */
    lpos pos;                         /* the call */
} infer;

static bool bind_generic(lower *L, infer *in, int g, em_scalar s, lpos pos)
{
    if (g < 0 || g >= LANG_MAX_GENERICS) return false;
    if (in->bound[g] && in->gen[g] != s) {
        em_lang_lerr(L, pos, NULL, "conflicting types for '%s' in call to '%s': '%s' and '%s'",
                     in->f->generics[g].name, in->f->name, em_scalar_name(in->gen[g]),
                     em_scalar_name(s));
        return false;
    }
    in->bound[g] = true;
    in->gen[g] = s;
    return true;
}

static bool bind_width(lower *L, infer *in, unsigned lanes, lpos pos)
{
    if (in->width > 1 && lanes > 1 && lanes != in->width) {
        em_lang_lerr(L, pos, NULL, "conflicting line widths in call to '%s': %u and %u",
                     in->f->name, in->width, lanes);
        return false;
    }
    if (lanes > in->width) in->width = lanes;
    return true;
}

/* Infers generics and the line width from one argument against its parameter's type. */
static bool infer_arg(lower *L, infer *in, const ast_param *q, const lv *a, uint32_t i, lpos pos)
{
    const ast_type *t = q->type;
    if (t->kind == TY_TENSOR || t->kind == TY_ARRAY) {
        if (a->kind != V_MEM) {
            char d[96];
            em_lang_lv_desc(a, d, sizeof(d));
            em_lang_lerr(L, pos, NULL, "argument %u of '%s' must be a tensor or array, got %s",
                         i + 1, in->f->name, d);
            return false;
        }
        t = t->elem;
        if (t->kind == TY_NAME) {
            if (a->ty.lanes != 1) {
                em_lang_lerr(L, pos, "declare the parameter with line elements: array(line(T))",
                             "argument %u of '%s' holds lines, but parameter '%s' holds scalars",
                             i + 1, in->f->name, q->name);
                return false;
            }
            return bind_generic(L, in, t->generic, (em_scalar)a->ty.scalar, pos);
        }
        if (t->kind == TY_LINE) {
            if (t->elem->kind == TY_NAME &&
                !bind_generic(L, in, t->elem->generic, (em_scalar)a->ty.scalar, pos))
                return false;
            return t->arg || bind_width(L, in, a->ty.lanes, pos);
        }
        return true;
    }
    if (!em_lang_lv_is_value(a) || em_lang_lv_is_untyped(a))
        return true; /* literals: after the others */
    if (t->kind == TY_NAME) {
        if (a->ty.lanes != 1) {
            char d[48];
            em_lang_type_str(a->ty, d, sizeof(d));
            em_lang_lerr(L, pos, "declare the parameter as line(T) to accept lines and scalars",
                         "argument %u of '%s' is '%s', but parameter '%s' is a scalar", i + 1,
                         in->f->name, d, q->name);
            return false;
        }
        return bind_generic(L, in, t->generic, (em_scalar)a->ty.scalar, pos);
    }
    if (t->kind == TY_LINE) {
        if (t->elem->kind == TY_NAME &&
            !bind_generic(L, in, t->elem->generic, (em_scalar)a->ty.scalar, pos))
            return false;
        if (!t->arg && !bind_width(L, in, a->ty.lanes, pos)) return false;
    }
    return true;
}

/* Binds parameter q of the new frame (current) to argument a. */
static bool bind_param(lower *L, const ast_param *q, uint32_t i, lv a, lpos pos)
{
    const ast_func *f = L->fr->fn;
    char what[128];
    snprintf(what, sizeof(what), "argument %u of '%s'", i + 1, f->name);
    if (q->type->kind == TY_TENSOR || q->type->kind == TY_ARRAY) {
        em_type elem;
        if (!em_lang_lower_type(L, q->type->elem, &elem)) return false;
        if (!em_type_eq(elem, a.ty)) {
            char x[48], y[48];
            em_lang_type_str(a.ty, x, sizeof(x));
            em_lang_type_str(elem, y, sizeof(y));
            em_lang_lerr(L, pos, NULL, "%s holds '%s' elements, but parameter '%s' holds '%s'",
                         what, x, q->name, y);
            return false;
        }
        if (q->type->kind == TY_TENSOR && a.space != EM_MEM_GLOBAL) {
            em_lang_lerr(L, pos,
                         "declare the parameter as array(T) to accept shared and local arrays",
                         "%s must be a tensor parameter of the kernel", what);
            return false;
        }
        if (!q->is_const && !a.writable) {
            em_lang_lerr(L, pos, "declare the parameter const",
                         "%s is read-only, but parameter '%s' is not const", what, q->name);
            return false;
        }
        a.writable = a.writable && !q->is_const;
        L->fr->slots[i] = a;
        return true;
    }
    em_type t;
    if (!em_lang_lower_type(L, q->type, &t)) return false;
    if (q->is_comptime && !em_lang_lv_is_comptime(&a)) {
        if (a.kind != V_ERR) em_lang_lerr(L, pos, NULL, "%s must be known at compile time", what);
        return false;
    }
    lv v = em_lang_coerce(L, a, t, pos, what);
    if (v.kind == V_ERR) return false;
    L->fr->slots[i] = em_lang_bind_local(L, v, t, q->assigned, q->name);
    return true;
}

static lv inline_call(lower *L, const ast_expr *e)
{
    const ast_func *f = e->func;
    if (!f || !f->resolved) return em_lang_lv_err();
    if (L->inline_depth >= LANG_MAX_INLINE)
        return em_lang_lerr(L, e->op_pos, NULL, "helper calls nested too deeply (more than %d)",
                            LANG_MAX_INLINE);
    lv args[LANG_MAX_ARGS];
    bool ok = true;
    for (uint32_t i = 0; i < e->nargs && i < LANG_MAX_ARGS; i++) {
        args[i] = em_lang_lower_expr(L, e->args[i], NULL);
        ok &= args[i].kind != V_ERR;
    }
    if (!ok || e->nargs != f->nparams) return em_lang_lv_err();
    infer in = {.f = f, .pos = e->op_pos};
    for (uint32_t i = 0; i < f->nparams; i++)
        if (!infer_arg(L, &in, &f->params[i], &args[i], i, e->args[i]->pos))
            return em_lang_lv_err();
    for (uint32_t i = 0; i < f->nparams; i++) { /* literals give their default type last */
        const ast_type *t = f->params[i].type;
        if (t->kind == TY_LINE) t = t->elem;
        if (t->kind == TY_NAME && em_lang_lv_is_untyped(&args[i]) && !in.bound[t->generic])
            bind_generic(L, &in, t->generic, args[i].kind == V_ULIT_INT ? EM_I32 : EM_F32,
                         e->args[i]->pos);
    }
    frame nf = {.fn = f, .parent = L->fr};
    for (uint32_t g = 0; g < f->ngenerics; g++) {
        const ast_generic *gen = &f->generics[g];
        if (!in.bound[g])
            return em_lang_lerr(L, e->op_pos, NULL, "cannot infer '%s' in call to '%s'", gen->name,
                                f->name);
        if (!em_lang_bound_allows((gen_bound)gen->bound, in.gen[g]))
            return em_lang_lerr(L, e->op_pos, NULL, "'%s' needs %s: %s, got '%s'", f->name,
                                gen->name, em_lang_bound_name((gen_bound)gen->bound),
                                em_scalar_name(in.gen[g]));
        nf.generics[g] = in.gen[g];
    }
    nf.width = in.width ? in.width : L->fr->width;
    nf.slots = calloc(f->nslots ? f->nslots : 1, sizeof(lv));
    if (!nf.slots) {
        L->oom = L->abort = true;
        return em_lang_lv_err();
    }
    L->fr = &nf;
    for (uint32_t i = 0; ok && i < f->nparams; i++)
        ok = bind_param(L, &f->params[i], i, args[i], e->args[i]->pos);
    nf.ret_void = f->ret->kind == TY_VOID;
    if (ok && !nf.ret_void) ok = em_lang_lower_type(L, f->ret, &nf.ret_type);
    const ast_stmt *body = f->body;
    uint32_t n = body->nstmts;
    nf.tail_return = n && body->stmts[n - 1]->kind == ST_RETURN;
    for (uint32_t i = 0; nf.tail_return && i + 1 < n; i++)
        nf.tail_return = !body->stmts[i]->may_return;
    if (ok && !nf.tail_return && body->may_return) {
        if (!nf.ret_void) nf.ret_var = em_ir_var(L->k, nf.ret_type, f->name);
        nf.done_var = em_ir_var(L->k, em_ty(EM_BOOL), NULL);
        em_ir_assign(L->k, nf.done_var, em_ir_const_bool(L->k, false));
    }
    lv result = em_lang_lv_void();
    if (ok) {
        L->inline_depth++;
        if (nf.tail_return) {
            em_lang_lower_stmts(L, body->stmts, n - 1);
            const ast_stmt *ret = body->stmts[n - 1];
            if (!nf.ret_void && !L->abort) {
                em_ir_set_loc(L->k, ret->pos.line, ret->pos.col);
                result = em_lang_coerce(L, em_lang_lower_expr(L, ret->init, &nf.ret_type),
                                        nf.ret_type, ret->init->pos, "the return value");
            }
        } else {
            em_lang_lower_stmts(L, body->stmts, n);
            if (!nf.ret_void) result = em_lang_lv_rt(nf.ret_type, nf.ret_var);
        }
        L->inline_depth--;
    } else {
        result = em_lang_lv_err();
    }
    L->fr = nf.parent;
    free(nf.slots);
    result.is_var = false;
    result.name = NULL;
    return result;
}

/* ---- dispatch -----------------------------------------------------------------------------------
 */

lv em_lang_lower_expr(lower *L, const ast_expr *e, const em_type *hint)
{
    if (!e || !em_lang_tick(L, e->pos)) return em_lang_lv_err();
    switch (e->kind) {
    case EX_INT:
        if (e->op == 'u') {
            if (e->ival > (int64_t)UINT32_MAX)
                return em_lang_lerr(L, e->pos, "write u64(...) for wider values",
                                    "integer literal %lldu does not fit in 'u32'",
                                    (long long)e->ival);
            return em_lang_lv_const_uint(EM_U32, (uint64_t)e->ival);
        }
        return (lv){.kind = V_ULIT_INT, .c = {.i = e->ival}};
    case EX_FLOAT:
        return (lv){.kind = V_ULIT_FLOAT, .c = {.f = e->fval}};
    case EX_BOOL:
        return em_lang_lv_const_bool(e->ival != 0);
    case EX_NAME:
        return lower_name(L, e);
    case EX_UNARY:
        return em_lang_unop(L, e->op, em_lang_lower_expr(L, e->a, NULL), e->pos);
    case EX_BINARY:
        if (e->op == T_ANDAND || e->op == T_OROR) return lower_logic(L, e);
        {
            lv a = em_lang_lower_expr(L, e->a, NULL);
            lv b = em_lang_lower_expr(L, e->b, NULL);
            return em_lang_binop(L, e->op, a, b, e->op_pos);
        }
    case EX_TERNARY:
        return lower_ternary(L, e, hint);
    case EX_INDEX:
        return lower_index(L, e);
    case EX_CALL:
        switch (e->sym) {
        case SYM_FUNC:
            return inline_call(L, e);
        case SYM_BUILTIN:
            return em_lang_lower_builtin(L, e);
        case SYM_TYPE_CAST:
            return em_lang_convert(L, em_lang_lower_expr(L, e->args[0], NULL),
                                   em_ty(L->fr->generics[e->slot]), e->args[0]->pos);
        default:
            return em_lang_lv_err();
        }
    case EX_CAST:
        return lower_cast(L, e);
    case EX_BITCAST:
        return lower_bitcast(L, e);
    case EX_INTRINSIC:
        return lower_intrinsic(L, e);
    default:
        return em_lang_lv_err();
    }
}
