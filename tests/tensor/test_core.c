/* test_core.c — the tensor core on every device present: accessors and em_describe, creation
 * (zeros, ones, full, arange, linspace, eye, from_host, scalar) in every dtype the device holds,
 * em_to_host of strided views, em_item, copies across devices, and integer pow. */
#include "tensor_util.h"

static void test_accessors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_tensor *t = em_zeros(dev, EM_F16, EM_SHAPE(2, 3, 4));
    if (!t) return; /* a device without f16 */
    char buf[64];
    assert_string_equal(em_describe(t, buf, sizeof buf), "f16[2, 3, 4]");
    assert_int_equal(em_rank(t), 3);
    assert_int_equal(em_numel(t), 24);
    assert_int_equal(em_dim(t, -1), 4);
    assert_int_equal(em_stride(t, 0), 12);
    assert_true(em_is_contiguous(t));
    em_tensor *p = em_transpose(t, 0, 2);
    assert_false(em_is_contiguous(p));
    assert_int_equal(em_stride(p, 0), 1);
    assert_ptr_equal(em_tensor_device(p), dev);
    em_tensor *s = em_scalar_tensor(dev, EM_F32, 2);
    assert_string_equal(em_describe(s, buf, sizeof buf), "f32[]");
    em_release(s);
    em_release(p);
    em_release(t);
}

static void test_creation(void **state)
{
    (void)state;
    static const em_scalar types[] = {EM_F32, EM_F16, EM_BF16, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < 8; ti++) {
            em_scalar dt = types[ti];
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            double z[6] = {0}, o[6] = {1, 1, 1, 1, 1, 1}, f[6];
            for (int i = 0; i < 6; i++) f[i] = tu_round(dt, 3);
            tu_check("zeros", em_zeros(dev, dt, EM_SHAPE(2, 3)), EM_SHAPE(2, 3), z, 0);
            tu_check("ones", em_ones(dev, dt, EM_SHAPE(2, 3)), EM_SHAPE(2, 3), o, 0);
            tu_check("full", em_full(dev, dt, EM_SHAPE(3, 2), 3), EM_SHAPE(3, 2), f, 0);
            double e[6] = {1, 0, 0, 0, 1, 0};
            tu_check("eye", em_eye(dev, dt, 2, 3), EM_SHAPE(2, 3), e, 0);
            if (dt != EM_BOOL) {
                double a[4] = {2, 5, 8, 11};
                tu_check("arange", em_arange(dev, dt, 2, 12, 3), EM_SHAPE(4), a, 0);
            }
            em_scope_end(NULL, 0);
        }
        em_scope_begin();
        double ls[5] = {-1, -0.5, 0, 0.5, 1};
        tu_check("linspace", em_linspace(dev, EM_F32, -1, 1, 5), EM_SHAPE(5), ls, 0);
        double ar[3] = {1, 0.5, 0};
        tu_check("arange down", em_arange(dev, EM_F64, 1, -0.25, -0.5), EM_SHAPE(3), ar, 0);
        /* to_host of a strided view gives a row-major copy */
        em_tensor *m = em_view(em_arange(dev, EM_I32, 0, 12, 1), EM_SHAPE(3, 4));
        int32_t got[6];
        assert_int_equal(em_to_host(em_slice(em_transpose(m, 0, 1), 0, 1, 4, 2), got, sizeof got), EM_OK);
        int32_t want[6] = {1, 5, 9, 3, 7, 11};
        assert_memory_equal(got, want, sizeof want);
        assert_true(em_item(em_select(em_select(m, 0, 2), 0, 3)) == 11);
        /* integer pow by squaring */
        double b[5] = {2, 3, -2, 1, 5}, ex[5] = {10, 3, 3, -1, 0}, pr[5] = {1024, 27, -8, 1, 1};
        tu_check("pow i64", em_pow(tu_tensor(dev, EM_I64, EM_SHAPE(5), b), tu_tensor(dev, EM_I64, EM_SHAPE(5), ex)),
                 EM_SHAPE(5), pr, 0);
        /* across devices */
        em_tensor *back = em_to_device(m, tu_devs[0]);
        assert_ptr_equal(em_tensor_device(back), tu_devs[0]);
        assert_true(em_item(em_sum(back, NULL, 0, false)) == 66);
        em_scope_end(NULL, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_creation),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
