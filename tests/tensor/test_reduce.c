/* test_reduce.c — conformance of the reductions on every device present: sum, mean, prod, max,
 * min, argmax, argmin, var, std, logsumexp, all, any over single dims, dim sets and everything,
 * with and without keepdim, on permuted views and in every float dtype; cumsum; softmax and
 * log_softmax on any dim (with large values, for stability); layer_norm and rms_norm with and
 * without weight/bias; NaN propagation; zero-size reductions. Reference: float64 in C. */
#include "tensor_util.h"

/* Reference reduction of x [A, B, C] over the dims set in `mask` (bit d = dim d). */
static void ref_reduce(int op, const double *x, const int64_t *sh, unsigned mask, double *out, int corr)
{
    int64_t A = sh[0], B = sh[1], C = sh[2];
    int64_t oa = mask & 1 ? 1 : A, ob = mask & 2 ? 1 : B, oc = mask & 4 ? 1 : C;
    for (int64_t i = 0; i < oa; i++)
        for (int64_t j = 0; j < ob; j++)
            for (int64_t k = 0; k < oc; k++) {
                double acc = op == 1 ? 1 : 0, best = NAN, mean = 0, m = -INFINITY;
                int64_t cnt = 0, bi = -1;
                for (int pass = 0; pass < 2; pass++)
                    for (int64_t a = (mask & 1 ? 0 : i); a < (mask & 1 ? A : i + 1); a++)
                        for (int64_t b = (mask & 2 ? 0 : j); b < (mask & 2 ? B : j + 1); b++)
                            for (int64_t c = (mask & 4 ? 0 : k); c < (mask & 4 ? C : k + 1); c++) {
                                double v = x[(a * B + b) * C + c];
                                if (pass == 0) {
                                    cnt++;
                                    if (op == 0 || op == 6 || op == 7) acc += v;
                                    if (op == 1) acc *= v;
                                    if ((op == 2 && (bi < 0 || v > best)) || (op == 3 && (bi < 0 || v < best))) {
                                        best = v;
                                        bi = cnt - 1;
                                    }
                                    if (op == 9 && v > m) m = v;
                                } else {
                                    if (op == 7) acc += 0; /* handled below */
                                    if (op == 9) mean += exp(v - m);
                                    if (op == 7) mean += (v - acc / (double)cnt) * (v - acc / (double)cnt);
                                }
                            }
                double r = op == 0 ? acc : op == 1 ? acc : op == 2 || op == 3 ? best : op == 4 ? (double)bi
                         : op == 6 ? acc / (double)cnt : op == 7 ? mean / (double)(cnt - corr) : m + log(mean);
                out[(i * ob + j) * oc + k] = r;
            }
}

static void test_reductions_dims(void **state)
{
    (void)state;
    static const int64_t sh[3] = {3, 4, 5};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            double tol = tu_tol_on(dev, dt) * 4;
            static const unsigned masks[] = {1, 4, 6, 7}; /* dim 0, the last dim, the last two, all */
            for (size_t mi = 0; mi < 4; mi++) {
                unsigned mask = masks[mi];
                em_scope_begin();
                double x[60], ref[60];
                tu_fill(x, 60, -2, 2, mask + 3);
                /* stored as [5, 3, 4] and permuted to [3, 4, 5]: a non-contiguous input */
                double xs[60];
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 4; b++)
                        for (int c = 0; c < 5; c++) xs[(c * 3 + a) * 4 + b] = x[(a * 4 + b) * 5 + c];
                em_tensor *st = tu_tensor(dev, dt, EM_SHAPE(5, 3, 4), xs);
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 4; b++)
                        for (int c = 0; c < 5; c++) x[(a * 4 + b) * 5 + c] = xs[(c * 3 + a) * 4 + b];
                em_tensor *t = em_permute(st, (int[]){1, 2, 0}, 3);
                int dims[3], nd = 0;
                for (int d = 0; d < 3; d++)
                    if (mask & (1u << d)) dims[nd++] = d - (d == 2 ? 3 : 0); /* -1 for the last dim */
                em_shape keep = EM_SHAPE(mask & 1 ? 1 : 3, mask & 2 ? 1 : 4, mask & 4 ? 1 : 5);
                static const struct { const char *name; int op; } ops[] = {
                    {"sum", 0}, {"prod", 1}, {"max", 2}, {"min", 3}, {"mean", 6}, {"var", 7}, {"logsumexp", 9}};
                for (size_t oi = 0; oi < EM_ARRAY_LEN(ops); oi++) {
                    ref_reduce(ops[oi].op, x, sh, mask, ref, 1);
                    em_tensor *y = NULL;
                    switch (ops[oi].op) {
                    case 0: y = em_sum(t, dims, nd, true); break;
                    case 1: y = em_prod(t, dims, nd, true); break;
                    case 2: y = em_max(t, dims, nd, true); break;
                    case 3: y = em_min(t, dims, nd, true); break;
                    case 6: y = em_mean(t, dims, nd, true); break;
                    case 7: y = em_var(t, dims, nd, 1, true); break;
                    case 9: y = em_logsumexp(t, dims, nd, true); break;
                    }
                    char what[64];
                    snprintf(what, sizeof what, "%s %s mask %u", ops[oi].name, em_scalar_name(dt), mask);
                    tu_check(what, y, keep, ref, ops[oi].op == 1 ? tol * 10 : tol);
                }
                /* keepdim false drops the dims */
                em_tensor *s = em_sum(t, dims, nd, false);
                assert_int_equal(em_rank(s), 3 - nd);
                em_scope_end(NULL, 0);
            }
        }
    }
}

static void test_arg_all_any_int(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double x[12] = {3, 7, 7, 1, /**/ -1, -5, -5, 2, /**/ 0, NAN, 4, NAN};
        em_tensor *t = tu_tensor(dev, EM_F32, EM_SHAPE(3, 4), x);
        double am[3] = {1, 3, 1}, an[3] = {3, 1, 1}, mx[3] = {7, 2, NAN};
        tu_check("argmax", em_argmax(t, 1, false), EM_SHAPE(3), am, 0);
        tu_check("argmin", em_argmin(t, -1, false), EM_SHAPE(3), an, 0);
        tu_check("max nan", em_max(t, (int[]){1}, 1, false), EM_SHAPE(3), mx, 0);
        assert_int_equal(em_dtype(em_argmax(t, 1, false)), EM_I64);
        double am0[4] = {0, 2, 0, 2};
        tu_check("argmax dim 0 keepdim", em_argmax(t, 0, true), EM_SHAPE(1, 4), am0, 0);
        double b[6] = {1, 1, 0, 0, 0, 0};
        em_tensor *tb = tu_tensor(dev, EM_BOOL, EM_SHAPE(3, 2), b);
        double all[3] = {1, 0, 0}, any[3] = {1, 0, 0}, any0[2] = {1, 1};
        tu_check("all", em_all(tb, (int[]){1}, 1, false), EM_SHAPE(3), all, 0);
        tu_check("any", em_any(tb, (int[]){1}, 1, false), EM_SHAPE(3), any, 0);
        tu_check("any dim 0", em_any(tb, (int[]){0}, 1, false), EM_SHAPE(2), any0, 0);
        double iv[6] = {1, 2, 3, 4, 5, 6}, isum = 21, iprod = 720;
        em_tensor *ti = tu_tensor(dev, EM_I32, EM_SHAPE(2, 3), iv);
        em_tensor *s = em_sum(ti, NULL, 0, false);
        assert_int_equal(em_dtype(s), EM_I64);
        tu_check("sum i32", s, EM_SHAPE(), &isum, 0);
        tu_check("prod i32", em_prod(ti, NULL, 0, false), EM_SHAPE(), &iprod, 0);
        double imax[2] = {3, 6};
        tu_check("max i32", em_max(ti, (int[]){1}, 1, false), EM_SHAPE(2), imax, 0);
        /* std with correction 0, and a 0-d input */
        double sv[4] = {1, 2, 3, 4}, sd = sqrt(1.25), z = 5;
        tu_check("std", em_std(tu_tensor(dev, EM_F32, EM_SHAPE(4), sv), NULL, 0, 0, false), EM_SHAPE(), &sd, 1e-6);
        tu_check("sum 0-d", em_sum(tu_tensor(dev, EM_F32, EM_SHAPE(), &z), NULL, 0, false), EM_SHAPE(), &z, 0);
        /* reductions over a zero-size dim */
        em_tensor *e = em_zeros(dev, EM_F32, EM_SHAPE(2, 0));
        double zs[2] = {0, 0}, ps[2] = {1, 1};
        tu_check("sum empty", em_sum(e, (int[]){1}, 1, false), EM_SHAPE(2), zs, 0);
        tu_check("prod empty", em_prod(e, (int[]){1}, 1, false), EM_SHAPE(2), ps, 0);
        tu_expect_error(em_max(e, (int[]){1}, 1, false), "max: cannot reduce over a zero-size dim");
        em_scope_end(NULL, 0);
    }
}

static void test_cumsum(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double x[6] = {1, 2, 3, 4, 5, 6}, r1[6] = {1, 3, 6, 4, 9, 15}, r0[6] = {1, 2, 3, 5, 7, 9};
        em_tensor *t = tu_tensor(dev, EM_F32, EM_SHAPE(2, 3), x);
        tu_check("cumsum -1", em_cumsum(t, -1), EM_SHAPE(2, 3), r1, 0);
        tu_check("cumsum 0", em_cumsum(t, 0), EM_SHAPE(2, 3), r0, 0);
        em_tensor *ti = tu_tensor(dev, EM_I32, EM_SHAPE(2, 3), x);
        em_tensor *ci = em_cumsum(ti, 1);
        assert_int_equal(em_dtype(ci), EM_I64);
        tu_check("cumsum i32", ci, EM_SHAPE(2, 3), r1, 0);
        em_scope_end(NULL, 0);
    }
}

static void test_softmax(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            for (int dim = 0; dim < 3; dim++) {
                em_scope_begin();
                double x[2 * 3 * 70], ref[2 * 3 * 70], lref[2 * 3 * 70];
                int64_t sh[3] = {2, 3, 70};
                tu_fill(x, 420, -5, 5, (uint32_t)dim + 1);
                x[5] = dt == EM_F16 ? 60000 : 1000; /* stability: exp would overflow */
                em_tensor *t = tu_tensor(dev, dt, EM_SHAPE(2, 3, 70), x);
                for (int64_t i = 0; i < 420; i++) {
                    int64_t c[3] = {i / 210, (i / 70) % 3, i % 70};
                    double m = -INFINITY, s = 0;
                    for (int64_t j = 0; j < sh[dim]; j++) {
                        int64_t cc[3] = {c[0], c[1], c[2]};
                        cc[dim] = j;
                        double v = x[(cc[0] * 3 + cc[1]) * 70 + cc[2]];
                        if (v > m) m = v;
                    }
                    for (int64_t j = 0; j < sh[dim]; j++) {
                        int64_t cc[3] = {c[0], c[1], c[2]};
                        cc[dim] = j;
                        s += exp(x[(cc[0] * 3 + cc[1]) * 70 + cc[2]] - m);
                    }
                    ref[i] = exp(x[i] - m) / s;
                    lref[i] = x[i] - m - log(s);
                }
                char what[64];
                snprintf(what, sizeof what, "softmax %s dim %d", em_scalar_name(dt), dim);
                tu_check(what, em_softmax(t, dim), EM_SHAPE(2, 3, 70), ref, tu_tol_on(dev, dt) * 2);
                snprintf(what, sizeof what, "log_softmax %s dim %d", em_scalar_name(dt), dim);
                double ltol = dt == EM_F16 ? 0.5 : dt == EM_BF16 ? 2 : tu_tol_on(dev, dt) * 20;
                tu_check(what, em_log_softmax(t, dim - 3), EM_SHAPE(2, 3, 70), lref, ltol);
                em_scope_end(NULL, 0);
            }
        }
    }
}

/* Masked rows, as attention produces them: -inf entries anywhere (also first in the row, and in
 * the stretch one unit walks), rows longer than a cube, and a row of -inf only (NaN, as PyTorch). */
static void test_softmax_masked(void **state)
{
    (void)state;
    enum { ROWS = 4, N = 600 };
    static double x[ROWS * N], ref[ROWS * N];
    tu_fill(x, ROWS * N, -4, 4, 77);
    for (int64_t j = 0; j < N; j++) {
        if (j < 300) x[0 * N + j] = -INFINITY;       /* row 0: first half masked (left padding) */
        if (j % 256 == 3) x[1 * N + j] = -INFINITY;  /* row 1: one unit's whole stretch masked */
        if (j > 0) x[2 * N + j] = -INFINITY;         /* row 2: only the first entry remains */
        x[3 * N + j] = -INFINITY;                    /* row 3: all masked */
    }
    for (int r = 0; r < ROWS; r++) {
        double m = -INFINITY, s = 0;
        for (int j = 0; j < N; j++) m = fmax(m, x[r * N + j]);
        for (int j = 0; j < N; j++) s += exp(x[r * N + j] - m);
        for (int j = 0; j < N; j++) ref[r * N + j] = isinf(m) ? NAN : exp(x[r * N + j] - m) / s;
    }
    for (int di = 0; di < tu_ndev; di++) {
        em_scope_begin();
        em_tensor *t = tu_tensor(tu_devs[di], EM_F32, EM_SHAPE(ROWS, N), x);
        tu_check("softmax masked f32", em_softmax(t, -1), EM_SHAPE(ROWS, N), ref,
                 tu_tol_on(tu_devs[di], EM_F32) * 2);
        em_scope_end(NULL, 0);
    }
}

static void test_norms(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            enum { R = 6, C = 40 };
            double x[R * C], w[C], b[C], ref[R * C], rref[R * C], bare[R * C];
            tu_fill(x, R * C, -3, 3, 5);
            tu_fill(w, C, 0.5, 1.5, 6);
            tu_fill(b, C, -1, 1, 7);
            em_tensor *t = tu_tensor(dev, dt, EM_SHAPE(R, C), x);
            em_tensor *tw = tu_tensor(dev, dt, EM_SHAPE(C), w), *tb = tu_tensor(dev, dt, EM_SHAPE(C), b);
            for (int i = 0; i < R; i++) {
                double m = 0, v = 0, ms = 0;
                for (int j = 0; j < C; j++) m += x[i * C + j] / C;
                for (int j = 0; j < C; j++) v += (x[i * C + j] - m) * (x[i * C + j] - m) / C;
                for (int j = 0; j < C; j++) ms += x[i * C + j] * x[i * C + j] / C;
                for (int j = 0; j < C; j++) {
                    ref[i * C + j] = (x[i * C + j] - m) / sqrt(v + 1e-5) * w[j] + b[j];
                    bare[i * C + j] = (x[i * C + j] - m) / sqrt(v + 1e-5);
                    rref[i * C + j] = x[i * C + j] / sqrt(ms + 1e-6) * w[j];
                }
            }
            double tol = tu_tol_on(dev, dt) * 4;
            tu_check("layer_norm", em_layer_norm(t, 1, tw, tb, 1e-5), EM_SHAPE(R, C), ref, tol);
            tu_check("layer_norm bare", em_layer_norm(t, 1, NULL, NULL, 1e-5), EM_SHAPE(R, C), bare, tol);
            tu_check("rms_norm", em_rms_norm(t, 1, tw, 1e-6), EM_SHAPE(R, C), rref, tol);
            /* over the last two dims of a [2, 3, 40] view */
            em_tensor *t3 = em_view(t, EM_SHAPE(2, 3, C));
            double r3[R * C];
            for (int g = 0; g < 2; g++) {
                double m = 0, v = 0;
                for (int j = 0; j < 3 * C; j++) m += x[g * 3 * C + j] / (3 * C);
                for (int j = 0; j < 3 * C; j++) v += (x[g * 3 * C + j] - m) * (x[g * 3 * C + j] - m) / (3 * C);
                for (int j = 0; j < 3 * C; j++) r3[g * 3 * C + j] = (x[g * 3 * C + j] - m) / sqrt(v + 1e-5);
            }
            tu_check("layer_norm 2 dims", em_layer_norm(t3, 2, NULL, NULL, 1e-5), EM_SHAPE(2, 3, C), r3, tol);
            em_scope_end(NULL, 0);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reductions_dims),
        cmocka_unit_test(test_arg_all_any_int),
        cmocka_unit_test(test_cumsum),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_softmax_masked),
        cmocka_unit_test(test_norms),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
