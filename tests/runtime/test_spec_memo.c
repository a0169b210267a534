/* test_spec_memo.c — the IR hash a kernel-language module keeps with each specialization
 * (src/kernel/lang/module.c): em_lang_compile finds a kernel by that memoized hash instead of
 * printing and hashing the IR on every call, so the memo must be the hash of the specialization
 * (em_lang_spec_hash against em_ir_hash of a fresh one). The same binding twice, or two spellings
 * of one binding, give the same key and kernel; different bindings (type, comptime value) give
 * different keys and kernels, each the one em_kernel_compile finds for a fresh
 * specialization; and the kernels run right. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ember/lang.h"
#include "kernel/lang/internal.h"
#include "runtime/rt_util.h"

static const char *src = "kernel<F: float> void scale(const tensor(F) x, tensor(F) y,\n"
                         "                            comptime u32 K = 2)\n"
                         "{\n"
                         "    if (ABSOLUTE_POS < len(y)) {\n"
                         "        y[ABSOLUTE_POS] = x[ABSOLUTE_POS] * F(K);\n"
                         "    }\n"
                         "}\n";

/* The kernel em_kernel_compile finds for a fresh specialization (hashing its IR now). */
static em_kernel *fresh(em_device *dev, const em_lang_module *m, const em_lang_spec *spec)
{
    em_ir_kernel *ir = em_lang_specialize(m, "scale", spec, NULL);
    assert_non_null(ir);
    em_kernel *k = em_kernel_compile(dev, ir);
    em_ir_kernel_free(ir);
    assert_non_null(k);
    return k;
}

/* The memoized hash of a binding; checks that it is the hash of a fresh specialization. */
static void memo_hash(const em_lang_module *m, const em_lang_spec *spec, char out[33])
{
    assert_true(em_lang_spec_hash(m, "scale", spec, out));
    em_ir_kernel *ir = em_lang_specialize(m, "scale", spec, NULL);
    assert_non_null(ir);
    char now[33];
    em_ir_hash(ir, now);
    em_ir_kernel_free(ir);
    assert_string_equal(out, now);
}

static void test_same_binding_same_key(void **state)
{
    (void)state;
    em_lang_module *m = em_lang_module_from_string("memo.ek", src, NULL);
    assert_non_null(m);
    em_lang_bind b3[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("K", 3)};
    em_lang_bind b3_text[] = {em_lang_bind_text("F", "f32"), em_lang_bind_text("K", "3")};
    em_lang_bind b5[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("K", 5)};
    em_lang_bind b3_f64[] = {em_lang_bind_type("F", EM_F64), em_lang_bind_int("K", 3)};
    em_lang_spec s3 = {b3, 2, 1, NULL}, s3_text = {b3_text, 2, 1, NULL};
    em_lang_spec s5 = {b5, 2, 1, NULL}, s3_f64 = {b3_f64, 2, 1, NULL};
    char h3[33], again[33], text[33], h5[33], h3_f64[33], lanes4[33];
    memo_hash(m, &s3, h3);
    memo_hash(m, &s3, again);
    memo_hash(m, &s3_text, text);
    assert_string_equal(h3, again);
    assert_string_equal(h3, text);
    memo_hash(m, &s5, h5);
    memo_hash(m, &s3_f64, h3_f64);
    assert_string_not_equal(h5, h3);
    assert_string_not_equal(h3_f64, h3);
    assert_string_not_equal(h3_f64, h5);
    /* a line width the kernel does not use (it has no lines): its own entry, the same key */
    em_lang_spec s3_lanes = {b3, 2, 4, NULL};
    memo_hash(m, &s3_lanes, lanes4);
    assert_string_equal(lanes4, h3);
    assert_false(em_lang_spec_hash(m, "nope", &s3, again));
    em_lang_module_free(m);
}

/* y = x * K through kernel k; checks every element. */
static void run_scale(em_device *dev, em_kernel *k, float factor)
{
    enum { N = 100 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i - 40.0f;
    em_buffer *bx = em_buffer_alloc(dev, sizeof(x)), *by = em_buffer_alloc(dev, sizeof(y));
    assert_non_null(bx);
    assert_non_null(by);
    assert_int_equal(em_buffer_write(bx, 0, x, sizeof(x)), EM_OK);
    em_arg args[] = {em_arg_buffer(bx, N), em_arg_buffer(by, N)};
    uint32_t count[3] = {2, 1, 1}, dim[3] = {64, 1, 1};
    assert_int_equal(em_launch(k, count, dim, args, 2), EM_OK);
    assert_int_equal(em_buffer_read(by, 0, y, sizeof(y)), EM_OK);
    for (int i = 0; i < N; i++) assert_true(y[i] == x[i] * factor);
    em_buffer_free(bx);
    em_buffer_free(by);
}

static void test_memoized_hash_names_the_kernel(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    assert_non_null(dev);
    em_lang_module *m = em_lang_module_from_string("memo.ek", src, NULL);
    assert_non_null(m);

    em_lang_bind b3[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("K", 3)};
    em_lang_bind b3_text[] = {em_lang_bind_text("F", "f32"), em_lang_bind_text("K", "3")};
    em_lang_bind b5[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("K", 5)};
    em_lang_bind b3_f64[] = {em_lang_bind_type("F", EM_F64), em_lang_bind_int("K", 3)};
    em_lang_spec s3 = {b3, 2, 1, NULL}, s3_text = {b3_text, 2, 1, NULL};
    em_lang_spec s5 = {b5, 2, 1, NULL}, s3_f64 = {b3_f64, 2, 1, NULL};

    /* the same binding twice: the same kernel, the one a fresh hash finds */
    em_kernel *k3 = em_lang_compile(dev, m, "scale", &s3);
    assert_non_null(k3);
    em_cache_stats before, after;
    em_cache_stats_get(&before);
    assert_ptr_equal(em_lang_compile(dev, m, "scale", &s3), k3);
    em_cache_stats_get(&after);
    assert_int_equal(after.compiles, before.compiles); /* found in memory, not rebuilt */
    assert_ptr_equal(fresh(dev, m, &s3), k3);
    /* another spelling of the same binding: its own memo entry, the same kernel */
    assert_ptr_equal(em_lang_compile(dev, m, "scale", &s3_text), k3);

    /* different bindings: different kernels, each the one a fresh hash finds */
    em_kernel *k5 = em_lang_compile(dev, m, "scale", &s5);
    em_kernel *k3_f64 = em_lang_compile(dev, m, "scale", &s3_f64);
    assert_non_null(k5);
    assert_non_null(k3_f64);
    assert_ptr_not_equal(k5, k3);
    assert_ptr_not_equal(k3_f64, k3);
    assert_ptr_not_equal(k3_f64, k5);
    assert_ptr_equal(fresh(dev, m, &s5), k5);
    assert_ptr_equal(fresh(dev, m, &s3_f64), k3_f64);
    assert_ptr_equal(em_lang_compile(dev, m, "scale", &s5), k5);

    run_scale(dev, k3, 3.0f);
    run_scale(dev, k5, 5.0f);

    /* an unknown kernel still fails cleanly, and caches nothing */
    assert_null(em_lang_compile(dev, m, "nope", &s3));
    assert_null(em_lang_compile(dev, m, "nope", &s3));
    em_lang_module_free(m);
    em_device_close(dev);
}

/* A module freed and loaded again starts with no memo; a device closed and opened again has no
 * kernels: the memoized hashes of the new module find (or build) the new device's kernels. */
static void test_memo_across_modules_and_devices(void **state)
{
    (void)state;
    em_lang_bind b[] = {em_lang_bind_int("K", 7)};
    em_lang_spec s = {b, 1, 1, NULL};
    for (int round = 0; round < 2; round++) {
        em_device *dev = em_device_open("cpu");
        assert_non_null(dev);
        em_lang_module *m = em_lang_module_from_string("memo.ek", src, NULL);
        assert_non_null(m);
        em_kernel *k = em_lang_compile(dev, m, "scale", &s);
        assert_non_null(k);
        assert_ptr_equal(fresh(dev, m, &s), k);
        run_scale(dev, k, 7.0f);
        em_lang_module_free(m);
        em_device_close(dev);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_binding_same_key),
        cmocka_unit_test(test_memoized_hash_names_the_kernel),
        cmocka_unit_test(test_memo_across_modules_and_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
