/* bench_decode.c — `ember bench decode`: greedy GPT-2 decoding speed with the KV cache, through
 * the batched path `ember serve` runs (em_gpt_batch_prefill, em_gpt_batch_step; see
 * src/serve/sched.c). A model of a preset (GPT-2 124M by default) with random weights, B
 * sequences of P random prompt tokens, each prefilled into its own slot (one at a time, as the
 * server admits them), then decoded together, one batched step per token, until each has N new
 * tokens: the first from its prefill, the other N - 1 from N - 1 steps. The next token is the
 * first largest logit (what em_sample_token picks at temperature 0), picked on the device
 * (em_gpt_batch_step_greedy: one id per sequence comes back) or, with --greedy host, on the host
 * from the logits (em_gpt_batch_step: every logit comes back). With --steps-per-sync K (device
 * greedy), the steps go K at a time through em_gpt_batch_steps_greedy: each step's tokens feed the
 * next on the device and the K steps' tokens come back in one read, so the host waits once per K
 * steps instead of once per step (the same tokens). A warm-up runs first: one whole
 * untimed generation of the same N tokens over the same prompts, so that every kernel — also
 * those specialized by the attended length, such as the softmax over the KV cache — is compiled
 * (and every matmul shape tuned) before the clock starts. With
 * EMBER_PROFILE=1 the profiler's report of the timed generation goes to stderr.
 * One JSON line, with the fields of the PyTorch reference (../shared/anchors/decode.py, whose
 * dtype spelling it uses) and more:
 *
 *   {"workload":"gpt2_decode","impl":"ember","dtype":"fp32","batch":1,"new_tokens":256,
 *    "tokens_per_s":...,"device":"cuda:0","device_name":"...","preset":"gpt2",
 *    "prompt_tokens":16,"greedy":"device","prefill_ms":...,"ms_per_step":...,"steps_per_sync":1}
 *
 * tokens_per_s is B * N over the whole timed generation (prefills and steps), as the reference
 * times model.generate; prefill_ms is the B prefills together, ms_per_step one batched step. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cli.h"
#include "ember/gpt.h"

enum { MAX_BATCH = 4096 };


static int usage(FILE *out)
{
    fprintf(out,
            "usage: ember bench decode [--device D] [--dtype f32|bf16|f16] [--batch B]\n"
            "                          [--prompt P] [--new N] [--preset gpt2|tiny|...] [--seed S]\n"
            "                          [--greedy device|host] [--steps-per-sync K]\n"
            "  greedy decoding with the KV cache through the batched path of `ember serve`:\n"
            "  B sequences (default 1, at most 4096) of P random prompt tokens (16), N new tokens "
            "each (256),\n"
            "  a model of the preset (gpt2) with random weights in dtype (f32) on D (cpu).\n"
            "  The next token is picked on the device (default) or on the host from the logits.\n"
            "  --steps-per-sync K: K steps queued before the host waits for their tokens (1;\n"
            "  device greedy only).\n"
            "  Prints one JSON line: tokens_per_s, prefill_ms, ms_per_step, ...\n");
    return 2;
}



/* The first largest of x[0, n). */
static int64_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* What one generation needs. */
typedef struct decode_run {
    em_device *dev;         /* the model's device */
    em_gpt_batch *b;        /* B slots */
    int64_t B, P, V;        /* sequences, prompt tokens, vocabulary */
    const int64_t *prompts; /* [B, P] */
    int64_t *slots, *tok;   /* [B]: the slots listed in a step, the tokens they take */
    float *logits;          /* [B, V] (host greedy only) */
    bool host_greedy;       /* pick from logits on the host */
    int64_t chunk;          /* steps a sync (--steps-per-sync) */
    int64_t *chunk_tok;     /* [chunk, B]: the tokens of a chunk's steps */
} decode_run;

/* The prefill of sequence i, which sets its first token. */
static em_status prefill(decode_run *r, int64_t i)
{
    const int64_t *ids = r->prompts + i * r->P;
    if (!r->host_greedy) return em_gpt_batch_prefill_greedy(r->b, i, ids, r->P, r->tok + i);
    em_status st = em_gpt_batch_prefill(r->b, i, ids, r->P, r->logits + i * r->V);
    if (st == EM_OK) r->tok[i] = argmax(r->logits + i * r->V, r->V);
    return st;
}

/* One step of every sequence, which replaces each one's token by its next. */
static em_status step(decode_run *r)
{
    if (!r->host_greedy) return em_gpt_batch_step_greedy(r->b, r->slots, r->tok, r->B, r->tok);
    em_status st = em_gpt_batch_step(r->b, r->slots, r->tok, r->B, r->logits);
    for (int64_t i = 0; st == EM_OK && i < r->B; i++)
        r->tok[i] = argmax(r->logits + i * r->V, r->V);
    return st;
}

/* k steps of every sequence without a read-back between them (k > 1, device greedy). */
static em_status step_chunk(decode_run *r, int64_t k)
{
    em_status st = em_gpt_batch_steps_greedy(r->b, r->slots, r->tok, r->B, k, r->chunk_tok);
    if (st == EM_OK) memcpy(r->tok, r->chunk_tok + (k - 1) * r->B, (size_t)r->B * sizeof *r->tok);
    return st;
}

/* Generates n tokens for every sequence; the seconds of the prefills and of the steps go to
 * *prefill_s and *steps_s. The slots are emptied afterwards. */
static em_status generate(decode_run *r, int64_t n, double *prefill_s, double *steps_s)
{
    em_status st = em_flush(); /* nothing pending from before is timed */
    if (st == EM_OK) st = em_device_sync(r->dev);
    double t0 = bu_now_s();
    for (int64_t i = 0; st == EM_OK && i < r->B; i++) st = prefill(r, i);
    double t1 = bu_now_s();
    for (int64_t s = 1; st == EM_OK && s < n;) {
        int64_t k = r->chunk < n - s ? r->chunk : n - s;
        st = k > 1 ? step_chunk(r, k) : step(r);
        s += k;
    }
    double t2 = bu_now_s();
    for (int64_t i = 0; i < r->B; i++) em_gpt_batch_clear(r->b, i);
    *prefill_s = t1 - t0;
    *steps_s = t2 - t1;
    return st;
}

/* The options. */
typedef struct decode_opts {
    const char *device, *dtype, *preset; /* --device, --dtype as given, --preset */
    bool host_greedy;                    /* --greedy host */
    em_scalar dt;                        /* the parameters' dtype */
    const char *dtype_ref;               /* the reference's spelling: fp32, bf16, fp16 */
    int64_t batch, prompt, nnew;         /* --batch, --prompt, --new */
    int64_t chunk;                       /* --steps-per-sync */
    uint64_t seed;                       /* --seed: the weights and the prompts */
} decode_opts;

/* Parses argv into o. 0; 2 with the usage on stderr; -1 after --help (the usage on stdout). */
static int parse(int argc, char **argv, decode_opts *o)
{
    *o = (decode_opts){"cpu", "f32", "gpt2", false, EM_F32, "fp32", 1, 16, 256, 1, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        }
        if (!v) return usage(stderr);
        i++;
        if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--dtype"))
            o->dtype = v;
        else if (!strcmp(a, "--preset"))
            o->preset = v;
        else if (!strcmp(a, "--batch"))
            o->batch = bu_positive(v);
        else if (!strcmp(a, "--greedy") && (!strcmp(v, "device") || !strcmp(v, "host")))
            o->host_greedy = !strcmp(v, "host");
        else if (!strcmp(a, "--prompt"))
            o->prompt = bu_positive(v);
        else if (!strcmp(a, "--new"))
            o->nnew = bu_positive(v);
        else if (!strcmp(a, "--steps-per-sync"))
            o->chunk = bu_positive(v);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || *v == '-') return usage(stderr);
        } else
            return usage(stderr);
    }
    if (o->batch < 0 || o->batch > MAX_BATCH || o->prompt < 0 || o->nnew < 0 || o->chunk <= 0)
        return usage(stderr);
    if (o->chunk > 1 && o->host_greedy) {
        fprintf(stderr, "ember bench decode: --steps-per-sync needs --greedy device\n");
        return usage(stderr);
    }
    if (!strcmp(o->dtype, "f32") || !strcmp(o->dtype, "fp32"))
        o->dt = EM_F32, o->dtype_ref = "fp32";
    else if (!strcmp(o->dtype, "bf16"))
        o->dt = EM_BF16, o->dtype_ref = "bf16";
    else if (!strcmp(o->dtype, "f16") || !strcmp(o->dtype, "fp16"))
        o->dt = EM_F16, o->dtype_ref = "fp16";
    else
        return usage(stderr);
    return 0;
}

/* The model, the batch and the buffers of a run, then the warm-up and the timed generation. */
static int bench(const decode_opts *o, em_device *dev, const em_gpt_config *cfg)
{
    int64_t B = o->batch, P = o->prompt, N = o->nnew, V = cfg->vocab_size;
    int64_t len = P + (N > 1 ? N : 1);
    if (len > cfg->block_size) len = cfg->block_size;
    int64_t warm = len - P < N ? len - P : N; /* the timed run's lengths, untimed */
    em_gpt *g = em_gpt_new(dev, o->dt, cfg, o->seed);
    em_gpt_batch *b = g ? em_gpt_batch_new(g, B, len) : NULL;
    int64_t *prompts = malloc((size_t)(B * P) * sizeof *prompts);
    int64_t *slots = malloc((size_t)B * sizeof *slots), *tok = malloc((size_t)B * sizeof *tok);
    float *logits = o->host_greedy ? malloc((size_t)(B * V) * sizeof *logits) : NULL;
    int64_t *chunk_tok = malloc((size_t)(B * o->chunk) * sizeof *chunk_tok);
    int rc = 1;
    if (!b) {
        fprintf(stderr, "ember bench decode: %s\n", em_last_error());
        goto done;
    }
    if (!prompts || !slots || !tok || !chunk_tok || (o->host_greedy && !logits)) {
        fprintf(stderr, "ember bench decode: out of memory\n");
        goto done;
    }
    uint64_t rng = o->seed ^ 0x5EEDull;
    for (int64_t i = 0; i < B * P; i++) prompts[i] = (int64_t)(bu_next_u64(&rng) % (uint64_t)V);
    for (int64_t i = 0; i < B; i++) slots[i] = i;
    decode_run r = {dev, b, B, P, V, prompts, slots, tok, logits, o->host_greedy, o->chunk, chunk_tok};
    double pre, steps;
    bool profiling = em_profile_enabled();
    em_status st = generate(&r, warm, &pre, &steps);
    if (st == EM_OK && profiling) em_profile_reset(); /* the report covers the timed part only */
    if (st == EM_OK) st = generate(&r, N, &pre, &steps);
    if (st != EM_OK) {
        fprintf(stderr, "ember bench decode: %s\n", em_last_error());
        goto done;
    }
    if (profiling) {
        fprintf(stderr,
                "ember bench decode: profile of the timed generation (%lld prefills, "
                "%lld steps)\n",
                (long long)B, (long long)(N - 1));
        em_profile_report(stderr);
    }
    printf("{\"workload\":\"gpt2_decode\",\"impl\":\"ember\",\"dtype\":\"%s\",\"batch\":%lld,"
           "\"new_tokens\":%lld,\"tokens_per_s\":%.1f,\"device\":\"%s\",\"device_name\":\"%s\","
           "\"preset\":\"%s\",\"prompt_tokens\":%lld,\"greedy\":\"%s\",\"prefill_ms\":%.3f,"
           "\"ms_per_step\":%.4f,\"steps_per_sync\":%lld}\n",
           o->dtype_ref, (long long)B, (long long)N, (double)(B * N) / (pre + steps),
           em_device_name(dev), em_device_caps(dev)->device_name, o->preset, (long long)P,
           o->host_greedy ? "host" : "device", pre * 1e3,
           N > 1 ? steps * 1e3 / (double)(N - 1) : 0.0, (long long)o->chunk);
    fflush(stdout);
    rc = 0;
done:
    free(prompts), free(slots), free(tok), free(logits), free(chunk_tok);
    em_gpt_batch_free(b);
    em_gpt_free(g);
    return rc;
}

int em_cli_bench_decode(int argc, char **argv)
{
    decode_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    em_gpt_config cfg;
    if (!em_gpt_preset(o.preset, &cfg)) {
        fprintf(stderr, "ember bench decode: %s\n", em_last_error());
        return usage(stderr);
    }
    if (o.prompt + o.nnew > cfg.block_size) {
        fprintf(stderr,
                "ember bench decode: --prompt %lld and --new %lld need %lld positions; the %s "
                "context holds %lld\n",
                (long long)o.prompt, (long long)o.nnew, (long long)(o.prompt + o.nnew), o.preset,
                (long long)cfg.block_size);
        return usage(stderr);
    }
    em_device *dev = em_device_open(o.device);
    if (!dev) {
        fprintf(stderr, "ember bench decode: %s\n", em_last_error());
        return 1;
    }
    rc = bench(&o, dev, &cfg);
    em_device_close(dev);
    return rc;
}
