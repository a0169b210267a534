/* test_attention_qkv.c — em_attention_qkv and em_attention_qkv_backward (the packed projection
 * of a GPT block) against em_attention on the three slices viewed as heads, on every device
 * present: the same kernels on other strides, so the output (heads merged) and the [B, T, 3C]
 * gradient must equal em_attention's out and dq | dk | dv to the last bit. Through autodiff, the
 * gradient of a loss reaching qkv through the packed op equals the one through narrow, reshape,
 * transpose and em_attention. The matrix-op kernels (forced with EMBER_ATTENTION=mma, and the
 * warpgroup ones with =wgmma, emulated on the CPU) and the public-ops backward
 * (EMBER_ATTENTION_BWD=matmul) write into the strided gradient as well; the fused wgmma backward
 * too, its dq within a rounding (summed with atomics). Misuse gets errors. */
#include "tensor_util.h"

#include "ember/autodiff.h"
#include "ember/tensor_grad.h"

/* q, k or v of qkv [B, T, 3C] as [B, H, T, D], as nn/attention.c's composed path views it. */
static em_tensor *heads_of(em_tensor *qkv, int which, int64_t H, int64_t C)
{
    em_shape s = em_shape_of(qkv);
    em_tensor *part = em_narrow(qkv, 2, which * C, C);
    return em_transpose(em_reshape(part, EM_SHAPE(s.d[0], s.d[1], H, C / H)), 1, 2);
}

/* Reads both tensors and fails unless they hold the same values bit for bit. */
static void expect_same(const char *what, const em_tensor *a, const em_tensor *b)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(em_numel(a), em_numel(b));
    double *x = tu_read(a), *y = tu_read(b);
    for (int64_t i = 0; i < em_numel(a); i++)
        if (memcmp(&x[i], &y[i], sizeof(double)) != 0)
            fail_msg("%s: element %lld is %.9g, expected %.9g", what, (long long)i, x[i], y[i]);
    free(x);
    free(y);
}

/* Reads both tensors and fails unless they agree within one rounding to a 16-bit float (the fused
 * wgmma backward sums dq with atomics in an order that varies, then rounds). */
static void expect_close(const char *what, const em_tensor *a, const em_tensor *b)
{
    assert_int_equal(em_numel(a), em_numel(b));
    double *x = tu_read(a), *y = tu_read(b);
    for (int64_t i = 0; i < em_numel(a); i++)
        if (!(fabs(x[i] - y[i]) <= fabs(y[i]) / 128 + 1e-5))
            fail_msg("%s: element %lld is %.9g, expected %.9g", what, (long long)i, x[i], y[i]);
    free(x);
    free(y);
}

/* One case on dev: forward and backward against em_attention on the views (dq within a rounding
 * where the fused backward runs: EMBER_ATTENTION_FUSED_BWD=1). */
static void run_case(em_device *dev, em_scalar dt, int64_t B, int64_t T, int64_t H, int64_t D, bool causal,
                     const char *how)
{
    const char *fused = getenv("EMBER_ATTENTION_FUSED_BWD");
    bool dq_exact = !(fused && !strcmp(fused, "1"));
    em_scope_begin();
    int64_t C = H * D;
    size_t n = (size_t)(B * T * 3 * C), m = (size_t)(B * T * C);
    double *v = malloc(n * sizeof(double)), *gv = malloc(m * sizeof(double));
    assert_true(v && gv);
    tu_fill(v, n, -1, 1, (uint32_t)(B * 7 + T + H * 3 + D));
    tu_fill(gv, m, -1, 1, (uint32_t)(T * 5 + D));
    em_tensor *qkv = tu_tensor(dev, dt, EM_SHAPE(B, T, 3 * C), v), *g = tu_tensor(dev, dt, EM_SHAPE(B, T, C), gv);
    double scale = 1.0 / sqrt((double)D);
    char what[160];
    snprintf(what, sizeof what, "attention_qkv %s B %lld T %lld H %lld D %lld%s (%s) on %s", em_scalar_name(dt),
             (long long)B, (long long)T, (long long)H, (long long)D, causal ? " causal" : "", how,
             em_device_name(dev));
    em_tensor *out = em_attention_qkv(qkv, H, causal, scale);
    if (!out) fail_msg("%s: %s", what, em_last_error());
    em_tensor *q = heads_of(qkv, 0, H, C), *k = heads_of(qkv, 1, H, C), *vv = heads_of(qkv, 2, H, C);
    em_tensor *ref4 = em_attention(q, k, vv, causal, scale);
    em_tensor *ref = em_reshape(em_transpose(ref4, 1, 2), EM_SHAPE(B, T, C));
    expect_same(what, out, ref);
    /* the backward, from the out and lse of em_attention's kernels on the views */
    em_tensor *o4 = tn_new(dev, dt, 4, (int64_t[]){B, H, T, D});
    em_tensor *l2 = tn_new(dev, dt == EM_F64 ? EM_F64 : EM_F32, 3, (int64_t[]){B, H, T});
    assert_int_equal(tn_attention_forward_into("test", q, k, vv, causal, scale, o4, l2), EM_OK);
    em_tensor *grad = em_attention_qkv_backward(g, qkv, out, l2, H, causal, scale);
    if (!grad) fail_msg("%s backward: %s", what, em_last_error());
    em_tensor *g4 = em_transpose(em_reshape(g, EM_SHAPE(B, T, H, D)), 1, 2);
    em_tensor *dq, *dk, *dv;
    assert_int_equal(em_attention_backward(g4, q, k, vv, o4, l2, causal, scale, &dq, &dk, &dv), EM_OK);
    em_tensor *parts[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        em_tensor *mine = em_narrow(grad, 2, i * C, C);
        em_tensor *theirs = em_reshape(em_transpose(parts[i], 1, 2), EM_SHAPE(B, T, C));
        char w2[200];
        snprintf(w2, sizeof w2, "%s backward, d%c", what, "qkv"[i]);
        if (i == 0 && !dq_exact)
            expect_close(w2, mine, theirs);
        else
            expect_same(w2, mine, theirs);
        em_release(parts[i]);
    }
    free(v);
    free(gv);
    em_scope_end(NULL, 0);
}

static void test_against_attention(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *d = tu_devs[di];
        run_case(d, EM_F32, 2, 5, 3, 16, true, "simt");
        run_case(d, EM_F32, 1, 33, 2, 8, false, "simt");
        if (tu_has(d, EM_BF16)) run_case(d, EM_BF16, 2, 17, 2, 64, true, "default");
    }
}

/* The matrix-op kernels and the public-ops backward, forced on the CPU. */
static void test_forced_paths(void **state)
{
    (void)state;
    em_device *cpu = tu_devs[0];
    if (!tu_is_cpu(cpu)) skip();
    static const char *const paths[] = {"mma", "wgmma"};
    for (size_t i = 0; i < EM_ARRAY_LEN(paths); i++) {
        setenv("EMBER_ATTENTION", paths[i], 1);
        /* the wgmma dq pass, then the fused backward */
        setenv("EMBER_ATTENTION_FUSED_BWD", "0", 1);
        run_case(cpu, EM_BF16, 1, 70, 2, 64, true, paths[i]);
        setenv("EMBER_ATTENTION_FUSED_BWD", "1", 1);
        setenv("EMBER_ATTENTION_TILES", "1:64:1:64:1:64", 1); /* the fused pass's tiles */
        if (i == 1) run_case(cpu, EM_BF16, 1, 70, 2, 64, true, "wgmma, fused backward");
        unsetenv("EMBER_ATTENTION_TILES");
        unsetenv("EMBER_ATTENTION_FUSED_BWD");
        setenv("EMBER_ATTENTION_BWD", "matmul", 1);
        run_case(cpu, EM_BF16, 2, 20, 1, 64, true, "public-ops backward");
        unsetenv("EMBER_ATTENTION_BWD");
    }
    unsetenv("EMBER_ATTENTION");
}

/* d loss / d qkv through autodiff: the packed op against narrow + reshape + transpose + attention. */
static void test_autodiff(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *d = tu_devs[di];
        em_scope_begin();
        int64_t B = 2, T = 9, H = 2, D = 8, C = H * D;
        double v[2 * 9 * 48], w[2 * 9 * 16];
        tu_fill(v, EM_ARRAY_LEN(v), -1, 1, 3);
        tu_fill(w, EM_ARRAY_LEN(w), -1, 1, 4);
        em_tensor *wt = tu_tensor(d, EM_F32, EM_SHAPE(B, T, C), w);
        em_tensor *grads[2];
        for (int packed = 0; packed < 2; packed++) {
            em_tensor *x = tu_tensor(d, EM_F32, EM_SHAPE(B, T, 3 * C), v);
            assert_int_equal(em_set_requires_grad(x, true), EM_OK);
            em_tensor *h = em_mul_scalar(x, 1.25); /* a non-leaf, as a linear layer's output */
            em_tensor *o;
            if (packed) {
                o = em_attention_qkv(h, H, true, 0.3);
            } else {
                em_tensor *a = em_attention(heads_of(h, 0, H, C), heads_of(h, 1, H, C), heads_of(h, 2, H, C), true, 0.3);
                o = em_reshape(em_transpose(a, 1, 2), EM_SHAPE(B, T, C));
            }
            em_tensor *loss = em_sum(em_mul(o, wt), NULL, 0, false);
            assert_non_null(loss);
            assert_int_equal(em_backward(loss, NULL), EM_OK);
            grads[packed] = em_grad(x);
            assert_non_null(grads[packed]);
        }
        char what[96];
        snprintf(what, sizeof what, "d loss / d qkv, packed against views, on %s", em_device_name(d));
        double *a = tu_read(grads[1]), *b = tu_read(grads[0]);
        bool ok = tu_close_n(what, a, b, EM_ARRAY_LEN(v), 1e-6);
        free(a);
        free(b);
        assert_true(ok);
        em_scope_end(NULL, 0);
    }
}

static void test_errors(void **state)
{
    (void)state;
    em_device *d = tu_devs[0];
    em_scope_begin();
    double v[2 * 3 * 24] = {0};
    em_tensor *bad = tu_tensor(d, EM_F32, EM_SHAPE(2, 3, 20), v), *qkv = tu_tensor(d, EM_F32, EM_SHAPE(2, 3, 24), v);
    tu_expect_error(em_attention_qkv(bad, 2, true, 1.0), "[B, T, 3C]");
    tu_expect_error(em_attention_qkv(qkv, 3, true, 1.0), "3 heads do not divide the width 8");
    tu_expect_error(em_attention_qkv(em_cast(qkv, EM_I32), 2, true, 1.0), "float");
    em_tensor *out = em_attention_qkv(qkv, 2, true, 1.0);
    assert_non_null(out);
    em_tensor *lse = em_zeros(d, EM_F32, EM_SHAPE(2, 2, 3));
    tu_expect_error(em_attention_qkv_backward(qkv, qkv, out, lse, 2, true, 1.0), "do not match qkv");
    em_clear_error();
    tu_expect_error(em_attention_qkv_backward(out, qkv, out, NULL, 2, true, 1.0), "NULL input");
    assert_false(em_attention_qkv_fast(bad, 2));
    em_clear_error();
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_attention),
        cmocka_unit_test(test_forced_paths),
        cmocka_unit_test(test_autodiff),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
