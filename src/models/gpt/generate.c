/* generate.c — autoregressive generation through the KV cache: the prompt is fed once, then one
 * token at a time. Positions are absolute (learned position embeddings), so when the context is
 * full the cache is rebuilt from the last half of the context (one recomputation every
 * block_size / 2 tokens instead of one per token). Runs in eval mode with recording off. */
#include <stdlib.h>
#include <string.h>

#include "models/gpt/internal.h"

/* Feeds ids[0, n) through the cache; returns the last position's logits on the host in out
 * (vocab floats). */
static em_status feed(em_gpt *g, em_gpt_cache *cache, const int64_t *ids, int64_t n, float *out)
{
    em_status st = EM_OK;
    em_scope_begin();
    em_tensor *x = em_from_host(g->dev, EM_I64, EM_SHAPE(1, n), ids);
    em_tensor *logits = x ? em_gpt_forward(g, x, cache) : NULL;
    em_tensor *last = logits ? em_select(em_select(logits, 0, 0), 0, n - 1) : NULL;
    if (!last)
        st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_INTERNAL;
    else
        st = em_to_host(last, out, (size_t)g->cfg.vocab_size * sizeof(float));
    em_scope_end(NULL, 0);
    return st;
}

em_status em_gpt_generate(em_gpt *g, const int64_t *prompt, int64_t nprompt, int64_t max_new,
                          const em_sample_config *cfg, int64_t stop_token, em_token_fn fn,
                          void *user, int64_t *n_out)
{
    if (n_out) *n_out = 0;
    if (!g || !cfg || (!prompt && nprompt > 0))
        return em_set_error(EM_ERR_INVALID, "em_gpt_generate: NULL argument");
    if (nprompt <= 0)
        return em_set_error(EM_ERR_INVALID,
                            "em_gpt_generate: the prompt is empty (start with at least one token, "
                            "e.g. <|endoftext|>)");
    int64_t V = g->cfg.vocab_size, ctx = g->cfg.block_size;
    for (int64_t i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return em_set_error(EM_ERR_INVALID,
                                "em_gpt_generate: prompt token %lld at %lld is outside the "
                                "vocabulary of %lld",
                                (long long)prompt[i], (long long)i, (long long)V);
    if (max_new < 0) max_new = 0;
    int64_t *hist = malloc((size_t)(nprompt + max_new + 1) * sizeof *hist);
    float *logits = malloc((size_t)V * sizeof *logits);
    em_gpt_cache *cache = em_gpt_cache_new(g, 1, ctx);
    if (!hist || !logits || !cache) {
        free(hist);
        free(logits);
        em_gpt_cache_free(cache);
        return em_last_status() == EM_OK
                   ? em_set_error(EM_ERR_NOMEM, "em_gpt_generate: out of memory")
                   : em_last_status();
    }
    memcpy(hist, prompt, (size_t)nprompt * sizeof *hist);
    int64_t n = nprompt, made = 0;
    bool was_training = g->root->training;
    em_module_train(g->root, false);
    em_no_grad_begin();
    uint64_t rng = cfg->seed;
    /* The prompt: its last `ctx` tokens. */
    int64_t first = n > ctx ? n - ctx : 0;
    em_status st = feed(g, cache, hist + first, n - first, logits);
    while (st == EM_OK && made < max_new) {
        int64_t tok = em_sample_token(logits, V, hist, n, cfg, &rng);
        if (tok < 0) {
            st = em_last_status();
            break;
        }
        hist[n++] = tok;
        made++;
        bool go_on = !fn || fn(tok, user);
        if (!go_on || tok == stop_token || made == max_new) break;
        if (em_gpt_cache_len(cache) >= ctx) { /* full: rebuild from the last half */
            int64_t keep = ctx / 2 > 0 ? ctx / 2 : 1;
            em_gpt_cache_reset(cache);
            st = feed(g, cache, hist + n - keep, keep, logits);
        } else {
            st = feed(g, cache, hist + n - 1, 1, logits);
        }
    }
    em_no_grad_end();
    em_module_train(g->root, was_training);
    em_gpt_cache_free(cache);
    free(hist);
    free(logits);
    if (n_out) *n_out = made;
    if (st != EM_OK) em_error_context("em_gpt_generate");
    return st;
}
