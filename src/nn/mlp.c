/* mlp.c — GPT-2's feed-forward part: "c_fc" (dim -> hidden), the activation, "c_proj"
 * (hidden -> dim) and residual dropout in training mode. */
#include "nn/internal.h"

em_mlp *em_mlp_new(em_device *dev, em_scalar dtype, int64_t dim, int64_t hidden, em_activation act,
                   bool bias, double p_dropout, bool weight_in_out, em_rng *rng)
{
    if (!(p_dropout >= 0 && p_dropout < 1)) {
        em_set_error(EM_ERR_INVALID, "em_mlp_new: p_dropout must be in [0, 1), got %g", p_dropout);
        return NULL;
    }
    em_mlp *m = (em_mlp *)em_module_new("MLP", dev, sizeof *m);
    if (!m) return NULL;
    m->act = act;
    m->p_dropout = p_dropout;
    m->c_fc = (em_linear *)em_module_add(
        &m->base, "c_fc",
        (em_module *)em_linear_new(dev, dtype, dim, hidden, bias, weight_in_out, rng));
    if (!m->c_fc) return nn_fail(&m->base);
    m->c_proj = (em_linear *)em_module_add(
        &m->base, "c_proj",
        (em_module *)em_linear_new(dev, dtype, hidden, dim, bias, weight_in_out, rng));
    if (!m->c_proj) return nn_fail(&m->base);
    return m;
}

em_tensor *em_mlp_forward(em_mlp *m, const em_tensor *x, em_rng *rng)
{
    if (!m || !x) return NULL;
    bool train = m->base.training && m->p_dropout > 0;
    if (train && !rng) {
        em_set_error(EM_ERR_INVALID,
                     "em_mlp_forward: NULL generator with dropout in training mode");
        return NULL;
    }
    em_scope_begin();
    em_tensor *h = em_activate(em_take(em_linear_forward(m->c_fc, x)), m->act);
    em_tensor *y = em_linear_forward(m->c_proj, h);
    if (train) y = em_dropout(em_take(y), m->p_dropout, true, rng);
    em_scope_end(&y, 1);
    if (!y) em_error_context("em_mlp_forward");
    return y;
}
