/* rules_conv.c — backward rules of conv2d, the 2-D pools, the fused classifier and the fused
 * attention: thin wrappers over the gradient ops of include/ember/tensor_grad.h (gather-style
 * kernels, deterministic on every device).
 *   conv2d:     dx = conv2d_backward_input(g, w), dw = conv2d_backward_weight(g, x),
 *               dbias = sum of g over N, H, W;
 *   max_pool2d: dx = max_pool2d_backward(g, x) (the window's first maximum gets its gradient);
 *   avg_pool2d: dx = avg_pool2d_backward(g, x's shape) (needs nothing saved);
 *   linear_cross_entropy: dx = gx g / valid, dw = gw g / valid (gx, gw: the forward's).
 *   cross_entropy_rows: dlogits = cross_entropy_rows_backward(g, logits, classes) (the classes
 *               get no gradient);
 *   attention:  dq, dk, dv = attention_backward(g, q, k, v, out, lse) (lse, the recorded
 *               log-sum-exp of each query row, gets no gradient). */
#include "autodiff/internal.h"
#include "ember/tensor_grad.h"

static em_status finish(const ad_ctx *c, em_tensor **gin, int n)
{
    for (int i = 0; i < n; i++)
        if (c->needs[i] && !gin[i]) {
            for (int j = 0; j < n; j++) {
                em_release(gin[j]);
                gin[j] = NULL;
            }
            if (em_last_status() == EM_OK)
                em_set_error(EM_ERR_INTERNAL, "no gradient computed for input %d", i);
            return em_error_context("%s backward", em_top_name(c->op));
        }
    return EM_OK;
}

/* in = x, weight, bias or NULL; p->i = stride, padding, dilation, groups. */
static em_status conv2d_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    int s = (int)c->p->i[0], pad = (int)c->p->i[1], dil = (int)c->p->i[2], groups = (int)c->p->i[3];
    gin[0] = gin[1] = gin[2] = NULL;
    if (c->needs[0])
        gin[0] = em_conv2d_backward_input(g, c->in[1], c->in_shape[0], s, pad, dil, groups);
    if (c->needs[1] && (!c->needs[0] || gin[0]))
        gin[1] = em_conv2d_backward_weight(g, c->in[0], c->in_shape[1], s, pad, dil, groups);
    if (c->nin > 2 && c->in_present[2] && c->needs[2] && (!c->needs[1] || gin[1]) &&
        (!c->needs[0] || gin[0]))
        gin[2] = em_sum(g, (const int[]){0, 2, 3}, 3, false);
    return finish(c, gin, c->nin < 3 ? c->nin : 3);
}

/* in = x; p->i = kernel, stride, padding. */
static em_status max_pool2d_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    gin[0] = NULL;
    if (c->needs[0])
        gin[0] =
            em_max_pool2d_backward(g, c->in[0], (int)c->p->i[0], (int)c->p->i[1], (int)c->p->i[2]);
    return finish(c, gin, 1);
}

static em_status avg_pool2d_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    gin[0] = NULL;
    if (c->needs[0])
        gin[0] = em_avg_pool2d_backward(g, c->in_shape[0], (int)c->p->i[0], (int)c->p->i[1],
                                        (int)c->p->i[2]);
    return finish(c, gin, 1);
}

/* in = logits, classes; f[0] = label smoothing. */
static em_status cross_entropy_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    gin[0] = gin[1] = NULL;
    if (!c->needs[0]) return finish(c, gin, 1);
    /* the logits, when the tape held the last reference: their gradient overwrites them (the
     * classifier's [N, vocab] block exists once, not twice, at the peak of a GPT's backward) */
    em_tensor *logits = ad_take_input(c, 0);
    gin[0] = em_cross_entropy_rows_backward(g, logits ? logits : c->in[0], c->in[1], c->p->f[0]);
    return finish(c, gin, 1);
}

/* in = q, k, v, lse; f[0] = scale, flag = causal; out is saved. */
static em_status attention_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    gin[0] = gin[1] = gin[2] = gin[3] = NULL;
    em_status st = em_attention_backward(g, c->in[0], c->in[1], c->in[2], c->out, c->in[3],
                                         c->p->flag, c->p->f[0], c->needs[0] ? &gin[0] : NULL,
                                         c->needs[1] || c->needs[2] ? &gin[1] : NULL,
                                         c->needs[1] || c->needs[2] ? &gin[2] : NULL);
    return st != EM_OK ? st : finish(c, gin, 3);
}

/* in = qkv, lse; f[0] = scale, flag = causal, k = heads; out is saved. */
static em_status attention_qkv_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    gin[0] = gin[1] = NULL;
    if (c->needs[0])
        gin[0] = em_attention_qkv_backward(g, c->in[0], c->out, c->in[1], c->p->k, c->p->flag, c->p->f[0]);
    return finish(c, gin, 1);
}

/* in = x, w, then the summed loss's gradients for them, made by the forward
 * (em_linear_cross_entropy); f[0] = the mean's divisor's inverse: each gradient is its saved one
 * times g f[0], in the input's dtype. */
static em_status linear_cross_entropy_backward(const ad_ctx *c, const em_tensor *g, em_tensor **gin)
{
    gin[0] = gin[1] = gin[2] = gin[3] = NULL;
    em_tensor *s = em_mul_scalar(g, c->p->f[0]);
    for (int i = 0; s && i < 2; i++)
        if (c->needs[i]) gin[i] = em_cast(em_take(em_mul(c->in[2 + i], s)), c->in_dtype[i]);
    em_release(s);
    return finish(c, gin, 2);
}

unsigned ad_rule_take_inputs(em_tensor_op op)
{
    return op == EM_TOP_CROSS_ENTROPY ? 0x1u : 0;
}

void ad_rules_conv(ad_rule *table)
{
    table[EM_TOP_CONV2D] = (ad_rule){conv2d_backward, 0x3u, false};
    table[EM_TOP_MAX_POOL2D] = (ad_rule){max_pool2d_backward, 0x1u, false};
    table[EM_TOP_AVG_POOL2D] = (ad_rule){avg_pool2d_backward, 0x0u, false};
    table[EM_TOP_CROSS_ENTROPY] = (ad_rule){cross_entropy_backward, 0x3u, false};
    table[EM_TOP_ATTENTION] = (ad_rule){attention_backward, 0xfu, true};
    table[EM_TOP_ATTENTION_QKV] = (ad_rule){attention_qkv_backward, 0x3u, true};
    table[EM_TOP_LINEAR_CROSS_ENTROPY] = (ad_rule){linear_cross_entropy_backward, 0xcu, false};
}
