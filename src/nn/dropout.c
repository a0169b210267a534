/* dropout.c — inverted dropout and the activation functions selectable by name (for configs:
 * "gelu_new" is Hugging Face GPT-2's name for the tanh approximation). Dropout draws its keep
 * mask with em_bernoulli from the caller's generator, so a run is reproducible from its seed. */
#include <string.h>

#include "nn/internal.h"

em_tensor *em_dropout(const em_tensor *x, double p, bool training, em_rng *rng)
{
    if (!x) return NULL;
    if (!(p >= 0 && p <= 1)) {
        em_set_error(EM_ERR_INVALID, "em_dropout: p must be in [0, 1], got %g", p);
        return NULL;
    }
    em_scalar dt = em_dtype(x);
    if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16) {
        char b[96];
        em_set_error(EM_ERR_INVALID, "em_dropout: needs a floating-point tensor, got %s",
                     nn_desc(x, b, sizeof b));
        return NULL;
    }
    /* The identity still returns a new tensor (a view), so that scopes and the tape see it. */
    if (!training || p == 0) return em_reshape(x, em_shape_of(x));
    if (p == 1) return em_mul_scalar(x, 0.0);
    if (!rng) {
        em_set_error(EM_ERR_INVALID, "em_dropout: NULL generator in training mode");
        return NULL;
    }
    em_scope_begin();
    em_tensor *keep = em_full(em_tensor_device(x), dt, em_shape_of(x), 1.0 - p);
    em_tensor *mask = em_bernoulli(keep, rng);
    em_tensor *y = em_mul(x, em_take(em_mul_scalar(em_take(mask), 1.0 / (1.0 - p))));
    em_scope_end(&y, 1);
    if (!y) em_error_context("em_dropout");
    return y;
}

em_tensor *em_activate(const em_tensor *x, em_activation act)
{
    if (!x) return NULL;
    switch (act) {
    case EM_ACT_NONE:
        return em_reshape(x, em_shape_of(x));
    case EM_ACT_RELU:
        return em_relu(x);
    case EM_ACT_GELU:
        return em_gelu(x);
    case EM_ACT_GELU_TANH:
        return em_gelu_tanh(x);
    case EM_ACT_SILU:
        return em_silu(x);
    case EM_ACT_TANH:
        return em_tanh(x);
    case EM_ACT_SIGMOID:
        return em_sigmoid(x);
    }
    em_set_error(EM_ERR_INVALID, "em_activate: unknown activation %d", (int)act);
    return NULL;
}

em_activation em_activation_parse(const char *name)
{
    static const struct {
        const char *name;
        em_activation act;
    } names[] = {
        {"none", EM_ACT_NONE},          {"identity", EM_ACT_NONE},
        {"linear", EM_ACT_NONE},        {"relu", EM_ACT_RELU},
        {"gelu", EM_ACT_GELU},          {"gelu_tanh", EM_ACT_GELU_TANH},
        {"gelu_new", EM_ACT_GELU_TANH}, {"gelu_pytorch_tanh", EM_ACT_GELU_TANH},
        {"silu", EM_ACT_SILU},          {"swish", EM_ACT_SILU},
        {"tanh", EM_ACT_TANH},          {"sigmoid", EM_ACT_SIGMOID},
    };
    for (size_t i = 0; name && i < EM_ARRAY_LEN(names); i++)
        if (!strcmp(name, names[i].name)) return names[i].act;
    em_set_error(EM_ERR_INVALID,
                 "unknown activation \"%s\" (relu, gelu, gelu_tanh, gelu_new, "
                 "silu, tanh, sigmoid or none)",
                 name ? name : "(null)");
    return EM_ACT_NONE;
}
