/* test_reduce_cols.c — the column path of the reductions (src/kernels/tensor_cols.ek, chosen in
 * src/tensor/ops_reduce.c): sum and mean over leading dims whose kept dims are one contiguous
 * inner block, as bias gradients are ([R, C] over dim 0, [B, T, C] over dims 0 and 1), on every
 * device present, against float64 references computed from the values the device holds. Row
 * counts from 1 to past 16384 (one slice of rows, several slices and the second launch over the
 * partials), column counts that leave tiles and lines part empty, every float dtype, keepdim,
 * and views: narrowed columns or rows (offsets and row strides that break the lines' alignment),
 * broadcast rows (row stride 0), and transposed or permuted inputs, which take the general
 * kernel. The launch profiler tells which kernel ran, so a plan that never takes the path fails. */
#include "tensor_util.h"
#include "ember/runtime.h"

/* Column sums of the rows x n values x (row r at x + r * n), and the largest sum of |x| of a
 * column (for the tolerance). */
static double col_sums(const double *x, int64_t rows, int64_t n, double *ref)
{
    double worst = 0;
    for (int64_t j = 0; j < n; j++) {
        double s = 0, a = 0;
        for (int64_t r = 0; r < rows; r++) {
            s += x[r * n + j];
            a += fabs(x[r * n + j]);
        }
        ref[j] = s;
        if (a > worst) worst = a;
    }
    return worst;
}

/* Launches of kernel `name` since the last em_profile_reset. */
static uint64_t launches_of(const char *name)
{
    em_profile_kernel k;
    return em_profile_kernel_get(name, &k) ? k.launches : 0;
}

/* The views tested: how the rows x n input sits in its storage. */
typedef enum layout {
    L_CONTIG,     /* [rows, n], summed over dim 0 */
    L_THREE_D,    /* [rows / 4, 4, n] (rows a multiple of 4), summed over dims 0 and 1, keepdim */
    L_COL_OFF1,   /* [rows, n + 3] narrowed to columns 1 .. n: offset 1, row stride n + 3 */
    L_ROW_OFF,    /* [rows + 1, n] narrowed to rows 1 ..: offset n */
    L_BROADCAST,  /* one row [1, n] expanded to [rows, n]: row stride 0 */
    L_TRANSPOSED, /* [n, rows] transposed: the kept dim is not contiguous (general kernel) */
    L_PERMUTED,   /* [4, rows / 4, n] permuted to [rows / 4, 4, n]: the reduced dims do not
                   * merge (general kernel) */
    L_COUNT
} layout;
static const char *const layout_names[L_COUNT] = {
    "contiguous", "3-d over dims 0, 1", "narrowed columns from 1", "narrowed rows",
    "broadcast rows", "transposed", "permuted 3-d"};

/* Builds the input of layout lay holding the rows x n values x (overwritten with what the
 * device holds), runs sum (mean when mean) over the leading dims and checks the result and
 * which kernel ran. */
static void run_case(em_device *dev, em_scalar dt, int64_t rows, int64_t n, layout lay, bool mean,
                     uint32_t seed)
{
    em_scope_begin();
    double *x = malloc((size_t)(rows * n) * sizeof(double));
    double *ref = malloc((size_t)n * sizeof(double));
    assert_non_null(x);
    assert_non_null(ref);
    tu_fill(x, (size_t)(rows * n), -2, 2, seed);
    /* the storage: srows x scols values, the view's element (r, j) at st[sidx(r, j)] */
    int64_t srows = lay == L_ROW_OFF ? rows + 1 : lay == L_BROADCAST ? 1 : rows;
    int64_t scols = lay == L_COL_OFF1 ? n + 3 : n;
    if (lay == L_TRANSPOSED) {
        srows = n;
        scols = rows;
    }
    double *st = malloc((size_t)(srows * scols) * sizeof(double));
    assert_non_null(st);
    tu_fill(st, (size_t)(srows * scols), -9, 9, seed ^ 0x5a5a);
    int64_t q = rows / 4;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            int64_t at;
            switch (lay) {
            case L_COL_OFF1: at = r * scols + 1 + j; break;
            case L_ROW_OFF: at = (r + 1) * scols + j; break;
            case L_BROADCAST: at = j; break;
            case L_TRANSPOSED: at = j * scols + r; break;
            case L_PERMUTED: at = ((r % 4) * q + r / 4) * n + j; break; /* [4, q, n] at (r%4, r/4) */
            default: at = r * n + j; break;
            }
            st[at] = x[r * n + j];
        }
    em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(srows, scols), st);
    /* what the device holds (rounded to dt), back into x */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            int64_t at = lay == L_COL_OFF1 ? r * scols + 1 + j : lay == L_ROW_OFF ? (r + 1) * scols + j
                       : lay == L_BROADCAST ? j : lay == L_TRANSPOSED ? j * scols + r
                       : lay == L_PERMUTED ? ((r % 4) * q + r / 4) * n + j : r * n + j;
            x[r * n + j] = st[at];
        }
    em_tensor *xt = s;
    int dims[2] = {0, 1}, nd = 1;
    bool keepdim = false;
    em_shape want = EM_SHAPE(n);
    switch (lay) {
    case L_THREE_D:
        xt = em_view(s, EM_SHAPE(q, 4, n));
        nd = 2;
        keepdim = true;
        want = EM_SHAPE(1, 1, n);
        break;
    case L_COL_OFF1: xt = em_narrow(s, 1, 1, n); break;
    case L_ROW_OFF: xt = em_narrow(s, 0, 1, rows); break;
    case L_BROADCAST: xt = em_expand(s, EM_SHAPE(rows, n)); break;
    case L_TRANSPOSED: xt = em_transpose(s, 0, 1); break;
    case L_PERMUTED:
        xt = em_permute(em_view(s, EM_SHAPE(4, q, n)), (int[]){1, 0, 2}, 3);
        nd = 2;
        dims[0] = -2;
        dims[1] = -3;
        break;
    default: break;
    }
    assert_non_null(xt);
    double worst = col_sums(x, rows, n, ref);
    if (mean)
        for (int64_t j = 0; j < n; j++) ref[j] /= (double)rows;
    /* f32 accumulation of |x| up to `worst`, then the result rounded to dt */
    double tol = tu_tol_on(dev, dt) + 4e-7 * (mean ? worst / (double)rows : worst);
    em_profile_reset();
    em_tensor *y = mean ? em_mean(xt, dims, nd, keepdim) : em_sum(xt, dims, nd, keepdim);
    char what[160];
    snprintf(what, sizeof what, "%s %s rows %lld n %lld (%s)", mean ? "mean" : "sum",
             em_scalar_name(dt), (long long)rows, (long long)n, layout_names[lay]);
    tu_check(what, y, want, ref, dt == EM_F64 ? tu_tol_on(dev, dt) : tol);
    uint64_t cols = launches_of("tensor_cols_sum"), general = launches_of("tensor_reduce");
    /* a dim of size 1 drops out: [1, rows] transposed, or [4, 1, n] permuted, is a column case */
    bool fast = (lay != L_TRANSPOSED || n == 1) && (lay != L_PERMUTED || q == 1);
    if (fast ? cols < 1 || cols > 2 || general != 0 : cols != 0)
        fail_msg("%s on %s: %llu column launches, %llu general", what, em_device_name(dev),
                 (unsigned long long)cols, (unsigned long long)general);
    free(st);
    free(ref);
    free(x);
    em_scope_end(NULL, 0);
}

/* Whether dev is a CPU emulator of a GPU API (PoCL, lavapipe), where large cases are slow. */
static bool slow(em_device *dev) { return !tu_is_cpu(dev); }

/* f32 sums over dim 0 across row counts (1, odd, past a slice, past 16384) and column counts
 * (1, 3, 33: lines of one scalar; 768, 3072: full lines and tiles). */
static void test_sizes_f32(void **state)
{
    (void)state;
    static const int64_t rows[] = {1, 7, 1000, 16385}, cols[] = {1, 3, 33, 768, 3072};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t i = 0; i < EM_ARRAY_LEN(rows); i++)
            for (size_t j = 0; j < EM_ARRAY_LEN(cols); j++) {
                int64_t r = rows[i], c = cols[j];
                if (r * c > (slow(tu_devs[di]) ? 200000 : 13000000)) continue;
                run_case(tu_devs[di], EM_F32, r, c, L_CONTIG, false, (uint32_t)(i * 8 + j + 1));
            }
}

/* f16, bf16 and f64 (narrower and wider lines), sum and mean, 2-d and 3-d. */
static void test_dtypes(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F32, EM_F16, EM_BF16, EM_F64};
    static const int64_t rows[] = {8, 1000, 16388}, cols[] = {3, 33, 768};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++) {
            if (!tu_has(tu_devs[di], dts[t])) continue;
            for (size_t i = 0; i < EM_ARRAY_LEN(rows); i++)
                for (size_t j = 0; j < EM_ARRAY_LEN(cols); j++) {
                    int64_t r = rows[i], c = cols[j];
                    if (r * c > (slow(tu_devs[di]) ? 40000 : 13000000)) continue;
                    uint32_t seed = (uint32_t)(t * 64 + i * 8 + j);
                    run_case(tu_devs[di], dts[t], r, c, L_CONTIG, (i + j) % 2 == 1, seed);
                    run_case(tu_devs[di], dts[t], r, c, L_THREE_D, (i + j) % 2 == 0, seed + 7);
                }
        }
}

/* Views: narrowed columns (offset and row stride not multiples of a line), narrowed rows,
 * broadcast rows, and the transposed and permuted inputs the column path leaves to the general
 * kernel, in f32 and f16. */
static void test_views(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F32, EM_F16};
    static const int64_t rows[] = {4, 1000}, cols[] = {1, 32, 768};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++) {
            if (!tu_has(tu_devs[di], dts[t])) continue;
            for (size_t i = 0; i < EM_ARRAY_LEN(rows); i++)
                for (size_t j = 0; j < EM_ARRAY_LEN(cols); j++)
                    for (int lay = L_COL_OFF1; lay < L_COUNT; lay++) {
                        if (rows[i] * cols[j] > 40000 && slow(tu_devs[di])) continue;
                        run_case(tu_devs[di], dts[t], rows[i], cols[j], (layout)lay, lay % 2 == 0,
                                 (uint32_t)(lay * 31 + i * 5 + j));
                    }
        }
}

/* NaN and infinities reach the column's sum, and only that column's. */
static void test_nan_inf(void **state)
{
    (void)state;
    enum { R = 300, N = 40 };
    static double x[R * N], ref[N];
    for (int di = 0; di < tu_ndev; di++) {
        em_scope_begin();
        tu_fill(x, R * N, -1, 1, 9);
        x[17 * N + 3] = NAN;
        x[250 * N + 5] = INFINITY;
        x[0 * N + 6] = INFINITY;
        x[299 * N + 6] = -INFINITY;
        x[123 * N + 39] = -INFINITY;
        em_tensor *t = tu_tensor(tu_devs[di], EM_F32, EM_SHAPE(R, N), x);
        col_sums(x, R, N, ref);
        tu_check("sum nan/inf", em_sum(t, (int[]){0}, 1, false), EM_SHAPE(N), ref, 1e-5);
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
        cmocka_unit_test(test_sizes_f32),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_nan_inf),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
