/* conv.c — NCHW convolution and pooling as modules. Conv2d holds "weight" [out, in/groups, k, k]
 * and "bias" [out], both uniform(+-1/sqrt(fan_in)) as PyTorch's Conv2d (fan_in = in/groups k^2);
 * pools hold nothing and forward to em_max_pool2d / em_avg_pool2d. */
#include <math.h>

#include "nn/internal.h"

em_conv2d_mod *em_conv2d_new(em_device *dev, em_scalar dtype, int64_t in, int64_t out, int kernel,
                             int stride, int padding, int dilation, int groups, bool bias,
                             em_rng *rng)
{
    if (in <= 0 || out <= 0 || kernel <= 0 || stride <= 0 || padding < 0 || dilation <= 0 ||
        groups <= 0 || in % groups || out % groups) {
        em_set_error(EM_ERR_INVALID,
                     "em_conv2d_new: invalid configuration (in %lld, out %lld, kernel %d, stride "
                     "%d, padding %d, dilation %d, groups %d)",
                     (long long)in, (long long)out, kernel, stride, padding, dilation, groups);
        return NULL;
    }
    if (!rng) {
        em_set_error(EM_ERR_INVALID, "em_conv2d_new: NULL generator");
        return NULL;
    }
    em_conv2d_mod *c = (em_conv2d_mod *)em_module_new("Conv2d", dev, sizeof *c);
    if (!c) return NULL;
    c->stride = stride;
    c->padding = padding;
    c->dilation = dilation;
    c->groups = groups;
    c->weight =
        nn_param(&c->base, "weight", dtype, EM_SHAPE(out, in / groups, kernel, kernel), true);
    double bound = 1.0 / sqrt((double)(in / groups * kernel * kernel));
    if (!c->weight || em_init_uniform(c->weight, -bound, bound, rng) != EM_OK)
        return nn_fail(&c->base);
    if (bias) {
        c->bias = nn_param(&c->base, "bias", dtype, EM_SHAPE(out), false);
        if (!c->bias || em_init_uniform(c->bias, -bound, bound, rng) != EM_OK)
            return nn_fail(&c->base);
    }
    return c;
}

em_tensor *em_conv2d_forward(em_conv2d_mod *c, const em_tensor *x)
{
    if (!c || !x) return NULL;
    em_tensor *y = em_conv2d(x, c->weight, c->bias, c->stride, c->padding, c->dilation, c->groups);
    if (!y) em_error_context("em_conv2d_forward");
    return y;
}

em_pool2d_mod *em_pool2d_new(em_device *dev, bool max, int kernel, int stride, int padding)
{
    if (kernel <= 0 || stride < 0 || padding < 0 || padding > kernel / 2) {
        em_set_error(EM_ERR_INVALID,
                     "em_pool2d_new: invalid configuration (kernel %d, stride %d, padding %d)",
                     kernel, stride, padding);
        return NULL;
    }
    em_pool2d_mod *p =
        (em_pool2d_mod *)em_module_new(max ? "MaxPool2d" : "AvgPool2d", dev, sizeof *p);
    if (!p) return NULL;
    p->max = max;
    p->kernel = kernel;
    p->stride = stride;
    p->padding = padding;
    return p;
}

em_tensor *em_pool2d_forward(em_pool2d_mod *p, const em_tensor *x)
{
    if (!p || !x) return NULL;
    em_tensor *y = p->max ? em_max_pool2d(x, p->kernel, p->stride, p->padding)
                          : em_avg_pool2d(x, p->kernel, p->stride, p->padding);
    if (!y) em_error_context("em_pool2d_forward");
    return y;
}
