/* test_profile_labels.c — EMBER_PROFILE=shapes on the CPU: matmuls are counted per layout, shape
 * and epilogue ("matmul_simt nn 32x24x16 b1 e000": kernel, a's and b's layout, M x N x K, batch,
 * bias / act / residual), the bytes the tensor layer reports for them land on the same labeled
 * rows, other launches keep their kernel's name, and em_profile_label applies only to the calling
 * thread's launches while it is set. The environment variable is set before the first device opens
 * (the profiler reads it then). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "ember/runtime.h"
#include "ember/tensor.h"

/* The figures of the CPU's matmul kernel (whichever the heuristic picked) labeled `label`. */
static bool matmul_row(const char *label, em_profile_kernel *k)
{
    static const char *const kernels[] = {"matmul_simt", "matmul_skinny", "matmul_cpu"};
    char name[128];
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        snprintf(name, sizeof name, "%s %s", kernels[i], label);
        if (em_profile_kernel_get(name, k)) return true;
    }
    return false;
}

static void test_matmul_rows_by_shape(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    assert_non_null(dev);
    assert_true(em_profile_labels_on());
    em_profile_reset();
    em_scope_begin();
    em_tensor *a = em_ones(dev, EM_F32, EM_SHAPE(32, 16));
    em_tensor *b = em_ones(dev, EM_F32, EM_SHAPE(16, 24));
    em_tensor *c = em_ones(dev, EM_F32, EM_SHAPE(24, 16));
    assert_int_equal(em_realize(em_matmul(a, b)), EM_OK);
    em_tensor *ct = em_matmul(em_transpose(c, 0, 1), em_ones(dev, EM_F32, EM_SHAPE(24, 8)));
    assert_non_null(ct);
    assert_int_equal(em_realize(ct), EM_OK);
    assert_int_equal(em_realize(em_add_scalar(a, 1)), EM_OK);
    em_scope_end(NULL, 0);
    em_profile_kernel k;
    assert_true(matmul_row("nn 32x24x16 b1 e000", &k));
    assert_int_equal(k.launches, 1);
    assert_true(k.bytes_read > 0 && k.bytes_written == 32 * 24 * 4);
    assert_true(matmul_row("tn 16x8x24 b1 e000", &k));
    assert_int_equal(k.launches, 1);
    /* the unlabeled kernel name holds nothing of theirs; the operands' fills and the elementwise
     * op keep their kernel's name */
    assert_false(em_profile_kernel_get("matmul_simt", &k) ||
                 em_profile_kernel_get("matmul_skinny", &k));
    assert_false(em_profile_kernel_get("fused nn 32x24x16 b1 e000", &k));
    em_profile_counts tot;
    em_profile_get(&tot);
    assert_true(tot.launches >= 3);
    /* a label set by hand covers this thread's launches until cleared */
    em_profile_label("mine");
    em_profile_add_bytes("some_kernel", 10, 20);
    em_profile_label(NULL);
    em_profile_add_bytes("some_kernel", 1, 2);
    assert_true(em_profile_kernel_get("some_kernel mine", &k));
    assert_int_equal(k.bytes_read, 10);
    assert_true(em_profile_kernel_get("some_kernel", &k));
    assert_int_equal(k.bytes_written, 2);
    em_device_close(dev);
}

int main(void)
{
    setenv("EMBER_PROFILE", "shapes", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matmul_rows_by_shape)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
