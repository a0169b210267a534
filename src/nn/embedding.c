/* embedding.c — the lookup table: weight [num, dim] ~ normal(0, 1) as PyTorch's Embedding; the
 * forward gathers rows by id (ids i32/i64 of any shape -> [..ids, dim]). Out-of-range ids are an
 * error of the tensor layer's em_embedding. */
#include "nn/internal.h"

em_embedding_mod *em_embedding_new(em_device *dev, em_scalar dtype, int64_t num, int64_t dim,
                                   em_rng *rng)
{
    if (num <= 0 || dim <= 0) {
        em_set_error(EM_ERR_INVALID, "em_embedding_new: sizes must be positive, got %lld x %lld",
                     (long long)num, (long long)dim);
        return NULL;
    }
    if (!rng) {
        em_set_error(EM_ERR_INVALID, "em_embedding_new: NULL generator");
        return NULL;
    }
    em_embedding_mod *e = (em_embedding_mod *)em_module_new("Embedding", dev, sizeof *e);
    if (!e) return NULL;
    e->num = num;
    e->dim = dim;
    e->weight = nn_param(&e->base, "weight", dtype, EM_SHAPE(num, dim), true);
    if (!e->weight || em_init_normal(e->weight, 0, 1, rng) != EM_OK) return nn_fail(&e->base);
    return e;
}

em_tensor *em_embedding_forward(em_embedding_mod *e, const em_tensor *ids)
{
    if (!e || !ids) return NULL;
    em_scalar dt = em_dtype(ids);
    if (dt != EM_I32 && dt != EM_I64) {
        char b[96];
        em_set_error(EM_ERR_INVALID, "em_embedding_forward: ids must be i32 or i64, got %s",
                     nn_desc(ids, b, sizeof b));
        return NULL;
    }
    em_tensor *y = em_embedding(e->weight, ids);
    if (!y) em_error_context("em_embedding_forward");
    return y;
}
