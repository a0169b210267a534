/* ember/kernel.h — the kernel layer's IR: types, values, instructions, the builder API used by the
 * language front end and the fusion engine, the verifier, the text printer, the structural hash
 * and the simplification passes.
 *
 * The IR is structured (no goto, no phi): a kernel is a tree of blocks. Values are of three kinds:
 *  - temporaries, defined exactly once by the instruction that creates them (the builder returns a
 *    fresh temporary from every value-producing call); a use must lie in the scope of the def;
 *  - variables, declared with em_ir_var and written any number of times with em_ir_assign (loop
 *    counters and accumulators);
 *  - constants and scalar parameters, which are never written.
 * Memory (global buffers/tensors, shared arrays, local arrays) is a separate namespace of em_ir_mem
 * ids. Matrix fragments (cooperative matrices) are variables of a matrix type.
 *
 * The builder never crashes on bad input: it records what it is given, and em_ir_verify reports the
 * first problems, each naming the offending instruction in IR text form. */
#ifndef EMBER_KERNEL_H
#define EMBER_KERNEL_H

#include "ember/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- types ------------------------------------------------------------------------------------ */

typedef enum em_scalar {
    EM_BOOL = 0,
    EM_I8,
    EM_I16,
    EM_I32,
    EM_I64,
    EM_U8,
    EM_U16,
    EM_U32,
    EM_U64,
    EM_F16,
    EM_BF16,
    EM_F32,
    EM_F64,
    EM_SCALAR_COUNT
} em_scalar;

/* A value's type: a scalar kind and a line width (1 = plain scalar, up to 16 lanes). */
typedef struct em_type {
    uint8_t scalar; /* an em_scalar */
    uint8_t lanes;  /* 1..16 */
} em_type;

#define EM_MAX_LANES 16
#define EM_MAX_RANK 8

static inline em_type em_ty(em_scalar s) { return (em_type){(uint8_t)s, 1}; }
static inline em_type em_line(em_scalar s, unsigned lanes) { return (em_type){(uint8_t)s, (uint8_t)lanes}; }
static inline bool em_type_eq(em_type a, em_type b) { return a.scalar == b.scalar && a.lanes == b.lanes; }

/* "f32", "bf16", "u8"... and NULL for an out-of-range kind. */
const char *em_scalar_name(em_scalar s);
/* Parses a scalar name; returns EM_SCALAR_COUNT when unknown. */
em_scalar em_scalar_parse(const char *name);
/* Size in bytes (bool is 1). */
size_t em_scalar_size(em_scalar s);
bool em_scalar_is_float(em_scalar s);
bool em_scalar_is_int(em_scalar s);    /* signed or unsigned integer (not bool) */
bool em_scalar_is_signed(em_scalar s); /* signed integers and floats */
/* The lowest finite value of a float kind, as a double (-65504 for f16, bf16's own -3.39e38
 * since -FLT_MAX would round to -inf, -FLT_MAX for f32, -DBL_MAX for f64): what masked attention
 * scores are filled with. -DBL_MAX for other kinds. */
double em_scalar_lowest(em_scalar s);

/* ---- ids ------------------------------------------------------------------------------------- */

typedef uint32_t em_ir_val; /* a value; EM_IR_NONE (0) means "no value" */
typedef uint32_t em_ir_mem; /* a memory object; 0 means none */
#define EM_IR_NONE 0u

typedef enum em_ir_val_kind {
    EM_VAL_TEMP = 0, /* defined once by an instruction */
    EM_VAL_VAR,      /* mutable variable (em_ir_var) */
    EM_VAL_CONST,    /* constant; all lanes hold the same value */
    EM_VAL_PARAM,    /* scalar kernel parameter */
    EM_VAL_MATRIX,   /* a matrix fragment (mutable, like a variable) */
} em_ir_val_kind;

/* A constant's payload, interpreted by the value's scalar kind. */
typedef union em_ir_const {
    int64_t i;  /* signed integers and bool */
    uint64_t u; /* unsigned integers */
    double f;   /* every float kind (rounded to the kind when emitted) */
} em_ir_const;

typedef enum em_mat_role { EM_MAT_A = 0, EM_MAT_B, EM_MAT_ACC } em_mat_role;
typedef enum em_mat_layout { EM_ROW_MAJOR = 0, EM_COL_MAJOR } em_mat_layout;

typedef struct em_ir_value {
    em_type type;       /* element type (for matrices: the element scalar, lanes 1) */
    uint8_t kind;       /* an em_ir_val_kind */
    uint8_t mat_role;   /* matrices: an em_mat_role */
    uint8_t mat_layout; /* matrices A/B: an em_mat_layout */
    uint16_t mat_m, mat_n, mat_k; /* matrices: the MMA shape this fragment takes part in */
    em_ir_const c;      /* constants */
    uint32_t param;     /* parameters: index into the kernel's parameter list */
    const char *name;   /* optional name for printing and generated code (owned by the kernel) */
} em_ir_value;

typedef enum em_mem_space { EM_MEM_GLOBAL = 0, EM_MEM_SHARED, EM_MEM_LOCAL } em_mem_space;
typedef enum em_mem_access { EM_READ = 1, EM_WRITE = 2, EM_READ_WRITE = 3 } em_mem_access;

typedef struct em_ir_memory {
    em_type elem;     /* element type; a line type indexes whole lines */
    uint8_t space;    /* an em_mem_space */
    uint8_t access;   /* global buffers: an em_mem_access */
    uint8_t rank;     /* global tensors: number of dims (0 = plain array: no shape/stride) */
    uint32_t length;  /* shared/local: number of elements (fixed at build time); global: 0 */
    uint32_t param;   /* global: index into the kernel's parameter list */
    const char *name; /* name for printing and generated code */
} em_ir_memory;

/* Built-in positions (all u32). The _X/_Y/_Z variants are per axis; the plain ones are linear:
 * UNIT_POS = x + y*DIM_X + z*DIM_X*DIM_Y, CUBE_POS likewise over CUBE_COUNT, CUBE_DIM and
 * CUBE_COUNT are products of the three axes, and ABSOLUTE_POS = CUBE_POS * CUBE_DIM + UNIT_POS. */
typedef enum em_builtin {
    EM_ABSOLUTE_POS = 0,
    EM_ABSOLUTE_POS_X,
    EM_ABSOLUTE_POS_Y,
    EM_ABSOLUTE_POS_Z,
    EM_UNIT_POS,
    EM_UNIT_POS_X,
    EM_UNIT_POS_Y,
    EM_UNIT_POS_Z,
    EM_CUBE_POS,
    EM_CUBE_POS_X,
    EM_CUBE_POS_Y,
    EM_CUBE_POS_Z,
    EM_CUBE_DIM,
    EM_CUBE_DIM_X,
    EM_CUBE_DIM_Y,
    EM_CUBE_DIM_Z,
    EM_CUBE_COUNT,
    EM_CUBE_COUNT_X,
    EM_CUBE_COUNT_Y,
    EM_CUBE_COUNT_Z,
    EM_PLANE_DIM,      /* units per plane (warp / sub-group); 1 on the CPU */
    EM_UNIT_POS_PLANE, /* lane index inside the plane */
    EM_PLANE_POS,      /* index of the unit's plane inside the cube: UNIT_POS / PLANE_DIM */
    EM_BUILTIN_COUNT
} em_builtin;
const char *em_builtin_name(em_builtin b);

/* ---- instructions ----------------------------------------------------------------------------- */

/* X(name, text, operands) — operand conventions are given per group below. */
typedef enum em_ir_op {
    /* dst = a */
    EM_OP_ASSIGN = 0,
    /* lane-wise binary arithmetic: dst = a OP b. Operands have the same scalar kind; a scalar
     * operand broadcasts against a line. */
    EM_OP_ADD,
    EM_OP_SUB,
    EM_OP_MUL,
    EM_OP_DIV, /* integer division truncates; division by zero is undefined */
    EM_OP_REM, /* integers: C remainder; floats: fmod */
    EM_OP_MIN,
    EM_OP_MAX,
    EM_OP_POW, /* floats */
    EM_OP_AND, /* bitwise on integers, logical on bool */
    EM_OP_OR,
    EM_OP_XOR,
    EM_OP_SHL, /* integers; shift count taken modulo the bit width */
    EM_OP_SHR, /* arithmetic for signed, logical for unsigned */
    /* comparisons: dst (bool lines of the operands' width) = a CMP b */
    EM_OP_EQ,
    EM_OP_NE,
    EM_OP_LT,
    EM_OP_LE,
    EM_OP_GT,
    EM_OP_GE,
    /* lane-wise unary: dst = OP(a) */
    EM_OP_NEG,
    EM_OP_NOT, /* bitwise not on integers, logical not on bool */
    EM_OP_ABS,
    EM_OP_EXP,
    EM_OP_EXP2,
    EM_OP_LOG,
    EM_OP_LOG2,
    EM_OP_SQRT,
    EM_OP_RSQRT,
    EM_OP_ERF,
    EM_OP_TANH,
    EM_OP_SIN,
    EM_OP_COS,
    EM_OP_FLOOR,
    EM_OP_CEIL,
    EM_OP_ROUND, /* half to even */
    EM_OP_ISNAN, /* dst is bool */
    EM_OP_ISINF, /* dst is bool */
    EM_OP_POPCOUNT, /* integers; dst u32 lines */
    EM_OP_CLZ,      /* integers; dst u32 lines; clz(0) = bit width */
    EM_OP_CTZ,      /* integers; dst u32 lines; ctz(0) = bit width */
    /* ternary: dst = fma(a, b, c) (floats) / clamp(a, lo=b, hi=c) / a ? b : c (a bool, scalar or of
     * the result's width) */
    EM_OP_FMA,
    EM_OP_CLAMP,
    EM_OP_SELECT,
    /* conversions: dst = (dst type) a. CAST converts values (a scalar source splats to a line);
     * BITCAST reinterprets bits (the total bit widths must match). */
    EM_OP_CAST,
    EM_OP_BITCAST,
    /* lines: dst = a[b] (b a u32 value, in range) / dst = a with lane b set to c */
    EM_OP_EXTRACT,
    EM_OP_INSERT,
    /* memory: dst = mem[a] / mem[a] = b; indices count elements (whole lines for line memory) */
    EM_OP_LOAD,
    EM_OP_STORE,
    /* buffer metadata (global memory): dst (u32) = number of elements / shape[imm] / stride[imm];
     * shapes and strides count scalars, len counts elements (lines) */
    EM_OP_LEN,
    EM_OP_SHAPE,
    EM_OP_STRIDE,
    /* dst (u32) = built-in position imm (an em_builtin) */
    EM_OP_BUILTIN,
    /* synchronization: imm = 0 */
    EM_OP_SYNC_CUBE,  /* barrier for every unit of the cube, with a fence on shared memory */
    EM_OP_SYNC_PLANE, /* barrier for the units of one plane */
    EM_OP_FENCE,      /* memory fence; imm = 0 for the cube's memory, 1 for the whole device */
    /* plane ops: dst = OP over the units of the plane of a (lane-wise on lines) */
    EM_OP_PLANE_SUM,
    EM_OP_PLANE_PROD,
    EM_OP_PLANE_MIN,
    EM_OP_PLANE_MAX,
    EM_OP_PLANE_INCLUSIVE_SUM,
    EM_OP_PLANE_EXCLUSIVE_SUM,
    EM_OP_PLANE_ALL, /* a bool scalar -> bool */
    EM_OP_PLANE_ANY,
    EM_OP_PLANE_BALLOT,    /* a bool scalar -> u32 bit mask of the lanes where a holds */
    EM_OP_PLANE_BROADCAST, /* dst = a as held by plane lane b (b uniform) */
    EM_OP_PLANE_SHUFFLE,   /* dst = a as held by plane lane b */
    EM_OP_PLANE_SHUFFLE_XOR,  /* dst = a of lane (self ^ b) */
    EM_OP_PLANE_SHUFFLE_UP,   /* dst = a of lane (self - b), own a when out of range */
    EM_OP_PLANE_SHUFFLE_DOWN, /* dst = a of lane (self + b), own a when out of range */
    /* atomics on global or shared scalar memory: dst = old value of mem[a]; mem[a] = OP(old, b).
     * CAS: mem[a] = (old == b) ? c : old. LOAD: dst = mem[a]. STORE: mem[a] = b. */
    EM_OP_ATOMIC_ADD, /* integers and f32 */
    EM_OP_ATOMIC_SUB,
    EM_OP_ATOMIC_MIN,
    EM_OP_ATOMIC_MAX,
    EM_OP_ATOMIC_AND,
    EM_OP_ATOMIC_OR,
    EM_OP_ATOMIC_XOR,
    EM_OP_ATOMIC_XCHG,
    EM_OP_ATOMIC_CAS,
    EM_OP_ATOMIC_LOAD,
    EM_OP_ATOMIC_STORE,
    /* cooperative matrices (the plane works together on one fragment):
     * FILL: a = fragment, b = value; LOAD: a = fragment, mem, b = offset (elements), c = stride
     * (elements between rows, or columns for column-major), imm = layout of memory;
     * MMA: a = D, b = A, c = B, d = C (D = A*B + C); STORE: mem, a = offset, b = stride,
     * c = fragment, imm = layout of memory. */
    EM_OP_MAT_FILL,
    EM_OP_MAT_LOAD,
    EM_OP_MAT_MMA,
    EM_OP_MAT_STORE,
    /* asynchronous copies from global to shared memory (cp.async on NVIDIA from sm_80 on; the
     * kernel language lowers copy_async to plain loads and stores for other targets):
     * COPY_ASYNC: mem = the destination (shared), imm = the source memory (a global buffer),
     *   a = destination index, b = source index (elements of scalar memory), c = count (a u32
     *   constant: a and b are the first of `count` consecutive elements), d = a bool condition or
     *   none: where it is false the destination elements become zero and the source is not read.
     *   count * element size is 4, 8 or 16 bytes and both addresses are aligned to it. The copy
     *   lands at some point before the COPY_WAIT that covers it (other units see it after a
     *   barrier that follows that wait).
     * COPY_COMMIT: closes the group of this unit's copies issued since the previous commit;
     * COPY_WAIT: waits until at most imm (>= 0) of this unit's committed groups are in flight. */
    EM_OP_COPY_ASYNC,
    EM_OP_COPY_COMMIT,
    EM_OP_COPY_WAIT,
    /* structured control flow:
     * IF: a = bool scalar condition, blocks[0] = then, blocks[1] = else (0 for none);
     * RANGE: a = loop variable (a VAR of integer type), b = start, c = end (exclusive),
     *        d = step (> 0), imm = 1 to ask for unrolling (needs constant bounds), blocks[0] = body;
     * LOOP: blocks[0] = body, repeated until a BREAK or RETURN;
     * BREAK / CONTINUE: leave / restart the innermost RANGE or LOOP; RETURN: the unit stops. */
    EM_OP_IF,
    EM_OP_RANGE,
    EM_OP_LOOP,
    EM_OP_BREAK,
    EM_OP_CONTINUE,
    EM_OP_RETURN,
    /* debugging: print str (a printf-like format with %v for each of args a..d) where the target
     * can; targets that cannot drop it */
    EM_OP_PRINT,
    /* a target-specific intrinsic named str (e.g. "cuda.ptx:..."), dst = result or none, args a..d;
     * targets without it reject the kernel at legalization */
    EM_OP_INTRINSIC,
    EM_OP_COUNT
} em_ir_op;

/* The op's mnemonic as printed ("add", "load", "plane_sum"...); "?" when out of range. */
const char *em_ir_op_name(em_ir_op op);

#define EM_IR_MAX_ARGS 4

typedef struct em_ir_inst {
    uint16_t op;                   /* an em_ir_op */
    em_ir_val dst;                 /* result (EM_IR_NONE for none) */
    em_ir_val args[EM_IR_MAX_ARGS]; /* operands a, b, c, d (EM_IR_NONE when unused) */
    em_ir_mem mem;                 /* memory object of LOAD/STORE/LEN/SHAPE/STRIDE/atomics/MAT_* */
    int32_t imm;                   /* immediate: builtin, dimension, fence scope, layout, unroll */
    uint32_t blocks[2];            /* child blocks of IF/RANGE/LOOP (0 = none) */
    const char *str;               /* PRINT format / INTRINSIC name (owned by the kernel) */
    uint32_t line, col;            /* source position for diagnostics (0 = unknown) */
} em_ir_inst;

/* A block is an ordered list of instruction indices. */
typedef struct em_ir_block {
    uint32_t *items; /* instruction indices into the kernel's instruction array */
    size_t len, cap;
} em_ir_block;

typedef enum em_ir_param_kind { EM_PARAM_BUFFER = 0, EM_PARAM_SCALAR } em_ir_param_kind;
typedef struct em_ir_param {
    uint8_t kind; /* an em_ir_param_kind */
    uint32_t id;  /* the em_ir_mem (buffers) or em_ir_val (scalars) */
} em_ir_param;

typedef struct em_ir_kernel em_ir_kernel;

/* ---- building --------------------------------------------------------------------------------- */

/* A new empty kernel named `name` (a C identifier). The caller owns it (em_ir_kernel_free). NULL
 * (error set) when out of memory. */
em_ir_kernel *em_ir_kernel_new(const char *name);
void em_ir_kernel_free(em_ir_kernel *k);
/* A deep copy (passes transform copies so that a kernel can be specialized several ways). */
em_ir_kernel *em_ir_kernel_clone(const em_ir_kernel *k);

/* Fixes the cube dimensions the kernel must be launched with (0 = chosen at launch). Targets that
 * need them at compile time (Vulkan) use these when set. */
void em_ir_set_cube_dim(em_ir_kernel *k, uint32_t x, uint32_t y, uint32_t z);
/* Groups the cubes into clusters of x consecutive cubes along x (CUDA thread-block clusters:
 * their shared memory and barriers reachable from each other; elsewhere ordinary cubes). A
 * launch's cube count along x must be a multiple of it. 0 or 1: clusters of one. */
void em_ir_set_cluster_dim(em_ir_kernel *k, uint32_t x);
/* Records where subsequent instructions come from (for diagnostics); 0,0 clears. */
void em_ir_set_loc(em_ir_kernel *k, uint32_t line, uint32_t col);

/* Parameters, in launch order. */
em_ir_mem em_ir_param_buffer(em_ir_kernel *k, const char *name, em_type elem, em_mem_access access,
                             unsigned rank);
em_ir_val em_ir_param_scalar(em_ir_kernel *k, const char *name, em_type type);

/* Memory of the cube (shared) or of one unit (local), `length` elements. */
em_ir_mem em_ir_shared(em_ir_kernel *k, const char *name, em_type elem, uint32_t length);
em_ir_mem em_ir_local(em_ir_kernel *k, const char *name, em_type elem, uint32_t length);

/* Constants (every lane equal). */
em_ir_val em_ir_const_int(em_ir_kernel *k, em_type type, int64_t v);
em_ir_val em_ir_const_uint(em_ir_kernel *k, em_type type, uint64_t v);
em_ir_val em_ir_const_float(em_ir_kernel *k, em_type type, double v);
em_ir_val em_ir_const_bool(em_ir_kernel *k, bool v);
static inline em_ir_val em_ir_u32(em_ir_kernel *k, uint32_t v) { return em_ir_const_uint(k, em_ty(EM_U32), v); }

/* A mutable variable (name optional) and assignment to it. */
em_ir_val em_ir_var(em_ir_kernel *k, em_type type, const char *name);
void em_ir_assign(em_ir_kernel *k, em_ir_val var, em_ir_val value);
/* A matrix fragment variable. */
em_ir_val em_ir_matrix(em_ir_kernel *k, em_mat_role role, em_scalar elem, unsigned m, unsigned n,
                       unsigned kdim, em_mat_layout layout, const char *name);

/* Generic instruction emission: appends an instruction to the current block. When `dst_type` has
 * lanes > 0 a fresh temporary of that type is created as the result and returned; pass
 * (em_type){0, 0} for none (returns EM_IR_NONE). */
em_ir_val em_ir_emit(em_ir_kernel *k, em_ir_op op, em_type dst_type, em_ir_val a, em_ir_val b,
                     em_ir_val c, em_ir_val d, em_ir_mem mem, int32_t imm);

/* Typed helpers (result types inferred by the rules of the verifier; on ill-typed input they still
 * emit, and the verifier reports the instruction). */
em_ir_val em_ir_binary(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b);  /* arith, cmp */
em_ir_val em_ir_unary(em_ir_kernel *k, em_ir_op op, em_ir_val a);
em_ir_val em_ir_ternary(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b, em_ir_val c);
em_ir_val em_ir_cast(em_ir_kernel *k, em_type to, em_ir_val a);
em_ir_val em_ir_bitcast(em_ir_kernel *k, em_type to, em_ir_val a);
em_ir_val em_ir_extract(em_ir_kernel *k, em_ir_val line, em_ir_val lane);
em_ir_val em_ir_insert(em_ir_kernel *k, em_ir_val line, em_ir_val lane, em_ir_val v);
em_ir_val em_ir_load(em_ir_kernel *k, em_ir_mem mem, em_ir_val index);
void em_ir_store(em_ir_kernel *k, em_ir_mem mem, em_ir_val index, em_ir_val value);
em_ir_val em_ir_len(em_ir_kernel *k, em_ir_mem mem);
em_ir_val em_ir_shape(em_ir_kernel *k, em_ir_mem mem, unsigned dim);
em_ir_val em_ir_stride(em_ir_kernel *k, em_ir_mem mem, unsigned dim);
em_ir_val em_ir_builtin(em_ir_kernel *k, em_builtin b);
void em_ir_sync_cube(em_ir_kernel *k);
void em_ir_sync_plane(em_ir_kernel *k);
void em_ir_fence(em_ir_kernel *k, int device_scope);
em_ir_val em_ir_plane(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b); /* b: lane/offset */
em_ir_val em_ir_atomic(em_ir_kernel *k, em_ir_op op, em_ir_mem mem, em_ir_val index, em_ir_val v,
                       em_ir_val v2 /* CAS new value, else EM_IR_NONE */);
void em_ir_mat_fill(em_ir_kernel *k, em_ir_val frag, em_ir_val value);
void em_ir_mat_load(em_ir_kernel *k, em_ir_val frag, em_ir_mem mem, em_ir_val offset,
                    em_ir_val stride, em_mat_layout layout);
void em_ir_mat_mma(em_ir_kernel *k, em_ir_val d, em_ir_val a, em_ir_val b, em_ir_val c);
void em_ir_mat_store(em_ir_kernel *k, em_ir_mem mem, em_ir_val offset, em_ir_val stride,
                     em_ir_val frag, em_mat_layout layout);
/* An asynchronous copy of `count` elements src[src_index..] -> dst[dst_index..] (dst shared, src
 * global), zero-filled where `valid` (a bool value, or EM_IR_NONE for always) is false; a commit of
 * the unit's copies since the last one; a wait until at most `pending` committed groups remain. */
void em_ir_copy_async(em_ir_kernel *k, em_ir_mem dst, em_ir_val dst_index, em_ir_mem src,
                      em_ir_val src_index, unsigned count, em_ir_val valid);
void em_ir_copy_commit(em_ir_kernel *k);
void em_ir_copy_wait(em_ir_kernel *k, unsigned pending);
void em_ir_print(em_ir_kernel *k, const char *fmt, const em_ir_val *args, unsigned nargs);
em_ir_val em_ir_intrinsic(em_ir_kernel *k, const char *name, em_type dst_type, const em_ir_val *args,
                          unsigned nargs);

/* Structured control flow: each *_begin opens a block that the matching em_ir_end closes. */
void em_ir_if_begin(em_ir_kernel *k, em_ir_val cond);
void em_ir_else(em_ir_kernel *k); /* switches the open IF to its else block */
void em_ir_range_begin(em_ir_kernel *k, em_ir_val var, em_ir_val start, em_ir_val end,
                       em_ir_val step, bool unroll);
void em_ir_loop_begin(em_ir_kernel *k);
void em_ir_end(em_ir_kernel *k);
void em_ir_break(em_ir_kernel *k);
void em_ir_continue(em_ir_kernel *k);
void em_ir_return(em_ir_kernel *k);

/* ---- reading ---------------------------------------------------------------------------------- */

const char *em_ir_kernel_name(const em_ir_kernel *k);
void em_ir_cube_dim(const em_ir_kernel *k, uint32_t dim[3]);
uint32_t em_ir_cluster_dim(const em_ir_kernel *k); /* 1 unless set above 1 */
size_t em_ir_param_count(const em_ir_kernel *k);
const em_ir_param *em_ir_param_at(const em_ir_kernel *k, size_t i);
size_t em_ir_value_count(const em_ir_kernel *k);  /* ids run 1..count */
const em_ir_value *em_ir_value_at(const em_ir_kernel *k, em_ir_val v); /* NULL when out of range */
size_t em_ir_mem_count(const em_ir_kernel *k);    /* ids run 1..count */
const em_ir_memory *em_ir_mem_at(const em_ir_kernel *k, em_ir_mem m);  /* NULL when out of range */
size_t em_ir_inst_count(const em_ir_kernel *k);
const em_ir_inst *em_ir_inst_at(const em_ir_kernel *k, uint32_t i);    /* NULL when out of range */
uint32_t em_ir_body(const em_ir_kernel *k);       /* the top block */
const em_ir_block *em_ir_block_at(const em_ir_kernel *k, uint32_t b); /* NULL when out of range */
/* True when the kernel (or a block and its children) contains a SYNC_CUBE. */
bool em_ir_block_has_barrier(const em_ir_kernel *k, uint32_t b);

/* ---- targets ---------------------------------------------------------------------------------- */

/* One matrix-unit (cooperative matrix) combination a device runs, plane-wide:
 * D (m x n, kind d) = A (m x k, kind a) * B (k x n, kind b) + C (m x n, kind c). */
typedef struct em_matrix_shape {
    uint16_t m, n, k;
    uint8_t a, b, c, d; /* em_scalar kinds */
} em_matrix_shape;
#define EM_CAPS_MATRIX_SHAPES 24

/* What a target device can do: published by each runtime driver, read by code generators and
 * legalization. */
typedef struct em_caps {
    char target[16];          /* code generator: "c", "cuda", "opencl", "glsl" */
    char arch[64];            /* architecture string in cache keys ("x86_64-gcc12", "sm_90") */
    char device_name[128];    /* human-readable device name */
    uint32_t plane_dim;       /* units per plane (1 on the CPU, 32 on NVIDIA) */
    uint32_t max_cube_units;  /* most units in one cube */
    uint32_t max_cube_dim[3]; /* most units per axis */
    uint64_t max_shared;      /* bytes of shared memory per cube */
    uint64_t memory_total;    /* bytes of device memory (0 = unknown) */
    uint32_t compute_units;   /* multiprocessors / cores */
    /* bytes a buffer argument's byte offset must be a multiple of (OpenCL's sub-buffers:
     * CL_DEVICE_MEM_BASE_ADDR_ALIGN; Vulkan's minStorageBufferOffsetAlignment); 0: any */
    uint32_t buffer_align;
    bool dtype[EM_SCALAR_COUNT]; /* scalar kinds the device computes with */
    bool float_atomic_add;    /* atomic add on f32 */
    bool plane_ops;           /* plane (warp / sub-group) operations */
    bool matrix;              /* cooperative matrices (else lowered to loops) */
    bool print;               /* print works */
    /* Matrix units, where the device lists them (Vulkan: VK_KHR/NV_cooperative_matrix): the API
     * ("VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix"; "" when not listed: CUDA's WMMA
     * shapes are fixed by its code generator) and the combinations it runs (at most
     * EM_CAPS_MATRIX_SHAPES; 0 with an API named: none). */
    char matrix_api[32];
    uint32_t matrix_shape_count;
    em_matrix_shape matrix_shapes[EM_CAPS_MATRIX_SHAPES];
} em_caps;

/* ---- checking, printing, hashing, passes --------------------------------------------------- */

/* Checks every rule in this header (ids in range, types, scopes, control-flow nesting, memory
 * spaces, parameter kinds). Returns EM_OK, or EM_ERR_INVALID with em_last_error() holding up to
 * `max_errors` (0 = 8) problems, one per line, each as
 *   "kernel NAME: inst N `TEXT`: WHAT" (TEXT is the instruction in IR text form). */
em_status em_ir_verify(const em_ir_kernel *k, unsigned max_errors);

/* The stable text form of a kernel (one instruction per line), malloc'd; the caller frees it.
 * Prints out-of-range ids as %?N rather than crashing. */
char *em_ir_print_kernel(const em_ir_kernel *k);
/* One instruction in text form, malloc'd. */
char *em_ir_print_inst(const em_ir_kernel *k, uint32_t inst);

/* A structural hash (32 hex digits + NUL) of everything that affects generated code, independent of
 * the order in which ids were allocated for values that print the same. */
void em_ir_hash(const em_ir_kernel *k, char out[33]);

/* Simplification: constant folding (temporaries whose operands are constants become constants;
 * IF on a constant condition keeps one branch; RANGE marked unroll with constant bounds is
 * unrolled), then dead-code removal (unused side-effect-free temporaries, variables never read).
 * Works in place; returns EM_OK or an error (the kernel is then unchanged or still valid). */
em_status em_ir_simplify(em_ir_kernel *k);

#ifdef __cplusplus
}
#endif
#endif
