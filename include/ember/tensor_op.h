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

typedef enum em_op {
    EM_OP_NONE = 0,
    /* unary elementwise: in[0] = x; p.f[0], p.f[1] as noted */
    EM_OP_NEG, EM_OP_ABS, EM_OP_SIGN, EM_OP_EXP, EM_OP_LN, EM_OP_LOG1P, EM_OP_EXPM1, EM_OP_SQRT,
    EM_OP_RSQRT, EM_OP_RECIPROCAL, EM_OP_SIN, EM_OP_COS, EM_OP_TANH, EM_OP_ERF, EM_OP_SIGMOID,
    EM_OP_RELU, EM_OP_GELU, EM_OP_GELU_TANH, EM_OP_SILU, EM_OP_SOFTPLUS, EM_OP_FLOOR, EM_OP_CEIL,
    EM_OP_ROUND,
    EM_OP_CLAMP,         /* f[0] = lo, f[1] = hi */
    EM_OP_POW_SCALAR,    /* x ^ f[0] */
    EM_OP_ADD_SCALAR,    /* x + f[0] (sub_scalar records f[0] = -s) */
    EM_OP_MUL_SCALAR,    /* x * f[0] */
    EM_OP_DIV_SCALAR,    /* x / f[0] */
    EM_OP_RSUB_SCALAR,   /* f[0] - x */
    EM_OP_RDIV_SCALAR,   /* f[0] / x */
    EM_OP_MAXIMUM_SCALAR, EM_OP_MINIMUM_SCALAR, /* max/min(x, f[0]) */
    EM_OP_CAST,          /* to out's dtype (clone and contiguous record this too) */
    /* binary, broadcasting: in[0] = a, in[1] = b (after promotion, the gradient is cast back) */
    EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV, EM_OP_POW, EM_OP_MAXIMUM, EM_OP_MINIMUM,
    EM_OP_REMAINDER,
    EM_OP_WHERE,         /* in[0] = cond, in[1] = a, in[2] = b */
    EM_OP_MASKED_FILL,   /* in[0] = x, in[1] = mask; f[0] = value */
    /* reductions: i[0..ni) = the reduced dims (normalized, ascending), keepdim = flag */
    EM_OP_SUM, EM_OP_MEAN, EM_OP_PROD, EM_OP_MAX, EM_OP_MIN, EM_OP_LOGSUMEXP,
    EM_OP_VAR, EM_OP_STD, /* k = correction */
    EM_OP_CUMSUM,        /* k = dim */
    EM_OP_SOFTMAX, EM_OP_LOG_SOFTMAX, /* k = dim (normalized) */
    EM_OP_LAYER_NORM,    /* in = x, weight or NULL, bias or NULL; k = nnorm; f[0] = eps */
    EM_OP_RMS_NORM,      /* in = x, weight or NULL; k = nnorm; f[0] = eps */
    /* layout: out's geometry is in out; p as noted */
    EM_OP_RESHAPE,       /* any view/copy to out's shape with the same numel (view, flatten,
                            squeeze, unsqueeze record this) */
    EM_OP_PERMUTE,       /* i[0..ni) = perm (transpose records the swap) */
    EM_OP_EXPAND,        /* to out's shape */
    EM_OP_SLICE,         /* k = dim; i[0] = start, i[1] = end, i[2] = step (normalized) */
    EM_OP_SELECT,        /* k = dim; i[0] = index (normalized) */
    EM_OP_FLIP,          /* i[0..ni) = dims */
    EM_OP_CAT,           /* in[0..nin) along k = dim (normalized) */
    EM_OP_TRIL, EM_OP_TRIU, /* k = diagonal */
    EM_OP_PAD,           /* i[0..ni) = pads as given to em_pad; f[0] = value */
    /* matmul: in[0] = a, in[1] = b (the 1-D promotions of torch.matmul included) */
    EM_OP_MATMUL,
    /* indexing: in[0] = t, in[1] = index (not differentiable), in[2] = src */
    EM_OP_INDEX_SELECT,  /* k = dim */
    EM_OP_GATHER,        /* k = dim */
    EM_OP_SCATTER,       /* k = dim */
    EM_OP_SCATTER_ADD,   /* k = dim */
    EM_OP_EMBEDDING,     /* in[0] = weight, in[1] = ids */
    /* convolution (NCHW): in = x, weight, bias or NULL; i[0..4) = stride, padding, dilation, groups */
    EM_OP_CONV2D,
    EM_OP_MAX_POOL2D, EM_OP_AVG_POOL2D, /* i[0..3) = kernel, stride (resolved), padding */
    EM_OP_COUNT
} em_op;

/* The most inputs an op reports (cat of more tensors reports in chunks of cats). */
#define EM_OP_MAX_INPUTS 16

typedef struct em_op_params {
    double f[4];      /* float parameters */
    int64_t i[16];    /* integer lists: dims, perm, pads, slice bounds */
    int ni;           /* entries of i used */
    int64_t k;        /* one integer: dim, correction, diagonal, nnorm */
    bool flag;        /* keepdim */
} em_op_params;

/* A short lowercase name ("add", "layer_norm"). */
const char *em_op_name(em_op op);

/* The recorder: called by an op after it computed `out` (a new reference the op returns) from
 * `in` (borrowed; entries may be NULL for absent optional inputs), when some input carries an
 * annotation. `release` is called as a tensor carrying an annotation is freed (the recorder frees
 * the annotation). */
typedef struct em_op_recorder {
    void (*record)(em_op op, const em_op_params *p, const em_tensor *const *in, int nin,
                   em_tensor *out);
    void (*release)(em_tensor *t, void *annotation);
} em_op_recorder;

/* Installs the recorder (one per process; NULL uninstalls). */
void em_set_op_recorder(const em_op_recorder *r);

/* The annotation slot a recorder keeps per tensor (NULL by default). A view made by an op gets
 * no annotation of its own unless the recorder gives it one. */
void *em_tensor_annotation(const em_tensor *t);
void em_tensor_set_annotation(em_tensor *t, void *annotation);

#ifdef __cplusplus
}
#endif
#endif
