/* linear.c — the fully connected layer: y = x W^T + b with weight [out, in] (PyTorch's Linear),
 * or y = x W + b with weight [in, out] (Hugging Face GPT-2's Conv1D, so its checkpoints load as
 * they are). The input's leading dims are flattened into one matmul and restored afterwards. */
#include <math.h>

#include "nn/internal.h"

em_linear *em_linear_new(em_device *dev, em_scalar dtype, int64_t in, int64_t out, bool bias,
                         bool weight_in_out, em_rng *rng)
{
    if (in <= 0 || out <= 0) {
        em_set_error(EM_ERR_INVALID, "em_linear_new: sizes must be positive, got in %lld, out %lld",
                     (long long)in, (long long)out);
        return NULL;
    }
    if (!rng) {
        em_set_error(EM_ERR_INVALID, "em_linear_new: NULL generator");
        return NULL;
    }
    em_linear *l = (em_linear *)em_module_new("Linear", dev, sizeof *l);
    if (!l) return NULL;
    l->in = in;
    l->out = out;
    l->weight_in_out = weight_in_out;
    em_shape ws = weight_in_out ? EM_SHAPE(in, out) : EM_SHAPE(out, in);
    l->weight = nn_param(&l->base, "weight", dtype, ws, true);
    if (!l->weight) return nn_fail(&l->base);
    /* PyTorch's Linear: kaiming_uniform(a = sqrt(5)) gives bound 1 / sqrt(fan_in); bias alike. */
    double bound = 1.0 / sqrt((double)in);
    if (em_init_uniform(l->weight, -bound, bound, rng) != EM_OK) return nn_fail(&l->base);
    if (bias) {
        l->bias = nn_param(&l->base, "bias", dtype, EM_SHAPE(out), false);
        if (!l->bias || em_init_uniform(l->bias, -bound, bound, rng) != EM_OK)
            return nn_fail(&l->base);
    }
    return l;
}

em_tensor *em_linear_forward(em_linear *l, const em_tensor *x)
{
    if (!l || !x) return NULL;
    if (!nn_check_last_dim("em_linear_forward", x, 1, l->in)) return NULL;
    em_shape s = em_shape_of(x);
    em_scope_begin();
    em_tensor *x2 = em_reshape(x, EM_SHAPE(-1, l->in));
    em_tensor *w = l->weight_in_out ? l->weight : em_transpose(l->weight, 0, 1);
    em_tensor *y = em_matmul(x2, w);
    if (l->bias) y = em_add(em_take(y), l->bias);
    s.d[s.rank - 1] = l->out;
    y = em_reshape(em_take(y), s);
    em_scope_end(&y, 1);
    if (!y) em_error_context("em_linear_forward");
    return y;
}
