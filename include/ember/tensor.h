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

#ifdef __cplusplus
}
#endif
#endif
