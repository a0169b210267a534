/* internal.h — what the training layer's files share: the trainer's state (config, device, data,
 * models, optimizer, counters) and the helpers each file provides to the others. */
#ifndef EM_TRAIN_INTERNAL_H
#define EM_TRAIN_INTERNAL_H

#include "ember/train.h"

/* The recorded training step (step_graph.c). */
typedef struct tr_graph tr_graph;

/* A parameter of the compute model paired with its f32 master (bf16 mixed precision). */
typedef struct tr_pair {
    em_tensor *master;  /* f32, updated by the optimizer (borrowed from the master tree) */
    em_tensor *compute; /* bf16 working copy (borrowed from the compute tree) */
} tr_pair;

struct em_trainer {
    em_train_config cfg; /* copy; strings below are owned copies */
    char *data, *val_data, *tokenizer_name, *init_from, *out_dir;
    em_device *dev;         /* owned reference */
    em_tokenizer *tok;      /* NULL when unknown */
    em_loader *train, *val; /* val NULL when there is no validation data */
    em_gpt *master;         /* the f32 model the optimizer updates */
    em_gpt *compute;        /* the bf16 copy (bf16 mode) or == master */
    tr_pair *pairs;         /* bf16 mode: the parameter pairs */
    int npairs;
    bool mirrored;          /* bf16 mode: the optimizer writes the compute copies (no sync pass) */
    em_optimizer *opt;
    int64_t step;     /* optimizer steps done */
    int64_t tokens;   /* tokens trained on */
    int32_t *hx, *hy; /* host batch buffers */
    /* the time budget of the run in progress (em_trainer_run sets it; the schedule spans it) */
    double budget_s;      /* the run's max_time_s (0: no budget: the schedule spans max_steps) */
    double run_t0;        /* when the run began (tr_now) */
    double first_end;     /* when its first step ended (0: not yet) */
    int64_t first_step;   /* the step count then */
    char ckpt_path[4096]; /* out_dir/ckpt.safetensors */
    /* data parallel (parallel.c) */
    em_dist *dist;      /* cfg.dist (borrowed; NULL: one process) */
    int rank, world;    /* this rank and the number of ranks */
    bool collective;    /* the communicator has an engine: gradients are all-reduced */
    em_tensor **params; /* the master parameters, each once (borrowed), in module order */
    char **param_names; /* their full names (owned) */
    bool *param_decay;  /* their weight-decay flags */
    int *owner;         /* ZeRO-1: the rank whose optimizer updates each */
    int nparams;        /* entries in params, param_names, param_decay and owner */
    em_optimizer *clip; /* ZeRO-1: every parameter (SGD, never stepped) for the norm, the
                           clip and zeroing; NULL otherwise */
    /* the step as a graph (step_graph.c) */
    tr_graph *graph; /* its inputs, outputs and recording; NULL before the first step on it */
    bool graph_off;  /* unsupported or failed: eager for good */
};

/* True on the rank that writes files and reports (rank 0). */
static inline bool tr_lead(const em_trainer *t)
{
    return t->rank == 0;
}

/* data.c: opens the tokenizer and loaders from cfg (tokenizing a text file into shards in
 * out_dir/data) and saves the tokenizer into out_dir. */
em_status tr_open_data(em_trainer *t);
/* checkpoint.c: restores optimizer state, step, loader position and dropout state from an open
 * checkpoint file. */
em_status tr_resume(em_trainer *t, const char *path);
/* parallel.c: the data-parallel parts of the trainer (all no-ops in one process).
 * tr_dist_params lists the master parameters (and, for ZeRO-1, which rank updates each);
 * tr_dist_optimizer makes t->opt (AdamW over every parameter, or over this rank's shard plus
 * t->clip); tr_dist_start gives every rank rank 0's parameters and its own dropout seed;
 * tr_dist_grads averages the gradients over the ranks; tr_dist_share_update (ZeRO-1) sends each
 * parameter from its owner to the others after the optimizer step; tr_dist_gather_state
 * (ZeRO-1, on every rank) adds the whole optimizer state to rank 0's checkpoint writer (w is
 * NULL on the other ranks); tr_dist_free frees the lists. */
em_status tr_dist_params(em_trainer *t);
em_status tr_dist_optimizer(em_trainer *t, const em_adam_config *ac);
em_status tr_dist_start(em_trainer *t);
em_status tr_dist_grads(em_trainer *t);
em_status tr_dist_share_update(em_trainer *t);
em_status tr_dist_gather_state(em_trainer *t, em_safetensors_writer *w);
void tr_dist_free(em_trainer *t);
/* trainer.c: the step count the learning-rate schedule spans when cfg.lr.total_steps is 0:
 * max_steps, or, in a run with a time budget, the steps estimated to fit in it when fewer (the
 * step count so far plus the time left over the mean time per step since the run's first step,
 * which pays for compiling kernels). `now` is tr_now() at the start of the coming step. */
int64_t tr_schedule_steps(const em_trainer *t, double now);
/* trainer.c: bf16 mixed precision: the compute copy's gradients cast onto the masters, and the
 * masters cast into the compute copy. */
em_status tr_grads_to_master(em_trainer *t);
em_status tr_sync_compute(em_trainer *t);
/* step_graph.c: whether the step should take the graph path (cfg.graph or EMBER_TRAIN_GRAPH=1,
 * and it did not fail); the step on it at learning rate lr (*done false when this trainer
 * cannot take it: the caller runs the eager step), its mean loss and gradient norm; freeing its
 * graph and tensors. */
bool tr_graph_wanted(const em_trainer *t);
em_status tr_graph_step(em_trainer *t, double lr, double *loss, double *norm, bool *done);
void tr_graph_free(em_trainer *t);
/* util: path = out_dir/name into buf. */
void tr_path(const em_trainer *t, const char *name, char *buf, size_t size);
/* Monotonic seconds. */
double tr_now(void);

#endif
