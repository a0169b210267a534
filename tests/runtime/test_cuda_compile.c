/* test_cuda_compile.c — compiling CUDA through NVRTC without any GPU: hand-written kernels (the
 * driver's launch ABI, shared memory, atomics, warp shuffles, half and bfloat16) to sm_90 cubins
 * and to PTX; a source with an error gives NVRTC's log in the message; malformed architectures
 * are refused; kernels from the CUDA code generator, as the CUDA driver generates them (with its
 * dynamic shared memory symbols), compile for sm_90, one at a time and as a batch. Also checks
 * that the CUDA backend explains itself when it has no device. Every NVRTC test is skipped when
 * NVRTC is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernel/codegen/codegen.h"
#include "runtime/cuda_util.h"
#include "runtime/driver.h"

static void test_handwritten_to_sm90_cubin(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    void *bin = NULL;
    size_t size = 0;
    char *log = NULL;
    em_status st = em_nvrtc_compile(CU_TEST_SOURCE, "sm_90", &log, &bin, &size);
    if (st != EM_OK)
        fail_msg("NVRTC failed: %s", em_last_error());
    assert_non_null(log); /* a log is always handed back, possibly empty */
    assert_true(cu_is_cubin(bin, size, 90));
    /* every kernel and the shared-memory size symbol are in the image */
    const char *names[] = {"axpb",  "block_sum", "atomics",           "halves",
                           "spin", "meta_echo", "emk_smem_block_sum"};
    for (size_t i = 0; i < EM_ARRAY_LEN(names); i++)
        assert_non_null(memmem(bin, size, names[i], strlen(names[i])));
    free(bin);
    free(log);
}

static void test_other_archs_and_ptx(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    const unsigned sms[] = {75, 80, 86, 89, 90};
    for (size_t i = 0; i < EM_ARRAY_LEN(sms); i++) {
        if (!em_nvrtc_supports_arch((int)sms[i]))
            continue;
        char arch[16];
        snprintf(arch, sizeof(arch), "sm_%u", sms[i]);
        void *bin = NULL;
        size_t size = 0;
        if (em_nvrtc_compile(CU_TEST_SOURCE, arch, NULL, &bin, &size) != EM_OK)
            fail_msg("%s: %s", arch, em_last_error());
        assert_true(cu_is_cubin(bin, size, sms[i]));
        free(bin);
    }
    /* sm_90a: the architecture-specific variant the driver uses on compute capability 9.0 */
    void *bin = NULL;
    size_t size = 0;
    if (em_nvrtc_compile(CU_TEST_SOURCE, "sm_90a", NULL, &bin, &size) != EM_OK)
        fail_msg("sm_90a: %s", em_last_error());
    assert_true(cu_is_cubin(bin, size, 90));
    free(bin);
    /* PTX for a virtual architecture: NUL-terminated text */
    assert_int_equal(em_nvrtc_compile(CU_TEST_SOURCE, "compute_90", NULL, &bin, &size), EM_OK);
    assert_true(size > 1);
    assert_int_equal(((char *)bin)[size - 1], '\0');
    assert_non_null(strstr(bin, ".target sm_90"));
    assert_non_null(strstr(bin, ".entry block_sum"));
    free(bin);
}

static void test_compile_error_shows_log(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    const char *bad = "extern \"C\" __global__ void broken(float *x)\n"
                      "{\n"
                      "    x[0] = not_declared_anywhere * 2.0f;\n"
                      "}\n";
    void *bin = (void *)1;
    size_t size = 7;
    char *log = NULL;
    assert_int_equal(em_nvrtc_compile(bad, "sm_90", &log, &bin, &size), EM_ERR_COMPILE);
    assert_null(bin);
    assert_int_equal(size, 0);
    const char *msg = em_last_error();
    assert_non_null(strstr(msg, "NVRTC"));
    assert_non_null(strstr(msg, "sm_90"));
    assert_non_null(strstr(msg, "ember.cu(3)")); /* file and line of the error */
    assert_non_null(strstr(msg, "not_declared_anywhere"));
    assert_non_null(log);
    assert_non_null(strstr(log, "not_declared_anywhere"));
    free(log);
}

static void test_bad_arch_refused(void **state)
{
    (void)state;
    void *bin = NULL;
    size_t size = 0;
    const char *bad[] = {"", "sm90", "sm_", "sm_9", "sm_9000", "compute_", "gfx90a", "sm_90x",
                         "sm_90;rm"};
    for (size_t i = 0; i < EM_ARRAY_LEN(bad); i++) {
        assert_int_equal(em_nvrtc_compile("__global__ void k() {}", bad[i], NULL, &bin, &size),
                         EM_ERR_INVALID);
        assert_non_null(strstr(em_last_error(), "architecture"));
    }
    assert_int_equal(em_nvrtc_compile(NULL, "sm_90", NULL, &bin, &size), EM_ERR_INVALID);
}

static void test_version_and_options(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    int major = 0, minor = -1;
    assert_int_equal(em_nvrtc_version(&major, &minor), EM_OK);
    assert_true(major >= 11);
    assert_true(minor >= 0);
    assert_true(strlen(em_nvrtc_library()) > 0);
    assert_non_null(strstr(em_nvrtc_common_options(), "--std=c++17"));
    assert_true(em_nvrtc_max_arch() >= 75);
    assert_false(em_nvrtc_supports_arch(12)); /* sm_12 never existed for NVRTC */
}

/* ---- generated kernels -------------------------------------------------------------------- */

static em_ir_kernel *axpb_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("axpb_gen");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i);
    em_ir_val s = em_ir_const_float(k, em_ty(EM_F32), 2.5);
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, x, s), y));
    em_ir_end(k);
    return k;
}

typedef em_ir_kernel *(*kernel_maker)(void);
static const kernel_maker MAKERS[] = {axpb_kernel, cu_ir_shared_sum, cu_ir_big_shared_sum,
                                      cu_ir_plane_sum, cu_ir_tensor_scale};

/* The capabilities of an H200. */
static em_caps h200_caps(void)
{
    em_caps caps;
    memset(&caps, 0, sizeof(caps));
    snprintf(caps.target, sizeof(caps.target), "cuda");
    snprintf(caps.arch, sizeof(caps.arch), "sm_90");
    snprintf(caps.device_name, sizeof(caps.device_name), "NVIDIA H200");
    caps.plane_dim = 32;
    caps.max_cube_units = 1024;
    caps.max_cube_dim[0] = caps.max_cube_dim[1] = 1024;
    caps.max_cube_dim[2] = 64;
    caps.max_shared = 232448;
    caps.memory_total = (uint64_t)141 << 30;
    caps.compute_units = 132;
    for (int s = 0; s < EM_SCALAR_COUNT; s++)
        caps.dtype[s] = true;
    caps.float_atomic_add = caps.plane_ops = caps.matrix = caps.print = true;
    return caps;
}

/* What the CUDA driver compiles for ks (verified and simplified in place): the generator's source
 * plus the driver's dynamic shared memory symbols. */
static char *driver_source(em_ir_kernel **ks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (em_ir_verify(ks[i], 0) != EM_OK || em_ir_simplify(ks[i]) != EM_OK)
            fail_msg("%s: %s", em_ir_kernel_name(ks[i]), em_last_error());
    }
    em_caps caps = h200_caps();
    char *src = em_rt_cuda_driver.generate(NULL, (const em_ir_kernel *const *)ks, n, &caps);
    if (!src)
        fail_msg("generating CUDA for %s%s: %s", em_ir_kernel_name(ks[0]), n > 1 ? "..." : "",
                 em_last_error());
    return src;
}

/* Compiles src for sm_90 and checks that every kernel (and symbol) named is in the cubin. */
static void compile_and_find(const char *src, const char *const *names, size_t nnames)
{
    void *bin = NULL;
    size_t size = 0;
    if (em_nvrtc_compile(src, "sm_90", NULL, &bin, &size) != EM_OK) {
        fprintf(stderr, "---- generated source ----\n%s\n----\n", src);
        fail_msg("%s", em_last_error());
    }
    assert_true(cu_is_cubin(bin, size, 90));
    for (size_t i = 0; i < nnames; i++)
        if (!memmem(bin, size, names[i], strlen(names[i])))
            fail_msg("%s is not in the cubin", names[i]);
    free(bin);
}

static void test_ir_kernels_verify(void **state)
{
    (void)state;
    for (size_t i = 0; i < EM_ARRAY_LEN(MAKERS); i++) {
        em_ir_kernel *k = MAKERS[i]();
        assert_non_null(k);
        if (em_ir_verify(k, 0) != EM_OK)
            fail_msg("%s: %s", em_ir_kernel_name(k), em_last_error());
        em_ir_kernel_free(k);
    }
}

static void test_generated_kernels_compile(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    for (size_t i = 0; i < EM_ARRAY_LEN(MAKERS); i++) {
        em_ir_kernel *k = MAKERS[i]();
        char *src = driver_source(&k, 1);
        const char *name = em_ir_kernel_name(k);
        compile_and_find(src, &name, 1);
        free(src);
        em_ir_kernel_free(k);
    }
}

static void test_generated_batch_compiles(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    em_ir_kernel *ks[EM_ARRAY_LEN(MAKERS)];
    const char *names[EM_ARRAY_LEN(MAKERS)];
    for (size_t i = 0; i < EM_ARRAY_LEN(MAKERS); i++)
        ks[i] = MAKERS[i]();
    char *src = driver_source(ks, EM_ARRAY_LEN(ks));
    for (size_t i = 0; i < EM_ARRAY_LEN(MAKERS); i++)
        names[i] = em_ir_kernel_name(ks[i]);
    compile_and_find(src, names, EM_ARRAY_LEN(names));
    free(src);
    for (size_t i = 0; i < EM_ARRAY_LEN(ks); i++)
        em_ir_kernel_free(ks[i]);
}

/* A kernel with more than 48 KiB of shared memory gets its size as a symbol in the module; one
 * within 48 KiB does not. */
static void test_dynamic_shared_memory_symbol(void **state)
{
    (void)state;
    CU_SKIP_WITHOUT_NVRTC();
    em_ir_kernel *ks[2] = {cu_ir_big_shared_sum(), cu_ir_shared_sum()};
    char *src = driver_source(ks, 2);
    assert_true(em_codegen_cuda_dynamic_smem(ks[0]) >= 64 * 1024);
    assert_int_equal(em_codegen_cuda_dynamic_smem(ks[1]), 0);
    char want[128];
    snprintf(want, sizeof(want), "emk_smem_big_shared_sum = %zuu;",
             em_codegen_cuda_dynamic_smem(ks[0]));
    assert_non_null(strstr(src, want));
    assert_null(strstr(src, "emk_smem_shared_sum"));
    const char *names[] = {"big_shared_sum", "shared_sum", "emk_smem_big_shared_sum"};
    compile_and_find(src, names, EM_ARRAY_LEN(names));
    free(src);
    em_ir_kernel_free(ks[0]);
    em_ir_kernel_free(ks[1]);
}

/* ---- the backend without a device --------------------------------------------------------- */

static void test_backend_explains_itself(void **state)
{
    (void)state;
    em_backend_info info[16];
    size_t n = em_backend_list(info, 16);
    const em_backend_info *cuda = NULL;
    for (size_t i = 0; i < n && i < 16; i++)
        if (strcmp(info[i].name, "cuda") == 0)
            cuda = &info[i];
    assert_non_null(cuda);
    if (cuda->device_count > 0) {
        em_device *dev = em_device_open("cuda:0");
        if (!dev)
            fail_msg("cuda has %d devices but cuda:0 does not open: %s", cuda->device_count,
                     em_last_error());
        assert_string_equal(em_device_caps(dev)->target, "cuda");
        em_device_close(dev);
        return;
    }
    /* unavailable: the reason is one of the documented ones, and opening says it too */
    assert_true(strlen(cuda->why) > 0);
    assert_true(strstr(cuda->why, "libcuda.so.1 not found") || strstr(cuda->why, "no CUDA") ||
                strstr(cuda->why, "libnvrtc not found") || strstr(cuda->why, "stub") ||
                strstr(cuda->why, "cuInit failed"));
    assert_null(em_device_open("cuda:0"));
    assert_int_equal(em_last_status(), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), cuda->why));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handwritten_to_sm90_cubin),
        cmocka_unit_test(test_other_archs_and_ptx),
        cmocka_unit_test(test_compile_error_shows_log),
        cmocka_unit_test(test_bad_arch_refused),
        cmocka_unit_test(test_version_and_options),
        cmocka_unit_test(test_ir_kernels_verify),
        cmocka_unit_test(test_generated_kernels_compile),
        cmocka_unit_test(test_generated_batch_compiles),
        cmocka_unit_test(test_dynamic_shared_memory_symbol),
        cmocka_unit_test(test_backend_explains_itself),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
