/* resolve.c — name binding and the checks that do not depend on bindings: every identifier is
 * bound to its declaration (local slot, parameter, generic, module constant, helper, builtin,
 * position), types are well-formed where they are written, calls have the right number of
 * arguments, break/continue/return sit where they may, helpers do not recurse, non-void helpers
 * end in a return, and intrinsics sit behind `comptime if (has(TARGET))`. It records, per
 * declaration, whether it is assigned later (lowering keeps unassigned values as temporaries). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/internal.h"

typedef enum ent_kind { E_PARAM, E_DECL, E_LOOP, E_MATRIX } ent_kind;

typedef struct scope_entry {
    const char *name; /* declared name */
    lpos pos;         /* where declared */
    uint8_t kind;     /* an ent_kind */
    uint32_t depth;   /* block depth of the declaration */
    int32_t slot;     /* slot in the function */
    ast_stmt *decl;   /* E_DECL / E_LOOP / E_MATRIX */
    ast_param *param; /* E_PARAM */
} scope_entry;

typedef struct call_edge {
    ast_func *from, *to; /* caller, callee */
    lpos pos;            /* the call */
} call_edge;

typedef struct resolver {
    ast_module *mod; /* the module */
    lang_sink *sink; /* diagnostics */
    em_map funcs;    /* name -> ast_func */
    em_map globals;  /* name -> ast_global (only those resolved so far) */
    ast_func *fn;    /* function being resolved (NULL for module constants) */
    struct {
        scope_entry *items;
        size_t len, cap;
    } scope;                                   /* visible locals, innermost last */
    uint32_t depth;                            /* current block depth */
    bool loop_comptime[LANG_MAX_NEST * 2 + 2]; /* enclosing loops of this function: comptime? */
    unsigned loops;                            /* entries in loop_comptime */
    const char *guards[LANG_MAX_NEST * 2 + 2]; /* targets of enclosing comptime if (has(T)) */
    unsigned nguards;
    struct {
        call_edge *items;
        size_t len, cap;
    } edges;  /* helper calls */
    bool oom; /* an allocation failed */
} resolver;

static bool is_position(const char *name, int *which)
{
    for (int b = 0; b < EM_BUILTIN_COUNT; b++) {
        if (!strcmp(em_builtin_name((em_builtin)b), name)) {
            *which = b;
            return true;
        }
    }
    return false;
}

/* ---- hints ------------------------------------------------------------------------------------
 */

typedef struct cand_list {
    const char **items; /* candidate names */
    size_t len, cap;
} cand_list;

static void cand_push(cand_list *c, const char *name)
{
    if (name) EM_VEC_PUSH(c, name);
}

static void add_map_keys(cand_list *c, const em_map *m)
{
    size_t it = 0;
    const char *key;
    size_t klen;
    void *val;
    while (em_map_next(m, &it, &key, &klen, &val)) cand_push(c, key);
}

/* Hint for an unknown value name: locals, parameters, constants, positions. */
static bool value_hint(resolver *r, const char *name, char *out, size_t outsz)
{
    cand_list c = {0};
    for (size_t i = 0; i < r->scope.len; i++) cand_push(&c, r->scope.items[i].name);
    add_map_keys(&c, &r->globals);
    for (int b = 0; b < EM_BUILTIN_COUNT; b++) cand_push(&c, em_builtin_name((em_builtin)b));
    cand_push(&c, "LINE_WIDTH");
    bool ok = em_lang_nearest(name, c.items, c.len, out, outsz);
    free(c.items);
    return ok;
}

/* Hint for an unknown function: helpers, builtins, generic names (casts). */
static bool call_hint(resolver *r, const char *name, char *out, size_t outsz)
{
    cand_list c = {0};
    add_map_keys(&c, &r->funcs);
    for (size_t i = 0; i < em_lang_builtins_count; i++)
        cand_push(&c, em_lang_builtins_table[i].name);
    for (uint32_t g = 0; r->fn && g < r->fn->ngenerics; g++) cand_push(&c, r->fn->generics[g].name);
    bool ok = em_lang_nearest(name, c.items, c.len, out, outsz);
    free(c.items);
    return ok;
}

static bool type_hint(resolver *r, const char *name, char *out, size_t outsz)
{
    static const struct {
        const char *c;
        const char *scalar;
    } cnames[] = {
        {"float", "f32"},   {"double", "f64"},   {"half", "f16"},    {"int", "i32"},
        {"uint", "u32"},    {"unsigned", "u32"}, {"char", "i8"},     {"short", "i16"},
        {"long", "i64"},    {"size_t", "u64"},   {"int32_t", "i32"}, {"uint32_t", "u32"},
        {"int64_t", "i64"}, {"uint64_t", "u64"},
    };
    for (size_t i = 0; i < EM_ARRAY_LEN(cnames); i++) {
        if (!strcmp(name, cnames[i].c)) {
            snprintf(out, outsz,
                     "scalar types are named bool, i8..i64, u8..u64, f16, bf16, f32, f64: "
                     "did you mean '%s'?",
                     cnames[i].scalar);
            return true;
        }
    }
    cand_list c = {0};
    for (unsigned s = 0; s < EM_SCALAR_COUNT; s++) cand_push(&c, em_scalar_name((em_scalar)s));
    for (uint32_t g = 0; r->fn && g < r->fn->ngenerics; g++) cand_push(&c, r->fn->generics[g].name);
    bool ok = em_lang_nearest(name, c.items, c.len, out, outsz);
    free(c.items);
    return ok;
}

/* ---- scopes -----------------------------------------------------------------------------------
 */

static scope_entry *lookup(resolver *r, const char *name)
{
    for (size_t i = r->scope.len; i-- > 0;)
        if (!strcmp(r->scope.items[i].name, name)) return &r->scope.items[i];
    return NULL;
}

static int find_generic(const ast_func *f, const char *name)
{
    for (uint32_t g = 0; f && g < f->ngenerics; g++)
        if (!strcmp(f->generics[g].name, name)) return (int)g;
    return -1;
}

static bool declare(resolver *r, const char *name, lpos pos, ent_kind kind, ast_stmt *decl,
                    ast_param *param, int32_t *slot_out)
{
    for (size_t i = r->scope.len; i-- > 0;) {
        scope_entry *e = &r->scope.items[i];
        if (e->depth != r->depth) break;
        if (!strcmp(e->name, name))
            return em_lang_error(r->sink, pos, NULL,
                                 "redefinition of '%s' (first declared at line %u)", name,
                                 e->pos.line);
    }
    if (find_generic(r->fn, name) >= 0)
        return em_lang_error(r->sink, pos, NULL, "'%s' is already the name of a generic type",
                             name);
    int which;
    if (is_position(name, &which) || !strcmp(name, "LINE_WIDTH"))
        return em_lang_error(r->sink, pos, NULL, "'%s' is a built-in name and cannot be redeclared",
                             name);
    scope_entry e = {name, pos, (uint8_t)kind, r->depth, (int32_t)r->fn->nslots, decl, param};
    r->fn->nslots++;
    if (slot_out) *slot_out = e.slot;
    if (!EM_VEC_PUSH(&r->scope, e)) r->oom = true;
    return true;
}

static void pop_to(resolver *r, size_t len)
{
    r->scope.len = len;
}

/* ---- types ------------------------------------------------------------------------------------
 */

typedef enum type_ctx {
    TC_VALUE,  /* local variables, casts: scalar, generic, line */
    TC_ELEM,   /* line elements: scalar or generic */
    TC_MEM,    /* tensor/array elements, shared/local arrays: scalar, generic, line */
    TC_KPARAM, /* kernel parameters: scalar, generic, tensor, array */
    TC_HPARAM, /* helper parameters: scalar, generic, line, tensor, array */
    TC_RET,    /* helper results: scalar, generic, line, void */
    TC_LOCAL,  /* local declarations: scalar, generic, line, auto */
} type_ctx;

static bool resolve_expr(resolver *r, ast_expr *e, bool allow_type);

static bool resolve_type(resolver *r, ast_type *t, type_ctx ctx)
{
    if (!t) return false;
    switch (t->kind) {
    case TY_SCALAR:
        return true;
    case TY_NAME: {
        int g = find_generic(r->fn, t->name);
        if (g >= 0) {
            t->generic = (int16_t)g;
            return true;
        }
        char hint[256];
        bool h = type_hint(r, t->name, hint, sizeof(hint));
        return em_lang_error(r->sink, t->pos, h ? hint : NULL, "unknown type '%s'", t->name);
    }
    case TY_LINE:
        if (ctx == TC_ELEM)
            return em_lang_error(r->sink, t->pos, NULL, "the elements of a line must be scalars");
        if (ctx == TC_KPARAM)
            return em_lang_error(r->sink, t->pos, "pass lines in a tensor: tensor(line(F))",
                                 "kernel parameters cannot be lines");
        if (!resolve_type(r, t->elem, TC_ELEM)) return false;
        return !t->arg || resolve_expr(r, t->arg, false);
    case TY_TENSOR:
    case TY_ARRAY:
        if (ctx != TC_KPARAM && ctx != TC_HPARAM)
            return em_lang_error(r->sink, t->pos,
                                 ctx == TC_LOCAL ? "declare a local array as 'T name[N];'" : NULL,
                                 "%s types are only allowed for parameters",
                                 t->kind == TY_TENSOR ? "tensor" : "array");
        if (!resolve_type(r, t->elem, TC_MEM)) return false;
        return !t->arg || resolve_expr(r, t->arg, false);
    case TY_VOID:
        if (ctx == TC_RET) return true;
        return em_lang_error(r->sink, t->pos, NULL, "'void' is only allowed as a return type");
    case TY_AUTO:
        if (ctx == TC_LOCAL) return true;
        return em_lang_error(r->sink, t->pos, NULL, "'auto' is only allowed for local variables");
    }
    return false;
}

/* ---- expressions ------------------------------------------------------------------------------
 */

static bool resolve_name(resolver *r, ast_expr *e, bool allow_type)
{
    if (e->type) { /* a type keyword written as an argument */
        if (!allow_type)
            return em_lang_error(r->sink, e->pos, NULL, "'%s' is a type, not a value", e->name);
        return resolve_type(r, e->type, TC_VALUE);
    }
    scope_entry *s = lookup(r, e->name);
    if (s) {
        e->sym = SYM_LOCAL;
        e->slot = s->slot;
        return true;
    }
    int g = find_generic(r->fn, e->name);
    if (g >= 0) {
        if (!allow_type)
            return em_lang_error(r->sink, e->pos, "convert with F(x) or (F)x",
                                 "'%s' is a type, not a value", e->name);
        e->sym = SYM_GENERIC;
        e->slot = g;
        return true;
    }
    ast_global *gl = em_map_gets(&r->globals, e->name);
    if (gl) {
        e->sym = SYM_GLOBAL;
        e->global = gl;
        return true;
    }
    int which;
    if (is_position(e->name, &which)) {
        e->sym = SYM_POS;
        e->slot = which;
        return true;
    }
    if (!strcmp(e->name, "LINE_WIDTH")) {
        e->sym = SYM_LINE_WIDTH;
        return true;
    }
    if (!strcmp(e->name, "row_major") || !strcmp(e->name, "col_major")) {
        e->sym = SYM_LAYOUT;
        e->slot = !strcmp(e->name, "row_major") ? EM_ROW_MAJOR : EM_COL_MAJOR;
        return true;
    }
    if (em_map_gets(&r->funcs, e->name) || em_lang_builtin_find(e->name) >= 0)
        return em_lang_error(r->sink, e->pos, NULL, "'%s' is a function; call it with '(...)'",
                             e->name);
    char hint[256];
    bool h = value_hint(r, e->name, hint, sizeof(hint));
    return em_lang_error(r->sink, e->pos, h ? hint : NULL, "use of undeclared identifier '%s'",
                         e->name);
}

static bool resolve_args(resolver *r, ast_expr *e, uint32_t from)
{
    bool ok = true;
    for (uint32_t i = from; i < e->nargs; i++) ok &= resolve_expr(r, e->args[i], false);
    return ok;
}

static bool resolve_builtin_call(resolver *r, ast_expr *e, int id)
{
    const lang_builtin *b = &em_lang_builtins_table[id];
    e->sym = SYM_BUILTIN;
    e->slot = id;
    if (e->nargs < b->min_args || e->nargs > b->max_args) {
        if (b->min_args == b->max_args)
            return em_lang_error(r->sink, e->op_pos, NULL, "'%s' takes %u argument%s, got %u",
                                 b->name, b->min_args, b->min_args == 1 ? "" : "s", e->nargs);
        return em_lang_error(r->sink, e->op_pos, NULL, "'%s' takes %u to %u arguments, got %u",
                             b->name, b->min_args, b->max_args, e->nargs);
    }
    switch (b->cls) {
    case BI_HAS: {
        ast_expr *a = e->args[0];
        if (a->kind != EX_NAME || a->type)
            return em_lang_error(r->sink, a->pos, NULL, "has() takes a target or capability name");
        for (size_t i = 0; em_lang_capabilities[i]; i++)
            if (!strcmp(em_lang_capabilities[i], a->name)) {
                a->slot = (int32_t)i;
                return true;
            }
        char hint[256];
        size_t ncap = 0;
        while (em_lang_capabilities[ncap]) ncap++;
        bool h = em_lang_nearest(a->name, em_lang_capabilities, ncap, hint, sizeof(hint));
        return em_lang_error(r->sink, a->pos, h ? hint : NULL, "unknown capability '%s'", a->name);
    }
    case BI_SIZEOF:
    case BI_TYPEPRED:
        return resolve_expr(r, e->args[0], true);
    case BI_PRINT:
        if (e->args[0]->kind != EX_STRING)
            return em_lang_error(r->sink, e->args[0]->pos, NULL,
                                 "print takes a format string first: print(\"x = %%v\\n\", x)");
        return resolve_args(r, e, 1);
    default:
        return resolve_args(r, e, 0);
    }
}

static bool resolve_call(resolver *r, ast_expr *e)
{
    scope_entry *s = lookup(r, e->name);
    if (s)
        return em_lang_error(r->sink, e->op_pos, NULL, "'%s' is a variable, not a function",
                             e->name);
    int g = find_generic(r->fn, e->name);
    if (g >= 0) { /* F(x): a cast to a generic type */
        e->sym = SYM_TYPE_CAST;
        e->slot = g;
        if (e->nargs != 1)
            return em_lang_error(r->sink, e->op_pos, NULL,
                                 "a conversion to '%s' takes 1 argument, got %u", e->name,
                                 e->nargs);
        return resolve_args(r, e, 0);
    }
    ast_func *f = em_map_gets(&r->funcs, e->name);
    if (f) {
        if (f->is_kernel)
            return em_lang_error(r->sink, e->op_pos, NULL,
                                 "'%s' is a kernel; only helper functions can be called", e->name);
        e->sym = SYM_FUNC;
        e->func = f;
        bool ok = resolve_args(r, e, 0);
        if (e->nargs != f->nparams)
            return em_lang_error(r->sink, e->op_pos, NULL, "'%s' takes %u argument%s, got %u",
                                 f->name, f->nparams, f->nparams == 1 ? "" : "s", e->nargs);
        call_edge edge = {r->fn, f, e->op_pos};
        if (r->fn && !EM_VEC_PUSH(&r->edges, edge)) r->oom = true;
        return ok;
    }
    int id = em_lang_builtin_find(e->name);
    if (id >= 0) return resolve_builtin_call(r, e, id);
    char hint[256];
    bool h = call_hint(r, e->name, hint, sizeof(hint));
    resolve_args(r, e, 0);
    return em_lang_error(r->sink, e->op_pos, h ? hint : NULL, "call to undeclared function '%s'",
                         e->name);
}

static bool resolve_expr(resolver *r, ast_expr *e, bool allow_type)
{
    if (!e) return false;
    switch (e->kind) {
    case EX_INT:
    case EX_FLOAT:
    case EX_BOOL:
        return true;
    case EX_STRING:
        return em_lang_error(r->sink, e->pos, NULL,
                             "string literals are only allowed in print and intrinsic");
    case EX_NAME:
        return resolve_name(r, e, allow_type);
    case EX_UNARY:
        return resolve_expr(r, e->a, false);
    case EX_BINARY: {
        bool ok = resolve_expr(r, e->a, false);
        return resolve_expr(r, e->b, false) && ok;
    }
    case EX_TERNARY: {
        bool ok = resolve_expr(r, e->a, false);
        ok &= resolve_expr(r, e->b, false);
        return resolve_expr(r, e->c, false) && ok;
    }
    case EX_INDEX: {
        bool ok = resolve_expr(r, e->a, false);
        return resolve_expr(r, e->b, false) && ok;
    }
    case EX_CALL:
        return resolve_call(r, e);
    case EX_CAST: {
        bool ok = resolve_type(r, e->type, TC_VALUE);
        if (e->type && e->type->kind != TY_LINE && e->nargs != 1)
            ok = em_lang_error(r->sink, e->pos, NULL, "a conversion takes 1 argument, got %u",
                               e->nargs);
        return resolve_args(r, e, 0) && ok;
    }
    case EX_BITCAST: {
        bool ok = resolve_type(r, e->type, TC_VALUE);
        if (e->nargs != 1)
            return em_lang_error(r->sink, e->pos, NULL, "bitcast takes 1 argument, got %u",
                                 e->nargs);
        return resolve_args(r, e, 0) && ok;
    }
    case EX_INTRINSIC: {
        bool ok = !e->type || e->type->kind == TY_VOID || resolve_type(r, e->type, TC_VALUE);
        const char *name = e->args[0]->str;
        if (e->nargs > 1 + EM_IR_MAX_ARGS)
            ok = em_lang_error(r->sink, e->pos, NULL,
                               "intrinsic takes at most %d arguments after its name",
                               EM_IR_MAX_ARGS);
        const char *guard = NULL;
        for (unsigned i = 0; i < r->nguards; i++) {
            size_t n = strlen(r->guards[i]);
            if (!strncmp(name, r->guards[i], n) && name[n] == '.') guard = r->guards[i];
        }
        if (!guard)
            ok = em_lang_error(
                r->sink, e->pos,
                "write it inside 'comptime if (has(cuda)) { ... }' for the target it names",
                "intrinsic '%s' is not guarded by 'comptime if (has(TARGET))' for its target",
                name);
        return resolve_args(r, e, 1) && ok;
    }
    }
    return false;
}

/* ---- statements --------------------------------------------------------------------------------
 */

static bool resolve_stmt(resolver *r, ast_stmt *s);

static bool resolve_scoped(resolver *r, ast_stmt *s)
{
    size_t mark = r->scope.len;
    r->depth++;
    bool ok = resolve_stmt(r, s);
    r->depth--;
    pop_to(r, mark);
    return ok;
}

/* Marks the declaration behind an assigned name; reports writes to constants. */
static bool resolve_target(resolver *r, ast_expr *lhs, bool whole)
{
    if (lhs->kind == EX_INDEX) {
        if (!resolve_expr(r, lhs->b, false)) return false;
        return resolve_target(r, lhs->a, false);
    }
    if (lhs->kind != EX_NAME)
        return em_lang_error(r->sink, lhs->pos, NULL, "this expression cannot be assigned to");
    if (!resolve_name(r, lhs, false)) return false;
    if (lhs->sym != SYM_LOCAL)
        return em_lang_error(r->sink, lhs->pos, NULL, "cannot assign to '%s'", lhs->name);
    scope_entry *s = lookup(r, lhs->name);
    if (!s) return false;
    if (s->kind == E_LOOP)
        return em_lang_error(r->sink, lhs->pos, NULL, "cannot assign to loop variable '%s'",
                             lhs->name);
    if (s->kind == E_MATRIX)
        return em_lang_error(r->sink, lhs->pos, "use mat_fill, mat_load or mat_mma",
                             "cannot assign to matrix '%s'", lhs->name);
    if (s->kind == E_PARAM) {
        if (s->param->is_comptime)
            return em_lang_error(r->sink, lhs->pos, NULL,
                                 "cannot assign to comptime parameter '%s'", lhs->name);
        if (s->param->is_const)
            return em_lang_error(r->sink, lhs->pos, NULL,
                                 "cannot write to read-only parameter '%s'", lhs->name);
        ty_kind tk = (ty_kind)s->param->type->kind;
        if (whole && (tk == TY_TENSOR || tk == TY_ARRAY))
            return em_lang_error(r->sink, lhs->pos, "assign its elements: name[i] = value",
                                 "cannot assign to %s '%s' as a whole",
                                 tk == TY_TENSOR ? "tensor" : "array", lhs->name);
        s->param->assigned = true;
        return true;
    }
    ast_stmt *d = s->decl;
    if (d->is_comptime || d->is_const)
        return em_lang_error(r->sink, lhs->pos, NULL, "cannot assign to %s '%s'",
                             d->is_comptime ? "comptime constant" : "constant", lhs->name);
    if (whole && d->array_len)
        return em_lang_error(r->sink, lhs->pos, "assign its elements: name[i] = value",
                             "cannot assign to array '%s' as a whole", lhs->name);
    d->assigned = true;
    return true;
}

/* True when every path through s ends in a return. */
static bool ends_in_return(const ast_stmt *s)
{
    if (!s) return false;
    switch (s->kind) {
    case ST_RETURN:
        return true;
    case ST_BLOCK:
        return s->nstmts && ends_in_return(s->stmts[s->nstmts - 1]);
    case ST_IF:
        return s->els && ends_in_return(s->body) && ends_in_return(s->els);
    default:
        return false;
    }
}

static bool resolve_decl(resolver *r, ast_stmt *s)
{
    bool ok =
        resolve_type(r, s->type, s->array_len || s->storage == STORE_SHARED ? TC_MEM : TC_LOCAL);
    if (s->type && s->type->kind == TY_AUTO && s->array_len)
        ok = em_lang_error(r->sink, s->type->pos, NULL,
                           "an array needs an element type, not 'auto'");
    if (s->type && s->type->kind == TY_AUTO && !s->init)
        ok = em_lang_error(r->sink, s->name_pos, NULL, "'auto' variable '%s' needs an initializer",
                           s->name);
    if (s->storage == STORE_SHARED && !s->array_len)
        ok = em_lang_error(r->sink, s->name_pos, "declare it as 'shared T name[N];'",
                           "shared memory must be an array");
    if ((s->is_comptime || s->is_const) && !s->init)
        ok = em_lang_error(r->sink, s->name_pos, NULL, "%s '%s' needs an initializer",
                           s->is_comptime ? "comptime constant" : "constant", s->name);
    if ((s->is_comptime || s->is_const) && s->array_len)
        ok = em_lang_error(r->sink, s->name_pos, NULL, "arrays cannot be %s",
                           s->is_comptime ? "comptime" : "const");
    if (s->array_len && s->init)
        ok = em_lang_error(r->sink, s->init->pos, NULL, "arrays cannot have an initializer");
    if (s->array_len) ok &= resolve_expr(r, s->array_len, false);
    if (s->init) ok &= resolve_expr(r, s->init, false);
    ok &= declare(r, s->name, s->name_pos, E_DECL, s, NULL, &s->slot);
    return ok;
}

static bool resolve_for(resolver *r, ast_stmt *s)
{
    bool ok = true;
    if (s->cond) ok &= resolve_expr(r, s->cond, false);
    ok &= resolve_expr(r, s->end, false);
    if (s->step) ok &= resolve_expr(r, s->step, false);
    size_t mark = r->scope.len;
    r->depth++;
    if (s->type) {
        ok &= resolve_type(r, s->type, TC_VALUE);
        if (s->type->kind == TY_LINE)
            ok = em_lang_error(r->sink, s->type->pos, NULL,
                               "a loop variable must be a scalar integer");
    }
    ok &= declare(r, s->name, s->name_pos, E_LOOP, s, NULL, &s->slot);
    r->loop_comptime[r->loops++] = s->is_comptime;
    r->depth++;
    ok &= resolve_stmt(r, s->body);
    r->depth--;
    r->loops--;
    r->depth--;
    pop_to(r, mark);
    s->may_return = s->body->may_return;
    return ok;
}

/* The target named by `comptime if (has(TARGET))`, or NULL. */
static const char *guard_target(const ast_stmt *s)
{
    const ast_expr *c = s->cond;
    if (!s->is_comptime || c->kind != EX_CALL || c->sym != SYM_BUILTIN || c->nargs != 1)
        return NULL;
    if (em_lang_builtins_table[c->slot].cls != BI_HAS || c->args[0]->kind != EX_NAME) return NULL;
    return c->args[0]->name;
}

static bool resolve_stmt(resolver *r, ast_stmt *s)
{
    if (!s || r->oom || em_lang_sink_full(r->sink)) return false;
    bool ok = true;
    switch (s->kind) {
    case ST_BLOCK: {
        size_t mark = r->scope.len;
        r->depth++;
        for (uint32_t i = 0; i < s->nstmts; i++) {
            ok &= resolve_stmt(r, s->stmts[i]);
            s->may_return |= s->stmts[i]->may_return;
        }
        r->depth--;
        pop_to(r, mark);
        return ok;
    }
    case ST_DECL:
        return resolve_decl(r, s);
    case ST_MATRIX:
        ok &= resolve_type(r, s->type, TC_ELEM);
        for (int d = 0; d < 3; d++) ok &= resolve_expr(r, s->dims[d], false);
        if (s->layout_expr) ok &= resolve_expr(r, s->layout_expr, false);
        return declare(r, s->name, s->name_pos, E_MATRIX, s, NULL, &s->slot) && ok;
    case ST_EXPR:
        ok = resolve_expr(r, s->init, false);
        if (ok && s->init->kind != EX_CALL && s->init->kind != EX_INTRINSIC)
            return em_lang_error(r->sink, s->init->pos, NULL, "this statement has no effect");
        return ok;
    case ST_ASSIGN:
        ok &= resolve_expr(r, s->init, false);
        return resolve_target(r, s->lhs, true) && ok;
    case ST_IF: {
        ok &= resolve_expr(r, s->cond, false);
        const char *g = ok ? guard_target(s) : NULL;
        if (g) r->guards[r->nguards++] = g;
        ok &= resolve_scoped(r, s->body);
        if (g) r->nguards--;
        if (s->els) ok &= resolve_scoped(r, s->els);
        s->may_return = s->body->may_return || (s->els && s->els->may_return);
        return ok;
    }
    case ST_FOR:
        return resolve_for(r, s);
    case ST_WHILE:
        ok &= resolve_expr(r, s->cond, false);
        r->loop_comptime[r->loops++] = false;
        ok &= resolve_scoped(r, s->body);
        r->loops--;
        s->may_return = s->body->may_return;
        return ok;
    case ST_BREAK:
    case ST_CONTINUE: {
        const char *what = s->kind == ST_BREAK ? "break" : "continue";
        if (!r->loops) return em_lang_error(r->sink, s->pos, NULL, "'%s' outside of a loop", what);
        if (r->loop_comptime[r->loops - 1])
            return em_lang_error(
                r->sink, s->pos, "use a runtime 'for' loop when it must stop early",
                "'%s' cannot leave a comptime for (its iterations are unrolled)", what);
        return true;
    }
    case ST_RETURN: {
        s->may_return = true;
        bool is_void = r->fn->is_kernel || r->fn->ret->kind == TY_VOID;
        if (s->init) ok &= resolve_expr(r, s->init, false);
        if (is_void && s->init)
            return em_lang_error(r->sink, s->init->pos, NULL, "%s '%s' cannot return a value",
                                 r->fn->is_kernel ? "kernel" : "void function", r->fn->name);
        if (!is_void && !s->init)
            return em_lang_error(r->sink, s->pos, NULL, "function '%s' must return a value",
                                 r->fn->name);
        return ok;
    }
    case ST_EMPTY:
        return true;
    }
    return false;
}

/* ---- declarations ---------------------------------------------------------------------------- */

/* True when generic g appears in type t. */
static bool mentions_generic(const ast_type *t, int g)
{
    if (!t) return false;
    if (t->kind == TY_NAME) return t->generic == g;
    return mentions_generic(t->elem, g);
}

static bool resolve_signature(resolver *r, ast_func *f)
{
    bool ok = true;
    for (uint32_t g = 0; g < f->ngenerics; g++) {
        ast_generic *gen = &f->generics[g];
        for (uint32_t h = 0; h < g; h++)
            if (!strcmp(f->generics[h].name, gen->name))
                ok = em_lang_error(r->sink, gen->pos, NULL, "generic parameter '%s' declared twice",
                                   gen->name);
        if (em_scalar_parse(gen->name) < EM_SCALAR_COUNT)
            ok = em_lang_error(r->sink, gen->pos, NULL,
                               "'%s' is a scalar type and cannot name a generic", gen->name);
        if (gen->def) {
            if (gen->def->kind != TY_SCALAR)
                ok = em_lang_error(r->sink, gen->def->pos, NULL,
                                   "a generic's default must be a scalar type");
            else if (!em_lang_bound_allows((gen_bound)gen->bound, (em_scalar)gen->def->scalar))
                ok = em_lang_error(r->sink, gen->def->pos, NULL,
                                   "default type '%s' does not satisfy the bound '%s' of '%s'",
                                   em_scalar_name((em_scalar)gen->def->scalar),
                                   em_lang_bound_name((gen_bound)gen->bound), gen->name);
        }
    }
    if (f->is_kernel && f->ret->kind != TY_VOID)
        ok = em_lang_error(r->sink, f->ret->pos, NULL, "a kernel must return void");
    else if (!f->is_kernel)
        ok &= resolve_type(r, f->ret, TC_RET);
    for (uint32_t i = 0; i < f->nparams; i++) {
        ast_param *q = &f->params[i];
        bool tok = resolve_type(r, q->type, f->is_kernel ? TC_KPARAM : TC_HPARAM);
        ok &= tok;
        bool mem = q->type->kind == TY_TENSOR || q->type->kind == TY_ARRAY;
        if (q->is_comptime && tok && q->type->kind != TY_SCALAR)
            ok = em_lang_error(r->sink, q->type->pos, NULL,
                               "a comptime parameter must have a scalar type such as u32 or bool");
        if (q->is_const && !mem)
            ok = em_lang_error(r->sink, q->type_pos, NULL,
                               "only tensor and array parameters can be const");
        if (q->def && !q->is_comptime)
            ok = em_lang_error(r->sink, q->def->pos, NULL,
                               "only comptime parameters can have a default");
        if (q->def) ok &= resolve_expr(r, q->def, false);
        ok &= declare(r, q->name, q->pos, E_PARAM, NULL, q, NULL);
    }
    if (!f->is_kernel) {
        for (uint32_t g = 0; g < f->ngenerics; g++) {
            bool used = false;
            for (uint32_t i = 0; i < f->nparams; i++)
                used |= mentions_generic(f->params[i].type, (int)g);
            if (!used)
                ok = em_lang_error(
                    r->sink, f->generics[g].pos, NULL,
                    "generic parameter '%s' of '%s' is not used by any parameter, so it "
                    "cannot be inferred",
                    f->generics[g].name, f->name);
        }
    }
    return ok;
}

static bool resolve_func(resolver *r, ast_func *f)
{
    r->fn = f;
    r->scope.len = 0;
    r->depth = 0;
    r->loops = 0;
    r->nguards = 0;
    f->nslots = 0;
    bool ok = resolve_signature(r, f);
    if (f->is_kernel) {
        for (int d = 0; d < 3; d++)
            if (f->cube_dim[d]) ok &= resolve_expr(r, f->cube_dim[d], false);
        if (f->cluster_dim) ok &= resolve_expr(r, f->cluster_dim, false);
    }
    r->depth = 1;
    ok &= resolve_stmt(r, f->body);
    if (ok && !f->is_kernel && f->ret->kind != TY_VOID && !ends_in_return(f->body))
        ok = em_lang_error(r->sink, f->pos, NULL,
                           "non-void function '%s' does not end with a return statement", f->name);
    f->resolved = ok;
    return ok;
}

/* Reports helper recursion (helpers are inlined, so a cycle could never end). */
static bool check_cycles(resolver *r)
{
    size_t n = r->mod->funcs.len;
    uint8_t *state = calloc(n ? n : 1, 1); /* 0 new, 1 on the stack, 2 done */
    size_t *stack = calloc(n ? n : 1, sizeof(size_t));
    size_t *edge_at = calloc(n ? n : 1, sizeof(size_t));
    bool ok = true;
    if (!state || !stack || !edge_at) {
        r->oom = true;
        ok = false;
        goto done;
    }
    for (size_t root = 0; root < n; root++) {
        if (state[root]) continue;
        size_t sp = 0;
        stack[sp++] = root;
        state[root] = 1;
        edge_at[root] = 0;
        while (sp) {
            size_t u = stack[sp - 1];
            bool pushed = false;
            while (edge_at[u] < r->edges.len) {
                call_edge *e = &r->edges.items[edge_at[u]++];
                if (e->from->index != u) continue;
                size_t v = e->to->index;
                if (state[v] == 1) {
                    ok = em_lang_error(r->sink, e->pos,
                                       "helpers are inlined at each call, so they cannot "
                                       "call themselves directly or indirectly",
                                       "recursive call to '%s'", e->to->name);
                } else if (state[v] == 0) {
                    state[v] = 1;
                    edge_at[v] = 0;
                    stack[sp++] = v;
                    pushed = true;
                    break;
                }
            }
            if (!pushed) {
                state[u] = 2;
                sp--;
            }
        }
    }
done:
    free(state);
    free(stack);
    free(edge_at);
    return ok;
}

static bool resolve_global(resolver *r, ast_global *g)
{
    bool ok = true;
    if (g->type->kind != TY_SCALAR && g->type->kind != TY_AUTO)
        ok =
            em_lang_error(r->sink, g->type->pos, NULL, "a module constant must have a scalar type");
    ok &= resolve_expr(r, g->init, false);
    if (em_map_gets(&r->globals, g->name))
        ok = em_lang_error(r->sink, g->pos, NULL, "redefinition of constant '%s'", g->name);
    else if (em_map_gets(&r->funcs, g->name))
        ok =
            em_lang_error(r->sink, g->pos, NULL, "'%s' is already the name of a function", g->name);
    int which;
    if (is_position(g->name, &which) || !strcmp(g->name, "LINE_WIDTH"))
        ok = em_lang_error(r->sink, g->pos, NULL,
                           "'%s' is a built-in name and cannot be redeclared", g->name);
    if (!em_map_puts(&r->globals, g->name, g)) r->oom = true;
    return ok;
}

bool em_lang_resolve(ast_module *mod, lang_sink *sink)
{
    resolver R = {0};
    resolver *r = &R;
    r->mod = mod;
    r->sink = sink;
    em_map_init(&r->funcs);
    em_map_init(&r->globals);
    bool ok = true;
    for (size_t i = 0; i < mod->funcs.len; i++) {
        ast_func *f = mod->funcs.items[i];
        f->index = (uint32_t)i;
        ast_func *prev = em_map_gets(&r->funcs, f->name);
        if (prev) {
            ok =
                em_lang_error(sink, f->pos, NULL, "redefinition of '%s' (first defined at line %u)",
                              f->name, prev->pos.line);
            continue;
        }
        if (em_lang_builtin_find(f->name) >= 0) {
            ok = em_lang_error(sink, f->pos, NULL,
                               "'%s' is a builtin function and cannot be redefined", f->name);
            continue;
        }
        if (!em_map_puts(&r->funcs, f->name, f)) r->oom = true;
    }
    /* constants first, in order: each sees those before it */
    for (size_t i = 0; i < mod->globals.len && !r->oom; i++)
        ok &= resolve_global(r, mod->globals.items[i]);
    for (size_t i = 0; i < mod->funcs.len && !r->oom && !em_lang_sink_full(sink); i++)
        ok &= resolve_func(r, mod->funcs.items[i]);
    if (ok && !r->oom) ok = check_cycles(r);
    em_map_free(&r->funcs);
    em_map_free(&r->globals);
    free(r->scope.items);
    free(r->edges.items);
    if (r->oom) {
        em_set_error(EM_ERR_NOMEM, "out of memory resolving kernel source");
        return false;
    }
    return ok;
}
