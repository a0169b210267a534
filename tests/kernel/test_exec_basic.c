/* test_exec_basic.c — execution tests of the CPU target on everyday kernels: elementwise work over
 * lines of 1..16 lanes with tails and bounds checks, every sample kernel of examples.c (add, gelu,
 * reduce_sum, matmul_tiled, matmul_mma, histogram) against C references, built-in positions over
 * 3-D cube dimensions and counts, and the f32 math builtins. Each case runs through the generated
 * C directly and through the runtime (test_exec_common.h). */
#include "test_exec_common.h"

/* ---- lines ---------------------------------------------------------------------------------- */

/* out[i] = max(a[i] * s + b[i], -1000) over lines of `lanes` f32, for i < len(out). */
static em_ir_kernel *k_axpb(unsigned lanes)
{
    char name[32];
    snprintf(name, sizeof name, "axpb_x%u", lanes);
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_type t = em_line(EM_F32, lanes);
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", t, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", t, EM_WRITE, 1);
    em_ir_val s = em_ir_param_scalar(k, "s", em_ty(EM_F32));
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val x = em_ir_load(k, a, i);
    em_ir_val y = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, x, s), em_ir_load(k, b, i));
    em_ir_store(k, out, i,
                em_ir_binary(k, EM_OP_MAX, y, em_ir_const_float(k, em_ty(EM_F32), -1000.0)));
    em_ir_end(k);
    return k;
}

static void test_lines_with_tails(void **state)
{
    (void)state;
    static const unsigned widths[] = {1, 2, 3, 4, 8, 16};
    enum { NW = sizeof widths / sizeof widths[0], N = 1003, GUARD = 8 };
    em_ir_kernel *ks[NW];
    for (int w = 0; w < NW; w++) ks[w] = k_axpb(widths[w]);
    xmod *m = xcompile(ks, NW);
    uint64_t rng = 42;
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    float *out = malloc((N + GUARD) * sizeof(float));
    for (int i = 0; i < N; i++) {
        a[i] = xrandf(&rng, -100, 100);
        b[i] = xrandf(&rng, -100, 100);
    }
    const float s = 3.25f;
    for (int w = 0; w < NW; w++) {
        unsigned lanes = widths[w];
        for (int i = 0; i < N + GUARD; i++) out[i] = -7.0f;
        uint64_t nl = N / lanes, done = nl * lanes, tail = N - done;
        /* whole lines, with more units than lines (they must do nothing) */
        uint32_t cubes = (uint32_t)((nl + 5 + 31) / 32);
        xarg args[] = {xbuf(a, done * sizeof(float), nl), xbuf(b, done * sizeof(float), nl),
                       xbuf(out, done * sizeof(float), nl), xscalar_f(s)};
        xlaunch(m, (size_t)w, XGRID(cubes, 1, 1), XGRID(32, 1, 1), args, 4);
        /* the tail, one scalar at a time (the width-1 kernel on the rest of the arrays) */
        if (tail) {
            xarg targs[] = {xbuf(a + done, tail * sizeof(float), tail),
                            xbuf(b + done, tail * sizeof(float), tail),
                            xbuf(out + done, tail * sizeof(float), tail), xscalar_f(s)};
            xlaunch(m, 0, XGRID(1, 1, 1), XGRID(16, 1, 1), targs, 4);
        }
        for (int i = 0; i < N; i++) {
            float want = fmaxf(a[i] * s + b[i], -1000.0f);
            xcheck_close("axpb", (size_t)i, out[i], want, 1e-6);
        }
        for (int i = N; i < N + GUARD; i++) assert_true(out[i] == -7.0f);
    }
    xmod_free(m);
    for (int w = 0; w < NW; w++) em_ir_kernel_free(ks[w]);
    free(a);
    free(b);
    free(out);
}

/* ---- the sample kernels ------------------------------------------------------------------- */

static void test_example_add_gelu(void **state)
{
    (void)state;
    enum { N = 4 * 300 };
    em_ir_kernel *ks[2] = {em_ir_example("add"), em_ir_example("gelu")};
    assert_non_null(ks[0]);
    assert_non_null(ks[1]);
    xmod *m = xcompile(ks, 2);
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)),
          *out = malloc(N * sizeof(float));
    uint64_t rng = 7;
    for (int i = 0; i < N; i++) a[i] = xrandf(&rng, -5, 5), b[i] = xrandf(&rng, -5, 5);
    xarg args[] = {xbuf(a, sizeof(float) * N, N / 4), xbuf(b, sizeof(float) * N, N / 4),
                   xbuf(out, sizeof(float) * N, N / 4)};
    xlaunch(m, 0, XGRID(3, 1, 1), XGRID(128, 1, 1), args, 3);
    for (int i = 0; i < N; i++) assert_true(out[i] == a[i] + b[i]);
    xarg gargs[] = {xbuf(a, sizeof(float) * N, N / 4), xbuf(out, sizeof(float) * N, N / 4)};
    xlaunch(m, 1, XGRID(10, 1, 1), XGRID(32, 1, 1), gargs, 2);
    for (int i = 0; i < N; i++) {
        double x = a[i], want = x * (erf(x / sqrt(2.0)) + 1) / 2;
        xcheck_close("gelu", (size_t)i, out[i], want, 1e-5);
    }
    xmod_free(m);
    em_ir_kernel_free(ks[0]);
    em_ir_kernel_free(ks[1]);
    free(a);
    free(b);
    free(out);
}

static void test_example_reduce_sum(void **state)
{
    (void)state;
    enum { N = 1000, CUBES = (N + 255) / 256 };
    em_ir_kernel *k = em_ir_example("reduce_sum");
    float *in = malloc(N * sizeof(float)), out[CUBES + 1];
    uint64_t rng = 3;
    for (int i = 0; i < N; i++) in[i] = xrandf(&rng, -1, 1);
    out[CUBES] = 12345.0f;
    xarg args[] = {xbuf(in, N * sizeof(float), N), xbuf(out, CUBES * sizeof(float), CUBES)};
    xrun(k, XGRID(CUBES, 1, 1), XGRID(256, 1, 1), args, 2);
    for (int c = 0; c < CUBES; c++) {
        double want = 0;
        for (int i = c * 256; i < (c + 1) * 256 && i < N; i++) want += in[i];
        xcheck_close("reduce_sum", (size_t)c, out[c], want, 1e-5);
    }
    assert_true(out[CUBES] == 12345.0f);
    em_ir_kernel_free(k);
    free(in);
}

static void test_example_matmul_tiled(void **state)
{
    (void)state;
    enum { M = 37, N = 29, K = 53 };
    em_ir_kernel *k = em_ir_example("matmul_tiled");
    float *a = malloc(M * K * sizeof(float)), *b = malloc(K * N * sizeof(float)),
          *c = malloc(M * N * sizeof(float));
    uint64_t rng = 11;
    for (int i = 0; i < M * K; i++) a[i] = xrandf(&rng, -1, 1);
    for (int i = 0; i < K * N; i++) b[i] = xrandf(&rng, -1, 1);
    xarg args[] = {xbuf(a, M * K * sizeof(float), M * K),
                   xbuf(b, K * N * sizeof(float), K * N),
                   xbuf(c, M * N * sizeof(float), M * N),
                   xscalar_u(M),
                   xscalar_u(N),
                   xscalar_u(K)};
    xrun(k, XGRID((N + 15) / 16, (M + 15) / 16, 1), XGRID(16, 16, 1), args, 6);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0;
            for (int t = 0; t < K; t++) want += (double)a[i * K + t] * b[t * N + j];
            xcheck_close("matmul_tiled", (size_t)(i * N + j), c[i * N + j], want, 1e-5);
        }
    em_ir_kernel_free(k);
    free(a);
    free(b);
    free(c);
}

static uint16_t f16_of(float x)
{
    return xref_f16(x);
}

static void test_example_matmul_mma(void **state)
{
    (void)state;
    enum { M = 32, N = 64, K = 48, PLANES = 2 };
    em_ir_kernel *k = em_ir_example("matmul_mma");
    uint16_t *a = malloc(M * K * 2), *b = malloc(K * N * 2);
    float *c = malloc(M * N * sizeof(float));
    uint64_t rng = 5;
    for (int i = 0; i < M * K; i++) a[i] = f16_of(xrandf(&rng, -2, 2));
    for (int i = 0; i < K * N; i++) b[i] = f16_of(xrandf(&rng, -2, 2));
    xarg args[] = {xbuf(a, M * K * 2, M * K), xbuf(b, K * N * 2, K * N),
                   xbuf(c, M * N * sizeof(float), M * N), xscalar_u(N), xscalar_u(K)};
    /* PLANES planes (units, on the CPU) per cube along x, one 16x16 tile of c each */
    xrun(k, XGRID(N / 16 / PLANES, M / 16, 1), XGRID(PLANES, 1, 1), args, 5);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0;
            for (int t = 0; t < K; t++)
                want += xref_half_value(a[i * K + t], false) * xref_half_value(b[t * N + j], false);
            xcheck_close("matmul_mma", (size_t)(i * N + j), c[i * N + j], want, 1e-5);
        }
    em_ir_kernel_free(k);
    free(a);
    free(b);
    free(c);
}

static void test_example_histogram(void **state)
{
    (void)state;
    enum { N = 200000, BINS = 37 };
    em_ir_kernel *k = em_ir_example("histogram");
    uint32_t *in = malloc(N * sizeof(uint32_t)), bins[BINS] = {0}, want[BINS] = {0};
    uint64_t rng = 99;
    for (int i = 0; i < N; i++) {
        in[i] = (uint32_t)(xrand_state(&rng) >> 20) % 1000;
        if (i % 3 == 0) in[i] = 5; /* contention on one bin */
        want[in[i] % BINS]++;
    }
    xarg args[] = {xbuf(in, N * sizeof(uint32_t), N), xbuf(bins, sizeof bins, BINS),
                   xscalar_u(BINS)};
    xrun(k, XGRID((N + 63) / 64, 1, 1), XGRID(64, 1, 1), args, 3);
    for (int i = 0; i < BINS; i++) assert_int_equal(bins[i], want[i]);
    em_ir_kernel_free(k);
    free(in);
}

/* ---- positions ------------------------------------------------------------------------------ */

/* out[ABSOLUTE_POS * 23 + b] = built-in b, for every built-in. */
static em_ir_kernel *k_positions(void)
{
    em_ir_kernel *k = em_ir_kernel_new("positions");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 1);
    em_ir_val base = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_ABSOLUTE_POS),
                                  em_ir_u32(k, EM_BUILTIN_COUNT));
    for (unsigned b = 0; b < EM_BUILTIN_COUNT; b++)
        em_ir_store(k, out, em_ir_binary(k, EM_OP_ADD, base, em_ir_u32(k, b)),
                    em_ir_builtin(k, (em_builtin)b));
    return k;
}

static void check_positions(xmod *m, const uint32_t count[3], const uint32_t dim[3])
{
    uint32_t units = dim[0] * dim[1] * dim[2], cubes = count[0] * count[1] * count[2];
    size_t n = (size_t)units * cubes * EM_BUILTIN_COUNT;
    uint32_t *out = calloc(n, sizeof(uint32_t));
    xarg args[] = {xbuf(out, n * sizeof(uint32_t), n)};
    xlaunch(m, 0, count, dim, args, 1);
    for (uint32_t c = 0; c < cubes; c++)
        for (uint32_t u = 0; u < units; u++) {
            uint32_t cx = c % count[0], cy = c / count[0] % count[1],
                     cz = c / (count[0] * count[1]);
            uint32_t ux = u % dim[0], uy = u / dim[0] % dim[1], uz = u / (dim[0] * dim[1]);
            uint32_t want[EM_BUILTIN_COUNT] = {
                [EM_ABSOLUTE_POS] = c * units + u,
                [EM_ABSOLUTE_POS_X] = cx * dim[0] + ux,
                [EM_ABSOLUTE_POS_Y] = cy * dim[1] + uy,
                [EM_ABSOLUTE_POS_Z] = cz * dim[2] + uz,
                [EM_UNIT_POS] = u,
                [EM_UNIT_POS_X] = ux,
                [EM_UNIT_POS_Y] = uy,
                [EM_UNIT_POS_Z] = uz,
                [EM_CUBE_POS] = c,
                [EM_CUBE_POS_X] = cx,
                [EM_CUBE_POS_Y] = cy,
                [EM_CUBE_POS_Z] = cz,
                [EM_CUBE_DIM] = units,
                [EM_CUBE_DIM_X] = dim[0],
                [EM_CUBE_DIM_Y] = dim[1],
                [EM_CUBE_DIM_Z] = dim[2],
                [EM_CUBE_COUNT] = cubes,
                [EM_CUBE_COUNT_X] = count[0],
                [EM_CUBE_COUNT_Y] = count[1],
                [EM_CUBE_COUNT_Z] = count[2],
                [EM_PLANE_DIM] = 1,
                [EM_UNIT_POS_PLANE] = 0,
                [EM_PLANE_POS] = u,
            };
            const uint32_t *got = out + ((size_t)c * units + u) * EM_BUILTIN_COUNT;
            for (int b = 0; b < EM_BUILTIN_COUNT; b++)
                if (got[b] != want[b])
                    fail_msg("cube %u unit %u: %s = %u, want %u", c, u,
                             em_builtin_name((em_builtin)b), got[b], want[b]);
        }
    free(out);
}

static void test_positions_3d(void **state)
{
    (void)state;
    em_ir_kernel *k = k_positions();
    xmod *m = xcompile(&k, 1);
    check_positions(m, XGRID(2, 3, 4), XGRID(3, 4, 2));
    check_positions(m, XGRID(7, 1, 1), XGRID(5, 1, 1));
    check_positions(m, XGRID(1, 1, 3), XGRID(1, 2, 1));
    xmod_free(m);
    em_ir_kernel_free(k);
}

/* ---- f32 math ------------------------------------------------------------------------------- */

enum { MATH_OPS = 17 };

/* out[i * MATH_OPS + j] = op_j(a[i]) (and a binary op with b[i]); isnan / isinf as 0 / 1. */
static em_ir_kernel *k_math(void)
{
    static const em_ir_op unary[] = {EM_OP_EXP,   EM_OP_EXP2, EM_OP_LOG,  EM_OP_LOG2, EM_OP_SQRT,
                                     EM_OP_RSQRT, EM_OP_ERF,  EM_OP_TANH, EM_OP_SIN,  EM_OP_COS,
                                     EM_OP_FLOOR, EM_OP_CEIL, EM_OP_ROUND};
    em_ir_kernel *k = em_ir_kernel_new("math_f32");
    em_type f = em_ty(EM_F32);
    em_ir_mem a = em_ir_param_buffer(k, "a", f, EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", f, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, a)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i);
    em_ir_val base = em_ir_binary(k, EM_OP_MUL, i, em_ir_u32(k, MATH_OPS));
    em_ir_val r[MATH_OPS];
    unsigned n = 0;
    for (unsigned j = 0; j < sizeof unary / sizeof unary[0]; j++)
        r[n++] = em_ir_unary(k, unary[j], x);
    r[n++] = em_ir_binary(k, EM_OP_POW, em_ir_unary(k, EM_OP_ABS, x), y);
    r[n++] = em_ir_binary(k, EM_OP_REM, x, y);
    r[n++] = em_ir_cast(k, f, em_ir_unary(k, EM_OP_ISNAN, x));
    r[n++] = em_ir_cast(k, f, em_ir_unary(k, EM_OP_ISINF, x));
    for (unsigned j = 0; j < n; j++)
        em_ir_store(k, out, em_ir_binary(k, EM_OP_ADD, base, em_ir_u32(k, j)), r[j]);
    em_ir_end(k);
    return k;
}

static void test_math_f32(void **state)
{
    (void)state;
    enum { N = 512 };
    em_ir_kernel *k = k_math();
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)),
          *out = malloc(N * MATH_OPS * sizeof(float));
    uint64_t rng = 1234;
    for (int i = 0; i < N; i++) a[i] = xrandf(&rng, -6, 6), b[i] = xrandf(&rng, -3, 3);
    a[0] = NAN, a[1] = INFINITY, a[2] = -INFINITY, a[3] = 2.5f, a[4] = -2.5f, a[5] = 0.5f,
    a[6] = -0.0f;
    xarg args[] = {xbuf(a, N * sizeof(float), N), xbuf(b, N * sizeof(float), N),
                   xbuf(out, N * MATH_OPS * sizeof(float), (uint64_t)N * MATH_OPS)};
    xrun(k, XGRID(N / 64, 1, 1), XGRID(64, 1, 1), args, 3);
    for (int i = 0; i < N; i++) {
        float x = a[i], y = b[i];
        float want[MATH_OPS] = {expf(x),          exp2f(x),          logf(x),     log2f(x),
                                sqrtf(x),         1.0f / sqrtf(x),   erff(x),     tanhf(x),
                                sinf(x),          cosf(x),           floorf(x),   ceilf(x),
                                rintf(x),         powf(fabsf(x), y), fmodf(x, y), (float)!!isnan(x),
                                (float)!!isinf(x)};
        for (int j = 0; j < MATH_OPS; j++) {
            float got = out[i * MATH_OPS + j];
            if (isnan(want[j])) {
                if (!isnan(got)) fail_msg("math op %d of %g: got %g, want NaN", j, x, got);
            } else if (isinf(want[j])) {
                assert_true(got == want[j]);
            } else {
                xcheck_close("math", (size_t)(i * MATH_OPS + j), got, want[j], 2e-6);
            }
        }
    }
    /* round is half to even */
    assert_true(out[3 * MATH_OPS + 12] == 2.0f && out[4 * MATH_OPS + 12] == -2.0f &&
                out[5 * MATH_OPS + 12] == 0.0f);
    em_ir_kernel_free(k);
    free(a);
    free(b);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_with_tails),   cmocka_unit_test(test_example_add_gelu),
        cmocka_unit_test(test_example_reduce_sum), cmocka_unit_test(test_example_matmul_tiled),
        cmocka_unit_test(test_example_matmul_mma), cmocka_unit_test(test_example_histogram),
        cmocka_unit_test(test_positions_3d),       cmocka_unit_test(test_math_f32),
    };
    return XRUN_BOTH(tests);
}
