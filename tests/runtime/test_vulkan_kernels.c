/* test_vulkan_kernels.c — IR kernels built with the builder API, compiled for "vulkan:0" through
 * the public runtime API (GLSL generator -> SPIR-V -> pipelines) and checked against C
 * references: elementwise kernels over lines of 1, 2, 4 and 8 lanes with their scalar tails
 * (at element offsets) and sentinels after the end, a shared-memory reduction with barriers, an
 * atomic histogram (and float atomics where the device has them), 3-D grids and every position
 * built-in, casts between the device's dtypes, plane sums, a batch compile, `spirv-val` on the
 * binaries in the kernel cache, and a second compile being a disk-cache hit. Skipped when the
 * machine has no Vulkan device, or while the GLSL generator is not built yet. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include "runtime/rt_util.h"

static char cache_dir[1024];

static int setup(void **state)
{
    (void)state;
    rt_fresh_dir("vkkern", cache_dir, sizeof(cache_dir));
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    em_remove_tree(cache_dir);
    return 0;
}

/* The device under test: $EMBER_TEST_DEVICE when it names a Vulkan device, else vulkan:0. */
static const char *test_device(void)
{
    const char *e = getenv("EMBER_TEST_DEVICE");
    return e && strncmp(e, "vulkan:", 7) == 0 ? e : "vulkan:0";
}

/* Opens the device under test, or skips the test (saying why) when the machine has none. */
static em_device *open_or_skip(void) { return rt_open_or_skip("vulkan", test_device()); }

/* Compiles k (and frees it); skips while the GLSL generator is missing, fails otherwise. */
static em_kernel *compile_or_skip(em_device *dev, em_ir_kernel *k)
{
    em_kernel *kern = em_kernel_compile(dev, k);
    if (!kern && em_last_status() == EM_ERR_UNSUPPORTED && strstr(em_last_error(), "glsl") &&
        strstr(em_last_error(), "not built yet")) {
        fprintf(stderr, "skipped: %s\n", em_last_error());
        em_ir_kernel_free(k);
        em_device_close(dev);
        skip();
    }
    if (!kern) fail_msg("compile %s: %s", em_ir_kernel_name(k), em_last_error());
    em_ir_kernel_free(k);
    return kern;
}

static void launch_ok(em_kernel *k, uint32_t cx, uint32_t cy, uint32_t cz, uint32_t dx, uint32_t dy,
                      uint32_t dz, const em_arg *args, size_t nargs)
{
    uint32_t count[3] = {cx, cy, cz}, dim[3] = {dx, dy, dz};
    if (em_launch(k, count, dim, args, nargs) != EM_OK)
        fail_msg("launch %s: %s", em_kernel_name(k), em_last_error());
}

/* ---- elementwise over lines, with tails ------------------------------------------------------ */

/* out[i] = a[i] * s + b[i] for i < len(out), on lines of `lanes` f32. */
static em_ir_kernel *axpb_lines(unsigned lanes)
{
    char name[32];
    snprintf(name, sizeof(name), "axpb_l%u", lanes);
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_type t = em_line(EM_F32, lanes);
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", t, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", t, EM_WRITE, 0);
    em_ir_val s = em_ir_param_scalar(k, "s", em_ty(EM_F32));
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val x = em_ir_binary(k, EM_OP_MUL, em_ir_load(k, a, i), s);
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_ADD, x, em_ir_load(k, b, i)));
    em_ir_end(k);
    return k;
}

static void test_elementwise_lines(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_kernel *scalar = compile_or_skip(dev, axpb_lines(1));
    const unsigned widths[] = {1, 2, 4, 8};
    const float sentinel = 12345.0f, s = 1.5f;
    for (size_t w = 0; w < 4; w++) {
        unsigned lanes = widths[w];
        em_kernel *k = lanes == 1 ? scalar : compile_or_skip(dev, axpb_lines(lanes));
        const uint32_t n = 1000 + lanes - 1; /* a tail of lanes - 1 elements */
        uint32_t lines = n / lanes, tail = n % lanes, body = lines * lanes;
        float *ha = malloc(n * 4), *hb = malloc(n * 4), *ho = malloc((n + 8) * 4);
        for (uint32_t i = 0; i < n; i++) {
            ha[i] = (float)i * 0.5f - 100.0f;
            hb[i] = (float)(i % 7);
        }
        for (uint32_t i = 0; i < n + 8; i++) ho[i] = sentinel;
        em_buffer *a = em_buffer_alloc(dev, n * 4), *b = em_buffer_alloc(dev, n * 4);
        em_buffer *o = em_buffer_alloc(dev, (n + 8) * 4);
        assert_int_equal(em_buffer_write(a, 0, ha, n * 4), EM_OK);
        assert_int_equal(em_buffer_write(b, 0, hb, n * 4), EM_OK);
        assert_int_equal(em_buffer_write(o, 0, ho, (n + 8) * 4), EM_OK);
        em_arg args[4] = {em_arg_buffer(a, lines), em_arg_buffer(b, lines), em_arg_buffer(o, lines),
                          em_arg_f32(s)};
        launch_ok(k, (lines + 63) / 64, 1, 1, 64, 1, 1, args, 4);
        if (tail) { /* the rest with the scalar kernel, at element offsets */
            size_t off = (size_t)body * 4;
            em_arg targs[4] = {em_arg_tensor(a, off, tail, 0, NULL, NULL),
                               em_arg_tensor(b, off, tail, 0, NULL, NULL),
                               em_arg_tensor(o, off, tail, 0, NULL, NULL), em_arg_f32(s)};
            launch_ok(scalar, 1, 1, 1, 64, 1, 1, targs, 4);
        }
        assert_int_equal(em_buffer_read(o, 0, ho, (n + 8) * 4), EM_OK);
        for (uint32_t i = 0; i < n; i++) {
            float want = ha[i] * s + hb[i];
            if (fabsf(ho[i] - want) > 1e-5f * (1 + fabsf(want)))
                fail_msg("lanes %u: out[%u] = %g, want %g", lanes, i, ho[i], want);
        }
        for (uint32_t i = n; i < n + 8; i++)
            if (ho[i] != sentinel)
                fail_msg("lanes %u: out[%u] past the end was written (%g)", lanes, i, ho[i]);
        em_buffer_free(a);
        em_buffer_free(b);
        em_buffer_free(o);
        free(ha);
        free(hb);
        free(ho);
    }
    em_device_close(dev);
}

/* ---- shared memory and barriers -------------------------------------------------------------- */

/* sums[cube] = sum of x over the cube's 256 units (a tree in shared memory). */
static em_ir_kernel *reduce_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("block_sum");
    em_ir_set_cube_dim(k, 256, 1, 1);
    em_type f = em_ty(EM_F32), u = em_ty(EM_U32);
    em_ir_mem x = em_ir_param_buffer(k, "x", f, EM_READ, 0);
    em_ir_mem sums = em_ir_param_buffer(k, "sums", f, EM_WRITE, 0);
    em_ir_mem part = em_ir_shared(k, "part", f, 256);
    em_ir_val t = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val acc = em_ir_var(k, f, "acc");
    em_ir_assign(k, acc, em_ir_const_float(k, f, 0.0));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, x)));
    em_ir_assign(k, acc, em_ir_load(k, x, i));
    em_ir_end(k);
    em_ir_store(k, part, t, acc);
    em_ir_sync_cube(k);
    em_ir_val s = em_ir_var(k, u, "s");
    em_ir_assign(k, s, em_ir_u32(k, 128));
    em_ir_loop_begin(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, s, em_ir_u32(k, 0)));
    em_ir_break(k);
    em_ir_end(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, t, s));
    em_ir_val other = em_ir_load(k, part, em_ir_binary(k, EM_OP_ADD, t, s));
    em_ir_store(k, part, t, em_ir_binary(k, EM_OP_ADD, em_ir_load(k, part, t), other));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_assign(k, s, em_ir_binary(k, EM_OP_SHR, s, em_ir_u32(k, 1)));
    em_ir_end(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, t, em_ir_u32(k, 0)));
    em_ir_store(k, sums, em_ir_builtin(k, EM_CUBE_POS), em_ir_load(k, part, em_ir_u32(k, 0)));
    em_ir_end(k);
    return k;
}

static void test_shared_reduction(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_kernel *k = compile_or_skip(dev, reduce_kernel());
    const uint32_t n = 10000, cubes = (n + 255) / 256;
    float *hx = malloc(n * 4), *hs = malloc(cubes * 4);
    for (uint32_t i = 0; i < n; i++)
        hx[i] = (float)((i * 37) % 101) - 50.0f; /* small integers: sums are exact */
    em_buffer *x = em_buffer_alloc(dev, n * 4), *s = em_buffer_alloc(dev, cubes * 4);
    assert_int_equal(em_buffer_write(x, 0, hx, n * 4), EM_OK);
    em_arg args[2] = {em_arg_buffer(x, n), em_arg_buffer(s, cubes)};
    launch_ok(k, cubes, 1, 1, 256, 1, 1, args, 2);
    assert_int_equal(em_buffer_read(s, 0, hs, cubes * 4), EM_OK);
    for (uint32_t c = 0; c < cubes; c++) {
        double want = 0;
        for (uint32_t i = c * 256; i < n && i < (c + 1) * 256; i++) want += hx[i];
        if (hs[c] != (float)want) fail_msg("cube %u: sum %g, want %g", c, hs[c], want);
    }
    /* the fixed cube dimension is enforced */
    uint32_t count[3] = {cubes, 1, 1}, dim[3] = {128, 1, 1};
    assert_int_not_equal(em_launch(k, count, dim, args, 2), EM_OK);
    em_buffer_free(x);
    em_buffer_free(s);
    free(hx);
    free(hs);
    em_device_close(dev);
}

/* ---- atomics --------------------------------------------------------------------------------- */

/* hist[x[i] % 16] += 1 (u32 atomics); with float atomics also total += xf[i]. */
static em_ir_kernel *histogram_kernel(bool with_float)
{
    em_ir_kernel *k = em_ir_kernel_new(with_float ? "hist_f" : "hist");
    em_type u = em_ty(EM_U32), f = em_ty(EM_F32);
    em_ir_mem x = em_ir_param_buffer(k, "x", u, EM_READ, 0);
    em_ir_mem hist = em_ir_param_buffer(k, "hist", u, EM_READ_WRITE, 0);
    em_ir_mem xf = 0, total = 0;
    if (with_float) {
        xf = em_ir_param_buffer(k, "xf", f, EM_READ, 0);
        total = em_ir_param_buffer(k, "total", f, EM_READ_WRITE, 0);
    }
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, x)));
    em_ir_val bin = em_ir_binary(k, EM_OP_REM, em_ir_load(k, x, i), em_ir_u32(k, 16));
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, hist, bin, em_ir_u32(k, 1), EM_IR_NONE);
    if (with_float)
        em_ir_atomic(k, EM_OP_ATOMIC_ADD, total, em_ir_u32(k, 0), em_ir_load(k, xf, i), EM_IR_NONE);
    em_ir_end(k);
    return k;
}

static void test_atomic_histogram(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    bool fa = em_device_caps(dev)->float_atomic_add;
    em_kernel *k = compile_or_skip(dev, histogram_kernel(fa));
    const uint32_t n = 50000;
    uint32_t *hx = malloc(n * 4), hist[16] = {0}, want[16] = {0};
    float *hf = malloc(n * 4), total = 0;
    double want_total = 0;
    for (uint32_t i = 0; i < n; i++) {
        hx[i] = i * 2654435761u >> 7;
        want[hx[i] % 16]++;
        hf[i] = (float)(i % 5); /* small integers: any order sums exactly */
        want_total += hf[i];
    }
    em_buffer *x = em_buffer_alloc(dev, n * 4), *h = em_buffer_alloc(dev, 64);
    em_buffer *xf = em_buffer_alloc(dev, n * 4), *t = em_buffer_alloc(dev, 4);
    assert_int_equal(em_buffer_write(x, 0, hx, n * 4), EM_OK);
    assert_int_equal(em_buffer_write(xf, 0, hf, n * 4), EM_OK);
    assert_int_equal(em_buffer_fill_zero(h), EM_OK);
    assert_int_equal(em_buffer_fill_zero(t), EM_OK);
    em_arg args[4] = {em_arg_buffer(x, n), em_arg_buffer(h, 16), em_arg_buffer(xf, n),
                      em_arg_buffer(t, 1)};
    launch_ok(k, (n + 127) / 128, 1, 1, 128, 1, 1, args, fa ? 4 : 2);
    assert_int_equal(em_buffer_read(h, 0, hist, 64), EM_OK);
    assert_memory_equal(hist, want, 64);
    if (fa) {
        assert_int_equal(em_buffer_read(t, 0, &total, 4), EM_OK);
        assert_true(total == (float)want_total);
    } else {
        fprintf(stderr, "no float atomic add on this device: float part skipped\n");
    }
    em_buffer_free(x);
    em_buffer_free(h);
    em_buffer_free(xf);
    em_buffer_free(t);
    free(hx);
    free(hf);
    em_device_close(dev);
}

/* ---- 3-D grids ------------------------------------------------------------------------------- */

static const em_builtin POSITIONS[] = {
    EM_ABSOLUTE_POS_X, EM_ABSOLUTE_POS_Y, EM_ABSOLUTE_POS_Z, EM_UNIT_POS,   EM_UNIT_POS_X,
    EM_UNIT_POS_Y,     EM_UNIT_POS_Z,     EM_CUBE_POS,       EM_CUBE_POS_X, EM_CUBE_POS_Y,
    EM_CUBE_POS_Z,     EM_CUBE_DIM,       EM_CUBE_COUNT,
};
#define NPOS (sizeof(POSITIONS) / sizeof(POSITIONS[0]))

/* out[ABSOLUTE_POS * NPOS + j] = POSITIONS[j] */
static em_ir_kernel *positions_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("positions3d");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_val base =
        em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_ABSOLUTE_POS), em_ir_u32(k, (uint32_t)NPOS));
    for (uint32_t j = 0; j < NPOS; j++)
        em_ir_store(k, out, em_ir_binary(k, EM_OP_ADD, base, em_ir_u32(k, j)),
                    em_ir_builtin(k, POSITIONS[j]));
    return k;
}

static void test_3d_grid(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_kernel *k = compile_or_skip(dev, positions_kernel());
    const uint32_t C[3] = {5, 3, 2}, D[3] = {4, 2, 3};
    const uint32_t units = D[0] * D[1] * D[2], cubes = C[0] * C[1] * C[2];
    const uint32_t n = units * cubes * (uint32_t)NPOS;
    em_buffer *out = em_buffer_alloc(dev, n * 4);
    em_arg arg = em_arg_buffer(out, n);
    launch_ok(k, C[0], C[1], C[2], D[0], D[1], D[2], &arg, 1);
    uint32_t *h = malloc(n * 4);
    assert_int_equal(em_buffer_read(out, 0, h, n * 4), EM_OK);
    for (uint32_t cz = 0; cz < C[2]; cz++)
        for (uint32_t cy = 0; cy < C[1]; cy++)
            for (uint32_t cx = 0; cx < C[0]; cx++)
                for (uint32_t uz = 0; uz < D[2]; uz++)
                    for (uint32_t uy = 0; uy < D[1]; uy++)
                        for (uint32_t ux = 0; ux < D[0]; ux++) {
                            uint32_t cube = cx + C[0] * (cy + C[1] * cz);
                            uint32_t unit = ux + D[0] * (uy + D[1] * uz);
                            uint32_t want[NPOS] = {cx * D[0] + ux,
                                                   cy * D[1] + uy,
                                                   cz * D[2] + uz,
                                                   unit,
                                                   ux,
                                                   uy,
                                                   uz,
                                                   cube,
                                                   cx,
                                                   cy,
                                                   cz,
                                                   units,
                                                   cubes};
                            const uint32_t *got = h + (cube * units + unit) * NPOS;
                            for (uint32_t j = 0; j < NPOS; j++)
                                if (got[j] != want[j])
                                    fail_msg("cube (%u,%u,%u) unit (%u,%u,%u): %s = %u, want %u",
                                             cx, cy, cz, ux, uy, uz, em_builtin_name(POSITIONS[j]),
                                             got[j], want[j]);
                        }
    free(h);
    em_buffer_free(out);
    em_device_close(dev);
}

/* ---- casts ----------------------------------------------------------------------------------- */

/* out[i] = (to) x[i] */
static em_ir_kernel *cast_kernel(em_scalar from, em_scalar to)
{
    char name[64];
    snprintf(name, sizeof(name), "cast_%s_%s", em_scalar_name(from), em_scalar_name(to));
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_ir_mem x = em_ir_param_buffer(k, "x", em_ty(from), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(to), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_store(k, out, i, em_ir_cast(k, em_ty(to), em_ir_load(k, x, i)));
    em_ir_end(k);
    return k;
}

static double read_as(const void *p, em_scalar s)
{
    switch (s) {
    case EM_I8:
        return *(const int8_t *)p;
    case EM_U8:
        return *(const uint8_t *)p;
    case EM_I16:
        return *(const int16_t *)p;
    case EM_U16:
        return *(const uint16_t *)p;
    case EM_I32:
        return *(const int32_t *)p;
    case EM_U32:
        return *(const uint32_t *)p;
    case EM_I64:
        return (double)*(const int64_t *)p;
    case EM_U64:
        return (double)*(const uint64_t *)p;
    case EM_F32:
        return *(const float *)p;
    case EM_F64:
        return *(const double *)p;
    case EM_F16: {
        uint16_t h = *(const uint16_t *)p;
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        return h & 0x8000 ? -v : v;
    }
    default:
        return NAN;
    }
}

static void write_as(void *p, em_scalar s, double v)
{
    switch (s) {
    case EM_I8:
        *(int8_t *)p = (int8_t)v;
        break;
    case EM_U8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case EM_I16:
        *(int16_t *)p = (int16_t)v;
        break;
    case EM_U16:
        *(uint16_t *)p = (uint16_t)v;
        break;
    case EM_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    case EM_U32:
        *(uint32_t *)p = (uint32_t)v;
        break;
    case EM_I64:
        *(int64_t *)p = (int64_t)v;
        break;
    case EM_U64:
        *(uint64_t *)p = (uint64_t)v;
        break;
    case EM_F32:
        *(float *)p = (float)v;
        break;
    case EM_F64:
        *(double *)p = v;
        break;
    default:
        break;
    }
}

static void test_casts(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const em_caps *caps = em_device_caps(dev);
    /* values every pair below represents: small, signed only where both sides are signed */
    const double sv[] = {0, 1, -1, 2.75, -3.5, 100.25, -100.75, 126.5, 0.4999, -0.5};
    const double uv[] = {0, 1, 2.75, 3.5, 100.25, 126.5, 250.9, 0.4999, 7, 255};
    const em_scalar kinds[] = {EM_F32, EM_I32, EM_U32, EM_F64, EM_I64, EM_U64,
                               EM_F16, EM_I16, EM_U16, EM_I8,  EM_U8};
    const uint32_t nv = 10;
    int tried = 0;
    for (size_t a = 0; a < EM_ARRAY_LEN(kinds); a++) {
        for (size_t b = 0; b < EM_ARRAY_LEN(kinds); b++) {
            em_scalar from = kinds[a], to = kinds[b];
            if (from == to || !caps->dtype[from] || !caps->dtype[to]) continue;
            if (from == EM_F16 || (from != EM_F32 && to != EM_F32 && from != EM_I32))
                continue; /* f32 and i32 to everything, everything to f32 */
            bool is_signed = em_scalar_is_signed(from) && em_scalar_is_signed(to);
            const double *vals = is_signed ? sv : uv;
            size_t fs = em_scalar_size(from), ts = em_scalar_size(to);
            uint8_t in[80], out[80], want[80];
            for (uint32_t i = 0; i < nv; i++) {
                double v = em_scalar_is_float(from) ? vals[i] : trunc(vals[i]);
                write_as(in + i * fs, from, v);
            }
            em_kernel *k = compile_or_skip(dev, cast_kernel(from, to));
            em_buffer *x = em_buffer_alloc(dev, nv * fs), *o = em_buffer_alloc(dev, nv * ts);
            assert_int_equal(em_buffer_write(x, 0, in, nv * fs), EM_OK);
            em_arg args[2] = {em_arg_buffer(x, nv), em_arg_buffer(o, nv)};
            launch_ok(k, 1, 1, 1, 32, 1, 1, args, 2);
            assert_int_equal(em_buffer_read(o, 0, out, nv * ts), EM_OK);
            for (uint32_t i = 0; i < nv; i++) {
                double v = read_as(in + i * fs, from);
                double w;
                if (to == EM_F16) { /* values here are exact in f16 or rounded once */
                    w = v;
                    double got = read_as(out + i * ts, to);
                    if (fabs(got - w) > fabs(w) * 1e-3)
                        fail_msg("cast %s -> %s of %g gave %g", em_scalar_name(from),
                                 em_scalar_name(to), v, got);
                    continue;
                }
                write_as(want + i * ts, to, em_scalar_is_float(to) ? v : trunc(v));
                w = read_as(want + i * ts, to);
                double got = read_as(out + i * ts, to);
                if (to == EM_F32 ? (float)got != (float)w : got != w)
                    fail_msg("cast %s -> %s of %g gave %g, want %g", em_scalar_name(from),
                             em_scalar_name(to), v, got, w);
            }
            em_buffer_free(x);
            em_buffer_free(o);
            tried++;
        }
    }
    fprintf(stderr, "%d cast pairs checked\n", tried);
    assert_true(tried >= 4);
    em_device_close(dev);
}

/* ---- plane operations ------------------------------------------------------------------------ */

static void test_plane_sum(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const em_caps *caps = em_device_caps(dev);
    if (!caps->plane_ops) {
        fprintf(stderr, "skipped: no plane operations on %s\n", caps->device_name);
        em_device_close(dev);
        skip();
    }
    em_ir_kernel *ir = em_ir_kernel_new("plane_sum");
    em_ir_mem x = em_ir_param_buffer(ir, "x", em_ty(EM_U32), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(ir, "out", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(ir, EM_ABSOLUTE_POS);
    em_ir_val sum = em_ir_plane(ir, EM_OP_PLANE_SUM, em_ir_load(ir, x, i), EM_IR_NONE);
    em_ir_store(ir, out, i, sum);
    em_kernel *k = compile_or_skip(dev, ir);
    const uint32_t n = 256, p = caps->plane_dim;
    uint32_t hx[256], ho[256];
    for (uint32_t j = 0; j < n; j++) hx[j] = j * 3 + 1;
    em_buffer *bx = em_buffer_alloc(dev, n * 4), *bo = em_buffer_alloc(dev, n * 4);
    assert_int_equal(em_buffer_write(bx, 0, hx, n * 4), EM_OK);
    em_arg args[2] = {em_arg_buffer(bx, n), em_arg_buffer(bo, n)};
    launch_ok(k, n / 64, 1, 1, 64, 1, 1, args, 2);
    assert_int_equal(em_buffer_read(bo, 0, ho, n * 4), EM_OK);
    for (uint32_t j = 0; j < n; j++) {
        uint32_t first = j / p * p, want = 0;
        for (uint32_t q = first; q < first + p; q++) want += hx[q];
        if (ho[j] != want)
            fail_msg("unit %u: plane sum %u, want %u (plane of %u)", j, ho[j], want, p);
    }
    em_buffer_free(bx);
    em_buffer_free(bo);
    em_device_close(dev);
}

/* ---- the kernel cache ------------------------------------------------------------------------ */

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

/* Validates one module given as words; returns spirv_val's result. */
static int validate_words(const uint32_t *w, size_t n, const char *dir, const char *env)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/module.spv", dir);
    if (em_file_write_atomic(path, w, n * 4) != EM_OK) return 1;
    int rc = spirv_val(path, env);
    unlink(path);
    return rc;
}

static void test_cache_spirv_val_and_disk_hit(void **state)
{
    (void)state;
    char dir[1024];
    rt_fresh_dir("vkcache", dir, sizeof(dir));
    setenv("EMBER_CACHE_DIR", dir, 1);
    em_device *dev = open_or_skip();
    /* one kernel alone (a plain SPIR-V module) and a batch of two (a container) */
    em_kernel *one = compile_or_skip(dev, axpb_lines(4));
    em_ir_kernel *batch[2] = {histogram_kernel(false), positions_kernel()};
    em_kernel *outs[2];
    em_status st = em_kernel_compile_batch(dev, (const em_ir_kernel *const *)batch, 2, outs);
    if (st != EM_OK) fail_msg("batch compile: %s", em_last_error());
    em_ir_kernel_free(batch[0]);
    em_ir_kernel_free(batch[1]);
    assert_non_null(one);
    /* every single-module binary in the cache passes spirv-val */
    const char *env = strstr(em_device_caps(dev)->arch, "vulkan1.");
    char kdir[1100];
    snprintf(kdir, sizeof(kdir), "%s/kernels", dir);
    DIR *d = opendir(kdir);
    assert_non_null(d);
    struct dirent *e;
    int validated = 0, containers = 0;
    while ((e = readdir(d))) {
        size_t nlen = strlen(e->d_name);
        if (nlen < 5 || strcmp(e->d_name + nlen - 4, ".spv") != 0) continue;
        char path[2200];
        snprintf(path, sizeof(path), "%s/%s", kdir, e->d_name);
        size_t len = 0;
        uint32_t *w = (uint32_t *)(void *)em_file_read(path, &len);
        assert_non_null(w);
        assert_true(len >= 12 && len % 4 == 0);
        int rc = 0;
        if (memcmp(w, "EMBSPVB1", 8) == 0) { /* a batch: validate each module in it */
            containers++;
            size_t at = 3, nw = len / 4;
            for (uint32_t m = 0; m < w[2] && rc == 0; m++) {
                assert_true(at < nw && w[at] <= nw - at - 1);
                rc = validate_words(w + at + 1, w[at], dir, env);
                validated += rc == 0;
                at += 1 + w[at];
            }
            assert_int_equal(at, nw);
        } else {
            rc = spirv_val(path, env);
            validated += rc == 0;
        }
        free(w);
        if (rc == -1) {
            fprintf(stderr, "spirv-val not installed: validation skipped\n");
            break;
        }
        if (rc != 0) fail_msg("spirv-val rejects %s", path);
    }
    closedir(d);
    assert_int_equal(containers, 1);
    assert_true(validated == 0 || validated == 3); /* 0: spirv-val missing */
    fprintf(stderr, "%d cached SPIR-V module(s) validated\n", validated);
    /* a fresh device (empty memory cache): the same kernel comes from disk */
    em_device_close(dev);
    em_cache_stats s0;
    em_cache_stats_get(&s0);
    dev = em_device_open(test_device());
    assert_non_null(dev);
    em_kernel *again = compile_or_skip(dev, axpb_lines(4));
    assert_non_null(again);
    em_cache_stats s1;
    em_cache_stats_get(&s1);
    assert_int_equal(s1.disk_hits - s0.disk_hits, 1);
    assert_int_equal(s1.compiles - s0.compiles, 0);
    /* and it still runs */
    float ha[16], hb[16], ho[16];
    for (int i = 0; i < 16; i++) {
        ha[i] = (float)i;
        hb[i] = 1.0f;
    }
    em_buffer *a = em_buffer_alloc(dev, 64), *b = em_buffer_alloc(dev, 64);
    em_buffer *o = em_buffer_alloc(dev, 64);
    em_buffer_write(a, 0, ha, 64);
    em_buffer_write(b, 0, hb, 64);
    em_arg args[4] = {em_arg_buffer(a, 4), em_arg_buffer(b, 4), em_arg_buffer(o, 4),
                      em_arg_f32(2.0f)};
    launch_ok(again, 1, 1, 1, 64, 1, 1, args, 4);
    assert_int_equal(em_buffer_read(o, 0, ho, 64), EM_OK);
    for (int i = 0; i < 16; i++) assert_true(ho[i] == 2.0f * (float)i + 1.0f);
    em_buffer_free(a);
    em_buffer_free(b);
    em_buffer_free(o);
    em_device_close(dev);
    em_remove_tree(dir);
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_lines),
        cmocka_unit_test(test_shared_reduction),
        cmocka_unit_test(test_atomic_histogram),
        cmocka_unit_test(test_3d_grid),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_plane_sum),
        cmocka_unit_test(test_cache_spirv_val_and_disk_hit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
