/* test_graph.c — tensor programs recorded as runtime graphs (em_graph_begin .. em_graph_end around
 * tensor ops through em_tensor_graph_*, docs/graphs.md), on every device present (or $EMBER_TEST_DEVICE): a fused
 * layer (layer norm, matmul with bias and GELU in its epilogue, a residual, a softmax) recorded
 * after an eager warm-up and replayed on new input contents gives the eager results bitwise;
 * temporaries freed inside the recording do not disturb tensors allocated after it; reading a
 * tensor back inside the recording fails the recording, and the tensors stay usable. */
#include "tensor_util.h"

enum { ROWS = 5, IN = 48, OUT = 40 };

typedef struct layer {
    em_tensor *w, *b, *g, *beta;
} layer;

/* softmax(gelu(layer_norm(x) W + b) + x W[:, :OUT]...) — a few kernels of each family. */
static em_tensor *forward(const layer *L, const em_tensor *x)
{
    em_scope_begin();
    em_tensor *h = em_layer_norm(x, 1, L->g, L->beta, 1e-5);
    em_tensor *y = em_gelu(em_take(em_add(em_take(em_matmul(h, L->w)), L->b)));
    em_tensor *r = em_mul_scalar(em_take(em_add(em_take(y), em_narrow(x, 1, 0, OUT))), 0.5);
    em_tensor *out = em_softmax(em_take(r), -1);
    em_scope_end(&out, 1);
    return out;
}

static void set_input(em_tensor *x, uint32_t seed)
{
    double v[ROWS * IN];
    tu_fill(v, ROWS * IN, -2, 2, seed);
    em_scope_begin();
    em_tensor *src = tu_tensor(em_tensor_device(x), EM_F32, EM_SHAPE(ROWS, IN), v);
    assert_int_equal(em_copy_(x, src), EM_OK);
    em_scope_end(NULL, 0);
}

static void read_f32(const em_tensor *t, float *out, size_t n)
{
    assert_int_equal(em_to_host(t, out, n * sizeof(float)), EM_OK);
}

static void test_replay_matches_eager(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        em_scope_begin();
        double vw[IN * OUT], vb[OUT], vg[IN], vbeta[IN];
        tu_fill(vw, IN * OUT, -0.3, 0.3, 3);
        tu_fill(vb, OUT, -0.1, 0.1, 5);
        tu_fill(vg, IN, 0.5, 1.5, 7);
        tu_fill(vbeta, IN, -0.2, 0.2, 9);
        layer L = {tu_tensor(dev, EM_F32, EM_SHAPE(IN, OUT), vw),
                   tu_tensor(dev, EM_F32, EM_SHAPE(OUT), vb),
                   tu_tensor(dev, EM_F32, EM_SHAPE(IN), vg),
                   tu_tensor(dev, EM_F32, EM_SHAPE(IN), vbeta)};
        em_tensor *x = em_zeros(dev, EM_F32, EM_SHAPE(ROWS, IN));
        /* warm-up: every kernel compiled (and any tuning done) before recording */
        set_input(x, 11);
        float eager[3][ROWS * OUT];
        {
            em_tensor *y = forward(&L, x);
            read_f32(y, eager[0], ROWS * OUT);
            em_release(y);
        }
        set_input(x, 12);
        read_f32(forward(&L, x), eager[1], ROWS * OUT);
        set_input(x, 13);
        read_f32(forward(&L, x), eager[2], ROWS * OUT);

        assert_int_equal(em_tensor_graph_begin(dev), EM_OK);
        em_tensor *y = forward(&L, x);
        assert_non_null(y);
        assert_int_equal(em_realize(y), EM_OK);
        em_graph *g = NULL;
        assert_int_equal(em_tensor_graph_end(dev, &g), EM_OK);
        assert_true(em_graph_ops(g) >= 3);
        /* tensors made after the recording do not share the graph's temporaries */
        em_tensor *other = em_full(dev, EM_F32, EM_SHAPE(ROWS, IN), 7.0);
        for (int k = 0; k < 3; k++) {
            set_input(x, 11 + (uint32_t)k);
            assert_int_equal(em_tensor_graph_launch(g), EM_OK);
            float got[ROWS * OUT];
            read_f32(y, got, ROWS * OUT);
            for (int i = 0; i < ROWS * OUT; i++)
                if (got[i] != eager[k][i])
                    fail_msg("%s: replay %d, element %d: %.9g, eager %.9g", em_device_name(dev), k,
                             i, got[i], eager[k][i]);
        }
        float o[ROWS * IN];
        read_f32(other, o, ROWS * IN);
        for (int i = 0; i < ROWS * IN; i++) assert_float_equal(o[i], 7.0f, 0.0f);
        em_graph_free(g);
        em_scope_end(NULL, 0);
    }
}

static void test_read_back_fails_recording(void **state)
{
    (void)state;
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        em_scope_begin();
        em_tensor *x = em_full(dev, EM_F32, EM_SHAPE(3, 4), 2.0);
        assert_int_equal(em_tensor_graph_begin(dev), EM_OK);
        em_tensor *y = em_mul_scalar(x, 3.0);
        float h[12];
        assert_int_not_equal(em_to_host(y, h, sizeof(h)), EM_OK);
        em_graph *g = NULL;
        assert_int_equal(em_tensor_graph_end(dev, &g), EM_ERR_INVALID);
        assert_null(g);
        /* outside the recording the same tensors work (y's kernel was recorded, never run: a
         * fresh product is computed) */
        em_tensor *z = em_mul_scalar(x, 3.0);
        read_f32(z, h, 12);
        for (int i = 0; i < 12; i++) assert_float_equal(h[i], 6.0f, 0.0f);
        em_scope_end(NULL, 0);
    }
}

int main(void)
{
    setenv("EMBER_AUTOTUNE", "off", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_matches_eager),
        cmocka_unit_test(test_read_back_fails_recording),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
