/* nn_ref.h — float64 reference implementations of the nn layers as plain loops (linear, layer
 * and RMS norm, activations, multi-head attention with causal and padding masks, GPT-2's MLP and
 * block), used by tests/nn/test_*.c to check the modules, plus a helper that reads a module's
 * parameter back as doubles. Header-only; built on tests/tensor/tensor_util.h. */
#ifndef EM_TESTS_NN_REF_H
#define EM_TESTS_NN_REF_H

#include <float.h>

#include "ember/nn.h"
#include "tensor/tensor_util.h"

/* The values of a module's entry (by full name) as doubles; the caller frees. */
static inline double *nr_param(em_module *m, const char *name)
{
    em_module_entry *e = em_module_find(m, name);
    if (!e) fprintf(stderr, "no entry %s\n", name);
    assert_non_null(e);
    return tu_read(e->t);
}

/* y [n, out] = x [n, in] W + b, W stored [out, in] (PyTorch) or [in, out] (in_out). b may be NULL.
 */
static inline void nr_linear(const double *x, int64_t n, int64_t in, int64_t out, const double *w,
                             const double *b, bool in_out, double *y)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            double acc = b ? b[o] : 0;
            for (int64_t i = 0; i < in; i++)
                acc += x[r * in + i] * (in_out ? w[i * out + o] : w[o * in + i]);
            y[r * out + o] = acc;
        }
}

static inline void nr_layer_norm(const double *x, int64_t n, int64_t d, const double *w,
                                 const double *b, double eps, double *y)
{
    for (int64_t r = 0; r < n; r++) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += x[r * d + i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
        var /= (double)d;
        for (int64_t i = 0; i < d; i++)
            y[r * d + i] =
                (x[r * d + i] - mean) / sqrt(var + eps) * (w ? w[i] : 1) + (b ? b[i] : 0);
    }
}

static inline void nr_rms_norm(const double *x, int64_t n, int64_t d, const double *w, double eps,
                               double *y)
{
    for (int64_t r = 0; r < n; r++) {
        double ms = 0;
        for (int64_t i = 0; i < d; i++) ms += x[r * d + i] * x[r * d + i];
        ms /= (double)d;
        for (int64_t i = 0; i < d; i++)
            y[r * d + i] = x[r * d + i] / sqrt(ms + eps) * (w ? w[i] : 1);
    }
}

static inline double nr_act(double v, em_activation a)
{
    switch (a) {
    case EM_ACT_RELU:
        return v > 0 ? v : 0;
    case EM_ACT_GELU:
        return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case EM_ACT_GELU_TANH:
        return 0.5 * v * (1 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case EM_ACT_SILU:
        return v / (1 + exp(-v));
    case EM_ACT_TANH:
        return tanh(v);
    case EM_ACT_SIGMOID:
        return 1 / (1 + exp(-v));
    default:
        return v;
    }
}

/* The weights of an attention module read back. */
typedef struct nr_attn {
    double *wa, *ba, *wp, *bp; /* c_attn, c_proj (biases may be NULL) */
    bool in_out;
} nr_attn;

static inline nr_attn nr_attn_read(em_mha *m)
{
    nr_attn a = {0};
    a.wa = tu_read(m->c_attn->weight);
    a.ba = m->c_attn->bias ? tu_read(m->c_attn->bias) : NULL;
    a.wp = tu_read(m->c_proj->weight);
    a.bp = m->c_proj->bias ? tu_read(m->c_proj->bias) : NULL;
    a.in_out = m->c_attn->weight_in_out;
    return a;
}

static inline void nr_attn_free(nr_attn *a)
{
    free(a->wa);
    free(a->ba);
    free(a->wp);
    free(a->bp);
}

/* Multi-head self-attention on x [B, T, C] -> y [B, T, C]: direct loops over batch, head,
 * query and key; pad (NULL or [B, T] of 0/1, 1 = attend). A fully masked row attends uniformly
 * (the lowest-value fill of the module). */
static inline void nr_mha(const double *x, int64_t B, int64_t T, int64_t C, int64_t H,
                          const nr_attn *a, bool causal, const int *pad, double *y)
{
    int64_t D = C / H;
    double *qkv = malloc(sizeof(double) * (size_t)(B * T * 3 * C));
    double *o = malloc(sizeof(double) * (size_t)(B * T * C));
    double *p = malloc(sizeof(double) * (size_t)T);
    nr_linear(x, B * T, C, 3 * C, a->wa, a->ba, a->in_out, qkv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * 3 * C + h * D;
                double mx = -INFINITY;
                bool any = false;
                for (int64_t j = 0; j < T; j++) {
                    bool ok = !(causal && j > i) && !(pad && !pad[b * T + j]);
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += q[d] * k[d];
                    p[j] = ok ? s / sqrt((double)D) : -INFINITY;
                    if (ok) any = true;
                    if (p[j] > mx) mx = p[j];
                }
                double z = 0;
                for (int64_t j = 0; j < T; j++) {
                    p[j] = any ? exp(p[j] - mx) : 1;
                    z += p[j];
                }
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; j++)
                        acc += p[j] / z * qkv[(b * T + j) * 3 * C + 2 * C + h * D + d];
                    o[(b * T + i) * C + h * D + d] = acc;
                }
            }
    nr_linear(o, B * T, C, C, a->wp, a->bp, a->in_out, y);
    free(qkv);
    free(o);
    free(p);
}

/* GPT-2's MLP on x [n, C]: c_fc, activation, c_proj. */
static inline void nr_mlp(const double *x, int64_t n, int64_t C, int64_t hidden, em_mlp *m,
                          double *y)
{
    double *wf = tu_read(m->c_fc->weight), *bf = m->c_fc->bias ? tu_read(m->c_fc->bias) : NULL;
    double *wp = tu_read(m->c_proj->weight),
           *bp = m->c_proj->bias ? tu_read(m->c_proj->bias) : NULL;
    double *h = malloc(sizeof(double) * (size_t)(n * hidden));
    nr_linear(x, n, C, hidden, wf, bf, m->c_fc->weight_in_out, h);
    for (int64_t i = 0; i < n * hidden; i++) h[i] = nr_act(h[i], m->act);
    nr_linear(h, n, hidden, C, wp, bp, m->c_proj->weight_in_out, y);
    free(wf);
    free(bf);
    free(wp);
    free(bp);
    free(h);
}

/* The pre-norm block on x [B, T, C]. */
static inline void nr_block(const double *x, int64_t B, int64_t T, em_block *blk, const int *pad,
                            double *y)
{
    int64_t C = blk->attn->dim, n = B * T, hidden = blk->mlp->c_fc->out;
    size_t sz = sizeof(double) * (size_t)(n * C);
    double *t = malloc(sz), *u = malloc(sz), *h = malloc(sz);
    double *w1 = tu_read(blk->ln_1->weight),
           *b1 = blk->ln_1->bias ? tu_read(blk->ln_1->bias) : NULL;
    double *w2 = tu_read(blk->ln_2->weight),
           *b2 = blk->ln_2->bias ? tu_read(blk->ln_2->bias) : NULL;
    nr_layer_norm(x, n, C, w1, b1, blk->ln_1->eps, t);
    nr_attn a = nr_attn_read(blk->attn);
    nr_mha(t, B, T, C, blk->attn->heads, &a, true, pad, u);
    for (int64_t i = 0; i < n * C; i++) h[i] = x[i] + u[i];
    nr_layer_norm(h, n, C, w2, b2, blk->ln_2->eps, t);
    nr_mlp(t, n, C, hidden, blk->mlp, u);
    for (int64_t i = 0; i < n * C; i++) y[i] = h[i] + u[i];
    nr_attn_free(&a);
    free(w1);
    free(b1);
    free(w2);
    free(b2);
    free(t);
    free(u);
    free(h);
}

/* Randomizes every parameter of m (so that norms' ones/zeros and biases are exercised too). */
static inline bool nr_randomize_one(const char *name, em_module_entry *e, void *user)
{
    (void)name;
    em_rng *rng = user;
    if (e->is_param) assert_int_equal(em_init_uniform(e->t, -0.5, 0.5, rng), EM_OK);
    return true;
}
static inline void nr_randomize(em_module *m, uint64_t seed)
{
    em_rng rng = em_rng_new(seed);
    em_module_visit(m, nr_randomize_one, &rng);
}

#endif
