/* ember/optim.h — optimizers, gradient clipping and accumulation, learning-rate schedules.
 *
 * An optimizer updates a set of parameters (leaf tensors that require gradients) from their
 * gradients (em_grad), in place and with recording off. Parameters are taken from a module tree
 * (every parameter, its `decay` flag choosing the weight-decay group) or given as a list. State
 * (momentum, Adam's moments: f32, on the parameters' device) is created on the first step and can
 * be visited by name for checkpoints ("<param name>.exp_avg", ...). Errors: a status with the
 * message set; nothing aborts. */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H

#include "ember/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One parameter as optimizers see it. */
typedef struct em_param_ref {
    const char *name; /* full name (copied by the optimizer) */
    em_tensor *t;     /* borrowed: the parameter must outlive the optimizer */
    bool decay;       /* in the weight-decay group */
} em_param_ref;

typedef struct em_optimizer em_optimizer;

typedef struct em_sgd_config {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} em_sgd_config;

typedef struct em_adam_config {
    double lr, beta1, beta2, eps, weight_decay;
    bool decoupled; /* AdamW (decoupled decay, applied to the decay group only) or Adam (L2
                       added to the gradient) */
} em_adam_config;

/* Parameters from a module tree (every parameter, decay per entry) or a list. */
em_optimizer *em_sgd_new(em_module *m, const em_sgd_config *cfg);
em_optimizer *em_adam_new(em_module *m, const em_adam_config *cfg);
em_optimizer *em_sgd_new_params(const em_param_ref *ps, int n, const em_sgd_config *cfg);
em_optimizer *em_adam_new_params(const em_param_ref *ps, int n, const em_adam_config *cfg);
void em_optimizer_free(em_optimizer *o);

/* One update from the current gradients (parameters without a gradient are skipped). */
em_status em_optimizer_step(em_optimizer *o);
/* Drops every parameter's gradient. */
/* Keeps `mirror` (a tensor of param's shape and device in another float dtype: the bf16 copy a
 * mixed-precision forward reads) equal to param rounded to mirror's dtype: each step writes it
 * right after updating param — in the same launch where the fused Adam kernels run, else by a
 * cast — so no separate copy pass is needed. Borrowed: it must outlive its use by o. NULL removes
 * it. Fails when param is not o's or the mirror does not match it. */
em_status em_optimizer_set_mirror(em_optimizer *o, const em_tensor *param, em_tensor *mirror);
void em_optimizer_zero_grad(em_optimizer *o);
void em_optimizer_set_lr(em_optimizer *o, double lr);
double em_optimizer_lr(const em_optimizer *o);
int64_t em_optimizer_steps(const em_optimizer *o); /* steps taken (Adam's bias correction t) */

/* Flat storage (docs/optim.md): moves every parameter into one buffer, the weight-decay group
 * first (each parameter stays the same tensor, now a view of it), with its state, its mirror
 * and a gradient slot of grad_dtype at the same offset in buffers of their own. The gradient
 * norm, the clip and Adam's update then run as one launch over all of them (two for the update:
 * the decay group and the rest) instead of one per parameter. Gradients reach the slots in one
 * of two ways: the caller writes each parameter's gradient into em_optimizer_grad_slot (in the
 * slot's dtype, e.g. a bf16 model's gradients for f32 masters) and calls
 * em_optimizer_grads_written; or, when every parameter has a gradient (em_grad), the clip or
 * step copies them in (and, where grad_dtype is the parameter's, the slot becomes its
 * gradient). Otherwise each parameter takes the per-parameter path as before. Adam and AdamW
 * only, every parameter contiguous, on one device, of one dtype, mirrors on all or none;
 * EM_ERR_UNSUPPORTED otherwise, or when another view shares a parameter's storage. Keeps the
 * results of the per-parameter path except the norm's rounding (its partial sums are grouped
 * differently). Costs a gradient buffer for the optimizer's lifetime. */
em_status em_optimizer_flatten(em_optimizer *o, em_scalar grad_dtype);
/* param's gradient slot (borrowed; param's shape, the flattening's gradient dtype), or NULL when
 * o is not flattened or param is not o's. */
em_tensor *em_optimizer_grad_slot(em_optimizer *o, const em_tensor *param);
/* Says that every slot holds this step's gradient: the next clips and step read the slots
 * rather than em_grad, until em_optimizer_zero_grad. */
em_status em_optimizer_grads_written(em_optimizer *o);

/* Optimizer state for checkpoints: visits every state tensor with a full name; load replaces the
 * state from tensors found by name (missing ones are an error naming them). */
typedef bool (*em_optim_state_fn)(const char *name, em_tensor *t, void *user);
void em_optimizer_state_visit(em_optimizer *o, em_optim_state_fn fn, void *user);
typedef em_tensor *(*em_optim_state_lookup)(const char *name, void *user);
em_status em_optimizer_state_load(em_optimizer *o, em_optim_state_lookup fn, void *user,
                                  int64_t steps);

/* Gradient clipping over the parameters (the optimizer's, or a module's): by global L2 norm
 * (returns the norm before clipping through *norm_out when not NULL) and by value. */
em_status em_clip_grad_norm(em_optimizer *o, double max_norm, double *norm_out);
em_status em_clip_grad_value(em_optimizer *o, double clip);
/* Gradient accumulation: multiplies every gradient by s (e.g. 1 / micro-steps). */
em_status em_scale_grads(em_optimizer *o, double s);

/* ---- device scalars: steps recorded as graphs (docs/optim.md, docs/graphs.md) -------------- */

/* Adam/AdamW only, every parameter on one device. With `on`, the fused update reads the step's
 * scalars (lr / (1 - beta1^t), sqrt(1 - beta2^t), the decay factor) from a small buffer on the
 * parameters' device instead of launch arguments, so a recorded step replays with new values;
 * em_optimizer_step then no longer counts steps (the caller does, em_optimizer_set_steps, once it
 * knows whether the step was skipped). The buffer is written by em_optimizer_write_scalars
 * (here too). Off frees it. */
em_status em_optimizer_device_scalars(em_optimizer *o, bool on);
/* Writes the scalars of step em_optimizer_steps(o) + 1 at the current lr (and resets the clip
 * slots: coefficient 1, no skip). Not while the device records: before a recording or replay. */
em_status em_optimizer_write_scalars(em_optimizer *o);
/* em_clip_grad_norm on the device, reading nothing back: the norm and the coefficient
 * min(1, max_norm / (norm + 1e-6)) go to the scalar buffer (added in f64 where the device has
 * f64, in slot order as the host adds them: the same bits; else f32), every gradient is rescaled
 * in place by it, and a non-finite norm makes the next em_optimizer_step leave every parameter
 * and its state unchanged (as a caller of em_clip_grad_norm skips the step). EM_ERR_UNSUPPORTED
 * for a gradient it cannot rescale in place (strided or shared). */
em_status em_clip_grad_norm_device(em_optimizer *o, double max_norm);
/* em_clip_grad_norm_device without the rescale's pass over the gradients: they are left as they
 * are and the next em_optimizer_step (Adam and AdamW's fused kernels) multiplies each gradient
 * by the coefficient as it reads it, rounded as the rescale would store it: the same update.
 * Gradients read between the two are not rescaled. Optimizers without a fused update (SGD)
 * rescale at once, as em_clip_grad_norm_device. */
em_status em_clip_grad_norm_device_deferred(em_optimizer *o, double max_norm);
/* Reads back the norm of the last em_clip_grad_norm_device (NaN when none ran since the last
 * write): a read, so after the replay. */
em_status em_optimizer_device_norm(em_optimizer *o, double *norm);
/* Sets the step count (Adam's t of the next step is steps + 1). */
void em_optimizer_set_steps(em_optimizer *o, int64_t steps);

/* ---- learning-rate schedules: plain values, lr = em_lr_at(s, step) ------------------------- */

typedef enum em_lr_kind {
    EM_LR_CONSTANT,  /* base */
    EM_LR_LINEAR,    /* warmup, then linear from base to min_lr at total_steps */
    EM_LR_COSINE,    /* warmup, then cosine from base to min_lr at total_steps */
    EM_LR_STEP,      /* warmup, then base * gamma^(floor((step - warmup) / step_size)) */
    EM_LR_NOAM,      /* base * dim^-0.5 * min(step^-0.5, step * warmup^-1.5) (step from 1) */
} em_lr_kind;

typedef struct em_lr_schedule {
    em_lr_kind kind;
    double base, min_lr, gamma;
    int64_t warmup, total_steps, step_size, dim;
} em_lr_schedule;

/* Linear warmup from 0 over `warmup` steps applies to every kind but NOAM. */
double em_lr_at(const em_lr_schedule *s, int64_t step);

/* A composition: `n` schedules each in force from its start step (starts ascending, the first
 * 0); each sees the step counted from its own start. */
typedef struct em_lr_sequence {
    const em_lr_schedule *parts;
    const int64_t *starts;
    int n;
} em_lr_sequence;
double em_lr_sequence_at(const em_lr_sequence *s, int64_t step);
/* Parses "cosine", "linear", "constant", "step", "noam"; false with the error set otherwise. */
bool em_lr_kind_parse(const char *name, em_lr_kind *out);

#ifdef __cplusplus
}
#endif
#endif
