/* test_layout.c — conformance of layout, matmul and indexing on every device present: views
 * (reshape/view, permute, transpose, expand, squeeze/unsqueeze, slice with steps, narrow, select,
 * split, chunk) share storage and read right; copies (contiguous, reshape of a non-viewable
 * tensor, flip, cat, stack, pad, tril/triu) match a C reference; matmul with batching,
 * broadcasting, transposed operands, 1-D promotion and f16/bf16 inputs; index_select, embedding,
 * gather, scatter and scatter_add. */
#include "tensor_util.h"

static void test_views(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *x = em_arange(dev, EM_F32, 0, 24, 1);
        em_tensor *v = em_view(x, EM_SHAPE(2, -1, 4));
        assert_int_equal(em_dim(v, 1), 3);
        em_tensor *p = em_permute(v, (int[]){2, 0, 1}, 3); /* [4, 2, 3] */
        double ref[24];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++)
                for (int k = 0; k < 3; k++) ref[(i * 2 + j) * 3 + k] = j * 12 + k * 4 + i;
        tu_check("permute", p, EM_SHAPE(4, 2, 3), ref, 0);
        assert_false(em_is_contiguous(p));
        tu_check("contiguous", em_contiguous(p), EM_SHAPE(4, 2, 3), ref, 0);
        /* a permuted tensor cannot be viewed flat, but reshape copies */
        tu_expect_error(em_view(p, EM_SHAPE(24)), "view: the strides of f32[4, 2, 3] do not allow a view as f32[24]");
        tu_check("reshape copy", em_reshape(p, EM_SHAPE(24)), EM_SHAPE(24), ref, 0);
        /* slicing with steps, on both dims of a [4, 6] matrix */
        em_tensor *m = em_view(x, EM_SHAPE(4, 6));
        em_tensor *s = em_slice(em_slice(m, 0, 1, 4, 2), 1, -5, 100, 2); /* rows 1, 3; cols 1, 3, 5 */
        double rs[6] = {7, 9, 11, 19, 21, 23};
        tu_check("slice steps", s, EM_SHAPE(2, 3), rs, 0);
        tu_check("exp of slice", em_sub_scalar(em_add_scalar(s, 1), 1), EM_SHAPE(2, 3), rs, 0);
        double rn[4] = {8, 9, 14, 15};
        tu_check("narrow", em_narrow(em_narrow(m, 0, 1, 2), 1, 2, 2), EM_SHAPE(2, 2), rn, 0);
        double rsel[4] = {2, 8, 14, 20};
        tu_check("select", em_select(m, 1, -4), EM_SHAPE(4), rsel, 0);
        /* expand, squeeze, unsqueeze */
        em_tensor *col = em_unsqueeze(em_narrow(x, 0, 0, 3), 1); /* [3, 1] */
        em_tensor *e = em_expand(col, EM_SHAPE(2, 3, 4));
        double re[24];
        for (int i = 0; i < 24; i++) re[i] = (i / 4) % 3;
        tu_check("expand", e, EM_SHAPE(2, 3, 4), re, 0);
        tu_check("contiguous(expand)", em_contiguous(e), EM_SHAPE(2, 3, 4), re, 0);
        assert_int_equal(em_rank(em_squeeze(col, EM_ALL_DIMS)), 1);
        assert_int_equal(em_rank(em_squeeze(em_unsqueeze(col, 0), 0)), 2);
        /* split and chunk */
        em_tensor *parts[4];
        assert_int_equal(em_split(m, 4, 1, parts, 4), 2);
        assert_int_equal(em_dim(parts[1], 1), 2);
        double rp[8] = {4, 5, 10, 11, 16, 17, 22, 23};
        tu_check("split", parts[1], EM_SHAPE(4, 2), rp, 0);
        em_release(parts[0]);
        em_release(parts[1]);
        assert_int_equal(em_chunk(m, 3, 0, parts, 4), 2); /* 4 rows in chunks of 2 */
        em_release(parts[0]);
        em_release(parts[1]);
        em_scope_end(NULL, 0);
    }
}

static void test_copies(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *x = em_view(em_arange(dev, EM_F32, 0, 6, 1), EM_SHAPE(2, 3));
        double rf[6] = {5, 4, 3, 2, 1, 0}, rf1[6] = {2, 1, 0, 5, 4, 3};
        tu_check("flip both", em_flip(x, (int[]){0, 1}, 2), EM_SHAPE(2, 3), rf, 0);
        tu_check("flip last", em_flip(x, (int[]){-1}, 1), EM_SHAPE(2, 3), rf1, 0);
        double rc[12] = {0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5};
        tu_check("cat dim 1", em_cat((em_tensor *[]){x, x}, 2, 1), EM_SHAPE(2, 6), rc, 0);
        double rs[12] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
        tu_check("stack", em_stack((em_tensor *[]){x, x}, 2, 0), EM_SHAPE(2, 2, 3), rs, 0);
        double rp[20] = {9, 9, 9, 9, 9, 9, 0, 1, 2, 9, 9, 3, 4, 5, 9, 9, 9, 9, 9, 9};
        tu_check("pad", em_pad(x, (int64_t[]){1, 1, 1, 1}, 4, 9), EM_SHAPE(4, 5), rp, 0);
        em_tensor *sq = em_view(em_arange(dev, EM_F32, 1, 10, 1), EM_SHAPE(3, 3));
        double tl[9] = {1, 0, 0, 4, 5, 0, 7, 8, 9}, tu1[9] = {0, 2, 3, 0, 0, 6, 0, 0, 0};
        tu_check("tril", em_tril(sq, 0), EM_SHAPE(3, 3), tl, 0);
        tu_check("triu 1", em_triu(sq, 1), EM_SHAPE(3, 3), tu1, 0);
        /* cat of a transposed view with a contiguous tensor */
        em_tensor *t = em_transpose(x, 0, 1); /* [3, 2] */
        double rct[12] = {0, 3, 1, 4, 2, 5, 0, 3, 1, 4, 2, 5};
        tu_check("cat views", em_cat((em_tensor *[]){t, em_contiguous(t)}, 2, 0), EM_SHAPE(6, 2), rct, 0);
        em_scope_end(NULL, 0);
    }
}

static void test_matmul(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            /* a [2, 1, 19, 23] x b^T where b is [3, 17, 23] transposed: out [2, 3, 19, 17] */
            enum { B0 = 2, B1 = 3, M = 19, K = 23, N = 17 };
            double a[B0 * M * K], b[B1 * N * K], ref[B0 * B1 * M * N];
            tu_fill(a, B0 * M * K, -1, 1, 1);
            tu_fill(b, B1 * N * K, -1, 1, 2);
            em_tensor *ta = tu_tensor(dev, dt, EM_SHAPE(B0, 1, M, K), a);
            em_tensor *tb = em_transpose(tu_tensor(dev, dt, EM_SHAPE(B1, N, K), b), -1, -2);
            for (int i = 0; i < B0; i++)
                for (int j = 0; j < B1; j++)
                    for (int m = 0; m < M; m++)
                        for (int n = 0; n < N; n++) {
                            double s = 0;
                            for (int k = 0; k < K; k++) s += a[(i * M + m) * K + k] * b[(j * N + n) * K + k];
                            ref[((i * B1 + j) * M + m) * N + n] = s;
                        }
            char what[64];
            snprintf(what, sizeof what, "matmul %s", em_scalar_name(dt));
            tu_check(what, em_matmul(ta, tb), EM_SHAPE(B0, B1, M, N), ref, tu_tol(dt) * 10);
            /* 1-D operands */
            em_tensor *v = em_select(em_select(ta, 0, 0), 0, 0); /* [M, K] */
            em_tensor *k1 = em_select(em_select(v, 0, 0), 0, 0);  /* 0-d: not allowed */
            tu_expect_error(em_matmul(v, k1), "matmul: needs numeric tensors of rank 1 or more");
            em_tensor *row = em_select(v, 0, 0); /* [K] */
            double rv[M];
            for (int m = 0; m < M; m++) {
                rv[m] = 0;
                for (int k = 0; k < K; k++) rv[m] += a[m * K + k] * a[k];
            }
            tu_check("matmul matrix x vector", em_matmul(v, row), EM_SHAPE(M), rv, tu_tol(dt) * 10);
            em_scope_end(NULL, 0);
        }
        /* integers */
        em_scope_begin();
        double ia[6] = {1, 2, 3, 4, 5, 6}, ib[6] = {1, 0, 0, 1, 1, 1}, ir[4] = {4, 5, 10, 11};
        tu_check("matmul i32", em_matmul(tu_tensor(dev, EM_I32, EM_SHAPE(2, 3), ia), tu_tensor(dev, EM_I32, EM_SHAPE(3, 2), ib)),
                 EM_SHAPE(2, 2), ir, 0);
        em_scope_end(NULL, 0);
    }
}

static void test_indexing(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *w = em_view(em_arange(dev, EM_F32, 0, 15, 1), EM_SHAPE(5, 3)); /* row i = 3i, 3i+1, 3i+2 */
        double ids[4] = {4, 0, 0, 2};
        em_tensor *ti = tu_tensor(dev, EM_I64, EM_SHAPE(2, 2), ids);
        double re[12] = {12, 13, 14, 0, 1, 2, 0, 1, 2, 6, 7, 8};
        tu_check("embedding", em_embedding(w, ti), EM_SHAPE(2, 2, 3), re, 0);
        double i32v[2] = {2, 0};
        em_tensor *t32 = tu_tensor(dev, EM_I32, EM_SHAPE(2), i32v);
        double rs[10] = {2, 0, 5, 3, 8, 6, 11, 9, 14, 12};
        tu_check("index_select dim 1", em_index_select(w, 1, t32), EM_SHAPE(5, 2), rs, 0);
        /* gather along dim 1 of [2, 3]: out[i][j] = x[i][idx[i][j]] */
        double x[6] = {10, 11, 12, 20, 21, 22}, gi[4] = {2, 0, 1, 1}, gr[4] = {12, 10, 21, 21};
        em_tensor *tx = tu_tensor(dev, EM_F32, EM_SHAPE(2, 3), x);
        em_tensor *tg = tu_tensor(dev, EM_I64, EM_SHAPE(2, 2), gi);
        tu_check("gather", em_gather(tx, 1, tg), EM_SHAPE(2, 2), gr, 0);
        /* scatter / scatter_add along dim 1 into zeros [2, 3] */
        double src[4] = {1, 2, 3, 4};
        em_tensor *ts = tu_tensor(dev, EM_F32, EM_SHAPE(2, 2), src);
        em_tensor *z = em_zeros(dev, EM_F32, EM_SHAPE(2, 3));
        double sr[6] = {2, 0, 1, 0, 4, 0}, sa[6] = {2, 0, 1, 0, 7, 0};
        tu_check("scatter", em_scatter(z, 1, tg, ts), EM_SHAPE(2, 3), sr, 0);
        tu_check("scatter_add", em_scatter_add(z, 1, tg, ts), EM_SHAPE(2, 3), sa, 0);
        em_scope_end(NULL, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_indexing),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
