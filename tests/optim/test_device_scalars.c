/* test_device_scalars.c — Adam/AdamW with device scalars and clipping on the device
 * (src/optim/device_scalars.c) against the host path, on every device present:
 *   - several steps with a changing learning rate, clipping active on some and not on others:
 *     parameters, norms and rescaled gradients equal the host path's (bitwise where the device
 *     adds in f64; within 1e-5 relative elsewhere); the clip coefficient the device computed
 *     equals min(1, max_norm / (norm + 1e-6)) on the host;
 *   - a non-finite gradient: the device path leaves parameters and state unchanged, as the host
 *     path that skips the step does;
 *   - the same steps recorded once as a graph and replayed with new gradients and new learning
 *     rates give the host path's parameters (a frozen scalar would not);
 *   - the deferred clip (the coefficient applied by the step's kernels) gives the eager device
 *     clip's parameters and leaves the gradients as they were until the step. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ember/optim.h"
#include "ember/runtime.h"
#include "tensor/tensor_util.h"

#define NP 3
#define STEPS 5
static const int64_t SIZES[NP] = {7, 96, 1031};
static const bool DECAY[NP] = {true, false, true};

typedef struct side {
    em_tensor *p[NP];
    em_optimizer *o;
} side;

static void side_new(side *s, em_device *dev, bool adamw)
{
    em_param_ref refs[NP];
    static const char *names[NP] = {"a", "b", "c"};
    for (int k = 0; k < NP; k++) {
        double v[1031];
        tu_fill(v, (size_t)SIZES[k], -1, 1, (uint32_t)(11 + k));
        s->p[k] = tu_tensor(dev, EM_F32, EM_SHAPE(SIZES[k]), v);
        assert_int_equal(em_set_requires_grad(s->p[k], true), EM_OK);
        refs[k] = (em_param_ref){names[k], s->p[k], DECAY[k]};
    }
    em_adam_config c = {1e-2, 0.9, 0.95, 1e-8, 0.1, adamw};
    s->o = em_adam_new_params(refs, NP, &c);
    assert_non_null(s->o);
}

static void side_free(side *s)
{
    em_optimizer_free(s->o);
    for (int k = 0; k < NP; k++) em_release(s->p[k]);
}

/* The gradient of step t for parameter k: large at t = 1 and 3 (clipped), small otherwise,
 * non-finite at t == bad. */
static void grad_values(int k, int t, int bad, double *g)
{
    tu_fill(g, (size_t)SIZES[k], -1, 1, (uint32_t)(100 * t + k));
    double scale = t % 2 ? 3.0 : 0.01;
    for (int64_t i = 0; i < SIZES[k]; i++) g[i] = tu_round(EM_F32, g[i] * scale);
    if (t == bad && k == 1) g[5] = INFINITY;
}

static void set_grads(side *s, int t, int bad)
{
    for (int k = 0; k < NP; k++) {
        double g[1031];
        grad_values(k, t, bad, g);
        em_tensor *gt = tu_tensor(em_tensor_device(s->p[k]), EM_F32, EM_SHAPE(SIZES[k]), g);
        assert_int_equal(em_set_grad(s->p[k], gt), EM_OK);
        em_release(gt);
    }
}

static double lr_at(int t)
{
    return 1e-2 / (1.0 + 0.7 * t);
}

static const double MAX_NORM = 2.0;

/* The host path's step t: clip, skip on a non-finite norm, update. */
static double host_step(side *s, int t)
{
    double norm;
    assert_int_equal(em_clip_grad_norm(s->o, MAX_NORM, &norm), EM_OK);
    if (isfinite(norm)) {
        em_optimizer_set_lr(s->o, lr_at(t));
        assert_int_equal(em_optimizer_step(s->o), EM_OK);
    }
    em_optimizer_zero_grad(s->o);
    return norm;
}

/* The device path's step t up to the read-back; the host writes the scalars first. */
static void device_body(side *s)
{
    assert_int_equal(em_clip_grad_norm_device(s->o, MAX_NORM), EM_OK);
    assert_int_equal(em_optimizer_step(s->o), EM_OK);
}

static double device_finish(side *s)
{
    double norm;
    assert_int_equal(em_optimizer_device_norm(s->o, &norm), EM_OK);
    if (isfinite(norm)) em_optimizer_set_steps(s->o, em_optimizer_steps(s->o) + 1);
    return norm;
}

static void expect_same(em_device *dev, const em_tensor *a, const em_tensor *b, const char *what)
{
    double *x = tu_read(a), *y = tu_read(b);
    size_t n = (size_t)em_numel(a);
    /* bitwise where the device has f64, except CUDA: NVRTC contracts the update's multiply-adds
     * differently when a scalar comes from memory (cuda:0 of the H200: one ulp apart) */
    const em_caps *caps = em_device_caps(dev);
    bool exact = caps->dtype[EM_F64] && strcmp(caps->target, "cuda") != 0;
    double tol = caps->dtype[EM_F64] ? 1e-6 : 1e-5;
    for (size_t i = 0; i < n; i++) {
        bool ok = exact ? x[i] == y[i] : fabs(x[i] - y[i]) <= tol * fmax(fabs(x[i]), 1e-3);
        if (!ok)
            fail_msg("%s on %s: element %zu: %.9g vs %.9g", what, em_device_name(dev), i, x[i],
                     y[i]);
    }
    free(x);
    free(y);
}

static void expect_norm(em_device *dev, double host, double device)
{
    bool exact = em_device_caps(dev)->dtype[EM_F64];
    if (!isfinite(host)) {
        assert_false(isfinite(device));
        return;
    }
    if (exact ? host != device : fabs(host - device) > 1e-5 * host)
        fail_msg("norm on %s: %.17g (host) vs %.17g (device)", em_device_name(dev), host, device);
}

static void run_eager_pair(em_device *dev, bool adamw, int bad)
{
    side h, d;
    side_new(&h, dev, adamw);
    side_new(&d, dev, adamw);
    assert_int_equal(em_optimizer_device_scalars(d.o, true), EM_OK);
    for (int t = 1; t <= STEPS; t++) {
        set_grads(&h, t, bad);
        set_grads(&d, t, bad);
        double hn = host_step(&h, t);
        em_optimizer_set_lr(d.o, lr_at(t));
        assert_int_equal(em_optimizer_write_scalars(d.o), EM_OK);
        assert_int_equal(em_clip_grad_norm_device(d.o, MAX_NORM), EM_OK);
        double dn = device_finish(&d);
        expect_norm(dev, hn, dn);
        /* the rescaled gradients: the coefficient the device used is the host formula's */
        double coef = MAX_NORM / (dn + 1e-6);
        for (int k = 0; isfinite(dn) && k < NP; k++) {
            double g[1031];
            grad_values(k, t, bad, g);
            double *got = tu_read(em_grad(d.p[k]));
            for (int64_t i = 0; i < SIZES[k]; i++) {
                double want = coef < 1 ? (double)(float)((float)g[i] * (float)coef) : g[i];
                if (got[i] != want && em_device_caps(dev)->dtype[EM_F64])
                    fail_msg("rescaled gradient %d[%lld] on %s: %.9g, want %.9g", k, (long long)i,
                             em_device_name(dev), got[i], want);
            }
            free(got);
        }
        if (isfinite(dn))
            assert_int_equal(em_optimizer_step(d.o), EM_OK);
        else
            assert_int_equal(em_optimizer_step(d.o), EM_OK); /* reads the flag: no change */
        em_optimizer_zero_grad(d.o);
        assert_int_equal(em_optimizer_steps(h.o), em_optimizer_steps(d.o));
        for (int k = 0; k < NP; k++) expect_same(dev, h.p[k], d.p[k], "parameter");
    }
    side_free(&h);
    side_free(&d);
}

static void test_eager_equal(void **state)
{
    (void)state;
    for (int i = 0; i < tu_ndev; i++) {
        run_eager_pair(tu_devs[i], true, 0);
        run_eager_pair(tu_devs[i], false, 0);
    }
}

static void test_nonfinite_skips(void **state)
{
    (void)state;
    for (int i = 0; i < tu_ndev; i++) run_eager_pair(tu_devs[i], true, 3);
}

/* Steps 2.. recorded once (gradients cloned in from persistent tensors the host rewrites). */
static void test_recorded(void **state)
{
    (void)state;
    for (int i = 0; i < tu_ndev; i++) {
        em_device *dev = tu_devs[i];
        side h, d;
        side_new(&h, dev, true);
        side_new(&d, dev, true);
        assert_int_equal(em_optimizer_device_scalars(d.o, true), EM_OK);
        em_tensor *src[NP];
        for (int k = 0; k < NP; k++) src[k] = em_zeros(dev, EM_F32, EM_SHAPE(SIZES[k]));
        em_graph *g = NULL;
        for (int t = 1; t <= STEPS; t++) {
            int bad = 4; /* one skipped step among the replays */
            set_grads(&h, t, bad);
            double hn = host_step(&h, t);
            for (int k = 0; k < NP; k++) {
                double gv[1031];
                grad_values(k, t, bad, gv);
                em_scope_begin();
                assert_int_equal(em_copy_(src[k], tu_tensor(dev, EM_F32, EM_SHAPE(SIZES[k]), gv)),
                                 EM_OK);
                em_scope_end(NULL, 0);
            }
            em_optimizer_set_lr(d.o, lr_at(t));
            assert_int_equal(em_optimizer_write_scalars(d.o), EM_OK);
            if (t == 2) assert_int_equal(em_tensor_graph_begin(dev), EM_OK);
            if (t <= 2) {
                for (int k = 0; k < NP; k++) {
                    em_tensor *c = em_clone(src[k]);
                    assert_int_equal(em_set_grad(d.p[k], c), EM_OK);
                    em_release(c);
                }
                device_body(&d);
                em_optimizer_zero_grad(d.o);
            }
            if (t == 2) {
                em_status st = em_tensor_graph_end(dev, &g);
                if (st != EM_OK)
                    fail_msg("recording on %s: %s", em_device_name(dev), em_last_error());
            }
            if (t >= 2) assert_int_equal(em_tensor_graph_launch(g), EM_OK);
            double dn = device_finish(&d);
            expect_norm(dev, hn, dn);
            assert_int_equal(em_optimizer_steps(h.o), em_optimizer_steps(d.o));
            for (int k = 0; k < NP; k++) expect_same(dev, h.p[k], d.p[k], "parameter (graph)");
        }
        em_graph_free(g);
        for (int k = 0; k < NP; k++) em_release(src[k]);
        side_free(&h);
        side_free(&d);
    }
}

/* em_clip_grad_norm_device_deferred: the same parameters and norms as the eager device clip,
 * step after step (clipped and not, a non-finite step skipped), and the gradients left as they
 * were between the clip and the step. */
static void run_deferred_pair(em_device *dev, bool adamw, int bad)
{
    side e, d;
    side_new(&e, dev, adamw);
    side_new(&d, dev, adamw);
    assert_int_equal(em_optimizer_device_scalars(e.o, true), EM_OK);
    assert_int_equal(em_optimizer_device_scalars(d.o, true), EM_OK);
    for (int t = 1; t <= STEPS; t++) {
        set_grads(&e, t, bad);
        set_grads(&d, t, bad);
        em_optimizer_set_lr(e.o, lr_at(t));
        em_optimizer_set_lr(d.o, lr_at(t));
        assert_int_equal(em_optimizer_write_scalars(e.o), EM_OK);
        assert_int_equal(em_optimizer_write_scalars(d.o), EM_OK);
        device_body(&e);
        assert_int_equal(em_clip_grad_norm_device_deferred(d.o, MAX_NORM), EM_OK);
        for (int k = 0; k < NP; k++) { /* not rescaled */
            double g[1031];
            grad_values(k, t, bad, g);
            double *got = tu_read(em_grad(d.p[k]));
            for (int64_t i = 0; i < SIZES[k]; i++)
                if (got[i] != tu_round(EM_F32, g[i]) && !(isinf(got[i]) && isinf(g[i])))
                    fail_msg("deferred clip changed gradient %d[%lld] on %s", k, (long long)i,
                             em_device_name(dev));
            free(got);
        }
        assert_int_equal(em_optimizer_step(d.o), EM_OK);
        double en = device_finish(&e), dn = device_finish(&d);
        assert_true(en == dn || (isnan(en) && isnan(dn)) || (isinf(en) && isinf(dn)));
        for (int k = 0; k < NP; k++) expect_same(dev, d.p[k], e.p[k], "deferred clip: parameter");
        em_optimizer_zero_grad(e.o);
        em_optimizer_zero_grad(d.o);
    }
    side_free(&e);
    side_free(&d);
}

static void test_deferred_clip(void **state)
{
    (void)state;
    for (int i = 0; i < tu_ndev; i++) {
        run_deferred_pair(tu_devs[i], true, -1);
        run_deferred_pair(tu_devs[i], false, 2);
    }
}

static void test_misuse(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_tensor *p = em_zeros(dev, EM_F32, EM_SHAPE(3));
    em_set_requires_grad(p, true);
    em_param_ref r = {"p", p, true};
    em_sgd_config sc = {.lr = 0.1};
    em_optimizer *o = em_sgd_new_params(&r, 1, &sc);
    assert_int_equal(em_optimizer_device_scalars(o, true), EM_ERR_UNSUPPORTED);
    assert_int_equal(em_optimizer_write_scalars(o), EM_ERR_INVALID);
    assert_int_equal(em_clip_grad_norm_device(o, 1.0), EM_ERR_INVALID);
    em_optimizer_free(o);
    em_release(p);
    em_clear_error();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eager_equal),
        cmocka_unit_test(test_nonfinite_skips),
        cmocka_unit_test(test_recorded),
        cmocka_unit_test(test_deferred_clip),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
