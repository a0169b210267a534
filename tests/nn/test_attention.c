/* test_attention.c — multi-head self-attention against a direct float64 loop implementation
 * (nn_ref.h's nr_mha): causal, unmasked, with a padding mask and with both, in both weight
 * layouts and in f32 and f64 on every device present; the KV-cache path (positions fed one at a
 * time, or in chunks, give the full-sequence outputs within 1e-5 in f32 and 1e-12 in f64; reset;
 * overflow); dropout in training mode; and the shape errors. */
#include "nn_ref.h"

static const em_scalar dtypes[] = {EM_F32, EM_F64};

/* f32 everywhere; f64 on the CPU only (the ops' f64 kernels are covered per device by the tensor
 * conformance tests, and compiling them again here would only slow PoCL and lavapipe down). */
static bool want(em_device *dev, em_scalar dt)
{
    return tu_has(dev, dt) && (dt == EM_F32 || tu_is_cpu(dev));
}

enum { B = 2, T = 6, C = 12, H = 3 };

static void test_mha_reference(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            em_scalar dt = dtypes[ti];
            if (!want(dev, dt)) continue;
            double tol = dt == EM_F32 ? 1e-4 : tu_tol_on(dev, dt) * 1000;
            for (int variant = 0; variant < 4; variant++) {
                bool causal = variant != 1, padded = variant >= 2, in_out = variant % 2 == 0;
                em_rng rng = em_rng_new(100 + variant);
                em_mha *m = em_mha_new(dev, dt, C, H, causal, variant != 3, 0.0, in_out, &rng);
                assert_non_null(m);
                nr_randomize(&m->base, 7 + variant);
                em_scope_begin();
                double x[B * T * C], ref[B * T * C];
                tu_fill(x, B * T * C, -1, 1, 21 + variant);
                em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(B, T, C), x);
                /* batch 0 left-padded (its first query sees only padding), batch 1 right-padded */
                int pad[B * T] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
                bool padb[B * T];
                for (int i = 0; i < B * T; i++) padb[i] = pad[i];
                em_tensor *pm = padded ? em_from_host(dev, EM_BOOL, EM_SHAPE(B, T), padb) : NULL;
                nr_attn a = nr_attn_read(m);
                nr_mha(x, B, T, C, H, &a, causal, padded ? pad : NULL, ref);
                char what[64];
                snprintf(what, sizeof what, "mha variant %d %s", variant, em_scalar_name(dt));
                tu_check(what, em_mha_forward(m, xt, pm, NULL, NULL), EM_SHAPE(B, T, C), ref, tol);
                nr_attn_free(&a);
                em_scope_end(NULL, 0);
                em_module_free(&m->base);
            }
        }
}

/* Feeds x through the cache in chunks of the given sizes and compares with the full forward. */
static void check_cache(em_device *dev, em_scalar dt, const int *chunks, int nchunks, bool padded)
{
    em_rng rng = em_rng_new(200);
    em_mha *m = em_mha_new(dev, dt, C, H, true, true, 0.1, true, &rng);
    assert_non_null(m);
    nr_randomize(&m->base, 9);
    em_module_train(&m->base, false);
    em_kv_cache *cache = em_kv_cache_new(dev, dt, B, H, T + 2, C / H);
    assert_non_null(cache);
    em_no_grad_begin();
    em_scope_begin();
    double x[B * T * C];
    tu_fill(x, B * T * C, -1, 1, 31);
    em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(B, T, C), x);
    bool padb[B * T] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    em_tensor *pm = padded ? em_from_host(dev, EM_BOOL, EM_SHAPE(B, T), padb) : NULL;
    double *full = tu_read(em_mha_forward(m, xt, pm, NULL, NULL));
    double tol = dt == EM_F32 ? 1e-5 : strcmp(em_device_caps(dev)->target, "glsl") ? 1e-12 : 1e-6;
    for (int rep = 0; rep < 2; rep++) { /* the second pass after a reset */
        int64_t at = 0;
        for (int c = 0; c < nchunks; c++) {
            em_tensor *part = em_narrow(xt, 1, at, chunks[c]);
            em_tensor *pmask = pm ? em_narrow(pm, 1, 0, at + chunks[c]) : NULL;
            em_tensor *y = em_mha_forward(m, part, pmask, cache, NULL);
            if (!y) fail_msg("cache forward: %s", em_last_error());
            assert_int_equal(cache->len, at + chunks[c]);
            double *got = tu_read(y);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < chunks[c]; t++) {
                    int64_t pos = at + t;
                    /* a query whose every key is padding is undefined (finite) */
                    if (padded && b == 0 && pos == 0) continue;
                    char what[96];
                    snprintf(what, sizeof what, "cache %s batch %d position %lld",
                             em_scalar_name(dt), b, (long long)pos);
                    if (!tu_close_n(what, got + (b * chunks[c] + t) * C, full + (b * T + pos) * C,
                                    C, tol))
                        fail_msg("%s on %s", what, em_device_name(dev));
                }
            free(got);
            at += chunks[c];
        }
        em_kv_cache_reset(cache);
        assert_int_equal(cache->len, 0);
    }
    free(full);
    em_scope_end(NULL, 0);
    em_no_grad_end();
    em_kv_cache_free(cache);
    em_module_free(&m->base);
}

static void test_kv_cache(void **state)
{
    (void)state;
    static const int ones[T] = {1, 1, 1, 1, 1, 1}, mixed[3] = {3, 1, 2};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t ti = 0; ti < EM_ARRAY_LEN(dtypes); ti++) {
            em_device *dev = tu_devs[di];
            if (!want(dev, dtypes[ti])) continue;
            check_cache(dev, dtypes[ti], ones, T, false);
            check_cache(dev, dtypes[ti], mixed, 3, false);
            check_cache(dev, dtypes[ti], mixed, 3, true);
        }
}

static void test_cache_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_rng rng = em_rng_new(300);
    em_mha *m = em_mha_new(dev, EM_F32, C, H, true, true, 0.0, false, &rng);
    assert_non_null(m);
    em_kv_cache *small = em_kv_cache_new(dev, EM_F32, B, H, 4, C / H);
    em_kv_cache *wrong = em_kv_cache_new(dev, EM_F32, B, H + 1, 8, C / H);
    em_kv_cache *f64 = em_kv_cache_new(dev, EM_F64, B, H, 8, C / H);
    assert_non_null(small);
    assert_non_null(wrong);
    assert_non_null(f64);
    assert_null(em_kv_cache_new(dev, EM_F32, 0, H, 4, 4));
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *x = em_zeros(dev, EM_F32, EM_SHAPE(B, 3, C));
    assert_non_null(em_mha_forward(m, x, NULL, small, NULL));
    tu_expect_error(em_mha_forward(m, x, NULL, small, NULL), "no room for 3");
    assert_int_equal(small->len, 3); /* a refused append leaves the cache as it was */
    tu_expect_error(em_mha_forward(m, x, NULL, wrong, NULL), "f32[2, 4, 8, 4]");
    assert_non_null(strstr(em_last_error(), "f32[2, 3, 3, 4]"));
    tu_expect_error(em_mha_forward(m, x, NULL, f64, NULL), "f64[2, 3, 8, 4]");
    /* the padding mask covers cached and new keys: [B, len + T] */
    em_tensor *pm = em_ones(dev, EM_BOOL, EM_SHAPE(B, 3));
    em_kv_cache_reset(small);
    assert_non_null(em_mha_forward(m, em_zeros(dev, EM_F32, EM_SHAPE(B, 1, C)), NULL, small, NULL));
    tu_expect_error(em_mha_forward(m, x, pm, small, NULL), "bool[2, 4]");
    assert_non_null(strstr(em_last_error(), "bool[2, 3]"));
    em_scope_end(NULL, 0);
    em_no_grad_end();
    em_kv_cache_free(small);
    em_kv_cache_free(wrong);
    em_kv_cache_free(f64);
    em_kv_cache_free(NULL);
    em_module_free(&m->base);
}

static void test_shape_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_rng rng = em_rng_new(400);
    em_mha *m = em_mha_new(dev, EM_F32, C, H, true, true, 0.0, false, &rng);
    assert_non_null(m);
    em_scope_begin();
    tu_expect_error(
        em_mha_forward(m, em_zeros(dev, EM_F32, EM_SHAPE(B, T, C + 1)), NULL, NULL, NULL),
        "f32[2, 6, 13]");
    assert_non_null(strstr(em_last_error(), "12]"));
    tu_expect_error(em_mha_forward(m, em_zeros(dev, EM_F32, EM_SHAPE(T, C)), NULL, NULL, NULL),
                    "f32[6, 12]");
    em_tensor *x = em_zeros(dev, EM_F32, EM_SHAPE(B, T, C));
    tu_expect_error(em_mha_forward(m, x, em_ones(dev, EM_BOOL, EM_SHAPE(B, T + 1)), NULL, NULL),
                    "bool[2, 7]");
    tu_expect_error(em_mha_forward(m, x, em_ones(dev, EM_F32, EM_SHAPE(B, T)), NULL, NULL),
                    "f32[2, 6]");
    em_scope_end(NULL, 0);
    em_module_free(&m->base);
}

static void test_dropout_training(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_rng rng = em_rng_new(500);
    em_mha *m = em_mha_new(dev, EM_F32, C, H, true, true, 0.5, false, &rng);
    assert_non_null(m);
    em_scope_begin();
    double xv[B * T * C];
    tu_fill(xv, B * T * C, -1, 1, 41);
    em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(B, T, C), xv);
    tu_expect_error(em_mha_forward(m, x, NULL, NULL, NULL), "generator");
    em_rng r1 = em_rng_new(1), r2 = em_rng_new(1);
    double *a = tu_read(em_mha_forward(m, x, NULL, NULL, &r1));
    double *b = tu_read(em_mha_forward(m, x, NULL, NULL, &r2));
    assert_memory_equal(a, b, sizeof(double) * B * T * C); /* reproducible from the seed */
    assert_true(r1.counter > 0);
    em_module_train(&m->base, false);
    double *e1 = tu_read(em_mha_forward(m, x, NULL, NULL, NULL));
    bool differs = false;
    for (int i = 0; i < B * T * C; i++) differs |= a[i] != e1[i];
    assert_true(differs);
    em_module_free(&m->base);
    /* the eval output equals a fresh module's output with p = 0 and the same weights */
    em_rng rng2 = em_rng_new(500);
    em_mha *m0 = em_mha_new(dev, EM_F32, C, H, true, true, 0.0, false, &rng2);
    double *e0 = tu_read(em_mha_forward(m0, x, NULL, NULL, NULL));
    assert_memory_equal(e0, e1, sizeof(double) * B * T * C);
    em_module_free(&m0->base);
    free(a);
    free(b);
    free(e1);
    free(e0);
    em_scope_end(NULL, 0);
}

/* Half types: a fully masked row stays finite (the fill is the dtype's lowest finite value). */
static void test_half_types(void **state)
{
    (void)state;
    static const em_scalar halves[] = {EM_F16, EM_BF16};
    em_device *dev = tu_devs[0];
    for (size_t ti = 0; ti < EM_ARRAY_LEN(halves); ti++) {
        em_scalar dt = halves[ti];
        if (!want(dev, dt)) continue;
        em_rng rng = em_rng_new(600);
        em_mha *m = em_mha_new(dev, dt, C, H, true, true, 0.0, true, &rng);
        assert_non_null(m);
        em_scope_begin();
        double x[B * T * C], ref[B * T * C];
        tu_fill(x, B * T * C, -1, 1, 51);
        em_tensor *xt = tu_tensor(dev, dt, EM_SHAPE(B, T, C), x);
        int pad[B * T] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
        bool padb[B * T];
        for (int i = 0; i < B * T; i++) padb[i] = pad[i];
        em_tensor *pm = em_from_host(dev, EM_BOOL, EM_SHAPE(B, T), padb);
        nr_attn a = nr_attn_read(m);
        nr_mha(x, B, T, C, H, &a, true, pad, ref);
        tu_check(em_scalar_name(dt), em_mha_forward(m, xt, pm, NULL, NULL), EM_SHAPE(B, T, C), ref,
                 5e-2);
        nr_attn_free(&a);
        em_scope_end(NULL, 0);
        em_module_free(&m->base);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mha_reference),    cmocka_unit_test(test_kv_cache),
        cmocka_unit_test(test_cache_errors),     cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_dropout_training), cmocka_unit_test(test_half_types),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
