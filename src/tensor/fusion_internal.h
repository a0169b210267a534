/* fusion_internal.h — what the files of the fusion layer share (fusion.c records and realizes
 * elementwise trees; fusion_reduce.c fuses a pending tree into the loads of a reduction;
 * fusion_matmul.c keeps a matmul pending and grows its epilogue; fusion_rows.c does the same for
 * a row-wise reduction): the node layout, the lock, and the pieces of kernel generation. Not for
 * the rest of the tensor layer, which sees fusion.h only — except ops_reduce.c, which records
 * and runs the pending row-wise reductions (fu_rows_call, tn_rows_run). */
#ifndef EM_TENSOR_FUSION_INTERNAL_H
#define EM_TENSOR_FUSION_INTERNAL_H

#include <pthread.h>

#include "base/strbuf.h"
#include "tensor/fusion.h"

#define FU_MAX_OPS 24     /* ops and leaves in one node */
#define FU_MAX_COMPUTE 16 /* ops (not leaves) in one node: a longer chain is realized */
#define FU_MAX_LEAVES 8   /* input buffers of one fused kernel */
#define FU_MAX_PARAMS 16  /* scalar parameters of ops in one node */
#define FU_MAX_SCALARS 16 /* scalar arguments of one kernel (offsets and parameters): Vulkan passes
                           * them as 8-byte push constants, and many devices have only 128 bytes */
#define FU_BCAST_OPS 4    /* a broadcast pending input is recomputed per element: only short ones */

typedef struct fu_op {
    uint8_t kind;     /* FU_LEAF .. FU_WHERE */
    uint8_t code;     /* the kernel's OP */
    em_scalar C, M;   /* compute and math types */
    em_scalar U;      /* the value's dtype (a leaf's dtype; an op's result dtype) */
    int8_t a, b, c;   /* operand ops (-1: none); a leaf's index in leaves[] for FU_LEAF */
    int8_t p;         /* first scalar parameter in params[] (-1: none) */
    int8_t np;        /* how many it uses (0..2) */
    const char *name; /* the op's name (a literal) */
} fu_op;

typedef struct fu_leaf {
    tn_storage *st;               /* the buffer read (retained; counted in st->readers) */
    em_scalar dtype;              /* its element type as read */
    int64_t stride[EM_MAX_RANK];  /* strides over the node's output shape (0: broadcast) */
    int64_t offset;               /* first element */
} fu_leaf;

struct fu_node {
    tn_storage *st;                /* the storage it fills (which owns the node) */
    struct fu_node *prev, *next;   /* the pending list */
    int rank;                      /* output shape */
    int64_t shape[EM_MAX_RANK];
    em_scalar dtype;               /* output dtype (the root's U) */
    bool inplace;                  /* some leaf reads st itself (an op on a donated buffer): it
                                    * may only be inlined into a node that fills st too */
    int inlined;                   /* consumers it has been inlined into */
    int nops, ncompute, nleaves, nparams;
    struct fu_matmul *mm; /* a pending matmul instead of a tree (fusion_matmul.c; its
                           * operands are the leaves, nops is 0), or NULL */
    struct fu_rows *rows; /* a pending row-wise reduction instead of a tree (fusion_rows.c; its
                           * inputs and its epilogue's leaves are the leaves, nops is 0), or NULL */
    fu_op ops[FU_MAX_OPS];
    fu_leaf leaves[FU_MAX_LEAVES];
    em_arg params[FU_MAX_PARAMS];
};
typedef struct fu_node fu_node;

/* Guards the pending list, every node and the kernel caches (recursive). */
extern pthread_mutex_t fu_lock;

/* Whether EMBER_FUSION_DEBUG is set (read once). */
bool fu_debug_on(void);
/* The embedded sources of src/kernels (generated into the library): how many, and the i-th's
 * file stem and text. */
size_t fu_builtin_count(void);
void fu_builtin_at(size_t i, const char **stem, const char **source);
/* The embedded source of src/kernels/<stem>.ek, or NULL. */
const char *fu_builtin_source(const char *stem);
/* Allocates st's buffer if it has none yet (a deferred storage). Called with the lock held.
 * EM_OK, or the error set (out of device memory). */
em_status fu_ensure_buffer(tn_storage *st);
/* Whether nd holds a transcendental op (exp, log, tanh, erf, sigmoid, the GELUs, SiLU, softplus,
 * pow): costly to compute twice on the CPU. */
bool fu_node_transcendental(const fu_node *nd);
/* The walk over nd's leaves and its contiguous output (the output last), their dtypes and
 * offsets (arrays of FU_WALK_MAX); returns the widest line width they allow. */
unsigned fu_node_walk(const fu_node *nd, fu_walk *w, em_scalar *dts, int64_t *offs);
/* The buffer argument of operand k of walk w, st read as dt in lines of lw. */
em_arg fu_operand_arg(tn_storage *st, em_scalar dt, unsigned lw, const fu_walk *w, int k);
/* Counts one fused launch covering n ops (em_tensor_stats). */
void fu_count_fused(int nops);
/* Counts one generated source (em_tensor_stats' fused_compiles). */
void fu_count_compile(void);
/* "exp, add, mul" into sb: the ops of nd. */
void fu_op_list(const fu_node *nd, em_strbuf *sb);
/* The signature of nd's tree: what a source generated from it depends on. */
void fu_signature(const fu_node *nd, em_strbuf *sb);

/* Kernel generation, in pieces other generators reuse (the leaves are kernel parameters x<i>,
 * x<i>_off of type tensor(line(dtype), R), each carrying the walk's shape; scalars s<j>):
 *  - fu_gen_params: ", const tensor(line(L), R) x0, u32 x0_off, ..." then ", C s0, ...";
 *  - fu_gen_index: the statements that set u32 i<k> (leaf k's element index) for the output
 *    element whose flat (row-major) index is the u32 expression `flat`, a multiple of
 *    LINE_WIDTH, walking the shape of the rank-R tensor parameter `shaped`;
 *  - fu_gen_ops: the statements computing every op, the root's value in v<nops - 1>, a
 *    line(U) of the node's dtype U. `ind` is the indentation. */
void fu_gen_params(const fu_node *nd, em_strbuf *sb);
void fu_gen_params_scalars(const fu_node *nd, em_strbuf *sb);
void fu_gen_index(const fu_node *nd, em_strbuf *sb, const char *flat, const char *shaped,
                  const char *ind);
void fu_gen_ops(const fu_node *nd, em_strbuf *sb, const char *ind);

/* The scalar parameters elementwise op d reads (0..2). (fusion.c) */
int fu_desc_params(const fu_desc *d);
/* Appends op d to nd's ops: result dtype U, operands child[0..2] (ops of nd, -1: none), its
 * scalar parameters copied into nd->params (the caller checked the room). (fusion.c) */
void fu_push_op(fu_node *nd, const fu_desc *d, em_scalar U, const int *child);
/* A copy of view t that no scope or recorder knows (a node holds its storage as a leaf).
 * (fusion.c) */
void fu_copy_view(em_tensor *dst, const em_tensor *t);

/* Links nd (filling nd->st, its leaves held) into the pending list as st's pending node. Called
 * with the lock held. (fusion.c) */
void fu_link(fu_node *nd);

/* Pending matmuls (fusion_matmul.c), called with the lock held:
 *  - fu_mm_absorb: out (the donated result of pending matmul nd: one of in[] is out itself)
 *    receives op d of in[0..nin); extends nd's epilogue and returns 1 when d fits it, else runs
 *    the matmul and returns 0 (the op is then recorded on the realized buffer), -1 with the error
 *    set when that failed;
 *  - fu_mm_take: in[self] is the whole, donated, otherwise unheld result of pending matmul nd,
 *    and out a fresh deferred storage: when op d fits nd's epilogue, nd moves to out's storage
 *    (in[self]'s is left empty, never to be read) and absorbs d, returning 1; else nothing
 *    changes and it returns 0 (-1 with the error set when an operand failed to run);
 *  - fu_mm_launch: runs nd's matmul with its epilogue into nd->st (its buffer allocated); EM_OK
 *    or the error set;
 *  - fu_mm_launch_into: runs nd's matmul into view dst (contiguous, realized, of the result's
 *    elements and dtype, its first element aligned to 256 bytes) instead of nd->st; EM_OK or
 *    the error set (fu_run_into, fusion.c);
 *  - fu_mm_colsum_into: when t is a whole view of the result of pending matmul (t->st's node)
 *    and out a contiguous float [N] (N the result's last dim) of another storage, runs the matmul
 *    now with out receiving the result's sums over its leading dims as well (mm_problem.colsum:
 *    in the epilogue where the kernel can) and sets *taken; otherwise does nothing. EM_OK or the
 *    error set;
 *  - fu_mm_act_pre: with EMBER_MATMUL_PRE=1, when unary op d is an activation the matmul's
 *    epilogue takes (GELU, GELU-tanh) of `in`, a whole view of the result of a pending matmul
 *    without an activation or residual that someone keeps (not donated, or donated with another
 *    reference: the autodiff tape's, for the GELU's backward), and `out` a fresh storage of
 *    its size: runs the matmul now writing act(result) into out and the result into its own
 *    storage (mm_problem.pre), returning 1; 0 when it does not apply, -1 with the error set;
 *  - fu_mm_error: adds the context of a failed realization to the error ("matmul f32[M, K] x
 *    f32[K, N] + bias, gelu_tanh (...)");
 *  - fu_mm_free: frees nd->mm (the leaves are free_node's). */
int fu_mm_absorb(fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin,
                 const em_tensor *out);
int fu_mm_take(fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin, int self,
               const em_tensor *out);
em_status fu_mm_launch(fu_node *nd);
em_status fu_mm_launch_into(fu_node *nd, const em_tensor *dst);
em_status fu_mm_colsum_into(const em_tensor *t, em_tensor *out, bool *taken);
int fu_mm_act_pre(const fu_desc *d, const em_tensor *in, em_tensor *out);
void fu_mm_error(const fu_node *nd);
void fu_mm_free(fu_node *nd);

/* Pending row-wise reductions (fusion_rows.c; docs/fusion.md, "Reductions with an epilogue").
 * ops_reduce.c describes the call; the node keeps copies of its views. */
typedef struct fu_rows_call {
    const char *op;    /* the op's name (a literal) */
    int kind;          /* 0: tensor_rows; 1: tensor_rows_sum (sum, mean); 2: tensor_xent (w holds
                        * the checked classes, eps the label smoothing) */
    em_tensor x, w, b; /* the input, weight and bias views (copies; their storages are leaves) */
    bool has_w, has_b;
    em_tensor out;     /* the result's view: on the node's storage, of the epilogue's dtype */
    int k;             /* the dims reduced (the last k) */
    double eps;        /* the norms' eps; the scale of a sum (1, or 1 / n for a mean) */
    int code;          /* tensor_rows' op: 0 softmax, 1 log_softmax, 2 layer_norm, 3 rms_norm */
} fu_rows_call;

/* Called with the lock held unless said otherwise:
 *  - fu_rows_record (takes the lock): records call c, whose result c->out is a fresh storage,
 *    as a pending node; 1 when recorded, 0 when it must run now (fusion off, no memory), -1
 *    with the error set when an input could not be realized;
 *  - fu_rows_absorb (takes the lock): when op d of in[0..nin) into out consumes the donated
 *    result of a pending row-wise reduction (in place, or a donated input out's shape as a fresh
 *    out), extends its epilogue and returns 1; returns 0 when no such input, or after running
 *    the reduction when the op does not fit (then the op reads its buffer); -1 with the error set;
 *  - fu_rows_launch: runs nd's reduction with its epilogue into nd->st (its buffer allocated);
 *  - fu_rows_error: adds the context of a failed realization to the error;
 *  - fu_rows_free: frees nd->rows (the leaves are free_node's). */
int fu_rows_record(const fu_rows_call *c);
int fu_rows_absorb(const fu_desc *d, const em_tensor *const *in, int nin, int64_t (*strides)[EM_MAX_RANK],
                   const em_tensor *out);
em_status fu_rows_launch(fu_node *nd);
void fu_rows_error(const fu_node *nd);
void fu_rows_free(fu_node *nd);
/* The epilogue node epi's kernel-language pieces (fusion_rows.c): appends to out the helper
 * fu_store and `text` (an instantiated kernel) with its output parameter's type made epi's dtype,
 * followed by epi's leaves and scalars, and each store `out[i] = line(T)(v);` (or, for an output
 * of scalars, `out[i] = T(v);`) made a call of fu_store. false when the text does not have that
 * shape. */
bool fu_epi_instantiate(const fu_node *epi, const char *text, em_strbuf *out);
/* The arguments epi's kernel parameters take (leaves in lines of lw over walk w, offsets,
 * scalars) into args, the leaves' bytes added to *read; returns how many, SIZE_MAX with the
 * error set when a leaf's buffer could not be allocated. */
size_t fu_epi_args(const fu_node *epi, const fu_walk *w, unsigned lw, em_arg *args, uint64_t *read);

/* Launches `kernel` of src/kernels/<file>.ek with pr's tree in its loads (pr may be NULL: x is
 * args[0]) and epi's epilogue in its stores (epi may be NULL; epi_scalar: the kernel's output is
 * a tensor of scalars, not lines): args are the plain kernel's, x's first (a placeholder when pr
 * is set), out's at index out_at. (fusion_reduce.c) */
em_status fu_reduce_launch(fu_prologue *pr, const fu_node *epi, bool epi_scalar, em_device *dev,
                           const char *file, const char *kernel, const em_lang_spec *spec, const uint32_t cubes[3],
                           const uint32_t units[3], const em_arg *args, size_t na, size_t out_at,
                           uint64_t read, uint64_t written);
/* Runs call c (ops_reduce.c: the row-wise kernel it would have launched) with epilogue epi (or
 * NULL) into c->out, whose storage's buffer exists. EM_OK or the error set. */
em_status tn_rows_run(const fu_rows_call *c, const fu_node *epi);
/* tn_rows_run for cross-entropy (kind 2; ops_xent.c). */
em_status tn_xent_run(const fu_rows_call *c, const fu_node *epi);

#endif
