/* test_fusion_reduce.c — a pending elementwise tree computed in the loads of a row-wise reduction
 * (src/tensor/fusion_reduce.c; docs/fusion.md, "Reductions with a prologue"): softmax,
 * log_softmax, layer_norm, rms_norm, sum and mean over the last dim(s) of a pending input give the
 * results of the same ops run one by one (bitwise on the CPU, within rounding elsewhere) in one
 * launch where the row-wise kernels run (the CPU and devices with plane ops), for every float
 * dtype, odd row lengths, broadcast and transposed leaves; the input stays pending and right; the
 * cases that must not fuse (a slice of the pending value, a transcendental tree walked three
 * times on the CPU, too many scalars for one kernel, a tree of several ops on the CPU unless
 * forced as the other tests do) realize it and stay right; bytes are those of the leaves. */
#include "tensor_util.h"

#include "ember/tensor_grad.h"
#include "tensor/fusion.h"

/* The row-wise ops under test. */
enum { OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LAYER_NORM, OP_LAYER_NORM_PLAIN, OP_RMS_NORM, OP_SUM, OP_MEAN,
       OP_SUM2, OP_COUNT };
static const char *op_names[] = {"softmax", "log_softmax", "layer_norm", "layer_norm (no affine)",
                                 "rms_norm", "sum", "mean", "sum over 2 dims"};

static em_tensor *apply(int op, em_tensor *p, const em_tensor *w, const em_tensor *b)
{
    int last = -1, last2[2] = {-2, -1};
    switch (op) {
    case OP_SOFTMAX: return em_softmax(p, -1);
    case OP_LOG_SOFTMAX: return em_log_softmax(p, -1);
    case OP_LAYER_NORM: return em_layer_norm(p, 1, w, b, 1e-5);
    case OP_LAYER_NORM_PLAIN: return em_layer_norm(p, 1, NULL, NULL, 1e-5);
    case OP_RMS_NORM: return em_rms_norm(p, 1, w, 1e-6);
    case OP_SUM: return em_sum(p, &last, 1, false);
    case OP_MEAN: return em_mean(p, &last, 1, true);
    default: return em_sum(p, last2, 2, false);
    }
}

/* Whether dev runs the row-wise kernels (else the general ones, which read a realized input). */
static bool rowpath(em_device *dev)
{
    return tu_is_cpu(dev) || em_device_caps(dev)->plane_ops;
}

typedef struct run_out {
    double *v;
    size_t n;
    uint64_t launches, fused, read;
} run_out;

/* op over the pending x * 0.5 + bias (bias broadcast over the rows; with `transposed`, x is the
 * transpose of a [n, rows] tensor), fused or not. */
static run_out run(em_device *dev, em_scalar dt, int op, int64_t rows, int64_t n, bool transposed, bool fused)
{
    em_fusion_set(fused);
    em_scope_begin();
    size_t total = (size_t)(rows * n);
    double *xv = malloc(total * sizeof(double)), bv[1024], wv[1024];
    assert_non_null(xv);
    tu_fill(xv, total, -3, 3, (uint32_t)(rows * 31 + n));
    tu_fill(bv, (size_t)n, -1, 1, 7u);
    tu_fill(wv, (size_t)n, 0.5, 1.5, 8u);
    em_tensor *x = transposed ? em_transpose(tu_tensor(dev, dt, EM_SHAPE(n, rows), xv), 0, 1)
                              : tu_tensor(dev, dt, EM_SHAPE(rows, n), xv);
    em_tensor *b = tu_tensor(dev, dt, EM_SHAPE(n), bv);
    em_tensor *w = tu_tensor(dev, dt, EM_SHAPE(n), wv);
    assert_int_equal(em_flush(), EM_OK);
    em_tensor *p = em_add(em_take(em_mul_scalar(x, 0.5)), b);
    if (op == OP_SUM2) p = em_reshape(em_take(p), EM_SHAPE(rows, 1, n));
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = apply(op, p, w, b);
    em_realize(y); /* a pending reduction (fusion_rows.c) runs */
    em_tensor_stats s1 = em_tensor_stats_get();
    run_out r = {NULL, 0, s1.launches - s0.launches, s1.fused_launches - s0.fused_launches,
                 s1.bytes_read - s0.bytes_read};
    if (!y) fail_msg("%s: %s", op_names[op], em_last_error());
    r.v = tu_read(y);
    r.n = (size_t)em_numel(y);
    em_release(y);
    em_release(p);
    free(xv);
    em_scope_end(NULL, 0);
    em_fusion_set(true);
    return r;
}

static void test_rows_prologue_values(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 7}, {3, 33}, {17, 64}, {5, 1000}, {2, 8}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        int checked = 0;
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            for (int op = 0; op < OP_COUNT; op++) {
                for (size_t si = 0; si < EM_ARRAY_LEN(shapes); si++) {
                    /* every op at every shape in f32, one shape per op in the other dtypes */
                    if (dt != EM_F32 && si != (size_t)op % EM_ARRAY_LEN(shapes)) continue;
                    bool tr = si == 2;
                    int64_t rows = shapes[si][0], n = shapes[si][1];
                    run_out f = run(dev, dt, op, rows, n, tr, true);
                    run_out u = run(dev, dt, op, rows, n, tr, false);
                    char what[160];
                    snprintf(what, sizeof what, "%s of pending %s[%lld, %lld]%s on %s", op_names[op],
                             em_scalar_name(dt), (long long)rows, (long long)n, tr ? " (transposed leaf)" : "",
                             em_device_name(dev));
                    assert_int_equal(f.n, u.n);
                    /* the same ops in the same order: bitwise on the CPU, unless the transposed
                     * leaf narrowed the row kernel's lines (then its sums add in another order) */
                    double tol = tu_is_cpu(dev) && !tr ? 0 : tu_tol_on(dev, dt) * 4;
                    if (!tu_close_n(what, f.v, u.v, f.n, tol)) fail_msg("%s: fused differs from unfused", what);
                    /* fused: one launch (the row kernel computing the tree), counted as fused;
                     * unfused: the row kernel alone (the 2 ops ran before) */
                    uint64_t want = rowpath(dev) ? 1 : 2;
                    if (f.launches != want || (rowpath(dev) && f.fused != 1) || u.launches != 1)
                        fail_msg("%s: %llu launches fused (%llu counted fused), %llu unfused; want %llu, 1",
                                 what, (unsigned long long)f.launches, (unsigned long long)f.fused,
                                 (unsigned long long)u.launches, (unsigned long long)want);
                    free(f.v);
                    free(u.v);
                    checked++;
                }
            }
        }
        fprintf(stderr, "[fusion_reduce] %s: %d fused row-wise reductions checked against unfused\n",
                em_device_name(dev), checked);
    }
}

/* The pending input stays pending (the row kernel computed its tree, it did not run it) and is
 * right when read afterwards; the fused launch reads the leaves' bytes. */
static void test_input_stays_pending(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!rowpath(dev)) continue;
        em_scope_begin();
        double xv[4 * 16], bv[16], ref[4 * 16];
        tu_fill(xv, 64, -2, 2, 3u);
        tu_fill(bv, 16, -1, 1, 4u);
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(4, 16), xv);
        em_tensor *b = tu_tensor(dev, EM_F32, EM_SHAPE(16), bv);
        assert_int_equal(em_flush(), EM_OK);
        em_tensor *p = em_add(x, b);
        em_tensor_stats s0 = em_tensor_stats_get();
        em_tensor *y = em_softmax(p, -1);
        assert_non_null(y);
        assert_int_equal(em_realize(y), EM_OK); /* a pending reduction (fusion_rows.c) runs */
        em_tensor_stats s1 = em_tensor_stats_get();
        /* reads x (256 bytes) and b (64, broadcast: counted once), writes y (256) */
        assert_int_equal(s1.bytes_read - s0.bytes_read, 64 * 4 + 16 * 4);
        assert_int_equal(s1.bytes_written - s0.bytes_written, 64 * 4);
        assert_true(p->st->pending != NULL);
        for (int i = 0; i < 64; i++) ref[i] = (double)((float)xv[i] + (float)bv[i % 16]);
        tu_check("the pending input read after a fused softmax", p, EM_SHAPE(4, 16), ref, 0);
        em_tensor_stats s2 = em_tensor_stats_get();
        assert_int_equal(s2.launches - s1.launches, 1); /* its tree ran once, for the read */
        em_release(y);
        em_release(p);
        em_scope_end(NULL, 0);
    }
}

/* Cases that realize the pending input instead, with the right values. */
static void test_not_fused(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!rowpath(dev)) continue;
        em_scope_begin();
        double xv[8 * 16];
        tu_fill(xv, 128, -2, 2, 5u);
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(8, 16), xv), *xs[6];
        for (int k = 0; k < 6; k++) {
            tu_fill(xv, 128, -1, 1, 10u + (uint32_t)k);
            xs[k] = tu_tensor(dev, EM_F32, EM_SHAPE(8, 16), xv);
        }
        assert_int_equal(em_flush(), EM_OK);
        for (int c = 0; c < 6; c++) {
            double ref[128];
            /* 4 and 5: the CPU's default rule (only single ops computed in its loads) */
            fu_prologue_force_cpu(c < 4);
            em_fusion_set(false);
            em_tensor *pu = c == 0   ? em_narrow(em_take(em_add_scalar(x, 1)), 0, 2, 4)
                            : c == 1 ? em_exp(x)
                            : c == 2 ? em_exp(x)
                            : c == 3 ? em_add(xs[0], xs[1])
                            : c == 4 ? em_add_scalar(em_take(em_mul_scalar(x, 2)), 1)
                                     : em_cast(x, EM_F64);
            for (int k = 2; c == 3 && k < 6; k++) pu = em_add(em_take(pu), xs[k]);
            int last = -1;
            em_tensor *yu = c == 2 ? em_sum(pu, &last, 1, false) : em_softmax(pu, -1);
            double *vu = tu_read(yu);
            size_t n = (size_t)em_numel(yu);
            memcpy(ref, vu, n * sizeof(double));
            free(vu);
            em_release(yu);
            em_release(pu);
            em_fusion_set(true);
            em_tensor *p = c == 0   ? em_narrow(em_take(em_add_scalar(x, 1)), 0, 2, 4)
                           : c == 1 ? em_exp(x)
                           : c == 2 ? em_exp(x)
                           : c == 3 ? em_add(xs[0], xs[1])
                           : c == 4 ? em_add_scalar(em_take(em_mul_scalar(x, 2)), 1)
                                    : em_cast(x, EM_F64);
            for (int k = 2; c == 3 && k < 6; k++) p = em_add(em_take(p), xs[k]);
            em_tensor_stats s0 = em_tensor_stats_get();
            em_tensor *y = c == 2 ? em_sum(p, &last, 1, false) : em_softmax(p, -1);
            assert_non_null(y);
            assert_int_equal(em_realize(y), EM_OK); /* a pending reduction (fusion_rows.c) runs */
            em_tensor_stats s1 = em_tensor_stats_get();
            /* 0: a slice is realized (2 launches); 1: exp walked 3 times by the CPU's softmax is
             * realized there (2), computed in the loads elsewhere (1); 2: the CPU's sum walks
             * the row once: exp computed in its loads (1); 3: 6 leaves (6 offsets) exceed the
             * scalars one row kernel takes with its own 11 (2); 4: the CPU, not forced, realizes
             * a tree of 2 ops (2), other devices compute it (1); 5: a single cast is computed in
             * the loads everywhere (1) */
            uint64_t want = c == 0 || c == 3 ? 2 : (c == 1 || c == 4) ? (tu_is_cpu(dev) ? 2 : 1) : 1;
            if (s1.launches - s0.launches != want)
                fail_msg("case %d on %s: %llu launches, want %llu", c, em_device_name(dev),
                         (unsigned long long)(s1.launches - s0.launches), (unsigned long long)want);
            char what[64];
            snprintf(what, sizeof what, "not-fused case %d on %s", c, em_device_name(dev));
            double *got = tu_read(y);
            assert_true(tu_close_n(what, got, ref, n, tu_is_cpu(dev) ? 0 : 1e-5));
            free(got);
            em_release(y);
            em_release(p);
        }
        fu_prologue_force_cpu(true);
        em_scope_end(NULL, 0);
    }
}

/* Cross-entropy and its gradient on pending logits: f32 logits cast from bf16 (as the GPT's
 * classifier feeds them) and a scaled, shifted chain; each is one launch reading the leaves, with
 * the values of the unfused ops. */
static void test_xent_prologue(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int c = 0; c < 2; c++) {
            em_scalar src = c == 0 ? EM_BF16 : EM_F32;
            if (!tu_has(dev, src)) continue;
            int64_t N = 13, C = 257;
            double *lv = malloc((size_t)(N * C) * sizeof(double)), gv[13], res[2][13 + 13 * 257];
            int64_t tg[13];
            int32_t z32[13];
            assert_non_null(lv);
            tu_fill(lv, (size_t)(N * C), -4, 4, 77u);
            tu_fill(gv, 13, 0.5, 1.5, 78u);
            for (int i = 0; i < 13; i++) tg[i] = (i * 37) % C;
            tg[5] = -100; /* ignored */
            for (int i = 0; i < 13; i++) z32[i] = tg[i] < 0 ? -1 : (int32_t)tg[i];
            uint64_t launches[2][2];
            for (int fused = 1; fused >= 0; fused--) {
                em_fusion_set(fused);
                em_scope_begin();
                em_tensor *raw = tu_tensor(dev, src, EM_SHAPE(N, C), lv);
                em_tensor *t = em_from_host(dev, EM_I64, EM_SHAPE(N), tg);
                em_tensor *g = tu_tensor(dev, EM_F32, EM_SHAPE(N), gv);
                assert_int_equal(em_flush(), EM_OK);
                em_tensor *x = c == 0 ? em_cast(raw, EM_F32) : em_add_scalar(em_take(em_mul_scalar(raw, 0.5)), 1);
                em_tensor_stats s0 = em_tensor_stats_get();
                em_tensor *l = em_cross_entropy_rows(x, t, -100, 0.0, NULL);
                assert_non_null(l);
                em_realize(l); /* a pending reduction (fusion_rows.c) runs */
                em_tensor_stats s1 = em_tensor_stats_get();
                em_tensor *z = em_from_host(dev, EM_I32, EM_SHAPE(N), z32);
                assert_int_equal(em_flush(), EM_OK);
                em_tensor_stats s2 = em_tensor_stats_get();
                em_tensor *dx = em_cross_entropy_rows_backward(g, x, z, 0.0);
                assert_non_null(dx);
                em_tensor_stats s3 = em_tensor_stats_get();
                launches[fused][0] = s1.launches - s0.launches;
                launches[fused][1] = s3.launches - s2.launches;
                double *lo = tu_read(l), *d = tu_read(dx);
                memcpy(res[fused], lo, 13 * sizeof(double));
                memcpy(res[fused] + 13, d, (size_t)(N * C) * sizeof(double));
                free(lo);
                free(d);
                em_scope_end(NULL, 0);
            }
            em_fusion_set(true);
            char what[96];
            snprintf(what, sizeof what, "cross-entropy of pending logits (%s) on %s", c == 0 ? "cast" : "chain",
                     em_device_name(dev));
            assert_true(tu_close_n(what, res[1], res[0], 13 + 13 * 257, tu_is_cpu(dev) ? 0 : 1e-5));
            /* fused: the forward and the backward each one launch; unfused: the same kernels
             * after the ops that ran before */
            if (launches[1][0] != 1 || launches[1][1] != 1 || launches[0][0] != 1 || launches[0][1] != 1)
                fail_msg("%s: launches fused %llu + %llu, unfused %llu + %llu; want 1 + 1 each", what,
                         (unsigned long long)launches[1][0], (unsigned long long)launches[1][1],
                         (unsigned long long)launches[0][0], (unsigned long long)launches[0][1]);
            free(lv);
        }
    }
}

/* A pending matmul (fusion_matmul.c) is not a tree: a reduction reading it runs it first (two
 * launches), with the values of the ops one by one. */
static void test_pending_matmul_input(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        double av[6 * 40], bv[40 * 24], res[2][6 * 24 + 6];
        tu_fill(av, 240, -1, 1, 41u);
        tu_fill(bv, 960, -1, 1, 42u);
        int64_t tg[6] = {0, 5, 23, 7, 1, 11};
        uint64_t launches[2][2];
        for (int fused = 1; fused >= 0; fused--) {
            em_fusion_set(fused);
            em_scope_begin();
            em_tensor *a = tu_tensor(dev, EM_F32, EM_SHAPE(6, 40), av);
            em_tensor *b = tu_tensor(dev, EM_F32, EM_SHAPE(40, 24), bv);
            em_tensor *t = em_from_host(dev, EM_I64, EM_SHAPE(6), tg);
            assert_int_equal(em_flush(), EM_OK);
            em_tensor_stats s0 = em_tensor_stats_get();
            em_tensor *y = em_softmax(em_matmul(a, b), -1);
            em_realize(y); /* a pending reduction (fusion_rows.c) runs */
            em_tensor_stats s1 = em_tensor_stats_get();
            em_tensor *l = em_cross_entropy_rows(em_matmul(a, b), t, -100, 0.0, NULL);
            em_realize(l);
            em_tensor_stats s2 = em_tensor_stats_get();
            assert_non_null(y);
            assert_non_null(l);
            launches[fused][0] = s1.launches - s0.launches;
            launches[fused][1] = s2.launches - s1.launches;
            double *vy = tu_read(y), *vl = tu_read(l);
            memcpy(res[fused], vy, sizeof(double) * 144);
            memcpy(res[fused] + 144, vl, sizeof(double) * 6);
            free(vy);
            free(vl);
            em_scope_end(NULL, 0);
        }
        em_fusion_set(true);
        char what[64];
        snprintf(what, sizeof what, "reductions of a pending matmul on %s", em_device_name(dev));
        assert_true(tu_close_n(what, res[1], res[0], 150, tu_is_cpu(dev) ? 0 : 1e-5));
        for (int k = 0; k < 2; k++)
            if (launches[1][k] != 2 || launches[0][k] != 2)
                fail_msg("%s: %llu launches fused, %llu unfused (op %d); want 2", what,
                         (unsigned long long)launches[1][k], (unsigned long long)launches[0][k], k);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_prologue_values),
        cmocka_unit_test(test_input_stays_pending),
        cmocka_unit_test(test_not_fused),
        cmocka_unit_test(test_xent_prologue),
        cmocka_unit_test(test_pending_matmul_input),
    };
    fu_prologue_force_cpu(true); /* every tree computed in the loads on the CPU too */
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
