/* c_prelude.c — the fixed part of generated C for the CPU target: the prelude (includes, the
 * c_abi.h structs re-declared with identical layout, half-float types), the helper functions that
 * kernels use and that are emitted only when needed (f16/bf16 conversions with round-to-nearest-
 * even, integer division without traps, saturating float-to-integer casts, atomics), C type names
 * and literals. The same conversions run here on the host to emit half-float constants. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/c_internal.h"

/* ---- types ---------------------------------------------------------------------------------- */

static const char *const ctypes[EM_SCALAR_COUNT] = {
    "bool",     "int8_t",   "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
    "uint32_t", "uint64_t", "em_f16",  "em_bf16", "float",   "double",
};

const char *cg_ctype(em_scalar s)
{
    return (unsigned)s < EM_SCALAR_COUNT ? ctypes[s] : "int";
}

const char *cg_mtype(em_scalar s)
{
    return s == EM_BOOL ? "uint8_t" : cg_ctype(s);
}

const char *cg_vtype(cg *g, em_type t, char *buf)
{
    if (t.lanes <= 1 || t.lanes > EM_MAX_LANES || t.scalar >= EM_SCALAR_COUNT)
        return cg_ctype((em_scalar)t.scalar);
    g->needs->line[t.scalar][t.lanes] = true;
    snprintf(buf, 32, "em_%sx%u", em_scalar_name((em_scalar)t.scalar), t.lanes);
    return buf;
}

/* ---- host-side half conversions (for constants) ------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float f32_from_bits(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* double -> float rounded to odd: exact, or the truncated value with its last bit set. A second
 * rounding to fewer than 22 bits is then correct (no double-rounding error). */
static float f32_odd(double d)
{
    float f = (float)d;
    if ((double)f != d && d == d) {
        uint32_t b = f32_bits(f);
        if (fabs((double)f) > fabs(d)) b--;
        f = f32_from_bits(b | 1u);
    }
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x47800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x < 0x38800000u) {
        float t = f32_from_bits(x) + 0.5f;
        return (uint16_t)(sign | (f32_bits(t) - 0x3f000000u));
    }
    x += 0xc8000fffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | (x >> 13));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

uint16_t cg_f16_bits(double x)
{
    return f32_to_f16(f32_odd(x));
}
uint16_t cg_bf16_bits(double x)
{
    return f32_to_bf16(f32_odd(x));
}

double cg_half_value(em_scalar s, uint16_t h)
{
    if (s == EM_BF16) return (double)f32_from_bits((uint32_t)h << 16);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return (double)f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e) return (double)f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
    double v = ldexp((double)m, -24);
    return sign ? -v : v;
}

/* ---- literals ------------------------------------------------------------------------------- */

/* The shortest decimal that reads back as the same float (f32) or double. */
static void float_literal(em_strbuf *sb, double v, bool f32)
{
    if (isnan(v)) {
        em_sb_append(sb, "NAN");
        return;
    }
    if (isinf(v)) {
        em_sb_append(sb, v < 0 ? "(-INFINITY)" : "INFINITY");
        return;
    }
    char buf[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (f32 ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v) break;
    }
    bool neg = buf[0] == '-';
    if (neg) em_sb_append(sb, "(");
    em_sb_append(sb, buf);
    if (!strpbrk(buf, ".en")) em_sb_append(sb, ".0");
    if (f32) em_sb_append(sb, "f");
    if (neg) em_sb_append(sb, ")");
}

static int scalar_bits(em_scalar s)
{
    return (int)em_scalar_size(s) * 8;
}

void cg_literal(em_strbuf *sb, em_scalar s, em_ir_const c)
{
    switch (s) {
    case EM_BOOL:
        em_sb_append(sb, c.i ? "true" : "false");
        return;
    case EM_F16:
        em_sb_printf(sb, "0x%04xu", cg_f16_bits(c.f));
        return;
    case EM_BF16:
        em_sb_printf(sb, "0x%04xu", cg_bf16_bits(c.f));
        return;
    case EM_F32:
        float_literal(sb, (double)(float)c.f, true);
        return;
    case EM_F64:
        float_literal(sb, c.f, false);
        return;
    case EM_I8:
    case EM_I16:
    case EM_I32:
    case EM_I64: {
        int bits = scalar_bits(s);
        int64_t v = c.i;
        if (bits < 64) { /* wrap to the kind's width, as a store into it would */
            uint64_t m = (uint64_t)v & ((UINT64_C(1) << bits) - 1);
            if (m >> (bits - 1)) m |= ~((UINT64_C(1) << bits) - 1);
            memcpy(&v, &m, sizeof v);
        }
        /* 64-bit kinds get 64-bit literals, so that shifts and products stay 64-bit */
        if (v == INT64_MIN)
            em_sb_append(sb, "INT64_MIN");
        else if (bits == 64)
            em_sb_printf(sb, v < 0 ? "(INT64_C(%lld))" : "INT64_C(%lld)", (long long)v);
        else if (v == INT32_MIN)
            em_sb_append(sb, "INT32_MIN");
        else
            em_sb_printf(sb, v < 0 ? "(%lld)" : "%lld", (long long)v);
        return;
    }
    case EM_U8:
    case EM_U16:
    case EM_U32:
    case EM_U64: {
        int bits = scalar_bits(s);
        uint64_t v = bits < 64 ? c.u & ((UINT64_C(1) << bits) - 1) : c.u;
        if (bits < 64)
            em_sb_printf(sb, "%lluu", (unsigned long long)v);
        else
            em_sb_printf(sb, "UINT64_C(%llu)", (unsigned long long)v);
        return;
    }
    default:
        em_sb_append(sb, "0");
        return;
    }
}

void cg_half_literal_f(em_strbuf *sb, em_scalar s, em_ir_const c)
{
    uint16_t bits = s == EM_BF16 ? cg_bf16_bits(c.f) : cg_f16_bits(c.f);
    float_literal(sb, cg_half_value(s, bits), true);
}

void cg_zero(em_strbuf *sb, em_scalar s)
{
    switch (s) {
    case EM_BOOL:
        em_sb_append(sb, "false");
        break;
    case EM_F32:
        em_sb_append(sb, "0.0f");
        break;
    case EM_F64:
        em_sb_append(sb, "0.0");
        break;
    case EM_F16:
    case EM_BF16:
        em_sb_append(sb, "0x0000u");
        break;
    default:
        em_sb_append(sb, "0");
        break;
    }
}

/* ---- the prelude ---------------------------------------------------------------------------- */

static const char head[] =
    "#include <math.h>\n"
    "#include <stdbool.h>\n"
    "#include <stdint.h>\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "\n"
    "/* The calling convention (src/kernel/codegen/c_abi.h, ABI version 1). */\n"
    "typedef struct em_cpu_buf {\n"
    "    void *data;            /* element 0 */\n"
    "    uint64_t len;          /* number of elements (lines) */\n"
    "    const int64_t *shape;  /* per dim, in scalars (NULL for plain arrays) */\n"
    "    const int64_t *stride; /* per dim, in scalars (NULL for plain arrays) */\n"
    "} em_cpu_buf;\n"
    "typedef union em_cpu_scalar {\n"
    "    int64_t i;\n"
    "    uint64_t u;\n"
    "    double f;\n"
    "} em_cpu_scalar;\n"
    "typedef struct em_cpu_launch {\n"
    "    const em_cpu_buf *bufs;       /* by parameter index */\n"
    "    const em_cpu_scalar *scalars; /* by parameter index */\n"
    "    uint32_t cube_dim[3];         /* units per cube, per axis */\n"
    "    uint32_t cube_count[3];       /* cubes in the grid, per axis */\n"
    "} em_cpu_launch;\n"
    "\n"
    "typedef uint16_t em_f16;  /* IEEE binary16 bits; arithmetic runs in float */\n"
    "typedef uint16_t em_bf16; /* bfloat16 bits; arithmetic runs in float */\n"
    "#if defined(__GNUC__)\n"
    "#define EM_HELPER static inline __attribute__((unused))\n"
    "#else\n"
    "#define EM_HELPER static inline\n"
    "#endif\n"
    "#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8)\n"
    "#define EM_UNROLL _Pragma(\"GCC unroll 16\")\n"
    "#else\n"
    "#define EM_UNROLL\n"
    "#endif\n";

static const char f16_helpers[] =
    "\n/* f16 <-> float, rounding to nearest even; NaN stays NaN (made quiet), overflow becomes\n"
    " * infinity. */\n"
    "EM_HELPER float em_h2f(em_f16 h)\n"
    "{\n"
    "    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;\n"
    "    float f;\n"
    "    if (e == 0x1fu) {\n"
    "        x = s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u); /* NaNs come out quiet */\n"
    "    } else if (e != 0) {\n"
    "        x = s | ((e + 112u) << 23) | (m << 13);\n"
    "    } else {\n"
    "        f = (float)m * 0x1p-24f;\n"
    "        memcpy(&x, &f, 4);\n"
    "        x |= s;\n"
    "    }\n"
    "    memcpy(&f, &x, 4);\n"
    "    return f;\n"
    "}\n"
    "EM_HELPER em_f16 em_f2h(float f)\n"
    "{\n"
    "    uint32_t x, sign;\n"
    "    memcpy(&x, &f, 4);\n"
    "    sign = (x >> 16) & 0x8000u;\n"
    "    x &= 0x7fffffffu;\n"
    "    if (x >= 0x47800000u) return (em_f16)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));\n"
    "    if (x < 0x38800000u) { /* subnormal or zero: let the FPU round at 2^-24 */\n"
    "        float t;\n"
    "        uint32_t r;\n"
    "        memcpy(&t, &x, 4);\n"
    "        t += 0.5f;\n"
    "        memcpy(&r, &t, 4);\n"
    "        return (em_f16)(sign | (r - 0x3f000000u));\n"
    "    }\n"
    "    x += 0xc8000fffu + ((x >> 13) & 1u); /* rebias the exponent, round half to even */\n"
    "    return (em_f16)(sign | (x >> 13));\n"
    "}\n";

static const char bf16_helpers[] =
    "\n/* bf16 <-> float, rounding to nearest even; NaN stays NaN (made quiet). */\n"
    "EM_HELPER float em_b2f(em_bf16 b)\n"
    "{\n"
    "    uint32_t x = (uint32_t)b << 16;\n"
    "    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u; /* NaNs come out quiet */\n"
    "    float f;\n"
    "    memcpy(&f, &x, 4);\n"
    "    return f;\n"
    "}\n"
    "EM_HELPER em_bf16 em_f2b(float f)\n"
    "{\n"
    "    uint32_t x;\n"
    "    memcpy(&x, &f, 4);\n"
    "    if ((x & 0x7fffffffu) > 0x7f800000u) return (em_bf16)((x >> 16) | 0x40u);\n"
    "    return (em_bf16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);\n"
    "}\n";

static const char f32odd_helper[] =
    "\n/* double -> float rounded to odd, so that a second rounding to a half kind is exact. */\n"
    "EM_HELPER float em_f32_odd(double d)\n"
    "{\n"
    "    float f = (float)d, r;\n"
    "    uint32_t b;\n"
    "    if ((double)f == d || d != d) return f;\n"
    "    memcpy(&b, &f, 4);\n"
    "    if (fabs((double)f) > fabs(d)) b--; /* rounded away from zero: step back */\n"
    "    b |= 1u;\n"
    "    memcpy(&r, &b, 4);\n"
    "    return r;\n"
    "}\n";

static const char i64odd_helper[] =
    "\n/* 64-bit integers -> double rounded to odd (exact below 2^53). */\n"
    "EM_HELPER double em_u64_odd(uint64_t m)\n"
    "{\n"
    "    if (m >> 53) {\n"
    "        int sh = 11 - __builtin_clzll(m);\n"
    "        uint64_t keep = (m >> sh) | (uint64_t)((m & ((UINT64_C(1) << sh) - 1)) != 0);\n"
    "        return ldexp((double)keep, sh);\n"
    "    }\n"
    "    return (double)m;\n"
    "}\n"
    "EM_HELPER double em_i64_odd(int64_t v)\n"
    "{\n"
    "    return v < 0 ? -em_u64_odd(0 - (uint64_t)v) : em_u64_odd((uint64_t)v);\n"
    "}\n";

static const char scratch_helper[] =
    "\n/* Sizes in the cube scratch are padded to cache lines. */\n"
    "EM_HELPER size_t em_pad(size_t n) { return (n + 63u) & ~(size_t)63u; }\n";

static const char state_helpers[] =
    "\n/* Unit states in kernels with barriers: 0 runs, 1 returned, 2d / 2d+1 left the cube-level\n"
    " * loop at depth d with break / continue. */\n"
    "EM_HELPER uint32_t em_lead(const uint8_t *state, uint32_t n)\n"
    "{\n"
    "    uint32_t u = 0;\n"
    "    while (u < n && state[u]) u++;\n"
    "    return u; /* the first running unit; n when none runs */\n"
    "}\n"
    "EM_HELPER bool em_any_running(const uint8_t *state, uint32_t n, uint8_t cont)\n"
    "{\n"
    "    for (uint32_t u = 0; u < n; u++)\n"
    "        if (state[u] == 0 || state[u] == cont) return true;\n"
    "    return false;\n"
    "}\n"
    "EM_HELPER void em_resume(uint8_t *state, uint32_t n, uint8_t a, uint8_t b)\n"
    "{\n"
    "    for (uint32_t u = 0; u < n; u++)\n"
    "        if (state[u] == a || state[u] == b) state[u] = 0;\n"
    "}\n";

static const char meta_helpers[] = "\n/* Tensor metadata (0 when the launch gave none). */\n"
                                   "EM_HELPER uint32_t em_shape(const em_cpu_buf *b, uint32_t d)\n"
                                   "{\n"
                                   "    return b->shape ? (uint32_t)b->shape[d] : 0u;\n"
                                   "}\n"
                                   "EM_HELPER uint32_t em_stride(const em_cpu_buf *b, uint32_t d)\n"
                                   "{\n"
                                   "    return b->stride ? (uint32_t)b->stride[d] : 0u;\n"
                                   "}\n";

static void int_helpers(em_strbuf *sb, const cg_needs *n)
{
    static const char *const lo[EM_SCALAR_COUNT] = {[EM_I8] = "-128.0",
                                                    [EM_I16] = "-32768.0",
                                                    [EM_I32] = "-2147483648.0",
                                                    [EM_I64] = "-9223372036854775808.0"};
    static const char *const hi[EM_SCALAR_COUNT] = {
        [EM_I8] = "127.0",         [EM_I16] = "32767.0",
        [EM_I32] = "2147483647.0", [EM_I64] = "9223372036854775807.0",
        [EM_U8] = "255.0",         [EM_U16] = "65535.0",
        [EM_U32] = "4294967295.0", [EM_U64] = "18446744073709551615.0"};
    static const char *const minv[EM_SCALAR_COUNT] = {[EM_I8] = "INT8_MIN",
                                                      [EM_I16] = "INT16_MIN",
                                                      [EM_I32] = "INT32_MIN",
                                                      [EM_I64] = "INT64_MIN"};
    static const char *const maxv[EM_SCALAR_COUNT] = {
        [EM_I8] = "INT8_MAX",    [EM_I16] = "INT16_MAX", [EM_I32] = "INT32_MAX",
        [EM_I64] = "INT64_MAX",  [EM_U8] = "UINT8_MAX",  [EM_U16] = "UINT16_MAX",
        [EM_U32] = "UINT32_MAX", [EM_U64] = "UINT64_MAX"};
    bool any = false;
    for (int s = EM_I8; s <= EM_U64; s++)
        any = any || n->div[s] || n->rem[s] || n->sat[s] || n->minmax[s];
    if (!any) return;
    em_sb_append(
        sb,
        "\n/* Integer helpers. Division never traps: a / 0 == a, a % 0 == 0, MIN / -1 == MIN, MIN "
        "% -1 == 0\n"
        " * (the rule of every ember target). Float to integer casts saturate; NaN gives 0. */\n");
    for (int s = EM_I8; s <= EM_U64; s++) {
        const char *t = ctypes[s], *name = em_scalar_name((em_scalar)s);
        bool sgn = em_scalar_is_signed((em_scalar)s);
        const char *u = em_scalar_size((em_scalar)s) == 8 ? "uint64_t" : "uint32_t";
        if (n->div[s]) {
            if (sgn)
                em_sb_printf(
                    sb,
                    "EM_HELPER %s em_div_%s(%s a, %s b)\n{\n"
                    "    return b == 0 ? a : b == -1 ? (%s)(0u - (%s)a) : (%s)(a / b);\n}\n",
                    t, name, t, t, t, u, t);
            else
                em_sb_printf(sb,
                             "EM_HELPER %s em_div_%s(%s a, %s b) { return b ? (%s)(a / b) : a; }\n",
                             t, name, t, t, t);
        }
        if (n->rem[s]) {
            if (sgn)
                em_sb_printf(sb,
                             "EM_HELPER %s em_rem_%s(%s a, %s b)\n{\n"
                             "    return b == 0 || b == -1 ? 0 : (%s)(a %% b);\n}\n",
                             t, name, t, t, t);
            else
                em_sb_printf(
                    sb, "EM_HELPER %s em_rem_%s(%s a, %s b) { return b ? (%s)(a %% b) : 0; }\n", t,
                    name, t, t, t);
        }
        if (n->minmax[s]) {
            em_sb_printf(sb, "EM_HELPER %s em_min_%s(%s a, %s b) { return a < b ? a : b; }\n", t,
                         name, t, t);
            em_sb_printf(sb, "EM_HELPER %s em_max_%s(%s a, %s b) { return a > b ? a : b; }\n", t,
                         name, t, t);
            em_sb_printf(sb,
                         "EM_HELPER %s em_clamp_%s(%s x, %s lo, %s hi) { return x < lo ? lo : x > "
                         "hi ? hi : x; }\n",
                         t, name, t, t, t);
        }
        if (n->sat[s]) {
            if (sgn)
                em_sb_printf(sb,
                             "EM_HELPER %s em_sat_%s(double x)\n{\n"
                             "    return x != x ? 0 : x <= %s ? %s : x >= %s ? %s : (%s)x;\n}\n",
                             t, name, lo[s], minv[s], hi[s], maxv[s], t);
            else
                em_sb_printf(sb,
                             "EM_HELPER %s em_sat_%s(double x)\n{\n"
                             "    return x != x || x <= 0.0 ? 0 : x >= %s ? %s : (%s)x;\n}\n",
                             t, name, hi[s], maxv[s], t);
        }
    }
}

static void atomic_helpers(em_strbuf *sb, const cg_needs *n)
{
    static const char *const names[11] = {"add", "sub",  "min", "max",  "and",  "or",
                                          "xor", "xchg", "cas", "load", "store"};
    bool any = false;
    for (int o = 0; o < 11; o++)
        for (int s = 0; s < EM_SCALAR_COUNT; s++) any = any || n->atomic[o][s];
    if (!any) return;
    em_sb_append(sb,
                 "\n/* Atomics (sequentially consistent); each returns the old value. Float add\n"
                 " * and min/max loop on compare-exchange. */\n");
    for (int o = 0; o < 11; o++) {
        for (int s = 0; s < EM_SCALAR_COUNT; s++) {
            if (!n->atomic[o][s]) continue;
            const char *t = cg_mtype((em_scalar)s), *nm = em_scalar_name((em_scalar)s);
            bool flt = em_scalar_is_float((em_scalar)s);
            em_ir_op op = (em_ir_op)(EM_OP_ATOMIC_ADD + o);
            switch (op) {
            case EM_OP_ATOMIC_ADD:
            case EM_OP_ATOMIC_SUB:
                if (flt) {
                    em_sb_printf(sb,
                                 "EM_HELPER %s em_atomic_%s_%s(%s *p, %s v)\n{\n"
                                 "    %s old, upd;\n"
                                 "    __atomic_load(p, &old, __ATOMIC_RELAXED);\n"
                                 "    do {\n"
                                 "        upd = old %c v;\n"
                                 "    } while (!__atomic_compare_exchange(p, &old, &upd, true, "
                                 "__ATOMIC_SEQ_CST, __ATOMIC_RELAXED));\n"
                                 "    return old;\n}\n",
                                 t, names[o], nm, t, t, t, op == EM_OP_ATOMIC_ADD ? '+' : '-');
                    break;
                }
                /* fall through */
            case EM_OP_ATOMIC_AND:
            case EM_OP_ATOMIC_OR:
            case EM_OP_ATOMIC_XOR:
                em_sb_printf(sb,
                             "EM_HELPER %s em_atomic_%s_%s(%s *p, %s v) "
                             "{ return __atomic_fetch_%s(p, v, __ATOMIC_SEQ_CST); }\n",
                             t, names[o], nm, t, t, names[o]);
                break;
            case EM_OP_ATOMIC_MIN:
            case EM_OP_ATOMIC_MAX:
                em_sb_printf(
                    sb,
                    "EM_HELPER %s em_atomic_%s_%s(%s *p, %s v)\n{\n"
                    "    %s old = __atomic_load_n(p, __ATOMIC_RELAXED);\n"
                    "    while (v %c old && !__atomic_compare_exchange_n(p, &old, v, true, "
                    "__ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {\n"
                    "    }\n"
                    "    return old;\n}\n",
                    t, names[o], nm, t, t, t, op == EM_OP_ATOMIC_MIN ? '<' : '>');
                break;
            case EM_OP_ATOMIC_XCHG:
                if (flt)
                    em_sb_printf(sb,
                                 "EM_HELPER %s em_atomic_xchg_%s(%s *p, %s v)\n{\n"
                                 "    %s old;\n"
                                 "    __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);\n"
                                 "    return old;\n}\n",
                                 t, nm, t, t, t);
                else
                    em_sb_printf(sb,
                                 "EM_HELPER %s em_atomic_xchg_%s(%s *p, %s v) "
                                 "{ return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }\n",
                                 t, nm, t, t);
                break;
            case EM_OP_ATOMIC_CAS:
                if (flt)
                    em_sb_printf(
                        sb,
                        "EM_HELPER %s em_atomic_cas_%s(%s *p, %s cmp, %s v)\n{\n"
                        "    __atomic_compare_exchange(p, &cmp, &v, false, __ATOMIC_SEQ_CST, "
                        "__ATOMIC_SEQ_CST);\n"
                        "    return cmp;\n}\n",
                        t, nm, t, t, t);
                else
                    em_sb_printf(
                        sb,
                        "EM_HELPER %s em_atomic_cas_%s(%s *p, %s cmp, %s v)\n{\n"
                        "    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, "
                        "__ATOMIC_SEQ_CST);\n"
                        "    return cmp;\n}\n",
                        t, nm, t, t, t);
                break;
            case EM_OP_ATOMIC_LOAD:
                if (flt)
                    em_sb_printf(sb,
                                 "EM_HELPER %s em_atomic_load_%s(const %s *p)\n{\n"
                                 "    %s v;\n"
                                 "    __atomic_load(p, &v, __ATOMIC_SEQ_CST);\n"
                                 "    return v;\n}\n",
                                 t, nm, t, t);
                else
                    em_sb_printf(sb,
                                 "EM_HELPER %s em_atomic_load_%s(const %s *p) "
                                 "{ return __atomic_load_n(p, __ATOMIC_SEQ_CST); }\n",
                                 t, nm, t);
                break;
            case EM_OP_ATOMIC_STORE:
                if (flt)
                    em_sb_printf(sb,
                                 "EM_HELPER void em_atomic_store_%s(%s *p, %s v) "
                                 "{ __atomic_store(p, &v, __ATOMIC_SEQ_CST); }\n",
                                 nm, t, t);
                else
                    em_sb_printf(sb,
                                 "EM_HELPER void em_atomic_store_%s(%s *p, %s v) "
                                 "{ __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }\n",
                                 nm, t, t);
                break;
            default:
                break;
            }
        }
    }
}

void cg_prelude(em_strbuf *sb, const cg_needs *n, size_t nkernels)
{
    em_sb_printf(
        sb,
        "/* Generated by ember's C code generator (src/kernel/codegen/c.c) for the CPU "
        "target: %zu kernel%s.\n"
        " * Each emk_NAME(launch, first, count) runs cubes [first, first + count) of the "
        "grid on the calling\n"
        " * thread; inside a cube, every barrier-free region is a loop over the units. */\n",
        nkernels, nkernels == 1 ? "" : "s");
    em_sb_append(sb, head);
    bool lines = false;
    for (int s = 0; s < EM_SCALAR_COUNT; s++)
        for (int l = 2; l <= EM_MAX_LANES; l++)
            if (n->line[s][l]) {
                if (!lines)
                    em_sb_append(sb,
                                 "\n/* Lines: vectors of 1..16 lanes, computed lane by lane. */\n");
                lines = true;
                em_sb_printf(sb, "typedef struct { %s v[%d]; } em_%sx%d;\n", cg_ctype((em_scalar)s),
                             l, em_scalar_name((em_scalar)s), l);
            }
    if (n->f16 || n->d2h) em_sb_append(sb, f16_helpers);
    if (n->bf16 || n->d2b) em_sb_append(sb, bf16_helpers);
    if (n->f32odd || n->d2h || n->d2b) em_sb_append(sb, f32odd_helper);
    if (n->d2h)
        em_sb_append(sb, "EM_HELPER em_f16 em_d2h(double d) { return em_f2h(em_f32_odd(d)); }\n");
    if (n->d2b)
        em_sb_append(sb, "EM_HELPER em_bf16 em_d2b(double d) { return em_f2b(em_f32_odd(d)); }\n");
    if (n->i64odd) em_sb_append(sb, i64odd_helper);
    int_helpers(sb, n);
    atomic_helpers(sb, n);
    if (n->scratch) em_sb_append(sb, scratch_helper);
    if (n->state) em_sb_append(sb, state_helpers);
    if (n->meta) em_sb_append(sb, meta_helpers);
}
