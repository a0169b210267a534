/* sample.c — picking the next token from one row of logits, on the host: repetition penalty
 * (CTRL-style), temperature, top-k, top-p (nucleus), then a draw from the remaining distribution
 * with a small counter-free generator (splitmix64), so a seed reproduces a sample exactly on any
 * device. Temperature 0 is greedy (the first largest logit). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ember/gpt.h"

/* splitmix64: advances *s and returns 64 random bits. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *s)
{
    return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

typedef struct cand {
    double v;  /* logit, then probability */
    int64_t i; /* token id */
} cand;

/* Descending by value, ascending id among equals (a deterministic order). */
static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Moves the k first candidates in cmp_cand's order to c[0..k), sorted, in O(vocab log k): a
 * heap of the k best seen so far, whose root is the worst of them. The same prefix a full sort
 * gives, since cmp_cand is a total order. */
static void sift_down(cand *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && cmp_cand(&h[l], &h[w]) > 0) w = l;
        if (r < n && cmp_cand(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void top_k_sorted(cand *c, int64_t vocab, int64_t k)
{
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int64_t i = k; i < vocab; i++)
        if (cmp_cand(&c[i], &c[0]) < 0) {
            c[0] = c[i];
            sift_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

int64_t em_sample_token(const float *logits, int64_t vocab, const int64_t *history, int64_t nhist,
                        const em_sample_config *cfg, uint64_t *rng_state)
{
    if (!logits || vocab <= 0 || !cfg) {
        em_set_error(EM_ERR_INVALID, "em_sample_token: no logits");
        return -1;
    }
    cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c) {
        em_set_error(EM_ERR_NOMEM, "em_sample_token: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < vocab; i++) c[i] = (cand){logits[i], i};
    /* Repetition penalty: once per distinct token of the history. */
    double rp = cfg->repetition_penalty;
    if (rp > 0 && rp != 1.0 && history && nhist > 0) {
        uint8_t *seen = calloc((size_t)vocab, 1);
        if (!seen) {
            free(c);
            em_set_error(EM_ERR_NOMEM, "em_sample_token: out of memory");
            return -1;
        }
        for (int64_t h = 0; h < nhist; h++) {
            int64_t t = history[h];
            if (t < 0 || t >= vocab || seen[t]) continue;
            seen[t] = 1;
            c[t].v = c[t].v > 0 ? c[t].v / rp : c[t].v * rp;
        }
        free(seen);
    }
    int64_t pick = 0;
    if (cfg->temperature <= 0) { /* greedy */
        for (int64_t i = 1; i < vocab; i++)
            if (c[i].v > c[pick].v) pick = i;
        free(c);
        return pick;
    }
    for (int64_t i = 0; i < vocab; i++) c[i].v /= cfg->temperature;
    int64_t n = vocab;
    if (cfg->top_k > 0 && cfg->top_k < n) n = cfg->top_k;
    if (n < vocab)
        top_k_sorted(c, vocab, n);
    else
        qsort(c, (size_t)vocab, sizeof *c, cmp_cand);
    /* Softmax over the n kept (the largest first, so no overflow). */
    double mx = c[0].v, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        c[i].v = c[i].v == -INFINITY ? 0.0 : exp(c[i].v - mx);
        sum += c[i].v;
    }
    for (int64_t i = 0; i < n; i++) c[i].v /= sum;
    /* Nucleus: the smallest prefix whose mass reaches top_p (at least one token). */
    if (cfg->top_p > 0 && cfg->top_p < 1) {
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += c[i].v;
            if (cum >= cfg->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int64_t i = 0; i < n; i++) sum += c[i].v;
        for (int64_t i = 0; i < n; i++) c[i].v /= sum;
    }
    double u = next_unit(rng_state), acc = 0;
    pick = c[n - 1].i;
    for (int64_t i = 0; i < n; i++) {
        acc += c[i].v;
        if (u < acc) {
            pick = c[i].i;
            break;
        }
    }
    free(c);
    return pick;
}
