/* checkpoint.c — training checkpoints: one safetensors file holding the model (as em_gpt_save
 * writes it, so `ember sample` and em_gpt_load read it), the optimizer state under
 * "optim.<param>.<state>", and the counters in metadata ("train.step", "train.optim_steps",
 * "train.tokens", "train.loader" = "epoch step", "train.rng" = "seed counter" of the dropout
 * generator). Written to a temporary file and renamed, so a crash never leaves a torn checkpoint.
 * Resuming restores all of it, so the run continues as if never interrupted. Data parallel: rank 0
 * writes (every rank holds the same model and optimizer state); every rank resumes from the file,
 * each loader at the same batch of its own share. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"

typedef struct state_ctx {
    em_safetensors_writer *w;
    em_status st;
} state_ctx;

static bool add_state(const char *name, em_tensor *t, void *user)
{
    state_ctx *c = user;
    char full[1024];
    snprintf(full, sizeof full, "optim.%s", name);
    c->st = em_safetensors_add(c->w, full, t);
    return c->st == EM_OK;
}

static em_status add_meta_i64(em_safetensors_writer *w, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return em_safetensors_add_metadata(w, key, buf);
}

em_status em_trainer_save(em_trainer *t, const char *path)
{
    if (!t) return em_set_error(EM_ERR_INVALID, "em_trainer_save: no trainer");
    bool lead = tr_lead(t);
    /* data parallel: the ranks hold the same model; rank 0 writes (with ZeRO-1 every rank sends
     * it the optimizer state of its share, so every rank takes part) */
    if (!lead && !t->clip) return EM_OK;
    if (!path) path = t->ckpt_path;
    em_safetensors_writer *w = lead ? em_safetensors_writer_new() : NULL;
    em_status st = lead && !w ? em_last_status() : EM_OK;
    if (st == EM_OK && lead) st = em_gpt_add_to_writer(t->master, w);
    if (t->clip) {
        em_status gst = tr_dist_gather_state(t, st == EM_OK ? w : NULL);
        if (st == EM_OK) st = gst;
    } else if (st == EM_OK) {
        state_ctx c = {w, EM_OK};
        em_optimizer_state_visit(t->opt, add_state, &c);
        st = c.st;
    }
    if (!lead) return st;
    if (!w) return st;
    char buf[96];
    if (st == EM_OK) st = add_meta_i64(w, "train.step", t->step);
    if (st == EM_OK) st = add_meta_i64(w, "train.optim_steps", em_optimizer_steps(t->opt));
    if (st == EM_OK) st = add_meta_i64(w, "train.tokens", t->tokens);
    if (st == EM_OK) {
        em_loader_pos p = em_loader_tell(t->train);
        snprintf(buf, sizeof buf, "%" PRIu64 " %" PRIu64, p.epoch, p.step);
        st = em_safetensors_add_metadata(w, "train.loader", buf);
    }
    if (st == EM_OK) {
        const em_rng *r = em_gpt_rng(t->compute);
        snprintf(buf, sizeof buf, "%" PRIu64 " %" PRIu64, r->seed, r->counter);
        st = em_safetensors_add_metadata(w, "train.rng", buf);
    }
    if (st == EM_OK) st = em_safetensors_write(w, path);
    em_safetensors_writer_free(w);
    if (st != EM_OK) em_error_context("saving checkpoint %s", path);
    return st;
}

static bool meta_u64(const em_safetensors *f, const char *key, int n, uint64_t *out)
{
    const char *s = em_safetensors_metadata(f, key);
    if (!s) return false;
    if (n == 1) return sscanf(s, "%" SCNu64, &out[0]) == 1;
    return sscanf(s, "%" SCNu64 " %" SCNu64, &out[0], &out[1]) == 2;
}

typedef struct lookup_ctx {
    const em_safetensors *f;
    em_device *dev;
} lookup_ctx;

static em_tensor *lookup_state(const char *name, void *user)
{
    lookup_ctx *c = user;
    char full[1024];
    snprintf(full, sizeof full, "optim.%s", name);
    return em_safetensors_load(c->f, full, c->dev, EM_F32);
}

em_status tr_resume(em_trainer *t, const char *path)
{
    em_safetensors *f = em_safetensors_open(path);
    if (!f) return em_last_status();
    uint64_t step, osteps, tokens, pos[2], rng[2];
    em_status st = EM_OK;
    if (!meta_u64(f, "train.step", 1, &step) || !meta_u64(f, "train.optim_steps", 1, &osteps) ||
        !meta_u64(f, "train.tokens", 1, &tokens) || !meta_u64(f, "train.loader", 2, pos) ||
        !meta_u64(f, "train.rng", 2, rng))
        st = em_set_error(EM_ERR_CORRUPT,
                          "%s is not a training checkpoint (no train.* metadata; a model file "
                          "can start a run with --init-from instead)",
                          path);
    if (st == EM_OK) {
        lookup_ctx c = {f, t->dev};
        em_scope_begin();
        st = em_optimizer_state_load(t->opt, lookup_state, &c, (int64_t)osteps);
        em_scope_end(NULL, 0);
    }
    if (st == EM_OK) st = em_loader_seek(t->train, (em_loader_pos){pos[0], pos[1]});
    if (st == EM_OK) {
        t->step = (int64_t)step;
        t->tokens = (int64_t)tokens;
        em_rng *r = em_gpt_rng(t->master);
        r->seed = rng[0];
        r->counter = rng[1];
    }
    em_safetensors_close(f);
    if (st != EM_OK) em_error_context("resuming from %s", path);
    return st;
}
