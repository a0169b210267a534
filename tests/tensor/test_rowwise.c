/* test_rowwise.c — the row-wise fast path of the reductions (src/kernels/tensor_rowwise.ek,
 * chosen in src/tensor/ops_reduce.c): softmax, log_softmax, layer_norm, rms_norm, sum and mean
 * over contiguous last dims, on every device present, against float64 references computed from
 * the values the device holds. Row lengths straddle every boundary of the host's plan (a part of
 * a plane, a plane, a cube per row, registers, the streamed walk past 16384 elements, 16-byte
 * lines or narrower); every float dtype; views whose offset or row stride break the lines'
 * alignment (narrowed on either dim), or keep it with a row stride larger than the row; rows
 * broadcast with stride 0; the last two dims at once; row counts that leave cubes part empty;
 * and rows holding NaN, +Inf and -Inf. */
#include "tensor_util.h"

enum { OPS = 6 };
static const char *const op_names[OPS] = {"softmax",  "log_softmax", "layer_norm",
                                          "rms_norm", "sum",         "mean"};

/* References for the rows x n values of x (row r at x + r * n) into ref[op] (rows x n, or rows
 * for sum and mean); w, b: the affine parameters (n each). Written as the textbook formulas, so
 * NaN and Inf propagate as IEEE arithmetic makes them. */
static void reference(const double *x, int64_t rows, int64_t n, const double *w, const double *b,
                      double **ref)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n;
        double m = -INFINITY, s = 0, sum = 0, ms = 0, var = 0;
        for (int64_t j = 0; j < n; j++) {
            if (xr[j] > m) m = xr[j];
            sum += xr[j];
            ms += xr[j] * xr[j];
        }
        for (int64_t j = 0; j < n; j++) s += exp(xr[j] - m);
        double mean = sum / (double)n;
        for (int64_t j = 0; j < n; j++) var += (xr[j] - mean) * (xr[j] - mean);
        var /= (double)n;
        ms /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            ref[0][r * n + j] = exp(xr[j] - m) / s;
            ref[1][r * n + j] = xr[j] - m - log(s);
            ref[2][r * n + j] = (xr[j] - mean) / sqrt(var + 1e-5) * w[j] + b[j];
            ref[3][r * n + j] = xr[j] / sqrt(ms + 1e-6) * w[j];
        }
        ref[4][r] = sum;
        ref[5][r] = mean;
    }
}

/* The tolerance of op for dtype dt on dev (normalized by max(1, |ref|), as tu_close_n). Sums
 * get room for their rounding: relative to 1 + the sum of |x| of the row (the worst row). */
static double tolerance(em_device *dev, em_scalar dt, int op, const double *x, int64_t rows,
                        int64_t n)
{
    double t = tu_tol_on(dev, dt);
    if (op == 0) return t * 2;
    if (op == 1) return dt == EM_F16 ? 0.5 : dt == EM_BF16 ? 2 : t * 20;
    if (op <= 3) return t * 4;
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double a = 0;
        for (int64_t j = 0; j < n; j++) a += isfinite(x[r * n + j]) ? fabs(x[r * n + j]) : 0;
        if (a > worst) worst = a;
    }
    return t * 4 * (1 + (op == 5 ? worst / (double)n : worst));
}

/* Runs op on xt (rows x n over the last dim, or over the last two dims of [rows, 2, n / 2] when
 * two_dims) and checks it against ref. */
static void check_op(em_device *dev, em_scalar dt, int op, const em_tensor *xt, bool two_dims,
                     const em_tensor *wt, const em_tensor *bt, const double *ref, double tol,
                     int64_t rows, int64_t n, const char *how)
{
    int k = two_dims ? 2 : 1;
    int dims[2] = {-1, -2};
    em_tensor *y = NULL;
    switch (op) {
    case 0:
        y = em_softmax(xt, -1);
        break;
    case 1:
        y = em_log_softmax(xt, -1);
        break;
    case 2:
        y = em_layer_norm(xt, k, wt, bt, 1e-5);
        break;
    case 3:
        y = em_rms_norm(xt, k, wt, 1e-6);
        break;
    case 4:
        y = em_sum(xt, dims, k, false);
        break;
    default:
        y = em_mean(xt, dims, k, false);
        break;
    }
    char what[160];
    snprintf(what, sizeof what, "%s %s rows %lld n %lld (%s)", op_names[op], em_scalar_name(dt),
             (long long)rows, (long long)n, how);
    if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_non_null(y);
    assert_int_equal(em_numel(y), op >= 4 ? rows : rows * n);
    double *got = tu_read(y);
    bool ok = tu_close_n(what, got, ref, (size_t)em_numel(y), tol);
    free(got);
    if (!ok) fail_msg("%s on %s", what, em_device_name(dev));
}

/* The views tested: how the rows x n input sits in its storage. */
typedef enum layout {
    L_CONTIG,    /* [rows, n] */
    L_COL_OFF1,  /* [rows, n + 3] narrowed to columns 1 .. n: offset 1, row stride n + 3 */
    L_ROW_OFF,   /* [rows + 1, n] narrowed to rows 1 ..: offset n */
    L_COL_OFF4,  /* [rows, n + 8] narrowed to columns 4 .. n + 3: aligned to 4, row stride n + 8 */
    L_BROADCAST, /* one row [1, n] expanded to [rows, n]: row stride 0 */
    L_TWO_DIMS,  /* [rows, 2, n / 2], the last two dims reduced together (n even) */
    L_COUNT
} layout;
static const char *const layout_names[L_COUNT] = {"contiguous",     "narrowed columns from 1",
                                                  "narrowed rows",  "narrowed columns from 4",
                                                  "broadcast rows", "last two dims"};

/* Builds the input of layout lay from the host values in x (rows x n; overwritten with what the
 * device holds) and checks every op on it. Values of the storage outside the view are filler. */
static void run_layout(em_device *dev, em_scalar dt, int64_t rows, int64_t n, layout lay, double *x,
                       uint32_t seed)
{
    em_scope_begin();
    int64_t srows = lay == L_ROW_OFF ? rows + 1 : lay == L_BROADCAST ? 1 : rows;
    int64_t scols = lay == L_COL_OFF1 ? n + 3 : lay == L_COL_OFF4 ? n + 8 : n;
    int64_t c0 = lay == L_COL_OFF1 ? 1 : lay == L_COL_OFF4 ? 4 : 0, r0 = lay == L_ROW_OFF ? 1 : 0;
    double *st = malloc((size_t)(srows * scols) * sizeof(double));
    assert_non_null(st);
    tu_fill(st, (size_t)(srows * scols), -7, 7, seed ^ 0x5a5a);
    for (int64_t r = 0; r < srows - r0; r++)
        for (int64_t j = 0; j < n; j++)
            st[(r + r0) * scols + c0 + j] = x[(lay == L_BROADCAST ? 0 : r) * n + j];
    em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(srows, scols), st);
    /* read back what the device holds (rounded to dt) into x */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++)
            x[r * n + j] = st[((lay == L_BROADCAST ? 0 : r) + r0) * scols + c0 + j];
    em_tensor *xt = s;
    if (lay == L_COL_OFF1 || lay == L_COL_OFF4) xt = em_narrow(s, 1, c0, n);
    if (lay == L_ROW_OFF) xt = em_narrow(s, 0, 1, rows);
    if (lay == L_BROADCAST) xt = em_expand(s, EM_SHAPE(rows, n));
    if (lay == L_TWO_DIMS) xt = em_view(s, EM_SHAPE(rows, 2, n / 2));
    assert_non_null(xt);
    /* weight and bias: narrowed from 1 for the layouts that break alignment, so they do too */
    int64_t wo = lay == L_COL_OFF1 ? 1 : 0;
    double *wb = malloc((size_t)(2 * (n + 1)) * sizeof(double));
    assert_non_null(wb);
    tu_fill(wb, (size_t)(2 * (n + 1)), 0.5, 1.5, seed + 1);
    for (int64_t j = 0; j < n + 1; j++) wb[n + 1 + j] -= 1; /* bias in [-0.5, 0.5) */
    em_tensor *ws = tu_tensor(dev, dt, EM_SHAPE(n + 1), wb),
              *bs = tu_tensor(dev, dt, EM_SHAPE(n + 1), wb + n + 1);
    em_tensor *wt = em_narrow(ws, 0, wo, n), *bt = em_narrow(bs, 0, wo, n);
    if (lay == L_TWO_DIMS) {
        wt = em_view(wt, EM_SHAPE(2, n / 2));
        bt = em_view(bt, EM_SHAPE(2, n / 2));
    }
    assert_non_null(wt);
    assert_non_null(bt);
    double *ref[OPS];
    for (int op = 0; op < OPS; op++) {
        ref[op] = malloc((size_t)(rows * n) * sizeof(double));
        assert_non_null(ref[op]);
    }
    reference(x, rows, n, wb + wo, wb + n + 1 + wo, ref);
    for (int op = 0; op < OPS; op++) {
        if (lay == L_TWO_DIMS && op <= 1) continue; /* softmax takes one dim */
        check_op(dev, dt, op, xt, lay == L_TWO_DIMS, wt, bt, ref[op],
                 tolerance(dev, dt, op, x, rows, n), rows, n, layout_names[lay]);
    }
    for (int op = 0; op < OPS; op++) free(ref[op]);
    free(wb);
    free(st);
    em_scope_end(NULL, 0);
}

/* Random rows of n values in [-3, 3), with one large value (softmax must subtract the maximum). */
static double *random_rows(int64_t rows, int64_t n, uint32_t seed)
{
    double *x = malloc((size_t)(rows * n) * sizeof(double));
    assert_non_null(x);
    tu_fill(x, (size_t)(rows * n), -3, 3, seed);
    x[(rows / 2) * n + n / 2] = 1000;
    return x;
}

/* Every row length of the plan's boundaries in f32 on contiguous rows, with 5 rows (cubes of
 * several rows are left part empty). */
static void test_lengths_f32(void **state)
{
    (void)state;
    static const int64_t lengths[] = {1,   3,    4,    5,    31,   32,    33,   127,
                                      768, 1000, 1024, 3072, 4097, 10000, 20000};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t i = 0; i < EM_ARRAY_LEN(lengths); i++) {
            double *x = random_rows(5, lengths[i], (uint32_t)i + 1);
            run_layout(tu_devs[di], EM_F32, 5, lengths[i], L_CONTIG, x, (uint32_t)i + 1);
            free(x);
        }
}

/* f16, bf16 and f64 (lines of 8 and 2 lanes) over a subset of the lengths. */
static void test_lengths_dtypes(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F16, EM_BF16, EM_F64};
    static const int64_t lengths[] = {3, 8, 33, 768, 1000, 4097, 20000};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++) {
            if (!tu_has(tu_devs[di], dts[t])) continue;
            for (size_t i = 0; i < EM_ARRAY_LEN(lengths); i++) {
                double *x = random_rows(3, lengths[i], (uint32_t)(i * 7 + t));
                run_layout(tu_devs[di], dts[t], 3, lengths[i], L_CONTIG, x, (uint32_t)(i * 7 + t));
                free(x);
            }
        }
}

/* Views: offsets and row strides that break or keep the lines' alignment, broadcast rows, and
 * two dims reduced together, in f32 and f16. */
static void test_views(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F32, EM_F16};
    static const int64_t lengths[] = {4, 32, 1000, 3072};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++) {
            if (!tu_has(tu_devs[di], dts[t])) continue;
            for (size_t i = 0; i < EM_ARRAY_LEN(lengths); i++)
                for (int lay = L_COL_OFF1; lay < L_COUNT; lay++) {
                    double *x = random_rows(6, lengths[i], (uint32_t)(lay * 31 + i));
                    run_layout(tu_devs[di], dts[t], 6, lengths[i], (layout)lay, x,
                               (uint32_t)(lay * 31 + i));
                    free(x);
                }
        }
}

/* Rows with NaN, +Inf and -Inf: NaN spreads to the whole row of softmax and the norms; an -Inf
 * entry is 0 after softmax (-Inf after log_softmax) while the row's maximum is finite; a row of
 * -Inf only, or one with +Inf, is NaN after softmax; sums follow IEEE arithmetic. */
static void test_nan_inf(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F32, EM_F16};
    static const int64_t lengths[] = {5, 33, 1000, 20000};
    enum { ROWS = 7 };
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++)
            for (size_t i = 0; i < EM_ARRAY_LEN(lengths); i++) {
                int64_t n = lengths[i];
                double *x = random_rows(ROWS, n, (uint32_t)(i + 40));
                x[0 * n + n / 3] = NAN;
                x[1 * n + 0] = INFINITY;
                for (int64_t j = 0; j < n; j += 7) x[2 * n + j] = -INFINITY;
                for (int64_t j = 0; j < n; j++) x[3 * n + j] = -INFINITY;
                x[4 * n + n - 1] = INFINITY;
                x[4 * n + n / 2] = -INFINITY;
                for (int64_t j = 1; j < n; j++)
                    x[5 * n + j] = -INFINITY; /* only the first entry left */
                run_layout(tu_devs[di], dts[t], ROWS, n, L_CONTIG, x, (uint32_t)(i + 40));
                free(x);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lengths_f32),
        cmocka_unit_test(test_lengths_dtypes),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_nan_inf),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
