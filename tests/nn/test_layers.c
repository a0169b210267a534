/* test_layers.c — the nn layers against float64 references computed by plain loops (nn_ref.h):
 * Linear in both weight layouts, Embedding, LayerNorm, RMSNorm, the MLP, the transformer block,
 * Conv2d and pool modules, on every device present (tests/tensor/tensor_util.h's device loop,
 * or $EMBER_TEST_DEVICE), in f32 and f64; dropout (fraction zeroed, scaling, eval and p = 0 are
 * the identity, reproducible from the seed); initializer statistics and bounds by fan;
 * activations by name; and the shape errors, whose messages name both shapes. */
#include "nn_ref.h"

static const em_scalar dtypes[] = {EM_F32, EM_F64};

/* f32 everywhere; f64 on the CPU only (the ops' f64 kernels are covered per device by the tensor
 * conformance tests, and compiling them again here would only slow PoCL and lavapipe down). */
static bool want(em_device *dev, em_scalar dt)
{
    return tu_has(dev, dt) && (dt == EM_F32 || tu_is_cpu(dev));
}

static double tol_for(em_device *dev, em_scalar dt)
{
    return dt == EM_F32 ? 1e-4 : tu_tol_on(dev, dt) * 100;
}

static void test_linear(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            em_scalar dt = dtypes[ti];
            if (!want(dev, dt)) continue;
            for (int layout = 0; layout < 2; layout++)
                for (int has_bias = 0; has_bias < 2; has_bias++) {
                    em_rng rng = em_rng_new(10 + layout * 2 + has_bias);
                    em_linear *l = em_linear_new(dev, dt, 5, 4, has_bias, layout, &rng);
                    assert_non_null(l);
                    em_shape ws = em_shape_of(l->weight);
                    assert_int_equal(ws.d[0], layout ? 5 : 4);
                    assert_int_equal(ws.d[1], layout ? 4 : 5);
                    assert_int_equal(l->bias != NULL, has_bias);
                    em_scope_begin();
                    double x[30], ref[24];
                    tu_fill(x, 30, -1, 1, 7);
                    em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(2, 3, 5), x);
                    double *w = tu_read(l->weight), *b = has_bias ? tu_read(l->bias) : NULL;
                    /* PyTorch's init: uniform(+-1/sqrt(in)) */
                    double bound = 1 / sqrt(5.0);
                    for (int i = 0; i < 20; i++) assert_true(fabs(w[i]) <= bound);
                    for (int i = 0; has_bias && i < 4; i++) assert_true(fabs(b[i]) <= bound);
                    nr_linear(x, 6, 5, 4, w, b, layout, ref);
                    tu_check("linear", em_linear_forward(l, xt), EM_SHAPE(2, 3, 4), ref,
                             tol_for(dev, dt));
                    /* a non-contiguous input: a transposed view */
                    em_tensor *xs = em_transpose(tu_tensor(dev, dt, EM_SHAPE(5, 6), x), 0, 1);
                    double xr[30], ref2[24];
                    for (int r = 0; r < 6; r++)
                        for (int c = 0; c < 5; c++) xr[r * 5 + c] = x[c * 6 + r];
                    nr_linear(xr, 6, 5, 4, w, b, layout, ref2);
                    tu_check("linear view", em_linear_forward(l, xs), EM_SHAPE(6, 4), ref2,
                             tol_for(dev, dt));
                    /* wrong shape: the message names the expected and the given shapes */
                    em_tensor *bad = em_zeros(dev, dt, EM_SHAPE(2, 3, 4));
                    tu_expect_error(em_linear_forward(l, bad), "[..., 5]");
                    assert_non_null(strstr(em_last_error(), "[2, 3, 4]"));
                    free(w);
                    free(b);
                    em_scope_end(NULL, 0);
                    em_module_free(&l->base);
                }
        }
}

static void test_embedding(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_rng rng = em_rng_new(20);
        em_embedding_mod *e = em_embedding_new(dev, EM_F32, 7, 3, &rng);
        assert_non_null(e);
        em_scope_begin();
        double *w = tu_read(e->weight);
        int64_t ids[6] = {0, 6, 3, 3, 1, 5};
        em_tensor *it = em_from_host(dev, EM_I64, EM_SHAPE(2, 3), ids);
        double ref[18];
        for (int i = 0; i < 6; i++)
            for (int d = 0; d < 3; d++) ref[i * 3 + d] = w[ids[i] * 3 + d];
        tu_check("embedding", em_embedding_forward(e, it), EM_SHAPE(2, 3, 3), ref, 0);
        int32_t ids32[2] = {4, 2};
        em_tensor *i32 = em_from_host(dev, EM_I32, EM_SHAPE(2), ids32);
        double ref32[6] = {w[12], w[13], w[14], w[6], w[7], w[8]};
        tu_check("embedding i32", em_embedding_forward(e, i32), EM_SHAPE(2, 3), ref32, 0);
        tu_expect_error(em_embedding_forward(e, em_zeros(dev, EM_F32, EM_SHAPE(2))), "i32 or i64");
        int64_t oob = 7;
        assert_null(em_embedding_forward(e, em_from_host(dev, EM_I64, EM_SHAPE(1), &oob)));
        free(w);
        em_scope_end(NULL, 0);
        em_module_free(&e->base);
    }
}

static void test_norms(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            em_scalar dt = dtypes[ti];
            if (!want(dev, dt)) continue;
            double tol = tol_for(dev, dt);
            em_layer_norm_mod *ln = em_layer_norm_new(dev, dt, 6, 1e-5, true, true);
            em_layer_norm_mod *plain = em_layer_norm_new(dev, dt, 6, 1e-3, false, false);
            em_layer_norm_mod *nob = em_layer_norm_new(dev, dt, 6, 1e-5, true, false);
            em_rms_norm_mod *rms = em_rms_norm_new(dev, dt, 6, 1e-6);
            assert_non_null(ln);
            assert_non_null(plain);
            assert_non_null(nob);
            assert_non_null(rms);
            assert_int_equal(em_module_num_params(&plain->base), 0);
            assert_int_equal(em_module_num_params(&nob->base), 6);
            assert_null(nob->bias);
            em_scope_begin();
            /* defaults: weight ones, bias zeros */
            double *w0 = tu_read(ln->weight), *b0 = tu_read(ln->bias);
            for (int i = 0; i < 6; i++) assert_true(w0[i] == 1 && b0[i] == 0);
            free(w0);
            free(b0);
            nr_randomize(&ln->base, 1);
            nr_randomize(&rms->base, 2);
            double x[24], ref[24];
            tu_fill(x, 24, -3, 3, 5);
            em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(2, 2, 6), x);
            double *w = tu_read(ln->weight), *b = tu_read(ln->bias), *rw = tu_read(rms->weight);
            nr_layer_norm(x, 4, 6, w, b, 1e-5, ref);
            tu_check("layer_norm", em_layer_norm_forward(ln, xt), EM_SHAPE(2, 2, 6), ref, tol);
            nr_layer_norm(x, 4, 6, NULL, NULL, 1e-3, ref);
            tu_check("layer_norm plain", em_layer_norm_forward(plain, xt), EM_SHAPE(2, 2, 6), ref,
                     tol);
            nr_rms_norm(x, 4, 6, rw, 1e-6, ref);
            tu_check("rms_norm", em_rms_norm_forward(rms, xt), EM_SHAPE(2, 2, 6), ref, tol);
            em_tensor *bad = em_zeros(dev, dt, EM_SHAPE(3, 5));
            tu_expect_error(em_layer_norm_forward(ln, bad), "[..., 6]");
            assert_non_null(strstr(em_last_error(), dt == EM_F32 ? "f32[3, 5]" : "f64[3, 5]"));
            tu_expect_error(em_rms_norm_forward(rms, bad), "[3, 5]");
            free(w);
            free(b);
            free(rw);
            em_scope_end(NULL, 0);
            em_module_free(&ln->base);
            em_module_free(&plain->base);
            em_module_free(&nob->base);
            em_module_free(&rms->base);
        }
}

static void test_mlp(void **state)
{
    (void)state;
    static const em_activation acts[] = {EM_ACT_GELU_TANH, EM_ACT_RELU, EM_ACT_GELU, EM_ACT_SILU};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ai = 0; ai < EM_ARRAY_LEN(acts); ai++) {
            em_device *dev = tu_devs[di];
            em_rng rng = em_rng_new(30 + ai);
            em_mlp *m = em_mlp_new(dev, EM_F32, 4, 16, acts[ai], ai != 1, 0.1, ai % 2, &rng);
            assert_non_null(m);
            em_module_train(&m->base, false); /* eval: dropout is the identity */
            em_scope_begin();
            double x[12], ref[12];
            tu_fill(x, 12, -2, 2, 9);
            em_tensor *xt = tu_tensor(dev, EM_F32, EM_SHAPE(3, 4), x);
            nr_mlp(x, 3, 4, 16, m, ref);
            tu_check("mlp", em_mlp_forward(m, xt, NULL), EM_SHAPE(3, 4), ref, 1e-4);
            em_scope_end(NULL, 0);
            em_module_free(&m->base);
        }
}

static void test_block(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            em_scalar dt = dtypes[ti];
            if (!want(dev, dt)) continue;
            em_rng rng = em_rng_new(40);
            em_block_config cfg = {.dim = 8,
                                   .heads = 2,
                                   .hidden = 32,
                                   .bias = true,
                                   .p_dropout = 0.0,
                                   .eps = 1e-5,
                                   .act = EM_ACT_GELU_TANH,
                                   .weight_in_out = ti == 0};
            em_block *b = em_block_new(dev, dt, &cfg, &rng);
            assert_non_null(b);
            nr_randomize(&b->base, 3);
            em_scope_begin();
            double x[2 * 5 * 8], ref[2 * 5 * 8];
            tu_fill(x, 80, -1, 1, 11);
            em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(2, 5, 8), x);
            nr_block(x, 2, 5, b, NULL, ref);
            /* training mode with p = 0 needs no generator and changes nothing */
            tu_check("block", em_block_forward(b, xt, NULL, NULL, NULL), EM_SHAPE(2, 5, 8), ref,
                     dt == EM_F32 ? 2e-4 : tu_tol_on(dev, dt) * 1000);
            int pad[10] = {0, 1, 1, 1, 1, 1, 1, 1, 0, 0};
            bool padb[10];
            for (int i = 0; i < 10; i++) padb[i] = pad[i];
            em_tensor *pm = em_from_host(dev, EM_BOOL, EM_SHAPE(2, 5), padb);
            nr_block(x, 2, 5, b, pad, ref);
            tu_check("block padded", em_block_forward(b, xt, pm, NULL, NULL), EM_SHAPE(2, 5, 8),
                     ref, dt == EM_F32 ? 2e-4 : tu_tol_on(dev, dt) * 1000);
            tu_expect_error(
                em_block_forward(b, em_zeros(dev, dt, EM_SHAPE(2, 5, 7)), NULL, NULL, NULL),
                "[2, 5, 7]");
            em_scope_end(NULL, 0);
            em_module_free(&b->base);
        }
}

/* ---- dropout ------------------------------------------------------------------------------- */

static void test_dropout(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    const int64_t n = 100000;
    em_scope_begin();
    em_tensor *x = em_full(dev, EM_F32, EM_SHAPE(n), 2.0);
    static const double ps[] = {0.1, 0.5, 0.9};
    for (size_t i = 0; i < EM_ARRAY_LEN(ps); i++) {
        double p = ps[i];
        em_rng rng = em_rng_new(50);
        double *y = tu_read(em_dropout(x, p, true, &rng));
        int64_t zeros = 0;
        for (int64_t j = 0; j < n; j++) {
            if (y[j] == 0)
                zeros++;
            else if (fabs(y[j] - 2 / (1 - p)) > 1e-5 * (2 / (1 - p)))
                fail_msg("element %lld is %g", (long long)j, y[j]);
        }
        /* binomial: 5 standard deviations */
        double sd = sqrt(p * (1 - p) / (double)n);
        assert_true(fabs((double)zeros / (double)n - p) < 5 * sd);
        /* the same seed gives the same mask; the advanced generator another one */
        em_rng again = em_rng_new(50);
        double *y2 = tu_read(em_dropout(x, p, true, &again));
        assert_memory_equal(y, y2, sizeof(double) * (size_t)n);
        double *y3 = tu_read(em_dropout(x, p, true, &rng));
        assert_true(memcmp(y, y3, sizeof(double) * (size_t)n) != 0);
        free(y);
        free(y2);
        free(y3);
    }
    em_rng rng = em_rng_new(51);
    double v[6] = {1, -2, 3, -4, 5, -6};
    em_tensor *small = tu_tensor(dev, EM_F32, EM_SHAPE(2, 3), v);
    tu_check("dropout eval", em_dropout(small, 0.5, false, &rng), EM_SHAPE(2, 3), v, 0);
    tu_check("dropout p=0", em_dropout(small, 0, true, NULL), EM_SHAPE(2, 3), v, 0);
    double z[6] = {0};
    tu_check("dropout p=1", em_dropout(small, 1, true, &rng), EM_SHAPE(2, 3), z, 0);
    assert_int_equal(rng.counter, em_rng_new(51).counter); /* no draw was needed */
    tu_expect_error(em_dropout(small, 1.5, true, &rng), "[0, 1]");
    tu_expect_error(em_dropout(small, 0.5, true, NULL), "generator");
    tu_expect_error(em_dropout(em_zeros(dev, EM_I32, EM_SHAPE(2)), 0.5, true, &rng), "floating");
    em_scope_end(NULL, 0);
}

static void test_activations(void **state)
{
    (void)state;
    assert_int_equal(em_activation_parse("gelu_new"), EM_ACT_GELU_TANH);
    assert_int_equal(em_activation_parse("gelu_tanh"), EM_ACT_GELU_TANH);
    assert_int_equal(em_activation_parse("gelu"), EM_ACT_GELU);
    assert_int_equal(em_activation_parse("relu"), EM_ACT_RELU);
    assert_int_equal(em_activation_parse("silu"), EM_ACT_SILU);
    assert_int_equal(em_activation_parse("tanh"), EM_ACT_TANH);
    assert_int_equal(em_activation_parse("sigmoid"), EM_ACT_SIGMOID);
    em_clear_error();
    assert_int_equal(em_activation_parse("swoosh"), EM_ACT_NONE);
    assert_non_null(strstr(em_last_error(), "swoosh"));
    em_device *dev = tu_devs[0];
    em_scope_begin();
    double x[8], ref[8];
    tu_fill(x, 8, -4, 4, 3);
    em_tensor *xt = tu_tensor(dev, EM_F64, EM_SHAPE(8), x);
    for (int a = EM_ACT_NONE; a <= EM_ACT_SIGMOID; a++) {
        for (int i = 0; i < 8; i++) ref[i] = nr_act(x[i], (em_activation)a);
        tu_check("activation", em_activate(xt, (em_activation)a), EM_SHAPE(8), ref,
                 tu_tol_on(dev, EM_F64) * 10);
    }
    em_scope_end(NULL, 0);
}

/* ---- initializers -------------------------------------------------------------------------- */

static void stats(const em_tensor *t, double *mean, double *sd, double *amax)
{
    double *v = tu_read(t);
    int64_t n = em_numel(t);
    double s = 0, s2 = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        if (fabs(v[i]) > m) m = fabs(v[i]);
    }
    s /= (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - s) * (v[i] - s);
    *mean = s;
    *sd = sqrt(s2 / (double)(n - 1));
    *amax = m;
    free(v);
}

/* The sample mean and standard deviation of n draws are within 5 standard errors. */
static void expect_stats(const char *what, const em_tensor *t, double mean, double sd)
{
    double m, s, a;
    stats(t, &m, &s, &a);
    double n = (double)em_numel(t);
    if (fabs(m - mean) > 5 * sd / sqrt(n) || fabs(s - sd) > 5 * sd / sqrt(2 * n) * 1.5)
        fail_msg("%s: mean %g sd %g, expected %g and %g", what, m, s, mean, sd);
}

static void test_init(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_rng rng = em_rng_new(60);
    em_tensor *t = em_zeros(dev, EM_F32, EM_SHAPE(400, 500));
    assert_int_equal(em_init_normal(t, 1.0, 2.0, &rng), EM_OK);
    expect_stats("normal", t, 1.0, 2.0);
    assert_int_equal(em_init_uniform(t, -2, 3, &rng), EM_OK);
    expect_stats("uniform", t, 0.5, 5 / sqrt(12.0));
    double m, s, a;
    stats(t, &m, &s, &a);
    assert_true(a <= 3);
    /* xavier: fan_in 500, fan_out 400 */
    double xb = sqrt(6.0 / 900);
    assert_int_equal(em_init_xavier_uniform(t, 1.0, &rng), EM_OK);
    stats(t, &m, &s, &a);
    assert_true(a <= xb && a > 0.99 * xb);
    expect_stats("xavier_uniform", t, 0, xb / sqrt(3.0));
    assert_int_equal(em_init_xavier_normal(t, 2.0, &rng), EM_OK);
    expect_stats("xavier_normal", t, 0, 2 * sqrt(2.0 / 900));
    assert_int_equal(em_init_kaiming_normal(t, false, &rng), EM_OK);
    expect_stats("kaiming_normal fan_out", t, 0, sqrt(2.0 / 400));
    assert_int_equal(em_init_kaiming_normal(t, true, &rng), EM_OK);
    expect_stats("kaiming_normal fan_in", t, 0, sqrt(2.0 / 500));
    assert_int_equal(em_init_gpt2_residual(t, 12, &rng), EM_OK);
    expect_stats("gpt2_residual", t, 0, 0.02 / sqrt(24.0));
    /* kaiming uniform on a conv weight: fan_in = 20 * 3 * 3 = 180, fan_out = 30 * 9 = 270 */
    em_tensor *c = em_zeros(dev, EM_F64, EM_SHAPE(30, 20, 3, 3));
    assert_int_equal(em_init_kaiming_uniform(c, true, &rng), EM_OK);
    stats(c, &m, &s, &a);
    double kb = sqrt(6.0 / 180);
    assert_true(a <= kb && a > 0.98 * kb);
    assert_int_equal(em_init_kaiming_uniform(c, false, &rng), EM_OK);
    stats(c, &m, &s, &a);
    kb = sqrt(6.0 / 270);
    assert_true(a <= kb && a > 0.98 * kb);
    assert_int_equal(em_init_constant(c, 0.25), EM_OK);
    stats(c, &m, &s, &a);
    assert_true(m == 0.25 && s == 0);
    /* the same seed gives the same draw, in place (the tensor object stays) */
    em_tensor *u1 = em_zeros(dev, EM_F32, EM_SHAPE(64)), *u2 = em_zeros(dev, EM_F32, EM_SHAPE(64));
    em_rng r1 = em_rng_new(7), r2 = em_rng_new(7);
    assert_int_equal(em_init_normal(u1, 0, 1, &r1), EM_OK);
    assert_int_equal(em_init_normal(u2, 0, 1, &r2), EM_OK);
    double *v1 = tu_read(u1), *v2 = tu_read(u2);
    assert_memory_equal(v1, v2, 64 * sizeof(double));
    free(v1);
    free(v2);
    /* errors */
    em_tensor *vec = em_zeros(dev, EM_F32, EM_SHAPE(10));
    assert_int_equal(em_init_xavier_uniform(vec, 1, &rng), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "f32[10]"));
    assert_int_equal(em_init_normal(em_zeros(dev, EM_I32, EM_SHAPE(3)), 0, 1, &rng),
                     EM_ERR_INVALID);
    assert_int_equal(em_init_normal(vec, 0, 1, NULL), EM_ERR_INVALID);
    assert_int_equal(em_init_normal(NULL, 0, 1, &rng), EM_ERR_INVALID);
    assert_int_equal(em_init_gpt2_residual(vec, 0, &rng), EM_ERR_INVALID);
    em_scope_end(NULL, 0);
}

/* ---- conv and pools ------------------------------------------------------------------------- */

static void test_conv_pool(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_rng rng = em_rng_new(70);
        /* in 4, out 6, kernel 3, stride 2, padding 1, dilation 1, groups 2 */
        em_conv2d_mod *c = em_conv2d_new(dev, EM_F32, 4, 6, 3, 2, 1, 1, 2, true, &rng);
        assert_non_null(c);
        em_shape ws = em_shape_of(c->weight);
        assert_int_equal(ws.d[1], 2);
        em_scope_begin();
        double *w = tu_read(c->weight), *b = tu_read(c->bias);
        double bound = 1 / sqrt(2.0 * 9);
        for (int i = 0; i < 6 * 2 * 9; i++) assert_true(fabs(w[i]) <= bound);
        double x[2 * 4 * 5 * 5];
        tu_fill(x, 200, -1, 1, 13);
        em_tensor *xt = tu_tensor(dev, EM_F32, EM_SHAPE(2, 4, 5, 5), x);
        double ref[2 * 6 * 3 * 3];
        for (int n = 0; n < 2; n++)
            for (int o = 0; o < 6; o++)
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        double acc = b[o];
                        int g = o / 3;
                        for (int ci = 0; ci < 2; ci++)
                            for (int ki = 0; ki < 3; ki++)
                                for (int kj = 0; kj < 3; kj++) {
                                    int y = i * 2 - 1 + ki, xx = j * 2 - 1 + kj;
                                    if (y < 0 || y >= 5 || xx < 0 || xx >= 5) continue;
                                    acc += w[((o * 2 + ci) * 3 + ki) * 3 + kj] *
                                           x[((n * 4 + g * 2 + ci) * 5 + y) * 5 + xx];
                                }
                        ref[((n * 6 + o) * 3 + i) * 3 + j] = acc;
                    }
        tu_check("conv2d module", em_conv2d_forward(c, xt), EM_SHAPE(2, 6, 3, 3), ref, 1e-4);
        em_pool2d_mod *mp = em_pool2d_new(dev, true, 2, 0, 0),
                      *ap = em_pool2d_new(dev, false, 3, 1, 1);
        assert_non_null(mp);
        assert_non_null(ap);
        assert_int_equal(em_module_num_params(&mp->base), 0);
        double pr[2 * 4 * 2 * 2], ar[2 * 4 * 5 * 5];
        for (int nc = 0; nc < 8; nc++) {
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) {
                    double m = -INFINITY;
                    for (int a = 0; a < 2; a++)
                        for (int bb = 0; bb < 2; bb++)
                            m = fmax(m, x[(nc * 5 + 2 * i + a) * 5 + 2 * j + bb]);
                    pr[(nc * 2 + i) * 2 + j] = m;
                }
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 5; j++) {
                    double s = 0;
                    for (int a = -1; a <= 1; a++)
                        for (int bb = -1; bb <= 1; bb++)
                            if (i + a >= 0 && i + a < 5 && j + bb >= 0 && j + bb < 5)
                                s += x[(nc * 5 + i + a) * 5 + j + bb];
                    ar[(nc * 5 + i) * 5 + j] = s / 9;
                }
        }
        tu_check("max pool module", em_pool2d_forward(mp, xt), EM_SHAPE(2, 4, 2, 2), pr, 1e-6);
        tu_check("avg pool module", em_pool2d_forward(ap, xt), EM_SHAPE(2, 4, 5, 5), ar, 1e-5);
        assert_null(em_conv2d_forward(c, em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 5, 5))));
        assert_null(em_conv2d_new(dev, EM_F32, 3, 6, 3, 1, 0, 1, 2, true, &rng));
        assert_null(em_pool2d_new(dev, true, 2, 0, 2));
        free(w);
        free(b);
        em_scope_end(NULL, 0);
        em_module_free(&c->base);
        em_module_free(&mp->base);
        em_module_free(&ap->base);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),      cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_norms),       cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_block),       cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_activations), cmocka_unit_test(test_init),
        cmocka_unit_test(test_conv_pool),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
