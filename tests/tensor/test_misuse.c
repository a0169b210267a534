/* test_misuse.c — the tensor layer's errors: each misuse returns NULL (or an error status) with
 * a message that names what is wrong (both shapes of a mismatch, the dtypes, the devices, the
 * dim or index out of range); a NULL input propagates through a chain without replacing the
 * first error; scopes release every temporary (the ASan build's LeakSanitizer checks that nothing
 * leaks) and keep what is kept; and the pool holds no buffer once everything is released. */
#include "tensor_util.h"

static em_device *cpu(void) { return tu_devs[0]; }

static void test_messages(void **state)
{
    (void)state;
    em_device *dev = cpu();
    em_scope_begin();
    em_tensor *a = em_zeros(dev, EM_F32, EM_SHAPE(2, 3));
    em_tensor *b = em_zeros(dev, EM_F32, EM_SHAPE(4));
    em_tensor *h = em_zeros(dev, EM_F64, EM_SHAPE(2, 3));
    em_tensor *i = em_zeros(dev, EM_I32, EM_SHAPE(2, 3));
    em_tensor *bo = em_zeros(dev, EM_BOOL, EM_SHAPE(2, 3));
    /* 1-3: shapes */
    tu_expect_error(em_add(a, b), "add: shapes f32[2, 3] and f32[4] cannot be broadcast");
    tu_expect_error(em_matmul(a, a), "matmul: shapes f32[2, 3] and f32[2, 3] do not match (inner dims 3 and 2)");
    tu_expect_error(em_where(bo, a, b), "where: shapes f32[2, 3] and f32[4] cannot be broadcast");
    /* 4-6: dtypes (different dtypes are promoted, f32 * f64 -> f64; bool - bool is refused) */
    em_tensor *ah = em_mul(a, h);
    assert_non_null(ah);
    assert_int_equal(em_dtype(ah), EM_F64);
    tu_expect_error(em_sub(bo, bo), "sub: not defined for bool tensors");
    tu_expect_error(em_exp(i), "exp: needs a floating-point tensor, got i32");
    tu_expect_error(em_where(a, a, a), "where: the condition must be bool, got f32");
    /* 7-10: dims */
    tu_expect_error(em_sum(a, (int[]){2}, 1, false), "sum: dim 2 is out of range for a tensor of rank 2 (expected -2..1)");
    tu_expect_error(em_softmax(a, -3), "softmax: dim -3 is out of range for a tensor of rank 2 (expected -2..1)");
    tu_expect_error(em_transpose(a, 0, 5), "transpose: dim 5 is out of range");
    tu_expect_error(em_sum(a, (int[]){1, -1}, 2, false), "sum: dim 1 appears more than once");
    /* 11-14: indices */
    double bad[2] = {0, 7};
    em_tensor *idx = tu_tensor(dev, EM_I64, EM_SHAPE(2), bad);
    tu_expect_error(em_index_select(a, 1, idx), "index_select: index 7 is out of range for a dim of size 3");
    tu_expect_error(em_embedding(a, idx), "embedding: index 7 is out of range for a dim of size 2");
    tu_expect_error(em_index_select(a, 0, a), "index_select: the index must be 1-D, got f32[2, 3]");
    tu_expect_error(em_select(a, 0, 2), "select: index 2 is out of range for dim 0 of size 2");
    /* 15-20: layout */
    tu_expect_error(em_view(a, EM_SHAPE(4, 2)), "view: cannot view f32[2, 3] (6 elements) as f32[4, 2]");
    tu_expect_error(em_expand(a, EM_SHAPE(4, 3)), "expand: cannot expand f32[2, 3] to f32[4, 3]");
    tu_expect_error(em_permute(a, (int[]){0, 0}, 2), "permute: dim 0 appears twice");
    tu_expect_error(em_cat((em_tensor *[]){a, b}, 2, 0), "cat: tensors f32[2, 3] and f32[4] do not match outside dim 0");
    tu_expect_error(em_narrow(a, 1, 2, 2), "narrow: [2, 4) is out of range for dim 1 of size 3");
    tu_expect_error(em_slice(a, 0, 0, 2, 0), "slice: step must be at least 1, got 0");
    /* 21-25: others */
    tu_expect_error(em_layer_norm(a, 1, b, NULL, 1e-5), "layer_norm: weight f32[4] does not match the normalized dims of f32[2, 3]");
    tu_expect_error(em_zeros(dev, EM_F32, EM_SHAPE(2, -1)), "full: negative size -1 in dim 1");
    tu_expect_error(em_cast(a, EM_U32), "cast: unsupported dtype u32");
    tu_expect_error(em_mean(i, NULL, 0, false), "mean: needs a floating-point tensor, got i32");
    em_rng rng = em_rng_new(1);
    tu_expect_error(em_randint(dev, EM_I32, EM_SHAPE(3), 5, 5, &rng), "randint: bad range [5, 5)");
    /* 26-30 */
    tu_expect_error(em_add(bo, bo), "add: not defined for bool tensors");
    tu_expect_error(em_conv2d(a, a, NULL, 1, 0, 1, 1), "conv2d: input f32[2, 3] and weight f32[2, 3] do not fit");
    assert_int_equal(em_topk(a, 4, 1, true, NULL, NULL), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "topk: k = 4 is out of range for a dim of size 3"));
    assert_true(isnan(em_item(a)));
    assert_non_null(strstr(em_last_error(), "item: f32[2, 3] has 6 elements, not one"));
    char small[4];
    assert_int_equal(em_to_host(a, small, sizeof small), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "to_host: f32[2, 3] needs 24 bytes, the destination has 4"));
    tu_expect_error(em_pad(a, (int64_t[]){1}, 1, 0), "pad: 1 pad values for a tensor of rank 2");
    em_scope_end(NULL, 0);
}

static void test_device_mismatch(void **state)
{
    (void)state;
    if (tu_ndev < 2) return;
    em_scope_begin();
    em_tensor *a = em_zeros(tu_devs[0], EM_F32, EM_SHAPE(2));
    em_tensor *b = em_zeros(tu_devs[1], EM_F32, EM_SHAPE(2));
    char want[128];
    snprintf(want, sizeof want, "add: tensors are on different devices (%s and %s)", em_device_name(tu_devs[0]),
             em_device_name(tu_devs[1]));
    tu_expect_error(em_add(a, b), want);
    /* moving one fixes it */
    em_tensor *b0 = em_to_device(b, tu_devs[0]);
    assert_non_null(em_add(a, b0));
    em_scope_end(NULL, 0);
}

static void test_null_propagation(void **state)
{
    (void)state;
    em_device *dev = cpu();
    em_scope_begin();
    em_tensor *a = em_zeros(dev, EM_F32, EM_SHAPE(2, 3));
    em_tensor *b = em_zeros(dev, EM_F32, EM_SHAPE(5));
    /* the first failure's message survives the rest of the chain */
    em_tensor *y = em_softmax(em_gelu(em_matmul(em_add(a, b), a)), -1);
    tu_expect_error(y, "add: shapes f32[2, 3] and f32[5] cannot be broadcast");
    assert_null(em_sum(NULL, NULL, 0, false));
    assert_null(em_cat((em_tensor *[]){a, NULL}, 2, 0));
    assert_null(em_where(NULL, a, a));
    assert_null(em_reshape(NULL, EM_SHAPE(6)));
    assert_null(em_cast(NULL, EM_F16));
    assert_int_equal(em_rank(NULL), -1);
    assert_non_null(strstr(em_last_error(), "add: shapes"));
    em_scope_end(NULL, 0);
}

static void test_scopes_release(void **state)
{
    (void)state;
    em_device *dev = cpu();
    em_device_pool_trim(dev);
    em_pool_stats s0, s1;
    em_device_pool_stats(dev, &s0);
    em_tensor *kept;
    em_scope_begin();
    {
        em_tensor *x = em_ones(dev, EM_F32, EM_SHAPE(4, 4));
        em_scope_begin();
        em_tensor *inner = em_mul_scalar(em_exp(x), 2); /* temporaries of the inner scope */
        em_tensor *k = em_keep(em_sum(inner, NULL, 0, false)); /* moves to the outer scope */
        em_release(em_retain(inner));                           /* balanced: no effect */
        em_scope_end(NULL, 0);
        assert_true(fabs(em_item(k) - 16 * 2 * exp(1.0)) < 1e-3);
        em_tensor *t = em_transpose(x, 0, 1);
        em_release(t); /* an explicit release inside a scope is fine */
        kept = em_add_scalar(x, 1);
        em_scope_end(&kept, 1); /* kept survives; the outer scope releases the rest */
    }
    em_tensor *total = em_sum(kept, NULL, 0, false); /* outside any scope: the caller releases it */
    assert_true(em_item(total) == 32);
    em_release(total);
    em_release(kept);
    em_device_pool_stats(dev, &s1);
    assert_int_equal(s1.bytes_in_use, s0.bytes_in_use);
    em_clear_error();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_device_mismatch),
        cmocka_unit_test(test_null_propagation),
        cmocka_unit_test(test_scopes_release),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
