/* test_gradcheck_reduce.c — finite-difference checks (float64, CPU) of the backward rules of the
 * reductions (sum, mean, prod with zeros, max/min with ties, logsumexp, var, std), cumsum,
 * softmax / log_softmax and layer_norm / rms_norm: several dims, keepdim, negative dims, views;
 * and an f32 check of a few cases on every device against the CPU f64 gradient. */
#include "autodiff/gradcheck.h"

#define RED(name, expr)                                                                            \
    static em_tensor *f_##name(em_tensor *const *in, const void *arg)                              \
    {                                                                                              \
        (void)arg;                                                                                 \
        const em_tensor *x = in[0];                                                                \
        return gc_wsum(expr);                                                                      \
    }
#define DIMS(...) ((const int[]){__VA_ARGS__}), (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))

RED(sum_all, em_sum(x, NULL, 0, false))
RED(sum_02_keep, em_sum(x, DIMS(0, 2), true))
RED(sum_neg, em_sum(x, DIMS(-1), false))
RED(sum_t, em_sum(em_transpose(x, 0, 2), DIMS(1), false))
RED(mean_all, em_mean(x, NULL, 0, false))
RED(mean_12, em_mean(x, DIMS(1, 2), false))
RED(mean_keep, em_mean(x, DIMS(-2), true))
RED(prod_1, em_prod(x, DIMS(1), false))
RED(prod_all, em_prod(x, NULL, 0, false))
RED(max_1, em_max(x, DIMS(1), false))
RED(max_keep, em_max(x, DIMS(0, 2), true))
RED(max_all, em_max(x, NULL, 0, false))
RED(min_neg, em_min(x, DIMS(-1), false))
RED(logsumexp_1, em_logsumexp(x, DIMS(1), false))
RED(logsumexp_all_keep, em_logsumexp(x, DIMS(0, 1, 2), true))
RED(var_1, em_var(x, DIMS(1), 1, false))
RED(var_02_pop, em_var(x, DIMS(0, 2), 0, true))
RED(var_all, em_var(x, NULL, 0, 1, false))
RED(std_neg, em_std(x, DIMS(-1), 1, false))
RED(std_keep_pop, em_std(x, DIMS(0, 1), 0, true))
RED(cumsum_1, em_cumsum(x, 1))
RED(cumsum_neg, em_cumsum(x, -1))
RED(cumsum_t, em_cumsum(em_transpose(x, 0, 1), 0))
RED(softmax_last, em_softmax(x, -1))
RED(softmax_0, em_softmax(x, 0))
RED(log_softmax_last, em_log_softmax(x, -1))
RED(log_softmax_1, em_log_softmax(x, 1))
RED(softmax_t, em_softmax(em_transpose(x, 0, 1), -1))
RED(layer_norm_plain, em_layer_norm(x, 1, NULL, NULL, 1e-5))
RED(rms_norm_plain, em_rms_norm(x, 2, NULL, 1e-6))

static em_tensor *f_layer_norm(em_tensor *const *in, const void *arg)
{
    (void)arg;
    return gc_wsum(em_layer_norm(in[0], 1, in[1], in[2], 1e-5));
}

static em_tensor *f_layer_norm2(em_tensor *const *in, const void *arg)
{
    (void)arg;
    return gc_wsum(em_layer_norm(in[0], 2, in[1], in[2], 1e-3));
}

static em_tensor *f_rms_norm(em_tensor *const *in, const void *arg)
{
    (void)arg;
    return gc_wsum(em_rms_norm(in[0], 1, in[1], 1e-5));
}

/* a residual block over a non-leaf h = 1.5 x: h's gradient from the skip connection reaches h
 * before the layer norm's backward, which takes it (ad_take_grad) and adds its dx to it; then
 * h feeds a second norm too, so h's node receives three contributions in all */
static em_tensor *f_layer_norm_residual(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *h = em_mul_scalar(in[0], 1.5);
    em_tensor *y = em_add(h, em_mul(em_layer_norm(h, 1, in[1], in[2], 1e-5), em_tanh(h)));
    return gc_wsum(em_add(y, em_rms_norm(h, 1, in[1], 1e-5)));
}

/* prod with zeros: row 0 none, row 1 one zero, row 2 two zeros */
static const double prod_zero_x[12] = {0.5, -1.5, 2, 1.25, 3, 0, -0.5, 2, 0, 1.5, 0, -2};
/* two-way ties: max in rows 0 and 2, min in row 2 (central differences give half to each) */
static const double max_tie_x[12] = {1, 3, 3, -1, 0.5, 2, -4, 1, -2, 7, -2, 7};

static const gc_case cases[] = {
    {.name = "sum_all", .f = f_sum_all, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "sum_02_keep", .f = f_sum_02_keep, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "sum_neg", .f = f_sum_neg, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "sum_t", .f = f_sum_t, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "mean_all", .f = f_mean_all, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "mean_12", .f = f_mean_12, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "mean_keep", .f = f_mean_keep, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "mean_0d", .f = f_mean_all, .nin = 1, .shape = {EM_SHAPE()}},
    {.name = "prod_1",
     .f = f_prod_1,
     .nin = 1,
     .shape = {EM_SHAPE(2, 3, 4)},
     .lo = {0.5},
     .hi = {1.5},
     .sign = 1,
     .device = true},
    {.name = "prod_all",
     .f = f_prod_all,
     .nin = 1,
     .shape = {EM_SHAPE(2, 3)},
     .lo = {0.5},
     .hi = {1.5},
     .sign = 1},
    {.name = "prod_zeros",
     .f = f_prod_1,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     .values = {prod_zero_x}},
    {.name = "max_1", .f = f_max_1, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "max_keep", .f = f_max_keep, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "max_all", .f = f_max_all, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "min_neg", .f = f_min_neg, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "max_ties", .f = f_max_1, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .values = {max_tie_x}},
    {.name = "min_ties",
     .f = f_min_neg,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     .values = {max_tie_x}},
    {.name = "logsumexp_1",
     .f = f_logsumexp_1,
     .nin = 1,
     .shape = {EM_SHAPE(2, 3, 4)},
     .device = true},
    {.name = "logsumexp_all_keep",
     .f = f_logsumexp_all_keep,
     .nin = 1,
     .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "var_1", .f = f_var_1, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "var_02_pop", .f = f_var_02_pop, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "var_all", .f = f_var_all, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "std_neg", .f = f_std_neg, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "std_keep_pop", .f = f_std_keep_pop, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "cumsum_1", .f = f_cumsum_1, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "cumsum_neg", .f = f_cumsum_neg, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "cumsum_t", .f = f_cumsum_t, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "softmax_last",
     .f = f_softmax_last,
     .nin = 1,
     .shape = {EM_SHAPE(2, 3, 4)},
     .device = true},
    {.name = "softmax_0", .f = f_softmax_0, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "log_softmax_last",
     .f = f_log_softmax_last,
     .nin = 1,
     .shape = {EM_SHAPE(2, 3, 4)},
     .device = true},
    {.name = "log_softmax_1", .f = f_log_softmax_1, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "softmax_t", .f = f_softmax_t, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "layer_norm",
     .f = f_layer_norm,
     .nin = 3,
     .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(4), EM_SHAPE(4)},
     .device = true},
    {.name = "layer_norm_2dims",
     .f = f_layer_norm2,
     .nin = 3,
     .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(3, 4), EM_SHAPE(3, 4)}},
    {.name = "layer_norm_plain", .f = f_layer_norm_plain, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "rms_norm",
     .f = f_rms_norm,
     .nin = 2,
     .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(4)},
     .device = true},
    {.name = "rms_norm_plain", .f = f_rms_norm_plain, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "layer_norm_residual",
     .f = f_layer_norm_residual,
     .nin = 3,
     .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(4), EM_SHAPE(4)},
     .device = true},
};

static void test_gradcheck(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    if (!cpu) skip();
    assert_int_equal(gc_check_cases(cases, (int)(sizeof cases / sizeof *cases), cpu), 0);
}

/* The same cases with elementwise outputs recomputed in backward instead of kept. */
static void test_gradcheck_recompute(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    if (!cpu) skip();
    em_set_recompute_policy(EM_RECOMPUTE_ELEMENTWISE);
    int fails = gc_check_cases(cases, (int)(sizeof cases / sizeof *cases), cpu);
    em_set_recompute_policy(EM_RECOMPUTE_NONE);
    assert_int_equal(fails, 0);
}

static void test_devices(void **state)
{
    (void)state;
    assert_int_equal(gc_check_devices(cases, (int)(sizeof cases / sizeof *cases), 2e-3), 0);
}

/* max over a row of three equal maxima gives a third of g to each (PyTorch's amax). */
static void test_max_three_ties(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    double v[4] = {2, 2, -1, 2};
    em_tensor *x = tu_tensor(cpu, EM_F64, EM_SHAPE(4), v);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    em_scope_begin();
    em_tensor *loss = em_mul_scalar(em_max(x, NULL, 0, false), 3.0);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    tu_check("max ties", em_grad(x), EM_SHAPE(4), (double[]){1, 1, 0, 1}, 1e-12);
    em_release(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_max_three_ties),
        cmocka_unit_test(test_gradcheck_recompute),
        cmocka_unit_test(test_devices),
    };
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
