/* trainer.c — the trainer: setting up device, data, model and optimizer, one optimizer step
 * (gradient accumulation over micro-batches, clipping, the learning-rate schedule, AdamW),
 * validation and samples. bf16 mixed precision keeps an f32 master model for the optimizer and a
 * bf16 copy for forward and backward: each step the bf16 gradients are cast to f32 onto the
 * masters, the masters are updated, and cast back into the copy.
 *
 * Data parallel (cfg.dist with an engine): the ranks start from rank 0's parameters (broadcast
 * once), each computes the gradients of its own batches, and the masters' gradients are averaged
 * over the ranks in buckets (em_dist_all_reduce_many) after the whole backward pass — the autodiff
 * has no per-parameter hook that would let a bucket leave while backward still runs. Clipping,
 * the schedule and AdamW then see the same gradients on every rank, so the parameters stay equal
 * without further communication. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/log.h"
#include "train/internal.h"

double tr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tr_path(const em_trainer *t, const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", t->out_dir, name);
}

void em_train_config_default(em_train_config *c)
{
    memset(c, 0, sizeof *c);
    em_gpt_preset("tiny", &c->model);
    c->model.vocab_size = 0;
    c->val_fraction = 0.1;
    c->batch = 16;
    c->seq = 0;
    c->grad_accum = 1;
    c->max_steps = 1000;
    c->lr = (em_lr_schedule){.kind = EM_LR_COSINE, .base = 1e-3, .min_lr = 1e-4, .warmup = 50};
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->grad_clip = 1.0;
    c->eval_every = 100;
    c->eval_batches = 10;
    c->sample_every = 500;
    c->sample_tokens = 200;
    c->ckpt_every = 500;
    c->log_every = 1;
    c->out_dir = "out";
    c->seed = 1337;
}

/* True for a device that is the CPU seen through OpenCL (PoCL) or Vulkan (lavapipe). */
static bool emulated(em_device *d)
{
    const char *n = em_device_caps(d)->device_name;
    return strstr(n, "llvmpipe") || strstr(n, "lavapipe") || strstr(n, "SwiftShader") ||
           strstr(n, "pthread") || strstr(n, "cpu") || strstr(n, "CPU") || strstr(n, "pocl");
}

em_device *em_train_best_device(void)
{
    static const char *const order[] = {"cuda:0", "vulkan:0", "opencl:0"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        em_device *d = em_device_open(order[i]);
        if (!d) continue;
        if (i == 0 || !emulated(d)) {
            em_clear_error();
            return d;
        }
        em_device_close(d);
    }
    em_clear_error();
    return em_device_open("cpu");
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Pairs each f32 master parameter with the bf16 copy's parameter of the same name. */
typedef struct pair_ctx {
    em_trainer *t;
    em_module *compute;
    em_status st;
} pair_ctx;

static bool add_pair(const char *name, em_module_entry *e, void *user)
{
    pair_ctx *c = user;
    if (!e->is_param) return true;
    em_module_entry *o = em_module_find(c->compute, name);
    if (!o) {
        c->st = em_set_error(EM_ERR_INTERNAL, "bf16 copy lacks %s", name);
        return false;
    }
    c->t->pairs[c->t->npairs++] = (tr_pair){e->t, o->t};
    return true;
}

/* master -> compute (cast to bf16). */
em_status tr_sync_compute(em_trainer *t)
{
    em_status st = EM_OK;
    em_no_grad_begin();
    for (int i = 0; st == EM_OK && i < t->npairs; i++) {
        em_tensor *c = em_cast(t->pairs[i].master, em_dtype(t->pairs[i].compute));
        st = c ? em_copy_(t->pairs[i].compute, c) : em_last_status();
        em_release(c);
    }
    em_no_grad_end();
    return st;
}

static bool count_param(const char *name, em_module_entry *e, void *user)
{
    (void)name;
    if (e->is_param) ++*(int64_t *)user;
    return true;
}

/* bf16 mode with one optimizer over every parameter: the optimizer's step writes each bf16
 * compute copy as it updates the master (in the fused Adam kernel's launch), so the step needs
 * no separate master -> compute pass. ZeRO-1 shards keep the pass: other ranks' updates arrive
 * in the masters after the step. */
static em_status setup_mirrors(em_trainer *t)
{
    const char *env = getenv("EMBER_TRAIN_MIRRORS"); /* 0: the separate pass (measurements) */
    if (t->clip || (env && !strcmp(env, "0"))) return EM_OK;
    for (int i = 0; i < t->npairs; i++) {
        em_status st = em_optimizer_set_mirror(t->opt, t->pairs[i].master, t->pairs[i].compute);
        if (st != EM_OK) {
            for (int j = 0; j < i; j++) em_optimizer_set_mirror(t->opt, t->pairs[j].master, NULL);
            em_clear_error();
            return EM_OK; /* the copy pass stays */
        }
    }
    t->mirrored = true;
    return EM_OK;
}

/* Names master's optimizer slot (if it has one) as t's gradient destination (em_set_grad_into):
 * t is master itself, or its bf16 compute copy. */
static void grad_into_slot(em_optimizer *o, const em_tensor *master, em_tensor *t)
{
    em_tensor *slot = em_optimizer_grad_slot(o, master);
    if (slot && em_set_grad_into(t, slot) != EM_OK) em_clear_error(); /* not this one */
}

/* em_module_visit: f32 mode's parameter e takes its slot (user: the optimizer). */
static bool param_grad_into_slot(const char *name, em_module_entry *e, void *user)
{
    (void)name;
    if (e->is_param) grad_into_slot(user, e->t, e->t);
    return true;
}

/* One optimizer over every parameter on one device: its flat storage (em_optimizer_flatten), so
 * that the norm, the clip and AdamW take a launch per region instead of one per parameter; bf16
 * mode writes the compute copy's gradients into the slots (tr_grads_to_master). Where it cannot
 * (a shared parameter, ...) the step stays per parameter; EMBER_TRAIN_FLAT=0 keeps it so for
 * comparisons. */
static void setup_flat(em_trainer *t)
{
    const char *env = getenv("EMBER_TRAIN_FLAT");
    if (t->clip || t->collective || t->world > 1 || (env && !strcmp(env, "0"))) return;
    /* bf16 mode: the slots take the compute copy's gradients as they are (cast as read) */
    em_scalar gd = t->npairs > 0 ? em_dtype(t->pairs[0].compute) : EM_F32;
    if (em_optimizer_flatten(t->opt, gd) != EM_OK) {
        EM_LOGI("training: the optimizer steps per parameter (%s)", em_last_error());
        em_clear_error();
        return;
    }
    /* the ops that can (the bias and norm gradients' column sums) write the compute copy's
     * gradients straight into their slots (em_set_grad_into), which saves a copy launch each;
     * EMBER_GRAD_INTO=0 leaves every gradient in its own tensor (A/B) */
    const char *into = getenv("EMBER_GRAD_INTO");
    if (into && !strcmp(into, "0")) return;
    for (int i = 0; i < t->npairs; i++)
        grad_into_slot(t->opt, t->pairs[i].master, t->pairs[i].compute);
    /* f32 mode: the parameters' own gradients (the optimizer's gather then skips them) */
    if (t->npairs == 0) em_module_visit(em_gpt_module(t->master), param_grad_into_slot, t->opt);
}

static em_status setup_bf16(em_trainer *t)
{
    t->compute = em_gpt_new(t->dev, EM_BF16, em_gpt_config_of(t->master), t->cfg.seed);
    if (!t->compute) return em_last_status();
    int64_t n = 0;
    em_module_visit(em_gpt_module(t->master), count_param, &n);
    t->pairs = calloc((size_t)n, sizeof *t->pairs);
    if (!t->pairs) return em_set_error(EM_ERR_NOMEM, "out of memory");
    pair_ctx c = {t, em_gpt_module(t->compute), EM_OK};
    em_module_visit(em_gpt_module(t->master), add_pair, &c);
    if (c.st != EM_OK) return c.st;
    *em_gpt_rng(t->compute) = *em_gpt_rng(t->master);
    return tr_sync_compute(t);
}

/* The device of this rank: --device as given, except that "cuda" (and "auto" when it finds
 * CUDA) means cuda:<local rank> when several ranks share a host. */
static em_device *open_device(em_trainer *t, const char *name)
{
    int local = em_dist_local_rank(t->dist);
    char buf[32];
    if (name && strcmp(name, "cuda") == 0) {
        snprintf(buf, sizeof buf, "cuda:%d", local);
        return em_device_open(buf);
    }
    if (name && *name && strcmp(name, "auto") != 0) return em_device_open(name);
    em_device *d = em_train_best_device();
    if (d && local > 0 && strcmp(em_device_name(d), "cuda:0") == 0) {
        em_device_close(d);
        snprintf(buf, sizeof buf, "cuda:%d", local);
        d = em_device_open(buf);
    }
    return d;
}

em_trainer *em_trainer_new(const em_train_config *cfg)
{
    if (!cfg) {
        em_set_error(EM_ERR_INVALID, "em_trainer_new: no config");
        return NULL;
    }
    em_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        em_set_error(EM_ERR_NOMEM, "em_trainer_new: out of memory");
        return NULL;
    }
    t->cfg = *cfg;
    t->dist = cfg->dist;
    t->rank = em_dist_rank(t->dist);
    t->world = em_dist_world(t->dist);
    t->data = dup_or_null(cfg->data);
    t->val_data = dup_or_null(cfg->val_data);
    t->tokenizer_name = dup_or_null(cfg->tokenizer);
    t->init_from = dup_or_null(cfg->init_from);
    t->out_dir = strdup(cfg->out_dir ? cfg->out_dir : "out");
    em_train_config *c = &t->cfg;
    em_status st = EM_OK;
    if (c->batch <= 0 || c->grad_accum <= 0 || c->max_steps < 0 || c->seq < 0)
        st = em_set_error(EM_ERR_INVALID,
                          "batch (%d) and grad_accum (%d) must be positive, max_steps (%lld) and "
                          "seq (%d) not negative",
                          c->batch, c->grad_accum, (long long)c->max_steps, c->seq);
    if (st == EM_OK && c->eval_batches <= 0) c->eval_batches = 1;
    if (st == EM_OK && c->log_every <= 0) c->log_every = 1;
    if (st == EM_OK) {
        tr_path(t, "ckpt.safetensors", t->ckpt_path, sizeof t->ckpt_path);
        if (c->resume && !em_file_exists(t->ckpt_path))
            st =
                em_set_error(EM_ERR_NOT_FOUND, "--resume: there is no checkpoint %s", t->ckpt_path);
    }
    /* The model's sizes first (seq needs block_size), from the checkpoint when there is one. */
    if (st == EM_OK) st = em_mkdir_p(t->out_dir);
    if (st == EM_OK) {
        t->dev = open_device(t, c->device);
        if (!t->dev) st = em_last_status();
    }
    if (st == EM_OK) {
        st = em_dist_use_device(t->dist, t->dev);
        t->collective = strcmp(em_dist_engine(t->dist), "none") != 0;
    }
    const char *from = c->resume ? t->ckpt_path : t->init_from;
    if (st == EM_OK && from) {
        t->master = em_gpt_load(from, t->dev, EM_F32);
        if (!t->master)
            st = em_last_status();
        else
            c->model = *em_gpt_config_of(t->master);
    }
    if (st == EM_OK) {
        if (c->seq == 0) c->seq = (int)c->model.block_size;
        if (c->seq > c->model.block_size)
            st = em_set_error(EM_ERR_INVALID, "seq %d exceeds the model's block_size %lld", c->seq,
                              (long long)c->model.block_size);
    }
    if (st == EM_OK) st = tr_open_data(t);
    if (st == EM_OK && !t->master) {
        if (t->tok && c->model.vocab_size < (int64_t)em_tok_vocab_size(t->tok))
            c->model.vocab_size = em_tok_vocab_size(t->tok);
        if (c->model.vocab_size <= 0)
            st = em_set_error(EM_ERR_INVALID, "the vocabulary size is unknown: the data has no "
                                              "tokenizer.json; give --tokenizer or --vocab-size");
        if (st == EM_OK) {
            t->master = em_gpt_new(t->dev, EM_F32, &c->model, c->seed);
            if (!t->master) st = em_last_status();
        }
    }
    if (st == EM_OK && t->tok && em_tok_vocab_size(t->tok) > c->model.vocab_size)
        st = em_set_error(EM_ERR_INVALID, "the tokenizer has %u ids but the model only %lld",
                          em_tok_vocab_size(t->tok), (long long)c->model.vocab_size);
    if (st == EM_OK) st = tr_dist_params(t);
    if (st == EM_OK) {
        em_adam_config ac = {c->lr.base, c->beta1, c->beta2, c->eps, c->weight_decay, true};
        st = tr_dist_optimizer(t, &ac);
    }
    if (st == EM_OK && c->resume) st = tr_resume(t, t->ckpt_path);
    if (st == EM_OK) st = tr_dist_start(t);
    if (st == EM_OK) {
        t->compute = t->master;
        if (c->bf16) st = setup_bf16(t);
        if (st == EM_OK && c->bf16) st = setup_mirrors(t);
        if (st == EM_OK) setup_flat(t);
    }
    if (st == EM_OK) {
        size_t n = (size_t)c->batch * (size_t)c->seq;
        t->hx = malloc(n * sizeof *t->hx);
        t->hy = malloc(n * sizeof *t->hy);
        if (!t->hx || !t->hy) st = em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    if (st != EM_OK) {
        em_trainer_free(t);
        return NULL;
    }
    em_module_train(em_gpt_module(t->compute), true);
    return t;
}

void em_trainer_free(em_trainer *t)
{
    if (!t) return;
    char *keep = strdup(em_last_error());
    em_status kst = em_last_status();
    tr_graph_free(t); /* before the tensors and the device it holds */
    em_optimizer_free(t->opt);
    em_optimizer_free(t->clip);
    if (t->compute && t->compute != t->master) em_gpt_free(t->compute);
    em_gpt_free(t->master);
    em_loader_close(t->train);
    em_loader_close(t->val);
    em_tok_free(t->tok);
    if (t->dev) em_device_close(t->dev);
    free(t->pairs);
    tr_dist_free(t);
    free(t->hx);
    free(t->hy);
    free(t->data);
    free(t->val_data);
    free(t->tokenizer_name);
    free(t->init_from);
    free(t->out_dir);
    free(t);
    if (kst != EM_OK && keep) em_set_error(kst, "%s", keep);
    free(keep);
}

em_gpt *em_trainer_model(em_trainer *t)
{
    return t ? t->master : NULL;
}
const em_tokenizer *em_trainer_tokenizer(em_trainer *t)
{
    return t ? t->tok : NULL;
}
int64_t em_trainer_step_count(const em_trainer *t)
{
    return t ? t->step : 0;
}

void em_trainer_info(const em_trainer *t, em_train_info *out)
{
    memset(out, 0, sizeof *out);
    out->device = em_device_name(t->dev);
    out->device_desc = em_device_caps(t->dev)->device_name;
    out->model = *em_gpt_config_of(t->master);
    out->num_params = em_module_num_params(em_gpt_module(t->master));
    out->tokens_per_step = (int64_t)t->cfg.batch * t->cfg.seq * t->cfg.grad_accum * t->world;
    out->start_step = t->step;
    out->max_steps = t->cfg.max_steps;
    out->out_dir = t->out_dir;
    out->bf16 = t->cfg.bf16;
    out->world = t->world;
    out->dist_engine = em_dist_engine(t->dist);
}

/* The mean loss of the next batch of `l` on model g (host value through *loss); backward when
 * `train` (scaled by 1 / grad_accum). */
static em_status batch_loss(em_trainer *t, em_loader *l, em_gpt *g, bool train, double *loss)
{
    em_status st = em_loader_next(l, t->hx, t->hy);
    if (st != EM_OK) return st;
    em_recompute_policy policy = em_recompute_policy_get();
    if (train && t->cfg.recompute) em_set_recompute_policy(EM_RECOMPUTE_ELEMENTWISE);
    em_scope_begin();
    em_shape sh = EM_SHAPE(t->cfg.batch, t->cfg.seq);
    em_tensor *x = em_from_host(t->dev, EM_I32, sh, t->hx);
    em_tensor *y = em_from_host(t->dev, EM_I32, sh, t->hy);
    em_tensor *l_ = x && y ? em_gpt_loss(g, x, y) : NULL;
    if (!l_) st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_INTERNAL;
    if (st == EM_OK) {
        *loss = em_item(l_);
        if (!isfinite(*loss) && em_last_status() != EM_OK) st = em_last_status();
    }
    if (st == EM_OK && train) {
        em_tensor *scaled = t->cfg.grad_accum > 1 ? em_mul_scalar(l_, 1.0 / t->cfg.grad_accum) : l_;
        st = scaled ? em_backward(scaled, NULL) : em_last_status();
    }
    em_scope_end(NULL, 0);
    em_set_recompute_policy(policy);
    return st;
}

/* bf16: the compute copy's gradients, cast to f32, become the masters' gradients. */
em_status tr_grads_to_master(em_trainer *t)
{
    em_status st = EM_OK;
    em_no_grad_begin();
    /* the optimizer's flat gradient slots (setup_flat), when every pair has a gradient and a
     * slot (else the casts below, and the optimizer steps per parameter) */
    bool slots = t->npairs > 0;
    for (int i = 0; slots && i < t->npairs; i++)
        slots = em_grad(t->pairs[i].compute) && em_optimizer_grad_slot(t->opt, t->pairs[i].master);
    for (int i = 0; slots && st == EM_OK && i < t->npairs; i++) {
        /* the gradient is taken from the parameter and donated: a weight gradient whose matmul
         * has not run yet (lazy) then runs into the slot itself, with no copy (em_copy_) */
        em_tensor *g = em_retain(em_grad(t->pairs[i].compute));
        em_tensor *slot = em_optimizer_grad_slot(t->opt, t->pairs[i].master);
        em_zero_grad(t->pairs[i].compute);
        if (g == slot) { /* written there by its op (em_set_grad_into) */
            em_release(g);
            continue;
        }
        st = em_copy_(slot, em_take(g));
    }
    if (slots) {
        em_no_grad_end();
        return st == EM_OK ? em_optimizer_grads_written(t->opt) : st;
    }
    for (int i = 0; st == EM_OK && i < t->npairs; i++) {
        em_tensor *g = em_grad(t->pairs[i].compute);
        if (!g) continue;
        em_tensor *g32 = em_cast(g, EM_F32);
        st = g32 ? em_set_grad(t->pairs[i].master, g32) : em_last_status();
        em_release(g32);
        em_zero_grad(t->pairs[i].compute);
    }
    em_no_grad_end();
    return st;
}

int64_t tr_schedule_steps(const em_trainer *t, double now)
{
    int64_t total = t->cfg.max_steps;
    if (t->budget_s <= 0 || t->first_end <= 0 || t->step <= t->first_step) return total;
    double per = (now - t->first_end) / (double)(t->step - t->first_step);
    double left = t->budget_s - (now - t->run_t0);
    double est = (double)t->step + (per > 0 ? fmax(left, 0) / per : INFINITY);
    if (est < (double)total) total = (int64_t)ceil(est);
    return total > t->step ? total : t->step + 1;
}

/* The eager step at learning rate lr: its mean loss (over the ranks) and gradient norm. */
static em_status eager_step(em_trainer *t, double lr, double *loss, double *norm)
{
    double sum = 0;
    em_status st = EM_OK;
    for (int i = 0; st == EM_OK && i < t->cfg.grad_accum; i++) {
        double l = 0;
        st = batch_loss(t, t->train, t->compute, true, &l);
        sum += l;
    }
    if (st == EM_OK && t->compute != t->master) st = tr_grads_to_master(t);
    if (st == EM_OK && t->collective) st = tr_dist_grads(t);
    *loss = sum / t->cfg.grad_accum;
    if (st == EM_OK) st = em_dist_all_reduce_host(t->dist, loss, 1, EM_F64, EM_DIST_MEAN);
    /* ZeRO-1: this rank's optimizer holds a shard; the norm and the clip are the whole model's */
    em_optimizer *all = t->clip ? t->clip : t->opt;
    if (st == EM_OK)
        st = em_clip_grad_norm(all, t->cfg.grad_clip > 0 ? t->cfg.grad_clip : INFINITY, norm);
    /* A non-finite gradient (an overflow, a bad batch) skips the update, as loss scalers do;
     * the step is still counted and its norm reported as what it was. */
    if (st == EM_OK && isfinite(*norm)) {
        em_optimizer_set_lr(t->opt, lr);
        st = em_optimizer_step(t->opt);
        if (st == EM_OK && t->clip) st = tr_dist_share_update(t);
    }
    em_optimizer_zero_grad(all);
    if (st == EM_OK && t->compute != t->master && !t->mirrored) st = tr_sync_compute(t);
    if (st == EM_OK) st = em_flush(); /* the update's fused kernels run inside the step's time */
    if (st == EM_OK) st = em_device_sync(t->dev);
    return st;
}

em_status em_trainer_step(em_trainer *t, em_train_metrics *m)
{
    double t0 = tr_now(), loss = NAN, norm = NAN;
    em_status st = EM_OK;
    em_module_train(em_gpt_module(t->compute), true);
    em_lr_schedule s = t->cfg.lr;
    int64_t span = tr_schedule_steps(t, t0);
    /* the ranks' clocks differ: all take rank 0's estimate, so their learning rates agree */
    if (t->budget_s > 0 && t->world > 1)
        st = em_dist_broadcast_host(t->dist, &span, sizeof span, 0);
    if (s.total_steps <= 0) s.total_steps = span;
    double lr = em_lr_at(&s, t->step);
    bool done = false;
    if (st == EM_OK && tr_graph_wanted(t)) st = tr_graph_step(t, lr, &loss, &norm, &done);
    if (st == EM_OK && !done) st = eager_step(t, lr, &loss, &norm);
    if (st != EM_OK) return em_error_context("training step %lld", (long long)t->step + 1);
    t->step++;
    if (t->budget_s > 0 && t->first_end <= 0) {
        t->first_end = tr_now();
        t->first_step = t->step;
    }
    int64_t ntok = (int64_t)t->cfg.batch * t->cfg.seq * t->cfg.grad_accum * t->world;
    t->tokens += ntok;
    double dt = tr_now() - t0;
    if (m) {
        memset(m, 0, sizeof *m);
        m->step = t->step;
        m->max_steps = span; /* with a time budget: the steps expected to fit in it */
        m->loss = loss;
        m->val_loss = NAN;
        m->lr = lr;
        m->grad_norm = norm;
        m->step_ms = dt * 1e3;
        m->tokens_per_s = dt > 0 ? ntok / dt : 0;
        m->tokens = t->tokens;
        em_pool_stats ps;
        em_device_pool_stats(t->dev, &ps);
        m->mem_in_use = ps.bytes_in_use;
        m->mem_peak = ps.peak_in_use;
        m->mem_total = em_device_caps(t->dev)->memory_total;
        m->eta_s = m->elapsed_s = NAN;
    }
    return EM_OK;
}

em_status em_trainer_eval(em_trainer *t, double *val_loss)
{
    *val_loss = NAN;
    if (!t->val) return em_set_error(EM_ERR_NOT_FOUND, "no validation data");
    em_loader_pos zero = {0, 0};
    em_status st = em_loader_seek(t->val, zero);
    uint64_t nb = em_loader_batches_per_epoch(t->val);
    int n = t->cfg.eval_batches;
    if (nb > 0 && (uint64_t)n > nb) n = (int)nb;
    em_module *m = em_gpt_module(t->compute);
    em_module_train(m, false);
    em_no_grad_begin();
    double sum = 0;
    for (int i = 0; st == EM_OK && i < n; i++) {
        double l = 0;
        st = batch_loss(t, t->val, t->compute, false, &l);
        sum += l;
    }
    em_no_grad_end();
    em_module_train(m, true);
    double mean = sum / n;
    if (st == EM_OK) st = em_dist_all_reduce_host(t->dist, &mean, 1, EM_F64, EM_DIST_MEAN);
    if (st == EM_OK) *val_loss = mean;
    return st;
}

typedef struct collect {
    uint32_t *ids; /* generated ids */
    int n, cap;
} collect;

static bool collect_token(int64_t tok, void *user)
{
    collect *c = user;
    if (c->n < c->cap) c->ids[c->n++] = (uint32_t)tok;
    return c->n < c->cap;
}

char *em_trainer_sample(em_trainer *t, int n, uint64_t seed)
{
    if (!t->tok) {
        em_set_error(EM_ERR_UNSUPPORTED, "no tokenizer: cannot decode a sample");
        return NULL;
    }
    int64_t start = em_tok_eot(t->tok);
    if (start < 0) {
        em_tokens nl = {0};
        if (em_tok_encode(t->tok, "\n", 1, false, &nl) == EM_OK && nl.len > 0) start = nl.ids[0];
        em_tokens_free(&nl);
    }
    if (start < 0) start = 0;
    collect c = {malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t)), 0, n};
    if (!c.ids) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    em_sample_config sc = {
        .temperature = 0.8, .top_k = 0, .top_p = 1.0, .repetition_penalty = 1.0, .seed = seed};
    em_status st = em_gpt_generate(t->compute, &start, 1, n, &sc, -1, collect_token, &c, NULL);
    char *text = NULL;
    size_t len;
    if (st == EM_OK && em_tok_decode(t->tok, c.ids, (size_t)c.n, &text, &len) != EM_OK) text = NULL;
    free(c.ids);
    return text;
}
