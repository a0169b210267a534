/* test_attention.c — fused attention (em_attention, src/kernels/tensor_attention.ek) on every
 * device present: the output and, through autodiff (em_backward of sum(out * g)), the gradients
 * of q, k and v against a float64 reference of naive attention (softmax(q k^T * scale + mask) v),
 * causal and not, Tq == Tk and Tq < Tk (the causal mask aligned at the last key), sequence lengths
 * from 1 to past a cube and a tile (one of 1024 on the CPU), head sizes 40, 64 and 128, B * H > 1,
 * every float dtype the device holds, q read through the transposed view GPT-2's heads are, the
 * matrix-unit path (forced with EMBER_ATTENTION=mma); and the misuse cases, each an error naming
 * the shapes. GPU emulators (PoCL, lavapipe) run fewer, smaller
 * cases: their compiles and runs are slow. */
#include "ember/autodiff.h"
#include "ember/tensor_grad.h"
#include "tensor_util.h"

/* One case's sizes. */
typedef struct acase {
    int64_t B, H, Tq, Tk, D;
    bool causal;
    bool strided; /* q built as [B, Tq, H, D] viewed transposed (the last dim contiguous, read as
                     it is), v as [B, H, D, Tk] viewed transposed (copied first) */
    bool padded;  /* k built as [B, H, Tk, D + 1] narrowed to D (read in place, its rows not
                     aligned to 8 elements) */
} acase;

/* out, dq, dk, dv of naive attention for contiguous q [BH, Tq, D], k, v [BH, Tk, D] and the
 * gradient g of out, in float64. */
static void reference(const acase *c, double scale, const double *q, const double *k,
                      const double *v, const double *g, double *out, double *dq, double *dk,
                      double *dv)
{
    int64_t BH = c->B * c->H, Tq = c->Tq, Tk = c->Tk, D = c->D;
    double *p = malloc((size_t)Tk * sizeof *p), *dp = malloc((size_t)Tk * sizeof *dp);
    assert_true(p && dp);
    memset(dk, 0, (size_t)(BH * Tk * D) * sizeof *dk);
    memset(dv, 0, (size_t)(BH * Tk * D) * sizeof *dv);
    for (int64_t h = 0; h < BH; h++)
        for (int64_t i = 0; i < Tq; i++) {
            const double *qi = q + (h * Tq + i) * D, *gi = g + (h * Tq + i) * D;
            const double *kh = k + h * Tk * D, *vh = v + h * Tk * D;
            int64_t n = c->causal ? i + Tk - Tq + 1 : Tk; /* keys seen */
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = 0;
                for (int64_t e = 0; e < D; e++) d += qi[e] * kh[j * D + e];
                p[j] = d * scale;
                m = p[j] > m ? p[j] : m;
            }
            for (int64_t j = 0; j < n; j++) s += (p[j] = exp(p[j] - m));
            double *oi = out + (h * Tq + i) * D, *dqi = dq + (h * Tq + i) * D;
            for (int64_t e = 0; e < D; e++) oi[e] = 0;
            for (int64_t j = 0; j < n; j++) {
                p[j] /= s;
                for (int64_t e = 0; e < D; e++) oi[e] += p[j] * vh[j * D + e];
            }
            /* dp_j = g . v_j; ds_j = p_j (dp_j - g . out) */
            double delta = 0;
            for (int64_t e = 0; e < D; e++) delta += gi[e] * oi[e];
            for (int64_t e = 0; e < D; e++) dqi[e] = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = 0;
                for (int64_t e = 0; e < D; e++) d += gi[e] * vh[j * D + e];
                dp[j] = p[j] * (d - delta) * scale;
                for (int64_t e = 0; e < D; e++) {
                    dqi[e] += dp[j] * kh[j * D + e];
                    dk[(h * Tk + j) * D + e] += dp[j] * qi[e];
                    dv[(h * Tk + j) * D + e] += p[j] * gi[e];
                }
            }
        }
    free(p);
    free(dp);
}

/* Forward tolerance (error normalized by max(1, |ref|)): f16/bf16 inputs are exact and the sums
 * run in f32, so the output's own rounding dominates; f32 and f64 sum over up to Tk terms. */
static double fwd_tol(em_device *dev, em_scalar dt)
{
    return dt == EM_F16 ? 4e-3 : dt == EM_BF16 ? 2e-2 : tu_tol_on(dev, dt) * 10;
}

/* Gradient tolerance: one more rounding of the result and sums over Tq (dk, dv) or Tk (dq). */
static double grad_tol(em_device *dev, em_scalar dt)
{
    return dt == EM_F16 ? 1e-2 : dt == EM_BF16 ? 4e-2 : tu_tol_on(dev, dt) * 50;
}

static void run_case(em_device *dev, em_scalar dt, acase c, uint32_t seed)
{
    char what[200];
    snprintf(what, sizeof what, "attention %s %s B %lld H %lld Tq %lld Tk %lld D %lld%s%s%s",
             em_device_name(dev), em_scalar_name(dt), (long long)c.B, (long long)c.H,
             (long long)c.Tq, (long long)c.Tk, (long long)c.D, c.causal ? " causal" : "",
             c.strided ? " strided q, v" : "", c.padded ? " padded k" : "");
    em_scope_begin();
    int64_t BH = c.B * c.H, nq = BH * c.Tq * c.D, nk = BH * c.Tk * c.D;
    double *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nk * sizeof *k);
    double *v = malloc((size_t)nk * sizeof *v), *g = malloc((size_t)nq * sizeof *g);
    double *out = malloc((size_t)nq * sizeof *out), *dq = malloc((size_t)nq * sizeof *dq);
    double *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nk * sizeof *dv);
    assert_true(q && k && v && g && out && dq && dk && dv);
    /* scores up to about +-4 after scaling: peaked rows, not uniform ones */
    tu_fill(q, (size_t)nq, -2, 2, seed);
    tu_fill(k, (size_t)nk, -2, 2, seed + 1);
    tu_fill(v, (size_t)nk, -1, 1, seed + 2);
    tu_fill(g, (size_t)nq, -1, 1, seed + 3);
    double scale = 1.0 / sqrt((double)c.D);
    em_tensor *qt;
    if (c.strided) { /* stored [B, Tq, H, D] */
        double *st = malloc((size_t)nq * sizeof *st);
        assert_non_null(st);
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.H; h++)
                for (int64_t i = 0; i < c.Tq; i++)
                    for (int64_t e = 0; e < c.D; e++)
                        st[((b * c.Tq + i) * c.H + h) * c.D + e] =
                            q[((b * c.H + h) * c.Tq + i) * c.D + e];
        em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(c.B, c.Tq, c.H, c.D), st);
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.H; h++)
                for (int64_t i = 0; i < c.Tq; i++)
                    for (int64_t e = 0; e < c.D; e++)
                        q[((b * c.H + h) * c.Tq + i) * c.D + e] =
                            st[((b * c.Tq + i) * c.H + h) * c.D + e];
        free(st);
        qt = em_transpose(s, 1, 2);
    } else {
        qt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tq, c.D), q);
    }
    em_tensor *kt;
    if (c.padded) {
        double *st = malloc((size_t)(BH * c.Tk * (c.D + 1)) * sizeof *st);
        assert_non_null(st);
        for (int64_t r = 0; r < BH * c.Tk; r++) {
            for (int64_t e = 0; e < c.D; e++) st[r * (c.D + 1) + e] = k[r * c.D + e];
            st[r * (c.D + 1) + c.D] = 1e4; /* never read */
        }
        kt = em_narrow(tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tk, c.D + 1), st), 3, 0, c.D);
        free(st);
    } else {
        kt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tk, c.D), k);
    }
    em_tensor *vt;
    if (c.strided) { /* stored [B, H, D, Tk] */
        double *st = malloc((size_t)nk * sizeof *st);
        assert_non_null(st);
        for (int64_t h = 0; h < BH; h++)
            for (int64_t j = 0; j < c.Tk; j++)
                for (int64_t e = 0; e < c.D; e++)
                    st[(h * c.D + e) * c.Tk + j] = v[(h * c.Tk + j) * c.D + e];
        em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.D, c.Tk), st);
        for (int64_t h = 0; h < BH; h++)
            for (int64_t j = 0; j < c.Tk; j++)
                for (int64_t e = 0; e < c.D; e++)
                    v[(h * c.Tk + j) * c.D + e] = st[(h * c.D + e) * c.Tk + j];
        free(st);
        vt = em_transpose(s, 2, 3);
    } else {
        vt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tk, c.D), v);
    }
    em_tensor *gt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tq, c.D), g);
    assert_int_equal(em_set_requires_grad(qt, true), EM_OK);
    assert_int_equal(em_set_requires_grad(kt, true), EM_OK);
    assert_int_equal(em_set_requires_grad(vt, true), EM_OK);
    reference(&c, scale, q, k, v, g, out, dq, dk, dv);
    em_tensor *o = em_attention(qt, kt, vt, c.causal, scale);
    if (!o) fprintf(stderr, "%s: %s\n", what, em_last_error());
    char part[240];
    snprintf(part, sizeof part, "%s: out", what);
    tu_check(part, o, EM_SHAPE(c.B, c.H, c.Tq, c.D), out, fwd_tol(dev, dt));
    em_tensor *loss = em_sum(em_mul(o, gt), NULL, 0, false);
    em_status st = em_backward(loss, NULL);
    if (st != EM_OK) fprintf(stderr, "%s: backward: %s\n", what, em_last_error());
    assert_int_equal(st, EM_OK);
    double tol = grad_tol(dev, dt);
    snprintf(part, sizeof part, "%s: dq", what);
    tu_check(part, em_grad(qt), EM_SHAPE(c.B, c.H, c.Tq, c.D), dq, tol);
    snprintf(part, sizeof part, "%s: dk", what);
    tu_check(part, em_grad(kt), EM_SHAPE(c.B, c.H, c.Tk, c.D), dk, tol);
    snprintf(part, sizeof part, "%s: dv", what);
    tu_check(part, em_grad(vt), EM_SHAPE(c.B, c.H, c.Tk, c.D), dv, tol);
    em_scope_end(NULL, 0);
    free(q);
    free(k);
    free(v);
    free(g);
    free(out);
    free(dq);
    free(dk);
    free(dv);
}

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
        cmocka_unit_test(test_lengths_f32), cmocka_unit_test(test_fewer_queries),
        cmocka_unit_test(test_dtypes),      cmocka_unit_test(test_mma_path),
        cmocka_unit_test(test_long_cpu),    cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_fast_predicate),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
