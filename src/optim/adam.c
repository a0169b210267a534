/* adam.c — Adam and AdamW as torch.optim.Adam / AdamW compute them (without amsgrad):
 *
 *   g = grad + weight_decay * p                     (Adam: L2 in the gradient, decay group only)
 *   p = p * (1 - lr * weight_decay)                 (AdamW: decoupled, decay group only)
 *   m = beta1 * m + (1 - beta1) * g                 ("exp_avg")
 *   v = beta2 * v + (1 - beta2) * g^2               ("exp_avg_sq")
 *   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * t is the optimizer's step count (em_optimizer_steps after the step), shared by all parameters;
 * the moments start at zero on the first step.
 *
 * The step runs fused.c's op_adam_fused: these formulas in one launch per parameter, in place
 * (src/kernels/optim_adam.ek). adam_update below computes the same op by op; it runs only where
 * the kernel cannot: a strided parameter (a view), or one of more than 2^31 elements. */
#include <math.h>

#include "optim/internal.h"

static em_status adam_update(em_optimizer *o, op_param *p, const em_tensor *grad, int64_t t)
{
    const em_adam_config *c = &o->cfg.adam;
    em_scalar ct = op_compute_type(p->t);
    em_device *dev = em_tensor_device(p->t);
    const em_tensor *w = em_dtype(p->t) == ct ? p->t : em_cast(p->t, ct);
    const em_tensor *g = grad;
    bool decay = c->weight_decay != 0 && p->decay;
    if (decay && !c->decoupled) g = em_add(g, em_mul_scalar(w, c->weight_decay));
    if (decay && c->decoupled) w = em_mul_scalar(w, 1.0 - o->lr * c->weight_decay);
    for (int k = 0; k < 2; k++)
        if (!p->state[k]) {
            em_tensor *z = em_zeros(dev, ct, em_shape_of(p->t));
            if (!z) return em_last_status();
            op_set_state(p, k, z);
        }
    em_tensor *m = em_add(em_mul_scalar(p->state[0], c->beta1), em_mul_scalar(g, 1.0 - c->beta1));
    em_tensor *v =
        em_add(em_mul_scalar(p->state[1], c->beta2), em_mul_scalar(em_mul(g, g), 1.0 - c->beta2));
    if (!m || !v) return em_last_status();
    op_set_state(p, 0, m);
    op_set_state(p, 1, v);
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    em_tensor *denom = em_add_scalar(em_div_scalar(em_sqrt(v), sqrt(bc2)), c->eps);
    return op_write_param(p, em_sub(w, em_mul_scalar(em_div(m, denom), o->lr / bc1)));
}

static em_optimizer *adam_setup(em_optimizer *o, const em_adam_config *cfg)
{
    if (!o) return NULL;
    o->kind = cfg->decoupled ? "AdamW" : "Adam";
    o->cfg.adam = *cfg;
    o->lr = cfg->lr;
    o->update = adam_update;
    o->fused = op_adam_fused;
    o->nstate = 2;
    o->state_names[0] = "exp_avg";
    o->state_names[1] = "exp_avg_sq";
    return o;
}

/* Checks the configuration as torch.optim.Adam does. */
static bool adam_valid(const em_adam_config *c)
{
    if (!c) return em_set_error(EM_ERR_INVALID, "Adam: NULL config"), false;
    const char *k = c->decoupled ? "AdamW" : "Adam";
    if (!(c->lr >= 0)) return em_set_error(EM_ERR_INVALID, "%s: invalid lr %g", k, c->lr), false;
    if (!(c->eps >= 0)) return em_set_error(EM_ERR_INVALID, "%s: invalid eps %g", k, c->eps), false;
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return em_set_error(EM_ERR_INVALID, "%s: betas (%g, %g) must be in [0, 1)", k, c->beta1,
                            c->beta2),
               false;
    if (!(c->weight_decay >= 0))
        return em_set_error(EM_ERR_INVALID, "%s: invalid weight_decay %g", k, c->weight_decay),
               false;
    return true;
}

em_optimizer *em_adam_new(em_module *m, const em_adam_config *cfg)
{
    return adam_valid(cfg) ? adam_setup(op_new_module(cfg->decoupled ? "AdamW" : "Adam", m), cfg)
                           : NULL;
}

em_optimizer *em_adam_new_params(const em_param_ref *ps, int n, const em_adam_config *cfg)
{
    return adam_valid(cfg)
               ? adam_setup(op_new_params(cfg->decoupled ? "AdamW" : "Adam", ps, n), cfg)
               : NULL;
}
