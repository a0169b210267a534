/* block.c — the pre-norm transformer block of GPT-2: x + attn(ln_1(x)), then + mlp(ln_2(x)).
 * Children "ln_1", "attn", "ln_2", "mlp", so a GPT's tree reads h.<i>.attn.c_attn.weight as in
 * Hugging Face's checkpoints. */
#include "nn/internal.h"

em_block *em_block_new(em_device *dev, em_scalar dtype, const em_block_config *cfg, em_rng *rng)
{
    if (!cfg) {
        em_set_error(EM_ERR_INVALID, "em_block_new: NULL config");
        return NULL;
    }
    em_block *b = (em_block *)em_module_new("Block", dev, sizeof *b);
    if (!b) return NULL;
    b->ln_1 = (em_layer_norm_mod *)em_module_add(
        &b->base, "ln_1",
        (em_module *)em_layer_norm_new(dev, dtype, cfg->dim, cfg->eps, true, cfg->bias));
    if (!b->ln_1) return nn_fail(&b->base);
    b->attn = (em_mha *)em_module_add(&b->base, "attn",
                                      (em_module *)em_mha_new(dev, dtype, cfg->dim, cfg->heads,
                                                              true, cfg->bias, cfg->p_dropout,
                                                              cfg->weight_in_out, rng));
    if (!b->attn) return nn_fail(&b->base);
    b->ln_2 = (em_layer_norm_mod *)em_module_add(
        &b->base, "ln_2",
        (em_module *)em_layer_norm_new(dev, dtype, cfg->dim, cfg->eps, true, cfg->bias));
    if (!b->ln_2) return nn_fail(&b->base);
    b->mlp = (em_mlp *)em_module_add(&b->base, "mlp",
                                     (em_module *)em_mlp_new(dev, dtype, cfg->dim, cfg->hidden,
                                                             cfg->act, cfg->bias, cfg->p_dropout,
                                                             cfg->weight_in_out, rng));
    if (!b->mlp) return nn_fail(&b->base);
    return b;
}

em_tensor *em_block_forward(em_block *b, const em_tensor *x, const em_tensor *pad_mask,
                            em_kv_cache *cache, em_rng *rng)
{
    if (!b || !x) return NULL;
    em_scope_begin();
    em_tensor *a = em_mha_forward(b->attn, em_layer_norm_forward(b->ln_1, x), pad_mask, cache, rng);
    em_tensor *h = em_add(x, em_take(a));
    em_tensor *f = em_mlp_forward(b->mlp, em_layer_norm_forward(b->ln_2, h), rng);
    em_tensor *y = em_add(em_take(h), em_take(f));
    em_scope_end(&y, 1);
    if (!y) em_error_context("em_block_forward");
    return y;
}
