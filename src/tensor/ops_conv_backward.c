/* ops_conv_backward.c — the gradient ops of conv2d and the 2-D pools
 * (include/ember/tensor_grad.h), through the gather-style kernels of src/kernels/tensor_conv.ek:
 * one unit per element of the gradient, so no atomics and the same sums in the same order on
 * every device. The autodiff layer's rules (src/autodiff/rules_conv.c) call these. */
#include <stdio.h>
#include <string.h>

#include "ember/tensor_grad.h"
#include "tensor/internal.h"

/* The forward ops' output size along one dim (as ops_conv.c computes it). */
static int64_t out_size(int64_t in, int64_t k, int stride, int pad, int dil)
{
    int64_t span = dil * (k - 1) + 1;
    return in + 2 * pad < span ? 0 : (in + 2 * pad - span) / stride + 1;
}

static const char *shape_str(em_scalar dt, em_shape s, char *buf, size_t size)
{
    tn_describe_shape(dt, s.rank, s.d, buf, size);
    return buf;
}

static bool shape_ok(em_shape s)
{
    if (s.rank != 4) return false;
    for (int i = 0; i < 4; i++)
        if (s.d[i] < 0) return false;
    return true;
}

/* A new contiguous tensor of `shape` for a gradient; filled with zeros (and returned without a
 * launch) when there is nothing to sum: *done is then true. */
static em_tensor *new_grad(em_device *dev, em_scalar dt, em_shape shape, bool nothing, bool *done)
{
    em_tensor *out = tn_new(dev, dt, 4, shape.d);
    *done = true;
    if (!out || em_numel(out) == 0) return out;
    if (nothing) {
        if (tn_fill(out, 0) == EM_OK) return out;
        em_release(out);
        return NULL;
    }
    *done = false;
    return out;
}

/* Launches one of the backward kernels writing `out`; releases out and returns NULL on failure. */
static em_tensor *launch(const char *op, const char *kernel, em_tensor *out, const em_tensor *a,
                         const em_tensor *b, int pool_max, const uint32_t *scalars, int nscalars)
{
    em_lang_bind binds[3] = {em_lang_bind_type("T", out->dtype),
                             em_lang_bind_type("C", tn_compute_type(out->dtype)),
                             em_lang_bind_bool("MAX", pool_max == 1)};
    tn_arg args[8] = {tn_arg_t(a), tn_arg_t(b), tn_arg_t(out)};
    for (int i = 0; i < nscalars; i++) args[3 + i] = tn_arg_s(em_arg_u32(scalars[i]));
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(out), cubes, units);
    if (tn_launch(op, out->st->dev, kernel, binds, pool_max >= 0 ? 3 : 2, 1, cubes, units, args,
                  (size_t)(3 + nscalars)) == EM_OK)
        return out;
    em_release(out);
    return NULL;
}

/* Checks the geometry shared by both conv2d gradients: x_shape [N, C, H, W], w_shape
 * [O, C/groups, KH, KW] and grad_out [N, O, OH, OW] of the forward's output size. */
static bool conv_fits(em_shape xs, em_shape ws, const em_tensor *gy, int stride, int padding,
                      int dilation, int groups)
{
    if (!shape_ok(xs) || !shape_ok(ws) || gy->rank != 4 || groups < 1 || stride < 1 ||
        padding < 0 || dilation < 1)
        return false;
    if (xs.d[1] != ws.d[1] * groups || ws.d[0] % groups) return false;
    return gy->shape[0] == xs.d[0] && gy->shape[1] == ws.d[0] &&
           gy->shape[2] == out_size(xs.d[2], ws.d[2], stride, padding, dilation) &&
           gy->shape[3] == out_size(xs.d[3], ws.d[3], stride, padding, dilation);
}

static void conv_error(const char *op, const em_tensor *gy, em_scalar dt, em_shape xs, em_shape ws,
                       int stride, int padding, int dilation, int groups)
{
    char a[128], b[128], c[128];
    em_set_error(
        EM_ERR_INVALID,
        "%s: grad_out %s does not fit input %s and weight %s (NCHW, [O, C/groups, KH, KW], "
        "float; groups %d, stride %d, padding %d, dilation %d)",
        op, em_describe(gy, a, sizeof a), shape_str(dt, xs, b, sizeof b),
        shape_str(dt, ws, c, sizeof c), groups, stride, padding, dilation);
}

em_tensor *em_conv2d_backward_input(const em_tensor *grad_out, const em_tensor *weight,
                                    em_shape x_shape, int stride, int padding, int dilation,
                                    int groups)
{
    static const char *op = "conv2d_backward_input";
    em_tensor *out = NULL;
    if (!grad_out || !weight) goto done;
    if (!tn_same_device(op, grad_out, weight)) goto done;
    if (!em_scalar_is_float(grad_out->dtype) || weight->dtype != grad_out->dtype ||
        weight->rank != 4 ||
        !conv_fits(x_shape, em_shape_of(weight), grad_out, stride, padding, dilation, groups)) {
        conv_error(op, grad_out, weight->dtype, x_shape, em_shape_of(weight), stride, padding,
                   dilation, groups);
        goto done;
    }
    bool finished;
    out = new_grad(grad_out->st->dev, grad_out->dtype, x_shape,
                   em_numel(grad_out) == 0 || em_numel(weight) == 0, &finished);
    if (!out || finished) goto done;
    uint32_t s[4] = {(uint32_t)stride, (uint32_t)padding, (uint32_t)dilation, (uint32_t)groups};
    out = launch(op, "tensor_conv2d_bwd_input", out, grad_out, weight, -1, s, 4);
done:
    tn_done(grad_out);
    tn_done(weight);
    return out;
}

em_tensor *em_conv2d_backward_weight(const em_tensor *grad_out, const em_tensor *x,
                                     em_shape weight_shape, int stride, int padding, int dilation,
                                     int groups)
{
    static const char *op = "conv2d_backward_weight";
    em_tensor *out = NULL;
    if (!grad_out || !x) goto done;
    if (!tn_same_device(op, grad_out, x)) goto done;
    if (!em_scalar_is_float(grad_out->dtype) || x->dtype != grad_out->dtype || x->rank != 4 ||
        !conv_fits(em_shape_of(x), weight_shape, grad_out, stride, padding, dilation, groups)) {
        conv_error(op, grad_out, x->dtype, em_shape_of(x), weight_shape, stride, padding, dilation,
                   groups);
        goto done;
    }
    bool finished;
    out = new_grad(grad_out->st->dev, grad_out->dtype, weight_shape,
                   em_numel(grad_out) == 0 || em_numel(x) == 0, &finished);
    if (!out || finished) goto done;
    uint32_t s[4] = {(uint32_t)stride, (uint32_t)padding, (uint32_t)dilation, (uint32_t)groups};
    out = launch(op, "tensor_conv2d_bwd_weight", out, grad_out, x, -1, s, 4);
done:
    tn_done(grad_out);
    tn_done(x);
    return out;
}

/* The pools' gradient: x is the forward input (max) or NULL (average, x_shape given). */
static em_tensor *pool_backward(const char *op, const em_tensor *gy, const em_tensor *x,
                                em_shape xs, int k, int stride, int padding, bool max)
{
    em_tensor *out = NULL;
    char a[128], b[128];
    if (!gy || (max && !x)) goto done;
    if (max && !tn_same_device(op, gy, x)) goto done;
    if (stride <= 0) stride = k;
    if (max) xs = em_shape_of(x);
    bool ok = shape_ok(xs) && gy->rank == 4 && em_scalar_is_float(gy->dtype) &&
              (!max || x->dtype == gy->dtype) && k >= 1 && padding >= 0 && padding * 2 <= k;
    if (ok)
        ok = gy->shape[0] == xs.d[0] && gy->shape[1] == xs.d[1] &&
             gy->shape[2] == out_size(xs.d[2], k, stride, padding, 1) &&
             gy->shape[3] == out_size(xs.d[3], k, stride, padding, 1);
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: grad_out %s does not fit input %s (float NCHW; kernel %d, stride %d, "
                     "padding %d, padding at most kernel / 2)",
                     op, em_describe(gy, a, sizeof a),
                     shape_str(max ? x->dtype : gy->dtype, xs, b, sizeof b), k, stride, padding);
        goto done;
    }
    bool finished;
    out = new_grad(gy->st->dev, gy->dtype, xs, em_numel(gy) == 0, &finished);
    if (!out || finished) goto done;
    uint32_t s[3] = {(uint32_t)k, (uint32_t)stride, (uint32_t)padding};
    out = launch(op, "tensor_pool2d_bwd", out, gy, max ? x : gy, max ? 1 : 0, s, 3);
done:
    tn_done(gy);
    tn_done(x);
    return out;
}

em_tensor *em_max_pool2d_backward(const em_tensor *grad_out, const em_tensor *x, int kernel,
                                  int stride, int padding)
{
    return pool_backward("max_pool2d_backward", grad_out, x, EM_SHAPE(), kernel, stride, padding,
                         true);
}

em_tensor *em_avg_pool2d_backward(const em_tensor *grad_out, em_shape x_shape, int kernel,
                                  int stride, int padding)
{
    return pool_backward("avg_pool2d_backward", grad_out, NULL, x_shape, kernel, stride, padding,
                         false);
}
