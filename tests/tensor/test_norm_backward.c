/* test_norm_backward.c — em_norm_backward (tensor_grad.h): the gradients of layer_norm and
 * rms_norm, on every device present, against float64 references computed from the values the
 * device holds. Row lengths cross the row-wise plan's boundaries (a part of a plane, a plane, a
 * cube per row, lines held in registers, the streamed walk of long rows); row counts from one to
 * many rounds per group of units (the weight and bias sums meet across groups and cubes); with and
 * without a weight; each gradient alone; every float dtype; rows narrowed (unaligned, a row
 * stride past the row), transposed (the public-ops path), and normalized over two dims. The
 * one-launch kernel must be the path taken on the CPU and on devices with plane ops (the
 * profiler's count says which ran). Bad inputs get errors naming what is wrong. */
#include "tensor_util.h"

#include "ember/runtime.h"
#include "ember/tensor_grad.h"
#include "kernel/codegen/codegen.h"
#include "kernel/hopper_util.h"

/* The reference gradients of rows x n (x and g row-major, w of n or NULL): dx (rows x n), dw and
 * db (n each). */
static void reference(const double *x, const double *g, const double *w, int64_t rows, int64_t n,
                      double eps, bool rms, double *dx, double *dw, double *db)
{
    for (int64_t j = 0; j < n; j++) dw[j] = db[j] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n, *gr = g + r * n;
        double mean = 0, var = 0, mg = 0, mgx = 0;
        if (!rms) {
            for (int64_t j = 0; j < n; j++) mean += xr[j];
            mean /= (double)n;
        }
        for (int64_t j = 0; j < n; j++) var += (xr[j] - mean) * (xr[j] - mean);
        double rstd = 1 / sqrt(var / (double)n + eps);
        for (int64_t j = 0; j < n; j++) {
            double xh = (xr[j] - mean) * rstd, gh = gr[j] * (w ? w[j] : 1);
            mg += gh;
            mgx += gh * xh;
            dw[j] += gr[j] * xh;
            db[j] += gr[j];
        }
        mg = rms ? 0 : mg / (double)n;
        mgx /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            double xh = (xr[j] - mean) * rstd, gh = gr[j] * (w ? w[j] : 1);
            dx[r * n + j] = rstd * (gh - mg - xh * mgx);
        }
    }
}

/* How the rows x n input and gradient sit in their storage. */
typedef enum layout {
    L_CONTIG,     /* [rows, n] */
    L_NARROW,     /* [rows, n + 3] narrowed to columns 1 .. n: unaligned, row stride n + 3 */
    L_TRANSPOSED, /* [n, rows] transposed: the normalized dim strided (the public-ops path) */
    L_TWO_DIMS,   /* [rows, 2, n / 2], normalized over the last two dims */
} layout;
static const char *const layout_names[] = {"contiguous", "narrowed", "transposed", "last two dims"};

/* A rows x n view of layout lay holding v (rounded to dt in place). */
static em_tensor *make_view(em_device *dev, em_scalar dt, int64_t rows, int64_t n, layout lay, double *v,
                            uint32_t seed)
{
    if (lay == L_CONTIG) return tu_tensor(dev, dt, EM_SHAPE(rows, n), v);
    if (lay == L_TWO_DIMS) return em_view(tu_tensor(dev, dt, EM_SHAPE(rows, n), v), EM_SHAPE(rows, 2, n / 2));
    if (lay == L_NARROW) {
        double *s = malloc((size_t)(rows * (n + 3)) * sizeof(double));
        assert_non_null(s);
        tu_fill(s, (size_t)(rows * (n + 3)), -9, 9, seed ^ 0x77);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) s[r * (n + 3) + 1 + j] = v[r * n + j];
        em_tensor *t = tu_tensor(dev, dt, EM_SHAPE(rows, n + 3), s);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) v[r * n + j] = s[r * (n + 3) + 1 + j];
        free(s);
        return em_narrow(t, 1, 1, n);
    }
    double *s = malloc((size_t)(rows * n) * sizeof(double));
    assert_non_null(s);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) s[j * rows + r] = v[r * n + j];
    em_tensor *t = tu_tensor(dev, dt, EM_SHAPE(n, rows), s);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) v[r * n + j] = s[j * rows + r];
    free(s);
    return em_transpose(t, 0, 1);
}

/* Which gradients a case asks for. */
enum { WANT_DX = 1, WANT_DW = 2, WANT_DB = 4, WANT_ALL = 7 };

/* The count of tensor_norm_backward launches so far. */
static uint64_t kernel_launches(void)
{
    em_profile_kernel k;
    return em_profile_kernel_get("tensor_norm_backward", &k) ? k.launches : 0;
}

/* Runs one case and checks every gradient asked for (and that the others stay NULL). */
static void run_case_res(em_device *dev, em_scalar dt, int64_t rows, int64_t n, bool rms, bool has_w,
                         int want, layout lay, bool with_res, uint32_t seed)
{
    em_scope_begin();
    double eps = rms ? 1e-6 : 1e-5;
    size_t total = (size_t)(rows * n);
    double *x = malloc(total * sizeof(double)), *g = malloc(total * sizeof(double));
    double *w = malloc((size_t)n * sizeof(double)), *dx = malloc(total * sizeof(double));
    double *dw = malloc((size_t)n * sizeof(double)), *db = malloc((size_t)n * sizeof(double));
    assert_true(x && g && w && dx && dw && db);
    tu_fill(x, total, -3, 3, seed);
    for (int64_t r = 0; r < rows; r++) x[r * n] += 0.5 * (double)(r % 5); /* rows of other means */
    tu_fill(g, total, -1, 1, seed + 7);
    tu_fill(w, (size_t)n, 0.5, 1.5, seed + 13);
    em_tensor *xt = make_view(dev, dt, rows, n, lay, x, seed);
    em_tensor *gt = make_view(dev, dt, rows, n, lay, g, seed + 1);
    int nnorm = lay == L_TWO_DIMS ? 2 : 1;
    em_tensor *wt = has_w ? tu_tensor(dev, dt, EM_SHAPE(n), w) : NULL;
    if (wt && lay == L_TWO_DIMS) wt = em_view(wt, EM_SHAPE(2, n / 2));
    reference(x, g, has_w ? w : NULL, rows, n, eps, rms, dx, dw, db);
    /* a residual gradient added to dx: contiguous, or (narrowed layout) in a strided view */
    em_tensor *rt = NULL;
    if (with_res) {
        double *rv = malloc(total * sizeof(double));
        assert_non_null(rv);
        tu_fill(rv, total, -2, 2, seed + 99);
        rt = make_view(dev, dt, rows, n, lay == L_NARROW ? L_NARROW : L_CONTIG, rv, seed + 5);
        if (lay == L_TWO_DIMS) rt = em_view(rt, EM_SHAPE(rows, 2, n / 2));
        for (size_t i = 0; i < total; i++) dx[i] += rv[i];
        free(rv);
    }
    em_tensor *rdx = NULL, *rdw = NULL, *rdb = NULL;
    uint64_t before = kernel_launches();
    em_status st = em_norm_backward(gt, xt, nnorm, wt, eps, rms, rt, want & WANT_DX ? &rdx : NULL,
                                    want & WANT_DW ? &rdw : NULL, want & WANT_DB ? &rdb : NULL);
    char what[200];
    snprintf(what, sizeof what, "%s backward %s rows %lld n %lld, %s, %s%s, want %d on %s",
             rms ? "rms_norm" : "layer_norm", em_scalar_name(dt), (long long)rows, (long long)n,
             has_w ? "weight" : "no weight", layout_names[lay], with_res ? ", residual" : "", want,
             em_device_name(dev));
    if (st != EM_OK) fail_msg("%s: %s", what, em_last_error());
    /* the row-wise path: contiguous normalized dims on the CPU or a device with plane ops */
    const em_caps *caps = em_device_caps(dev);
    bool row_path = lay != L_TRANSPOSED && (tu_is_cpu(dev) || (caps->plane_ops && caps->plane_dim > 1)) &&
                    !(tu_is_cpu(dev) && n > 65536);
    if ((kernel_launches() > before) != row_path)
        fail_msg("%s: the one-launch kernel %s", what, row_path ? "did not run" : "ran off its path");
    /* f32 and f64: the sums' rounding; f16 and bf16: one rounding of an f32 result on the row
     * path, a rounding per step on the public-ops path (every product summed was rounded) */
    bool wide = dt == EM_F32 || dt == EM_F64;
    double tol = tu_tol_on(dev, dt) * (wide ? 8 * sqrt((double)n) : row_path ? 4 : 8);
    double stol = tu_tol_on(dev, dt) * (wide || !row_path ? 8 * sqrt((double)rows) : 4);
    struct {
        em_tensor *t;
        const double *ref;
        size_t n;
        double tol;
        int bit;
        const char *name;
    } out[3] = {{rdx, dx, total, tol, WANT_DX, "dx"}, {rdw, dw, (size_t)n, stol, WANT_DW, "dw"},
                {rdb, db, (size_t)n, stol, WANT_DB, "db"}};
    for (int i = 0; i < 3; i++) {
        if (!(want & out[i].bit)) continue;
        if (!out[i].t) fail_msg("%s: no %s", what, out[i].name);
        assert_int_equal(em_numel(out[i].t), (int64_t)out[i].n);
        assert_int_equal(em_dtype(out[i].t), dt);
        double *got = tu_read(out[i].t);
        char w2[240];
        snprintf(w2, sizeof w2, "%s: %s", what, out[i].name);
        bool ok = tu_close_n(w2, got, out[i].ref, out[i].n, out[i].tol);
        free(got);
        if (!ok) fail_msg("%s", w2);
    }
    free(x);
    free(g);
    free(w);
    free(dx);
    free(dw);
    free(db);
    em_scope_end(NULL, 0);
}

static void run_case(em_device *dev, em_scalar dt, int64_t rows, int64_t n, bool rms, bool has_w,
                     int want, layout lay, uint32_t seed)
{
    run_case_res(dev, dt, rows, n, rms, has_w, want, lay, false, seed);
}

/* Row lengths across the plan's boundaries and row counts from one round to many, in f32. */
static void test_shapes_f32(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{5, 1},   {7, 3},    {33, 64},  {64, 768}, {3, 1000},
                                        {1000, 32}, {300, 768}, {2, 5000}, {3, 20000}};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t i = 0; i < EM_ARRAY_LEN(shapes); i++)
            for (int rms = 0; rms < 2; rms++)
                run_case(tu_devs[di], EM_F32, shapes[i][0], shapes[i][1], rms, true,
                         rms ? WANT_DX | WANT_DW : WANT_ALL, L_CONTIG, (uint32_t)(i * 2 + (size_t)rms + 1));
}

/* Without a weight, and each gradient alone (the kernel skips what is not wanted). */
static void test_subsets(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *d = tu_devs[di];
        run_case(d, EM_F32, 40, 96, false, false, WANT_DX | WANT_DB, L_CONTIG, 3);
        run_case(d, EM_F32, 40, 96, true, false, WANT_DX, L_CONTIG, 4);
        for (int want = 1; want <= 4; want *= 2) run_case(d, EM_F32, 70, 200, false, true, want, L_CONTIG, 5);
    }
}

/* A residual gradient added to dx: in the kernel's pass (contiguous) or after it (strided, and
 * on the public-ops path), in every layout, registers and streamed rows, bf16 where present. */
static void test_residual(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *d = tu_devs[di];
        for (layout lay = L_CONTIG; lay <= L_TWO_DIMS; lay++)
            run_case_res(d, EM_F32, 19, 96, false, true, WANT_ALL, lay, true, 41 + lay);
        run_case_res(d, EM_F32, 3, 20000, true, true, WANT_DX | WANT_DW, L_CONTIG, true, 51);
        run_case_res(d, EM_F32, 30, 64, false, true, WANT_DW, L_CONTIG, true, 52); /* no dx: unused */
        if (tu_has(d, EM_BF16)) run_case_res(d, EM_BF16, 64, 768, false, true, WANT_ALL, L_CONTIG, true, 53);
    }
}

/* Every float dtype the device has, at GPT-2's row length and an odd one. */
static void test_dtypes(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F16, EM_BF16, EM_F64};
    for (int di = 0; di < tu_ndev; di++)
        for (size_t t = 0; t < EM_ARRAY_LEN(dts); t++) {
            if (!tu_has(tu_devs[di], dts[t])) continue;
            run_case(tu_devs[di], dts[t], 48, 768, false, true, WANT_ALL, L_CONTIG, 11);
            run_case(tu_devs[di], dts[t], 9, 100, true, true, WANT_DX | WANT_DW, L_CONTIG, 12);
        }
}

/* Views: narrowed rows (unaligned lines), transposed (public ops), two normalized dims. */
static void test_views(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++)
        for (layout lay = L_NARROW; lay <= L_TWO_DIMS; lay++) {
            run_case(tu_devs[di], EM_F32, 17, 64, false, true, WANT_ALL, lay, 21 + lay);
            run_case(tu_devs[di], EM_F32, 6, 130, true, true, WANT_DX | WANT_DW, lay, 31 + lay);
        }
}

/* No rows: empty dx, zero weight and bias gradients. */
static void test_no_rows(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_scope_begin();
        em_device *d = tu_devs[di];
        em_tensor *x = em_zeros(d, EM_F32, EM_SHAPE(0, 8)), *w = em_ones(d, EM_F32, EM_SHAPE(8));
        em_tensor *dx = NULL, *dw = NULL, *db = NULL;
        assert_int_equal(em_norm_backward(x, x, 1, w, 1e-5, false, NULL, &dx, &dw, &db), EM_OK);
        assert_int_equal(em_numel(dx), 0);
        double zero[8] = {0};
        tu_check("dw of no rows", dw, EM_SHAPE(8), zero, 0);
        tu_check("db of no rows", db, EM_SHAPE(8), zero, 0);
        em_scope_end(NULL, 0);
    }
}

/* Bad inputs: an error that names the problem, and no result. */
static void test_errors(void **state)
{
    (void)state;
    em_device *d = tu_devs[0];
    em_scope_begin();
    double v[24] = {0};
    em_tensor *x = tu_tensor(d, EM_F32, EM_SHAPE(4, 6), v), *w = tu_tensor(d, EM_F32, EM_SHAPE(6), v);
    em_tensor *g_bad = tu_tensor(d, EM_F32, EM_SHAPE(6, 4), v), *w_bad = tu_tensor(d, EM_F32, EM_SHAPE(4), v);
    em_tensor *xi = em_cast(x, EM_I32);
    em_tensor *dx = (em_tensor *)1, *dw = NULL, *db = NULL;
    assert_int_not_equal(em_norm_backward(g_bad, x, 1, w, 1e-5, false, NULL, &dx, &dw, &db), EM_OK);
    assert_null(dx);
    assert_non_null(strstr(em_last_error(), "[6, 4]"));
    assert_non_null(strstr(em_last_error(), "[4, 6]"));
    assert_int_not_equal(em_norm_backward(x, x, 1, w, 1e-5, false, g_bad, &dx, &dw, NULL), EM_OK);
    assert_non_null(strstr(em_last_error(), "residual"));
    assert_non_null(strstr(em_last_error(), "[6, 4]"));
    assert_int_not_equal(em_norm_backward(x, x, 1, w_bad, 1e-5, false, NULL, &dx, &dw, NULL), EM_OK);
    assert_non_null(strstr(em_last_error(), "weight"));
    assert_int_not_equal(em_norm_backward(x, x, 1, NULL, 1e-5, false, NULL, &dx, &dw, NULL), EM_OK);
    assert_non_null(strstr(em_last_error(), "without a weight"));
    assert_int_not_equal(em_norm_backward(x, x, 1, w, 1e-6, true, NULL, &dx, NULL, &db), EM_OK);
    assert_non_null(strstr(em_last_error(), "no bias"));
    assert_int_not_equal(em_norm_backward(x, x, 3, w, 1e-5, false, NULL, &dx, NULL, NULL), EM_OK);
    assert_non_null(strstr(em_last_error(), "last 3 dims"));
    assert_int_not_equal(em_norm_backward(xi, xi, 1, NULL, 1e-5, false, NULL, &dx, NULL, NULL), EM_OK);
    assert_non_null(strstr(em_last_error(), "floating-point"));
    assert_int_not_equal(em_norm_backward(NULL, x, 1, NULL, 1e-5, false, NULL, &dx, NULL, NULL), EM_OK);
    assert_null(dx);
    em_clear_error();
    em_scope_end(NULL, 0);
}

/* The kernel as the H200's plan binds it at GPT-2's rows (768 and 1024 wide, f32 and bf16) and a
 * long row, through NVRTC for sm_90: it must compile and spill nothing (ptxas's report). */
static void test_cuda_compiles(void **state)
{
    (void)state;
    SKIP_UNLESS_NVRTC();
    em_caps caps = cuda_caps("sm_90");
    static const struct {
        em_scalar dt;
        int64_t n;
    } cases[] = {{EM_BF16, 768}, {EM_BF16, 1024}, {EM_F32, 768}, {EM_F16, 1600}, {EM_F32, 50000}};
    size_t failed = 0;
    for (size_t i = 0; i < EM_ARRAY_LEN(cases); i++) {
        int64_t al[1] = {0};
        tn_rows_plan p;
        assert_true(tn_norm_backward_plan(&caps, cases[i].dt, 16384, cases[i].n, cases[i].n, al, 1, &p));
        em_lang_bind b[5] = {em_lang_bind_type("T", cases[i].dt), em_lang_bind_type("C", EM_F32)};
        size_t nb = 2 + tn_rows_binds(&p, b + 2);
        char *src = builtin_cuda_source("tensor_norm_backward", b, nb, p.lw, &caps);
        char *log = NULL;
        void *bin = NULL;
        size_t size = 0;
        if (em_nvrtc_compile(src, "sm_90", &log, &bin, &size) != EM_OK) {
            print_message("%s n %lld: %s\n", em_scalar_name(cases[i].dt), (long long)cases[i].n, em_last_error());
            failed++;
        } else {
            print_message("%s n %lld (line %u, G %u, cube %u, V %u): %.60s\n", em_scalar_name(cases[i].dt),
                          (long long)cases[i].n, p.lw, p.g, p.cube, p.v, nvrtc_used(log));
            failed += (size_t)nvrtc_problems(log, "tensor_norm_backward");
        }
        free(log);
        free(bin);
        free(src);
    }
    assert_int_equal(failed, 0);
}

/* The weight's and bias's gradients into neighbouring slots of one buffer (the optimizer's flat
 * gradients: weight n, then bias n): one column-sum launch writes both (the default), apart (a
 * gap between the slots) or with EMBER_NORM_SUMS_PAIR=0 two do; every way the sums against
 * float64, and the rest of the buffer untouched. */
static void test_into_pair(void **state)
{
    (void)state;
    const int64_t rows = 300, n = 768, pad = 128;
    double eps = 1e-5;
    size_t total = (size_t)(rows * n);
    double *x = malloc(total * sizeof(double)), *g = malloc(total * sizeof(double));
    double *w = malloc((size_t)n * sizeof(double)), *dx = malloc(total * sizeof(double));
    double *ref = malloc(2 * (size_t)n * sizeof(double));
    assert_true(x && g && w && dx && ref);
    tu_fill(x, total, -3, 3, 41);
    tu_fill(g, total, -1, 1, 42);
    tu_fill(w, (size_t)n, 0.5, 1.5, 43);
    reference(x, g, w, rows, n, eps, false, dx, ref, ref + n);
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        if (!tu_is_cpu(dev) && !(caps->plane_ops && caps->plane_dim > 1))
            continue;                          /* no row path */
        for (int form = 0; form < 3; form++) { /* paired; the switch off; a gap between */
            em_scope_begin();
            if (form == 1) setenv("EMBER_NORM_SUMS_PAIR", "0", 1);
            int64_t gap = form == 2 ? 64 : 0, len = pad + 2 * n + gap + pad;
            em_tensor *xt = tu_tensor(dev, EM_F32, EM_SHAPE(rows, n), x);
            em_tensor *gt = tu_tensor(dev, EM_F32, EM_SHAPE(rows, n), g);
            em_tensor *wt = tu_tensor(dev, EM_F32, EM_SHAPE(n), w);
            em_tensor *flat = em_full(dev, EM_F32, EM_SHAPE(len), 7.0);
            em_tensor *ws = em_narrow(flat, 0, pad, n), *bs = em_narrow(flat, 0, pad + n + gap, n);
            assert_true(xt && gt && wt && ws && bs);
            em_profile_kernel k;
            uint64_t before = em_profile_kernel_get("tensor_cols_sum", &k) ? k.launches : 0;
            em_tensor *rdw = NULL, *rdb = NULL;
            em_status st =
                em_norm_backward_into(gt, xt, 1, wt, eps, false, NULL, NULL, &rdw, &rdb, ws, bs);
            char what[160];
            snprintf(what, sizeof what, "norm sums into slots (%s) on %s",
                     form == 0   ? "neighbours"
                     : form == 1 ? "switch off"
                                 : "a gap between",
                     em_device_name(dev));
            if (st != EM_OK) fail_msg("%s: %s", what, em_last_error());
            assert_true(rdw == ws && rdb == bs);
            uint64_t launches =
                (em_profile_kernel_get("tensor_cols_sum", &k) ? k.launches : 0) - before;
            if (launches != (form == 0 ? 1u : 2u))
                fail_msg("%s: %llu column-sum launches (want %d)", what,
                         (unsigned long long)launches, form == 0 ? 1 : 2);
            double *got = tu_read(flat);
            double stol = tu_tol_on(dev, EM_F32) * 8 * sqrt((double)rows);
            if (!tu_close_n(what, got + pad, ref, (size_t)n, stol) ||
                !tu_close_n(what, got + pad + n + gap, ref + n, (size_t)n, stol))
                fail_msg("%s: the sums", what);
            for (int64_t i = 0; i < len; i++) {
                bool inside =
                    (i >= pad && i < pad + n) || (i >= pad + n + gap && i < pad + 2 * n + gap);
                if (!inside && got[i] != 7.0)
                    fail_msg("%s: flat[%lld] changed to %g", what, (long long)i, got[i]);
            }
            free(got);
            em_release(rdw);
            em_release(rdb);
            unsetenv("EMBER_NORM_SUMS_PAIR");
            em_scope_end(NULL, 0);
        }
    }
    free(x), free(g), free(w), free(dx), free(ref);
}

int main(void)
{
    /* ptxas's report of registers and spills (NVRTC reads its options once) */
    setenv("EMBER_NVRTC_OPTIONS", "--ptxas-options=-v", 1);
    em_profile_enable(true);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes_f32), cmocka_unit_test(test_subsets),
        cmocka_unit_test(test_residual),   cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_views),      cmocka_unit_test(test_no_rows),
        cmocka_unit_test(test_errors),     cmocka_unit_test(test_cuda_compiles),
        cmocka_unit_test(test_into_pair),
    };
    if (getenv("TU_ONLY")) cmocka_set_test_filter(getenv("TU_ONLY")); /* one test, on a GPU machine */
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
