/* test_matmul_ln.c — em_matmul_ex's layer-norm prologue (em_matmul_epilogue.ln) on every device
 * present: against a float64 reference (the layer norm rounded to the dtype, as em_layer_norm
 * stores it, then the product and the epilogue) and against em_layer_norm followed by
 * em_matmul_ex on the same device. Rows M in {1, 3, 16} (the skinny kernel normalizes them
 * itself), K in {7, 64, 768}, odd and even N, b row-major and transposed, with and without the
 * norm's weight and bias, combined with bias, GELU and residual; folded batches, a 1-D a, lazy
 * operands, forced configurations (groups along K meeting in shared memory, split-K), f16/bf16;
 * one launch for the skinny case, em_layer_norm then the product elsewhere; error messages. */
#include "tensor_util.h"

/* A random tensor of dt in [lo, hi). */
static em_tensor *rnd(em_device *dev, em_scalar dt, em_shape s, uint32_t seed, double lo,
                      double hi)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    double *v = malloc((n + 1) * sizeof(double));
    tu_fill(v, n, lo, hi, seed);
    em_tensor *t = tu_tensor(dev, dt, s, v);
    free(v);
    return t;
}

static double act_ref(int act, double v)
{
    if (act == EM_MATMUL_ACT_RELU) return v > 0 ? v : 0;
    if (act == EM_MATMUL_ACT_GELU) return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    if (act == EM_MATMUL_ACT_GELU_TANH)
        return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    return v;
}

/* The float64 reference of em_matmul_ex(a, b, ep) for a [..., K] (rows: the product of a's other
 * dims), b 2-D [K, N]; a residual is [rows, N] (as the result's elements) or [N]. */
static double *ref_ln_matmul(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep)
{
    em_scalar dt = em_dtype(a);
    int64_t K = em_dim(a, -1), N = em_dim(b, 1), rows = em_numel(a) / K;
    double *ad = tu_read(a), *bd = tu_read(b);
    double *w = ep->ln_weight ? tu_read(ep->ln_weight) : NULL;
    double *lb = ep->ln_bias ? tu_read(ep->ln_bias) : NULL;
    double *bias = ep->bias ? tu_read(ep->bias) : NULL;
    double *res = ep->residual ? tu_read(ep->residual) : NULL;
    bool res_row = ep->residual && em_numel(ep->residual) == N;
    double *out = calloc((size_t)(rows * N) + 1, sizeof(double));
    double *x = malloc((size_t)K * sizeof(double) + 8);
    for (int64_t r = 0; r < rows; r++) {
        const double *row = ad + r * K;
        double mean = 0, var = 0;
        for (int64_t k = 0; k < K; k++) mean += row[k];
        mean /= (double)K;
        for (int64_t k = 0; k < K; k++) var += (row[k] - mean) * (row[k] - mean);
        double rstd = 1 / sqrt(var / (double)K + ep->ln_eps);
        for (int64_t k = 0; k < K; k++) {
            double y = (row[k] - mean) * rstd;
            if (w) y *= w[k];
            if (lb) y += lb[k];
            x[k] = tu_round(dt, y);
        }
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += x[k] * bd[k * N + n];
            if (bias) s += bias[n];
            s = act_ref((int)ep->act, s);
            if (res) s += res[res_row ? n : r * N + n];
            out[r * N + n] = s;
        }
    }
    free(ad), free(bd), free(w), free(lb), free(bias), free(res), free(x);
    return out;
}

/* The tolerance for dt over sums of K terms (the normalized values are O(1)). */
static double tol_of(em_device *dev, em_scalar dt, int64_t K)
{
    double t = tu_tol_on(dev, dt);
    if (dt == EM_F32) t *= 1 + (double)K / 64;
    if (dt != EM_F32 && dt != EM_F64) t *= 2; /* one more rounding: the normalized a */
    return t;
}

/* Checks em_matmul_ex(a, b, ep) (ep->ln set) against the float64 reference and against
 * em_layer_norm then em_matmul_ex on the device. */
/* The fused product against float64; the result (the caller releases it). */
static em_tensor *check_ln_ref(const char *what, const em_tensor *a, const em_tensor *b,
                               const em_matmul_epilogue *ep)
{
    assert_non_null(a);
    assert_non_null(b);
    em_scalar dt = em_dtype(a);
    em_tensor *y = em_matmul_ex(a, b, ep);
    if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_non_null(y);
    double *ref = ref_ln_matmul(a, b, ep);
    char label[256];
    snprintf(label, sizeof label, "%s %s vs float64", what, em_scalar_name(dt));
    tu_check(label, y, em_shape_of(y), ref, tol_of(em_tensor_device(a), dt, em_dim(a, -1)));
    free(ref);
    return y;
}

static void check_ln(const char *what, const em_tensor *a, const em_tensor *b,
                     const em_matmul_epilogue *ep)
{
    em_device *dev = em_tensor_device(a);
    em_scalar dt = em_dtype(a);
    int64_t K = em_dim(a, -1);
    em_tensor *y = check_ln_ref(what, a, b, ep);
    char label[256];
    /* the unfused form on the same device */
    em_matmul_epilogue rest = *ep;
    rest.ln = false;
    rest.ln_weight = rest.ln_bias = NULL;
    em_tensor *x = em_layer_norm(a, 1, ep->ln_weight, ep->ln_bias, ep->ln_eps);
    em_tensor *y2 = em_matmul_ex(x, b, &rest);
    assert_non_null(y2);
    double *r2 = tu_read(y2);
    snprintf(label, sizeof label, "%s %s vs layer_norm + matmul", what, em_scalar_name(dt));
    tu_check(label, y, em_shape_of(y2), r2, tol_of(dev, dt, K));
    free(r2);
    em_release(x), em_release(y2), em_release(y);
}

static int setup(void **state)
{
    setenv("EMBER_AUTOTUNE", "off", 1); /* the heuristic choice, so the skinny kernel runs */
    unsetenv("EMBER_MATMUL_CONFIG");
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
    setenv("EMBER_CFLAGS", "-O2 -march=native -ffp-contract=off", 0);
#else
    setenv("EMBER_CFLAGS", "-O2 -ffp-contract=off", 0);
#endif
    return tu_setup(state);
}

/* M x K x N, b both ways, the prologue's weight and bias and the epilogue's parts in turn. */
static void test_shapes(void **state)
{
    (void)state;
    static const int64_t Ms[] = {1, 3, 16}, Ks[] = {7, 64, 768}, Ns[] = {5, 33, 64, 131};
    static const int acts[] = {EM_MATMUL_ACT_NONE, EM_MATMUL_ACT_GELU_TANH, EM_MATMUL_ACT_RELU,
                               EM_MATMUL_ACT_GELU};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        int ci = 0;
        for (size_t mi = 0; mi < EM_ARRAY_LEN(Ms); mi++)
            for (size_t ki = 0; ki < EM_ARRAY_LEN(Ks); ki++)
                for (int bt = 0; bt < 2; bt++, ci++) {
                    em_scope_begin();
                    int64_t M = Ms[mi], K = Ks[ki], N = Ns[ci % 4];
                    uint32_t s = (uint32_t)(ci * 10);
                    /* rows of a mean far from 0 and a spread unlike 1, so the norm matters */
                    em_tensor *a = rnd(dev, EM_F32, EM_SHAPE(M, K), s, 1.5, 4.5);
                    em_tensor *b = bt ? em_transpose(rnd(dev, EM_F32, EM_SHAPE(N, K), s + 1, -1, 1),
                                                     0, 1)
                                      : rnd(dev, EM_F32, EM_SHAPE(K, N), s + 1, -1, 1);
                    int v = ci % 4; /* 0: w and b; 1: w; 2: b; 3: neither */
                    em_matmul_epilogue ep = {.ln = true, .ln_eps = 1e-5};
                    if (v <= 1) ep.ln_weight = rnd(dev, EM_F32, EM_SHAPE(K), s + 2, 0.5, 1.5);
                    if (v == 0 || v == 2) ep.ln_bias = rnd(dev, EM_F32, EM_SHAPE(K), s + 3, -1, 1);
                    ep.act = (em_matmul_act)acts[(ci / 2) % 4];
                    if ((ci / 3) % 2) ep.bias = rnd(dev, EM_F32, EM_SHAPE(N), s + 4, -1, 1);
                    if ((ci / 5) % 2)
                        ep.residual = rnd(dev, EM_F32, EM_SHAPE(M, N), s + 5, -1, 1);
                    char what[96];
                    snprintf(what, sizeof what, "ln M %lld K %lld N %lld %s", (long long)M,
                             (long long)K, (long long)N, bt ? "b^T" : "b");
                    check_ln(what, a, b, &ep);
                    em_scope_end(NULL, 0);
                }
    }
}

/* Folded batches, a 1-D a, lazy operands, a row residual, f16/bf16, and configurations forced:
 * groups along K meeting in shared memory (6 units: the tree of an odd count) and split-K (the
 * statistics over the whole row, the product over a chunk). */
static void test_variants(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *w = rnd(dev, EM_F32, EM_SHAPE(96), 700, 0.5, 1.5);
        em_tensor *lb = rnd(dev, EM_F32, EM_SHAPE(96), 701, -1, 1);
        em_matmul_epilogue ep = {.ln = true, .ln_weight = w, .ln_bias = lb, .ln_eps = 1e-5};
        check_ln("ln folded", rnd(dev, EM_F32, EM_SHAPE(2, 3, 96), 702, -2, 3),
                 rnd(dev, EM_F32, EM_SHAPE(96, 40), 703, -1, 1), &ep);
        check_ln("ln 1-D a", rnd(dev, EM_F32, EM_SHAPE(96), 704, -2, 3),
                 em_transpose(rnd(dev, EM_F32, EM_SHAPE(24, 96), 705, -1, 1), 0, 1), &ep);
        /* a mean far from 0 beside the spread: the one-pass statistics' shift keeps E[x^2] -
         * E[x]^2 from cancelling (without it the variance is off by a few percent); against
         * float64 only: em_layer_norm's f32 two passes are further off here (4e-4) */
        em_matmul_epilogue ep0 = {.ln = true, .ln_eps = 1e-5};
        em_release(check_ln_ref("ln mean 300, spread 1",
                                rnd(dev, EM_F32, EM_SHAPE(1, 768), 720, 300, 301),
                                rnd(dev, EM_F32, EM_SHAPE(768, 40), 721, -1, 1), &ep0));
        em_matmul_epilogue epr = ep;
        epr.residual = rnd(dev, EM_F32, EM_SHAPE(40), 706, -1, 1);
        epr.act = EM_MATMUL_ACT_GELU_TANH;
        check_ln("ln lazy a, row residual",
                 em_add(rnd(dev, EM_F32, EM_SHAPE(4, 96), 707, 0, 2),
                        rnd(dev, EM_F32, EM_SHAPE(4, 96), 708, -1, 1)),
                 rnd(dev, EM_F32, EM_SHAPE(96, 40), 709, -1, 1), &epr);
        static const em_scalar halves[] = {EM_F16, EM_BF16};
        for (size_t t = 0; t < 2; t++) {
            if (!tu_has(dev, halves[t])) continue;
            em_matmul_epilogue eph = {.ln = true,
                                      .ln_weight = rnd(dev, halves[t], EM_SHAPE(64), 710, 0.5, 1.5),
                                      .ln_bias = rnd(dev, halves[t], EM_SHAPE(64), 711, -1, 1),
                                      .ln_eps = 1e-5,
                                      .bias = rnd(dev, halves[t], EM_SHAPE(48), 712, -1, 1),
                                      .act = EM_MATMUL_ACT_GELU_TANH};
            check_ln("ln half", rnd(dev, halves[t], EM_SHAPE(3, 64), 713, 1, 3),
                     rnd(dev, halves[t], EM_SHAPE(64, 48), 714, -1, 1), &eph);
        }
        em_scope_end(NULL, 0);
        static const char *const configs[] = {"skinny 4x2x16 1x3x2 s1", "skinny 4x1x16 1x1x1 s3"};
        for (size_t i = 0; i < 2; i++) {
            em_scope_begin();
            setenv("EMBER_MATMUL_CONFIG", configs[i], 1);
            char what[96];
            snprintf(what, sizeof what, "ln config %s", configs[i]);
            em_matmul_epilogue epc = {.ln = true,
                                      .ln_weight = rnd(dev, EM_F32, EM_SHAPE(200), 720, 0.5, 1.5),
                                      .ln_bias = rnd(dev, EM_F32, EM_SHAPE(200), 721, -1, 1),
                                      .ln_eps = 1e-5,
                                      .bias = rnd(dev, EM_F32, EM_SHAPE(37), 722, -1, 1),
                                      .act = EM_MATMUL_ACT_GELU,
                                      .residual = rnd(dev, EM_F32, EM_SHAPE(3, 37), 723, -1, 1)};
            check_ln(what, rnd(dev, EM_F32, EM_SHAPE(3, 200), 724, 1, 4),
                     rnd(dev, EM_F32, EM_SHAPE(200, 37), 725, -1, 1), &epc);
            check_ln(what, rnd(dev, EM_F32, EM_SHAPE(3, 200), 726, 1, 4),
                     em_transpose(rnd(dev, EM_F32, EM_SHAPE(37, 200), 727, -1, 1), 0, 1), &epc);
            /* a configuration of another kernel cannot normalize: the skinny default runs */
            setenv("EMBER_MATMUL_CONFIG", "simt 16x16x8 1x1 s1", 1);
            check_ln("ln forced simt", rnd(dev, EM_F32, EM_SHAPE(3, 200), 728, 1, 4),
                     rnd(dev, EM_F32, EM_SHAPE(200, 37), 729, -1, 1), &epc);
            unsetenv("EMBER_MATMUL_CONFIG");
            em_scope_end(NULL, 0);
        }
    }
}

/* Launches: one row into a wide row-major b (decoding's c_attn / c_fc) is one skinny launch with
 * the layer norm in it; 64 rows take another kernel, after the layer norm's own launch (at least
 * two launches, the profiler's count). Between them (a few rows, many cubes) the choice follows
 * the device's plan: fused while the cubes' reads of a stay below half of b (ops_matmul.c). */
static void test_launches(void **state)
{
    (void)state;
    em_profile_enable(true);
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *w = rnd(dev, EM_F32, EM_SHAPE(768), 800, 0.5, 1.5);
        em_tensor *lb = rnd(dev, EM_F32, EM_SHAPE(768), 801, -1, 1);
        em_tensor *wb = rnd(dev, EM_F32, EM_SHAPE(768, 4096), 802, -1, 1);
        em_matmul_epilogue ep = {.ln = true,
                                 .ln_weight = w,
                                 .ln_bias = lb,
                                 .ln_eps = 1e-5,
                                 .bias = rnd(dev, EM_F32, EM_SHAPE(4096), 803, -1, 1),
                                 .act = EM_MATMUL_ACT_GELU_TANH};
        static const int64_t rows[] = {1, 64};
        for (size_t i = 0; i < 2; i++) {
            em_tensor *a = rnd(dev, EM_F32, EM_SHAPE(rows[i], 768), 804 + (uint32_t)i, -1, 2);
            assert_int_equal(em_device_sync(dev), EM_OK);
            em_profile_reset();
            em_tensor *y = em_matmul_ex(a, wb, &ep);
            assert_non_null(y);
            assert_int_equal(em_realize(y), EM_OK);
            em_profile_counts c;
            em_profile_get(&c);
            em_profile_kernel k;
            bool skinny = em_profile_kernel_get("matmul_skinny", &k);
            bool fused = rows[i] == 1;
            if (fused ? c.launches != 1 || !skinny : c.launches < 2) {
                fprintf(stderr, "ln %lld rows on %s: %llu launches\n", (long long)rows[i],
                        em_device_name(dev), (unsigned long long)c.launches);
                em_profile_report(stderr);
                fail();
            }
            em_release(y);
        }
        em_scope_end(NULL, 0);
    }
    em_profile_enable(false);
}

/* Wrong shapes, dtypes and operands name what is wrong. */
static void test_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *a = em_zeros(dev, EM_F32, EM_SHAPE(3, 64));
    em_tensor *b = em_zeros(dev, EM_F32, EM_SHAPE(64, 5));
    em_matmul_epilogue ep = {.ln = true, .ln_weight = em_zeros(dev, EM_F32, EM_SHAPE(5))};
    tu_expect_error(em_matmul_ex(a, b, &ep),
                    "layer-norm weight f32[5] does not fit a f32[3, 64] (needs f32[64])");
    ep.ln_weight = NULL;
    ep.ln_bias = em_zeros(dev, EM_F16, EM_SHAPE(64));
    tu_expect_error(em_matmul_ex(a, b, &ep),
                    "layer-norm bias f16[64] does not fit a f32[3, 64] (needs f32[64])");
    ep.ln_bias = em_zeros(dev, EM_F32, EM_SHAPE(1, 64));
    tu_expect_error(em_matmul_ex(a, b, &ep), "layer-norm bias f32[1, 64] does not fit a f32[3, 64]");
    ep.ln_bias = NULL;
    tu_expect_error(em_matmul_ex(em_zeros(dev, EM_I32, EM_SHAPE(3, 64)),
                                 em_zeros(dev, EM_I32, EM_SHAPE(64, 5)), &ep),
                    "layer-norm prologue needs a floating-point a of rank 1 or more, got i32[3, 64]");
    tu_expect_error(em_matmul_ex(a, em_zeros(dev, EM_F32, EM_SHAPE(63, 5)), &ep),
                    "shapes f32[3, 64] and f32[63, 5] do not match");
    ep.bias = em_zeros(dev, EM_F32, EM_SHAPE(4));
    tu_expect_error(em_matmul_ex(a, b, &ep), "bias f32[4] does not fit result f32[3, 5]");
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_launches),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
