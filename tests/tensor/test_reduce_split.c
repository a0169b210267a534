/* test_reduce_split.c — reductions over few, long rows split over several cubes
 * (tensor_reduce_split, then tensor_reduce_combine; reduce_split_for in
 * src/tensor/ops_reduce.c) on every device present: sum, mean, prod, max, min, argmax, argmin,
 * all and any over rows of 1 to 100000 elements (around the 4096 threshold too), in every float
 * dtype the device holds and i32/i64, with ties at chunk borders, NaN, +-inf, several reduced
 * dims, a strided view and a pending (fused) input. Each result is checked against a float64
 * host reference and against the single-pass kernel (EMBER_REDUCE_SPLIT=off): equal for
 * max/min/argmax/argmin/all/any and integer sums, within float tolerance for float sums, means
 * and products. The launch profiler tells whether the split ran (one launch of each pass), so a
 * choice that never splits fails. */
#include "tensor_util.h"
#include "ember/runtime.h"

enum { O_SUM, O_MEAN, O_PROD, O_MAX, O_MIN, O_ARGMAX, O_ARGMIN, O_ALL, O_ANY, O_COUNT };
static const char *const op_names[O_COUNT] = {"sum", "mean", "prod", "max", "min",
                                              "argmax", "argmin", "all", "any"};

/* Launches of kernel `name` since the last em_profile_reset. */
static uint64_t launches_of(const char *name)
{
    em_profile_kernel k;
    return em_profile_kernel_get(name, &k) ? k.launches : 0;
}

/* Sets EMBER_REDUCE_SPLIT (NULL: unset, the automatic choice). */
static void set_split(const char *v)
{
    if (v) setenv("EMBER_REDUCE_SPLIT", v, 1);
    else unsetenv("EMBER_REDUCE_SPLIT");
}

/* Runs op over the last dim of x (keepdim false). */
static em_tensor *run_op(int op, const em_tensor *x)
{
    int d = -1;
    switch (op) {
    case O_SUM: return em_sum(x, &d, 1, false);
    case O_MEAN: return em_mean(x, &d, 1, false);
    case O_PROD: return em_prod(x, &d, 1, false);
    case O_MAX: return em_max(x, &d, 1, false);
    case O_MIN: return em_min(x, &d, 1, false);
    case O_ARGMAX: return em_argmax(x, -1, false);
    case O_ARGMIN: return em_argmin(x, -1, false);
    case O_ALL: return em_all(x, &d, 1, false);
    default: return em_any(x, &d, 1, false);
    }
}

/* Whether (b at bi) beats (a at ai) in a max (maxi) or min search, as the kernels decide: NaN
 * wins, then the larger (smaller) value, ties to the lower index. */
static bool better(double a, double b, bool maxi)
{
    if (isnan(b) != isnan(a)) return isnan(b);
    if (isnan(a) || b == a) return false; /* the earlier index stays */
    return maxi ? b > a : b < a;
}

/* The float64 reference of op over row x[0..n); *mag receives the sum of |x| (a sum's scale). */
static double ref_row(int op, const double *x, int64_t n, double *mag)
{
    double acc = op == O_PROD || op == O_ALL ? 1 : 0, a = 0;
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        a += fabs(x[i]);
        switch (op) {
        case O_SUM: case O_MEAN: acc += x[i]; break;
        case O_PROD: acc *= x[i]; break;
        case O_ALL: acc = acc && x[i] != 0; break;
        case O_ANY: acc = acc || x[i] != 0; break;
        default:
            if (better(x[best], x[i], op == O_MAX || op == O_ARGMAX)) best = i;
        }
    }
    *mag = a;
    if (op == O_MEAN) return acc / (double)n;
    if (op == O_MAX || op == O_MIN) return x[best];
    if (op == O_ARGMAX || op == O_ARGMIN) return (double)best;
    return acc;
}

/* Whether op's results must be bit-equal between the split and the single pass on dt. */
static bool exact(int op, em_scalar dt)
{
    return !em_scalar_is_float(dt) || !(op == O_SUM || op == O_MEAN || op == O_PROD);
}

/* Runs op on x (rows x n values, host copy xv) under EMBER_REDUCE_SPLIT=mode (NULL: automatic),
 * checks it against the reference and the single pass (off), and that the split ran exactly
 * when `split` says (two launches, no single-pass tensor_reduce). */
static void check(em_device *dev, int op, const em_tensor *x, const double *xv, int64_t rows, int64_t n,
                  const char *mode, bool split, const char *what)
{
    em_scalar dt = em_dtype(x);
    double *ref = malloc((size_t)rows * sizeof(double));
    assert_non_null(ref);
    double tol = tu_tol_on(dev, dt);
    for (int64_t r = 0; r < rows; r++) {
        double mag;
        ref[r] = ref_row(op, xv + r * n, n, &mag);
        /* f32 accumulation (f64 for f64) of values whose |x| sum to mag: an absolute error of
         * about 2e-6 mag (1e-13 for f64), as a tolerance relative to max(1, |ref|) (tu_close_n),
         * plus the rounding to dt */
        if (em_scalar_is_float(dt) && (op == O_SUM || op == O_MEAN) && isfinite(ref[r])) {
            double acc = (dt == EM_F64 ? 1e-13 : 2e-6) * (op == O_MEAN ? mag / (double)n : mag);
            acc /= fabs(ref[r]) > 1 ? fabs(ref[r]) : 1;
            if (tol < acc + tu_tol_on(dev, dt)) tol = acc + tu_tol_on(dev, dt);
        }
    }
    char msg[200];
    snprintf(msg, sizeof msg, "%s %s %s [%lld, %lld] split=%s", what, op_names[op], em_scalar_name(dt),
             (long long)rows, (long long)n, mode ? mode : "auto");
    em_scope_begin();
    set_split(mode);
    em_profile_reset();
    em_tensor *y = run_op(op, x);
    double *got = tu_read(y);
    uint64_t p1 = launches_of("tensor_reduce_split"), p2 = launches_of("tensor_reduce_combine"),
             one = launches_of("tensor_reduce");
    set_split("off");
    em_tensor *z = run_op(op, x);
    double *single = tu_read(z);
    uint64_t p1_off = launches_of("tensor_reduce_split");
    set_split(NULL);
    if (split ? p1 != 1 || p2 != 1 || one != 0 : p1 != 0 || p2 != 0)
        fail_msg("%s on %s: %llu split, %llu combine, %llu single-pass launches (split expected: %d)", msg,
                 em_device_name(dev), (unsigned long long)p1, (unsigned long long)p2, (unsigned long long)one,
                 split);
    if (p1_off != p1) fail_msg("%s: EMBER_REDUCE_SPLIT=off still split", msg);
    tu_check(msg, y, EM_SHAPE(rows), ref, tol);
    if (exact(op, dt)) {
        for (int64_t r = 0; r < rows; r++) {
            bool same = (isnan(got[r]) && isnan(single[r])) || got[r] == single[r];
            if (!same)
                fail_msg("%s row %lld: split %.17g, single pass %.17g", msg, (long long)r, got[r], single[r]);
        }
    } else {
        tu_check(msg, z, EM_SHAPE(rows), ref, tol);
    }
    free(got);
    free(single);
    free(ref);
    em_scope_end(NULL, 0);
}

/* Values for op: random in [-2, 2) (rounded to dt by tu_tensor); for prod, mostly 1 with a few
 * 2, 0.5 and -1 (exact products); for all, nonzero but a zero in the last row's last place; for
 * any, zeros but a one in the first row's middle. Integers: round to [-1000, 1000). */
static void fill_for(int op, em_scalar dt, double *v, int64_t rows, int64_t n, uint32_t seed)
{
    size_t total = (size_t)(rows * n);
    tu_fill(v, total, -2, 2, seed);
    for (size_t i = 0; i < total; i++) {
        if (!em_scalar_is_float(dt)) v[i] = floor(v[i] * 500);
        if (op == O_PROD) v[i] = i % 997 == 5 ? 2 : i % 1009 == 7 ? 0.5 : i % 1499 == 3 ? -1 : 1;
        if (op == O_ALL) v[i] = v[i] == 0 ? 1 : v[i];
        if (op == O_ANY) v[i] = 0;
    }
    if (op == O_ALL) v[total - 1] = 0;
    if (op == O_ANY) v[n / 2] = 1;
}

/* Whether dev is a CPU emulator of a GPU API (PoCL, lavapipe), where many kernels are slow to
 * build: fewer cases run there. */
static bool slow(em_device *dev) { return !tu_is_cpu(dev); }

/* Whether the automatic choice splits rows x n on dev (reduce_split_for's rule). */
static bool auto_splits(em_device *dev, int64_t rows, int64_t n)
{
    const em_caps *c = em_device_caps(dev);
    int64_t cu = c && c->compute_units ? c->compute_units : 1;
    return n >= 4096 && rows < cu && n / 2048 >= 2;
}

/* Every op on every float dtype over long rows, forced into 5 chunks and by the automatic
 * choice; lengths around the threshold and a single element. */
static void test_float_ops(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 50257}, {2, 100000}, {3, 4097}, {1, 1},
                                        {1, 4095}, {1, 4096}, {1, 4097}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt) || (slow(dev) && dt == EM_F64)) continue;
            for (size_t si = 0; si < EM_ARRAY_LEN(shapes); si++) {
                int64_t rows = shapes[si][0], n = shapes[si][1];
                if (slow(dev) && (dt != EM_F32 ? si != 0 : si > 3)) continue;
                double *v = malloc((size_t)(rows * n) * sizeof(double));
                assert_non_null(v);
                for (int op = 0; op < O_COUNT; op++) {
                    fill_for(op, dt, v, rows, n, (uint32_t)(si * 16 + op + 1));
                    em_tensor *x = tu_tensor(dev, dt, EM_SHAPE(rows, n), v);
                    check(dev, op, x, v, rows, n, "5", n >= 2, "forced");
                    check(dev, op, x, v, rows, n, NULL, auto_splits(dev, rows, n), "auto");
                    em_release(x);
                }
                free(v);
            }
        }
    }
}

/* i32 and i64 inputs: sums (to i64), products, extremes and their indices, all, any. */
static void test_int_ops(void **state)
{
    (void)state;
    static const em_scalar types[] = {EM_I32, EM_I64};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(types); ti++) {
            em_scalar dt = types[ti];
            if (!tu_has(dev, dt) || (slow(dev) && dt == EM_I64)) continue;
            int64_t rows = 2, n = 30011;
            double *v = malloc((size_t)(rows * n) * sizeof(double));
            assert_non_null(v);
            for (int op = 0; op < O_COUNT; op++) {
                if (op == O_MEAN) continue; /* floats only */
                fill_for(op, dt, v, rows, n, (uint32_t)(op + 77));
                em_tensor *x = tu_tensor(dev, dt, EM_SHAPE(rows, n), v);
                check(dev, op, x, v, rows, n, "7", true, "ints");
                em_release(x);
            }
            free(v);
        }
    }
}

/* Ties for the extremes at and across chunk borders (n = 10000 in 4 chunks of 2500, and in 1000
 * of 10), NaN, +inf and -inf: argmax/argmin keep the first index, NaN wins as in the single pass. */
static void test_ties_nan_inf(void **state)
{
    (void)state;
    enum { N = 10000, L = 2500 };
    static double v[N];
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int c = 0; c < 9; c++) {
            for (int i = 0; i < N; i++) v[i] = (double)(i % 7) - 3; /* in [-3, 3] */
            const char *what = "";
            switch (c) {
            case 0: v[L - 1] = v[L] = 9; v[L - 1 + 2 * L] = -9; v[2 * L] = -9; what = "tie across a border"; break;
            case 1: v[L] = v[3 * L] = 9; v[2 * L] = v[3 * L] = -9; what = "ties at chunk starts"; break;
            case 2: v[N - 1] = 9; v[N - 2] = -9; what = "last element"; break;
            case 3: for (int i = 0; i < N; i++) v[i] = 1; what = "all equal"; break;
            case 4: v[7000] = NAN; v[3000] = NAN; v[L] = 9; what = "NaNs"; break;
            case 5: for (int i = 0; i < N; i++) v[i] = -INFINITY; what = "all -inf"; break;
            case 6: v[6000] = INFINITY; v[6001] = INFINITY; v[4] = -INFINITY; what = "+-inf"; break;
            case 7: v[L] = NAN; v[L - 1] = INFINITY; what = "NaN at a border"; break;
            default: v[0] = 9; v[N - 1] = 9; v[1] = -9; v[N - 2] = -9; what = "first and last"; break;
            }
            static const em_scalar types[] = {EM_F32, EM_BF16};
            for (size_t ti = 0; ti < EM_ARRAY_LEN(types); ti++) {
                if (!tu_has(dev, types[ti]) || (slow(dev) && ti > 0)) continue;
                double w[N];
                memcpy(w, v, sizeof w);
                em_tensor *x = tu_tensor(dev, types[ti], EM_SHAPE(1, N), w);
                static const int ops[] = {O_ARGMAX, O_ARGMIN, O_MAX, O_MIN, O_SUM};
                for (size_t oi = 0; oi < EM_ARRAY_LEN(ops); oi++) {
                    check(dev, ops[oi], x, w, 1, N, "4", true, what);
                    /* 1000 chunks of 10: pass 2's units each combine several partials */
                    check(dev, ops[oi], x, w, 1, N, "1000", true, what);
                }
                em_release(x);
            }
        }
    }
}

/* Several reduced dims ([2, 3, 5000] over dims 1 and 2), a reduced dim that is not last (argmax
 * of [6000, 3] over dim 0), keepdim, and a pending input (fusion: x * x for sum, which keeps the
 * single-pass row-wise kernel with its prologue, and x + 1 for argmax, realized and split). */
static void test_views_pending(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        set_split("6");
        /* [2, 3, 5000] over dims 1, 2 with keepdim */
        double *v = malloc(30000 * sizeof(double)), ref[6];
        assert_non_null(v);
        tu_fill(v, 30000, -2, 2, 5);
        v[2 * 5000 + 4321] = 7; /* row 0's maximum, at flat index 14321 of its 15000 */
        v[15000 + 77] = 7;
        v[15000 + 14999] = 7;
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(2, 3, 5000), v);
        em_profile_reset();
        em_tensor *m = em_max(x, (int[]){1, 2}, 2, true), *s = em_sum(x, (int[]){1, 2}, 2, false);
        for (int r = 0; r < 2; r++) {
            double mag;
            ref[r] = 7;
            ref[2 + r] = ref_row(O_SUM, v + r * 15000, 15000, &mag);
        }
        tu_check("max over dims 1, 2", m, EM_SHAPE(2, 1, 1), ref, 0);
        tu_check("sum over dims 1, 2", s, EM_SHAPE(2), ref + 2, 1e-4);
        if (launches_of("tensor_reduce_split") != 2 || launches_of("tensor_reduce_combine") != 2)
            fail_msg("dims 1, 2 on %s: not split", em_device_name(dev));
        /* argmax over dim 0 of [6000, 3] (the reduced dim strided) */
        em_tensor *c = em_view(x, EM_SHAPE(6000, 5));
        em_tensor *a = em_argmax(em_narrow(c, 1, 1, 3), 0, false);
        for (int j = 0; j < 3; j++) {
            int64_t best = 0;
            for (int64_t i = 1; i < 6000; i++)
                if (better(v[best * 5 + 1 + j], v[i * 5 + 1 + j], true)) best = i;
            ref[j] = (double)best;
        }
        tu_check("argmax over dim 0 of a strided view", a, EM_SHAPE(3), ref, 0);
        /* pending inputs (with fusion on; else plain ops) */
        em_profile_reset();
        em_tensor *sq = em_mul(x, x), *ss = em_sum(em_view(sq, EM_SHAPE(1, 30000)), (int[]){-1}, 1, false);
        double want = 0;
        for (int i = 0; i < 30000; i++) want += v[i] * v[i];
        tu_check("sum of a pending x * x", ss, EM_SHAPE(1), &want, 1e-5);
        uint64_t split_sum = launches_of("tensor_reduce_split");
        em_tensor *ax = em_argmax(em_add_scalar(x, 1), -1, false);
        double aref[6];
        for (int r = 0; r < 6; r++) {
            double mag;
            aref[r] = ref_row(O_ARGMAX, v + r * 5000, 5000, &mag);
        }
        tu_check("argmax of a pending x + 1", ax, EM_SHAPE(2, 3), aref, 0);
        bool fusing = getenv("EMBER_FUSION") == NULL || strcmp(getenv("EMBER_FUSION"), "0") != 0;
        if ((fusing && split_sum != 0) || launches_of("tensor_reduce_split") != split_sum + 1)
            fail_msg("pending inputs on %s: %llu split launches for the sum, %llu in all", em_device_name(dev),
                     (unsigned long long)split_sum, (unsigned long long)launches_of("tensor_reduce_split"));
        set_split(NULL);
        free(v);
        em_scope_end(NULL, 0);
    }
}

static int setup(void **state)
{
    em_profile_enable(true);
    return tu_setup(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_ops),
        cmocka_unit_test(test_int_ops),
        cmocka_unit_test(test_ties_nan_inf),
        cmocka_unit_test(test_views_pending),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
