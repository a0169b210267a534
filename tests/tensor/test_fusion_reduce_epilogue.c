/* test_fusion_reduce_epilogue.c — a pending row-wise reduction absorbing the elementwise ops
 * applied to its donated result (src/tensor/fusion_rows.c; docs/fusion.md, "Reductions with an
 * epilogue"): softmax, log_softmax, layer_norm (with and without affine), rms_norm, sum and mean
 * over the last dim (one value per row: an output of scalars), cross-entropy's per-row loss (an
 * output of scalars in the loss's dtype; on every device, the classifier having one kernel), followed
 * by a scale, the add of a broadcast row, a cast to bf16 or f16, exp, or a 3-op chain, give the
 * results of the ops one by one (bitwise on the CPU, within rounding elsewhere) in one launch
 * where the row-wise kernels run, also with a pending input computed in the loads (prologue +
 * epilogue: one launch); the cases that must run the reduction first (a second reader, a slice,
 * a host read, a write into the input, a broadcast to a bigger shape) do, with the right values;
 * freed unread, it never runs; under autodiff nothing is absorbed and gradients are those of the
 * ops one by one. */
#include "tensor_util.h"

#include "ember/autodiff.h"
#include "tensor/fusion.h"

enum { OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LAYER_NORM, OP_LAYER_NORM_PLAIN, OP_RMS_NORM, OP_SUM, OP_MEAN,
       OP_XENT, OP_COUNT };
static const char *op_names[] = {"softmax", "log_softmax", "layer_norm", "layer_norm (no affine)", "rms_norm",
                                 "sum", "mean (keepdim)", "cross_entropy_rows"};

enum { EP_SCALE, EP_ADD_ROW, EP_CAST_BF16, EP_CAST_F16, EP_EXP, EP_CHAIN, EP_COUNT };
static const char *ep_names[] = {"* 1.7", "+ row", "cast bf16", "cast f16", "exp", "* 2, + row, tanh"};

/* op on p (w, b: a row of weights and biases; tg: i64 classes for cross-entropy, one ignored). */
static em_tensor *apply(int op, em_tensor *p, const em_tensor *w, const em_tensor *b, const em_tensor *tg)
{
    switch (op) {
    case OP_XENT: return em_cross_entropy_rows(p, tg, -100, 0.1, NULL);
    case OP_SOFTMAX: return em_softmax(p, -1);
    case OP_LOG_SOFTMAX: return em_log_softmax(p, -1);
    case OP_LAYER_NORM: return em_layer_norm(p, 1, w, b, 1e-5);
    case OP_LAYER_NORM_PLAIN: return em_layer_norm(p, 1, NULL, NULL, 1e-5);
    case OP_RMS_NORM: return em_rms_norm(p, 1, w, 1e-6);
    case OP_SUM: return em_sum(p, (const int[]){-1}, 1, false);
    default: return em_mean(p, (const int[]){-1}, 1, true);
    }
}

/* The epilogue ep applied to the donated y (row: a row of y's dtype that broadcasts to y: [n],
 * or for a sum [rows], for a mean [1]). */
static em_tensor *epilogue(int ep, em_tensor *y, const em_tensor *row)
{
    switch (ep) {
    case EP_SCALE: return em_mul_scalar(em_take(y), 1.7);
    case EP_ADD_ROW: return em_add(em_take(y), row);
    case EP_CAST_BF16: return em_cast(em_take(y), EM_BF16);
    case EP_CAST_F16: return em_cast(em_take(y), EM_F16);
    case EP_EXP: return em_exp(em_take(y));
    default: return em_tanh(em_take(em_add(em_take(em_mul_scalar(em_take(y), 2)), row)));
    }
}

/* Whether dev runs the row-wise kernels (else the general ones, which record nothing). */
static bool rowpath(em_device *dev)
{
    return tu_is_cpu(dev) || em_device_caps(dev)->plane_ops;
}

typedef struct run_out {
    double *v;
    size_t n;
    em_scalar dtype;
    uint64_t launches, fused;
} run_out;

/* ep(op(x)), x realized or (pending) the pending x' * 0.5 + 0.25 of a transposed x', fused or
 * not; launches counted from the reduction's call to the result realized. */
static run_out run(em_device *dev, em_scalar dt, int op, int ep, int64_t rows, int64_t n, bool pending,
                   bool fused)
{
    em_fusion_set(fused);
    em_scope_begin();
    size_t total = (size_t)(rows * n);
    double *xv = malloc(total * sizeof(double)), bv[1024], wv[1024], rv[1024];
    assert_non_null(xv);
    tu_fill(xv, total, -3, 3, (uint32_t)(rows * 31 + n));
    tu_fill(bv, (size_t)n, -1, 1, 7u);
    tu_fill(wv, (size_t)n, 0.5, 1.5, 8u);
    int64_t nrow = op == OP_SUM || op == OP_XENT ? rows : op == OP_MEAN ? 1 : n;
    tu_fill(rv, (size_t)nrow, -0.5, 0.5, 9u);
    int64_t tv[1024];
    for (int64_t r = 0; r < rows; r++) tv[r] = r == 1 ? -100 : (r * 7 + 3) % n;
    em_tensor *tg = em_from_host(dev, EM_I64, EM_SHAPE(rows), tv);
    /* cross-entropy's loss of f16/bf16 logits is f32: the row it adds is too */
    em_scalar rdt = op == OP_XENT && (dt == EM_F16 || dt == EM_BF16) ? EM_F32 : dt;
    em_tensor *x = pending ? em_transpose(tu_tensor(dev, dt, EM_SHAPE(n, rows), xv), 0, 1)
                           : tu_tensor(dev, dt, EM_SHAPE(rows, n), xv);
    em_tensor *b = tu_tensor(dev, dt, EM_SHAPE(n), bv);
    em_tensor *w = tu_tensor(dev, dt, EM_SHAPE(n), wv);
    em_tensor *row = tu_tensor(dev, rdt, EM_SHAPE(nrow), rv);
    assert_int_equal(em_flush(), EM_OK);
    em_tensor *p = pending ? em_add_scalar(em_take(em_mul_scalar(x, 0.5)), 0.25) : x;
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = apply(op, p, w, b, tg);
    if (!y) fail_msg("%s: %s", op_names[op], em_last_error());
    em_tensor *z = epilogue(ep, y, row);
    if (!z) fail_msg("%s then %s: %s", op_names[op], ep_names[ep], em_last_error());
    if (em_realize(z) != EM_OK) fail_msg("%s then %s: %s", op_names[op], ep_names[ep], em_last_error());
    em_tensor_stats s1 = em_tensor_stats_get();
    run_out r = {tu_read(z), (size_t)em_numel(z), z->dtype, s1.launches - s0.launches,
                 s1.fused_launches - s0.fused_launches};
    em_release(z);
    if (pending) em_release(p);
    free(xv);
    em_scope_end(NULL, 0);
    em_fusion_set(true);
    return r;
}

static void test_epilogue_values(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 7}, {3, 33}, {5, 1000}, {17, 64}};
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
                    for (int ep = 0; ep < EP_COUNT; ep++) {
                        if ((ep == EP_CAST_BF16 && !tu_has(dev, EM_BF16)) ||
                            (ep == EP_CAST_F16 && !tu_has(dev, EM_F16)))
                            continue;
                        /* the last shape: a pending input over a transposed leaf (prologue) */
                        bool pend = si == 3;
                        int64_t rows = shapes[si][0], n = shapes[si][1];
                        run_out f = run(dev, dt, op, ep, rows, n, pend, true);
                        run_out u = run(dev, dt, op, ep, rows, n, pend, false);
                        char what[200];
                        snprintf(what, sizeof what, "%s of %s[%lld, %lld]%s then %s on %s", op_names[op],
                                 em_scalar_name(dt), (long long)rows, (long long)n,
                                 pend ? " (pending, transposed leaf)" : "", ep_names[ep], em_device_name(dev));
                        assert_int_equal(f.n, u.n);
                        assert_int_equal(f.dtype, u.dtype);
                        /* the same ops in the same order: bitwise on the CPU, unless the transposed
                         * leaf narrowed the row kernel's lines (its sums then add in another order) */
                        em_scalar lo = tu_tol_on(dev, f.dtype) > tu_tol_on(dev, dt) ? f.dtype : dt;
                        double tol = tu_is_cpu(dev) && !pend ? 0 : tu_tol_on(dev, lo) * 4;
                        if (!tu_close_n(what, f.v, u.v, f.n, tol)) fail_msg("%s: fused differs from unfused", what);
                        /* fused: one launch (prologue and epilogue in the row kernel) */
                        if ((rowpath(dev) || op == OP_XENT) && (f.launches != 1 || f.fused != 1))
                            fail_msg("%s: %llu launches fused (%llu counted fused); want 1, 1", what,
                                     (unsigned long long)f.launches, (unsigned long long)f.fused);
                        free(f.v);
                        free(u.v);
                        checked++;
                    }
                }
            }
        }
        fprintf(stderr, "[fusion_reduce_epilogue] %s: %d reductions with an epilogue checked against unfused\n",
                em_device_name(dev), checked);
    }
}

/* The cases that run the reduction first, each against the ops run one by one. Returns the
 * values of case c and its launches from the reduction's call to the result realized. */
static double *case_run(em_device *dev, int c, bool fused, size_t *n, uint64_t *launches)
{
    em_fusion_set(fused);
    em_scope_begin();
    double xv[6 * 24], ov[6 * 24], bv[4 * 6 * 24];
    tu_fill(xv, 144, -2, 2, 31u);
    tu_fill(ov, 144, -2, 2, 32u);
    tu_fill(bv, 576, -1, 1, 33u);
    em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(6, 24), xv);
    em_tensor *o = tu_tensor(dev, EM_F32, EM_SHAPE(6, 24), ov);
    em_tensor *big = tu_tensor(dev, EM_F32, EM_SHAPE(4, 6, 24), bv);
    assert_int_equal(em_flush(), EM_OK);
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_softmax(x, -1), *z = NULL;
    assert_non_null(y);
    double *host = NULL;
    switch (c) {
    case 0: /* a second reader: y stays, the op reads its buffer */
        z = em_add(em_mul_scalar(y, 2), y);
        break;
    case 1: /* a slice of the donated result */
        z = em_exp(em_narrow(em_take(y), 0, 1, 3));
        y = NULL;
        break;
    case 2: /* read on the host first, then an op in place */
        host = tu_read(y);
        z = em_mul_scalar(em_take(y), 3);
        y = NULL;
        break;
    case 3: /* its input overwritten after it was recorded: it runs first, on the old values */
        assert_int_equal(em_copy_(x, o), EM_OK);
        z = em_mul_scalar(em_take(y), 3);
        y = NULL;
        break;
    case 4: /* broadcast to a bigger shape: not an epilogue */
        z = em_add(em_take(y), big);
        y = NULL;
        break;
    case 5: /* an op on a pending reduction's donated result reading another one */
        z = em_mul(em_take(y), em_take(em_log_softmax(o, -1)));
        y = NULL;
        break;
    default: /* em_flush runs it; freed unread, another never runs */
        em_release(em_layer_norm(o, 1, NULL, NULL, 1e-5));
        assert_int_equal(em_flush(), EM_OK);
        z = y;
        y = NULL;
        break;
    }
    assert_non_null(z);
    assert_int_equal(em_realize(z), EM_OK);
    em_tensor_stats s1 = em_tensor_stats_get();
    *launches = s1.launches - s0.launches;
    double *v = tu_read(z), *all = malloc(sizeof(double) * (size_t)(em_numel(z) + 144));
    assert_non_null(all);
    *n = (size_t)em_numel(z);
    memcpy(all, v, sizeof(double) * *n);
    if (host) memcpy(all + *n, host, sizeof(double) * 144), *n += 144;
    if (y) {
        double *yv = tu_read(y);
        memcpy(all + *n, yv, sizeof(double) * 144);
        *n += 144;
        free(yv);
    }
    free(v);
    free(host);
    em_scope_end(NULL, 0);
    em_fusion_set(true);
    return all;
}

static void test_realized_first(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int c = 0; c < 7; c++) {
            size_t nf, nu;
            uint64_t lf, lu;
            double *f = case_run(dev, c, true, &nf, &lf), *u = case_run(dev, c, false, &nu, &lu);
            char what[64];
            snprintf(what, sizeof what, "realized-first case %d on %s", c, em_device_name(dev));
            assert_int_equal(nf, nu);
            if (!tu_close_n(what, f, u, nf, tu_is_cpu(dev) ? 0 : 1e-5)) fail_msg("%s: fused differs", what);
            /* row kernels: 0: softmax, then the fused mul + add (2); 1: softmax, exp (2); 2:
             * softmax (host read), mul (2); 3: softmax before the copy, the copy, mul (3); 4:
             * softmax, add (2); 5: log_softmax, then softmax with the mul absorbed (2); 6: the
             * flushed softmax only (1) */
            static const uint64_t want[] = {2, 2, 2, 3, 2, 2, 1};
            if (rowpath(dev) && lf != want[c])
                fail_msg("%s: %llu launches, want %llu", what, (unsigned long long)lf, (unsigned long long)want[c]);
            free(f);
            free(u);
        }
    }
}

/* Under autodiff nothing is donated, so nothing is absorbed: the gradients of softmax, log_softmax
 * and layer_norm followed by elementwise ops are those of the ops one by one (bitwise on the CPU). */
static void test_autodiff_unchanged(void **state)
{
    (void)state;
    fu_prologue_force_cpu(false); /* the CPU's own rule, as in training */
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        double xv[5 * 40], wv[40], bv[40], rv[5 * 40], res[2][3][5 * 40 + 80 + 1];
        tu_fill(xv, 200, -2, 2, 51u);
        tu_fill(wv, 40, 0.5, 1.5, 52u);
        tu_fill(bv, 40, -1, 1, 53u);
        tu_fill(rv, 200, -1, 1, 54u);
        for (int fused = 1; fused >= 0; fused--) {
            for (int op = 0; op < 3; op++) {
                em_fusion_set(fused);
                em_scope_begin();
                em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(5, 40), xv);
                em_tensor *w = tu_tensor(dev, EM_F32, EM_SHAPE(40), wv);
                em_tensor *b = tu_tensor(dev, EM_F32, EM_SHAPE(40), bv);
                em_tensor *r = tu_tensor(dev, EM_F32, EM_SHAPE(5, 40), rv);
                assert_int_equal(em_set_requires_grad(x, true), EM_OK);
                assert_int_equal(em_set_requires_grad(w, true), EM_OK);
                assert_int_equal(em_set_requires_grad(b, true), EM_OK);
                em_tensor *y = op == 0   ? em_softmax(x, -1)
                               : op == 1 ? em_log_softmax(x, -1)
                                         : em_layer_norm(x, 1, w, b, 1e-5);
                em_tensor *z = em_tanh(em_take(em_add(em_take(em_mul_scalar(em_take(y), 1.5)), b)));
                em_tensor *loss = em_sum(em_take(em_mul(em_take(z), r)), NULL, 0, false);
                assert_non_null(loss);
                double *lv = tu_read(loss);
                assert_int_equal(em_backward(loss, NULL), EM_OK);
                double *gx = tu_read(em_grad(x)), *gb = tu_read(em_grad(b));
                memcpy(res[fused][op], gx, sizeof(double) * 200);
                memcpy(res[fused][op] + 200, gb, sizeof(double) * 40);
                if (op == 2) {
                    double *gw = tu_read(em_grad(w));
                    memcpy(res[fused][op] + 240, gw, sizeof(double) * 40);
                    free(gw);
                } else {
                    memset(res[fused][op] + 240, 0, sizeof(double) * 40);
                }
                res[fused][op][280] = lv[0];
                free(lv);
                free(gx);
                free(gb);
                em_scope_end(NULL, 0);
            }
        }
        em_fusion_set(true);
        for (int op = 0; op < 3; op++) {
            char what[96];
            snprintf(what, sizeof what, "gradients of %s then elementwise ops on %s", op_names[op == 2 ? 2 : op],
                     em_device_name(dev));
            if (!tu_close_n(what, res[1][op], res[0][op], 281, tu_is_cpu(dev) ? 0 : 1e-5))
                fail_msg("%s: fused differs from unfused", what);
        }
    }
    fu_prologue_force_cpu(true);
}

int main(void)
{
    em_autodiff_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epilogue_values),
        cmocka_unit_test(test_realized_first),
        cmocka_unit_test(test_autodiff_unchanged),
    };
    fu_prologue_force_cpu(true); /* every tree computed in the loads on the CPU too */
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
