/* init.c — parameter initializers. Each draws a fresh tensor of the target's shape and dtype
 * with the tensor layer's counter-based generator (so the same seed gives the same weights on
 * every device), shapes it with ordinary ops and copies it into the target in place under
 * no-grad: the tensor stays the same object (modules keep pointers to their parameters) and no
 * gradient is recorded. Fans are computed as PyTorch's _calculate_fan_in_and_fan_out. */
#include <math.h>

#include "nn/internal.h"

/* Copies the result of a draw into t without recording; releases src. */
static em_status fill_from(const char *op, em_tensor *t, em_tensor *src)
{
    if (!src) return em_error_context("%s", op);
    em_no_grad_begin();
    em_status st = em_copy_(t, src);
    em_no_grad_end();
    em_release(src);
    if (st != EM_OK) em_error_context("%s", op);
    return st;
}

static bool check_target(const char *op, const em_tensor *t, const em_rng *rng, bool need_rng)
{
    if (!t) {
        em_set_error(EM_ERR_INVALID, "%s: NULL tensor", op);
        return false;
    }
    if (need_rng && !rng) {
        em_set_error(EM_ERR_INVALID, "%s: NULL generator", op);
        return false;
    }
    em_scalar dt = em_dtype(t);
    if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16) {
        char b[96];
        em_set_error(EM_ERR_INVALID, "%s: needs a floating-point tensor, got %s", op,
                     nn_desc(t, b, sizeof b));
        return false;
    }
    return true;
}

static em_status init_normal(const char *op, em_tensor *t, double mean, double std, em_rng *rng)
{
    if (!check_target(op, t, rng, true)) return em_last_status();
    em_scope_begin();
    em_tensor *z = em_randn(em_tensor_device(t), em_dtype(t), em_shape_of(t), rng);
    em_tensor *r = em_add_scalar(em_take(em_mul_scalar(em_take(z), std)), mean);
    em_scope_end(&r, 1);
    return fill_from(op, t, r);
}

static em_status init_uniform(const char *op, em_tensor *t, double lo, double hi, em_rng *rng)
{
    if (!check_target(op, t, rng, true)) return em_last_status();
    em_scope_begin();
    em_tensor *u = em_rand(em_tensor_device(t), em_dtype(t), em_shape_of(t), rng);
    em_tensor *r = em_add_scalar(em_take(em_mul_scalar(em_take(u), hi - lo)), lo);
    em_scope_end(&r, 1);
    return fill_from(op, t, r);
}

em_status em_init_normal(em_tensor *t, double mean, double std, em_rng *rng)
{
    return init_normal("em_init_normal", t, mean, std, rng);
}

em_status em_init_uniform(em_tensor *t, double lo, double hi, em_rng *rng)
{
    return init_uniform("em_init_uniform", t, lo, hi, rng);
}

em_status em_init_constant(em_tensor *t, double value)
{
    if (!check_target("em_init_constant", t, NULL, false)) return em_last_status();
    em_tensor *c = em_full(em_tensor_device(t), em_dtype(t), EM_SHAPE(), value);
    return fill_from("em_init_constant", t, c);
}

/* fan_in = dim 1 x receptive field, fan_out = dim 0 x receptive field; rank >= 2. */
static bool fans(const char *op, const em_tensor *t, double *fan_in, double *fan_out)
{
    if (em_rank(t) < 2) {
        char b[96];
        em_set_error(EM_ERR_INVALID, "%s: fan in and fan out need a tensor of rank >= 2, got %s",
                     op, nn_desc(t, b, sizeof b));
        return false;
    }
    double rf = 1;
    for (int i = 2; i < em_rank(t); i++) rf *= (double)em_dim(t, i);
    *fan_in = (double)em_dim(t, 1) * rf;
    *fan_out = (double)em_dim(t, 0) * rf;
    if (*fan_in <= 0 || *fan_out <= 0) {
        em_set_error(EM_ERR_INVALID, "%s: zero fan", op);
        return false;
    }
    return true;
}

em_status em_init_xavier_uniform(em_tensor *t, double gain, em_rng *rng)
{
    const char *op = "em_init_xavier_uniform";
    double fi, fo;
    if (!check_target(op, t, rng, true) || !fans(op, t, &fi, &fo)) return em_last_status();
    double a = gain * sqrt(6.0 / (fi + fo));
    return init_uniform(op, t, -a, a, rng);
}

em_status em_init_xavier_normal(em_tensor *t, double gain, em_rng *rng)
{
    const char *op = "em_init_xavier_normal";
    double fi, fo;
    if (!check_target(op, t, rng, true) || !fans(op, t, &fi, &fo)) return em_last_status();
    return init_normal(op, t, 0, gain * sqrt(2.0 / (fi + fo)), rng);
}

em_status em_init_kaiming_uniform(em_tensor *t, bool mode_fan_in, em_rng *rng)
{
    const char *op = "em_init_kaiming_uniform";
    double fi, fo;
    if (!check_target(op, t, rng, true) || !fans(op, t, &fi, &fo)) return em_last_status();
    double std = sqrt(2.0) / sqrt(mode_fan_in ? fi : fo);
    double bound = sqrt(3.0) * std;
    return init_uniform(op, t, -bound, bound, rng);
}

em_status em_init_kaiming_normal(em_tensor *t, bool mode_fan_in, em_rng *rng)
{
    const char *op = "em_init_kaiming_normal";
    double fi, fo;
    if (!check_target(op, t, rng, true) || !fans(op, t, &fi, &fo)) return em_last_status();
    return init_normal(op, t, 0, sqrt(2.0) / sqrt(mode_fan_in ? fi : fo), rng);
}

em_status em_init_gpt2_residual(em_tensor *t, int n_layer, em_rng *rng)
{
    if (n_layer < 1)
        return em_set_error(EM_ERR_INVALID, "em_init_gpt2_residual: n_layer must be >= 1, got %d",
                            n_layer);
    return init_normal("em_init_gpt2_residual", t, 0, 0.02 / sqrt(2.0 * n_layer), rng);
}
