/* test_gradcheck_conv.c — the backward rules of conv2d, max_pool2d and avg_pool2d (rules_conv.c)
 * through the tape: em_backward of loss = sum(f(inputs) * R) in float64 on the CPU against central
 * finite differences of the same loss, for every element of every input. Cases: conv2d with bias,
 * groups and stride; with dilation and padding and no bias; only the weight requiring gradients;
 * max and avg pools with overlapping, padded windows; and a chain conv2d -> max_pool2d ->
 * avg_pool2d, where gradients flow through all three rules. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ember/autodiff.h"
#include "ember/tensor.h"

static em_device *g_cpu;

enum { MAX_IN = 3 };

typedef struct gc_case {
    const char *name;
    int nin; /* inputs: x, then weight and bias for conv cases */
    em_shape shape[MAX_IN];
    bool grad[MAX_IN]; /* which inputs require gradients */
    bool distinct;     /* x gets well-separated distinct values (max pooling: no near ties) */
    int kind;          /* 0 conv2d, 1 max_pool2d, 2 avg_pool2d, 3 conv -> max -> avg chain */
    int a, b, c, d;    /* conv: stride, padding, dilation, groups; pools: kernel, stride, padding */
} gc_case;

static size_t numel(em_shape s)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    return n;
}

static void fill(double *v, size_t n, double lo, double hi, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 99u;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v[i] = lo + (hi - lo) * (double)(s % 1000003u) / 1000003.0;
    }
}

static em_tensor *apply(const gc_case *k, em_tensor *const *in)
{
    switch (k->kind) {
    case 0:
        return em_conv2d(in[0], in[1], k->nin > 2 ? in[2] : NULL, k->a, k->b, k->c, k->d);
    case 1:
        return em_max_pool2d(in[0], k->a, k->b, k->c);
    case 2:
        return em_avg_pool2d(in[0], k->a, k->b, k->c);
    default: {
        em_tensor *y = em_conv2d(in[0], in[1], in[2], 1, 1, 1, 1);
        em_tensor *m = em_max_pool2d(y, 2, 0, 0);
        em_tensor *r = em_avg_pool2d(m, 3, 1, 1);
        em_release(y);
        em_release(m);
        return r;
    }
    }
}

/* loss = sum(f(in) * R) with the inputs made from host values; with `grads`, backpropagates and
 * copies each gradient (zeros when an input has none) into grads[i]. */
static double run(const gc_case *k, double *const *vals, const double *r, double **grads)
{
    em_scope_begin();
    em_tensor *in[MAX_IN] = {0};
    for (int i = 0; i < k->nin; i++) {
        in[i] = em_from_host(g_cpu, EM_F64, k->shape[i], vals[i]);
        assert_non_null(in[i]);
        if (grads && k->grad[i]) assert_int_equal(em_set_requires_grad(in[i], true), EM_OK);
    }
    em_tensor *out = apply(k, in);
    if (!out) fprintf(stderr, "%s: %s\n", k->name, em_last_error());
    assert_non_null(out);
    em_tensor *rt = em_from_host(g_cpu, EM_F64, em_shape_of(out), r);
    em_tensor *loss = em_sum(em_mul(out, rt), NULL, 0, false);
    assert_non_null(loss);
    double lv = em_item(loss);
    if (grads) {
        em_status st = em_backward(loss, NULL);
        if (st != EM_OK) fprintf(stderr, "%s: backward: %s\n", k->name, em_last_error());
        assert_int_equal(st, EM_OK);
        for (int i = 0; i < k->nin; i++) {
            em_tensor *g = em_grad(in[i]);
            size_t n = numel(k->shape[i]);
            if (!k->grad[i]) {
                assert_null(g);
                memset(grads[i], 0, n * sizeof(double));
                continue;
            }
            assert_non_null(g);
            assert_int_equal(em_dtype(g), EM_F64);
            assert_int_equal(em_numel(g), (int64_t)n);
            assert_int_equal(em_to_host(g, grads[i], n * sizeof(double)), EM_OK);
        }
    }
    em_scope_end(NULL, 0);
    return lv;
}

static void check_case(const gc_case *k)
{
    double *vals[MAX_IN] = {0}, *grads[MAX_IN] = {0};
    for (int i = 0; i < k->nin; i++) {
        size_t n = numel(k->shape[i]);
        vals[i] = malloc(n * sizeof(double));
        grads[i] = malloc(n * sizeof(double));
        fill(vals[i], n, -1, 1, (uint32_t)(17 * i + 3));
        if (i == 0 && k->distinct) { /* a shuffled ramp with gaps of 0.01 */
            for (size_t j = 0; j < n; j++)
                vals[0][j] = 0.01 * (double)((j * 7919u) % n) - 0.005 * (double)n;
        }
    }
    /* the output shape, from one plain forward */
    em_scope_begin();
    em_tensor *in[MAX_IN] = {0};
    for (int i = 0; i < k->nin; i++) in[i] = em_from_host(g_cpu, EM_F64, k->shape[i], vals[i]);
    em_tensor *o = apply(k, in);
    if (!o) fprintf(stderr, "%s: %s\n", k->name, em_last_error());
    assert_non_null(o);
    size_t nout = (size_t)em_numel(o);
    em_scope_end(NULL, 0);
    double *r = malloc(nout * sizeof(double) + 8);
    fill(r, nout, -1, 1, 77);

    run(k, vals, r, grads);
    const double eps = 1e-6;
    int bad = 0;
    for (int i = 0; i < k->nin; i++) {
        if (!k->grad[i]) continue;
        for (size_t j = 0; j < numel(k->shape[i]); j++) {
            double keep = vals[i][j];
            vals[i][j] = keep + eps;
            double lp = run(k, vals, r, NULL);
            vals[i][j] = keep - eps;
            double lm = run(k, vals, r, NULL);
            vals[i][j] = keep;
            double fd = (lp - lm) / (2 * eps);
            if (fabs(grads[i][j] - fd) > 1e-6 * (fabs(fd) > 1 ? fabs(fd) : 1)) {
                if (bad++ < 5)
                    fprintf(
                        stderr,
                        "%s: d loss / d input %d [%zu] is %.12g, finite differences say %.12g\n",
                        k->name, i, j, grads[i][j], fd);
            }
        }
    }
    for (int i = 0; i < k->nin; i++) {
        free(vals[i]);
        free(grads[i]);
    }
    free(r);
    if (bad) fail_msg("%s: %d gradient elements disagree with finite differences", k->name, bad);
}

static void test_conv2d(void **state)
{
    (void)state;
    static const gc_case cases[] = {
        {"conv2d groups 2, stride 2, bias",
         3,
         {EM_SHAPE(2, 4, 5, 6), EM_SHAPE(6, 2, 3, 2), EM_SHAPE(6)},
         {true, true, true},
         false,
         0,
         2,
         1,
         1,
         2},
        {"conv2d dilation 2, padding 2, no bias",
         2,
         {EM_SHAPE(1, 3, 6, 6), EM_SHAPE(4, 3, 3, 3)},
         {true, true},
         false,
         0,
         1,
         2,
         2,
         1},
        {"conv2d weight and bias only",
         3,
         {EM_SHAPE(2, 2, 4, 4), EM_SHAPE(3, 2, 2, 2), EM_SHAPE(3)},
         {false, true, true},
         false,
         0,
         1,
         0,
         1,
         1},
        {"conv2d input only, depthwise, stride 3",
         2,
         {EM_SHAPE(1, 3, 8, 7), EM_SHAPE(3, 1, 3, 3)},
         {true, false},
         false,
         0,
         3,
         1,
         1,
         3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

static void test_pools(void **state)
{
    (void)state;
    static const gc_case cases[] = {
        {"max_pool2d 3/2/1", 1, {EM_SHAPE(2, 2, 7, 7)}, {true}, true, 1, 3, 2, 1, 0},
        {"max_pool2d 2 (stride = kernel)", 1, {EM_SHAPE(1, 3, 5, 6)}, {true}, true, 1, 2, 0, 0, 0},
        {"avg_pool2d 3/2/1", 1, {EM_SHAPE(2, 2, 7, 7)}, {true}, false, 2, 3, 2, 1, 0},
        {"avg_pool2d 3/1/1", 1, {EM_SHAPE(1, 2, 5, 4)}, {true}, false, 2, 3, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

static void test_chain(void **state)
{
    (void)state;
    /* conv2d 3x3 padding 1 -> max_pool2d 2 -> avg_pool2d 3/1/1: x [1, 2, 6, 6] -> [1, 3, 3, 3] */
    static const gc_case k = {"conv2d -> max_pool2d -> avg_pool2d",
                              3,
                              {EM_SHAPE(1, 2, 6, 6), EM_SHAPE(3, 2, 3, 3), EM_SHAPE(3)},
                              {true, true, true},
                              true,
                              3,
                              0,
                              0,
                              0,
                              0};
    check_case(&k);
}

static int setup(void **state)
{
    (void)state;
    em_autodiff_init();
    g_cpu = em_device_open("cpu");
    return g_cpu ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(g_cpu);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_chain),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
