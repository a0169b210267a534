/* test_exec_numeric.c — execution tests of the CPU target's arithmetic, bit for bit against C
 * references written independently of the generator: f16 and bf16 (rounding to nearest even,
 * NaN, infinities, subnormals), f64, every integer kind (wrapping, division by zero, MIN / -1,
 * shifts, bit counts), casts between all 13 scalar kinds, bitcasts, select / compare / bool logic
 * and lane access on lines, plane ops with one unit per plane, and cooperative matrices against a
 * reference matmul. Each case runs through the generated C directly and through the runtime
 * (test_exec_common.h). */
#include "test_exec_common.h"

#define U32 em_ty(EM_U32)

static em_ir_val at(em_ir_kernel *k, em_ir_val i, unsigned stride, unsigned j)
{
    return em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, i, em_ir_u32(k, stride)),
                        em_ir_u32(k, j));
}

static uint16_t bits16(const void *p, size_t i)
{
    return ((const uint16_t *)p)[i];
}

/* ---- f16 and bf16 -----------------------------------------------------------------------------
 */

enum {
    H_ADD,
    H_SUB,
    H_MUL,
    H_DIV,
    H_SQRT,
    H_FMA,
    H_MIN,
    H_MAX,
    H_NEG,
    H_ABS,
    H_FLOOR,
    H_CEIL,
    H_ROUND,
    H_FROM_F32,
    H_FROM_F64,
    H_FROM_I32,
    H_CLAMP,
    H_SELECT,
    H_REM,
    H_OPS
};

static em_ir_kernel *k_half(em_scalar h)
{
    em_ir_kernel *k = em_ir_kernel_new(h == EM_F16 ? "half_f16" : "half_bf16");
    em_type t = em_ty(h);
    em_scalar other = h == EM_F16 ? EM_BF16 : EM_F16;
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 1),
              b = em_ir_param_buffer(k, "b", t, EM_READ, 1);
    em_ir_mem c = em_ir_param_buffer(k, "c", em_ty(EM_F32), EM_READ, 1);
    em_ir_mem d = em_ir_param_buffer(k, "d", em_ty(EM_F64), EM_READ, 1);
    em_ir_mem e = em_ir_param_buffer(k, "e", em_ty(EM_I32), EM_READ, 1);
    em_ir_mem r = em_ir_param_buffer(k, "r", t, EM_WRITE, 1);
    em_ir_mem f = em_ir_param_buffer(k, "f", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem io = em_ir_param_buffer(k, "io", em_ty(EM_I32), EM_WRITE, 1);
    em_ir_mem ot = em_ir_param_buffer(k, "ot", em_ty(other), EM_WRITE, 1);
    em_ir_mem fl = em_ir_param_buffer(k, "flags", em_ty(EM_BOOL), EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, a)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i);
    em_ir_val v[H_OPS];
    v[H_ADD] = em_ir_binary(k, EM_OP_ADD, x, y);
    v[H_SUB] = em_ir_binary(k, EM_OP_SUB, x, y);
    v[H_MUL] = em_ir_binary(k, EM_OP_MUL, x, y);
    v[H_DIV] = em_ir_binary(k, EM_OP_DIV, x, y);
    v[H_SQRT] = em_ir_unary(k, EM_OP_SQRT, em_ir_unary(k, EM_OP_ABS, x));
    v[H_FMA] = em_ir_ternary(k, EM_OP_FMA, x, y, y);
    v[H_MIN] = em_ir_binary(k, EM_OP_MIN, x, y);
    v[H_MAX] = em_ir_binary(k, EM_OP_MAX, x, y);
    v[H_NEG] = em_ir_unary(k, EM_OP_NEG, x);
    v[H_ABS] = em_ir_unary(k, EM_OP_ABS, x);
    v[H_FLOOR] = em_ir_unary(k, EM_OP_FLOOR, x);
    v[H_CEIL] = em_ir_unary(k, EM_OP_CEIL, x);
    v[H_ROUND] = em_ir_unary(k, EM_OP_ROUND, x);
    v[H_FROM_F32] = em_ir_cast(k, t, em_ir_load(k, c, i));
    v[H_FROM_F64] = em_ir_cast(k, t, em_ir_load(k, d, i));
    v[H_FROM_I32] = em_ir_cast(k, t, em_ir_load(k, e, i));
    v[H_CLAMP] = em_ir_ternary(k, EM_OP_CLAMP, x, em_ir_const_float(k, t, -1.0),
                               em_ir_const_float(k, t, 1.0));
    v[H_SELECT] = em_ir_ternary(k, EM_OP_SELECT, em_ir_binary(k, EM_OP_LT, x, y), x, y);
    v[H_REM] = em_ir_binary(k, EM_OP_REM, x, y);
    for (unsigned j = 0; j < H_OPS; j++) em_ir_store(k, r, at(k, i, H_OPS, j), v[j]);
    em_ir_store(k, f, i, em_ir_cast(k, em_ty(EM_F32), x));
    em_ir_store(k, io, i, em_ir_cast(k, em_ty(EM_I32), x));
    em_ir_store(k, ot, i, em_ir_cast(k, em_ty(other), x));
    em_ir_store(k, fl, at(k, i, 2, 0), em_ir_unary(k, EM_OP_ISNAN, x));
    em_ir_store(k, fl, at(k, i, 2, 1), em_ir_unary(k, EM_OP_ISINF, x));
    em_ir_end(k);
    return k;
}

static int32_t ref_sat_i32(double x)
{
    if (isnan(x)) return 0;
    if (x <= -2147483648.0) return INT32_MIN;
    if (x >= 2147483647.0) return INT32_MAX;
    return (int32_t)x;
}

static void test_f16_bf16(void **state)
{
    (void)state;
    enum { N = 6000 };
    em_ir_kernel *ks[2] = {k_half(EM_F16), k_half(EM_BF16)};
    xmod *m = xcompile(ks, 2);
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2), *r = malloc(N * H_OPS * 2),
             *ot = malloc(N * 2);
    float *c = malloc(N * 4), *f = malloc(N * 4);
    double *d = malloc(N * 8);
    int32_t *e = malloc(N * 4), *io = malloc(N * 4);
    uint8_t *fl = malloc(N * 2);
    uint64_t rng = 2024;
    for (int which = 0; which < 2; which++) {
        bool bf = which == 1;
        uint16_t (*ref)(double) = bf ? xref_bf16 : xref_f16;
        for (int i = 0; i < N; i++) {
            a[i] = (uint16_t)xrand_state(&rng);
            b[i] = (uint16_t)xrand_state(&rng);
            if (i % 4 == 1) a[i] = (uint16_t)(a[i] & 0x83ffu); /* f16 subnormals / small bf16 */
            if (i % 8 == 3) b[i] = ref(xrandf(&rng, -4, 4));   /* ordinary magnitudes */
            uint32_t cb = (uint32_t)xrand_state(&rng);
            memcpy(&c[i], &cb, 4);
            if (i % 3 == 0) c[i] = xrandf(&rng, -70000, 70000);
            if (i % 5 == 0)
                c[i] = ldexpf(1.0f + (float)(i % 7) * 0x1p-11f, (int)(xrand_state(&rng) % 40) - 30);
            d[i] = ldexp(1.0 + (double)(xrand_state(&rng) >> 11) * 0x1p-53,
                         (int)(xrand_state(&rng) % 60) - 40);
            if (i % 2) d[i] = -d[i];
            if (i % 11 == 0)
                d[i] = 1.0 + 0x1p-11 + (i % 22 ? 0x1p-40 : 0.0); /* near and on a tie */
            e[i] = (int32_t)(uint32_t)xrand_state(&rng) >> (int)(xrand_state(&rng) % 32);
        }
        a[0] = 0x7c00, a[1] = 0xfc00, a[2] = 0x7e00, a[3] = 0x0001,
        a[5] = 0x8000; /* f16 specials */
        if (bf) a[0] = 0x7f80, a[1] = 0xff80, a[2] = 0x7fc0, a[3] = 0x0001, a[5] = 0x8000;
        c[0] = 65520.0f, c[1] = 65519.0f, c[2] = NAN, c[3] = -INFINITY, c[4] = 0x1p-25f,
        c[6] = 0x1.8p-24f;
        c[7] = 3.4e38f, c[8] = -0.0f, c[9] = 0x1.0101p0f; /* bf16 tie above even */
        e[0] = INT32_MAX, e[1] = INT32_MIN, e[2] = 65504, e[3] = 65520, e[4] = 16777217;
        xarg args[] = {xbuf(a, N * 2, N),  xbuf(b, N * 2, N),
                       xbuf(c, N * 4, N),  xbuf(d, N * 8, N),
                       xbuf(e, N * 4, N),  xbuf(r, N * H_OPS * 2, (uint64_t)N * H_OPS),
                       xbuf(f, N * 4, N),  xbuf(io, N * 4, N),
                       xbuf(ot, N * 2, N), xbuf(fl, N * 2, (uint64_t)N * 2)};
        xlaunch(m, (size_t)which, XGRID((N + 127) / 128, 1, 1), XGRID(128, 1, 1), args, 10);
        const char *name = bf ? "bf16" : "f16";
        for (int i = 0; i < N; i++) {
            double x = xref_half_value(a[i], bf), y = xref_half_value(b[i], bf);
            uint16_t want[H_OPS] = {
                [H_ADD] = ref(x + y),
                [H_SUB] = ref(x - y),
                [H_MUL] = ref(x * y),
                [H_DIV] = ref(x / y),
                [H_SQRT] = ref(sqrt(fabs(x))),
                [H_FMA] = ref(fma(x, y, y)),
                [H_MIN] = ref(fmin(x, y)),
                [H_MAX] = ref(fmax(x, y)),
                [H_NEG] = (uint16_t)(a[i] ^ 0x8000u),
                [H_ABS] = (uint16_t)(a[i] & 0x7fffu),
                [H_FLOOR] = ref(floor(x)),
                [H_CEIL] = ref(ceil(x)),
                [H_ROUND] = ref(nearbyint(x)),
                [H_FROM_F32] = ref((double)c[i]),
                [H_FROM_F64] = ref(d[i]),
                [H_FROM_I32] = ref((double)e[i]),
                [H_CLAMP] = ref(fmin(fmax(x, -1.0), 1.0)),
                [H_SELECT] = x < y ? a[i] : b[i],
                [H_REM] = ref(fmod(x, y)),
            };
            for (int j = 0; j < H_OPS; j++) {
                char what[48];
                snprintf(what, sizeof what, "%s op %d of (%a, %a)", name, j, x, y);
                xcheck_half(what, (size_t)i, bits16(r, (size_t)i * H_OPS + j), want[j], bf);
            }
            if (!(isnan(x) && isnan(f[i])) && f[i] != (float)x)
                fail_msg("%s -> f32 [%d]: %g vs %g", name, i, f[i], x);
            if (io[i] != ref_sat_i32(x))
                fail_msg("%s -> i32 [%d]: %d, want %d", name, i, io[i], ref_sat_i32(x));
            xcheck_half(bf ? "bf16 -> f16" : "f16 -> bf16", (size_t)i, ot[i],
                        bf ? xref_f16(x) : xref_bf16(x), !bf);
            assert_int_equal(fl[2 * i], isnan(x) ? 1 : 0);
            assert_int_equal(fl[2 * i + 1], isinf(x) ? 1 : 0);
        }
    }
    xmod_free(m);
    em_ir_kernel_free(ks[0]);
    em_ir_kernel_free(ks[1]);
    free(a), free(b), free(r), free(ot), free(c), free(f), free(d), free(e), free(io), free(fl);
}

/* ---- f64 ------------------------------------------------------------------------------------ */

enum {
    D_ADD,
    D_SUB,
    D_MUL,
    D_DIV,
    D_SQRT,
    D_FMA,
    D_MIN,
    D_MAX,
    D_FLOOR,
    D_ROUND,
    D_REM,
    D_NEG,
    D_CLAMP,
    D_EXP,
    D_FROM_I64,
    D_FROM_U64,
    D_OPS
};

static em_ir_kernel *k_f64(void)
{
    em_ir_kernel *k = em_ir_kernel_new("arith_f64");
    em_type t = em_ty(EM_F64);
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 1),
              b = em_ir_param_buffer(k, "b", t, EM_READ, 1);
    em_ir_mem c = em_ir_param_buffer(k, "c", t, EM_READ, 1);
    em_ir_mem n = em_ir_param_buffer(k, "n", em_ty(EM_I64), EM_READ, 1);
    em_ir_mem r = em_ir_param_buffer(k, "r", t, EM_WRITE, 1);
    em_ir_mem f = em_ir_param_buffer(k, "f", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem io = em_ir_param_buffer(k, "io", em_ty(EM_I64), EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, a)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i), z = em_ir_load(k, c, i),
              w = em_ir_load(k, n, i);
    em_ir_val v[D_OPS];
    v[D_ADD] = em_ir_binary(k, EM_OP_ADD, x, y);
    v[D_SUB] = em_ir_binary(k, EM_OP_SUB, x, y);
    v[D_MUL] = em_ir_binary(k, EM_OP_MUL, x, y);
    v[D_DIV] = em_ir_binary(k, EM_OP_DIV, x, y);
    v[D_SQRT] = em_ir_unary(k, EM_OP_SQRT, x);
    v[D_FMA] = em_ir_ternary(k, EM_OP_FMA, x, y, z);
    v[D_MIN] = em_ir_binary(k, EM_OP_MIN, x, y);
    v[D_MAX] = em_ir_binary(k, EM_OP_MAX, x, y);
    v[D_FLOOR] = em_ir_unary(k, EM_OP_FLOOR, x);
    v[D_ROUND] = em_ir_unary(k, EM_OP_ROUND, x);
    v[D_REM] = em_ir_binary(k, EM_OP_REM, x, y);
    v[D_NEG] = em_ir_unary(k, EM_OP_NEG, x);
    v[D_CLAMP] = em_ir_ternary(k, EM_OP_CLAMP, x, y, z);
    v[D_EXP] = em_ir_unary(k, EM_OP_EXP, y);
    v[D_FROM_I64] = em_ir_cast(k, t, w);
    v[D_FROM_U64] = em_ir_cast(k, t, em_ir_bitcast(k, em_ty(EM_U64), w));
    for (unsigned j = 0; j < D_OPS; j++) em_ir_store(k, r, at(k, i, D_OPS, j), v[j]);
    em_ir_store(k, f, i, em_ir_cast(k, em_ty(EM_F32), x));
    em_ir_store(k, io, i, em_ir_cast(k, em_ty(EM_I64), x));
    em_ir_end(k);
    return k;
}

static bool same_f64(double a, double b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, 8) == 0;
}

static void test_f64(void **state)
{
    (void)state;
    enum { N = 3000 };
    em_ir_kernel *k = k_f64();
    double *a = malloc(N * 8), *b = malloc(N * 8), *c = malloc(N * 8), *r = malloc(N * D_OPS * 8);
    int64_t *n = malloc(N * 8), *io = malloc(N * 8);
    float *f = malloc(N * 4);
    uint64_t rng = 64;
    for (int i = 0; i < N; i++) {
        a[i] = ldexp((double)(int64_t)xrand_state(&rng), -(int)(xrand_state(&rng) % 120));
        b[i] = ldexp((double)(int64_t)xrand_state(&rng), -60 - (int)(xrand_state(&rng) % 8));
        c[i] = (double)(int64_t)xrand_state(&rng) * 0x1p-70;
        n[i] = (int64_t)xrand_state(&rng);
    }
    a[0] = NAN, a[1] = INFINITY, a[2] = 1e300, a[3] = -1e300, a[4] = 2.5, a[5] = 3.5, a[6] = -0.0;
    a[7] = 9.3e18, a[8] = -9.3e18, b[9] = 0;
    n[0] = INT64_MIN, n[1] = INT64_MAX, n[2] = -1,
    n[3] = (INT64_C(1) << 60) + (INT64_C(1) << 52) + 1;
    xarg args[] = {xbuf(a, N * 8, N),
                   xbuf(b, N * 8, N),
                   xbuf(c, N * 8, N),
                   xbuf(n, N * 8, N),
                   xbuf(r, N * D_OPS * 8, (uint64_t)N * D_OPS),
                   xbuf(f, N * 4, N),
                   xbuf(io, N * 8, N)};
    xrun(k, XGRID((N + 63) / 64, 1, 1), XGRID(64, 1, 1), args, 7);
    for (int i = 0; i < N; i++) {
        double x = a[i], y = b[i], z = c[i];
        double want[D_OPS] = {x + y,
                              x - y,
                              x * y,
                              x / y,
                              sqrt(x),
                              fma(x, y, z),
                              fmin(x, y),
                              fmax(x, y),
                              floor(x),
                              nearbyint(x),
                              fmod(x, y),
                              -x,
                              fmin(fmax(x, y), z),
                              exp(y),
                              (double)n[i],
                              (double)(uint64_t)n[i]};
        for (int j = 0; j < D_OPS; j++)
            if (!same_f64(r[i * D_OPS + j], want[j]))
                fail_msg("f64 op %d [%d] of (%a, %a, %a): got %a, want %a", j, i, x, y, z,
                         r[i * D_OPS + j], want[j]);
        float wf = (float)x;
        assert_true((isnan(wf) && isnan(f[i])) || memcmp(&wf, &f[i], 4) == 0);
        int64_t wi = isnan(x)                      ? 0
                     : x <= -9223372036854775808.0 ? INT64_MIN
                     : x >= 9223372036854775807.0  ? INT64_MAX
                                                   : (int64_t)x;
        if (io[i] != wi)
            fail_msg("f64 -> i64 [%d] of %a: %lld, want %lld", i, x, (long long)io[i],
                     (long long)wi);
    }
    em_ir_kernel_free(k);
    free(a), free(b), free(c), free(r), free(n), free(io), free(f);
}

/* ---- integers ------------------------------------------------------------------------------- */

enum {
    I_ADD,
    I_SUB,
    I_MUL,
    I_DIV,
    I_REM,
    I_MIN,
    I_MAX,
    I_AND,
    I_OR,
    I_XOR,
    I_SHL,
    I_SHR,
    I_NEG,
    I_NOT,
    I_ABS,
    I_POPCOUNT,
    I_CLZ,
    I_CTZ,
    I_CLAMP,
    I_LT,
    I_SELECT,
    I_EQ,
    I_OPS
};

static const em_scalar int_kinds[] = {EM_I8, EM_I16, EM_I32, EM_I64, EM_U8, EM_U16, EM_U32, EM_U64};
enum { NINT = sizeof int_kinds / sizeof int_kinds[0] };

static em_ir_kernel *k_int(em_scalar s)
{
    char name[32];
    snprintf(name, sizeof name, "int_%s", em_scalar_name(s));
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_type t = em_ty(s);
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 1),
              b = em_ir_param_buffer(k, "b", t, EM_READ, 1);
    em_ir_mem c = em_ir_param_buffer(k, "c", t, EM_READ, 1);
    em_ir_mem r = em_ir_param_buffer(k, "r", t, EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, a)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i), z = em_ir_load(k, c, i);
    em_ir_val v[I_OPS];
    static const em_ir_op bin[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                   EM_OP_REM, EM_OP_MIN, EM_OP_MAX, EM_OP_AND,
                                   EM_OP_OR,  EM_OP_XOR, EM_OP_SHL, EM_OP_SHR};
    for (unsigned j = 0; j < sizeof bin / sizeof bin[0]; j++) v[j] = em_ir_binary(k, bin[j], x, y);
    v[I_NEG] = em_ir_unary(k, EM_OP_NEG, x);
    v[I_NOT] = em_ir_unary(k, EM_OP_NOT, x);
    v[I_ABS] = em_ir_unary(k, EM_OP_ABS, x);
    v[I_POPCOUNT] = em_ir_cast(k, t, em_ir_unary(k, EM_OP_POPCOUNT, x));
    v[I_CLZ] = em_ir_cast(k, t, em_ir_unary(k, EM_OP_CLZ, x));
    v[I_CTZ] = em_ir_cast(k, t, em_ir_unary(k, EM_OP_CTZ, x));
    v[I_CLAMP] = em_ir_ternary(k, EM_OP_CLAMP, x, y, z);
    v[I_LT] = em_ir_cast(k, t, em_ir_binary(k, EM_OP_LT, x, y));
    v[I_SELECT] = em_ir_ternary(k, EM_OP_SELECT, em_ir_binary(k, EM_OP_LT, x, y), y, x);
    v[I_EQ] = em_ir_cast(k, t, em_ir_binary(k, EM_OP_EQ, x, y));
    for (unsigned j = 0; j < I_OPS; j++) em_ir_store(k, r, at(k, i, I_OPS, j), v[j]);
    em_ir_end(k);
    return k;
}

static uint64_t load_bits(const void *p, size_t i, unsigned bytes)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)p + i * bytes, bytes);
    return v;
}

static void store_bits(void *p, size_t i, unsigned bytes, uint64_t v)
{
    memcpy((char *)p + i * bytes, &v, bytes);
}

/* The reference: values as 64-bit patterns of width w; signed kinds sign-extended. */
static uint64_t ref_int(int op, uint64_t ua, uint64_t ub, uint64_t uc, unsigned w, bool sgn)
{
    uint64_t mask = w == 64 ? ~UINT64_C(0) : (UINT64_C(1) << w) - 1;
    int64_t sa = 0, sb = 0, sc = 0;
    if (sgn) {
        unsigned sh = 64 - w;
        sa = (int64_t)(ua << sh) >> sh, sb = (int64_t)(ub << sh) >> sh,
        sc = (int64_t)(uc << sh) >> sh;
    }
    bool lt = sgn ? sa < sb : ua < ub;
    uint64_t r = 0;
    switch (op) {
    case I_ADD:
        r = ua + ub;
        break;
    case I_SUB:
        r = ua - ub;
        break;
    case I_MUL:
        r = ua * ub;
        break;
    case I_DIV:
        if (ub == 0)
            r = ua;
        else if (sgn && sb == -1)
            r = 0 - ua;
        else
            r = sgn ? (uint64_t)(sa / sb) : ua / ub;
        break;
    case I_REM:
        if (ub == 0 || (sgn && sb == -1))
            r = 0;
        else
            r = sgn ? (uint64_t)(sa % sb) : ua % ub;
        break;
    case I_MIN:
        r = lt ? ua : ub;
        break;
    case I_MAX:
        r = (sgn ? sa > sb : ua > ub) ? ua : ub;
        break;
    case I_AND:
        r = ua & ub;
        break;
    case I_OR:
        r = ua | ub;
        break;
    case I_XOR:
        r = ua ^ ub;
        break;
    case I_SHL:
        r = ua << (ub & (w - 1));
        break;
    case I_SHR:
        r = sgn ? (uint64_t)(sa >> (ub & (w - 1))) : (ua & mask) >> (ub & (w - 1));
        break;
    case I_NEG:
        r = 0 - ua;
        break;
    case I_NOT:
        r = ~ua;
        break;
    case I_ABS:
        r = sgn && sa < 0 ? 0 - ua : ua;
        break;
    case I_POPCOUNT:
        r = (uint64_t)__builtin_popcountll(ua & mask);
        break;
    case I_CLZ: {
        uint64_t x = ua & mask;
        r = x ? (uint64_t)(__builtin_clzll(x) - (64 - (int)w)) : w;
        break;
    }
    case I_CTZ: {
        uint64_t x = ua & mask;
        r = x ? (uint64_t)__builtin_ctzll(x) : w;
        break;
    }
    case I_CLAMP: {
        bool below = sgn ? sa < sb : (ua & mask) < (ub & mask);
        bool above = sgn ? sa > sc : (ua & mask) > (uc & mask);
        r = below ? ub : above ? uc : ua;
        break;
    }
    case I_LT:
        r = lt;
        break;
    case I_SELECT:
        r = lt ? ub : ua;
        break;
    case I_EQ:
        r = ((ua ^ ub) & mask) == 0;
        break;
    }
    return r & mask;
}

static void test_int_ops(void **state)
{
    (void)state;
    enum { N = 700 };
    em_ir_kernel *ks[NINT];
    for (int t = 0; t < NINT; t++) ks[t] = k_int(int_kinds[t]);
    xmod *m = xcompile(ks, NINT);
    uint64_t rng = 8;
    void *a = malloc(N * 8), *b = malloc(N * 8), *c = malloc(N * 8),
         *r = malloc((size_t)N * I_OPS * 8);
    for (int t = 0; t < NINT; t++) {
        em_scalar s = int_kinds[t];
        unsigned bytes = (unsigned)em_scalar_size(s), w = bytes * 8;
        bool sgn = em_scalar_is_signed(s);
        uint64_t min = sgn ? UINT64_C(1) << (w - 1) : 0,
                 edges[] = {0, 1, ~UINT64_C(0), min, min - 1, 2, 3, 7};
        for (int i = 0; i < N; i++) {
            uint64_t x = xrand_state(&rng) >> (xrand_state(&rng) % 64),
                     y = xrand_state(&rng) >> (xrand_state(&rng) % 64);
            if (i < 64) x = edges[i % 8], y = edges[i / 8];
            if (i % 9 == 5) y = xrand_state(&rng) % 80; /* shift counts around the width */
            store_bits(a, (size_t)i, bytes, x);
            store_bits(b, (size_t)i, bytes, y);
            store_bits(c, (size_t)i, bytes, xrand_state(&rng));
        }
        xarg args[] = {xbuf(a, (size_t)N * bytes, N), xbuf(b, (size_t)N * bytes, N),
                       xbuf(c, (size_t)N * bytes, N),
                       xbuf(r, (size_t)N * I_OPS * bytes, (uint64_t)N * I_OPS)};
        xlaunch(m, (size_t)t, XGRID((N + 99) / 100, 1, 1), XGRID(100, 1, 1), args, 4);
        for (int i = 0; i < N; i++) {
            uint64_t x = load_bits(a, (size_t)i, bytes), y = load_bits(b, (size_t)i, bytes);
            uint64_t z = load_bits(c, (size_t)i, bytes);
            for (int op = 0; op < I_OPS; op++) {
                uint64_t got = load_bits(r, (size_t)i * I_OPS + op, bytes),
                         want = ref_int(op, x, y, z, w, sgn);
                if (got != want)
                    fail_msg("%s op %d of (0x%llx, 0x%llx, 0x%llx): got 0x%llx, want 0x%llx",
                             em_scalar_name(s), op, (unsigned long long)x, (unsigned long long)y,
                             (unsigned long long)z, (unsigned long long)got,
                             (unsigned long long)want);
            }
        }
    }
    xmod_free(m);
    for (int t = 0; t < NINT; t++) em_ir_kernel_free(ks[t]);
    free(a), free(b), free(c), free(r);
}

/* 64-bit constants stay 64-bit in expressions: products, shifts and sums beyond 32 bits. */
static void test_int64_constants(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("int64_constants");
    em_type u = em_ty(EM_U64), i = em_ty(EM_I64);
    em_ir_mem zu = em_ir_param_buffer(k, "zu", u, EM_READ, 0);
    em_ir_mem zi = em_ir_param_buffer(k, "zi", i, EM_READ, 0);
    em_ir_mem ou = em_ir_param_buffer(k, "ou", u, EM_WRITE, 0);
    em_ir_mem oi = em_ir_param_buffer(k, "oi", i, EM_WRITE, 0);
    em_ir_val x = em_ir_load(k, zu, em_ir_u32(k, 0)),
              y = em_ir_load(k, zi, em_ir_u32(k, 0)); /* zeros */
    em_ir_val big = em_ir_binary(k, EM_OP_ADD, em_ir_const_uint(k, u, 4000000000u), x);
    em_ir_store(k, ou, em_ir_u32(k, 0), em_ir_binary(k, EM_OP_MUL, big, em_ir_const_uint(k, u, 3)));
    em_ir_store(k, ou, em_ir_u32(k, 1),
                em_ir_binary(k, EM_OP_SHR, em_ir_const_uint(k, u, UINT64_C(1) << 40),
                             em_ir_binary(k, EM_OP_ADD, x, em_ir_const_uint(k, u, 35))));
    em_ir_store(k, ou, em_ir_u32(k, 2),
                em_ir_binary(k, EM_OP_SHL, em_ir_binary(k, EM_OP_ADD, x, em_ir_const_uint(k, u, 1)),
                             em_ir_const_uint(k, u, 40)));
    /* constants only (folded by em_ir_simplify on the runtime path, computed by the C otherwise) */
    em_ir_store(k, ou, em_ir_u32(k, 3),
                em_ir_binary(k, EM_OP_MUL, em_ir_const_uint(k, u, 4000000000u), em_ir_const_uint(k, u, 3)));
    em_ir_store(k, ou, em_ir_u32(k, 4),
                em_ir_binary(k, EM_OP_SHR, em_ir_const_uint(k, u, 106), em_ir_const_uint(k, u, 42)));
    em_ir_store(k, oi, em_ir_u32(k, 0),
                em_ir_binary(k, EM_OP_SUB,
                             em_ir_binary(k, EM_OP_ADD, y, em_ir_const_int(k, i, -3000000000)),
                             em_ir_const_int(k, i, -5)));
    em_ir_store(k, oi, em_ir_u32(k, 1), em_ir_unary(k, EM_OP_NEG, em_ir_const_int(k, i, -7)));
    em_ir_store(k, oi, em_ir_u32(k, 2),
                em_ir_binary(k, EM_OP_MUL,
                             em_ir_binary(k, EM_OP_ADD, y, em_ir_const_int(k, i, 1 << 20)),
                             em_ir_const_int(k, i, -(1 << 20))));
    uint64_t zero_u = 0, outu[5];
    int64_t zero_i = 0, outi[3];
    xarg args[] = {xbuf(&zero_u, 8, 1), xbuf(&zero_i, 8, 1), xbuf(outu, sizeof outu, 5),
                   xbuf(outi, sizeof outi, 3)};
    xrun(k, XGRID(1, 1, 1), XGRID(1, 1, 1), args, 4);
    assert_true(outu[0] == UINT64_C(12000000000));
    assert_true(outu[1] == 32);
    assert_true(outu[2] == UINT64_C(1) << 40);
    assert_true(outu[3] == UINT64_C(12000000000));
    assert_true(outu[4] == 0);
    assert_true(outi[0] == -2999999995);
    assert_true(outi[1] == 7);
    assert_true(outi[2] == -(INT64_C(1) << 40));
    em_ir_kernel_free(k);
}

/* ---- casts and bitcasts ------------------------------------------------------------------------
 */

/* out_D[i] = (D)x[i] for all 13 kinds D. */
static em_ir_kernel *k_cast_from(em_scalar s)
{
    char name[32];
    snprintf(name, sizeof name, "cast_from_%s", em_scalar_name(s));
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_ir_mem x = em_ir_param_buffer(k, "x", em_ty(s), EM_READ, 0);
    em_ir_mem out[EM_SCALAR_COUNT];
    for (int d = 0; d < EM_SCALAR_COUNT; d++) {
        char pn[16];
        snprintf(pn, sizeof pn, "to_%s", em_scalar_name((em_scalar)d));
        out[d] = em_ir_param_buffer(k, pn, em_ty((em_scalar)d), EM_WRITE, 0);
    }
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, x)));
    em_ir_val v = em_ir_load(k, x, i);
    for (int d = 0; d < EM_SCALAR_COUNT; d++)
        em_ir_store(k, out[d], i, em_ir_cast(k, em_ty((em_scalar)d), v));
    em_ir_end(k);
    return k;
}

/* A source value: exactly, as a double (floats) or as 64-bit integer bits. */
typedef struct xval {
    bool is_float;
    double f;
    bool neg;     /* integers: negative */
    uint64_t mag; /* integers: magnitude */
} xval;

static xval decode(em_scalar s, uint64_t bits)
{
    xval v = {0};
    unsigned w = (unsigned)em_scalar_size(s) * 8;
    switch (s) {
    case EM_BOOL:
        v.mag = bits & 0xff ? 1 : 0;
        return v;
    case EM_F16:
        v.is_float = true, v.f = xref_half_value((uint16_t)bits, false);
        return v;
    case EM_BF16:
        v.is_float = true, v.f = xref_half_value((uint16_t)bits, true);
        return v;
    case EM_F32: {
        float f;
        uint32_t b32 = (uint32_t)bits;
        memcpy(&f, &b32, 4);
        v.is_float = true, v.f = f;
        return v;
    }
    case EM_F64:
        v.is_float = true, memcpy(&v.f, &bits, 8);
        return v;
    default:
        break;
    }
    if (w < 64) bits &= (UINT64_C(1) << w) - 1;
    if (em_scalar_is_signed(s) && (bits >> (w - 1)) & 1) {
        uint64_t ext = w < 64 ? bits | ~((UINT64_C(1) << w) - 1) : bits;
        v.neg = true, v.mag = 0 - ext;
    } else {
        v.mag = bits;
    }
    return v;
}

/* An integer, rounded to a half kind with `mant` fraction bits, exactly. */
static uint16_t ref_int_half(const xval *v, bool bf)
{
    uint64_t m = v->mag;
    int p = m ? 64 - __builtin_clzll(m) : 0, keep = (bf ? 7 : 10) + 1;
    double r;
    if (p <= keep) {
        r = (double)m;
    } else {
        int sh = p - keep;
        uint64_t q = m >> sh, rest = m & ((UINT64_C(1) << sh) - 1), half = UINT64_C(1) << (sh - 1);
        if (rest > half || (rest == half && (q & 1))) q++;
        r = ldexp((double)q, sh);
    }
    if (v->neg) r = -r;
    return bf ? xref_bf16(r) : xref_f16(r);
}

static uint64_t ref_cast(em_scalar from, em_scalar to, uint64_t bits)
{
    xval v = decode(from, bits);
    unsigned w = (unsigned)em_scalar_size(to) * 8;
    if (to == EM_BOOL) return v.is_float ? v.f != 0 : v.mag != 0;
    if (em_scalar_is_int(to)) {
        bool sgn = em_scalar_is_signed(to);
        uint64_t mask = w == 64 ? ~UINT64_C(0) : (UINT64_C(1) << w) - 1;
        if (!v.is_float) return (v.neg ? 0 - v.mag : v.mag) & mask;
        if (isnan(v.f)) return 0;
        double lo = sgn ? -ldexp(1.0, (int)w - 1) : 0,
               hi = sgn ? ldexp(1.0, (int)w - 1) : ldexp(1.0, (int)w);
        if (v.f <= lo) return sgn ? (UINT64_C(1) << (w - 1)) & mask : 0;
        if (v.f >= hi) return sgn ? mask >> 1 : mask;
        double t = trunc(v.f);
        return (t < 0 ? 0 - (uint64_t)(-t) : (uint64_t)t) & mask;
    }
    if (to == EM_F16 || to == EM_BF16) {
        bool bf = to == EM_BF16;
        if (v.is_float) return bf ? xref_bf16(v.f) : xref_f16(v.f);
        return ref_int_half(&v, bf);
    }
    if (to == EM_F32) {
        float f = v.is_float ? (float)v.f : v.neg ? -(float)v.mag : (float)v.mag;
        if (!v.is_float && v.neg && v.mag == UINT64_C(1) << 63) f = -0x1p63f;
        uint32_t b;
        memcpy(&b, &f, 4);
        return b;
    }
    double d = v.is_float ? v.f : v.neg ? -(double)v.mag : (double)v.mag;
    uint64_t b;
    memcpy(&b, &d, 8);
    return b;
}

static bool same_value(em_scalar s, uint64_t got, uint64_t want)
{
    if (em_scalar_is_float(s)) {
        xval a = decode(s, got), b = decode(s, want);
        if (isnan(a.f) && isnan(b.f)) return true;
    }
    unsigned w = (unsigned)em_scalar_size(s) * 8;
    uint64_t mask = w == 64 ? ~UINT64_C(0) : (UINT64_C(1) << w) - 1;
    return ((got ^ want) & mask) == 0;
}

static void test_casts(void **state)
{
    (void)state;
    enum { N = 256 };
    em_ir_kernel *ks[EM_SCALAR_COUNT];
    for (int s = 0; s < EM_SCALAR_COUNT; s++) ks[s] = k_cast_from((em_scalar)s);
    xmod *m = xcompile(ks, EM_SCALAR_COUNT);
    static const double specials[] = {0.0,          -0.0,         0.5,           1.5,    2.5,
                                      -2.5,         1e10,         -1e10,         NAN,    INFINITY,
                                      -INFINITY,    3e38,         65504,         65520,  1e-8,
                                      127.9,        128.0,        -129.0,        255.5,  65535.9,
                                      4294967295.0, 2147483648.0, -2147483649.0, 9.3e18, -9.3e18,
                                      1.9e19,       0x1.0101p0,   1.0 + 0x1p-11, 6e-8};
    enum { NSPEC = sizeof specials / sizeof specials[0] };
    static const uint64_t int_edges[] = {0,
                                         1,
                                         ~UINT64_C(0),
                                         127,
                                         128,
                                         255,
                                         256,
                                         32767,
                                         32768,
                                         65535,
                                         65536,
                                         16777217,
                                         0x7fffffffu,
                                         0x80000000u,
                                         0xffffffffu,
                                         UINT64_C(1) << 63,
                                         (UINT64_C(1) << 63) - 1,
                                         (UINT64_C(1) << 60) + (UINT64_C(1) << 52) + 1,
                                         (UINT64_C(1) << 24) + (UINT64_C(3) << 16) - 1};
    enum { NEDGE = sizeof int_edges / sizeof int_edges[0] };
    uint64_t rng = 13;
    void *x = malloc(N * 8), *out[EM_SCALAR_COUNT];
    for (int d = 0; d < EM_SCALAR_COUNT; d++) out[d] = malloc(N * 8);
    for (int s = 0; s < EM_SCALAR_COUNT; s++) {
        em_scalar from = (em_scalar)s;
        unsigned bytes = (unsigned)em_scalar_size(from);
        for (int i = 0; i < N; i++) {
            uint64_t bits = xrand_state(&rng) >> (xrand_state(&rng) % 60);
            if (from == EM_BOOL)
                bits = i % 2;
            else if (em_scalar_is_int(from) && i < NEDGE)
                bits = int_edges[i];
            else if (em_scalar_is_float(from) && i < NSPEC) {
                double v = specials[i];
                if (from == EM_F64)
                    memcpy(&bits, &v, 8);
                else if (from == EM_F32) {
                    float f = (float)v;
                    uint32_t b32;
                    memcpy(&b32, &f, 4);
                    bits = b32;
                } else {
                    bits = from == EM_F16 ? xref_f16(v) : xref_bf16(v);
                }
            } else if (from == EM_F64 && i % 2) { /* doubles of ordinary size */
                double v =
                    ldexp((double)(int64_t)xrand_state(&rng), -(int)(xrand_state(&rng) % 80));
                memcpy(&bits, &v, 8);
            } else if (from == EM_F32 && i % 2) {
                float f = ldexpf((float)(int32_t)xrand_state(&rng), -(int)(xrand_state(&rng) % 40));
                uint32_t b32;
                memcpy(&b32, &f, 4);
                bits = b32;
            }
            store_bits(x, (size_t)i, bytes, bits);
        }
        xarg args[1 + EM_SCALAR_COUNT];
        args[0] = xbuf(x, (size_t)N * bytes, N);
        for (int d = 0; d < EM_SCALAR_COUNT; d++)
            args[1 + d] = xbuf(out[d], N * em_scalar_size((em_scalar)d), N);
        xlaunch(m, (size_t)s, XGRID(4, 1, 1), XGRID(64, 1, 1), args, 1 + EM_SCALAR_COUNT);
        for (int d = 0; d < EM_SCALAR_COUNT; d++) {
            em_scalar to = (em_scalar)d;
            unsigned ob = (unsigned)em_scalar_size(to);
            for (int i = 0; i < N; i++) {
                uint64_t in = load_bits(x, (size_t)i, bytes),
                         got = load_bits(out[d], (size_t)i, ob);
                uint64_t want = ref_cast(from, to, in);
                if (!same_value(to, got, want))
                    fail_msg("cast %s -> %s of 0x%llx: got 0x%llx, want 0x%llx",
                             em_scalar_name(from), em_scalar_name(to), (unsigned long long)in,
                             (unsigned long long)got, (unsigned long long)want);
            }
        }
    }
    xmod_free(m);
    for (int s = 0; s < EM_SCALAR_COUNT; s++) em_ir_kernel_free(ks[s]);
    for (int d = 0; d < EM_SCALAR_COUNT; d++) free(out[d]);
    free(x);
}

/* Bitcasts reinterpret bytes: a u32x2 line becomes f64, i64, u16x4, f16x4, bf16x4, i8x8 and f32x2;
 * a u32 becomes f32, f16x2 and i8x4; and the f64 goes back to u32x2. */
static void test_bitcasts(void **state)
{
    (void)state;
    enum { N = 64 };
    static const em_type wide[] = {{EM_F64, 1},  {EM_I64, 1}, {EM_U16, 4}, {EM_F16, 4},
                                   {EM_BF16, 4}, {EM_I8, 8},  {EM_F32, 2}};
    static const em_type narrow[] = {{EM_F32, 1}, {EM_F16, 2}, {EM_I8, 4}};
    enum { NW = sizeof wide / sizeof wide[0], NN = sizeof narrow / sizeof narrow[0] };
    em_ir_kernel *k = em_ir_kernel_new("bitcasts");
    em_ir_mem src = em_ir_param_buffer(k, "src", em_line(EM_U32, 2), EM_READ, 0);
    em_ir_mem w[NW], nw[NN];
    for (int j = 0; j < NW; j++) w[j] = em_ir_param_buffer(k, "w", wide[j], EM_WRITE, 0);
    for (int j = 0; j < NN; j++) nw[j] = em_ir_param_buffer(k, "n", narrow[j], EM_WRITE, 0);
    em_ir_mem back = em_ir_param_buffer(k, "back", em_line(EM_U32, 2), EM_WRITE, 0);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_len(k, src)));
    em_ir_val v = em_ir_load(k, src, pos);
    for (int j = 0; j < NW; j++) em_ir_store(k, w[j], pos, em_ir_bitcast(k, wide[j], v));
    em_ir_val lo = em_ir_extract(k, v, em_ir_u32(k, 0));
    for (int j = 0; j < NN; j++) em_ir_store(k, nw[j], pos, em_ir_bitcast(k, narrow[j], lo));
    em_ir_store(k, back, pos,
                em_ir_bitcast(k, em_line(EM_U32, 2), em_ir_bitcast(k, em_ty(EM_F64), v)));
    em_ir_end(k);
    uint32_t in[N * 2], bk[N * 2];
    uint64_t outw[NW][N];
    uint32_t outn[NN][N];
    uint64_t rng = 3;
    for (int i = 0; i < N * 2; i++) in[i] = (uint32_t)xrand_state(&rng);
    xarg args[2 + NW + NN];
    args[0] = xbuf(in, sizeof in, N);
    for (int j = 0; j < NW; j++) args[1 + j] = xbuf(outw[j], sizeof outw[j], N);
    for (int j = 0; j < NN; j++) args[1 + NW + j] = xbuf(outn[j], sizeof outn[j], N);
    args[1 + NW + NN] = xbuf(bk, sizeof bk, N);
    xrun(k, XGRID(2, 1, 1), XGRID(32, 1, 1), args, 2 + NW + NN);
    for (int j = 0; j < NW; j++) assert_memory_equal(outw[j], in, sizeof in);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < NN; j++) assert_int_equal(outn[j][i], in[2 * i]);
    assert_memory_equal(bk, in, sizeof in);
    em_ir_kernel_free(k);
}

/* ---- lines: select, compare, bool logic, extract / insert ------------------------------------ */

enum { S_SELECT_LINE, S_SELECT_SCALAR, S_CLAMP, S_INSERT, S_NF };

static em_ir_kernel *k_select(void)
{
    em_ir_kernel *k = em_ir_kernel_new("select_compare");
    em_type f4 = em_line(EM_F32, 4), b4 = em_line(EM_BOOL, 4), u16 = em_line(EM_U8, 16);
    em_ir_mem a = em_ir_param_buffer(k, "a", f4, EM_READ, 1),
              b = em_ir_param_buffer(k, "b", f4, EM_READ, 1);
    em_ir_mem c = em_ir_param_buffer(k, "c", em_line(EM_I32, 3), EM_READ, 1);
    em_ir_mem fo = em_ir_param_buffer(k, "fo", f4, EM_WRITE, 1);
    em_ir_mem cmp = em_ir_param_buffer(k, "cmp", b4, EM_WRITE, 1);
    em_ir_mem ex = em_ir_param_buffer(k, "ex", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem bytes = em_ir_param_buffer(k, "bytes", u16, EM_READ_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, a)));
    em_ir_val x = em_ir_load(k, a, i), y = em_ir_load(k, b, i), z = em_ir_load(k, c, i);
    em_ir_val lt = em_ir_binary(k, EM_OP_LT, x, y);
    em_ir_val flag = em_ir_binary(k, EM_OP_GT, em_ir_extract(k, z, em_ir_u32(k, 1)),
                                  em_ir_const_int(k, em_ty(EM_I32), 0));
    em_ir_val fv[S_NF];
    fv[S_SELECT_LINE] = em_ir_ternary(k, EM_OP_SELECT, lt, x, y);
    fv[S_SELECT_SCALAR] =
        em_ir_ternary(k, EM_OP_SELECT, flag, x, em_ir_const_float(k, em_ty(EM_F32), 7.0));
    fv[S_CLAMP] = em_ir_ternary(k, EM_OP_CLAMP, x, em_ir_const_float(k, em_ty(EM_F32), -0.5),
                                em_ir_const_float(k, em_ty(EM_F32), 0.5));
    em_ir_val lane = em_ir_binary(k, EM_OP_REM, i, em_ir_u32(k, 4));
    fv[S_INSERT] = em_ir_insert(
        k, x,
        em_ir_binary(k, EM_OP_REM, em_ir_binary(k, EM_OP_ADD, i, em_ir_u32(k, 1)), em_ir_u32(k, 4)),
        em_ir_const_float(k, em_ty(EM_F32), 99.0));
    for (unsigned j = 0; j < S_NF; j++) em_ir_store(k, fo, at(k, i, S_NF, j), fv[j]);
    static const em_ir_op cmps[] = {EM_OP_EQ, EM_OP_NE, EM_OP_LT, EM_OP_LE, EM_OP_GT, EM_OP_GE};
    em_ir_val cv[10];
    for (unsigned j = 0; j < 6; j++) cv[j] = em_ir_binary(k, cmps[j], x, y);
    em_ir_val nan = em_ir_unary(k, EM_OP_ISNAN, x);
    cv[6] = em_ir_binary(k, EM_OP_AND, lt, em_ir_unary(k, EM_OP_NOT, nan));
    cv[7] = em_ir_binary(k, EM_OP_OR, lt, nan);
    cv[8] = em_ir_binary(k, EM_OP_XOR, lt, flag); /* a scalar bool broadcast against a line */
    cv[9] = em_ir_binary(k, EM_OP_EQ, lt, em_ir_const_bool(k, true));
    for (unsigned j = 0; j < 10; j++) em_ir_store(k, cmp, at(k, i, 10, j), cv[j]);
    em_ir_store(k, ex, i, em_ir_extract(k, x, lane));
    em_ir_val by = em_ir_load(k, bytes, i);
    em_ir_store(k, bytes, i,
                em_ir_binary(k, EM_OP_XOR, by, em_ir_const_uint(k, em_ty(EM_U8), 0x5a)));
    em_ir_end(k);
    return k;
}

static void test_select_compare_lines(void **state)
{
    (void)state;
    enum { N = 200 };
    em_ir_kernel *k = k_select();
    float *a = malloc(N * 16), *b = malloc(N * 16), *fo = malloc(N * 16 * S_NF),
          *ex = malloc(N * 4);
    int32_t *c = malloc(N * 12);
    uint8_t *cmp = malloc(N * 40), *bytes = malloc(N * 16), *orig = malloc(N * 16);
    uint64_t rng = 17;
    for (int i = 0; i < N * 4; i++) {
        a[i] = xrandf(&rng, -1, 1), b[i] = xrandf(&rng, -1, 1);
        if (i % 7 == 0) b[i] = a[i];
        if (i % 13 == 0) a[i] = NAN;
    }
    for (int i = 0; i < N * 3; i++) c[i] = (int32_t)(xrand_state(&rng) % 5) - 2;
    for (int i = 0; i < N * 16; i++) bytes[i] = orig[i] = (uint8_t)xrand_state(&rng);
    xarg args[] = {xbuf(a, N * 16, N),        xbuf(b, N * 16, N),
                   xbuf(c, N * 12, N),        xbuf(fo, N * 16 * S_NF, N * S_NF),
                   xbuf(cmp, N * 40, N * 10), xbuf(ex, N * 4, N),
                   xbuf(bytes, N * 16, N)};
    xrun(k, XGRID(7, 1, 1), XGRID(32, 1, 1), args, 7);
    for (int i = 0; i < N; i++) {
        bool flag = c[i * 3 + 1] > 0;
        for (int l = 0; l < 4; l++) {
            float x = a[i * 4 + l], y = b[i * 4 + l];
            float want[S_NF] = {x < y ? x : y, flag ? x : 7.0f, fminf(fmaxf(x, -0.5f), 0.5f),
                                l == (i + 1) % 4 ? 99.0f : x};
            for (int j = 0; j < S_NF; j++) {
                float got = fo[(i * S_NF + j) * 4 + l];
                if (!(got == want[j] || (isnan(got) && isnan(want[j]))))
                    fail_msg("select op %d [%d.%d]: got %g, want %g", j, i, l, got, want[j]);
            }
            bool lt = x < y, nan = isnan(x);
            bool wc[10] = {x == y,     x != y,    x<y, x <= y, x> y, x >= y,
                           lt && !nan, lt || nan, lt != flag,        lt == true};
            for (int j = 0; j < 10; j++)
                if (cmp[(i * 10 + j) * 4 + l] != wc[j])
                    fail_msg("compare op %d [%d.%d] of (%g, %g)", j, i, l, x, y);
        }
        float wx = a[i * 4 + i % 4];
        assert_true(ex[i] == wx || (isnan(ex[i]) && isnan(wx)));
        for (int l = 0; l < 16; l++) assert_int_equal(bytes[i * 16 + l], orig[i * 16 + l] ^ 0x5a);
    }
    em_ir_kernel_free(k);
    free(a), free(b), free(fo), free(ex), free(c), free(cmp), free(bytes), free(orig);
}

/* ---- plane ops ---------------------------------------------------------------------------------
 */

static void test_plane_ops(void **state)
{
    (void)state;
    enum { N = 96, NF = 11, NU = 6 };
    static const em_ir_op fops[NF] = {
        EM_OP_PLANE_SUM,        EM_OP_PLANE_PROD,          EM_OP_PLANE_MIN,
        EM_OP_PLANE_MAX,        EM_OP_PLANE_INCLUSIVE_SUM, EM_OP_PLANE_EXCLUSIVE_SUM,
        EM_OP_PLANE_BROADCAST,  EM_OP_PLANE_SHUFFLE,       EM_OP_PLANE_SHUFFLE_XOR,
        EM_OP_PLANE_SHUFFLE_UP, EM_OP_PLANE_SHUFFLE_DOWN};
    em_ir_kernel *k = em_ir_kernel_new("plane_ops");
    em_type f2 = em_line(EM_F32, 2);
    em_ir_mem a = em_ir_param_buffer(k, "a", f2, EM_READ, 1);
    em_ir_mem fo = em_ir_param_buffer(k, "fo", f2, EM_WRITE, 1);
    em_ir_mem uo = em_ir_param_buffer(k, "uo", U32, EM_WRITE, 1);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val x = em_ir_load(k, a, pos);
    em_ir_val lane = em_ir_binary(k, EM_OP_REM, pos, em_ir_u32(k, 32));
    for (unsigned j = 0; j < NF; j++)
        em_ir_store(
            k, fo, at(k, pos, NF, j),
            em_ir_plane(k, fops[j], x, j >= 6 ? (j == 6 ? em_ir_u32(k, 0) : lane) : EM_IR_NONE));
    em_ir_val odd = em_ir_binary(k, EM_OP_EQ, em_ir_binary(k, EM_OP_REM, pos, em_ir_u32(k, 2)),
                                 em_ir_u32(k, 1));
    em_ir_sync_plane(k);
    em_ir_fence(k, 1);
    em_ir_fence(k, 0);
    em_ir_val uv[NU] = {em_ir_cast(k, U32, em_ir_plane(k, EM_OP_PLANE_ALL, odd, EM_IR_NONE)),
                        em_ir_cast(k, U32, em_ir_plane(k, EM_OP_PLANE_ANY, odd, EM_IR_NONE)),
                        em_ir_plane(k, EM_OP_PLANE_BALLOT, odd, EM_IR_NONE),
                        em_ir_builtin(k, EM_PLANE_DIM),
                        em_ir_builtin(k, EM_UNIT_POS_PLANE),
                        em_ir_builtin(k, EM_PLANE_POS)};
    for (unsigned j = 0; j < NU; j++) em_ir_store(k, uo, at(k, pos, NU, j), uv[j]);
    float in[N * 2], fout[N * 2 * NF];
    uint32_t uout[N * NU];
    for (int j = 0; j < N * 2; j++) in[j] = (float)j * 0.5f - 10;
    xarg args[] = {xbuf(in, sizeof in, N), xbuf(fout, sizeof fout, N * NF),
                   xbuf(uout, sizeof uout, N * NU)};
    xrun(k, XGRID(3, 1, 1), XGRID(32, 1, 1), args, 3);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < NF; j++)
            for (int l = 0; l < 2; l++) {
                float want = fops[j] == EM_OP_PLANE_EXCLUSIVE_SUM ? 0.0f : in[i * 2 + l];
                if (fout[(i * NF + j) * 2 + l] != want)
                    fail_msg("%s [%d.%d]: got %g, want %g", em_ir_op_name(fops[j]), i, l,
                             fout[(i * NF + j) * 2 + l], want);
            }
        uint32_t o = (uint32_t)i % 2, wu[NU] = {o, o, o, 1, 0, (uint32_t)i % 32};
        for (int j = 0; j < NU; j++) assert_int_equal(uout[i * NU + j], wu[j]);
    }
    em_ir_kernel_free(k);
}

/* ---- cooperative matrices ------------------------------------------------------------------ */

/* i8 fragments: A (8x32) read column-major with stride 10, B (32x16) row-major with stride 20,
 * accumulators filled with 7, D = A * B + C stored column-major with stride 9. And f32: D = A * B +
 * C with C loaded from memory and D a different fragment. */
static void test_matrix_ops(void **state)
{
    (void)state;
    enum { M = 8, NN = 16, K = 32, SA = 10, SB = 20, SD = 9 };
    em_ir_kernel *k = em_ir_kernel_new("matrix_i8");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_I8), EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_I8), EM_READ, 0);
    em_ir_mem d = em_ir_param_buffer(k, "d", em_ty(EM_I32), EM_WRITE, 0);
    em_ir_val fa = em_ir_matrix(k, EM_MAT_A, EM_I8, M, NN, K, EM_COL_MAJOR, "fa");
    em_ir_val fb = em_ir_matrix(k, EM_MAT_B, EM_I8, M, NN, K, EM_ROW_MAJOR, "fb");
    em_ir_val acc = em_ir_matrix(k, EM_MAT_ACC, EM_I32, M, NN, K, EM_ROW_MAJOR, "acc");
    em_ir_val cube = em_ir_builtin(k, EM_CUBE_POS);
    em_ir_mat_fill(k, acc, em_ir_const_int(k, em_ty(EM_I32), 7));
    em_ir_mat_load(k, fa, a, em_ir_binary(k, EM_OP_MUL, cube, em_ir_u32(k, K * SA)),
                   em_ir_u32(k, SA), EM_COL_MAJOR);
    em_ir_mat_load(k, fb, b, em_ir_binary(k, EM_OP_MUL, cube, em_ir_u32(k, K * SB)),
                   em_ir_u32(k, SB), EM_ROW_MAJOR);
    em_ir_mat_mma(k, acc, fa, fb, acc);
    em_ir_mat_store(k, d, em_ir_binary(k, EM_OP_MUL, cube, em_ir_u32(k, NN * SD)), em_ir_u32(k, SD),
                    acc, EM_COL_MAJOR);

    em_ir_kernel *k2 = em_ir_kernel_new("matrix_f32");
    em_ir_mem a2 = em_ir_param_buffer(k2, "a", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem c2 = em_ir_param_buffer(k2, "c", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem d2 = em_ir_param_buffer(k2, "d", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val ga = em_ir_matrix(k2, EM_MAT_A, EM_F32, 4, 4, 8, EM_ROW_MAJOR, NULL);
    em_ir_val gb = em_ir_matrix(k2, EM_MAT_B, EM_F32, 4, 4, 8, EM_ROW_MAJOR, NULL);
    em_ir_val gc = em_ir_matrix(k2, EM_MAT_ACC, EM_F32, 4, 4, 8, EM_ROW_MAJOR, "c_frag");
    em_ir_val gd = em_ir_matrix(k2, EM_MAT_ACC, EM_F32, 4, 4, 8, EM_ROW_MAJOR, "d_frag");
    em_ir_mat_load(k2, ga, a2, em_ir_u32(k2, 0), em_ir_u32(k2, 8), EM_ROW_MAJOR);
    em_ir_mat_load(k2, gb, a2, em_ir_u32(k2, 32), em_ir_u32(k2, 4), EM_ROW_MAJOR);
    em_ir_mat_load(k2, gc, c2, em_ir_u32(k2, 0), em_ir_u32(k2, 4), EM_ROW_MAJOR);
    em_ir_mat_mma(k2, gd, ga, gb, gc);
    em_ir_mat_store(k2, d2, em_ir_u32(k2, 0), em_ir_u32(k2, 4), gd, EM_ROW_MAJOR);

    enum { CUBES = 3 };
    int8_t *ha = malloc(CUBES * K * SA), *hb = malloc(CUBES * K * SB);
    int32_t *hd = malloc(CUBES * NN * SD * 4);
    uint64_t rng = 21;
    for (int i = 0; i < CUBES * K * SA; i++) ha[i] = (int8_t)(xrand_state(&rng) % 255 - 127);
    for (int i = 0; i < CUBES * K * SB; i++) hb[i] = (int8_t)(xrand_state(&rng) % 255 - 127);
    for (int i = 0; i < CUBES * NN * SD; i++) hd[i] = -12345;
    em_ir_kernel *ks[2] = {k, k2};
    xmod *mod = xcompile(ks, 2);
    xarg args[] = {xbuf(ha, CUBES * K * SA, CUBES * K * SA),
                   xbuf(hb, CUBES * K * SB, CUBES * K * SB),
                   xbuf(hd, CUBES * NN * SD * 4, CUBES * NN * SD)};
    xlaunch(mod, 0, XGRID(CUBES, 1, 1), XGRID(1, 1, 1), args, 3);
    for (int c = 0; c < CUBES; c++)
        for (int r = 0; r < M; r++)
            for (int col = 0; col < NN; col++) {
                int32_t want = 7;
                for (int t = 0; t < K; t++)
                    want += ha[c * K * SA + t * SA + r] * hb[c * K * SB + t * SB + col];
                int32_t got = hd[c * NN * SD + col * SD + r];
                if (got != want)
                    fail_msg("matrix_i8 cube %d (%d, %d): got %d, want %d", c, r, col, got, want);
            }
    for (int c = 0; c < CUBES; c++) /* the padding between column-major columns is untouched */
        for (int col = 0; col < NN; col++) assert_int_equal(hd[c * NN * SD + col * SD + M], -12345);
    float fa2[64], fc[16], fd[16];
    for (int i = 0; i < 64; i++) fa2[i] = (float)(i % 9) - 4;
    for (int i = 0; i < 16; i++) fc[i] = (float)i * 0.25f;
    xarg args2[] = {xbuf(fa2, sizeof fa2, 64), xbuf(fc, sizeof fc, 16), xbuf(fd, sizeof fd, 16)};
    xlaunch(mod, 1, XGRID(1, 1, 1), XGRID(1, 1, 1), args2, 3);
    for (int r = 0; r < 4; r++)
        for (int col = 0; col < 4; col++) {
            float want = fc[r * 4 + col];
            for (int t = 0; t < 8; t++) want += fa2[r * 8 + t] * fa2[32 + t * 4 + col];
            xcheck_close("matrix_f32", (size_t)(r * 4 + col), fd[r * 4 + col], want, 1e-6);
        }
    xmod_free(mod);
    em_ir_kernel_free(k);
    em_ir_kernel_free(k2);
    free(ha), free(hb), free(hd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_bf16),
        cmocka_unit_test(test_f64),
        cmocka_unit_test(test_int_ops),
        cmocka_unit_test(test_int64_constants),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_bitcasts),
        cmocka_unit_test(test_select_compare_lines),
        cmocka_unit_test(test_plane_ops),
        cmocka_unit_test(test_matrix_ops),
    };
    return XRUN_BOTH(tests);
}
