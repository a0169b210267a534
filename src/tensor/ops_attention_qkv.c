/* ops_attention_qkv.c — em_attention_qkv (tensor.h) and em_attention_qkv_backward
 * (tensor_grad.h): attention over a GPT block's packed projection qkv [B, T, 3C] with the heads
 * merged in the result [B, T, C], through the kernels of em_attention (ops_attention.c).
 *
 * q, k and v are strided [B, H, T, D] views of qkv's three slices (no copies), the output is
 * written through a [B, H, T, D] view of the [B, T, C] result (the layout the next linear layer
 * reads), and the backward reads the output's gradient through the same view and writes dq, dk
 * and dv straight into the three slices of one [B, T, 3C] gradient. em_attention on narrowed
 * views of qkv gives the same values, but its head-major output must be copied to [B, T, C], and
 * the tape then copies each head-major gradient out, pads it to [B, T, 3C] with zeros and adds
 * the three pads: about five times qkv's bytes more per layer, in eight more launches. */
#include "tensor/internal.h"

/* The [B, H, T, D] view of columns col .. col + H D of t, a contiguous [B, T, W] tensor. */
static em_tensor *heads_view(const em_tensor *t, int64_t col, int64_t H, int64_t D)
{
    int64_t B = t->shape[0], T = t->shape[1], W = t->shape[2];
    return tn_view(t, 4, (int64_t[]){B, H, T, D}, (int64_t[]){T * W, D, W, 1}, t->offset + col);
}

/* Checks qkv [B, T, 3C] (float, C a multiple of heads); sets *C. false with the error set. */
static bool check_packed(const char *op, const em_tensor *qkv, int64_t heads, int64_t *C)
{
    char a[96];
    if (qkv->rank != 3 || !em_scalar_is_float(qkv->dtype) || qkv->shape[2] % 3 != 0) {
        em_set_error(EM_ERR_INVALID, "%s: qkv %s is not [B, T, 3C] of a float dtype", op,
                     em_describe(qkv, a, sizeof a));
        return false;
    }
    *C = qkv->shape[2] / 3;
    if (heads < 1 || *C % heads != 0) {
        em_set_error(EM_ERR_INVALID, "%s: %lld heads do not divide the width %lld of qkv %s", op,
                     (long long)heads, (long long)*C, em_describe(qkv, a, sizeof a));
        return false;
    }
    return true;
}

bool em_attention_qkv_fast(const em_tensor *qkv, int64_t heads)
{
    if (!qkv || qkv->rank != 3 || heads < 1 || qkv->shape[2] % (3 * heads) != 0) return false;
    return tn_attention_fast(qkv->st->dev, qkv->dtype, qkv->shape[2] / (3 * heads));
}

em_tensor *em_attention_qkv(const em_tensor *qkv, int64_t heads, bool causal, double scale)
{
    const char *op = "attention_qkv";
    em_tensor *out = NULL, *lse = NULL, *src = NULL, *q = NULL, *k = NULL, *v = NULL, *o = NULL;
    int64_t C;
    if (!qkv || !check_packed(op, qkv, heads, &C)) goto done;
    int64_t B = qkv->shape[0], T = qkv->shape[1], D = C / heads;
    src = tn_contig(qkv);
    q = src ? heads_view(src, 0, heads, D) : NULL;
    k = q ? heads_view(src, C, heads, D) : NULL;
    v = k ? heads_view(src, 2 * C, heads, D) : NULL;
    out = v ? tn_new(qkv->st->dev, qkv->dtype, 3, (int64_t[]){B, T, C}) : NULL;
    o = out ? heads_view(out, 0, heads, D) : NULL;
    lse = o ? tn_new(qkv->st->dev, tn_compute_type(qkv->dtype), 3, (int64_t[]){B, heads, T}) : NULL;
    if (!lse || tn_attention_forward_into(op, q, k, v, causal, scale, o, lse) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) {
        em_top_params p = {0};
        p.f[0] = scale;
        p.flag = causal;
        p.k = heads;
        const em_tensor *in[2] = {qkv, lse};
        tn_record(EM_TOP_ATTENTION_QKV, &p, in, 2, out);
    }
    em_release(q);
    em_release(k);
    em_release(v);
    em_release(o);
    em_release(src);
    em_release(lse);
    tn_done(qkv);
    return out;
}

em_tensor *em_attention_qkv_backward(const em_tensor *grad_out, const em_tensor *qkv,
                                     const em_tensor *out, const em_tensor *lse, int64_t heads,
                                     bool causal, double scale)
{
    const char *op = "attention_qkv backward";
    char a[96], b[96], c[96];
    int64_t C;
    if (!grad_out || !qkv || !out || !lse) {
        if (em_last_status() == EM_OK) em_set_error(EM_ERR_INVALID, "%s: NULL input", op);
        return NULL;
    }
    if (!check_packed(op, qkv, heads, &C)) return NULL;
    int64_t B = qkv->shape[0], T = qkv->shape[1], D = C / heads;
    bool ok = grad_out->rank == 3 && out->rank == 3 && grad_out->dtype == qkv->dtype &&
              out->dtype == qkv->dtype;
    int64_t want[3] = {B, T, C};
    for (int i = 0; ok && i < 3; i++) ok = grad_out->shape[i] == want[i] && out->shape[i] == want[i];
    if (!ok) {
        em_set_error(EM_ERR_INVALID, "%s: grad %s and out %s do not match qkv %s (expected [B, T, C])", op,
                     em_describe(grad_out, a, sizeof a), em_describe(out, b, sizeof b),
                     em_describe(qkv, c, sizeof c));
        return NULL;
    }
    em_tensor *src = tn_contig(qkv), *g = src ? tn_contig(grad_out) : NULL, *oc = g ? tn_contig(out) : NULL;
    em_tensor *grad = oc ? tn_new(qkv->st->dev, qkv->dtype, 3, qkv->shape) : NULL;
    em_tensor *views[8] = {NULL};
    bool made = grad != NULL;
    for (int i = 0; made && i < 3; i++) {
        made = (views[i] = heads_view(src, i * C, heads, D)) && (views[3 + i] = heads_view(grad, i * C, heads, D));
    }
    made = made && (views[6] = heads_view(g, 0, heads, D)) && (views[7] = heads_view(oc, 0, heads, D));
    if (!made || tn_attention_backward_into(op, views[6], views[0], views[1], views[2], views[7], lse, causal, scale,
                                            views[3], views[4], views[5]) != EM_OK) {
        em_release(grad);
        grad = NULL;
    }
    for (int i = 0; i < 8; i++) em_release(views[i]);
    em_release(src);
    em_release(g);
    em_release(oc);
    return grad;
}
