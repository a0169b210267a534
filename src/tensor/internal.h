/* internal.h — what the tensor layer's files share: the tensor and storage structs, creation of
 * result tensors, input checks that set errors in the house style, host dtype conversions, the
 * scope hooks, and the launcher that binds a kernel of src/kernels/tensor_*.ek to tensors. */
#ifndef EM_TENSOR_INTERNAL_H
#define EM_TENSOR_INTERNAL_H

#include <stdatomic.h>

#include "base/base.h"
#include "ember/lang.h"
#include "ember/tensor.h"

struct fu_node;

/* A reference-counted device buffer shared by every view on it. */
typedef struct tn_storage {
    atomic_int refs;         /* views holding it (and pending fusion nodes reading it) */
    em_buffer *buf;          /* the device buffer; NULL until first needed for a deferred storage
                              * (tn_new_deferred): every reader realizes first (tn_realize), which
                              * allocates it */
    em_device *dev;          /* its device */
    size_t bytes;            /* size of buf */
    struct fu_node *pending; /* the fused computation that will fill buf (fusion.c), or NULL */
    atomic_int readers;      /* leaves of pending nodes that read buf */
} tn_storage;

struct em_tensor {
    atomic_int refs;             /* references to this tensor */
    tn_storage *st;              /* the storage viewed */
    em_scalar dtype;             /* element type */
    int rank;                    /* dims, 0..EM_MAX_RANK */
    int64_t shape[EM_MAX_RANK];  /* sizes */
    int64_t stride[EM_MAX_RANK]; /* strides in elements (non-negative) */
    int64_t offset;              /* first element, in elements from the start of the storage */
    void *scope;                 /* the scope holding the creation reference, or NULL */
    size_t scope_slot;           /* index in that scope's list */
    bool taken;                  /* donated with em_take to the next op reading it */
    void *annotation;            /* the op recorder's per-tensor data (tensor_op.h), or NULL */
};

/* ---- op recording (record.c) ---- */
#include "ember/tensor_op.h"
/* Reports an op to the installed recorder when some input carries an annotation and out is a
 * floating-point tensor (integer and bool results are not differentiable). Call it after out is
 * computed and while every input is still alive (before tn_done). NULL out is ignored. */
void tn_record(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
               em_tensor *out);
/* Shorthands: one input with no parameters, and a params block with k set. */
void tn_record1(em_tensor_op op, const em_tensor *in, em_tensor *out);
em_top_params tn_params_k(int64_t k);
/* True when a recorder is installed and some of in[0..n) carries an annotation: the op will be
 * recorded, so it must not write its result into an input's buffer. */
bool tn_recording(const em_tensor *const *in, int n);
/* Whether the installed, active recorder keeps input i's value when it records op (true when it
 * cannot say; false with no recorder or while it records nothing). */
bool tn_record_keeps_input(em_tensor_op op, int i);
/* Called as an annotated tensor is freed (releases the annotation through the recorder). */
void tn_release_annotation(em_tensor *t);
/* Asks the recorder whether an in-place write into t is allowed (EM_OK when not annotated). */
em_status tn_check_write(const em_tensor *t, const char *op);

/* ---- scopes (scope.c) ---- */
/* Registers a new tensor with the current scope (if any). Returns t. */
em_tensor *tn_scope_track(em_tensor *t);
/* Called when a tensor is freed or its scope reference dropped: forgets it. */
void tn_scope_forget(em_tensor *t);

/* ---- tensors (tensor.c) ---- */
/* A new tensor viewing st (retained) with the given geometry; tracked by the scope. */
em_tensor *tn_view(const em_tensor *base, int rank, const int64_t *shape, const int64_t *stride,
                   int64_t offset);
/* Moves t's values into `region` (a contiguous tensor of t's dtype, device and element count,
 * in another storage) and makes t a contiguous view of region's storage at region's offset, so
 * that every holder of t sees it there (the optimizer's flat parameter storage, optim/arena.c).
 * t's old storage is released. EM_ERR_UNSUPPORTED when another view shares t's storage (it would
 * keep the old values); EM_ERR_INVALID when region does not fit t. Call with recording off. */
em_status tn_rebase(em_tensor *t, const em_tensor *region);
/* A new contiguous tensor with uninitialized storage. */
em_tensor *tn_new(em_device *dev, em_scalar dtype, int rank, const int64_t *shape);
/* A rank-4 attention operand as the attention kernels read it: t itself (a new, realized
 * reference) when its last dim is contiguous (or of size 1) and every element index of its
 * storage fits u32, else a contiguous copy. NULL on error (ops_attention.c). */
em_tensor *tn_attn_view(const em_tensor *t);
/* The same without a buffer yet (for elementwise results, which fusion may record): the buffer
 * is allocated by fu_realize when the pending computation runs or a kernel binds the storage,
 * and never when a pending result is dropped unread. Zero-size tensors get theirs at once, and
 * so does every tensor while fusion is off. */
em_tensor *tn_new_deferred(em_device *dev, em_scalar dtype, int rank, const int64_t *shape);
void tn_contig_strides(int rank, const int64_t *shape, int64_t *stride);
int64_t tn_numel(int rank, const int64_t *shape);
/* Normalizes a (possibly negative) dim for rank; -1 with the error set (naming op) when out of
 * range. rank 0 accepts dims 0 and -1 as in PyTorch when allow_scalar. */
int tn_dim(const char *op, int dim, int rank);
/* "f32[2, 3]" for messages. */
void tn_describe_shape(em_scalar dt, int rank, const int64_t *shape, char *buf, size_t size);
bool tn_check_dtype_supported(const char *op, em_scalar dt);
/* Checks a and b share a device (error names both). */
bool tn_same_device(const char *op, const em_tensor *a, const em_tensor *b);
/* Releases t if it was donated with em_take (after an op read it). */
void tn_done(const em_tensor *t);
/* True when t may be overwritten by its consumer (taken, only reference, sole view, contiguous). */
bool tn_reusable(const em_tensor *t);
/* One more reference to a storage, and one less (the last frees its buffer, and drops a pending
 * computation uncomputed). */
void tn_storage_retain(tn_storage *st);
void tn_storage_release(tn_storage *st);
/* Runs t's pending fused computation (fusion.c), if any, allocating a deferred buffer first:
 * afterwards t->st->buf exists and holds its values. Every reader of a buffer outside tn_launch
 * (host reads, kernels launched directly) calls it first. EM_OK (also for NULL), or the error
 * set (out of device memory included). */
em_status tn_realize(const em_tensor *t);

/* ---- the fused classifier's parts (ops_xent.c), for ops_xent_linear.c ---- */
/* targets [N] checked against n_class classes: i32 classes (-1 where ignore_index), *valid the
 * rows not ignored; NULL with the error set (a target out of range names its row). */
em_tensor *tn_xent_classes(const char *op, const em_tensor *targets, int64_t n_class,
                           int64_t ignore_index, int64_t *valid);
/* The per-row losses [N] of logits [N, C] (realized, 2-D) against checked classes, recording
 * nothing; NULL with the error set. */
em_tensor *tn_xent_rows(const em_tensor *logits, const em_tensor *cls);
/* Both at once, in one launch that reads the logits twice (tn_xent_rows, then
 * em_cross_entropy_rows_backward, read them three times): returns the logits' gradient (over
 * the logits when they are donated, as em_cross_entropy_rows_backward) for row gradients
 * grad_out and label smoothing ls, and sets *rows to the per-row losses [N] (grad_out's dtype),
 * recording nothing; NULL with the error set (*rows NULL). The logits are released when
 * donated. */
em_tensor *tn_xent_rows_grad(const em_tensor *grad_out, const em_tensor *logits, const em_tensor *classes,
                             double ls, em_tensor **rows);

/* ---- host dtype conversions (convert.c) ---- */
uint16_t tn_f32_to_f16(float f);
float tn_f16_to_f32(uint16_t h);
uint16_t tn_f32_to_bf16(float f);
float tn_bf16_to_f32(uint16_t h);
/* Reads element i of a host array of dtype dt as double, and writes one. */
double tn_host_get(em_scalar dt, const void *p, size_t i);
void tn_host_set(em_scalar dt, void *p, size_t i, double v);

/* ---- kernel launches (launch.c) ---- */
/* The compute type of a dtype: f32 for f16/bf16/f32, f64, i64 for i64, i32 for the rest. */
em_scalar tn_compute_type(em_scalar dt);
/* The type transcendental functions run in for compute type ct on dev: ct, except f32 for f64 on
 * targets without f64 math (GLSL). */
em_scalar tn_math_type(em_device *dev, em_scalar ct);

/* A kernel argument under construction. */
typedef struct tn_arg {
    const em_tensor *t; /* a tensor argument (viewed with rank/shape/stride below), or NULL */
    int rank;           /* its rank as the kernel sees it */
    int64_t shape[EM_MAX_RANK];
    int64_t stride[EM_MAX_RANK];
    int64_t offset;     /* in elements */
    bool flat;          /* pass as a rank-less array over the whole storage from offset */
    unsigned lanes;     /* scalars per element as the kernel declares it: 0 for the launch's line
                         * width (a tensor of lines), 1 for a tensor of scalars in a launch
                         * whose other tensors are lines */
    em_arg scalar;      /* a scalar argument when t is NULL */
} tn_arg;

tn_arg tn_arg_t(const em_tensor *t);                 /* t's own geometry */
tn_arg tn_arg_flat(const em_tensor *t);              /* rank-less array from t's offset */
tn_arg tn_arg_geom(const em_tensor *t, int rank, const int64_t *shape, const int64_t *stride,
                   int64_t offset);
tn_arg tn_arg_s(em_arg a);
/* A flat buffer argument over t's whole storage read as dtype dt, in elements of `lanes` scalars
 * (for kernels whose arguments are built outside tn_launch). */
em_arg tn_flat_buffer(const em_tensor *t, em_scalar dt, unsigned lanes);

/* Launches tensor kernel `name` of the built-in module on dev with bindings, line width lw and a
 * 3-D grid. Pending tensors among the arguments are realized first, and pending computations that
 * read a buffer the kernel writes run before it. EM_OK or the error set (prefixed with op). */
em_status tn_launch(const char *op, em_device *dev, const char *name, const em_lang_bind *binds,
                    size_t nbinds, unsigned lw, const uint32_t cubes[3], const uint32_t units[3],
                    tn_arg *args, size_t nargs);
/* tn_launch for a kernel whose input args[0] is a pending tensor computed in its loads (pr, from
 * fu_prologue_begin; the kernel is `name` of src/kernels/<file>.ek instantiated by
 * fusion_reduce.c): args[0]'s buffer is not bound (its offset is), writes[i] says whether the
 * kernel writes args[i] (the plain kernel's IR is not compiled to find out). */
struct fu_prologue;
em_status tn_launch_prologue(const char *op, struct fu_prologue *pr, const char *file, const char *name,
                             const em_lang_bind *binds, size_t nbinds, unsigned lw, const uint32_t cubes[3],
                             const uint32_t units[3], tn_arg *args, size_t nargs, const bool *writes);
/* The bytes a kernel moves through a view of dtype dt over (rank, shape, stride): the elements
 * it addresses (a dim of stride 0, broadcast, counts once; none when the view is empty) times the
 * dtype's size. The model of traffic em_tensor_stats and the profiler report, not a hardware
 * counter. */
uint64_t tn_view_bytes(em_scalar dt, int rank, const int64_t *shape, const int64_t *stride);

/* The cube size for reducing n elements in one cube: a power of two in 32..256 (the smallest
 * covering n, or 256); *log (when not NULL) receives its base-2 log. */
unsigned tn_cube_for(int64_t n, unsigned *log);
/* 1-D grid covering n units in cubes of 256 (n must fit in u32). */
void tn_grid_1d(uint64_t n, uint32_t cubes[3], uint32_t units[3]);

/* Copies src (any view) into dst (any view of the same shape and dtype). */
em_status tn_copy_into(const char *op, em_tensor *dst, const em_tensor *src);

/* A contiguous version of t (a view when it already is, else a copy) that never consumes a
 * donated t, for use inside ops. The result is realized: its buffer holds its values. */
em_tensor *tn_contig(const em_tensor *t);

/* ops_index_device.c, in trusted-index mode (em_trusted_indices): the embedding gradient [V, D]
 * of grad [..., D] over ids [...] with the stable sort by id on the device, and cross-entropy's
 * classes (targets clamped into [0, n_class), as i32 [N]). New references; NULL with the error
 * set. */
em_tensor *tn_embedding_backward_device(const char *op, const em_tensor *grad,
                                        const em_tensor *ids, int64_t V);
em_tensor *tn_classes_device(const em_tensor *targets, int64_t n_class);

/* Writes value into every element of out (ops_elementwise.c). */
em_status tn_fill(em_tensor *out, double value);

/* Scalars passed to kernels as the compute type of dt. */
em_arg tn_scalar_arg(em_scalar dt, double v);
/* Whether a kernel may load the n tensors' buffers before its dependency_wait() (a comptime PRE
 * flag): where each is settled (em_buffer_settled: no launch that may still run writes it) on
 * CUDA, the one target whose wait lets the launches before run out meanwhile. The environment
 * variable env: "0" never, "1" on any target where they are settled (tests). */
bool tn_preload_ok(em_device *dev, const char *env, const em_tensor *const *ts, int n);

/* Elementwise entry points shared by several files (ops_elementwise.c). */
enum {
    TN_U_NEG = 0, TN_U_ABS, TN_U_SIGN, TN_U_EXP, TN_U_LOG, TN_U_LOG1P, TN_U_EXPM1, TN_U_SQRT,
    TN_U_RSQRT, TN_U_RECIP, TN_U_SIN, TN_U_COS, TN_U_TANH, TN_U_ERF, TN_U_SIGMOID, TN_U_RELU,
    TN_U_GELU, TN_U_GELU_TANH, TN_U_SILU, TN_U_SOFTPLUS, TN_U_FLOOR, TN_U_CEIL, TN_U_ROUND,
    TN_U_CLAMP, TN_U_POWS, TN_U_ISNAN, TN_U_ISINF, TN_U_NOT, TN_U_COPY, TN_U_ADDS, TN_U_MULS,
    TN_U_RSUBS, TN_U_RDIVS, TN_U_MAXS, TN_U_MINS, TN_U_EQS, TN_U_LTS, TN_U_GTS, TN_U_FILL,
    TN_U_SUBS, TN_U_DIVS,
};
em_tensor *tn_unary(const char *op, const em_tensor *t, int code, double p0, double p1);
/* The binary ops' codes (tn_binary_op and tn_binary_pred of tensor_elementwise.ek). */
enum {
    TN_B_ADD = 0,
    TN_B_SUB,
    TN_B_MUL,
    TN_B_DIV,
    TN_B_POW,
    TN_B_MAX,
    TN_B_MIN,
    TN_B_REM,
    TN_B_EQ,
    TN_B_NE,
    TN_B_LT,
    TN_B_LE,
    TN_B_GT,
    TN_B_GE,
    TN_B_AND,
    TN_B_OR,
    TN_B_XOR,
    TN_B_GELU_GRAD,
    TN_B_GELU_TANH_GRAD,
};
/* Broadcast shape of a and b into out; false with "op: shapes A and B cannot be broadcast". */
bool tn_broadcast(const char *op, const em_tensor *a, const em_tensor *b, int *rank,
                  int64_t *shape);
/* The view of t expanded to (rank, shape) with stride 0 on broadcast dims (no checks). */
void tn_expand_geom(const em_tensor *t, int rank, const int64_t *shape, int64_t *stride);

/* The row-wise fast path of ops_reduce.c (src/kernels/tensor_rowwise.ek), for the kernels that
 * read rows the same way (ops_norm_backward.c). */
typedef struct tn_rows_plan {
    unsigned lw;     /* line width: scalars per load */
    unsigned g;      /* units per row (a power of two) */
    unsigned cube;   /* units per cube (a multiple of g) */
    unsigned v;      /* lines each unit keeps in registers; 0: the row is walked once per pass */
    uint32_t rows;   /* rows */
    uint32_t nl;     /* lines per row */
    uint32_t x_rs;   /* row stride of the input, in lines */
} tn_rows_plan;

/* Whether the last k dims of t are contiguous together (rows of *n elements, stride 1) and its
 * other dims merge into one (rows at a stride of *rs elements). */
bool tn_rows_geometry(const em_tensor *t, int k, int64_t *rows, int64_t *n, int64_t *rs);
/* The plan for rows x n elements of dt on dev (al[0..na): offsets and strides a line must
 * divide; cap: the widest line width allowed); false when the row-wise path does not apply. */
bool tn_rows_plan_for(em_device *dev, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                      const int64_t *al, int na, unsigned cap, tn_rows_plan *p);
/* The same for a device of capabilities c, a unit holding up to `values` values of each array it
 * keeps in registers (0: the row-wise kernels' 32, 16 for f64). */
bool tn_rows_plan_caps(const em_caps *c, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                       const int64_t *al, int na, unsigned cap, unsigned values, tn_rows_plan *p);
/* The comptime bindings G, CUBE and V of plan p into b; returns 3. */
size_t tn_rows_binds(const tn_rows_plan *p, em_lang_bind *b);
/* The plan of tensor_norm_backward (ops_norm_backward.c) for rows x n elements of dt, as
 * tn_rows_plan_caps makes it with 16-byte lines and fewer values held per array. */
bool tn_norm_backward_plan(const em_caps *c, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                           const int64_t *al, int na, tn_rows_plan *p);
/* em_attention_fast for q of dtype dt and head size D on dev (ops_attention.c). */
bool tn_attention_fast(em_device *dev, em_scalar dt, int64_t D);
/* The wgmma attention kernels' tiles in effect at head size D, "FWD_WG:FWD_BK:KV_WG:KV_BQ:Q_WG:Q_BK"
 * (the defaults for D, or EMBER_ATTENTION_TILES where it is valid), into out. */
void tn_attention_tiles(int64_t D, char *out, size_t size);
/* Attention into given tensors (ops_attention.c; em_attention_qkv): the forward writes out (q's
 * shape, a view with a contiguous last dim) and lse ([B, H, Tq], the compute type) after
 * em_attention's checks; the backward writes the gradients into dq, dk and dv (views of q's, k's
 * and v's shapes, each with a contiguous last dim). EM_OK or the error set (prefixed with op). */
em_status tn_attention_forward_into(const char *op, const em_tensor *q, const em_tensor *k,
                                    const em_tensor *v, bool causal, double scale, em_tensor *out,
                                    em_tensor *lse);
em_status tn_attention_backward_into(const char *op, const em_tensor *grad_out, const em_tensor *q,
                                     const em_tensor *k, const em_tensor *v, const em_tensor *out,
                                     const em_tensor *lse, bool causal, double scale, em_tensor *dq,
                                     em_tensor *dk, em_tensor *dv);
/* out (contiguous, [n], any float dtype) = the sums of the rows of t, a contiguous [rows, n]
 * float tensor, on the column path (tensor_cols.ek), accumulated in t's compute type; one launch
 * for up to 2048 rows. */
em_status tn_cols_sum_rows(const char *op, const em_tensor *t, em_tensor *out);
/* out (float, t's trailing dims) = the sum of float t over its leading dims, written in place:
 * em_sum_leading_into without consuming t; a pending matmul's result takes the sums in its
 * epilogue (fu_mm_colsum_into). */
em_status tn_sum_leading_into(const char *op, const em_tensor *t, em_tensor *out);
/* out = unary op `code` (a float op without parameters: TN_U_*) of t, into out (t's shape),
 * launched now (not recorded for fusion): a matmul's activation after its pre-activation result. */
em_status tn_unary_run(const char *op, const em_tensor *t, em_tensor *out, int code);

#endif
