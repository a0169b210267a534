/* test_optim.c — optimizers against a float64 reference written here from PyTorch's documented
 * update rules (torch.optim.SGD, Adam, AdamW): the parameter trajectory over several steps for
 * each variant (momentum, dampening, Nesterov, weight decay with decay groups, Adam's L2 vs
 * AdamW's decoupled decay, a learning-rate change), in f64, f32 and bf16 parameters on every
 * device; gradient clipping by norm (torch's 1e-6) and by value, gradient scaling, zeroing;
 * state visit/load for checkpoints; configuration errors; and a linear regression trained
 * end to end with em_backward and Adam. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ember/optim.h"
#include "tensor/tensor_util.h"

#define NP 2   /* parameters per case */
#define MAXN 6 /* elements of the largest */
#define STEPS 5

static const int NUMEL[NP] = {6, 3};
static const bool DECAY[NP] = {true, false};

typedef struct ref_state {
    double p[NP][MAXN], b[NP][MAXN], m[NP][MAXN], v[NP][MAXN];
} ref_state;

typedef enum { K_SGD, K_ADAM } algo;

typedef struct opt_case {
    const char *name;
    algo kind;
    em_sgd_config sgd;
    em_adam_config adam;
} opt_case;

/* The gradient both sides use: d/dp of sum (p - c)^2 plus a step-dependent wobble. */
static double grad_of(double p, int param, int i, int step)
{
    double c = 0.3 * (i + 1) - 0.5 * param;
    return 2 * (p - c) + 0.1 * sin(1.0 + step + 0.7 * i);
}

/* One step of the reference at step t (from 1) with learning rate lr. */
static void ref_step(const opt_case *c, ref_state *r, const double g_in[NP][MAXN], int t, double lr,
                     em_scalar dt)
{
    for (int k = 0; k < NP; k++)
        for (int i = 0; i < NUMEL[k]; i++) {
            double g = g_in[k][i], *p = &r->p[k][i];
            if (c->kind == K_SGD) {
                const em_sgd_config *s = &c->sgd;
                if (s->weight_decay != 0 && DECAY[k]) g += s->weight_decay * *p;
                if (s->momentum != 0) {
                    double *b = &r->b[k][i];
                    *b = t == 1 ? g : s->momentum * *b + (1 - s->dampening) * g;
                    g = s->nesterov ? g + s->momentum * *b : *b;
                }
                *p -= lr * g;
            } else {
                const em_adam_config *a = &c->adam;
                if (a->weight_decay != 0 && DECAY[k]) {
                    if (a->decoupled)
                        *p *= 1 - lr * a->weight_decay;
                    else
                        g += a->weight_decay * *p;
                }
                double *m = &r->m[k][i], *v = &r->v[k][i];
                *m = a->beta1 * *m + (1 - a->beta1) * g;
                *v = a->beta2 * *v + (1 - a->beta2) * g * g;
                double mhat = *m / (1 - pow(a->beta1, t)), vhat = *v / (1 - pow(a->beta2, t));
                *p -= lr * mhat / (sqrt(vhat) + a->eps);
            }
            if (dt != EM_F64 && dt != EM_F32) *p = tu_round(dt, *p); /* stored in 16 bits */
        }
}

static em_optimizer *make_opt(const opt_case *c, em_param_ref *refs)
{
    em_optimizer *o = c->kind == K_SGD ? em_sgd_new_params(refs, NP, &c->sgd)
                                       : em_adam_new_params(refs, NP, &c->adam);
    if (!o) fail_msg("%s: %s", c->name, em_last_error());
    return o;
}

/* Runs case c on dev with parameters of dtype dt and compares every step with the reference. */
static void run_case(const opt_case *c, em_device *dev, em_scalar dt)
{
    ref_state r = {0};
    em_tensor *ps[NP];
    em_param_ref refs[NP];
    const char *names[NP] = {"layer.weight", "layer.bias"};
    for (int k = 0; k < NP; k++) {
        tu_fill(r.p[k], (size_t)NUMEL[k], -1, 1, (uint32_t)(7 + k));
        ps[k] = tu_tensor(dev, dt, k == 0 ? EM_SHAPE(2, 3) : EM_SHAPE(3), r.p[k]);
        assert_int_equal(em_set_requires_grad(ps[k], true), EM_OK);
        refs[k] = (em_param_ref){names[k], ps[k], DECAY[k]};
    }
    em_optimizer *o = make_opt(c, refs);
    double lr = c->kind == K_SGD ? c->sgd.lr : c->adam.lr;
    double tol = dt == EM_F64 ? 1e-10 : dt == EM_F32 ? 2e-5 : 2e-2;
    for (int t = 1; t <= STEPS; t++) {
        if (t == 4) { /* a learning-rate change takes effect at once */
            lr *= 0.5;
            em_optimizer_set_lr(o, lr);
            assert_true(em_optimizer_lr(o) == lr);
        }
        double gref[NP][MAXN];
        for (int k = 0; k < NP; k++) {
            double *mine = tu_read(ps[k]), g[MAXN];
            for (int i = 0; i < NUMEL[k]; i++) {
                g[i] = grad_of(mine[i], k, i, t);
                gref[k][i] = grad_of(r.p[k][i], k, i, t);
            }
            free(mine);
            em_tensor *gt = tu_tensor(dev, dt, em_shape_of(ps[k]), g);
            assert_int_equal(em_set_grad(ps[k], gt), EM_OK);
            em_release(gt);
        }
        em_status st = em_optimizer_step(o);
        if (st != EM_OK) fail_msg("%s step %d: %s", c->name, t, em_last_error());
        assert_int_equal(em_optimizer_steps(o), t);
        ref_step(c, &r, gref, t, lr, dt);
        for (int k = 0; k < NP; k++) {
            char what[128];
            snprintf(what, sizeof what, "%s %s %s step %d", c->name, em_scalar_name(dt), names[k],
                     t);
            tu_check(what, ps[k], em_shape_of(ps[k]), r.p[k], tol);
        }
    }
    em_optimizer_zero_grad(o);
    for (int k = 0; k < NP; k++) assert_null(em_grad(ps[k]));
    em_optimizer_free(o);
    for (int k = 0; k < NP; k++) em_release(ps[k]);
}

static const opt_case CASES[] = {
    {"sgd", K_SGD, .sgd = {.lr = 0.1}},
    {"sgd-momentum", K_SGD, .sgd = {.lr = 0.05, .momentum = 0.9}},
    {"sgd-dampening", K_SGD, .sgd = {.lr = 0.05, .momentum = 0.8, .dampening = 0.3}},
    {"sgd-nesterov", K_SGD, .sgd = {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
    {"sgd-weight-decay", K_SGD, .sgd = {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.2}},
    {"adam", K_ADAM, .adam = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
    {"adam-l2", K_ADAM,
     .adam = {.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.3}},
    {"adamw", K_ADAM,
     .adam = {.lr = 0.02,
              .beta1 = 0.9,
              .beta2 = 0.95,
              .eps = 1e-8,
              .weight_decay = 0.1,
              .decoupled = true}},
};

static void test_trajectories(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        /* every dtype on the CPU device; f32 (what the update computes in) on the others, to
         * keep the test within CI's time on PoCL and lavapipe */
        static const em_scalar dts[] = {EM_F32, EM_F64, EM_BF16};
        for (size_t k = 0; k < (tu_is_cpu(tu_devs[d]) ? 3u : 1u); k++) {
            if (!tu_has(tu_devs[d], dts[k])) continue;
            for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
                run_case(&CASES[i], tu_devs[d], dts[k]);
        }
    }
}

/* A parameter without a gradient is left alone (and gets zero state). */
static void test_skips_params_without_grad(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    double a[2] = {1, 2}, b[2] = {3, 4};
    em_tensor *pa = tu_tensor(dev, EM_F32, EM_SHAPE(2), a),
              *pb = tu_tensor(dev, EM_F32, EM_SHAPE(2), b);
    em_set_requires_grad(pa, true);
    em_set_requires_grad(pb, true);
    em_param_ref refs[2] = {{"a", pa, true}, {"b", pb, true}};
    em_adam_config cfg = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    em_optimizer *o = em_adam_new_params(refs, 2, &cfg);
    em_tensor *g = em_full(dev, EM_F32, EM_SHAPE(2), 1.0);
    em_set_grad(pa, g);
    em_release(g);
    assert_int_equal(em_optimizer_step(o), EM_OK);
    tu_check("b untouched", pb, EM_SHAPE(2), b, 0);
    /* first Adam step moves by lr * sign(g) (up to eps) */
    tu_check("a", pa, EM_SHAPE(2), (double[]){0.9, 1.9}, 1e-6);
    em_optimizer_free(o);
    em_release(pa);
    em_release(pb);
}

/* ---- clipping and scaling
 * ------------------------------------------------------------------------- */

typedef struct two {
    em_tensor *p[2];
    em_optimizer *o;
} two;

static two make_two(em_device *dev, double g0a, double g0b, double g1)
{
    two s;
    s.p[0] = em_zeros(dev, EM_F32, EM_SHAPE(2));
    s.p[1] = em_zeros(dev, EM_F32, EM_SHAPE(1));
    em_param_ref refs[2] = {{"x", s.p[0], true}, {"y", s.p[1], true}};
    for (int k = 0; k < 2; k++) em_set_requires_grad(s.p[k], true);
    double ga[2] = {g0a, g0b}, gb[1] = {g1};
    em_tensor *t0 = tu_tensor(dev, EM_F32, EM_SHAPE(2), ga),
              *t1 = tu_tensor(dev, EM_F32, EM_SHAPE(1), gb);
    assert_int_equal(em_set_grad(s.p[0], t0), EM_OK);
    assert_int_equal(em_set_grad(s.p[1], t1), EM_OK);
    em_release(t0);
    em_release(t1);
    em_sgd_config cfg = {.lr = 1};
    s.o = em_sgd_new_params(refs, 2, &cfg);
    assert_non_null(s.o);
    return s;
}

static void free_two(two *s)
{
    em_optimizer_free(s->o);
    em_release(s->p[0]);
    em_release(s->p[1]);
}

static void test_clipping(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        /* norm sqrt(3^2 + 4^2 + 12^2) = 13 */
        two s = make_two(dev, 3, -4, 12);
        double norm = 0;
        assert_int_equal(em_clip_grad_norm(s.o, 100, &norm), EM_OK);
        assert_true(fabs(norm - 13) < 1e-5);
        tu_check("unclipped", em_grad(s.p[0]), EM_SHAPE(2), (double[]){3, -4}, 0);
        assert_int_equal(em_clip_grad_norm(s.o, 6.5, &norm), EM_OK);
        double coef = 6.5 / (13 + 1e-6); /* torch.nn.utils.clip_grad_norm_ */
        tu_check("clipped x", em_grad(s.p[0]), EM_SHAPE(2), (double[]){3 * coef, -4 * coef}, 1e-6);
        tu_check("clipped y", em_grad(s.p[1]), EM_SHAPE(1), (double[]){12 * coef}, 1e-6);
        assert_int_equal(em_clip_grad_norm(s.o, 1, NULL), EM_OK);
        double n2 = 0;
        assert_int_equal(em_clip_grad_norm(s.o, 1e9, &n2), EM_OK);
        assert_true(fabs(n2 - 1) < 1e-5); /* the norm after the clip to 1 */
        free_two(&s);

        /* a tiny norm shows torch's 1e-6: coef 1e-6 / (1.3e-5 + 1e-6), not 1 / 13 */
        s = make_two(dev, 3e-6, -4e-6, 12e-6);
        assert_int_equal(em_clip_grad_norm(s.o, 1e-6, &norm), EM_OK);
        assert_true(fabs(norm - 13e-6) < 1e-11);
        coef = 1e-6 / (13e-6 + 1e-6);
        em_tensor *sx = em_mul_scalar(em_grad(s.p[0]), 1e6);
        tu_check("tiny x", sx, EM_SHAPE(2), (double[]){3 * coef, -4 * coef}, 1e-5);
        em_release(sx);
        free_two(&s);

        s = make_two(dev, 3, -4, 12);
        assert_int_equal(em_clip_grad_value(s.o, 3.5), EM_OK);
        tu_check("value x", em_grad(s.p[0]), EM_SHAPE(2), (double[]){3, -3.5}, 0);
        tu_check("value y", em_grad(s.p[1]), EM_SHAPE(1), (double[]){3.5}, 0);
        assert_int_equal(em_scale_grads(s.o, 0.25), EM_OK);
        tu_check("scaled x", em_grad(s.p[0]), EM_SHAPE(2), (double[]){0.75, -0.875}, 0);
        assert_int_equal(em_clip_grad_value(s.o, -1), EM_ERR_INVALID);
        assert_int_equal(em_clip_grad_norm(s.o, -1, NULL), EM_ERR_INVALID);
        em_optimizer_zero_grad(s.o);
        assert_int_equal(em_clip_grad_norm(s.o, 1, &norm), EM_OK); /* no gradients: norm 0 */
        assert_true(norm == 0);
        free_two(&s);
    }
}

/* ---- state for checkpoints ---------------------------------------------------------------------
 */

#define MAX_SAVED 8
typedef struct saved {
    char names[MAX_SAVED][64];
    em_tensor *t[MAX_SAVED];
    int n;
    const char *drop; /* a name the lookup pretends not to have */
} saved;

static bool save_state(const char *name, em_tensor *t, void *user)
{
    saved *s = user;
    assert_true(s->n < MAX_SAVED);
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    s->t[s->n++] = em_clone(t);
    return true;
}

static em_tensor *find_state(const char *name, void *user)
{
    saved *s = user;
    if (s->drop && !strcmp(name, s->drop)) return NULL;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return s->t[i];
    return NULL;
}

static void set_grads(em_tensor *const *ps, int step)
{
    for (int k = 0; k < 2; k++) {
        em_tensor *g = em_full(tu_devs[0], EM_F32, em_shape_of(ps[k]), 0.5 * step - k);
        assert_int_equal(em_set_grad(ps[k], g), EM_OK);
        em_release(g);
    }
}

static void test_state_roundtrip(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_tensor *pa[2] = {em_full(dev, EM_F32, EM_SHAPE(3), 1.0),
                        em_full(dev, EM_F32, EM_SHAPE(2, 2), -1.0)};
    for (int k = 0; k < 2; k++) em_set_requires_grad(pa[k], true);
    em_param_ref ra[2] = {{"w", pa[0], true}, {"b", pa[1], false}};
    em_adam_config cfg = {.lr = 0.1,
                          .beta1 = 0.9,
                          .beta2 = 0.99,
                          .eps = 1e-8,
                          .weight_decay = 0.1,
                          .decoupled = true};
    em_optimizer *a = em_adam_new_params(ra, 2, &cfg);
    for (int t = 1; t <= 3; t++) {
        set_grads(pa, t);
        assert_int_equal(em_optimizer_step(a), EM_OK);
    }
    saved s = {0};
    em_optimizer_state_visit(a, save_state, &s);
    assert_int_equal(s.n, 4);
    assert_string_equal(s.names[0], "w.exp_avg");
    assert_string_equal(s.names[1], "w.exp_avg_sq");
    assert_string_equal(s.names[2], "b.exp_avg");
    assert_string_equal(s.names[3], "b.exp_avg_sq");

    /* a second optimizer over copies of the parameters, its state loaded from the first */
    em_no_grad_begin(); /* plain copies, not recorded clones */
    em_tensor *pb[2] = {em_clone(pa[0]), em_clone(pa[1])};
    em_no_grad_end();
    for (int k = 0; k < 2; k++) em_set_requires_grad(pb[k], true);
    em_param_ref rb[2] = {{"w", pb[0], true}, {"b", pb[1], false}};
    em_optimizer *b = em_adam_new_params(rb, 2, &cfg);
    s.drop = "b.exp_avg_sq";
    assert_int_equal(em_optimizer_state_load(b, find_state, &s, 3), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_last_error(), "b.exp_avg_sq"));
    assert_int_equal(em_optimizer_steps(b), 0);
    s.drop = NULL;
    assert_int_equal(em_optimizer_state_load(b, find_state, &s, 3), EM_OK);
    assert_int_equal(em_optimizer_steps(b), 3);
    for (int t = 4; t <= 5; t++) {
        set_grads(pa, t);
        set_grads(pb, t);
        assert_int_equal(em_optimizer_step(a), EM_OK);
        assert_int_equal(em_optimizer_step(b), EM_OK);
    }
    for (int k = 0; k < 2; k++) {
        double *x = tu_read(pa[k]);
        tu_check("resumed", pb[k], em_shape_of(pa[k]), x, 0);
        free(x);
    }
    /* mis-shaped state */
    em_release(s.t[0]);
    s.t[0] = em_zeros(dev, EM_F32, EM_SHAPE(5));
    assert_int_equal(em_optimizer_state_load(b, find_state, &s, 3), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "w.exp_avg"));
    for (int i = 0; i < s.n; i++) em_release(s.t[i]);
    em_optimizer_free(a);
    em_optimizer_free(b);
    for (int k = 0; k < 2; k++) {
        em_release(pa[k]);
        em_release(pb[k]);
    }
}

/* ---- errors
 * -------------------------------------------------------------------------------------- */

static void test_config_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_tensor *p = em_zeros(dev, EM_F32, EM_SHAPE(2));
    em_tensor *ip = em_zeros(dev, EM_I32, EM_SHAPE(2));
    em_set_requires_grad(p, true);
    em_param_ref ok[1] = {{"p", p, true}}, bad[1] = {{"ints", ip, true}};
    em_sgd_config nest = {.lr = 0.1, .nesterov = true};
    assert_null(em_sgd_new_params(ok, 1, &nest));
    assert_non_null(strstr(em_last_error(), "nesterov"));
    em_sgd_config neg = {.lr = -1};
    assert_null(em_sgd_new_params(ok, 1, &neg));
    assert_non_null(strstr(em_last_error(), "lr"));
    em_adam_config betas = {.lr = 0.1, .beta1 = 1.0, .beta2 = 0.9};
    assert_null(em_adam_new_params(ok, 1, &betas));
    assert_non_null(strstr(em_last_error(), "betas"));
    em_sgd_config plain = {.lr = 0.1};
    assert_null(em_sgd_new_params(bad, 1, &plain));
    assert_non_null(strstr(em_last_error(), "ints"));
    assert_int_equal(em_optimizer_step(NULL), EM_ERR_INVALID);
    em_optimizer *o = em_sgd_new_params(ok, 1, &plain);
    assert_non_null(o);
    assert_int_equal(em_optimizer_step(o), EM_OK); /* no gradients: nothing to do */
    em_optimizer_free(o);
    em_release(p);
    em_release(ip);
}

/* ---- end to end ---------------------------------------------------------------------------------
 */

/* y = x w + b with w = [2, -1, 0.5], b = 0.3, learned from zeros with em_backward and Adam (the
 * loss reaches about 3e-7 in 150 steps). */
static void test_linear_regression(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_rng rng = em_rng_new(42);
    em_tensor *x = em_randn(dev, EM_F32, EM_SHAPE(64, 3), &rng);
    double wt[3] = {2, -1, 0.5};
    em_tensor *w_true = tu_tensor(dev, EM_F32, EM_SHAPE(3, 1), wt);
    em_tensor *y = em_add_scalar(em_take(em_matmul(x, w_true)), 0.3);
    em_tensor *w = em_zeros(dev, EM_F32, EM_SHAPE(3, 1)), *b = em_zeros(dev, EM_F32, EM_SHAPE(1));
    em_set_requires_grad(w, true);
    em_set_requires_grad(b, true);
    em_param_ref refs[2] = {{"w", w, true}, {"b", b, false}};
    em_adam_config cfg = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    em_optimizer *o = em_adam_new_params(refs, 2, &cfg);
    double loss_v = 0;
    for (int it = 0; it < 150; it++) {
        em_scope_begin();
        em_tensor *d = em_sub(em_add(em_matmul(x, w), b), y);
        em_tensor *loss = em_mean(em_mul(d, d), NULL, 0, false);
        assert_non_null(loss);
        if (em_backward(loss, NULL) != EM_OK) fail_msg("backward: %s", em_last_error());
        if (it == 149) loss_v = em_item(loss);
        em_scope_end(NULL, 0);
        assert_int_equal(em_optimizer_step(o), EM_OK);
        em_optimizer_zero_grad(o);
    }
    fprintf(stderr, "linear regression: loss %g after 150 Adam steps\n", loss_v);
    assert_true(loss_v < 1e-4);
    tu_check("w", w, EM_SHAPE(3, 1), wt, 1e-2);
    tu_check("b", b, EM_SHAPE(1), (double[]){0.3}, 1e-2);
    em_optimizer_free(o);
    em_release(x);
    em_release(w_true);
    em_release(y);
    em_release(w);
    em_release(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trajectories),  cmocka_unit_test(test_skips_params_without_grad),
        cmocka_unit_test(test_clipping),      cmocka_unit_test(test_state_roundtrip),
        cmocka_unit_test(test_config_errors), cmocka_unit_test(test_linear_regression),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
