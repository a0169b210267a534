/* test_train.c — the training loop on the CPU: a tiny GPT on a small repeated text drives the
 * loss well below its start (and below the text's unigram entropy) in a fixed number of steps,
 * deterministically; a run stopped at a checkpoint and resumed gives exactly the losses of the
 * uninterrupted run (with dropout, gradient accumulation and shuffling, so the optimizer state,
 * data position and dropout generator must all be restored); a corrupt or missing checkpoint
 * gives a clear error; the metrics log is JSON lines; the loss curve is an SVG; bad settings are
 * refused with a message; with a time budget the learning-rate schedule spans the steps expected
 * to fit in it; the gradients written straight into the optimizer's slots give the same losses
 * with fewer copies. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/file.h"
#include "data/data_util.h"
#include "ember/runtime.h"
#include "ember/train.h"
#include "train/internal.h"

static const char TEXT[] = "the quick brown fox jumps over the lazy dog. ";

/* A text file of the sentence repeated; the path goes to out. */
static void make_text(const char *dir, char *out, size_t size, int reps)
{
    snprintf(out, size, "%s/text.txt", dir);
    size_t n = strlen(TEXT);
    char *buf = malloc(n * (size_t)reps + 1);
    for (int i = 0; i < reps; i++) memcpy(buf + i * n, TEXT, n);
    assert_int_equal(write_file(out, buf, n * (size_t)reps), 0);
    free(buf);
}

/* Unigram entropy of TEXT in nats per character. */
static double unigram_entropy(void)
{
    int counts[256] = {0};
    size_t n = strlen(TEXT);
    for (size_t i = 0; i < n; i++) counts[(unsigned char)TEXT[i]]++;
    double h = 0;
    for (int c = 0; c < 256; c++)
        if (counts[c]) h -= (double)counts[c] / n * log((double)counts[c] / n);
    return h;
}

static void small_config(em_train_config *c, const char *data, const char *out)
{
    em_train_config_default(c);
    c->model = (em_gpt_config){0, 32, 2, 2, 32, 0.0, true, true};
    c->data = data;
    c->out_dir = out;
    c->device = "cpu";
    c->batch = 8;
    c->seq = 32;
    c->max_steps = 40;
    c->lr = (em_lr_schedule){
        .kind = EM_LR_COSINE, .base = 1e-2, .min_lr = 1e-3, .warmup = 3, .total_steps = 40};
    c->eval_every = 20;
    c->eval_batches = 2;
    c->sample_every = -1;
    c->ckpt_every = 0;
    c->seed = 5;
}

/* An observer recording every step's loss. */
typedef struct record {
    double loss[256];
    int64_t step[256];
    int n;
    double val;
} record;

static void on_step(void *user, const em_train_metrics *m)
{
    record *r = user;
    if (r->n < 256) r->step[r->n] = m->step, r->loss[r->n++] = m->loss;
}

static void on_eval(void *user, int64_t step, double v)
{
    (void)step;
    ((record *)user)->val = v;
}

static em_train_observer observer(record *r)
{
    em_train_observer o = {0};
    o.step = on_step;
    o.eval = on_eval;
    o.user = r;
    return o;
}

/* An observer recording every step's learning rate and the last reported goal. */
typedef struct lr_record {
    double lr[4096];
    int n;
    int64_t goal;
} lr_record;

static void on_step_lr(void *user, const em_train_metrics *m)
{
    lr_record *r = user;
    if (r->n < 4096) r->lr[r->n++] = m->lr;
    r->goal = m->max_steps;
}

static void run_ok(em_trainer *t, const em_train_observer *o)
{
    if (em_trainer_run(t, o) != EM_OK) fail_msg("training: %s", em_last_error());
}

static void test_loss_goes_down(void **state)
{
    (void)state;
    char dir[512], text[1024], again[700];
    scratch_dir("train-down", dir, sizeof dir);
    snprintf(again, sizeof again, "%s/again", dir);
    make_text(dir, text, sizeof text, 200);
    em_train_config c;
    small_config(&c, text, dir);
    em_trainer *t = em_trainer_new(&c);
    if (!t) fail_msg("trainer: %s", em_last_error());
    record r = {{0}, {0}, 0, NAN};
    em_train_observer o = observer(&r);
    run_ok(t, &o);
    assert_int_equal(r.n, 40);
    double h = unigram_entropy(), first = r.loss[0], last = r.loss[39];
    fprintf(stderr, "[train] loss %.3f -> %.3f (validation %.3f); unigram entropy %.3f nats\n",
            first, last, r.val, h);
    /* Starts near ln(vocab) and ends far below the unigram entropy (about 0.55 nats after 40
     * steps): it learned the sequence, not just the letter frequencies. */
    int64_t V = em_gpt_config_of(em_trainer_model(t))->vocab_size;
    assert_true(fabs(first - log((double)V)) < 0.5);
    assert_true(last < 0.3 * h);
    assert_true(r.val < 0.3 * h);
    em_trainer_free(t);
    /* Deterministic: the first steps again give the same losses, bit for bit. */
    c.max_steps = 5;
    c.out_dir = again;
    t = em_trainer_new(&c);
    assert_non_null(t);
    record r2 = {{0}, {0}, 0, NAN};
    em_train_observer o2 = observer(&r2);
    run_ok(t, &o2);
    assert_memory_equal(r.loss, r2.loss, 5 * sizeof(double));
    em_trainer_free(t);
    /* The files: checkpoint, tokenizer, metrics (JSON lines), loss curve. */
    char p[1200];
    snprintf(p, sizeof p, "%s/ckpt.safetensors", dir);
    assert_true(em_file_exists(p));
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    assert_true(em_file_exists(p));
    snprintf(p, sizeof p, "%s/loss.svg", dir);
    char *svg = em_file_read(p, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "<svg"));
    assert_non_null(strstr(svg, "<polyline"));
    free(svg);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *log = em_file_read(p, NULL);
    assert_non_null(log);
    int steps = 0, vals = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("not JSON: %s", line);
        if (cJSON_GetObjectItem(j, "loss")) {
            steps++;
            assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "lr")));
            assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "tokens_per_s")));
        }
        if (cJSON_GetObjectItem(j, "val_loss")) vals++;
        cJSON_Delete(j);
    }
    free(log);
    assert_int_equal(steps, 40);
    assert_int_equal(vals, 2); /* step 20 and the end */
    remove_dir(dir);
}

/* The step's copy launches (tensor_unary) and losses of max_steps steps of c, with the gradients
 * written into the optimizer's slots (EMBER_GRAD_INTO unset) or not (=0). */
static uint64_t copies_of_run(em_train_config *c, bool into, record *r)
{
    if (into)
        unsetenv("EMBER_GRAD_INTO");
    else
        setenv("EMBER_GRAD_INTO", "0", 1);
    em_trainer *t = em_trainer_new(c);
    if (!t) fail_msg("trainer: %s", em_last_error());
    em_train_observer o = observer(r);
    em_profile_reset();
    em_profile_enable(true);
    run_ok(t, &o);
    em_profile_enable(false);
    em_profile_kernel k;
    uint64_t n = em_profile_kernel_get("tensor_unary", &k) ? k.launches : 0;
    em_trainer_free(t);
    unsetenv("EMBER_GRAD_INTO");
    return n;
}

/* Gradient destinations (em_set_grad_into): in f32 and in bf16, the biases' and norms' gradients
 * land in the optimizer's flat slots, so a step launches fewer copies, and the losses are the
 * same bit for bit as with every gradient in its own tensor. */
static void test_grads_into_slots(void **state)
{
    (void)state;
    char dir[512], text[1024];
    scratch_dir("train-into", dir, sizeof dir);
    make_text(dir, text, sizeof text, 100);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        em_train_config c;
        small_config(&c, text, dir);
        c.max_steps = 6;
        c.eval_every = 0;
        c.bf16 = bf16 == 1;
        record on = {{0}, {0}, 0, NAN}, off = {{0}, {0}, 0, NAN};
        uint64_t with = copies_of_run(&c, true, &on), without = copies_of_run(&c, false, &off);
        fprintf(stderr,
                "[train] %s: %llu copy launches with the slots as destinations, %llu without\n",
                bf16 ? "bf16" : "f32", (unsigned long long)with, (unsigned long long)without);
        /* 2 layers: 4 biases and 4 norm parameters each, and the final norm's 2, a step */
        assert_true(without >= with + 6 * 10);
        assert_int_equal(on.n, 6);
        assert_int_equal(off.n, 6);
        assert_memory_equal(on.loss, off.loss, 6 * sizeof(double));
    }
    remove_dir(dir);
}

static void test_resume_is_exact(void **state)
{
    (void)state;
    char dir[512], a[700], b[700], text[1024];
    scratch_dir("train-resume", dir, sizeof dir);
    make_text(dir, text, sizeof text, 100);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    em_train_config c;
    small_config(&c, text, a);
    c.model.dropout = 0.1;
    c.grad_accum = 2;
    c.shuffle = true;
    c.max_steps = 8;
    c.lr.total_steps = 8; /* the schedule must not depend on where the first run stops */
    c.eval_every = 0;
    /* Uninterrupted. */
    em_trainer *t = em_trainer_new(&c);
    assert_non_null(t);
    record full = {{0}, {0}, 0, NAN};
    em_train_observer o = observer(&full);
    run_ok(t, &o);
    em_trainer_free(t);
    assert_int_equal(full.n, 8);
    /* Stopped after 4 (the end of a run saves a checkpoint), then resumed to 8. */
    c.out_dir = b;
    c.max_steps = 4;
    t = em_trainer_new(&c);
    record part = {{0}, {0}, 0, NAN};
    o = observer(&part);
    run_ok(t, &o);
    em_trainer_free(t);
    c.max_steps = 8;
    c.resume = true;
    t = em_trainer_new(&c);
    if (!t) fail_msg("resume: %s", em_last_error());
    assert_int_equal(em_trainer_step_count(t), 4);
    o = observer(&part);
    run_ok(t, &o);
    em_trainer_free(t);
    assert_int_equal(part.n, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(part.step[i], i + 1);
        if (part.loss[i] != full.loss[i])
            fail_msg("step %d: resumed %.9g, uninterrupted %.9g", i + 1, part.loss[i],
                     full.loss[i]);
    }
    /* The metrics log holds each step once across the two runs. */
    char mp[800];
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", b);
    char *log = em_file_read(mp, NULL);
    assert_non_null(log);
    int nloss = 0;
    for (char *p = log; (p = strstr(p, "\"loss\"")); p++) nloss++;
    assert_int_equal(nloss, 8);
    free(log);
    /* Corrupt checkpoint: a clear error naming the file. */
    char ck[800];
    snprintf(ck, sizeof ck, "%s/ckpt.safetensors", b);
    assert_int_equal(write_file(ck, "\x10\0\0\0\0\0\0\0{\"a\": 1", 15), 0);
    assert_null(em_trainer_new(&c));
    fprintf(stderr, "[train] corrupt checkpoint: %s\n", em_last_error());
    assert_non_null(strstr(em_last_error(), "ckpt.safetensors"));
    /* No checkpoint at all. */
    remove_dir(b);
    assert_null(em_trainer_new(&c));
    assert_non_null(strstr(em_last_error(), "no checkpoint"));
    remove_dir(dir);
}

static void test_bad_settings(void **state)
{
    (void)state;
    char dir[512], text[1024];
    scratch_dir("train-bad", dir, sizeof dir);
    make_text(dir, text, sizeof text, 20);
    em_train_config c;
    small_config(&c, text, dir);
    c.seq = 64; /* > block_size 32 */
    assert_null(em_trainer_new(&c));
    assert_non_null(strstr(em_last_error(), "block_size"));
    small_config(&c, text, dir);
    c.batch = 0;
    assert_null(em_trainer_new(&c));
    assert_non_null(strstr(em_last_error(), "batch"));
    small_config(&c, "/nonexistent/text.txt", dir);
    assert_null(em_trainer_new(&c));
    assert_non_null(strstr(em_last_error(), "/nonexistent/text.txt"));
    small_config(&c, text, dir);
    c.batch = 64; /* 20 sentences are too few tokens for one batch of 64 x 32 */
    assert_null(em_trainer_new(&c));
    assert_non_null(strstr(em_last_error(), "too few"));
    remove_dir(dir);
}

/* The schedule's span with a time budget: the steps expected to fit in it, from the mean time
 * per step after the first (which compiles kernels), never more than max_steps and always past
 * the current step; max_steps without a budget or before the first step has ended. */
static void test_schedule_spans_the_time_budget(void **state)
{
    (void)state;
    char dir[512], text[1024];
    scratch_dir("train-budget", dir, sizeof dir);
    make_text(dir, text, sizeof text, 20);
    em_train_config c;
    small_config(&c, text, dir);
    c.max_steps = INT64_MAX;
    em_trainer *t = em_trainer_new(&c);
    if (!t) fail_msg("trainer: %s", em_last_error());
    assert_true(tr_schedule_steps(t, 50.0) == INT64_MAX); /* no budget */
    t->budget_s = 100;
    t->run_t0 = 1000;
    t->first_step = 1;
    t->step = 1;
    assert_true(tr_schedule_steps(t, 1010.0) == INT64_MAX);  /* the first step has not ended */
    t->first_end = 1010;                                     /* the first step took 10 s */
    assert_true(tr_schedule_steps(t, 1010.0) == INT64_MAX);  /* no step to measure yet */
    t->step = 11;                                            /* 10 steps in 10 s: 1 s a step */
    assert_int_equal(tr_schedule_steps(t, 1020.0), 11 + 80); /* 80 s left */
    t->step = 21; /* 20 steps in 30 s: 1.5 s a step, 60 s left: 40 more */
    assert_int_equal(tr_schedule_steps(t, 1040.0), 21 + 40);
    t->cfg.max_steps = 50; /* fewer steps than fit: max_steps */
    assert_int_equal(tr_schedule_steps(t, 1040.0), 50);
    t->cfg.max_steps = INT64_MAX;
    assert_int_equal(tr_schedule_steps(t, 1200.0), 22); /* out of time: the next step ends it */
    em_trainer_free(t);

    /* A run on a budget (no step limit): the learning rate falls from base toward min_lr over
     * the budget, and the reported goal is the estimate. */
    small_config(&c, text, dir);
    c.max_steps = INT64_MAX;
    c.max_time_s = 2.0;
    c.eval_every = 0;
    c.lr = (em_lr_schedule){.kind = EM_LR_COSINE, .base = 1e-2, .min_lr = 1e-4, .warmup = 0};
    t = em_trainer_new(&c);
    if (!t) fail_msg("trainer: %s", em_last_error());
    lr_record r = {0};
    em_train_observer o = {0};
    o.step = on_step_lr;
    o.user = &r;
    run_ok(t, &o);
    fprintf(stderr, "[train] %d steps in 2 s: lr %.2e -> %.2e, goal %lld\n", r.n, r.lr[0],
            r.lr[r.n - 1], (long long)r.goal);
    assert_true(r.n >= 4);
    assert_true(r.lr[0] == 1e-2);
    assert_true(r.lr[r.n - 1] < 0.3e-2);
    assert_true(r.goal < INT64_MAX && r.goal >= r.n);
    em_trainer_free(t);
    remove_dir(dir);
}

static void test_plot(void **state)
{
    (void)state;
    char dir[512], p[700];
    scratch_dir("train-plot", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/x.svg", dir);
    double s[3] = {1, 2, 3}, l[3] = {3.0, 2.0, 1.5}, vs[1] = {3}, vl[1] = {1.7};
    assert_int_equal(em_train_plot_svg(p, s, l, 3, vs, vl, 1, "a <title>"), EM_OK);
    char *svg = em_file_read(p, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "a &lt;title&gt;"));
    assert_non_null(strstr(svg, "validation"));
    assert_non_null(strstr(svg, "</svg>"));
    free(svg);
    assert_int_equal(em_train_plot_svg(p, NULL, NULL, 0, NULL, NULL, 0, NULL), EM_OK);
    assert_int_not_equal(em_train_plot_svg(p, NULL, l, 3, NULL, NULL, 0, NULL), EM_OK);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot),
        cmocka_unit_test(test_bad_settings),
        cmocka_unit_test(test_loss_goes_down),
        cmocka_unit_test(test_resume_is_exact),
        cmocka_unit_test(test_grads_into_slots),
        cmocka_unit_test(test_schedule_spans_the_time_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
