/* attention_case.h — the shared part of the fused-attention tests (test_attention.c,
 * test_attention_wgmma.c): one case's sizes, the float64 reference of naive attention and its
 * gradients, the per-dtype tolerances, and run_case, which checks em_attention's output and,
 * through em_backward, dq, dk and dv on one device. Included once per test program. */
#ifndef EMBER_TESTS_ATTENTION_CASE_H
#define EMBER_TESTS_ATTENTION_CASE_H
#include "ember/autodiff.h"
#include "ember/tensor_grad.h"
#include "tensor_util.h"

/* One case's sizes. */
typedef struct acase {
    int64_t B, H, Tq, Tk, D;
    bool causal;
    bool strided; /* q built as [B, Tq, H, D] viewed transposed (the last dim contiguous, read as
                     it is), v as [B, H, D, Tk] viewed transposed (copied first) */
    bool padded;  /* k built as [B, H, Tk, D + 1] narrowed to D (read in place, its rows not
                     aligned to 8 elements) */
} acase;

/* out, dq, dk, dv of naive attention for contiguous q [BH, Tq, D], k, v [BH, Tk, D] and the
 * gradient g of out, in float64. */
static void reference(const acase *c, double scale, const double *q, const double *k,
                      const double *v, const double *g, double *out, double *dq, double *dk,
                      double *dv)
{
    int64_t BH = c->B * c->H, Tq = c->Tq, Tk = c->Tk, D = c->D;
    double *p = malloc((size_t)Tk * sizeof *p), *dp = malloc((size_t)Tk * sizeof *dp);
    assert_true(p && dp);
    memset(dk, 0, (size_t)(BH * Tk * D) * sizeof *dk);
    memset(dv, 0, (size_t)(BH * Tk * D) * sizeof *dv);
    for (int64_t h = 0; h < BH; h++)
        for (int64_t i = 0; i < Tq; i++) {
            const double *qi = q + (h * Tq + i) * D, *gi = g + (h * Tq + i) * D;
            const double *kh = k + h * Tk * D, *vh = v + h * Tk * D;
            int64_t n = c->causal ? i + Tk - Tq + 1 : Tk; /* keys seen */
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = 0;
                for (int64_t e = 0; e < D; e++) d += qi[e] * kh[j * D + e];
                p[j] = d * scale;
                m = p[j] > m ? p[j] : m;
            }
            for (int64_t j = 0; j < n; j++) s += (p[j] = exp(p[j] - m));
            double *oi = out + (h * Tq + i) * D, *dqi = dq + (h * Tq + i) * D;
            for (int64_t e = 0; e < D; e++) oi[e] = 0;
            for (int64_t j = 0; j < n; j++) {
                p[j] /= s;
                for (int64_t e = 0; e < D; e++) oi[e] += p[j] * vh[j * D + e];
            }
            /* dp_j = g . v_j; ds_j = p_j (dp_j - g . out) */
            double delta = 0;
            for (int64_t e = 0; e < D; e++) delta += gi[e] * oi[e];
            for (int64_t e = 0; e < D; e++) dqi[e] = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = 0;
                for (int64_t e = 0; e < D; e++) d += gi[e] * vh[j * D + e];
                dp[j] = p[j] * (d - delta) * scale;
                for (int64_t e = 0; e < D; e++) {
                    dqi[e] += dp[j] * kh[j * D + e];
                    dk[(h * Tk + j) * D + e] += dp[j] * qi[e];
                    dv[(h * Tk + j) * D + e] += p[j] * gi[e];
                }
            }
        }
    free(p);
    free(dp);
}

/* Forward tolerance (error normalized by max(1, |ref|)): f16/bf16 inputs are exact and the sums
 * run in f32, so the output's own rounding dominates; f32 and f64 sum over up to Tk terms. */
static double fwd_tol(em_device *dev, em_scalar dt)
{
    return dt == EM_F16 ? 4e-3 : dt == EM_BF16 ? 2e-2 : tu_tol_on(dev, dt) * 10;
}

/* Gradient tolerance: one more rounding of the result and sums over Tq (dk, dv) or Tk (dq). */
static double grad_tol(em_device *dev, em_scalar dt)
{
    return dt == EM_F16 ? 1e-2 : dt == EM_BF16 ? 4e-2 : tu_tol_on(dev, dt) * 50;
}

static void run_case(em_device *dev, em_scalar dt, acase c, uint32_t seed)
{
    char what[200];
    snprintf(what, sizeof what, "attention %s %s B %lld H %lld Tq %lld Tk %lld D %lld%s%s%s",
             em_device_name(dev), em_scalar_name(dt), (long long)c.B, (long long)c.H,
             (long long)c.Tq, (long long)c.Tk, (long long)c.D, c.causal ? " causal" : "",
             c.strided ? " strided q, v" : "", c.padded ? " padded k" : "");
    em_scope_begin();
    int64_t BH = c.B * c.H, nq = BH * c.Tq * c.D, nk = BH * c.Tk * c.D;
    double *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nk * sizeof *k);
    double *v = malloc((size_t)nk * sizeof *v), *g = malloc((size_t)nq * sizeof *g);
    double *out = malloc((size_t)nq * sizeof *out), *dq = malloc((size_t)nq * sizeof *dq);
    double *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nk * sizeof *dv);
    assert_true(q && k && v && g && out && dq && dk && dv);
    /* scores up to about +-4 after scaling: peaked rows, not uniform ones */
    tu_fill(q, (size_t)nq, -2, 2, seed);
    tu_fill(k, (size_t)nk, -2, 2, seed + 1);
    tu_fill(v, (size_t)nk, -1, 1, seed + 2);
    tu_fill(g, (size_t)nq, -1, 1, seed + 3);
    double scale = 1.0 / sqrt((double)c.D);
    em_tensor *qt;
    if (c.strided) { /* stored [B, Tq, H, D] */
        double *st = malloc((size_t)nq * sizeof *st);
        assert_non_null(st);
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.H; h++)
                for (int64_t i = 0; i < c.Tq; i++)
                    for (int64_t e = 0; e < c.D; e++)
                        st[((b * c.Tq + i) * c.H + h) * c.D + e] =
                            q[((b * c.H + h) * c.Tq + i) * c.D + e];
        em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(c.B, c.Tq, c.H, c.D), st);
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.H; h++)
                for (int64_t i = 0; i < c.Tq; i++)
                    for (int64_t e = 0; e < c.D; e++)
                        q[((b * c.H + h) * c.Tq + i) * c.D + e] =
                            st[((b * c.Tq + i) * c.H + h) * c.D + e];
        free(st);
        qt = em_transpose(s, 1, 2);
    } else {
        qt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tq, c.D), q);
    }
    em_tensor *kt;
    if (c.padded) {
        double *st = malloc((size_t)(BH * c.Tk * (c.D + 1)) * sizeof *st);
        assert_non_null(st);
        for (int64_t r = 0; r < BH * c.Tk; r++) {
            for (int64_t e = 0; e < c.D; e++) st[r * (c.D + 1) + e] = k[r * c.D + e];
            st[r * (c.D + 1) + c.D] = 1e4; /* never read */
        }
        kt = em_narrow(tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tk, c.D + 1), st), 3, 0, c.D);
        free(st);
    } else {
        kt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tk, c.D), k);
    }
    em_tensor *vt;
    if (c.strided) { /* stored [B, H, D, Tk] */
        double *st = malloc((size_t)nk * sizeof *st);
        assert_non_null(st);
        for (int64_t h = 0; h < BH; h++)
            for (int64_t j = 0; j < c.Tk; j++)
                for (int64_t e = 0; e < c.D; e++)
                    st[(h * c.D + e) * c.Tk + j] = v[(h * c.Tk + j) * c.D + e];
        em_tensor *s = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.D, c.Tk), st);
        for (int64_t h = 0; h < BH; h++)
            for (int64_t j = 0; j < c.Tk; j++)
                for (int64_t e = 0; e < c.D; e++)
                    v[(h * c.Tk + j) * c.D + e] = st[(h * c.D + e) * c.Tk + j];
        free(st);
        vt = em_transpose(s, 2, 3);
    } else {
        vt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tk, c.D), v);
    }
    em_tensor *gt = tu_tensor(dev, dt, EM_SHAPE(c.B, c.H, c.Tq, c.D), g);
    assert_int_equal(em_set_requires_grad(qt, true), EM_OK);
    assert_int_equal(em_set_requires_grad(kt, true), EM_OK);
    assert_int_equal(em_set_requires_grad(vt, true), EM_OK);
    reference(&c, scale, q, k, v, g, out, dq, dk, dv);
    em_tensor *o = em_attention(qt, kt, vt, c.causal, scale);
    if (!o) fprintf(stderr, "%s: %s\n", what, em_last_error());
    char part[240];
    snprintf(part, sizeof part, "%s: out", what);
    tu_check(part, o, EM_SHAPE(c.B, c.H, c.Tq, c.D), out, fwd_tol(dev, dt));
    em_tensor *loss = em_sum(em_mul(o, gt), NULL, 0, false);
    em_status st = em_backward(loss, NULL);
    if (st != EM_OK) fprintf(stderr, "%s: backward: %s\n", what, em_last_error());
    assert_int_equal(st, EM_OK);
    double tol = grad_tol(dev, dt);
    snprintf(part, sizeof part, "%s: dq", what);
    tu_check(part, em_grad(qt), EM_SHAPE(c.B, c.H, c.Tq, c.D), dq, tol);
    snprintf(part, sizeof part, "%s: dk", what);
    tu_check(part, em_grad(kt), EM_SHAPE(c.B, c.H, c.Tk, c.D), dk, tol);
    snprintf(part, sizeof part, "%s: dv", what);
    tu_check(part, em_grad(vt), EM_SHAPE(c.B, c.H, c.Tk, c.D), dv, tol);
    em_scope_end(NULL, 0);
    free(q);
    free(k);
    free(v);
    free(g);
    free(out);
    free(dq);
    free(dk);
    free(dv);
}

#endif
