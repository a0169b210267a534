/* collectives_cases.h — the checks of every collective, shared by test_collectives.c (MPI on
 * CPU ranks, or a world of one) and test_nccl.c (NCCL on CUDA devices). The including file opens
 * the communicator D on device DEV (rank R of W) in its group setup and sets ENGINE to the engine
 * em_dist_engine must report. Rank r fills its tensors from r, so every expected value is a
 * formula of the world size that each rank computes for itself. Header-only, included once. */
#ifndef EM_TEST_DIST_COLLECTIVES_CASES_H
#define EM_TEST_DIST_COLLECTIVES_CASES_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ember/autodiff.h"
#include "ember/dist.h"

static em_dist *D;
static em_device *DEV;
static int R, W;           /* rank, world */
static const char *ENGINE; /* what em_dist_engine(D) must say */

/* A tensor of `dt` whose element i is f(i) (as double, converted by em_cast). */
static em_tensor *filled(em_scalar dt, em_shape shape, double (*f)(int64_t i, int rank))
{
    int64_t n = 1;
    for (int k = 0; k < shape.rank; k++) n *= shape.d[k];
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = f(i, R);
    em_tensor *t64 = em_from_host(DEV, EM_F64, shape, v);
    free(v);
    assert_non_null(t64);
    em_tensor *t = em_cast(t64, dt);
    em_release(t64);
    assert_non_null(t);
    return t;
}

/* The elements of t as doubles (malloc'd). */
static double *values(const em_tensor *t)
{
    em_tensor *t64 = em_cast(t, EM_F64);
    assert_non_null(t64);
    int64_t n = em_numel(t);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    assert_int_equal(em_to_host(t64, v, (size_t)n * sizeof *v), EM_OK);
    em_release(t64);
    return v;
}

static double f_lin(int64_t i, int r)
{
    return (r + 1) * 1.0 + (double)i * 0.5; /* rank r's element i */
}
static double f_mixed(int64_t i, int r)
{
    return (double)((i * 7 + r * 3) % 11) - 5.0; /* ranks disagree on which is largest */
}
static double f_int(int64_t i, int r)
{
    return (double)(i - 3) * (r + 1);
}

static void test_info(void **state)
{
    (void)state;
    assert_true(W >= 1);
    assert_true(R >= 0 && R < W);
    const char *env = getenv("OMPI_COMM_WORLD_SIZE");
    if (env) assert_int_equal(W, atoi(env));
    assert_string_equal(em_dist_engine(D), ENGINE);
    /* NULL is a world of one. */
    assert_int_equal(em_dist_world(NULL), 1);
    assert_int_equal(em_dist_rank(NULL), 0);
    assert_int_equal(em_dist_barrier(D), EM_OK);
}

static void test_all_reduce_sum_mean(void **state)
{
    (void)state;
    em_scalar dts[] = {EM_F32, EM_F64};
    for (int k = 0; k < 2; k++) {
        em_tensor *s = filled(dts[k], EM_SHAPE(3, 5), f_lin);
        em_tensor *m = filled(dts[k], EM_SHAPE(3, 5), f_lin);
        assert_int_equal(em_dist_all_reduce(D, s, EM_DIST_SUM), EM_OK);
        assert_int_equal(em_dist_all_reduce(D, m, EM_DIST_MEAN), EM_OK);
        double *vs = values(s), *vm = values(m);
        for (int64_t i = 0; i < 15; i++) {
            double sum = 0;
            for (int r = 0; r < W; r++) sum += f_lin(i, r);
            assert_float_equal(vs[i], sum, 1e-6);
            assert_float_equal(vm[i], sum / W, 1e-6);
        }
        free(vs), free(vm);
        em_release(s), em_release(m);
    }
}

static void test_all_reduce_max_min(void **state)
{
    (void)state;
    em_tensor *mx = filled(EM_F32, EM_SHAPE(22), f_mixed);
    em_tensor *mn = filled(EM_I64, EM_SHAPE(22), f_mixed);
    assert_int_equal(em_dist_all_reduce(D, mx, EM_DIST_MAX), EM_OK);
    assert_int_equal(em_dist_all_reduce(D, mn, EM_DIST_MIN), EM_OK);
    double *vx = values(mx), *vn = values(mn);
    for (int64_t i = 0; i < 22; i++) {
        double hi = -1e9, lo = 1e9;
        for (int r = 0; r < W; r++) hi = fmax(hi, f_mixed(i, r)), lo = fmin(lo, f_mixed(i, r));
        assert_float_equal(vx[i], hi, 0);
        assert_float_equal(vn[i], lo, 0);
    }
    free(vx), free(vn);
    em_release(mx), em_release(mn);
}

static void test_all_reduce_int_and_half(void **state)
{
    (void)state;
    em_scalar dts[] = {EM_I32, EM_I64, EM_BF16, EM_F16};
    for (int k = 0; k < 4; k++) {
        em_tensor *t = filled(dts[k], EM_SHAPE(2, 4), f_int);
        assert_int_equal(em_dist_all_reduce(D, t, EM_DIST_SUM), EM_OK);
        assert_int_equal(em_dtype(t), dts[k]);
        double *v = values(t);
        for (int64_t i = 0; i < 8; i++) {
            double sum = 0;
            for (int r = 0; r < W; r++) sum += f_int(i, r);
            assert_float_equal(v[i], sum, 0); /* small integers: exact in every dtype */
        }
        free(v);
        em_release(t);
    }
}

/* A strided view (every other column) is reduced in place; the other columns keep their values. */
static void test_all_reduce_view(void **state)
{
    (void)state;
    em_tensor *base = filled(EM_F32, EM_SHAPE(4, 6), f_lin);
    em_tensor *view = em_slice(base, 1, 0, 6, 2);
    assert_non_null(view);
    assert_false(em_is_contiguous(view));
    assert_int_equal(em_dist_all_reduce(D, view, EM_DIST_SUM), EM_OK);
    double *v = values(base);
    for (int64_t i = 0; i < 24; i++) {
        double want = 0; /* a reduced column holds the sum, the others this rank's value */
        for (int r = 0; r < W; r++) want += i % 2 == 0 ? f_lin(i, r) : (r == R) * f_lin(i, r);
        assert_float_equal(v[i], want, 1e-6);
    }
    free(v);
    em_release(view);
    em_release(base);
}

static void test_broadcast(void **state)
{
    (void)state;
    int root = W - 1;
    em_tensor *t = filled(EM_F32, EM_SHAPE(7), f_lin);
    em_tensor *b = filled(EM_BF16, EM_SHAPE(3), f_int);
    assert_int_equal(em_dist_broadcast(D, t, root), EM_OK);
    assert_int_equal(em_dist_broadcast(D, b, root), EM_OK);
    double *v = values(t), *vb = values(b);
    for (int64_t i = 0; i < 7; i++) assert_float_equal(v[i], f_lin(i, root), 0);
    for (int64_t i = 0; i < 3; i++) assert_float_equal(vb[i], f_int(i, root), 0);
    free(v), free(vb);
    em_release(t), em_release(b);
    /* A strided view, written in place. */
    em_tensor *base = filled(EM_F32, EM_SHAPE(3, 4), f_lin);
    em_tensor *col = em_select(base, 1, 2);
    assert_int_equal(em_dist_broadcast(D, col, 0), EM_OK);
    double *vv = values(base);
    for (int64_t i = 0; i < 12; i++) assert_float_equal(vv[i], f_lin(i, i % 4 == 2 ? 0 : R), 0);
    free(vv);
    em_release(col), em_release(base);
}

static void test_all_gather(void **state)
{
    (void)state;
    em_tensor *t = filled(EM_F32, EM_SHAPE(2, 3), f_lin);
    em_tensor *g = em_dist_all_gather(D, t);
    assert_non_null(g);
    assert_int_equal(em_rank(g), 2);
    assert_int_equal(em_dim(g, 0), 2 * W);
    assert_int_equal(em_dim(g, 1), 3);
    double *v = values(g);
    for (int r = 0; r < W; r++)
        for (int64_t i = 0; i < 6; i++) assert_float_equal(v[r * 6 + i], f_lin(i, r), 0);
    free(v);
    em_release(g), em_release(t);
    /* 0-d tensors gather into [world]; integers and a transposed view too. */
    em_tensor *s = em_scalar_tensor(DEV, EM_I32, 10 + R);
    em_tensor *gs = em_dist_all_gather(D, s);
    assert_non_null(gs);
    assert_int_equal(em_rank(gs), 1);
    assert_int_equal(em_dim(gs, 0), W);
    double *vs = values(gs);
    for (int r = 0; r < W; r++) assert_float_equal(vs[r], 10 + r, 0);
    free(vs);
    em_release(gs), em_release(s);
    em_tensor *m = filled(EM_F64, EM_SHAPE(2, 3), f_lin);
    em_tensor *mt = em_transpose(m, 0, 1);
    em_tensor *gt = em_dist_all_gather(D, mt);
    assert_non_null(gt);
    double *vt = values(gt);
    for (int r = 0; r < W; r++)
        for (int64_t i = 0; i < 3; i++)
            for (int64_t j = 0; j < 2; j++)
                assert_float_equal(vt[r * 6 + i * 2 + j], f_lin(j * 3 + i, r), 0);
    free(vt);
    em_release(gt), em_release(mt), em_release(m);
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    em_tensor *t = filled(EM_F32, EM_SHAPE(2 * W, 3), f_lin);
    em_tensor *s = em_dist_reduce_scatter(D, t, EM_DIST_SUM);
    em_tensor *m = em_dist_reduce_scatter(D, t, EM_DIST_MEAN);
    em_tensor *b = em_cast(t, EM_BF16);
    em_tensor *sb = em_dist_reduce_scatter(D, b, EM_DIST_MAX);
    assert_non_null(s), assert_non_null(m), assert_non_null(sb);
    assert_int_equal(em_dim(s, 0), 2);
    assert_int_equal(em_dim(s, 1), 3);
    assert_int_equal(em_dtype(sb), EM_BF16);
    double *vs = values(s), *vm = values(m), *vb = values(sb);
    for (int64_t i = 0; i < 6; i++) {
        int64_t g = R * 6 + i; /* this rank's rows of the whole */
        double sum = 0;
        for (int r = 0; r < W; r++) sum += f_lin(g, r);
        assert_float_equal(vs[i], sum, 1e-6);
        assert_float_equal(vm[i], sum / W, 1e-6);
        assert_float_equal(vb[i], f_lin(g, W - 1), 0.05); /* bf16 rounding */
    }
    free(vs), free(vm), free(vb);
    em_release(s), em_release(m), em_release(sb), em_release(b), em_release(t);
    /* dim 0 must split evenly; a 0-d tensor has no dim 0. */
    em_tensor *z = em_scalar_tensor(DEV, EM_F32, 1);
    assert_null(em_dist_reduce_scatter(D, z, EM_DIST_SUM));
    assert_non_null(strstr(em_last_error(), "multiple of the world size"));
    em_release(z);
    if (W > 1) {
        em_tensor *odd = filled(EM_F32, EM_SHAPE(W + 1), f_lin);
        assert_null(em_dist_reduce_scatter(D, odd, EM_DIST_SUM));
        em_release(odd);
    }
}

/* Several tensors of several dtypes in tiny buckets (64 bytes: many buckets, and tensors larger
 * than a bucket alone in theirs); the inputs are unchanged; NULL stays NULL. */
static void test_many(void **state)
{
    (void)state;
    em_shape shapes[] = {EM_SHAPE(3), EM_SHAPE(4, 5), EM_SHAPE(2), EM_SHAPE(1), EM_SHAPE(33)};
    em_scalar dts[] = {EM_F32, EM_F32, EM_F64, EM_I32, EM_BF16};
    em_tensor *in[6] = {0}, *out[6];
    for (int k = 0; k < 5; k++) in[k] = filled(dts[k], shapes[k], k == 3 ? f_int : f_lin);
    in[5] = NULL;
    assert_int_equal(em_dist_all_reduce_many(D, in, 6, EM_DIST_SUM, 64, out), EM_OK);
    assert_null(out[5]);
    for (int k = 0; k < 5; k++) {
        assert_non_null(out[k]);
        assert_int_equal(em_dtype(out[k]), dts[k]);
        assert_int_equal(em_numel(out[k]), em_numel(in[k]));
        double *v = values(out[k]), *orig = values(in[k]);
        for (int64_t i = 0; i < em_numel(in[k]); i++) {
            double sum = 0;
            for (int r = 0; r < W; r++) sum += k == 3 ? f_int(i, r) : f_lin(i, r);
            assert_float_equal(v[i], sum, dts[k] == EM_BF16 ? 0.25 : 1e-5);
            assert_float_equal(orig[i], k == 3 ? f_int(i, R) : f_lin(i, R), 0.1);
        }
        free(v), free(orig);
        em_release(out[k]);
    }
    /* The mean with the default bucket size. */
    assert_int_equal(em_dist_all_reduce_many(D, in, 3, EM_DIST_MEAN, 0, out), EM_OK);
    double *v = values(out[1]);
    for (int64_t i = 0; i < 20; i++) {
        double sum = 0;
        for (int r = 0; r < W; r++) sum += f_lin(i, r);
        assert_float_equal(v[i], sum / W, 1e-5);
    }
    free(v);
    for (int k = 0; k < 3; k++) em_release(out[k]);
    for (int k = 0; k < 5; k++) em_release(in[k]);
}

static void test_host_values(void **state)
{
    (void)state;
    double d[2] = {R + 0.5, -R};
    assert_int_equal(em_dist_all_reduce_host(D, d, 2, EM_F64, EM_DIST_MEAN), EM_OK);
    assert_float_equal(d[0], (W - 1) / 2.0 + 0.5, 1e-12);
    int64_t k = R * 10;
    assert_int_equal(em_dist_all_reduce_host(D, &k, 1, EM_I64, EM_DIST_MAX), EM_OK);
    assert_int_equal(k, (W - 1) * 10);
    char msg[16];
    snprintf(msg, sizeof msg, "rank %d", R);
    assert_int_equal(em_dist_broadcast_host(D, msg, sizeof msg, 0), EM_OK);
    assert_string_equal(msg, "rank 0");
    int32_t i = 1;
    assert_int_not_equal(em_dist_all_reduce_host(D, &i, 1, EM_I32, EM_DIST_MEAN), EM_OK);
}

static void test_errors(void **state)
{
    (void)state;
    em_tensor *i = filled(EM_I32, EM_SHAPE(3), f_int);
    assert_int_equal(em_dist_all_reduce(D, i, EM_DIST_MEAN), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "floating-point"));
    assert_int_equal(em_dist_broadcast(D, i, W), EM_ERR_INVALID);
    assert_int_equal(em_dist_broadcast(D, i, -1), EM_ERR_INVALID);
    assert_int_equal(em_dist_all_reduce(D, NULL, EM_DIST_SUM), EM_ERR_INVALID);
    assert_null(em_dist_all_gather(D, NULL));
    em_dist_mode m;
    assert_true(em_dist_mode_parse("nccl", &m));
    assert_int_equal(m, EM_DIST_NCCL);
    assert_false(em_dist_mode_parse("gloo", &m));
    em_release(i);
    /* Parameters that require gradients are reduced too (with recording off). */
    em_tensor *p = filled(EM_F32, EM_SHAPE(4), f_lin);
    em_set_requires_grad(p, true);
    assert_int_equal(em_dist_all_reduce(D, p, EM_DIST_MEAN), EM_OK);
    double *v = values(p);
    double mean = 0;
    for (int r = 0; r < W; r++) mean += f_lin(3, r) / W;
    assert_float_equal(v[3], mean, 1e-6);
    free(v);
    em_release(p);
}

#define COLLECTIVES_CASES                                                                          \
    cmocka_unit_test(test_info), cmocka_unit_test(test_all_reduce_sum_mean),                       \
        cmocka_unit_test(test_all_reduce_max_min), cmocka_unit_test(test_all_reduce_int_and_half), \
        cmocka_unit_test(test_all_reduce_view), cmocka_unit_test(test_broadcast),                  \
        cmocka_unit_test(test_all_gather), cmocka_unit_test(test_reduce_scatter),                  \
        cmocka_unit_test(test_many), cmocka_unit_test(test_host_values),                           \
        cmocka_unit_test(test_errors)

#endif
