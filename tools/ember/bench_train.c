/* bench_train.c — `ember bench train-gpt2`: GPT-2 training speed, the workload of the PyTorch
 * reference ../shared/anchors/gpt2_train.py (issue #13). A model of the gpt2 preset (124M;
 * --layers/--dim/--heads resize it) with random weights trains on random tokens through the same
 * trainer as `ember train` (em_trainer_step: forward, loss, backward, clipping at 1.0, AdamW at
 * lr 6e-4 with betas 0.9/0.95 and weight decay 0.1; the vocabulary padded to 50304, no dropout,
 * tokens drawn from GPT-2's 50257), bf16 compute with f32 master weights unless --fp32. W warm-up steps (kernels compiled, pool filled), then N timed steps. One JSON line with
 * the reference's fields and the device:
 *
 *   {"workload":"gpt2_train","impl":"ember","device":"cuda:0","gpu":"NVIDIA H200","dtype":"bf16",
 *    "batch":16,"seq":1024,"layers":12,"dim":768,"params":...,"ms_per_step":...,
 *    "tokens_per_s":...,"model_tflops":...,"peak_mem_gib":...,"loss":...,"fusion":true,
 *    "launches_per_step":...,"fused_launches_per_step":...,"gib_read_per_step":...,
 *    "gib_written_per_step":...,"recompute":false,"peak_mem_warmup_gib":...,"graph":false}
 *
 * The last five are ember's own: whether fusion was on (EMBER_FUSION=0 turns it off) and, per
 * timed step, the tensor layer's launches (fused ones among them) and bytes read and written
 * (em_tensor_stats: the bound views, a model of the traffic; docs/fusion.md).
 * model_tflops counts 6 * params + 6 * layers * dim * seq FLOPs per token, as the reference
 * (and llm.c) does; peak_mem_gib is the device pool's high-water mark over the timed steps (the
 * counter is reset after the warm-up, as the reference resets its own), peak_mem_warmup_gib that
 * of the warm-up (whose first step autotunes the matmuls); both count the blocks the pool holds
 * (sizes rounded up to its classes). peak_mem_requested_gib is the timed steps' peak of the bytes
 * asked for — what the reference's torch.cuda.max_memory_allocated counts. The random tokens are written as one shard in a temporary folder, removed at exit.
 * With EMBER_PROFILE=1 the profiler's report of the timed steps (docs/profiling.md) goes to
 * stderr: launches, host and device time per kernel. */
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "ember/data.h"
#include "ember/gpt.h"
#include "ember/runtime.h"
#include "ember/train.h"


static int usage(FILE *out)
{
    fprintf(out,
            "usage: ember bench train-gpt2 [--device D] [--batch B] [--seq T] [--steps N]\n"
            "                              [--warmup W] [--layers L] [--dim C] [--heads H]\n"
            "                              [--preset P] [--fp32] [--recompute] [--graph]\n"
            "                              [--seed S]\n"
            "  GPT-2 training speed on random tokens: a model of the preset (gpt2) with random\n"
            "  weights, B sequences (16) of T tokens (1024), W warm-up steps (5), then N timed\n"
            "  steps (30); bf16 compute with f32 master weights unless --fp32. D: the best\n"
            "  device present by default. --recompute: backward recomputes elementwise results\n"
            "  and norms instead of keeping them. --graph: the step is recorded once and replayed\n"
            "  as a runtime graph. Prints one JSON line: tokens_per_s, ms_per_step,\n"
            "  model_tflops, peak_mem_gib, loss, ...\n");
    return 2;
}


typedef struct train_opts {
    const char *device, *preset;
    int64_t batch, seq, steps, warmup, layers, dim, heads; /* 0: the preset's */
    bool fp32;
    uint64_t seed;
    bool recompute;
    bool graph; /* --graph: the step replayed as a recorded graph */
} train_opts;

/* Parses argv into o. 0; 2 with the usage on stderr; -1 after --help. */
static int parse(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){NULL, "gpt2", 16, 1024, 30, 5, 0, 0, 0, false, 0, false, false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--fp32")) {
            o->fp32 = true;
            continue;
        }
        if (!strcmp(a, "--recompute")) {
            o->recompute = true;
            continue;
        }
        if (!strcmp(a, "--graph")) {
            o->graph = true;
            continue;
        }
        int64_t *n = !strcmp(a, "--batch")    ? &o->batch
                     : !strcmp(a, "--seq")    ? &o->seq
                     : !strcmp(a, "--steps")  ? &o->steps
                     : !strcmp(a, "--warmup") ? &o->warmup
                     : !strcmp(a, "--layers") ? &o->layers
                     : !strcmp(a, "--dim")    ? &o->dim
                     : !strcmp(a, "--heads")  ? &o->heads
                                              : NULL;
        if (!v) {
            fprintf(stderr, "ember bench train-gpt2: %s needs a value\n", a);
            return usage(stderr);
        }
        i++;
        if (n) {
            if ((*n = bu_positive(v)) < 0) {
                fprintf(stderr, "ember bench train-gpt2: %s takes a positive integer, not '%s'\n",
                        a, v);
                return usage(stderr);
            }
        } else if (!strcmp(a, "--device")) {
            o->device = v;
        } else if (!strcmp(a, "--preset")) {
            em_gpt_config c;
            if (!em_gpt_preset(v, &c)) {
                fprintf(stderr, "ember bench train-gpt2: %s\n", em_last_error());
                return usage(stderr);
            }
            o->preset = v;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || *v == '-') {
                fprintf(stderr, "ember bench train-gpt2: --seed takes a number, not '%s'\n", v);
                return usage(stderr);
            }
        } else {
            fprintf(stderr, "ember bench train-gpt2: unknown option '%s'\n", a);
            return usage(stderr);
        }
    }
    return 0;
}


static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Writes enough random tokens of [0, vocab) for every step (each step reads B * (T + 1) tokens)
 * to dir/train_000.bin, a shard of the model's (padded) vocabulary. */
static em_status write_tokens(const char *dir, const train_opts *o, int64_t vocab,
                              int64_t padded)
{
    size_t n = (size_t)((o->steps + o->warmup + 1) * o->batch * (o->seq + 1));
    uint32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return em_set_error(EM_ERR_NOMEM, "bench train-gpt2: out of memory for %zu tokens", n);
    uint64_t s = o->seed ^ 0x5eedull;
    for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)(bu_next_u64(&s) % (uint64_t)vocab);
    char path[4200];
    snprintf(path, sizeof path, "%s/train_000.bin", dir);
    em_status st = em_shard_write(path, ids, n, (uint32_t)padded);
    free(ids);
    return st;
}

/* The config of the run: the preset resized, the reference's optimizer, nothing periodic. */
static bool configure(const train_opts *o, const char *dir, em_train_config *c, int64_t *vocab)
{
    em_train_config_default(c);
    if (!em_gpt_preset(o->preset, &c->model)) { /* checked by parse */
        fprintf(stderr, "ember bench train-gpt2: %s\n", em_last_error());
        return false;
    }
    *vocab = c->model.vocab_size;
    /* as the reference: the vocabulary padded to a multiple of 64 (50304), no dropout */
    c->model.vocab_size = (c->model.vocab_size + 63) / 64 * 64;
    c->model.dropout = 0;
    if (o->layers) c->model.n_layer = o->layers;
    if (o->dim) c->model.n_embd = o->dim;
    if (o->heads) c->model.n_head = o->heads;
    if (c->model.block_size < o->seq) c->model.block_size = o->seq;
    c->data = dir;
    c->val_data = dir;
    c->device = o->device;
    c->bf16 = !o->fp32;
    c->recompute = o->recompute;
    c->graph = o->graph;
    c->batch = (int)o->batch;
    c->seq = (int)o->seq;
    c->grad_accum = 1;
    c->max_steps = o->steps + o->warmup;
    c->lr.kind = EM_LR_CONSTANT;
    c->lr.base = 6e-4;
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->grad_clip = 1.0;
    c->eval_every = 0;
    c->sample_every = -1;
    c->ckpt_every = 0;
    c->out_dir = dir;
    c->seed = o->seed;
    c->shuffle = false;
    return true;
}

static int run(const train_opts *o, const char *dir)
{
    em_train_config c;
    int64_t vocab;
    if (!configure(o, dir, &c, &vocab)) return 1;
    if (write_tokens(dir, o, vocab, c.model.vocab_size) != EM_OK) {
        fprintf(stderr, "ember bench train-gpt2: %s\n", em_last_error());
        return 1;
    }
    em_trainer *t = em_trainer_new(&c);
    if (!t) {
        fprintf(stderr, "ember bench train-gpt2: %s\n", em_last_error());
        return 1;
    }
    em_train_info info;
    em_trainer_info(t, &info);
    em_train_metrics m = {0};
    em_status st = EM_OK;
    for (int64_t i = 0; st == EM_OK && i < o->warmup; i++) st = em_trainer_step(t, &m);
    em_device *dev = em_gpt_device(em_trainer_model(t));
    if (st == EM_OK) st = em_flush(); /* pending fused work runs before the clock reads */
    if (st == EM_OK) st = em_device_sync(dev);
    bool profiling = em_profile_enabled();
    if (st == EM_OK && profiling) em_profile_reset(); /* the report covers the timed steps only */
    /* the peak of the timed steps, as the reference's (it resets its counter after the warm-up,
     * whose first step also autotunes the matmuls) */
    em_pool_stats pw;
    em_device_pool_stats(dev, &pw);
    em_device_pool_reset_peak(dev);
    em_tensor_stats s0 = em_tensor_stats_get();
    double t0 = bu_now_s();
    for (int64_t i = 0; st == EM_OK && i < o->steps; i++) st = em_trainer_step(t, &m);
    if (st == EM_OK) st = em_flush(); /* pending fused work runs before the clock reads */
    if (st == EM_OK) st = em_device_sync(dev);
    double dt = (bu_now_s() - t0) / (double)o->steps;
    em_tensor_stats s1 = em_tensor_stats_get();
    double per = (double)o->steps, gib = (double)(1ull << 30);
    int rc = 0;
    if (st != EM_OK) {
        fprintf(stderr, "ember bench train-gpt2: %s\n", em_last_error());
        rc = 1;
    } else {
        if (profiling) {
            fprintf(stderr, "ember bench train-gpt2: profile of the %lld timed steps\n",
                    (long long)o->steps);
            em_profile_report(stderr);
        }
        em_pool_stats ps;
        em_device_pool_stats(dev, &ps);
        const char *pk = getenv("EMBER_POOL_PEAK");
        if (pk && *pk && strcmp(pk, "0")) {
            em_pool_bucket bk[16];
            size_t nb = em_device_pool_peak_buckets(dev, bk, 16);
            fprintf(stderr, "ember bench train-gpt2: peak %.3f GiB, reached before kernel %s (launch "
                    "%llu of the timed steps' %llu); live blocks then:\n",
                    (double)ps.peak_in_use / (double)(1ull << 30),
                    ps.peak_kernel[0] ? ps.peak_kernel : "(none)",
                    (unsigned long long)ps.peak_launch,
                    (unsigned long long)(s1.launches - s0.launches));
            for (size_t i = 0; i < nb; i++)
                fprintf(stderr, "  >= %10.3f MiB: %6llu blocks, %9.3f MiB\n",
                        (double)bk[i].min_bytes / 1048576.0, (unsigned long long)bk[i].count,
                        (double)bk[i].bytes / 1048576.0);
            fprintf(stderr, "  largest buffers (bytes):");
            for (size_t i = 0; i < sizeof(ps.peak_largest) / sizeof(ps.peak_largest[0]) && ps.peak_largest[i]; i++)
                fprintf(stderr, " %llu", (unsigned long long)ps.peak_largest[i]);
            fprintf(stderr, "\n");
        }
        double tokens = (double)(o->batch * o->seq);
        double flops = 6.0 * (double)info.num_params +
                       6.0 * (double)(c.model.n_layer * c.model.n_embd * o->seq);
        printf("{\"workload\":\"gpt2_train\",\"impl\":\"ember\",\"device\":\"%s\",\"gpu\":\"%s\","
               "\"dtype\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"layers\":%lld,\"dim\":%lld,"
               "\"params\":%lld,\"ms_per_step\":%.2f,\"tokens_per_s\":%.0f,"
               "\"model_tflops\":%.1f,\"peak_mem_gib\":%.2f,\"loss\":%.4f,\"fusion\":%s,"
               "\"launches_per_step\":%.0f,\"fused_launches_per_step\":%.0f,"
               "\"gib_read_per_step\":%.4f,\"gib_written_per_step\":%.4f,\"recompute\":%s,"
               "\"peak_mem_warmup_gib\":%.2f,\"peak_mem_requested_gib\":%.2f,\"graph\":%s}\n",
               info.device, info.device_desc, info.bf16 ? "bf16" : "fp32", (long long)o->batch,
               (long long)o->seq, (long long)c.model.n_layer, (long long)c.model.n_embd,
               (long long)info.num_params, dt * 1e3, tokens / dt, flops * tokens / dt / 1e12,
               (double)ps.peak_in_use / (double)(1ull << 30), m.loss, em_fusion_enabled() ? "true" : "false",
               (double)(s1.launches - s0.launches) / per, (double)(s1.fused_launches - s0.fused_launches) / per,
               (double)(s1.bytes_read - s0.bytes_read) / per / gib,
               (double)(s1.bytes_written - s0.bytes_written) / per / gib,
               o->recompute ? "true" : "false", (double)pw.peak_in_use / gib,
               (double)ps.peak_requested / gib, em_trainer_graph(t) ? "true" : "false");
        fflush(stdout);
    }
    em_trainer_free(t);
    return rc;
}

int em_cli_bench_train(int argc, char **argv)
{
    train_opts o;
    int p = parse(argc, argv, &o);
    if (p) return p < 0 ? 0 : p;
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/ember-bench-train-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ember bench train-gpt2: cannot create a folder in %s: %s\n",
                tmp && *tmp ? tmp : "/tmp", strerror(errno));
        return 1;
    }
    int rc = run(&o, dir);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
