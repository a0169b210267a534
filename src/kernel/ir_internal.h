/* ir_internal.h — the layout of an IR kernel, shared by the files of src/kernel that build, check,
 * print, hash and transform it (ir.c, verify.c, print.c, ir_hash.c, passes/). Everything outside
 * src/kernel reads kernels through the accessors of ember/kernel.h. */
#ifndef EM_KERNEL_IR_INTERNAL_H
#define EM_KERNEL_IR_INTERNAL_H
#include "base/base.h"
#include "ember/kernel.h"

#define EM_IR_MAX_DEPTH 256

/* One open control-flow construct in the builder. */
typedef struct em_ir_open {
    uint32_t inst;  /* the IF/RANGE/LOOP instruction */
    uint32_t block; /* the block instructions currently go to */
} em_ir_open;

struct em_ir_kernel {
    char *name;          /* kernel name (a C identifier), malloc'd */
    em_arena strings;    /* names and print formats */
    struct { em_ir_value *items; size_t len, cap; } values; /* index 0 unused */
    struct { em_ir_memory *items; size_t len, cap; } mems;  /* index 0 unused */
    struct { em_ir_inst *items; size_t len, cap; } insts;
    struct { em_ir_block *items; size_t len, cap; } blocks; /* index 0 unused; 1 is the body */
    struct { em_ir_param *items; size_t len, cap; } params;
    uint32_t cube_dim[3]; /* fixed cube dims, 0 = chosen at launch */
    uint32_t cluster_dim; /* cubes of a cluster along x (0 or 1: clusters of one) */
    em_ir_open open[EM_IR_MAX_DEPTH]; /* builder: open control flow, innermost last */
    unsigned depth;                   /* builder: entries in open[] */
    uint32_t line, col;               /* builder: current source position */
    char build_error[256];            /* first misuse of the builder ("" when none) */
    bool oom;                         /* an allocation failed while building */
    em_map consts;                    /* (type, payload) -> constant value id, for reuse */
};

/* Appends an instruction index to a block; false on out of memory. */
bool em_ir_block_push(em_ir_kernel *k, uint32_t block, uint32_t inst);
/* A new empty block; 0 on out of memory. */
uint32_t em_ir_new_block(em_ir_kernel *k);
/* A new value slot; 0 on out of memory. */
em_ir_val em_ir_new_value(em_ir_kernel *k, em_ir_value v);

/* Per-op facts used by the verifier, printer and passes. */
typedef enum em_op_class {
    EM_OPC_ASSIGN,
    EM_OPC_BINARY,  /* arithmetic/bitwise: same scalar, broadcasting lanes */
    EM_OPC_COMPARE, /* like binary, result bool */
    EM_OPC_UNARY,
    EM_OPC_TERNARY,
    EM_OPC_CONVERT,
    EM_OPC_LINE,
    EM_OPC_MEMORY,
    EM_OPC_META,
    EM_OPC_BUILTIN,
    EM_OPC_SYNC,
    EM_OPC_PLANE,
    EM_OPC_ATOMIC,
    EM_OPC_MATRIX,
    EM_OPC_CONTROL,
    EM_OPC_DEBUG,
} em_op_class;

typedef struct em_op_info {
    const char *name;   /* mnemonic */
    uint8_t cls;        /* an em_op_class */
    uint8_t nargs;      /* operands a.. used */
    bool has_dst;       /* produces a value */
    bool side_effects;  /* must not be removed when its result is unused */
} em_op_info;
const em_op_info *em_ir_op_info(unsigned op);

/* Structural helpers for passes. */
bool em_ir_is_const(const em_ir_kernel *k, em_ir_val v);

#endif
