/* test_cuda_driver.c — the CUDA driver on a real GPU: capabilities; buffer round trips through
 * the pinned staging ring (1 byte to several staging slots, odd offsets, device copies);
 * out-of-memory reported as EM_ERR_NOMEM; hand-written kernels run through the driver's
 * build/load/function/launch (strided elementwise with scalars of every width, the metadata ring
 * over thousands of unsynchronized launches, a block reduction in more than 48 KiB of dynamic
 * shared memory, integer and float atomics with warp shuffles, half and bfloat16); corrupt and
 * truncated cubins refused with EM_ERR_CORRUPT; timing events; refused launches; and generated
 * kernels through em_kernel_compile / em_launch (elementwise with a disk-cache hit, plane and
 * shared-memory reductions, one in 64 KiB of dynamic shared memory, a transposed rank-2 tensor
 * with an f16 input). The device is $EMBER_TEST_DEVICE when it names a CUDA device, else cuda:0;
 * every test is skipped when the machine has none (scripts/gpu-test.sh runs them on the GPU). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/cuda_util.h"
#include "runtime/rt.h"
#include "runtime/rt_util.h"

/* Opens the CUDA test device, or skips the test (saying why) when the machine has none. */
static em_device *open_or_skip(void)
{
    em_backend_info info[16];
    size_t n = em_backend_list(info, 16);
    for (size_t i = 0; i < n && i < 16; i++) {
        if (strcmp(info[i].name, "cuda") == 0 && info[i].device_count == 0) {
            fprintf(stderr, "skipped: no CUDA device (%s)\n", info[i].why);
            skip();
        }
    }
    em_device *dev = em_device_open(cu_test_device());
    if (!dev)
        fail_msg("em_device_open(%s): %s", cu_test_device(), em_last_error());
    return dev;
}

/* A module built from CU_TEST_SOURCE through the driver (build into a temp file, load). */
typedef struct test_module {
    void *module;   /* the driver's module */
    char path[1200]; /* the cubin */
} test_module;

static void build_module(em_device *dev, test_module *m, const char *source)
{
    char dir[1024];
    rt_fresh_dir("cuda", dir, sizeof(dir));
    assert_true(dir[0] != '\0');
    snprintf(m->path, sizeof(m->path), "%s/test.cubin", dir);
    if (dev->drv->build(dev->state, source, m->path) != EM_OK)
        fail_msg("build: %s", em_last_error());
    if (dev->drv->load(dev->state, m->path, &m->module) != EM_OK)
        fail_msg("load: %s", em_last_error());
}

static void *function(em_device *dev, test_module *m, const char *name)
{
    void *fn = NULL;
    if (dev->drv->function(dev->state, m->module, name, &fn) != EM_OK)
        fail_msg("function %s: %s", name, em_last_error());
    return fn;
}

/* A launch argument for a whole buffer of n elements of scalar s (rank 0). */
static em_drv_arg buf_arg(em_buffer *b, em_scalar s, uint64_t n)
{
    em_drv_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_BUFFER;
    a.type = em_ty(s);
    a.mem = b->mem;
    a.len = n;
    return a;
}

static em_drv_arg float_arg(em_scalar s, double v)
{
    em_drv_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_SCALAR;
    a.type = em_ty(s);
    a.value.f = v;
    return a;
}

static em_drv_arg int_arg(em_scalar s, int64_t v)
{
    em_drv_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_SCALAR;
    a.type = em_ty(s);
    a.value.i = v;
    return a;
}

static void launch(em_device *dev, void *fn, uint32_t cubes, uint32_t units, const em_drv_arg *args,
                   size_t nargs)
{
    em_drv_launch L = {{cubes, 1, 1}, {units, 1, 1}, args, nargs};
    if (dev->drv->launch(dev->state, fn, &L) != EM_OK)
        fail_msg("launch: %s", em_last_error());
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_caps(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const em_caps *c = em_device_caps(dev);
    assert_string_equal(c->target, "cuda");
    assert_true(strncmp(c->arch, "sm_", 3) == 0);
    assert_int_equal(c->plane_dim, 32);
    assert_true(c->max_cube_units >= 1024);
    assert_true(c->max_cube_dim[0] >= 1024 && c->max_cube_dim[2] >= 64);
    assert_true(c->max_shared >= 48 * 1024);
    assert_true(c->memory_total > ((uint64_t)1 << 30));
    assert_true(c->compute_units >= 1);
    assert_true(c->dtype[EM_F32] && c->dtype[EM_F64] && c->dtype[EM_I64] && c->dtype[EM_U8]);
    assert_true(c->float_atomic_add && c->plane_ops && c->print);
    assert_non_null(strstr(c->device_name, "NVRTC"));
    if (strcmp(c->arch, "sm_90") == 0) { /* the H200 */
        assert_true(c->matrix && c->dtype[EM_F16] && c->dtype[EM_BF16]);
        assert_true(c->max_shared > 200 * 1024);
    }
    fprintf(stderr, "device: %s (%s), %u SMs\n", c->device_name, c->arch, c->compute_units);
    em_device_close(dev);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

static void test_round_trips(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const size_t sizes[] = {1, 3, 256, 4097, (1u << 20) + 5, ((size_t)8 << 20),
                            ((size_t)8 << 20) + 1, ((size_t)37 << 20) + 11};
    for (size_t s = 0; s < EM_ARRAY_LEN(sizes); s++) {
        size_t n = sizes[s], off = s % 2 ? 13 : 0;
        unsigned char *src = malloc(n), *orig = malloc(n), *dst = malloc(n + 1);
        assert_non_null(src);
        assert_non_null(orig);
        assert_non_null(dst);
        fill(src, n, (unsigned)s);
        memcpy(orig, src, n);
        em_buffer *b = em_buffer_alloc(dev, n + off);
        assert_non_null(b);
        assert_int_equal(em_buffer_write(b, off, src, n), EM_OK);
        memset(src, 0x5A, n); /* the caller may reuse its memory as soon as write returns */
        memset(dst, 0xEE, n + 1);
        assert_int_equal(em_buffer_read(b, off, dst, n), EM_OK);
        assert_memory_equal(orig, dst, n);
        assert_int_equal(dst[n], 0xEE);
        /* a device copy into a second buffer, at another offset */
        em_buffer *c = em_buffer_alloc(dev, n + 7);
        assert_non_null(c);
        assert_int_equal(em_buffer_copy(c, 7, b, off, n), EM_OK);
        memset(dst, 0, n);
        assert_int_equal(em_buffer_read(c, 7, dst, n), EM_OK);
        assert_memory_equal(orig, dst, n);
        em_buffer_free(b);
        em_buffer_free(c);
        free(src);
        free(orig);
        free(dst);
    }
    /* many small writes back to back wrap the staging ring several times */
    em_buffer *b = em_buffer_alloc(dev, 4096 * sizeof(uint32_t));
    assert_non_null(b);
    for (uint32_t i = 0; i < 4096; i++)
        assert_int_equal(em_buffer_write(b, i * sizeof(uint32_t), &i, sizeof(i)), EM_OK);
    uint32_t *back = malloc(4096 * sizeof(uint32_t));
    assert_int_equal(em_buffer_read(b, 0, back, 4096 * sizeof(uint32_t)), EM_OK);
    for (uint32_t i = 0; i < 4096; i++)
        assert_int_equal(back[i], i);
    free(back);
    em_buffer_free(b);
    em_device_close(dev);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    uint64_t total = em_device_caps(dev)->memory_total;
    em_buffer *b = em_buffer_alloc(dev, (size_t)(total * 2));
    assert_null(b);
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    fprintf(stderr, "as expected: %s\n", em_last_error());
    /* the device still works afterwards */
    b = em_buffer_alloc(dev, 1024);
    assert_non_null(b);
    em_buffer_free(b);
    em_device_close(dev);
}

static void test_elementwise_kernel(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "axpb");
    const uint32_t n = 100003;
    float *a = malloc(n * sizeof(float)), *b = malloc(2 * n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    for (uint32_t i = 0; i < n; i++) {
        a[i] = (float)i * 0.25f;
        b[2 * i] = (float)(n - i);
        b[2 * i + 1] = -1e30f; /* skipped by the stride */
    }
    em_buffer *ba = em_buffer_alloc(dev, n * sizeof(float));
    em_buffer *bb = em_buffer_alloc(dev, 2 * n * sizeof(float) + 4);
    em_buffer *bo = em_buffer_alloc(dev, n * sizeof(float));
    assert_int_equal(em_buffer_write(ba, 0, a, n * sizeof(float)), EM_OK);
    assert_int_equal(em_buffer_write(bb, 4, b, 2 * n * sizeof(float)), EM_OK);
    int64_t shape[1] = {n}, stride[1] = {2};
    em_drv_arg args[4] = {buf_arg(ba, EM_F32, n), buf_arg(bb, EM_F32, 2 * n),
                          buf_arg(bo, EM_F32, n), float_arg(EM_F32, 3.0)};
    args[1].offset = 4; /* element 0 is one float in */
    args[1].rank = 1;
    args[1].shape = shape;
    args[1].stride = stride;
    launch(dev, fn, (n + 255) / 256, 256, args, 4);
    assert_int_equal(em_buffer_read(bo, 0, out, n * sizeof(float)), EM_OK);
    for (uint32_t i = 0; i < n; i++)
        if (out[i] != a[i] * 3.0f + b[2 * i])
            fail_msg("out[%u] = %g, want %g", i, out[i], a[i] * 3.0f + b[2 * i]);
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bo);
    free(a);
    free(b);
    free(out);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

static void test_shared_memory_reduction(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "block_sum"); /* 64 KiB of dynamic shared memory */
    const uint32_t n = 1u << 20;
    float *in = malloc(n * sizeof(float));
    double want = 0;
    for (uint32_t i = 0; i < n; i++) {
        in[i] = (float)(i % 7) - 3.0f;
        want += in[i];
    }
    em_buffer *bi = em_buffer_alloc(dev, n * sizeof(float)), *bo = em_buffer_alloc(dev, 4);
    assert_int_equal(em_buffer_write(bi, 0, in, n * sizeof(float)), EM_OK);
    assert_int_equal(em_buffer_fill_zero(bo), EM_OK);
    em_drv_arg args[2] = {buf_arg(bi, EM_F32, n), buf_arg(bo, EM_F32, 1)};
    launch(dev, fn, n / 256, 256, args, 2);
    float got = 0;
    assert_int_equal(em_buffer_read(bo, 0, &got, 4), EM_OK);
    assert_float_equal(got, want, 1e-3);
    em_buffer_free(bi);
    em_buffer_free(bo);
    free(in);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

static void test_atomics_and_shuffles(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "atomics");
    em_buffer *counts = em_buffer_alloc(dev, 4), *sums = em_buffer_alloc(dev, 4);
    em_buffer *maxes = em_buffer_alloc(dev, 4), *warps = em_buffer_alloc(dev, 4);
    em_buffer *all[4] = {counts, sums, maxes, warps};
    for (int i = 0; i < 4; i++)
        assert_int_equal(em_buffer_fill_zero(all[i]), EM_OK);
    const uint32_t cubes = 1000, units = 128;
    em_drv_arg args[5] = {buf_arg(counts, EM_U32, 1), buf_arg(sums, EM_F32, 1),
                          buf_arg(maxes, EM_U32, 1), buf_arg(warps, EM_F32, 1),
                          float_arg(EM_F32, 0.5)};
    launch(dev, fn, cubes, units, args, 5);
    uint32_t count = 0, max = 0;
    float sum = 0, warp_sum = 0;
    assert_int_equal(em_buffer_read(counts, 0, &count, 4), EM_OK);
    assert_int_equal(em_buffer_read(sums, 0, &sum, 4), EM_OK);
    assert_int_equal(em_buffer_read(maxes, 0, &max, 4), EM_OK);
    assert_int_equal(em_buffer_read(warps, 0, &warp_sum, 4), EM_OK);
    assert_int_equal(count, cubes * units);
    assert_float_equal(sum, 0.5 * cubes * units, 1e-6 * cubes * units);
    assert_int_equal(max, cubes * units - 1);
    /* each warp sums 0..31 = 496 */
    assert_float_equal(warp_sum, 496.0 * cubes * units / 32, 1.0);
    for (int i = 0; i < 4; i++)
        em_buffer_free(all[i]);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

static void test_half_scalars(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "halves");
    const uint16_t h[4] = {0x3c00, 0x4000, 0xbc00, 0x0000};   /* 1, 2, -1, 0 in f16 */
    const uint16_t bf[4] = {0x3f80, 0x4040, 0xc000, 0x3f00}; /* 1, 3, -2, 0.5 in bf16 */
    em_buffer *bh = em_buffer_alloc(dev, 8), *bb = em_buffer_alloc(dev, 8);
    em_buffer *bo = em_buffer_alloc(dev, 16);
    assert_int_equal(em_buffer_write(bh, 0, h, 8), EM_OK);
    assert_int_equal(em_buffer_write(bb, 0, bf, 8), EM_OK);
    em_drv_arg args[10] = {buf_arg(bh, EM_F16, 4), buf_arg(bb, EM_BF16, 4),
                           buf_arg(bo, EM_F32, 4), float_arg(EM_F16, 0.5),
                           float_arg(EM_BF16, 0.25), float_arg(EM_F64, 100.0),
                           int_arg(EM_I64, -1000), int_arg(EM_BOOL, 1), int_arg(EM_I8, -5),
                           int_arg(EM_I16, 300)};
    launch(dev, fn, 1, 32, args, 10);
    float out[4];
    assert_int_equal(em_buffer_read(bo, 0, out, 16), EM_OK);
    const float rest = 100.0f - 1000.0f + 1000.0f - 5.0f + 300.0f;
    const float want[4] = {1.5f + 1.25f + rest, 2.5f + 3.25f + rest, -0.5f - 1.75f + rest,
                           0.5f + 0.75f + rest};
    for (int i = 0; i < 4; i++)
        assert_float_equal(out[i], want[i], 1e-3);
    em_buffer_free(bh);
    em_buffer_free(bb);
    em_buffer_free(bo);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

static void test_metadata_of_many_launches(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "meta_echo");
    /* more launches than the metadata ring holds at once, none synchronized in between */
    const uint32_t launches = 10000, words = 5, slot = 8;
    em_buffer *b = em_buffer_alloc(dev, (size_t)launches * slot * sizeof(uint64_t));
    assert_non_null(b);
    for (uint32_t i = 0; i < launches; i++) {
        int64_t shape[2] = {i, i + 1}, stride[2] = {(int64_t)i + 2, 1};
        em_drv_arg args[2] = {buf_arg(b, EM_U64, slot), int_arg(EM_U32, words)};
        args[0].offset = (size_t)i * slot * sizeof(uint64_t);
        args[0].rank = 2;
        args[0].shape = shape;
        args[0].stride = stride;
        launch(dev, fn, 1, 32, args, 2);
    }
    uint64_t *got = malloc((size_t)launches * slot * sizeof(uint64_t));
    assert_non_null(got);
    assert_int_equal(em_buffer_read(b, 0, got, (size_t)launches * slot * sizeof(uint64_t)), EM_OK);
    for (uint32_t i = 0; i < launches; i++) {
        const uint64_t *w = got + (size_t)i * slot;
        if (w[0] != slot || w[1] != i || w[2] != i + 1 || w[3] != i + 2 || w[4] != 1)
            fail_msg("launch %u saw metadata %llu %llu %llu %llu %llu", i,
                     (unsigned long long)w[0], (unsigned long long)w[1], (unsigned long long)w[2],
                     (unsigned long long)w[3], (unsigned long long)w[4]);
    }
    free(got);
    em_buffer_free(b);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

static void test_corrupt_modules(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    dev->drv->unload(dev->state, m.module);
    size_t len = 0;
    char *cubin = em_file_read(m.path, &len);
    assert_non_null(cubin);
    char path[1300];
    snprintf(path, sizeof(path), "%s.bad", m.path);
    void *mod = NULL;
    /* garbage, a truncated cubin, a cubin with a scrambled middle, an empty file */
    const char garbage[] = "this is not a cubin at all";
    assert_int_equal(em_file_write_atomic(path, garbage, sizeof(garbage) - 1), EM_OK);
    assert_int_equal(dev->drv->load(dev->state, path, &mod), EM_ERR_CORRUPT);
    const size_t cuts[] = {10, 64, len / 3, len / 2, len - 1};
    for (size_t i = 0; i < EM_ARRAY_LEN(cuts); i++) {
        assert_int_equal(em_file_write_atomic(path, cubin, cuts[i]), EM_OK);
        assert_int_equal(dev->drv->load(dev->state, path, &mod), EM_ERR_CORRUPT);
        fprintf(stderr, "truncated to %zu: %s\n", cuts[i], em_last_error());
    }
    assert_int_equal(em_file_write_atomic(path, "", 0), EM_OK);
    assert_int_equal(dev->drv->load(dev->state, path, &mod), EM_ERR_CORRUPT);
    /* a missing kernel name */
    assert_int_equal(dev->drv->load(dev->state, m.path, &mod), EM_OK);
    void *fn = NULL;
    assert_int_equal(dev->drv->function(dev->state, mod, "no_such_kernel", &fn), EM_ERR_NOT_FOUND);
    dev->drv->unload(dev->state, mod);
    free(cubin);
    em_device_close(dev);
}

static void test_timing_events(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "spin");
    em_buffer *b = em_buffer_alloc(dev, 8);
    em_drv_arg args[2] = {buf_arg(b, EM_U64, 1), int_arg(EM_U64, 20 * 1000 * 1000)};
    em_timer t;
    assert_int_equal(em_timer_start(&t, dev), EM_OK);
    launch(dev, fn, 1, 32, args, 2);
    double seconds = em_timer_stop(&t);
    /* 20 M cycles at 1-2 GHz: 10-20 ms */
    fprintf(stderr, "spin of 20M cycles: %.3f ms\n", seconds * 1e3);
    assert_true(seconds > 1e-3 && seconds < 1.0);
    assert_int_equal(em_device_sync(dev), EM_OK);
    em_buffer_free(b);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

static void test_too_many_units_refused(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    test_module m;
    build_module(dev, &m, CU_TEST_SOURCE);
    void *fn = function(dev, &m, "axpb");
    em_buffer *b = em_buffer_alloc(dev, 16);
    em_drv_arg args[4] = {buf_arg(b, EM_F32, 4), buf_arg(b, EM_F32, 4), buf_arg(b, EM_F32, 4),
                          float_arg(EM_F32, 1.0)};
    static const int64_t shape[1] = {4}, stride[1] = {1};
    args[1].rank = 1;
    args[1].shape = shape;
    args[1].stride = stride;
    em_drv_launch L = {{1, 70000, 1}, {32, 1, 1}, args, 4}; /* grid y above 65535 */
    assert_int_equal(dev->drv->launch(dev->state, fn, &L), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "axis y"));
    em_drv_launch L2 = {{1, 1, 1}, {2048, 1, 1}, args, 4};
    assert_int_equal(dev->drv->launch(dev->state, fn, &L2), EM_ERR_UNSUPPORTED);
    assert_int_equal(em_device_sync(dev), EM_OK); /* nothing broke */
    em_buffer_free(b);
    dev->drv->unload(dev->state, m.module);
    em_device_close(dev);
}

/* ---- generated kernels through the runtime ------------------------------------------------ */

static em_kernel *compile_or_skip(em_device *dev, em_ir_kernel *k)
{
    em_kernel *kern = em_kernel_compile(dev, k);
    if (!kern && em_last_status() == EM_ERR_UNSUPPORTED &&
        strstr(em_last_error(), "generat")) {
        fprintf(stderr, "skipped: %s\n", em_last_error());
        em_ir_kernel_free(k);
        em_device_close(dev);
        skip();
    }
    if (!kern)
        fail_msg("compiling %s: %s", em_ir_kernel_name(k), em_last_error());
    return kern;
}

static void test_generated_axpb_and_cache(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_ir_kernel *k = rt_kernel_axpb("cuda_axpb", 1.5);
    em_kernel *kern = compile_or_skip(dev, k);
    assert_int_equal(rt_run_axpb(dev, kern, 1.5, 100000), 0);
    assert_int_equal(rt_run_axpb(dev, kern, 1.5, 1), 0);
    em_ir_kernel_free(k);
    em_device_close(dev);
    /* a fresh device finds the cubin on disk */
    dev = open_or_skip();
    em_cache_stats before, after;
    em_cache_stats_get(&before);
    k = rt_kernel_axpb("cuda_axpb", 1.5);
    kern = compile_or_skip(dev, k);
    em_cache_stats_get(&after);
    assert_int_equal(after.compiles, before.compiles);
    assert_int_equal(rt_run_axpb(dev, kern, 1.5, 4097), 0);
    em_ir_kernel_free(k);
    em_device_close(dev);
}

static void test_generated_reductions(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_ir_kernel *ks[3] = {cu_ir_plane_sum(), NULL, NULL};
    em_kernel *kerns[3];
    kerns[0] = compile_or_skip(dev, ks[0]); /* skips (freeing ks[0]) without a generator */
    ks[1] = cu_ir_shared_sum();
    ks[2] = cu_ir_big_shared_sum(); /* 64 KiB: dynamic shared memory */
    for (int i = 1; i < 3; i++)
        if (!(kerns[i] = em_kernel_compile(dev, ks[i])))
            fail_msg("compiling %s: %s", em_ir_kernel_name(ks[i]), em_last_error());
    const uint32_t n = 256 * 1000;
    float *in = malloc(n * sizeof(float));
    double want = 0;
    for (uint32_t i = 0; i < n; i++) {
        in[i] = (float)(i % 5) * 0.5f;
        want += in[i];
    }
    em_buffer *bi = em_buffer_alloc(dev, n * sizeof(float)), *bo = em_buffer_alloc(dev, 4);
    assert_int_equal(em_buffer_write(bi, 0, in, n * sizeof(float)), EM_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(em_buffer_fill_zero(bo), EM_OK);
        em_arg args[2] = {em_arg_buffer(bi, n), em_arg_buffer(bo, 1)};
        uint32_t count[3] = {n / 256, 1, 1}, dim[3] = {256, 1, 1};
        if (em_launch(kerns[i], count, dim, args, 2) != EM_OK)
            fail_msg("%s: %s", em_ir_kernel_name(ks[i]), em_last_error());
        float got = 0;
        assert_int_equal(em_buffer_read(bo, 0, &got, 4), EM_OK);
        assert_float_equal(got, want, want * 1e-5);
    }
    for (int i = 0; i < 3; i++)
        em_ir_kernel_free(ks[i]);
    em_buffer_free(bi);
    em_buffer_free(bo);
    free(in);
    em_device_close(dev);
}

/* IEEE half bits of a small non-negative float that half represents exactly. */
static uint16_t f16_bits(float v)
{
    if (v == 0.0f)
        return 0;
    int e = 0;
    float m = frexpf(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    return (uint16_t)((unsigned)(e - 1 + 15) << 10 | (unsigned)((m * 2.0f - 1.0f) * 1024.0f));
}

/* A rank-2 tensor view (transposed: strides (1, rows)), an f16 array and an f32 scalar through a
 * generated kernel: the metadata and every argument kind arrive where the generator expects. */
static void test_generated_tensor_f16(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_ir_kernel *k = cu_ir_tensor_scale();
    em_kernel *kern = compile_or_skip(dev, k);
    enum { ROWS = 300, COLS = 7, N = ROWS * COLS };
    float *x = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;                  /* x[r, c] = r + c * ROWS */
        h[i] = f16_bits((float)(i % 16) * 0.25f);
    }
    em_buffer *bx = em_buffer_alloc(dev, N * sizeof(float)), *bo = em_buffer_alloc(dev, N * 4);
    em_buffer *bh = em_buffer_alloc(dev, N * sizeof(uint16_t));
    assert_int_equal(em_buffer_write(bx, 0, x, N * sizeof(float)), EM_OK);
    assert_int_equal(em_buffer_write(bh, 0, h, N * sizeof(uint16_t)), EM_OK);
    int64_t shape[2] = {ROWS, COLS}, stride[2] = {1, ROWS};
    em_arg args[4] = {em_arg_tensor(bx, 0, N, 2, shape, stride), em_arg_buffer(bh, N),
                      em_arg_buffer(bo, N), em_arg_f32(1.5f)};
    uint32_t count[3] = {(N + 127) / 128, 1, 1}, dim[3] = {128, 1, 1};
    if (em_launch(kern, count, dim, args, 4) != EM_OK)
        fail_msg("launch: %s", em_last_error());
    assert_int_equal(em_buffer_read(bo, 0, out, N * sizeof(float)), EM_OK);
    for (int i = 0; i < N; i++) {
        int r = i / COLS, c = i % COLS;
        float want = (float)(r + c * ROWS) * 1.5f + (float)(i % 16) * 0.25f;
        if (out[i] != want)
            fail_msg("out[%d] = %g, want %g", i, out[i], want);
    }
    em_buffer_free(bx);
    em_buffer_free(bo);
    em_buffer_free(bh);
    free(x);
    free(out);
    free(h);
    em_ir_kernel_free(k);
    em_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_elementwise_kernel),
        cmocka_unit_test(test_shared_memory_reduction),
        cmocka_unit_test(test_atomics_and_shuffles),
        cmocka_unit_test(test_half_scalars),
        cmocka_unit_test(test_metadata_of_many_launches),
        cmocka_unit_test(test_corrupt_modules),
        cmocka_unit_test(test_timing_events),
        cmocka_unit_test(test_too_many_units_refused),
        cmocka_unit_test(test_generated_axpb_and_cache),
        cmocka_unit_test(test_generated_reductions),
        cmocka_unit_test(test_generated_tensor_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
