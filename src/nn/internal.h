/* internal.h — what the nn layer's files share: taking a freshly made tensor out of every scope
 * (modules own their tensors), the helpers that make a parameter of a given shape, and input
 * checks that set errors in the house style (the message names the expected and the given
 * shapes). */
#ifndef EM_NN_INTERNAL_H
#define EM_NN_INTERNAL_H

#include "base/base.h"
#include "ember/nn.h"

/* Detaches t from any scope, so that the caller holds its creation reference. Returns t. */
em_tensor *nn_own(em_tensor *t);

/* A new parameter of m: em_empty of shape, owned by m, marked requires-grad. NULL on error. */
em_tensor *nn_param(em_module *m, const char *name, em_scalar dtype, em_shape shape, bool decay);

/* "f32[2, 3]"-style text of t into buf. */
const char *nn_desc(const em_tensor *t, char *buf, size_t size);

/* Checks that x is a floating-point tensor of rank >= min_rank whose last dim is `last`; sets
 * "op: expected [..., last] input, got f32[...]" otherwise. */
bool nn_check_last_dim(const char *op, const em_tensor *x, int min_rank, int64_t last);

/* Frees m after a failed construction and returns NULL (for `return nn_fail(&l->base);`). */
void *nn_fail(em_module *m);

#endif
