/* parallel.c — the trainer's data-parallel parts (ember/dist.h, docs/distributed.md): the list of
 * master parameters, rank 0's parameters on every rank at the start, the gradient all-reduce, and
 * ZeRO-1 (optimizer state sharded over the ranks). In one process (no communicator, or one
 * without an engine) every function here leaves the trainer as it would be without them.
 *
 * Gradients are averaged after the whole backward pass, in buckets (em_dist_all_reduce_many):
 * the autodiff has no per-parameter hook that would let a bucket leave while backward still runs,
 * so communication does not overlap computation.
 *
 * ZeRO-1: each parameter has an owner rank (greedy by size, so the shares are about equal); the
 * owner's AdamW holds its moments and updates it, then broadcasts it. Gradients are still
 * averaged in full on every rank (an all-reduce, not a reduce-scatter), so the norm and the clip
 * are computed by t->clip, an optimizer over every parameter that is never stepped — the same
 * numbers as without ZeRO-1, and the same checkpoint: the moments are gathered to rank 0 when it
 * saves. The gather broadcasts each moment from its owner to every rank (simple, N times the
 * traffic of a gather; checkpoints are rare). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"

/* AdamW's state per parameter (src/optim/adam.c names them so). */
static const char *const ADAM_STATE[] = {"exp_avg", "exp_avg_sq"};

typedef struct plist {
    em_trainer *t;
    int cap; /* entries allocated */
    em_status st;
} plist;

static bool count(const char *name, em_module_entry *e, void *user)
{
    (void)name;
    if (e->is_param) ((plist *)user)->cap++;
    return true;
}

static bool add(const char *name, em_module_entry *e, void *user)
{
    plist *l = user;
    em_trainer *t = l->t;
    if (!e->is_param) return true;
    for (int i = 0; i < t->nparams; i++)
        if (t->params[i] == e->t) return true; /* a tied weight, visited under two names */
    char *n = strdup(name);
    if (!n) {
        l->st = em_set_error(EM_ERR_NOMEM, "out of memory");
        return false;
    }
    t->params[t->nparams] = e->t;
    t->param_names[t->nparams] = n;
    t->param_decay[t->nparams++] = e->decay;
    return true;
}

em_status tr_dist_params(em_trainer *t)
{
    plist l = {t, 0, EM_OK};
    em_module *m = em_gpt_module(t->master);
    em_module_visit(m, count, &l);
    size_t n = (size_t)(l.cap > 0 ? l.cap : 1);
    t->params = calloc(n, sizeof *t->params);
    t->param_names = calloc(n, sizeof *t->param_names);
    t->param_decay = calloc(n, sizeof *t->param_decay);
    t->owner = calloc(n, sizeof *t->owner);
    int64_t *load = calloc((size_t)t->world, sizeof *load);
    if (!t->params || !t->param_names || !t->param_decay || !t->owner || !load) {
        free(load);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    em_module_visit(m, add, &l);
    /* ZeRO-1 owners: each parameter to the rank with the fewest elements so far. */
    for (int i = 0; l.st == EM_OK && i < t->nparams; i++) {
        int best = 0;
        for (int r = 1; r < t->world; r++)
            if (load[r] < load[best]) best = r;
        t->owner[i] = best;
        load[best] += em_numel(t->params[i]);
    }
    free(load);
    return l.st;
}

em_status tr_dist_optimizer(em_trainer *t, const em_adam_config *ac)
{
    bool zero1 = t->cfg.zero1 && t->collective && t->world > 1;
    if (!zero1) {
        t->opt = em_adam_new(em_gpt_module(t->master), ac);
        return t->opt ? EM_OK : em_last_status();
    }
    em_param_ref *mine = calloc((size_t)(t->nparams > 0 ? t->nparams : 1), sizeof *mine);
    if (!mine) return em_set_error(EM_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < t->nparams; i++)
        if (t->owner[i] == t->rank)
            mine[k++] = (em_param_ref){t->param_names[i], t->params[i], t->param_decay[i]};
    t->opt = em_adam_new_params(mine, k, ac);
    free(mine);
    em_sgd_config none = {0};
    if (t->opt) t->clip = em_sgd_new(em_gpt_module(t->master), &none);
    return t->opt && t->clip ? EM_OK : em_last_status();
}

em_status tr_dist_start(em_trainer *t)
{
    em_status st = EM_OK;
    if (t->collective && t->world > 1)
        for (int i = 0; st == EM_OK && i < t->nparams; i++)
            st = em_dist_broadcast(t->dist, t->params[i], 0);
    em_gpt_rng(t->master)->seed += (uint64_t)t->rank; /* dropout: a stream of its own */
    return st == EM_OK ? EM_OK : em_error_context("sharing rank 0's parameters");
}

em_status tr_dist_grads(em_trainer *t)
{
    em_tensor **in = calloc((size_t)(t->nparams > 0 ? t->nparams : 1), 2 * sizeof *in);
    if (!in) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_tensor **out = in + t->nparams;
    for (int i = 0; i < t->nparams; i++) in[i] = em_grad(t->params[i]);
    double mb = t->cfg.bucket_mb > 0 ? t->cfg.bucket_mb : 25;
    em_status st = em_dist_all_reduce_many(t->dist, in, t->nparams, EM_DIST_MEAN,
                                           (size_t)(mb * 1024 * 1024), out);
    for (int i = 0; i < t->nparams; i++) {
        if (st == EM_OK && out[i]) st = em_set_grad(t->params[i], out[i]);
        em_release(out[i]);
    }
    free(in);
    return st == EM_OK ? EM_OK
                       : em_error_context("averaging the gradients over %d ranks", t->world);
}

em_status tr_dist_share_update(em_trainer *t)
{
    em_status st = EM_OK;
    for (int i = 0; st == EM_OK && i < t->nparams; i++)
        st = em_dist_broadcast(t->dist, t->params[i], t->owner[i]);
    return st == EM_OK ? EM_OK : em_error_context("ZeRO-1: sharing the updated parameters");
}

typedef struct find_ctx {
    const char *name;
    em_tensor *found;
} find_ctx;

static bool find_state(const char *name, em_tensor *s, void *user)
{
    find_ctx *c = user;
    if (strcmp(name, c->name) != 0) return true;
    c->found = s;
    return false;
}

em_status tr_dist_gather_state(em_trainer *t, em_safetensors_writer *w)
{
    em_status st = EM_OK;
    char name[1024], full[1100];
    for (int i = 0; st == EM_OK && i < t->nparams; i++)
        for (size_t k = 0; st == EM_OK && k < sizeof ADAM_STATE / sizeof ADAM_STATE[0]; k++) {
            snprintf(name, sizeof name, "%s.%s", t->param_names[i], ADAM_STATE[k]);
            int root = t->owner[i];
            find_ctx c = {name, NULL};
            if (root == t->rank) em_optimizer_state_visit(t->opt, find_state, &c);
            int32_t has = c.found != NULL; /* no state before the first step */
            st = em_dist_broadcast_host(t->dist, &has, sizeof has, root);
            if (st != EM_OK || !has) continue;
            em_scalar dt = c.found                            ? em_dtype(c.found)
                           : em_dtype(t->params[i]) == EM_F64 ? EM_F64
                                                              : EM_F32;
            em_tensor *s =
                c.found ? em_retain(c.found) : em_zeros(t->dev, dt, em_shape_of(t->params[i]));
            st = s ? em_dist_broadcast(t->dist, s, root) : em_last_status();
            snprintf(full, sizeof full, "optim.%s", name);
            if (st == EM_OK && w) st = em_safetensors_add(w, full, s);
            em_release(s);
        }
    return st == EM_OK ? EM_OK : em_error_context("ZeRO-1: gathering the optimizer state");
}

void tr_dist_free(em_trainer *t)
{
    for (int i = 0; t->param_names && i < t->nparams; i++) free(t->param_names[i]);
    free(t->param_names);
    free(t->param_decay);
    free(t->params);
    free(t->owner);
}
