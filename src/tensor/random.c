/* random.c — random tensors from the Philox 4x32-10 kernel of src/kernels/tensor_random.ek:
 * rand, randn, randint, bernoulli and multinomial. A generator (em_rng) is a seed and a call
 * counter; each draw uses a fresh counter value, so the same seed and sequence of calls give the
 * same numbers on every device (uniform and integer draws bit for bit; normals up to the device's
 * rounding of log, sin and cos). */
#include <string.h>

#include "tensor/internal.h"

em_rng em_rng_new(uint64_t seed)
{
    em_rng r = {seed, 0};
    return r;
}

static em_tensor *draw(const char *op, em_device *dev, em_scalar dtype, em_shape shape, em_rng *rng,
                       int dist, int64_t low, uint32_t span)
{
    if (!rng) {
        em_set_error(EM_ERR_INVALID, "%s: no generator given", op);
        return NULL;
    }
    if (shape.rank < 0 || shape.rank > EM_MAX_RANK) {
        em_set_error(EM_ERR_INVALID, "%s: rank %d is out of range", op, shape.rank);
        return NULL;
    }
    em_tensor *out = tn_new(dev, dtype, shape.rank, shape.d);
    if (!out) return NULL;
    uint64_t call = rng->counter++;
    int64_t n = em_numel(out);
    if (n == 0) return out;
    em_lang_bind b[2] = {em_lang_bind_type("T", dtype), em_lang_bind_int("DIST", dist)};
    em_arg lw = em_arg_i32(0);
    lw.value_class = EM_ARG_INT;
    lw.value.i = low;
    tn_arg args[9] = {tn_arg_flat(out),
                      tn_arg_s(em_arg_u32((uint32_t)n)),
                      tn_arg_s(em_arg_u32((uint32_t)rng->seed)),
                      tn_arg_s(em_arg_u32((uint32_t)(rng->seed >> 32))),
                      tn_arg_s(em_arg_u32((uint32_t)call)),
                      tn_arg_s(em_arg_u32((uint32_t)(call >> 32))),
                      tn_arg_s(lw),
                      tn_arg_s(em_arg_u32(span))};
    uint32_t cubes[3], units[3];
    tn_grid_1d(((uint64_t)n + 3) / 4, cubes, units);
    if (tn_launch(op, dev, "tensor_random", b, 2, 1, cubes, units, args, 8) != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em_rand(em_device *dev, em_scalar dtype, em_shape shape, em_rng *rng)
{
    if (!em_scalar_is_float(dtype)) {
        em_set_error(EM_ERR_INVALID, "rand: needs a floating-point dtype, got %s", em_scalar_name(dtype));
        return NULL;
    }
    return draw("rand", dev, dtype, shape, rng, 0, 0, 1);
}

em_tensor *em_randn(em_device *dev, em_scalar dtype, em_shape shape, em_rng *rng)
{
    if (!em_scalar_is_float(dtype)) {
        em_set_error(EM_ERR_INVALID, "randn: needs a floating-point dtype, got %s", em_scalar_name(dtype));
        return NULL;
    }
    return draw("randn", dev, dtype, shape, rng, 1, 0, 1);
}

em_tensor *em_randint(em_device *dev, em_scalar dtype, em_shape shape, int64_t low, int64_t high, em_rng *rng)
{
    if (high <= low || high - low > (int64_t)UINT32_MAX) {
        em_set_error(EM_ERR_INVALID, "randint: bad range [%lld, %lld)", (long long)low, (long long)high);
        return NULL;
    }
    if (dtype == EM_BOOL) {
        em_set_error(EM_ERR_INVALID, "randint: needs a numeric dtype, got bool");
        return NULL;
    }
    return draw("randint", dev, dtype, shape, rng, 2, low, (uint32_t)(high - low));
}

em_tensor *em_bernoulli(const em_tensor *p, em_rng *rng)
{
    if (!p) return NULL;
    em_tensor *out = NULL;
    if (!em_scalar_is_float(p->dtype)) {
        em_set_error(EM_ERR_INVALID, "bernoulli: p must be a floating-point tensor, got %s", em_scalar_name(p->dtype));
    } else {
        /* u < p with u uniform in [0, 1): 1 with probability p. */
        em_tensor *u = em_rand(p->st->dev, p->dtype, em_shape_of(p), rng);
        em_tensor *hit = u ? em_lt(u, p) : NULL;
        out = hit ? em_cast(hit, p->dtype) : NULL;
        em_release(u);
        em_release(hit);
        return out; /* em_lt consumed a donated p */
    }
    tn_done(p);
    return out;
}

em_tensor *em_multinomial(const em_tensor *probs, int64_t num_samples, em_rng *rng)
{
    if (!probs) return NULL;
    em_tensor *out = NULL, *u = NULL, *pv = NULL;
    if (!em_scalar_is_float(probs->dtype) || probs->rank < 1 || probs->rank > 2 || num_samples < 1) {
        char s[128];
        em_set_error(EM_ERR_INVALID, "multinomial: needs float probabilities [K] or [B, K] and num_samples >= 1, got %s and %lld",
                     em_describe(probs, s, sizeof s), (long long)num_samples);
        goto done;
    }
    int64_t B = probs->rank == 2 ? probs->shape[0] : 1;
    pv = probs->rank == 2 ? tn_view(probs, 2, probs->shape, probs->stride, probs->offset)
                          : tn_view(probs, 2, (int64_t[]){1, probs->shape[0]}, (int64_t[]){0, probs->stride[0]},
                                    probs->offset);
    u = pv ? em_rand(probs->st->dev, EM_F32, EM_SHAPE(B, num_samples), rng) : NULL;
    if (!u) goto done;
    out = probs->rank == 2 ? tn_new(probs->st->dev, EM_I64, 2, (int64_t[]){B, num_samples})
                           : tn_new(probs->st->dev, EM_I64, 1, (int64_t[]){num_samples});
    if (!out || B == 0 || probs->shape[probs->rank - 1] == 0) goto done;
    em_lang_bind b[1] = {em_lang_bind_type("F", probs->dtype)};
    tn_arg args[4] = {tn_arg_t(pv), tn_arg_flat(u), tn_arg_flat(out), tn_arg_s(em_arg_u32((uint32_t)num_samples))};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)(B * num_samples), cubes, units);
    if (tn_launch("multinomial", probs->st->dev, "tensor_multinomial", b, 1, 1, cubes, units, args, 4) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    em_release(u);
    em_release(pv);
    tn_done(probs);
    return out;
}
