/* gradcheck.h — a finite-difference gradient checker for the autodiff tests (header-only).
 *
 * A case is a function f(inputs) -> scalar tensor built from tensor ops, and the shapes and value
 * ranges of its inputs. gc_check_cases computes, for every case, the analytic gradient of each
 * input with em_backward (float64 on the CPU device) and the numeric one by central differences
 * (eps 1e-6), compares them with rtol = atol = 1e-5, and reports each failing case by name.
 * gc_check_devices runs the cases flagged .device in float32 on every device present and compares
 * the device's analytic gradient with the CPU float64 one (loose tolerance), since some devices
 * have no float64. Inputs are random (seeded by the case and input) and uniform in [lo, hi], with
 * a random sign where .sign has the input's bit, so that values stay away from kinks; .values
 * gives fixed values instead. */
#ifndef EM_TESTS_AUTODIFF_GRADCHECK_H
#define EM_TESTS_AUTODIFF_GRADCHECK_H

#include "ember/autodiff.h"
#include "tensor/tensor_util.h"

#define GC_MAX_IN 4

/* Computes the scalar loss from in[0..nin) (new reference, or owned by the open scope). */
typedef em_tensor *(*gc_fn)(em_tensor *const *in, const void *arg);

typedef struct gc_case {
    const char *name;          /* reported on failure */
    gc_fn f;                   /* the function checked */
    const void *arg;           /* passed to f */
    int nin;                   /* inputs */
    em_shape shape[GC_MAX_IN]; /* each input's shape */
    double lo[GC_MAX_IN];      /* value range (both 0: [-2, 2]) */
    double hi[GC_MAX_IN];
    unsigned sign;                   /* bit i: input i gets a random sign (|x| in [lo, hi]) */
    unsigned constant;               /* bit i: input i is not differentiated */
    const double *values[GC_MAX_IN]; /* fixed values (NULL: random) */
    bool device;                     /* also checked in f32 on every device */
} gc_case;

/* ---- helpers for the functions checked ---------------------------------------------------------
 */

/* sum(t * W) with fixed weights W in [-1, 1] (seeded by t's numel): a loss that sees every element
 * of t with a different weight. */
static inline em_tensor *gc_wsum(const em_tensor *t)
{
    if (!t) return NULL;
    size_t n = (size_t)em_numel(t);
    double *w = malloc((n + 1) * sizeof *w);
    tu_fill(w, n, -1.0, 1.0, (uint32_t)n * 7u + 3u);
    em_tensor *wt = tu_tensor(em_tensor_device(t), em_dtype(t), em_shape_of(t), w);
    free(w);
    em_tensor *r = em_sum(em_mul(t, wt), NULL, 0, false);
    return r;
}

/* An index tensor (i64, or i32 where the device lacks i64) on like's device. */
static inline em_tensor *gc_index(const em_tensor *like, em_shape shape, const int64_t *v)
{
    em_device *dev = em_tensor_device(like);
    size_t n = 1;
    for (int i = 0; i < shape.rank; i++) n *= (size_t)shape.d[i];
    if (tu_has(dev, EM_I64)) return em_from_host(dev, EM_I64, shape, v);
    int32_t *v32 = malloc((n + 1) * sizeof *v32);
    for (size_t i = 0; i < n; i++) v32[i] = (int32_t)v[i];
    em_tensor *t = em_from_host(dev, EM_I32, shape, v32);
    free(v32);
    return t;
}

/* A bool mask on like's device. */
static inline em_tensor *gc_mask(const em_tensor *like, em_shape shape, const uint8_t *v)
{
    return em_from_host(em_tensor_device(like), EM_BOOL, shape, v);
}

/* ---- the checker ------------------------------------------------------------------------------
 */

static inline size_t gc_numel(em_shape s)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    return n;
}

/* The inputs' values: fixed, or random as the case asks (rounded to dt). Caller frees each. */
static inline void gc_values(const gc_case *c, int ci, em_scalar dt, double **v)
{
    for (int i = 0; i < c->nin; i++) {
        size_t n = gc_numel(c->shape[i]);
        v[i] = malloc((n + 1) * sizeof(double));
        if (c->values[i]) {
            memcpy(v[i], c->values[i], n * sizeof(double));
        } else {
            double lo = c->lo[i], hi = c->hi[i];
            if (lo == 0 && hi == 0) lo = -2, hi = 2;
            tu_fill(v[i], n, lo, hi, (uint32_t)(ci * 131 + i * 17 + 5));
            if (c->sign >> i & 1u) {
                double *s = malloc((n + 1) * sizeof(double));
                tu_fill(s, n, -1, 1, (uint32_t)(ci * 131 + i * 17 + 1001));
                for (size_t j = 0; j < n; j++)
                    if (s[j] < 0) v[i][j] = -v[i][j];
                free(s);
            }
        }
        for (size_t j = 0; j < n; j++) v[i][j] = tu_round(dt, v[i][j]);
    }
}

static inline em_tensor *gc_make(em_device *dev, em_scalar dt, em_shape shape, const double *v)
{
    size_t n = gc_numel(shape);
    double *copy = malloc((n + 1) * sizeof(double));
    memcpy(copy, v, n * sizeof(double));
    em_tensor *t = tu_tensor(dev, dt, shape, copy);
    free(copy);
    return t;
}

/* f's value at v (no gradients recorded); NaN with msg set on error. */
static inline double gc_eval(const gc_case *c, em_device *dev, em_scalar dt, double *const *v,
                             char *msg, size_t msz)
{
    em_tensor *in[GC_MAX_IN] = {0};
    for (int i = 0; i < c->nin; i++) in[i] = gc_make(dev, dt, c->shape[i], v[i]);
    em_scope_begin();
    em_tensor *loss = c->f(in, c->arg);
    double r = loss ? em_item(loss) : NAN;
    if (!loss) snprintf(msg, msz, "forward failed: %s", em_last_error());
    em_scope_end(NULL, 0);
    for (int i = 0; i < c->nin; i++) em_release(in[i]);
    return r;
}

/* The analytic gradients (grad[i]: numel doubles, zeros where em_grad is NULL); false with msg
 * on error. */
static inline bool gc_analytic(const gc_case *c, em_device *dev, em_scalar dt, double *const *v,
                               double **grad, char *msg, size_t msz)
{
    em_tensor *in[GC_MAX_IN] = {0};
    bool ok = true;
    for (int i = 0; i < c->nin; i++) {
        in[i] = gc_make(dev, dt, c->shape[i], v[i]);
        grad[i] = calloc(gc_numel(c->shape[i]) + 1, sizeof(double));
        if (!(c->constant >> i & 1u) && em_set_requires_grad(in[i], true) != EM_OK) {
            snprintf(msg, msz, "requires_grad: %s", em_last_error());
            ok = false;
        }
    }
    em_scope_begin();
    em_tensor *loss = ok ? c->f(in, c->arg) : NULL;
    if (ok && !loss) {
        snprintf(msg, msz, "forward failed: %s", em_last_error());
        ok = false;
    }
    if (ok && em_backward(loss, NULL) != EM_OK) {
        snprintf(msg, msz, "backward failed: %s", em_last_error());
        ok = false;
    }
    em_scope_end(NULL, 0);
    for (int i = 0; ok && i < c->nin; i++) {
        em_tensor *g = em_grad(in[i]);
        if (!g || (c->constant >> i & 1u)) continue;
        em_shape gs = em_shape_of(g);
        bool same = gs.rank == c->shape[i].rank;
        for (int d = 0; same && d < gs.rank; d++) same = gs.d[d] == c->shape[i].d[d];
        if (!same) {
            snprintf(msg, msz, "input %d: gradient of rank %d for an input of rank %d", i, gs.rank,
                     c->shape[i].rank);
            ok = false;
            break;
        }
        size_t n = gc_numel(gs);
        uint8_t *host = malloc(n * 8 + 8);
        if (em_to_host(g, host, n * 8 + 8) != EM_OK) {
            snprintf(msg, msz, "input %d: reading the gradient: %s", i, em_last_error());
            ok = false;
        }
        for (size_t j = 0; ok && j < n; j++) grad[i][j] = tn_host_get(em_dtype(g), host, j);
        free(host);
    }
    for (int i = 0; i < c->nin; i++) em_release(in[i]);
    return ok;
}

static inline void gc_free(double **v, int n)
{
    for (int i = 0; i < n; i++) {
        free(v[i]);
        v[i] = NULL;
    }
}

/* Checks one case in f64 on dev against central differences; true when it passes. */
static inline bool gc_check_one(const gc_case *c, int ci, em_device *dev)
{
    const double eps = 1e-6, rtol = 1e-5, atol = 1e-5;
    double *v[GC_MAX_IN] = {0}, *ga[GC_MAX_IN] = {0};
    char msg[512] = "";
    gc_values(c, ci, EM_F64, v);
    bool ok = gc_analytic(c, dev, EM_F64, v, ga, msg, sizeof msg);
    em_no_grad_begin();
    for (int i = 0; ok && i < c->nin; i++) {
        if (c->constant >> i & 1u) continue;
        size_t n = gc_numel(c->shape[i]);
        for (size_t j = 0; ok && j < n; j++) {
            double x = v[i][j];
            v[i][j] = x + eps;
            double fp = gc_eval(c, dev, EM_F64, v, msg, sizeof msg);
            v[i][j] = x - eps;
            double fm = gc_eval(c, dev, EM_F64, v, msg, sizeof msg);
            v[i][j] = x;
            double num = (fp - fm) / (2 * eps), an = ga[i][j];
            bool good = fabs(an - num) <= atol + rtol * fabs(num);
            if (isnan(num) && isnan(an)) good = true;
            if (!good) {
                if (!msg[0])
                    snprintf(msg, sizeof msg,
                             "input %d element %zu: analytic %.10g, numeric %.10g (x = %.6g)", i, j,
                             an, num, x);
                ok = false;
            }
        }
    }
    em_no_grad_end();
    if (!ok) fprintf(stderr, "gradcheck FAILED %s: %s\n", c->name, msg);
    gc_free(v, c->nin);
    gc_free(ga, c->nin);
    return ok;
}

/* Checks every case (f64, CPU); prints each failure and a summary. Returns the failures. */
static inline int gc_check_cases(const gc_case *cases, int n, em_device *cpu)
{
    int fails = 0;
    char names[2048] = "";
    for (int i = 0; i < n; i++) {
        if (!gc_check_one(&cases[i], i, cpu)) {
            fails++;
            if (strlen(names) + strlen(cases[i].name) + 3 < sizeof names) {
                strcat(names, " ");
                strcat(names, cases[i].name);
            }
        }
    }
    fprintf(stderr, "gradcheck: %d of %d cases passed%s%s\n", n - fails, n,
            fails ? "; failed:" : "", names);
    return fails;
}

/* The f32 analytic gradient of a case on dev against the f64 one on the CPU (normalized error
 * tolerance tol per input: |got - ref| <= tol * max(1, max |ref|)). */
static inline bool gc_device_one(const gc_case *c, int ci, em_device *cpu, em_device *dev,
                                 double tol)
{
    double *v[GC_MAX_IN] = {0}, *ref[GC_MAX_IN] = {0}, *got[GC_MAX_IN] = {0};
    char msg[512] = "";
    gc_values(c, ci, EM_F32, v); /* f32 values: both sides see the same inputs */
    bool ok = gc_analytic(c, cpu, EM_F64, v, ref, msg, sizeof msg);
    if (ok) ok = gc_analytic(c, dev, EM_F32, v, got, msg, sizeof msg);
    for (int i = 0; ok && i < c->nin; i++) {
        if (c->constant >> i & 1u) continue;
        size_t n = gc_numel(c->shape[i]);
        double scale = 1;
        for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(ref[i][j]));
        for (size_t j = 0; ok && j < n; j++)
            if (!(fabs(got[i][j] - ref[i][j]) <= tol * scale)) {
                snprintf(msg, sizeof msg, "input %d element %zu: f32 %.8g, f64 %.8g", i, j,
                         got[i][j], ref[i][j]);
                ok = false;
            }
    }
    if (!ok)
        fprintf(stderr, "device gradcheck FAILED %s on %s: %s\n", c->name, em_device_name(dev),
                msg);
    gc_free(v, c->nin);
    gc_free(ref, c->nin);
    gc_free(got, c->nin);
    return ok;
}

/* The CPU device, the float64 reference of every check: one of tu_devs, or opened by gc_setup
 * when $EMBER_TEST_DEVICE names another device (the checks then compare that device with it). */
static em_device *gc_cpu;
static bool gc_cpu_owned;

static inline int gc_setup(void **state)
{
    int rc = tu_setup(state);
    gc_cpu = NULL;
    gc_cpu_owned = false;
    for (int d = 0; d < tu_ndev; d++)
        if (tu_is_cpu(tu_devs[d])) gc_cpu = tu_devs[d];
    if (!gc_cpu) {
        gc_cpu = em_device_open("cpu");
        gc_cpu_owned = gc_cpu != NULL;
    }
    return gc_cpu ? rc : -1;
}

static inline int gc_teardown(void **state)
{
    if (gc_cpu_owned) em_device_close(gc_cpu);
    gc_cpu = NULL;
    gc_cpu_owned = false;
    return tu_teardown(state);
}

static inline em_device *cpu_dev(void) { return gc_cpu; }

/* Runs the .device cases on every device of tu_devs (gc_setup) against the CPU. Returns the
 * failures. */
static inline int gc_check_devices(const gc_case *cases, int n, double tol)
{
    em_device *cpu = gc_cpu;
    if (!cpu) return 0;
    int fails = 0, runs = 0;
    for (int d = 0; d < tu_ndev; d++)
        for (int i = 0; i < n; i++) {
            if (!cases[i].device) continue;
            runs++;
            if (!gc_device_one(&cases[i], i, cpu, tu_devs[d], tol)) fails++;
        }
    fprintf(stderr, "device gradcheck: %d of %d runs passed\n", runs - fails, runs);
    return fails;
}

/* The two tests every gradcheck file runs on its `cases` array: float64 finite differences on
 * the CPU (skipped without one) and f32 on every device against the CPU. */
#define GC_STANDARD_TESTS(cases)                                                                  \
    static void test_gradcheck(void **state)                                                      \
    {                                                                                             \
        (void)state;                                                                              \
        em_device *cpu = cpu_dev();                                                               \
        if (!cpu) skip();                                                                         \
        assert_int_equal(gc_check_cases(cases, (int)(sizeof cases / sizeof *cases), cpu), 0);     \
    }                                                                                             \
    static void test_devices(void **state)                                                        \
    {                                                                                             \
        (void)state;                                                                              \
        assert_int_equal(gc_check_devices(cases, (int)(sizeof cases / sizeof *cases), 2e-3), 0);   \
    }

#endif
