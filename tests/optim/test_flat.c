/* test_flat.c — the optimizer's flat storage (em_optimizer_flatten, src/optim/arena.c) on every
 * device present: a flattened AdamW against a twin that is not, from the same values, over
 * several steps:
 *   - without a clip the parameters, mirrors and moments are the same bits; with a host clip, a
 *     device clip and a deferred device clip, the norm and the parameters agree to 1e-6 (the
 *     norm's partial sums are grouped differently);
 *   - bf16 gradient slots written by the caller (em_optimizer_grads_written) against f32
 *     gradients of the same values, host and deferred device clips;
 *   - launches: one sum of squares and two updates (decay group and the rest) per step, however
 *     many parameters; the parameters are the same tensors with the same values after flattening;
 *   - a parameter without a gradient (the per-parameter path), state flattened after steps and
 *     loaded by name afterwards, a rescale seen through em_grad;
 *   - refusals: SGD, a parameter whose storage another view shares, a non-float gradient dtype;
 *   - the grain between parameters: 256 elements, more where the device's buffer offsets must be
 *     aligned further (op_flat_grain), and every parameter's and slot's byte offset a multiple of
 *     the device's buffer_align. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ember/autodiff.h"
#include "ember/optim.h"
#include "ember/runtime.h"
#include "optim/internal.h"
#include "tensor/internal.h"
#include "tensor/tensor_util.h"

#define NP 6
#define STEPS 3

static const int64_t DIMS[NP][2] = {{7, 0}, {3, 5}, {33, 31}, {64, 64}, {1, 0}, {1000, 0}};
static const bool DECAY[NP] = {false, true, true, false, true, false};
static const em_adam_config CFG = {
    .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decoupled = true};

static em_shape shape_of(int k)
{
    return DIMS[k][1] ? EM_SHAPE(DIMS[k][0], DIMS[k][1]) : EM_SHAPE(DIMS[k][0]);
}

/* One side of a comparison: parameters (and bf16 mirrors) and their optimizer. */
typedef struct side {
    em_tensor *p[NP], *mirror[NP];
    em_optimizer *o;
} side;

static const char *NAMES[NP] = {"a", "b", "c", "d", "e", "f"};

static void side_new(side *s, em_device *dev, bool mirrors)
{
    em_param_ref refs[NP];
    for (int k = 0; k < NP; k++) {
        em_rng r = em_rng_new(11u + (uint64_t)k);
        s->p[k] = em_randn(dev, EM_F32, shape_of(k), &r);
        assert_non_null(s->p[k]);
        em_tensor_untrack(s->p[k]);
        em_set_requires_grad(s->p[k], true);
        s->mirror[k] = mirrors ? em_cast(s->p[k], EM_BF16) : NULL;
        if (mirrors) em_tensor_untrack(s->mirror[k]), em_realize(s->mirror[k]);
        refs[k] = (em_param_ref){NAMES[k], s->p[k], DECAY[k]};
    }
    s->o = em_adam_new_params(refs, NP, &CFG);
    assert_non_null(s->o);
    for (int k = 0; mirrors && k < NP; k++)
        assert_int_equal(em_optimizer_set_mirror(s->o, s->p[k], s->mirror[k]), EM_OK);
}

static void side_free(side *s)
{
    em_optimizer_free(s->o);
    for (int k = 0; k < NP; k++) em_release(s->p[k]), em_release(s->mirror[k]);
}

/* The largest difference between a and b relative to max(1, |b|). */
static double rel_diff(const em_tensor *a, const em_tensor *b)
{
    double *x = tu_read(a), *y = tu_read(b), worst = 0;
    for (int64_t i = 0; i < em_numel(a); i++) {
        double d = fabs(x[i] - y[i]) / fmax(1.0, fabs(y[i]));
        if (!(d <= worst)) worst = d; /* NaN wins */
    }
    free(x);
    free(y);
    return worst;
}

static void expect_same(const char *what, const side *f, const side *u, double tol, int t)
{
    for (int k = 0; k < NP; k++) {
        double d = rel_diff(f->p[k], u->p[k]);
        if (!(d <= tol))
            fail_msg("%s, step %d: parameter %s differs by %.3g (tolerance %.3g)", what, t,
                     NAMES[k], d, tol);
        if (f->mirror[k] && rel_diff(f->mirror[k], u->mirror[k]) > tol)
            fail_msg("%s, step %d: the mirror of %s differs", what, t, NAMES[k]);
    }
}

enum clip { NO_CLIP, HOST_CLIP, DEVICE_CLIP, DEFERRED_CLIP };

/* Step t's gradients: random, rounded to bf16 when `narrow` (so both sides hold the same values);
 * f's go to its bf16 slots when `narrow`, else both sides get them through em_set_grad. */
static void set_grads(side *f, side *u, em_device *dev, int t, bool narrow)
{
    em_rng r = em_rng_new(1000u + (uint64_t)t);
    for (int k = 0; k < NP; k++) {
        em_tensor *g = em_randn(dev, EM_F32, shape_of(k), &r);
        em_tensor *gs = em_mul_scalar(g, 3.0 + k); /* a norm above the clip's 1 */
        if (narrow) {
            em_tensor *b = em_cast(gs, EM_BF16);
            assert_int_equal(em_copy_(em_optimizer_grad_slot(f->o, f->p[k]), b), EM_OK);
            em_tensor *back = em_cast(b, EM_F32);
            assert_int_equal(em_set_grad(u->p[k], back), EM_OK);
            em_release(back);
            em_release(b);
        } else {
            assert_int_equal(em_set_grad(f->p[k], gs), EM_OK);
            assert_int_equal(em_set_grad(u->p[k], gs), EM_OK);
        }
        em_release(gs);
        em_release(g);
    }
    if (narrow) assert_int_equal(em_optimizer_grads_written(f->o), EM_OK);
}

/* The clip of one side (device scalars written first where they are on); its norm. */
static double clip_side(side *s, enum clip c)
{
    double norm = NAN;
    if (c == NO_CLIP) return 0;
    if (c == HOST_CLIP) {
        assert_int_equal(em_clip_grad_norm(s->o, 1.0, &norm), EM_OK);
        return norm;
    }
    assert_int_equal(em_optimizer_write_scalars(s->o), EM_OK);
    em_status st = c == DEVICE_CLIP ? em_clip_grad_norm_device(s->o, 1.0)
                                    : em_clip_grad_norm_device_deferred(s->o, 1.0);
    assert_int_equal(st, EM_OK);
    return 0; /* read after the step */
}

static void step_side(side *s, enum clip c, double *norm)
{
    assert_int_equal(em_optimizer_step(s->o), EM_OK);
    if (c == DEVICE_CLIP || c == DEFERRED_CLIP) {
        assert_int_equal(em_optimizer_device_norm(s->o, norm), EM_OK);
        em_optimizer_set_steps(s->o, em_optimizer_steps(s->o) + 1);
    }
    em_optimizer_zero_grad(s->o);
}

static void compare_case(em_device *dev, enum clip c, bool narrow)
{
    static const char *CLIPS[] = {"no clip", "host clip", "device clip", "deferred clip"};
    char what[128];
    snprintf(what, sizeof what, "%s, %s, %s slots", em_device_name(dev), CLIPS[c],
             narrow ? "bf16" : "f32");
    side f, u;
    bool mirrors = tu_has(dev, EM_BF16);
    side_new(&f, dev, mirrors);
    side_new(&u, dev, mirrors);
    double *before = tu_read(f.p[2]);
    em_tensor *p2 = f.p[2];
    assert_int_equal(em_optimizer_flatten(f.o, narrow ? EM_BF16 : EM_F32), EM_OK);
    assert_ptr_equal(f.p[2], p2);
    double *after = tu_read(f.p[2]);
    assert_memory_equal(before, after, sizeof(double) * (size_t)em_numel(p2));
    free(before);
    free(after);
    if (c == DEVICE_CLIP || c == DEFERRED_CLIP) {
        assert_int_equal(em_optimizer_device_scalars(f.o, true), EM_OK);
        assert_int_equal(em_optimizer_device_scalars(u.o, true), EM_OK);
    }
    for (int t = 1; t <= STEPS; t++) {
        set_grads(&f, &u, dev, t, narrow);
        assert_int_equal(em_flush(), EM_OK);
        em_profile_enable(true);
        em_profile_reset();
        double nf = clip_side(&f, c);
        step_side(&f, c, &nf);
        em_profile_kernel kf;
        const char *adam = c == DEVICE_CLIP || c == DEFERRED_CLIP ? "optim_adam_dev" : "optim_adam";
        assert_true(em_profile_kernel_get(adam, &kf));
        if (kf.launches != 2) fail_msg("%s: %lld update launches", what, (long long)kf.launches);
        if (c != NO_CLIP) {
            assert_true(em_profile_kernel_get("optim_sumsq", &kf));
            assert_int_equal(kf.launches, 1);
        }
        em_profile_enable(false);
        double nu = clip_side(&u, c);
        step_side(&u, c, &nu);
        if (c != NO_CLIP && !(fabs(nf - nu) <= 1e-6 * nu))
            fail_msg("%s, step %d: norm %.9g, per parameter %.9g", what, t, nf, nu);
        expect_same(what, &f, &u, c == NO_CLIP ? 0 : 1e-6, t);
    }
    side_free(&f);
    side_free(&u);
}

static void test_flat_matches(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++)
        for (int c = NO_CLIP; c <= DEFERRED_CLIP; c++) {
            compare_case(tu_devs[d], (enum clip)c, false);
            if (tu_has(tu_devs[d], EM_BF16) && (c == HOST_CLIP || c == DEFERRED_CLIP))
                compare_case(tu_devs[d], (enum clip)c, true);
        }
}

/* The grain (op_flat_grain), and on each device the byte offsets of the flattened parameters and
 * of the bf16 gradient slots against the device's buffer_align. */
static void test_flat_grain(void **state)
{
    (void)state;
    static const struct {
        size_t elem;
        uint64_t align;
        int64_t grain;
    } cases[] = {{4, 0, 256},    {2, 16, 256},    {2, 512, 256}, {1, 512, 512},
                 {2, 1024, 512}, {4, 4096, 1024}, {2, 384, 768}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(op_flat_grain(cases[i].elem, cases[i].align), cases[i].grain);
    for (int d = 0; d < tu_ndev; d++) {
        if (!tu_has(tu_devs[d], EM_BF16)) continue;
        side f;
        side_new(&f, tu_devs[d], false);
        assert_int_equal(em_optimizer_flatten(f.o, EM_BF16), EM_OK);
        uint64_t align = em_device_caps(tu_devs[d])->buffer_align;
        for (int k = 0; k < NP; k++) {
            const em_tensor *slot = em_optimizer_grad_slot(f.o, f.p[k]);
            assert_non_null(slot);
            assert_int_equal(f.p[k]->offset % 256, 0);
            assert_int_equal(slot->offset, f.p[k]->offset);
            if (align > 1) assert_int_equal((uint64_t)slot->offset * 2 % align, 0);
        }
        side_free(&f);
    }
}

typedef struct want {
    const char *name;
    em_tensor *t;
} want;

static bool hit(const char *name, em_tensor *t, void *user)
{
    want *w = user;
    if (strcmp(name, w->name) != 0) return true;
    w->t = t;
    return false;
}

/* The state tensor `name` of the optimizer `user` (em_optimizer_state_load's lookup). */
static em_tensor *lookup(const char *name, void *user)
{
    want w = {name, NULL};
    em_optimizer_state_visit(user, hit, &w);
    return w.t;
}

/* A parameter without a gradient, state flattened after per-parameter steps, state loaded by
 * name into a flattened optimizer, and a host rescale seen through em_grad. */
static void test_flat_paths(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        side f, u;
        side_new(&f, dev, false);
        side_new(&u, dev, false);
        for (int t = 1; t <= 4; t++) {
            if (t == 3) assert_int_equal(em_optimizer_flatten(f.o, EM_F32), EM_OK);
            set_grads(&f, &u, dev, t, false);
            if (t == 4) em_zero_grad(f.p[1]), em_zero_grad(u.p[1]); /* no gradient: skipped */
            double nf, nu;
            assert_int_equal(em_scale_grads(f.o, 0.5), EM_OK);
            assert_int_equal(em_scale_grads(u.o, 0.5), EM_OK);
            if (t == 3) { /* the rescale is in the slot, and the slot is the gradient */
                assert_ptr_equal(em_grad(f.p[0]), em_optimizer_grad_slot(f.o, f.p[0]));
                assert_true(rel_diff(em_grad(f.p[0]), em_grad(u.p[0])) == 0);
            }
            assert_int_equal(em_clip_grad_norm(f.o, 1.0, &nf), EM_OK);
            assert_int_equal(em_clip_grad_norm(u.o, 1.0, &nu), EM_OK);
            assert_true(fabs(nf - nu) <= 1e-6 * nu);
            step_side(&f, NO_CLIP, NULL);
            step_side(&u, NO_CLIP, NULL);
            expect_same("paths", &f, &u, 1e-6, t);
        }
        /* a fresh flattened optimizer loads u's state by name and steps as u does */
        side g;
        side_new(&g, dev, false);
        em_no_grad_begin();
        for (int k = 0; k < NP; k++) assert_int_equal(em_copy_(g.p[k], u.p[k]), EM_OK);
        em_no_grad_end();
        assert_int_equal(em_optimizer_flatten(g.o, EM_F32), EM_OK);
        if (em_optimizer_state_load(g.o, lookup, u.o, em_optimizer_steps(u.o)) != EM_OK)
            fail_msg("state load: %s", em_last_error());
        set_grads(&g, &u, dev, 9, false);
        step_side(&g, NO_CLIP, NULL);
        step_side(&u, NO_CLIP, NULL);
        expect_same("loaded state", &g, &u, 0, 9);
        side_free(&g);
        side_free(&f);
        side_free(&u);
    }
}

static void test_flat_refusals(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_tensor *base = em_zeros(dev, EM_F32, EM_SHAPE(4, 4));
    em_tensor_untrack(base);
    em_set_requires_grad(base, true);
    em_tensor *alias = em_reshape(base, EM_SHAPE(16)); /* shares base's storage */
    em_tensor_untrack(alias);
    em_param_ref ref = {"w", base, true};
    em_optimizer *o = em_adam_new_params(&ref, 1, &CFG);
    assert_int_equal(em_optimizer_flatten(o, EM_I32), EM_ERR_INVALID);
    assert_int_equal(em_optimizer_flatten(o, EM_F32), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "shared"));
    assert_null(em_optimizer_grad_slot(o, base));
    assert_int_equal(em_optimizer_grads_written(o), EM_ERR_INVALID);
    em_clear_error();
    em_optimizer_free(o);
    em_sgd_config sc = {.lr = 0.1};
    o = em_sgd_new_params(&ref, 1, &sc);
    assert_int_equal(em_optimizer_flatten(o, EM_F32), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "SGD"));
    em_clear_error();
    em_optimizer_free(o);
    em_release(alias);
    em_release(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flat_matches),
        cmocka_unit_test(test_flat_paths),
        cmocka_unit_test(test_flat_refusals),
        cmocka_unit_test(test_flat_grain),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
