/* test_xent.c — the fused classifier (em_cross_entropy_rows, src/kernels/tensor_xent.ek) on every
 * device present: the per-row loss and, through autodiff, the gradient of the logits against
 * float64 references computed from the values the device holds, for class counts from 1 to past
 * GPT-2's 50257 (rows shorter and longer than a cube), every float dtype, ignored rows, label
 * smoothing, logits read through a transposed or narrowed view, a non-uniform gradient of the
 * losses, very large and -inf logits; the gradient written over donated logits (directly and
 * through the tape); the losses and the gradient from one launch (tn_xent_rows_grad, the chunked
 * head's); the backward with its lines kept in registers (on GPUs) through NVRTC; and the misuse
 * cases (a class out of range, shapes that do
 * not match, a smoothing outside [0, 1), integer logits), each an error naming what is wrong. */
#include "ember/autodiff.h"
#include "ember/tensor_grad.h"
#include "tensor_util.h"
#include "kernel/hopper_util.h"
#include "tensor/internal.h" /* tn_xent_classes, tn_xent_rows_grad */

enum { IGNORE = -100 };

/* Loss and gradient references for rows x n logits x (row-major), classes t (IGNORE: ignored),
 * the gradient of each row's loss g, smoothing ls. */
static void reference(const double *x, const int64_t *t, const double *g, int64_t rows, int64_t n,
                      double ls, double *loss, double *dx)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n;
        double m = -INFINITY, s = 0, sum = 0;
        for (int64_t j = 0; j < n; j++) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < n; j++) {
            s += exp(xr[j] - m);
            sum += xr[j];
        }
        double lse = m + log(s);
        bool ign = t[r] == IGNORE;
        double nll = ign ? 0 : lse - xr[t[r]];
        loss[r] = ign ? 0 : ls > 0 ? (1 - ls) * nll + ls * (lse - sum / (double)n) : nll;
        for (int64_t j = 0; j < n; j++)
            dx[r * n + j] =
                ign ? 0 : g[r] * (exp(xr[j] - lse) - ls / (double)n - (j == t[r] ? 1 - ls : 0));
    }
}

/* The loss tolerance: f16/bf16 logits are exact, the sums run in f32, the result is rounded once
 * to the dtype (relative to max(1, |loss|)). */
static double loss_tol(em_device *dev, em_scalar dt)
{
    return dt == EM_F16 ? 2e-3 : dt == EM_BF16 ? 1e-2 : tu_tol_on(dev, dt) * 10;
}

enum { V_CONTIG, V_TRANSPOSED, V_NARROWED, V_COUNT };
static const char *const view_names[V_COUNT] = {"contiguous", "transposed", "narrowed"};

/* Logits [rows, n] on dev as the view asks (x is updated to the stored values, row-major). */
static em_tensor *logits_view(em_device *dev, em_scalar dt, int64_t rows, int64_t n, int view,
                              double *x)
{
    if (view == V_CONTIG) return tu_tensor(dev, dt, EM_SHAPE(rows, n), x);
    if (view == V_TRANSPOSED) { /* stored [n, rows], read transposed */
        double *st = malloc((size_t)(rows * n) * sizeof *st);
        assert_non_null(st);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) st[j * rows + r] = x[r * n + j];
        em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(n, rows), st);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) x[r * n + j] = st[j * rows + r];
        free(st);
        return em_transpose(s, 0, 1);
    }
    /* narrowed: the columns 1 .. n of a [rows, n + 2] tensor */
    double *st = malloc((size_t)(rows * (n + 2)) * sizeof *st);
    assert_non_null(st);
    for (int64_t r = 0; r < rows; r++) {
        st[r * (n + 2)] = 1e30;
        st[r * (n + 2) + n + 1] = -1e30;
        for (int64_t j = 0; j < n; j++) st[r * (n + 2) + 1 + j] = x[r * n + j];
    }
    em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(rows, n + 2), st);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) x[r * n + j] = st[r * (n + 2) + 1 + j];
    free(st);
    return em_narrow(s, 1, 1, n);
}

/* One case: forward against the reference, backward through autodiff with gradient g. */
static void run_case(em_device *dev, em_scalar dt, int64_t rows, int64_t n, int view, double ls,
                     uint32_t seed, double spike)
{
    char what[160];
    snprintf(what, sizeof what, "cross_entropy_rows %s %s %lld x %lld %s ls %g",
             em_device_name(dev), em_scalar_name(dt), (long long)rows, (long long)n,
             view_names[view], ls);
    em_scope_begin();
    double *x = malloc((size_t)(rows * n) * sizeof *x), *g = malloc((size_t)rows * sizeof *g);
    double *loss = malloc((size_t)rows * sizeof *loss), *dx = malloc((size_t)(rows * n) * sizeof *dx);
    int64_t *t = malloc((size_t)rows * sizeof *t);
    assert_true(x && g && loss && dx && t);
    tu_fill(x, (size_t)(rows * n), -6, 6, seed);
    tu_fill(g, (size_t)rows, 0.5, 2, seed + 1);
    uint32_t s = seed * 747796405u + 1;
    for (int64_t r = 0; r < rows; r++) {
        s = s * 1664525u + 1013904223u;
        t[r] = r % 5 == 3 ? IGNORE : (int64_t)((s >> 8) % (uint32_t)n);
        if (spike != 0 && n > 1) x[r * n + (r % n)] = spike; /* a dominant logit */
    }
    if (spike != 0 && n > 2) x[n - 1] = -INFINITY;
    em_tensor *lg = logits_view(dev, dt, rows, n, view, x);
    for (int64_t r = 0; r < rows; r++) g[r] = tu_round(dt, g[r]);
    em_tensor *gt = tu_tensor(dev, dt, EM_SHAPE(rows), g);
    em_tensor *tt = em_from_host(dev, EM_I64, EM_SHAPE(rows), t);
    assert_int_equal(em_set_requires_grad(lg, true), EM_OK);
    int64_t valid = -1;
    em_tensor *out = em_cross_entropy_rows(lg, tt, IGNORE, ls, &valid);
    int64_t expect_valid = 0;
    for (int64_t r = 0; r < rows; r++) expect_valid += t[r] != IGNORE;
    assert_int_equal(valid, expect_valid);
    reference(x, t, g, rows, n, ls, loss, dx);
    double *got = tu_read(out);
    if (!tu_close_n(what, got, loss, (size_t)rows, loss_tol(dev, dt))) fail_msg("%s: loss", what);
    free(got);
    /* d sum(g * loss) / d logits */
    em_tensor *total = em_sum(em_mul(out, gt), NULL, 0, false);
    assert_int_equal(em_backward(total, NULL), EM_OK);
    got = tu_read(em_grad(lg));
    double dtol = dt == EM_F16 || dt == EM_BF16 ? 2e-2 : tu_tol_on(dev, dt) * 10;
    if (!tu_close_n(what, got, dx, (size_t)(rows * n), dtol)) fail_msg("%s: gradient", what);
    free(got);
    /* the losses and the gradient from one launch (the chunked head's tn_xent_rows_grad) */
    em_tensor *cls = tn_xent_classes("test", tt, n, IGNORE, NULL);
    em_tensor *rl = NULL;
    em_no_grad_begin();
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *d1 = cls ? tn_xent_rows_grad(gt, lg, cls, ls, &rl) : NULL;
    uint64_t launches = em_tensor_stats_get().launches - s0.launches;
    em_no_grad_end();
    if (!d1 || !rl) fail_msg("%s: tn_xent_rows_grad: %s", what, em_last_error());
    got = tu_read(rl);
    if (!tu_close_n(what, got, loss, (size_t)rows, loss_tol(dev, dt))) fail_msg("%s: one launch's loss", what);
    free(got);
    got = tu_read(d1);
    if (!tu_close_n(what, got, dx, (size_t)(rows * n), dtol)) fail_msg("%s: one launch's gradient", what);
    free(got);
    if (launches != 1) fail_msg("%s: losses and gradient took %llu launches", what, (unsigned long long)launches);
    em_scope_end(NULL, 0);
    free(x);
    free(g);
    free(loss);
    free(dx);
    free(t);
}

static void test_class_counts(void **state)
{
    (void)state;
    static const int64_t counts[] = {1, 2, 7, 31, 32, 33, 255, 257, 1000, 50257};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
            int64_t rows = counts[i] > 5000 ? 6 : 13;
            run_case(tu_devs[di], EM_F32, rows, counts[i], V_CONTIG, 0, (uint32_t)i + 1, 0);
        }
}

static void test_dtypes_views_smoothing(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < sizeof tu_float_types / sizeof tu_float_types[0]; ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(tu_devs[di], dt)) continue;
            for (int view = 0; view < V_COUNT; view++)
                for (int si = 0; si < 2; si++)
                    run_case(tu_devs[di], dt, 9, view == V_CONTIG ? 300 : 45, view, si ? 0.1 : 0,
                             (uint32_t)(ti * 10 + view * 2 + si + 50), 0);
        }
}

/* A logit of 1e4 (exp would overflow without the running maximum) and a -inf logit. */
static void test_extreme_logits(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        run_case(tu_devs[di], EM_F32, 8, 50, V_CONTIG, 0, 91, 1e4);
        run_case(tu_devs[di], EM_F32, 8, 50, V_CONTIG, 0.2, 92, -1e4);
    }
}

static void test_misuse(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    double x[12];
    tu_fill(x, 12, -1, 1, 7);
    em_tensor *lg = tu_tensor(dev, EM_F32, EM_SHAPE(3, 4), x);
    int64_t bad[3] = {0, 4, 1}, neg[3] = {0, -1, 1}, ok[3] = {0, 3, IGNORE};
    tu_expect_error(em_cross_entropy_rows(lg, em_from_host(dev, EM_I64, EM_SHAPE(3), bad), IGNORE,
                                          0, NULL),
                    "target 4 (row 1) is out of range for 4 classes");
    tu_expect_error(em_cross_entropy_rows(lg, em_from_host(dev, EM_I64, EM_SHAPE(3), neg), IGNORE,
                                          0, NULL),
                    "target -1 (row 1)");
    em_tensor *tt = em_from_host(dev, EM_I64, EM_SHAPE(3), ok);
    tu_expect_error(em_cross_entropy_rows(lg, em_reshape(tt, EM_SHAPE(3, 1)), IGNORE, 0, NULL),
                    "f32[3, 4]");
    tu_expect_error(em_cross_entropy_rows(em_narrow(lg, 0, 0, 2), tt, IGNORE, 0, NULL),
                    "i64[3]");
    tu_expect_error(em_cross_entropy_rows(lg, tt, IGNORE, 1.0, NULL), "label_smoothing");
    tu_expect_error(em_cross_entropy_rows(em_cast(lg, EM_I32), tt, IGNORE, 0, NULL), "float logits");
    tu_expect_error(em_cross_entropy_rows(lg, em_cast(tt, EM_F32), IGNORE, 0, NULL), "i32/i64");
    assert_null(em_cross_entropy_rows(NULL, tt, IGNORE, 0, NULL));
    /* the valid rows are counted; ignored rows give 0 */
    int64_t valid = 0;
    em_tensor *out = em_cross_entropy_rows(lg, tt, IGNORE, 0, &valid);
    assert_int_equal(valid, 2);
    double *got = tu_read(out);
    assert_true(got[2] == 0 && got[0] > 0);
    free(got);
    em_scope_end(NULL, 0);
}

/* f16/bf16 logits: the loss is f32, and the gradient is the f32 computation rounded once to the
 * logits' dtype — what casting the logits to f32 first, then the gradient back, gives (bitwise on
 * the CPU), without the f32 copy. */
static void test_half_logits(void **state)
{
    (void)state;
    static const em_scalar half[] = {EM_BF16, EM_F16};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t hi = 0; hi < 2; hi++) {
            em_scalar dt = half[hi];
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            int64_t rows = 7, n = 301, t[7];
            double x[7 * 301];
            tu_fill(x, (size_t)(rows * n), -5, 5, 300u + (uint32_t)hi);
            for (int64_t r = 0; r < rows; r++) t[r] = r == 3 ? IGNORE : (r * 53) % n;
            em_tensor *tt = em_from_host(dev, EM_I64, EM_SHAPE(rows), t);
            double *res[2][2];
            for (int wide = 0; wide < 2; wide++) {
                em_tensor *lg = tu_tensor(dev, dt, EM_SHAPE(rows, n), x);
                assert_int_equal(em_set_requires_grad(lg, true), EM_OK);
                em_tensor *in = wide ? em_cast(lg, EM_F32) : lg;
                em_tensor *loss = em_cross_entropy_rows(in, tt, IGNORE, 0.05, NULL);
                assert_non_null(loss);
                assert_int_equal(em_dtype(loss), EM_F32);
                assert_int_equal(em_backward(em_sum(loss, NULL, 0, false), NULL), EM_OK);
                assert_int_equal(em_dtype(em_grad(lg)), dt);
                res[wide][0] = tu_read(loss);
                res[wide][1] = tu_read(em_grad(lg));
            }
            char what[64];
            snprintf(what, sizeof what, "%s logits on %s", em_scalar_name(dt), em_device_name(dev));
            double tol = tu_is_cpu(dev) ? 0 : 1e-6;
            assert_true(tu_close_n(what, res[0][0], res[1][0], (size_t)rows, tol));
            assert_true(tu_close_n(what, res[0][1], res[1][1], (size_t)(rows * n), tu_is_cpu(dev) ? 0 : 1e-2));
            for (int w = 0; w < 2; w++)
                for (int k = 0; k < 2; k++) free(res[w][k]);
            em_scope_end(NULL, 0);
        }
    }
}

/* The gradient written over donated logits: the same values as into a new tensor, the logits
 * tensor returned; logits that are shared (another view) or only borrowed are left intact. Through
 * autodiff the tape hands the logits over when it held the last reference (em_backward, not
 * em_backward_retain): the same gradients, and the backward's peak lower by the [N, C] block. */
static void test_gradient_in_place(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        enum { R = 9, N = 1000, K = 16 };
        static double x[R * N], xk[R * K], wv[K * N];
        int32_t c[R];
        tu_fill(x, R * N, -4, 4, 41);
        tu_fill(xk, R * K, -1, 1, 42);
        tu_fill(wv, K * N, -1, 1, 43);
        for (int r = 0; r < R; r++) c[r] = r == 4 ? -1 : (r * 97) % N;
        em_tensor *cls = em_from_host(dev, EM_I32, EM_SHAPE(R), c);
        em_tensor *g = em_full(dev, EM_F32, EM_SHAPE(R), 0.5);
        em_tensor *lg = tu_tensor(dev, EM_F32, EM_SHAPE(R, N), x);
        em_tensor *ref = em_cross_entropy_rows_backward(g, lg, cls, 0.1); /* borrowed */
        assert_non_null(ref);
        assert_ptr_not_equal(ref, lg);
        double *vref = tu_read(ref), *vlg = tu_read(lg);
        assert_true(tu_close_n("borrowed logits unchanged", vlg, x, R * N, 0));
        em_tensor *mine = tu_tensor(dev, EM_F32, EM_SHAPE(R, N), x);
        em_tensor *got = em_cross_entropy_rows_backward(g, em_take(mine), cls, 0.1);
        assert_ptr_equal(got, mine); /* written over the logits */
        double *vgot = tu_read(got);
        assert_true(tu_close_n("in place", vgot, vref, R * N, 0));
        em_tensor *shared = tu_tensor(dev, EM_F32, EM_SHAPE(R, N), x);
        em_tensor *other = em_reshape(shared, EM_SHAPE(R * N)); /* a second view of its buffer */
        em_tensor *got2 = em_cross_entropy_rows_backward(g, em_take(shared), cls, 0.1);
        assert_non_null(got2);
        double *vother = tu_read(other), *vgot2 = tu_read(got2);
        assert_true(tu_close_n("shared logits unchanged", vother, x, R * N, 0));
        assert_true(tu_close_n("shared logits' gradient", vgot2, vref, R * N, 0));
        free(vref), free(vlg), free(vgot), free(vother), free(vgot2);

        /* through autodiff: logits = x w, their buffer the gradient's when the tape lets go */
        double *gx[2];
        uint64_t peak[2];
        for (int retain = 0; retain < 2; retain++) {
            em_scope_begin();
            em_tensor *xt = tu_tensor(dev, EM_F32, EM_SHAPE(R, K), xk);
            em_tensor *wt = tu_tensor(dev, EM_F32, EM_SHAPE(K, N), wv);
            assert_int_equal(em_set_requires_grad(xt, true), EM_OK);
            em_tensor *tt = em_from_host(dev, EM_I32, EM_SHAPE(R), c);
            em_tensor *loss = em_sum(em_take(em_cross_entropy_rows(em_take(em_matmul(xt, wt)), tt,
                                                                   -1, 0.1, NULL)),
                                     NULL, 0, false);
            assert_non_null(loss);
            assert_int_equal(em_flush(), EM_OK);
            em_device_pool_reset_peak(dev);
            uint64_t before = 0;
            em_pool_stats ps;
            em_device_pool_stats(dev, &ps);
            before = ps.bytes_in_use;
            assert_int_equal(retain ? em_backward_retain(loss, NULL) : em_backward(loss, NULL), EM_OK);
            assert_int_equal(em_flush(), EM_OK);
            em_device_pool_stats(dev, &ps);
            peak[retain] = ps.peak_in_use - before;
            gx[retain] = tu_read(em_grad(xt));
            em_scope_end(NULL, 0);
        }
        char what[96];
        snprintf(what, sizeof what, "gradient through the tape on %s", em_device_name(dev));
        assert_true(tu_close_n(what, gx[0], gx[1], R * K, 0));
        if (peak[0] + (uint64_t)(R * N) * 4 > peak[1])
            fail_msg("%s: backward's peak %llu bytes, retained %llu: the logits were not reused",
                     em_device_name(dev), (unsigned long long)peak[0], (unsigned long long)peak[1]);
        free(gx[0]), free(gx[1]);
        em_scope_end(NULL, 0);
    }
}

/* tensor_xent_backward_staged (the CUDA default for 2-byte logits whose rows fit shared memory
 * twice; EMBER_XENT_STAGED=3 takes it on every device, with 3 persistent cubes so that rows take
 * turns through the two buffers): the losses and gradient of one launch (tn_xent_rows_grad) and
 * the gradient alone against float64 references, for bf16 and f16 logits with ignored rows,
 * smoothing, dominant and -inf logits; the launches are the staged kernel's; the gradient written
 * over donated logits equals the one into a new tensor; a row length that is not a multiple of 8
 * takes tensor_xent_backward. */
static uint64_t staged_launches(void)
{
    em_profile_kernel k;
    return em_profile_kernel_get("tensor_xent_backward_staged", &k) ? k.launches : 0;
}

static void staged_case(em_device *dev, em_scalar dt, int64_t rows, int64_t n, double ls)
{
    char what[128];
    snprintf(what, sizeof what, "staged xent %s %s %lld x %lld ls %g", em_device_name(dev),
             em_scalar_name(dt), (long long)rows, (long long)n, ls);
    em_scope_begin();
    double *x = malloc((size_t)(rows * n) * sizeof *x), *g = malloc((size_t)rows * sizeof *g);
    double *loss = malloc((size_t)rows * sizeof *loss),
           *dx = malloc((size_t)(rows * n) * sizeof *dx);
    int64_t *t = malloc((size_t)rows * sizeof *t);
    assert_true(x && g && loss && dx && t);
    tu_fill(x, (size_t)(rows * n), -6, 6, (uint32_t)(n + rows));
    tu_fill(g, (size_t)rows, 0.5, 2, 7);
    for (int64_t r = 0; r < rows; r++) {
        t[r] = r % 5 == 3 ? IGNORE : (r * 131 + 7) % n;
        if (r % 4 == 1) x[r * n + (r * 17) % n] = 40; /* a dominant logit */
    }
    x[n - 1] = -INFINITY;
    em_tensor *lg = tu_tensor(dev, dt, EM_SHAPE(rows, n), x); /* x now holds the stored values */
    em_tensor *gt = tu_tensor(dev, EM_F32, EM_SHAPE(rows), g);
    em_tensor *tt = em_from_host(dev, EM_I64, EM_SHAPE(rows), t);
    em_tensor *cls = tn_xent_classes("test", tt, n, IGNORE, NULL);
    assert_non_null(cls);
    reference(x, t, g, rows, n, ls, loss, dx);
    bool staged = n % 8 == 0;
    em_no_grad_begin();
    em_profile_reset();
    em_tensor *rl = NULL;
    em_tensor *d1 = tn_xent_rows_grad(gt, lg, cls, ls, &rl);
    em_tensor *d2 = em_cross_entropy_rows_backward(gt, lg, cls, ls);
    if (!d1 || !rl || !d2) fail_msg("%s: %s", what, em_last_error());
    double *got = tu_read(rl);
    if (!tu_close_n(what, got, loss, (size_t)rows, loss_tol(dev, dt))) fail_msg("%s: loss", what);
    free(got);
    double *v1 = tu_read(d1), *v2 = tu_read(d2);
    if (!tu_close_n(what, v1, dx, (size_t)(rows * n), 2e-2))
        fail_msg("%s: gradient with the loss", what);
    if (!tu_close_n(what, v2, dx, (size_t)(rows * n), 2e-2)) fail_msg("%s: gradient", what);
    if (staged_launches() != (staged ? 2u : 0u))
        fail_msg("%s: %llu staged launches, expected %d", what,
                 (unsigned long long)staged_launches(), staged ? 2 : 0);
    /* in place: the donated logits hold the same gradient */
    em_tensor *mine = tu_tensor(dev, dt, EM_SHAPE(rows, n), x);
    em_tensor *d3 = em_cross_entropy_rows_backward(gt, em_take(mine), cls, ls);
    assert_ptr_equal(d3, mine);
    double *v3 = tu_read(d3);
    if (!tu_close_n(what, v3, v2, (size_t)(rows * n), 0)) fail_msg("%s: in place", what);
    em_no_grad_end();
    free(v1), free(v2), free(v3);
    em_scope_end(NULL, 0);
    free(x), free(g), free(loss), free(dx), free(t);
}

static void test_staged(void **state)
{
    (void)state;
    bool was = em_profile_enabled();
    em_profile_enable(true);
    setenv("EMBER_XENT_STAGED", "3", 1);
    static const em_scalar half[] = {EM_BF16, EM_F16};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t hi = 0; hi < 2; hi++) {
            if (!tu_has(tu_devs[di], half[hi])) continue;
            staged_case(tu_devs[di], half[hi], 37, 1000, 0);
            staged_case(tu_devs[di], half[hi], 37, 1000, 0.1);
            staged_case(tu_devs[di], half[hi], 2, 4104, 0); /* fewer rows than cubes */
            staged_case(tu_devs[di], half[hi], 5, 1001, 0); /* not a multiple of 8 */
        }
    unsetenv("EMBER_XENT_STAGED");
    em_profile_enable(was);
}

/* tensor_xent_backward for the H200 as the host binds it for GPT-2's fused head (50304 bf16
 * classes in lines of 8: 1024 units keeping 7 lines each, the losses too; xent_keep in
 * ops_xent.c) and without kept lines (256 units), through NVRTC for sm_90: it must compile
 * within __launch_bounds__'s registers and spill nothing (ptxas's report). */
static void test_cuda_compiles(void **state)
{
    (void)state;
    SKIP_UNLESS_NVRTC();
    em_caps caps = cuda_caps("sm_90");
    static const struct {
        em_scalar dt;
        unsigned cube, v, lw;
        bool loss;
    } cases[] = {{EM_BF16, 1024, 7, 8, true}, {EM_BF16, 1024, 7, 8, false}, {EM_F16, 256, 0, 8, true},
                 {EM_F32, 256, 0, 4, false}};
    for (size_t i = 0; i < EM_ARRAY_LEN(cases); i++) {
        em_lang_bind b[7] = {em_lang_bind_type("T", cases[i].dt), em_lang_bind_type("C", EM_F32),
                             em_lang_bind_type("M", EM_F32),       em_lang_bind_type("O", EM_F32),
                             em_lang_bind_int("CUBE", cases[i].cube), em_lang_bind_bool("LOSS", cases[i].loss),
                             em_lang_bind_int("V", cases[i].v)};
        char *src = builtin_cuda_source("tensor_xent_backward", b, 7, cases[i].lw, &caps);
        char label[96];
        snprintf(label, sizeof label, "tensor_xent_backward %s cube %u V %u%s", em_scalar_name(cases[i].dt),
                 cases[i].cube, cases[i].v, cases[i].loss ? " LOSS" : "");
        expect_nvrtc_clean(src, "sm_90", label);
        free(src);
    }
    /* the staged form as GPT-2's head binds it: 50304 bf16 classes, two row buffers */
    for (int loss = 0; loss < 2; loss++) {
        em_lang_bind b[7] = {em_lang_bind_type("T", EM_BF16), em_lang_bind_type("C", EM_F32),
                             em_lang_bind_type("M", EM_F32),  em_lang_bind_type("O", EM_F32),
                             em_lang_bind_int("CUBE", 1024),  em_lang_bind_bool("LOSS", loss),
                             em_lang_bind_int("NB", 50304)};
        char *src = builtin_cuda_source("tensor_xent_backward_staged", b, 7, 2, &caps);
        expect_nvrtc_clean(src, "sm_90",
                           loss ? "tensor_xent_backward_staged LOSS"
                                : "tensor_xent_backward_staged");
        free(src);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_counts),   cmocka_unit_test(test_dtypes_views_smoothing),
        cmocka_unit_test(test_extreme_logits), cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_half_logits),    cmocka_unit_test(test_gradient_in_place),
        cmocka_unit_test(test_staged),         cmocka_unit_test(test_cuda_compiles),
    };
    if (getenv("TU_ONLY")) cmocka_set_test_filter(getenv("TU_ONLY")); /* one test, on a GPU machine */
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
