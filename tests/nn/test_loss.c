/* test_loss.c — the losses against float64 references written independently in the test:
 * cross-entropy with ignore_index, label smoothing and every reduction (and large logits),
 * MSE, BCE with logits on extreme logits (no inf/nan) and with pos_weight; their shape errors;
 * and gradients checked against central finite differences in f64: of each loss w.r.t. its
 * input, and of a transformer block w.r.t. its input and parameters (through autodiff). */
#include "nn_ref.h"

static const em_scalar dtypes[] = {EM_F32, EM_F64};

/* f32 everywhere; f64 on the CPU only (the ops' f64 kernels are covered per device by the tensor
 * conformance tests, and compiling them again here would only slow PoCL and lavapipe down). */
static bool want(em_device *dev, em_scalar dt)
{
    return tu_has(dev, dt) && (dt == EM_F32 || tu_is_cpu(dev));
}

enum { N0 = 2, N1 = 3, NC = 5 };

/* PyTorch's cross_entropy for one row: label-smoothed nll. */
static double ref_ce_row(const double *x, int c, int t, double eps)
{
    double m = -INFINITY, z = 0;
    for (int i = 0; i < c; i++) m = fmax(m, x[i]);
    for (int i = 0; i < c; i++) z += exp(x[i] - m);
    double lse = m + log(z), nll = lse - x[t], smooth = 0;
    for (int i = 0; i < c; i++) smooth += (lse - x[i]) / c;
    return (1 - eps) * nll + eps * smooth;
}

static void ref_ce(const double *x, const int64_t *t, int n, int c, int64_t ignore, double eps,
                   em_reduction r, double *out)
{
    double sum = 0;
    int count = 0;
    for (int i = 0; i < n; i++) {
        double l = t[i] == ignore ? 0 : ref_ce_row(x + i * c, c, (int)t[i], eps);
        if (t[i] != ignore) count++;
        if (r == EM_REDUCE_NONE) out[i] = l;
        sum += l;
    }
    if (r == EM_REDUCE_SUM) out[0] = sum;
    if (r == EM_REDUCE_MEAN) out[0] = sum / count;
}

static void test_cross_entropy(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            em_scalar dt = dtypes[ti];
            if (!want(dev, dt)) continue;
            double tol = dt == EM_F32 ? 1e-5 : tu_tol_on(dev, dt) * 10;
            em_scope_begin();
            double x[N0 * N1 * NC];
            tu_fill(x, N0 * N1 * NC, -4, 4, 3);
            x[7] = 900; /* large logits stay finite */
            x[8] = 899;
            em_tensor *lt = tu_tensor(dev, dt, EM_SHAPE(N0, N1, NC), x);
            int64_t tg[N0 * N1] = {0, 4, -100, 2, 1, 3};
            int64_t tg2[N0 * N1] = {0, 4, 2, 2, 1, 3}; /* ignore_index 2 */
            em_tensor *tt = em_from_host(dev, EM_I64, EM_SHAPE(N0, N1), tg);
            em_tensor *tt2 = em_from_host(dev, EM_I64, EM_SHAPE(N0, N1), tg2);
            int32_t tg32[N0 * N1] = {0, 4, -100, 2, 1, 3};
            em_tensor *t32 = em_from_host(dev, EM_I32, EM_SHAPE(N0, N1), tg32);
            static const double smooth[] = {0.0, 0.1};
            for (int si = 0; si < 2; si++)
                for (int r = 0; r < 3; r++) {
                    double ref[N0 * N1];
                    em_shape s = r == EM_REDUCE_NONE ? EM_SHAPE(N0, N1) : EM_SHAPE();
                    ref_ce(x, tg, N0 * N1, NC, -100, smooth[si], (em_reduction)r, ref);
                    tu_check("cross_entropy", em_cross_entropy(lt, tt, -100, smooth[si], r), s, ref,
                             tol);
                    tu_check("cross_entropy i32", em_cross_entropy(lt, t32, -100, smooth[si], r), s,
                             ref, tol);
                    ref_ce(x, tg2, N0 * N1, NC, 2, smooth[si], (em_reduction)r, ref);
                    tu_check("cross_entropy ignore 2", em_cross_entropy(lt, tt2, 2, smooth[si], r),
                             s, ref, tol);
                }
            /* 2-D logits [N, C] */
            em_tensor *flat = em_reshape(lt, EM_SHAPE(N0 * N1, NC));
            em_tensor *tflat = em_reshape(tt, EM_SHAPE(N0 * N1));
            double ref[1];
            ref_ce(x, tg, N0 * N1, NC, -100, 0, EM_REDUCE_MEAN, ref);
            tu_check("cross_entropy 2-D", em_cross_entropy(flat, tflat, -100, 0, EM_REDUCE_MEAN),
                     EM_SHAPE(), ref, tol);
            /* every target ignored: the mean is 0 / 0, NaN as in PyTorch; the sum is 0 */
            em_tensor *all = em_full(dev, EM_I64, EM_SHAPE(N0, N1), -100);
            assert_true(isnan(em_item(em_cross_entropy(lt, all, -100, 0, EM_REDUCE_MEAN))));
            assert_true(em_item(em_cross_entropy(lt, all, -100, 0, EM_REDUCE_SUM)) == 0);
            /* errors name both shapes */
            em_tensor *bad = em_zeros(dev, EM_I64, EM_SHAPE(N0, N1 + 1));
            tu_expect_error(em_cross_entropy(lt, bad, -100, 0, EM_REDUCE_MEAN), "i64[2, 4]");
            assert_non_null(strstr(em_last_error(), "[2, 3, 5]"));
            tu_expect_error(
                em_cross_entropy(lt, em_zeros(dev, dt, EM_SHAPE(N0, N1)), -100, 0, EM_REDUCE_MEAN),
                "i32/i64");
            tu_expect_error(em_cross_entropy(lt, tt, -100, 1.0, EM_REDUCE_MEAN), "label_smoothing");
            int64_t oob[N0 * N1] = {0, 5, 1, 1, 1, 1};
            assert_null(em_cross_entropy(lt, em_from_host(dev, EM_I64, EM_SHAPE(N0, N1), oob), -100,
                                         0, EM_REDUCE_MEAN));
            em_scope_end(NULL, 0);
        }
}

static void test_mse(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double a[12], b[12], ref[12], sum = 0;
        tu_fill(a, 12, -3, 3, 4);
        tu_fill(b, 12, -3, 3, 5);
        em_tensor *at = tu_tensor(dev, EM_F32, EM_SHAPE(3, 4), a),
                  *bt = tu_tensor(dev, EM_F32, EM_SHAPE(3, 4), b);
        for (int i = 0; i < 12; i++) {
            ref[i] = (a[i] - b[i]) * (a[i] - b[i]);
            sum += ref[i];
        }
        tu_check("mse none", em_mse_loss(at, bt, EM_REDUCE_NONE), EM_SHAPE(3, 4), ref, 1e-5);
        tu_check("mse sum", em_mse_loss(at, bt, EM_REDUCE_SUM), EM_SHAPE(), &sum, 1e-5);
        double mean = sum / 12;
        tu_check("mse mean", em_mse_loss(at, bt, EM_REDUCE_MEAN), EM_SHAPE(), &mean, 1e-5);
        tu_expect_error(em_mse_loss(at, em_zeros(dev, EM_F32, EM_SHAPE(4, 3)), EM_REDUCE_MEAN),
                        "f32[4, 3]");
        assert_non_null(strstr(em_last_error(), "f32[3, 4]"));
        tu_expect_error(em_mse_loss(at, bt, (em_reduction)7), "reduction");
        em_scope_end(NULL, 0);
    }
}

/* -[pw y log s(x) + (1 - y) log(1 - s(x))] with log s written per sign (exact in f64). */
static double ref_bce(double x, double y, double pw)
{
    double log_s = x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));    /* log sigmoid(x) */
    double log_1ms = x >= 0 ? -x - log1p(exp(-x)) : -log1p(exp(x)); /* log(1 - sigmoid(x)) */
    return -(pw * y * log_s + (1 - y) * log_1ms);
}

static void test_bce(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            em_scalar dt = dtypes[ti];
            if (!want(dev, dt)) continue;
            double tol = dt == EM_F32 ? 1e-5 : tu_tol_on(dev, dt) * 10;
            em_scope_begin();
            double x[8] = {-1000, -100, -20, -0.5, 0, 3, 88, 1000};
            double y[8] = {1, 0, 0.3, 1, 0.5, 0, 1, 0};
            double pw[4] = {1, 2, 0.5, 3};
            em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(2, 4), x),
                      *yt = tu_tensor(dev, dt, EM_SHAPE(2, 4), y);
            em_tensor *pt = tu_tensor(dev, dt, EM_SHAPE(4), pw);
            double ref[8], rpw[8], s = 0, spw = 0;
            for (int i = 0; i < 8; i++) {
                ref[i] = ref_bce(x[i], y[i], 1);
                rpw[i] = ref_bce(x[i], y[i], pw[i % 4]);
                s += ref[i];
                spw += rpw[i];
            }
            tu_check("bce none", em_bce_with_logits(xt, yt, NULL, EM_REDUCE_NONE), EM_SHAPE(2, 4),
                     ref, tol);
            tu_check("bce pos_weight", em_bce_with_logits(xt, yt, pt, EM_REDUCE_NONE),
                     EM_SHAPE(2, 4), rpw, tol);
            tu_check("bce sum", em_bce_with_logits(xt, yt, NULL, EM_REDUCE_SUM), EM_SHAPE(), &s,
                     tol);
            double mpw = spw / 8;
            tu_check("bce mean pos_weight", em_bce_with_logits(xt, yt, pt, EM_REDUCE_MEAN),
                     EM_SHAPE(), &mpw, tol);
            tu_expect_error(
                em_bce_with_logits(xt, em_zeros(dev, dt, EM_SHAPE(8)), NULL, EM_REDUCE_MEAN),
                "[8]");
            assert_non_null(strstr(em_last_error(), "[2, 4]"));
            assert_null(em_bce_with_logits(xt, yt, em_ones(dev, dt, EM_SHAPE(3)), EM_REDUCE_MEAN));
            assert_null(
                em_bce_with_logits(xt, yt, em_ones(dev, dt, EM_SHAPE(3, 2, 4)), EM_REDUCE_MEAN));
            assert_non_null(strstr(em_last_error(), "pos_weight"));
            em_scope_end(NULL, 0);
        }
}

/* ---- gradients against finite differences (f64, CPU) ---------------------------------------- */

typedef em_tensor *(*loss_fn)(const em_tensor *x, void *user);

/* Gradient checks need true f64 math: the CPU device (skipped when the run excludes it). */
static em_device *cpu_dev(void)
{
    for (int i = 0; i < tu_ndev; i++)
        if (tu_is_cpu(tu_devs[i])) return tu_devs[i];
    return NULL;
}

/* Checks d fn(x) / d x from em_backward against central differences at x (n values, shape s). */
static void check_grad(const char *what, em_device *dev, em_shape s, const double *x0, loss_fn fn,
                       void *user)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    double *x = malloc(n * sizeof(double));
    memcpy(x, x0, n * sizeof(double));
    em_scope_begin();
    em_tensor *xt = tu_tensor(dev, EM_F64, s, x);
    assert_int_equal(em_set_requires_grad(xt, true), EM_OK);
    em_tensor *l = fn(xt, user);
    if (!l) fail_msg("%s: %s", what, em_last_error());
    assert_int_equal(em_backward(l, NULL), EM_OK);
    assert_non_null(em_grad(xt));
    double *g = tu_read(em_grad(xt));
    em_scope_end(NULL, 0);
    const double h = 1e-6;
    em_no_grad_begin();
    for (size_t i = 0; i < n; i++) {
        double v = x[i], fp, fm;
        em_scope_begin();
        x[i] = v + h;
        fp = em_item(fn(tu_tensor(dev, EM_F64, s, x), user));
        x[i] = v - h;
        fm = em_item(fn(tu_tensor(dev, EM_F64, s, x), user));
        x[i] = v;
        em_scope_end(NULL, 0);
        double fd = (fp - fm) / (2 * h);
        if (fabs(fd - g[i]) > 1e-6 * fmax(1, fabs(fd)))
            fail_msg("%s: d/dx[%zu] is %.10g, finite differences give %.10g", what, i, g[i], fd);
    }
    em_no_grad_end();
    free(g);
    free(x);
}

typedef struct ce_args {
    const em_tensor *targets, *other;
    double smooth;
    em_reduction r;
    em_tensor *weights; /* random weights so that a "none" reduction gives a scalar */
} ce_args;

static em_tensor *ce_fn(const em_tensor *x, void *user)
{
    ce_args *a = user;
    em_tensor *l = em_cross_entropy(x, a->targets, -100, a->smooth, a->r);
    return a->r == EM_REDUCE_NONE ? em_sum(em_take(em_mul(em_take(l), a->weights)), NULL, 0, false)
                                  : l;
}

static em_tensor *bce_fn(const em_tensor *x, void *user)
{
    ce_args *a = user;
    return em_bce_with_logits(x, a->targets, a->other, a->r);
}

static em_tensor *mse_fn(const em_tensor *x, void *user)
{
    ce_args *a = user;
    return em_mse_loss(x, a->targets, a->r);
}

static void test_loss_grads(void **state)
{
    (void)state;
    em_device *dev = cpu_dev();
    if (!dev) skip();
    em_scope_begin();
    double x[N0 * N1 * NC];
    tu_fill(x, N0 * N1 * NC, -3, 3, 8);
    int64_t tg[N0 * N1] = {1, -100, 4, 0, 2, 2};
    double wv[N0 * N1];
    tu_fill(wv, N0 * N1, 0.5, 2, 9);
    ce_args a = {.targets = em_from_host(dev, EM_I64, EM_SHAPE(N0, N1), tg),
                 .weights = tu_tensor(dev, EM_F64, EM_SHAPE(N0, N1), wv)};
    static const double smooth[] = {0.0, 0.2};
    for (int si = 0; si < 2; si++)
        for (int r = 0; r < 3; r++) {
            a.smooth = smooth[si];
            a.r = (em_reduction)r;
            check_grad("cross_entropy", dev, EM_SHAPE(N0, N1, NC), x, ce_fn, &a);
        }
    double y[8] = {1, 0, 0.3, 1, 0.5, 0, 1, 0}, pw[4] = {1, 2, 0.5, 3}, bx[8];
    tu_fill(bx, 8, -6, 6, 10);
    ce_args b = {.targets = tu_tensor(dev, EM_F64, EM_SHAPE(2, 4), y),
                 .other = tu_tensor(dev, EM_F64, EM_SHAPE(4), pw),
                 .r = EM_REDUCE_MEAN};
    check_grad("bce pos_weight", dev, EM_SHAPE(2, 4), bx, bce_fn, &b);
    b.other = NULL;
    b.r = EM_REDUCE_SUM;
    check_grad("bce", dev, EM_SHAPE(2, 4), bx, bce_fn, &b);
    check_grad("mse", dev, EM_SHAPE(2, 4), bx, mse_fn, &b);
    em_scope_end(NULL, 0);
}

/* ---- a block's gradients --------------------------------------------------------------------- */

typedef struct block_args {
    em_block *b;
    em_tensor *r; /* random projection: loss = sum(block(x) * r) */
} block_args;

static em_tensor *block_fn(const em_tensor *x, void *user)
{
    block_args *a = user;
    return em_sum(em_take(em_mul(em_take(em_block_forward(a->b, x, NULL, NULL, NULL)), a->r)), NULL,
                  0, false);
}

static void set_values(em_tensor *t, double *v)
{
    em_no_grad_begin();
    em_scope_begin();
    assert_int_equal(em_copy_(t, tu_tensor(em_tensor_device(t), em_dtype(t), em_shape_of(t), v)),
                     EM_OK);
    em_scope_end(NULL, 0);
    em_no_grad_end();
}

typedef struct pcheck {
    block_args *a;
    const em_tensor *x;
    int checked;
} pcheck;

/* For one parameter: autodiff's gradient against central differences on a few elements. */
static bool check_param(const char *name, em_module_entry *e, void *user)
{
    pcheck *pc = user;
    if (!e->is_param) return true;
    double *g = tu_read(em_grad(e->t)), *v = tu_read(e->t);
    int64_t n = em_numel(e->t);
    const double h = 1e-6;
    for (int64_t i = 0; i < n; i += n / 3 + 1) {
        double old = v[i], fp, fm;
        em_no_grad_begin();
        em_scope_begin();
        v[i] = old + h;
        set_values(e->t, v);
        fp = em_item(block_fn(pc->x, pc->a));
        v[i] = old - h;
        set_values(e->t, v);
        fm = em_item(block_fn(pc->x, pc->a));
        v[i] = old;
        set_values(e->t, v);
        em_scope_end(NULL, 0);
        em_no_grad_end();
        double fd = (fp - fm) / (2 * h);
        if (fabs(fd - g[i]) > 1e-6 * fmax(1, fabs(fd)))
            fail_msg("block %s[%lld]: autodiff %.10g, finite differences %.10g", name, (long long)i,
                     g[i], fd);
        pc->checked++;
    }
    free(g);
    free(v);
    return true;
}

static void test_block_grads(void **state)
{
    (void)state;
    em_device *dev = cpu_dev();
    if (!dev) skip();
    em_rng rng = em_rng_new(77);
    em_block_config cfg = {.dim = 8,
                           .heads = 2,
                           .hidden = 16,
                           .bias = true,
                           .p_dropout = 0.0,
                           .eps = 1e-5,
                           .act = EM_ACT_GELU_TANH,
                           .weight_in_out = true};
    em_block *b = em_block_new(dev, EM_F64, &cfg, &rng);
    assert_non_null(b);
    nr_randomize(&b->base, 5);
    em_scope_begin();
    double rv[2 * 4 * 8], x[2 * 4 * 8];
    tu_fill(rv, 64, -1, 1, 12);
    tu_fill(x, 64, -1, 1, 13);
    block_args a = {b, tu_tensor(dev, EM_F64, EM_SHAPE(2, 4, 8), rv)};
    /* d / d x (x requires grad; the parameters get gradients too) */
    check_grad("block input", dev, EM_SHAPE(2, 4, 8), x, block_fn, &a);
    em_module_zero_grad(&b->base);
    em_tensor *xt = tu_tensor(dev, EM_F64, EM_SHAPE(2, 4, 8), x);
    assert_int_equal(em_backward(block_fn(xt, &a), NULL), EM_OK);
    pcheck pc = {&a, xt, 0};
    em_module_visit(&b->base, check_param, &pc);
    assert_true(pc.checked >= 12 * 2);
    em_module_zero_grad(&b->base);
    em_scope_end(NULL, 0);
    em_module_free(&b->base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_mse),
        cmocka_unit_test(test_bce),           cmocka_unit_test(test_loss_grads),
        cmocka_unit_test(test_block_grads),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
