/* test_grad_into.c — gradient destinations (em_set_grad_into) and the ops that write into them
 * (em_sum_leading_into, em_norm_backward_into), on every device present: a bias's gradient and a
 * layer norm's weight and bias gradients land in views of one flat buffer (as the optimizer's
 * slots are), equal to float64 references, em_grad returning the destination itself and the
 * buffer untouched around them; a second contribution to the same leaf still adds up (in a tensor
 * of its own); a destination that cannot be written directly (strided) gets the values copied
 * in; bad destinations and shapes get errors naming both shapes. */
#include "tensor/tensor_util.h"

#include "ember/autodiff.h"
#include "ember/tensor_grad.h"

#define B 3
#define T 5
#define C 40
#define PAD 64 /* elements of the flat buffer before, between and after the destinations */

/* A flat buffer of n elements of dt holding `fill` (random), and its host copy. */
static em_tensor *flat_buffer(em_device *dev, em_scalar dt, int64_t n, double **fill, uint32_t seed)
{
    *fill = malloc((size_t)n * sizeof(double));
    assert_non_null(*fill);
    tu_fill(*fill, (size_t)n, -3, 3, seed);
    return tu_tensor(dev, dt, EM_SHAPE(n), *fill);
}

/* A contiguous 1-D view of n elements of flat at off, untracked by the scope (the leaf keeps it).
 */
static em_tensor *slot_of(em_tensor *flat, int64_t off, int64_t n)
{
    em_tensor *v = em_narrow(flat, 0, off, n);
    assert_non_null(v);
    return v;
}

/* Checks that flat (n elements) still holds `before` outside [lo, hi). */
static void check_untouched(const em_tensor *flat, const double *before, int64_t n,
                            const int64_t *lo, const int64_t *hi, int nr)
{
    double *got = tu_read(flat);
    for (int64_t i = 0; i < n; i++) {
        bool inside = false;
        for (int r = 0; r < nr; r++) inside |= i >= lo[r] && i < hi[r];
        if (!inside && got[i] != before[i])
            fail_msg("flat[%lld] changed: %g, was %g", (long long)i, got[i], before[i]);
    }
    free(got);
}

/* y = x + b over [B, T, C], loss = sum(y * w): d loss / d b = the sums of w over B and T. */
static void test_bias_into_slot(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        for (int k = 0; k < 2; k++) {
            em_scalar dt = k ? EM_BF16 : EM_F32;
            if (!tu_has(tu_devs[d], dt)) continue;
            em_scope_begin();
            double xv[B * T * C], wv[B * T * C], bv[C], *before, ref[C];
            tu_fill(xv, B * T * C, -1, 1, 11);
            tu_fill(wv, B * T * C, -1, 1, 12 + (uint32_t)k);
            tu_fill(bv, C, -1, 1, 13);
            em_tensor *x = tu_tensor(tu_devs[d], dt, EM_SHAPE(B, T, C), xv);
            em_tensor *w = tu_tensor(tu_devs[d], dt, EM_SHAPE(B, T, C), wv);
            em_tensor *b = tu_tensor(tu_devs[d], dt, EM_SHAPE(C), bv);
            int64_t n = 2 * PAD + C;
            em_tensor *flat = flat_buffer(tu_devs[d], dt, n, &before, 14);
            em_tensor *slot = slot_of(flat, PAD, C);
            assert_int_equal(em_set_requires_grad(b, true), EM_OK);
            assert_int_equal(em_set_grad_into(b, slot), EM_OK);
            em_tensor *loss = em_sum(em_mul(em_add(x, b), w), NULL, 0, false);
            assert_int_equal(em_backward(loss, NULL), EM_OK);
            assert_ptr_equal(em_grad(b), slot);
            for (int c = 0; c < C; c++) {
                ref[c] = 0;
                for (int i = 0; i < B * T; i++) ref[c] += wv[i * C + c];
            }
            tu_check("bias gradient in its slot", slot, EM_SHAPE(C), ref,
                     tu_tol_on(tu_devs[d], dt) * 4);
            int64_t lo = PAD, hi = PAD + C;
            check_untouched(flat, before, n, &lo, &hi, 1);
            /* a second backward: the leaf holds a gradient, so the new one adds to it elsewhere */
            loss = em_sum(em_mul(em_add(x, b), w), NULL, 0, false);
            assert_int_equal(em_backward(loss, NULL), EM_OK);
            assert_ptr_not_equal(em_grad(b), slot);
            double twice[C];
            for (int c = 0; c < C; c++) twice[c] = 2 * ref[c];
            tu_check("accumulated bias gradient", em_grad(b), EM_SHAPE(C), twice,
                     tu_tol_on(tu_devs[d], dt) * 8);
            /* zeroed: the next one lands in the slot again */
            em_zero_grad(b);
            loss = em_sum(em_mul(em_add(x, b), w), NULL, 0, false);
            assert_int_equal(em_backward(loss, NULL), EM_OK);
            assert_ptr_equal(em_grad(b), slot);
            assert_int_equal(em_set_grad_into(b, NULL), EM_OK);
            em_zero_grad(b);
            free(before);
            em_scope_end(NULL, 0);
        }
    }
}

/* A bias used twice in one graph: the first contribution lands in the slot, the sum is right. */
static void test_used_twice(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_scope_begin();
        double xv[T * C], bv[C], *before, ref[C];
        tu_fill(xv, T * C, -1, 1, 21);
        tu_fill(bv, C, -1, 1, 22);
        em_tensor *x = tu_tensor(tu_devs[d], EM_F32, EM_SHAPE(T, C), xv);
        em_tensor *b = tu_tensor(tu_devs[d], EM_F32, EM_SHAPE(C), bv);
        em_tensor *flat = flat_buffer(tu_devs[d], EM_F32, C + PAD, &before, 23);
        em_tensor *slot = slot_of(flat, PAD, C);
        assert_int_equal(em_set_requires_grad(b, true), EM_OK);
        assert_int_equal(em_set_grad_into(b, slot), EM_OK);
        /* loss = sum((x + b) * 3 + (x + b) * x): d/db = sum over T of 3 + x */
        em_tensor *y = em_add(x, b);
        em_tensor *loss =
            em_sum(em_add(em_mul_scalar(y, 3), em_mul(em_add(x, b), x)), NULL, 0, false);
        assert_int_equal(em_backward(loss, NULL), EM_OK);
        for (int c = 0; c < C; c++) {
            ref[c] = 0;
            for (int t = 0; t < T; t++) ref[c] += 3 + xv[t * C + c];
        }
        tu_check("bias used twice", em_grad(b), EM_SHAPE(C), ref, 1e-5);
        em_zero_grad(b);
        free(before);
        em_scope_end(NULL, 0);
    }
}

/* loss = sum((x W + b) * w) with W's and b's destinations in one flat buffer (aligned, as the
 * optimizer's slots): the add's rule hands b's sums to the matmul's (ad_defer_colsum), whose weight
 * gradient then runs at once into W's slot with them (em_matmul_sum_b_into): em_grad returns
 * both slots, dW = x^T w and db = the column sums of w against float64. With EMBER_MATMUL_BSUM=0
 * the weight's gradient is left pending (not its slot) and the values are the same. */
#define LI 48
#define LO 40
#define LA 128 /* slot offsets: 256 bytes or more */
static void check_linear(em_device *dev, em_scalar dt, bool handed)
{
    em_scope_begin();
    double xv[T * LI], wv[T * LO], Wv[LI * LO], bv[LO], *before, dW[LI * LO], db[LO];
    tu_fill(xv, T * LI, -1, 1, 31);
    tu_fill(wv, T * LO, -1, 1, 32);
    tu_fill(Wv, LI * LO, -1, 1, 33);
    tu_fill(bv, LO, -1, 1, 34);
    em_tensor *x = tu_tensor(dev, dt, EM_SHAPE(T, LI), xv);
    em_tensor *w = tu_tensor(dev, dt, EM_SHAPE(T, LO), wv);
    em_tensor *W = tu_tensor(dev, dt, EM_SHAPE(LI, LO), Wv);
    em_tensor *b = tu_tensor(dev, dt, EM_SHAPE(LO), bv);
    int64_t n = LA + LI * LO + LA + LO + LA;
    em_tensor *flat = flat_buffer(dev, dt, n, &before, 35);
    em_tensor *wslot = em_reshape(slot_of(flat, LA, LI * LO), EM_SHAPE(LI, LO));
    em_tensor *bslot = slot_of(flat, LA + LI * LO + LA, LO);
    assert_int_equal(em_set_requires_grad(W, true), EM_OK);
    assert_int_equal(em_set_requires_grad(b, true), EM_OK);
    assert_int_equal(em_set_grad_into(W, wslot), EM_OK);
    assert_int_equal(em_set_grad_into(b, bslot), EM_OK);
    if (!handed) setenv("EMBER_MATMUL_BSUM", "0", 1); /* the default hands them on */
    em_tensor *loss = em_sum(em_mul(em_add(em_matmul(x, W), b), w), NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    unsetenv("EMBER_MATMUL_BSUM");
    if (handed)
        assert_ptr_equal(em_grad(W), wslot);
    else
        assert_ptr_not_equal(em_grad(W), wslot);
    assert_ptr_equal(em_grad(b), bslot);
    for (int o = 0; o < LO; o++) {
        db[o] = 0;
        for (int t = 0; t < T; t++) db[o] += wv[t * LO + o];
        for (int i = 0; i < LI; i++) {
            dW[i * LO + o] = 0;
            for (int t = 0; t < T; t++) dW[i * LO + o] += xv[t * LI + i] * wv[t * LO + o];
        }
    }
    double tol = tu_tol_on(dev, dt) * 4;
    tu_check(handed ? "bias gradient with the weight's" : "bias gradient, not handed", bslot,
             EM_SHAPE(LO), db, tol);
    tu_check(handed ? "weight gradient with the bias's" : "weight gradient, not handed", em_grad(W),
             EM_SHAPE(LI, LO), dW, tol);
    int64_t lo[2] = {LA, LA + LI * LO + LA}, hi[2] = {LA + LI * LO, LA + LI * LO + LA + LO};
    if (handed) check_untouched(flat, before, n, lo, hi, 2);
    em_set_grad_into(W, NULL);
    em_set_grad_into(b, NULL);
    em_zero_grad(W);
    em_zero_grad(b);
    free(before);
    em_scope_end(NULL, 0);
}

static void test_linear_into_slots(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++)
        for (int k = 0; k < 2; k++) {
            em_scalar dt = k ? EM_BF16 : EM_F32;
            if (!tu_has(tu_devs[d], dt)) continue;
            check_linear(tu_devs[d], dt, true);
            check_linear(tu_devs[d], dt, false);
        }
}

/* A bias whose sums are handed to a matmul (ad_defer_colsum) that the walk reaches late: the
 * product is used twice (mm * 2 and mm + b), so its node runs after the other uses of b, whose
 * contribution must find the sums written before it adds (cs_flush); the matmul's gradient is not
 * the add's alone, so its rule does not take them. loss = sum(2 mm c1) + sum(b * c2) + sum((mm +
 * b) w) with mm = x W: db = the sums of c2 + w, dW = x^T (2 c1 + w), against float64. */
static void test_linear_bias_shared(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_scope_begin();
        double xv[T * LI], Wv[LI * LO], bv[LO], c1[T * LO], c2[T * LO], wv[T * LO];
        double *before, db[LO], dW[LI * LO];
        tu_fill(xv, T * LI, -1, 1, 41), tu_fill(Wv, LI * LO, -1, 1, 43), tu_fill(bv, LO, -1, 1, 45);
        tu_fill(c1, T * LO, -1, 1, 46), tu_fill(c2, T * LO, -1, 1, 47),
            tu_fill(wv, T * LO, -1, 1, 49);
        em_device *dev = tu_devs[d];
        em_tensor *W = tu_tensor(dev, EM_F32, EM_SHAPE(LI, LO), Wv);
        em_tensor *b = tu_tensor(dev, EM_F32, EM_SHAPE(LO), bv);
        em_tensor *flat = flat_buffer(dev, EM_F32, LA + LO, &before, 48);
        em_tensor *bslot = slot_of(flat, LA, LO);
        assert_int_equal(em_set_requires_grad(W, true), EM_OK);
        assert_int_equal(em_set_requires_grad(b, true), EM_OK);
        assert_int_equal(em_set_grad_into(b, bslot), EM_OK);
        em_tensor *mm = em_matmul(tu_tensor(dev, EM_F32, EM_SHAPE(T, LI), xv), W);
        em_tensor *s1 =
            em_sum(em_mul(em_mul_scalar(mm, 2), tu_tensor(dev, EM_F32, EM_SHAPE(T, LO), c1)), NULL,
                   0, false);
        em_tensor *s2 =
            em_sum(em_mul(b, tu_tensor(dev, EM_F32, EM_SHAPE(T, LO), c2)), NULL, 0, false);
        em_tensor *s3 = em_sum(em_mul(em_add(mm, b), tu_tensor(dev, EM_F32, EM_SHAPE(T, LO), wv)),
                               NULL, 0, false);
        assert_int_equal(em_backward(em_add(em_add(s1, s2), s3), NULL), EM_OK);
        for (int o = 0; o < LO; o++) {
            db[o] = 0;
            for (int t = 0; t < T; t++) db[o] += c2[t * LO + o] + wv[t * LO + o];
            for (int i = 0; i < LI; i++) {
                dW[i * LO + o] = 0;
                for (int t = 0; t < T; t++)
                    dW[i * LO + o] += xv[t * LI + i] * (2 * c1[t * LO + o] + wv[t * LO + o]);
            }
        }
        tu_check("a bias used twice, its sums handed on", em_grad(b), EM_SHAPE(LO), db, 1e-5);
        tu_check("the weight of a product used twice", em_grad(W), EM_SHAPE(LI, LO), dW, 1e-5);
        em_set_grad_into(b, NULL);
        em_zero_grad(b);
        em_zero_grad(W);
        free(before);
        em_scope_end(NULL, 0);
    }
}

/* The layer norm's weight and bias gradients in two slots of one buffer, against em_norm_backward
 * without destinations (itself checked against float64 in tensor.norm_backward). */
static void test_norm_into_slots(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        for (int k = 0; k < 2; k++) {
            em_scalar dt = k ? EM_BF16 : EM_F32;
            if (!tu_has(tu_devs[d], dt)) continue;
            em_scope_begin();
            double xv[B * T * C], gv[B * T * C], wv[C], bv[C], *before;
            tu_fill(xv, B * T * C, -2, 2, 31);
            tu_fill(gv, B * T * C, -1, 1, 32);
            tu_fill(wv, C, 0.5, 1.5, 33);
            tu_fill(bv, C, -1, 1, 34);
            em_device *dev = tu_devs[d];
            em_tensor *x = tu_tensor(dev, dt, EM_SHAPE(B, T, C), xv);
            em_tensor *g = tu_tensor(dev, dt, EM_SHAPE(B, T, C), gv);
            em_tensor *w = tu_tensor(dev, dt, EM_SHAPE(C), wv);
            em_tensor *b = tu_tensor(dev, dt, EM_SHAPE(C), bv);
            /* the plain gradients first */
            em_tensor *rdx = NULL, *rdw = NULL, *rdb = NULL;
            assert_int_equal(em_norm_backward(g, x, 1, w, 1e-5, false, NULL, &rdx, &rdw, &rdb),
                             EM_OK);
            double *dw_ref = tu_read(rdw), *db_ref = tu_read(rdb);
            /* then through the tape, into the slots */
            int64_t n = 3 * PAD + 2 * C;
            em_tensor *flat = flat_buffer(dev, dt, n, &before, 35);
            em_tensor *sw = slot_of(flat, PAD, C), *sb = slot_of(flat, 2 * PAD + C, C);
            assert_int_equal(em_set_requires_grad(w, true), EM_OK);
            assert_int_equal(em_set_requires_grad(b, true), EM_OK);
            assert_int_equal(em_set_grad_into(w, sw), EM_OK);
            assert_int_equal(em_set_grad_into(b, sb), EM_OK);
            em_tensor *loss = em_sum(em_mul(em_layer_norm(x, 1, w, b, 1e-5), g), NULL, 0, false);
            assert_int_equal(em_backward(loss, NULL), EM_OK);
            assert_ptr_equal(em_grad(w), sw);
            assert_ptr_equal(em_grad(b), sb);
            double tol = tu_tol_on(dev, dt) * 4;
            tu_check("norm weight gradient in its slot", sw, EM_SHAPE(C), dw_ref, tol);
            tu_check("norm bias gradient in its slot", sb, EM_SHAPE(C), db_ref, tol);
            int64_t lo[2] = {PAD, 2 * PAD + C}, hi[2] = {PAD + C, 2 * PAD + 2 * C};
            check_untouched(flat, before, n, lo, hi, 2);
            em_zero_grad(w);
            em_zero_grad(b);
            assert_int_equal(em_set_grad_into(w, NULL), EM_OK);
            assert_int_equal(em_set_grad_into(b, NULL), EM_OK);
            em_release(rdx);
            em_release(rdw);
            em_release(rdb);
            free(dw_ref);
            free(db_ref);
            free(before);
            em_scope_end(NULL, 0);
        }
    }
}

/* em_sum_leading_into: a contiguous view at an offset of another dtype (the column sums write
 * it), a strided view (summed, then copied in), and the errors. */
static void test_sum_leading_into(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_scope_begin();
        em_device *dev = tu_devs[d];
        double tv[7 * 3 * 24], ref[3 * 24], *before;
        tu_fill(tv, 7 * 3 * 24, -1, 1, 41);
        for (int j = 0; j < 3 * 24; j++) {
            ref[j] = 0;
            for (int i = 0; i < 7; i++) ref[j] += tu_round(EM_BF16, tv[i * 3 * 24 + j]);
        }
        em_tensor *t = tu_tensor(dev, EM_BF16, EM_SHAPE(7, 3, 24), tv);
        em_tensor *flat = flat_buffer(dev, EM_F32, PAD + 3 * 24 + PAD, &before, 42);
        em_tensor *out = em_view(slot_of(flat, PAD, 3 * 24), EM_SHAPE(3, 24));
        assert_int_equal(em_sum_leading_into(out, t), EM_OK);
        tu_check("bf16 sums into an f32 view", out, EM_SHAPE(3, 24), ref, 1e-5);
        int64_t lo = PAD, hi = PAD + 3 * 24;
        check_untouched(flat, before, PAD + 3 * 24 + PAD, &lo, &hi, 1);
        /* a strided destination: the columns of a [24, 3] tensor, transposed */
        double zeros[24 * 3] = {0};
        em_tensor *m = tu_tensor(dev, EM_F32, EM_SHAPE(24, 3), zeros);
        em_tensor *mt = em_transpose(m, 0, 1);
        assert_int_equal(em_sum_leading_into(mt, t), EM_OK);
        tu_check("sums into a transposed view", mt, EM_SHAPE(3, 24), ref, 1e-5);
        /* shapes that do not fit: both named */
        em_tensor *bad = em_zeros(dev, EM_F32, EM_SHAPE(24, 3));
        assert_int_not_equal(em_sum_leading_into(bad, t), EM_OK);
        assert_non_null(strstr(em_last_error(), "[24, 3]"));
        assert_non_null(strstr(em_last_error(), "[7, 3, 24]"));
        em_clear_error();
        free(before);
        em_scope_end(NULL, 0);
    }
}

/* Destinations that do not match the leaf, a non-leaf, and a norm destination of the wrong shape.
 */
static void test_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *b = em_zeros(dev, EM_F32, EM_SHAPE(C));
    em_tensor *wrong = em_zeros(dev, EM_F32, EM_SHAPE(C + 1));
    em_tensor *other = em_zeros(dev, EM_F64, EM_SHAPE(C));
    assert_int_not_equal(em_set_grad_into(b, wrong), EM_OK);
    assert_non_null(strstr(em_last_error(), "[41]"));
    assert_non_null(strstr(em_last_error(), "[40]"));
    assert_int_not_equal(em_set_grad_into(b, other), EM_OK);
    assert_int_equal(em_set_requires_grad(b, true), EM_OK);
    em_tensor *y = em_mul_scalar(b, 2);
    assert_int_not_equal(em_set_grad_into(y, b), EM_OK);
    assert_non_null(strstr(em_last_error(), "leaf"));
    em_tensor *x = em_ones(dev, EM_F32, EM_SHAPE(T, C));
    em_tensor *dx = NULL, *dw = NULL;
    assert_int_not_equal(
        em_norm_backward_into(x, x, 1, b, 1e-5, false, NULL, &dx, &dw, NULL, wrong, NULL), EM_OK);
    assert_non_null(strstr(em_last_error(), "destination"));
    assert_null(dx);
    assert_null(dw);
    em_clear_error();
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias_into_slot),
        cmocka_unit_test(test_used_twice),
        cmocka_unit_test(test_norm_into_slots),
        cmocka_unit_test(test_sum_leading_into),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_linear_into_slots),
        cmocka_unit_test(test_linear_bias_shared),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
