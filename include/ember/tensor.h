/* ember/tensor.h — tensors and their ops. Every op runs as a kernel of ember's kernel layer (an .ek
 * kernel of src/kernels, or one generated through the IR builder), so one implementation runs on
 * every device.
 *
 * A tensor is a view — dtype, shape, strides (in elements), offset — on a reference-counted buffer
 * of one device. Ownership: an op returns a new reference, its inputs are borrowed; em_release
 * drops one. Scopes (em_scope_begin / em_scope_end) release every tensor created inside them
 * except those kept, so chains like em_gelu(em_matmul(x, w)) do not leak. Errors: an op given bad
 * arguments returns NULL and sets the thread's error (em_last_error); an op given a NULL input
 * returns NULL without touching the error, so a chain fails once, cleanly. */
#ifndef EMBER_TENSOR_H
#define EMBER_TENSOR_H

#include "ember/base.h"
#include "ember/kernel.h"
#include "ember/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_tensor em_tensor;

/* A shape: up to EM_MAX_RANK dims. EM_SHAPE(2, 3) builds one inline; EM_SHAPE() is a 0-d shape. */
typedef struct em_shape {
    int rank;                 /* number of dims, 0..EM_MAX_RANK */
    int64_t d[EM_MAX_RANK];   /* sizes */
} em_shape;
#define EM_SHAPE(...)                                                                              \
    ((em_shape){(int)(sizeof((int64_t[]){0, ##__VA_ARGS__}) / sizeof(int64_t)) - 1, {__VA_ARGS__}})

/* ---- the tensor ------------------------------------------------------------------------------ */

em_scalar em_dtype(const em_tensor *t);
int em_rank(const em_tensor *t);
em_shape em_shape_of(const em_tensor *t);
int64_t em_dim(const em_tensor *t, int dim);       /* negative dims count from the end */
int64_t em_stride(const em_tensor *t, int dim);
int64_t em_numel(const em_tensor *t);
em_device *em_tensor_device(const em_tensor *t);
bool em_is_contiguous(const em_tensor *t);
/* "f32[2, 3]" into buf (for messages). Returns buf. */
const char *em_describe(const em_tensor *t, char *buf, size_t size);

/* Reference counting. em_retain returns t. NULL is ignored by both. */
em_tensor *em_retain(em_tensor *t);
void em_release(em_tensor *t);

/* Scopes: tensors created while a scope is open belong to it; em_scope_end releases them all
 * except the `keep` ones, which move to the enclosing scope (or to the caller when none).
 * Scopes nest, per thread. */
void em_scope_begin(void);
void em_scope_end(em_tensor *const *keep, size_t nkeep);
/* Keeps one tensor out of the current scope's release (moves it to the enclosing scope). */
em_tensor *em_keep(em_tensor *t);


/* Donates t to the next op that reads it: that op releases t when it is done and, when t is the
 * only view of its buffer and the op allows it (elementwise ops whose output matches t's dtype
 * and layout), writes its result into t's buffer instead of allocating. Returns t. Use it on
 * temporaries: em_gelu(em_take(em_matmul(x, w))). */
em_tensor *em_take(em_tensor *t);

/* ---- creation (dtype any of f32 f16 bf16 f64 i32 i64 u8 bool) ---------------------------------- */

/* Every creation function returns a new contiguous tensor (the caller owns it) or NULL. */
em_tensor *em_empty(em_device *dev, em_scalar dtype, em_shape shape);
em_tensor *em_zeros(em_device *dev, em_scalar dtype, em_shape shape);
em_tensor *em_ones(em_device *dev, em_scalar dtype, em_shape shape);
em_tensor *em_full(em_device *dev, em_scalar dtype, em_shape shape, double value);
/* 0-d tensor holding value. */
em_tensor *em_scalar_tensor(em_device *dev, em_scalar dtype, double value);
/* [start, end) by step (1-D, ceil((end - start) / step) elements). */
em_tensor *em_arange(em_device *dev, em_scalar dtype, double start, double end, double step);
/* steps points from start to end inclusive. */
em_tensor *em_linspace(em_device *dev, em_scalar dtype, double start, double end, int64_t steps);
/* n x m identity (m = n when m < 0). */
em_tensor *em_eye(em_device *dev, em_scalar dtype, int64_t n, int64_t m);
/* A copy of numel(shape) host elements of `dtype` (f16/bf16 as their 16-bit patterns, bool as
 * bytes) laid out row-major. */
em_tensor *em_from_host(em_device *dev, em_scalar dtype, em_shape shape, const void *data);
/* Copies any view into `dst` as a contiguous row-major host array of numel * dtype-size bytes
 * (waits for the device). EM_OK, or an error status with the message set. */
em_status em_to_host(const em_tensor *t, void *dst, size_t dst_bytes);
/* The value of a 0-d or one-element tensor as a double; NaN with the error set otherwise. */
double em_item(const em_tensor *t);
/* A copy of t on another device. */
em_tensor *em_to_device(const em_tensor *t, em_device *dev);
/* The elements converted to dtype: round to nearest even for f16/bf16, float to int truncates
 * toward zero, anything to bool is x != 0, bool is 0/1. A same-dtype cast returns a copy. */
em_tensor *em_cast(const em_tensor *t, em_scalar dtype);
/* A contiguous copy. */
em_tensor *em_clone(const em_tensor *t);
/* Writes src's elements into dst (same shape after broadcasting src; same dtype). A src
 * donated with em_take is released; when it is the whole result of a matmul not yet run (lazy
 * execution) that nothing else holds, the matmul writes dst itself and no copy runs (dst
 * contiguous, of src's shape, its first element 256-byte aligned: the optimizer's gradient slots,
 * a preallocated output). */
em_status em_copy_(em_tensor *dst, const em_tensor *src);

/* ---- elementwise: unary --------------------------------------------------------------------- */

/* Each returns a new tensor of t's shape and dtype (isnan/isinf: bool). Math functions need a
 * floating-point tensor; neg, abs, sign, relu, clamp, floor, ceil, round also take integers. */
em_tensor *em_neg(const em_tensor *t);
em_tensor *em_abs(const em_tensor *t);
em_tensor *em_sign(const em_tensor *t);
em_tensor *em_exp(const em_tensor *t);
em_tensor *em_ln(const em_tensor *t); /* natural log (em_log is the logger of ember/base) */
em_tensor *em_log1p(const em_tensor *t);
em_tensor *em_expm1(const em_tensor *t);
em_tensor *em_sqrt(const em_tensor *t);
em_tensor *em_rsqrt(const em_tensor *t);
em_tensor *em_reciprocal(const em_tensor *t);
em_tensor *em_sin(const em_tensor *t);
em_tensor *em_cos(const em_tensor *t);
em_tensor *em_tanh(const em_tensor *t);
em_tensor *em_erf(const em_tensor *t);
em_tensor *em_sigmoid(const em_tensor *t);
em_tensor *em_relu(const em_tensor *t);
em_tensor *em_gelu(const em_tensor *t);      /* exact (erf) form */
em_tensor *em_gelu_tanh(const em_tensor *t); /* tanh approximation (GPT-2) */
em_tensor *em_silu(const em_tensor *t);
em_tensor *em_softplus(const em_tensor *t);
em_tensor *em_floor(const em_tensor *t);
em_tensor *em_ceil(const em_tensor *t);
em_tensor *em_round(const em_tensor *t); /* half to even */
em_tensor *em_clamp(const em_tensor *t, double lo, double hi);
em_tensor *em_pow_scalar(const em_tensor *t, double exponent);
em_tensor *em_isnan(const em_tensor *t);
em_tensor *em_isinf(const em_tensor *t);
em_tensor *em_logical_not(const em_tensor *t); /* bool */

/* ---- elementwise: binary, with NumPy broadcasting ------------------------------------------- */

/* Type promotion, as PyTorch's torch.promote_types: the dtype two operands of different dtypes
 * are converted to (with em_cast) before a binary op or where runs.
 *
 *   a \ b   bool  u8    i32   i64   f16   bf16  f32   f64
 *   bool    bool  u8    i32   i64   f16   bf16  f32   f64
 *   u8            u8    i32   i64   f16   bf16  f32   f64
 *   i32                 i32   i64   f16   bf16  f32   f64
 *   i64                       i64   f16   bf16  f32   f64
 *   f16                             f16   f32   f32   f64
 *   bf16                                  bf16  f32   f64
 *   f32                                         f32   f64
 *   f64                                               f64
 *
 * (symmetric; bool gives way to anything, a float beats any integer, f16 with bf16 meets at f32,
 * an unsigned with a signed integer gives the smallest signed type holding both, i64 for u64).
 * EM_SCALAR_COUNT for a value outside the enum. */
em_scalar em_promote_types(em_scalar a, em_scalar b);

/* Binary ops: both operands on the same device; operands of different dtypes are first converted
 * to em_promote_types of the two. The result has the broadcast shape and that dtype (comparisons
 * and logical ops: bool). em_div is true division, as in PyTorch: integer or bool operands give
 * f32 (i32 / i32 -> f32). Remainder stays integer for integers and takes the divisor's sign, as
 * Python's %. Arithmetic on two bool tensors is refused ("not defined for bool tensors"). */
em_tensor *em_add(const em_tensor *a, const em_tensor *b);
em_tensor *em_sub(const em_tensor *a, const em_tensor *b);
em_tensor *em_mul(const em_tensor *a, const em_tensor *b);
em_tensor *em_div(const em_tensor *a, const em_tensor *b);
em_tensor *em_pow(const em_tensor *a, const em_tensor *b);
em_tensor *em_maximum(const em_tensor *a, const em_tensor *b);
em_tensor *em_minimum(const em_tensor *a, const em_tensor *b);
em_tensor *em_remainder(const em_tensor *a, const em_tensor *b);
em_tensor *em_eq(const em_tensor *a, const em_tensor *b);
em_tensor *em_ne(const em_tensor *a, const em_tensor *b);
em_tensor *em_lt(const em_tensor *a, const em_tensor *b);
em_tensor *em_le(const em_tensor *a, const em_tensor *b);
em_tensor *em_gt(const em_tensor *a, const em_tensor *b);
em_tensor *em_ge(const em_tensor *a, const em_tensor *b);
em_tensor *em_logical_and(const em_tensor *a, const em_tensor *b);
em_tensor *em_logical_or(const em_tensor *a, const em_tensor *b);
em_tensor *em_logical_xor(const em_tensor *a, const em_tensor *b);
/* cond (bool) ? a : b, all three broadcast together; a and b are promoted as for binary ops. */
em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b);
/* t with value where mask (bool, broadcast to t's shape) holds. */
em_tensor *em_masked_fill(const em_tensor *t, const em_tensor *mask, double value);

/* Scalar variants: the scalar takes t's dtype, except that an integer or bool tensor with a
 * non-integral (or non-finite) scalar is first converted to f32, as in PyTorch (i32 + 0.5 -> f32).
 * With an integral scalar an integer tensor stays integer, and em_div_scalar truncates toward zero
 * (x / 0 gives 0). em_rsub_scalar is s - t, em_rdiv_scalar s / t. */
em_tensor *em_add_scalar(const em_tensor *t, double s);
em_tensor *em_sub_scalar(const em_tensor *t, double s);
em_tensor *em_rsub_scalar(const em_tensor *t, double s);
em_tensor *em_mul_scalar(const em_tensor *t, double s);
em_tensor *em_div_scalar(const em_tensor *t, double s);
em_tensor *em_rdiv_scalar(const em_tensor *t, double s);
em_tensor *em_maximum_scalar(const em_tensor *t, double s);
em_tensor *em_minimum_scalar(const em_tensor *t, double s);
em_tensor *em_eq_scalar(const em_tensor *t, double s);
em_tensor *em_lt_scalar(const em_tensor *t, double s);
em_tensor *em_gt_scalar(const em_tensor *t, double s);

/* ---- reductions ------------------------------------------------------------------------------ */

/* Over the `ndims` dims listed (negative dims count from the end; ndims == 0 or dims == NULL
 * reduces over every dim); keepdim leaves them as size 1. sum/prod of integers and bool give
 * i64; mean/var/std/logsumexp need floats; argmax/argmin give i64 (the first index among
 * equals; NaN counts as the largest); all/any give bool. */
em_tensor *em_sum(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_mean(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_prod(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_max(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_min(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_all(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_any(const em_tensor *t, const int *dims, int ndims, bool keepdim);
em_tensor *em_logsumexp(const em_tensor *t, const int *dims, int ndims, bool keepdim);
/* out = the sum of t over its leading dims (all but the last rank(out), which must be out's
 * shape), written into out (floats; out may be of another float dtype than t, and a view, such
 * as a slot of a flat gradient buffer): where out is contiguous the column sums write it
 * themselves, else the sum is made and copied in. Consumes a donated t. EM_OK or the error set
 * (out's shape against t's named), out left as it was. */
em_status em_sum_leading_into(em_tensor *out, const em_tensor *t);
/* Variance with Bessel's correction `correction` (1 = unbiased, 0 = population). */
em_tensor *em_var(const em_tensor *t, const int *dims, int ndims, int correction, bool keepdim);
em_tensor *em_std(const em_tensor *t, const int *dims, int ndims, int correction, bool keepdim);
/* Over one dim. */
em_tensor *em_argmax(const em_tensor *t, int dim, bool keepdim);
em_tensor *em_argmin(const em_tensor *t, int dim, bool keepdim);
em_tensor *em_cumsum(const em_tensor *t, int dim);

/* ---- softmax and norms ----------------------------------------------------------------------- */

em_tensor *em_softmax(const em_tensor *t, int dim);
em_tensor *em_log_softmax(const em_tensor *t, int dim);
/* Normalizes over the last `nnorm` dims; weight and bias (each NULL or of those dims' shape) are
 * optional. rms_norm divides by sqrt(mean(x^2) + eps). */
em_tensor *em_layer_norm(const em_tensor *t, int nnorm, const em_tensor *weight,
                         const em_tensor *bias, double eps);
em_tensor *em_rms_norm(const em_tensor *t, int nnorm, const em_tensor *weight, double eps);
/* The fused classifier: the cross-entropy of each row of logits [N, C] (float) against its class
 * in targets [N] (i32/i64), out[r] = lse(logits[r]) - logits[r, class] with
 * lse = log(sum(exp(logits[r]))), mixed with lse - mean(logits[r]) by label_smoothing ls in
 * [0, 1): (1 - ls) nll + ls smooth; 0 for a row whose target is ignore_index. A result [N] of
 * logits' dtype, except f32 for f16/bf16 logits (computed in f32, as under PyTorch's autocast),
 * one read of the logits and no probabilities kept;
 * its gradient is one more pass (tensor_grad.h). The targets are read back and checked: one out of
 * [0, C) that is not ignore_index is an error naming it. *valid (may be NULL) receives the number
 * of rows not ignored (the divisor of a mean). em_cross_entropy (nn.h) runs on it. */
em_tensor *em_cross_entropy_rows(const em_tensor *logits, const em_tensor *targets,
                                 int64_t ignore_index, double label_smoothing, int64_t *valid);
/* The mean cross-entropy of the rows of x [N, C] @ w^T (w [V, C]: a classifier's weight, a tied
 * embedding) against targets [N] (i32/i64; ignore_index rows left out of the sum and of the
 * divisor: NaN when every row is ignored), without the [N, V] logits: the rows go in chunks of
 * chunk_rows (<= 0: as many as keep a chunk's logits near 256 MiB), each chunk's logits made,
 * reduced to per-row losses and freed. When gradients are recorded for x or w, each chunk's
 * logits' gradient is made in place and multiplied into the gradients of x and w at once (what
 * the backward would do with the whole [N, V] block), which the op keeps ([N, C] of x's dtype,
 * [V, C] of w's) until the backward scales them by the loss's gradient. A scalar f32 result for
 * f16/bf16 and f32 (x's dtype for f64); x and w of one float dtype and device. The losses are
 * em_cross_entropy's over x @ w^T up to the matmul's rounding. */
em_tensor *em_linear_cross_entropy(const em_tensor *x, const em_tensor *w, const em_tensor *targets,
                                   int64_t ignore_index, int64_t chunk_rows);
/* Fused scaled-dot-product attention: out = softmax(q k^T * scale + mask) v for q [B, H, Tq, D],
 * k and v [B, H, Tk, D] (float, one dtype and device, any strides, D from 1 to 256), a result
 * [B, H, Tq, D] of q's dtype. With causal, query i sees the keys j <= i + Tk - Tq (the last query
 * is aligned with the last key, as PyTorch's is_causal when Tq == Tk) and Tq <= Tk is required.
 * The softmax statistics are kept in f32 (f64 for f64); neither the scores nor the probabilities
 * are stored: for its gradient (tensor_grad.h) the op keeps q, k, v, out and one log-sum-exp per
 * query row. docs/attention.md says how. */
em_tensor *em_attention(const em_tensor *q, const em_tensor *k, const em_tensor *v, bool causal,
                        double scale);
/* em_attention over a transformer block's packed projection qkv [B, T, 3C] (q | k | v along the
 * last dim, each C = heads x D wide, heads side by side), the heads merged in the result
 * [B, T, C]: the values of em_attention on the three slices viewed as [B, H, T, D], transposed
 * back and reshaped, without the copies that takes. Its gradient (tensor_grad.h) is one
 * [B, T, 3C] tensor, dq, dk and dv written into their slices. */
em_tensor *em_attention_qkv(const em_tensor *qkv, int64_t heads, bool causal, double scale);
/* em_attention_fast for the q that qkv [B, T, 3C] split into `heads` heads would give. */
bool em_attention_qkv_fast(const em_tensor *qkv, int64_t heads);
/* Decoding's attention: out [R, H, 1, D] = softmax(q k^T * scale) v over the keys j <= pos[r]
 * (and j < Tk) of each row r, for q [R, H, 1, D], k and v [R, H, Tk, D] (one float dtype, a
 * contiguous last dim or a copy is made) and pos i64 [R] on the device: the visible lengths are
 * read there, so a step keeps its shape as sequences grow (graphs). A row with pos < 0 gets zeros.
 * One launch; softmax statistics in f32 (f64 for f64). Not differentiable (no gradient is
 * recorded): for inference. */
em_tensor *em_attention_decode(const em_tensor *q, const em_tensor *k, const em_tensor *v,
                               const em_tensor *pos, double scale);
/* em_attention_decode that also appends, in the same launch: k_new and v_new [R, H, 1, D] (q's
 * dtype) are each row's new key and value, used for key position pos[r] (the cache's entry there
 * is not read) and stored into k and v at pos[r] when 0 <= pos[r] < Tk (a row whose pos lies
 * outside writes nothing); the result equals em_scatter_rows_ of them into k and v followed by
 * em_attention_decode. k and v are views of the cache written in place (a contiguous last dim
 * and a buffer of at most 2^32 elements, else an error). counters (may be NULL) is u32 or i32
 * [n >= R H], contiguous, all zeros, on q's device: with it, where the keys are split over
 * several cubes, the last cube of each (row, head) merges the splits in the same launch and sets
 * its counter back to 0 (keep one such tensor for every call: a recorded step replays with it;
 * calls on the device must not overlap in time); without it (or where the device's memory model
 * does not allow it: OpenCL, Vulkan) a second launch merges, as in em_attention_decode. */
em_tensor *em_attention_decode_append(const em_tensor *q, const em_tensor *k_new,
                                      const em_tensor *v_new, em_tensor *k, em_tensor *v,
                                      const em_tensor *pos, em_tensor *counters, double scale);
/* The largest head size D em_attention takes. */
#define EM_ATTENTION_MAX_HEAD_DIM 256
/* Whether em_attention runs its matrix-op (tensor-core) kernels for q's device, dtype and head
 * size: f16/bf16 at D 64 or 128 on CUDA, or wherever EMBER_ATTENTION=mma forces them (not with
 * EMBER_ATTENTION=simt). Elsewhere the op's SIMT kernels serve every case correctly but run
 * slower than matmuls plus a softmax, so layers (nn.h's em_mha) compose the ops there.
 * EMBER_ATTENTION=fused makes it true for every q (layers then always take the op: tests). */
bool em_attention_fast(const em_tensor *q);

/* ---- layout ---------------------------------------------------------------------------------- */

/* Views share the input's buffer (the result is a new tensor reference); others copy. */
/* A view when strides allow, else a contiguous copy. One dim of `shape` may be -1. */
em_tensor *em_reshape(const em_tensor *t, em_shape shape);
/* Always a view; NULL with an error when the strides do not allow one. */
em_tensor *em_view(const em_tensor *t, em_shape shape);
em_tensor *em_flatten(const em_tensor *t);
em_tensor *em_permute(const em_tensor *t, const int *perm, int n);
em_tensor *em_transpose(const em_tensor *t, int d0, int d1);
/* A new view of t when it is already contiguous (t itself when donated with em_take), else a
 * contiguous copy. */
em_tensor *em_contiguous(const em_tensor *t);
/* Broadcasts size-1 dims (and new leading dims) to `shape`; -1 keeps a size. A view. */
em_tensor *em_expand(const em_tensor *t, em_shape shape);
/* Removes dim (or every size-1 dim when dim is EM_ALL_DIMS). */
#define EM_ALL_DIMS 0x7fffffff
em_tensor *em_squeeze(const em_tensor *t, int dim);
em_tensor *em_unsqueeze(const em_tensor *t, int dim);
/* A view of elements start, start+step, ... < end along dim (start/end clamped as Python's;
 * step >= 1). */
em_tensor *em_slice(const em_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
em_tensor *em_narrow(const em_tensor *t, int dim, int64_t start, int64_t length);
/* Element `index` of dim, which is removed. A view. */
em_tensor *em_select(const em_tensor *t, int dim, int64_t index);
/* A copy reversed along the given dims. */
em_tensor *em_flip(const em_tensor *t, const int *dims, int ndims);
em_tensor *em_cat(em_tensor *const *ts, int n, int dim);
em_tensor *em_stack(em_tensor *const *ts, int n, int dim);
/* Views of `size`-long pieces (the last may be shorter) along dim, stored in out[0..]; returns
 * the number of pieces (at most max_out), -1 on error. */
int em_split(const em_tensor *t, int64_t size, int dim, em_tensor **out, int max_out);
/* n nearly equal pieces (as torch.chunk). Returns the count or -1. */
int em_chunk(const em_tensor *t, int n, int dim, em_tensor **out, int max_out);
/* Lower / upper triangle of the last two dims (diagonal k: 0 main, >0 above). */
em_tensor *em_tril(const em_tensor *t, int64_t k);
em_tensor *em_triu(const em_tensor *t, int64_t k);
/* Constant padding; pads[2*i], pads[2*i+1] are before/after for the i-th dim from the last (as
 * torch.nn.functional.pad); npads is even and at most 2 * rank. */
em_tensor *em_pad(const em_tensor *t, const int64_t *pads, int npads, double value);

/* ---- matmul ---------------------------------------------------------------------------------- */

/* a [..., M, K] x b [..., K, N] -> [..., M, N] with batch dims broadcast; 1-D operands are
 * promoted as in torch.matmul. f16/bf16 accumulate in f32 (on tensor cores where the device has
 * them). f32 stays exact f32 (no tf32) unless allowed by em_matmul_ex's allow_tf32 or
 * $EMBER_ALLOW_TF32=1, as PyTorch's default allow_tf32=False for matmul. */
em_tensor *em_matmul(const em_tensor *a, const em_tensor *b);

/* The activation of a matmul epilogue. */
typedef enum em_matmul_act {
    EM_MATMUL_ACT_NONE = 0,
    EM_MATMUL_ACT_RELU,
    EM_MATMUL_ACT_GELU,      /* exact (erf) form */
    EM_MATMUL_ACT_GELU_TANH, /* tanh approximation (GPT-2) */
} em_matmul_act;

/* What em_matmul_ex does on top of the product, in the matmul kernel itself (no extra pass):
 * result = act(a x b + bias) + residual, computed in the accumulation type (f32 for f16/bf16) and
 * rounded once to the result dtype. Every field is optional (zero-initialize the struct, or use
 * designated initializers).
 * With `ln` set, a's rows are first layer-normalized over K (a prologue): the result is
 * em_matmul_ex(em_layer_norm(a, 1, ln_weight, ln_bias, ln_eps), b, the rest of the epilogue), up
 * to rounding. Where the product takes the skinny kernel (few rows: decoding) every cube
 * normalizes the rows it reads itself, so the layer norm costs no launch of its own; elsewhere
 * em_layer_norm runs first (docs/matmul.md). */
typedef struct em_matmul_epilogue {
    const em_tensor *bias;      /* NULL or [N] (or [1, ..., N]), a's dtype: added to every row */
    em_matmul_act act;          /* activation after the bias */
    const em_tensor *residual;  /* NULL or a tensor of a's dtype broadcastable to the result */
    bool allow_tf32;            /* f32 operands may use tf32 tensor cores (10-bit mantissa) */
    bool ln;                    /* layer-normalize a's rows over K first (floating point only) */
    const em_tensor *ln_weight; /* with ln: NULL or [K], a's dtype: scales the normalized rows */
    const em_tensor *ln_bias;   /* with ln: NULL or [K], a's dtype: then added to them */
    double ln_eps;              /* with ln: added to the variance (GPT-2: 1e-5) */
} em_matmul_epilogue;

/* em_matmul with an epilogue (NULL: plain em_matmul). Errors name the shapes involved (a bias
 * that is not [N], a residual that does not broadcast to the result, a dtype that differs, an
 * activation on integers other than ReLU). Inputs are borrowed (donated ones are released). */
em_tensor *em_matmul_ex(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep);

/* a [M, K] x b [K, N] (2-D) run now (never left pending for fusion), and b's column sums (its
 * sums over the K rows) written into b_sums (contiguous, N elements, any float dtype, a buffer of
 * its own): a Linear's weight gradient (x^T g) and bias gradient (g summed over its rows) from one
 * read of g. On Hopper the TMA matmul's producer warpgroup adds up the b tiles it loads; elsewhere
 * the column sum runs after the product. b_sums is not recorded for autodiff (the product is, as
 * em_matmul's). Inputs borrowed (donated ones released); NULL with the error set (naming the
 * shapes), b_sums left as it was. */
em_tensor *em_matmul_sum_b(const em_tensor *a, const em_tensor *b, em_tensor *b_sums);
/* The same with the product written into `into` (contiguous, [M, N], a's dtype, not an
 * operand's buffer), as a weight gradient into an optimizer's slot; never recorded. EM_OK, or the
 * error set with into and b_sums left as they were. */
em_status em_matmul_sum_b_into(em_tensor *into, const em_tensor *a, const em_tensor *b,
                               em_tensor *b_sums);

/* ---- indexing -------------------------------------------------------------------------------- */

/* Indices are i32 or i64 tensors; out-of-range indices are an error (checked on the host). */
em_tensor *em_index_select(const em_tensor *t, int dim, const em_tensor *index);
em_tensor *em_gather(const em_tensor *t, int dim, const em_tensor *index);
/* A copy of t with src values written (scatter) or added (scatter_add) at index along dim. */
em_tensor *em_scatter(const em_tensor *t, int dim, const em_tensor *index, const em_tensor *src);
em_tensor *em_scatter_add(const em_tensor *t, int dim, const em_tensor *index,
                          const em_tensor *src);
/* weight [V, D], ids of any shape -> [..ids, D]. */
em_tensor *em_embedding(const em_tensor *weight, const em_tensor *ids);

/* Device-side indices, never read back (for steps that must not wait for the device, e.g. one
 * replayed as a captured graph); whatever the indices hold, nothing outside the tensors is
 * touched. The caller checks its indices where they come from. */
/* em_embedding whose ids are clamped into [0, V - 1] on the device instead of checked: an
 * out-of-range id gives the first or last row, not an error. */
em_tensor *em_embedding_clamped(const em_tensor *weight, const em_tensor *ids);
/* Trusted indices, per thread (for steps recorded as graphs, docs/graphs.md): between begin and
 * end, embedding / index_select, the embedding gradient and cross-entropy's targets keep their
 * indices on the device instead of reading them back to check them: each index is clamped into
 * range (no stray read, no error), no target is taken as ignore_index; results equal the checked
 * forms' for indices in range. Regions nest. */
void em_trusted_indices_begin(void);
void em_trusted_indices_end(void);
bool em_trusted_indices(void);
/* In place: dst[i, ..., index[i], ...] = src[i, ..., 0, ...], with index[i] at dim `dim` (not 0)
 * for each row i of dim 0: src has dst's shape except 1 at dim, index (i32/i64) has one entry per
 * row. A row whose index lies outside [0, dst's size at dim) writes nothing. EM_OK, or the error
 * (naming the shapes) set. */
em_status em_scatter_rows_(em_tensor *dst, int dim, const em_tensor *index, const em_tensor *src);

/* ---- random (Philox 4x32-10, the same numbers on every device) ------------------------------- */

/* A generator: a seed and a counter advanced by every draw. Plain value; no cleanup. */
typedef struct em_rng {
    uint64_t seed;    /* the key */
    uint64_t counter; /* draws so far (advanced by each call) */
} em_rng;
em_rng em_rng_new(uint64_t seed);
/* Uniform in [0, 1). */
em_tensor *em_rand(em_device *dev, em_scalar dtype, em_shape shape, em_rng *rng);
/* Standard normal (Box-Muller). */
em_tensor *em_randn(em_device *dev, em_scalar dtype, em_shape shape, em_rng *rng);
/* Integers in [low, high). */
em_tensor *em_randint(em_device *dev, em_scalar dtype, em_shape shape, int64_t low, int64_t high,
                      em_rng *rng);
/* 1 with probability p (each element of p, a float tensor), else 0, in p's dtype. */
em_tensor *em_bernoulli(const em_tensor *p, em_rng *rng);
/* probs [K] or [B, K] (non-negative, not necessarily normalized): num_samples draws per row with
 * replacement -> i64 [num_samples] or [B, num_samples]. */
em_tensor *em_multinomial(const em_tensor *probs, int64_t num_samples, em_rng *rng);

/* ---- sorting --------------------------------------------------------------------------------- */

/* Stable sort along dim (NaN sorts as the largest). values/indices may be NULL when unwanted;
 * returns EM_OK or an error status. Indices are i64. */
em_status em_sort(const em_tensor *t, int dim, bool descending, em_tensor **values,
                  em_tensor **indices);
em_tensor *em_argsort(const em_tensor *t, int dim, bool descending);
/* The k largest (or smallest) along dim, sorted. */
em_status em_topk(const em_tensor *t, int64_t k, int dim, bool largest, em_tensor **values,
                  em_tensor **indices);

/* ---- convolution and pooling (NCHW) ---------------------------------------------------------- */

/* x [N, C, H, W], weight [O, C/groups, KH, KW], bias NULL or [O]. Pools: stride 0 means the
 * kernel size; padding at most kernel / 2; avg_pool2d counts padding as zeros (PyTorch's default). */
em_tensor *em_conv2d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias,
                     int stride, int padding, int dilation, int groups);
em_tensor *em_max_pool2d(const em_tensor *x, int kernel, int stride, int padding);
em_tensor *em_avg_pool2d(const em_tensor *x, int kernel, int stride, int padding);

/* ---- printing -------------------------------------------------------------------------------- */

/* PyTorch-style text ("tensor([[1., 2.],\n        [3., 4.]])"), with "..." for dims over
 * 1000 elements in total (the first and last 3 of each dim). Malloc'd; the caller frees it. NULL
 * on error. */
char *em_tensor_format(const em_tensor *t);
/* Writes em_tensor_format(t) and a newline to stdout. */
void em_tensor_print(const em_tensor *t);

/* ---- lazy fusion (docs/fusion.md) ------------------------------------------------------------ */

/* With fusion on (the default; EMBER_FUSION=0 in the environment, or em_fusion_set(false),
 * switches it off), elementwise ops record their result instead of launching, and a chain of
 * them runs as one generated kernel when the result is needed: read to the host, bound by a
 * non-elementwise kernel, or flushed. Results
 * are those of the ops run one by one (each op's result is rounded to its dtype as if stored).
 * EMBER_FUSION_DEBUG=1 prints each fused kernel and the ops it covers to stderr. */
void em_fusion_set(bool on); /* overrides EMBER_FUSION for the process (tests) */
bool em_fusion_enabled(void);
/* Runs every pending computation of every device (e.g. before timing with em_device_sync).
 * EM_OK, or the first error (set). */
em_status em_flush(void);
/* Runs t's pending computation, if any, and the pending computations that read t's buffer, so
 * that code reading or writing the buffer directly (collectives, benchmarks) sees and leaves
 * the right values. EM_OK for NULL, or the first error (set). */
em_status em_realize(const em_tensor *t);

/* Runtime graphs of tensor programs (ember/runtime.h em_graph_*, docs/graphs.md): the same calls
 * with the pending computations handled. em_tensor_graph_begin runs everything pending first (so
 * none of it is recorded) and starts recording on dev; em_tensor_graph_end runs what the recorded
 * ops left pending (recording it) and ends the recording; em_tensor_graph_launch runs what is
 * pending (e.g. writes into the graph's inputs) and then the graph. Run the program once eagerly
 * before recording it, so that its kernels are compiled and tuned; keep its input, weight and
 * output tensors alive while the graph lives, and change inputs by writing into them (em_copy_). */
em_status em_tensor_graph_begin(em_device *dev);
em_status em_tensor_graph_end(em_device *dev, em_graph **out);
em_status em_tensor_graph_launch(em_graph *g);

/* Counters of the tensor layer since the start (or em_tensor_stats_reset), for tests and for
 * the bytes a training step moves (docs/fusion.md). */
typedef struct em_tensor_stats {
    uint64_t launches;       /* kernels launched by tensor ops, fused ones included */
    uint64_t fused_launches; /* fused kernels launched */
    uint64_t fused_ops;      /* ops covered by those fused kernels */
    uint64_t recorded_ops;   /* elementwise ops recorded instead of launched */
    uint64_t fused_compiles; /* fused kernel sources generated (signature cache misses) */
    uint64_t bytes_read;     /* bytes those launches read: the elements of each view a kernel
                              * binds as an input (a broadcast dim counted once) times its dtype's
                              * size; a fused kernel's leaves (docs/fusion.md). A model of the
                              * traffic, not a hardware counter */
    uint64_t bytes_written;  /* bytes they wrote: the views bound as outputs, likewise */
} em_tensor_stats;
em_tensor_stats em_tensor_stats_get(void);
void em_tensor_stats_reset(void);

#ifdef __cplusplus
}
#endif
#endif
