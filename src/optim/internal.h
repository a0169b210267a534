/* internal.h — what the optimizer files share: the optimizer object (its parameters, their state
 * and the algorithm's per-parameter update), and the helpers sgd.c and adam.c use. optimizer.c
 * holds everything that does not depend on the algorithm. */
#ifndef EM_OPTIM_INTERNAL_H
#define EM_OPTIM_INTERNAL_H

#include "base/base.h"
#include "ember/optim.h"

#define OP_MAX_STATE 2 /* state tensors per parameter (Adam's two moments) */

/* One parameter and its state. */
typedef struct op_param {
    char *name;                     /* full name (owned) */
    em_tensor *t;                   /* borrowed */
    bool decay;                     /* in the weight-decay group */
    em_tensor *state[OP_MAX_STATE]; /* owned, untracked (no scope); NULL until created */
} op_param;

/* Updates one parameter from its gradient g (in the parameter's compute dtype, see op_compute_type)
 * at step t (1 for the first). Runs with recording off, inside a scope of optimizer.c's (so
 * temporaries need no release; state kept across steps must go through op_set_state). */
typedef em_status (*op_update_fn)(em_optimizer *o, op_param *p, const em_tensor *g, int64_t t);

struct em_optimizer {
    const char *kind; /* "SGD", "Adam", "AdamW" */
    op_param *ps;     /* parameters, in the order given (or visited) */
    int n;
    double lr;                             /* current learning rate */
    int64_t steps;                         /* steps taken */
    int nstate;                            /* state tensors per parameter (0..OP_MAX_STATE) */
    const char *state_names[OP_MAX_STATE]; /* suffixes: "momentum_buffer", "exp_avg", ... */
    op_update_fn update;
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

#endif
