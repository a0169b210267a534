/* test_embedding_backward.c — em_embedding_backward (tensor_grad.h), the gradient of an embedding
 * table, on every device present: against a float64 host reference for ids with repeats, ids that
 * never occur, every float dtype and a strided gradient; the same result as the scatter_add into
 * zeros it replaced; and the misuse cases (an id out of range, shapes that do not match), each an
 * error naming what is wrong. */
#include "ember/tensor_grad.h"
#include "tensor_util.h"

enum { N0 = 3, N1 = 7, D = 13, V = 11 };

static void run(em_device *dev, em_scalar dt, bool strided)
{
    em_scope_begin();
    double g[N0 * N1 * D], ref[V * D] = {0};
    tu_fill(g, N0 * N1 * D, -2, 2, 5 + (uint32_t)dt);
    int64_t ids[N0 * N1];
    for (int i = 0; i < N0 * N1; i++) ids[i] = (i * 7 + i / 5) % (V - 2); /* V-2, V-1 never occur */
    ids[4] = ids[9] = ids[17] = 3;                                         /* repeats */
    em_tensor *gt;
    if (strided) { /* g stored [D, N0 * N1], read transposed */
        double st[N0 * N1 * D];
        for (int p = 0; p < N0 * N1; p++)
            for (int c = 0; c < D; c++) st[c * N0 * N1 + p] = g[p * D + c];
        em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(D, N0 * N1), st);
        for (int p = 0; p < N0 * N1; p++)
            for (int c = 0; c < D; c++) g[p * D + c] = st[c * N0 * N1 + p];
        gt = em_transpose(s, 0, 1); /* [N0 * N1, D], strided */
    } else {
        gt = tu_tensor(dev, dt, EM_SHAPE(N0, N1, D), g);
    }
    for (int p = 0; p < N0 * N1; p++)
        for (int c = 0; c < D; c++) ref[ids[p] * D + c] += g[p * D + c];
    for (int i = 0; i < V * D; i++) ref[i] = tu_round(dt, ref[i]);
    em_tensor *it = em_from_host(dev, EM_I64, strided ? EM_SHAPE(N0 * N1) : EM_SHAPE(N0, N1), ids);
    em_tensor *out = em_embedding_backward(gt, it, V);
    char what[96];
    snprintf(what, sizeof what, "embedding_backward %s %s%s", em_device_name(dev),
             em_scalar_name(dt), strided ? " strided" : "");
    double tol = dt == EM_F16 || dt == EM_BF16 ? 1e-2 : tu_tol_on(dev, dt) * 10;
    tu_check(what, out, EM_SHAPE(V, D), ref, tol);
    /* what it replaced: zeros with the rows scatter-added at the ids */
    if (dt == EM_F32) {
        em_tensor *g2 = em_reshape(gt, EM_SHAPE(N0 * N1, D));
        em_tensor *idx = em_contiguous(em_expand(em_reshape(it, EM_SHAPE(N0 * N1, 1)),
                                                 EM_SHAPE(N0 * N1, D)));
        em_tensor *old = em_scatter_add(em_zeros(dev, dt, EM_SHAPE(V, D)), 0, idx, em_contiguous(g2));
        double *a = tu_read(out), *b = tu_read(old);
        if (!tu_close_n("embedding_backward vs scatter_add", a, b, V * D, 1e-5))
            fail_msg("%s differs from scatter_add", what);
        free(a);
        free(b);
    }
    em_scope_end(NULL, 0);
}

static void test_values(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < sizeof tu_float_types / sizeof tu_float_types[0]; t++) {
            if (!tu_has(tu_devs[di], tu_float_types[t])) continue;
            run(tu_devs[di], tu_float_types[t], false);
            run(tu_devs[di], tu_float_types[t], true);
        }
}

static void test_misuse(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    double g[4 * D];
    tu_fill(g, 4 * D, -1, 1, 3);
    em_tensor *gt = tu_tensor(dev, EM_F32, EM_SHAPE(4, D), g);
    int64_t bad[4] = {0, 1, V, 2}, ok[4] = {0, 1, 2, 3};
    tu_expect_error(em_embedding_backward(gt, em_from_host(dev, EM_I64, EM_SHAPE(4), bad), V),
                    "out of range");
    em_tensor *it = em_from_host(dev, EM_I64, EM_SHAPE(4), ok);
    tu_expect_error(em_embedding_backward(gt, em_reshape(it, EM_SHAPE(2, 2)), V), "f32[4, 13]");
    tu_expect_error(em_embedding_backward(em_cast(gt, EM_I32), it, V), "float grad");
    tu_expect_error(em_embedding_backward(gt, it, 0), "0 embeddings");
    assert_null(em_embedding_backward(NULL, it, V));
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
