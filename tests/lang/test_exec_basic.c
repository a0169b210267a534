/* test_exec_basic.c — kernel-language programs run on the CPU device and compared with references
 * computed here in C: elementwise kernels and GELU (the built-in, exact erf form), every math
 * builtin, integer and bit operations, casts and bitcasts, control flow (if/else, for, while,
 * break, continue, the conditional, short-circuit guards), helpers with early returns, comptime
 * parameters, comptime if and unrolled comptime for, lines (lanes, constructors, lane writes),
 * local arrays, module constants, has() and print, helpers taking arrays and lines, the other
 * built-in kernels in f64, and a generic transpose through shapes and strides. */
#include "lang/lang_util.h"

#define N 1000

/* ---- elementwise and GELU ------------------------------------------------------------------ */

static void test_builtin_gelu_exact(void **state)
{
    (void)state;
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    float in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = (float)(i - N / 2) / 97.0f;
    em_buffer *a = buf_new(in, sizeof(in)), *b = buf_new(NULL, sizeof(out));
    em_lang_bind binds[] = {em_lang_bind_type("F", EM_F32)};
    em_lang_spec spec = {binds, 1, 4, NULL};
    em_arg args[] = {em_arg_buffer(a, N / 4), em_arg_buffer(b, N / 4)};
    launch_x(m, "gelu", &spec, (N / 4 + 63) / 64, 64, args, 2);
    buf_get(b, out, sizeof(out));
    for (int i = 0; i < N; i++) {
        double x = in[i], ref = x * (1.0 + erf(x / sqrt(2.0))) / 2.0;
        assert_true(fabs(out[i] - ref) <= 1e-6 + 1e-5 * fabs(ref));
    }
    em_buffer_free(a);
    em_buffer_free(b);
}

static void test_builtin_add_mul_i32(void **state)
{
    (void)state;
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    int32_t x[N], y[N], sum[N], prod[N];
    for (int i = 0; i < N; i++) {
        x[i] = i * 7 - 300;
        y[i] = 11 - i;
    }
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(y, sizeof(y)),
              *c = buf_new(NULL, sizeof(sum));
    em_lang_bind binds[] = {em_lang_bind_type("F", EM_I32)};
    em_lang_spec spec = {binds, 1, 2, NULL};
    em_arg args[] = {em_arg_buffer(a, N / 2), em_arg_buffer(b, N / 2), em_arg_buffer(c, N / 2)};
    launch_x(m, "add", &spec, 4, 128, args, 3);
    buf_get(c, sum, sizeof(sum));
    launch_x(m, "mul", &spec, 4, 128, args, 3);
    buf_get(c, prod, sizeof(prod));
    for (int i = 0; i < N; i++) {
        assert_int_equal(sum[i], x[i] + y[i]);
        assert_int_equal(prod[i], x[i] * y[i]);
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_buffer_free(c);
}

/* ---- math builtins ----------------------------------------------------------------------------
 */

static const char *math_src =
    "kernel void math(const tensor(f32) x, tensor(f32) out, comptime u32 K = 20)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i >= len(x)) { return; }\n"
    "    f32 v = x[i];\n"
    "    f32 p = abs(v) + 0.5;\n"
    "    out[i * K + 0] = exp(v);\n"
    "    out[i * K + 1] = log(p);\n"
    "    out[i * K + 2] = exp2(v);\n"
    "    out[i * K + 3] = log2(p);\n"
    "    out[i * K + 4] = sqrt(p);\n"
    "    out[i * K + 5] = rsqrt(p);\n"
    "    out[i * K + 6] = tanh(v);\n"
    "    out[i * K + 7] = sin(v);\n"
    "    out[i * K + 8] = cos(v);\n"
    "    out[i * K + 9] = pow(p, 1.5);\n"
    "    out[i * K + 10] = abs(v);\n"
    "    out[i * K + 11] = min(v, 0.25);\n"
    "    out[i * K + 12] = max(v, 0.25);\n"
    "    out[i * K + 13] = clamp(v, -1.0, 1.0);\n"
    "    out[i * K + 14] = fma(v, 2.0, 0.5);\n"
    "    out[i * K + 15] = floor(v);\n"
    "    out[i * K + 16] = ceil(v);\n"
    "    out[i * K + 17] = round(v);\n"
    "    out[i * K + 18] = isnan(log(v)) ? 1.0 : 0.0;\n"
    "    out[i * K + 19] = isinf(1.0 / (v - v)) ? 1.0 : 0.0;\n"
    "}\n";

static void test_math_builtins(void **state)
{
    (void)state;
    em_lang_module *m = must_load(math_src);
    enum { M = 64, K = 20 };
    float x[M], out[M * K];
    for (int i = 0; i < M; i++) x[i] = (float)(i - 32) * 0.19f + 0.001f;
    x[5] = 2.5f; /* round half to even */
    x[6] = -1.5f;
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(a, M), em_arg_buffer(b, M * K)};
    launch_x(m, "math", NULL, 1, M, args, 2);
    buf_get(b, out, sizeof(out));
    for (int i = 0; i < M; i++) {
        double v = x[i], p = fabs(v) + 0.5;
        double ref[K] = {exp(v),
                         log(p),
                         exp2(v),
                         log2(p),
                         sqrt(p),
                         1.0 / sqrt(p),
                         tanh(v),
                         sin(v),
                         cos(v),
                         pow(p, 1.5),
                         fabs(v),
                         fmin(v, 0.25),
                         fmax(v, 0.25),
                         fmin(fmax(v, -1), 1),
                         v * 2 + 0.5,
                         floor(v),
                         ceil(v),
                         nearbyint(v),
                         isnan(log(v)) ? 1 : 0,
                         1};
        for (int k = 0; k < K; k++) {
            double got = out[i * K + k];
            if (!(fabs(got - ref[k]) <= 1e-5 * (1 + fabs(ref[k])))) {
                fprintf(stderr, "x=%g builtin #%d: got %g want %g\n", v, k, got, ref[k]);
                fail();
            }
        }
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- integers, bits, casts ----------------------------------------------------------------------
 */

static const char *int_src =
    "kernel void ints(const tensor(u32) xs, const tensor(i32) ys, tensor(u32) out)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(xs)) {\n"
    "        u32 x = xs[i];\n"
    "        i32 y = ys[i];\n"
    "        u32 o = i * 16;\n"
    "        out[o + 0] = x + 3 * x - 1;\n"
    "        out[o + 1] = x / 7 + x % 7;\n"
    "        out[o + 2] = (x & 0xff) | (x ^ 0x5a5a);\n"
    "        out[o + 3] = ~x;\n"
    "        out[o + 4] = (x << 3) + (x >> 2);\n"
    "        out[o + 5] = popcount(x);\n"
    "        out[o + 6] = clz(x);\n"
    "        out[o + 7] = ctz(x);\n"
    "        out[o + 8] = u32(y / 3);\n"
    "        out[o + 9] = u32(y % 5);\n"
    "        out[o + 10] = u32(y >> 1);\n"
    "        out[o + 11] = (u32)(-y * 2);\n"
    "        out[o + 12] = u32(i32(f32(y) * 0.5));\n"
    "        out[o + 13] = bitcast<u32>(f32(x));\n"
    "        out[o + 14] = u32(u8(x)) + u32(i8(y));\n"
    "        out[o + 15] = u32(abs(y)) + min(x, 100) + max(x, 7u);\n"
    "    }\n"
    "}\n";

static void test_integer_and_bit_ops(void **state)
{
    (void)state;
    em_lang_module *m = must_load(int_src);
    enum { M = 50 };
    uint32_t xs[M], out[M * 16];
    int32_t ys[M];
    for (int i = 0; i < M; i++) {
        xs[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i << 3);
        ys[i] = (i * 37 - 900) * (i % 2 ? 1 : -3);
    }
    xs[0] = 0;
    em_buffer *a = buf_new(xs, sizeof(xs)), *b = buf_new(ys, sizeof(ys)),
              *c = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(a, M), em_arg_buffer(b, M), em_arg_buffer(c, M * 16)};
    launch_x(m, "ints", NULL, 2, 32, args, 3);
    buf_get(c, out, sizeof(out));
    for (int i = 0; i < M; i++) {
        uint32_t x = xs[i];
        int32_t y = ys[i];
        float fx = (float)x;
        uint32_t bits;
        memcpy(&bits, &fx, 4);
        uint32_t ref[16] = {x + 3 * x - 1,
                            x / 7 + x % 7,
                            (x & 0xff) | (x ^ 0x5a5a),
                            ~x,
                            (x << 3) + (x >> 2),
                            (uint32_t)__builtin_popcount(x),
                            x ? (uint32_t)__builtin_clz(x) : 32,
                            x ? (uint32_t)__builtin_ctz(x) : 32,
                            (uint32_t)(y / 3),
                            (uint32_t)(y % 5),
                            (uint32_t)(y >> 1),
                            (uint32_t)(-y * 2),
                            (uint32_t)(int32_t)((float)y * 0.5f),
                            bits,
                            (uint32_t)(uint8_t)x + (uint32_t)(int32_t)(int8_t)y,
                            (uint32_t)abs(y) + (x < 100 ? x : 100) + (x > 7 ? x : 7)};
        for (int k = 0; k < 16; k++) {
            if (out[i * 16 + k] != ref[k]) {
                fprintf(stderr, "x=%u y=%d op #%d: got %u want %u\n", x, y, k, out[i * 16 + k],
                        ref[k]);
                fail();
            }
        }
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_buffer_free(c);
    em_lang_module_free(m);
}

/* ---- control flow and helpers
 * ---------------------------------------------------------------------- */

static const char *flow_src =
    "/* steps of the Collatz sequence: a helper with a return inside a loop */\n"
    "inline u32 collatz(u32 n)\n"
    "{\n"
    "    u32 steps = 0;\n"
    "    while (true) {\n"
    "        if (n <= 1) { return steps; }\n"
    "        if (n % 2 == 0) { n = n / 2; } else { n = 3 * n + 1; }\n"
    "        steps += 1;\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
    "/* several returns, none in a loop */\n"
    "inline i32 sign(i32 x)\n"
    "{\n"
    "    if (x > 0) { return 1; }\n"
    "    if (x < 0) { return -1; }\n"
    "    return 0;\n"
    "}\n"
    "/* the sum of the odd numbers below n, stopping at 50: continue and break in a for */\n"
    "inline u32 odd_sum(u32 n)\n"
    "{\n"
    "    u32 s = 0;\n"
    "    for (u32 k in range(n)) {\n"
    "        if (k % 2 == 0) { continue; }\n"
    "        if (k > 50) { break; }\n"
    "        s += k;\n"
    "    }\n"
    "    return s;\n"
    "}\n"
    "/* a return from an inner loop leaves both loops */\n"
    "inline i32 find_pair(const array(i32) a, u32 n, i32 target)\n"
    "{\n"
    "    for (u32 i in range(n)) {\n"
    "        for (u32 j in range(i + 1, n)) {\n"
    "            if (a[i] + a[j] == target) { return i32(i * 1000 + j); }\n"
    "        }\n"
    "    }\n"
    "    return -1;\n"
    "}\n"
    "kernel void flow(const tensor(i32) xs, tensor(i32) out)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i >= len(xs)) { return; }\n"
    "    i32 x = xs[i];\n"
    "    u32 j = i * 6;\n"
    "    out[j] = i32(collatz(u32(abs(x)) + 1));\n"
    "    out[j + 1] = sign(x);\n"
    "    out[j + 2] = i32(odd_sum(u32(abs(x))));\n"
    "    /* the neighbour, guarded by && so that the load never runs out of bounds */\n"
    "    out[j + 3] = i + 1 < len(xs) && xs[i + 1] > x ? xs[i + 1] : x;\n"
    "    i32 digits = 0;\n"
    "    u32 v = u32(abs(x));\n"
    "    while (v > 0 || digits == 0) { digits++; v /= 10; }\n"
    "    if (x < -100) { digits = -digits; } else if (x > 100) { digits *= 10; } else { digits += "
    "1000; }\n"
    "    out[j + 4] = digits;\n"
    "    out[j + 5] = find_pair(xs, len(xs), x + 7);\n"
    "}\n";

static uint32_t ref_collatz(uint32_t n)
{
    uint32_t s = 0;
    while (n > 1) {
        n = n % 2 ? 3 * n + 1 : n / 2;
        s++;
    }
    return s;
}

static void test_control_flow_and_helpers(void **state)
{
    (void)state;
    em_lang_module *m = must_load(flow_src);
    enum { M = 77 };
    int32_t xs[M], out[M * 6];
    for (int i = 0; i < M; i++) xs[i] = (i * 53) % 401 - 200;
    em_buffer *a = buf_new(xs, sizeof(xs)), *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(a, M), em_arg_buffer(b, M * 6)};
    launch_x(m, "flow", NULL, 3, 32, args, 2);
    buf_get(b, out, sizeof(out));
    for (int i = 0; i < M; i++) {
        int32_t x = xs[i];
        uint32_t ax = (uint32_t)abs(x), odd = 0;
        for (uint32_t k = 0; k < ax; k++) {
            if (k % 2 == 0) continue;
            if (k > 50) break;
            odd += k;
        }
        int32_t next = i + 1 < M && xs[i + 1] > x ? xs[i + 1] : x;
        int32_t digits = 0;
        uint32_t v = ax;
        while (v > 0 || digits == 0) {
            digits++;
            v /= 10;
        }
        digits = x < -100 ? -digits : x > 100 ? digits * 10 : digits + 1000;
        int32_t pair = -1;
        for (int p = 0; p < M && pair < 0; p++)
            for (int q = p + 1; q < M; q++)
                if (xs[p] + xs[q] == x + 7) {
                    pair = p * 1000 + q;
                    break;
                }
        assert_int_equal(out[i * 6], (int32_t)ref_collatz(ax + 1));
        assert_int_equal(out[i * 6 + 1], x > 0 ? 1 : x < 0 ? -1 : 0);
        assert_int_equal(out[i * 6 + 2], (int32_t)odd);
        assert_int_equal(out[i * 6 + 3], next);
        assert_int_equal(out[i * 6 + 4], digits);
        assert_int_equal(out[i * 6 + 5], pair);
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- comptime
 * ------------------------------------------------------------------------------------ */

static const char *poly_src =
    "/* p(x) = sum of (k + 1) * x^k for k < DEGREE, by Horner's rule, unrolled at compile time */\n"
    "kernel<F: float> void poly(const tensor(F) x, tensor(F) out, comptime u32 DEGREE = 6,\n"
    "                           comptime bool SQUARE = false)\n"
    "{\n"
    "    if (ABSOLUTE_POS < len(x)) {\n"
    "        F v = x[ABSOLUTE_POS];\n"
    "        F acc = F(0);\n"
    "        comptime for (u32 k in range(DEGREE)) {\n"
    "            comptime u32 c = DEGREE - k;\n"
    "            acc = acc * v + F(c);\n"
    "        }\n"
    "        comptime if (SQUARE) { acc = acc * acc; }\n"
    "        out[ABSOLUTE_POS] = acc;\n"
    "    }\n"
    "}\n";

/* Counts the instructions of an op in a kernel. */
static size_t count_ops(const em_ir_kernel *k, em_ir_op op)
{
    size_t n = 0;
    for (uint32_t i = 0; i < em_ir_inst_count(k); i++) n += em_ir_inst_at(k, i)->op == op;
    return n;
}

static void test_comptime_unrolled_loop_and_if(void **state)
{
    (void)state;
    em_lang_module *m = must_load(poly_src);
    em_lang_bind b1[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("DEGREE", 5)};
    em_lang_bind b2[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("DEGREE", 5),
                         em_lang_bind_bool("SQUARE", true)};
    em_lang_spec s1 = {b1, 2, 1, NULL}, s2 = {b2, 3, 1, NULL};
    /* unrolled: no loop is left, and the if is gone; each binding is its own IR */
    em_ir_kernel *k1 = em_lang_specialize(m, "poly", &s1, NULL);
    em_ir_kernel *k2 = em_lang_specialize(m, "poly", &s2, NULL);
    assert_non_null(k1);
    assert_non_null(k2);
    assert_int_equal(count_ops(k1, EM_OP_RANGE) + count_ops(k1, EM_OP_LOOP), 0);
    assert_int_equal(count_ops(k1, EM_OP_MUL), 5);
    assert_int_equal(count_ops(k2, EM_OP_MUL), 6);
    char h1[33], h2[33];
    em_ir_hash(k1, h1);
    em_ir_hash(k2, h2);
    assert_string_not_equal(h1, h2);
    em_ir_kernel_free(k1);
    em_ir_kernel_free(k2);

    enum { M = 40 };
    float x[M], o1[M], o2[M];
    for (int i = 0; i < M; i++) x[i] = (float)i / 20.0f - 1.0f;
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(o1));
    em_arg args[] = {em_arg_buffer(a, M), em_arg_buffer(b, M)};
    launch_x(m, "poly", &s1, 1, 64, args, 2);
    buf_get(b, o1, sizeof(o1));
    launch_x(m, "poly", &s2, 1, 64, args, 2);
    buf_get(b, o2, sizeof(o2));
    for (int i = 0; i < M; i++) {
        double acc = 0;
        for (int k = 0; k < 5; k++) acc = acc * x[i] + (5 - k);
        assert_true(fabs(o1[i] - acc) < 1e-4);
        assert_true(fabs(o2[i] - acc * acc) < 1e-3);
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- lines, local arrays, constants
 * ----------------------------------------------------------------- */

static const char *lines_src =
    "const u32 LANES = 4;\n"
    "const auto SCALE = 0.5;\n"
    "/* a line of LANES floats from four scalars; lanes reversed through a local array */\n"
    "kernel void lines(const tensor(line(f32, LANES)) x, tensor(line(f32, LANES)) out)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i >= len(x)) { return; }\n"
    "    line(f32, 4) v = x[i];\n"
    "    f32 rev[LANES];\n"
    "    comptime for (u32 l in range(lanes(v))) { rev[LANES - 1 - l] = v[l]; }\n"
    "    line(f32, 4) r = line(f32, 4)(rev[0], rev[1], rev[2], rev[3]);\n"
    "    r[0] = r[0] + 100.0;\n"
    "    out[i] = r * SCALE + line(f32, 4)(f32(i));\n"
    "    out[i][3] = f32(sizeof(line(f32, 4)));\n"
    "}\n";

static void test_lines_local_arrays_constants(void **state)
{
    (void)state;
    em_lang_module *m = must_load(lines_src);
    enum { M = 24 };
    float x[M * 4], out[M * 4];
    for (int i = 0; i < M * 4; i++) x[i] = (float)i * 1.25f;
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(a, M), em_arg_buffer(b, M)};
    launch_x(m, "lines", NULL, 1, 32, args, 2);
    buf_get(b, out, sizeof(out));
    for (int i = 0; i < M; i++) {
        const float *v = &x[i * 4];
        float want[4] = {(v[3] + 100.0f) * 0.5f + (float)i, v[2] * 0.5f + (float)i,
                         v[1] * 0.5f + (float)i, 16.0f};
        for (int l = 0; l < 4; l++) assert_true(fabsf(out[i * 4 + l] - want[l]) < 1e-4f);
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- targets, print
 * ----------------------------------------------------------------------------------- */

static const char *has_src =
    "kernel void which(tensor(u32) out)\n"
    "{\n"
    "    if (ABSOLUTE_POS == 0) {\n"
    "        comptime if (has(cuda)) {\n"
    "            out[0] = intrinsic<u32>(\"cuda.ptx:mov.u32 %0, %%laneid;\");\n"
    "        } else {\n"
    "            comptime if (has(c)) { out[0] = 1; } else { out[0] = 2; }\n"
    "        }\n"
    "        out[1] = u32(has(print)) + 10 * u32(has(matrix));\n"
    "        print(\"which: unit %v of %v\\n\", UNIT_POS, CUBE_DIM);\n"
    "    }\n"
    "}\n";

static void test_has_and_print(void **state)
{
    (void)state;
    em_lang_module *m = must_load(has_src);
    uint32_t out[2];
    em_buffer *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(b, 2)};
    launch_x(m, "which", NULL, 1, 1, args, 1); /* the device's caps: target c */
    buf_get(b, out, sizeof(out));
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], em_device_caps(g_dev)->print + 10 * em_device_caps(g_dev)->matrix);
    /* portable specialization: every has() is false */
    em_ir_kernel *k = em_lang_specialize(m, "which", NULL, NULL);
    assert_non_null(k);
    char *text = em_ir_print_kernel(k);
    assert_non_null(strstr(text, "2u32"));
    assert_null(strstr(text, "intrinsic"));
    free(text);
    em_ir_kernel_free(k);
    /* for cuda: the intrinsic is there */
    em_caps cuda = {0};
    snprintf(cuda.target, sizeof(cuda.target), "cuda");
    em_lang_spec spec = {NULL, 0, 1, &cuda};
    k = em_lang_specialize(m, "which", &spec, NULL);
    assert_non_null(k);
    assert_int_equal(count_ops(k, EM_OP_INTRINSIC), 1);
    assert_int_equal(count_ops(k, EM_OP_PRINT), 1);
    em_ir_kernel_free(k);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- helpers over memory and lines -------------------------------------------------------------
 */

static const char *helpers_src =
    "inline<T: num> void fill(array(T) dst, u32 from, u32 n, T v)\n"
    "{\n"
    "    for (u32 i in range(from, from + n)) { dst[i] = v; }\n"
    "}\n"
    "inline<T: num> T total(const array(T) src, u32 n)\n"
    "{\n"
    "    T s = T(0);\n"
    "    for (u32 i in range(n)) { s += src[i]; }\n"
    "    return s;\n"
    "}\n"
    "inline<F: float> line(F) lerp(line(F) a, line(F) b, F t) { return a + (b - a) * t; }\n"
    "inline u32 pow2(comptime u32 K) { return 1u << K; }\n"
    "kernel void helpers(const tensor(line(f32, 4)) a, const tensor(line(f32, 4)) b, tensor(f32) "
    "out)\n"
    "{\n"
    "    shared f32 tile[8];\n"
    "    if (UNIT_POS == 0) { fill(tile, 0, 8, 2.0); }\n"
    "    sync_cube();\n"
    "    f32 mine[4];\n"
    "    fill(mine, 0, 4, f32(UNIT_POS));\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(a)) {\n"
    "        auto l = lerp(a[i], b[i], 0.25);\n"
    "        comptime for (u32 k in range(4)) { out[i * 8 + k] = l[k]; }\n"
    "        out[i * 8 + 4] = total(tile, 8) + total(mine, 4);\n"
    "        out[i * 8 + 5] = lerp(1.0, 3.0, 0.5);\n"
    "        out[i * 8 + 6] = f32(pow2(3));\n"
    "        line(f32, 4) big = l > line(f32, 4)(2.0) ? l : line(f32, 4)(0.0);\n"
    "        out[i * 8 + 7] = big[0] + big[1] + big[2] + big[3] + select(l[1] > 1.0, 100.0, 0.0);\n"
    "    }\n"
    "}\n";

static void test_helpers_memory_and_lines(void **state)
{
    (void)state;
    em_lang_module *m = must_load(helpers_src);
    enum { L = 10 };
    float a[L * 4], b[L * 4], out[L * 8];
    for (int i = 0; i < L * 4; i++) {
        a[i] = (float)i * 0.3f - 2.0f;
        b[i] = (float)(i % 7);
    }
    em_buffer *ba = buf_new(a, sizeof(a)), *bb = buf_new(b, sizeof(b)),
              *bo = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(ba, L), em_arg_buffer(bb, L), em_arg_buffer(bo, L * 8)};
    launch_x(m, "helpers", NULL, 2, 8, args, 3);
    buf_get(bo, out, sizeof(out));
    for (int i = 0; i < L; i++) {
        float l[4], big = 0;
        for (int k = 0; k < 4; k++) {
            l[k] = a[i * 4 + k] + (b[i * 4 + k] - a[i * 4 + k]) * 0.25f;
            assert_true(fabsf(out[i * 8 + k] - l[k]) < 1e-5f);
            big += l[k] > 2.0f ? l[k] : 0.0f;
        }
        assert_true(fabsf(out[i * 8 + 4] - (16.0f + 4.0f * (float)(i % 8))) < 1e-5f);
        assert_true(out[i * 8 + 5] == 2.0f);
        assert_true(out[i * 8 + 6] == 8.0f);
        assert_true(fabsf(out[i * 8 + 7] - (big + (l[1] > 1.0f ? 100.0f : 0.0f))) < 1e-4f);
    }
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bo);
    em_lang_module_free(m);
}

static void test_builtin_activations_f64(void **state)
{
    (void)state;
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    enum { L = 64 };
    double x[L], y[L], out[L];
    for (int i = 0; i < L; i++) {
        x[i] = (double)(i - 32) / 9.0;
        y[i] = (double)(i % 5);
    }
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(y, sizeof(y)),
              *c = buf_new(NULL, sizeof(out));
    em_lang_bind binds[] = {em_lang_bind_type("F", EM_F64)};
    em_lang_spec spec = {binds, 1, 2, NULL};
    em_arg two[] = {em_arg_buffer(a, L / 2), em_arg_buffer(c, L / 2)};
    launch_x(m, "relu", &spec, 1, 32, two, 2);
    buf_get(c, out, sizeof(out));
    for (int i = 0; i < L; i++) assert_true(out[i] == (x[i] > 0 ? x[i] : 0));
    launch_x(m, "gelu_tanh", &spec, 1, 32, two, 2);
    buf_get(c, out, sizeof(out));
    for (int i = 0; i < L; i++) {
        double v = x[i],
               ref = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        assert_true(fabs(out[i] - ref) < 1e-12);
    }
    em_arg axpy[] = {em_arg_f64(-1.5), em_arg_buffer(a, L / 2), em_arg_buffer(b, L / 2),
                     em_arg_buffer(c, L / 2)};
    launch_x(m, "axpy", &spec, 1, 32, axpy, 4);
    buf_get(c, out, sizeof(out));
    for (int i = 0; i < L; i++) assert_true(fabs(out[i] - (-1.5 * x[i] + y[i])) < 1e-12);
    em_buffer_free(a);
    em_buffer_free(b);
    em_buffer_free(c);
}

static const char *transpose_src =
    "/* out = transpose(x) for any element type, through shapes and strides */\n"
    "kernel<T> void transpose(const tensor(T, 2) x, tensor(T, 2) out)\n"
    "{\n"
    "    u32 r = ABSOLUTE_POS_Y;\n"
    "    u32 c = ABSOLUTE_POS_X;\n"
    "    if (r < shape(x, 0) && c < shape(x, 1)) {\n"
    "        out[c * stride(out, 0) + r * stride(out, 1)] = x[r * stride(x, 0) + c * stride(x, "
    "1)];\n"
    "    }\n"
    "}\n";

static void test_generic_transpose_u8(void **state)
{
    (void)state;
    em_lang_module *m = must_load(transpose_src);
    enum { R = 5, C = 9 };
    uint8_t x[R * C], out[R * C];
    for (int i = 0; i < R * C; i++) x[i] = (uint8_t)(i * 7);
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(out));
    int64_t xs[2] = {R, C}, xst[2] = {C, 1}, os[2] = {C, R}, ost[2] = {R, 1};
    em_arg args[] = {em_arg_tensor(a, 0, R * C, 2, xs, xst),
                     em_arg_tensor(b, 0, R * C, 2, os, ost)};
    em_lang_bind binds[] = {em_lang_bind_text("T", "u8")};
    em_lang_spec spec = {binds, 1, 1, NULL};
    uint32_t cubes[3] = {3, 2, 1}, units[3] = {4, 4, 1};
    launch_3d(m, "transpose", &spec, cubes, units, args, 2);
    buf_get(b, out, sizeof(out));
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) assert_int_equal(out[c * R + r], x[r * C + c]);
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_gelu_exact),
        cmocka_unit_test(test_builtin_add_mul_i32),
        cmocka_unit_test(test_math_builtins),
        cmocka_unit_test(test_integer_and_bit_ops),
        cmocka_unit_test(test_control_flow_and_helpers),
        cmocka_unit_test(test_comptime_unrolled_loop_and_if),
        cmocka_unit_test(test_lines_local_arrays_constants),
        cmocka_unit_test(test_has_and_print),
        cmocka_unit_test(test_helpers_memory_and_lines),
        cmocka_unit_test(test_builtin_activations_f64),
        cmocka_unit_test(test_generic_transpose_u8),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
