/* ember/tensor_op.h — the op vocabulary of the tensor layer, for the layers that record ops
 * (autodiff now, the fusion stream later): an id per differentiable op, the parameters that
 * define it, and one hook through which every op reports what it computed.
 *
 * An op of tensor.h, after computing `out` from its inputs, reports (op, params, inputs, out) to
 * the installed recorder when at least one input carries a recorder annotation (em_tensor's
 * annotation slot, set by the recorder, e.g. on tensors that require gradients). Ops built from
 * other public ops may report nothing themselves: their parts report. With no recorder installed
 * or no annotated input the cost is one pointer test per input. */
#ifndef EMBER_TENSOR_OP_H
#define EMBER_TENSOR_OP_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum em_tensor_op {
    EM_TOP_NONE = 0,
    /* unary elementwise: in[0] = x; p.f[0], p.f[1] as noted */
    EM_TOP_NEG, EM_TOP_ABS, EM_TOP_SIGN, EM_TOP_EXP, EM_TOP_LN, EM_TOP_LOG1P, EM_TOP_EXPM1, EM_TOP_SQRT,
    EM_TOP_RSQRT, EM_TOP_RECIPROCAL, EM_TOP_SIN, EM_TOP_COS, EM_TOP_TANH, EM_TOP_ERF, EM_TOP_SIGMOID,
    EM_TOP_RELU, EM_TOP_GELU, EM_TOP_GELU_TANH, EM_TOP_SILU, EM_TOP_SOFTPLUS, EM_TOP_FLOOR, EM_TOP_CEIL,
    EM_TOP_ROUND,
    EM_TOP_CLAMP,         /* f[0] = lo, f[1] = hi */
    EM_TOP_POW_SCALAR,    /* x ^ f[0] */
    EM_TOP_ADD_SCALAR,    /* x + f[0] (sub_scalar records f[0] = -s) */
    EM_TOP_MUL_SCALAR,    /* x * f[0] */
    EM_TOP_DIV_SCALAR,    /* x / f[0] */
    EM_TOP_RSUB_SCALAR,   /* f[0] - x */
    EM_TOP_RDIV_SCALAR,   /* f[0] / x */
    EM_TOP_MAXIMUM_SCALAR, EM_TOP_MINIMUM_SCALAR, /* max/min(x, f[0]) */
    EM_TOP_CAST,          /* to out's dtype (clone and contiguous record this too) */
    /* binary, broadcasting: in[0] = a, in[1] = b (after promotion, the gradient is cast back) */
    EM_TOP_ADD, EM_TOP_SUB, EM_TOP_MUL, EM_TOP_DIV, EM_TOP_POW, EM_TOP_MAXIMUM, EM_TOP_MINIMUM,
    EM_TOP_REMAINDER,
    EM_TOP_WHERE,         /* in[0] = cond, in[1] = a, in[2] = b */
    EM_TOP_MASKED_FILL,   /* in[0] = x, in[1] = mask; f[0] = value */
    /* reductions: i[0..ni) = the reduced dims (normalized, ascending), keepdim = flag */
    EM_TOP_SUM, EM_TOP_MEAN, EM_TOP_PROD, EM_TOP_MAX, EM_TOP_MIN, EM_TOP_LOGSUMEXP,
    EM_TOP_VAR, EM_TOP_STD, /* k = correction */
    EM_TOP_CUMSUM,        /* k = dim */
    EM_TOP_SOFTMAX, EM_TOP_LOG_SOFTMAX, /* k = dim (normalized) */
    EM_TOP_LAYER_NORM,    /* in = x, weight or NULL, bias or NULL; k = nnorm; f[0] = eps */
    EM_TOP_RMS_NORM,      /* in = x, weight or NULL; k = nnorm; f[0] = eps */
    /* layout: out's geometry is in out; p as noted */
    EM_TOP_RESHAPE,       /* any view/copy to out's shape with the same numel (view, flatten,
                            squeeze, unsqueeze record this) */
    EM_TOP_PERMUTE,       /* i[0..ni) = perm (transpose records the swap) */
    EM_TOP_EXPAND,        /* to out's shape */
    EM_TOP_SLICE,         /* k = dim; i[0] = start, i[1] = end, i[2] = step (normalized) */
    EM_TOP_SELECT,        /* k = dim; i[0] = index (normalized) */
    EM_TOP_FLIP,          /* i[0..ni) = dims */
    EM_TOP_CAT,           /* in[0..nin) along k = dim (normalized) */
    EM_TOP_TRIL, EM_TOP_TRIU, /* k = diagonal */
    EM_TOP_PAD,           /* i[0..ni) = pads as given to em_pad; f[0] = value */
    /* matmul: in[0] = a, in[1] = b (the 1-D promotions of torch.matmul included) */
    EM_TOP_MATMUL,
    /* indexing: in[0] = t, in[1] = index (not differentiable), in[2] = src */
    EM_TOP_INDEX_SELECT,  /* k = dim */
    EM_TOP_GATHER,        /* k = dim */
    EM_TOP_SCATTER,       /* k = dim */
    EM_TOP_SCATTER_ADD,   /* k = dim */
    EM_TOP_EMBEDDING,     /* in[0] = weight, in[1] = ids */
    /* convolution (NCHW): in = x, weight, bias or NULL; i[0..4) = stride, padding, dilation, groups */
    EM_TOP_CONV2D,
    EM_TOP_MAX_POOL2D, EM_TOP_AVG_POOL2D, /* i[0..3) = kernel, stride (resolved), padding */
    /* the fused classifier: in[0] = logits [N, C], in[1] = the checked i32 classes [N] (-1:
     * ignored); f[0] = label smoothing (em_cross_entropy_rows) */
    EM_TOP_CROSS_ENTROPY,
    /* fused attention: in[0..3) = q, k, v, in[3] = the log-sum-exp of each query row (f32, f64
     * for f64; not differentiable); f[0] = scale, flag = causal (em_attention) */
    EM_TOP_ATTENTION,
    /* the classifier over a linear layer's rows, in chunks (em_linear_cross_entropy): in[0] = x
     * [N, C], in[1] = w [V, C], in[2], in[3] = the gradients of the summed loss for x and w,
     * computed by the forward (not differentiable); f[0] = the mean's divisor's inverse */
    EM_TOP_LINEAR_CROSS_ENTROPY,
    /* fused attention over a packed projection (em_attention_qkv): in[0] = qkv [B, T, 3C], in[1]
     * = the log-sum-exp of each query row (not differentiable); f[0] = scale, flag = causal,
     * k = heads */
    EM_TOP_ATTENTION_QKV,
    EM_TOP_COUNT
} em_tensor_op;

/* The most inputs an op reports (cat of more tensors reports in chunks of cats). */
#define EM_TOP_MAX_INPUTS 16

typedef struct em_top_params {
    double f[4];      /* float parameters */
    int64_t i[16];    /* integer lists: dims, perm, pads, slice bounds */
    int ni;           /* entries of i used */
    int64_t k;        /* one integer: dim, correction, diagonal, nnorm */
    bool flag;        /* keepdim */
} em_top_params;

/* A short lowercase name ("add", "layer_norm"). */
const char *em_top_name(em_tensor_op op);

/* The recorder: called by an op after it computed `out` (a new reference the op returns) from
 * `in` (borrowed; entries may be NULL for absent optional inputs), when some input carries an
 * annotation. `release` is called as a tensor carrying an annotation is freed (the recorder frees
 * the annotation). */
typedef struct em_op_recorder {
    void (*record)(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
                   em_tensor *out);
    void (*release)(em_tensor *t, void *annotation);
    /* Optional: asked before an in-place write into an annotated tensor (em_copy_); returns EM_OK
     * or an error status with the message set (e.g. a tensor requiring gradients while
     * gradients are recorded), which the write then returns. */
    em_status (*check_write)(const em_tensor *t, const char *op);
    /* Optional: false while the recorder records nothing on this thread (autodiff's no-grad), so
     * that ops may then reuse donated buffers and fuse as if no input were annotated. */
    bool (*active)(void);
    /* Optional: whether recording op keeps the value of its input i (its backward reads it, or a
     * recipe replays the op from it). When it does not, the op may take over a donated input's
     * pending computation instead of reading its result (a matmul's epilogue absorbing an add
     * while gradients are recorded). Absent: every input is taken as kept. */
    bool (*keeps_input)(em_tensor_op op, int i);
} em_op_recorder;

/* Installs the recorder (one per process; NULL uninstalls). */
void em_set_op_recorder(const em_op_recorder *r);

/* The annotation slot a recorder keeps per tensor (NULL by default). A view made by an op gets
 * no annotation of its own unless the recorder gives it one. */
void *em_tensor_annotation(const em_tensor *t);
void em_tensor_set_annotation(em_tensor *t, void *annotation);

/* Helpers for recorders (they hold tensors beyond the caller's scopes):
 * em_tensor_alias: a new tensor object viewing t's storage with t's geometry, with no annotation
 * and recording nothing; it belongs to no scope (the caller owns it). NULL on error.
 * em_tensor_untrack: removes t from the scope holding its creation reference (the caller owns
 * that reference from now on).
 * em_tensor_exclusive: true when t has one reference and is the only view of its storage. */
em_tensor *em_tensor_alias(const em_tensor *t);
void em_tensor_untrack(em_tensor *t);
bool em_tensor_exclusive(const em_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
