/* ops_xent_linear.c — em_linear_cross_entropy (tensor.h): a classifier over a linear layer's
 * rows without its [N, V] logits (issue #13, peak memory: GPT-2's bf16 logits at 16 x 1024 rows
 * are 1.65 GB, the largest block of a training step). The rows go in chunks; per chunk the
 * logits (one matmul), the per-row losses (the fused classifier's forward, ops_xent.c) and, when
 * gradients are recorded, the logits' gradient written over them (its backward, the same launch
 * as the losses then: tn_xent_rows_grad reads the logits twice) and multiplied into x's rows and
 * w at once (two matmuls: what the backward of the whole block would run, in
 * the same FLOPs). w's gradient sums over the chunks in f32 and is rounded once to w's dtype.
 * The op records x and w with both gradients as saved inputs; the backward (autodiff's rule)
 * only scales them by the loss's gradient and the mean's divisor. Inside, the op computes on
 * unannotated aliases of x and w, so its parts record nothing. */
#include <math.h>
#include <stdlib.h>

#include "ember/tensor_grad.h"
#include "ember/tensor_op.h"
#include "tensor/internal.h"

/* Rows per chunk: as many as keep a chunk's logits within about 768 MiB, at least 1. Each chunk
 * adds a pass over w's f32 gradient, so fewer chunks are faster; GPT-2 124M at 16 x 1024 on the
 * H200 (docs/benchmarks.md, session 17): 7 chunks (256 MiB) 41.94 ms a step at a 7.35 GiB peak,
 * 3 chunks (this) 41.21 ms at 7.72 GiB, 2 chunks 41.14 ms at 7.97 GiB, the whole logits 40.62 ms
 * at 8.77 GiB (over torch.compile's 8.45). */
static int64_t chunk_of(int64_t N, int64_t V, em_scalar dt, int64_t asked)
{
    if (asked > 0) return asked < N ? asked : N;
    int64_t row = V * (int64_t)em_scalar_size(dt);
    int64_t n = ((int64_t)768 << 20) / (row > 0 ? row : 1);
    if (n < 1) n = 1;
    int64_t chunks = (N + n - 1) / n; /* equal chunks: no short last one */
    return chunks > 0 ? (N + chunks - 1) / chunks : 1;
}

/* Checks the operands; false with the error set, naming the shapes. */
static bool check(const char *op, const em_tensor *x, const em_tensor *w, const em_tensor *t)
{
    char a[96], b[96], c[96];
    bool ok = x->rank == 2 && w->rank == 2 && t->rank == 1 && x->shape[1] == w->shape[1] &&
              t->shape[0] == x->shape[0] && em_scalar_is_float(x->dtype) &&
              x->dtype == w->dtype && (t->dtype == EM_I32 || t->dtype == EM_I64) &&
              w->shape[0] > 0;
    if (!ok)
        em_set_error(EM_ERR_INVALID,
                     "%s: x %s, w %s and targets %s do not match (expected x [N, C] and w [V, C] "
                     "of one float dtype, V >= 1, and i32/i64 targets [N])",
                     op, em_describe(x, a, sizeof a), em_describe(w, b, sizeof b),
                     em_describe(t, c, sizeof c));
    return ok && tn_same_device(op, x, w) && tn_same_device(op, x, t);
}

/* One chunk: rows [r0, r0 + n) of x (xa, unannotated) against their classes. Adds the chunk's
 * summed loss to *sum and, with grad, stores its x gradient in *dx and its w gradient in *dw
 * (acc, several chunks: added to *dw in f32); the results belong to the enclosing scope, the
 * ones they replace are released. */
static bool chunk(const em_tensor *xa, const em_tensor *wa, const em_tensor *cls, int64_t r0,
                  int64_t n, bool grad, bool acc, em_tensor **sum, em_tensor **dx, em_tensor **dw)
{
    em_scope_begin();
    em_tensor *xc = em_narrow(xa, 0, r0, n), *cc = em_narrow(cls, 0, r0, n);
    em_tensor *lg = xc ? em_matmul(xc, em_transpose(wa, 0, 1)) : NULL; /* [n, V] */
    bool lg_ok = lg && em_realize(lg) == EM_OK;
    em_tensor *rows = NULL, *dl = NULL;
    if (lg_ok && grad) {
        /* the losses and the gradient of the chunk's summed loss (ones per row, over the logits
         * in place) in one launch */
        em_tensor *ones = em_ones(em_tensor_device(lg), tn_compute_type(em_dtype(lg)), EM_SHAPE(n));
        dl = ones ? tn_xent_rows_grad(ones, em_take(lg), cc, 0.0, &rows) : NULL;
    } else if (lg_ok) {
        rows = tn_xent_rows(lg, cc);
    }
    em_tensor *s = rows ? em_sum(rows, NULL, 0, false) : NULL;
    if (s && *sum) s = em_add(*sum, em_take(s));
    em_tensor *d = NULL, *g = NULL;
    if (s && dl) {
        d = em_matmul(dl, wa); /* [n, C] */
        g = em_matmul(em_transpose(dl, 0, 1), xc); /* [V, C] */
        /* over several chunks summed in f32 (the sum's buffer donated: updated in place) */
        if (g && acc) g = em_cast(em_take(g), EM_F32);
        if (g && acc && *dw) {
            g = em_add(em_take(*dw), em_take(g));
            *dw = NULL;
        }
    }
    /* run now: pending, d and g would keep this chunk's logits alive until read */
    bool ok = s && (!grad || (d && g && em_realize(d) == EM_OK && em_realize(g) == EM_OK)) &&
              em_realize(s) == EM_OK;
    em_tensor *keep[3] = {s, d, g};
    em_scope_end(ok ? keep : NULL, ok ? (grad ? 3 : 1) : 0);
    if (ok) {
        em_release(*sum);
        *sum = s;
        if (grad) {
            *dx = d;
            em_release(*dw);
            *dw = g;
        }
    }
    return ok;
}

em_tensor *em_linear_cross_entropy(const em_tensor *x, const em_tensor *w, const em_tensor *targets,
                                   int64_t ignore_index, int64_t chunk_rows)
{
    const char *op = "linear_cross_entropy";
    em_tensor *out = NULL, *xa = NULL, *wa = NULL;
    em_scope_begin();
    if (!x || !w || !targets || !check(op, x, w, targets)) goto done;
    int64_t N = x->shape[0], V = w->shape[0], valid = 0;
    em_tensor *cls = tn_xent_classes(op, targets, V, ignore_index, &valid);
    xa = cls ? em_tensor_alias(x) : NULL; /* the parts record nothing */
    wa = xa ? em_tensor_alias(w) : NULL;
    if (!wa) goto done;
    const em_tensor *ins[2] = {x, w};
    bool grad = tn_recording(ins, 2) && N > 0; /* no rows: a NaN loss, no gradient recorded */
    int64_t n = chunk_of(N, V, x->dtype, chunk_rows), nchunks = N ? (N + n - 1) / n : 0;
    em_tensor **dxs = calloc((size_t)(nchunks ? nchunks : 1), sizeof *dxs), *sum = NULL, *dw = NULL;
    if (!dxs) {
        em_set_error(EM_ERR_NOMEM, "%s: out of host memory", op);
        goto done;
    }
    bool ok = true;
    for (int64_t k = 0; ok && k < nchunks; k++) {
        int64_t r0 = k * n, len = N - r0 < n ? N - r0 : n;
        ok = chunk(xa, wa, cls, r0, len, grad, nchunks > 1, &sum, &dxs[k], &dw);
    }
    double inv = valid ? 1.0 / (double)valid : NAN;
    em_scalar lt = x->dtype == EM_F64 ? EM_F64 : EM_F32;
    em_tensor *loss = !ok ? NULL
                      : sum ? em_mul_scalar(sum, inv)
                            : em_full(em_tensor_device(x), lt, EM_SHAPE(), NAN);
    em_tensor *gx = loss && grad && nchunks ? em_cat(dxs, (int)nchunks, 0) : NULL;
    em_tensor *gw = loss && grad && dw ? em_cast(em_take(dw), w->dtype) : NULL;
    dw = NULL;
    free(dxs);
    if (loss && (!grad || (gx && gw))) {
        out = loss;
        if (grad) {
            em_top_params p = {0};
            p.f[0] = inv;
            const em_tensor *rec[4] = {x, w, gx, gw};
            tn_record(EM_TOP_LINEAR_CROSS_ENTROPY, &p, rec, 4, out);
        }
    }
done:
    em_release(xa);
    em_release(wa);
    em_scope_end(out ? &out : NULL, out ? 1 : 0);
    if (!out && em_last_status() != EM_OK) em_error_context("%s", op);
    if (x) tn_done(x);
    if (w) tn_done(w);
    if (targets) tn_done(targets);
    return out;
}
