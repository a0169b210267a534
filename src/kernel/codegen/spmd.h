/* spmd.h — the emitter shared by the GPU code generators (cuda.c, opencl.c, glsl.c).
 *
 * GPU targets run one kernel unit per hardware thread, with native barriers and plane (warp /
 * sub-group) operations, so one emitter walks the IR for all of them: declarations, structured
 * control flow, lane-wise arithmetic, casts and bitcasts, built-in positions, buffer metadata,
 * matrix ops lowered to loops. What differs per target (type names, memory access, plane ops,
 * atomics, synchronization, the kernel's signature and prelude) comes from a dialect table,
 * em_spmd_dialect, that each target file fills.
 *
 * Conventions every dialect follows (the drivers rely on them; each target file documents its
 * exact parameter ABI at its top):
 *  - Buffer parameters arrive as a pointer to element 0 (already offset). Their metadata arrives
 *    in one extra buffer, `meta`, always the last parameter (or binding) of every kernel: for each
 *    buffer parameter in parameter order, len, then shape[0..rank), then stride[0..rank), as
 *    unsigned 64-bit words (1 + 2*rank words per buffer; scalar parameters take none). len counts
 *    elements of the buffer's element type (lines for a line buffer); shapes and strides count
 *    scalars. Kernels without buffers still take `meta` (pass a one-word buffer).
 *  - Values compute in a "compute type": f16 and bf16 compute as 32-bit float rounded to their
 *    precision after every operation (exact IEEE results for + - * / sqrt, since float has more
 *    than twice their precision), bool as the target's bool; narrow integers wrap to their width
 *    after every operation. Memory holds the "storage type": f16/bf16 as 16-bit patterns, bool as
 *    one byte 0/1.
 *  - Integer division by zero does not trap: a / 0 == a and a % 0 == 0; for signed types
 *    MIN / -1 == MIN and MIN % -1 == 0 (the same rule as WGSL).
 *  - Plane ops must be reached by every unit of the plane (uniform control flow), as on CUDA.
 *  - Matrix ops lower to per-unit loops only where PLANE_DIM is 1 (every unit is its own plane,
 *    so it holds the whole fragment); elsewhere the target must map them to matrix units or
 *    reject them. */
#ifndef EM_KERNEL_CODEGEN_SPMD_H
#define EM_KERNEL_CODEGEN_SPMD_H
#include "base/base.h"
#include "ember/kernel.h"

typedef struct em_spmd em_spmd;

enum { EM_LINE_LANES = 0, EM_LINE_ASSIGN = 1, EM_LINE_OPS = 2 };

/* Facts about each memory object, found before emission (em_spmd.mflags). */
enum {
    EM_MEMF_USED = 1 << 0,      /* some reachable instruction uses it */
    EM_MEMF_ATOMIC = 1 << 1,    /* some atomic op touches it */
    EM_MEMF_FLOAT_RMW = 1 << 2, /* float atomics write it (add, sub, xchg, store) */
    EM_MEMF_MATRIX = 1 << 3,    /* matrix loads or stores use it */
};

/* Features a kernel uses (em_spmd.needs), collected while emitting so that a prelude holds only
 * the helpers and extensions that are used. */
enum {
    EM_NEED_F16 = 1u << 0,           /* f16 values or memory */
    EM_NEED_BF16 = 1u << 1,          /* bf16 values or memory */
    EM_NEED_F64 = 1u << 2,           /* f64 values or memory */
    EM_NEED_INT64 = 1u << 3,         /* 64-bit integer values or memory */
    EM_NEED_STORAGE8 = 1u << 4,      /* 8-bit buffer elements */
    EM_NEED_STORAGE16 = 1u << 5,     /* 16-bit buffer elements */
    EM_NEED_PLANE = 1u << 6,         /* plane built-ins or barriers */
    EM_NEED_PLANE_ARITH = 1u << 7,   /* plane reductions and scans */
    EM_NEED_PLANE_VOTE = 1u << 8,    /* plane all / any */
    EM_NEED_PLANE_BALLOT = 1u << 9,  /* plane ballot, broadcast */
    EM_NEED_SHUFFLE = 1u << 10,      /* plane shuffle, shuffle_xor */
    EM_NEED_SHUFFLE_REL = 1u << 11,  /* plane shuffle_up / down */
    EM_NEED_PLANE_MUL = 1u << 12,    /* plane product (OpenCL: non-uniform arithmetic) */
    EM_NEED_ATOMIC64 = 1u << 13,     /* 64-bit atomics */
    EM_NEED_ATOMIC_FLOAT = 1u << 14, /* native float atomic add */
    EM_NEED_FATOMIC_G = 1u << 15,    /* CAS-loop helpers for float atomics on global memory */
    EM_NEED_FATOMIC_L = 1u << 16,    /* ... on shared memory */
    EM_NEED_MATRIX = 1u << 17,       /* matrix units */
    EM_NEED_ERF = 1u << 18,          /* an erf helper */
    EM_NEED_BITS64 = 1u << 19,       /* 64-bit bit-count helpers */
    EM_NEED_UNROLL = 1u << 20,       /* unroll attributes */
    EM_NEED_PRINT = 1u << 21,        /* printf */
    EM_NEED_VECOPS = 1u << 22,       /* operators on whole lines */
    EM_NEED_BOOLMEM = 1u << 23,      /* bool storage conversions */
    EM_NEED_DYN_SMEM = 1u << 24,     /* CUDA: shared memory placed in dynamic shared memory */
    EM_NEED_COPY_ASYNC = 1u << 25,   /* CUDA: asynchronous copy helpers (cp.async) */
};

/* What a target supplies. Every hook writes text into `sb`; hooks that return an expression may
 * first emit whole statements with em_spmd_line (they come before the statement that uses the
 * expression). Hooks report what the target cannot express with em_spmd_fail. */
typedef struct em_spmd_dialect {
    const char *name;                   /* "CUDA", "OpenCL", "GLSL": for messages */
    const char *ns;                     /* intrinsic namespace: "cuda", "opencl", "glsl" */
    const char *ctype[EM_SCALAR_COUNT]; /* compute type of each scalar kind */
    const char *fn_prefix;              /* written before helper function definitions */
    const char *unroll;  /* line written before a loop marked for unrolling, or NULL */
    bool index32;        /* memory indices must be 32-bit (64-bit ones are converted to u32) */
    bool rem_via_div;    /* signed % is not C's remainder: compute a - (a / b) * b */
    bool float_rem_expr; /* no fmod: float % is a - b * trunc(a / b) */
    bool vector_math; /* float functions (exp, sqrt...) take whole vector lines (not em_ helpers) */

    /* Declaration "T name" of a variable of compute type t (arrays put [N] after the name). */
    void (*decl)(em_spmd *e, em_type t, const char *name, em_strbuf *sb);
    /* Lane i of the named line variable (of compute type t). */
    void (*lane)(em_spmd *e, em_type t, const char *name, unsigned i, em_strbuf *sb);
    /* What whole lines of type t support: EM_LINE_LANES (lane by lane only), EM_LINE_ASSIGN
     * (assignment as a whole), EM_LINE_OPS (also + - * / with a scalar operand broadcasting). */
    int (*line_kind)(em_spmd *e, em_type t);
    /* NULL when the device can use scalar kind s in values (space < 0) or in memory of the
     * given em_mem_space; else why not (the emitter rejects the instruction). NULL hook: all. */
    const char *(*dtype_missing)(em_spmd *e, em_scalar s, int space);
    /* A literal of scalar kind s in its compute type. */
    void (*literal)(em_spmd *e, em_scalar s, em_ir_const c, em_strbuf *sb);
    /* An initializer that zeroes a variable of type t ("= 0.0f", "= vec4(0.0)"), or nothing. */
    void (*zero)(em_spmd *e, em_type t, em_strbuf *sb);
    /* Converts a numeric (non-bool) scalar expression of kind `from` to kind `to`, wrapping
     * narrow integers and rounding f16/bf16. */
    void (*convert)(em_spmd *e, em_scalar from, em_scalar to, const char *x, em_strbuf *sb);
    /* A whole line x of kind `from` converted to kind `to` in one expression (packed conversion
     * instructions), or false when the target converts lane by lane. NULL hook: lane by lane. */
    bool (*line_convert)(em_spmd *e, em_scalar from, em_scalar to, unsigned lanes, const char *x,
                         em_strbuf *sb);
    /* Brings the result of an operation on kind s into range (narrow wrap, f16 rounding); writes
     * x unchanged for kinds that need nothing. */
    void (*wrap)(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb);
    /* The function computing op (a float unary op, POW, REM, MIN, MAX, FMA, ISNAN, ISINF) on
     * float kind s; NULL when the target lacks it. */
    const char *(*float_fn)(em_spmd *e, em_ir_op op, em_scalar s);
    /* POPCOUNT / CLZ / CTZ of an integer of kind s, as a u32 expression. */
    void (*bit_count)(em_spmd *e, em_ir_op op, em_scalar s, const char *x, em_strbuf *sb);
    /* Bits of kind s as an unsigned integer of its width (u32 up to 32 bits, u64 for 64) and back.
     */
    void (*to_bits)(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb);
    void (*from_bits)(em_spmd *e, em_scalar s, const char *bits, em_strbuf *sb);
    /* A per-axis built-in (UNIT_POS_X.., CUBE_POS_X.., CUBE_DIM_X.., CUBE_COUNT_X.., PLANE_DIM,
     * UNIT_POS_PLANE) as a u32 expression. */
    void (*builtin)(em_spmd *e, em_builtin b, em_strbuf *sb);
    /* Word `off` of the metadata buffer as a u32 expression. */
    void (*meta)(em_spmd *e, uint32_t off, em_strbuf *sb);

    /* Memory. `index` is an element index expression; lane is -1 for scalar memory, else the lane
     * of a line element. Loads give compute-typed expressions; stores emit a statement. */
    void (*mem_load)(em_spmd *e, em_ir_mem m, const char *index, int lane, em_strbuf *sb);
    void (*mem_store)(em_spmd *e, em_ir_mem m, const char *index, int lane, const char *value);
    /* A whole line element: returns false when the target goes lane by lane instead. */
    bool (*mem_load_line)(em_spmd *e, em_ir_mem m, const char *index, em_strbuf *sb);
    bool (*mem_store_line)(em_spmd *e, em_ir_mem m, const char *index, const char *value);

    /* SYNC_CUBE, SYNC_PLANE, FENCE. */
    void (*sync)(em_spmd *e, const em_ir_inst *in);
    /* One lane of a plane op on scalar kind s (not called when planes have one unit). */
    void (*plane)(em_spmd *e, const em_ir_inst *in, em_scalar s, const char *a, const char *b,
                  em_strbuf *sb);
    /* An atomic op on mem[index] (operands in->args[1..2]); writes the old value's expression,
     * or, for ATOMIC_STORE, the whole call. */
    void (*atomic)(em_spmd *e, const em_ir_inst *in, const char *index, em_strbuf *sb);
    /* Declares a matrix fragment variable / emits a MAT_* instruction. NULL: the shared loop
     * lowering (only where planes have one unit): a fragment is a per-unit array (A: m*k, B: k*n,
     * accumulators: m*n, row-major). */
    void (*fragment)(em_spmd *e, em_ir_val v);
    void (*matrix)(em_spmd *e, const em_ir_inst *in);
    /* COPY_ASYNC, COPY_COMMIT, COPY_WAIT; NULL: the target has no asynchronous copies (the
     * kernel language lowers them to loads and stores for such targets) and rejects them. */
    void (*copy)(em_spmd *e, const em_ir_inst *in);
    /* PRINT; NULL drops it (with a comment). */
    void (*print)(em_spmd *e, const em_ir_inst *in);
    /* A target intrinsic other than "NS.call:NAME"; returns false when it does not know it.
     * Writes the result's expression (or the whole statement when there is no result). */
    bool (*intrinsic)(em_spmd *e, const em_ir_inst *in, em_strbuf *sb);
    /* Opens the kernel: signature, memory declarations, parameter copies, up to and including
     * the opening brace of the body (indentation is then 1). */
    void (*open)(em_spmd *e);
} em_spmd_dialect;

/* The emitter's state for one kernel. Dialects read it; em_spmd_* functions change it. */
struct em_spmd {
    const em_spmd_dialect *d;
    const em_ir_kernel *k; /* the kernel being emitted */
    em_caps caps;          /* the target's capabilities (defaults filled in) */
    em_strbuf *sb;         /* where the kernel's text goes */
    int depth;             /* indentation level of em_spmd_line */
    uint32_t inst;         /* instruction being emitted (UINT32_MAX: none), for messages */
    bool failed;           /* an error was set; emission stops */
    bool plane_one;        /* planes have one unit (PLANE_DIM 1 semantics) */
    uint32_t needs;        /* EM_NEED_* */
    char **vname;          /* per value id: identifier (NULL for constants and unused values) */
    char **mname;          /* per memory id: identifier */
    uint8_t *vused;        /* per value id: referenced by a reachable instruction */
    uint32_t *vfirst;      /* per value id: the first instruction referencing it (for messages) */
    uint8_t *mflags;       /* per memory id: EM_MEMF_* */
    uint32_t *meta_off;    /* per parameter: first metadata word (buffer parameters) */
    uint32_t meta_words;   /* metadata words of the kernel */
    unsigned fresh;        /* counter for emitter-made names */
    char **scratch;        /* strings made by em_spmd_str (a stack) */
    size_t scratch_len, scratch_cap;
    void *priv; /* the dialect's own state */
};

/* Emits one kernel with dialect d into out (the kernel is verified here; it should have been
 * simplified). caps must be complete (see em_spmd_default_caps). *needs (may be NULL) is read and
 * updated with the EM_NEED_* features the kernel uses, so a batch accumulates them for its
 * prelude. priv is handed to the dialect's hooks (em_spmd.priv). Returns false with the error set
 * ("TARGET: kernel NAME: inst N `TEXT`: what"), leaving out as it was. */
bool em_spmd_kernel(const em_spmd_dialect *d, const em_ir_kernel *k, const em_caps *caps,
                    void *priv, em_strbuf *out, uint32_t *needs);

/* Checks a batch before generation: at least one kernel, none NULL, no two with one name (one
 * source cannot hold both). Returns false with the error set. */
bool em_spmd_check_batch(const em_spmd_dialect *d, const em_ir_kernel *const *ks, size_t n);

/* Capabilities used when a caller passes NULL: everything available, with the given plane size
 * (plane_ops when > 1). */
em_caps em_spmd_default_caps(const char *target, uint32_t plane_dim);

/* The C-library name of a float math op ("exp", "rsqrt", "isnan"...; with `single`, the float
 * variants "expf", "rsqrtf"...), as CUDA and OpenCL spell them; NULL for ops that have none. */
const char *em_spmd_libm_name(em_ir_op op, bool single);

/* Writes the prelude of a whole translation unit, given the union of what its kernels need. */
typedef void (*em_spmd_prelude_fn)(const em_caps *caps, uint32_t needs, em_strbuf *sb);
/* One translation unit for a batch (targets that put every kernel in one source: CUDA, OpenCL):
 * checks the batch, emits every kernel, then prepends the prelude. `label` names the generator in
 * an out-of-memory message. Returns malloc'd text, or NULL with the error set. */
char *em_spmd_translation_unit(const em_spmd_dialect *d, const em_ir_kernel *const *ks, size_t n,
                               const em_caps *caps, em_spmd_prelude_fn prelude, const char *label);

/* ---- helpers for dialects ----------------------------------------------------------------- */

/* Writes one indented line (printf-style) followed by a newline. */
void em_spmd_line(em_spmd *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records the first error: "TARGET: kernel NAME[: inst N `TEXT`]: message". */
void em_spmd_fail(em_spmd *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A string that lives until the instruction being emitted is done (printf-style); "" when out of
 * memory (the error is then set). */
const char *em_spmd_str(em_spmd *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A value (NULL when out of range). */
const em_ir_value *em_spmd_value(const em_spmd *e, em_ir_val v);
/* A value as an expression: its identifier, or a literal for a scalar constant. */
void em_spmd_val(em_spmd *e, em_ir_val v, em_strbuf *sb);
/* A value converted to u32 (indices, offsets, lanes). */
void em_spmd_val_u32(em_spmd *e, em_ir_val v, em_strbuf *sb);
/* A fresh identifier "em_PREFIXN" in buf. */
void em_spmd_fresh(em_spmd *e, const char *prefix, char buf[32]);
/* Bits of scalar kind s (bool: 8). */
unsigned em_spmd_bits(em_scalar s);
/* True for i8, i16, u8, u16 (computed wider and wrapped). */
bool em_spmd_narrow(em_scalar s);
/* The C-like literal shared by CUDA and OpenCL: f32 "1.5f", f64 "1.5", integers with the given
 * 64-bit suffixes, special floats through inf32/nan32/inf64/nan64 (expressions). */
void em_spmd_c_literal(em_spmd *e, em_scalar s, em_ir_const c, const char *sfx_i64,
                       const char *sfx_u64, const char *const special[4], em_strbuf *sb);
/* printf for PRINT (CUDA, OpenCL): `%v` becomes each argument's conversion (lines print as
 * [a, b, ...]); ll64 chooses %lld/%llu (CUDA) over %ld/%lu (OpenCL); float_cast is put before
 * float arguments ("(double)" on CUDA). At most max_args values. */
void em_spmd_printf(em_spmd *e, const em_ir_inst *in, bool ll64, const char *float_cast,
                    unsigned max_args);
/* Writes the helper functions for the linear positions (em_unit_pos(), em_cube_pos(),
 * em_cube_dim(), em_cube_count(), em_absolute_pos() and the per-axis em_absolute_pos_x/y/z())
 * built from the dialect's per-axis built-ins, each prefixed by fn_prefix; `void_params` is
 * "void" or "". */
void em_spmd_position_helpers(const em_spmd_dialect *d, const em_caps *caps, void *priv,
                              const char *void_params, em_strbuf *sb);

#endif
