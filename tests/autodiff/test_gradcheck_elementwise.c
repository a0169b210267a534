/* test_gradcheck_elementwise.c — finite-difference checks (float64, CPU) of the backward rules of
 * the elementwise ops: unary math and activations, scalar variants, casts, binary ops with
 * broadcasting, where and masked_fill, on views (transposed, sliced, expanded inputs); the
 * conventions at kinks (relu, abs, clamp, maximum ties) against known values; and an f32 check of
 * a few cases on every device against the CPU f64 gradient. */
#include "autodiff/gradcheck.h"
#include "autodiff/internal.h"

/* ---- the functions checked ---------------------------------------------------------------------
 */

#define UN(name, expr)                                                                             \
    static em_tensor *f_##name(em_tensor *const *in, const void *arg)                              \
    {                                                                                              \
        (void)arg;                                                                                 \
        const em_tensor *x = in[0];                                                                \
        return gc_wsum(expr);                                                                      \
    }
#define BIN(name, expr)                                                                            \
    static em_tensor *f_##name(em_tensor *const *in, const void *arg)                              \
    {                                                                                              \
        (void)arg;                                                                                 \
        const em_tensor *a = in[0], *b = in[1];                                                    \
        return gc_wsum(expr);                                                                      \
    }

UN(neg, em_neg(x))
UN(abs, em_abs(x))
UN(exp, em_exp(x))
UN(ln, em_ln(x))
UN(log1p, em_log1p(x))
UN(expm1, em_expm1(x))
UN(sqrt, em_sqrt(x))
UN(rsqrt, em_rsqrt(x))
UN(reciprocal, em_reciprocal(x))
UN(sin, em_sin(x))
UN(cos, em_cos(x))
UN(tanh, em_tanh(x))
UN(erf, em_erf(x))
UN(sigmoid, em_sigmoid(x))
UN(relu, em_relu(x))
UN(gelu, em_gelu(x))
UN(gelu_tanh, em_gelu_tanh(x))
UN(silu, em_silu(x))
UN(softplus, em_softplus(x))
/* zero-gradient ops: only the product's other factor carries a gradient */
UN(sign, em_mul(x, em_sign(x)))
UN(floor, em_mul(x, em_floor(x)))
UN(ceil, em_mul(x, em_ceil(x)))
UN(round, em_mul(x, em_round(x)))
UN(clamp, em_clamp(x, -1.0, 1.0))
UN(pow_scalar, em_pow_scalar(x, 2.5))
UN(pow_scalar_int, em_pow_scalar(x, 3.0))
UN(pow_scalar_neg, em_pow_scalar(x, -1.5))
UN(pow_scalar_zero, em_add(em_pow_scalar(x, 0.0), x))
UN(add_scalar, em_add_scalar(x, 0.7))
UN(sub_scalar, em_sub_scalar(x, 0.7))
UN(mul_scalar, em_mul_scalar(x, -1.3))
UN(div_scalar, em_div_scalar(x, 0.4))
UN(rsub_scalar, em_rsub_scalar(x, 2.0))
UN(rdiv_scalar, em_rdiv_scalar(x, 1.5))
UN(maximum_scalar, em_maximum_scalar(x, 0.3))
UN(minimum_scalar, em_minimum_scalar(x, 0.3))
UN(clone, em_mul(em_clone(x), x))
UN(cast_same, em_exp(em_cast(x, EM_F64)))
UN(contiguous_t, em_sin(em_contiguous(em_transpose(x, 0, 1))))
UN(chain, em_tanh(em_mul(em_sigmoid(x), em_exp(em_neg(x)))))
UN(div_same, em_mul(em_div(x, x), x))
UN(reuse, em_mul(em_add(x, x), em_sin(x)))

BIN(add, em_add(a, b))
BIN(sub, em_sub(a, b))
BIN(mul, em_mul(a, b))
BIN(div, em_div(a, b))
BIN(pow, em_pow(a, b))
BIN(maximum, em_maximum(a, b))
BIN(minimum, em_minimum(a, b))
BIN(remainder, em_remainder(a, b))
BIN(mul_transposed, em_mul(em_transpose(a, 0, 1), b))
BIN(add_sliced, em_add(em_slice(a, 1, 1, 5, 2), b))
BIN(mul_expanded, em_mul(em_expand(a, EM_SHAPE(2, 3, 4)), b))

static em_tensor *f_where(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const uint8_t m[12] = {1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0};
    em_tensor *cond = gc_mask(in[0], EM_SHAPE(3, 4), m);
    return gc_wsum(em_where(cond, em_sin(in[0]), in[1]));
}

static em_tensor *f_masked_fill(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const uint8_t m[4] = {1, 0, 0, 1};
    em_tensor *mask = gc_mask(in[0], EM_SHAPE(1, 4), m);
    return gc_wsum(em_mul(em_masked_fill(in[0], mask, 2.5), in[0]));
}

/* ties: maximum(a, b) with some a == b; central differences also give half of g there */
static const double tie_a[6] = {0.5, -1.0, 2.0, 0.25, 1.5, -0.5};
static const double tie_b[6] = {0.5, 1.0, 2.0, -0.25, 1.5, -0.75};
/* clamp values kept away from the bounds */
static const double clamp_x[8] = {-1.7, -0.6, 0.3, 1.4, 0.9, -1.2, 0.05, 2.5};

#define POS(l, h) .lo = {l}, .hi = {h}

static const gc_case cases[] = {
    {.name = "neg", .f = f_neg, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .device = true},
    {.name = "abs", .f = f_abs, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.2, 2), .sign = 1},
    {.name = "exp", .f = f_exp, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .device = true},
    {.name = "ln", .f = f_ln, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.5, 3), .device = true},
    {.name = "log1p", .f = f_log1p, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(-0.5, 2)},
    {.name = "expm1", .f = f_expm1, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "sqrt", .f = f_sqrt, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.5, 3)},
    {.name = "rsqrt", .f = f_rsqrt, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.5, 3)},
    {.name = "reciprocal",
     .f = f_reciprocal,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.5, 2),
     .sign = 1},
    {.name = "sin", .f = f_sin, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "cos", .f = f_cos, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "tanh", .f = f_tanh, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .device = true},
    {.name = "erf", .f = f_erf, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "sigmoid", .f = f_sigmoid, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "relu", .f = f_relu, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.1, 2), .sign = 1},
    {.name = "gelu", .f = f_gelu, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .device = true},
    {.name = "gelu_tanh", .f = f_gelu_tanh, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .device = true},
    {.name = "silu", .f = f_silu, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "softplus", .f = f_softplus, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "sign", .f = f_sign, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.2, 2), .sign = 1},
    {.name = "floor", .f = f_floor, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.1, 0.9), .sign = 1},
    {.name = "ceil", .f = f_ceil, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.1, 0.9), .sign = 1},
    {.name = "round", .f = f_round, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.1, 0.4), .sign = 1},
    {.name = "clamp", .f = f_clamp, .nin = 1, .shape = {EM_SHAPE(2, 4)}, .values = {clamp_x}},
    {.name = "pow_scalar", .f = f_pow_scalar, .nin = 1, .shape = {EM_SHAPE(3, 4)}, POS(0.5, 2)},
    {.name = "pow_scalar_int",
     .f = f_pow_scalar_int,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.3, 2),
     .sign = 1},
    {.name = "pow_scalar_neg",
     .f = f_pow_scalar_neg,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.5, 2)},
    {.name = "pow_scalar_zero",
     .f = f_pow_scalar_zero,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.5, 2)},
    {.name = "add_scalar", .f = f_add_scalar, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "sub_scalar", .f = f_sub_scalar, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "mul_scalar", .f = f_mul_scalar, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "div_scalar", .f = f_div_scalar, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "rsub_scalar", .f = f_rsub_scalar, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "rdiv_scalar",
     .f = f_rdiv_scalar,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.5, 2),
     .sign = 1},
    {.name = "maximum_scalar",
     .f = f_maximum_scalar,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.35, 2),
     .sign = 1},
    {.name = "minimum_scalar",
     .f = f_minimum_scalar,
     .nin = 1,
     .shape = {EM_SHAPE(3, 4)},
     POS(0.35, 2),
     .sign = 1},
    {.name = "clone", .f = f_clone, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "cast_same", .f = f_cast_same, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "contiguous_t", .f = f_contiguous_t, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "chain", .f = f_chain, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "reuse", .f = f_reuse, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "add_broadcast",
     .f = f_add,
     .nin = 2,
     .shape = {EM_SHAPE(3, 1, 4), EM_SHAPE(2, 1)},
     .device = true},
    {.name = "sub_broadcast", .f = f_sub, .nin = 2, .shape = {EM_SHAPE(2, 1), EM_SHAPE(3, 1, 4)}},
    {.name = "mul_broadcast",
     .f = f_mul,
     .nin = 2,
     .shape = {EM_SHAPE(3, 1, 4), EM_SHAPE(2, 1)},
     .device = true},
    {.name = "mul_scalar_tensor", .f = f_mul, .nin = 2, .shape = {EM_SHAPE(3, 4), EM_SHAPE()}},
    {.name = "div_broadcast",
     .f = f_div,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(4)},
     .lo = {-2, 0.5},
     .hi = {2, 2},
     .sign = 2,
     .device = true},
    {.name = "pow",
     .f = f_pow,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(3, 1)},
     .lo = {0.5, -2},
     .hi = {2, 2},
     .device = true},
    {.name = "maximum", .f = f_maximum, .nin = 2, .shape = {EM_SHAPE(3, 4), EM_SHAPE(4)}},
    {.name = "minimum", .f = f_minimum, .nin = 2, .shape = {EM_SHAPE(2, 1, 4), EM_SHAPE(3, 1)}},
    {.name = "maximum_ties",
     .f = f_maximum,
     .nin = 2,
     .shape = {EM_SHAPE(6), EM_SHAPE(6)},
     .values = {tie_a, tie_b}},
    {.name = "minimum_ties",
     .f = f_minimum,
     .nin = 2,
     .shape = {EM_SHAPE(6), EM_SHAPE(6)},
     .values = {tie_a, tie_b}},
    {.name = "remainder",
     .f = f_remainder,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(4)},
     .lo = {-3, 0.7},
     .hi = {3, 2},
     .sign = 2},
    {.name = "mul_transposed",
     .f = f_mul_transposed,
     .nin = 2,
     .shape = {EM_SHAPE(4, 3), EM_SHAPE(3, 4)}},
    {.name = "add_sliced", .f = f_add_sliced, .nin = 2, .shape = {EM_SHAPE(3, 6), EM_SHAPE(3, 2)}},
    {.name = "mul_expanded",
     .f = f_mul_expanded,
     .nin = 2,
     .shape = {EM_SHAPE(3, 1), EM_SHAPE(2, 3, 4)}},
    {.name = "div_same", .f = f_div_same, .nin = 1, .shape = {EM_SHAPE(4)}, POS(0.5, 2)},
    {.name = "where",
     .f = f_where,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(4)},
     .device = true},
    {.name = "masked_fill", .f = f_masked_fill, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
};

static void test_gradcheck(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    if (!cpu) skip();
    int n = (int)(sizeof cases / sizeof *cases);
    assert_int_equal(gc_check_cases(cases, n, cpu), 0);
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

/* ---- conventions at kinks and dtypes, against known values ------------------------------------
 */

/* d/dx of sum(f(x)) for x given, against expected values. */
static void check_grad1(em_tensor *(*f)(const em_tensor *), const double *x, const double *want,
                        int n, const char *what)
{
    em_device *cpu = cpu_dev();
    double *v = malloc(sizeof(double) * (size_t)n);
    memcpy(v, x, sizeof(double) * (size_t)n);
    em_tensor *t = tu_tensor(cpu, EM_F64, EM_SHAPE(n), v);
    free(v);
    assert_int_equal(em_set_requires_grad(t, true), EM_OK);
    em_scope_begin();
    em_tensor *loss = em_sum(f(t), NULL, 0, false);
    assert_non_null(loss);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    tu_check(what, em_grad(t), EM_SHAPE(n), want, 1e-12);
    em_release(t);
}

static em_tensor *relu1(const em_tensor *x)
{
    return em_relu(x);
}
static em_tensor *abs1(const em_tensor *x)
{
    return em_abs(x);
}
static em_tensor *clamp1(const em_tensor *x)
{
    return em_clamp(x, -1, 1);
}
static em_tensor *maxs1(const em_tensor *x)
{
    return em_maximum_scalar(x, 1);
}
static em_tensor *pow1(const em_tensor *x)
{
    return em_pow_scalar(x, 2);
}

static void test_kinks(void **state)
{
    (void)state;
    static const double x[5] = {-1, 0, 1, 2, -2};
    check_grad1(relu1, x, (double[]){0, 0, 1, 1, 0}, 5, "relu at 0");
    check_grad1(abs1, x, (double[]){-1, 0, 1, 1, -1}, 5, "abs at 0");
    check_grad1(clamp1, x, (double[]){1, 1, 1, 0, 0}, 5, "clamp at the bounds");
    check_grad1(maxs1, x, (double[]){0, 0, 0.5, 1, 0}, 5, "maximum_scalar tie");
    check_grad1(pow1, x, (double[]){-2, 0, 2, 4, -4}, 5, "pow_scalar 2");
}

/* The gradient of an f32 input of a promoted op comes back in f32; a cast's gradient is cast. */
static void test_dtypes(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    double xv[3] = {1.5, -2, 0.25}, yv[3] = {2, 3, -4};
    em_tensor *x = tu_tensor(cpu, EM_F64, EM_SHAPE(3), xv);
    em_tensor *y = tu_tensor(cpu, EM_F32, EM_SHAPE(3), yv);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    assert_int_equal(em_set_requires_grad(y, true), EM_OK);
    em_scope_begin();
    /* sum(x * y) + sum(3 * cast(x, f32)) */
    em_tensor *l1 = em_sum(em_mul(x, y), NULL, 0, false);
    em_tensor *l2 = em_sum(em_mul_scalar(em_cast(x, EM_F32), 3), NULL, 0, false);
    em_tensor *loss = em_add(l1, l2);
    assert_non_null(loss);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    assert_non_null(em_grad(x));
    assert_non_null(em_grad(y));
    assert_int_equal(em_dtype(em_grad(x)), EM_F64);
    assert_int_equal(em_dtype(em_grad(y)), EM_F32);
    tu_check("d x", em_grad(x), EM_SHAPE(3), (double[]){5, 6, -1}, 1e-6);
    tu_check("d y", em_grad(y), EM_SHAPE(3), xv, 1e-6);
    em_release(x);
    em_release(y);
}

/* Every op but convolution and pooling has a rule; the table answers out-of-range ids. */
static void test_table(void **state)
{
    (void)state;
    for (int op = EM_TOP_NEG; op < EM_TOP_CONV2D; op++) {
        if (!ad_rule_for((em_tensor_op)op)->backward)
            fprintf(stderr, "no rule for %s\n", em_top_name(op));
        assert_non_null(ad_rule_for((em_tensor_op)op)->backward);
    }
    assert_null(ad_rule_for(EM_TOP_NONE)->backward);
    assert_null(ad_rule_for(EM_TOP_COUNT)->backward);
    assert_null(ad_rule_for((em_tensor_op)-3)->backward);
}

/* ad_sum_to: sums over broadcast dims (known values) and names the sizes of a mismatch. */
static void test_sum_to(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    double v[24];
    for (int i = 0; i < 24; i++) v[i] = i;
    em_tensor *g = tu_tensor(cpu, EM_F64, EM_SHAPE(2, 3, 4), v);
    em_tensor *s = ad_sum_to(g, EM_SHAPE(3, 1));
    /* row r of [3, 1]: sum over the 2 leading and 4 last entries of rows r */
    double want[3];
    for (int r = 0; r < 3; r++) {
        want[r] = 0;
        for (int a = 0; a < 2; a++)
            for (int c = 0; c < 4; c++) want[r] += v[a * 12 + r * 4 + c];
    }
    tu_check("sum_to [3, 1]", s, EM_SHAPE(3, 1), want, 1e-12);
    em_release(s);
    em_tensor *same = ad_sum_to(g, EM_SHAPE(2, 3, 4));
    assert_ptr_equal(same, g);
    em_release(same);
    em_tensor *bad = ad_sum_to(g, EM_SHAPE(2, 4));
    em_tensor *bad2 = bad ? NULL : ad_sum_to(g, EM_SHAPE(1, 2, 3, 4));
    char msg[256];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    em_release(g);
    em_release(bad);
    em_release(bad2);
    assert_null(bad);
    assert_null(bad2);
    assert_non_null(strstr(msg, "[2, 3, 4]"));
    assert_non_null(strstr(msg, "[1, 2, 3, 4]"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),     cmocka_unit_test(test_sum_to),
        cmocka_unit_test(test_gradcheck), cmocka_unit_test(test_kinks),
        cmocka_unit_test(test_dtypes),    cmocka_unit_test(test_gradcheck_recompute),
        cmocka_unit_test(test_devices),
    };
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
