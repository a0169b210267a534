/* test_opencl_driver.c — the OpenCL driver below the kernel compiler: probing and opening
 * "opencl:0", capabilities, buffers (round trips, offsets, copies including overlapping ones,
 * out-of-memory), building hand-written OpenCL C through the driver's build/load/function/launch,
 * the build log on a compile error, corrupt program binaries (detected, never crashing), and
 * timing events. Every test is skipped when the machine has no OpenCL device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/rt.h"
#include "runtime/rt_util.h"

/* Opens opencl:0, or skips the test (saying why) when the machine has none. */
static em_device *open_or_skip(void) { return rt_open_or_skip("opencl", "opencl:0"); }

/* A fresh temp file path for a binary. */
static void temp_file(const char *name, char *out, size_t size)
{
    char dir[1024];
    rt_fresh_dir("ocl", dir, sizeof(dir));
    assert_true(dir[0] != '\0');
    snprintf(out, size, "%s/%s", dir, name);
}

static void test_probe_open_caps(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    assert_string_equal(em_device_name(dev), "opencl:0");
    const em_caps *caps = em_device_caps(dev);
    assert_string_equal(caps->target, "opencl");
    assert_true(strlen(caps->arch) > 0);
    assert_true(strlen(caps->device_name) > 0);
    assert_true(caps->compute_units >= 1);
    /* sub-buffers' origin alignment (CL_DEVICE_MEM_BASE_ADDR_ALIGN, in bytes): a power of two */
    assert_true(caps->buffer_align >= 1 && (caps->buffer_align & (caps->buffer_align - 1)) == 0);
    assert_true(caps->max_cube_units >= 1);
    for (int i = 0; i < 3; i++) {
        assert_true(caps->max_cube_dim[i] >= 1);
        assert_true(caps->max_cube_dim[i] <= caps->max_cube_units);
    }
    assert_true(caps->max_shared > 0);
    assert_true(caps->memory_total > 0);
    assert_true(caps->plane_dim >= 1);
    if (!caps->plane_ops) assert_int_equal(caps->plane_dim, 1);
    assert_true(caps->dtype[EM_F32] && caps->dtype[EM_I32] && caps->dtype[EM_U8]);
    assert_false(caps->float_atomic_add);
    assert_false(caps->matrix);
    /* the same name gives the same device; a missing index is a clear error */
    em_device *again = em_device_open("opencl:0");
    assert_ptr_equal(again, dev);
    em_device_close(again);
    assert_null(em_device_open("opencl:63"));
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_last_error(), "opencl:63"));
    em_device_close(dev);
}

static void test_buffers_round_trip(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const size_t n = 1 << 18;
    uint32_t *host = malloc(n * 4), *back = malloc(n * 4);
    assert_non_null(host);
    assert_non_null(back);
    for (size_t i = 0; i < n; i++) host[i] = (uint32_t)(i * 2654435761u);
    em_buffer *a = em_buffer_alloc(dev, n * 4), *b = em_buffer_alloc(dev, n * 4);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(em_buffer_write(a, 0, host, n * 4), EM_OK);
    memset(back, 0, n * 4);
    assert_int_equal(em_buffer_read(a, 0, back, n * 4), EM_OK);
    assert_memory_equal(back, host, n * 4);
    /* offsets: a partial write and a partial read */
    uint32_t mark[3] = {7, 8, 9}, got[5];
    assert_int_equal(em_buffer_write(a, 40, mark, sizeof(mark)), EM_OK);
    assert_int_equal(em_buffer_read(a, 36, got, sizeof(got)), EM_OK);
    assert_int_equal(got[0], host[9]);
    assert_int_equal(got[1], 7);
    assert_int_equal(got[3], 9);
    assert_int_equal(got[4], host[13]);
    /* device-to-device copy with offsets */
    assert_int_equal(em_buffer_fill_zero(b), EM_OK);
    assert_int_equal(em_buffer_copy(b, 400, a, 800, 4000), EM_OK);
    assert_int_equal(em_buffer_read(b, 0, back, n * 4), EM_OK);
    assert_int_equal(back[99], 0);
    assert_int_equal(back[100], host[200]);
    assert_int_equal(back[1099], host[1199]);
    assert_int_equal(back[1100], 0);
    /* an overlapping copy inside one block, through the driver (OpenCL refuses these itself) */
    void *mem = NULL;
    assert_int_equal(dev->drv->alloc(dev->state, 64 * 4, &mem), EM_OK);
    assert_int_equal(dev->drv->write(dev->state, mem, 0, host, 64 * 4), EM_OK);
    assert_int_equal(dev->drv->copy(dev->state, mem, 8 * 4, mem, 0, 32 * 4), EM_OK);
    assert_int_equal(dev->drv->read(dev->state, mem, 0, back, 64 * 4), EM_OK);
    for (int i = 0; i < 64; i++)
        assert_int_equal(back[i], i < 8 ? host[i] : i < 40 ? host[i - 8] : host[i]);
    dev->drv->free(dev->state, mem, 64 * 4);
    em_buffer_free(a);
    em_buffer_free(b);
    free(host);
    free(back);
    em_device_close(dev);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    uint64_t total = em_device_caps(dev)->memory_total;
    void *mem = NULL;
    em_status st = dev->drv->alloc(dev->state, (size_t)(total + (total / 2)), &mem);
    assert_int_equal(st, EM_ERR_NOMEM);
    assert_non_null(strstr(em_last_error(), "opencl:0"));
    assert_null(em_buffer_alloc(dev, (size_t)total * 2));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    /* the device still works afterwards */
    em_buffer *b = em_buffer_alloc(dev, 1024);
    assert_non_null(b);
    em_buffer_free(b);
    em_device_close(dev);
}

static void test_build_log_on_failure(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    char path[1200];
    temp_file("bad.clbin", path, sizeof(path));
    const char *bad = "__kernel void broken(__global float *x) {\n"
                      "    x[get_global_id(0)] = undeclared_thing + ;\n"
                      "}\n";
    em_status st = dev->drv->build(dev->state, bad, path);
    assert_int_equal(st, EM_ERR_COMPILE);
    const char *msg = em_last_error();
    assert_non_null(strstr(msg, "clBuildProgram"));
    assert_non_null(strstr(msg, "CL_BUILD_PROGRAM_FAILURE"));
    assert_non_null(strstr(msg, "build log"));
    assert_non_null(strstr(msg, "undeclared_thing")); /* the compiler's own words */
    em_device_close(dev);
}

/* Writes data to path. */
static void put_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static const char *COPY_SRC = "__kernel void twice(__global const float *x, __global float *y) {\n"
                              "    size_t i = get_global_id(0);\n"
                              "    y[i] = 2.0f * x[i];\n"
                              "}\n";

static void test_binary_load_and_corruption(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    char path[1200], bad[1300];
    temp_file("good.clbin", path, sizeof(path));
    assert_int_equal(dev->drv->build(dev->state, COPY_SRC, path), EM_OK);
    void *module = NULL, *fn = NULL;
    assert_int_equal(dev->drv->load(dev->state, path, &module), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, module, "twice", &fn), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, module, "nope", &fn), EM_ERR_NOT_FOUND);
    dev->drv->unload(dev->state, module);

    size_t len = 0;
    char *data = em_file_read(path, &len);
    assert_non_null(data);
    assert_true(len > 64);
    snprintf(bad, sizeof(bad), "%s.bad", path);
    char *copy = malloc(len);
    assert_non_null(copy);
    struct {
        const char *what;
        size_t len;   /* bytes kept */
        long flip;    /* byte to flip, -1 for none */
        bool garbage; /* overwrite everything */
    } cases[] = {
        {"empty", 0, -1, false},
        {"header only", 60, -1, false},
        {"truncated", len - 1, -1, false},
        {"flipped in the binary", len, (long)len - 5, false},
        {"flipped in the id", len, 70, false},
        {"flipped in the magic", len, 2, false},
        {"garbage", len, -1, true},
    };
    for (size_t i = 0; i < EM_ARRAY_LEN(cases); i++) {
        memcpy(copy, data, len);
        if (cases[i].flip >= 0) copy[cases[i].flip] ^= 0x5a;
        if (cases[i].garbage)
            for (size_t j = 0; j < len; j++) copy[j] = (char)(j * 131 + 7);
        put_file(bad, copy, cases[i].len);
        module = NULL;
        em_status st = dev->drv->load(dev->state, bad, &module);
        if (st != EM_ERR_CORRUPT)
            fail_msg("%s: load returned %d (%s)", cases[i].what, st, em_last_error());
        assert_null(module);
    }
    /* a well-formed file around a program binary OpenCL cannot use: only OpenCL itself can
     * refuse it, and that must end in EM_ERR_CORRUPT too (the layout is opencl.c's bin_header) */
    char id[1024];
    assert_int_equal(dev->drv->compiler_id(dev->state, id, sizeof(id)), EM_OK);
    uint32_t id_len = (uint32_t)strlen(id), abi = 0;
    memcpy(&abi, data + 12, 4);
    const char junk[] = "this is not a program binary of any OpenCL implementation";
    uint64_t payload = sizeof(junk);
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_u64(&h, id_len);
    em_hasher_bytes(&h, id, id_len);
    em_hasher_u64(&h, payload);
    em_hasher_bytes(&h, junk, sizeof(junk));
    char hex[33];
    em_hasher_hex(&h, hex);
    char forged[2048];
    size_t at = 0;
    memcpy(forged, "EMBERCL1", 8), at += 8;
    memcpy(forged + at, &id_len, 4), at += 4;
    memcpy(forged + at, &abi, 4), at += 4;
    memcpy(forged + at, &payload, 8), at += 8;
    memcpy(forged + at, hex, 32), at += 32;
    memcpy(forged + at, id, id_len), at += id_len;
    memcpy(forged + at, junk, sizeof(junk)), at += sizeof(junk);
    put_file(bad, forged, at);
    module = NULL;
    em_status st = dev->drv->load(dev->state, bad, &module);
    if (st != EM_ERR_CORRUPT) fail_msg("forged binary: load returned %d (%s)", st, em_last_error());
    assert_null(module);
    free(copy);
    free(data);
    em_device_close(dev);
}

/* Hand-written kernels that follow the code generator's parameter ABI (kernel/codegen/opencl.c):
 * IR parameters in order, then the ulong metadata buffer. */
static const char *ABI_SRC =
    "__kernel void scale_add(__global const float *x, __global float *y, const float a,\n"
    "                        const int b, __global const ulong *em_meta)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < (uint)em_meta[1]) y[i] = a * x[i] + (float)b;\n"
    "}\n"
    "__kernel void echo(__global const float *t, __global ulong *out, const uchar flag,\n"
    "                   const long big, const double dbl, const ushort small,\n"
    "                   __global const ulong *em_meta)\n"
    "{\n"
    "    if (get_global_id(0) != 0) return;\n"
    "    for (int i = 0; i < 6; i++) out[i] = em_meta[i];\n"
    "    out[6] = flag; out[7] = (ulong)big; out[9] = small;\n"
    "    out[8] = (ulong)((dbl - 0.25) * 1099511627776.0); /* 1 when no bit of dbl was lost */\n"
    "}\n"
    "__kernel void grid(__global uint *out, __global const ulong *em_meta)\n"
    "{\n"
    "    size_t gx = get_global_size(0), gy = get_global_size(1);\n"
    "    size_t x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
    "    uint ok = get_local_size(0) == 4 && get_local_size(1) == 2 && get_local_size(2) == 3 &&\n"
    "              get_num_groups(0) == 3 && get_num_groups(1) == 5 && get_num_groups(2) == 2;\n"
    "    out[(z * gy + y) * gx + x] = (uint)(x + 100 * y + 10000 * z) | (ok << 31);\n"
    "}\n";

/* A driver argument for a whole buffer (or a view at `offset` bytes). */
static em_drv_arg buf_arg(em_buffer *b, em_scalar s, size_t offset, uint64_t len)
{
    em_drv_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_BUFFER;
    a.type = em_ty(s);
    a.mem = b->mem;
    a.offset = offset;
    a.len = len;
    return a;
}

static em_drv_arg scalar(em_scalar s, em_ir_const v)
{
    em_drv_arg a;
    memset(&a, 0, sizeof(a));
    a.kind = EM_PARAM_SCALAR;
    a.type = em_ty(s);
    a.value = v;
    return a;
}

/* Builds ABI_SRC through the driver and returns the loaded module. */
static void *load_abi_module(em_device *dev)
{
    char path[1200];
    temp_file("abi.clbin", path, sizeof(path));
    if (dev->drv->build(dev->state, ABI_SRC, path) != EM_OK) fail_msg("build: %s", em_last_error());
    void *module = NULL;
    if (dev->drv->load(dev->state, path, &module) != EM_OK) fail_msg("load: %s", em_last_error());
    return module;
}

static void run(em_device *dev, void *fn, const uint32_t count[3], const uint32_t dim[3],
                const em_drv_arg *args, size_t nargs)
{
    em_drv_launch l;
    memset(&l, 0, sizeof(l));
    memcpy(l.cube_count, count, sizeof(l.cube_count));
    memcpy(l.cube_dim, dim, sizeof(l.cube_dim));
    l.args = args;
    l.nargs = nargs;
    if (dev->drv->launch(dev->state, fn, &l) != EM_OK) fail_msg("launch: %s", em_last_error());
}

static void test_handwritten_kernels(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    void *module = load_abi_module(dev), *scale_add = NULL, *echo = NULL, *grid = NULL;
    assert_int_equal(dev->drv->function(dev->state, module, "scale_add", &scale_add), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, module, "echo", &echo), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, module, "grid", &grid), EM_OK);

    /* scale_add over 1000 elements, then again with other scalars (new metadata is not needed,
     * new scalar values are), then on views 4 KiB into both buffers */
    enum { N = 1000 };
    float hx[N + 1024], hy[N + 1024];
    for (int i = 0; i < N + 1024; i++) hx[i] = (float)i * 0.25f;
    em_buffer *x = em_buffer_alloc(dev, sizeof(hx)), *y = em_buffer_alloc(dev, sizeof(hy));
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(em_buffer_write(x, 0, hx, sizeof(hx)), EM_OK);
    assert_int_equal(em_buffer_fill_zero(y), EM_OK);
    uint32_t count[3] = {(N + 63) / 64, 1, 1}, dim[3] = {64, 1, 1};
    for (int round = 0; round < 2; round++) {
        float a = round ? -1.5f : 3.0f;
        int32_t b = round ? 7 : -2;
        em_drv_arg args[4] = {buf_arg(x, EM_F32, 0, N), buf_arg(y, EM_F32, 0, N),
                              scalar(EM_F32, (em_ir_const){.f = a}),
                              scalar(EM_I32, (em_ir_const){.i = b})};
        run(dev, scale_add, count, dim, args, 4);
        assert_int_equal(em_buffer_read(y, 0, hy, sizeof(hy)), EM_OK);
        for (int i = 0; i < N; i++) assert_float_equal(hy[i], a * hx[i] + (float)b, 1e-5);
        assert_float_equal(hy[N], 0.0f, 0.0); /* past len: untouched */
    }
    {
        em_drv_arg args[4] = {buf_arg(x, EM_F32, 4096, N), buf_arg(y, EM_F32, 4096, N),
                              scalar(EM_F32, (em_ir_const){.f = 2.0}),
                              scalar(EM_I32, (em_ir_const){.i = 1})};
        run(dev, scale_add, count, dim, args, 4);
        assert_int_equal(em_buffer_read(y, 0, hy, sizeof(hy)), EM_OK);
        for (int i = 0; i < N; i++)
            assert_float_equal(hy[1024 + i], 2.0f * hx[1024 + i] + 1.0f, 1e-5);
        /* an offset OpenCL cannot make a sub-buffer of is refused, clearly */
        args[0] = buf_arg(x, EM_F32, 4, N);
        em_drv_launch l = {{count[0], 1, 1}, {64, 1, 1}, args, 4};
        em_status st = dev->drv->launch(dev->state, scale_add, &l);
        if (st != EM_OK) {
            assert_int_equal(st, EM_ERR_UNSUPPORTED);
            assert_non_null(strstr(em_last_error(), "CL_DEVICE_MEM_BASE_ADDR_ALIGN"));
        }
    }

    /* echo: tensor metadata and scalars of several widths arrive as the ABI says */
    em_buffer *out = em_buffer_alloc(dev, 16 * 8);
    assert_non_null(out);
    int64_t shape[2] = {3, 4}, stride[2] = {4, 1};
    em_drv_arg eargs[6] = {buf_arg(x, EM_F32, 0, 12),
                           buf_arg(out, EM_U64, 0, 16),
                           scalar(EM_BOOL, (em_ir_const){.i = 1}),
                           scalar(EM_I64, (em_ir_const){.i = -5}),
                           scalar(EM_F64, (em_ir_const){.f = 0.25 + 0x1p-40}),
                           scalar(EM_U16, (em_ir_const){.u = 65535})};
    eargs[0].rank = 2;
    eargs[0].shape = shape;
    eargs[0].stride = stride;
    uint32_t one[3] = {1, 1, 1};
    const em_caps *caps = em_device_caps(dev);
    if (caps->dtype[EM_F64]) {
        run(dev, echo, one, one, eargs, 6);
        uint64_t got[16];
        assert_int_equal(em_buffer_read(out, 0, got, sizeof(got)), EM_OK);
        uint64_t want[10] = {12, 3, 4, 4, 1, 16, 1, (uint64_t)-5, 1, 65535}; /* 8: f64 kept */
        for (int i = 0; i < 10; i++)
            if (got[i] != want[i])
                fail_msg("echo word %d: %llu, want %llu", i, (unsigned long long)got[i],
                         (unsigned long long)want[i]);
    }

    /* grid: a 3-D launch has global size = cubes * units on every axis */
    uint32_t gcount[3] = {3, 5, 2}, gdim[3] = {4, 2, 3};
    size_t gx = 12, gy = 10, gz = 6;
    em_buffer *g = em_buffer_alloc(dev, gx * gy * gz * 4);
    assert_non_null(g);
    em_drv_arg gargs[1] = {buf_arg(g, EM_U32, 0, gx * gy * gz)};
    run(dev, grid, gcount, gdim, gargs, 1);
    uint32_t *hg = malloc(gx * gy * gz * 4);
    assert_non_null(hg);
    assert_int_equal(em_buffer_read(g, 0, hg, gx * gy * gz * 4), EM_OK);
    for (size_t z = 0; z < gz; z++)
        for (size_t yy = 0; yy < gy; yy++)
            for (size_t xx = 0; xx < gx; xx++)
                assert_int_equal(hg[(z * gy + yy) * gx + xx],
                                 (uint32_t)(xx + 100 * yy + 10000 * z) | (1u << 31));
    free(hg);

    /* more units per cube than the kernel can run: refused before OpenCL sees it */
    uint32_t huge[3] = {caps->max_cube_units, 2, 1};
    em_drv_launch bad = {{1, 1, 1}, {huge[0], huge[1], huge[2]}, gargs, 1};
    assert_int_equal(dev->drv->launch(dev->state, grid, &bad), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "grid"));

    assert_int_equal(em_device_sync(dev), EM_OK);
    em_buffer_free(x);
    em_buffer_free(y);
    em_buffer_free(out);
    em_buffer_free(g);
    dev->drv->unload(dev->state, module);
    em_device_close(dev);
}

static void test_events(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    void *a = NULL, *b = NULL;
    assert_int_equal(dev->drv->event_record(dev->state, &a), EM_OK);
    em_buffer *buf = em_buffer_alloc(dev, 1 << 20);
    assert_non_null(buf);
    assert_int_equal(em_buffer_fill_zero(buf), EM_OK);
    assert_int_equal(dev->drv->event_record(dev->state, &b), EM_OK);
    double s = -1;
    assert_int_equal(dev->drv->event_elapsed(dev->state, a, b, &s), EM_OK);
    assert_true(s >= 0.0 && s < 60.0);
    dev->drv->event_destroy(dev->state, a);
    dev->drv->event_destroy(dev->state, b);
    em_timer t;
    assert_int_equal(em_timer_start(&t, dev), EM_OK);
    assert_int_equal(em_buffer_fill_zero(buf), EM_OK);
    double e = em_timer_stop(&t);
    assert_true(e >= 0.0 && e < 60.0);
    em_buffer_free(buf);
    em_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_open_caps),
        cmocka_unit_test(test_buffers_round_trip),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_build_log_on_failure),
        cmocka_unit_test(test_binary_load_and_corruption),
        cmocka_unit_test(test_handwritten_kernels),
        cmocka_unit_test(test_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
