/* test_gradcheck_linear_xent.c — em_linear_cross_entropy (ops_xent_linear.c) and its backward rule
 * (rules_conv.c): finite differences (float64, CPU) of 3 x the loss for x and w with ignored rows
 * and chunks of 1, 4 and all rows (so the gradient the rule scales is the forward's sum over
 * chunks), w alone, and f32 on every device against the CPU; the loss and both gradients equal
 * em_cross_entropy's over em_matmul(x, w^T) in f32 and bf16; no gradient recorded, every row
 * ignored (NaN), bad shapes; and the peak of a forward and backward far under the unfused one's,
 * whose [N, V] logits it never makes. */
#include "autodiff/gradcheck.h"
#include "ember/nn.h"

enum { N = 9, C = 5, V = 7, IGN = -100 };

/* targets with rows 2 and 6 ignored */
static const int64_t TARGETS[N] = {3, 0, IGN, 6, 1, 1, IGN, 5, 2};

static em_tensor *targets_on(em_device *dev)
{
    return em_from_host(dev, EM_I64, EM_SHAPE(N), TARGETS);
}

/* 3 x the fused loss, chunks of *(const int64_t *)arg rows */
static em_tensor *f_fused(em_tensor *const *in, const void *arg)
{
    em_tensor *t = targets_on(em_tensor_device(in[0]));
    em_tensor *l = em_linear_cross_entropy(in[0], in[1], t, IGN, *(const int64_t *)arg);
    return l ? em_mul_scalar(em_take(l), 3.0) : NULL;
}

static const int64_t ONE = 1, FOUR = 4, ALL = 0;

static const gc_case cases[] = {
    {.name = "chunks of 1", .f = f_fused, .arg = &ONE, .nin = 2,
     .shape = {EM_SHAPE(N, C), EM_SHAPE(V, C)}, .device = true},
    {.name = "chunks of 4", .f = f_fused, .arg = &FOUR, .nin = 2,
     .shape = {EM_SHAPE(N, C), EM_SHAPE(V, C)}, .device = true},
    {.name = "one chunk", .f = f_fused, .arg = &ALL, .nin = 2,
     .shape = {EM_SHAPE(N, C), EM_SHAPE(V, C)}},
    {.name = "w alone", .f = f_fused, .arg = &FOUR, .nin = 2,
     .shape = {EM_SHAPE(N, C), EM_SHAPE(V, C)}, .constant = 0x1u},
};

GC_STANDARD_TESTS(cases)

/* max |a - b| / (1 + |b|) over two tensors of one shape */
static double rel_diff(const em_tensor *a, const em_tensor *b)
{
    size_t n = (size_t)em_numel(b);
    float *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb);
    em_tensor *fa = em_cast(a, EM_F32), *fb = em_cast(b, EM_F32);
    assert_int_equal(em_to_host(fa, ha, n * sizeof *ha), EM_OK);
    assert_int_equal(em_to_host(fb, hb, n * sizeof *hb), EM_OK);
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)ha[i] - hb[i]) / (1 + fabs((double)hb[i]));
        if (!(d <= m)) m = d; /* NaN wins */
    }
    free(ha);
    free(hb);
    return m;
}

/* The loss and gradients of x [rows, cols] and w [vocab, cols] (dtype dt), fused in chunks of
 * `chunk` or not; into loss / gx / gw (kept). */
static void run(em_device *dev, em_scalar dt, int64_t rows, int64_t cols, int64_t vocab,
                int64_t chunk, bool fused, em_tensor **loss, em_tensor **gx, em_tensor **gw)
{
    em_scope_begin();
    double *hx = malloc((size_t)(rows * cols) * sizeof *hx);
    double *hw = malloc((size_t)(vocab * cols) * sizeof *hw);
    int64_t *ht = malloc((size_t)rows * sizeof *ht);
    tu_fill(hx, (size_t)(rows * cols), -2, 2, 5);
    tu_fill(hw, (size_t)(vocab * cols), -2, 2, 6);
    for (int64_t i = 0; i < rows; i++) ht[i] = i % 5 == 2 ? IGN : (i * 7919) % vocab;
    em_tensor *x = tu_tensor(dev, dt, EM_SHAPE(rows, cols), hx);
    em_tensor *w = tu_tensor(dev, dt, EM_SHAPE(vocab, cols), hw);
    em_tensor *t = em_from_host(dev, EM_I64, EM_SHAPE(rows), ht);
    free(hx), free(hw), free(ht);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    assert_int_equal(em_set_requires_grad(w, true), EM_OK);
    em_tensor *l = fused ? em_linear_cross_entropy(x, w, t, IGN, chunk)
                         : em_cross_entropy(em_matmul(x, em_transpose(w, 0, 1)), t, IGN, 0.0,
                                            EM_REDUCE_MEAN);
    assert_non_null(l);
    *loss = em_keep(em_detach(l));
    assert_int_equal(em_backward(l, NULL), EM_OK);
    *gx = em_keep(em_detach(em_grad(x)));
    *gw = em_keep(em_detach(em_grad(w)));
    em_scope_end(NULL, 0);
}

/* Fused against unfused: f32 to 1e-5, bf16 to bf16's rounding; chunks that divide N and not. */
static void test_matches_unfused(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    static const struct {
        em_scalar dt;
        int64_t chunk;
        double tol;
    } cfg[] = {{EM_F32, 0, 1e-5}, {EM_F32, 7, 1e-5}, {EM_F32, 1, 1e-5}, {EM_BF16, 16, 2e-2}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        em_scope_begin();
        em_tensor *l0, *x0, *w0, *l1, *x1, *w1;
        run(cpu, cfg[i].dt, 48, 24, 131, cfg[i].chunk, false, &l0, &x0, &w0);
        run(cpu, cfg[i].dt, 48, 24, 131, cfg[i].chunk, true, &l1, &x1, &w1);
        double d[3] = {rel_diff(l1, l0), rel_diff(x1, x0), rel_diff(w1, w0)};
        for (int k = 0; k < 3; k++)
            if (!(d[k] <= cfg[i].tol))
                fail_msg("%s, chunks of %lld: the %s differs by %g from the unfused one",
                         em_scalar_name(cfg[i].dt), (long long)cfg[i].chunk,
                         k == 0 ? "loss" : k == 1 ? "x gradient" : "w gradient", d[k]);
        em_scope_end(NULL, 0);
    }
}

/* Without gradients recorded the op computes only the loss (nothing for a backward to find);
 * every row ignored gives NaN; mismatched shapes and an out-of-range target are errors naming
 * them. */
static void test_no_grad_and_errors(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    em_scope_begin();
    double hx[N * C], hw[V * C];
    tu_fill(hx, N * C, -1, 1, 1);
    tu_fill(hw, V * C, -1, 1, 2);
    em_tensor *x = tu_tensor(cpu, EM_F32, EM_SHAPE(N, C), hx);
    em_tensor *w = tu_tensor(cpu, EM_F32, EM_SHAPE(V, C), hw);
    em_tensor *t = targets_on(cpu);
    em_tensor *l = em_linear_cross_entropy(x, w, t, IGN, 2);
    assert_non_null(l);
    assert_false(em_requires_grad(l));
    em_tensor *ref = em_cross_entropy(em_matmul(x, em_transpose(w, 0, 1)), t, IGN, 0.0,
                                      EM_REDUCE_MEAN);
    assert_true(rel_diff(l, ref) < 1e-6);
    int64_t all[N];
    for (int i = 0; i < N; i++) all[i] = IGN;
    float v = 0;
    em_tensor *none = em_linear_cross_entropy(x, w, em_from_host(cpu, EM_I64, EM_SHAPE(N), all),
                                              IGN, 0);
    assert_non_null(none);
    assert_int_equal(em_to_host(none, &v, sizeof v), EM_OK);
    assert_true(isnan(v));
    assert_null(em_linear_cross_entropy(x, em_transpose(w, 0, 1), t, IGN, 0));
    assert_non_null(strstr(em_last_error(), "f32[5, 7]"));
    int64_t bad[N] = {0, 1, 2, 3, 4, 5, 6, 7, 0}; /* 7 is out of range for 7 classes */
    assert_null(em_linear_cross_entropy(x, w, em_from_host(cpu, EM_I64, EM_SHAPE(N), bad), IGN, 0));
    assert_non_null(strstr(em_last_error(), "target 7"));
    em_scope_end(NULL, 0);
}

/* The peak asked of the pool through a forward and backward: the fused op in chunks of 32 rows
 * never holds the [512, 4096] f32 logits (8 MiB) that the unfused one does (with their gradient
 * written over them). */
static void test_peak_memory(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    uint64_t peak[2];
    for (int fused = 0; fused < 2; fused++) {
        em_scope_begin();
        em_tensor *l, *gx, *gw;
        em_device_pool_reset_peak(cpu);
        em_pool_stats before, after;
        em_device_pool_stats(cpu, &before);
        run(cpu, EM_F32, 512, 16, 4096, 32, fused, &l, &gx, &gw);
        em_device_pool_stats(cpu, &after);
        peak[fused] = after.peak_requested - before.requested_in_use;
        em_scope_end(NULL, 0);
    }
    if (!(peak[1] + (6u << 20) < peak[0]))
        fail_msg("peak %llu bytes fused, %llu unfused: the logits (8 MiB) were not saved",
                 (unsigned long long)peak[1], (unsigned long long)peak[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_matches_unfused),
        cmocka_unit_test(test_no_grad_and_errors),
        cmocka_unit_test(test_peak_memory),
    };
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
