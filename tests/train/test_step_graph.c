/* test_step_graph.c — the training step as a recorded graph (src/train/step_graph.c) against the
 * eager step, on the CPU (and PoCL and lavapipe when present): a tiny GPT trained 6 steps from
 * the same init and data both ways gives the same losses, gradient norms and final parameters
 * (bit for bit on devices that add the norm in f64, within 1e-5 relative otherwise), with
 * gradient accumulation, bf16 mixed precision and a validation between steps; from the third
 * step a step makes no em_launch call (the replay issues the recorded calls itself; em_launch is
 * wrapped at link time, tests/CMakeLists.txt); a parameter made NaN before a replayed step gives
 * a non-finite norm and a skipped update, as the eager step does; with dropout the graph path
 * is declined and training is eager. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data/data_util.h"
#include "ember/autodiff.h"
#include "ember/train.h"
#include "train/internal.h"

static int g_launches; /* em_launch calls since the last reset */

em_status __real_em_launch(em_kernel *kernel, const uint32_t cube_count[3],
                           const uint32_t cube_dim[3], const em_arg *args, size_t nargs);
em_status __wrap_em_launch(em_kernel *kernel, const uint32_t cube_count[3],
                           const uint32_t cube_dim[3], const em_arg *args, size_t nargs);
em_status __wrap_em_launch(em_kernel *kernel, const uint32_t cube_count[3],
                           const uint32_t cube_dim[3], const em_arg *args, size_t nargs)
{
    g_launches++;
    return __real_em_launch(kernel, cube_count, cube_dim, args, nargs);
}

#define STEPS 6
static const char TEXT[] = "the quick brown fox jumps over the lazy dog. ";

static void make_text(const char *dir, char *out, size_t size)
{
    snprintf(out, size, "%s/text.txt", dir);
    size_t n = strlen(TEXT);
    int reps = 60;
    char *buf = malloc(n * (size_t)reps + 1);
    for (int i = 0; i < reps; i++) memcpy(buf + i * n, TEXT, n);
    assert_int_equal(write_file(out, buf, n * (size_t)reps), 0);
    free(buf);
}

typedef struct variant {
    const char *name;
    int grad_accum;
    bool bf16;
    bool eval;  /* a validation after step 3 */
    int poison; /* a NaN put into ln_f.weight before this step (0: none) */
} variant;

typedef struct run {
    double loss[STEPS], norm[STEPS];
    int launches[STEPS];
    float *params; /* every master parameter, in module order */
    size_t nparams;
    int64_t adam_steps;
    bool replayed;
} run;

static bool count_param(const char *name, em_module_entry *e, void *user)
{
    (void)name;
    if (e->is_param) *(size_t *)user += (size_t)em_numel(e->t);
    return true;
}

typedef struct gather {
    float *out;
    size_t at;
} gather;

static bool read_param(const char *name, em_module_entry *e, void *user)
{
    (void)name;
    if (!e->is_param) return true;
    gather *g = user;
    size_t n = (size_t)em_numel(e->t);
    assert_int_equal(em_to_host(e->t, g->out + g->at, n * sizeof(float)), EM_OK);
    g->at += n;
    return true;
}

static bool poison_param(const char *name, em_module_entry *e, void *user)
{
    (void)user;
    size_t len = strlen(name);
    if (!e->is_param || len < 11 || strcmp(name + len - 11, "ln_f.weight") != 0) return true;
    float *h = malloc((size_t)em_numel(e->t) * sizeof *h);
    assert_int_equal(em_to_host(e->t, h, (size_t)em_numel(e->t) * sizeof *h), EM_OK);
    h[1] = NAN;
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *src = em_from_host(em_tensor_device(e->t), EM_F32, em_shape_of(e->t), h);
    assert_int_equal(em_copy_(e->t, src), EM_OK);
    em_scope_end(NULL, 0);
    em_no_grad_end();
    free(h);
    return false;
}

static void train(const char *device, const char *text, const char *out, const variant *v,
                  bool graph, run *r)
{
    em_train_config c;
    em_train_config_default(&c);
    c.model = (em_gpt_config){0, 16, 2, 2, 32, 0.0, true, true};
    c.data = text;
    c.out_dir = out;
    c.device = device;
    c.batch = 4;
    c.seq = 16;
    c.grad_accum = v->grad_accum;
    c.bf16 = v->bf16;
    c.max_steps = STEPS;
    c.lr = (em_lr_schedule){
        .kind = EM_LR_COSINE, .base = 1e-2, .min_lr = 1e-3, .warmup = 2, .total_steps = STEPS};
    c.grad_clip = 0.5; /* clipping active on some steps, not on others */
    c.eval_batches = 2;
    c.seed = 9;
    c.graph = graph;
    em_trainer *t = em_trainer_new(&c);
    if (!t) fail_msg("trainer: %s", em_last_error());
    em_gpt *model = em_trainer_model(t);
    for (int s = 0; s < STEPS; s++) {
        if (v->poison == s + 1) em_module_visit(em_gpt_module(model), poison_param, NULL);
        em_train_metrics m;
        g_launches = 0;
        if (em_trainer_step(t, &m) != EM_OK) fail_msg("step %d: %s", s + 1, em_last_error());
        r->launches[s] = g_launches;
        r->loss[s] = m.loss;
        r->norm[s] = m.grad_norm;
        if (v->eval && s == 2) {
            double val;
            assert_int_equal(em_trainer_eval(t, &val), EM_OK);
            assert_true(isfinite(val));
        }
    }
    r->replayed = em_trainer_graph(t);
    r->adam_steps = em_optimizer_steps(t->opt);
    r->nparams = 0;
    em_module_visit(em_gpt_module(model), count_param, &r->nparams);
    r->params = malloc(r->nparams * sizeof(float));
    gather g = {r->params, 0};
    em_module_visit(em_gpt_module(model), read_param, &g);
    em_trainer_free(t);
}

/* a and b agree: bitwise when exact, else within 1e-5 relative (NaN with NaN). */
static bool same(double a, double b, bool exact)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return exact ? a == b : fabs(a - b) <= 1e-5 * fmax(fabs(a), 1e-2);
}

static void compare(const char *device, const variant *v)
{
    char dir[512], text[700], a[700], b[700];
    scratch_dir("train-graph", dir, sizeof dir);
    make_text(dir, text, sizeof text);
    snprintf(a, sizeof a, "%s/eager", dir);
    snprintf(b, sizeof b, "%s/graph", dir);
    run e = {0}, g = {0};
    train(device, text, a, v, false, &e);
    train(device, text, b, v, true, &g);
    em_device *dev = em_device_open(device);
    bool exact = em_device_caps(dev)->dtype[EM_F64];
    em_device_close(dev);
    fprintf(stderr, "[train] %s on %s: losses %.6f -> %.6f; launches per graph step:", v->name,
            device, g.loss[0], g.loss[STEPS - 1]);
    for (int s = 0; s < STEPS; s++) fprintf(stderr, " %d", g.launches[s]);
    fprintf(stderr, " (eager %d)\n", e.launches[STEPS - 1]);
    for (int s = 0; s < STEPS; s++) {
        if (!same(e.loss[s], g.loss[s], exact) || !same(e.norm[s], g.norm[s], exact))
            fail_msg("%s on %s, step %d: loss %.17g / %.17g, norm %.17g / %.17g (eager / graph)",
                     v->name, device, s + 1, e.loss[s], g.loss[s], e.norm[s], g.norm[s]);
    }
    assert_true(g.replayed);
    assert_false(e.replayed);
    for (int s = 2; s < STEPS; s++) assert_int_equal(g.launches[s], 0);
    assert_true(e.launches[STEPS - 1] > 0);
    assert_int_equal(e.adam_steps, g.adam_steps);
    assert_int_equal(e.nparams, g.nparams);
    for (size_t i = 0; i < e.nparams; i++)
        if (!(exact ? memcmp(&e.params[i], &g.params[i], sizeof(float)) == 0
                    : same(e.params[i], g.params[i], false)))
            fail_msg("%s on %s: parameter element %zu: %.9g (eager) vs %.9g (graph)", v->name,
                     device, i, e.params[i], g.params[i]);
    free(e.params);
    free(g.params);
    remove_dir(dir);
}

static const char *devices[] = {"cpu", "opencl:0", "vulkan:0"};

static void for_devices(const variant *v)
{
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        em_device *d = em_device_open(devices[i]);
        if (!d) {
            fprintf(stderr, "[train] skipping %s: %s\n", devices[i], em_last_error());
            em_clear_error();
            continue;
        }
        em_device_close(d);
        compare(devices[i], v);
    }
}

static void test_plain(void **state)
{
    (void)state;
    variant v = {"plain", 1, false, false, 0};
    for_devices(&v);
}

static void test_accum_eval(void **state)
{
    (void)state;
    variant v = {"accumulation 2, validation after step 3", 2, false, true, 0};
    compare("cpu", &v);
}

static void test_bf16(void **state)
{
    (void)state;
    variant v = {"bf16", 1, true, false, 0};
    compare("cpu", &v);
}

/* Variant v trained on the CPU eagerly into e and on the graph path into g, from the same
 * init and text (in a scratch directory named tag, removed after); max_ops, when not NULL, is
 * EMBER_GRAPH_MAX_OPS for the graph run. */
static void eager_and_graph_cpu(const char *tag, const variant *v, const char *max_ops, run *e,
                                run *g)
{
    char dir[512], text[700], a[700], b[700];
    scratch_dir(tag, dir, sizeof dir);
    make_text(dir, text, sizeof text);
    snprintf(a, sizeof a, "%s/eager", dir);
    snprintf(b, sizeof b, "%s/graph", dir);
    train("cpu", text, a, v, false, e);
    if (max_ops) setenv("EMBER_GRAPH_MAX_OPS", max_ops, 1);
    train("cpu", text, b, v, true, g);
    if (max_ops) unsetenv("EMBER_GRAPH_MAX_OPS");
    remove_dir(dir);
}

static void test_nonfinite_skipped(void **state)
{
    (void)state;
    variant v = {"NaN before step 5", 1, false, false, 5};
    run e = {0}, g = {0};
    eager_and_graph_cpu("train-graph-nan", &v, NULL, &e, &g);
    for (int s = 4; s < STEPS; s++) {
        assert_false(isfinite(e.norm[s]));
        assert_false(isfinite(g.norm[s]));
    }
    assert_int_equal(e.adam_steps, STEPS - 2); /* steps 5 and 6 skipped */
    assert_int_equal(g.adam_steps, STEPS - 2);
    assert_memory_equal(e.params, g.params, e.nparams * sizeof(float));
    free(e.params);
    free(g.params);
}

/* A recording that fails (here: more operations than EMBER_GRAPH_MAX_OPS allows) leaves the
 * trainer eager from then on, with the eager path's results bit for bit: nothing of the failed
 * recording ran, and every step still launches its kernels. */
static void test_recording_fails_falls_back(void **state)
{
    (void)state;
    variant v = {"recording over the limit", 1, false, false, 0};
    run e = {0}, g = {0};
    eager_and_graph_cpu("train-graph-limit", &v, "20", &e, &g);
    assert_false(g.replayed);
    for (int s = 0; s < STEPS; s++) {
        assert_true(g.launches[s] > 0);
        assert_true(e.loss[s] == g.loss[s] && e.norm[s] == g.norm[s]);
    }
    assert_int_equal(e.adam_steps, g.adam_steps);
    assert_memory_equal(e.params, g.params, e.nparams * sizeof(float));
    free(e.params);
    free(g.params);
}

/* Token ids past the model's vocabulary (a shard of another tokenizer): the graph path checks
 * them on the host where the batch is written — its device ops would clamp them — and fails the
 * step naming the id, as the eager path's embedding does. */
static void test_ids_outside_vocab(void **state)
{
    (void)state;
    char dir[512], path[700];
    scratch_dir("train-graph-vocab", dir, sizeof dir);
    enum { NTOK = 4096 };
    static uint32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (uint32_t)(i * 7 % 64);
    ids[1000] = 300; /* outside a 256-id model */
    snprintf(path, sizeof path, "%s/train_000.bin", dir);
    assert_int_equal(em_shard_write(path, ids, NTOK, 512), EM_OK);
    for (int graph = 0; graph < 2; graph++) {
        em_train_config c;
        em_train_config_default(&c);
        c.model = (em_gpt_config){256, 16, 1, 2, 32, 0.0, true, true};
        c.data = dir;
        c.out_dir = dir;
        c.device = "cpu";
        c.batch = 4;
        c.seq = 16;
        c.max_steps = 40;
        c.eval_every = 0;
        c.sample_every = -1;
        c.ckpt_every = 0;
        c.shuffle = false;
        c.graph = graph == 1;
        em_trainer *t = em_trainer_new(&c);
        if (!t) fail_msg("trainer: %s", em_last_error());
        em_status st = EM_OK;
        for (int s = 0; s < 40 && st == EM_OK; s++) st = em_trainer_step(t, NULL);
        assert_int_equal(st, EM_ERR_INVALID);
        fprintf(stderr, "[train] %s: %s\n", graph ? "graph" : "eager", em_last_error());
        assert_non_null(strstr(em_last_error(), "300"));
        em_trainer_free(t);
    }
    remove_dir(dir);
}

static void test_dropout_declined(void **state)
{
    (void)state;
    char dir[512], text[700];
    scratch_dir("train-graph-drop", dir, sizeof dir);
    make_text(dir, text, sizeof text);
    em_train_config c;
    em_train_config_default(&c);
    c.model = (em_gpt_config){0, 16, 1, 2, 32, 0.1, true, true};
    c.data = text;
    c.out_dir = dir;
    c.device = "cpu";
    c.batch = 2;
    c.seq = 16;
    c.graph = true;
    em_trainer *t = em_trainer_new(&c);
    assert_non_null(t);
    for (int s = 0; s < 3; s++) assert_int_equal(em_trainer_step(t, NULL), EM_OK);
    assert_false(em_trainer_graph(t));
    em_trainer_free(t);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_accum_eval),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_nonfinite_skipped),
        cmocka_unit_test(test_dropout_declined),
        cmocka_unit_test(test_recording_fails_falls_back),
        cmocka_unit_test(test_ids_outside_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
