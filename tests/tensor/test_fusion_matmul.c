/* test_fusion_matmul.c — pending matmuls and the epilogues they absorb (src/tensor/fusion_matmul.c,
 * docs/fusion.md "Matmul epilogues"), on every device present (or $EMBER_TEST_DEVICE):
 *  - each absorbed pattern (bias; GELU, GELU-tanh, ReLU on integers; residual; bias + act; bias +
 *    act + residual; a broadcast residual; a result reshaped before the ops, as em_linear_forward
 *    does; GELU's and GELU-tanh's backward with the result as the gradient, after a bias, at a
 *    broadcast input; opt-in, EMBER_MATMUL_GELU_GRAD=1, set by main) gives the unfused result
 * (em_fusion_set(false)) within rounding and launches one kernel fused, against one per op unfused;
 * odd sizes, batched and transposed operands;
 *  - what is not absorbed stays correct: a result read twice (the matmul runs once), an op that
 *    broadcasts the result up, an op that is no epilogue (mul, float ReLU), a cast, a write into
 *    an operand after the matmul was recorded, a result freed unread (no launch), em_flush;
 *  - a donated result copied into an aligned view of another buffer (em_copy_): the matmul writes
 *    the view itself; not donated, misaligned or unfused, the copy runs; the buffer's other
 *    values, its own pending value and a pending reader of it stay right;
 *  - autodiff: Linear + GELU-tanh + residual, Linear + residual and a kept product give identical
 *    gradients fused and unfused; while recording, adds move into the epilogue (an add's rule
 *    keeps no input) but not the GELU, nor anything under the recompute policy; an MLP's
 *    backward moves the GELU's backward into fc2's input-gradient matmul (one launch fewer);
 *  - running out of memory when the matmul runs is an error at the sync point naming it.
 * Autotuning is off (EMBER_AUTOTUNE=off) so that launch counts are the kernels' own. */
#include "tensor_util.h"

#include "ember/autodiff.h"
#include "ember/nn.h"
#include "ember/tensor_grad.h"

enum {
    P_BIAS,
    P_GELU,
    P_GELU_TANH,
    P_RELU,
    P_RES,
    P_BIAS_ACT,
    P_LINEAR,
    P_RES_BCAST,
    P_RESHAPE,
    P_GELU_GRAD,
    P_GELU_TANH_GRAD,
    P_BIAS_GELU_GRAD,
    P_GELU_GRAD_BCAST,
    P_COUNT
};
static const char *const p_names[] = {"bias",
                                      "gelu",
                                      "gelu_tanh",
                                      "relu",
                                      "residual",
                                      "bias+gelu",
                                      "bias+gelu_tanh+residual",
                                      "broadcast residual",
                                      "reshaped",
                                      "gelu backward",
                                      "gelu_tanh backward",
                                      "bias+gelu_tanh backward",
                                      "gelu backward at a broadcast input"};
static const int p_ops[] = {1, 1, 1, 1, 1, 2, 3, 1, 3, 1, 1, 2, 1}; /* elementwise ops after it */

typedef struct geom {
    int64_t batch, M, K, N; /* batch 0: plain matrices */
    bool bt;                /* b given as the transpose of an [N, K] tensor */
} geom;

/* Builds pattern p on dev (fused or not), reads it back; *launches gets the kernels it took. */
static double *run_pattern(em_device *dev, em_scalar dt, int p, geom g, bool fused, uint64_t *launches,
                           size_t *n)
{
    em_fusion_set(fused);
    em_scope_begin();
    int64_t B = g.batch ? g.batch : 1;
    size_t na = (size_t)(B * g.M * g.K), nb = (size_t)(g.K * g.N), nr = (size_t)(B * g.M * g.N);
    double *va = malloc(na * 8), *vb = malloc(nb * 8), *vbias = malloc((size_t)g.N * 8),
           *vr = malloc(nr * 8), *vc = malloc((size_t)(B * g.M) * 8);
    tu_fill(va, na, -1, 1, 3);
    tu_fill(vb, nb, -1, 1, 5);
    tu_fill(vbias, (size_t)g.N, -1, 1, 7);
    tu_fill(vr, nr, -2, 2, 11);
    tu_fill(vc, (size_t)(B * g.M), -1, 1, 13);
    if (!em_scalar_is_float(dt)) {
        for (size_t i = 0; i < na; i++) va[i] = floor(va[i] * 5);
        for (size_t i = 0; i < nb; i++) vb[i] = floor(vb[i] * 5);
        for (size_t i = 0; i < (size_t)g.N; i++) vbias[i] = floor(vbias[i] * 5);
    }
    em_tensor *a = g.batch ? tu_tensor(dev, dt, EM_SHAPE(g.batch, g.M, g.K), va)
                           : tu_tensor(dev, dt, EM_SHAPE(g.M, g.K), va);
    em_tensor *b = g.bt ? em_transpose(tu_tensor(dev, dt, EM_SHAPE(g.N, g.K), vb), 0, 1)
                        : tu_tensor(dev, dt, EM_SHAPE(g.K, g.N), vb);
    em_tensor *bias = tu_tensor(dev, dt, EM_SHAPE(g.N), vbias);
    em_tensor *res = g.batch ? tu_tensor(dev, dt, EM_SHAPE(g.batch, g.M, g.N), vr)
                             : tu_tensor(dev, dt, EM_SHAPE(g.M, g.N), vr);
    em_tensor *col = g.batch ? tu_tensor(dev, dt, EM_SHAPE(1, g.M, 1), vc)
                             : tu_tensor(dev, dt, EM_SHAPE(g.M, 1), vc);
    assert_int_equal(em_flush(), EM_OK);
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_matmul(a, b);
    switch (p) {
    case P_BIAS: y = em_add(em_take(y), bias); break;
    case P_GELU: y = em_gelu(em_take(y)); break;
    case P_GELU_TANH: y = em_gelu_tanh(em_take(y)); break;
    case P_RELU: y = em_relu(em_take(y)); break;
    case P_RES: y = em_add(res, em_take(y)); break;
    case P_BIAS_ACT: y = em_gelu(em_take(em_add(em_take(y), bias))); break;
    case P_LINEAR:
        y = em_add(em_take(em_gelu_tanh(em_take(em_add(bias, em_take(y))))), res);
        break;
    case P_RES_BCAST: y = em_add(em_take(y), col); break;
    /* GELU's backward with the product as its gradient: res (in [-2, 2]) is the GELU's input */
    case P_GELU_GRAD:
        y = em_gelu_backward(em_take(y), res, false);
        break;
    case P_GELU_TANH_GRAD:
        y = em_gelu_backward(em_take(y), res, true);
        break;
    case P_BIAS_GELU_GRAD:
        y = em_gelu_backward(em_take(em_add(em_take(y), bias)), res, true);
        break;
    case P_GELU_GRAD_BCAST:
        y = em_gelu_backward(em_take(y), col, false);
        break;
    default: { /* P_RESHAPE: [3 m, N] seen as [3, m, N], as em_linear_forward reshapes */
        y = em_reshape(em_take(y), EM_SHAPE(3, g.M / 3, g.N));
        y = em_add(em_take(y), bias);
        y = em_gelu_tanh(em_take(y));
        em_tensor *r3 = em_reshape(res, EM_SHAPE(3, g.M / 3, g.N));
        y = em_add(r3, em_take(y));
        break;
    }
    }
    if (!y) fprintf(stderr, "%s: %s\n", p_names[p], em_last_error());
    assert_non_null(y);
    double *got = tu_read(y);
    *launches = em_tensor_stats_get().launches - s0.launches;
    *n = (size_t)em_numel(y);
    em_scope_end(NULL, 0);
    free(va), free(vb), free(vbias), free(vr), free(vc);
    em_fusion_set(true);
    return got;
}

static double tol_of(em_scalar dt)
{
    return dt == EM_F16 ? 4e-3 : dt == EM_BF16 ? 3e-2 : dt == EM_F32 ? 2e-5 : 0;
}

static void check_pattern(em_device *dev, em_scalar dt, int p, geom g)
{
    if (p == P_RESHAPE && g.batch) return; /* a is 2-D there: the batch folds into M */
    if (p >= P_GELU_GRAD && !em_scalar_is_float(dt)) return;
    uint64_t lf, lu;
    size_t nf, nu;
    geom g2 = g;
    if (p == P_RESHAPE) g2.M = g.M * 3, g2.batch = 0; /* [3 M, K] x [K, N] -> [3, M, N] */
    double *f = run_pattern(dev, dt, p, g2, true, &lf, &nf);
    double *u = run_pattern(dev, dt, p, g2, false, &lu, &nu);
    char what[160];
    snprintf(what, sizeof what, "%s %s [%lld] %lldx%lldx%lld%s on %s", p_names[p], em_scalar_name(dt),
             (long long)g.batch, (long long)g.M, (long long)g.K, (long long)g.N, g.bt ? " (b^T)" : "",
             em_device_name(dev));
    assert_int_equal(nf, nu);
    if (!tu_close_n(what, f, u, nf, tol_of(dt))) fail_msg("%s: fused differs from unfused", what);
    /* fused: one launch (a float ReLU is not absorbed: the matmul and the ReLU); unfused: one per
     * op (the reshape is a view) */
    uint64_t want = p == P_RELU && em_scalar_is_float(dt) ? 2 : 1;
    if (lf != want || lu != (uint64_t)(1 + p_ops[p]))
        fail_msg("%s: %llu launches fused (want %llu), %llu unfused (want %d)", what,
                 (unsigned long long)lf, (unsigned long long)want, (unsigned long long)lu, 1 + p_ops[p]);
    free(f);
    free(u);
}

static void test_absorbed_patterns(void **state)
{
    (void)state;
    const geom gs[] = {{0, 7, 33, 257, false}, {0, 1, 7, 33, true}, {3, 33, 1, 7, false},
                       {2, 7, 33, 33, true}, {0, 257, 7, 1, false}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        bool cpu = tu_is_cpu(dev);
        /* LLVM-based devices compile each specialization for about a second: fewer there */
        int ngeom = cpu ? 5 : 2;
        for (int gi = 0; gi < ngeom; gi++)
            for (int p = 0; p < P_COUNT; p++) check_pattern(dev, EM_F32, p, gs[gi]);
        const em_scalar dts[] = {EM_F16, EM_BF16};
        for (int i = 0; i < 2; i++) {
            if (!tu_has(dev, dts[i])) continue;
            check_pattern(dev, dts[i], P_LINEAR, gs[0]);
            check_pattern(dev, dts[i], P_BIAS_GELU_GRAD, gs[0]);
            if (cpu) check_pattern(dev, dts[i], P_RESHAPE, gs[1]);
        }
        check_pattern(dev, EM_I32, P_RELU, gs[0]); /* integer ReLU is absorbed: same math */
        check_pattern(dev, EM_I32, P_BIAS, gs[2]);
    }
}

/* ---- what is not absorbed -------------------------------------------------------------------- */

static em_tensor *mat(em_device *dev, em_shape s, uint32_t seed)
{
    double v[4096];
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    assert_true(n <= 4096);
    tu_fill(v, n, -1, 1, seed);
    return tu_tensor(dev, EM_F32, s, v);
}

/* Launches since s0. */
static uint64_t since(em_tensor_stats s0) { return em_tensor_stats_get().launches - s0.launches; }

/* The values of t, compared with those of an unfused run of the same function. */
typedef em_tensor *(*build_fn)(em_device *dev, uint64_t *launches);

static void compare(em_device *dev, const char *name, build_fn f, uint64_t want_fused)
{
    double *v[2];
    uint64_t l[2];
    size_t n[2];
    for (int fused = 1; fused >= 0; fused--) {
        em_fusion_set(fused);
        em_scope_begin();
        em_tensor *t = f(dev, &l[fused]);
        if (!t) fprintf(stderr, "%s: %s\n", name, em_last_error());
        assert_non_null(t);
        v[fused] = tu_read(t);
        n[fused] = (size_t)em_numel(t);
        em_scope_end(NULL, 0);
        em_fusion_set(true);
    }
    assert_int_equal(n[0], n[1]);
    if (!tu_close_n(name, v[1], v[0], n[0], 2e-5)) fail_msg("%s on %s", name, em_device_name(dev));
    if (l[1] != want_fused)
        fail_msg("%s on %s: %llu launches fused, want %llu", name, em_device_name(dev),
                 (unsigned long long)l[1], (unsigned long long)want_fused);
    free(v[0]);
    free(v[1]);
}

/* y read by two consumers, not donated: the matmul runs once, before them (3 launches: it, the
 * fused kernel of z, and z2's own, which em_flush runs too; 4 if the matmul ran twice). */
static em_tensor *read_twice(em_device *dev, uint64_t *launches)
{
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor *bias = mat(dev, EM_SHAPE(9), 3);
    em_flush();
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_matmul(a, b);
    em_tensor *z1 = em_add(y, bias);
    em_tensor *z2 = em_mul_scalar(y, 2);
    em_tensor *z = em_add(em_take(z1), z2);
    em_flush();
    *launches = since(s0);
    return z;
}

/* y + t where t broadcasts y up ([7, 9] + [2, 7, 9]): a fresh output, the matmul runs first. */
static em_tensor *broadcast_up(em_device *dev, uint64_t *launches)
{
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor *t = mat(dev, EM_SHAPE(2, 7, 9), 4);
    em_flush();
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_add(em_take(em_matmul(a, b)), t);
    em_flush();
    *launches = since(s0);
    return y;
}

/* mul is no epilogue; a float ReLU keeps NaN where the epilogue's would not: both run after the
 * matmul, which absorbed the bias before them. */
static em_tensor *not_epilogue(em_device *dev, uint64_t *launches)
{
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor *bias = mat(dev, EM_SHAPE(9), 3), *t = mat(dev, EM_SHAPE(7, 9), 5);
    em_flush();
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_add(em_take(em_matmul(a, b)), bias);
    y = em_relu(em_take(em_mul(em_take(y), t)));
    em_flush();
    *launches = since(s0);
    return y;
}

/* GELU's (tanh: GELU-tanh's) backward of the product (`as_input`: the product as the op's input
 * x rather than its gradient, never absorbed) with EMBER_MATMUL_GELU_GRAD set to `env` (NULL:
 * unset); back to "1" (main's setting) after. */
static em_tensor *gelu_grad_with(em_device *dev, uint64_t *launches, bool as_input, const char *env,
                                 bool tanh)
{
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor *t = mat(dev, EM_SHAPE(7, 9), 5);
    em_flush();
    if (env)
        setenv("EMBER_MATMUL_GELU_GRAD", env, 1);
    else
        unsetenv("EMBER_MATMUL_GELU_GRAD");
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_take(em_matmul(a, b));
    y = as_input ? em_gelu_backward(t, y, tanh) : em_gelu_backward(y, t, tanh);
    em_flush();
    *launches = since(s0);
    setenv("EMBER_MATMUL_GELU_GRAD", "1", 1);
    return y;
}

/* Not absorbed: the product as the op's input, or with EMBER_MATMUL_GELU_GRAD=0. The matmul
 * runs, the op reads its buffer. */
static em_tensor *gelu_grad_not_epilogue(em_device *dev, uint64_t *launches, bool as_input)
{
    return gelu_grad_with(dev, launches, as_input, "0", true);
}
static em_tensor *gelu_grad_input(em_device *dev, uint64_t *launches)
{
    return gelu_grad_not_epilogue(dev, launches, true);
}
static em_tensor *gelu_grad_switched_off(em_device *dev, uint64_t *launches)
{
    return gelu_grad_not_epilogue(dev, launches, false);
}
/* With EMBER_MATMUL_GELU_GRAD unset (the default): not absorbed (two launches). */
static em_tensor *gelu_tanh_grad_default(em_device *dev, uint64_t *launches)
{
    return gelu_grad_with(dev, launches, false, NULL, true);
}

/* A cast changes the dtype: the matmul runs, the cast reads it. */
static em_tensor *cast_after(em_device *dev, uint64_t *launches)
{
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_flush();
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_cast(em_take(em_matmul(a, b)), EM_F64);
    em_flush();
    *launches = since(s0);
    return y;
}

/* A write into an operand after the matmul was recorded: the matmul sees the old values (it
 * runs before the write: 2 launches, the matmul and the copy). */
static em_tensor *write_operand(em_device *dev, uint64_t *launches)
{
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor *a2 = mat(dev, EM_SHAPE(7, 33), 6);
    em_flush();
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_matmul(a, b);
    assert_int_equal(em_copy_(a, a2), EM_OK);
    em_tensor *z = em_add(em_take(y), em_narrow(a, 1, 0, 9)); /* a's new values */
    em_flush();
    *launches = since(s0);
    return z;
}

static void test_not_absorbed(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        compare(dev, "read twice", read_twice, 3);
        compare(dev, "broadcast up", broadcast_up, 2);
        compare(dev, "mul, relu", not_epilogue, 2);
        compare(dev, "cast", cast_after, 2);
        compare(dev, "gelu backward of the product", gelu_grad_input, 2);
        compare(dev, "gelu backward, switched off", gelu_grad_switched_off, 2);
        compare(dev, "gelu-tanh backward, by default", gelu_tanh_grad_default, 2);
        compare(dev, "write to an operand", write_operand, 3);
    }
}

/* ---- a donated result copied into a view (em_copy_, fu_run_into) ------------------------------ */

/* buf [320] f32 (zeros, or 0.5 * i pending when `pending_dst`), then em_copy_ of bias + a x b
 * ([7, 9]) into buf[off .. off + 63) as [7, 9]: donated or not. Returns buf's values; *launches
 * gets those of the copy, *before the values a pending reader of buf (2 * buf, recorded before
 * the copy) saw. */
static double *copy_into(em_device *dev, int64_t off, bool donate, bool pending_dst, uint64_t *launches,
                         double **before)
{
    em_scope_begin();
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor *bias = mat(dev, EM_SHAPE(9), 3);
    em_tensor *buf = em_zeros(dev, EM_F32, EM_SHAPE(320));
    assert_int_equal(em_flush(), EM_OK);
    if (pending_dst) buf = em_mul_scalar(em_take(em_add_scalar(em_take(em_arange(dev, EM_F32, 0, 320, 1)), 0)), 0.5);
    em_tensor *reader = em_mul_scalar(buf, 2);
    em_tensor *dst = em_view(em_narrow(buf, 0, off, 63), EM_SHAPE(7, 9));
    assert_non_null(dst);
    em_tensor *y = em_add(em_take(em_matmul(a, b)), bias);
    em_tensor_stats s0 = em_tensor_stats_get();
    assert_int_equal(em_copy_(dst, donate ? em_take(y) : y), EM_OK);
    assert_int_equal(em_flush(), EM_OK);
    *launches = since(s0);
    if (!donate) { /* y is still the caller's, its values intact */
        double *w = tu_read(y), *d = tu_read(dst);
        assert_true(tu_close_n("kept source", w, d, 63, 0));
        free(w);
        free(d);
    }
    *before = tu_read(reader);
    double *v = tu_read(buf);
    em_scope_end(NULL, 0);
    return v;
}

/* The matmul writes the view itself (one launch fewer than the same copy of a kept result)
 * when its result is donated, whole, unheld and the view 256-byte aligned; misaligned or
 * unfused the copy runs (as many launches). Either way buf holds the product at the view and its
 * old values elsewhere, and a pending reader of buf saw the old values. */
static void test_copy_into(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        struct {
            int64_t off;
            bool pending, fused;
            uint64_t saved; /* launches the donation saves */
        } cases[] = {{64, false, true, 1}, {128, true, true, 1}, {3, false, true, 0}, {64, false, false, 0}};
        /* the product alone, unfused, as the reference */
        em_fusion_set(false);
        uint64_t l[2];
        double *bf, *ref = copy_into(dev, 0, false, false, &l[0], &bf);
        free(bf);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            for (int donate = 0; donate < 2; donate++) {
                em_fusion_set(cases[c].fused);
                double *before, *v = copy_into(dev, cases[c].off, donate, cases[c].pending, &l[donate], &before);
                em_fusion_set(true);
                char what[96];
                snprintf(what, sizeof what, "copy into offset %lld (%s), case %zu on %s",
                         (long long)cases[c].off, donate ? "donated" : "kept", c, em_device_name(dev));
                for (int64_t i = 0; i < 320; i++) {
                    double old = cases[c].pending ? 0.5 * (double)i : 0;
                    bool in = i >= cases[c].off && i < cases[c].off + 63;
                    double want = in ? ref[i - cases[c].off] : old;
                    if (fabs(v[i] - want) > 1e-5 * (1 + fabs(want)) || before[i] != 2 * old)
                        fail_msg("%s: element %lld is %g (want %g), the reader saw %g (want %g)",
                                 what, (long long)i, v[i], want, before[i], 2 * old);
                }
                free(v);
                free(before);
            }
            if (l[1] + cases[c].saved != l[0])
                fail_msg("case %zu on %s: %llu launches donated, %llu kept (want %llu fewer)", c,
                         em_device_name(dev), (unsigned long long)l[1], (unsigned long long)l[0],
                         (unsigned long long)cases[c].saved);
        }
        free(ref);
    }
}

/* A result freed unread never runs; em_flush runs a pending one (with its absorbed epilogue)
 * and a host read after it launches nothing more; fused_ops counts the absorbed ops. */
static void test_drop_and_flush(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
        em_tensor *bias = mat(dev, EM_SHAPE(9), 3);
        assert_int_equal(em_flush(), EM_OK);
        em_tensor_stats s0 = em_tensor_stats_get();
        em_tensor *y = em_gelu(em_take(em_add(em_take(em_matmul(a, b)), bias)));
        em_release(y);
        assert_int_equal(em_flush(), EM_OK);
        assert_int_equal(since(s0), 0);
        y = em_gelu(em_take(em_add(em_take(em_matmul(a, b)), bias)));
        assert_int_equal(since(s0), 0);
        assert_int_equal(em_flush(), EM_OK);
        em_tensor_stats s1 = em_tensor_stats_get();
        assert_int_equal(s1.launches - s0.launches, 1);
        assert_int_equal(s1.fused_ops - s0.fused_ops, 2);
        assert_int_equal(s1.fused_launches - s0.fused_launches, 1);
        double *v = tu_read(y);
        assert_int_equal(since(s0), 1);
        free(v);
        em_scope_end(NULL, 0);
    }
}

/* ---- autodiff -------------------------------------------------------------------------------- */

/* The graphs of the autodiff tests, on a Linear of 16 -> 16 over x [2, 5, 16]:
 *  - G_GELU: x + gelu_tanh(linear(x)): under recording the bias moves into the matmul (an add
 *    keeps no input), the GELU does not (its rule reads its input, which must exist);
 *  - G_RESIDUAL: x + linear(x): bias and residual both in the matmul;
 *  - G_KEPT: the matmul's result also read later (not donated): nothing absorbed. */
enum { G_GELU, G_RESIDUAL, G_KEPT };

/* Builds graph gr on dev under recording (fused or not, recompute policy rp), sums y * y and runs
 * backward; g[0..2] get the gradients of x, weight and bias; returns the forward's launches (up
 * to y realized). */
static uint64_t linear_grads(em_device *dev, int gr, bool fused, em_recompute_policy rp, double **g)
{
    em_fusion_set(fused);
    em_set_recompute_policy(rp);
    em_rng rng = em_rng_new(17);
    em_linear *l = em_linear_new(dev, EM_F32, 16, 16, true, true, &rng);
    assert_non_null(l);
    em_tensor *x = mat(dev, EM_SHAPE(2, 5, 16), 9);
    em_set_requires_grad(x, true);
    assert_int_equal(em_flush(), EM_OK);
    uint64_t l0 = em_tensor_stats_get().launches;
    em_tensor *y = NULL, *kept = NULL;
    if (gr == G_KEPT) {
        kept = em_matmul(em_take(em_reshape(x, EM_SHAPE(10, 16))), l->weight);
        y = em_reshape(em_take(em_add(em_take(em_add(kept, l->bias)),
                                      em_take(em_reshape(x, EM_SHAPE(10, 16))))),
                       EM_SHAPE(2, 5, 16));
    } else {
        em_tensor *h = em_linear_forward(l, x);
        y = gr == G_GELU ? em_add(x, em_take(em_gelu_tanh(em_take(h)))) : em_add(x, em_take(h));
    }
    assert_non_null(y);
    assert_int_equal(em_flush(), EM_OK);
    uint64_t launches = em_tensor_stats_get().launches - l0;
    em_tensor *loss = em_sum(em_take(em_mul(y, y)), NULL, 0, false);
    if (kept) loss = em_add(em_take(loss), em_take(em_sum(em_take(em_mul(kept, kept)), NULL, 0, false)));
    assert_non_null(loss);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    g[0] = tu_read(em_grad(x));
    g[1] = tu_read(em_grad(l->weight));
    g[2] = tu_read(em_grad(l->bias));
    em_release(loss);
    em_release(y);
    em_release(kept);
    em_release(x);
    em_module_free(&l->base);
    em_fusion_set(true);
    em_set_recompute_policy(EM_RECOMPUTE_NONE);
    return launches;
}

/* Gradients are those of the ops one by one, and the epilogue absorbs what autodiff lets it
 * (launches of the forward fused / unfused: G_GELU 2 / 4, G_RESIDUAL 1 / 3, G_KEPT 2 / 3; the same
 * under the recompute policy, which keeps adds rather than recomputing them). */
static void test_autodiff(void **state)
{
    (void)state;
    em_autodiff_init();
    static const char *const names[] = {"gelu", "residual", "kept"};
    static const uint64_t want[3][2] = {{2, 4}, {1, 3}, {2, 3}};
    for (int di = 0; di < tu_ndev; di++) {
        for (int gr = 0; gr < 3; gr++) {
            for (int rp = 0; rp < 2; rp++) {
                if (rp && gr == G_KEPT) continue;
                em_recompute_policy pol = rp ? EM_RECOMPUTE_ELEMENTWISE : EM_RECOMPUTE_NONE;
                double *gf[3], *gu[3];
                uint64_t lf = linear_grads(tu_devs[di], gr, true, pol, gf);
                uint64_t lu = linear_grads(tu_devs[di], gr, false, pol, gu);
                uint64_t wf = want[gr][0];
                if (lf != wf || lu != want[gr][1])
                    fail_msg("%s%s on %s: %llu launches fused (want %llu), %llu unfused (want %llu)",
                             names[gr], rp ? " (recompute)" : "", em_device_name(tu_devs[di]),
                             (unsigned long long)lf, (unsigned long long)wf,
                             (unsigned long long)lu, (unsigned long long)want[gr][1]);
                const size_t n[3] = {160, 256, 16};
                for (int i = 0; i < 3; i++) {
                    if (!tu_close_n("grad", gf[i], gu[i], n[i], tu_is_cpu(tu_devs[di]) ? 1e-6 : 1e-5))
                        fail_msg("%s%s: gradient %d differs fused and unfused on %s", names[gr],
                                 rp ? " (recompute)" : "", i, em_device_name(tu_devs[di]));
                    free(gf[i]);
                    free(gu[i]);
                }
            }
        }
    }
}

/* An MLP's backward, y = fc2(gelu_tanh(fc1(x))) over x [2, 5, 16] (16 -> 32 -> 16), loss
 * sum(y * y): mode 0 fused, 1 fused with EMBER_MATMUL_GELU_GRAD=0, 2 unfused, 3 fused with
 * EMBER_MATMUL_PRE=1 (the GELU's output and input from fc1's launch). g[0..3] get the
 * gradients of x, fc1's weight and bias, fc2's weight; returns the backward's launches. */
static uint64_t mlp_grads(em_device *dev, int mode, double **g)
{
    em_fusion_set(mode != 2);
    if (mode == 1) setenv("EMBER_MATMUL_GELU_GRAD", "0", 1);
    if (mode == 3) setenv("EMBER_MATMUL_PRE", "1", 1);
    em_rng rng = em_rng_new(23);
    em_linear *fc1 = em_linear_new(dev, EM_F32, 16, 32, true, true, &rng);
    em_linear *fc2 = em_linear_new(dev, EM_F32, 32, 16, true, true, &rng);
    assert_non_null(fc1);
    assert_non_null(fc2);
    em_tensor *x = mat(dev, EM_SHAPE(2, 5, 16), 9);
    em_set_requires_grad(x, true);
    em_tensor *h = em_gelu_tanh(em_take(em_linear_forward(fc1, x)));
    em_tensor *y = em_linear_forward(fc2, em_take(h));
    em_tensor *loss = em_sum(em_take(em_mul(y, y)), NULL, 0, false);
    assert_non_null(loss);
    assert_int_equal(em_flush(), EM_OK);
    uint64_t l0 = em_tensor_stats_get().launches;
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    assert_int_equal(em_flush(), EM_OK);
    uint64_t launches = em_tensor_stats_get().launches - l0;
    g[0] = tu_read(em_grad(x));
    g[1] = tu_read(em_grad(fc1->weight));
    g[2] = tu_read(em_grad(fc1->bias));
    g[3] = tu_read(em_grad(fc2->weight));
    em_release(loss);
    em_release(y);
    em_release(x);
    em_module_free(&fc1->base);
    em_module_free(&fc2->base);
    setenv("EMBER_MATMUL_GELU_GRAD", "1", 1);
    unsetenv("EMBER_MATMUL_PRE");
    em_fusion_set(true);
    return launches;
}

/* The backward engine donates a GELU's incoming gradient to its rule (ad_take_out_grad), so the
 * input-gradient matmul of fc2 absorbs the GELU's backward: one launch fewer than with the switch
 * off, and the same gradients as unfused. */
static void test_autodiff_gelu_backward(void **state)
{
    (void)state;
    em_autodiff_init();
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        double *g[4][4];
        uint64_t l[4];
        for (int mode = 0; mode < 4; mode++) l[mode] = mlp_grads(dev, mode, g[mode]);
        if (l[0] + 1 != l[1])
            fail_msg("on %s: %llu backward launches fused, %llu with the GELU backward not "
                     "absorbed (want one fewer)",
                     em_device_name(dev), (unsigned long long)l[0], (unsigned long long)l[1]);
        const size_t n[4] = {160, 512, 32, 512};
        for (int mode = 0; mode < 4; mode++)
            for (int i = 0; i < 4; i++)
                if (mode != 2 &&
                    !tu_close_n("grad", g[mode][i], g[2][i], n[i], tu_is_cpu(dev) ? 1e-6 : 1e-5))
                    fail_msg("mode %d: gradient %d differs from unfused on %s", mode, i,
                             em_device_name(dev));
        for (int mode = 0; mode < 4; mode++)
            for (int i = 0; i < 4; i++) free(g[mode][i]);
    }
}

/* A recorder that annotates every result of an annotated input and keeps (says it keeps) the
 * inputs of adds or not: an add takes a donated pending matmul over only when it does not. */
static bool g_keeps;
static int g_marker;
static void mark_record(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
                        em_tensor *out)
{
    (void)op, (void)p, (void)in, (void)nin;
    em_tensor_set_annotation(out, &g_marker);
}
static void mark_release(em_tensor *t, void *a) { (void)t, (void)a; }
static bool mark_keeps(em_tensor_op op, int i) { return (void)i, op == EM_TOP_ADD && g_keeps; }

static void test_recorder_keeps_input(void **state)
{
    (void)state;
    static const em_op_recorder rec = {mark_record, mark_release, NULL, NULL, mark_keeps};
    em_set_op_recorder(&rec);
    for (int di = 0; di < tu_ndev; di++) {
        for (int keeps = 0; keeps < 2; keeps++) {
            g_keeps = keeps;
            em_scope_begin();
            em_tensor *x = mat(tu_devs[di], EM_SHAPE(6, 8), 3), *w = mat(tu_devs[di], EM_SHAPE(8, 5), 4);
            em_tensor *bias = mat(tu_devs[di], EM_SHAPE(5), 5);
            em_tensor_set_annotation(x, &g_marker);
            assert_int_equal(em_flush(), EM_OK);
            uint64_t l0 = em_tensor_stats_get().launches;
            em_tensor *y = em_add(em_take(em_matmul(x, w)), bias);
            assert_non_null(y);
            double *got = tu_read(y);
            uint64_t launches = em_tensor_stats_get().launches - l0;
            if (launches != (keeps ? 2u : 1u))
                fail_msg("recorder keeping add inputs %d on %s: %llu launches", keeps,
                         em_device_name(tu_devs[di]), (unsigned long long)launches);
            em_tensor_set_annotation(x, NULL);
            em_tensor_set_annotation(y, NULL);
            em_fusion_set(false);
            double *want = tu_read(em_add(em_take(em_matmul(x, w)), bias));
            em_fusion_set(true);
            assert_true(tu_close_n("recorded add", got, want, 30, tu_is_cpu(tu_devs[di]) ? 0 : 1e-5));
            free(got);
            free(want);
            em_scope_end(NULL, 0);
        }
    }
    em_set_op_recorder(NULL);
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* A 32 GiB result (65535^2 f64: the most elements a tensor holds is 2^32 - 1): the matmul is recorded (nothing allocated), and running it is out of memory
 * at the sync point, naming the matmul and its epilogue; the node stays pending until freed. */
static void test_realize_out_of_memory(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    const em_caps *caps = em_device_caps(dev);
    const int64_t n = 65535;
    if (!tu_is_cpu(dev) || !caps->memory_total || caps->memory_total >= (uint64_t)(n * n * 8)) {
        fprintf(stderr, "[fusion_matmul] skipping the out-of-memory check\n");
        return;
    }
    em_fusion_set(true);
    em_tensor *a = em_ones(dev, EM_F64, EM_SHAPE(n, 1)), *b = em_ones(dev, EM_F64, EM_SHAPE(1, n));
    em_tensor *bias = em_ones(dev, EM_F64, EM_SHAPE(n));
    assert_int_equal(em_flush(), EM_OK);
    em_tensor *y = em_add(em_take(em_matmul(a, b)), bias);
    assert_non_null(y); /* recorded */
    assert_int_equal(em_flush(), EM_ERR_NOMEM);
    assert_non_null(strstr(em_last_error(), "out of memory"));
    assert_non_null(strstr(em_last_error(), "matmul f64[65535, 1] x f64[1, 65535] + bias"));
    assert_int_equal(em_realize(y), EM_ERR_NOMEM); /* again at the next sync point */
    em_release(y);
    assert_int_equal(em_flush(), EM_OK); /* dropped */
    em_release(a);
    em_release(b);
    em_release(bias);
    em_clear_error();
}

/* Fusion off: the matmul launches at the call. */
static void test_fusion_off(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_fusion_set(false);
    em_scope_begin();
    em_tensor *a = mat(dev, EM_SHAPE(7, 33), 1), *b = mat(dev, EM_SHAPE(33, 9), 2);
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_matmul(a, b);
    assert_non_null(y);
    assert_int_equal(since(s0), 1);
    em_scope_end(NULL, 0);
    em_fusion_set(true);
}

int main(void)
{
    setenv("EMBER_AUTOTUNE", "off", 1);
    unsetenv("EMBER_MATMUL_CONFIG");
    setenv("EMBER_MATMUL_GELU_GRAD", "1", 1); /* GELU's backward in the epilogue is opt-in */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absorbed_patterns),
        cmocka_unit_test(test_not_absorbed),
        cmocka_unit_test(test_drop_and_flush),
        cmocka_unit_test(test_recorder_keeps_input),
        cmocka_unit_test(test_copy_into),
        cmocka_unit_test(test_autodiff),
        cmocka_unit_test(test_autodiff_gelu_backward),
        cmocka_unit_test(test_realize_out_of_memory),
        cmocka_unit_test(test_fusion_off),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
