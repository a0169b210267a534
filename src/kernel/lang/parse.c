/* parse.c — the kernel language's recursive-descent parser: tokens to the syntax tree of
 * internal.h. Top level: kernels, inline helpers and module constants. Statements and expressions
 * follow C (precedence climbing for binary operators). After a syntax error the parser skips to the
 * end of the statement (or declaration) and goes on, reporting one error per statement. Nesting is
 * bounded (statements, expression height) so that no input can exhaust the stack. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/internal.h"

typedef struct parser {
    const token *t;  /* tokens (ending with T_EOF) */
    size_t n;        /* number of tokens */
    size_t i;        /* next token */
    em_arena *arena; /* nodes */
    lang_sink *sink; /* diagnostics */
    ast_module *mod; /* output */
    unsigned depth;  /* statement nesting */
    bool panic;      /* an error was reported in the current statement: stay quiet until sync */
    bool oom;        /* an allocation failed */
    const ast_generic *gens; /* generics of the function being parsed (to spot type names) */
    uint32_t ngens;
} parser;

/* ---- helpers ----------------------------------------------------------------------------------
 */

static const token *peek(const parser *p)
{
    return &p->t[p->i];
}
static const token *peek_at(const parser *p, size_t ahead)
{
    size_t j = p->i + ahead;
    return &p->t[j < p->n ? j : p->n - 1];
}
static bool at_kind(const parser *p, tok_kind k)
{
    return peek(p)->kind == k;
}
static const token *next(parser *p)
{
    const token *t = peek(p);
    if (t->kind != T_EOF) p->i++;
    return t;
}
static bool accept(parser *p, tok_kind k)
{
    if (!at_kind(p, k)) return false;
    next(p);
    return true;
}

static void *alloc(parser *p, size_t size)
{
    void *m = em_arena_alloc(p->arena, size);
    if (!m) p->oom = true;
    return m;
}

/* Describes the current token for "expected X, found Y" messages. */
static void describe(const token *t, char *out, size_t outsz)
{
    if (t->kind == T_IDENT || t->kind == T_TYPE || t->kind == T_INT || t->kind == T_FLOAT)
        snprintf(out, outsz, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->text);
    else
        snprintf(out, outsz, "%s", em_lang_tok_name((tok_kind)t->kind));
}

static bool error_at(parser *p, lpos pos, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool error_at(parser *p, lpos pos, const char *hint, const char *fmt, ...)
{
    if (!p->panic) {
        va_list ap;
        va_start(ap, fmt);
        em_lang_verror(p->sink, pos, hint, fmt, ap);
        va_end(ap);
    }
    p->panic = true;
    return false;
}

static bool expect(parser *p, tok_kind k, const char *context)
{
    if (accept(p, k)) return true;
    char found[64];
    describe(peek(p), found, sizeof(found));
    char what[96];
    snprintf(what, sizeof(what), "%s%s%s", em_lang_tok_name(k), context ? " " : "",
             context ? context : "");
    return error_at(p, peek(p)->pos, NULL, "expected %s, found %s", what, found);
}

static const char *expect_ident(parser *p, const char *what, lpos *pos)
{
    const token *t = peek(p);
    if (pos) *pos = t->pos;
    if (t->kind == T_IDENT) {
        next(p);
        return t->str ? t->str : "?";
    }
    char found[64];
    describe(t, found, sizeof(found));
    if (t->kind != T_IDENT && t->kind >= T_KERNEL)
        error_at(p, t->pos, NULL, "expected %s, found keyword %s", what, found);
    else
        error_at(p, t->pos, NULL, "expected %s, found %s", what, found);
    return NULL;
}

/* Skips to the end of the current statement: past the next ';' at this nesting, or up to a '}'
 * that closes the enclosing block. */
static void sync_stmt(parser *p)
{
    int parens = 0, braces = 0;
    while (!at_kind(p, T_EOF)) {
        tok_kind k = (tok_kind)peek(p)->kind;
        if (k == T_LPAREN || k == T_LBRACKET) parens++;
        if ((k == T_RPAREN || k == T_RBRACKET) && parens > 0) parens--;
        if (k == T_LBRACE) braces++;
        if (k == T_RBRACE) {
            if (braces == 0) break;
            braces--;
            if (braces == 0 && parens == 0) {
                next(p);
                break;
            }
        }
        if (k == T_SEMI && braces == 0) {
            next(p);
            break;
        }
        next(p);
    }
    p->panic = false;
}

/* Skips to the next top-level declaration. */
static void sync_top(parser *p)
{
    int braces = 0;
    while (!at_kind(p, T_EOF)) {
        tok_kind k = (tok_kind)peek(p)->kind;
        if (braces == 0 && (k == T_KERNEL || k == T_INLINE)) break;
        if (k == T_LBRACE) braces++;
        if (k == T_RBRACE && --braces <= 0) {
            next(p);
            if (braces < 0) braces = 0;
            if (braces == 0) break;
            continue;
        }
        if (k == T_SEMI && braces == 0) {
            next(p);
            break;
        }
        next(p);
    }
    p->panic = false;
}

static bool is_generic_name(const parser *p, const token *t)
{
    if (t->kind != T_IDENT || !t->str) return false;
    for (uint32_t g = 0; g < p->ngens; g++)
        if (!strcmp(p->gens[g].name, t->str)) return true;
    return false;
}

static bool is_type_start(const parser *p, const token *t)
{
    switch (t->kind) {
    case T_TYPE:
    case T_LINE:
    case T_TENSOR:
    case T_ARRAY:
    case T_VOID:
    case T_AUTO:
        return true;
    default:
        return is_generic_name(p, t);
    }
}

/* The index of the token after a type starting at token j (syntax only), or 0 if none. */
static size_t skip_type(const parser *p, size_t j)
{
    if (j >= p->n || !is_type_start(p, &p->t[j])) return 0;
    tok_kind k = (tok_kind)p->t[j].kind;
    if (k != T_LINE && k != T_TENSOR && k != T_ARRAY) return j + 1;
    if (j + 1 >= p->n || p->t[j + 1].kind != T_LPAREN) return 0;
    int depth = 0;
    for (size_t m = j + 1; m < p->n; m++) {
        if (p->t[m].kind == T_LPAREN) depth++;
        if (p->t[m].kind == T_RPAREN && --depth == 0) return m + 1;
        if (p->t[m].kind == T_EOF || p->t[m].kind == T_SEMI || p->t[m].kind == T_LBRACE) return 0;
    }
    return 0;
}

/* ---- expressions ------------------------------------------------------------------------------
 */

static ast_expr *parse_expr(parser *p);
static ast_type *parse_type(parser *p);

static ast_expr *new_expr(parser *p, ex_kind kind, lpos pos)
{
    ast_expr *e = alloc(p, sizeof(*e));
    if (!e) return NULL;
    e->kind = (uint8_t)kind;
    e->pos = e->op_pos = pos;
    e->height = 1;
    e->slot = -1;
    return e;
}

static uint16_t height_of(const ast_expr *e)
{
    return e ? e->height : 0;
}

/* Sets e's height from its children; reports (once) a tree too tall to lower safely. */
static ast_expr *finish(parser *p, ast_expr *e)
{
    if (!e) return NULL;
    unsigned h = height_of(e->a);
    if (height_of(e->b) > h) h = height_of(e->b);
    if (height_of(e->c) > h) h = height_of(e->c);
    for (uint32_t i = 0; i < e->nargs; i++)
        if (height_of(e->args[i]) > h) h = height_of(e->args[i]);
    if (e->type && e->type->arg && height_of(e->type->arg) > h) h = height_of(e->type->arg);
    if (h + 1 > LANG_MAX_HEIGHT) {
        error_at(p, e->pos, NULL, "expression nested too deeply (more than %d levels)",
                 LANG_MAX_HEIGHT);
        h = LANG_MAX_HEIGHT;
    }
    e->height = (uint16_t)(h + 1);
    return e;
}

/* '(' [expr {',' expr}] ')' — the '(' is the current token. */
static bool parse_args(parser *p, ast_expr ***args, uint32_t *nargs, bool first_string)
{
    if (!expect(p, T_LPAREN, NULL)) return false;
    ast_expr *tmp[LANG_MAX_ARGS + 1];
    uint32_t n = 0;
    if (!at_kind(p, T_RPAREN)) {
        do {
            if (n == LANG_MAX_ARGS) {
                error_at(p, peek(p)->pos, NULL, "too many arguments (at most %d)", LANG_MAX_ARGS);
                return false;
            }
            ast_expr *a;
            if (first_string && n == 0 && at_kind(p, T_STRING)) {
                const token *t = next(p);
                a = new_expr(p, EX_STRING, t->pos);
                if (a) a->str = t->str ? t->str : "";
            } else {
                a = parse_expr(p);
            }
            if (!a) return false;
            tmp[n++] = a;
        } while (accept(p, T_COMMA));
    }
    if (!at_kind(p, T_RPAREN)) {
        char found[64];
        describe(peek(p), found, sizeof(found));
        return error_at(p, peek(p)->pos, NULL, "expected ',' or ')' in argument list, found %s",
                        found);
    }
    next(p);
    *nargs = n;
    *args = n ? alloc(p, n * sizeof(ast_expr *)) : NULL;
    if (n && !*args) return false;
    if (n) memcpy(*args, tmp, n * sizeof(ast_expr *));
    return true;
}

static ast_expr *parse_primary(parser *p)
{
    const token *t = peek(p);
    ast_expr *e = NULL;
    switch (t->kind) {
    case T_INT:
        next(p);
        e = new_expr(p, EX_INT, t->pos);
        if (e) {
            e->ival = t->ival;
            e->op = t->is_unsigned ? 'u' : 0;
        }
        return e;
    case T_FLOAT:
        next(p);
        e = new_expr(p, EX_FLOAT, t->pos);
        if (e) e->fval = t->fval;
        return e;
    case T_TRUE:
    case T_FALSE:
        next(p);
        e = new_expr(p, EX_BOOL, t->pos);
        if (e) e->ival = t->kind == T_TRUE;
        return e;
    case T_STRING:
        next(p);
        e = new_expr(p, EX_STRING, t->pos);
        if (e) e->str = t->str ? t->str : "";
        return e;
    case T_IDENT:
        next(p);
        if (at_kind(p, T_LPAREN)) {
            e = new_expr(p, EX_CALL, t->pos);
            if (!e) return NULL;
            e->name = t->str ? t->str : "?";
            if (!parse_args(p, &e->args, &e->nargs, !strcmp(e->name, "print"))) return NULL;
            return finish(p, e);
        }
        e = new_expr(p, EX_NAME, t->pos);
        if (e) e->name = t->str ? t->str : "?";
        return e;
    case T_TYPE:
    case T_LINE: {
        /* functional cast or line constructor: f32(x), line(F)(x), line(f32, 4)(a, b, c, d) */
        ast_type *ty = parse_type(p);
        if (!ty) return NULL;
        if (!at_kind(p, T_LPAREN)) {
            /* a type used as an argument (sizeof(f32), is_float(F)); resolve rejects it elsewhere
             */
            e = new_expr(p, EX_NAME, t->pos);
            if (!e) return NULL;
            e->type = ty;
            e->name = t->kind == T_TYPE ? em_scalar_name((em_scalar)t->scalar) : "line";
            return e;
        }
        e = new_expr(p, EX_CAST, t->pos);
        if (!e) return NULL;
        e->type = ty;
        if (!parse_args(p, &e->args, &e->nargs, false)) return NULL;
        return finish(p, e);
    }
    case T_BITCAST: {
        next(p);
        e = new_expr(p, EX_BITCAST, t->pos);
        if (!e || !expect(p, T_LT, "after 'bitcast'")) return NULL;
        e->type = parse_type(p);
        if (!e->type || !expect(p, T_GT, "after the bitcast type")) return NULL;
        if (!parse_args(p, &e->args, &e->nargs, false)) return NULL;
        return finish(p, e);
    }
    case T_INTRINSIC: {
        next(p);
        e = new_expr(p, EX_INTRINSIC, t->pos);
        if (!e) return NULL;
        if (accept(p, T_LT)) {
            e->type = parse_type(p);
            if (!e->type || !expect(p, T_GT, "after the intrinsic's result type")) return NULL;
        }
        if (!parse_args(p, &e->args, &e->nargs, true)) return NULL;
        if (!e->nargs || e->args[0]->kind != EX_STRING) {
            error_at(p, t->pos, NULL, "intrinsic needs the intrinsic's name as a string first");
            return NULL;
        }
        return finish(p, e);
    }
    case T_MATRIX:
        /* the capability name of has(matrix); resolve rejects it anywhere else */
        next(p);
        e = new_expr(p, EX_NAME, t->pos);
        if (e) e->name = "matrix";
        return e;
    case T_LPAREN: {
        next(p);
        e = parse_expr(p);
        if (!e || !expect(p, T_RPAREN, NULL)) return NULL;
        return e;
    }
    default: {
        char found[64];
        describe(t, found, sizeof(found));
        error_at(p, t->pos, NULL, "expected an expression, found %s", found);
        return NULL;
    }
    }
}

static ast_expr *parse_postfix(parser *p)
{
    ast_expr *e = parse_primary(p);
    while (e) {
        const token *t = peek(p);
        if (t->kind == T_LBRACKET) {
            next(p);
            ast_expr *ix = new_expr(p, EX_INDEX, e->pos);
            if (!ix) return NULL;
            ix->op_pos = t->pos;
            ix->a = e;
            ix->b = parse_expr(p);
            if (!ix->b || !expect(p, T_RBRACKET, NULL)) return NULL;
            e = finish(p, ix);
        } else if (t->kind == T_DOT) {
            /* x.f(args) is f(x, args); x.f is f(x) */
            next(p);
            lpos npos;
            const char *name = expect_ident(p, "a method name after '.'", &npos);
            if (!name) return NULL;
            ast_expr *call = new_expr(p, EX_CALL, e->pos);
            if (!call) return NULL;
            call->name = name;
            call->op_pos = npos;
            ast_expr **rest = NULL;
            uint32_t nrest = 0;
            if (at_kind(p, T_LPAREN) && !parse_args(p, &rest, &nrest, false)) return NULL;
            if (nrest + 1 > LANG_MAX_ARGS) {
                error_at(p, npos, NULL, "too many arguments (at most %d)", LANG_MAX_ARGS);
                return NULL;
            }
            call->nargs = nrest + 1;
            call->args = alloc(p, call->nargs * sizeof(ast_expr *));
            if (!call->args) return NULL;
            call->args[0] = e;
            if (nrest) memcpy(call->args + 1, rest, nrest * sizeof(ast_expr *));
            e = finish(p, call);
        } else if (t->kind == T_LPAREN) {
            error_at(p, t->pos, NULL, "only functions and types can be called");
            return NULL;
        } else {
            break;
        }
    }
    return e;
}

static ast_expr *parse_unary(parser *p)
{
    const token *t = peek(p);
    switch (t->kind) {
    case T_MINUS:
    case T_BANG:
    case T_TILDE:
    case T_PLUS: {
        next(p);
        ast_expr *e = new_expr(p, EX_UNARY, t->pos);
        if (!e) return NULL;
        e->op = t->kind;
        /* count unary chains against the height limit before recursing */
        if (++p->depth > LANG_MAX_HEIGHT) {
            error_at(p, t->pos, NULL, "expression nested too deeply (more than %d levels)",
                     LANG_MAX_HEIGHT);
            p->depth--;
            return NULL;
        }
        e->a = parse_unary(p);
        p->depth--;
        return e->a ? finish(p, e) : NULL;
    }
    case T_PLUSPLUS:
    case T_MINUSMINUS:
        error_at(p, t->pos, NULL, "'%s' is a statement, not an expression",
                 t->kind == T_PLUSPLUS ? "++" : "--");
        return NULL;
    case T_LPAREN: {
        const token *u = peek_at(p, 1);
        if (is_type_start(p, u) && u->kind != T_VOID && u->kind != T_AUTO) {
            size_t end = skip_type(p, p->i + 1);
            if (end && end < p->n && p->t[end].kind == T_RPAREN) {
                next(p);
                ast_expr *e = new_expr(p, EX_CAST, t->pos);
                if (!e) return NULL;
                e->type = parse_type(p);
                if (!e->type || !expect(p, T_RPAREN, NULL)) return NULL;
                if (++p->depth > LANG_MAX_HEIGHT) {
                    error_at(p, t->pos, NULL, "expression nested too deeply (more than %d levels)",
                             LANG_MAX_HEIGHT);
                    p->depth--;
                    return NULL;
                }
                ast_expr *operand = parse_unary(p);
                p->depth--;
                if (!operand) return NULL;
                e->nargs = 1;
                e->args = alloc(p, sizeof(ast_expr *));
                if (!e->args) return NULL;
                e->args[0] = operand;
                return finish(p, e);
            }
        }
        return parse_postfix(p);
    }
    default:
        return parse_postfix(p);
    }
}

static int precedence(tok_kind k)
{
    switch (k) {
    case T_OROR:
        return 1;
    case T_ANDAND:
        return 2;
    case T_PIPE:
        return 3;
    case T_CARET:
        return 4;
    case T_AMP:
        return 5;
    case T_EQEQ:
    case T_NE:
        return 6;
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE:
        return 7;
    case T_SHL:
    case T_SHR:
        return 8;
    case T_PLUS:
    case T_MINUS:
        return 9;
    case T_STAR:
    case T_SLASH:
    case T_PERCENT:
        return 10;
    default:
        return 0;
    }
}

static ast_expr *parse_binary(parser *p, int min_prec)
{
    ast_expr *lhs = parse_unary(p);
    for (;;) {
        if (!lhs) return NULL;
        const token *t = peek(p);
        int prec = precedence((tok_kind)t->kind);
        if (!prec || prec < min_prec) return lhs;
        next(p);
        ast_expr *e = new_expr(p, EX_BINARY, lhs->pos);
        if (!e) return NULL;
        e->op = t->kind;
        e->op_pos = t->pos;
        e->a = lhs;
        if (++p->depth > LANG_MAX_HEIGHT) {
            error_at(p, t->pos, NULL, "expression nested too deeply (more than %d levels)",
                     LANG_MAX_HEIGHT);
            p->depth--;
            return NULL;
        }
        e->b = parse_binary(p, prec + 1);
        p->depth--;
        if (!e->b) return NULL;
        lhs = finish(p, e);
    }
}

static ast_expr *parse_expr(parser *p)
{
    if (++p->depth > LANG_MAX_HEIGHT) {
        error_at(p, peek(p)->pos, NULL, "expression nested too deeply (more than %d levels)",
                 LANG_MAX_HEIGHT);
        p->depth--;
        return NULL;
    }
    ast_expr *c = parse_binary(p, 1);
    if (c && at_kind(p, T_QUESTION)) {
        const token *q = next(p);
        ast_expr *e = new_expr(p, EX_TERNARY, c->pos);
        if (e) {
            e->op_pos = q->pos;
            e->a = c;
            e->b = parse_expr(p);
            if (e->b && expect(p, T_COLON, "in conditional expression")) e->c = parse_expr(p);
            c = e->b && e->c ? finish(p, e) : NULL;
        } else {
            c = NULL;
        }
    }
    p->depth--;
    return c;
}

/* ---- types -------------------------------------------------------------------------------------
 */

static ast_type *new_type(parser *p, ty_kind kind, lpos pos)
{
    ast_type *t = alloc(p, sizeof(*t));
    if (!t) return NULL;
    t->kind = (uint8_t)kind;
    t->pos = pos;
    t->generic = -1;
    return t;
}

static ast_type *parse_type(parser *p)
{
    const token *t = peek(p);
    ast_type *ty = NULL;
    switch (t->kind) {
    case T_TYPE:
        next(p);
        ty = new_type(p, TY_SCALAR, t->pos);
        if (ty) ty->scalar = t->scalar;
        return ty;
    case T_IDENT:
        next(p);
        ty = new_type(p, TY_NAME, t->pos);
        if (ty) ty->name = t->str ? t->str : "?";
        return ty;
    case T_VOID:
        next(p);
        return new_type(p, TY_VOID, t->pos);
    case T_AUTO:
        next(p);
        return new_type(p, TY_AUTO, t->pos);
    case T_LINE:
    case T_TENSOR:
    case T_ARRAY: {
        next(p);
        ty = new_type(p,
                      t->kind == T_LINE     ? TY_LINE
                      : t->kind == T_TENSOR ? TY_TENSOR
                                            : TY_ARRAY,
                      t->pos);
        if (!ty || !expect(p, T_LPAREN,
                           t->kind == T_LINE     ? "after 'line'"
                           : t->kind == T_TENSOR ? "after 'tensor'"
                                                 : "after 'array'"))
            return NULL;
        if (++p->depth > LANG_MAX_NEST) {
            error_at(p, t->pos, NULL, "type nested too deeply");
            p->depth--;
            return NULL;
        }
        ty->elem = parse_type(p);
        p->depth--;
        if (!ty->elem) return NULL;
        if (t->kind != T_ARRAY && accept(p, T_COMMA)) {
            ty->arg = parse_expr(p);
            if (!ty->arg) return NULL;
        }
        if (!expect(p, T_RPAREN, "to close the type")) return NULL;
        return ty;
    }
    default: {
        char found[64];
        describe(t, found, sizeof(found));
        error_at(p, t->pos, NULL, "expected a type, found %s", found);
        return NULL;
    }
    }
}

/* ---- statements --------------------------------------------------------------------------------
 */

static ast_stmt *parse_stmt(parser *p);

static ast_stmt *new_stmt(parser *p, st_kind kind, lpos pos)
{
    ast_stmt *s = alloc(p, sizeof(*s));
    if (!s) return NULL;
    s->kind = (uint8_t)kind;
    s->pos = s->name_pos = pos;
    s->slot = -1;
    return s;
}

static ast_stmt *parse_block(parser *p)
{
    lpos pos = peek(p)->pos;
    if (!expect(p, T_LBRACE, NULL)) return NULL;
    ast_stmt *b = new_stmt(p, ST_BLOCK, pos);
    if (!b) return NULL;
    struct {
        ast_stmt **items;
        size_t len, cap;
    } list = {0};
    while (!at_kind(p, T_RBRACE) && !at_kind(p, T_EOF) && !p->oom && !em_lang_sink_full(p->sink)) {
        size_t before = p->i;
        ast_stmt *s = parse_stmt(p);
        if (!s || p->panic) sync_stmt(p);
        if (s && !EM_VEC_PUSH(&list, s)) p->oom = true;
        if (p->i == before) next(p); /* always make progress */
    }
    if (!at_kind(p, T_RBRACE)) {
        error_at(p, peek(p)->pos, NULL, "expected '}' to close the block opened at line %u",
                 pos.line);
    } else {
        next(p);
    }
    if (list.len) {
        b->stmts = alloc(p, list.len * sizeof(ast_stmt *));
        if (b->stmts) memcpy(b->stmts, list.items, list.len * sizeof(ast_stmt *));
        b->nstmts = b->stmts ? (uint32_t)list.len : 0;
    }
    free(list.items);
    return b;
}

/* The rest of a declaration after its type: name ['[' len ']'] ['=' init] ';'. */
static ast_stmt *parse_decl_rest(parser *p, ast_stmt *s)
{
    s->name = expect_ident(p, "a name in the declaration", &s->name_pos);
    if (!s->name) return NULL;
    if (accept(p, T_LBRACKET)) {
        s->array_len = parse_expr(p);
        if (!s->array_len || !expect(p, T_RBRACKET, "after the array length")) return NULL;
    }
    if (accept(p, T_ASSIGN)) {
        s->init = parse_expr(p);
        if (!s->init) return NULL;
    }
    if (!expect(p, T_SEMI, "after the declaration")) return NULL;
    return s;
}

static ast_stmt *parse_if(parser *p, lpos pos, bool comptime)
{
    next(p); /* if */
    ast_stmt *s = new_stmt(p, ST_IF, pos);
    if (!s) return NULL;
    s->is_comptime = comptime;
    if (!expect(p, T_LPAREN, "after 'if'")) return NULL;
    s->cond = parse_expr(p);
    if (!s->cond || !expect(p, T_RPAREN, "after the condition")) return NULL;
    s->body = parse_stmt(p);
    if (!s->body) return NULL;
    if (accept(p, T_ELSE)) {
        s->els = parse_stmt(p);
        if (!s->els) return NULL;
    }
    return s;
}

/* for ([type] name in range([start,] end[, step])) body */
static ast_stmt *parse_for(parser *p, lpos pos, bool comptime)
{
    next(p); /* for */
    ast_stmt *s = new_stmt(p, ST_FOR, pos);
    if (!s) return NULL;
    s->is_comptime = comptime;
    if (!expect(p, T_LPAREN, "after 'for'")) return NULL;
    if (!(at_kind(p, T_IDENT) && peek_at(p, 1)->kind == T_IN)) {
        if (!is_type_start(p, peek(p))) {
            char found[64];
            describe(peek(p), found, sizeof(found));
            error_at(p, peek(p)->pos, "loops are written 'for (u32 i in range(start, end))'",
                     "expected the loop variable, found %s", found);
            return NULL;
        }
        s->type = parse_type(p);
        if (!s->type) return NULL;
    }
    s->name = expect_ident(p, "the loop variable", &s->name_pos);
    if (!s->name) return NULL;
    if (!at_kind(p, T_IN)) {
        char found[64];
        describe(peek(p), found, sizeof(found));
        error_at(p, peek(p)->pos, "loops are written 'for (u32 i in range(start, end))'",
                 "expected 'in' after the loop variable, found %s", found);
        return NULL;
    }
    next(p);
    const token *r = peek(p);
    if (r->kind != T_IDENT || !r->str || strcmp(r->str, "range") != 0) {
        char found[64];
        describe(r, found, sizeof(found));
        error_at(p, r->pos, "loops are written 'for (u32 i in range(start, end))'",
                 "expected 'range(...)' after 'in', found %s", found);
        return NULL;
    }
    next(p);
    ast_expr **args = NULL;
    uint32_t nargs = 0;
    if (!parse_args(p, &args, &nargs, false)) return NULL;
    if (nargs < 1 || nargs > 3) {
        error_at(p, r->pos, NULL,
                 "range takes 1 to 3 arguments (end; start, end; start, end, step)");
        return NULL;
    }
    s->cond = nargs >= 2 ? args[0] : NULL;
    s->end = nargs >= 2 ? args[1] : args[0];
    s->step = nargs == 3 ? args[2] : NULL;
    if (!expect(p, T_RPAREN, "after the range")) return NULL;
    s->body = parse_stmt(p);
    return s->body ? s : NULL;
}

/* matrix(role, elem, m, n, k[, layout]) name; */
static ast_stmt *parse_matrix(parser *p, lpos pos)
{
    next(p); /* matrix */
    ast_stmt *s = new_stmt(p, ST_MATRIX, pos);
    if (!s || !expect(p, T_LPAREN, "after 'matrix'")) return NULL;
    lpos rpos;
    const char *role = expect_ident(p, "a matrix role (a, b or acc)", &rpos);
    if (!role) return NULL;
    if (!strcmp(role, "a"))
        s->role = EM_MAT_A;
    else if (!strcmp(role, "b"))
        s->role = EM_MAT_B;
    else if (!strcmp(role, "acc"))
        s->role = EM_MAT_ACC;
    else
        return error_at(p, rpos, NULL, "unknown matrix role '%s' (expected a, b or acc)", role),
               NULL;
    if (!expect(p, T_COMMA, "after the matrix role")) return NULL;
    s->type = parse_type(p);
    if (!s->type) return NULL;
    for (int d = 0; d < 3; d++) {
        if (!expect(p, T_COMMA, "in the matrix shape (m, n, k)")) return NULL;
        s->dims[d] = parse_expr(p);
        if (!s->dims[d]) return NULL;
    }
    s->layout = EM_ROW_MAJOR;
    if (accept(p, T_COMMA)) {
        const token *t = peek(p);
        bool plain = t->kind == T_IDENT && t->str && peek_at(p, 1)->kind == T_RPAREN;
        if (plain && !strcmp(t->str, "row_major")) {
            next(p);
        } else if (plain && !strcmp(t->str, "col_major")) {
            next(p);
            s->layout = EM_COL_MAJOR;
        } else if (plain) {
            return error_at(p, t->pos, NULL,
                            "unknown layout '%s' (expected row_major or col_major)", t->str),
                   NULL;
        } else {
            /* a comptime choice, e.g. TRANS ? col_major : row_major (checked when lowering) */
            s->layout_expr = parse_expr(p);
            if (!s->layout_expr) return NULL;
        }
    }
    if (!expect(p, T_RPAREN, "after the matrix type")) return NULL;
    s->name = expect_ident(p, "a name for the matrix", &s->name_pos);
    if (!s->name || !expect(p, T_SEMI, "after the declaration")) return NULL;
    return s;
}

static ast_stmt *parse_simple(parser *p)
{
    const token *t = peek(p);
    lpos pos = t->pos;
    if (t->kind == T_PLUSPLUS || t->kind == T_MINUSMINUS) {
        next(p);
        ast_stmt *s = new_stmt(p, ST_ASSIGN, pos);
        if (!s) return NULL;
        s->op = t->kind == T_PLUSPLUS ? T_PLUSEQ : T_MINUSEQ;
        s->name_pos = pos;
        s->lhs = parse_unary(p);
        if (!s->lhs) return NULL;
        s->init = new_expr(p, EX_INT, pos);
        if (!s->init) return NULL;
        s->init->ival = 1;
        return expect(p, T_SEMI, "after the statement") ? s : NULL;
    }
    ast_expr *e = parse_expr(p);
    if (!e) return NULL;
    const token *op = peek(p);
    ast_stmt *s;
    switch (op->kind) {
    case T_ASSIGN:
    case T_PLUSEQ:
    case T_MINUSEQ:
    case T_STAREQ:
    case T_SLASHEQ:
    case T_PERCENTEQ:
    case T_AMPEQ:
    case T_PIPEEQ:
    case T_CARETEQ:
    case T_SHLEQ:
    case T_SHREQ:
        next(p);
        s = new_stmt(p, ST_ASSIGN, pos);
        if (!s) return NULL;
        s->op = op->kind;
        s->name_pos = op->pos;
        s->lhs = e;
        s->init = parse_expr(p);
        if (!s->init) return NULL;
        break;
    case T_PLUSPLUS:
    case T_MINUSMINUS:
        next(p);
        s = new_stmt(p, ST_ASSIGN, pos);
        if (!s) return NULL;
        s->op = op->kind == T_PLUSPLUS ? T_PLUSEQ : T_MINUSEQ;
        s->name_pos = op->pos;
        s->lhs = e;
        s->init = new_expr(p, EX_INT, op->pos);
        if (!s->init) return NULL;
        s->init->ival = 1;
        break;
    default:
        s = new_stmt(p, ST_EXPR, pos);
        if (!s) return NULL;
        s->init = e;
    }
    if (at_kind(p, T_ASSIGN) || at_kind(p, T_PLUSEQ)) {
        error_at(p, peek(p)->pos, NULL,
                 "assignments cannot be chained: an assignment is a statement");
        return NULL;
    }
    return expect(p, T_SEMI, "after the statement") ? s : NULL;
}

static ast_stmt *parse_stmt_inner(parser *p)
{
    const token *t = peek(p);
    lpos pos = t->pos;
    switch (t->kind) {
    case T_LBRACE:
        return parse_block(p);
    case T_SEMI:
        next(p);
        return new_stmt(p, ST_EMPTY, pos);
    case T_IF:
        return parse_if(p, pos, false);
    case T_FOR:
        return parse_for(p, pos, false);
    case T_WHILE: {
        next(p);
        ast_stmt *s = new_stmt(p, ST_WHILE, pos);
        if (!s || !expect(p, T_LPAREN, "after 'while'")) return NULL;
        s->cond = parse_expr(p);
        if (!s->cond || !expect(p, T_RPAREN, "after the condition")) return NULL;
        s->body = parse_stmt(p);
        return s->body ? s : NULL;
    }
    case T_BREAK:
    case T_CONTINUE: {
        next(p);
        ast_stmt *s = new_stmt(p, t->kind == T_BREAK ? ST_BREAK : ST_CONTINUE, pos);
        return s && expect(p, T_SEMI, t->kind == T_BREAK ? "after 'break'" : "after 'continue'")
                   ? s
                   : NULL;
    }
    case T_RETURN: {
        next(p);
        ast_stmt *s = new_stmt(p, ST_RETURN, pos);
        if (!s) return NULL;
        if (!at_kind(p, T_SEMI)) {
            s->init = parse_expr(p);
            if (!s->init) return NULL;
        }
        return expect(p, T_SEMI, "after the return statement") ? s : NULL;
    }
    case T_COMPTIME: {
        next(p);
        if (at_kind(p, T_IF)) return parse_if(p, pos, true);
        if (at_kind(p, T_FOR)) return parse_for(p, pos, true);
        ast_stmt *s = new_stmt(p, ST_DECL, pos);
        if (!s) return NULL;
        s->is_comptime = true;
        s->type = parse_type(p);
        if (!s->type) return NULL;
        return parse_decl_rest(p, s);
    }
    case T_CONST: {
        next(p);
        ast_stmt *s = new_stmt(p, ST_DECL, pos);
        if (!s) return NULL;
        s->is_const = true;
        s->type = parse_type(p);
        if (!s->type) return NULL;
        return parse_decl_rest(p, s);
    }
    case T_SHARED: {
        next(p);
        ast_stmt *s = new_stmt(p, ST_DECL, pos);
        if (!s) return NULL;
        s->storage = STORE_SHARED;
        s->type = parse_type(p);
        if (!s->type) return NULL;
        return parse_decl_rest(p, s);
    }
    case T_MATRIX:
        return parse_matrix(p, pos);
    case T_KERNEL:
    case T_INLINE:
        error_at(p, pos, NULL, "functions cannot be declared inside a function");
        return NULL;
    case T_ELSE:
        error_at(p, pos, NULL, "'else' without a matching 'if'");
        return NULL;
    default:
        break;
    }
    if (is_type_start(p, t)) {
        size_t end = skip_type(p, p->i);
        if (end && end < p->n && p->t[end].kind == T_IDENT) {
            ast_stmt *s = new_stmt(p, ST_DECL, pos);
            if (!s) return NULL;
            s->type = parse_type(p);
            if (!s->type) return NULL;
            return parse_decl_rest(p, s);
        }
    }
    /* "x y ..." where x is not a known type: most likely a misspelled type name */
    if (t->kind == T_IDENT && peek_at(p, 1)->kind == T_IDENT) {
        ast_stmt *s = new_stmt(p, ST_DECL, pos);
        if (!s) return NULL;
        s->type = parse_type(p); /* a TY_NAME that resolve reports as an unknown type */
        if (!s->type) return NULL;
        return parse_decl_rest(p, s);
    }
    return parse_simple(p);
}

static ast_stmt *parse_stmt(parser *p)
{
    if (++p->depth > LANG_MAX_NEST) {
        error_at(p, peek(p)->pos, NULL, "statements nested too deeply (more than %d levels)",
                 LANG_MAX_NEST);
        p->depth--;
        /* skip the rest of the nesting quickly without recursing */
        return NULL;
    }
    ast_stmt *s = parse_stmt_inner(p);
    p->depth--;
    return s;
}

/* ---- declarations ---------------------------------------------------------------------------- */

static bool parse_bound(parser *p, ast_generic *g)
{
    lpos pos;
    const char *b = expect_ident(p, "a bound (float, int, sint, uint, num or any)", &pos);
    if (!b) return false;
    static const char *const names[] = {"any", "num", "float", "int", "sint", "uint"};
    for (unsigned i = 0; i < EM_ARRAY_LEN(names); i++) {
        if (!strcmp(b, names[i])) {
            g->bound = (uint8_t)i;
            return true;
        }
    }
    char hint[128];
    bool h = em_lang_nearest(b, names, EM_ARRAY_LEN(names), hint, sizeof(hint));
    return error_at(p, pos, h ? hint : "bounds are float, int, sint, uint, num and any",
                    "unknown bound '%s'", b);
}

static bool parse_generics(parser *p, ast_func *f)
{
    if (!accept(p, T_LT)) return true;
    ast_generic tmp[LANG_MAX_GENERICS];
    uint32_t n = 0;
    do {
        if (n == LANG_MAX_GENERICS)
            return error_at(p, peek(p)->pos, NULL, "too many generic parameters (at most %d)",
                            LANG_MAX_GENERICS);
        ast_generic g = {0};
        g.name = expect_ident(p, "a generic parameter name", &g.pos);
        if (!g.name) return false;
        if (accept(p, T_COLON) && !parse_bound(p, &g)) return false;
        tmp[n++] = g;
        p->gens = tmp;
        p->ngens = n;
        if (accept(p, T_ASSIGN)) {
            tmp[n - 1].def = parse_type(p);
            if (!tmp[n - 1].def) return false;
        }
    } while (accept(p, T_COMMA));
    if (!expect(p, T_GT, "to close the generic parameters")) return false;
    f->generics = alloc(p, n * sizeof(ast_generic));
    if (!f->generics) return false;
    memcpy(f->generics, tmp, n * sizeof(ast_generic));
    f->ngenerics = n;
    p->gens = f->generics;
    p->ngens = n;
    return true;
}

static bool parse_params(parser *p, ast_func *f)
{
    if (!expect(p, T_LPAREN, "before the parameters")) return false;
    if (at_kind(p, T_VOID) && peek_at(p, 1)->kind == T_RPAREN) next(p);
    ast_param tmp[LANG_MAX_PARAMS];
    uint32_t n = 0;
    if (!at_kind(p, T_RPAREN)) {
        do {
            if (n == LANG_MAX_PARAMS)
                return error_at(p, peek(p)->pos, NULL, "too many parameters (at most %d)",
                                LANG_MAX_PARAMS);
            ast_param q = {0};
            q.type_pos = peek(p)->pos;
            for (;;) {
                if (accept(p, T_CONST))
                    q.is_const = true;
                else if (accept(p, T_COMPTIME))
                    q.is_comptime = true;
                else
                    break;
            }
            q.type_pos = peek(p)->pos;
            q.type = parse_type(p);
            if (!q.type) return false;
            q.name = expect_ident(p, "a parameter name", &q.pos);
            if (!q.name) return false;
            if (accept(p, T_ASSIGN)) {
                q.def = parse_expr(p);
                if (!q.def) return false;
            }
            tmp[n++] = q;
        } while (accept(p, T_COMMA));
    }
    if (!at_kind(p, T_RPAREN)) {
        char found[64];
        describe(peek(p), found, sizeof(found));
        return error_at(p, peek(p)->pos, NULL, "expected ',' or ')' after a parameter, found %s",
                        found);
    }
    next(p);
    if (n) {
        f->params = alloc(p, n * sizeof(ast_param));
        if (!f->params) return false;
        memcpy(f->params, tmp, n * sizeof(ast_param));
    }
    f->nparams = n;
    return true;
}

static bool parse_func(parser *p)
{
    ast_func *f = alloc(p, sizeof(*f));
    if (!f) return false;
    p->gens = NULL;
    p->ngens = 0;
    if (accept(p, T_KERNEL)) {
        f->is_kernel = true;
        if (!parse_generics(p, f)) return false;
    } else if (accept(p, T_INLINE)) {
        if (!parse_generics(p, f)) return false;
    }
    f->ret = parse_type(p);
    if (!f->ret) return false;
    f->name = expect_ident(p, f->is_kernel ? "the kernel's name" : "the function's name", &f->pos);
    if (!f->name || !parse_params(p, f)) return false;
    if (f->is_kernel && accept(p, T_CUBE_DIM)) {
        ast_expr **args = NULL;
        uint32_t nargs = 0;
        lpos cpos = p->t[p->i - 1].pos;
        if (!parse_args(p, &args, &nargs, false)) return false;
        if (nargs < 1 || nargs > 3) return error_at(p, cpos, NULL, "cube_dim takes 1 to 3 sizes");
        for (uint32_t i = 0; i < nargs; i++) f->cube_dim[i] = args[i];
    }
    if (f->is_kernel && accept(p, T_CLUSTER_DIM)) {
        ast_expr **args = NULL;
        uint32_t nargs = 0;
        lpos cpos = p->t[p->i - 1].pos;
        if (!parse_args(p, &args, &nargs, false)) return false;
        if (nargs != 1)
            return error_at(p, cpos, NULL, "cluster_dim takes one size (cubes along x)");
        f->cluster_dim = args[0];
    }
    if (!at_kind(p, T_LBRACE)) {
        char found[64];
        describe(peek(p), found, sizeof(found));
        return error_at(p, peek(p)->pos, NULL, "expected '{' to open the body of '%s', found %s",
                        f->name, found);
    }
    p->depth = 0;
    f->body = parse_block(p);
    if (!f->body) return false;
    f->index = (uint32_t)p->mod->funcs.len;
    if (!EM_VEC_PUSH(&p->mod->funcs, f)) p->oom = true;
    return true;
}

static bool parse_global(parser *p)
{
    ast_global *g = alloc(p, sizeof(*g));
    if (!g) return false;
    next(p); /* const */
    p->gens = NULL;
    p->ngens = 0;
    g->type = parse_type(p);
    if (!g->type) return false;
    g->name = expect_ident(p, "the constant's name", &g->pos);
    if (!g->name || !expect(p, T_ASSIGN, "after the constant's name (a constant needs a value)"))
        return false;
    g->init = parse_expr(p);
    if (!g->init || !expect(p, T_SEMI, "after the constant")) return false;
    g->index = (uint32_t)p->mod->globals.len;
    if (!EM_VEC_PUSH(&p->mod->globals, g)) p->oom = true;
    return true;
}

bool em_lang_parse(const token_vec *toks, em_arena *arena, lang_sink *sink, ast_module *mod)
{
    parser P = {toks->items, toks->len, 0, arena, sink, mod, 0, false, false, NULL, 0};
    parser *p = &P;
    while (!at_kind(p, T_EOF) && !p->oom && !em_lang_sink_full(sink)) {
        const token *t = peek(p);
        size_t before = p->i;
        bool ok;
        if (t->kind == T_KERNEL || t->kind == T_INLINE || t->kind == T_TYPE || t->kind == T_VOID ||
            t->kind == T_LINE) {
            ok = parse_func(p);
        } else if (t->kind == T_CONST) {
            ok = parse_global(p);
        } else if (t->kind == T_SEMI) {
            next(p);
            ok = true;
        } else {
            char found[64];
            describe(t, found, sizeof(found));
            static const char *const starts[] = {"kernel", "inline", "const"};
            char hint[128];
            bool h = t->kind == T_IDENT && t->str &&
                     em_lang_nearest(t->str, starts, EM_ARRAY_LEN(starts), hint, sizeof(hint));
            if (t->kind == T_IDENT && peek_at(p, 1)->kind == T_IDENT && !h)
                snprintf(
                    hint, sizeof(hint),
                    "a helper returning a generic type is declared 'inline<T: float> T name(...)'"),
                    h = true;
            ok = error_at(p, t->pos, h ? hint : NULL,
                          "expected a declaration (kernel, helper function or const), found %s",
                          found);
        }
        if (!ok || p->panic) sync_top(p);
        if (p->i == before) next(p);
    }
    if (p->oom) em_set_error(EM_ERR_NOMEM, "out of memory parsing kernel source");
    return !p->oom;
}
