/* ember/train.h — the GPT training loop as a library (what `ember train` runs): data from token
 * shards or a text file, the device, batch / sequence length / gradient accumulation, the
 * learning-rate schedule, AdamW with weight decay on the linear weights only, gradient clipping,
 * validation every N steps, a sample every N steps, atomic checkpoints every N steps with
 * --resume that continues bit-identically on the CPU, bf16 mixed precision with f32 master
 * weights, a JSONL metrics log, and an SVG loss curve at the end.
 *
 * What happens during training is reported to an observer (em_train_observer): the dashboard
 * (ncurses full screen on a terminal, plain log lines otherwise) is one; tests use their own.
 *
 * Files in out_dir: ckpt.safetensors (model + optimizer state + step, see em_trainer_save),
 * tokenizer.json (so `ember sample` finds it beside the checkpoint), metrics.jsonl (one JSON
 * object per line: {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "elapsed_s"}
 * for train steps, {"step", "val_loss"} for validations, {"step", "sample"} for samples) and
 * loss.svg. With a text file as data, its shards go to out_dir/data/.
 *
 * Data parallel (cfg.dist, a communicator of N ranks started by `mpirun -np N ember train ...`):
 * every rank holds the whole model and starts from rank 0's parameters; rank r trains on batches
 * r, N + r, 2N + r, ... of the data (and of the validation data), so a step sees N x B sequences;
 * after the backward pass the gradients are averaged over the ranks (em_dist_all_reduce_many, in
 * buckets) and every rank takes the same optimizer step. Reported losses are means over the
 * ranks, tokens count every rank's. Only rank 0 writes files (shards of a text file, tokenizer,
 * metrics, checkpoints, plot) and reports to the observer; samples are made on rank 0 alone. Every
 * other call below must be made on every rank in the same order (they hold collectives). The
 * dropout generator of rank r is seeded with seed + r. With zero1 the optimizer state is sharded:
 * rank r updates only the parameters it owns (about 1/N of them) and broadcasts them; the
 * checkpoint still holds the whole state (gathered to rank 0), so a run can resume with or
 * without zero1. */
#ifndef EMBER_TRAIN_H
#define EMBER_TRAIN_H

#include <stdio.h>

#include "ember/dist.h"
#include "ember/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_train_config {
    /* model */
    em_gpt_config model;   /* sizes (vocab_size replaced by the tokenizer's when 0 or smaller) */
    const char *init_from; /* a checkpoint (ember's or Hugging Face's) to start from, or NULL */
    /* data */
    const char *data;      /* a folder from `ember data prepare`, a shard glob, or a text file */
    const char *val_data;  /* validation shards (NULL: val_*.bin beside the training shards) */
    const char *tokenizer; /* for a text file: "char" (default), "gpt2" or a tokenizer file */
    double val_fraction;   /* for a text file: the share held out for validation (0.1) */
    /* device and precision */
    const char *device; /* NULL or "auto": the best present (see em_train_best_device) */
    bool bf16;          /* bf16 compute with f32 master weights */
    bool recompute;     /* backward recomputes elementwise results and norms instead of keeping
                         * them (EM_RECOMPUTE_ELEMENTWISE: less memory, a little more time) */
    /* batches */
    int batch;         /* B: sequences per micro-batch */
    int seq;           /* T: tokens per sequence (<= block_size; 0 = block_size) */
    int grad_accum;    /* micro-batches per optimizer step */
    int64_t max_steps; /* optimizer steps */
    double max_time_s; /* stop (with a checkpoint) after this much time; 0 = no limit */
    /* optimizer */
    em_lr_schedule lr;        /* kind, base, min_lr, warmup (total_steps 0 = the run's span:
                               * max_steps, or with max_time_s the steps expected to fit in
                               * it when fewer) */
    double weight_decay;      /* AdamW decay of the linear weights */
    double beta1, beta2, eps; /* Adam */
    double grad_clip;         /* global L2 norm clip; 0 = off */
    /* periodic work */
    int64_t eval_every;   /* validation every N steps (0 = only at the end) */
    int eval_batches;     /* batches per validation */
    int64_t sample_every; /* a sample every N steps (0 = only at the end; <0 never) */
    int sample_tokens;    /* tokens per sample */
    int64_t ckpt_every;   /* checkpoint every N steps (0 = only at the end) */
    int64_t log_every;    /* observer / metrics every N steps (1) */
    /* where */
    const char *out_dir; /* checkpoint, metrics, tokenizer and plot */
    bool resume;         /* continue from out_dir/ckpt.safetensors */
    uint64_t seed;       /* init, data order and dropout */
    bool shuffle;        /* random batch order (default: sequential) */
    /* data parallel (docs/distributed.md) */
    em_dist *dist;    /* the communicator (borrowed, outlives the trainer); NULL: one process */
    double bucket_mb; /* gradient all-reduce buckets in MiB (0: 25) */
    bool zero1;       /* ZeRO-1: each rank keeps (and updates) the AdamW state of a share of the
                         parameters and sends the updated share to the others */
    /* the step as a graph (docs/graphs.md): recorded once, replayed; also EMBER_TRAIN_GRAPH=1.
     * One process, dropout 0; otherwise (or when the recording fails) the step runs eagerly */
    bool graph;
} em_train_config;

/* Defaults: the tiny preset, batch 16, seq = block_size, accumulation 1, 1000 steps, cosine from
 * 1e-3 to 1e-4 with 50 warmup steps, weight decay 0.1, betas 0.9/0.95, eps 1e-8, clip 1.0,
 * eval every 100 steps over 10 batches, a 200-token sample every 500 steps, checkpoints every 500
 * steps, out_dir "out", seed 1337. */
void em_train_config_default(em_train_config *c);

/* What one reported step looks like. NaN marks what was not measured at this step. */
typedef struct em_train_metrics {
    int64_t step;        /* optimizer steps done (1 after the first) */
    int64_t max_steps;   /* the goal */
    double loss;         /* mean training loss of the step's micro-batches */
    double val_loss;     /* validation loss at this step, or NaN */
    double lr;           /* learning rate used */
    double grad_norm;    /* global gradient norm before clipping */
    double tokens_per_s; /* of this step */
    double step_ms;      /* wall time of this step */
    double elapsed_s;    /* since the run (or resume) began */
    double eta_s;        /* estimated time to max_steps */
    int64_t tokens;      /* tokens trained on so far */
    uint64_t mem_in_use; /* device pool: bytes in use */
    uint64_t mem_peak;   /* and its high-water mark */
    uint64_t mem_total;  /* device memory (0 = unknown) */
} em_train_metrics;

/* Facts about the run, given to the observer once at the start. */
typedef struct em_train_info {
    const char *device;      /* device name */
    const char *device_desc; /* its human-readable name */
    em_gpt_config model;     /* sizes */
    int64_t num_params;      /* parameter count */
    int64_t tokens_per_step; /* B * T * accumulation */
    int64_t start_step;      /* > 0 when resumed */
    int64_t max_steps;
    const char *out_dir;
    bool bf16;
    int world;               /* data-parallel ranks (1: one process) */
    const char *dist_engine; /* "none", "mpi" or "nccl" (em_dist_engine) */
} em_train_info;

/* Receives the run's events; any callback may be NULL. */
typedef struct em_train_observer {
    void (*begin)(void *user, const em_train_info *info);
    void (*step)(void *user, const em_train_metrics *m);     /* every log_every steps */
    void (*eval)(void *user, int64_t step, double val_loss); /* after each validation */
    void (*sample)(void *user, int64_t step, const char *text);
    void (*message)(void *user, const char *text); /* checkpoints, notes */
    void (*end)(void *user, const em_train_metrics *last);
    /* Polled between steps: true asks the loop to stop (with a checkpoint), e.g. on 'q'. */
    bool (*should_stop)(void *user);
    void *user;
} em_train_observer;

typedef struct em_trainer em_trainer;

/* Opens the device, the data (tokenizing a text file into shards in out_dir/data), the model
 * (new, from init_from, or from out_dir/ckpt.safetensors when resuming) and the optimizer. NULL
 * with the error set (bad sizes, missing data, a corrupt checkpoint, ...). The config's strings
 * are copied. */
em_trainer *em_trainer_new(const em_train_config *cfg);
void em_trainer_free(em_trainer *t);

em_gpt *em_trainer_model(em_trainer *t);                 /* borrowed */
const em_tokenizer *em_trainer_tokenizer(em_trainer *t); /* borrowed; NULL when unknown */
int64_t em_trainer_step_count(const em_trainer *t);      /* optimizer steps done */
void em_trainer_info(const em_trainer *t, em_train_info *out);

/* True once the step is replayed as a recorded graph (cfg.graph, from the second step). */
bool em_trainer_graph(const em_trainer *t);
/* One optimizer step (grad_accum micro-batches on each rank); fills m (val_loss NaN). */
em_status em_trainer_step(em_trainer *t, em_train_metrics *m);
/* Mean loss over eval_batches validation batches, always from the start of the validation data. */
em_status em_trainer_eval(em_trainer *t, double *val_loss);
/* Generates up to n tokens from the tokenizer's <|endoftext|> (or a newline), decoded. malloc'd. */
char *em_trainer_sample(em_trainer *t, int n, uint64_t seed);
/* Writes a training checkpoint atomically: the model (em_gpt_save's form), the optimizer state
 * ("optim.<param>.<state>") and metadata "train.step", "train.loader" (epoch/step), "train.rng"
 * (dropout generator), "train.tokens". Data parallel: call it on every rank (with zero1 the state
 * is gathered); rank 0 writes. */
em_status em_trainer_save(em_trainer *t, const char *path);

/* The whole loop from the current step to max_steps (or max_time_s, or should_stop): metrics to
 * out_dir/metrics.jsonl, validations, samples and checkpoints as configured, and at the end a
 * final validation and checkpoint and out_dir/loss.svg. */
em_status em_trainer_run(em_trainer *t, const em_train_observer *obs);

/* The best device present: cuda:0, then a hardware (not CPU-emulated) vulkan:0 / opencl:0, then
 * cpu. A new reference (em_device_close). */
em_device *em_train_best_device(void);

/* ---- dashboard and plot ---------------------------------------------------------------------- */

typedef enum em_dashboard_mode {
    EM_DASH_AUTO = 0, /* full screen when stdout is a terminal, else plain lines */
    EM_DASH_TUI,      /* ncurses full screen */
    EM_DASH_PLAIN,    /* one log line per reported step */
    EM_DASH_QUIET,    /* nothing but errors */
} em_dashboard_mode;

typedef struct em_dashboard em_dashboard;
/* A dashboard writing to `out` (plain mode; stdout for the full screen). NULL on no memory. */
em_dashboard *em_dashboard_new(em_dashboard_mode mode, FILE *out);
/* The observer that feeds it (valid while the dashboard lives). */
em_train_observer em_dashboard_observer(em_dashboard *d);
/* Leaves the full screen (if any) and frees. */
void em_dashboard_free(em_dashboard *d);

/* Writes an SVG chart of train (and validation) loss against step. steps/loss: n train points;
 * vsteps/vloss: nv validation points (may be 0). Atomic. */
em_status em_train_plot_svg(const char *path, const double *steps, const double *loss, int64_t n,
                            const double *vsteps, const double *vloss, int64_t nv,
                            const char *title);

#ifdef __cplusplus
}
#endif
#endif
