/* conformance_main.c — the conformance suite: every kernel of the corpus (tests/conformance/
 * kernels/NAME.ek, one module) runs on every backend present against a C reference (float64 where
 * floats are involved), with a normalized-error tolerance per dtype, NaN/Inf agreement, and
 * sentinel guards after every output. Usage: conformance [DEVICE...]; without arguments the
 * devices are $EMBER_TEST_DEVICE when set, else cpu, opencl:0, vulkan:0 and cuda:0 (with both,
 * only the named devices equal to $EMBER_TEST_DEVICE run; none: exit 77). A device
 * that cannot be opened is reported and skipped. A case needing what the device lacks (a dtype,
 * f32 atomic add, plane ops, cooperative matrices, or a compile answering EM_ERR_UNSUPPORTED) is
 * UNSUPPORTED; a case that passes although caps says the feature is missing is "emulated". The
 * summary table (case x device) is printed at the end; any FAIL fails the program. Exit code 77
 * (CTest's skip) when no requested device exists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "conformance.h"

#define MAX_CASES 96
#define MAX_DEVS 4

typedef conf_result (*case_fn)(conf_ctx *c, int variant);

typedef struct conf_case {
    const char *name; /* row of the summary table */
    case_fn fn;       /* runs it */
    int variant;      /* a dtype or an index, passed to fn */
} conf_case;

/* ---- elementwise -------------------------------------------------------------------------- */

/* needs dtype t, else UNSUPPORTED */
#define NEED_DTYPE(c, t)                                                                           \
    do {                                                                                           \
        if (!(c)->caps->dtype[t])                                                                  \
            return conf_unsup(c, "no %s on this device (caps.dtype)", em_scalar_name(t));          \
    } while (0)

static conf_result run_ew_lines_w(conf_ctx *c, em_scalar t, unsigned w)
{
    enum { N = 1003 };
    size_t es = em_scalar_size(t), nl = N / w, tail = N - nl * w;
    uint64_t seed = 11 + w;
    double x[N], y[N], ref[N], got[N];
    for (size_t k = 0; k < N; k++) {
        x[k] = conf_round(t, conf_uniform(&seed, -2, 2));
        y[k] = conf_round(t, conf_uniform(&seed, -2, 2));
    }
    const double alpha = conf_round(t, 1.5);
    for (size_t k = 0; k < N; k++) ref[k] = alpha * x[k] + y[k] * y[k] - 1;
    unsigned char hx[N * 8], hy[N * 8], ho[N * 8];
    conf_pack(t, x, NULL, N, hx);
    conf_pack(t, y, NULL, N, hy);
    conf_buf bx = conf_buf_new(c, hx, N * es), by = conf_buf_new(c, hy, N * es),
             bo = conf_buf_new(c, NULL, N * es);
    conf_result r = CONF_FAIL;
    if (!bx.b || !by.b || !bo.b) {
        conf_fail(c, "allocation: %s", em_last_error());
        goto out;
    }
    em_arg args[] = {conf_arg(&bx, nl), conf_arg(&by, nl), conf_arg(&bo, nl),
                     conf_arg(&bx, N),  conf_arg(&by, N),  conf_arg(&bo, N),
                     em_arg_f64(1.5)};
    em_lang_bind b[] = {em_lang_bind_type("F", t)};
    uint32_t units = (uint32_t)(nl + tail), cubes[3] = {(units + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    r = conf_launch(c, "ew_lines", b, 1, w, cubes, dims, args, 7);
    if (r != CONF_PASS) goto out;
    char what[64];
    snprintf(what, sizeof(what), "ew_lines<%s> width %u: out", em_scalar_name(t), w);
    if (!conf_buf_read(c, &bo, ho, what)) {
        r = CONF_FAIL;
        goto out;
    }
    conf_unpack(t, ho, N, got, NULL);
    r = conf_cmp_f(c, what, got, ref, NULL, N, conf_tol(t), 1) ? CONF_PASS : CONF_FAIL;
out:
    conf_buf_free(&bx);
    conf_buf_free(&by);
    conf_buf_free(&bo);
    return r;
}

static conf_result case_ew_lines(conf_ctx *c, int v)
{
    em_scalar t = (em_scalar)v;
    NEED_DTYPE(c, t);
    static const unsigned widths[] = {1, 2, 4, 8};
    for (size_t k = 0; k < 4; k++) {
        conf_result r = run_ew_lines_w(c, t, widths[k]);
        if (r != CONF_PASS) return r;
    }
    return CONF_PASS;
}

static conf_result case_ew_generic(conf_ctx *c, int v)
{
    em_scalar t = (em_scalar)v;
    NEED_DTYPE(c, t);
    enum { N = 777 };
    size_t es = em_scalar_size(t);
    bool fl = em_scalar_is_float(t), sg = em_scalar_is_signed(t);
    uint64_t seed = 5 + (uint64_t)t;
    double a[N], b[N], ref[N], got[N], mag[N];
    int64_t ia[N], ib[N], iref[N], igot[N];
    for (size_t k = 0; k < N; k++) {
        if (fl) {
            a[k] = conf_round(t, conf_uniform(&seed, -50, 50));
            b[k] = conf_round(t, conf_uniform(&seed, -20, 20));
            double mx = fmax(a[k], b[k]), mn = fmin(a[k], b[k]);
            ref[k] = mx * 3 - mn + a[k] / (fabs(b[k]) + 1);
            mag[k] = fabs(mx * 3) + fabs(mn) + fabs(a[k] / (fabs(b[k]) + 1)); /* error scale */
        } else {
            ia[k] = sg ? (int64_t)(conf_rand(&seed) % 101) - 50 : (int64_t)(conf_rand(&seed) % 101);
            ib[k] = sg ? (int64_t)(conf_rand(&seed) % 41) - 20 : (int64_t)(conf_rand(&seed) % 41);
            int64_t mx = ia[k] > ib[k] ? ia[k] : ib[k], mn = ia[k] < ib[k] ? ia[k] : ib[k];
            iref[k] = conf_int_norm(t, mx * 3 - mn + ia[k] / (llabs(ib[k]) + 1));
        }
    }
    unsigned char ha[N * 8], hb[N * 8], ho[N * 8];
    conf_pack(t, a, ia, N, ha);
    conf_pack(t, b, ib, N, hb);
    conf_buf ba = conf_buf_new(c, ha, N * es), bb = conf_buf_new(c, hb, N * es),
             bo = conf_buf_new(c, NULL, N * es);
    em_arg args[] = {conf_arg(&ba, N), conf_arg(&bb, N), conf_arg(&bo, N)};
    em_lang_bind bd[] = {em_lang_bind_type("T", t)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "ew_generic", bd, 1, 1, cubes, dims, args, 3);
    if (r == CONF_PASS) {
        char what[64];
        snprintf(what, sizeof(what), "ew_generic<%s>: out", em_scalar_name(t));
        if (!conf_buf_read(c, &bo, ho, what)) {
            r = CONF_FAIL;
        } else {
            conf_unpack(t, ho, N, got, igot);
            bool ok = true;
            for (size_t k = 0; fl && ok && k < N; k++)
                ok = conf_cmp_f(c, what, got + k, ref + k, NULL, 1, conf_tol(t), fmax(mag[k], 1));
            if (!fl) ok = conf_cmp_i(c, what, igot, iref, N);
            r = ok ? CONF_PASS : CONF_FAIL;
        }
    }
    conf_buf_free(&ba);
    conf_buf_free(&bb);
    conf_buf_free(&bo);
    return r;
}

static conf_result case_select_bool(conf_ctx *c, int v)
{
    em_scalar t = (em_scalar)v;
    NEED_DTYPE(c, t);
    NEED_DTYPE(c, EM_BOOL);
    enum { N = 333 };
    size_t es = em_scalar_size(t);
    bool fl = em_scalar_is_float(t);
    uint8_t cond[N], flags[N], eflags[N];
    double a[N], b[N], ref[N], got[N];
    int64_t ia[N], ib[N], iref[N], igot[N];
    uint64_t seed = 17;
    for (size_t k = 0; k < N; k++) {
        cond[k] = (uint8_t)(conf_rand(&seed) & 1);
        ia[k] = (int64_t)(conf_rand(&seed) % 200) - 100;
        ib[k] = (int64_t)(conf_rand(&seed) % 200) - 100;
        a[k] = conf_round(t, (double)ia[k] / 4);
        b[k] = conf_round(t, (double)ib[k] / 4);
        ref[k] = cond[k] ? a[k] : b[k];
        iref[k] = cond[k] ? ia[k] : ib[k];
        eflags[k] = fl ? a[k] > b[k] : ia[k] > ib[k];
    }
    unsigned char ha[N * 8], hb[N * 8], ho[N * 8];
    conf_pack(t, a, ia, N, ha);
    conf_pack(t, b, ib, N, hb);
    conf_buf bc = conf_buf_new(c, cond, N), ba = conf_buf_new(c, ha, N * es),
             bb = conf_buf_new(c, hb, N * es), bo = conf_buf_new(c, NULL, N * es),
             bf = conf_buf_new(c, NULL, N);
    em_arg args[] = {conf_arg(&bc, N), conf_arg(&ba, N), conf_arg(&bb, N), conf_arg(&bo, N),
                     conf_arg(&bf, N)};
    em_lang_bind bd[] = {em_lang_bind_type("T", t)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "select_bool", bd, 1, 1, cubes, dims, args, 5);
    if (r == CONF_PASS) {
        char what[64];
        snprintf(what, sizeof(what), "select_bool<%s>", em_scalar_name(t));
        bool ok = conf_buf_read(c, &bo, ho, what) && conf_buf_read(c, &bf, flags, what);
        if (ok) {
            conf_unpack(t, ho, N, got, igot);
            ok = fl ? conf_cmp_f(c, what, got, ref, NULL, N, 0, 0) : conf_cmp_i(c, what, igot, iref, N);
        }
        for (size_t k = 0; ok && k < N; k++)
            if (flags[k] != eflags[k])
                ok = conf_fail(c, "%s: flags[%zu] = %u, expected %u", what, k, flags[k], eflags[k]) ==
                     CONF_PASS;
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bc);
    conf_buf_free(&ba);
    conf_buf_free(&bb);
    conf_buf_free(&bo);
    conf_buf_free(&bf);
    return r;
}

/* ---- math builtins --------------------------------------------------------------------------- */

enum { MATH_OPS = 23 };
static const char *const MATH_NAMES[MATH_OPS] = {
    "exp", "log", "exp2", "log2", "sqrt", "rsqrt", "erf", "tanh", "sin",   "cos", "floor", "ceil",
    "round", "abs", "isnan", "isinf", "pow", "fma", "min", "max", "clamp", "neg", "div"};

static double ref_math(int op, double v, double w, bool *skip)
{
    *skip = false;
    switch (op) {
    case 0: return exp(v);
    case 1: return log(v);
    case 2: return exp2(v);
    case 3: return log2(v);
    case 4: return sqrt(v);
    case 5: *skip = v == 0; return 1 / sqrt(v); /* rsqrt(±0): the sign of the infinity varies */
    case 6: return erf(v);
    case 7: return tanh(v);
    case 8: return sin(v);
    case 9: return cos(v);
    case 10: return floor(v);
    case 11: return ceil(v);
    case 12: return nearbyint(v); /* half to even in the default rounding mode */
    case 13: return fabs(v);
    case 14: return isnan(v) ? 1 : 0;
    case 15: return isinf(v) ? 1 : 0;
    case 16: /* pow: checked where the base is positive and finite (GLSL leaves x <= 0 undefined) */
        *skip = !(v > 0) || isinf(v) || !isfinite(w);
        return pow(v, w);
    case 17: return fma(v, w, 0.5);
    case 18: *skip = isnan(v) || isnan(w); return fmin(v, w); /* min/max with NaN vary by target */
    case 19: *skip = isnan(v) || isnan(w); return fmax(v, w);
    case 20: *skip = isnan(v); return fmin(fmax(v, -1.5), 2);
    case 21: return -v;
    default: return v / w;
    }
}

static conf_result case_math(conf_ctx *c, int v)
{
    em_scalar t = (em_scalar)v;
    NEED_DTYPE(c, t);
    enum { N = 160 };
    static const double special[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 0.5, 1.5, 2.5, -0.5,
                                     -2.5, 1, -1, 3.25, -3.75, 1e-3, 5.5};
    size_t es = em_scalar_size(t), ns = sizeof(special) / sizeof(special[0]);
    uint64_t seed = 99;
    double *x = calloc(N, 8), *y = calloc(N, 8), *got = calloc((size_t)N * MATH_OPS, 8),
           *ref = calloc((size_t)N * MATH_OPS, 8);
    bool *skip = calloc((size_t)N * MATH_OPS, 1);
    unsigned char *hx = malloc(N * 8), *hy = malloc(N * 8), *ho = malloc((size_t)N * MATH_OPS * 8);
    for (size_t k = 0; k < N; k++) {
        x[k] = conf_round(t, k < ns ? special[k] : conf_uniform(&seed, -6, 6));
        y[k] = conf_round(t, k % 9 == 4 ? 0.0 : conf_uniform(&seed, -3, 3));
    }
    for (int op = 0; op < MATH_OPS; op++)
        for (size_t k = 0; k < N; k++)
            ref[(size_t)op * N + k] = conf_round(t, ref_math(op, x[k], y[k], &skip[(size_t)op * N + k]));
    conf_pack(t, x, NULL, N, hx);
    conf_pack(t, y, NULL, N, hy);
    conf_buf bx = conf_buf_new(c, hx, N * es), by = conf_buf_new(c, hy, N * es),
             bo = conf_buf_new(c, NULL, (size_t)N * MATH_OPS * es);
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&by, N), conf_arg(&bo, (uint64_t)N * MATH_OPS)};
    em_lang_bind bd[] = {em_lang_bind_type("F", t)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "math_all", bd, 1, 1, cubes, dims, args, 3);
    if (r == CONF_PASS) {
        char what[64];
        snprintf(what, sizeof(what), "math_all<%s>: out", em_scalar_name(t));
        if (!conf_buf_read(c, &bo, ho, what)) {
            r = CONF_FAIL;
        } else {
            conf_unpack(t, ho, (size_t)N * MATH_OPS, got, NULL);
            for (int op = 0; op < MATH_OPS && r == CONF_PASS; op++) {
                snprintf(what, sizeof(what), "%s<%s>", MATH_NAMES[op], em_scalar_name(t));
                size_t o = (size_t)op * N;
                if (!conf_cmp_f(c, what, got + o, ref + o, skip + o, N, conf_tol(t), 1)) {
                    size_t len = strlen(c->why);
                    for (size_t k = 0; k < N; k++) { /* name the input of the first mismatch */
                        if (strstr(c->why, "[") && (size_t)atol(strstr(c->why, "[") + 1) == k) {
                            snprintf(c->why + len, sizeof(c->why) - len, " for x = %.9g, y = %.9g",
                                     x[k], y[k]);
                            break;
                        }
                    }
                    r = CONF_FAIL;
                }
            }
        }
    }
    conf_buf_free(&bx);
    conf_buf_free(&by);
    conf_buf_free(&bo);
    free(x), free(y), free(got), free(ref), free(skip), free(hx), free(hy), free(ho);
    return r;
}

/* ---- integers, casts, bitcasts ------------------------------------------------------------- */

enum { INT_OPS = 12, CNT_OPS = 3 };

static void ref_int(em_scalar t, int64_t a, int64_t b, int64_t *o, uint32_t *cnt)
{
    unsigned bits = (unsigned)em_scalar_size(t) * 8;
    bool sg = em_scalar_is_signed(t);
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    unsigned s = (unsigned)(ub & (bits - 1));
    o[0] = (int64_t)(ua & ub);
    o[1] = (int64_t)(ua | ub);
    o[2] = (int64_t)(ua ^ ub);
    o[3] = (int64_t)~ua;
    o[4] = (int64_t)(ua << s);
    o[5] = sg ? a >> s : (int64_t)((ua & mask) >> s);
    if (sg) {
        o[6] = a / b;
        o[7] = a % b;
    } else {
        o[6] = (int64_t)((ua & mask) / (ub & mask));
        o[7] = (int64_t)((ua & mask) % (ub & mask));
    }
    o[8] = (int64_t)(ua + ub);
    o[9] = (int64_t)(ua - ub);
    o[10] = (int64_t)(ua * ub);
    o[11] = (int64_t)(0 - ua);
    for (int k = 0; k < INT_OPS; k++) o[k] = conf_int_norm(t, o[k]);
    uint64_t m = ua & mask;
    cnt[0] = (uint32_t)__builtin_popcountll(m);
    cnt[1] = m ? (uint32_t)(__builtin_clzll(m) - (64 - bits)) : bits;
    cnt[2] = m ? (uint32_t)__builtin_ctzll(m) : bits;
}

static conf_result case_int_ops(conf_ctx *c, int v)
{
    em_scalar t = (em_scalar)v;
    NEED_DTYPE(c, t);
    enum { N = 300 };
    size_t es = em_scalar_size(t);
    unsigned bits = (unsigned)es * 8;
    int64_t a[N], b[N], ref[N * INT_OPS], got[N * INT_OPS];
    uint32_t cref[N * CNT_OPS], cgot[N * CNT_OPS];
    uint64_t seed = 7 * (uint64_t)t;
    int64_t minv = em_scalar_is_signed(t) ? conf_int_norm(t, (int64_t)(1ull << (bits - 1))) : 0;
    for (size_t k = 0; k < N; k++) {
        a[k] = conf_int_norm(t, (int64_t)conf_rand(&seed));
        if (k < 8) a[k] = conf_int_norm(t, (int64_t[]){0, -1, 1, 2, 0x80, minv, (int64_t)((uint64_t)minv - 1), 12345}[k]);
        b[k] = conf_int_norm(t, k % 3 ? (int64_t)(conf_rand(&seed) % 17) - 8 : (int64_t)conf_rand(&seed));
        if (b[k] == 0) b[k] = 3;
        if (a[k] == minv && b[k] == -1) b[k] = 5; /* MIN / -1 overflows */
        int64_t o[INT_OPS];
        uint32_t cn[CNT_OPS];
        ref_int(t, a[k], b[k], o, cn);
        for (int j = 0; j < INT_OPS; j++) ref[(size_t)j * N + k] = o[j];
        for (int j = 0; j < CNT_OPS; j++) cref[(size_t)j * N + k] = cn[j];
    }
    unsigned char ha[N * 8], hb[N * 8], ho[N * INT_OPS * 8];
    conf_pack(t, NULL, a, N, ha);
    conf_pack(t, NULL, b, N, hb);
    conf_buf ba = conf_buf_new(c, ha, N * es), bb = conf_buf_new(c, hb, N * es),
             bo = conf_buf_new(c, NULL, N * INT_OPS * es), bc = conf_buf_new(c, NULL, sizeof(cgot));
    em_arg args[] = {conf_arg(&ba, N), conf_arg(&bb, N), conf_arg(&bo, N * INT_OPS),
                     conf_arg(&bc, N * CNT_OPS)};
    em_lang_bind bd[] = {em_lang_bind_type("I", t)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "int_ops", bd, 1, 1, cubes, dims, args, 4);
    if (r == CONF_PASS) {
        static const char *const names[INT_OPS] = {"and", "or", "xor", "not", "shl", "shr",
                                                   "div", "rem", "add", "sub", "mul", "neg"};
        char what[64];
        snprintf(what, sizeof(what), "int_ops<%s>", em_scalar_name(t));
        bool ok = conf_buf_read(c, &bo, ho, what) && conf_buf_read(c, &bc, cgot, what);
        if (ok) conf_unpack(t, ho, N * INT_OPS, NULL, got);
        for (int j = 0; ok && j < INT_OPS; j++) {
            snprintf(what, sizeof(what), "%s<%s>", names[j], em_scalar_name(t));
            ok = conf_cmp_i(c, what, got + j * N, ref + j * N, N);
            if (!ok) {
                size_t k = (size_t)atol(strchr(c->why, '[') + 1), len = strlen(c->why);
                snprintf(c->why + len, sizeof(c->why) - len, " for a = %lld, b = %lld",
                         (long long)a[k], (long long)b[k]);
            }
        }
        static const char *const cnames[CNT_OPS] = {"popcount", "clz", "ctz"};
        for (int j = 0; ok && j < CNT_OPS; j++) {
            snprintf(what, sizeof(what), "%s<%s>", cnames[j], em_scalar_name(t));
            ok = conf_cmp_u32(c, what, cgot + j * N, cref + j * N, N);
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&ba);
    conf_buf_free(&bb);
    conf_buf_free(&bo);
    conf_buf_free(&bc);
    return r;
}

typedef struct cast_pair {
    em_scalar from, to;
    double lo, hi; /* the range of source values */
} cast_pair;

static const cast_pair CASTS[] = {
    {EM_F32, EM_I32, -1e6, 1e6},   {EM_F32, EM_U32, 0, 3e9},     {EM_I32, EM_F32, -3e7, 3e7},
    {EM_U32, EM_F32, 0, 4e9},      {EM_F32, EM_F16, -7e4, 7e4},  {EM_F16, EM_F32, -6e4, 6e4},
    {EM_F32, EM_BF16, -1e9, 1e9},  {EM_BF16, EM_F32, -1e9, 1e9}, {EM_F64, EM_F32, -1e30, 1e30},
    {EM_F32, EM_F64, -1e30, 1e30}, {EM_I32, EM_I64, -2e9, 2e9},  {EM_I64, EM_I32, -9e15, 9e15},
    {EM_U32, EM_U64, 0, 4e9},      {EM_I32, EM_U8, -1e5, 1e5},   {EM_F32, EM_U8, 0, 255.9},
    {EM_F64, EM_I64, -9e15, 9e15}, {EM_I16, EM_F32, -3e4, 3e4},  {EM_F16, EM_I32, -6e4, 6e4},
};
#define NCASTS (sizeof(CASTS) / sizeof(CASTS[0]))

static conf_result case_cast(conf_ctx *c, int v)
{
    const cast_pair *p = &CASTS[v];
    NEED_DTYPE(c, p->from);
    NEED_DTYPE(c, p->to);
    enum { N = 200 };
    size_t es = em_scalar_size(p->from), ed = em_scalar_size(p->to);
    bool ff = em_scalar_is_float(p->from), tf = em_scalar_is_float(p->to);
    double x[N], ref[N], got[N];
    int64_t ix[N], iref[N], igot[N];
    uint64_t seed = 1234 + (uint64_t)v;
    for (size_t k = 0; k < N; k++) {
        double d = conf_uniform(&seed, p->lo, p->hi);
        if (k % 4 == 0) d = trunc(d / 1000); /* small and integral values too */
        if (ff) {
            x[k] = conf_round(p->from, d);
            ix[k] = 0;
        } else {
            ix[k] = conf_int_norm(p->from, (int64_t)d);
            x[k] = em_scalar_is_signed(p->from) ? (double)ix[k] : (double)(uint64_t)ix[k];
        }
        if (tf) {
            ref[k] = conf_round(p->to, x[k]);
        } else if (ff) {
            double tr = trunc(x[k]);
            iref[k] = em_scalar_is_signed(p->to) ? (int64_t)tr : (int64_t)(uint64_t)tr;
            iref[k] = conf_int_norm(p->to, iref[k]);
        } else {
            iref[k] = conf_int_norm(p->to, ix[k]);
        }
    }
    unsigned char hx[N * 8], ho[N * 8];
    conf_pack(p->from, x, ix, N, hx);
    conf_buf bx = conf_buf_new(c, hx, N * es), bo = conf_buf_new(c, NULL, N * ed);
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&bo, N)};
    em_lang_bind bd[] = {em_lang_bind_type("S", p->from), em_lang_bind_type("D", p->to)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "cast_pair", bd, 2, 1, cubes, dims, args, 2);
    if (r == CONF_PASS) {
        char what[64];
        snprintf(what, sizeof(what), "cast %s -> %s", em_scalar_name(p->from),
                 em_scalar_name(p->to));
        bool ok = conf_buf_read(c, &bo, ho, what);
        if (ok) {
            conf_unpack(p->to, ho, N, got, igot);
            ok = tf ? conf_cmp_f(c, what, got, ref, NULL, N, 0, 0)
                    : conf_cmp_i(c, what, igot, iref, N);
            if (!ok) {
                size_t k = (size_t)atol(strchr(c->why, '[') + 1), len = strlen(c->why);
                snprintf(c->why + len, sizeof(c->why) - len, " from %.17g", x[k]);
            }
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&bo);
    return r;
}

static conf_result case_bitcasts(conf_ctx *c, int v)
{
    (void)v;
    enum { N = 100 };
    float x[N], back[N];
    uint32_t bits[N], rbits[N], ib[N];
    uint64_t seed = 3;
    for (size_t k = 0; k < N; k++) {
        x[k] = (float)conf_uniform(&seed, -1e6, 1e6);
        if (k == 0) x[k] = -0.0f;
        if (k == 1) x[k] = INFINITY;
        memcpy(&rbits[k], &x[k], 4);
    }
    conf_buf bx = conf_buf_new(c, x, sizeof(x)), bb = conf_buf_new(c, NULL, sizeof(bits)),
             bk = conf_buf_new(c, NULL, sizeof(back)), bi = conf_buf_new(c, NULL, sizeof(ib));
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&bb, N), conf_arg(&bk, N), conf_arg(&bi, N)};
    uint32_t cubes[3] = {2, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "bitcasts", NULL, 0, 1, cubes, dims, args, 4);
    if (r == CONF_PASS) {
        bool ok = conf_buf_read(c, &bb, bits, "bitcasts: bits") &&
                  conf_buf_read(c, &bk, back, "bitcasts: back") &&
                  conf_buf_read(c, &bi, ib, "bitcasts: ibits") &&
                  conf_cmp_u32(c, "bitcast<u32>(f32)", bits, rbits, N) &&
                  conf_cmp_u32(c, "bitcast<i32>(f32)", ib, rbits, N);
        for (size_t k = 0; ok && k < N; k++) {
            uint32_t bk2;
            memcpy(&bk2, &back[k], 4);
            if (bk2 != (rbits[k] ^ 0x80000000u))
                ok = conf_fail(c, "bitcast<f32>(u32)[%zu]: bits 0x%08x, expected 0x%08x", k, bk2,
                               rbits[k] ^ 0x80000000u) == CONF_PASS;
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&bb);
    conf_buf_free(&bk);
    conf_buf_free(&bi);
    return r;
}

/* ---- control flow -------------------------------------------------------------------------- */

static uint32_t ref_control(const uint32_t *x, uint32_t n, uint32_t i, bool *untouched)
{
    uint32_t v = x[i];
    *untouched = v % 7 == 3;
    if (*untouched) return 0;
    uint32_t acc = 0, m = v;
    while (m != 1 && m != 0) {
        m = m % 2 == 0 ? m / 2 : 3 * m + 1;
        acc++;
        if (acc >= 500) break;
    }
    for (uint32_t k = 0; k < 40; k += 3) {
        if (k % 2 == 0) continue;
        if (k > v % 37) break;
        acc += k;
    }
    if (v % 5 == 0)
        acc *= 2;
    else if (v % 5 == 1)
        acc += 1000;
    else if (i + 1 < n && x[i + 1] > v)
        acc ^= 0xff;
    else
        acc -= 1;
    uint32_t j = 0;
    for (;;) {
        j += 3;
        if (j > v % 50) break;
    }
    int32_t fm = -1;
    for (uint32_t k = 1; k < 64; k++)
        if ((v + k) % 11 == 0) {
            fm = (int32_t)k;
            break;
        }
    acc += j + (uint32_t)fm;
    return (v > 100 || i == 0) ? acc : acc + 7;
}

static conf_result case_control(conf_ctx *c, int v)
{
    (void)v;
    enum { N = 500 };
    uint32_t x[N], got[N], ref[N];
    uint64_t seed = 77;
    for (uint32_t k = 0; k < N; k++) x[k] = k < 50 ? k : (uint32_t)(conf_rand(&seed) % 100000);
    for (uint32_t k = 0; k < N; k++) {
        bool untouched;
        ref[k] = ref_control(x, N, k, &untouched);
        if (untouched) ref[k] = 0xA5A5A5A5u;
    }
    conf_buf bx = conf_buf_new(c, x, sizeof(x)), bo = conf_buf_new(c, NULL, sizeof(got));
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&bo, N)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "control", NULL, 0, 1, cubes, dims, args, 2);
    if (r == CONF_PASS)
        r = conf_buf_read(c, &bo, got, "control: out") &&
                    conf_cmp_u32(c, "control: out", got, ref, N)
                ? CONF_PASS
                : CONF_FAIL;
    conf_buf_free(&bx);
    conf_buf_free(&bo);
    return r;
}

/* ---- shared memory --------------------------------------------------------------------------- */

static conf_result case_cube_reduce(conf_ctx *c, int v)
{
    em_scalar t = (em_scalar)v;
    NEED_DTYPE(c, t);
    enum { N = 1000, CUBE = 128, CUBES = (N + CUBE - 1) / CUBE };
    size_t es = em_scalar_size(t);
    double x[N], ref[CUBES], got[CUBES], mag[CUBES];
    uint64_t seed = 21;
    memset(ref, 0, sizeof(ref));
    memset(mag, 0, sizeof(mag));
    for (size_t k = 0; k < N; k++) {
        x[k] = conf_round(t, conf_uniform(&seed, -1, 1));
        ref[k / CUBE] += x[k];
        mag[k / CUBE] += fabs(x[k]);
    }
    unsigned char hx[N * 8], ho[CUBES * 8];
    conf_pack(t, x, NULL, N, hx);
    conf_buf bx = conf_buf_new(c, hx, N * es), bo = conf_buf_new(c, NULL, CUBES * es);
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&bo, CUBES)};
    em_lang_bind bd[] = {em_lang_bind_type("F", t), em_lang_bind_int("CUBE", CUBE)};
    uint32_t cubes[3] = {CUBES, 1, 1}, dims[3] = {CUBE, 1, 1};
    conf_result r = conf_launch(c, "cube_reduce", bd, 2, 1, cubes, dims, args, 2);
    if (r == CONF_PASS) {
        char what[64];
        snprintf(what, sizeof(what), "cube_reduce<%s>", em_scalar_name(t));
        bool ok = conf_buf_read(c, &bo, ho, what);
        if (ok) {
            conf_unpack(t, ho, CUBES, got, NULL);
            for (size_t k = 0; ok && k < CUBES; k++)
                ok = conf_cmp_f(c, what, got + k, ref + k, NULL, 1, conf_tol(t) * 2, mag[k]);
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&bo);
    return r;
}

static conf_result case_matmul(conf_ctx *c, int v)
{
    (void)v;
    enum { M = 19, K = 23, N = 13, LDC = N + 3, T = 8 };
    float a[M * K], bt[N * K], cc[M * LDC];
    double ref[M * LDC], got[M * LDC], mag[M * LDC];
    uint64_t seed = 8;
    for (int k = 0; k < M * K; k++) a[k] = (float)conf_uniform(&seed, -1, 1);
    for (int k = 0; k < N * K; k++) bt[k] = (float)conf_uniform(&seed, -1, 1);
    float sent;
    memset(&sent, (int)CONF_SENTINEL, 4);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < LDC; j++) {
            double s = 0, m = 0;
            for (int k = 0; j < N && k < K; k++) {
                s += (double)a[i * K + k] * bt[j * K + k];
                m += fabs((double)a[i * K + k] * bt[j * K + k]);
            }
            ref[i * LDC + j] = j < N ? s : sent; /* padding columns must stay untouched */
            mag[i * LDC + j] = m;
        }
    conf_buf ba = conf_buf_new(c, a, sizeof(a)), bb = conf_buf_new(c, bt, sizeof(bt)),
             bc = conf_buf_new(c, NULL, sizeof(cc));
    int64_t sa[2] = {M, K}, ta[2] = {K, 1}, sb[2] = {K, N}, tb[2] = {1, K}, sc[2] = {M, N},
            tc[2] = {LDC, 1};
    em_arg args[] = {em_arg_tensor(ba.b, 0, M * K, 2, sa, ta),
                     em_arg_tensor(bb.b, 0, N * K, 2, sb, tb),
                     em_arg_tensor(bc.b, 0, M * LDC, 2, sc, tc)};
    em_lang_bind bd[] = {em_lang_bind_int("TILE", T)};
    uint32_t cubes[3] = {(N + T - 1) / T, (M + T - 1) / T, 1}, dims[3] = {T, T, 1};
    conf_result r = conf_launch(c, "matmul_tiled", bd, 1, 1, cubes, dims, args, 3);
    if (r == CONF_PASS) {
        bool ok = conf_buf_read(c, &bc, cc, "matmul_tiled: c");
        for (int k = 0; ok && k < M * LDC; k++) {
            got[k] = cc[k];
            ok = conf_cmp_f(c, "matmul_tiled: c", got + k, ref + k, NULL, 1, 1e-5,
                            fmax(mag[k], 1e-30));
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&ba);
    conf_buf_free(&bb);
    conf_buf_free(&bc);
    return r;
}

/* ---- plane ops ------------------------------------------------------------------------------- */

enum { PLANE_OUTS = 16 };

static conf_result case_plane(conf_ctx *c, int v)
{
    (void)v;
    uint32_t P = c->caps->plane_dim ? c->caps->plane_dim : 1;
    if (P > 64 || (P & (P - 1))) return conf_unsup(c, "plane size %u is not a power of two <= 64", P);
    uint32_t D = P > 64 ? P : 64, N = 4 * D;
    int32_t *x = calloc(N, 4), *got = calloc((size_t)N * PLANE_OUTS, 4),
            *ref = calloc((size_t)N * PLANE_OUTS, 4);
    float *xf = calloc(N, 4), *gotf = calloc((size_t)N * 2, 4);
    double *dgot = calloc((size_t)N * 2, 8), *dref = calloc((size_t)N * 2, 8);
    for (uint32_t i = 0; i < N; i++) {
        x[i] = (int32_t)((i * 37u) % 41u) - 20;
        if ((i / P) % 3 == 0) x[i] = abs(x[i]) + 1; /* planes where every value is positive */
        xf[i] = (float)((int32_t)((i * 13u) % 17u) - 8);
    }
    for (uint32_t i = 0; i < N; i++) {
        uint32_t base = i / P * P, lane = i % P;
        int32_t *o = ref + (size_t)i * PLANE_OUTS, sum = 0, mx = INT32_MIN, mn = INT32_MAX, incl = 0;
        uint32_t ballot = 0;
        int all1 = 1, all2 = 1, any1 = 0, any2 = 0;
        double fs = 0, fm = -INFINITY;
        for (uint32_t l = 0; l < P; l++) {
            int32_t w = x[base + l];
            sum += w;
            mx = w > mx ? w : mx;
            mn = w < mn ? w : mn;
            if (l <= lane) incl += w;
            if (w > 0 && l < 32) ballot |= 1u << l;
            all1 &= w > -1000;
            all2 &= w > 0;
            any1 |= w == 7;
            any2 |= w > 1000;
            fs += xf[base + l];
            fm = fmax(fm, xf[base + l]);
        }
        o[0] = sum, o[1] = mx, o[2] = mn, o[3] = incl, o[4] = incl - x[i];
        o[5] = x[base + (lane ^ (P - 1))];
        o[6] = lane >= 1 ? x[i - 1] : x[i];
        o[7] = lane + 1 < P ? x[i + 1] : x[i];
        o[8] = x[base + P - 1];
        o[9] = x[base + (lane + 1) % P];
        o[10] = (int32_t)ballot;
        o[11] = all1, o[12] = all2, o[13] = any1, o[14] = any2;
        o[15] = (int32_t)(((i % D) / P) * 1000 + lane);
        dref[i * 2] = fs;
        dref[i * 2 + 1] = fm;
    }
    conf_buf bx = conf_buf_new(c, x, N * 4), bxf = conf_buf_new(c, xf, N * 4),
             bo = conf_buf_new(c, NULL, (size_t)N * PLANE_OUTS * 4),
             bof = conf_buf_new(c, NULL, (size_t)N * 2 * 4);
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&bxf, N), conf_arg(&bo, (uint64_t)N * PLANE_OUTS),
                     conf_arg(&bof, (uint64_t)N * 2)};
    uint32_t cubes[3] = {N / D, 1, 1}, dims[3] = {D, 1, 1};
    conf_result r = conf_launch(c, "plane_ops", NULL, 0, 1, cubes, dims, args, 4);
    if (r == CONF_PASS) {
        static const char *const names[PLANE_OUTS] = {
            "plane_sum",     "plane_max",           "plane_min",          "plane_inclusive_sum",
            "plane_exclusive_sum", "plane_shuffle_xor", "plane_shuffle_up", "plane_shuffle_down",
            "plane_broadcast", "plane_shuffle",     "plane_ballot",       "plane_all (true)",
            "plane_all (mixed)", "plane_any (some)", "plane_any (none)",  "PLANE_POS/UNIT_POS_PLANE"};
        bool ok = conf_buf_read(c, &bo, got, "plane_ops: out") &&
                  conf_buf_read(c, &bof, gotf, "plane_ops: outf");
        for (uint32_t i = 0; ok && i < N; i++)
            for (int k = 0; ok && k < PLANE_OUTS; k++)
                if (got[(size_t)i * PLANE_OUTS + k] != ref[(size_t)i * PLANE_OUTS + k])
                    ok = conf_fail(c, "%s (plane size %u) at unit %u: got %d, expected %d",
                                   names[k], P, i, got[(size_t)i * PLANE_OUTS + k],
                                   ref[(size_t)i * PLANE_OUTS + k]) == CONF_PASS;
        for (uint32_t k = 0; ok && k < N * 2; k++) dgot[k] = gotf[k];
        ok = ok && conf_cmp_f(c, "plane_sum/plane_max (f32)", dgot, dref, NULL, N * 2, 0, 0);
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&bxf);
    conf_buf_free(&bo);
    conf_buf_free(&bof);
    free(x), free(got), free(ref), free(xf), free(gotf), free(dgot), free(dref);
    if (r == CONF_PASS && !c->caps->plane_ops) c->emulated = true;
    return r;
}

/* ---- atomics --------------------------------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static conf_result case_atomics_int(conf_ctx *c, int v)
{
    (void)v;
    enum { CUBE = 64, CUBES = 8, N = CUBE * CUBES, NACC = 11, INIT_X = 12345 };
    uint32_t x[N], acc[NACC] = {0, 0, 0xffffffffu, 0xffffffffu, 0, 0, INIT_X, 0, 0, 1000000, 0};
    int32_t sacc[2] = {INT32_MAX, INT32_MIN}, sgot[2];
    uint32_t tickets[N], olds[N + 1], got[NACC], eacc[NACC];
    memset(tickets, 0, sizeof(tickets));
    uint64_t seed = 4;
    uint32_t sum = 0, mx = 0, mn = 0xffffffffu, orv = 0, xr = 0;
    for (uint32_t i = 0; i < N; i++) {
        x[i] = (uint32_t)(conf_rand(&seed) % 1000);
        sum += x[i];
        mx = x[i] > mx ? x[i] : mx;
        mn = x[i] < mn ? x[i] : mn;
        orv |= 1u << (x[i] % 32);
        xr ^= x[i];
    }
    uint32_t e[NACC] = {sum, mx, mn, 0, orv, xr, 0 /* checked apart */, N, N, 1000000 - N, sum};
    memcpy(eacc, e, sizeof(e));
    conf_buf bx = conf_buf_new(c, x, sizeof(x)), ba = conf_buf_new(c, acc, sizeof(acc)),
             bs = conf_buf_new(c, sacc, sizeof(sacc)), bt = conf_buf_new(c, tickets, sizeof(tickets)),
             bo = conf_buf_new(c, NULL, N * 4);
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&ba, NACC), conf_arg(&bs, 2), conf_arg(&bt, N),
                     conf_arg(&bo, N)};
    em_lang_bind bd[] = {em_lang_bind_int("CUBE", CUBE)};
    uint32_t cubes[3] = {CUBES, 1, 1}, dims[3] = {CUBE, 1, 1};
    conf_result r = conf_launch(c, "atomics_int", bd, 1, 1, cubes, dims, args, 5);
    if (r == CONF_PASS) {
        static const char *const names[NACC] = {
            "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
            "atomic_exchange", "atomic_compare_exchange loop", "atomic_add tickets", "atomic_sub",
            "atomic_add (shared) + atomic_add"};
        bool ok = conf_buf_read(c, &ba, got, "atomics_int: acc") &&
                  conf_buf_read(c, &bs, sgot, "atomics_int: sacc") &&
                  conf_buf_read(c, &bt, tickets, "atomics_int: tickets") &&
                  conf_buf_read(c, &bo, olds, "atomics_int: olds");
        for (int k = 0; ok && k < NACC; k++)
            if (k != 6 && got[k] != eacc[k])
                ok = conf_fail(c, "%s under contention (%d units): got %u, expected %u", names[k], N,
                               got[k], eacc[k]) == CONF_PASS;
        if (ok && (sgot[0] != (int32_t)mn - 500 || sgot[1] != (int32_t)mx - 500))
            ok = conf_fail(c, "atomic_min/max (i32): got %d/%d, expected %d/%d", sgot[0], sgot[1],
                           (int32_t)mn - 500, (int32_t)mx - 500) == CONF_PASS;
        for (uint32_t i = 0; ok && i < N; i++)
            if (tickets[i] != 1)
                ok = conf_fail(c, "atomic_add tickets: ticket %u was not handed out exactly once", i) ==
                     CONF_PASS;
        if (ok) { /* exchange: the values returned plus the final one are the initial value and
                     every unit's i + 1, each once */
            olds[N] = got[6];
            qsort(olds, N + 1, 4, cmp_u32);
            for (uint32_t i = 0; ok && i < N; i++)
                if (olds[i] != i + 1)
                    ok = conf_fail(c, "atomic_exchange: the chain of old values is broken at %u "
                                      "(found %u)", i + 1, olds[i]) == CONF_PASS;
            if (ok && olds[N] != INIT_X)
                ok = conf_fail(c, "atomic_exchange: initial value %u missing", INIT_X) == CONF_PASS;
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&ba);
    conf_buf_free(&bs);
    conf_buf_free(&bt);
    conf_buf_free(&bo);
    return r;
}

static conf_result case_atomics_f32(conf_ctx *c, int v)
{
    (void)v;
    enum { N = 1000 };
    float xf[N], facc[2] = {0, 0}, got[2];
    double sum = 0;
    for (int i = 0; i < N; i++) {
        xf[i] = (float)((i * 7) % 17 - 8);
        sum += xf[i];
    }
    conf_buf bx = conf_buf_new(c, xf, sizeof(xf)), ba = conf_buf_new(c, facc, sizeof(facc));
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&ba, 2)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "atomics_f32", NULL, 0, 1, cubes, dims, args, 2);
    if (r == CONF_PASS) {
        bool ok = conf_buf_read(c, &ba, got, "atomics_f32");
        if (ok && (got[0] != sum || got[1] != sum))
            ok = conf_fail(c, "f32 atomic_add under contention: got %g (global) and %g (shared), "
                              "expected %g", got[0], got[1], sum) == CONF_PASS;
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&ba);
    if (r == CONF_PASS && !c->caps->float_atomic_add) c->emulated = true;
    return r;
}

/* ---- positions, comptime, matrices -------------------------------------------------------------- */

/* variant 0: the positions (every output but 14); variant 1: the plane ids (output 14), which
 * must agree with the linear UNIT_POS whatever the cube's shape */
static conf_result case_dims(conf_ctx *c, int v)
{
    enum { CX = 3, CY = 2, CZ = 2, DX = 4, DY = 2, DZ = 3, OUTS = 16 };
    const uint32_t D = DX * DY * DZ, C = CX * CY * CZ, N = C * D;
    uint32_t *got = calloc((size_t)N * OUTS, 4), *ref = calloc((size_t)N * OUTS, 4);
    for (uint32_t cz = 0; cz < CZ; cz++)
        for (uint32_t cy = 0; cy < CY; cy++)
            for (uint32_t cx = 0; cx < CX; cx++)
                for (uint32_t uz = 0; uz < DZ; uz++)
                    for (uint32_t uy = 0; uy < DY; uy++)
                        for (uint32_t ux = 0; ux < DX; ux++) {
                            uint32_t cp = cx + cy * CX + cz * CX * CY, up = ux + uy * DX + uz * DX * DY;
                            uint32_t ap = cp * D + up, *o = ref + (size_t)ap * OUTS;
                            uint32_t e[OUTS] = {cx * DX + ux, cy * DY + uy, cz * DZ + uz, up, ux, uy,
                                                uz, cp, cx * 100 + cy * 10 + cz, D,
                                                DX * 100 + DY * 10 + DZ, C, CX * 100 + CY * 10 + CZ,
                                                ap, up, 0xC0FFEEu};
                            memcpy(o, e, sizeof(e));
                        }
    conf_buf bo = conf_buf_new(c, NULL, (size_t)N * OUTS * 4);
    em_arg args[] = {conf_arg(&bo, (uint64_t)N * OUTS)};
    uint32_t cubes[3] = {CX, CY, CZ}, dims[3] = {DX, DY, DZ};
    conf_result r = conf_launch(c, "dims3", NULL, 0, 1, cubes, dims, args, 1);
    if (r == CONF_PASS) {
        static const char *const names[OUTS] = {
            "ABSOLUTE_POS_X", "ABSOLUTE_POS_Y", "ABSOLUTE_POS_Z", "UNIT_POS",  "UNIT_POS_X",
            "UNIT_POS_Y",     "UNIT_POS_Z",     "CUBE_POS",       "CUBE_POS_XYZ", "CUBE_DIM",
            "CUBE_DIM_XYZ",   "CUBE_COUNT",     "CUBE_COUNT_XYZ", "ABSOLUTE_POS",
            "PLANE_POS * PLANE_DIM + UNIT_POS_PLANE", "marker"};
        bool ok = conf_buf_read(c, &bo, got, "dims3: out");
        for (uint32_t i = 0; ok && i < N * OUTS; i++)
            if (got[i] != ref[i] && (i % OUTS == 14) == (v == 1))
                ok = conf_fail(c, "dims3: %s of unit %u: got %u, expected %u", names[i % OUTS],
                               i / OUTS, got[i], ref[i]) == CONF_PASS;
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bo);
    free(got), free(ref);
    return r;
}

typedef struct poly_variant {
    em_scalar t;
    int degree;
    bool square, line4;
} poly_variant;
static const poly_variant POLYS[] = {
    {EM_F32, 4, false, false}, {EM_F32, 7, true, true}, {EM_F64, 3, true, false}, {EM_F16, 5, false, true}};

static conf_result case_poly(conf_ctx *c, int v)
{
    const poly_variant *p = &POLYS[v];
    NEED_DTYPE(c, p->t);
    enum { N = 300 };
    size_t es = em_scalar_size(p->t);
    double x[N], ref[N], got[N];
    uint64_t seed = 31;
    for (int i = 0; i < N; i++) {
        x[i] = conf_round(p->t, conf_uniform(&seed, -1.2, 1.2));
        double acc = 0;
        for (int k = p->degree - 1; k >= 0; k--) acc = acc * x[i] + (k + 1);
        if (p->square) acc *= acc;
        if (p->line4) acc *= 2;
        ref[i] = acc;
    }
    unsigned char hx[N * 8], ho[N * 8];
    conf_pack(p->t, x, NULL, N, hx);
    conf_buf bx = conf_buf_new(c, hx, N * es), bo = conf_buf_new(c, NULL, N * es);
    em_arg args[] = {conf_arg(&bx, N), conf_arg(&bo, N)};
    em_lang_bind bd[] = {em_lang_bind_type("F", p->t), em_lang_bind_int("DEGREE", p->degree),
                         em_lang_bind_bool("SQUARE", p->square), em_lang_bind_bool("LINE4", p->line4)};
    uint32_t cubes[3] = {(N + 63) / 64, 1, 1}, dims[3] = {64, 1, 1};
    conf_result r = conf_launch(c, "poly", bd, 4, 1, cubes, dims, args, 2);
    if (r == CONF_PASS) {
        char what[96];
        snprintf(what, sizeof(what), "poly<%s, DEGREE=%d, SQUARE=%d, LINE4=%d>",
                 em_scalar_name(p->t), p->degree, p->square, p->line4);
        bool ok = conf_buf_read(c, &bo, ho, what);
        if (ok) {
            conf_unpack(p->t, ho, N, got, NULL);
            ok = conf_cmp_f(c, what, got, ref, NULL, N,
                            p->t == EM_F16 ? 2e-2 : p->t == EM_F32 ? 1e-5 : 1e-12, 1);
        }
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&bx);
    conf_buf_free(&bo);
    return r;
}

static conf_result case_mma(conf_ctx *c, int v)
{
    (void)v;
    NEED_DTYPE(c, EM_F16);
    enum { S = 16 };
    double a[S * S], b[S * S], bcol[S * S], ref[S * S], got[S * S];
    uint16_t ha[S * S], hb[S * S];
    float cc[S * S];
    for (int i = 0; i < S * S; i++) {
        a[i] = ((i * 7) % 17 - 8) * 0.25;
        b[i] = ((i * 5) % 13 - 6) * 0.25; /* b row-major: b[k * S + n] */
    }
    for (int k = 0; k < S; k++)
        for (int n = 0; n < S; n++) bcol[n * S + k] = b[k * S + n];
    for (int m = 0; m < S; m++)
        for (int n = 0; n < S; n++) {
            double s = 1;
            for (int k = 0; k < S; k++) s += a[m * S + k] * b[k * S + n];
            ref[m * S + n] = s;
        }
    conf_pack(EM_F16, a, NULL, S * S, ha);
    conf_pack(EM_F16, bcol, NULL, S * S, hb);
    conf_buf ba = conf_buf_new(c, ha, sizeof(ha)), bb = conf_buf_new(c, hb, sizeof(hb)),
             bc = conf_buf_new(c, NULL, sizeof(cc));
    em_arg args[] = {conf_arg(&ba, S * S), conf_arg(&bb, S * S), conf_arg(&bc, S * S)};
    uint32_t P = c->caps->plane_dim ? c->caps->plane_dim : 1;
    uint32_t cubes[3] = {1, 1, 1}, dims[3] = {P, 1, 1};
    conf_result r = conf_launch(c, "mma16", NULL, 0, 1, cubes, dims, args, 3);
    if (r == CONF_PASS) {
        bool ok = conf_buf_read(c, &bc, cc, "mma16: c");
        for (int i = 0; ok && i < S * S; i++) got[i] = cc[i];
        ok = ok && conf_cmp_f(c, "mma16: c", got, ref, NULL, S * S, 1e-6, 1);
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&ba);
    conf_buf_free(&bb);
    conf_buf_free(&bc);
    if (r == CONF_PASS && !c->caps->matrix) c->emulated = true;
    return r;
}

/* mma_tiled: c = a · b + 0.5 (32×64 f16 times 64×48 f16, f32 out) through shared f16 tiles and a
 * shared f32 staging tile; exact in f32 (products of quarter-multiples, short sums). */
static conf_result case_mma_tiled(conf_ctx *c, int v)
{
    (void)v;
    NEED_DTYPE(c, EM_F16);
    enum { M = 32, N = 48, K = 64 };
    static double a[M * K], b[K * N], ref[M * N], got[M * N];
    static uint16_t ha[M * K], hb[K * N];
    static float cc[M * N];
    for (int i = 0; i < M * K; i++) a[i] = ((i * 7) % 11 - 5) * 0.25;
    for (int i = 0; i < K * N; i++) b[i] = ((i * 3) % 13 - 6) * 0.5;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0.5;
            for (int k = 0; k < K; k++) s += a[m * K + k] * b[k * N + n];
            ref[m * N + n] = s;
        }
    conf_pack(EM_F16, a, NULL, M * K, ha);
    conf_pack(EM_F16, b, NULL, K * N, hb);
    conf_buf ba = conf_buf_new(c, ha, sizeof(ha)), bb = conf_buf_new(c, hb, sizeof(hb)),
             bc = conf_buf_new(c, NULL, sizeof(cc));
    em_arg args[] = {conf_arg(&ba, M * K), conf_arg(&bb, K * N), conf_arg(&bc, M * N),
                     em_arg_u32(N), em_arg_u32(K)};
    uint32_t P = c->caps->plane_dim ? c->caps->plane_dim : 1;
    uint32_t cubes[3] = {N / 16, M / 16, 1}, dims[3] = {P, 1, 1};
    conf_result r = conf_launch(c, "mma_tiled", NULL, 0, 1, cubes, dims, args, 5);
    if (r == CONF_PASS) {
        bool ok = conf_buf_read(c, &bc, cc, "mma_tiled: c");
        for (int i = 0; ok && i < M * N; i++) got[i] = cc[i];
        ok = ok && conf_cmp_f(c, "mma_tiled: c", got, ref, NULL, M * N, 1e-6, 1);
        r = ok ? CONF_PASS : CONF_FAIL;
    }
    conf_buf_free(&ba);
    conf_buf_free(&bb);
    conf_buf_free(&bc);
    if (r == CONF_PASS && !c->caps->matrix) c->emulated = true;
    return r;
}

/* ---- the case list, devices, summary ------------------------------------------------------------ */

static conf_case g_cases[MAX_CASES];
static size_t g_ncases;
static char g_names[MAX_CASES][64];

static void add_case(case_fn fn, int variant, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_case(case_fn fn, int variant, const char *fmt, ...)
{
    if (g_ncases >= MAX_CASES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_names[g_ncases], sizeof(g_names[0]), fmt, ap);
    va_end(ap);
    g_cases[g_ncases] = (conf_case){g_names[g_ncases], fn, variant};
    g_ncases++;
}

static void build_cases(void)
{
    static const em_scalar floats[] = {EM_F32, EM_F16, EM_BF16, EM_F64};
    static const em_scalar generic[] = {EM_F16, EM_BF16, EM_F32, EM_F64, EM_I32, EM_U32, EM_I64};
    static const em_scalar ints[] = {EM_I32, EM_U32, EM_I64, EM_U64};
    for (size_t k = 0; k < 4; k++)
        add_case(case_ew_lines, floats[k], "ew_lines<%s> w1/2/4/8+tail", em_scalar_name(floats[k]));
    for (size_t k = 0; k < 7; k++)
        add_case(case_ew_generic, generic[k], "ew_generic<%s>", em_scalar_name(generic[k]));
    static const em_scalar sel[] = {EM_F32, EM_I32, EM_F16};
    for (size_t k = 0; k < 3; k++)
        add_case(case_select_bool, sel[k], "select_bool<%s>", em_scalar_name(sel[k]));
    for (size_t k = 0; k < 4; k++)
        add_case(case_math, floats[k], "math_all<%s>", em_scalar_name(floats[k]));
    for (size_t k = 0; k < 4; k++)
        add_case(case_int_ops, ints[k], "int_ops<%s>", em_scalar_name(ints[k]));
    for (size_t k = 0; k < NCASTS; k++)
        add_case(case_cast, (int)k, "cast %s->%s", em_scalar_name(CASTS[k].from),
                 em_scalar_name(CASTS[k].to));
    add_case(case_bitcasts, 0, "bitcasts");
    add_case(case_control, 0, "control flow");
    for (size_t k = 0; k < 4; k++)
        add_case(case_cube_reduce, floats[k], "cube_reduce<%s>", em_scalar_name(floats[k]));
    add_case(case_matmul, 0, "matmul_tiled (strided)");
    add_case(case_plane, 0, "plane ops");
    add_case(case_atomics_int, 0, "atomics (int)");
    add_case(case_atomics_f32, 0, "atomic_add f32");
    add_case(case_dims, 0, "3-D positions");
    add_case(case_dims, 1, "plane ids in a 3-D cube");
    for (size_t k = 0; k < sizeof(POLYS) / sizeof(POLYS[0]); k++)
        add_case(case_poly, (int)k, "poly<%s> comptime #%zu", em_scalar_name(POLYS[k].t), k);
    add_case(case_mma, 0, "mma16 (coop. matrix)");
    add_case(case_mma_tiled, 0, "mma tiled, shared (coop. m.)");
}

static const char *g_devs[MAX_DEVS];
static size_t g_ndevs;
static conf_result g_res[MAX_DEVS][MAX_CASES];
static bool g_opened[MAX_DEVS];
static em_lang_module *g_module;

static void run_device(void **state)
{
    size_t d = (size_t)(uintptr_t)*state;
    const char *name = g_devs[d];
    for (size_t k = 0; k < g_ncases; k++) g_res[d][k] = CONF_NOTRUN;
    em_device *dev = em_device_open(name);
    if (!dev) {
        printf("conformance: %s: not available: %s\n", name, em_last_error());
        skip();
    }
    g_opened[d] = true;
    conf_ctx ctx = {dev, em_device_caps(dev), g_module, false, ""};
    printf("conformance: %s: %s (plane size %u)\n", name, ctx.caps->device_name,
           ctx.caps->plane_dim);
    if (ctx.caps->matrix_api[0]) { /* the matrix units the mma cases run on */
        printf("  matrix units (%s):", ctx.caps->matrix_api);
        for (uint32_t i = 0; i < ctx.caps->matrix_shape_count && i < EM_CAPS_MATRIX_SHAPES; i++) {
            const em_matrix_shape *x = &ctx.caps->matrix_shapes[i];
            printf("%s %s x %s + %s -> %s %ux%ux%u", i ? "," : "",
                   em_scalar_name((em_scalar)x->a), em_scalar_name((em_scalar)x->b),
                   em_scalar_name((em_scalar)x->c), em_scalar_name((em_scalar)x->d), x->m, x->n,
                   x->k);
        }
        printf("\n");
    }
    size_t fails = 0;
    for (size_t k = 0; k < g_ncases; k++) {
        ctx.emulated = false;
        ctx.why[0] = '\0';
        em_clear_error();
        conf_result r = g_cases[k].fn(&ctx, g_cases[k].variant);
        if (r == CONF_PASS && ctx.emulated) r = CONF_EMUL;
        g_res[d][k] = r;
        if (r == CONF_FAIL) fails++;
        if (r == CONF_FAIL || r == CONF_UNSUP)
            printf("  %-30s %-11s %s\n", g_cases[k].name, CONF_RESULT_NAME[r], ctx.why);
        fflush(stdout);
    }
    em_device_close(dev);
    if (fails) fail_msg("%s: %zu of %zu cases FAILED", name, fails, g_ncases);
}

static void print_summary(void)
{
    printf("\nconformance summary (pass / emulated: passed, the feature lowered / unsupported / FAIL "
           "/ -: device absent)\n%-30s", "case");
    for (size_t d = 0; d < g_ndevs; d++) printf(" %-11s", g_devs[d]);
    printf("\n");
    size_t counts[MAX_DEVS][5];
    memset(counts, 0, sizeof(counts));
    for (size_t k = 0; k < g_ncases; k++) {
        printf("%-30s", g_cases[k].name);
        for (size_t d = 0; d < g_ndevs; d++) {
            printf(" %-11s", CONF_RESULT_NAME[g_res[d][k]]);
            counts[d][g_res[d][k]]++;
        }
        printf("\n");
    }
    printf("%-30s", "total pass/emul/unsup/FAIL");
    for (size_t d = 0; d < g_ndevs; d++) {
        char t[48];
        if (g_opened[d])
            snprintf(t, sizeof(t), "%zu/%zu/%zu/%zu", counts[d][0], counts[d][1], counts[d][2],
                     counts[d][3]);
        else
            snprintf(t, sizeof(t), "absent");
        printf(" %-11s", t);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    static const char *const all[] = {"cpu", "opencl:0", "vulkan:0", "cuda:0"};
    const char *env = getenv("EMBER_TEST_DEVICE");
    if (argc > 1) { /* with $EMBER_TEST_DEVICE set, only that device runs */
        for (int i = 1; i < argc && g_ndevs < MAX_DEVS; i++)
            if (!env || !*env || strcmp(env, argv[i]) == 0) g_devs[g_ndevs++] = argv[i];
        if (g_ndevs == 0) {
            printf("skipped: EMBER_TEST_DEVICE=%s selects another device\n", env);
            return 77;
        }
    } else if (env && *env) {
        g_devs[g_ndevs++] = env;
    } else {
        for (size_t i = 0; i < MAX_DEVS; i++) g_devs[g_ndevs++] = all[i];
    }
    build_cases();
    g_module = conf_load_corpus();
    if (!g_module) return 1;
    struct CMUnitTest tests[MAX_DEVS];
    char names[MAX_DEVS][64];
    for (size_t d = 0; d < g_ndevs; d++) {
        snprintf(names[d], sizeof(names[d]), "conformance on %s", g_devs[d]);
        tests[d] = (struct CMUnitTest){names[d], run_device, NULL, NULL, (void *)(uintptr_t)d};
    }
    int failed = _cmocka_run_group_tests("conformance", tests, g_ndevs, NULL, NULL);
    print_summary();
    em_lang_module_free(g_module);
    bool any = false;
    for (size_t d = 0; d < g_ndevs; d++) any |= g_opened[d];
    return failed ? 1 : any ? 0 : 77;
}
