/* internal.h — what the optimizer files share: the optimizer object (its parameters, their state
 * and the algorithm's per-parameter update), the helpers sgd.c and adam.c use, and the fused
 * kernels' host side (fused.c). optimizer.c holds everything that does not depend on the
 * algorithm. */
#ifndef EM_OPTIM_INTERNAL_H
#define EM_OPTIM_INTERNAL_H

#include "base/base.h"
#include "ember/optim.h"

#define OP_MAX_STATE 2 /* state tensors per parameter (Adam's two moments) */
#define OP_CLIP_EPS 1e-6 /* added to the norm, as torch.nn.utils.clip_grad_norm_ */

/* One parameter and its state. */
typedef struct op_param {
    char *name;                     /* full name (owned) */
    em_tensor *t;                   /* borrowed */
    bool decay;                     /* in the weight-decay group */
    em_tensor *state[OP_MAX_STATE]; /* owned, untracked (no scope); NULL until created */
    em_tensor *mirror;              /* borrowed: kept equal to t rounded to its dtype, or NULL */
    bool mirror_written;            /* the fused update wrote the mirror in this step */
} op_param;

/* Updates one parameter from its gradient g (in the parameter's compute dtype, see op_compute_type)
 * at step t (1 for the first). Runs with recording off, inside a scope of optimizer.c's (so
 * temporaries need no release; state kept across steps must go through op_set_state). */
typedef em_status (*op_update_fn)(em_optimizer *o, op_param *p, const em_tensor *g, int64_t t);

/* The same update in one fused launch, given the gradient as it is (the parameter's dtype, any
 * layout). Sets *ran when it updated p; leaves it false (returning EM_OK) where it cannot run, and
 * the step then calls the op-by-op update. Same context as op_update_fn. */
typedef struct op_arena op_arena; /* the flat storage (arena.c) */

typedef em_status (*op_fused_fn)(em_optimizer *o, op_param *p, const em_tensor *g, int64_t t,
                                 bool *ran);

struct em_optimizer {
    const char *kind; /* "SGD", "Adam", "AdamW" */
    op_param *ps;     /* parameters, in the order given (or visited) */
    int n;
    double lr;                             /* current learning rate */
    int64_t steps;                         /* steps taken */
    int nstate;                            /* state tensors per parameter (0..OP_MAX_STATE) */
    const char *state_names[OP_MAX_STATE]; /* suffixes: "momentum_buffer", "exp_avg", ... */
    op_update_fn update;
    op_fused_fn fused; /* or NULL (SGD) */
    em_tensor *dscal;  /* device scalars (device_scalars.c: OP_SC_* slots) or NULL: launch
                          arguments */
    op_arena *arena;   /* the flat storage of em_optimizer_flatten (arena.c), or NULL */
    double host_coef;  /* with clip_deferred and no device scalars: the coefficient of a host
                          clip (em_clip_grad_norm) over flat slots narrower than the parameters,
                          applied by the step as it reads them (rounded to the parameter's
                          dtype, as a clip of full-width gradients stores them) */
    bool clip_deferred; /* the last device clip left the gradients as they were: the next step
                           applies OP_SC_COEF as it reads each one (em_clip_grad_norm_device_deferred) */
    union {
        em_sgd_config sgd;
        em_adam_config adam;
    } cfg;
};

/* A new optimizer over the parameters (names copied; every tensor must be a floating-point leaf).
 * NULL with the error set. */
em_optimizer *op_new_params(const char *kind, const em_param_ref *ps, int n);
/* As op_new_params, with the parameters of a module tree. */
em_optimizer *op_new_module(const char *kind, em_module *m);

/* The dtype updates compute in for parameter t: f64 for f64 parameters, f32 otherwise. State has
 * that dtype too. */
em_scalar op_compute_type(const em_tensor *t);
/* Replaces state slot i of p with v (untracked from any scope; the optimizer owns it). */
void op_set_state(op_param *p, int i, em_tensor *v);
/* Writes v (compute dtype) into the parameter, converting to its dtype. */
em_status op_write_param(op_param *p, const em_tensor *v);

/* The slots of the device-scalar buffer (dtype op_scalar_type): what the host writes before a
 * step, and what optim_clip_coef writes. */
enum {
    OP_SC_STEP_SIZE, /* lr / (1 - beta1^t) */
    OP_SC_BC2_SQRT,  /* sqrt(1 - beta2^t) */
    OP_SC_DECAY,     /* AdamW: 1 - lr * weight_decay; Adam: weight_decay */
    OP_SC_NORM,      /* the last device clip's global norm */
    OP_SC_COEF,      /* its rescale coefficient (1: none) */
    OP_SC_OK,        /* 1: the norm was finite (or no clip ran); 0: the step is skipped */
    OP_SC_COUNT
};

/* ---- fused kernels (fused.c, src/kernels/optim_adam.ek) ---- */

/* Adam/AdamW's update of p in one launch, in place (an op_fused_fn). */
em_status op_adam_fused(em_optimizer *o, op_param *p, const em_tensor *g, int64_t t, bool *ran);
/* *out = the sum of the squares of every gradient of o: per gradient one launch writing partial
 * sums into one buffer per device, read back once per device and added in double. */
em_status op_grad_sq_sum(em_optimizer *o, double *out);
/* g = g * s in place in one launch, computed in g's compute dtype. Sets *ran when done; leaves it
 * false (EM_OK) when g is strided, too large or shared with another tensor. */
em_status op_scale_grad(em_tensor *g, double s, bool *ran);
/* The dtype of partial sums and device scalars on dev: f64 where it has f64, else f32. */
em_scalar op_scalar_type(em_device *dev);
/* Device clipping (o->dscal set, every parameter on one device): the partial sums of every
 * gradient, optim_clip_coef into o->dscal, and each gradient rescaled in place by the
 * coefficient read from there (EM_ERR_UNSUPPORTED for a gradient that cannot be: strided,
 * shared or too large); with `defer` and a fused update (Adam), the rescale is left to the next
 * step's kernels (o->clip_deferred). Nothing is read back. */
em_status op_clip_device(em_optimizer *o, double max_norm, bool defer);
/* g *= the coefficient of o's device scalars, in place (op_clip_device's rescale of one
 * gradient; EM_ERR_UNSUPPORTED where g is strided, shared or too large). */
em_status op_scale_grad_device(em_optimizer *o, em_tensor *g, const char *name);

/* Launches Adam's update of n elements: the parameter w, gradient g, moments m and v (and the
 * mirror q, or NULL) are contiguous, realized tensors or regions of at least n elements, at the
 * given step t, in the decay group or not (fused.c; op_adam_fused and arena.c's regions). */
em_status op_adam_launch(em_optimizer *o, em_tensor *w, const em_tensor *g, em_tensor *m,
                         em_tensor *v, em_tensor *q, int64_t n, bool decay, int64_t t);

/* ---- flat storage (arena.c, em_optimizer_flatten) ---- */

void op_arena_free(op_arena *a, int n);

/* Elements between the flat storage's parameter offsets for buffers whose narrowest dtype is
 * `elem` bytes on a device whose buffer offsets must be multiples of `align` bytes (0: any): the
 * least multiple of 256 elements whose bytes are a multiple of align, so that a kernel may be
 * passed a parameter's view at its offset (NVIDIA's OpenCL binds it as a sub-buffer, whose origin
 * must be 512-byte aligned). */
int64_t op_flat_grain(size_t elem, uint64_t align);
/* True when s (a state tensor) is a view of o's flat state: it may be written in place. */
bool op_arena_holds(const em_optimizer *o, const em_tensor *s);
/* *grads = every slot as one 1-D tensor (borrowed) when they hold this step's gradients: the
 * caller wrote them (em_optimizer_grads_written), or every parameter has a gradient, which is
 * copied in (and, where the dtypes match, becomes the slot). NULL when o is not flattened or a
 * parameter has no gradient: the per-parameter path runs. */
em_status op_arena_gather(em_optimizer *o, em_tensor **grads);
/* The whole Adam step over the flat storage: one launch for the decay group, one for the rest
 * (*ran set); *ran false (EM_OK) where op_arena_gather finds no flat gradients. Inside a scope. */
em_status op_arena_step(em_optimizer *o, int64_t t, bool *ran);
/* Forgets that the caller wrote the slots (em_optimizer_zero_grad). */
void op_arena_forget_grads(em_optimizer *o);
/* True when the flat slots hold this step's gradients in a dtype other than the parameters'
 * (bf16 for f32): a host clip then leaves its coefficient to the step (o->host_coef) rather than
 * round the rescaled gradients to the slots' dtype. */
bool op_arena_narrow(const em_optimizer *o);
/* Applies a host clip's coefficient that is still pending (o->host_coef) to the flat slots in
 * place, before anything but the step reads them. */
em_status op_arena_settle(em_optimizer *o);

#endif
