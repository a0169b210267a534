/* ember/tensor_grad.h — tensor ops that compute the gradients of other tensor ops, for the
 * autodiff layer's backward rules (and anyone writing a backward by hand): the input and weight
 * gradients of conv2d, the input gradients of the 2-D pools, of the fused classifier and of the
 * fused attention, and the gradients of GELU and of the norms.
 *
 * Same conventions as tensor.h: each returns a new contiguous tensor (the caller owns it) of
 * grad_out's dtype, or NULL with the error set; inputs are borrowed; a NULL input gives NULL.
 * grad_out is d loss / d out for the forward op's output; the geometry parameters are those the
 * forward op was called with. Results are deterministic (each element is one unit's sum in a fixed
 * order; no atomics), identical on every device up to rounding. */
#ifndef EMBER_TENSOR_GRAD_H
#define EMBER_TENSOR_GRAD_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* d loss / d x of em_conv2d(x, weight, bias, stride, padding, dilation, groups), of shape
 * x_shape [N, C, H, W]; grad_out is [N, O, OH, OW], weight [O, C/groups, KH, KW]. */
em_tensor *em_conv2d_backward_input(const em_tensor *grad_out, const em_tensor *weight,
                                    em_shape x_shape, int stride, int padding, int dilation,
                                    int groups);
/* d loss / d weight of the same conv2d, of shape weight_shape [O, C/groups, KH, KW]. (The bias
 * gradient is em_sum of grad_out over dims 0, 2, 3.) */
em_tensor *em_conv2d_backward_weight(const em_tensor *grad_out, const em_tensor *x,
                                     em_shape weight_shape, int stride, int padding, int dilation,
                                     int groups);
/* d loss / d x of em_max_pool2d(x, kernel, stride, padding): each window's gradient goes to the
 * element the forward selected (the first maximum in row-major window order; padding never wins;
 * a NaN takes over, the last one winning, as in PyTorch). stride 0 means the kernel size. */
em_tensor *em_max_pool2d_backward(const em_tensor *grad_out, const em_tensor *x, int kernel,
                                  int stride, int padding);
/* d loss / d x of em_avg_pool2d(x, kernel, stride, padding), of shape x_shape: each window's
 * gradient divided by kernel * kernel (padding counted, as the forward counts it). */
em_tensor *em_avg_pool2d_backward(const em_tensor *grad_out, em_shape x_shape, int kernel,
                                  int stride, int padding);
/* d loss / d weight of em_embedding(weight, ids) for a table of num_embeddings rows: [V, D] of
 * grad's dtype, row v the sum of grad's rows [..., D] at the positions whose id is v (zeros for
 * ids that do not occur), summed in f32 for f16/bf16 in ascending position order. The ids are read
 * back, checked and sorted by counting on the host; then one unit per output element reads each
 * of its rows once (O(n D + V D), where a scatter_add into zeros is O(n V D)). */
em_tensor *em_embedding_backward(const em_tensor *grad, const em_tensor *ids,
                                 int64_t num_embeddings);

/* d loss / d logits of em_cross_entropy_rows(logits, targets, ignore_index, label_smoothing), of
 * logits' shape [N, C]: grad_out[r] (softmax(logits[r]) - (1 - ls) onehot(class) - ls / C), zeros
 * for an ignored row. classes is the checked i32 [N] that op records (-1 where ignored), not the
 * targets given to it; grad_out is [N] of the loss's dtype (f32 for f16/bf16 logits) or of the
 * logits'. The result, of the logits' dtype, is computed in f32 for f16/bf16 and rounded once. One
 * pass over each row (its log-sum-exp recomputed), no probabilities kept. logits may be donated
 * (em_take; the other inputs are borrowed): when that is the only reference to a realized,
 * contiguous buffer, the gradient is written over the logits and returned in that tensor. */
em_tensor *em_cross_entropy_rows_backward(const em_tensor *grad_out, const em_tensor *logits,
                                          const em_tensor *classes, double label_smoothing);

/* The gradients of out = em_attention(q, k, v, causal, scale): from grad_out (d loss / d out, of
 * q's shape and dtype), out itself and lse, the log-sum-exp of each scaled, masked score row that
 * em_attention records ([B, H, Tq], f32, f64 for f64), writes new contiguous tensors into *dq
 * (q's shape), *dk and *dv (k's shape); any of the three may be NULL to skip it. The
 * probabilities are recomputed from q, k and lse: tile by tile in a pass per key block for dk and
 * dv and a pass per query block for dq (each gradient element summed by one unit), or, where the
 * forward runs on matrix units (f16/bf16, D 64 or 128 on CUDA), as one [Tq, Tk] block per call
 * through tensor-core matmuls, freed on return. Deterministic either way. EM_OK, or the error
 * status with the message set (then every requested result is NULL). */
em_status em_attention_backward(const em_tensor *grad_out, const em_tensor *q, const em_tensor *k,
                                const em_tensor *v, const em_tensor *out, const em_tensor *lse,
                                bool causal, double scale, em_tensor **dq, em_tensor **dk,
                                em_tensor **dv);

/* d loss / d qkv of out = em_attention_qkv(qkv, heads, causal, scale), from grad_out and out
 * [B, T, C] and the log-sum-exp lse [B, heads, T] the op records: one new [B, T, 3C] tensor of
 * qkv's dtype, the kernels of em_attention_backward writing dq, dk and dv into its slices. NULL
 * with the error set on failure. */
em_tensor *em_attention_qkv_backward(const em_tensor *grad_out, const em_tensor *qkv,
                                     const em_tensor *out, const em_tensor *lse, int64_t heads,
                                     bool causal, double scale);

/* d loss / d x of em_gelu(x) (tanh_approx false) or em_gelu_tanh(x) (true): grad_out times the
 * derivative at x, computed in f32 for f16/bf16 and rounded once; the two broadcast as em_mul's
 * operands do. One elementwise op, so it fuses with what produces grad_out and what consumes the
 * result. */
em_tensor *em_gelu_backward(const em_tensor *grad_out, const em_tensor *x, bool tanh_approx);

/* The gradients of out = em_layer_norm(x, nnorm, weight, bias, eps) (rms false) or
 * em_rms_norm(x, nnorm, weight, eps) (rms true) from grad_out (d loss / d out, of x's shape and
 * dtype): *dx (x's shape), *dw (weight's) and *db (the bias's: the normalized dims' shape; not for
 * rms_norm), each computed when its pointer is non-NULL; weight may be NULL (then no dw). Each
 * row's mean and rstd are recomputed from x, so the forward keeps nothing. Where x's and
 * grad_out's normalized dims are contiguous, on the CPU and on devices with plane ops, this is
 * one pass over the rows (dx written, the weight and bias sums left per cube, computed in f32 for
 * f16/bf16 and rounded once) and two small column sums; elsewhere the same formulas run as
 * tensor ops. residual (NULL, or of x's shape and dtype) is added to dx in the same pass (the
 * gradient x has received from its other consumers, as a residual connection gives it).
 * EM_OK, or the error status with the message set (every result NULL). */
em_status em_norm_backward(const em_tensor *grad_out, const em_tensor *x, int nnorm,
                           const em_tensor *weight, double eps, bool rms, const em_tensor *residual,
                           em_tensor **dx, em_tensor **dw, em_tensor **db);
/* em_norm_backward with the weight's and the bias's gradients written into dw_into and db_into
 * where given (tensors of the normalized dims' shape, any float dtype, views allowed: a slot of
 * a flat gradient buffer), *dw and *db then a new reference to them. */
em_status em_norm_backward_into(const em_tensor *grad_out, const em_tensor *x, int nnorm,
                                const em_tensor *weight, double eps, bool rms,
                                const em_tensor *residual, em_tensor **dx, em_tensor **dw,
                                em_tensor **db, em_tensor *dw_into, em_tensor *db_into);

#ifdef __cplusplus
}
#endif
#endif
