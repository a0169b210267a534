/* test_vulkan_driver.c — the Vulkan driver below the kernel compiler: probing (including why a
 * machine has no device), opening "vulkan:0" (lavapipe in CI) and its capabilities, buffers in
 * both transfer modes (mapped, and staged through the frame arenas), copies (overlapping too),
 * out-of-memory, hand-written GLSL through build/load/function/launch (sparse bindings, the
 * metadata buffer, push constants of several types, unaligned offsets, 3-D grids, sub-groups,
 * shared memory and barriers, batches), the compiler's message on a GLSL error, `spirv-val` on
 * what build wrote, corrupt binaries (EM_ERR_CORRUPT, never a crash) and timing events. Every
 * test is skipped when the machine has no Vulkan device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/rt.h"
#include "runtime/rt_util.h"

/* The device under test: $EMBER_TEST_DEVICE when it names a Vulkan device, else vulkan:0. */
static const char *test_device(void)
{
    const char *e = getenv("EMBER_TEST_DEVICE");
    return e && strncmp(e, "vulkan:", 7) == 0 ? e : "vulkan:0";
}

/* Opens the device under test, or skips the test (saying why) when the machine has none. */
static em_device *open_or_skip(void) { return rt_open_or_skip("vulkan", test_device()); }

static char tmp_dir[1024]; /* this run's scratch directory (removed at the end) */

/* A path in this run's scratch directory. */
static void temp_file(const char *name, char *out, size_t size)
{
    if (!tmp_dir[0]) rt_fresh_dir("vk", tmp_dir, sizeof(tmp_dir));
    assert_true(tmp_dir[0] != '\0');
    snprintf(out, size, "%s/%s", tmp_dir, name);
}

/* ---- probing --------------------------------------------------------------------------------- */

/* Child mode: probes and exits 0 when the reason contains argv[2]. */
static int probe_child(const char *expect)
{
    em_backend_info info[8];
    size_t n = em_backend_list(info, 8);
    for (size_t i = 0; i < n && i < 8; i++) {
        if (strcmp(info[i].name, "vulkan") != 0) continue;
        if (info[i].device_count == 0 && strstr(info[i].why, expect)) return 0;
        fprintf(stderr, "probe: %d devices, why '%s' (expected '%s')\n", info[i].device_count,
                info[i].why, expect);
        return 1;
    }
    return 2;
}

/* Runs the probe in a child with one environment variable set. */
static int probe_with_env(const char *var, const char *value, const char *expect)
{
    const char *old = getenv(var);
    char *saved = old ? strdup(old) : NULL;
    setenv(var, value, 1);
    const char *args[] = {"--probe-why", expect, NULL};
    pid_t pid = rt_spawn_self(args, false);
    if (saved) {
        setenv(var, saved, 1);
        free(saved);
    } else {
        unsetenv(var);
    }
    return pid < 0 ? -1 : rt_wait(pid);
}

static void test_probe_reasons(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_device_close(dev);
    /* no ICD at all: the loader finds no driver */
    assert_int_equal(probe_with_env("VK_ICD_FILENAMES", "/nonexistent/icd.json",
                                    "no usable "
                                    "Vulkan driver (ICD)"),
                     0);
}

static void test_open_caps(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    assert_string_equal(em_device_name(dev), test_device());
    const em_caps *caps = em_device_caps(dev);
    assert_string_equal(caps->target, "glsl");
    assert_non_null(strstr(caps->arch, "spirv-vulkan1."));
    assert_true(strlen(caps->device_name) > 0);
    assert_true(caps->max_cube_units >= 128);
    /* minStorageBufferOffsetAlignment, at least the 16 bytes the driver rounds it up to */
    assert_true(caps->buffer_align >= 16 && (caps->buffer_align & (caps->buffer_align - 1)) == 0);
    for (int i = 0; i < 3; i++) assert_true(caps->max_cube_dim[i] >= 1);
    assert_true(caps->max_shared >= 16384);
    assert_true(caps->memory_total > 0);
    assert_true(caps->plane_dim >= 1);
    assert_true(caps->dtype[EM_F32] && caps->dtype[EM_I32] && caps->dtype[EM_U32]);
    /* bf16 as 16-bit patterns where there is 16-bit storage and no cooperative matrices (vulkan.c);
     * cooperative matrices are checked by test_vulkan_coopmat.c */
    assert_true(!caps->dtype[EM_BF16] || (caps->dtype[EM_U16] && !caps->matrix));
    assert_true(caps->matrix == (caps->matrix_api[0] != '\0'));
    fprintf(stderr,
            "vulkan:0 = %s (%s), plane %u%s, shared %llu, f16 %d f64 %d i8 %d i64 %d, "
            "float atomics %d\n",
            caps->device_name, caps->arch, caps->plane_dim, caps->plane_ops ? " with ops" : "",
            (unsigned long long)caps->max_shared, caps->dtype[EM_F16], caps->dtype[EM_F64],
            caps->dtype[EM_I8], caps->dtype[EM_I64], caps->float_atomic_add);
    em_device *again = em_device_open(test_device());
    assert_ptr_equal(again, dev);
    em_device_close(again);
    assert_null(em_device_open("vulkan:31"));
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
    em_device_close(dev);
}

/* ---- buffers --------------------------------------------------------------------------------- */

static void round_trips(em_device *dev)
{
    /* larger than a frame arena (16 MiB when staged), so transfers go in chunks */
    const size_t n = (size_t)5 << 20;
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
    /* partial writes and reads at odd word offsets */
    uint32_t patch[7] = {1, 2, 3, 4, 5, 6, 7};
    assert_int_equal(em_buffer_write(a, 4 * 1001, patch, sizeof(patch)), EM_OK);
    memcpy(host + 1001, patch, sizeof(patch));
    uint32_t got[9];
    assert_int_equal(em_buffer_read(a, 4 * 1000, got, sizeof(got)), EM_OK);
    assert_memory_equal(got, host + 1000, sizeof(got));
    /* device copies, then an overlapping copy inside one buffer (memmove semantics) */
    assert_int_equal(em_buffer_copy(b, 0, a, 0, n * 4), EM_OK);
    assert_int_equal(em_buffer_copy(b, 4 * 3, b, 0, 4 * 1000), EM_OK);
    memmove(host + 3, host, 4 * 1000);
    assert_int_equal(em_buffer_read(b, 0, back, n * 4), EM_OK);
    assert_memory_equal(back, host, n * 4);
    /* writes queued behind copies keep their order */
    uint32_t zero[4] = {0};
    assert_int_equal(em_buffer_copy(b, 0, a, 4 * 100, 16), EM_OK);
    assert_int_equal(em_buffer_write(b, 0, zero, 8), EM_OK);
    assert_int_equal(em_buffer_read(b, 0, got, 16), EM_OK);
    assert_int_equal(got[0], 0);
    assert_int_equal(got[1], 0);
    uint32_t want2;
    assert_int_equal(em_buffer_read(a, 4 * 102, &want2, 4), EM_OK);
    assert_int_equal(got[2], want2);
    em_buffer_free(a);
    em_buffer_free(b);
    em_device_pool_trim(dev);
    free(host);
    free(back);
}

static void test_buffers_mapped(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    round_trips(dev);
    em_device_close(dev);
}

static void test_buffers_staged(void **state)
{
    (void)state;
    em_device *probe = open_or_skip(); /* skips before the environment changes */
    em_device_close(probe);
    setenv("EMBER_VK_STAGING", "1", 1);
    em_device *dev = em_device_open(test_device());
    unsetenv("EMBER_VK_STAGING");
    assert_non_null(dev);
    round_trips(dev);
    em_device_close(dev);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_buffer *huge = em_buffer_alloc(dev, (size_t)1 << 46);
    assert_null(huge);
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    /* the device still works */
    em_buffer *small = em_buffer_alloc(dev, 1024);
    assert_non_null(small);
    em_buffer_free(small);
    em_device_close(dev);
}

/* ---- hand-written GLSL through the driver ---------------------------------------------------- */

/* y[i] = a * x[i] + y[i] + bias for i < len(y): parameters x (0), a (1, f32 scalar), y (2),
 * bias (3, i32 scalar), so the buffers sit at bindings 0 and 2 and the metadata at 4, as the GLSL
 * generator lays them out (codegen/glsl.c): metadata in u64 words (x.len, y.len) read as uint
 * pairs, scalars in 8-byte push-constant slots. */
static const char *AXPY_GLSL =
    "//@@ember-kernel axpy\n"
    "#version 450\n"
    "layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;\n"
    "layout(std430, binding = 0) readonly buffer B0 { float x[]; };\n"
    "layout(std430, binding = 2) buffer B2 { float y[]; };\n"
    "layout(std430, binding = 4) readonly buffer Meta { uint meta[]; };\n"
    "layout(push_constant) uniform P { layout(offset = 0) float a; layout(offset = 8) int bias; } "
    "pc;\n"
    "void main() {\n"
    "    uint i = gl_GlobalInvocationID.x;\n"
    "    if (i < meta[2])\n"
    "        y[i] = pc.a * x[i] + y[i] + float(pc.bias);\n"
    "}\n";

typedef struct built {
    em_device *dev;
    void *module;
    char path[1100];
} built;

/* Builds and loads GLSL through the driver. */
static void build_load(em_device *dev, const char *glsl, built *b)
{
    b->dev = dev;
    temp_file("k.spv", b->path, sizeof(b->path));
    em_status st = dev->drv->build(dev->state, glsl, b->path);
    if (st != EM_OK) fail_msg("build: %s", em_last_error());
    st = dev->drv->load(dev->state, b->path, &b->module);
    if (st != EM_OK) fail_msg("load: %s", em_last_error());
}

static em_drv_arg buf_arg(em_buffer *buf, em_scalar s, size_t offset, uint64_t len)
{
    em_drv_arg a = {
        .kind = EM_PARAM_BUFFER, .type = em_ty(s), .mem = buf->mem, .offset = offset, .len = len};
    return a;
}

static void test_glsl_axpy(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    built b;
    build_load(dev, AXPY_GLSL, &b);
    void *fn = NULL;
    assert_int_equal(dev->drv->function(dev->state, b.module, "axpy", &fn), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, b.module, "nope", &fn), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_last_error(), "axpy"));
    assert_int_equal(dev->drv->function(dev->state, b.module, "axpy", &fn), EM_OK);

    const uint32_t n = 1000, xoff = 8, yoff = 4; /* element offsets of 32 and 16 bytes */
    float *hx = malloc((n + xoff) * 4), *hy = malloc((n + yoff + 5) * 4);
    float *out = malloc((n + yoff + 5) * 4);
    for (uint32_t i = 0; i < n + xoff; i++) hx[i] = (float)i * 0.25f;
    for (uint32_t i = 0; i < n + yoff + 5; i++) hy[i] = (float)i;
    em_buffer *x = em_buffer_alloc(dev, (n + xoff) * 4),
              *y = em_buffer_alloc(dev, (n + yoff + 5) * 4);
    assert_int_equal(em_buffer_write(x, 0, hx, (n + xoff) * 4), EM_OK);
    assert_int_equal(em_buffer_write(y, 0, hy, (n + yoff + 5) * 4), EM_OK);
    em_drv_arg args[4] = {
        buf_arg(x, EM_F32, xoff * 4, n),
        {.kind = EM_PARAM_SCALAR, .type = em_ty(EM_F32), .value.f = 2.0},
        buf_arg(y, EM_F32, yoff * 4, n),
        {.kind = EM_PARAM_SCALAR, .type = em_ty(EM_I32), .value.i = -3},
    };
    /* an offset the device cannot bind at (12 bytes: not a multiple of 16) is refused */
    args[0].offset = 12;
    em_drv_launch bad = {{1, 1, 1}, {64, 1, 1}, args, 4};
    assert_int_equal(dev->drv->launch(dev->state, fn, &bad), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "argument 0"));
    assert_non_null(strstr(em_last_error(), "minStorageBufferOffsetAlignment"));
    args[0].offset = xoff * 4;
    /* two launches with different cube dimensions: two pipelines */
    uint32_t dims[2] = {64, 100};
    for (int r = 0; r < 2; r++) {
        em_drv_launch l = {{(n + dims[r] - 1) / dims[r], 1, 1}, {dims[r], 1, 1}, args, 4};
        assert_int_equal(dev->drv->launch(dev->state, fn, &l), EM_OK);
    }
    assert_int_equal(em_buffer_read(y, 0, out, (n + yoff + 5) * 4), EM_OK);
    for (uint32_t i = 0; i < n + yoff + 5; i++) {
        float want = hy[i];
        if (i >= yoff && i < yoff + n)
            for (int r = 0; r < 2; r++) want = 2.0f * hx[i - yoff + xoff] + want - 3.0f;
        if (out[i] != want) fail_msg("y[%u] = %g, want %g", i, out[i], want);
    }
    em_buffer_free(x);
    em_buffer_free(y);
    free(hx);
    free(hy);
    free(out);
    dev->drv->unload(dev->state, b.module);
    em_device_close(dev);
}

/* Thousands of launches without a sync in between: frames rotate, their descriptor pools and
 * arenas are reused, and the results accumulate in order. */
static void test_many_launches(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    built b;
    build_load(dev, AXPY_GLSL, &b);
    void *fn = NULL;
    assert_int_equal(dev->drv->function(dev->state, b.module, "axpy", &fn), EM_OK);
    const uint32_t n = 256, rounds = 3000;
    em_buffer *x = em_buffer_alloc(dev, n * 4), *y = em_buffer_alloc(dev, n * 4);
    assert_int_equal(em_buffer_fill_zero(x), EM_OK);
    assert_int_equal(em_buffer_fill_zero(y), EM_OK);
    em_drv_arg args[4] = {
        buf_arg(x, EM_F32, 0, n),
        {.kind = EM_PARAM_SCALAR, .type = em_ty(EM_F32), .value.f = 0.0},
        buf_arg(y, EM_F32, 0, n),
        {.kind = EM_PARAM_SCALAR, .type = em_ty(EM_I32), .value.i = 1},
    };
    em_drv_launch l = {{n / 64, 1, 1}, {64, 1, 1}, args, 4};
    double t0 = em_rt_now();
    for (uint32_t r = 0; r < rounds; r++)
        assert_int_equal(dev->drv->launch(dev->state, fn, &l), EM_OK);
    assert_int_equal(em_device_sync(dev), EM_OK);
    double t1 = em_rt_now();
    float h[256];
    assert_int_equal(em_buffer_read(y, 0, h, n * 4), EM_OK);
    for (uint32_t i = 0; i < n; i++) assert_true(h[i] == (float)rounds);
    fprintf(stderr, "%u launches in %.1f ms (%.1f us each)\n", rounds, (t1 - t0) * 1e3,
            (t1 - t0) * 1e6 / rounds);
    em_buffer_free(x);
    em_buffer_free(y);
    dev->drv->unload(dev->state, b.module);
    em_device_close(dev);
}

/* A batch of three kernels with a shared preamble: 3-D positions, sub-group size, and a
 * shared-memory reduction with barriers. */
static const char *BATCH_GLSL =
    "#version 450\n"
    "#extension GL_KHR_shader_subgroup_basic : require\n"
    "//@@ember-kernel grid3d\n"
    "layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;\n"
    "layout(std430, binding = 0) buffer B0 { uint o[]; };\n"
    "layout(std430, binding = 1) readonly buffer Meta { uint meta[]; };\n"
    "void main() {\n"
    "    uvec3 g = gl_GlobalInvocationID, n = gl_NumWorkGroups * gl_WorkGroupSize;\n"
    "    uint i = g.x + n.x * (g.y + n.y * g.z);\n"
    "    if (i < meta[0]) o[i] = g.x | (g.y << 8) | (g.z << 16);\n"
    "}\n"
    "//@@ember-kernel subgroup\n"
    "layout(local_size_x_id = 0) in;\n"
    "layout(std430, binding = 0) buffer B0 { uint o[]; };\n"
    "void main() { if (gl_GlobalInvocationID.x == 0) o[0] = gl_SubgroupSize; }\n"
    "//@@ember-kernel reduce\n"
    "layout(local_size_x = 128) in;\n"
    "layout(std430, binding = 0) readonly buffer B0 { float x[]; };\n"
    "layout(std430, binding = 1) buffer B1 { float sums[]; };\n"
    "layout(std430, binding = 2) readonly buffer Meta { uint meta[]; };\n"
    "shared float part[128];\n"
    "void main() {\n"
    "    uint i = gl_GlobalInvocationID.x, t = gl_LocalInvocationID.x;\n"
    "    part[t] = i < meta[0] ? x[i] : 0.0;\n"
    "    barrier();\n"
    "    for (uint s = 64; s > 0; s >>= 1) {\n"
    "        if (t < s) part[t] += part[t + s];\n"
    "        barrier();\n"
    "    }\n"
    "    if (t == 0) sums[gl_WorkGroupID.x] = part[0];\n"
    "}\n"
    "//@@ember-kernel tall\n"
    "layout(local_size_x_id = 0) in;\n"
    "layout(std430, binding = 0) buffer B0 { uint o[]; };\n"
    "void main() { o[gl_WorkGroupID.y] = gl_GlobalInvocationID.y + 1u; }\n";

static void test_glsl_batch(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    built b;
    build_load(dev, BATCH_GLSL, &b);
    void *grid = NULL, *sub = NULL, *red = NULL;
    assert_int_equal(dev->drv->function(dev->state, b.module, "grid3d", &grid), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, b.module, "subgroup", &sub), EM_OK);
    assert_int_equal(dev->drv->function(dev->state, b.module, "reduce", &red), EM_OK);

    /* 3-D grid: 3x2x2 cubes of 4x3x2 units = 12x6x4 units */
    const uint32_t total = 12 * 6 * 4;
    em_buffer *o = em_buffer_alloc(dev, total * 4);
    em_drv_arg ga[1] = {buf_arg(o, EM_U32, 0, total)};
    em_drv_launch gl = {{3, 2, 2}, {4, 3, 2}, ga, 1};
    assert_int_equal(dev->drv->launch(dev->state, grid, &gl), EM_OK);
    uint32_t *h = malloc(total * 4);
    assert_int_equal(em_buffer_read(o, 0, h, total * 4), EM_OK);
    for (uint32_t z = 0; z < 4; z++)
        for (uint32_t y = 0; y < 6; y++)
            for (uint32_t x = 0; x < 12; x++)
                assert_int_equal(h[x + 12 * (y + 6 * z)], x | (y << 8) | (z << 16));

    /* sub-group size agrees with the caps */
    em_drv_arg sa[1] = {buf_arg(o, EM_U32, 0, 1)};
    em_drv_launch sl = {{1, 1, 1}, {64, 1, 1}, sa, 1};
    assert_int_equal(dev->drv->launch(dev->state, sub, &sl), EM_OK);
    uint32_t size = 0;
    assert_int_equal(em_buffer_read(o, 0, &size, 4), EM_OK);
    assert_int_equal(size, em_device_caps(dev)->plane_dim);

    /* reduction with barriers; a fixed local size refuses other cube dimensions */
    const uint32_t n = 1000, cubes = (n + 127) / 128;
    float *hx = malloc(n * 4), sums[8];
    for (uint32_t i = 0; i < n; i++) hx[i] = (float)(i % 17);
    em_buffer *x = em_buffer_alloc(dev, n * 4), *s = em_buffer_alloc(dev, cubes * 4);
    assert_int_equal(em_buffer_write(x, 0, hx, n * 4), EM_OK);
    em_drv_arg ra[2] = {buf_arg(x, EM_F32, 0, n), buf_arg(s, EM_F32, 0, cubes)};
    em_drv_launch rl = {{cubes, 1, 1}, {128, 1, 1}, ra, 2};
    assert_int_equal(dev->drv->launch(dev->state, red, &rl), EM_OK);
    assert_int_equal(em_buffer_read(s, 0, sums, cubes * 4), EM_OK);
    for (uint32_t c = 0; c < cubes; c++) {
        double want = 0;
        for (uint32_t i = c * 128; i < n && i < c * 128 + 128; i++) want += hx[i];
        assert_true(fabs(sums[c] - want) < 1e-3);
    }
    rl.cube_dim[0] = 64;
    assert_int_equal(dev->drv->launch(dev->state, red, &rl), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "128x1x1"));

    /* more cubes along y than one dispatch may have (65535 on most devices): pieces */
    void *tall = NULL;
    assert_int_equal(dev->drv->function(dev->state, b.module, "tall", &tall), EM_OK);
    const uint32_t rows = 70000;
    em_buffer *t = em_buffer_alloc(dev, rows * 4);
    em_drv_arg ta[1] = {buf_arg(t, EM_U32, 0, rows)};
    em_drv_launch tl = {{1, rows, 1}, {1, 1, 1}, ta, 1};
    assert_int_equal(dev->drv->launch(dev->state, tall, &tl), EM_OK);
    uint32_t *ht = malloc(rows * 4);
    assert_int_equal(em_buffer_read(t, 0, ht, rows * 4), EM_OK);
    for (uint32_t r = 0; r < rows; r++)
        if (ht[r] != r + 1) fail_msg("row %u: %u", r, ht[r]);
    free(ht);
    /* a kernel reading gl_NumWorkGroups cannot be split */
    em_drv_launch big = {{1, rows, 1}, {1, 1, 1}, ga, 1};
    assert_int_equal(dev->drv->launch(dev->state, grid, &big), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "gl_NumWorkGroups"));
    em_buffer_free(t);

    em_buffer_free(o);
    em_buffer_free(x);
    em_buffer_free(s);
    free(h);
    free(hx);
    dev->drv->unload(dev->state, b.module);
    em_device_close(dev);
}

/* The compilers to try in turn ($EMBER_VK_COMPILER values). */
static const char *const COMPILERS[] = {"glslang", "shaderc"};

/* Selects a compiler; false (saying so) when this machine cannot run it. */
static bool use_compiler(em_device *dev, const char *name)
{
    setenv("EMBER_VK_COMPILER", name, 1);
    char id[600];
    if (dev->drv->compiler_id(dev->state, id, sizeof(id)) != EM_OK) {
        assert_int_equal(em_last_status(), EM_ERR_UNSUPPORTED);
        fprintf(stderr, "compiler %s unavailable here: %s\n", name, em_last_error());
        return false;
    }
    fprintf(stderr, "compiler %s: %s\n", name, id);
    return true;
}

static void test_glsl_error_message(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const char *bad = "//@@ember-kernel broken\n"
                      "#version 450\n"
                      "layout(local_size_x = 1) in;\n"
                      "void main() {\n"
                      "    float v = undefined_thing * 2.0;\n"
                      "}\n";
    char path[1100];
    temp_file("bad.spv", path, sizeof(path));
    int tried = 0;
    for (size_t c = 0; c < EM_ARRAY_LEN(COMPILERS); c++) {
        if (!use_compiler(dev, COMPILERS[c])) continue;
        tried++;
        assert_int_equal(dev->drv->build(dev->state, bad, path), EM_ERR_COMPILE);
        const char *msg = em_last_error();
        fprintf(stderr, "compile error as reported:\n%s\n", msg);
        assert_non_null(strstr(msg, COMPILERS[c])); /* names the compiler */
        assert_non_null(strstr(msg, "broken"));
        assert_non_null(strstr(msg, "undefined_thing")); /* the compiler's own words */
        assert_non_null(strstr(msg, "broken.comp:4"));   /* file:line of the shader */
        assert_non_null(strstr(msg, "4 |     float v = undefined_thing")); /* the line itself */
        assert_null(strstr(msg, "/tmp"));                                  /* no temp paths */
        assert_null(strstr(msg, EMBER_TEST_TMP));
        /* a source that names no kernel */
        assert_int_equal(dev->drv->build(dev->state, "#version 450\nvoid main(){}\n", path),
                         EM_ERR_INVALID);
    }
    unsetenv("EMBER_VK_COMPILER");
    assert_true(tried >= 1);
    /* a compiler that does not exist is named in the error */
    setenv("EMBER_GLSLANG", "/nonexistent/glslangValidator", 1);
    setenv("EMBER_VK_COMPILER", "glslang", 1);
    char id[600];
    assert_int_equal(dev->drv->compiler_id(dev->state, id, sizeof(id)), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "/nonexistent/glslangValidator"));
    unsetenv("EMBER_GLSLANG");
    unsetenv("EMBER_VK_COMPILER");
    em_device_close(dev);
}

/* Runs spirv-val on a file; 0 when valid, -1 when the tool is missing. */
static int spirv_val(const char *path, const char *env)
{
    char cmd[2400];
    snprintf(cmd, sizeof(cmd),
             "command -v spirv-val >/dev/null 2>&1 || exit 127; "
             "spirv-val --target-env %s '%s'",
             env, path);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) return 1;
    return WEXITSTATUS(rc) == 127 ? -1 : WEXITSTATUS(rc);
}

static void test_spirv_val_and_entry_name(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const char *env = strstr(em_device_caps(dev)->arch, "vulkan1.");
    for (size_t c = 0; c < EM_ARRAY_LEN(COMPILERS); c++) {
        if (!use_compiler(dev, COMPILERS[c])) continue;
        built b;
        build_load(dev, AXPY_GLSL, &b);
        int rc = spirv_val(b.path, env);
        if (rc == -1)
            fprintf(stderr, "spirv-val not installed: validation skipped\n");
        else
            assert_int_equal(rc, 0);
        /* a single kernel is a plain module whose entry point carries the kernel's name */
        size_t len = 0;
        char *data = em_file_read(b.path, &len);
        assert_non_null(data);
        uint32_t magic;
        memcpy(&magic, data, 4);
        assert_int_equal(magic, 0x07230203u);
        assert_non_null(memmem(data, len, "axpy", 5)); /* with its NUL */
        free(data);
        dev->drv->unload(dev->state, b.module);
    }
    unsetenv("EMBER_VK_COMPILER");
    em_device_close(dev);
}

/* Writes bytes to a fresh file and expects load to fail with EM_ERR_CORRUPT. */
static void expect_corrupt(em_device *dev, const void *bytes, size_t len, const char *what)
{
    char path[1100];
    temp_file("c.spv", path, sizeof(path));
    assert_int_equal(em_file_write_atomic(path, bytes, len), EM_OK);
    void *m = NULL;
    em_status st = dev->drv->load(dev->state, path, &m);
    if (st != EM_ERR_CORRUPT)
        fail_msg("%s: load returned %d (%s), expected EM_ERR_CORRUPT", what, (int)st,
                 em_last_error());
}

static void test_corrupt_binaries(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    built b;
    build_load(dev, AXPY_GLSL, &b);
    size_t len = 0;
    uint32_t *good = (uint32_t *)(void *)em_file_read(b.path, &len);
    assert_non_null(good);
    size_t nw = len / 4;
    uint32_t *w = malloc(len + 64);
    assert_non_null(w);

    expect_corrupt(dev, "hello", 5, "text");
    expect_corrupt(dev, "", 0, "empty");
    expect_corrupt(dev, good, len - 4, "truncated by a word");
    expect_corrupt(dev, good, len - 1, "truncated by a byte");
    expect_corrupt(dev, good, 20, "header only");
    memcpy(w, good, len);
    w[0] ^= 1;
    expect_corrupt(dev, w, len, "bad magic");
    memcpy(w, good, len);
    w[1] = 0x00090000;
    expect_corrupt(dev, w, len, "bad version");
    memcpy(w, good, len);
    w[3] = 0;
    expect_corrupt(dev, w, len, "zero bound");
    memcpy(w, good, len);
    w[5] = 0xffff0011; /* first instruction claims 65535 words */
    expect_corrupt(dev, w, len, "overlong instruction");
    memcpy(w, good, len);
    w[5] &= 0xffff; /* zero word count */
    expect_corrupt(dev, w, len, "zero-length instruction");
    /* batch containers */
    uint32_t hdr[3];
    memcpy(hdr, "EMBSPVB1", 8);
    hdr[2] = 0;
    expect_corrupt(dev, hdr, 12, "empty batch");
    hdr[2] = 2;
    memcpy(w, hdr, 12);
    w[3] = (uint32_t)nw;
    memcpy(w + 4, good, len);
    expect_corrupt(dev, w, 16 + len, "batch missing its second module");
    w[3] = (uint32_t)nw + 100;
    expect_corrupt(dev, w, 16 + len, "batch entry past the end");
    /* a module cut at any word boundary is detected (partial instruction, or no final
     * OpFunctionEnd); bit flips inside a module are the cache's content hash's job */
    for (size_t cut = 1; cut < nw; cut++) {
        char path[1100];
        temp_file("t.spv", path, sizeof(path));
        assert_int_equal(em_file_write_atomic(path, good, cut * 4), EM_OK);
        void *m = NULL;
        em_status st = dev->drv->load(dev->state, path, &m);
        if (st != EM_ERR_CORRUPT)
            fail_msg("module cut at word %zu of %zu: load returned %d (%s)", cut, nw, (int)st,
                     em_last_error());
    }
    free(w);
    free(good);
    dev->drv->unload(dev->state, b.module);
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

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--probe-why") == 0) return probe_child(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_caps),          cmocka_unit_test(test_probe_reasons),
        cmocka_unit_test(test_buffers_mapped),     cmocka_unit_test(test_buffers_staged),
        cmocka_unit_test(test_out_of_memory),      cmocka_unit_test(test_glsl_axpy),
        cmocka_unit_test(test_many_launches),      cmocka_unit_test(test_glsl_batch),
        cmocka_unit_test(test_glsl_error_message), cmocka_unit_test(test_spirv_val_and_entry_name),
        cmocka_unit_test(test_corrupt_binaries),   cmocka_unit_test(test_events),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (tmp_dir[0]) em_remove_tree(tmp_dir);
    return failed;
}
