/* test_elementwise.c — conformance of the elementwise ops on every device present: each unary
 * op in every float dtype against a float64 reference (on a transposed view), integer unary ops,
 * binary ops with NumPy broadcasting on sliced and expanded views, comparisons and logical ops,
 * where/masked_fill, scalar variants, casts between all dtypes, NaN/Inf agreement, zero-size and
 * 0-d tensors, in-place reuse through em_take, and sentinel guards around output views. */
#include "tensor_util.h"

typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef double (*ref_fn)(double);

static double r_neg(double x) { return -x; }
static double r_sign(double x) { return isnan(x) ? x : (x > 0) - (x < 0); }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_recip(double x) { return 1 / x; }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x < 0 ? 0 : x; }
static double r_gelu(double x) { return x * (erf(x / sqrt(2)) + 1) / 2; }
static double r_gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double r_silu(double x) { return x / (1 + exp(-x)); }
static double r_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }
static double r_round(double x) { return nearbyint(x); }

static const struct {
    const char *name;
    unary_fn fn;
    ref_fn ref;
    double lo, hi; /* input range */
} unary_ops[] = {
    {"neg", em_neg, r_neg, -3, 3},         {"abs", em_abs, fabs, -3, 3},
    {"sign", em_sign, r_sign, -3, 3},      {"exp", em_exp, exp, -4, 4},
    {"ln", em_ln, log, 0.1, 5},            {"log1p", em_log1p, log1p, -0.5, 3},
    {"expm1", em_expm1, expm1, -2, 2},     {"sqrt", em_sqrt, sqrt, 0, 9},
    {"rsqrt", em_rsqrt, r_rsqrt, 0.2, 9},  {"reciprocal", em_reciprocal, r_recip, 0.5, 4},
    {"sin", em_sin, sin, -3, 3},           {"cos", em_cos, cos, -3, 3},
    {"tanh", em_tanh, tanh, -3, 3},        {"erf", em_erf, erf, -2, 2},
    {"sigmoid", em_sigmoid, r_sigmoid, -6, 6}, {"relu", em_relu, r_relu, -3, 3},
    {"gelu", em_gelu, r_gelu, -4, 4},      {"gelu_tanh", em_gelu_tanh, r_gelu_tanh, -4, 4},
    {"silu", em_silu, r_silu, -5, 5},      {"softplus", em_softplus, r_softplus, -5, 25},
    {"floor", em_floor, floor, -3, 3},     {"ceil", em_ceil, ceil, -3, 3},
    {"round", em_round, r_round, -3, 3},
};

/* Every unary op, every float dtype, on a transposed [5, 3] view of a [3, 5] tensor. */
static void test_unary_floats(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            for (size_t oi = 0; oi < EM_ARRAY_LEN(unary_ops); oi++) {
                em_scope_begin();
                double v[15], ref[15];
                tu_fill(v, 15, unary_ops[oi].lo, unary_ops[oi].hi, (uint32_t)oi + 1);
                if (!strcmp(unary_ops[oi].name, "round")) v[0] = 2.5, v[1] = -0.5, v[2] = 1.5;
                em_tensor *x = tu_tensor(dev, dt, EM_SHAPE(3, 5), v);
                em_tensor *xt = em_transpose(x, 0, 1);
                em_tensor *y = unary_ops[oi].fn(xt);
                for (int i = 0; i < 5; i++)
                    for (int j = 0; j < 3; j++) ref[i * 3 + j] = tu_round(dt, unary_ops[oi].ref(v[j * 5 + i]));
                char what[96];
                snprintf(what, sizeof what, "%s %s", unary_ops[oi].name, em_scalar_name(dt));
                /* f16/bf16: one rounding of the result on top of f32 math */
                tu_check(what, y, EM_SHAPE(5, 3), ref, tu_tol_on(dev, dt) + (dt == EM_F32 ? 1e-5 : 0));
                em_scope_end(NULL, 0);
            }
        }
    }
}

static void test_unary_params_and_predicates(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double v[8] = {-2, -0.5, 0, 0.5, 2, NAN, INFINITY, -INFINITY}, ref[8];
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(8), v);
        for (int i = 0; i < 8; i++) ref[i] = isnan(v[i]) ? v[i] : v[i] < -1 ? -1 : v[i] > 1 ? 1 : v[i];
        tu_check("clamp", em_clamp(x, -1, 1), EM_SHAPE(8), ref, 0);
        for (int i = 0; i < 8; i++) ref[i] = isnan(v[i]);
        tu_check("isnan", em_isnan(x), EM_SHAPE(8), ref, 0);
        assert_int_equal(em_dtype(em_isnan(x)), EM_BOOL);
        for (int i = 0; i < 8; i++) ref[i] = isinf(v[i]) != 0;
        tu_check("isinf", em_isinf(x), EM_SHAPE(8), ref, 0);
        /* NaN and Inf flow through math as in C */
        for (int i = 0; i < 8; i++) ref[i] = (float)exp(v[i]);
        tu_check("exp nan/inf", em_exp(x), EM_SHAPE(8), ref, 1e-6);
        double p[5] = {0.5, 1, 2, 3, 4}, rp[5];
        em_tensor *px = tu_tensor(dev, EM_F32, EM_SHAPE(5), p);
        for (int i = 0; i < 5; i++) rp[i] = pow(p[i], 2.5);
        tu_check("pow_scalar", em_pow_scalar(px, 2.5), EM_SHAPE(5), rp, 1e-5);
        for (int i = 0; i < 5; i++) rp[i] = (float)(p[i] * 3 + 1);
        tu_check("mul/add scalar", em_add_scalar(em_mul_scalar(px, 3), 1), EM_SHAPE(5), rp, 1e-6);
        for (int i = 0; i < 5; i++) rp[i] = (float)(10 - p[i]);
        tu_check("rsub_scalar", em_rsub_scalar(px, 10), EM_SHAPE(5), rp, 1e-6);
        for (int i = 0; i < 5; i++) rp[i] = (float)(2 / p[i]);
        tu_check("rdiv_scalar", em_rdiv_scalar(px, 2), EM_SHAPE(5), rp, 1e-6);
        for (int i = 0; i < 5; i++) rp[i] = p[i] > 2 ? 1 : 0;
        tu_check("gt_scalar", em_gt_scalar(px, 2), EM_SHAPE(5), rp, 0);
        /* integers: neg, abs, sign, relu, clamp, scalar ops, integer division by zero gives 0 */
        double iv[6] = {-7, -1, 0, 3, 8, 100}, ir[6];
        em_tensor *xi = tu_tensor(dev, EM_I32, EM_SHAPE(6), iv);
        for (int i = 0; i < 6; i++) ir[i] = fabs(iv[i]);
        tu_check("abs i32", em_abs(xi), EM_SHAPE(6), ir, 0);
        for (int i = 0; i < 6; i++) ir[i] = iv[i] < 0 ? 0 : iv[i];
        tu_check("relu i32", em_relu(xi), EM_SHAPE(6), ir, 0);
        for (int i = 0; i < 6; i++) ir[i] = iv[i] < -2 ? -2 : iv[i] > 5 ? 5 : iv[i];
        tu_check("clamp i32", em_clamp(xi, -2, 5), EM_SHAPE(6), ir, 0);
        for (int i = 0; i < 6; i++) ir[i] = (double)(int)(iv[i] / 2);
        tu_check("div_scalar i32", em_div_scalar(xi, 2), EM_SHAPE(6), ir, 0);
        for (int i = 0; i < 6; i++) ir[i] = 0;
        tu_check("div_scalar i32 by 0", em_div_scalar(xi, 0), EM_SHAPE(6), ir, 0);
        em_tensor *xl = tu_tensor(dev, EM_I64, EM_SHAPE(6), iv);
        for (int i = 0; i < 6; i++) ir[i] = -iv[i];
        tu_check("neg i64", em_neg(xl), EM_SHAPE(6), ir, 0);
        em_scope_end(NULL, 0);
    }
}

/* The reference of binary op k. */
static double ref_binary(int k, double a, double b)
{
    switch (k) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return pow(a, b);
    case 5: return a > b ? a : b;
    case 6: return a < b ? a : b;
    case 7: { double r = fmod(a, b); return r != 0 && ((r < 0) != (b < 0)) ? r + b : r; }
    case 8: return a == b;
    case 9: return a != b;
    case 10: return a < b;
    case 11: return a <= b;
    case 12: return a > b;
    case 13: return a >= b;
    }
    return NAN;
}

typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);
static const binary_fn binary_ops[] = {em_add, em_sub, em_mul, em_div, em_pow, em_maximum, em_minimum,
                                       em_remainder, em_eq, em_ne, em_lt, em_le, em_gt, em_ge};
static const char *const binary_names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                           "remainder", "eq", "ne", "lt", "le", "gt", "ge"};

/* a: [4, 1, 3] sliced with step 2 from [8, 1, 3]; b: [5, 1] expanded view, broadcast to [4, 5, 3]. */
static void test_binary_broadcast_views(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < 6; ti++) {
            static const em_scalar types[] = {EM_F32, EM_F16, EM_BF16, EM_F64, EM_I32, EM_I64};
            em_scalar dt = types[ti];
            if (!tu_has(dev, dt)) continue;
            bool fl = em_scalar_is_float(dt);
            for (int k = 0; k < 14; k++) {
                em_scope_begin();
                double va[24], vb[5], ref[60];
                tu_fill(va, 24, fl ? 0.5 : -9, fl ? 3 : 9, 7 + (uint32_t)k);
                tu_fill(vb, 5, fl ? 0.5 : 1, fl ? 2 : 5, 11 + (uint32_t)k);
                if (!fl)
                    for (int i = 0; i < 24; i++) va[i] = floor(va[i]);
                if (!fl)
                    for (int i = 0; i < 5; i++) vb[i] = floor(vb[i]);
                if (!fl && k == 4) { /* integer pow is checked with the integer ops */
                    em_scope_end(NULL, 0);
                    continue;
                }
                va[0] = vb[0]; /* an equal pair for the comparisons */
                em_tensor *a = em_slice(tu_tensor(dev, dt, EM_SHAPE(8, 1, 3), va), 0, 0, 8, 2);
                em_tensor *b = tu_tensor(dev, dt, EM_SHAPE(5, 1), vb);
                em_tensor *y = binary_ops[k](a, b);
                em_scalar rdt = !fl && k == 3 ? EM_F32 : dt; /* true division of integers */
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 5; j++)
                        for (int c = 0; c < 3; c++) {
                            double r = ref_binary(k, va[(2 * i) * 3 + c], vb[j]);
                            ref[(i * 5 + j) * 3 + c] = k >= 8 ? r : tu_round(rdt, r);
                        }
                char what[64];
                snprintf(what, sizeof what, "%s %s", binary_names[k], em_scalar_name(dt));
                tu_check(what, y, EM_SHAPE(4, 5, 3), ref, k >= 8 ? 0 : tu_tol_on(dev, rdt) * 2);
                assert_int_equal(em_dtype(y), k >= 8 ? EM_BOOL : rdt);
                em_scope_end(NULL, 0);
            }
        }
    }
}

/* Type promotion (em_promote_types): each row of the table in tensor.h, through the binary ops
 * (both operand orders), div (true division), remainder, comparisons and where, against host
 * references; and the scalar variants' rule for integer tensors with non-integral scalars. */
typedef struct promo_case {
    em_scalar a, b, want;
} promo_case;

static void promo_values(em_scalar dt, double *v, size_t n, bool divisor)
{
    for (size_t i = 0; i < n; i++) {
        int k = (int)((i * 7 + (divisor ? 3 : 1)) % 9); /* 0..8 */
        if (dt == EM_BOOL) v[i] = divisor ? 1 : (double)(k & 1);
        else if (em_scalar_is_float(dt)) v[i] = divisor ? 0.5 + 0.5 * (k % 4) : 0.5 * k - 2;
        else if (dt == EM_U8) v[i] = divisor ? 1 + k % 4 : k;
        else v[i] = divisor ? 1 + k % 4 : k - 4;
    }
}

static void test_type_promotion(void **state)
{
    (void)state;
    static const promo_case cases[] = {
        {EM_F16, EM_F32, EM_F32},  {EM_BF16, EM_F16, EM_F32},  {EM_I32, EM_F32, EM_F32},
        {EM_I32, EM_I64, EM_I64},  {EM_U8, EM_I32, EM_I32},    {EM_BOOL, EM_F32, EM_F32},
        {EM_BOOL, EM_I32, EM_I32}, {EM_BOOL, EM_BF16, EM_BF16}, {EM_BF16, EM_BF16, EM_BF16},
        {EM_F32, EM_F64, EM_F64},  {EM_U8, EM_F16, EM_F16},    {EM_I64, EM_BF16, EM_BF16},
        {EM_U8, EM_I64, EM_I64},   {EM_BOOL, EM_U8, EM_U8},    {EM_I64, EM_F64, EM_F64},
    };
    /* the table itself, on the host */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(em_promote_types(cases[i].a, cases[i].b), cases[i].want);
        assert_int_equal(em_promote_types(cases[i].b, cases[i].a), cases[i].want);
    }
    assert_int_equal(em_promote_types(EM_F16, EM_F16), EM_F16);
    assert_int_equal(em_promote_types(EM_BOOL, EM_BOOL), EM_BOOL);
    assert_int_equal(em_promote_types(EM_U8, EM_I8), EM_I16);
    assert_int_equal(em_promote_types((em_scalar)99, EM_F32), EM_SCALAR_COUNT);
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            promo_case pc = cases[ci];
            if (!tu_has(dev, pc.a) || !tu_has(dev, pc.b) || !tu_has(dev, pc.want) ||
                !tu_has(dev, EM_F32))
                continue;
            em_scope_begin();
            double va[6], vb[3], ref[6], ref2[6];
            promo_values(pc.a, va, 6, false);
            promo_values(pc.b, vb, 3, true);
            em_tensor *a = tu_tensor(dev, pc.a, EM_SHAPE(2, 3), va);
            em_tensor *b = tu_tensor(dev, pc.b, EM_SHAPE(3), vb);
            char what[96];
            bool fl = em_scalar_is_float(pc.want);
            for (int k = 0; k < 14; k++) {
                if (k == 4) continue; /* pow: covered by the same-dtype tests */
                if (k == 7 && fl) continue; /* float remainder: covered by the same-dtype tests */
                em_scalar rdt = k >= 8 ? EM_BOOL : k == 3 && !fl ? EM_F32 : pc.want;
                double tol = tu_tol_on(dev, rdt) * 2;
                for (int i = 0; i < 6; i++) {
                    double x = va[i], y = vb[i % 3];
                    double r = ref_binary(k, x, y), r2 = ref_binary(k, y, x);
                    if (rdt == EM_U8) { /* u8 arithmetic wraps */
                        r -= 256 * floor(r / 256);
                        r2 -= 256 * floor(r2 / 256);
                    }
                    ref[i] = k >= 8 ? r : tu_round(rdt, r);
                    ref2[i] = k >= 8 ? r2 : tu_round(rdt, r2);
                }
                snprintf(what, sizeof what, "%s %s %s", binary_names[k], em_scalar_name(pc.a),
                         em_scalar_name(pc.b));
                em_tensor *y = binary_ops[k](a, b);
                tu_check(what, y, EM_SHAPE(2, 3), ref, k >= 8 ? 0 : tol);
                assert_int_equal(em_dtype(y), rdt);
                if (k == 3 || k == 7) continue; /* b / a: a may hold zeros */
                snprintf(what, sizeof what, "%s %s %s", binary_names[k], em_scalar_name(pc.b),
                         em_scalar_name(pc.a));
                y = binary_ops[k](b, a);
                tu_check(what, y, EM_SHAPE(2, 3), ref2, k >= 8 ? 0 : tol);
                assert_int_equal(em_dtype(y), rdt);
            }
            /* where promotes its two value operands */
            double vc[6] = {1, 0, 0, 1, 1, 0};
            em_tensor *c = tu_tensor(dev, EM_BOOL, EM_SHAPE(2, 3), vc);
            for (int i = 0; i < 6; i++) ref[i] = vc[i] ? va[i] : vb[i % 3];
            snprintf(what, sizeof what, "where %s %s", em_scalar_name(pc.a), em_scalar_name(pc.b));
            em_tensor *w = em_where(c, a, b);
            tu_check(what, w, EM_SHAPE(2, 3), ref, 0);
            assert_int_equal(em_dtype(w), pc.want);
            /* donated operands are released (or reused) through the conversion */
            em_tensor *a2 = em_take(tu_tensor(dev, pc.a, EM_SHAPE(2, 3), va));
            em_tensor *b2 = em_take(tu_tensor(dev, pc.b, EM_SHAPE(3), vb));
            for (int i = 0; i < 6; i++) ref[i] = tu_round(pc.want, va[i] + vb[i % 3]);
            tu_check("add donated", em_add(a2, b2), EM_SHAPE(2, 3), ref,
                     tu_tol_on(dev, pc.want) * 2);
            em_scope_end(NULL, 0);
        }
        /* scalar variants: float tensors keep their dtype; integer tensors with a non-integral
         * scalar go to f32; with an integral scalar they stay integer */
        em_scope_begin();
        double vi[4] = {-3, 0, 2, 7}, ref[4];
        em_tensor *ti = tu_tensor(dev, EM_I32, EM_SHAPE(4), vi);
        em_tensor *y = em_add_scalar(ti, 0.5);
        for (int i = 0; i < 4; i++) ref[i] = vi[i] + 0.5;
        tu_check("i32 + 0.5", y, EM_SHAPE(4), ref, 0);
        assert_int_equal(em_dtype(y), EM_F32);
        y = em_mul_scalar(ti, 1.5);
        for (int i = 0; i < 4; i++) ref[i] = vi[i] * 1.5;
        tu_check("i32 * 1.5", y, EM_SHAPE(4), ref, 0);
        assert_int_equal(em_dtype(y), EM_F32);
        y = em_div_scalar(ti, 0.5);
        for (int i = 0; i < 4; i++) ref[i] = vi[i] / 0.5;
        tu_check("i32 / 0.5", y, EM_SHAPE(4), ref, 0);
        assert_int_equal(em_dtype(y), EM_F32);
        y = em_lt_scalar(ti, 1.5);
        for (int i = 0; i < 4; i++) ref[i] = vi[i] < 1.5;
        tu_check("i32 < 1.5", y, EM_SHAPE(4), ref, 0);
        assert_int_equal(em_dtype(y), EM_BOOL);
        y = em_add_scalar(ti, 2);
        for (int i = 0; i < 4; i++) ref[i] = vi[i] + 2;
        tu_check("i32 + 2", y, EM_SHAPE(4), ref, 0);
        assert_int_equal(em_dtype(y), EM_I32);
        y = em_add_scalar(em_take(tu_tensor(dev, EM_I64, EM_SHAPE(4), vi)), 0.25);
        for (int i = 0; i < 4; i++) ref[i] = vi[i] + 0.25;
        tu_check("i64 (donated) + 0.25", y, EM_SHAPE(4), ref, 0);
        assert_int_equal(em_dtype(y), EM_F32);
        for (size_t fi = 0; fi < sizeof tu_float_types / sizeof *tu_float_types; fi++) {
            em_scalar ft = tu_float_types[fi];
            if (!tu_has(dev, ft)) continue;
            double vf[4] = {-3, 0, 2, 7};
            y = em_add_scalar(tu_tensor(dev, ft, EM_SHAPE(4), vf), 0.5);
            for (int i = 0; i < 4; i++) ref[i] = tu_round(ft, vf[i] + 0.5);
            tu_check("float + 0.5", y, EM_SHAPE(4), ref, tu_tol_on(dev, ft));
            assert_int_equal(em_dtype(y), ft);
        }
        em_scope_end(NULL, 0);
    }
}

static void test_logical_where_masked_fill(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double a[4] = {1, 0, 1, 0}, b[4] = {1, 1, 0, 0}, ref[4];
        em_tensor *ta = tu_tensor(dev, EM_BOOL, EM_SHAPE(4), a), *tb = tu_tensor(dev, EM_BOOL, EM_SHAPE(4), b);
        for (int i = 0; i < 4; i++) ref[i] = a[i] && b[i];
        tu_check("and", em_logical_and(ta, tb), EM_SHAPE(4), ref, 0);
        for (int i = 0; i < 4; i++) ref[i] = a[i] || b[i];
        tu_check("or", em_logical_or(ta, tb), EM_SHAPE(4), ref, 0);
        for (int i = 0; i < 4; i++) ref[i] = (a[i] != 0) != (b[i] != 0);
        tu_check("xor", em_logical_xor(ta, tb), EM_SHAPE(4), ref, 0);
        for (int i = 0; i < 4; i++) ref[i] = !a[i];
        tu_check("not", em_logical_not(ta), EM_SHAPE(4), ref, 0);
        /* where: cond [4, 1] against x [3] and y 0-d */
        double c[4] = {1, 0, 0, 1}, x[3] = {1, 2, 3}, y0 = -1, wr[12];
        em_tensor *tc = tu_tensor(dev, EM_BOOL, EM_SHAPE(4, 1), c);
        em_tensor *tx = tu_tensor(dev, EM_F32, EM_SHAPE(3), x);
        em_tensor *ty = tu_tensor(dev, EM_F32, EM_SHAPE(), &y0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) wr[i * 3 + j] = c[i] ? x[j] : y0;
        tu_check("where", em_where(tc, tx, ty), EM_SHAPE(4, 3), wr, 0);
        em_tensor *full = em_expand(tx, EM_SHAPE(4, 3));
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) wr[i * 3 + j] = c[i] ? -5 : x[j];
        tu_check("masked_fill", em_masked_fill(full, tc, -5), EM_SHAPE(4, 3), wr, 0);
        /* a condition that starts inside its buffer (narrowed: offset 1) */
        em_tensor *tc1 = em_narrow(tu_tensor(dev, EM_BOOL, EM_SHAPE(4), c), 0, 1, 3);
        double sr[3];
        for (int j = 0; j < 3; j++) sr[j] = c[j + 1] ? x[j] : y0;
        tu_check("where (offset cond)", em_where(tc1, tx, ty), EM_SHAPE(3), sr, 0);
        em_scope_end(NULL, 0);
    }
}

/* Casts between every pair of dtypes, on values every dtype holds (and rounding cases). */
static void test_cast_all_pairs(void **state)
{
    (void)state;
    static const em_scalar types[] = {EM_F32, EM_F16, EM_BF16, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t i = 0; i < 8; i++)
            for (size_t j = 0; j < 8; j++) {
                if (!tu_has(dev, types[i]) || !tu_has(dev, types[j])) continue;
                em_scope_begin();
                double v[6] = {0, 1, 2, 7, 100, 3}, ref[6];
                if (types[i] == EM_BOOL) v[2] = v[3] = v[4] = v[5] = 1;
                if (em_scalar_is_float(types[i])) v[5] = 2.75; /* truncates to 2 in integers */
                em_tensor *x = tu_tensor(dev, types[i], EM_SHAPE(2, 3), v);
                em_tensor *y = em_cast(x, types[j]);
                for (int k = 0; k < 6; k++) ref[k] = tu_round(types[j], v[k]);
                char what[64];
                snprintf(what, sizeof what, "cast %s -> %s", em_scalar_name(types[i]), em_scalar_name(types[j]));
                tu_check(what, y, EM_SHAPE(2, 3), ref, 0);
                assert_int_equal(em_dtype(y), types[j]);
                em_scope_end(NULL, 0);
            }
        /* round to nearest even: f32 -> f16 and bf16 */
        em_scope_begin();
        if (tu_has(dev, EM_F16) && tu_has(dev, EM_BF16)) {
            /* ties go to the even neighbour, above-half rounds up */
            double h[4] = {1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256};
            double rh[4] = {1.0, 1.0 + 4.0 / 2048, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256};
            double rb[4] = {1.0, 1.0, 1.0, 1.0 + 4.0 / 256};
            em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(4), h);
            tu_check("f32 -> f16 rne", em_cast(x, EM_F16), EM_SHAPE(4), rh, 0);
            tu_check("f32 -> bf16 rne", em_cast(x, EM_BF16), EM_SHAPE(4), rb, 0);
        }
        double neg[3] = {-2.75, 0.5, -0.25}, rn[3] = {-2, 0, 0};
        tu_check("f32 -> i32 truncates", em_cast(tu_tensor(dev, EM_F32, EM_SHAPE(3), neg), EM_I32), EM_SHAPE(3), rn, 0);
        double rb[3] = {1, 1, 1};
        tu_check("f32 -> bool", em_cast(tu_tensor(dev, EM_F32, EM_SHAPE(3), neg), EM_BOOL), EM_SHAPE(3), rb, 0);
        em_scope_end(NULL, 0);
    }
}

/* Zero-size and 0-d tensors. */
static void test_zero_size_and_scalars(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *z = em_zeros(dev, EM_F32, EM_SHAPE(3, 0, 2));
        em_tensor *y = em_exp(em_add(z, em_ones(dev, EM_F32, EM_SHAPE(2))));
        assert_non_null(y);
        assert_int_equal(em_numel(y), 0);
        assert_int_equal(em_dim(y, 1), 0);
        double a = 2, b = 3, r = 8;
        em_tensor *s = em_pow(tu_tensor(dev, EM_F32, EM_SHAPE(), &a), tu_tensor(dev, EM_F32, EM_SHAPE(), &b));
        assert_int_equal(em_rank(s), 0);
        tu_check("0-d pow", s, EM_SHAPE(), &r, 1e-6);
        assert_true(em_item(s) == 8.0);
        em_scope_end(NULL, 0);
    }
}

/* Output views inside a larger buffer: the guard region around them stays untouched. */
static void test_sentinel_guards(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        /* a 6 x 7 guard buffer; the output is the 3 x 5 window at (2, 1) with row stride 7 */
        em_tensor *buf = em_full(dev, EM_F32, EM_SHAPE(6, 7), 1234.5);
        em_tensor *win = em_narrow(em_narrow(buf, 0, 2, 3), 1, 1, 5);
        double v[15];
        tu_fill(v, 15, -1, 1, 3);
        em_tensor *src = tu_tensor(dev, EM_F32, EM_SHAPE(3, 5), v);
        em_status cs = em_copy_(win, em_exp(src));
        if (cs != EM_OK) fprintf(stderr, "copy_: %s\n", em_last_error());
        assert_int_equal(cs, EM_OK);
        double *all = tu_read(buf);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 7; j++) {
                bool inside = i >= 2 && i < 5 && j >= 1 && j < 6;
                double want = inside ? (float)exp(v[(i - 2) * 5 + j - 1]) : 1234.5;
                if (fabs(all[i * 7 + j] - want) > 1e-5 * fabs(want)) fail_msg("guard (%d, %d): %g vs %g", i, j, all[i * 7 + j], want);
            }
        free(all);
        em_scope_end(NULL, 0);
    }
}

/* em_take lets an op write into its donated input's buffer. */
static void test_take_reuses_buffer(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        double v[4] = {1, 2, 3, 4}, ref[4];
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(4), v);
        em_tensor *y = em_exp(x);
        em_pool_stats before, after;
        em_device_pool_stats(dev, &before);
        em_tensor *z = em_neg(em_take(y)); /* y is consumed: z reuses its buffer */
        em_device_pool_stats(dev, &after);
        assert_int_equal(after.allocs, before.allocs);
        for (int i = 0; i < 4; i++) ref[i] = -(float)exp(v[i]);
        tu_check("neg(take(exp))", z, EM_SHAPE(4), ref, 1e-6);
        em_release(z);
        em_release(x);
    }
}

/* One tensor of more than 2^24 elements (cpu: fast enough). */
static void test_large_tensor(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    if (!tu_is_cpu(dev)) return;
    em_scope_begin();
    int64_t n = (1 << 24) + 37;
    em_tensor *x = em_arange(dev, EM_F32, 0, (double)n, 1);
    em_tensor *y = em_add_scalar(em_mul_scalar(x, 0.5), 1);
    em_tensor *last = em_narrow(y, 0, n - 2, 2);
    double ref[2] = {(float)((float)((double)(n - 2) * 0.5) + 1.0f), (float)((float)((double)(n - 1) * 0.5) + 1.0f)};
    tu_check("large", last, EM_SHAPE(2), ref, 1e-7);
    double s = em_item(em_sum(em_ones(dev, EM_F32, EM_SHAPE(n)), NULL, 0, false));
    assert_true(fabs(s - (double)n) <= 2); /* f32 sums: 2^24 + 37 rounds */
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_floats),
        cmocka_unit_test(test_unary_params_and_predicates),
        cmocka_unit_test(test_binary_broadcast_views),
        cmocka_unit_test(test_type_promotion),
        cmocka_unit_test(test_logical_where_masked_fill),
        cmocka_unit_test(test_cast_all_pairs),
        cmocka_unit_test(test_zero_size_and_scalars),
        cmocka_unit_test(test_sentinel_guards),
        cmocka_unit_test(test_take_reuses_buffer),
        cmocka_unit_test(test_large_tensor),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
