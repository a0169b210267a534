/* test_trusted_indices.c — the trusted-index mode (src/tensor/ops_index_device.c) on every device
 * present: an embedding lookup, its gradient (the stable sort by id done on the device, with
 * repeated ids, unused ids and the last id) and a cross-entropy over the looked-up rows give the
 * same loss and gradient bitwise as the checked forms; inside the mode nothing is read back (a
 * recording of the whole forward and backward succeeds and its replay equals the eager run);
 * out-of-range ids are clamped instead of reported. */
#include "tensor/tensor_util.h"

#include "ember/autodiff.h"
#include "ember/tensor_grad.h"
#include "ember/nn.h"
#include "ember/runtime.h"

#define V 13
#define D 6
#define N 40

static void ids_of(int32_t *ids, uint32_t seed)
{
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + seed * 3 + (i % 5) * (i % 3)) % V);
    ids[N - 1] = V - 1;
}

/* loss of cross_entropy(rows of w at ids, targets) and w's gradient (into grad[V * D]). */
static double loss_and_grad(em_device *dev, em_tensor *w, const int32_t *ids, const int32_t *tg,
                            double *grad)
{
    em_scope_begin();
    em_tensor *x = em_from_host(dev, EM_I32, EM_SHAPE(N), ids);
    em_tensor *y = em_from_host(dev, EM_I32, EM_SHAPE(N), tg);
    em_tensor *l = em_cross_entropy(em_embedding(w, x), y, -100, 0.0, EM_REDUCE_MEAN);
    assert_non_null(l);
    assert_int_equal(em_backward(l, NULL), EM_OK);
    double loss = em_item(l);
    double *g = tu_read(em_grad(w));
    memcpy(grad, g, sizeof(double) * V * D);
    free(g);
    em_zero_grad(w);
    em_scope_end(NULL, 0);
    return loss;
}

static void test_same_as_checked(void **state)
{
    (void)state;
    for (int k = 0; k < tu_ndev; k++) {
        em_device *dev = tu_devs[k];
        double wv[V * D];
        tu_fill(wv, V * D, -1, 1, 3);
        em_tensor *w = tu_tensor(dev, EM_F32, EM_SHAPE(V, D), wv);
        em_set_requires_grad(w, true);
        int32_t ids[N], tg[N];
        ids_of(ids, 1);
        for (int i = 0; i < N; i++) tg[i] = (i * 5 + 1) % D;
        double g1[V * D], g2[V * D];
        double l1 = loss_and_grad(dev, w, ids, tg, g1);
        em_trusted_indices_begin();
        assert_true(em_trusted_indices());
        double l2 = loss_and_grad(dev, w, ids, tg, g2);
        em_trusted_indices_end();
        assert_false(em_trusted_indices());
        assert_true(l1 == l2);
        assert_memory_equal(g1, g2, sizeof g1);
        /* out of range: an error checked, clamped (to V - 1) trusted */
        ids[0] = V + 4;
        em_tensor *x = em_from_host(dev, EM_I32, EM_SHAPE(N), ids);
        assert_null(em_embedding(w, x));
        em_clear_error();
        em_trusted_indices_begin();
        em_tensor *e = em_embedding(w, x);
        em_trusted_indices_end();
        assert_non_null(e);
        double *ev = tu_read(e);
        for (int d = 0; d < D; d++) assert_true(ev[d] == tu_round(EM_F32, wv[(V - 1) * D + d]));
        free(ev);
        em_release(e);
        em_release(x);
        em_release(w);
    }
}

/* The trusted forward and backward record as a graph (nothing read back); a replay after new ids
 * are written gives the eager gradient of those ids. */
static void test_records(void **state)
{
    (void)state;
    for (int k = 0; k < tu_ndev; k++) {
        em_device *dev = tu_devs[k];
        double wv[V * D];
        tu_fill(wv, V * D, -1, 1, 4);
        em_tensor *w = tu_tensor(dev, EM_F32, EM_SHAPE(V, D), wv);
        em_set_requires_grad(w, true);
        int32_t ids[N], ids2[N], tg[N];
        ids_of(ids, 1);
        ids_of(ids2, 2);
        for (int i = 0; i < N; i++) tg[i] = (i * 3 + 2) % D;
        double gref[V * D];
        loss_and_grad(dev, w, ids2, tg, gref); /* eager, also compiles every kernel */
        em_tensor *x = em_from_host(dev, EM_I32, EM_SHAPE(N), ids);
        em_tensor *y = em_from_host(dev, EM_I32, EM_SHAPE(N), tg);
        em_tensor *gout = em_zeros(dev, EM_F32, EM_SHAPE(V, D));
        em_trusted_indices_begin();
        assert_int_equal(em_tensor_graph_begin(dev), EM_OK);
        em_scope_begin();
        em_tensor *l = em_cross_entropy(em_embedding(w, x), y, -100, 0.0, EM_REDUCE_MEAN);
        assert_non_null(l);
        assert_int_equal(em_backward(l, NULL), EM_OK);
        assert_int_equal(em_copy_(gout, em_grad(w)), EM_OK);
        em_zero_grad(w);
        em_scope_end(NULL, 0);
        em_graph *g = NULL;
        em_status st = em_tensor_graph_end(dev, &g);
        em_trusted_indices_end();
        if (st != EM_OK) fprintf(stderr, "recording failed: %s\n", em_last_error());
        assert_int_equal(st, EM_OK);
        em_scope_begin();
        assert_int_equal(em_copy_(x, em_from_host(dev, EM_I32, EM_SHAPE(N), ids2)), EM_OK);
        em_scope_end(NULL, 0);
        assert_int_equal(em_tensor_graph_launch(g), EM_OK);
        double *got = tu_read(gout);
        assert_memory_equal(got, gref, sizeof gref);
        free(got);
        em_graph_free(g);
        em_release(gout);
        em_release(x);
        em_release(y);
        em_release(w);
        em_clear_error();
    }
}

/* The device's stable sort of the ids (tensor_ids_sort) over more ids than one cube's chunk,
 * the last chunk part full, many repeats and i64 ids: the embedding gradient equals the host's
 * counting sort's bit for bit. */
static void test_many_ids(void **state)
{
    (void)state;
    enum { NM = 300, VM = 50, DM = 4 };
    for (int k = 0; k < tu_ndev; k++) {
        em_device *dev = tu_devs[k];
        em_scope_begin();
        int64_t ids[NM];
        double gv[NM * DM];
        for (int i = 0; i < NM; i++) ids[i] = (i * 37 + i / 7) % VM;
        tu_fill(gv, NM * DM, -1, 1, 9);
        em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(NM), ids);
        em_tensor *g = tu_tensor(dev, EM_F32, EM_SHAPE(NM, DM), gv);
        em_tensor *host = em_embedding_backward(g, x, VM);
        em_trusted_indices_begin();
        em_tensor *device = em_embedding_backward(g, x, VM);
        em_trusted_indices_end();
        assert_non_null(host);
        assert_non_null(device);
        double *a = tu_read(host), *b = tu_read(device);
        assert_memory_equal(a, b, sizeof(double) * VM * DM);
        free(a);
        free(b);
        em_scope_end(NULL, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_checked),
        cmocka_unit_test(test_many_ids),
        cmocka_unit_test(test_records),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
