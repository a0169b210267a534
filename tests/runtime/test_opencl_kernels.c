/* test_opencl_kernels.c — IR kernels built with the builder API, compiled for "opencl:0" through
 * the public runtime (em_kernel_compile: OpenCL code generator, clBuildProgram, program binary in
 * the kernel cache) and launched with em_launch, each result compared with a C reference:
 * elementwise over lines of 1, 2, 4 and 8 lanes with partial last cubes, a shared-memory
 * reduction with barriers, an atomic histogram (shared and global atomics), 3-D grids and their
 * positions, f64, casts between kinds (f16 and bf16 included), launches of one kernel from several
 * threads at once, and the program-binary disk cache (a fresh device compiling the same kernel
 * again is a disk hit). Skipped without OpenCL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include "runtime/rt_util.h"

/* Opens opencl:0, or skips the test (saying why) when the machine has none. */
static em_device *open_or_skip(void) { return rt_open_or_skip("opencl", "opencl:0"); }

/* Compiles k on dev (failing the test with the message otherwise); frees k. */
static em_kernel *compile(em_device *dev, em_ir_kernel *k)
{
    assert_non_null(k);
    em_kernel *kern = em_kernel_compile(dev, k);
    if (!kern) {
        char *src = em_kernel_source(k, "opencl");
        fprintf(stderr, "---- generated source ----\n%s\n", src ? src : em_last_error());
        free(src);
        em_ir_kernel_free(k);
        fail_msg("em_kernel_compile: %s", em_last_error());
    }
    em_ir_kernel_free(k);
    return kern;
}

static void launch(em_kernel *kern, uint32_t cx, uint32_t cy, uint32_t cz, uint32_t dx, uint32_t dy,
                   uint32_t dz, const em_arg *args, size_t nargs)
{
    uint32_t count[3] = {cx, cy, cz}, dim[3] = {dx, dy, dz};
    if (em_launch(kern, count, dim, args, nargs) != EM_OK)
        fail_msg("em_launch(%s): %s", em_kernel_name(kern), em_last_error());
}

static em_buffer *upload(em_device *dev, const void *data, size_t bytes)
{
    em_buffer *b = em_buffer_alloc(dev, bytes);
    assert_non_null(b);
    assert_int_equal(em_buffer_write(b, 0, data, bytes), EM_OK);
    return b;
}

/* ---- elementwise over lines ------------------------------------------------------------------ */

/* out[i] = a[i] * b[i] + sqrt(|a[i]|) - 0.5 over lines of `lanes` f32 for i < len(out). */
static em_ir_kernel *ew_kernel(unsigned lanes)
{
    char name[32];
    snprintf(name, sizeof(name), "ocl_ew_l%u", lanes);
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_type t = em_line(EM_F32, lanes);
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", t, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", t, EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i);
    em_ir_val r = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, x, y),
                               em_ir_unary(k, EM_OP_SQRT, em_ir_unary(k, EM_OP_ABS, x)));
    r = em_ir_binary(k, EM_OP_SUB, r, em_ir_const_float(k, em_ty(EM_F32), 0.5));
    em_ir_store(k, out, i, r);
    em_ir_end(k);
    return k;
}

static void test_elementwise_lines(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    static const unsigned widths[] = {1, 2, 4, 8};
    const uint32_t lines = 1000; /* not a multiple of the cube: the last cube is partial */
    for (size_t w = 0; w < EM_ARRAY_LEN(widths); w++) {
        unsigned lanes = widths[w];
        size_t n = (size_t)lines * lanes, extra = 16; /* sentinels past the view */
        float *ha = malloc((n + extra) * 4), *hb = malloc((n + extra) * 4);
        float *ho = malloc((n + extra) * 4);
        assert_true(ha && hb && ho);
        for (size_t i = 0; i < n + extra; i++) {
            ha[i] = (float)((int)(i % 97) - 40) * 0.125f;
            hb[i] = (float)(i % 13) * 0.5f - 2.0f;
            ho[i] = -12345.0f;
        }
        em_buffer *a = upload(dev, ha, (n + extra) * 4), *b = upload(dev, hb, (n + extra) * 4);
        em_buffer *o = upload(dev, ho, (n + extra) * 4);
        em_kernel *kern = compile(dev, ew_kernel(lanes));
        em_arg args[3] = {em_arg_buffer(a, lines), em_arg_buffer(b, lines),
                          em_arg_buffer(o, lines)};
        launch(kern, (lines + 63) / 64, 1, 1, 64, 1, 1, args, 3);
        assert_int_equal(em_buffer_read(o, 0, ho, (n + extra) * 4), EM_OK);
        for (size_t i = 0; i < n; i++) {
            float want = ha[i] * hb[i] + sqrtf(fabsf(ha[i])) - 0.5f;
            if (fabsf(ho[i] - want) > 1e-5f * (1.0f + fabsf(want)))
                fail_msg("lanes %u: out[%zu] = %g, want %g", lanes, i, ho[i], want);
        }
        for (size_t i = n; i < n + extra; i++) assert_float_equal(ho[i], -12345.0f, 0.0);
        em_buffer_free(a);
        em_buffer_free(b);
        em_buffer_free(o);
        free(ha);
        free(hb);
        free(ho);
    }
    em_device_close(dev);
}

/* ---- shared-memory reduction ----------------------------------------------------------------- */

/* out[CUBE_POS] = sum of the cube's 256 inputs (0 past len), by halving in shared memory with a
 * barrier after every step. */
static em_ir_kernel *reduce_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ocl_reduce256");
    em_type f = em_ty(EM_F32);
    em_ir_mem in = em_ir_param_buffer(k, "in", f, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_WRITE, 0);
    em_ir_mem s = em_ir_shared(k, "s", f, 256);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val v = em_ir_var(k, f, "v");
    em_ir_assign(k, v, em_ir_const_float(k, f, 0.0));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, in)));
    em_ir_assign(k, v, em_ir_load(k, in, i));
    em_ir_end(k);
    em_ir_store(k, s, u, v);
    em_ir_sync_cube(k);
    for (uint32_t half = 128; half >= 1; half /= 2) {
        em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, u, em_ir_u32(k, half)));
        em_ir_val other = em_ir_load(k, s, em_ir_binary(k, EM_OP_ADD, u, em_ir_u32(k, half)));
        em_ir_store(k, s, u, em_ir_binary(k, EM_OP_ADD, em_ir_load(k, s, u), other));
        em_ir_end(k);
        em_ir_sync_cube(k);
    }
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, u, em_ir_u32(k, 0)));
    em_ir_store(k, out, em_ir_builtin(k, EM_CUBE_POS), em_ir_load(k, s, em_ir_u32(k, 0)));
    em_ir_end(k);
    return k;
}

static void test_shared_reduction(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    if (em_device_caps(dev)->max_cube_units < 256) {
        em_device_close(dev);
        skip();
    }
    const uint32_t n = 10000, cubes = (n + 255) / 256;
    float *h = malloc(n * 4), got[64];
    assert_non_null(h);
    for (uint32_t i = 0; i < n; i++) h[i] = (float)(i % 17) - 8.0f + (float)(i % 3) * 0.25f;
    em_buffer *in = upload(dev, h, n * 4), *out = em_buffer_alloc(dev, cubes * 4);
    assert_non_null(out);
    em_kernel *kern = compile(dev, reduce_kernel());
    em_arg args[2] = {em_arg_buffer(in, n), em_arg_buffer(out, cubes)};
    launch(kern, cubes, 1, 1, 256, 1, 1, args, 2);
    assert_int_equal(em_buffer_read(out, 0, got, cubes * 4), EM_OK);
    for (uint32_t c = 0; c < cubes; c++) {
        double want = 0;
        for (uint32_t i = c * 256; i < (c + 1) * 256 && i < n; i++) want += h[i];
        if (fabs(got[c] - want) > 1e-3) fail_msg("cube %u: sum %g, want %g", c, got[c], want);
    }
    em_buffer_free(in);
    em_buffer_free(out);
    free(h);
    em_device_close(dev);
}

/* ---- atomic histogram ------------------------------------------------------------------------ */

#define BINS 64

/* Counts data[i] % BINS into a shared histogram with shared atomics, then adds it to the global
 * one with global atomics; also counts every element into total[0]. */
static em_ir_kernel *histogram_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ocl_histogram");
    em_type u32 = em_ty(EM_U32);
    em_ir_mem data = em_ir_param_buffer(k, "data", u32, EM_READ, 0);
    em_ir_mem hist = em_ir_param_buffer(k, "hist", u32, EM_READ_WRITE, 0);
    em_ir_mem total = em_ir_param_buffer(k, "total", em_ty(EM_I32), EM_READ_WRITE, 0);
    em_ir_mem local = em_ir_shared(k, "local_hist", u32, BINS);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val bins = em_ir_u32(k, BINS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, u, bins));
    em_ir_store(k, local, u, em_ir_u32(k, 0));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, data)));
    em_ir_val bin = em_ir_binary(k, EM_OP_REM, em_ir_load(k, data, i), bins);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, local, bin, em_ir_u32(k, 1), EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, total, em_ir_u32(k, 0), em_ir_const_int(k, em_ty(EM_I32), 1),
                 EM_IR_NONE);
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, u, bins));
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, hist, u, em_ir_load(k, local, u), EM_IR_NONE);
    em_ir_end(k);
    return k;
}

static void test_atomic_histogram(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const uint32_t n = 50000;
    uint32_t *h = malloc(n * 4), want[BINS] = {0}, got[BINS];
    assert_non_null(h);
    for (uint32_t i = 0; i < n; i++) {
        h[i] = (i * 2654435761u) >> 7;
        want[h[i] % BINS]++;
    }
    em_buffer *data = upload(dev, h, n * 4), *hist = em_buffer_alloc(dev, BINS * 4);
    em_buffer *total = em_buffer_alloc(dev, 4);
    assert_non_null(hist);
    assert_non_null(total);
    assert_int_equal(em_buffer_fill_zero(hist), EM_OK);
    assert_int_equal(em_buffer_fill_zero(total), EM_OK);
    em_kernel *kern = compile(dev, histogram_kernel());
    em_arg args[3] = {em_arg_buffer(data, n), em_arg_buffer(hist, BINS), em_arg_buffer(total, 1)};
    launch(kern, (n + 127) / 128, 1, 1, 128, 1, 1, args, 3);
    int32_t count = 0;
    assert_int_equal(em_buffer_read(hist, 0, got, sizeof(got)), EM_OK);
    assert_int_equal(em_buffer_read(total, 0, &count, 4), EM_OK);
    for (int b = 0; b < BINS; b++)
        if (got[b] != want[b]) fail_msg("bin %d: %u, want %u", b, got[b], want[b]);
    assert_int_equal(count, (int32_t)n);
    em_buffer_free(data);
    em_buffer_free(hist);
    em_buffer_free(total);
    free(h);
    em_device_close(dev);
}

/* ---- 3-D grids ------------------------------------------------------------------------------- */

/* At the unit's 3-D absolute position (x, y, z) in a grid gx * gy * gz (the launch's size, from
 * CUBE_COUNT and CUBE_DIM), writes pos[x + gx*(y + gy*z)] = x + 1000y + 1000000z and
 * lin[same] = ABSOLUTE_POS, checking the linear built-ins against the per-axis ones. */
static em_ir_kernel *grid_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ocl_grid3d");
    em_ir_mem pos = em_ir_param_buffer(k, "pos", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_mem lin = em_ir_param_buffer(k, "lin", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_val x = em_ir_builtin(k, EM_ABSOLUTE_POS_X), y = em_ir_builtin(k, EM_ABSOLUTE_POS_Y);
    em_ir_val z = em_ir_builtin(k, EM_ABSOLUTE_POS_Z);
    em_ir_val gx = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_COUNT_X),
                                em_ir_builtin(k, EM_CUBE_DIM_X));
    em_ir_val gy = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_COUNT_Y),
                                em_ir_builtin(k, EM_CUBE_DIM_Y));
    em_ir_val idx = em_ir_binary(
        k, EM_OP_ADD, x,
        em_ir_binary(k, EM_OP_MUL, gx,
                     em_ir_binary(k, EM_OP_ADD, y, em_ir_binary(k, EM_OP_MUL, gy, z))));
    em_ir_val v =
        em_ir_binary(k, EM_OP_ADD, x,
                     em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, y, em_ir_u32(k, 1000)),
                                  em_ir_binary(k, EM_OP_MUL, z, em_ir_u32(k, 1000000))));
    em_ir_store(k, pos, idx, v);
    em_ir_store(k, lin, idx, em_ir_builtin(k, EM_ABSOLUTE_POS));
    return k;
}

static void test_grid_3d(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    const uint32_t cc[3] = {3, 4, 5}, cd[3] = {4, 2, 2};
    const uint32_t gx = cc[0] * cd[0], gy = cc[1] * cd[1], gz = cc[2] * cd[2];
    size_t n = (size_t)gx * gy * gz;
    em_buffer *pos = em_buffer_alloc(dev, n * 4), *lin = em_buffer_alloc(dev, n * 4);
    assert_non_null(pos);
    assert_non_null(lin);
    em_kernel *kern = compile(dev, grid_kernel());
    em_arg args[2] = {em_arg_buffer(pos, n), em_arg_buffer(lin, n)};
    launch(kern, cc[0], cc[1], cc[2], cd[0], cd[1], cd[2], args, 2);
    uint32_t *hp = malloc(n * 4), *hl = malloc(n * 4);
    assert_true(hp && hl);
    assert_int_equal(em_buffer_read(pos, 0, hp, n * 4), EM_OK);
    assert_int_equal(em_buffer_read(lin, 0, hl, n * 4), EM_OK);
    uint32_t cube_units = cd[0] * cd[1] * cd[2];
    for (uint32_t z = 0; z < gz; z++)
        for (uint32_t y = 0; y < gy; y++)
            for (uint32_t x = 0; x < gx; x++) {
                size_t i = x + (size_t)gx * (y + (size_t)gy * z);
                assert_int_equal(hp[i], x + 1000 * y + 1000000 * z);
                /* ABSOLUTE_POS = CUBE_POS * CUBE_DIM + UNIT_POS, both linear x-fastest */
                uint32_t cube = x / cd[0] + cc[0] * (y / cd[1] + cc[1] * (z / cd[2]));
                uint32_t unit = x % cd[0] + cd[0] * (y % cd[1] + cd[1] * (z % cd[2]));
                assert_int_equal(hl[i], cube * cube_units + unit);
            }
    free(hp);
    free(hl);
    em_buffer_free(pos);
    em_buffer_free(lin);
    em_device_close(dev);
}

/* ---- f64 ------------------------------------------------------------------------------------- */

/* out[i] = fma(x[i], s, exp(x[i] * 1e-3)) / 3 in f64, s a scalar parameter. */
static em_ir_kernel *f64_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ocl_f64");
    em_type d = em_ty(EM_F64);
    em_ir_mem x = em_ir_param_buffer(k, "x", d, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", d, EM_WRITE, 0);
    em_ir_val s = em_ir_param_scalar(k, "s", d);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val v = em_ir_load(k, x, i);
    em_ir_val e =
        em_ir_unary(k, EM_OP_EXP, em_ir_binary(k, EM_OP_MUL, v, em_ir_const_float(k, d, 1e-3)));
    em_ir_val r = em_ir_binary(k, EM_OP_DIV, em_ir_ternary(k, EM_OP_FMA, v, s, e),
                               em_ir_const_float(k, d, 3.0));
    em_ir_store(k, out, i, r);
    em_ir_end(k);
    return k;
}

static void test_f64(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    if (!em_device_caps(dev)->dtype[EM_F64]) {
        fprintf(stderr, "skipped: this OpenCL device has no cl_khr_fp64\n");
        em_device_close(dev);
        skip();
    }
    const uint32_t n = 777;
    double *h = malloc(n * 8), *o = malloc(n * 8);
    assert_true(h && o);
    for (uint32_t i = 0; i < n; i++) h[i] = 1.0 / 3.0 + (double)i * 1.0000001;
    em_buffer *x = upload(dev, h, n * 8), *out = em_buffer_alloc(dev, n * 8);
    assert_non_null(out);
    em_kernel *kern = compile(dev, f64_kernel());
    const double s = 1.0 + 1e-12; /* a value f32 cannot hold */
    em_arg args[3] = {em_arg_buffer(x, n), em_arg_buffer(out, n), em_arg_f64(s)};
    launch(kern, (n + 31) / 32, 1, 1, 32, 1, 1, args, 3);
    assert_int_equal(em_buffer_read(out, 0, o, n * 8), EM_OK);
    for (uint32_t i = 0; i < n; i++) {
        double want = fma(h[i], s, exp(h[i] * 1e-3)) / 3.0;
        if (fabs(o[i] - want) > 1e-14 * fabs(want))
            fail_msg("out[%u] = %.17g, want %.17g", i, o[i], want);
    }
    em_buffer_free(x);
    em_buffer_free(out);
    free(h);
    free(o);
    em_device_close(dev);
}

/* ---- casts ----------------------------------------------------------------------------------- */

/* From x (f32): i32 (truncation), u8 (of |x| mod 200), f16 and bf16 (rounded to nearest even),
 * and back from f16 to f32; from n (i32): f32 and i64 (sign-extended), and bool (n != 0) as u8. */
static em_ir_kernel *cast_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ocl_casts");
    em_ir_mem x = em_ir_param_buffer(k, "x", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem nn = em_ir_param_buffer(k, "n", em_ty(EM_I32), EM_READ, 0);
    em_ir_mem oi = em_ir_param_buffer(k, "oi", em_ty(EM_I32), EM_WRITE, 0);
    em_ir_mem ou8 = em_ir_param_buffer(k, "ou8", em_ty(EM_U8), EM_WRITE, 0);
    em_ir_mem oh = em_ir_param_buffer(k, "oh", em_ty(EM_F16), EM_WRITE, 0);
    em_ir_mem ob = em_ir_param_buffer(k, "ob", em_ty(EM_BF16), EM_WRITE, 0);
    em_ir_mem ohf = em_ir_param_buffer(k, "ohf", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_mem onf = em_ir_param_buffer(k, "onf", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_mem on64 = em_ir_param_buffer(k, "on64", em_ty(EM_I64), EM_WRITE, 0);
    em_ir_mem obool = em_ir_param_buffer(k, "obool", em_ty(EM_U8), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, x)));
    em_ir_val v = em_ir_load(k, x, i);
    em_ir_store(k, oi, i, em_ir_cast(k, em_ty(EM_I32), v));
    em_ir_val small = em_ir_binary(k, EM_OP_REM, em_ir_unary(k, EM_OP_ABS, v),
                                   em_ir_const_float(k, em_ty(EM_F32), 200.0));
    em_ir_store(k, ou8, i, em_ir_cast(k, em_ty(EM_U8), small));
    em_ir_val h = em_ir_cast(k, em_ty(EM_F16), v);
    em_ir_store(k, oh, i, h);
    em_ir_store(k, ob, i, em_ir_cast(k, em_ty(EM_BF16), v));
    em_ir_store(k, ohf, i, em_ir_cast(k, em_ty(EM_F32), h));
    em_ir_val m = em_ir_load(k, nn, i);
    em_ir_store(k, onf, i, em_ir_cast(k, em_ty(EM_F32), m));
    em_ir_store(k, on64, i, em_ir_cast(k, em_ty(EM_I64), m));
    em_ir_val nz = em_ir_binary(k, EM_OP_NE, m, em_ir_const_int(k, em_ty(EM_I32), 0));
    em_ir_store(k, obool, i, em_ir_cast(k, em_ty(EM_U8), nz));
    em_ir_end(k);
    return k;
}

/* IEEE binary16 / bfloat16 bits of f, rounded to nearest even (normal and subnormal range). */
static uint16_t ref_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    float a = fabsf(f);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) { /* subnormal: units of 2^-24 */
        float q = nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | (uint32_t)q);
    }
    uint32_t m = u & 0x7fffffffu;
    uint32_t r = m + 0xfffu + ((m >> 13) & 1u); /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((r >> 13) - ((127 - 15) << 10)));
}

static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000u) ? -v : v;
}

static void test_casts(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    enum { N = 300 };
    float hx[N];
    int32_t hn[N];
    for (int i = 0; i < N; i++) {
        hx[i] = (float)(i - 150) * 1.37f + (float)(i % 7) * 0.001f;
        if (i % 50 == 0) hx[i] = 1.0f + ldexpf(1.0f, -11); /* a tie for f16: rounds to even (1.0) */
        if (i % 50 == 1) hx[i] = 3.0e-6f;                  /* f16 subnormal */
        hn[i] = (i - 150) * 1000003;
    }
    em_buffer *x = upload(dev, hx, sizeof(hx)), *n = upload(dev, hn, sizeof(hn));
    em_buffer *oi = em_buffer_alloc(dev, N * 4), *ou8 = em_buffer_alloc(dev, N);
    em_buffer *oh = em_buffer_alloc(dev, N * 2), *ob = em_buffer_alloc(dev, N * 2);
    em_buffer *ohf = em_buffer_alloc(dev, N * 4), *onf = em_buffer_alloc(dev, N * 4);
    em_buffer *on64 = em_buffer_alloc(dev, N * 8), *obool = em_buffer_alloc(dev, N);
    assert_true(oi && ou8 && oh && ob && ohf && onf && on64 && obool);
    em_kernel *kern = compile(dev, cast_kernel());
    em_arg args[10] = {em_arg_buffer(x, N),    em_arg_buffer(n, N),   em_arg_buffer(oi, N),
                       em_arg_buffer(ou8, N),  em_arg_buffer(oh, N),  em_arg_buffer(ob, N),
                       em_arg_buffer(ohf, N),  em_arg_buffer(onf, N), em_arg_buffer(on64, N),
                       em_arg_buffer(obool, N)};
    launch(kern, (N + 63) / 64, 1, 1, 64, 1, 1, args, 10);
    int32_t gi[N];
    uint8_t g8[N], gb[N];
    uint16_t gh[N], gbf[N];
    float ghf[N], gnf[N];
    int64_t g64[N];
    assert_int_equal(em_buffer_read(oi, 0, gi, sizeof(gi)), EM_OK);
    assert_int_equal(em_buffer_read(ou8, 0, g8, sizeof(g8)), EM_OK);
    assert_int_equal(em_buffer_read(oh, 0, gh, sizeof(gh)), EM_OK);
    assert_int_equal(em_buffer_read(ob, 0, gbf, sizeof(gbf)), EM_OK);
    assert_int_equal(em_buffer_read(ohf, 0, ghf, sizeof(ghf)), EM_OK);
    assert_int_equal(em_buffer_read(onf, 0, gnf, sizeof(gnf)), EM_OK);
    assert_int_equal(em_buffer_read(on64, 0, g64, sizeof(g64)), EM_OK);
    assert_int_equal(em_buffer_read(obool, 0, gb, sizeof(gb)), EM_OK);
    for (int i = 0; i < N; i++) {
        if (gi[i] != (int32_t)hx[i])
            fail_msg("i32 of %g: %d, want %d", hx[i], gi[i], (int32_t)hx[i]);
        assert_int_equal(g8[i], (uint8_t)fmodf(fabsf(hx[i]), 200.0f));
        if (gh[i] != ref_f16(hx[i]))
            fail_msg("f16 of %.9g: 0x%04x, want 0x%04x", hx[i], gh[i], ref_f16(hx[i]));
        if (gbf[i] != ref_bf16(hx[i]))
            fail_msg("bf16 of %.9g: 0x%04x, want 0x%04x", hx[i], gbf[i], ref_bf16(hx[i]));
        assert_float_equal(ghf[i], from_f16(ref_f16(hx[i])), 0.0);
        assert_float_equal(gnf[i], (float)hn[i], 0.0);
        assert_int_equal(g64[i], (int64_t)hn[i]);
        assert_int_equal(gb[i], hn[i] != 0);
    }
    em_buffer *bufs[] = {x, n, oi, ou8, oh, ob, ohf, onf, on64, obool};
    for (size_t i = 0; i < EM_ARRAY_LEN(bufs); i++) em_buffer_free(bufs[i]);
    em_device_close(dev);
}

/* ---- launches from several threads ----------------------------------------------------------- */

/* out[i] = x[i] * s + i for i < len(out), s a scalar parameter. */
static em_ir_kernel *scale_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ocl_scale_index");
    em_type f = em_ty(EM_F32);
    em_ir_mem x = em_ir_param_buffer(k, "x", f, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_WRITE, 0);
    em_ir_val s = em_ir_param_scalar(k, "s", f);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val r = em_ir_binary(k, EM_OP_MUL, em_ir_load(k, x, i), s);
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_ADD, r, em_ir_cast(k, f, i)));
    em_ir_end(k);
    return k;
}

typedef struct worker {
    em_kernel *kern; /* the shared kernel */
    em_device *dev;  /* its device */
    int id;          /* worker number: picks the length and the scalars */
    int bad;         /* launches whose result was wrong */
    char why[256];   /* the first failure */
} worker;

/* Launches the shared kernel 40 times with this worker's own buffers, length and scalars (so
 * metadata and arguments change from launch to launch on one cl_kernel), checking each result. */
static void *work(void *arg)
{
    worker *w = arg;
    uint32_t n = 500 + 97 * (uint32_t)w->id;
    float *h = malloc(n * 4), *o = malloc(n * 4);
    em_buffer *x = em_buffer_alloc(w->dev, n * 4), *out = em_buffer_alloc(w->dev, n * 4);
    if (!h || !o || !x || !out) {
        snprintf(w->why, sizeof(w->why), "allocation failed: %s", em_last_error());
        w->bad++;
    }
    for (uint32_t i = 0; i < n && !w->bad; i++) h[i] = (float)(i % 31) * 0.5f;
    if (!w->bad && em_buffer_write(x, 0, h, n * 4) != EM_OK) w->bad++;
    for (int round = 0; round < 40 && !w->bad; round++) {
        float s = (float)(w->id * 100 + round);
        em_arg args[3] = {em_arg_buffer(x, n), em_arg_buffer(out, n), em_arg_f32(s)};
        uint32_t count[3] = {(n + 63) / 64, 1, 1}, dim[3] = {64, 1, 1};
        if (em_launch(w->kern, count, dim, args, 3) != EM_OK ||
            em_buffer_read(out, 0, o, n * 4) != EM_OK) {
            snprintf(w->why, sizeof(w->why), "round %d: %s", round, em_last_error());
            w->bad++;
            break;
        }
        for (uint32_t i = 0; i < n; i++) {
            float want = h[i] * s + (float)i;
            if (fabsf(o[i] - want) > 1e-5f * fabsf(want) + 1e-5f) {
                snprintf(w->why, sizeof(w->why), "round %d: out[%u] = %g, want %g", round, i, o[i],
                         want);
                w->bad++;
                break;
            }
        }
    }
    em_buffer_free(x);
    em_buffer_free(out);
    free(h);
    free(o);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    em_device *dev = open_or_skip();
    em_kernel *kern = compile(dev, scale_kernel());
    enum { T = 4 };
    worker ws[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        ws[t] = (worker){.kern = kern, .dev = dev, .id = t};
        assert_int_equal(pthread_create(&th[t], NULL, work, &ws[t]), 0);
    }
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++)
        if (ws[t].bad) fail_msg("worker %d: %s", t, ws[t].why);
    em_device_close(dev);
}

/* ---- the program-binary disk cache ----------------------------------------------------------- */

static void test_binary_cache_disk_hit(void **state)
{
    (void)state;
    char dir[1024];
    rt_fresh_dir("ocl-cache", dir, sizeof(dir));
    assert_true(dir[0] != '\0');
    char *saved = getenv("EMBER_CACHE_DIR") ? strdup(getenv("EMBER_CACHE_DIR")) : NULL;
    setenv("EMBER_CACHE_DIR", dir, 1);
    em_device *dev = open_or_skip();
    em_cache_stats before, mid, after;
    em_cache_stats_get(&before);
    em_kernel *kern = compile(dev, rt_kernel_axpb("ocl_cached_axpb", 2.5));
    em_cache_stats_get(&mid);
    assert_int_equal(mid.compiles, before.compiles + 1);
    assert_int_equal(mid.disk_hits, before.disk_hits);
    assert_int_equal(rt_run_axpb(dev, kern, 2.5, 3000), 0);
    char kdir[1100];
    snprintf(kdir, sizeof(kdir), "%s/kernels", dir);
    assert_int_equal(rt_count_files(kdir, ".clbin"), 1);
    em_device_close(dev); /* the last reference: the next open is a fresh device */

    dev = open_or_skip();
    kern = compile(dev, rt_kernel_axpb("ocl_cached_axpb", 2.5));
    em_cache_stats_get(&after);
    assert_int_equal(after.compiles, mid.compiles); /* no compiler run */
    assert_int_equal(after.disk_hits, mid.disk_hits + 1);
    assert_int_equal(rt_run_axpb(dev, kern, 2.5, 3000), 0);
    em_device_close(dev);
    if (saved) {
        setenv("EMBER_CACHE_DIR", saved, 1);
        free(saved);
    } else {
        unsetenv("EMBER_CACHE_DIR");
    }
    em_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* first: it needs the last close of opencl:0 to free the device, which an earlier failed
         * test (leaving its device open) would prevent */
        cmocka_unit_test(test_binary_cache_disk_hit),
        cmocka_unit_test(test_elementwise_lines),
        cmocka_unit_test(test_shared_reduction),
        cmocka_unit_test(test_atomic_histogram),
        cmocka_unit_test(test_grid_3d),
        cmocka_unit_test(test_f64),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
