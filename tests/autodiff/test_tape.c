/* test_tape.c — the autodiff tape on the CPU: backward through small graphs against gradients
 * worked out by hand (mul/add/sum/mean/exp chains, broadcasting reduced back to each input's
 * shape, a tensor used twice), accumulation across backward calls and zero_grad, retain and the
 * error of a second backward without it, no-grad and detach, the errors of the user API, donation
 * (em_take) inside a recorded chain, in-place writes, a long chain (iterative walk and release),
 * casts, and the recompute policy (the same gradients bit for bit, fewer saved bytes, nothing
 * held through a view of a recomputed tensor). Every test
 * ends with the tape empty and the device pool holding no more than it did before. */
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
#include "ember/tensor_op.h"

static em_device *dev;
static uint64_t pool_base;

static int setup(void **state)
{
    (void)state;
    dev = em_device_open("cpu");
    if (!dev) return -1;
    em_autodiff_init();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    return 0;
}

static uint64_t pool_in_use(void)
{
    em_pool_stats s;
    em_device_pool_stats(dev, &s);
    return s.bytes_in_use;
}

/* Each test: starts with the tape empty and notes the pool's use ... */
static int before(void **state)
{
    (void)state;
    em_tape_stats s = em_tape_stats_get();
    assert_int_equal(s.nodes, 0);
    assert_int_equal(s.saved_bytes, 0);
    pool_base = pool_in_use();
    return 0;
}

/* ... and ends with it empty again and every buffer it made returned. */
static int after(void **state)
{
    (void)state;
    em_tape_stats s = em_tape_stats_get();
    assert_int_equal(s.nodes, 0);
    assert_int_equal(s.saved_bytes, 0);
    assert_int_equal(pool_in_use(), pool_base);
    return 0;
}

/* An f64 tensor holding v (the caller owns it). */
static em_tensor *tensor(em_shape shape, const double *v)
{
    em_tensor *t = em_from_host(dev, EM_F64, shape, v);
    assert_non_null(t);
    return t;
}

/* A leaf requiring gradients. */
static em_tensor *param(em_shape shape, const double *v)
{
    em_tensor *t = tensor(shape, v);
    assert_int_equal(em_set_requires_grad(t, true), EM_OK);
    return t;
}

static void read_t(const em_tensor *t, double *out, size_t n)
{
    assert_non_null(t);
    assert_int_equal(em_numel(t), (int64_t)n);
    assert_int_equal(em_to_host(t, out, n * sizeof *out), EM_OK);
}

/* Checks t's gradient against ref (relative 1e-12). */
static void check_grad(const em_tensor *t, const double *ref, size_t n)
{
    em_tensor *g = em_grad(t);
    assert_non_null(g);
    double got[64];
    assert_true(n <= 64);
    read_t(g, got, n);
    for (size_t i = 0; i < n; i++) {
        if (fabs(got[i] - ref[i]) > 1e-12 * (1 + fabs(ref[i]))) {
            fail_msg("grad[%zu] = %.17g, expected %.17g", i, got[i], ref[i]);
        }
    }
}

static void expect_error(em_status st, const char *part)
{
    assert_int_not_equal(st, EM_OK);
    if (!strstr(em_last_error(), part))
        fail_msg("error \"%s\" lacks \"%s\"", em_last_error(), part);
}

/* ---- gradients of small graphs -----------------------------------------------------------------
 */

static void test_exp_mul_sum(void **state)
{
    (void)state;
    double xv[4] = {-1.5, 0.25, 1, 2};
    em_tensor *x = param(EM_SHAPE(4), xv);
    em_scope_begin();
    /* loss = sum(exp(x) * x): d/dx = exp(x) (1 + x) */
    em_tensor *loss = em_sum(em_mul(em_exp(x), x), NULL, 0, false);
    assert_true(em_requires_grad(loss));
    assert_false(em_is_leaf(loss));
    assert_true(em_is_leaf(x));
    assert_true(em_tape_stats_get().nodes == 3);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    assert_false(em_requires_grad(loss));
    em_scope_end(NULL, 0);
    double ref[4];
    for (int i = 0; i < 4; i++) ref[i] = exp(xv[i]) * (1 + xv[i]);
    check_grad(x, ref, 4);
    em_release(x);
}

/* The gradient of sum(x) is the scalar seed broadcast to x's shape (a stride-0 view): the leaf
 * must receive a contiguous tensor of its own, which optimizers update in place. */
static void test_leaf_grad_is_contiguous(void **state)
{
    (void)state;
    double xv[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *x = param(EM_SHAPE(2, 3), xv);
    em_scope_begin();
    assert_int_equal(em_backward(em_sum(x, NULL, 0, false), NULL), EM_OK);
    em_scope_end(NULL, 0);
    const em_tensor *g = em_grad(x);
    assert_non_null(g);
    assert_true(em_is_contiguous(g));
    assert_true(em_tensor_exclusive(g));
    double ref[6] = {1, 1, 1, 1, 1, 1};
    check_grad(x, ref, 6);
    em_release(x);
}

static void test_mean_and_scalars(void **state)
{
    (void)state;
    double xv[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *x = param(EM_SHAPE(2, 3), xv);
    em_scope_begin();
    /* loss = mean((3 - x / 2)^2 - 1): d/dx = 2 (3 - x/2)(-1/2) / 6 */
    em_tensor *u = em_rsub_scalar(em_div_scalar(x, 2), 3);
    em_tensor *loss = em_mean(em_sub_scalar(em_mul(u, u), 1), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    double ref[6];
    for (int i = 0; i < 6; i++) ref[i] = -(3 - xv[i] / 2) / 6;
    check_grad(x, ref, 6);
    em_release(x);
}

static void test_broadcast_reduces_to_shape(void **state)
{
    (void)state;
    double av[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {0.5, -1, 2}, cv[2] = {3, -2};
    em_tensor *a = param(EM_SHAPE(2, 3), av), *b = param(EM_SHAPE(3), bv),
              *c = param(EM_SHAPE(2, 1), cv);
    em_scope_begin();
    /* loss = sum(a * b + c): da = b (broadcast), db = column sums of a, dc = 3 per row */
    em_tensor *loss = em_sum(em_add(em_mul(a, b), c), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    double ga[6] = {0.5, -1, 2, 0.5, -1, 2}, gb[3] = {5, 7, 9}, gc[2] = {3, 3};
    check_grad(a, ga, 6);
    check_grad(b, gb, 3);
    check_grad(c, gc, 2);
    em_shape s = em_shape_of(em_grad(c));
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.d[0], 2);
    assert_int_equal(s.d[1], 1);
    em_release(a);
    em_release(b);
    em_release(c);
}

static void test_used_twice_accumulates(void **state)
{
    (void)state;
    double xv[3] = {-2, 0.5, 3};
    em_tensor *x = param(EM_SHAPE(3), xv);
    em_scope_begin();
    /* loss = sum(x * x + x): 2x + 1; then a second backward adds the same again */
    em_tensor *loss = em_sum(em_add(em_mul(x, x), x), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    double ref[3];
    for (int i = 0; i < 3; i++) ref[i] = 2 * xv[i] + 1;
    check_grad(x, ref, 3);
    em_tensor *loss2 = em_sum(em_add(em_mul(x, x), x), NULL, 0, false);
    assert_int_equal(em_backward(loss2, NULL), EM_OK);
    for (int i = 0; i < 3; i++) ref[i] *= 2;
    check_grad(x, ref, 3);
    em_scope_end(NULL, 0);
    em_zero_grad(x);
    assert_null(em_grad(x));
    em_release(x);
}

static void test_retain_and_second_backward(void **state)
{
    (void)state;
    double xv[3] = {0.1, 0.2, 0.3};
    em_tensor *x = param(EM_SHAPE(3), xv);
    em_scope_begin();
    em_tensor *loss = em_sum(em_tanh(em_mul_scalar(x, 2)), NULL, 0, false);
    assert_int_equal(em_backward_retain(loss, NULL), EM_OK);
    double ref[3];
    for (int i = 0; i < 3; i++) ref[i] = 2 * (1 - tanh(2 * xv[i]) * tanh(2 * xv[i]));
    check_grad(x, ref, 3);
    assert_true(em_requires_grad(loss));
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    for (int i = 0; i < 3; i++) ref[i] *= 2;
    check_grad(x, ref, 3);
    /* the graph is gone now */
    expect_error(em_backward(loss, NULL), "already freed");
    check_grad(x, ref, 3);
    em_scope_end(NULL, 0);
    em_release(x);
}

static void test_shared_subgraph_freed(void **state)
{
    (void)state;
    double xv[2] = {1, 2};
    em_tensor *x = param(EM_SHAPE(2), xv);
    em_scope_begin();
    em_tensor *h = em_exp(x);
    em_tensor *l1 = em_sum(h, NULL, 0, false), *l2 = em_mean(h, NULL, 0, false);
    assert_int_equal(em_backward(l1, NULL), EM_OK);
    expect_error(em_backward(l2, NULL), "already freed");
    em_scope_end(NULL, 0);
    em_release(x);
}

static void test_grad_root(void **state)
{
    (void)state;
    double xv[3] = {1, 2, 3}, gv[3] = {1, -1, 0.5};
    em_tensor *x = param(EM_SHAPE(3), xv);
    em_scope_begin();
    em_tensor *y = em_mul_scalar(x, 2);
    expect_error(em_backward(y, NULL), "one element");
    em_tensor *bad = tensor(EM_SHAPE(2), gv);
    expect_error(em_backward(y, bad), "does not match");
    em_tensor *g = tensor(EM_SHAPE(3), gv);
    assert_int_equal(em_backward(y, g), EM_OK);
    double ref[3] = {2, -2, 1};
    check_grad(x, ref, 3);
    /* the gradient is x's own: writing the caller's grad_root does not change it */
    em_tensor *z = em_zeros(dev, EM_F64, EM_SHAPE(3));
    assert_int_equal(em_copy_(g, z), EM_OK);
    check_grad(x, ref, 3);
    em_scope_end(NULL, 0);
    em_release(x);
}

static void test_backward_of_leaf(void **state)
{
    (void)state;
    double xv[1] = {4};
    em_tensor *x = param(EM_SHAPE(), xv);
    assert_int_equal(em_backward(x, NULL), EM_OK);
    double ref[1] = {1};
    check_grad(x, ref, 1);
    em_release(x);
}

/* ---- no-grad, detach, marks -------------------------------------------------------------------
 */

static void test_no_grad_records_nothing(void **state)
{
    (void)state;
    double xv[3] = {1, 2, 3};
    em_tensor *x = param(EM_SHAPE(3), xv);
    em_scope_begin();
    assert_true(em_grad_enabled());
    em_no_grad_begin();
    em_no_grad_begin();
    assert_false(em_grad_enabled());
    em_tensor *y = em_sum(em_exp(em_mul(x, x)), NULL, 0, false);
    em_no_grad_end();
    assert_false(em_grad_enabled());
    em_no_grad_end();
    assert_true(em_grad_enabled());
    assert_int_equal(em_tape_stats_get().nodes, 0);
    assert_false(em_requires_grad(y));
    assert_true(em_is_leaf(y));
    expect_error(em_backward(y, NULL), "does not require gradients");
    em_scope_end(NULL, 0);
    em_release(x);
}

static void test_detach_stops_gradients(void **state)
{
    (void)state;
    double xv[3] = {1, -2, 3};
    em_tensor *x = param(EM_SHAPE(3), xv);
    em_scope_begin();
    em_tensor *d = em_detach(x);
    assert_false(em_requires_grad(d));
    assert_true(em_is_leaf(d));
    /* loss = sum(x * detach(x)): d/dx = x, not 2x */
    em_tensor *loss = em_sum(em_mul(x, d), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    check_grad(x, xv, 3);
    em_scope_end(NULL, 0);
    em_release(x);
}

static void test_marks_and_errors(void **state)
{
    (void)state;
    em_tensor *i = em_arange(dev, EM_I32, 0, 4, 1);
    expect_error(em_set_requires_grad(i, true), "floating-point");
    assert_false(em_requires_grad(i));
    double xv[2] = {1, 2};
    em_tensor *x = param(EM_SHAPE(2), xv);
    em_tensor *y = em_exp(x);
    expect_error(em_set_requires_grad(y, true), "only leaf");
    em_tensor *g = em_zeros(dev, EM_F32, EM_SHAPE(2));
    expect_error(em_set_grad(x, g), "does not match");
    em_tensor *g2 = em_ones(dev, EM_F64, EM_SHAPE(2));
    assert_int_equal(em_set_grad(x, g2), EM_OK);
    assert_ptr_equal(em_grad(x), g2);
    em_release(g2); /* x keeps its own reference */
    double one[2] = {1, 1};
    check_grad(x, one, 2);
    assert_int_equal(em_set_grad(x, NULL), EM_OK);
    assert_null(em_grad(x));
    /* integer results are not recorded */
    em_tensor *c = em_gt_scalar(x, 1.5);
    assert_false(em_requires_grad(c));
    /* an unmarked leaf stops recording */
    assert_int_equal(em_set_requires_grad(x, false), EM_OK);
    em_tensor *z = em_exp(x);
    assert_false(em_requires_grad(z));
    em_scope_begin();
    expect_error(em_backward(em_sum(z, NULL, 0, false), NULL), "does not require");
    em_scope_end(NULL, 0);
    em_release(z);
    em_release(c);
    em_release(g);
    em_release(y);
    em_release(x);
    em_release(i);
    /* backward of NULL */
    em_clear_error();
    expect_error(em_backward(NULL, NULL), "no tensor");
}

static void test_copy_into_recorded(void **state)
{
    (void)state;
    double xv[2] = {1, 2};
    em_tensor *x = param(EM_SHAPE(2), xv);
    em_tensor *z = em_zeros(dev, EM_F64, EM_SHAPE(2));
    expect_error(em_copy_(x, z), "requires gradients");
    em_tensor *y = em_exp(x);
    expect_error(em_copy_(y, z), "recorded");
    em_no_grad_begin();
    assert_int_equal(em_copy_(x, z), EM_OK);
    em_no_grad_end();
    double got[2];
    read_t(x, got, 2);
    assert_true(got[0] == 0 && got[1] == 0);
    em_release(y);
    em_release(z);
    em_release(x);
}

/* ---- donation, casts, long chains --------------------------------------------------------------
 */

static void test_donation_in_chain(void **state)
{
    (void)state;
    double xv[4] = {0.5, -0.25, 1, 0.75}, cv[4] = {2, 3, -1, 0.5};
    em_tensor *x = param(EM_SHAPE(4), xv);
    em_tensor *c = tensor(EM_SHAPE(4), cv);
    em_scope_begin();
    /* loss = sum(exp(x * x) * (c + 1)), every temporary donated: d/dx = 2x exp(x^2) (c + 1) */
    em_tensor *cp = em_add_scalar(c, 1);
    em_tensor *loss = em_sum(em_take(em_mul(em_take(em_exp(em_take(em_mul(x, x)))), em_take(cp))),
                             NULL, 0, false);
    assert_non_null(loss);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    double ref[4];
    for (int i = 0; i < 4; i++) ref[i] = 2 * xv[i] * exp(xv[i] * xv[i]) * (cv[i] + 1);
    check_grad(x, ref, 4);
    /* a donated unrecorded operand of a recorded op keeps its values for backward */
    em_zero_grad(x);
    em_scope_begin();
    em_tensor *k = em_mul_scalar(c, 1); /* a copy of c nobody else holds */
    em_tensor *l2 = em_sum(em_take(em_mul(em_take(k), x)), NULL, 0, false);
    em_tensor *junk =
        em_add_scalar(em_take(em_ones(dev, EM_F64, EM_SHAPE(4))), 5); /* reuses freed blocks */
    (void)junk;
    assert_int_equal(em_backward(l2, NULL), EM_OK);
    em_scope_end(NULL, 0);
    check_grad(x, cv, 4);
    em_release(c);
    em_release(x);
}

static void test_cast_and_views(void **state)
{
    (void)state;
    float xv[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *x = em_from_host(dev, EM_F32, EM_SHAPE(2, 3), xv);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    em_scope_begin();
    /* loss = sum(f64(x)^T[1:3, :] * 3): the gradient comes back as f32, 3 where used */
    em_tensor *t = em_transpose(em_cast(x, EM_F64), 0, 1);
    em_tensor *loss = em_sum(em_mul_scalar(em_slice(t, 0, 1, 3, 1), 3), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    em_tensor *g = em_grad(x);
    assert_int_equal(em_dtype(g), EM_F32);
    float got[6];
    assert_int_equal(em_to_host(g, got, sizeof got), EM_OK);
    float ref[6] = {0, 3, 3, 0, 3, 3};
    for (int i = 0; i < 6; i++) assert_true(got[i] == ref[i]);
    em_release(x);
}

static void test_long_chain(void **state)
{
    (void)state;
    enum { N = 4000 };
    double xv[2] = {1, 2};
    em_tensor *x = param(EM_SHAPE(2), xv);
    /* dropped without backward: the nodes are released iteratively */
    em_tensor *y = em_retain(x);
    for (int i = 0; i < N; i++) {
        em_tensor *n = em_add_scalar(y, 1);
        em_release(y);
        y = n;
    }
    assert_int_equal(em_tape_stats_get().nodes, N);
    em_release(y);
    assert_int_equal(em_tape_stats_get().nodes, 0);
    /* and walked: loss = sum(x * 1.0001^N + ...) */
    y = em_retain(x);
    for (int i = 0; i < N; i++) {
        em_tensor *n = em_mul_scalar(y, 1.0001);
        em_release(y);
        y = n;
    }
    em_tensor *loss = em_sum(y, NULL, 0, false);
    em_release(y);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    assert_int_equal(em_tape_stats_get().nodes, 0);
    em_release(loss);
    double want = pow(1.0001, N), got[2];
    read_t(em_grad(x), got, 2);
    assert_true(fabs(got[0] - want) < 1e-9 && fabs(got[1] - want) < 1e-9);
    em_release(x);
}

static void test_cat_many_and_topk(void **state)
{
    (void)state;
    enum { N = 20 };
    em_tensor *xs[N];
    for (int i = 0; i < N; i++) {
        double v[2] = {i, -i};
        xs[i] = param(EM_SHAPE(2), v);
    }
    em_scope_begin();
    /* loss = sum(cat(xs) * w) with w = 1..2N: each piece gets its slice of w */
    double wv[2 * N];
    for (int i = 0; i < 2 * N; i++) wv[i] = i + 1;
    em_tensor *w = tensor(EM_SHAPE(2 * N), wv);
    em_tensor *loss = em_sum(em_mul(em_cat(xs, N, 0), w), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    for (int i = 0; i < N; i++) check_grad(xs[i], wv + 2 * i, 2);
    /* topk values are differentiable: the gradient lands on the chosen entries */
    double tv[5] = {3, 9, 1, 7, 5};
    em_tensor *t = param(EM_SHAPE(5), tv);
    em_tensor *vals = NULL, *idx = NULL;
    assert_int_equal(em_topk(t, 2, 0, true, &vals, &idx), EM_OK);
    double sv[2] = {10, 100};
    em_tensor *scale = tensor(EM_SHAPE(2), sv);
    assert_int_equal(em_backward(em_sum(em_mul(vals, scale), NULL, 0, false), NULL), EM_OK);
    double gt[5] = {0, 10, 0, 100, 0};
    check_grad(t, gt, 5);
    em_release(vals);
    em_release(idx);
    em_scope_end(NULL, 0); /* releases t too */
    for (int i = 0; i < N; i++) em_release(xs[i]);
}

/* ---- recompute policy ---------------------------------------------------------------------------
 */

/* x [8, 16] -> matmul w1 [16, 32] -> gelu -> matmul w2 [32, 4] -> tanh -> sum; the gradients of
 * w1 and w2 into g1, g2 and the tape's saved bytes before backward into *saved. */
static void mlp(em_recompute_policy policy, double *g1, double *g2, int64_t *saved)
{
    double xv[8 * 16], w1v[16 * 32], w2v[32 * 4];
    for (int i = 0; i < 8 * 16; i++) xv[i] = sin(0.37 * i);
    for (int i = 0; i < 16 * 32; i++) w1v[i] = 0.2 * cos(0.11 * i + 0.3);
    for (int i = 0; i < 32 * 4; i++) w2v[i] = 0.3 * sin(0.7 * i + 1);
    em_tensor *x = tensor(EM_SHAPE(8, 16), xv);
    em_tensor *w1 = param(EM_SHAPE(16, 32), w1v), *w2 = param(EM_SHAPE(32, 4), w2v);
    em_set_recompute_policy(policy);
    assert_int_equal(em_recompute_policy_get(), policy);
    em_scope_begin();
    em_tensor *h = em_gelu(em_take(em_matmul(x, w1)));
    em_tensor *loss = em_sum(em_take(em_tanh(em_take(em_matmul(em_take(h), w2)))), NULL, 0, false);
    if (!loss) fail_msg("mlp: %s", em_last_error());
    *saved = em_tape_stats_get().saved_bytes;
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    assert_int_equal(em_tape_stats_get().saved_bytes, 0);
    em_scope_end(NULL, 0);
    em_set_recompute_policy(EM_RECOMPUTE_NONE);
    read_t(em_grad(w1), g1, 16 * 32);
    read_t(em_grad(w2), g2, 32 * 4);
    em_release(x);
    em_release(w1);
    em_release(w2);
}

static void test_recompute_policy(void **state)
{
    (void)state;
    static double a1[16 * 32], a2[32 * 4], b1[16 * 32], b2[32 * 4];
    int64_t sa, sb;
    mlp(EM_RECOMPUTE_NONE, a1, a2, &sa);
    mlp(EM_RECOMPUTE_ELEMENTWISE, b1, b2, &sb);
    assert_memory_equal(a1, b1, sizeof a1);
    assert_memory_equal(a2, b2, sizeof a2);
    fprintf(stderr, "[autodiff] saved bytes: %lld kept, %lld with recomputation\n", (long long)sa,
            (long long)sb);
    assert_true(sb < sa);
    /* the gradient of w2 by hand: h^T (1 - tanh(h w2)^2), checked on one entry against f64 math */
    assert_true(isfinite(a2[0]) && a2[0] != 0);
}

/* x [4, 64, 32] -> gelu -> reshape [256, 32] (as a Linear does) -> matmul w [32, 16] -> sum: with
 * recomputation the matmul saves the reshape as a recipe too, so gelu's output (64 KiB in f64) is
 * not held through the view: the pool holds less after the forward, and the gradients are the
 * same bits. */
static void view_chain(em_recompute_policy policy, double *gw, double *gx, uint64_t *held)
{
    enum { N = 4 * 64 * 32 };
    static double xv[N], wv[32 * 16];
    for (int i = 0; i < N; i++) xv[i] = sin(0.05 * i);
    for (int i = 0; i < 32 * 16; i++) wv[i] = 0.1 * cos(0.3 * i);
    em_tensor *x = param(EM_SHAPE(4, 64, 32), xv), *w = param(EM_SHAPE(32, 16), wv);
    em_set_recompute_policy(policy);
    uint64_t base = pool_in_use();
    em_scope_begin();
    em_tensor *h = em_reshape(em_take(em_gelu(x)), EM_SHAPE(256, 32));
    em_tensor *loss = em_sum(em_take(em_matmul(em_take(h), w)), NULL, 0, false);
    assert_non_null(loss);
    em_realize(loss);
    *held = pool_in_use() - base;
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    em_set_recompute_policy(EM_RECOMPUTE_NONE);
    read_t(em_grad(w), gw, 32 * 16);
    read_t(em_grad(x), gx, N);
    em_release(x);
    em_release(w);
}

static void test_recompute_through_views(void **state)
{
    (void)state;
    static double a_w[32 * 16], a_x[4 * 64 * 32], b_w[32 * 16], b_x[4 * 64 * 32];
    uint64_t ha, hb;
    view_chain(EM_RECOMPUTE_NONE, a_w, a_x, &ha);
    view_chain(EM_RECOMPUTE_ELEMENTWISE, b_w, b_x, &hb);
    assert_memory_equal(a_w, b_w, sizeof a_w);
    assert_memory_equal(a_x, b_x, sizeof a_x);
    fprintf(stderr, "[autodiff] held after the forward: %llu bytes kept, %llu recomputed\n",
            (unsigned long long)ha, (unsigned long long)hb);
    /* gelu's output is 4 * 64 * 32 doubles: no longer held */
    assert_true(ha >= hb + sizeof(double) * 4 * 64 * 32);
}

/* ---- a weight shared by every batch -------------------------------------------------------------
 */

/* x [64, 4, 128] @ w [128, 256]: w's gradient folds the 64 batches into one matmul instead of
 * summing 64 per-batch products of [128, 256] (8 MiB in f64, against 0.5 MiB for x or the
 * output): the pool's peak during the backward stays far below those products. The gradient is
 * checked against x^T g summed by hand. */
static void test_shared_weight_grad_folds_batches(void **state)
{
    (void)state;
    enum { B = 64, M = 4, K = 128, N = 256 };
    double *xv = malloc(sizeof(double) * B * M * K), *wv = malloc(sizeof(double) * K * N);
    double *g = malloc(sizeof(double) * K * N), *ref = calloc((size_t)K * N, sizeof(double));
    for (int i = 0; i < B * M * K; i++) xv[i] = sin(0.013 * i + 0.2);
    for (int i = 0; i < K * N; i++) wv[i] = 0.1 * cos(0.07 * i);
    em_tensor *x = tensor(EM_SHAPE(B, M, K), xv), *w = param(EM_SHAPE(K, N), wv);
    /* loss = sum(x @ w): d w[k, n] = sum over rows r of x[r, k] */
    for (int r = 0; r < B * M; r++)
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) ref[k * N + n] += xv[r * K + k];
    em_scope_begin();
    em_tensor *loss = em_sum(em_take(em_matmul(x, w)), NULL, 0, false);
    assert_non_null(loss);
    em_realize(loss);
    uint64_t before_bw = pool_in_use();
    em_device_pool_reset_peak(dev);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_pool_stats ps;
    em_device_pool_stats(dev, &ps);
    em_scope_end(NULL, 0);
    uint64_t rise = ps.peak_in_use - before_bw, per_batch = (uint64_t)B * K * N * sizeof(double);
    fprintf(stderr, "[autodiff] shared weight backward: peak rise %llu bytes (per-batch products "
            "would be %llu)\n", (unsigned long long)rise, (unsigned long long)per_batch);
    assert_true(rise < per_batch / 4);
    read_t(em_grad(w), g, (size_t)K * N);
    for (int i = 0; i < K * N; i++) assert_true(fabs(g[i] - ref[i]) <= 1e-12 * (1 + fabs(ref[i])));
    em_release(x);
    em_release(w);
    free(xv), free(wv), free(g), free(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_exp_mul_sum, before, after),
        cmocka_unit_test_setup_teardown(test_mean_and_scalars, before, after),
        cmocka_unit_test_setup_teardown(test_leaf_grad_is_contiguous, before, after),
        cmocka_unit_test_setup_teardown(test_broadcast_reduces_to_shape, before, after),
        cmocka_unit_test_setup_teardown(test_used_twice_accumulates, before, after),
        cmocka_unit_test_setup_teardown(test_retain_and_second_backward, before, after),
        cmocka_unit_test_setup_teardown(test_shared_subgraph_freed, before, after),
        cmocka_unit_test_setup_teardown(test_grad_root, before, after),
        cmocka_unit_test_setup_teardown(test_backward_of_leaf, before, after),
        cmocka_unit_test_setup_teardown(test_no_grad_records_nothing, before, after),
        cmocka_unit_test_setup_teardown(test_detach_stops_gradients, before, after),
        cmocka_unit_test_setup_teardown(test_marks_and_errors, before, after),
        cmocka_unit_test_setup_teardown(test_copy_into_recorded, before, after),
        cmocka_unit_test_setup_teardown(test_donation_in_chain, before, after),
        cmocka_unit_test_setup_teardown(test_cast_and_views, before, after),
        cmocka_unit_test_setup_teardown(test_long_chain, before, after),
        cmocka_unit_test_setup_teardown(test_cat_many_and_topk, before, after),
        cmocka_unit_test_setup_teardown(test_recompute_policy, before, after),
        cmocka_unit_test_setup_teardown(test_shared_weight_grad_folds_batches, before, after),
        cmocka_unit_test_setup_teardown(test_recompute_through_views, before, after),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
