/* test_attention.c — fused attention (em_attention, src/kernels/tensor_attention.ek) on every
 * device present: the output and, through autodiff (em_backward of sum(out * g)), the gradients
 * of q, k and v against a float64 reference of naive attention (softmax(q k^T * scale + mask) v),
 * causal and not, Tq == Tk and Tq < Tk (the causal mask aligned at the last key), sequence lengths
 * from 1 to past a cube and a tile (one of 1024 on the CPU), head sizes 40, 64 and 128, B * H > 1,
 * every float dtype the device holds, q read through the transposed view GPT-2's heads are, the
 * matrix-unit path (forced with EMBER_ATTENTION=mma); and the misuse cases, each an error naming
 * the shapes. GPU emulators (PoCL, lavapipe) run fewer, smaller
 * cases: their compiles and runs are slow. */
#include "attention_case.h"

/* f32: every length, both masks, every head size (the emulators: fewer). */
static void test_lengths_f32(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 7, 33, 64, 200};
    static const int64_t dims[] = {64, 128, 40};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        bool cpu = tu_is_cpu(dev);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (size_t ci = 0; ci < 2; ci++)
                for (size_t xi = 0; xi < sizeof dims / sizeof dims[0]; xi++) {
                    int64_t T = lens[li], D = dims[xi];
                    if (!cpu && (T > 33 || D == 64)) continue;
                    acase c = {2, 3, T, T, D, ci == 1, li == 2, false};
                    run_case(dev, EM_F32, c, (uint32_t)(li * 10 + ci * 3 + xi + 1));
                }
    }
}

/* Fewer queries than keys (a chunk after a cached prefix, decoding one token) and odd sizes. */
static void test_fewer_queries(void **state)
{
    (void)state;
    static const acase cases[] = {
        {1, 2, 5, 33, 64, true, false, false},  {2, 1, 1, 64, 40, true, false, false},
        {1, 3, 7, 20, 80, false, false, false}, {2, 2, 64, 200, 64, true, true, false},
        {1, 2, 3, 9, 1, true, false, false},    {1, 1, 17, 70, 256, true, false, false},
    };
    for (int di = 0; di < tu_ndev; di++) {
        bool cpu = tu_is_cpu(tu_devs[di]);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (!cpu && (i == 3 || i == 5)) continue;
            run_case(tu_devs[di], EM_F32, cases[i], (uint32_t)(100 + i));
        }
    }
}

/* f16, bf16 and f64 where the device holds them. */
static void test_dtypes(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F16, EM_BF16, EM_F64};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        bool cpu = tu_is_cpu(dev);
        for (size_t ti = 0; ti < 3; ti++) {
            if (!tu_has(dev, dts[ti])) continue;
            acase a = {2, 2, 33, 33, 64, true, true, false};
            acase b = {1, 3, 7, 19, 64, true, false, false};
            acase c = {2, 2, 64, 64, 128, false, false, false};
            acase d = {1, 2, 200, 200, 40, true, false, false};
            run_case(dev, dts[ti], a, (uint32_t)(200 + ti));
            run_case(dev, dts[ti], b, (uint32_t)(210 + ti));
            if (cpu) {
                run_case(dev, dts[ti], c, (uint32_t)(220 + ti));
                run_case(dev, dts[ti], d, (uint32_t)(230 + ti));
            }
        }
    }
}

/* The backward's statistics in 16-byte lines (tensor_attention_delta_lines) where the plane holds
 * a row's D / lanes units: every case against the float64 reference as above, the profiler
 * showing which kernel ran, and the plane kernel (EMBER_ATTENTION_DELTA_LINES=0) on the same
 * cases. On the CPU (planes of one unit) that is f32 at D 4; on lavapipe (planes of 8) f32 up to
 * D 32 and 16-bit types at D 64; on CUDA every head size up to 128. */
static void test_delta_lines(void **state)
{
    (void)state;
    static const struct {
        em_scalar dt;
        int64_t D;
    } cs[] = {{EM_F32, 4}, {EM_F32, 16}, {EM_F32, 32}, {EM_F16, 64}, {EM_BF16, 64}, {EM_F32, 24}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            if (!tu_has(dev, cs[i].dt)) continue;
            int64_t lanes = 16 / (int64_t)em_scalar_size(cs[i].dt), dl = cs[i].D / lanes;
            bool lines = caps->plane_ops && cs[i].D % lanes == 0 && dl <= caps->plane_dim &&
                         !(dl & (dl - 1));
            for (int off = 0; off < 2; off++) {
                if (off) setenv("EMBER_ATTENTION_DELTA_LINES", "0", 1);
                em_profile_enable(true);
                em_profile_reset();
                acase c = {2, 3, 33, 33, cs[i].D, true, true, false}; /* q strided */
                run_case(dev, cs[i].dt, c, (uint32_t)(300 + i));
                em_profile_kernel kf = {0};
                bool ran =
                    em_profile_kernel_get("tensor_attention_delta_lines", &kf) && kf.launches > 0;
                em_profile_enable(false);
                unsetenv("EMBER_ATTENTION_DELTA_LINES");
                if (ran != (lines && !off))
                    fail_msg("%s %s D %lld: the line kernel %s", em_device_name(dev),
                             em_scalar_name(cs[i].dt), (long long)cs[i].D,
                             ran ? "ran where it should not" : "did not run");
            }
        }
    }
}

/* The matrix-unit path, forced where only CUDA would pick it (the devices whose planes are one
 * unit run it; the others fall back to SIMT): the tensor_attention_fwd_mma forward and the tiled
 * backward (tensor_attention_bwd_kv_mma, _bwd_q_mma), f16 and bf16 with D 64 and 128, lengths
 * around the kernels' 64-row and 32-row tiles (7, 33, 65, 100, 200), Tq < Tk with the causal
 * mask, B * H > 1, k's rows not aligned (tiles copied element by element), the profiler's counts
 * showing that the tiled kernels ran; then once the backward through matmuls
 * (EMBER_ATTENTION_BWD=matmul). */
static void test_mma_path(void **state)
{
    (void)state;
    /* each specialization is a long compile on the CPU: few dtype x D x alignment triples */
    static const struct {
        em_scalar dt;
        acase c;
    } cases[] = {
        {EM_F16, {2, 2, 33, 33, 64, true, true, false}},
        {EM_F16, {1, 2, 7, 19, 64, true, false, false}},
        {EM_F16, {1, 1, 1, 40, 64, true, false, false}},
        {EM_BF16, {1, 2, 100, 100, 128, false, false, false}},
        {EM_BF16, {2, 1, 65, 130, 128, true, false, false}},
        {EM_F16, {1, 1, 200, 200, 64, true, false, false}},
        {EM_F16, {2, 3, 7, 7, 128, false, false, false}},
        {EM_BF16, {1, 2, 33, 70, 128, true, false, false}},
        {EM_BF16, {2, 2, 200, 200, 64, false, false, false}},
        {EM_F16, {1, 2, 33, 45, 64, true, false, true}},
    };
    size_t n = sizeof cases / sizeof cases[0];
    em_profile_kernel kv, dq;
    setenv("EMBER_ATTENTION", "mma", 1);
    unsetenv("EMBER_ATTENTION_BWD");
    em_profile_enable(true);
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        bool cpu = tu_is_cpu(dev);
        em_profile_reset();
        for (size_t i = 0; i < n; i++) {
            if (!tu_has(dev, cases[i].dt) || (!cpu && i >= 2)) continue;
            run_case(dev, cases[i].dt, cases[i].c, (uint32_t)(400 + i));
        }
        if (cpu) { /* every case's backward ran the tiled kernels, once each */
            assert_true(em_profile_kernel_get("tensor_attention_bwd_kv_mma", &kv));
            assert_true(em_profile_kernel_get("tensor_attention_bwd_q_mma", &dq));
            assert_int_equal(kv.launches, n);
            assert_int_equal(dq.launches, n);
            assert_false(em_profile_kernel_get("tensor_attention_bwd_kv", &kv));
        }
    }
    /* the backward through public ops, kept for comparison: no tiled kernel runs */
    setenv("EMBER_ATTENTION_BWD", "matmul", 1);
    for (int di = 0; di < tu_ndev; di++) {
        if (!tu_is_cpu(tu_devs[di])) continue;
        em_profile_reset();
        run_case(tu_devs[di], EM_F16, cases[1].c, 450);
        assert_false(em_profile_kernel_get("tensor_attention_bwd_kv_mma", &kv));
        assert_false(em_profile_kernel_get("tensor_attention_bwd_q_mma", &dq));
    }
    em_profile_enable(false);
    em_profile_reset();
    unsetenv("EMBER_ATTENTION_BWD");
    unsetenv("EMBER_ATTENTION");
}

/* em_attention_fast: false on the CPU by default (layers compose the ops there), true where
 * EMBER_ATTENTION=mma forces the matrix-op kernels (f16/bf16 at D 64/128 only) and for every q
 * with EMBER_ATTENTION=fused; simt forbids the matrix-op kernels. */
static void test_fast_predicate(void **state)
{
    (void)state;
    em_device *cpu = NULL;
    for (int di = 0; di < tu_ndev; di++)
        if (tu_is_cpu(tu_devs[di])) cpu = tu_devs[di];
    if (!cpu) skip();
    em_scope_begin();
    em_tensor *h64 = em_zeros(cpu, EM_BF16, EM_SHAPE(1, 2, 8, 64));
    em_tensor *h40 = em_zeros(cpu, EM_BF16, EM_SHAPE(1, 2, 8, 40));
    em_tensor *f64 = em_zeros(cpu, EM_F32, EM_SHAPE(1, 2, 8, 64));
    unsetenv("EMBER_ATTENTION");
    assert_false(em_attention_fast(h64));
    assert_false(em_attention_fast(f64));
    setenv("EMBER_ATTENTION", "mma", 1);
    assert_true(em_attention_fast(h64));
    assert_false(em_attention_fast(h40));
    assert_false(em_attention_fast(f64));
    setenv("EMBER_ATTENTION", "simt", 1);
    assert_false(em_attention_fast(h64));
    setenv("EMBER_ATTENTION", "fused", 1);
    assert_true(em_attention_fast(f64));
    assert_true(em_attention_fast(h40));
    assert_false(em_attention_fast(NULL));
    unsetenv("EMBER_ATTENTION");
    em_scope_end(NULL, 0);
}

/* One long sequence on the CPU. */
static void test_long_cpu(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        if (tu_is_cpu(tu_devs[di])) {
            acase c = {1, 2, 1024, 1024, 64, true, false, false};
            run_case(tu_devs[di], EM_F32, c, 300);
        }
}

static void test_misuse(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *q = em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 5, 8));
    em_tensor *k = em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 7, 8));
    tu_expect_error(em_attention(q, em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 7, 4)), k, false, 1),
                    "f32[2, 3, 7, 4]");
    tu_expect_error(em_attention(q, k, em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 6, 8)), false, 1),
                    "f32[2, 3, 5, 8]");
    tu_expect_error(em_attention(q, em_zeros(dev, EM_F32, EM_SHAPE(2, 4, 7, 8)), k, false, 1),
                    "do not match");
    tu_expect_error(em_attention(q, em_cast(k, EM_F64), k, false, 1), "f64[2, 3, 7, 8]");
    tu_expect_error(em_attention(em_cast(q, EM_I32), k, k, false, 1), "float");
    tu_expect_error(em_attention(em_reshape(q, EM_SHAPE(6, 5, 8)), k, k, false, 1), "f32[6, 5, 8]");
    tu_expect_error(em_attention(k, q, q, true, 1), "causal attention needs no more queries");
    em_tensor *wide = em_zeros(dev, EM_F32, EM_SHAPE(1, 1, 2, 300));
    tu_expect_error(em_attention(wide, wide, wide, false, 1), "head size 300");
    em_tensor *none = em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 0, 8));
    tu_expect_error(em_attention(q, none, none, false, 1), "no keys");
    tu_expect_error(em_attention(q, k, k, false, NAN), "scale must be finite");
    assert_null(em_attention(NULL, k, k, false, 1));
    /* no queries: an empty result */
    em_tensor *e = em_attention(em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 0, 8)), k, k, false, 1);
    assert_non_null(e);
    assert_int_equal(em_numel(e), 0);
    /* the backward checks what it is given */
    em_tensor *lse = em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 5));
    em_tensor *dq = NULL;
    assert_int_not_equal(em_attention_backward(q, q, k, k, q,
                                               em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 4)), false, 1,
                                               &dq, NULL, NULL),
                         EM_OK);
    assert_null(dq);
    assert_non_null(strstr(em_last_error(), "f32[2, 3, 4]"));
    assert_int_equal(em_attention_backward(q, q, k, k, q, lse, false, 1, &dq, NULL, NULL), EM_OK);
    assert_non_null(dq);
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lengths_f32),    cmocka_unit_test(test_fewer_queries),
        cmocka_unit_test(test_dtypes),         cmocka_unit_test(test_mma_path),
        cmocka_unit_test(test_long_cpu),       cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_fast_predicate), cmocka_unit_test(test_delta_lines),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
