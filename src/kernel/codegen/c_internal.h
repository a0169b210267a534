/* c_internal.h — state shared by the files of the C code generator for the CPU target:
 *   c.c         entry point, analysis (regions, liveness, storage), control flow, kernel functions;
 *   c_ops.c     one instruction at a time: expressions and statements for every op;
 *   c_prelude.c the prelude (ABI structs, types) and the helper functions emitted on demand
 *               (f16/bf16 conversion, integer division, saturating casts, atomics), and literals.
 *
 * How a kernel becomes C: a cube runs on one thread. SYNC_CUBE barriers split the body into
 * regions; every region is a loop over the cube's units. Control flow that contains a barrier is
 * run once per cube ("cube level", conditions and bounds taken from the first active unit).
 * Values that live across regions (or sit in a region inside a cube-level loop) are kept in
 * per-unit arrays in the cube's scratch memory, next to shared memory; everything else is a
 * plain local of the unit loop. */
#ifndef EM_KERNEL_CODEGEN_C_INTERNAL_H
#define EM_KERNEL_CODEGEN_C_INTERNAL_H
#include "base/base.h"
#include "ember/kernel.h"

/* Where a value or memory object lives in the generated code. */
typedef enum cg_store {
    CG_NONE = 0, /* not referenced by emitted code */
    CG_CONST,    /* a literal */
    CG_PARAM,    /* a const local of the kernel function, read from the launch */
    CG_LOCAL,    /* a local of one region's unit loop (temps: declared where defined) */
    CG_UNIT,     /* a per-unit array (values: name[u_]; memory/matrices: name_all_ + u_ * len) */
    CG_REMAT,    /* small integer expressions of positions, metadata, constants and parameters:
                    never stored, written out where used (in any region or at cube level) */
    CG_CUBE,     /* one variable per cube (counters of cube-level ranges) */
    CG_SHARED,   /* shared memory: one array per cube in the scratch */
    CG_GLOBAL,   /* a buffer parameter */
} cg_store;

/* What the generator knows about one IR value. */
typedef struct cg_value {
    char *name;         /* C identifier (NULL when none is needed) */
    uint8_t store;      /* a cg_store */
    bool read;          /* read by an emitted instruction */
    bool cube_read;     /* read by cube-level control flow */
    bool cube_counter;  /* counter of a cube-level range */
    bool loop_region;   /* accessed in a region that sits inside a cube-level loop */
    bool listed;        /* already in its region's declaration list */
    int32_t region;     /* the region it is accessed in: -1 none yet, -2 several */
    int32_t setup_in;   /* last region whose setup lists it (per-unit matrices) */
    uint32_t def;       /* temporaries: the defining instruction */
    uint8_t remat;      /* 0 unknown, 1 cannot be recomputed, 2+n recomputable from n nodes */
    bool read_by_remat; /* an operand of a recomputable temporary */
    uint8_t first;      /* first access in block order: 1 overwrites it at a region's top level */
} cg_value;

/* What the generator knows about one memory object. */
typedef struct cg_mem {
    char *name;       /* C identifier (NULL when unused) */
    uint8_t store;    /* a cg_store */
    bool used;        /* accessed by an emitted instruction */
    bool loaded;      /* local memory: read by a needed load (else its stores are dropped) */
    bool loop_region; /* accessed in a region inside a cube-level loop */
    bool listed;      /* already in its region's declaration list */
    int32_t region;   /* as for values */
    int32_t setup_in; /* as for values */
} cg_mem;

/* A list of ids (values or memory objects). */
typedef struct cg_ids {
    uint32_t *items;
    size_t len, cap;
} cg_ids;

/* One region: a run of barrier-free instructions executed as a loop over the units. */
typedef struct cg_region {
    bool in_loop; /* inside a cube-level loop */
    bool needed;  /* holds at least one emitted instruction */
    cg_ids vals;  /* local variables and matrices to declare at the top of the unit loop */
    cg_ids mems;  /* local memory to declare at the top of the unit loop */
    cg_ids uvals; /* per-unit matrices to point at */
    cg_ids umems; /* per-unit local memory to point at */
} cg_region;

/* An enclosing loop while emitting. */
typedef struct cg_loop {
    bool cube;     /* a cube-level loop (contains a barrier) */
    uint8_t depth; /* cube-level loops: 1 for the outermost */
} cg_loop;

/* Helpers the generated source needs, gathered over a batch of kernels and emitted once. */
typedef struct cg_needs {
    bool line[EM_SCALAR_COUNT][EM_MAX_LANES + 1]; /* typedefs of line structs */
    bool div[EM_SCALAR_COUNT];                    /* integer division */
    bool rem[EM_SCALAR_COUNT];                    /* integer remainder */
    bool sat[EM_SCALAR_COUNT];                    /* saturating double -> integer */
    bool minmax[EM_SCALAR_COUNT];                 /* integer min / max / clamp */
    bool atomic[11][EM_SCALAR_COUNT];             /* atomics, by op - EM_OP_ATOMIC_ADD */
    bool f16, bf16;                               /* f16 / bf16 <-> float */
    bool d2h, d2b;                                /* double -> f16 / bf16 (through round-to-odd) */
    bool f32odd;                                  /* double -> float rounded to odd */
    bool i64odd;                                  /* 64-bit integers -> double rounded to odd */
    bool scratch;                                 /* em_pad */
    bool state;                                   /* unit-state helpers */
    bool meta;                                    /* em_shape / em_stride */
} cg_needs;

#define CG_STATE_RETURNED 1u  /* unit states: 0 active, 1 returned, 2d broke / 2d+1 continued at */
#define CG_MAX_CUBE_LOOPS 120 /* deepest cube-level loop nesting (states fit a byte) */
#define CG_MAX_DEPTH 264      /* loop stack size */

/* The generator's state for one kernel. */
typedef struct cg {
    const em_ir_kernel *k;
    const em_caps *caps;
    cg_needs *needs;
    em_strbuf *sb;     /* where statements go */
    int indent;        /* current indentation level */
    em_status err;     /* first error (EM_OK while none) */
    uint32_t cur_inst; /* instruction being emitted (for errors) */

    size_t nvals, nmems, ninsts, nblocks;
    cg_value *vals;     /* indexed by value id */
    cg_mem *mems;       /* indexed by memory id */
    int32_t *region_of; /* per instruction: region id; -1 cube level; -3 unreachable */
    uint8_t *needed;    /* per instruction: emitted */
    uint8_t *barrier;   /* per block: 1 when it contains a SYNC_CUBE (0 unknown, 2 no) */
    cg_region *regions;
    size_t nregions, capregions;

    bool has_barrier;   /* the kernel has a SYNC_CUBE */
    bool state;         /* per-unit states are kept (units leave early in a barrier kernel) */
    bool lead;          /* cube-level code reads per-unit values at lead_ */
    bool at_cube;       /* emitting cube-level code */
    int32_t cur_region; /* region being emitted */
    bool next_used;     /* the current region's next-unit label is targeted */
    bool done_used;     /* the cube's done label is targeted */
    cg_loop loops[CG_MAX_DEPTH];
    unsigned nloops;     /* entries of loops */
    unsigned cube_depth; /* enclosing cube-level loops */
} cg;

/* ---- c.c ------------------------------------------------------------------------------------ */

/* Records an error naming instruction `inst` (once; later errors are dropped). */
void cg_fail(cg *g, em_status st, uint32_t inst, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Starts a new line at the current indentation and appends formatted text (no newline). */
void cg_line(cg *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const em_ir_value *cg_val(const cg *g, em_ir_val v);
const em_ir_memory *cg_mem_at(const cg *g, em_ir_mem m);

/* ---- c_prelude.c ---------------------------------------------------------------------------- */

/* The C type of a scalar value ("float", "em_f16", "bool"...), and of its storage in memory
 * (bool is stored as uint8_t). */
const char *cg_ctype(em_scalar s);
const char *cg_mtype(em_scalar s);
/* The C type of a value of type t: the scalar type, or the line struct "em_f32x4" (recorded as
 * needed). Writes into buf (at least 32 bytes) and returns it. */
const char *cg_vtype(cg *g, em_type t, char *buf);
/* Appends a literal of scalar kind s holding c. */
void cg_literal(em_strbuf *sb, em_scalar s, em_ir_const c);
/* Appends a float (f32) literal for a constant of a half kind (its exact value as float). */
void cg_half_literal_f(em_strbuf *sb, em_scalar s, em_ir_const c);
/* Appends the zero of a scalar kind. */
void cg_zero(em_strbuf *sb, em_scalar s);
/* Host-side conversions used for constants: double to f16 / bf16 bits (round to nearest even),
 * and back. */
uint16_t cg_f16_bits(double x);
uint16_t cg_bf16_bits(double x);
double cg_half_value(em_scalar s, uint16_t bits);
/* Appends the whole prelude for a batch: includes, ABI structs, the needed types and helpers. */
void cg_prelude(em_strbuf *sb, const cg_needs *needs, size_t nkernels);

/* ---- c_ops.c -------------------------------------------------------------------------------- */

/* Appends the C expression reading value v; with lane set, lines are indexed at lane l_. */
void cg_operand(cg *g, em_strbuf *sb, em_ir_val v, bool lane);
/* Appends the value converted from scalar kind `from` to `to`; expr is the source expression. */
void cg_convert(cg *g, em_strbuf *sb, em_scalar from, em_scalar to, const char *expr);
/* True for the ops whose (integer or bool) results may be recomputed where used. */
bool cg_rematerializable(uint16_t op);
/* Removes one pair of parentheses around a whole expression (for `if (...)`); true if it did. */
bool cg_strip_parens(char *e);
/* Emits one non-control instruction inside a region. */
void cg_emit_op(cg *g, uint32_t idx, const em_ir_inst *in);
/* The values an instruction reads in the generated code (up to 4, plus extras for print);
 * returns how many were written to out. */
unsigned cg_reads(const em_ir_inst *in, em_ir_val out[EM_IR_MAX_ARGS]);
/* The value (variable or matrix) an instruction writes besides its result temp; 0 when none. */
em_ir_val cg_writes(const em_ir_inst *in);

#endif
