/* test_gelu_backward.c — em_gelu_backward (tensor_grad.h): grad_out times the derivative of gelu
 * or gelu_tanh, on every device present and every float dtype it has, against float64 references
 * of the derivative (and, in f64, against a central difference of em_gelu itself); broadcasting
 * operands; with fusion on it is one op of a fused kernel (a scale of grad_out and a cast after
 * it run in the same launch). Non-float inputs get an error. */
#include "tensor_util.h"

#include "ember/runtime.h"
#include "ember/tensor_grad.h"

static double gelu_ref(double x, bool th)
{
    if (th) return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

static double dgelu_ref(double x, bool th)
{
    if (!th) return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    const double k = 0.7978845608028654, a = 0.044715;
    double t = tanh(k * (x + a * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * a * x * x);
}

/* grad * gelu'(x) over n values, each dtype the device has, both forms. */
static void test_values(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F32, EM_F16, EM_BF16, EM_F64};
    enum { N = 1003 };
    double x[N], g[N], ref[N];
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++) {
            em_device *d = tu_devs[di];
            if (!tu_has(d, dts[t])) continue;
            for (int th = 0; th < 2; th++) {
                em_scope_begin();
                tu_fill(x, N, -6, 6, 3 + (uint32_t)t);
                tu_fill(g, N, -2, 2, 9 + (uint32_t)t);
                x[0] = 0;
                x[1] = -30; /* far tails: the derivative is 0 and 1 */
                x[2] = 30;
                em_tensor *xt = tu_tensor(d, dts[t], EM_SHAPE(N), x), *gt = tu_tensor(d, dts[t], EM_SHAPE(N), g);
                for (int i = 0; i < N; i++) ref[i] = g[i] * dgelu_ref(x[i], th);
                em_tensor *r = em_gelu_backward(gt, xt, th);
                char what[96];
                snprintf(what, sizeof what, "gelu%s backward %s on %s", th ? "_tanh" : "",
                         em_scalar_name(dts[t]), em_device_name(d));
                if (!r) fail_msg("%s: %s", what, em_last_error());
                assert_int_equal(em_dtype(r), dts[t]);
                double *got = tu_read(r);
                bool ok = tu_close_n(what, got, ref, N, tu_tol_on(d, dts[t]) * 4);
                free(got);
                if (!ok) fail_msg("%s", what);
                em_scope_end(NULL, 0);
            }
        }
}

/* In f64 on the CPU the derivative agrees with a central difference of em_gelu's own values. */
static void test_matches_forward(void **state)
{
    (void)state;
    enum { N = 64 };
    double x[N], xp[N], xm[N], g[N];
    const double h = 1e-6;
    tu_fill(x, N, -4, 4, 77);
    for (int i = 0; i < N; i++) {
        xp[i] = x[i] + h;
        xm[i] = x[i] - h;
        g[i] = 1;
    }
    em_scope_begin();
    em_device *d = tu_devs[0];
    for (int th = 0; th < 2; th++) {
        em_tensor *fp = th ? em_gelu_tanh(tu_tensor(d, EM_F64, EM_SHAPE(N), xp)) : em_gelu(tu_tensor(d, EM_F64, EM_SHAPE(N), xp));
        em_tensor *fm = th ? em_gelu_tanh(tu_tensor(d, EM_F64, EM_SHAPE(N), xm)) : em_gelu(tu_tensor(d, EM_F64, EM_SHAPE(N), xm));
        em_tensor *r = em_gelu_backward(tu_tensor(d, EM_F64, EM_SHAPE(N), g), tu_tensor(d, EM_F64, EM_SHAPE(N), x), th);
        double *a = tu_read(fp), *b = tu_read(fm), *got = tu_read(r), fd[N];
        for (int i = 0; i < N; i++) {
            fd[i] = (a[i] - b[i]) / (2 * h);
            assert_true(fabs(gelu_ref(x[i], th) - (a[i] + b[i]) / 2) < 1e-9);
        }
        bool ok = tu_close_n(th ? "gelu_tanh' against differences" : "gelu' against differences", got, fd, N, 1e-7);
        free(a);
        free(b);
        free(got);
        assert_true(ok);
    }
    em_scope_end(NULL, 0);
}

/* Operands broadcast as em_mul's: a [3, 1] gradient against x [3, 5], and x [5] against [3, 5]. */
static void test_broadcast(void **state)
{
    (void)state;
    double x[15], g[15], ref[15];
    tu_fill(x, 15, -3, 3, 5);
    tu_fill(g, 15, -1, 1, 6);
    for (int di = 0; di < tu_ndev; di++) {
        em_scope_begin();
        em_device *d = tu_devs[di];
        em_tensor *xt = tu_tensor(d, EM_F32, EM_SHAPE(3, 5), x), *gt = tu_tensor(d, EM_F32, EM_SHAPE(3, 1), g);
        for (int i = 0; i < 15; i++) ref[i] = g[i / 5] * dgelu_ref(x[i], true);
        tu_check("gelu_tanh backward, grad [3, 1]", em_gelu_backward(gt, xt, true), EM_SHAPE(3, 5), ref, 1e-5);
        em_tensor *x5 = tu_tensor(d, EM_F32, EM_SHAPE(5), x), *g15 = tu_tensor(d, EM_F32, EM_SHAPE(3, 5), g);
        for (int i = 0; i < 15; i++) ref[i] = g[i] * dgelu_ref(x[i % 5], false);
        tu_check("gelu backward, x [5]", em_gelu_backward(g15, x5, false), EM_SHAPE(3, 5), ref, 1e-5);
        em_scope_end(NULL, 0);
    }
}

/* With fusion on, (2 g) * gelu'(x) cast to f16 is one launch. */
static void test_fuses(void **state)
{
    (void)state;
    double x[256], g[256], ref[256];
    tu_fill(x, 256, -3, 3, 15);
    tu_fill(g, 256, -1, 1, 16);
    em_scope_begin();
    em_device *d = tu_devs[0];
    em_tensor *xt = tu_tensor(d, EM_F32, EM_SHAPE(256), x), *gt = tu_tensor(d, EM_F32, EM_SHAPE(256), g);
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *r = em_cast(em_gelu_backward(em_mul_scalar(gt, 2.0), xt, true), EM_F16);
    assert_int_equal(em_realize(r), EM_OK);
    em_tensor_stats s1 = em_tensor_stats_get();
    for (int i = 0; i < 256; i++) ref[i] = tu_round(EM_F16, 2 * g[i] * dgelu_ref(x[i], true));
    tu_check("fused gelu_tanh backward", r, EM_SHAPE(256), ref, 2e-3);
    assert_int_equal(s1.launches - s0.launches, 1);
    em_scope_end(NULL, 0);
}

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    double v[4] = {1, 2, 3, 4};
    em_tensor *f = tu_tensor(tu_devs[0], EM_F32, EM_SHAPE(4), v), *i = tu_tensor(tu_devs[0], EM_I32, EM_SHAPE(4), v);
    tu_expect_error(em_gelu_backward(f, i, true), "floating-point");
    tu_expect_error(em_gelu_backward(f, tu_tensor(tu_devs[0], EM_F32, EM_SHAPE(3), v), false), "[3]");
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values), cmocka_unit_test(test_matches_forward), cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_fuses),  cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
