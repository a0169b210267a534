/* loader_tensor.c — the loader's batches as tensors: (inputs, targets) as int32 [B, T] tensors on
 * a device, copied from the host batch the loader (and its prefetch thread) prepared. Kept apart
 * from loader.c so that the host-side loader does not depend on the tensor layer. */
#include <stdlib.h>

#include "data/loader_internal.h"
#include "ember/tensor.h"

em_status em_loader_next_tensors(em_loader *l, em_device *dev, em_tensor **inputs,
                                 em_tensor **targets)
{
    if (!l || !dev || !inputs || !targets)
        return em_set_error(EM_ERR_INVALID, "em_loader_next_tensors: NULL argument");
    *inputs = *targets = NULL;
    size_t n = (size_t)l->o.batch * (size_t)l->o.seq;
    int32_t *buf = malloc(2 * n * sizeof *buf);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "out of memory for a batch of %zu tokens", n);
    em_status st = em_loader_next(l, buf, buf + n);
    if (st == EM_OK) {
        em_shape shape = EM_SHAPE(l->o.batch, l->o.seq);
        *inputs = em_from_host(dev, EM_I32, shape, buf);
        *targets = *inputs ? em_from_host(dev, EM_I32, shape, buf + n) : NULL;
        if (!*targets) {
            em_release(*inputs);
            *inputs = NULL;
            st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_DEVICE;
            em_error_context("loader: copying a batch to the device");
        }
    }
    free(buf);
    return st;
}
