/* loop.c — the training run: steps until max_steps (or the time limit, or the observer asks to
 * stop), with the metrics log (out_dir/metrics.jsonl, one JSON object per line), validation,
 * samples and checkpoints every N steps, and at the end a last validation, a checkpoint and the
 * loss curve (out_dir/loss.svg, drawn from the whole metrics log so a resumed run's curve is
 * complete).
 *
 * Data parallel: every rank runs the loop (steps and validations hold collectives); rank 0 alone
 * writes the log, the samples, the checkpoints and the plot and talks to the observer. Whether to
 * stop (the observer asking, the time limit) is rank 0's decision, shared with the others at each
 * step so that all ranks leave the loop together. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/strbuf.h"
#include "train/internal.h"

typedef struct run {
    em_trainer *t;
    const em_train_observer *obs;
    FILE *log;     /* metrics.jsonl */
    double t0;     /* start of this run */
    int64_t step0; /* step at the start (resume) */
} run;

static void note(run *r, const char *fmt, const char *arg)
{
    char buf[4200];
    snprintf(buf, sizeof buf, fmt, arg);
    if (r->obs && r->obs->message) r->obs->message(r->obs->user, buf);
}

/* A JSON number, or null for NaN / infinity. */
static void num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ", \"%s\": %.6g", key, v);
    else
        fprintf(f, ", \"%s\": null", key);
}

static void log_step(run *r, const em_train_metrics *m)
{
    if (!r->log) return;
    fprintf(r->log, "{\"step\": %lld", (long long)m->step);
    num(r->log, "loss", m->loss);
    num(r->log, "lr", m->lr);
    num(r->log, "grad_norm", m->grad_norm);
    num(r->log, "tokens_per_s", m->tokens_per_s);
    num(r->log, "step_ms", m->step_ms);
    num(r->log, "elapsed_s", m->elapsed_s);
    fprintf(r->log, ", \"tokens\": %lld}\n", (long long)m->tokens);
    fflush(r->log);
}

static em_status do_eval(run *r, em_train_metrics *m)
{
    double v;
    em_status st = em_trainer_eval(r->t, &v);
    if (st != EM_OK) return st;
    if (m) m->val_loss = v;
    if (r->log) {
        fprintf(r->log, "{\"step\": %lld", (long long)r->t->step);
        num(r->log, "val_loss", v);
        fprintf(r->log, "}\n");
        fflush(r->log);
    }
    if (r->obs && r->obs->eval) r->obs->eval(r->obs->user, r->t->step, v);
    return EM_OK;
}

static void do_sample(run *r)
{
    char *text =
        em_trainer_sample(r->t, r->t->cfg.sample_tokens, r->t->cfg.seed + (uint64_t)r->t->step);
    if (!text) {
        note(r, "sample failed: %s", em_last_error());
        em_clear_error();
        return;
    }
    if (r->log) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)r->t->step);
        cJSON_AddStringToObject(o, "sample", text);
        char *s = cJSON_PrintUnformatted(o);
        if (s) fprintf(r->log, "%s\n", s);
        fflush(r->log);
        free(s);
        cJSON_Delete(o);
    }
    if (r->obs && r->obs->sample) r->obs->sample(r->obs->user, r->t->step, text);
    free(text);
}

static em_status do_save(run *r)
{
    em_status st = em_trainer_save(r->t, NULL);
    if (st == EM_OK) note(r, "checkpoint %s", r->t->ckpt_path);
    return st;
}

typedef struct series {
    double *x, *y;
    int64_t n, cap;
} series;

static void push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (nx) s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (ny) s->y = ny;
        if (!nx || !ny) return;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

/* The loss curve from the metrics log. */
static em_status plot(run *r)
{
    char path[4096], svg[4096];
    tr_path(r->t, "metrics.jsonl", path, sizeof path);
    tr_path(r->t, "loss.svg", svg, sizeof svg);
    size_t len;
    char *text = em_file_read(path, &len);
    if (!text) return em_last_status();
    series tr = {0}, va = {0};
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
        cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
        cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "val_loss");
        if (cJSON_IsNumber(step) && cJSON_IsNumber(loss))
            push(&tr, step->valuedouble, loss->valuedouble);
        if (cJSON_IsNumber(step) && cJSON_IsNumber(val))
            push(&va, step->valuedouble, val->valuedouble);
        cJSON_Delete(o);
    }
    free(text);
    char title[160];
    const em_gpt_config *c = em_gpt_config_of(r->t->master);
    snprintf(title, sizeof title, "GPT %lld layers x %lld wide, %lld heads, context %lld",
             (long long)c->n_layer, (long long)c->n_embd, (long long)c->n_head,
             (long long)c->block_size);
    em_status st = em_train_plot_svg(svg, tr.x, tr.y, tr.n, va.x, va.y, va.n, title);
    free(tr.x), free(tr.y), free(va.x), free(va.y);
    if (st == EM_OK) note(r, "loss curve %s", svg);
    return st;
}

/* Resuming: drops the log lines of steps after the checkpoint (a run killed after its last
 * checkpoint logged steps that will be done again). */
static void trim_log(const char *path, int64_t step)
{
    size_t len;
    char *text = em_file_exists(path) ? em_file_read(path, &len) : NULL;
    if (!text) {
        em_clear_error();
        return;
    }
    em_strbuf keep;
    em_sb_init(&keep);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
        if (cJSON_IsNumber(s) && s->valuedouble <= (double)step) {
            em_sb_append(&keep, line);
            em_sb_appendc(&keep, '\n');
        }
        cJSON_Delete(o);
    }
    free(text);
    if (!keep.oom) em_file_write_atomic(path, keep.data, keep.len);
    em_sb_free(&keep);
}

/* Rank 0's reason to stop before the next step (0: none, 1: the observer, 2: the time limit),
 * agreed by every rank. */
static em_status stop_reason(run *r, int32_t *why)
{
    *why = 0;
    if (tr_lead(r->t)) {
        if (r->obs && r->obs->should_stop && r->obs->should_stop(r->obs->user))
            *why = 1;
        else if (r->t->cfg.max_time_s > 0 && tr_now() - r->t0 >= r->t->cfg.max_time_s)
            *why = 2;
    }
    return em_dist_all_reduce_host(r->t->dist, why, 1, EM_I32, EM_DIST_MAX);
}

em_status em_trainer_run(em_trainer *t, const em_train_observer *obs)
{
    if (!t) return em_set_error(EM_ERR_INVALID, "em_trainer_run: no trainer");
    if (!tr_lead(t)) obs = NULL; /* rank 0 reports */
    run r = {t, obs, NULL, tr_now(), t->step};
    t->budget_s = t->cfg.max_time_s > 0 ? t->cfg.max_time_s : 0; /* the schedule spans it */
    t->run_t0 = r.t0;
    t->first_end = 0;
    t->first_step = t->step;
    char path[4096];
    tr_path(t, "metrics.jsonl", path, sizeof path);
    if (tr_lead(t)) {
        if (t->cfg.resume) trim_log(path, t->step);
        r.log = fopen(path, t->cfg.resume ? "a" : "w");
        if (!r.log) return em_set_error(EM_ERR_IO, "cannot write %s", path);
    }
    em_train_info info;
    em_trainer_info(t, &info);
    if (obs && obs->begin) obs->begin(obs->user, &info);
    const em_train_config *c = &t->cfg;
    em_train_metrics m = {0};
    m.val_loss = NAN;
    em_status st = EM_OK;
    bool stopped = false;
    while (st == EM_OK && t->step < c->max_steps) {
        int32_t why = 0;
        st = stop_reason(&r, &why);
        if (st != EM_OK) break;
        if (why == 1) {
            stopped = true;
            break;
        }
        if (why == 2) {
            note(&r, "%s", "time limit reached");
            break;
        }
        st = em_trainer_step(t, &m);
        if (st != EM_OK) break;
        m.elapsed_s = tr_now() - r.t0;
        double per = m.elapsed_s / (double)(t->step - r.step0);
        m.eta_s = per * (double)(c->max_steps - t->step);
        if (c->max_time_s > 0 && c->max_time_s - m.elapsed_s < m.eta_s)
            m.eta_s = fmax(0, c->max_time_s - m.elapsed_s);
        log_step(&r, &m);
        bool last = t->step >= c->max_steps;
        if (!last && c->eval_every > 0 && t->step % c->eval_every == 0 && t->val)
            st = do_eval(&r, &m);
        if (st == EM_OK && (t->step % c->log_every == 0 || t->step == r.step0 + 1 || last) && obs &&
            obs->step)
            obs->step(obs->user, &m);
        m.val_loss = NAN;
        if (st == EM_OK && !last && c->sample_every > 0 && t->step % c->sample_every == 0 &&
            tr_lead(t))
            do_sample(&r);
        if (st == EM_OK && !last && c->ckpt_every > 0 && t->step % c->ckpt_every == 0)
            st = do_save(&r);
    }
    if (st == EM_OK && t->val && t->step > r.step0) st = do_eval(&r, &m);
    if (st == EM_OK && c->sample_every >= 0 && t->step > r.step0 && tr_lead(t)) do_sample(&r);
    if (st == EM_OK) st = do_save(&r);
    if (r.log) fclose(r.log);
    if (st == EM_OK && tr_lead(t)) st = plot(&r);
    if (stopped) note(&r, "%s", "stopped early");
    if (obs && obs->end) obs->end(obs->user, &m);
    return st;
}
