/* test_index_device.c — the indexing ops whose indices stay on the device (ops_index.c):
 * em_embedding_clamped gathers rows with out-of-range ids clamped into the table, and
 * em_scatter_rows_ writes one slice per row at a per-row position in place (into a view, from a
 * strided source), leaving rows with an out-of-range position and everything else untouched;
 * neither reads anything back to the host (the profiler counts device -> host reads), where
 * em_embedding does; misuse is an error naming the shapes. On every device present. */
#include "tensor_util.h"

enum { V = 7, D = 5 };

/* The clamped embedding of i64 and i32 ids (some below 0, some past V) equals the rows picked on
 * the host, exactly, and reads nothing back. */
static void run_embedding(em_device *dev, em_scalar it)
{
    em_scope_begin();
    double w[V * D];
    tu_fill(w, V * D, -2, 2, 7);
    em_tensor *wt = tu_tensor(dev, EM_F32, EM_SHAPE(V, D), w);
    double ids[6] = {3, -2, 9, 0, 6, 7}, ref[6 * D];
    em_tensor *idt = tu_tensor(dev, it, EM_SHAPE(2, 3), ids);
    assert_int_equal(em_flush(), EM_OK);
    em_profile_reset();
    em_profile_enable(true);
    em_tensor *out = em_embedding_clamped(wt, idt);
    assert_non_null(out);
    assert_int_equal(em_realize(out), EM_OK);
    em_profile_counts c;
    em_profile_get(&c);
    assert_int_equal(c.reads, 0);
    assert_non_null(em_embedding(wt, em_clamp(idt, 0, V - 1))); /* the checked op reads back */
    em_profile_get(&c);
    assert_true(c.reads >= 1);
    em_profile_enable(false);
    for (int i = 0; i < 6; i++) {
        int r = ids[i] < 0 ? 0 : ids[i] > V - 1 ? V - 1 : (int)ids[i];
        memcpy(ref + i * D, w + r * D, sizeof(double) * D);
    }
    tu_check("embedding_clamped", out, EM_SHAPE(2, 3, D), ref, 0);
    em_scope_end(NULL, 0);
}

static void test_embedding_clamped(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        run_embedding(tu_devs[di], EM_I64);
        run_embedding(tu_devs[di], EM_I32);
    }
}

/* A cache-like dst [4, 2, 3, 6, 2]; rows 0..2 (a view) get src [3, 2, 3, 1, 2] at positions
 * {5, 6 (out of range: nothing), 0}, src being a strided view (every other element of a bigger
 * tensor along the last dim); row 3 and every other position keep their values. */
static void run_scatter_rows(em_device *dev, em_scalar it)
{
    em_scope_begin();
    enum { N = 4 * 2 * 3 * 6 * 2, S = 3 * 2 * 3 * 1 * 2 };
    double d[N], big[2 * S], ref[N];
    tu_fill(d, N, -1, 1, 11);
    tu_fill(big, 2 * S, 2, 3, 12);
    em_tensor *dst = tu_tensor(dev, EM_F32, EM_SHAPE(4, 2, 3, 6, 2), d);
    em_tensor *bigt = tu_tensor(dev, EM_F32, EM_SHAPE(3, 2, 3, 1, 4), big);
    em_tensor *src = em_narrow(bigt, 4, 1, 2); /* strided: [3, 2, 3, 1, 2] of [.., 4] */
    double pos[3] = {5, 6, 0};
    em_tensor *pt = tu_tensor(dev, it, EM_SHAPE(3), pos);
    em_tensor *rows = em_narrow(dst, 0, 0, 3);
    assert_int_equal(em_flush(), EM_OK);
    em_profile_reset();
    em_profile_enable(true);
    assert_int_equal(em_scatter_rows_(rows, 3, pt, src), EM_OK);
    assert_int_equal(em_realize(dst), EM_OK);
    em_profile_counts c;
    em_profile_get(&c);
    em_profile_enable(false);
    assert_int_equal(c.reads, 0);
    memcpy(ref, d, sizeof ref);
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < 3; h++)
                for (int e = 0; e < 2; e++) {
                    if (pos[r] < 0 || pos[r] >= 6) continue;
                    int at = (int)pos[r];
                    ref[(((r * 2 + k) * 3 + h) * 6 + at) * 2 + e] =
                        big[(((r * 2 + k) * 3 + h) * 1) * 4 + 1 + e];
                }
    tu_check("scatter_rows_", dst, EM_SHAPE(4, 2, 3, 6, 2), ref, 0);
    em_scope_end(NULL, 0);
}

static void test_scatter_rows(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        run_scatter_rows(tu_devs[di], EM_I64);
        run_scatter_rows(tu_devs[di], EM_I32);
    }
}

static void expect_status(em_status st, const char *part)
{
    assert_int_equal(st, EM_ERR_INVALID);
    if (!strstr(em_last_error(), part))
        fail_msg("error '%s' does not mention '%s'", em_last_error(), part);
}

static void test_misuse(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *dst = em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 4));
    em_tensor *src = em_ones(dev, EM_F32, EM_SHAPE(2, 1, 4));
    int64_t p[2] = {0, 1};
    em_tensor *pt = em_from_host(dev, EM_I64, EM_SHAPE(2), p);
    expect_status(em_scatter_rows_(dst, 0, pt, src), "dim 0");
    expect_status(em_scatter_rows_(dst, 1, pt, em_ones(dev, EM_F32, EM_SHAPE(2, 2, 4))),
                  "f32[2, 2, 4]");
    expect_status(em_scatter_rows_(dst, 1, pt, em_ones(dev, EM_F32, EM_SHAPE(2, 1, 3))),
                  "f32[2, 3, 4]");
    expect_status(em_scatter_rows_(dst, 1, em_narrow(pt, 0, 0, 1), src), "i64[1]");
    expect_status(em_scatter_rows_(dst, 1, em_cast(pt, EM_F32), src), "i32 or i64");
    expect_status(em_scatter_rows_(dst, 1, pt, em_cast(src, EM_F64)), "f64");
    expect_status(em_scatter_rows_(dst, 3, pt, src), "dim");
    assert_int_not_equal(em_scatter_rows_(NULL, 1, pt, src), EM_OK);
    em_tensor *w = em_zeros(dev, EM_F32, EM_SHAPE(3, 2));
    tu_expect_error(em_embedding_clamped(em_reshape(w, EM_SHAPE(6)), pt), "2-D");
    tu_expect_error(em_embedding_clamped(w, em_cast(pt, EM_F32)), "i32 or i64");
    tu_expect_error(em_embedding_clamped(em_zeros(dev, EM_F32, EM_SHAPE(0, 2)), pt),
                    "nothing to select");
    assert_null(em_embedding_clamped(NULL, pt));
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_clamped),
        cmocka_unit_test(test_scatter_rows),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests_name("index_device", tests, tu_setup, tu_teardown);
}
