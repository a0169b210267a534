/* ember/autodiff.h — reverse-mode automatic differentiation, define-by-run.
 *
 * Mark leaf tensors (parameters) with em_set_requires_grad. Every op of tensor.h applied to a
 * tensor that requires gradients records a node with what its backward needs (a tape built as the
 * program runs). em_backward(loss) walks the nodes reachable from loss in reverse order,
 * accumulates d loss / d leaf into each leaf's gradient (em_grad), and frees the tape, unless the
 * graph is retained for a second backward. Backward rules run as ordinary tensor ops on the
 * tensors' device with recording off.
 *
 *   em_set_requires_grad(w, true);
 *   em_tensor *loss = em_mean(em_take(em_matmul(x, w)), NULL, 0, false);
 *   em_backward(loss, NULL);           // em_grad(w) now holds d loss / d w
 *
 * Ownership: em_grad returns a borrowed reference, valid until the gradient is zeroed, replaced
 * or the tensor released; gradients never belong to a scope. Errors follow tensor.h: a status
 * with the message set; nothing aborts. Gradients are kept per leaf and are accumulated across
 * backward calls (sum), as in PyTorch; em_zero_grad clears them. Recording state (no-grad depth,
 * recompute policy) is per thread. */
#ifndef EMBER_AUTODIFF_H
#define EMBER_AUTODIFF_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs autodiff's op recorder (idempotent; every function below calls it). */
void em_autodiff_init(void);

/* Marks a leaf tensor (one not produced by a recorded op) as requiring gradients, or clears the
 * mark. A floating-point dtype is required; EM_ERR_INVALID otherwise, or when t is the result of
 * a recorded op ("only leaf tensors"). */
em_status em_set_requires_grad(em_tensor *t, bool requires_grad);
/* True for a leaf marked with em_set_requires_grad and for the result of a recorded op. */
bool em_requires_grad(const em_tensor *t);
/* True for tensors not produced by a recorded op. */
bool em_is_leaf(const em_tensor *t);

/* The accumulated gradient of a leaf (same shape and dtype as t), or NULL when none yet.
 * Borrowed. */
em_tensor *em_grad(const em_tensor *t);
/* Drops t's gradient (the next backward starts from zero). */
void em_zero_grad(em_tensor *t);
/* Replaces t's gradient with g (retained; NULL drops it). Shape and dtype must match t's. Used by
 * optimizers, clipping and gradient all-reduce. */
em_status em_set_grad(em_tensor *t, em_tensor *g);
/* Asks that t's gradient (a leaf's) be written into dest (retained; the shape, dtype and device of
 * t; NULL clears it) when t has none yet: the ops that can write their result there do (the
 * column sums of a bias's gradient, the norms' weight and bias gradients), and em_grad(t) is then
 * dest itself; any other gradient is kept as before, in its own tensor. dest's contents are
 * overwritten by the next backward that reaches t. A trainer uses it to have gradients land in
 * the optimizer's flat buffer (em_optimizer_grad_slot) without a copy. */
em_status em_set_grad_into(em_tensor *t, em_tensor *dest);

/* Backpropagates from `root`. grad_root is d/d root: NULL means ones, allowed only for a tensor
 * of one element. Frees the nodes walked (root no longer requires gradients afterwards). */
em_status em_backward(em_tensor *root, const em_tensor *grad_root);
/* As em_backward, keeping the graph so that a second backward over it works. */
em_status em_backward_retain(em_tensor *root, const em_tensor *grad_root);

/* No-grad regions: ops inside record nothing (inference, optimizer updates). They nest. */
void em_no_grad_begin(void);
void em_no_grad_end(void);
bool em_grad_enabled(void);

/* A view of t sharing its data that requires no gradients and records nothing. */
em_tensor *em_detach(const em_tensor *t);

/* Gradient checkpointing policy (per thread, applies to ops recorded while it is set):
 *   EM_RECOMPUTE_NONE        every tensor a backward rule needs is kept from the forward pass;
 *   EM_RECOMPUTE_ELEMENTWISE outputs of elementwise ops (unary, binary, scalar, casts) and of
 *                            softmax and the norms are not kept: backward recomputes them from
 *                            their inputs when a rule needs them.
 * The gradients are the same either way; memory held between forward and backward is lower
 * with recomputation. */
typedef enum em_recompute_policy { EM_RECOMPUTE_NONE = 0, EM_RECOMPUTE_ELEMENTWISE } em_recompute_policy;
void em_set_recompute_policy(em_recompute_policy policy);
em_recompute_policy em_recompute_policy_get(void);

/* Statistics of the tape (process-wide): nodes alive (recorded and not yet freed) and bytes of
 * device memory held by saved tensors. For tests and the dashboard. */
typedef struct em_tape_stats {
    int64_t nodes;
    int64_t saved_bytes;
} em_tape_stats;
em_tape_stats em_tape_stats_get(void);

#ifdef __cplusplus
}
#endif
#endif
