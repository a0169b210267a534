/* train.c — `ember train`: trains a GPT (ember/train.h) on token shards or a text file, with the
 * dashboard: full screen on a terminal, plain log lines otherwise. Writes the checkpoint, the
 * tokenizer, metrics.jsonl and loss.svg into --out. Started by `mpirun -np N`, it trains data
 * parallel (ember/dist.h, docs/distributed.md): rank 0 shows the dashboard and writes the files,
 * the other ranks are quiet, and an error on any rank ends them all. */
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/train.h"
#include "cli.h"
#include "gen_common.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ember train --data PATH [options]\n\n"
        "Trains a GPT and writes OUT/ckpt.safetensors, OUT/tokenizer.json, OUT/metrics.jsonl\n"
        "(one JSON object per line) and OUT/loss.svg. PATH is a folder from `ember data prepare`\n"
        "(train_*.bin, val_*.bin, tokenizer.json), a shard glob, or a text file (tokenized here,\n"
        "characters by default, the first --val-fraction held out for validation).\n\n"
        "model:    --preset tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl (tiny)  --init-from CKPT\n"
        "          --vocab-size N (default: the tokenizer's)  --block-size N  --n-layer N\n"
        "          --n-head N  --n-embd N  --dropout P  --no-bias  --untied\n"
        "data:     --data PATH  --val-data GLOB  --tokenizer char|gpt2|FILE  --val-fraction F\n"
        "          --no-shuffle (batches in the data's order instead of a random one)\n"
        "device:   --device auto|cpu|cuda:0|vulkan:0|opencl:0 (auto: the best present)  --bf16\n"
        "          --recompute (backward recomputes elementwise results and norms: less memory)\n"
        "          --graph (each step recorded once and replayed as a runtime graph)\n"
        "batches:  --batch B (16)  --seq T (block size)  --grad-accum N (1)\n"
        "          --steps N (1000; with --time and no --steps: no step limit)\n"
        "          --time SECONDS (stop, with a checkpoint, after this long; the schedule then\n"
        "          spans the steps expected to fit in it)\n"
        "optim:    --lr LR (5e-3 for the tiny preset from scratch, else 1e-3)\n"
        "          --min-lr LR (a tenth of --lr)  --warmup N (50)\n"
        "          --schedule cosine|linear|constant|step (cosine)  --weight-decay W (0.1)\n"
        "          --beta1 B (0.9)  --beta2 B (0.95)  --eps E (1e-8)\n"
        "          --grad-clip C (1.0; 0 = off)\n"
        "periodic: --eval-every N (100)  --eval-batches N (10)  --sample-every N (500; -1 never)\n"
        "          --sample-tokens N (200)  --ckpt-every N (500)  --log-every N (1)\n"
        "output:   --out DIR (out)  --resume  --seed S (1337)\n"
        "          --dashboard auto|tui|plain|quiet (auto: full screen on a terminal)\n"
        "parallel: --dist auto|off|mpi|nccl (auto: data parallel when started by mpirun -np N;\n"
        "          NCCL for CUDA devices)  --bucket-mb MB (25: gradient all-reduce buckets)\n"
        "          --zero1 (shard the AdamW state over the ranks)\n"
        "          (mpirun -np N ember train ...: N processes, each a share of the batches)\n");
}

/* The learning rate when --lr is not given: 5e-3 for the tiny preset trained from scratch (it
 * learns fastest there, docs/gpt.md), else 1e-3 (larger models, fine-tuning from --init-from). */
static double default_lr(const char *preset, const char *init_from)
{
    return strcmp(preset, "tiny") == 0 && !init_from ? 5e-3 : 1e-3;
}

int em_cli_train(int argc, char **argv)
{
    em_train_config c;
    em_train_config_default(&c);
    const char *preset = "tiny", *schedule = "cosine", *dash = "auto", *dist = "auto";
    int64_t vocab = -1, block = -1, layers = -1, heads = -1, embd = -1, warmup = -1;
    int64_t steps = INT64_MIN; /* INT64_MIN: not given */
    double dropout = -1;
    bool no_bias = false, untied = false, no_shuffle = false;
    double lr = NAN, min_lr = NAN; /* NAN: not given */
    const gc_opt opts[] = {
        {"--preset", GC_STR, &preset},
        {"--init-from", GC_STR, &c.init_from},
        {"--vocab-size", GC_I64, &vocab},
        {"--block-size", GC_I64, &block},
        {"--n-layer", GC_I64, &layers},
        {"--n-head", GC_I64, &heads},
        {"--n-embd", GC_I64, &embd},
        {"--dropout", GC_DBL, &dropout},
        {"--no-bias", GC_FLAG, &no_bias},
        {"--untied", GC_FLAG, &untied},
        {"--data", GC_STR, &c.data},
        {"--val-data", GC_STR, &c.val_data},
        {"--tokenizer", GC_STR, &c.tokenizer},
        {"--val-fraction", GC_DBL, &c.val_fraction},
        {"--shuffle", GC_FLAG, &c.shuffle},
        {"--no-shuffle", GC_FLAG, &no_shuffle},
        {"--device", GC_STR, &c.device},
        {"--bf16", GC_FLAG, &c.bf16},
        {"--recompute", GC_FLAG, &c.recompute},
        {"--graph", GC_FLAG, &c.graph},
        {"--batch", GC_INT, &c.batch},
        {"--seq", GC_INT, &c.seq},
        {"--grad-accum", GC_INT, &c.grad_accum},
        {"--steps", GC_I64, &steps},
        {"--time", GC_DBL, &c.max_time_s},
        {"--lr", GC_DBL, &lr},
        {"--min-lr", GC_DBL, &min_lr},
        {"--warmup", GC_I64, &warmup},
        {"--schedule", GC_STR, &schedule},
        {"--weight-decay", GC_DBL, &c.weight_decay},
        {"--beta1", GC_DBL, &c.beta1},
        {"--beta2", GC_DBL, &c.beta2},
        {"--eps", GC_DBL, &c.eps},
        {"--grad-clip", GC_DBL, &c.grad_clip},
        {"--eval-every", GC_I64, &c.eval_every},
        {"--eval-batches", GC_INT, &c.eval_batches},
        {"--sample-every", GC_I64, &c.sample_every},
        {"--sample-tokens", GC_INT, &c.sample_tokens},
        {"--ckpt-every", GC_I64, &c.ckpt_every},
        {"--log-every", GC_I64, &c.log_every},
        {"--out", GC_STR, &c.out_dir},
        {"--resume", GC_FLAG, &c.resume},
        {"--seed", GC_U64, &c.seed},
        {"--dashboard", GC_STR, &dash},
        {"--dist", GC_STR, &dist},
        {"--bucket-mb", GC_DBL, &c.bucket_mb},
        {"--zero1", GC_FLAG, &c.zero1},
    };
    int r = gc_parse("ember train", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == 1) {
        usage(stdout);
        return 0;
    }
    char bad[256] = "";
    em_dashboard_mode mode = EM_DASH_AUTO;
    em_dist_mode dmode = EM_DIST_AUTO;
    if (r == 0) {
        if (!c.data)
            snprintf(bad, sizeof bad, "--data is required");
        else if (!em_gpt_preset(preset, &c.model))
            snprintf(bad, sizeof bad, "%s", em_last_error());
        else if (!em_lr_kind_parse(schedule, &c.lr.kind))
            snprintf(bad, sizeof bad, "%s", em_last_error());
        else if (strcmp(dash, "auto") == 0)
            mode = EM_DASH_AUTO;
        else if (strcmp(dash, "tui") == 0)
            mode = EM_DASH_TUI;
        else if (strcmp(dash, "plain") == 0)
            mode = EM_DASH_PLAIN;
        else if (strcmp(dash, "quiet") == 0)
            mode = EM_DASH_QUIET;
        else
            snprintf(bad, sizeof bad, "--dashboard wants auto, tui, plain or quiet, not '%s'",
                     dash);
        if (!bad[0] && !em_dist_mode_parse(dist, &dmode))
            snprintf(bad, sizeof bad, "--dist wants auto, off, mpi or nccl, not '%s'", dist);
        if (!bad[0] && c.bucket_mb < 0) snprintf(bad, sizeof bad, "--bucket-mb must be positive");
    }
    if (r == 0 && !bad[0]) {
        c.model.vocab_size = vocab > 0 ? vocab : 0;
        if (block > 0) c.model.block_size = block;
        if (layers > 0) c.model.n_layer = layers;
        if (heads > 0) c.model.n_head = heads;
        if (embd > 0) c.model.n_embd = embd;
        if (dropout >= 0) c.model.dropout = dropout;
        if (no_bias) c.model.bias = false;
        if (untied) c.model.tied = false;
        if (warmup >= 0) c.lr.warmup = warmup;
        c.shuffle = !no_shuffle; /* shuffled unless asked (--shuffle is the default) */
        c.lr.base = !isnan(lr) ? lr : default_lr(preset, c.init_from);
        c.lr.min_lr = !isnan(min_lr) ? min_lr : c.lr.base / 10;
        /* --time without --steps: the time alone ends the run (and the schedule spans it) */
        if (steps != INT64_MIN)
            c.max_steps = steps;
        else if (c.max_time_s > 0)
            c.max_steps = INT64_MAX;
        if (c.batch <= 0 || c.grad_accum <= 0 || c.seq < 0 || c.max_steps < 0)
            snprintf(bad, sizeof bad,
                     "--batch and --grad-accum must be positive, --seq and "
                     "--steps not negative");
        else if (!(c.lr.base > 0) || c.lr.min_lr < 0)
            snprintf(bad, sizeof bad, "--lr must be positive and --min-lr not negative");
        else if (!(c.eps >= 0) || !isfinite(c.eps))
            snprintf(bad, sizeof bad, "--eps must be a finite number, not negative");
        else if (block > 0 || layers > 0 || heads > 0 || embd > 0 || dropout >= 0) {
            em_gpt_config t = c.model;
            if (t.vocab_size == 0) t.vocab_size = 1;
            if (!em_gpt_config_check(&t)) snprintf(bad, sizeof bad, "%s", em_last_error());
        }
    }
    if (bad[0]) fprintf(stderr, "ember train: %s\n", bad);
    if (r != 0 || bad[0]) {
        fprintf(stderr, "\n");
        usage(stderr);
        return 2;
    }
    setlocale(LC_ALL, "");
    em_dist *comm = em_dist_init(dmode);
    if (!comm) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        return 1;
    }
    c.dist = comm;
    int rank = em_dist_rank(comm), world = em_dist_world(comm);
    char who[48] = "ember train";
    if (world > 1) snprintf(who, sizeof who, "ember train (rank %d of %d)", rank, world);
    em_trainer *t = em_trainer_new(&c);
    if (!t) {
        fprintf(stderr, "%s: %s\n", who, em_last_error());
        if (world > 1) em_dist_abort(comm, 1); /* the other ranks wait in a collective */
        em_dist_free(comm);
        return 1;
    }
    em_dashboard *d = em_dashboard_new(rank == 0 ? mode : EM_DASH_QUIET, stdout);
    em_train_observer obs = em_dashboard_observer(d);
    em_status st = em_trainer_run(t, d ? &obs : NULL);
    em_dashboard_free(d);
    if (st != EM_OK) {
        fprintf(stderr, "%s: %s\n", who, em_last_error());
        if (world > 1) em_dist_abort(comm, 1);
    }
    em_trainer_free(t);
    em_dist_free(comm);
    return st == EM_OK ? 0 : 1;
}
