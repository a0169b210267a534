/* lower.h — shared by the lowering files (lower.c: statements, places and the kernel entry;
 * lower_expr.c: expressions and helper inlining; lower_call.c: builtin calls; lower_value.c:
 * typed values, comptime folding, implicit conversions). Lowering walks the resolved syntax tree
 * once per specialization, with every generic, comptime value and line width known: it checks
 * types, folds comptime expressions, resolves comptime if, unrolls comptime for, inlines helpers
 * and emits IR through the builder API. */
#ifndef EM_KERNEL_LANG_LOWER_H
#define EM_KERNEL_LANG_LOWER_H

#include "kernel/lang/internal.h"

/* What an expression evaluates to. */
typedef enum vkind {
    V_ERR = 0,    /* an error was already reported: every use is silent */
    V_VOID,       /* a call that returns nothing */
    V_RT,         /* a run-time value: IR value v of type ty */
    V_CONST,      /* a comptime constant of type ty (scalar payload c, every lane equal) */
    V_ULIT_INT,   /* an untyped integer constant c.i (takes its type from where it is used) */
    V_ULIT_FLOAT, /* an untyped float constant c.f */
    V_MEM,        /* memory (tensor, array, shared or local array): mem */
    V_MATRIX,     /* a matrix fragment: v */
    V_TYPE,       /* a type (arguments of sizeof, is_float): ty */
    V_LAYOUT,     /* row_major / col_major: c.i */
} vkind;

typedef struct lv {
    uint8_t kind;     /* a vkind */
    uint8_t space;    /* V_MEM: an em_mem_space */
    bool writable;    /* V_MEM: stores allowed */
    bool is_var;      /* V_RT bound to a name: v is an IR variable that may be assigned */
    uint8_t rank;     /* V_MEM: tensor rank (0 for arrays, shared and local) */
    em_type ty;       /* V_RT, V_CONST, V_TYPE; V_MEM: element type */
    em_ir_val v;      /* V_RT, V_MATRIX */
    em_ir_const c;    /* V_CONST, V_ULIT_*, V_LAYOUT */
    em_ir_mem mem;    /* V_MEM */
    uint32_t length;  /* V_MEM shared/local: elements */
    const char *name; /* the name it was read through (for messages), or NULL */
} lv;

/* One function being lowered: the kernel, or one inlined call of a helper. */
typedef struct frame {
    const ast_func *fn;                    /* the function */
    lv *slots;                             /* fn->nslots bindings (parameters, then locals) */
    em_scalar generics[LANG_MAX_GENERICS]; /* bound generic types */
    unsigned width;                        /* lanes of line(T) written without a width */
    em_type ret_type;                      /* helpers: the result type */
    bool ret_void;                         /* helpers: returns nothing */
    bool tail_return;     /* helpers: the only return is the body's last statement */
    em_ir_val ret_var;    /* helpers (not tail_return): the result variable */
    em_ir_val done_var;   /* helpers (not tail_return): set once a return ran */
    unsigned loops;       /* IR loops open in this frame (a return breaks out of them) */
    lv result;            /* tail_return helpers: the value returned */
    struct frame *parent; /* the caller's frame */
} frame;

typedef struct lower {
    const ast_module *mod; /* the module */
    const lang_binding *b; /* the specialization */
    lang_sink *sink;       /* diagnostics */
    em_ir_kernel *k;       /* the kernel being built */
    frame *fr;             /* the innermost frame */
    lv *globals;           /* module constants, evaluated on first use */
    uint8_t *global_state; /* per constant: 0 not yet, 1 being evaluated, 2 done */
    unsigned inline_depth; /* helper calls open */
    unsigned ir_depth;     /* IR blocks open */
    unsigned long work;    /* statements and expressions lowered */
    bool abort;            /* a limit was hit: stop lowering */
    bool oom;              /* out of memory */
    bool wg_scratch_made;  /* wg_scratch exists (emulated wgmma_mma_rs) */
    em_ir_mem wg_scratch;  /* the shared array through which emulated units read A fragments */
} lower;

/* ---- lower_value.c ------------------------------------------------------------------------- */

lv em_lang_lv_err(void);
lv em_lang_lv_void(void);
lv em_lang_lv_rt(em_type ty, em_ir_val v);
lv em_lang_lv_const_int(em_scalar s, int64_t v); /* a typed comptime integer (or bool) */
lv em_lang_lv_const_uint(em_scalar s, uint64_t v);
lv em_lang_lv_const_float(em_scalar s, double v);
lv em_lang_lv_const_bool(bool v);
bool em_lang_lv_is_value(const lv *x);    /* V_RT, V_CONST or an untyped literal */
bool em_lang_lv_is_comptime(const lv *x); /* V_CONST or an untyped literal */
bool em_lang_lv_is_untyped(const lv *x);

/* "f32", "line(f32, 4)", "bool" — into a static-per-call buffer of the caller. */
void em_lang_type_str(em_type t, char *out, size_t outsz);
/* Describes a value's type for messages ("f32", "integer literal", "array 'x'"). */
void em_lang_lv_desc(const lv *x, char *out, size_t outsz);

/* Reports an error once per lowering (V_ERR operands are silent). Always returns em_lang_lv_err().
 */
lv em_lang_lerr(lower *L, lpos pos, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Requires x to be a value; reports what it is otherwise. */
bool em_lang_need_value(lower *L, const lv *x, lpos pos, const char *what);
/* Gives an untyped literal its default type (i32 / f32); typed values pass through. */
lv em_lang_lv_default(lower *L, lv x, lpos pos);
/* Implicit conversion of x to `to` (literals take the type, scalars broadcast to lines of the
 * same scalar kind); reports a mismatch naming both types and `what`. */
lv em_lang_coerce(lower *L, lv x, em_type to, lpos pos, const char *what);
/* Explicit conversion (casts): any scalar kind to any other, scalar to line. */
lv em_lang_convert(lower *L, lv x, em_type to, lpos pos);
/* The IR value of x (constants become IR constants of x's type). */
em_ir_val em_lang_materialize(lower *L, const lv *x);
/* A comptime integer value of x (any integer type or untyped), for sizes, bounds and indices. */
bool em_lang_comptime_int(lower *L, const lv *x, lpos pos, const char *what, int64_t *out);
/* A comptime bool. */
bool em_lang_comptime_bool(lower *L, const lv *x, lpos pos, const char *what, bool *out);
/* An index or lane: any integer value converted to u32. */
lv em_lang_to_index(lower *L, lv x, lpos pos, const char *what);
/* A bool scalar condition. */
bool em_lang_need_cond(lower *L, const lv *x, lpos pos, const char *what);

/* Binary operator (a token kind: T_PLUS...) on two values, with folding and typing. */
lv em_lang_binop(lower *L, int op, lv a, lv b, lpos pos);
/* Unary operator (T_MINUS, T_BANG, T_TILDE, T_PLUS). */
lv em_lang_unop(lower *L, int op, lv a, lpos pos);
/* Brings two operands to one type for a lane-wise operation (literals, broadcasting); false after
 * reporting a mismatch. `opname` is used in messages. */
bool em_lang_unify2(lower *L, lv *a, lv *b, lpos pos, const char *opname);
const char *em_lang_op_text(int op);

/* ---- lower_expr.c ---------------------------------------------------------------------------- */

/* Lowers an expression; `hint` (may be NULL) is the type the context expects, used only where an
 * expression has no type of its own (a conditional between two literals). */
lv em_lang_lower_expr(lower *L, const ast_expr *e, const em_type *hint);
/* The em_type of a written type in the current frame (line widths folded). */
bool em_lang_lower_type(lower *L, const ast_type *t, em_type *out);
/* Marks one unit of work; false (after reporting once) when the kernel grew past the limits. */
bool em_lang_tick(lower *L, lpos pos);
/* Opens / closes IR blocks while counting nesting. */
bool em_lang_ir_open(lower *L, lpos pos);
void em_lang_ir_close(lower *L);

/* ---- lower_call.c ---------------------------------------------------------------------------- */

lv em_lang_lower_builtin(lower *L, const ast_expr *e);

/* ---- lower_wgmma.c ------------------------------------------------------------------------- */

/* Whether the target runs warpgroup MMAs natively (CUDA on compute capability 9.0). */
bool em_lang_wgmma_native(const em_caps *caps);
/* True when L's target may lower a Hopper-only builtin (natively: CUDA sm_90a; emulated: the C
 * target); else reports "'builtin' needs <needs> ...; guard it with has(<feature>)" at e and
 * returns false. Shared by the wgmma and mbarrier builtins. */
bool em_lang_hopper_target(lower *L, const ast_expr *e, const char *builtin, const char *feature,
                           const char *needs);
/* A call of wgmma_fence / _commit / _wait / _mma (builtin b, arguments a already lowered). */
lv em_lang_lower_wgmma(lower *L, const ast_expr *e, const lang_builtin *b, lv *a);

/* ---- lower_mbarrier.c ---------------------------------------------------------------------- */

/* Whether the target has shared-memory barriers with phases and setmaxnreg (CUDA sm_90a). */
bool em_lang_mbarrier_native(const em_caps *caps);
/* A call of mbarrier_* / copy_async_arrive / setmaxnreg_* (builtin b, arguments a lowered). */
lv em_lang_lower_mbarrier(lower *L, const ast_expr *e, const lang_builtin *b, lv *a);

/* ---- lower_tma.c --------------------------------------------------------------------------- */

/* A call of tma_load / tma_acquire (builtin b, arguments a lowered). */
lv em_lang_lower_tma(lower *L, const ast_expr *e, const lang_builtin *b, lv *a);

/* ---- lower.c -----------------------------------------------------------------------------------
 */

/* Lowers the statements of a block (with the guards that helper returns need). */
void em_lang_lower_stmts(lower *L, ast_stmt *const *stmts, uint32_t n);
/* Binds a helper parameter / local: a variable when assigned later, else the value itself. */
lv em_lang_bind_local(lower *L, lv value, em_type ty, bool assigned, const char *name);

#endif
