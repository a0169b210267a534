/* fusion.h — lazy elementwise fusion in the tensor layer (fusion.c; docs/fusion.md). With fusion
 * on, an elementwise op whose output is a fresh buffer does not launch: the output's storage is
 * marked pending with a node (an expression tree over realized input buffers). A consumer that
 * reads a pending result as a whole inlines the producer's tree into its own, so a chain of ops
 * becomes one tree; the tree runs as one generated kernel when something needs the buffer
 * (tn_realize: a kernel binding it, a host read, em_flush) and is dropped uncomputed when its
 * storage is freed first. The output's buffer is allocated only when the tree runs (the storage
 * is deferred: tn_new_deferred), so a tree inlined and dropped never holds memory. Generated
 * kernels are cached by the tree's signature. */
#ifndef EM_TENSOR_FUSION_H
#define EM_TENSOR_FUSION_H

#include "tensor/internal.h"

/* The kinds of op the fusion layer records. */
enum {
    FU_LEAF = 0, /* an input buffer (not an op) */
    FU_UNARY,    /* tn_unary_op: code is a TN_U_* (not a predicate); p[0], p[1] */
    FU_UPRED,    /* tn_unary_pred: code is a TN_U_* predicate; p[0] */
    FU_FILL,     /* TN_U_FILL: no input; p[0] */
    FU_BINARY,   /* tn_binary_op: code 0..7 */
    FU_BPRED,    /* tn_binary_pred: code 8..16 */
    FU_WHERE,    /* select(cond, a, b) */
};

/* One elementwise op, as its entry point describes it. */
typedef struct fu_desc {
    const char *name; /* the op's name (a string literal), for messages and EMBER_FUSION_DEBUG */
    int kind;         /* FU_UNARY .. FU_WHERE */
    int code;         /* the kernel's OP */
    em_scalar C, M;   /* compute and math types (unary and binary ops) */
    em_arg p[2];      /* scalar parameters of unary ops, as the kernel takes them (type C) */
    unsigned movable; /* bit k: no recorder keeps input k's value, so a donated input k that is
                       * the whole result of a pending matmul may become this op's output, its
                       * epilogue absorbing the op (fusion_matmul.c, fu_mm_take) */
} fu_desc;

/* A walk over `shape` shared by n operands (n <= FU_WALK_MAX) with their strides: size-1 dims
 * dropped, dims merged where every operand is contiguous across them. Rank at least 1.
 * (ops_elementwise.c) */
#define FU_WALK_MAX 9
typedef struct fu_walk {
    int rank;
    int64_t shape[EM_MAX_RANK];
    int64_t stride[FU_WALK_MAX][EM_MAX_RANK];
} fu_walk;
void fu_walk_build(fu_walk *w, int rank, const int64_t *shape, int n, int64_t (*strides)[EM_MAX_RANK]);
/* The line width of the walk: the widest the device prefers for the widest of the operands'
 * dtypes (em_line_lanes), narrowed until every operand's shape, strides and offset allow it. */
unsigned fu_walk_width(const fu_walk *w, em_device *dev, const em_scalar *dts, int n,
                       const int64_t *offsets);

/* True when fusion is on: EMBER_FUSION (read once; "0" turns it off) or em_fusion_set. */
bool fu_enabled(void);

/* Tries to record out = op(in[0..nin)) as pending instead of launching it; strides[k] is in[k]
 * expanded to out's shape (stride 0 on broadcast dims). Returns 1 when recorded, 0 when the op
 * must be launched now (fusion off, empty output, or out is not a fresh, whole, unshared buffer),
 * -1 with the error set (naming the op) when an input could not be realized. */
int fu_record(const fu_desc *d, const em_tensor *const *in, int nin, int64_t (*strides)[EM_MAX_RANK],
              em_tensor *out);

/* Runs st's pending node (if any) as one kernel, allocating st's buffer first when it has none
 * (a deferred storage; also without a pending node). EM_OK, or the error set (out of device
 * memory included). */
em_status fu_realize(tn_storage *st);
/* em_copy_'s shortcut: when src is donated (em_take) and is the whole, otherwise unheld result
 * of a pending matmul, of dst's dtype and shape, and dst is contiguous on the same device with
 * its first element 256-byte aligned, the matmul (with its epilogue) runs into dst instead of
 * its own buffer, and no copy is needed: 1 when it ran, 0 when the copy must run (nothing
 * changed), -1 with the error set. */
int fu_run_into(const em_tensor *src, em_tensor *dst);
/* Called before a kernel writes st: realizes the pending nodes that read st (their leaves), so
 * they see the values they were recorded against. */
em_status fu_before_write(tn_storage *st);
/* Called as a storage with a pending node is freed: drops the node without computing it. */
void fu_drop(tn_storage *st);
/* Counts one kernel launch of the tensor layer and the bytes it reads and writes (a model:
 * tn_view_bytes of each bound view) into em_tensor_stats, and into the profiler's row of
 * `kernel` (its kernel name) while the profiler is on. */
void fu_count_launch(const char *kernel, uint64_t read, uint64_t written);

/* A pending input computed in a reduction kernel's loads instead of being realized (its
 * prologue; fusion_reduce.c). */
typedef struct fu_prologue {
    struct fu_node *nd; /* the input's pending node; the fusion lock is held while set */
    fu_walk w;          /* its leaves and its (contiguous) output, walked */
    unsigned max_lw;    /* the widest line width its leaves allow: the kernel's must divide it */
} fu_prologue;

/* True when t is a whole contiguous view of a pending tree that a reduction kernel reading it
 * `passes` times, with `scalars` scalar arguments of its own, can compute in its loads; then the
 * fusion lock is held until fu_prologue_end. False (nothing held) when t is realized, or a view
 * the tree cannot be read through, or the kernel would exceed FU_MAX_SCALARS, or on the CPU a
 * tree of more than one op (fu_prologue_force_cpu aside) or a transcendental op that several
 * passes would compute again. */
bool fu_prologue_begin(const em_tensor *t, int passes, int scalars, fu_prologue *pr);
/* Launches `kernel` of src/kernels/<file>.ek instantiated with pr's tree in place of its input
 * x (fusion_reduce.c says how): spec as for the plain kernel (R is added; its line width must
 * divide pr->max_lw), rest: the plain kernel's arguments after x. read/written: the bytes of
 * its other operands (the leaves' are added). EM_OK or the error set. */
em_status fu_prologue_launch(fu_prologue *pr, const char *file, const char *kernel, const em_lang_spec *spec,
                             const uint32_t cubes[3], const uint32_t units[3], const em_arg *rest, size_t nrest,
                             uint64_t read, uint64_t written);
void fu_prologue_end(fu_prologue *pr);
/* On the CPU a prologue is taken only for a single op (a cast); tests force every tree there. */
void fu_prologue_force_cpu(bool on);

#endif
