/* test_fused.c — the optimizer's fused kernels (src/optim/fused.c, src/kernels/optim_adam.ek) on
 * every device present and every float dtype it holds:
 *   - Adam, Adam with L2 decay and AdamW over several steps (a learning-rate change included),
 *     decay and no-decay parameters of odd and line-friendly sizes: each parameter, exp_avg and
 *     exp_avg_sq against a float64 host reference of PyTorch's formulas, and against a strided
 *     twin of the same values, which the fused kernel cannot take and adam.c's op-by-op update
 *     does (so the two paths are compared directly; every dtype on the CPU, f32 on the other
 *     devices); a strided gradient on a fused parameter;
 *   - clip_grad_norm against a float64 norm of the same gradients (several cubes per gradient,
 *     a strided gradient, parameters on two devices), the rescaled gradients, non-finite norms,
 *     and a gradient tensor shared by two parameters (rescaled once, not twice);
 *   - state a caller still holds is not written in place;
 *   - launches and allocations per step with the profiler (one launch per parameter, none
 *     allocated; clip: two launches per gradient and one read);
 *   - mirrors: bf16 copies written with the update equal the parameters cast, bit for bit. */
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

#define NP 5      /* parameters per case */
#define MAXN 4096 /* elements of the largest */
#define STEPS 5

/* 7 and 15 and 1023 take lines of 1, 4096 the device's widest; 1 and 2-D; decay mixed */
static const int RANK[NP] = {1, 2, 2, 2, 1};
static const int64_t DIMS[NP][2] = {{7}, {3, 5}, {33, 31}, {64, 64}, {1}};
static const bool DECAY[NP] = {false, true, true, false, true};

static em_shape shape_of(int k)
{
    em_shape s = {RANK[k], {0}};
    for (int d = 0; d < RANK[k]; d++) s.d[d] = DIMS[k][d];
    return s;
}

static int numel_of(int k)
{
    int n = 1;
    for (int d = 0; d < RANK[k]; d++) n *= (int)DIMS[k][d];
    return n;
}

typedef struct ref {
    double p[NP][MAXN], m[NP][MAXN], v[NP][MAXN];
} ref;

/* The gradient of element i of parameter k at step t (the same for every path). */
static double grad_at(int k, int i, int t)
{
    return sin(0.37 * i + 1.3 * k + 0.9 * t) * (1.0 + 0.5 * k) + 0.05 * t;
}

/* One float64 step of torch.optim.Adam/AdamW; 16-bit parameters are stored rounded. */
static void ref_step(const em_adam_config *a, ref *r, double g_in[NP][MAXN], int t, double lr,
                     em_scalar dt)
{
    for (int k = 0; k < NP; k++)
        for (int i = 0; i < numel_of(k); i++) {
            double g = g_in[k][i], *p = &r->p[k][i], *m = &r->m[k][i], *v = &r->v[k][i];
            if (a->weight_decay != 0 && DECAY[k]) {
                if (a->decoupled)
                    *p *= 1 - lr * a->weight_decay;
                else
                    g += a->weight_decay * *p;
            }
            *m = a->beta1 * *m + (1 - a->beta1) * g;
            *v = a->beta2 * *v + (1 - a->beta2) * g * g;
            double mhat = *m / (1 - pow(a->beta1, t)), vhat = *v / (1 - pow(a->beta2, t));
            *p -= lr * mhat / (sqrt(vhat) + a->eps);
            if (dt == EM_F16 || dt == EM_BF16) *p = tu_round(dt, *p);
        }
}

/* A strided view (every other element of the last dim of a twice-as-wide tensor) holding v. */
static em_tensor *strided_twin(em_device *dev, em_scalar dt, int k, const double *v)
{
    em_shape wide = shape_of(k);
    wide.d[wide.rank - 1] *= 2;
    int n = numel_of(k);
    double *w = malloc(sizeof(double) * (size_t)n * 2);
    assert_non_null(w);
    for (int i = 0; i < n; i++) {
        w[2 * i] = v[i];
        w[2 * i + 1] = 123.0; /* never read */
    }
    em_tensor *base = tu_tensor(dev, dt, wide, w);
    free(w);
    em_tensor *t = em_slice(base, wide.rank - 1, 0, wide.d[wide.rank - 1], 2);
    em_release(base);
    assert_non_null(t);
    em_tensor_untrack(t);
    if (n > 1) assert_false(em_is_contiguous(t));
    return t;
}

typedef struct lookup {
    const char *name;
    em_tensor *found;
} lookup;

static bool find(const char *name, em_tensor *t, void *user)
{
    lookup *l = user;
    if (strcmp(name, l->name) != 0) return true;
    l->found = t;
    return false;
}

static em_tensor *state_of(em_optimizer *o, const char *name)
{
    lookup l = {name, NULL};
    em_optimizer_state_visit(o, find, &l);
    if (!l.found) fail_msg("no state %s", name);
    return l.found;
}

/* Runs one configuration on dev in dtype dt: fused parameters p0.., and strided twins q0.. (the
 * op-by-op path) when `twins`. */
static void run_adam(const char *what, const em_adam_config *cfg, em_device *dev, em_scalar dt,
                     bool twins)
{
    static ref r; /* big: not on the stack */
    memset(&r, 0, sizeof r);
    em_tensor *ps[NP], *qs[NP] = {0};
    em_param_ref refs[2 * NP];
    char names[2 * NP][16];
    for (int k = 0; k < NP; k++) {
        tu_fill(r.p[k], (size_t)numel_of(k), -1, 1, (uint32_t)(11 + k));
        ps[k] = tu_tensor(dev, dt, shape_of(k), r.p[k]);
        snprintf(names[k], sizeof names[k], "p%d", k);
        assert_int_equal(em_set_requires_grad(ps[k], true), EM_OK);
        refs[k] = (em_param_ref){names[k], ps[k], DECAY[k]};
        if (!twins) continue;
        qs[k] = strided_twin(dev, dt, k, r.p[k]);
        snprintf(names[NP + k], sizeof names[k], "q%d", k);
        assert_int_equal(em_set_requires_grad(qs[k], true), EM_OK);
        refs[NP + k] = (em_param_ref){names[NP + k], qs[k], DECAY[k]};
    }
    em_optimizer *o = em_adam_new_params(refs, twins ? 2 * NP : NP, cfg);
    if (!o) fail_msg("%s: %s", what, em_last_error());
    double lr = cfg->lr;
    double tol = dt == EM_F64 ? 1e-10 : dt == EM_F32 ? 2e-5 : 2e-2;
    double twin_tol = dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 1e-6 : dt == EM_F16 ? 1e-3 : 8e-3;
    static double g[NP][MAXN];
    for (int t = 1; t <= STEPS; t++) {
        if (t == 4) em_optimizer_set_lr(o, lr *= 0.5);
        for (int k = 0; k < NP; k++) {
            for (int i = 0; i < numel_of(k); i++) g[k][i] = grad_at(k, i, t);
            em_tensor *gp = tu_tensor(dev, dt, shape_of(k), g[k]); /* rounds g[k] to dt */
            if (k ==
                2) { /* a strided gradient for the fused parameter: the transpose's transpose */
                em_shape sw = {2, {DIMS[k][1], DIMS[k][0]}};
                em_tensor *c = em_contiguous(em_take(em_transpose(gp, 0, 1)));
                em_tensor *s = em_transpose(c, 0, 1);
                assert_false(em_is_contiguous(s));
                assert_int_equal(em_shape_of(c).d[0], sw.d[0]);
                assert_int_equal(em_set_grad(ps[k], s), EM_OK);
                em_release(s);
                em_release(c);
            } else {
                assert_int_equal(em_set_grad(ps[k], gp), EM_OK);
            }
            if (twins) assert_int_equal(em_set_grad(qs[k], gp), EM_OK);
            em_release(gp);
        }
        if (em_optimizer_step(o) != EM_OK) fail_msg("%s step %d: %s", what, t, em_last_error());
        ref_step(cfg, &r, g, t, lr, dt);
        for (int k = 0; k < NP; k++) {
            char w[160], sn[32];
            em_shape sh = shape_of(k);
            snprintf(w, sizeof w, "%s %s p%d step %d", what, em_scalar_name(dt), k, t);
            tu_check(w, ps[k], sh, r.p[k], tol);
            if (!twins) {
                for (int s = 0; s < 2; s++) {
                    snprintf(sn, sizeof sn, "p%d.%s", k, s ? "exp_avg_sq" : "exp_avg");
                    snprintf(w, sizeof w, "%s %s %s step %d", what, em_scalar_name(dt), sn, t);
                    tu_check(w, state_of(o, sn), sh, s ? r.v[k] : r.m[k],
                             dt == EM_F64 ? 1e-10 : 2e-5);
                }
                continue;
            }
            double *fused = tu_read(ps[k]);
            snprintf(w, sizeof w, "%s %s p%d step %d (op-by-op twin)", what, em_scalar_name(dt), k,
                     t);
            tu_check(w, qs[k], sh, fused, twin_tol);
            free(fused);
            for (int s = 0; s < 2; s++) {
                const char *sfx = s ? "exp_avg_sq" : "exp_avg";
                snprintf(sn, sizeof sn, "p%d.%s", k, sfx);
                em_tensor *fs = state_of(o, sn);
                snprintf(w, sizeof w, "%s %s %s step %d", what, em_scalar_name(dt), sn, t);
                tu_check(w, fs, sh, s ? r.v[k] : r.m[k], dt == EM_F64 ? 1e-10 : 2e-5);
                double *fv = tu_read(fs);
                snprintf(sn, sizeof sn, "q%d.%s", k, sfx);
                snprintf(w, sizeof w, "%s %s %s step %d (op-by-op twin)", what, em_scalar_name(dt),
                         sn, t);
                tu_check(w, state_of(o, sn), sh, fv, dt == EM_F64 ? 1e-12 : 1e-6);
                free(fv);
            }
        }
    }
    em_optimizer_free(o);
    for (int k = 0; k < NP; k++) {
        em_release(ps[k]);
        em_release(qs[k]);
    }
}

static const struct {
    const char *name;
    em_adam_config cfg;
} ADAMS[] = {
    {"adam", {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
    {"adam-l2", {.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.3}},
    {"adamw",
     {.lr = 0.02,
      .beta1 = 0.9,
      .beta2 = 0.95,
      .eps = 1e-8,
      .weight_decay = 0.1,
      .decoupled = true}},
};

static void test_adam_fused(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++)
        for (size_t k = 0; k < sizeof tu_float_types / sizeof tu_float_types[0]; k++) {
            if (!tu_has(tu_devs[d], tu_float_types[k])) continue;
            /* the op-by-op twins in every dtype on the CPU, in f32 elsewhere: each of their
             * fused chains is compiled cold, and PoCL and lavapipe compile slowly */
            bool twins = tu_is_cpu(tu_devs[d]) || tu_float_types[k] == EM_F32;
            for (size_t i = 0; i < sizeof ADAMS / sizeof ADAMS[0]; i++)
                run_adam(ADAMS[i].name, &ADAMS[i].cfg, tu_devs[d], tu_float_types[k], twins);
        }
}

/* ---- clip_grad_norm -------------------------------------------------------------------------- */

#define NC 4
static const int64_t CLIP_N[NC] = {7, 100003, 6, 1}; /* 100003: seven cubes of partial sums */

/* Parameters of dt on dev with gradients g[k] (rounded to dt in place); parameter 2 is [2, 3]
 * and its gradient the strided transpose of a [3, 2] tensor. Returns an optimizer (SGD, never
 * stepped) over them. */
static em_optimizer *clip_setup(em_device *dev, em_scalar dt, em_tensor **ps, double **g)
{
    em_param_ref refs[NC];
    static const char *names[NC] = {"a", "b", "c", "d"};
    for (int k = 0; k < NC; k++) {
        tu_fill(g[k], (size_t)CLIP_N[k], -3, 3, (uint32_t)(5 + k));
        for (int64_t i = 0; i < CLIP_N[k]; i++) g[k][i] = tu_round(dt, g[k][i]);
        em_tensor *gt;
        if (k == 2) {
            double tr[6];
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++) tr[j * 2 + i] = g[k][i * 3 + j];
            em_tensor *c = tu_tensor(dev, dt, EM_SHAPE(3, 2), tr);
            gt = em_transpose(c, 0, 1);
            em_release(c);
            assert_false(em_is_contiguous(gt));
            ps[k] = em_zeros(dev, dt, EM_SHAPE(2, 3));
        } else {
            gt = tu_tensor(dev, dt, EM_SHAPE(CLIP_N[k]), g[k]);
            ps[k] = em_zeros(dev, dt, EM_SHAPE(CLIP_N[k]));
        }
        assert_int_equal(em_set_requires_grad(ps[k], true), EM_OK);
        assert_int_equal(em_set_grad(ps[k], gt), EM_OK);
        em_release(gt);
        refs[k] = (em_param_ref){names[k], ps[k], true};
    }
    em_sgd_config none = {.lr = 0};
    em_optimizer *o = em_sgd_new_params(refs, NC, &none);
    assert_non_null(o);
    return o;
}

static void test_clip_norm(void **state)
{
    (void)state;
    static double gbuf[NC][100003];
    double *g[NC];
    for (int k = 0; k < NC; k++) g[k] = gbuf[k];
    for (int d = 0; d < tu_ndev; d++)
        for (size_t t = 0; t < sizeof tu_float_types / sizeof tu_float_types[0]; t++) {
            em_scalar dt = tu_float_types[t];
            em_device *dev = tu_devs[d];
            if (!tu_has(dev, dt)) continue;
            em_tensor *ps[NC];
            em_optimizer *o = clip_setup(dev, dt, ps, g);
            double sq = 0;
            for (int k = 0; k < NC; k++)
                for (int64_t i = 0; i < CLIP_N[k]; i++) sq += g[k][i] * g[k][i];
            double want = sqrt(sq), norm = 0;
            assert_int_equal(em_clip_grad_norm(o, 1e30, &norm), EM_OK);
            double rel = dt == EM_F64 ? 1e-12 : 1e-5;
            if (!(fabs(norm - want) <= rel * want))
                fail_msg("%s %s: norm %.12g, float64 %.12g", em_device_name(dev),
                         em_scalar_name(dt), norm, want);
            /* clip to a third: every gradient times max / (norm + 1e-6) */
            double max = want / 3, coef = max / (norm + 1e-6);
            assert_int_equal(em_clip_grad_norm(o, max, &norm), EM_OK);
            for (int k = 0; k < NC; k++) {
                double *x = malloc(sizeof(double) * (size_t)CLIP_N[k]);
                for (int64_t i = 0; i < CLIP_N[k]; i++) x[i] = g[k][i] * coef;
                char w[96];
                snprintf(w, sizeof w, "%s %s clipped gradient %d", em_device_name(dev),
                         em_scalar_name(dt), k);
                tu_check(w, em_grad(ps[k]), em_shape_of(ps[k]), x, tu_tol(dt));
                free(x);
            }
            double after = 0;
            assert_int_equal(em_clip_grad_norm(o, 1e30, &after), EM_OK);
            if (!(fabs(after - coef * want) <= (dt == EM_F64 ? 1e-9 : 1e-2) * max))
                fail_msg("%s %s: norm %.12g after the clip to %.12g", em_device_name(dev),
                         em_scalar_name(dt), after, max);
            em_optimizer_free(o);
            for (int k = 0; k < NC; k++) em_release(ps[k]);
        }
}

/* A non-finite gradient gives a non-finite norm and leaves every gradient alone. */
static void test_clip_nonfinite(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        for (int which = 0; which < 2; which++) {
            double bad = which ? NAN : INFINITY;
            double a[3] = {1, bad, 2}, b[2] = {3, 4};
            em_tensor *pa = em_zeros(dev, EM_F32, EM_SHAPE(3)),
                      *pb = em_zeros(dev, EM_F32, EM_SHAPE(2));
            em_set_requires_grad(pa, true);
            em_set_requires_grad(pb, true);
            em_tensor *ga = tu_tensor(dev, EM_F32, EM_SHAPE(3), a),
                      *gb = tu_tensor(dev, EM_F32, EM_SHAPE(2), b);
            em_set_grad(pa, ga);
            em_set_grad(pb, gb);
            em_param_ref refs[2] = {{"a", pa, true}, {"b", pb, true}};
            em_sgd_config none = {.lr = 0};
            em_optimizer *o = em_sgd_new_params(refs, 2, &none);
            double norm = 0;
            assert_int_equal(em_clip_grad_norm(o, 1, &norm), EM_OK);
            assert_true(which ? isnan(norm) : isinf(norm));
            tu_check("nonfinite a", em_grad(pa), EM_SHAPE(3), a, 0);
            tu_check("nonfinite b", em_grad(pb), EM_SHAPE(2), b, 0);
            em_optimizer_free(o);
            em_release(ga);
            em_release(gb);
            em_release(pa);
            em_release(pb);
        }
    }
}

/* One gradient tensor held by two parameters is rescaled once (not in place twice), and the
 * gradients of parameters on two devices make one norm. */
static void test_clip_shared_and_devices(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0], *other = tu_devs[tu_ndev > 1 ? 1 : 0];
    double gv[2] = {3, 4}, hv[1] = {12};
    em_tensor *p1 = em_zeros(dev, EM_F32, EM_SHAPE(2)), *p2 = em_zeros(dev, EM_F32, EM_SHAPE(2));
    em_tensor *p3 = em_zeros(other, EM_F32, EM_SHAPE(1));
    em_tensor *g = tu_tensor(dev, EM_F32, EM_SHAPE(2), gv),
              *h = tu_tensor(other, EM_F32, EM_SHAPE(1), hv);
    em_tensor *all[3] = {p1, p2, p3};
    for (int k = 0; k < 3; k++) em_set_requires_grad(all[k], true);
    assert_int_equal(em_set_grad(p1, g), EM_OK);
    assert_int_equal(em_set_grad(p2, g), EM_OK);
    assert_int_equal(em_set_grad(p3, h), EM_OK);
    em_release(g);
    em_release(h);
    em_param_ref refs[3] = {{"p1", p1, true}, {"p2", p2, true}, {"p3", p3, true}};
    em_sgd_config none = {.lr = 0};
    em_optimizer *o = em_sgd_new_params(refs, 3, &none);
    double norm = 0, want = sqrt(9 + 16 + 9 + 16 + 144);
    assert_int_equal(em_clip_grad_norm(o, want / 2, &norm), EM_OK);
    assert_true(fabs(norm - want) < 1e-5 * want);
    double c = (want / 2) / (norm + 1e-6);
    tu_check("shared p1", em_grad(p1), EM_SHAPE(2), (double[]){3 * c, 4 * c}, 1e-6);
    tu_check("shared p2", em_grad(p2), EM_SHAPE(2), (double[]){3 * c, 4 * c}, 1e-6);
    tu_check("other device", em_grad(p3), EM_SHAPE(1), (double[]){12 * c}, 1e-6);
    em_optimizer_free(o);
    for (int k = 0; k < 3; k++) em_release(all[k]);
}

/* State that a caller still holds (a checkpoint writer, say) keeps its values: the fused step
 * writes a private copy. */
static void test_held_state_kept(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        em_tensor *p = em_full(dev, EM_F32, EM_SHAPE(8), 1.0);
        em_set_requires_grad(p, true);
        em_param_ref refs[1] = {{"w", p, true}};
        em_adam_config cfg = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
        em_optimizer *o = em_adam_new_params(refs, 1, &cfg);
        em_tensor *g = em_full(dev, EM_F32, EM_SHAPE(8), 0.5);
        em_set_grad(p, g);
        assert_int_equal(em_optimizer_step(o), EM_OK);
        em_tensor *held = em_retain(state_of(o, "w.exp_avg"));
        double *before = tu_read(held);
        assert_int_equal(em_optimizer_step(o), EM_OK);
        tu_check("held exp_avg", held, EM_SHAPE(8), before, 0);
        double *now = tu_read(state_of(o, "w.exp_avg"));
        assert_true(now[0] != before[0]); /* the optimizer's own state moved on */
        free(now);
        free(before);
        em_release(held);
        em_release(g);
        em_optimizer_free(o);
        em_release(p);
    }
}

/* ---- launches -------------------------------------------------------------------------------- */

static void test_launch_counts(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        enum { N = 6 };
        em_tensor *ps[N];
        em_param_ref refs[N];
        char names[N][8];
        for (int k = 0; k < N; k++) {
            ps[k] = em_full(dev, EM_F32, EM_SHAPE(16 + 5 * k), 0.5);
            em_set_requires_grad(ps[k], true);
            snprintf(names[k], sizeof names[k], "p%d", k);
            refs[k] = (em_param_ref){names[k], ps[k], k % 2 == 0};
        }
        em_adam_config cfg = {.lr = 0.01,
                              .beta1 = 0.9,
                              .beta2 = 0.95,
                              .eps = 1e-8,
                              .weight_decay = 0.1,
                              .decoupled = true};
        em_optimizer *o = em_adam_new_params(refs, N, &cfg);
        em_profile_counts c;
        em_profile_kernel kf;
        for (int t = 1; t <= 2; t++) {
            for (int k = 0; k < N; k++) {
                em_tensor *g = em_full(dev, EM_F32, em_shape_of(ps[k]), 3.0 + k);
                em_set_grad(ps[k], g);
                em_release(g);
            }
            assert_int_equal(em_flush(), EM_OK); /* the fills of the gradients run here */
            em_device_sync(dev);
            em_profile_enable(true);
            em_profile_reset();
            double norm;
            assert_int_equal(em_clip_grad_norm(o, 1.0, &norm), EM_OK); /* clips: norm > 1 */
            em_profile_get(&c);
            assert_true(em_profile_kernel_get("optim_sumsq", &kf));
            assert_int_equal(kf.launches, N);
            assert_true(em_profile_kernel_get("optim_scale", &kf));
            assert_int_equal(kf.launches, N);
            assert_int_equal(c.launches, 2 * N);
            assert_int_equal(c.reads, 1);
            assert_int_equal(c.allocs, 1); /* the partial sums */
            em_profile_reset();
            assert_int_equal(em_optimizer_step(o), EM_OK);
            em_profile_get(&c);
            em_profile_enable(false);
            assert_true(em_profile_kernel_get("optim_adam", &kf));
            assert_int_equal(kf.launches, N);
            if (t == 2) { /* the first step also makes the zero state */
                assert_int_equal(c.launches, N);
                assert_int_equal(c.allocs, 0);
            }
        }
        em_optimizer_free(o);
        for (int k = 0; k < N; k++) em_release(ps[k]);
    }
}

/* Mirrors (em_optimizer_set_mirror): bf16 copies of f32 parameters equal the parameters cast to
 * bf16 after every step, bit for bit — written in the fused launch (no extra launch: N per step,
 * as without mirrors) for contiguous parameters, by a cast for a strided one (the op-by-op path)
 * — on every device that holds bf16, with launch-argument and device scalars; a mirror of the
 * wrong shape is refused. */
static void mirror_case(em_device *dev, bool device_scalars, bool with_strided)
{
    enum { MAXP = 3 };
    const int N = with_strided ? 3 : 2;
    em_tensor *ps[MAXP], *mirror[MAXP];
    em_param_ref refs[MAXP];
    static const char *names[MAXP] = {"a", "b", "strided"};
    for (int k = 0; k < N; k++) {
        em_rng pr = em_rng_new(7u + (uint64_t)k);
        em_tensor *base = em_randn(dev, EM_F32, EM_SHAPE(24, 40), &pr);
        ps[k] = k == 2 ? em_transpose(base, 0, 1) : em_retain(base); /* a strided parameter */
        em_release(base);
        em_set_requires_grad(ps[k], true);
        mirror[k] = em_cast(ps[k], EM_BF16);
        assert_non_null(mirror[k]);
        assert_int_equal(em_realize(mirror[k]), EM_OK);
        refs[k] = (em_param_ref){names[k], ps[k], k != 1};
    }
    em_adam_config cfg = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                          .weight_decay = 0.1, .decoupled = true};
    em_optimizer *o = em_adam_new_params(refs, N, &cfg);
    assert_non_null(o);
    for (int k = 0; k < N; k++) assert_int_equal(em_optimizer_set_mirror(o, ps[k], mirror[k]), EM_OK);
    em_tensor *wrong = em_zeros(dev, EM_BF16, EM_SHAPE(3));
    assert_int_equal(em_optimizer_set_mirror(o, ps[0], wrong), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "does not match parameter a"));
    assert_int_equal(em_optimizer_set_mirror(o, wrong, NULL), EM_ERR_NOT_FOUND);
    em_clear_error();
    em_release(wrong);
    if (device_scalars) assert_int_equal(em_optimizer_device_scalars(o, true), EM_OK);
    em_rng r = em_rng_new(99);
    for (int t = 1; t <= 3; t++) {
        for (int k = 0; k < N; k++) {
            em_tensor *g = em_randn(dev, EM_F32, em_shape_of(ps[k]), &r);
            em_set_grad(ps[k], g);
            em_release(g);
        }
        if (device_scalars) assert_int_equal(em_optimizer_write_scalars(o), EM_OK);
        assert_int_equal(em_flush(), EM_OK); /* the gradients' fills run here */
        em_profile_enable(true);
        em_profile_reset();
        assert_int_equal(em_optimizer_step(o), EM_OK);
        em_profile_counts c;
        em_profile_get(&c);
        em_profile_enable(false);
        if (device_scalars) em_optimizer_set_steps(o, em_optimizer_steps(o) + 1);
        /* two fused launches write their mirrors; the strided one is updated op by op */
        em_profile_kernel kf;
        assert_true(em_profile_kernel_get(device_scalars ? "optim_adam_dev" : "optim_adam", &kf));
        assert_int_equal(kf.launches, 2);
        if (!with_strided && t > 1) assert_int_equal(c.launches, 2); /* no separate cast (the
                                                                  * first step makes state) */
        for (int k = 0; k < N; k++) {
            em_tensor *cast = em_cast(ps[k], EM_BF16);
            double *x = tu_read(cast), *y = tu_read(mirror[k]);
            for (int64_t i = 0; i < em_numel(cast); i++)
                if (x[i] != y[i])
                    fail_msg("mirror %s on %s, step %d: element %lld %.9g vs %.9g", names[k],
                             em_device_name(dev), t, (long long)i, y[i], x[i]);
            free(x);
            free(y);
            em_release(cast);
        }
        em_optimizer_zero_grad(o);
    }
    em_optimizer_free(o);
    for (int k = 0; k < N; k++) em_release(ps[k]), em_release(mirror[k]);
}

static void test_mirrors(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        if (!tu_has(tu_devs[d], EM_BF16)) continue;
        for (int ds = 0; ds < 2; ds++) {
            mirror_case(tu_devs[d], ds == 1, true);
            mirror_case(tu_devs[d], ds == 1, false);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adam_fused),      cmocka_unit_test(test_clip_norm),
        cmocka_unit_test(test_clip_nonfinite),  cmocka_unit_test(test_clip_shared_and_devices),
        cmocka_unit_test(test_held_state_kept), cmocka_unit_test(test_launch_counts),
        cmocka_unit_test(test_mirrors),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
