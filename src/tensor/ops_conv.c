/* ops_conv.c — conv2d, max_pool2d and avg_pool2d on NCHW tensors, through the direct kernels of
 * src/kernels/tensor_conv.ek. */
#include <string.h>

#include "tensor/internal.h"

static int64_t out_size(int64_t in, int64_t k, int stride, int pad, int dil)
{
    int64_t span = dil * (k - 1) + 1;
    return in + 2 * pad < span ? 0 : (in + 2 * pad - span) / stride + 1;
}

em_tensor *em_conv2d(const em_tensor *x, const em_tensor *w, const em_tensor *bias, int stride, int padding,
                     int dilation, int groups)
{
    em_tensor *out = NULL, *bc = NULL;
    char s1[128], s2[128];
    if (!x || !w) goto done;
    if (!tn_same_device("conv2d", x, w) || (bias && !tn_same_device("conv2d", x, bias))) goto done;
    if (x->rank != 4 || w->rank != 4 || !em_scalar_is_float(x->dtype) || w->dtype != x->dtype || groups < 1 ||
        stride < 1 || padding < 0 || dilation < 1 || x->shape[1] != w->shape[1] * groups || w->shape[0] % groups) {
        em_set_error(EM_ERR_INVALID, "conv2d: input %s and weight %s do not fit (NCHW and [O, C/groups, KH, KW], "
                     "groups %d, stride %d, padding %d, dilation %d)", em_describe(x, s1, sizeof s1),
                     em_describe(w, s2, sizeof s2), groups, stride, padding, dilation);
        goto done;
    }
    if (bias && (bias->rank != 1 || bias->shape[0] != w->shape[0] || bias->dtype != x->dtype)) {
        em_set_error(EM_ERR_INVALID, "conv2d: bias %s does not match %lld output channels",
                     em_describe(bias, s1, sizeof s1), (long long)w->shape[0]);
        goto done;
    }
    int64_t sh[4] = {x->shape[0], w->shape[0], out_size(x->shape[2], w->shape[2], stride, padding, dilation),
                     out_size(x->shape[3], w->shape[3], stride, padding, dilation)};
    out = tn_new(x->st->dev, x->dtype, 4, sh);
    if (!out || em_numel(out) == 0) goto done;
    bc = bias ? tn_contig(bias) : NULL;
    if (bias && !bc) goto fail;
    em_lang_bind b[3] = {em_lang_bind_type("T", x->dtype), em_lang_bind_type("C", tn_compute_type(x->dtype)),
                         em_lang_bind_bool("HAS_B", bc != NULL)};
    tn_arg args[8] = {tn_arg_t(x), tn_arg_t(w), tn_arg_flat(bc ? bc : x), tn_arg_t(out),
                      tn_arg_s(em_arg_u32((uint32_t)stride)), tn_arg_s(em_arg_u32((uint32_t)padding)),
                      tn_arg_s(em_arg_u32((uint32_t)dilation)), tn_arg_s(em_arg_u32((uint32_t)groups))};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(out), cubes, units);
    if (tn_launch("conv2d", x->st->dev, "tensor_conv2d", b, 3, 1, cubes, units, args, 8) == EM_OK) goto done;
fail:
    em_release(out);
    out = NULL;
done:
    em_release(bc);
    if (out) {
        em_top_params p = tn_params_k(0);
        p.ni = 4;
        p.i[0] = stride, p.i[1] = padding, p.i[2] = dilation, p.i[3] = groups;
        const em_tensor *ins[3] = {x, w, bias};
        tn_record(EM_TOP_CONV2D, &p, ins, 3, out);
    }
    tn_done(x);
    tn_done(w);
    tn_done(bias);
    return out;
}

static em_tensor *pool(const char *op, const em_tensor *x, int k, int stride, int padding, bool max)
{
    if (!x) return NULL;
    em_tensor *out = NULL;
    char s[128];
    if (stride <= 0) stride = k;
    if (x->rank != 4 || !em_scalar_is_float(x->dtype) || k < 1 || padding < 0 || padding * 2 > k) {
        em_set_error(EM_ERR_INVALID, "%s: needs a float NCHW tensor, kernel >= 1 and padding <= kernel / 2; got %s, "
                     "kernel %d, padding %d", op, em_describe(x, s, sizeof s), k, padding);
        goto done;
    }
    int64_t sh[4] = {x->shape[0], x->shape[1], out_size(x->shape[2], k, stride, padding, 1),
                     out_size(x->shape[3], k, stride, padding, 1)};
    out = tn_new(x->st->dev, x->dtype, 4, sh);
    if (!out || em_numel(out) == 0) goto done;
    em_lang_bind b[3] = {em_lang_bind_type("T", x->dtype), em_lang_bind_type("C", tn_compute_type(x->dtype)),
                         em_lang_bind_bool("MAX", max)};
    tn_arg args[5] = {tn_arg_t(x), tn_arg_t(out), tn_arg_s(em_arg_u32((uint32_t)k)),
                      tn_arg_s(em_arg_u32((uint32_t)stride)), tn_arg_s(em_arg_u32((uint32_t)padding))};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(out), cubes, units);
    if (tn_launch(op, x->st->dev, "tensor_pool2d", b, 3, 1, cubes, units, args, 5) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) {
        em_top_params p = tn_params_k(0);
        p.ni = 3;
        p.i[0] = k, p.i[1] = stride, p.i[2] = padding;
        tn_record(max ? EM_TOP_MAX_POOL2D : EM_TOP_AVG_POOL2D, &p, &x, 1, out);
    }
    tn_done(x);
    return out;
}

em_tensor *em_max_pool2d(const em_tensor *x, int kernel, int stride, int padding)
{
    return pool("max_pool2d", x, kernel, stride, padding, true);
}

em_tensor *em_avg_pool2d(const em_tensor *x, int kernel, int stride, int padding)
{
    return pool("avg_pool2d", x, kernel, stride, padding, false);
}
