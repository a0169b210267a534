/* ops_attention_decode.c — em_attention_decode: one query per (row, head) against cached keys
 * whose visible length each row reads from device memory (tensor_attention_decode.ek). A decode
 * step built on it keeps one shape however long its sequences grow, so it can be recorded once
 * and replayed (docs/graphs.md), and it is one launch where q k^T, the mask, the softmax and the
 * product with v were four. */
#include <math.h>

#include "tensor/internal.h"

enum { DEC_CUBE = 256 }; /* units per cube: at least D (at most 256) */

static bool dec_check(const char *op, const em_tensor *q, const em_tensor *k, const em_tensor *v,
                      const em_tensor *pos, double scale)
{
    char a[96], b[96], c[96], d[96];
    bool ok = q->rank == 4 && k->rank == 4 && v->rank == 4 && pos->rank == 1 &&
              em_scalar_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype &&
              pos->dtype == EM_I64 && q->shape[2] == 1 && pos->shape[0] == q->shape[0];
    for (int i = 0; ok && i < 4; i++)
        ok = (i == 2 || (k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i])) &&
             (i != 2 || v->shape[2] == k->shape[2]);
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: q %s, k %s, v %s and pos %s do not match (expected q [R, H, 1, D], k and "
                     "v [R, H, Tk, D] of q's float dtype, pos i64 [R])",
                     op, em_describe(q, a, sizeof a), em_describe(k, b, sizeof b),
                     em_describe(v, c, sizeof c), em_describe(pos, d, sizeof d));
        return false;
    }
    if (!tn_same_device(op, q, k) || !tn_same_device(op, q, v) || !tn_same_device(op, q, pos))
        return false;
    int64_t D = q->shape[3], bh = q->shape[0] * q->shape[1];
    if (D < 1 || D > EM_ATTENTION_MAX_HEAD_DIM) {
        em_set_error(EM_ERR_INVALID, "%s: head size %lld is not in 1..%d", op, (long long)D,
                     EM_ATTENTION_MAX_HEAD_DIM);
        return false;
    }
    if (!isfinite(scale)) {
        em_set_error(EM_ERR_INVALID, "%s: scale must be finite, got %g", op, scale);
        return false;
    }
    if (bh > 65535 || bh * D > (int64_t)INT32_MAX || k->shape[2] > (int64_t)INT32_MAX) {
        em_set_error(EM_ERR_INVALID, "%s: q %s and k %s are too large for one launch", op,
                     em_describe(q, a, sizeof a), em_describe(k, b, sizeof b));
        return false;
    }
    return true;
}

em_tensor *em_attention_decode(const em_tensor *q, const em_tensor *k, const em_tensor *v,
                               const em_tensor *pos, double scale)
{
    const char *op = "attention_decode";
    if (!q || !k || !v || !pos) {
        if (em_last_status() == EM_OK)
            em_set_error(EM_ERR_INVALID, "%s: NULL input", op);
        return NULL;
    }
    if (!dec_check(op, q, k, v, pos, scale)) return NULL;
    em_device *dev = q->st->dev;
    int64_t D = q->shape[3], bh = q->shape[0] * q->shape[1];
    em_tensor *out = tn_new(dev, q->dtype, 4, q->shape);
    em_tensor *qc = out ? tn_attn_view(q) : NULL, *kc = qc ? tn_attn_view(k) : NULL;
    em_tensor *vc = kc ? tn_attn_view(v) : NULL, *pc = vc ? tn_contig(pos) : NULL;
    em_status st = pc ? EM_OK : em_last_status();
    if (pc) {
        unsigned cube = DEC_CUBE;
        em_scalar ct = tn_compute_type(q->dtype);
        em_lang_bind bind[5] = {em_lang_bind_type("T", q->dtype), em_lang_bind_type("C", ct),
                                em_lang_bind_type("M", tn_math_type(dev, ct)),
                                em_lang_bind_int("D", D), em_lang_bind_int("CUBE", cube)};
        tn_arg args[6] = {tn_arg_t(qc),       tn_arg_t(kc),        tn_arg_t(vc),
                          tn_arg_flat(out), tn_arg_flat(pc), tn_arg_s(tn_scalar_arg(ct, scale))};
        uint32_t cubes[3] = {(uint32_t)bh, 1, 1}, units[3] = {cube, 1, 1};
        st = tn_launch(op, dev, "tensor_attention_decode", bind, 5, 1, cubes, units, args, 6);
    }
    em_release(qc);
    em_release(kc);
    em_release(vc);
    em_release(pc);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}
