/* internal.h — what the files of the kernel-language front end share: source files and positions,
 * the diagnostic sink, tokens (lex.c), the syntax tree (parse.c builds it, resolve.c binds its
 * names, lower*.c turn it into IR for one set of bindings), and the module (module.c).
 *
 * Pipeline: source → lex → parse → resolve (per module, binding-independent errors) → lower (per
 * specialization: types, comptime folding, inlining, unrolling) → IR via the builder API. */
#ifndef EM_KERNEL_LANG_INTERNAL_H
#define EM_KERNEL_LANG_INTERNAL_H

#include <stdarg.h>

#include "base/base.h"
#include "ember/kernel.h"
#include "ember/lang.h"

/* ---- limits (every input stays within them or gets a diagnostic) ---------------------------- */

#define LANG_MAX_NEST 96            /* nesting of statements in the parser */
#define LANG_MAX_HEIGHT 256         /* height of one expression tree */
#define LANG_MAX_ARGS 48            /* arguments of one call (a fused prologue passes its leaves) */
#define LANG_MAX_GENERICS 32        /* generic parameters of one function */
#define LANG_MAX_PARAMS 64          /* parameters of one function */
#define LANG_MAX_INLINE 48          /* helper calls inlined inside one another */
#define LANG_MAX_UNROLL 4096        /* iterations of one comptime for */
#define LANG_MAX_WORK 400000        /* statements + expressions lowered for one kernel */
#define LANG_MAX_INSTS 200000       /* IR instructions in one kernel */
#define LANG_MAX_ARRAY (1u << 24)   /* elements of a shared or local array */
#define LANG_MAX_SOURCE (16u << 20) /* bytes of one source file */

/* ---- sources and positions ------------------------------------------------------------------- */

typedef struct lang_file {
    char *name; /* file name used in diagnostics (owned) */
    char *text; /* NUL-terminated contents (owned) */
    size_t len; /* bytes in text */
} lang_file;

typedef struct lpos {
    uint32_t file; /* index in the module's files */
    uint32_t line; /* 1-based */
    uint32_t col;  /* 1-based, in bytes */
} lpos;

/* Where errors go during one front-end call: kept up to EM_LANG_MAX_ERRORS, the rest counted. */
typedef struct lang_sink {
    em_lang_diags *diags;   /* destination list */
    const lang_file *files; /* the module's files, for names and source lines */
    size_t nfiles;          /* entries in files */
    unsigned errors;        /* errors reported during this call */
} lang_sink;

/* Reports an error at `pos`; `hint` may be NULL. Returns false (so callers can `return err(...)`).
 */
bool em_lang_error(lang_sink *s, lpos pos, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool em_lang_verror(lang_sink *s, lpos pos, const char *hint, const char *fmt, va_list ap);
/* True once the error limit is reached (callers stop early). */
bool em_lang_sink_full(const lang_sink *s);
/* Adds a diagnostic without a source position (bad bindings, unknown kernel). */
void em_lang_error_nopos(lang_sink *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fills `out` (size outsz) with a hint naming the candidates nearest to `name` by edit distance
 * ("did you mean 'x'?" or "did you mean 'x' or 'y'?"); returns false when none is near. */
bool em_lang_nearest(const char *name, const char *const *cands, size_t n, char *out, size_t outsz);
/* Moves every diagnostic of `from` to the end of `to`. */
void em_lang_diags_move(em_lang_diags *to, em_lang_diags *from);

/* ---- tokens ---------------------------------------------------------------------------------- */

typedef enum tok_kind {
    T_EOF = 0,
    T_IDENT,
    T_INT,    /* integer literal: tok.ival */
    T_FLOAT,  /* float literal: tok.fval */
    T_STRING, /* string literal: tok.str (escapes decoded) */
    T_TYPE,   /* scalar type keyword: tok.scalar */
    /* punctuation */
    T_LPAREN,
    T_RPAREN,
    T_LBRACE,
    T_RBRACE,
    T_LBRACKET,
    T_RBRACKET,
    T_COMMA,
    T_SEMI,
    T_COLON,
    T_DOT,
    T_QUESTION,
    /* operators */
    T_PLUS,
    T_MINUS,
    T_STAR,
    T_SLASH,
    T_PERCENT,
    T_AMP,
    T_PIPE,
    T_CARET,
    T_TILDE,
    T_BANG,
    T_LT,
    T_GT,
    T_LE,
    T_GE,
    T_EQEQ,
    T_NE,
    T_SHL,
    T_SHR,
    T_ANDAND,
    T_OROR,
    T_ASSIGN,
    T_PLUSEQ,
    T_MINUSEQ,
    T_STAREQ,
    T_SLASHEQ,
    T_PERCENTEQ,
    T_AMPEQ,
    T_PIPEEQ,
    T_CARETEQ,
    T_SHLEQ,
    T_SHREQ,
    T_PLUSPLUS,
    T_MINUSMINUS,
    /* keywords */
    T_KERNEL,
    T_INLINE,
    T_VOID,
    T_CONST,
    T_COMPTIME,
    T_SHARED,
    T_IF,
    T_ELSE,
    T_FOR,
    T_IN,
    T_WHILE,
    T_BREAK,
    T_CONTINUE,
    T_RETURN,
    T_TRUE,
    T_FALSE,
    T_AUTO,
    T_LINE,
    T_TENSOR,
    T_ARRAY,
    T_MATRIX,
    T_BITCAST,
    T_INTRINSIC,
    T_CUBE_DIM,
    T_CLUSTER_DIM,
    T_COUNT
} tok_kind;

typedef struct token {
    uint16_t kind;    /* a tok_kind */
    uint8_t scalar;   /* T_TYPE: an em_scalar */
    bool is_unsigned; /* T_INT: written with a u suffix (a u32 literal) */
    lpos pos;         /* first character */
    const char *text; /* points into the source (identifiers, for messages) */
    uint32_t len;     /* bytes of text */
    int64_t ival;     /* T_INT */
    double fval;      /* T_FLOAT */
    char *str;        /* T_STRING / T_IDENT: NUL-terminated copy in the arena */
} token;

typedef struct token_vec {
    token *items; /* tokens, ending with T_EOF */
    size_t len, cap;
} token_vec;

/* Appends the tokens of file `file` to `out` (ending with one T_EOF). Lexical errors go to the
 * sink; strings are copied into `arena`. False only when out of memory. */
bool em_lang_lex(const lang_file *f, uint32_t file, em_arena *arena, lang_sink *sink,
                 token_vec *out);
/* "identifier", "'+'", "'kernel'"... for messages. */
const char *em_lang_tok_name(tok_kind k);

/* ---- syntax tree ----------------------------------------------------------------------------- */

typedef struct ast_type ast_type;
typedef struct ast_expr ast_expr;
typedef struct ast_stmt ast_stmt;
typedef struct ast_func ast_func;
typedef struct ast_global ast_global;

typedef enum ty_kind {
    TY_SCALAR = 0, /* a scalar keyword: scalar */
    TY_NAME,       /* an identifier: a generic parameter once resolved (generic >= 0) */
    TY_LINE,       /* line(elem[, arg = width]) */
    TY_TENSOR,     /* tensor(elem[, arg = rank]) */
    TY_ARRAY,      /* array(elem) */
    TY_VOID,
    TY_AUTO,
} ty_kind;

struct ast_type {
    uint8_t kind;     /* a ty_kind */
    uint8_t scalar;   /* TY_SCALAR */
    int16_t generic;  /* TY_NAME: index in the function's generics, -1 until resolved */
    lpos pos;         /* where the type is written */
    const char *name; /* TY_NAME */
    ast_type *elem;   /* line/tensor/array element */
    ast_expr *arg;    /* line width / tensor rank (NULL = default) */
};

typedef enum ex_kind {
    EX_INT = 0,   /* ival (untyped; a u32 when op is 'u') */
    EX_FLOAT,     /* fval (untyped) */
    EX_BOOL,      /* ival 0/1 */
    EX_STRING,    /* str (only as print/intrinsic argument) */
    EX_NAME,      /* name */
    EX_UNARY,     /* op a */
    EX_BINARY,    /* a op b (including && and ||) */
    EX_TERNARY,   /* a ? b : c */
    EX_CALL,      /* name(args): helper, builtin function or functional cast F(x) */
    EX_INDEX,     /* a[b] */
    EX_CAST,      /* (type)a, type(a...) for keyword and line types */
    EX_BITCAST,   /* bitcast<type>(a) */
    EX_INTRINSIC, /* intrinsic<type>("name", args) */
} ex_kind;

/* What a name or call refers to, filled by resolve. */
typedef enum sym_kind {
    SYM_NONE = 0,
    SYM_LOCAL,      /* a local declaration, loop variable or parameter: slot */
    SYM_GLOBAL,     /* a module-level constant: global */
    SYM_GENERIC,    /* a generic type parameter: slot = index */
    SYM_POS,        /* a built-in position: slot = em_builtin */
    SYM_LINE_WIDTH, /* LINE_WIDTH */
    SYM_FUNC,       /* a helper function: func */
    SYM_BUILTIN,    /* a builtin function: slot = builtin id */
    SYM_TYPE_CAST,  /* a call whose callee is a type (F(x), f32(x)) */
    SYM_LAYOUT,     /* row_major / col_major: slot = em_mat_layout */
} sym_kind;

struct ast_expr {
    uint8_t kind;        /* an ex_kind */
    uint8_t sym;         /* names and calls: a sym_kind */
    uint16_t op;         /* unary/binary: the operator's tok_kind */
    uint16_t height;     /* height of the tree below (1 for leaves) */
    lpos pos;            /* where the expression starts */
    lpos op_pos;         /* binary/ternary: the operator; calls: the callee */
    int64_t ival;        /* EX_INT, EX_BOOL */
    double fval;         /* EX_FLOAT */
    const char *str;     /* EX_STRING / EX_INTRINSIC name (arena) */
    const char *name;    /* EX_NAME, EX_CALL callee */
    ast_expr *a, *b, *c; /* operands */
    ast_expr **args;     /* EX_CALL / EX_CAST / EX_INTRINSIC arguments */
    uint32_t nargs;      /* entries in args */
    ast_type *type;      /* EX_CAST, EX_BITCAST, EX_INTRINSIC (NULL = void); EX_CALL type casts */
    int32_t slot;        /* resolved: local slot, generic index, builtin id, position */
    ast_func *func;      /* SYM_FUNC */
    ast_global *global;  /* SYM_GLOBAL */
};

typedef enum st_kind {
    ST_BLOCK = 0, /* { stmts } */
    ST_DECL,      /* [const|comptime|shared] type name [ '[' array_len ']' ] [= init]; */
    ST_MATRIX,    /* matrix(role, elem, m, n, k[, layout]) name; */
    ST_EXPR,      /* expr; */
    ST_ASSIGN,    /* lhs op= rhs; (op T_ASSIGN, T_PLUSEQ... ; ++/-- become += 1 / -= 1) */
    ST_IF,        /* [comptime] if (cond) body [else els] */
    ST_FOR,       /* [comptime] for ([type] name in range(start, end[, step])) body */
    ST_WHILE,     /* while (cond) body */
    ST_BREAK,
    ST_CONTINUE,
    ST_RETURN, /* return [value]; */
    ST_EMPTY,  /* ; */
} st_kind;

enum { STORE_LOCAL = 0, STORE_SHARED };

struct ast_stmt {
    uint8_t kind;        /* an st_kind */
    bool is_comptime;    /* comptime if / comptime for / comptime declaration */
    bool is_const;       /* const declaration */
    uint8_t storage;     /* ST_DECL: STORE_LOCAL or STORE_SHARED */
    bool may_return;     /* resolve: a return statement lies inside */
    bool assigned;       /* resolve (ST_DECL): written after its declaration */
    uint16_t op;         /* ST_ASSIGN: the assignment operator */
    lpos pos;            /* first token */
    lpos name_pos;       /* declared name / assignment operator */
    ast_type *type;      /* ST_DECL / ST_FOR variable type (NULL = inferred) / ST_MATRIX elem */
    const char *name;    /* declared name (ST_DECL, ST_FOR, ST_MATRIX) */
    int32_t slot;        /* resolve: the declaration's slot */
    ast_expr *array_len; /* ST_DECL arrays */
    ast_expr *init;    /* ST_DECL initializer, ST_EXPR expression, ST_RETURN value, ST_ASSIGN rhs */
    ast_expr *lhs;     /* ST_ASSIGN target */
    ast_expr *cond;    /* ST_IF / ST_WHILE condition; ST_FOR start */
    ast_expr *end;     /* ST_FOR end */
    ast_expr *step;    /* ST_FOR step (NULL = 1) */
    ast_expr *dims[3]; /* ST_MATRIX m, n, k */
    uint8_t role;      /* ST_MATRIX: an em_mat_role */
    uint8_t layout;    /* ST_MATRIX: an em_mat_layout */
    ast_expr *layout_expr; /* ST_MATRIX: a comptime layout expression instead (NULL: layout) */
    ast_stmt *body;    /* ST_IF then, ST_FOR / ST_WHILE body */
    ast_stmt *els;     /* ST_IF else */
    ast_stmt **stmts;  /* ST_BLOCK */
    uint32_t nstmts;   /* entries in stmts */
};

typedef enum gen_bound {
    BOUND_ANY = 0, /* every scalar, bool included */
    BOUND_NUM,     /* integers and floats */
    BOUND_FLOAT,   /* f16 bf16 f32 f64 */
    BOUND_INT,     /* signed and unsigned integers */
    BOUND_SINT,    /* signed integers */
    BOUND_UINT,    /* unsigned integers */
} gen_bound;

typedef struct ast_generic {
    const char *name; /* F */
    lpos pos;         /* where declared */
    uint8_t bound;    /* a gen_bound */
    ast_type *def;    /* default type (NULL = first of the bound) */
} ast_generic;

typedef struct ast_param {
    const char *name; /* parameter name */
    lpos pos;         /* where its name is */
    lpos type_pos;    /* where its type starts */
    ast_type *type;   /* declared type */
    bool is_const;    /* const tensor / array */
    bool is_comptime; /* comptime parameter (kernels) */
    bool assigned;    /* resolve: written in the body */
    ast_expr *def;    /* comptime default */
} ast_param;

struct ast_func {
    const char *name;      /* kernel or helper name */
    lpos pos;              /* where the name is */
    bool is_kernel;        /* kernel (entry point) or helper (inlined) */
    bool resolved;         /* resolve finished without errors in its signature */
    ast_generic *generics; /* generic parameters */
    uint32_t ngenerics;
    ast_param *params; /* parameters, in order */
    uint32_t nparams;
    ast_type *ret;         /* return type (void for kernels) */
    ast_stmt *body;        /* the body block */
    ast_expr *cube_dim[3]; /* kernels: fixed cube dims (NULL = chosen at launch) */
    ast_expr *cluster_dim; /* kernels: cubes of a cluster along x (NULL = clusters of one) */
    uint32_t nslots;       /* resolve: parameters + local declarations */
    uint32_t index;        /* position in the module's function list */
};

struct ast_global {
    const char *name; /* module-level constant */
    lpos pos;         /* where its name is */
    ast_type *type;   /* declared scalar type (TY_AUTO allowed) */
    ast_expr *init;   /* comptime initializer */
    uint32_t index;   /* position in the module's constants */
};

typedef struct ast_module {
    struct {
        ast_func **items;
        size_t len, cap;
    } funcs; /* kernels and helpers */
    struct {
        ast_global **items;
        size_t len, cap;
    } globals; /* module-level constants */
} ast_module;

/* Parses the tokens of one file into `mod` (nodes in `arena`). Syntax errors go to the sink. */
bool em_lang_parse(const token_vec *toks, em_arena *arena, lang_sink *sink, ast_module *mod);

/* ---- builtin functions ------------------------------------------------------------------------
 */

typedef enum bi_class {
    BI_MATH1,      /* float math of one operand: ir_op */
    BI_ABS,        /* abs: numbers */
    BI_FLOATPRED,  /* isnan, isinf */
    BI_BITCOUNT,   /* popcount, clz, ctz */
    BI_MINMAX,     /* min, max: numbers */
    BI_POW,        /* pow */
    BI_CLAMP,      /* clamp(x, lo, hi) */
    BI_FMA,        /* fma(a, b, c) */
    BI_SELECT,     /* select(c, a, b) */
    BI_LEN,        /* len(t) */
    BI_SHAPE,      /* shape(t, d) / stride(t, d): ir_op */
    BI_RANK,       /* rank(t) */
    BI_LANES,      /* lanes(x) */
    BI_SYNC,       /* sync_cube, sync_plane, fence_cube, fence_device: ir_op, imm */
    BI_PLANE1,     /* plane reductions / scans of one operand */
    BI_PLANE_BOOL, /* plane_all, plane_any, plane_ballot */
    BI_PLANE2,     /* plane_broadcast, plane_shuffle*: value and lane */
    BI_ATOMIC,     /* atomic_*: ir_op */
    BI_MAT_FILL,
    BI_MAT_LOAD,
    BI_MAT_MMA,
    BI_MAT_STORE,
    BI_COPY_ASYNC, /* copy_async(dst, i, src, j, count[, valid]) */
    BI_COPY_SYNC,  /* copy_async_commit(), copy_async_wait(pending): ir_op */
    BI_WGMMA,      /* wgmma_fence, _fence_regs, _commit, _wait, _mma, _mma_rs (lower_wgmma.c) */
    BI_MBARRIER,   /* mbarrier_*, copy_async_arrive, setmaxnreg_* (imm: which; lower_mbarrier.c) */
    BI_PREFETCH,   /* prefetch(t, i): a hint that t[i] will be read (lower_call.c) */
    BI_DEPWAIT,    /* dependency_wait(): wait for the launches this one depends on */
    BI_TMA,        /* tma_load, tma_acquire, fence_proxy_async (imm: which; lower_tma.c) */
    BI_PRINT,
    BI_HAS,      /* has(capability) */
    BI_SIZEOF,   /* sizeof(T) */
    BI_TYPEPRED, /* is_float(T), is_int(T), is_signed(T) */
} bi_class;

typedef struct lang_builtin {
    const char *name; /* as written */
    uint8_t cls;      /* a bi_class */
    uint8_t min_args; /* fewest arguments */
    uint8_t max_args; /* most arguments */
    uint16_t ir_op;   /* the em_ir_op it lowers to, where one */
    int32_t imm;      /* an extra immediate (fence scope, type predicate) */
} lang_builtin;

extern const lang_builtin em_lang_builtins_table[];
extern const size_t em_lang_builtins_count;
/* The builtin's id, or -1. */
int em_lang_builtin_find(const char *name);
/* Target and capability names accepted by has(...), ending with NULL. */
extern const char *const em_lang_capabilities[];

/* The warpgroup MMA builtins (the imm of their BI_WGMMA entries). */
enum { WGMMA_FENCE, WGMMA_FENCE_REGS, WGMMA_COMMIT, WGMMA_WAIT, WGMMA_MMA, WGMMA_MMA_RS };
/* The barrier and register builtins (the imm of their BI_MBARRIER entries). */
enum {
    MBAR_INIT,
    MBAR_ARRIVE,
    MBAR_ARRIVE_TX,
    MBAR_COPY_ARRIVE,
    MBAR_WAIT,
    MBAR_TRY_WAIT,
    MBAR_ARRIVE_CLUSTER,
    MBAR_SETMAXNREG_INC,
    MBAR_SETMAXNREG_DEC,
    MBAR_LOAD_U32
};
/* The tensor-memory-accelerator builtins (the imm of their BI_TMA entries). */
enum {
    TMA_LOAD,
    TMA_ACQUIRE,
    TMA_FENCE_ASYNC,
    TMA_LOAD_MULTICAST,
    TMA_REDUCE_ADD,
    TMA_COMMIT,
    TMA_WAIT_READ
};

/* An intrinsic (as em_ir_intrinsic) that names the memory `mem` it works on (defined in
 * src/kernel/ir.c; the warpgroup MMA's lowering uses it). */
em_ir_val em_ir_intrinsic_mem(em_ir_kernel *k, const char *name, em_type dst_type, em_ir_mem mem,
                              const em_ir_val *args, unsigned nargs);

/* ---- resolve and lower -------------------------------------------------------------------------
 */

/* Binds every name of the module and checks what does not depend on bindings (declarations,
 * arity, control flow, recursion, intrinsic guards). Returns false when errors were reported. */
bool em_lang_resolve(ast_module *mod, lang_sink *sink);

/* The bindings of one specialization after validation against a kernel's declaration. */
typedef struct lang_binding {
    em_scalar generic[32];    /* generic index -> bound type */
    bool have_comptime[64];   /* parameter index -> value given */
    em_ir_const comptime[64]; /* parameter index -> comptime value (as the parameter's type) */
    unsigned line_width;      /* lanes of line(T) */
    const em_caps *caps;      /* target (NULL = portable) */
    bool check_mode;          /* missing comptime values default to 1/false/1.0 */
} lang_binding;

/* Lowers kernel `f` for `b` into a new IR kernel; NULL when errors were reported (or out of
 * memory, error set). */
em_ir_kernel *em_lang_lower(const ast_module *mod, const ast_func *f, const lang_binding *b,
                            lang_sink *sink);

/* Scalar kinds allowed by a generic bound, and the bound's name ("float"...). */
bool em_lang_bound_allows(gen_bound b, em_scalar s);
const char *em_lang_bound_name(gen_bound b);
em_scalar em_lang_bound_default(gen_bound b);

/* ---- the module's specialization cache (module.c) ------------------------------------------- */

/* The IR hash (em_ir_hash) that module m keeps for the specialization of `kernel` for `spec`,
 * lowering and hashing it on first use: what em_lang_compile finds the device's kernel by. false
 * (error set) when the kernel does not specialize. For tests. */
bool em_lang_spec_hash(const em_lang_module *m, const char *kernel, const em_lang_spec *spec,
                       char out[33]);

#endif
