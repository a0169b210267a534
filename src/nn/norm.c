/* norm.c — LayerNorm and RMSNorm modules over the last dim, thin wrappers of the tensor layer's
 * fused em_layer_norm / em_rms_norm with the affine parameters ("weight" ones, "bias" zeros)
 * held by the module. Norm parameters are not weight-decayed. */
#include "nn/internal.h"

em_layer_norm_mod *em_layer_norm_new(em_device *dev, em_scalar dtype, int64_t dim, double eps,
                                     bool affine, bool bias)
{
    if (dim <= 0 || !(eps >= 0)) {
        em_set_error(EM_ERR_INVALID, "em_layer_norm_new: need dim > 0 and eps >= 0, got %lld, %g",
                     (long long)dim, eps);
        return NULL;
    }
    em_layer_norm_mod *n = (em_layer_norm_mod *)em_module_new("LayerNorm", dev, sizeof *n);
    if (!n) return NULL;
    n->dim = dim;
    n->eps = eps;
    if (affine) {
        n->weight = nn_param(&n->base, "weight", dtype, EM_SHAPE(dim), false);
        if (!n->weight || em_init_constant(n->weight, 1) != EM_OK) return nn_fail(&n->base);
        if (bias) {
            n->bias = nn_param(&n->base, "bias", dtype, EM_SHAPE(dim), false);
            if (!n->bias) return nn_fail(&n->base);
        }
    }
    return n;
}

em_tensor *em_layer_norm_forward(em_layer_norm_mod *n, const em_tensor *x)
{
    if (!n || !x) return NULL;
    if (!nn_check_last_dim("em_layer_norm_forward", x, 1, n->dim)) return NULL;
    em_tensor *y = em_layer_norm(x, 1, n->weight, n->bias, n->eps);
    if (!y) em_error_context("em_layer_norm_forward");
    return y;
}

em_rms_norm_mod *em_rms_norm_new(em_device *dev, em_scalar dtype, int64_t dim, double eps)
{
    if (dim <= 0 || !(eps >= 0)) {
        em_set_error(EM_ERR_INVALID, "em_rms_norm_new: need dim > 0 and eps >= 0, got %lld, %g",
                     (long long)dim, eps);
        return NULL;
    }
    em_rms_norm_mod *n = (em_rms_norm_mod *)em_module_new("RMSNorm", dev, sizeof *n);
    if (!n) return NULL;
    n->dim = dim;
    n->eps = eps;
    n->weight = nn_param(&n->base, "weight", dtype, EM_SHAPE(dim), false);
    if (!n->weight || em_init_constant(n->weight, 1) != EM_OK) return nn_fail(&n->base);
    return n;
}

em_tensor *em_rms_norm_forward(em_rms_norm_mod *n, const em_tensor *x)
{
    if (!n || !x) return NULL;
    if (!nn_check_last_dim("em_rms_norm_forward", x, 1, n->dim)) return NULL;
    em_tensor *y = em_rms_norm(x, 1, n->weight, n->eps);
    if (!y) em_error_context("em_rms_norm_forward");
    return y;
}
