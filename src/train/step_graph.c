/* step_graph.c — the training step recorded once and replayed as a runtime graph (docs/graphs.md,
 * "Users"): cfg.graph or EMBER_TRAIN_GRAPH=1, one device, one process, dropout 0.
 *
 * The step's batches go to persistent input tensors (x, y: [grad_accum, B, T] i32) and its
 * losses to a persistent [grad_accum] tensor, so that every run uses the same buffers. The
 * forward and backward run with trusted indices (em_trusted_indices_begin: the loader's tokens
 * are below the vocabulary already; nothing is read back to check them), clipping and AdamW with
 * device scalars (em_optimizer_device_scalars: the learning rate, bias corrections and clip
 * coefficient come from device memory, a non-finite norm skips the update on the device). The
 * first step on this path runs eagerly (it compiles and tunes kernels and creates the optimizer
 * state), the second is recorded and launched, every later one is: write the batches and the
 * step's scalars, launch, read the losses and the norm. A recording that fails is logged once;
 * its step runs eagerly and every later step takes the plain eager path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "tensor/internal.h" /* the inputs' buffers, written in place before each run */
#include "train/internal.h"

struct tr_graph {
    em_tensor *x, *y;  /* [grad_accum, B, T] i32: the step's batches */
    em_tensor *losses; /* [grad_accum] f32: each micro-batch's mean loss */
    em_graph *g;       /* the recorded step (NULL until the second step on this path) */
    int64_t runs;      /* steps run on this path */
};

bool tr_graph_wanted(const em_trainer *t)
{
    if (t->graph_off) return false;
    if (t->cfg.graph) return true;
    const char *v = getenv("EMBER_TRAIN_GRAPH");
    return v && strcmp(v, "1") == 0;
}

/* Why this trainer cannot take the graph path, or NULL. */
static const char *unsupported(const em_trainer *t)
{
    if (t->world > 1 || t->collective || t->clip) return "data parallel runs";
    if (t->cfg.model.dropout > 0)
        return "dropout (its random seeds would be frozen in the recording)";
    return NULL;
}

void tr_graph_free(em_trainer *t)
{
    tr_graph *gs = t->graph;
    if (!gs) return;
    em_graph_free(gs->g);
    em_release(gs->x);
    em_release(gs->y);
    em_release(gs->losses);
    free(gs);
    t->graph = NULL;
}

/* Leaves the graph path for good (the plain eager step follows from the next step on). */
static void give_up(em_trainer *t)
{
    tr_graph_free(t);
    em_optimizer_device_scalars(t->opt, false);
    t->graph_off = true;
}

static em_tensor *persistent_zeros(em_device *dev, em_scalar dt, em_shape s)
{
    em_tensor *z = em_zeros(dev, dt, s);
    if (z) em_tensor_untrack(z);
    if (z && em_realize(z) != EM_OK) {
        em_release(z);
        return NULL;
    }
    return z;
}

static em_status setup(em_trainer *t)
{
    tr_graph *gs = calloc(1, sizeof *gs);
    if (!gs) return em_set_error(EM_ERR_NOMEM, "out of memory");
    t->graph = gs;
    em_shape s = EM_SHAPE(t->cfg.grad_accum, t->cfg.batch, t->cfg.seq);
    gs->x = persistent_zeros(t->dev, EM_I32, s);
    gs->y = gs->x ? persistent_zeros(t->dev, EM_I32, s) : NULL;
    gs->losses = gs->y ? persistent_zeros(t->dev, EM_F32, EM_SHAPE(t->cfg.grad_accum)) : NULL;
    if (!gs->losses) return em_last_status();
    return em_optimizer_device_scalars(t->opt, true);
}

/* Loads the step's grad_accum batches into x and y. */
/* The graph's ops take their indices on trust (clamped, never checked on the device): the ids
 * are checked here, on the host, where they come from, as the eager ops would check them. */
static em_status check_ids(const em_trainer *t, const int32_t *ids, size_t n, const char *what)
{
    int64_t V = em_gpt_config_of(t->compute)->vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return em_set_error(EM_ERR_INVALID,
                                "training batch: %s id %d at position %zu is outside the model's "
                                "vocabulary of %lld (data made with another tokenizer?)",
                                what, (int)ids[i], i, (long long)V);
    return EM_OK;
}

static em_status write_batches(em_trainer *t)
{
    tr_graph *gs = t->graph;
    size_t n = (size_t)t->cfg.batch * (size_t)t->cfg.seq, bytes = n * sizeof(int32_t);
    em_status st = EM_OK;
    for (int i = 0; st == EM_OK && i < t->cfg.grad_accum; i++) {
        st = em_loader_next(t->train, t->hx, t->hy);
        if (st == EM_OK) st = check_ids(t, t->hx, n, "input");
        if (st == EM_OK) st = check_ids(t, t->hy, n, "target");
        if (st == EM_OK)
            st = em_buffer_write(gs->x->st->buf, (size_t)gs->x->offset * 4 + i * bytes, t->hx,
                                 bytes);
        if (st == EM_OK)
            st = em_buffer_write(gs->y->st->buf, (size_t)gs->y->offset * 4 + i * bytes, t->hy,
                                 bytes);
    }
    return st;
}

/* Micro-batch i's forward and backward; its loss goes to losses[i]. */
static em_status micro_batch(em_trainer *t, int i)
{
    tr_graph *gs = t->graph;
    em_scope_begin();
    em_tensor *x = em_select(gs->x, 0, i), *y = em_select(gs->y, 0, i);
    em_tensor *l = x && y ? em_gpt_loss(t->compute, x, y) : NULL;
    em_status st = l ? EM_OK : em_last_status();
    if (st == EM_OK) {
        em_tensor *slot = em_narrow(gs->losses, 0, i, 1);
        em_tensor *l1 = em_reshape(l, EM_SHAPE(1));
        st = slot && l1 ? em_copy_(slot, l1) : em_last_status();
    }
    if (st == EM_OK) {
        em_tensor *scaled = t->cfg.grad_accum > 1 ? em_mul_scalar(l, 1.0 / t->cfg.grad_accum) : l;
        st = scaled ? em_backward(scaled, NULL) : em_last_status();
    }
    em_scope_end(NULL, 0);
    return st;
}

/* The step as it is recorded: forward and backward of every micro-batch, clipping and the update
 * with device scalars, zeroing, and for bf16 the casts between master and compute copies. */
static em_status body(em_trainer *t)
{
    em_status st = EM_OK;
    em_recompute_policy policy = em_recompute_policy_get();
    if (t->cfg.recompute) em_set_recompute_policy(EM_RECOMPUTE_ELEMENTWISE);
    em_trusted_indices_begin();
    for (int i = 0; st == EM_OK && i < t->cfg.grad_accum; i++) st = micro_batch(t, i);
    em_trusted_indices_end();
    em_set_recompute_policy(policy);
    if (st == EM_OK && t->compute != t->master) st = tr_grads_to_master(t);
    double clip = t->cfg.grad_clip > 0 ? t->cfg.grad_clip : INFINITY;
    if (st == EM_OK) st = em_clip_grad_norm_device_deferred(t->opt, clip); /* applied by the step */
    if (st == EM_OK) st = em_optimizer_step(t->opt);
    em_optimizer_zero_grad(t->opt);
    if (st == EM_OK && t->compute != t->master && !t->mirrored) st = tr_sync_compute(t);
    return st;
}

/* Records the step and launches it; false (the error cleared, the gradients dropped) when the
 * recording failed: nothing ran. */
static bool record(em_trainer *t)
{
    tr_graph *gs = t->graph;
    em_status st = em_tensor_graph_begin(t->dev);
    if (st == EM_OK) {
        em_status bst = body(t);
        em_graph *g = NULL;
        st = em_tensor_graph_end(t->dev, &g);
        if (st == EM_OK && bst != EM_OK) {
            em_graph_free(g);
            st = bst;
        } else if (st == EM_OK) {
            gs->g = g;
            st = em_tensor_graph_launch(g);
            if (st == EM_OK) return true;
            gs->g = NULL;
            em_graph_free(g);
        }
    }
    EM_LOGW("training step %lld: the step could not be recorded as a graph (%s); training "
            "continues eagerly",
            (long long)t->step + 1, em_last_error());
    em_clear_error();
    em_optimizer_zero_grad(t->opt);
    if (t->compute != t->master)
        for (int i = 0; i < t->npairs; i++) em_zero_grad(t->pairs[i].compute);
    return false;
}

em_status tr_graph_step(em_trainer *t, double lr, double *loss, double *norm, bool *done)
{
    *done = false;
    const char *why = unsupported(t);
    if (why) {
        EM_LOGW("training steps are not recorded as graphs with %s; training eagerly", why);
        t->graph_off = true;
        return EM_OK;
    }
    em_status st = t->graph ? EM_OK : setup(t);
    if (st != EM_OK) {
        EM_LOGW("training graph: %s; training eagerly", em_last_error());
        em_clear_error();
        give_up(t);
        return EM_OK;
    }
    tr_graph *gs = t->graph;
    *done = true; /* from here on this step's batches are taken: it runs on this path */
    st = write_batches(t);
    em_optimizer_set_lr(t->opt, lr);
    if (st == EM_OK) st = em_optimizer_write_scalars(t->opt);
    bool failed = false;
    if (st == EM_OK && gs->g) {
        st = em_tensor_graph_launch(gs->g);
    } else if (st == EM_OK && gs->runs > 0 && !record(t)) {
        failed = true;
        st = body(t);
    } else if (st == EM_OK && gs->runs == 0) {
        st = body(t);
    }
    if (st == EM_OK) st = em_flush();
    float host[256], *lh = t->cfg.grad_accum <= 256 ? host : malloc((size_t)t->cfg.grad_accum * 4);
    if (!lh) st = em_set_error(EM_ERR_NOMEM, "out of memory");
    if (st == EM_OK) st = em_to_host(gs->losses, lh, (size_t)t->cfg.grad_accum * 4);
    double sum = 0;
    for (int i = 0; st == EM_OK && i < t->cfg.grad_accum; i++) sum += lh[i];
    if (lh != host) free(lh);
    *loss = sum / t->cfg.grad_accum;
    if (st == EM_OK) st = em_optimizer_device_norm(t->opt, norm);
    /* a non-finite norm skipped the update on the device: Adam's step count stays */
    if (st == EM_OK && isfinite(*norm))
        em_optimizer_set_steps(t->opt, em_optimizer_steps(t->opt) + 1);
    if (st == EM_OK) st = em_device_sync(t->dev);
    gs->runs++;
    if (failed) give_up(t);
    return st;
}

bool em_trainer_graph(const em_trainer *t)
{
    return t && t->graph && t->graph->g;
}
