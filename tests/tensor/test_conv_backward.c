/* test_conv_backward.c — the gradient ops of include/ember/tensor_grad.h on every device present
 * and in every float dtype: conv2d's input and weight gradients (stride, padding, dilation,
 * groups, rectangular kernels, output sizes that drop trailing input rows, NHWC-strided operands),
 * max_pool2d's (ties go to the first maximum in row-major window order, padding never wins, NaNs
 * take over, overlapping windows add up) and avg_pool2d's (padding counted). References: float64
 * loops in this file that scatter each output's gradient along the forward computation (the
 * kernels gather), and shape errors that name every shape involved. */
#include "ember/tensor_grad.h"
#include "tensor_util.h"

static int64_t osize(int64_t in, int64_t k, int s, int p, int d)
{
    int64_t span = d * (k - 1) + 1;
    return in + 2 * p < span ? 0 : (in + 2 * p - span) / s + 1;
}

/* A tensor of logical NCHW shape sh holding v (row-major, rounded in place) stored as NHWC and
 * permuted back: a non-contiguous view. */
static em_tensor *nhwc_tensor(em_device *dev, em_scalar dt, const int64_t *sh, double *v)
{
    size_t n = (size_t)(sh[0] * sh[1] * sh[2] * sh[3]);
    double *st = malloc(n * sizeof(double) + 8);
    assert_non_null(st);
    for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t c = 0; c < sh[1]; c++)
            for (int64_t h = 0; h < sh[2]; h++)
                for (int64_t w = 0; w < sh[3]; w++)
                    st[((a * sh[2] + h) * sh[3] + w) * sh[1] + c] =
                        v[((a * sh[1] + c) * sh[2] + h) * sh[3] + w];
    em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(sh[0], sh[2], sh[3], sh[1]), st);
    for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t c = 0; c < sh[1]; c++)
            for (int64_t h = 0; h < sh[2]; h++)
                for (int64_t w = 0; w < sh[3]; w++)
                    v[((a * sh[1] + c) * sh[2] + h) * sh[3] + w] =
                        st[((a * sh[2] + h) * sh[3] + w) * sh[1] + c];
    free(st);
    em_tensor *t = em_permute(s, (int[]){0, 3, 1, 2}, 4);
    assert_non_null(t);
    return t;
}

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int stride, pad, dil, groups;
} conv_case;

/* Scatters gy[n, o, oh, ow] along the forward sum into gx and gw (both zeroed here). */
static void ref_conv_backward(const conv_case *k, const double *x, const double *w,
                              const double *gy, double *gx, double *gw)
{
    int64_t oh_n = osize(k->h, k->kh, k->stride, k->pad, k->dil);
    int64_t ow_n = osize(k->w, k->kw, k->stride, k->pad, k->dil);
    int64_t cg = k->c / k->groups, og = k->o / k->groups;
    memset(gx, 0, sizeof(double) * (size_t)(k->n * k->c * k->h * k->w));
    memset(gw, 0, sizeof(double) * (size_t)(k->o * cg * k->kh * k->kw));
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t o = 0; o < k->o; o++)
            for (int64_t oh = 0; oh < oh_n; oh++)
                for (int64_t ow = 0; ow < ow_n; ow++) {
                    double g = gy[((n * k->o + o) * oh_n + oh) * ow_n + ow];
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t i = 0; i < k->kh; i++)
                            for (int64_t j = 0; j < k->kw; j++) {
                                int64_t ih = oh * k->stride + i * k->dil - k->pad;
                                int64_t iw = ow * k->stride + j * k->dil - k->pad;
                                if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w) continue;
                                int64_t ci = (o / og) * cg + c;
                                size_t xi = (size_t)(((n * k->c + ci) * k->h + ih) * k->w + iw);
                                size_t wi = (size_t)(((o * cg + c) * k->kh + i) * k->kw + j);
                                gx[xi] += g * w[wi];
                                gw[wi] += g * x[xi];
                            }
                }
}

static void test_conv2d_backward(void **state)
{
    (void)state;
    static const conv_case cases[] = {
        {2, 4, 7, 6, 6, 3, 2, 2, 1, 1, 2},  /* groups 2, rectangular kernel, stride 2 */
        {1, 3, 8, 9, 4, 3, 3, 1, 2, 2, 1},  /* dilation 2, padding 2 */
        {2, 4, 5, 5, 8, 1, 1, 1, 0, 1, 4},  /* 1x1, groups 4 (two outputs per group) */
        {1, 2, 10, 8, 3, 3, 2, 3, 0, 1, 1}, /* stride 3: trailing rows/cols never read */
        {2, 3, 6, 6, 3, 3, 3, 2, 1, 2, 3},  /* depthwise, dilated, strided */
    };
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            for (size_t ci = 0; ci < EM_ARRAY_LEN(cases); ci++) {
                const conv_case *k = &cases[ci];
                int64_t oh = osize(k->h, k->kh, k->stride, k->pad, k->dil);
                int64_t ow = osize(k->w, k->kw, k->stride, k->pad, k->dil);
                int64_t cg = k->c / k->groups;
                size_t nx = (size_t)(k->n * k->c * k->h * k->w),
                       nw = (size_t)(k->o * cg * k->kh * k->kw);
                size_t ny = (size_t)(k->n * k->o * oh * ow);
                double *x = malloc(nx * 8), *w = malloc(nw * 8), *gy = malloc(ny * 8);
                double *gx = malloc(nx * 8), *gw = malloc(nw * 8);
                tu_fill(x, nx, -1, 1, (uint32_t)(11 + ci));
                tu_fill(w, nw, -1, 1, (uint32_t)(23 + ci));
                tu_fill(gy, ny, -1, 1, (uint32_t)(37 + ci));
                em_scope_begin();
                bool strided = ci % 2 == 1; /* every other case reads NHWC-strided operands */
                int64_t xsh[4] = {k->n, k->c, k->h, k->w}, ysh[4] = {k->n, k->o, oh, ow};
                em_tensor *tx = strided ? nhwc_tensor(dev, dt, xsh, x)
                                        : tu_tensor(dev, dt, EM_SHAPE(k->n, k->c, k->h, k->w), x);
                em_tensor *ty = strided ? nhwc_tensor(dev, dt, ysh, gy)
                                        : tu_tensor(dev, dt, EM_SHAPE(k->n, k->o, oh, ow), gy);
                em_tensor *tw = tu_tensor(dev, dt, EM_SHAPE(k->o, cg, k->kh, k->kw), w);
                ref_conv_backward(k, x, w, gy, gx, gw);
                em_shape xs = EM_SHAPE(k->n, k->c, k->h, k->w),
                         ws = EM_SHAPE(k->o, cg, k->kh, k->kw);
                char what[96];
                double tol = tu_tol_on(dev, dt) * 4;
                snprintf(what, sizeof what, "conv2d_backward_input case %zu %s", ci,
                         em_scalar_name(dt));
                tu_check(what,
                         em_conv2d_backward_input(ty, tw, xs, k->stride, k->pad, k->dil, k->groups),
                         xs, gx, tol);
                snprintf(what, sizeof what, "conv2d_backward_weight case %zu %s", ci,
                         em_scalar_name(dt));
                tu_check(
                    what,
                    em_conv2d_backward_weight(ty, tx, ws, k->stride, k->pad, k->dil, k->groups), ws,
                    gw, tol);
                em_scope_end(NULL, 0);
                free(x), free(w), free(gy), free(gx), free(gw);
            }
        }
    }
}

/* Pool references: gx (zeroed here) from gy; max routes each window's gradient to its first
 * strict maximum in row-major order among the elements inside the input. */
static void ref_pool_backward(bool max, const int64_t *sh, int k, int s, int p, const double *x,
                              const double *gy, double *gx)
{
    int64_t oh_n = osize(sh[2], k, s, p, 1), ow_n = osize(sh[3], k, s, p, 1);
    memset(gx, 0, sizeof(double) * (size_t)(sh[0] * sh[1] * sh[2] * sh[3]));
    for (int64_t nc = 0; nc < sh[0] * sh[1]; nc++)
        for (int64_t oh = 0; oh < oh_n; oh++)
            for (int64_t ow = 0; ow < ow_n; ow++) {
                double g = gy[(nc * oh_n + oh) * ow_n + ow];
                int64_t best = -1;
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++) {
                        int64_t ih = oh * s + i - p, iw = ow * s + j - p;
                        if (ih < 0 || ih >= sh[2] || iw < 0 || iw >= sh[3]) continue;
                        int64_t at = (nc * sh[2] + ih) * sh[3] + iw;
                        if (!max)
                            gx[at] += g / (double)(k * k);
                        else if (best < 0 || x[at] > x[best])
                            best = at;
                    }
                if (max && best >= 0) gx[best] += g;
            }
}

static void test_pool2d_backward(void **state)
{
    (void)state;
    static const struct {
        int64_t sh[4];
        int k, s, p;
    } cases[] = {
        {{2, 3, 6, 7}, 2, 2, 0}, /* tiling windows, the last column dropped */
        {{1, 2, 7, 7}, 3, 2, 1}, /* overlapping windows with padding */
        {{2, 2, 5, 6}, 3, 1, 1}, /* every element in up to nine windows */
        {{1, 1, 9, 8}, 4, 3, 2}, /* padding 2 on a 4-window, stride 3 */
    };
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(tu_float_types); ti++) {
            em_scalar dt = tu_float_types[ti];
            if (!tu_has(dev, dt)) continue;
            for (size_t ci = 0; ci < EM_ARRAY_LEN(cases); ci++) {
                const int64_t *sh = cases[ci].sh;
                int k = cases[ci].k, s = cases[ci].s, p = cases[ci].p;
                int64_t oh = osize(sh[2], k, s, p, 1), ow = osize(sh[3], k, s, p, 1);
                size_t nx = (size_t)(sh[0] * sh[1] * sh[2] * sh[3]),
                       ny = (size_t)(sh[0] * sh[1] * oh * ow);
                double *x = malloc(nx * 8), *gy = malloc(ny * 8), *gx = malloc(nx * 8);
                /* negative values (a zero from the padding would win if it counted), drawn from
                 * only five levels so that windows have ties */
                tu_fill(x, nx, 0, 5, (uint32_t)(5 + ci));
                for (size_t i = 0; i < nx; i++) x[i] = -1 - floor(x[i]);
                tu_fill(gy, ny, -1, 1, (uint32_t)(9 + ci));
                em_scope_begin();
                em_shape xs = EM_SHAPE(sh[0], sh[1], sh[2], sh[3]);
                em_tensor *tx = ci % 2 ? nhwc_tensor(dev, dt, sh, x) : tu_tensor(dev, dt, xs, x);
                int64_t ysh[4] = {sh[0], sh[1], oh, ow};
                em_tensor *ty = ci % 2 ? tu_tensor(dev, dt, EM_SHAPE(sh[0], sh[1], oh, ow), gy)
                                       : nhwc_tensor(dev, dt, ysh, gy);
                double tol = tu_tol_on(dev, dt) * 4;
                char what[96];
                ref_pool_backward(true, sh, k, s, p, x, gy, gx);
                snprintf(what, sizeof what, "max_pool2d_backward case %zu %s", ci,
                         em_scalar_name(dt));
                /* the stride given as 0 (= kernel) where it equals the kernel */
                tu_check(what, em_max_pool2d_backward(ty, tx, k, s == k ? 0 : s, p), xs, gx, tol);
                ref_pool_backward(false, sh, k, s, p, x, gy, gx);
                snprintf(what, sizeof what, "avg_pool2d_backward case %zu %s", ci,
                         em_scalar_name(dt));
                tu_check(what, em_avg_pool2d_backward(ty, xs, k, s, p), xs, gx, tol);
                em_scope_end(NULL, 0);
                free(x), free(gy), free(gx);
            }
        }
    }
}

/* A hand-computed max-pool case: ties go to the first maximum, padding never wins. */
static void test_max_pool_known(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    /* 1x1x2x3, all negative; kernel 2, stride 1, padding 1 gives 3x4 windows */
    double x[6] = {-1, -3, -1, -2, -1, -5};
    em_tensor *tx = tu_tensor(dev, EM_F64, EM_SHAPE(1, 1, 2, 3), x);
    double gy[12];
    for (int i = 0; i < 12; i++) gy[i] = (double)(1 << i);
    em_tensor *ty = tu_tensor(dev, EM_F64, EM_SHAPE(1, 1, 3, 4), gy);
    /* window (oh, ow) covers x rows oh-1..oh and columns ow-1..ow (the rest is padding) and
     * carries gradient 2^(4 oh + ow). Selected: (0,0) x00; (0,1) x00 (-1 before -3); (0,2) x02;
     * (0,3) x02; (1,0) x00; (1,1) x00 (tie with x11: the first wins); (1,2) x02 (tie with x11);
     * (1,3) x02; (2,0) x10; (2,1) x11; (2,2) x11; (2,3) x12 (-5, alone: padding never wins). */
    double ref[6] = {1 + 2 + 16 + 32, 0, 4 + 8 + 64 + 128, 256, 512 + 1024, 2048};
    tu_check("max_pool2d_backward known", em_max_pool2d_backward(ty, tx, 2, 1, 1),
             EM_SHAPE(1, 1, 2, 3), ref, 0);
    /* NaNs take over the window, the last one winning (as in PyTorch) */
    double xn[4] = {1, NAN, 2, NAN}, gn[1] = {3}, refn[4] = {0, 0, 0, 3};
    em_tensor *txn = tu_tensor(dev, EM_F64, EM_SHAPE(1, 1, 2, 2), xn);
    em_tensor *tyn = tu_tensor(dev, EM_F64, EM_SHAPE(1, 1, 1, 1), gn);
    tu_check("max_pool2d_backward with NaNs", em_max_pool2d_backward(tyn, txn, 2, 0, 0),
             EM_SHAPE(1, 1, 2, 2), refn, 0);
    em_scope_end(NULL, 0);
}

static void test_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *gy = em_zeros(dev, EM_F32, EM_SHAPE(2, 4, 3, 3));
    em_tensor *w = em_zeros(dev, EM_F32, EM_SHAPE(4, 3, 3, 3));
    em_tensor *x = em_zeros(dev, EM_F32, EM_SHAPE(2, 3, 5, 5));
    em_tensor *xd = em_zeros(dev, EM_F64, EM_SHAPE(2, 3, 5, 5));
    /* the forward of x [2, 3, 5, 5] with w [4, 3, 3, 3] gives [2, 4, 3, 3]: valid */
    em_tensor *ok = em_conv2d_backward_input(gy, w, EM_SHAPE(2, 3, 5, 5), 1, 0, 1, 1);
    assert_non_null(ok);
    tu_expect_error(
        em_conv2d_backward_input(gy, w, EM_SHAPE(2, 3, 6, 5), 1, 0, 1, 1),
        "conv2d_backward_input: grad_out f32[2, 4, 3, 3] does not fit input f32[2, 3, 6, 5] and "
        "weight f32[4, 3, 3, 3]");
    tu_expect_error(em_conv2d_backward_input(gy, w, EM_SHAPE(2, 3, 5, 5), 1, 0, 1, 3),
                    "groups 3, stride 1, padding 0, dilation 1");
    tu_expect_error(
        em_conv2d_backward_weight(gy, x, EM_SHAPE(4, 2, 3, 3), 1, 0, 1, 1),
        "conv2d_backward_weight: grad_out f32[2, 4, 3, 3] does not fit input f32[2, 3, 5, 5] and "
        "weight f32[4, 2, 3, 3]");
    tu_expect_error(em_conv2d_backward_weight(gy, xd, EM_SHAPE(4, 3, 3, 3), 1, 0, 1, 1),
                    "does not fit input f64[2, 3, 5, 5]");
    tu_expect_error(em_conv2d_backward_weight(gy, x, EM_SHAPE(4, 3, 3, 3), 0, 0, 1, 1), "stride 0");
    tu_expect_error(
        em_max_pool2d_backward(gy, x, 2, 2, 0),
        "max_pool2d_backward: grad_out f32[2, 4, 3, 3] does not fit input f32[2, 3, 5, 5]");
    tu_expect_error(
        em_avg_pool2d_backward(gy, EM_SHAPE(2, 4, 7, 7), 3, 2, 2),
        "avg_pool2d_backward: grad_out f32[2, 4, 3, 3] does not fit input f32[2, 4, 7, 7] "
        "(float NCHW; kernel 3, stride 2, padding 2, padding at most kernel / 2)");
    tu_expect_error(em_avg_pool2d_backward(gy, EM_SHAPE(2, 4, 6), 2, 2, 0), "input f32[2, 4, 6]");
    /* a NULL input gives NULL and keeps the earlier message */
    assert_null(em_conv2d_backward_input(NULL, w, EM_SHAPE(2, 3, 5, 5), 1, 0, 1, 1));
    assert_null(em_max_pool2d_backward(gy, NULL, 2, 2, 0));
    assert_non_null(strstr(em_last_error(), "input f32[2, 4, 6]"));
    /* an empty output (the window is larger than the padded input) gives zero gradients */
    em_tensor *e = em_zeros(dev, EM_F32, EM_SHAPE(2, 4, 0, 0));
    double z[2 * 3 * 2 * 2] = {0};
    tu_check("conv2d_backward_input of an empty output",
             em_conv2d_backward_input(e, w, EM_SHAPE(2, 3, 2, 2), 1, 0, 1, 1), EM_SHAPE(2, 3, 2, 2),
             z, 0);
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_backward),
        cmocka_unit_test(test_pool2d_backward),
        cmocka_unit_test(test_max_pool_known),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
