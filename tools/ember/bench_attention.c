/* bench_attention.c — `ember bench attention`: the fused attention's forward and backward
 * (em_attention and its gradient, docs/attention.md) on random q, k, v [B, H, T, D] and a random
 * output gradient, timed apart on preallocated outputs (tn_attention_forward_into and
 * tn_attention_backward_into), so the figures are the kernels' and nothing else. Each pass runs
 * untimed first (compilation), then for 0.3 s to warm the clocks up, then three timed rounds of
 * --iters calls; the best round counts. One JSON line, with the fields of
 * scripts/attention_ref.py (PyTorch's flash attention on the same shapes):
 *
 *   {"bench":"attention","impl":"ember","device":"cuda:0","device_name":"...","dtype":"bf16",
 *    "batch":16,"heads":12,"seq":1024,"dim":64,"causal":true,"fwd_ms":...,"bwd_ms":...,
 *    "fwd_tflops":...,"bwd_tflops":...,"fast":true,"tiles":"1:64:1:48:1:64"}
 *
 * fast: em_attention_fast (the matrix-unit kernels ran); tiles: the wgmma kernels' tiles in
 * effect (tn_attention_tiles: EMBER_ATTENTION_TILES where it is valid, else the defaults).
 *
 * The TFLOP/s count the model's work as flash attention's papers do: 4 B H Tq Tk D for the
 * forward's two products and 2.5 times that for the backward's five (both halved, to the keys
 * each query sees, under --causal), whatever the kernels recompute. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cli.h"
#include "ember/tensor.h"
#include "tensor/internal.h"

typedef struct attn_opts {
    const char *device, *dtype;
    em_scalar dt;
    int64_t B, H, T, D, iters;
    bool causal;
} attn_opts;

static int usage(FILE *out)
{
    fprintf(out, "usage: ember bench attention [--device D] [--dtype bf16|f16|f32] [--batch B]\n"
                 "                             [--heads H] [--seq T] [--dim D] [--no-causal]\n"
                 "                             [--iters N]\n"
                 "  the fused attention's forward and backward on random q, k, v [B, H, T, D]\n"
                 "  (defaults: GPT-2's 16 x 12 x 1024 x 64, causal, bf16, on cpu), N calls a\n"
                 "  round (default 20; 2 on the CPU). Prints one JSON line: fwd_ms, bwd_ms and\n"
                 "  their TFLOP/s.\n");
    return 2;
}

static int parse(int argc, char **argv, attn_opts *o)
{
    *o = (attn_opts){"cpu", "bf16", EM_BF16, 16, 12, 1024, 64, 0, true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        int64_t *num = !strcmp(a, "--batch")   ? &o->B
                       : !strcmp(a, "--heads") ? &o->H
                       : !strcmp(a, "--seq")   ? &o->T
                       : !strcmp(a, "--dim")   ? &o->D
                       : !strcmp(a, "--iters") ? &o->iters
                                               : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--no-causal")) {
            o->causal = false;
        } else if (!strcmp(a, "--device") && has) {
            o->device = argv[++i];
        } else if (!strcmp(a, "--dtype") && has) {
            o->dtype = argv[++i];
        } else if (num && has) {
            if ((*num = bu_positive(argv[++i])) < 0) {
                fprintf(stderr, "ember bench attention: %s needs a positive integer, got '%s'\n", a,
                        argv[i]);
                return usage(stderr);
            }
        } else {
            fprintf(stderr, "ember bench attention: unexpected argument '%s'\n", a);
            return usage(stderr);
        }
    }
    if (!strcmp(o->dtype, "bf16"))
        o->dt = EM_BF16;
    else if (!strcmp(o->dtype, "f16") || !strcmp(o->dtype, "fp16"))
        o->dt = EM_F16, o->dtype = "f16";
    else if (!strcmp(o->dtype, "f32") || !strcmp(o->dtype, "fp32"))
        o->dt = EM_F32, o->dtype = "f32";
    else
        return usage(stderr);
    return 0;
}

/* The operands and outputs of one configuration. */
typedef struct attn_run {
    em_tensor *q, *k, *v, *g; /* inputs: [B, H, T, D] */
    em_tensor *out, *lse;     /* the forward's outputs */
    em_tensor *dq, *dk, *dv;  /* the backward's */
    bool causal;
    double scale;
} attn_run;

static em_status forward(attn_run *r)
{
    return tn_attention_forward_into("bench attention", r->q, r->k, r->v, r->causal, r->scale,
                                     r->out, r->lse);
}

static em_status backward(attn_run *r)
{
    return tn_attention_backward_into("bench attention", r->g, r->q, r->k, r->v, r->out, r->lse,
                                      r->causal, r->scale, r->dq, r->dk, r->dv);
}

/* Seconds per call of pass (the best of three rounds of iters calls, after a warm-up), or -1. */
static double time_pass(em_device *dev, em_status (*pass)(attn_run *), attn_run *r, int64_t iters)
{
    if (pass(r) != EM_OK || em_device_sync(dev) != EM_OK) return -1;
    double t0 = bu_now_s();
    while (bu_now_s() - t0 < 0.3) {
        if (pass(r) != EM_OK || em_device_sync(dev) != EM_OK) return -1;
    }
    double best = -1;
    for (int round = 0; round < 3; round++) {
        double s = bu_now_s();
        for (int64_t i = 0; i < iters; i++)
            if (pass(r) != EM_OK) return -1;
        if (em_device_sync(dev) != EM_OK) return -1;
        double t = (bu_now_s() - s) / (double)iters;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

int em_cli_bench_attention(int argc, char **argv)
{
    attn_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    em_device *dev = em_device_open(o.device);
    if (!dev) {
        fprintf(stderr, "ember bench attention: %s\n", em_last_error());
        return 1;
    }
    if (!o.iters) o.iters = strcmp(em_device_caps(dev)->target, "c") ? 20 : 2;
    int64_t shape[4] = {o.B, o.H, o.T, o.D};
    em_rng rng = em_rng_new(0xA77E);
    attn_run r = {.causal = o.causal, .scale = 1.0 / sqrt((double)o.D)};
    em_tensor **in[4] = {&r.q, &r.k, &r.v, &r.g};
    rc = 1;
    for (int i = 0; i < 4; i++)
        if (!(*in[i] = em_randn(dev, o.dt, EM_SHAPE(o.B, o.H, o.T, o.D), &rng))) goto fail;
    em_tensor **outs[4] = {&r.out, &r.dq, &r.dk, &r.dv};
    for (int i = 0; i < 4; i++)
        if (!(*outs[i] = tn_new(dev, o.dt, 4, shape))) goto fail;
    if (!(r.lse = tn_new(dev, tn_compute_type(o.dt), 3, shape))) goto fail;
    double fwd = time_pass(dev, forward, &r, o.iters);
    double bwd = fwd > 0 ? time_pass(dev, backward, &r, o.iters) : -1;
    if (fwd < 0 || bwd < 0) goto fail;
    /* the model's work: 4 B H T T D for the forward (T (T + 1) / 2 query-key pairs causal) */
    double pairs = o.causal ? (double)o.T * (double)(o.T + 1) / 2 : (double)o.T * (double)o.T;
    double flop = 4.0 * (double)(o.B * o.H) * pairs * (double)o.D;
    char tiles[64];
    tn_attention_tiles(o.D, tiles, sizeof tiles);
    printf("{\"bench\":\"attention\",\"impl\":\"ember\",\"device\":\"%s\",\"device_name\":\"%s\","
           "\"dtype\":\"%s\",\"batch\":%lld,\"heads\":%lld,\"seq\":%lld,\"dim\":%lld,"
           "\"causal\":%s,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"fwd_tflops\":%.4f,"
           "\"bwd_tflops\":%.4f,\"fast\":%s,\"tiles\":\"%s\"}\n",
           em_device_name(dev), em_device_caps(dev)->device_name, o.dtype, (long long)o.B,
           (long long)o.H, (long long)o.T, (long long)o.D, o.causal ? "true" : "false", fwd * 1e3,
           bwd * 1e3, flop / fwd * 1e-12, 2.5 * flop / bwd * 1e-12,
           em_attention_fast(r.q) ? "true" : "false", tiles);
    fflush(stdout);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "ember bench attention: %s\n", em_last_error());
    for (int i = 0; i < 4; i++) em_release(*in[i]), em_release(*outs[i]);
    em_release(r.lse);
    em_device_close(dev);
    return rc;
}
