/* test_random_sort.c — random numbers (Philox): the same seed gives the same numbers on every
 * device present, draws have the right ranges and moments, bernoulli and multinomial; sort,
 * argsort and topk (stable, NaN last); conv2d and the pools against a float64 reference; and
 * PyTorch-style printing, including truncation. */
#include "tensor_util.h"

static void test_same_seed_same_numbers(void **state)
{
    (void)state;
    enum { N = 1001 };
    double *first_u = NULL, *first_n = NULL, *first_i = NULL;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_rng rng = em_rng_new(1234567890123ull);
        em_tensor *u = em_rand(dev, EM_F32, EM_SHAPE(N), &rng);
        em_tensor *n = em_randn(dev, EM_F32, EM_SHAPE(N), &rng);
        em_tensor *k = em_randint(dev, EM_I64, EM_SHAPE(N), -5, 7, &rng);
        double *du = tu_read(u), *dn = tu_read(n), *dk = tu_read(k);
        double su = 0, sn = 0, sn2 = 0;
        for (int i = 0; i < N; i++) {
            assert_true(du[i] >= 0 && du[i] < 1);
            assert_true(dk[i] >= -5 && dk[i] < 7 && dk[i] == floor(dk[i]));
            su += du[i];
            sn += dn[i];
            sn2 += dn[i] * dn[i];
        }
        assert_true(fabs(su / N - 0.5) < 0.05);
        assert_true(fabs(sn / N) < 0.1 && fabs(sn2 / N - 1) < 0.15);
        if (!first_u) {
            first_u = du, first_n = dn, first_i = dk;
        } else {
            /* uniform and integer draws bit for bit; normals up to the device's log/sin/cos */
            assert_true(tu_close_n("rand across devices", du, first_u, N, 0));
            assert_true(tu_close_n("randint across devices", dk, first_i, N, 0));
            assert_true(tu_close_n("randn across devices", dn, first_n, N, 1e-5));
            free(du), free(dn), free(dk);
        }
        /* a second generator with the same seed repeats; another call differs */
        em_rng again = em_rng_new(1234567890123ull);
        double *d2 = tu_read(em_rand(dev, EM_F32, EM_SHAPE(N), &again));
        assert_true(tu_close_n("same seed", d2, first_u, N, 0));
        double *d3 = tu_read(em_rand(dev, EM_F32, EM_SHAPE(N), &again));
        assert_false(d3[0] == d2[0] && d3[1] == d2[1]);
        free(d2), free(d3);
        em_scope_end(NULL, 0);
    }
    free(first_u), free(first_n), free(first_i);
}

static void test_bernoulli_multinomial(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_rng rng = em_rng_new(7);
        em_tensor *p = em_full(dev, EM_F32, EM_SHAPE(2000), 0.25);
        double *b = tu_read(em_bernoulli(p, &rng));
        double s = 0;
        for (int i = 0; i < 2000; i++) {
            assert_true(b[i] == 0 || b[i] == 1);
            s += b[i];
        }
        assert_true(fabs(s / 2000 - 0.25) < 0.04);
        free(b);
        double pr[8] = {0, 1, 0, 3, /**/ 0, 0, 5, 0};
        em_tensor *probs = tu_tensor(dev, EM_F32, EM_SHAPE(2, 4), pr);
        double *m = tu_read(em_multinomial(probs, 400, &rng));
        int c3 = 0;
        for (int i = 0; i < 400; i++) {
            assert_true(m[i] == 1 || m[i] == 3);
            c3 += m[i] == 3;
            assert_true(m[400 + i] == 2);
        }
        assert_true(c3 > 240 && c3 < 360);
        free(m);
        em_scope_end(NULL, 0);
    }
}

static void test_sort_topk(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double x[10] = {3, 1, NAN, 2, 1, /**/ 5, -1, 5, 0, 7};
        em_tensor *t = tu_tensor(dev, EM_F32, EM_SHAPE(2, 5), x);
        em_tensor *v = NULL, *ix = NULL;
        assert_int_equal(em_sort(t, 1, false, &v, &ix), EM_OK);
        double rv[10] = {1, 1, 2, 3, NAN, -1, 0, 5, 5, 7}, ri[10] = {1, 4, 3, 0, 2, 1, 3, 0, 2, 4};
        tu_check("sort values", v, EM_SHAPE(2, 5), rv, 0);
        tu_check("sort indices", ix, EM_SHAPE(2, 5), ri, 0);
        double rd[10] = {2, 0, 3, 1, 4, 4, 0, 2, 3, 1};
        tu_check("argsort descending", em_argsort(t, -1, true), EM_SHAPE(2, 5), rd, 0);
        double c[6] = {3, 1, 2, 0, 5, 4}, rc[6] = {0, 1, 2, 3, 5, 4};
        assert_int_equal(em_sort(tu_tensor(dev, EM_F32, EM_SHAPE(2, 3), c), 0, false, &v, NULL), EM_OK);
        tu_check("sort dim 0", v, EM_SHAPE(2, 3), rc, 0);
        em_release(v);
        double y[6] = {4, 9, 1, 7, 3, 8};
        em_tensor *tv = NULL, *ti = NULL;
        assert_int_equal(em_topk(tu_tensor(dev, EM_I32, EM_SHAPE(6), y), 3, 0, true, &tv, &ti), EM_OK);
        double tk[3] = {9, 8, 7}, tki[3] = {1, 5, 3};
        tu_check("topk values", tv, EM_SHAPE(3), tk, 0);
        tu_check("topk indices", ti, EM_SHAPE(3), tki, 0);
        em_release(tv);
        em_release(ti);
        em_scope_end(NULL, 0);
    }
}

static void test_conv_pool(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        enum { NB = 2, C = 4, H = 7, W = 6, O = 6, G = 2, KS = 3 };
        double x[NB * C * H * W], w[O * (C / G) * KS * KS], b[O];
        tu_fill(x, EM_ARRAY_LEN(x), -1, 1, 3);
        tu_fill(w, EM_ARRAY_LEN(w), -1, 1, 4);
        tu_fill(b, O, -1, 1, 5);
        em_tensor *tx = tu_tensor(dev, EM_F32, EM_SHAPE(NB, C, H, W), x);
        em_tensor *tw = tu_tensor(dev, EM_F32, EM_SHAPE(O, C / G, KS, KS), w);
        em_tensor *tb = tu_tensor(dev, EM_F32, EM_SHAPE(O), b);
        int s = 2, p = 1, d = 1;
        int OH = (H + 2 * p - KS) / s + 1, OW = (W + 2 * p - KS) / s + 1;
        double *ref = malloc(sizeof(double) * NB * O * OH * OW);
        for (int n = 0; n < NB; n++)
            for (int o = 0; o < O; o++)
                for (int oh = 0; oh < OH; oh++)
                    for (int ow = 0; ow < OW; ow++) {
                        double acc = b[o];
                        int g = o / (O / G);
                        for (int c = 0; c < C / G; c++)
                            for (int kh = 0; kh < KS; kh++)
                                for (int kw = 0; kw < KS; kw++) {
                                    int ih = oh * s - p + kh * d, iw = ow * s - p + kw * d;
                                    if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                    acc += x[((n * C + g * (C / G) + c) * H + ih) * W + iw] *
                                           w[((o * (C / G) + c) * KS + kh) * KS + kw];
                                }
                        ref[((n * O + o) * OH + oh) * OW + ow] = acc;
                    }
        tu_check("conv2d", em_conv2d(tx, tw, tb, s, p, d, G), EM_SHAPE(NB, O, OH, OW), ref, 1e-5);
        free(ref);
        /* pools: kernel 2, stride 2 on [1, 1, 4, 4] */
        em_tensor *q = em_view(em_arange(dev, EM_F32, 0, 16, 1), EM_SHAPE(1, 1, 4, 4));
        double mp[4] = {5, 7, 13, 15}, ap[4] = {2.5, 4.5, 10.5, 12.5};
        tu_check("max_pool2d", em_max_pool2d(q, 2, 2, 0), EM_SHAPE(1, 1, 2, 2), mp, 0);
        tu_check("avg_pool2d", em_avg_pool2d(q, 2, 0, 0), EM_SHAPE(1, 1, 2, 2), ap, 0);
        em_scope_end(NULL, 0);
    }
}

static void expect_text(const em_tensor *t, const char *want)
{
    char *s = em_tensor_format(t);
    assert_non_null(s);
    if (strcmp(s, want) != 0) fprintf(stderr, "got:\n%s\nwant:\n%s\n", s, want);
    assert_string_equal(s, want);
    free(s);
}

static void test_print(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    if (!tu_is_cpu(dev)) return;
    em_scope_begin();
    em_tensor *m = em_view(em_arange(dev, EM_F32, 1, 5, 1), EM_SHAPE(2, 2));
    expect_text(m, "tensor([[1., 2.],\n        [3., 4.]])");
    expect_text(em_mul_scalar(m, 0.5), "tensor([[0.5000, 1.0000],\n        [1.5000, 2.0000]])");
    expect_text(em_arange(dev, EM_I64, 0, 3, 1), "tensor([0, 1, 2])");
    expect_text(em_arange(dev, EM_I32, 0, 3, 1), "tensor([0, 1, 2], dtype=torch.int32)");
    expect_text(em_gt_scalar(em_arange(dev, EM_F32, 0, 2, 1), 0.5), "tensor([False,  True])");
    expect_text(em_scalar_tensor(dev, EM_F64, 3.25), "tensor(3.2500, dtype=torch.float64)");
    expect_text(em_zeros(dev, EM_F32, EM_SHAPE(0)), "tensor([])");
    expect_text(em_view(em_arange(dev, EM_F32, 0, 8, 1), EM_SHAPE(2, 2, 2)),
                "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
    expect_text(em_arange(dev, EM_I64, 0, 2000, 1), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_numbers),
        cmocka_unit_test(test_bernoulli_multinomial),
        cmocka_unit_test(test_sort_topk),
        cmocka_unit_test(test_conv_pool),
        cmocka_unit_test(test_print),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
