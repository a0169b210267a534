/* sgd.c — stochastic gradient descent as torch.optim.SGD computes it:
 *
 *   g = grad + weight_decay * p                     (decay group only)
 *   b = g                                           (first step: a copy of g)
 *   b = momentum * b + (1 - dampening) * g          (later steps)
 *   g = g + momentum * b  (nesterov)  or  g = b     (when momentum != 0)
 *   p = p - lr * g
 *
 * State: "momentum_buffer" per parameter when momentum != 0. */
#include "optim/internal.h"

static em_status sgd_update(em_optimizer *o, op_param *p, const em_tensor *grad, int64_t t)
{
    const em_sgd_config *c = &o->cfg.sgd;
    em_scalar ct = op_compute_type(p->t);
    const em_tensor *w = em_dtype(p->t) == ct ? p->t : em_cast(p->t, ct);
    const em_tensor *g = grad;
    if (c->weight_decay != 0 && p->decay) g = em_add(g, em_mul_scalar(w, c->weight_decay));
    if (c->momentum != 0) {
        em_tensor *b = p->state[0] ? em_add(em_mul_scalar(p->state[0], c->momentum),
                                            em_mul_scalar(g, 1.0 - c->dampening))
                                   : em_clone(g);
        if (!b) return em_last_status();
        op_set_state(p, 0, b);
        g = c->nesterov ? em_add(g, em_mul_scalar(b, c->momentum)) : b;
    }
    return op_write_param(p, em_sub(w, em_mul_scalar(g, o->lr)));
}

static em_optimizer *sgd_setup(em_optimizer *o, const em_sgd_config *cfg)
{
    if (!o) return NULL;
    o->cfg.sgd = *cfg;
    o->lr = cfg->lr;
    o->update = sgd_update;
    o->nstate = cfg->momentum != 0 ? 1 : 0;
    o->state_names[0] = "momentum_buffer";
    return o;
}

/* Checks the configuration as torch.optim.SGD does. */
static bool sgd_valid(const em_sgd_config *c)
{
    if (!c) return em_set_error(EM_ERR_INVALID, "SGD: NULL config"), false;
    if (!(c->lr >= 0)) return em_set_error(EM_ERR_INVALID, "SGD: invalid lr %g", c->lr), false;
    if (!(c->momentum >= 0))
        return em_set_error(EM_ERR_INVALID, "SGD: invalid momentum %g", c->momentum), false;
    if (!(c->weight_decay >= 0))
        return em_set_error(EM_ERR_INVALID, "SGD: invalid weight_decay %g", c->weight_decay), false;
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return em_set_error(EM_ERR_INVALID,
                            "SGD: nesterov needs momentum > 0 and dampening 0 "
                            "(momentum %g, dampening %g)",
                            c->momentum, c->dampening),
               false;
    return true;
}

em_optimizer *em_sgd_new(em_module *m, const em_sgd_config *cfg)
{
    return sgd_valid(cfg) ? sgd_setup(op_new_module("SGD", m), cfg) : NULL;
}

em_optimizer *em_sgd_new_params(const em_param_ref *ps, int n, const em_sgd_config *cfg)
{
    return sgd_valid(cfg) ? sgd_setup(op_new_params("SGD", ps, n), cfg) : NULL;
}
