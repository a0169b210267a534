/* internal.h — what the training layer's files share: the trainer's state (config, device, data,
 * models, optimizer, counters) and the helpers each file provides to the others. */
#ifndef EM_TRAIN_INTERNAL_H
#define EM_TRAIN_INTERNAL_H

#include "ember/train.h"

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
    em_optimizer *opt;
    int64_t step;         /* optimizer steps done */
    int64_t tokens;       /* tokens trained on */
    int32_t *hx, *hy;     /* host batch buffers */
    char ckpt_path[4096]; /* out_dir/ckpt.safetensors */
};

/* data.c: opens the tokenizer and loaders from cfg (tokenizing a text file into shards in
 * out_dir/data) and saves the tokenizer into out_dir. */
em_status tr_open_data(em_trainer *t);
/* checkpoint.c: restores optimizer state, step, loader position and dropout state from an open
 * checkpoint file. */
em_status tr_resume(em_trainer *t, const char *path);
/* util: path = out_dir/name into buf. */
void tr_path(const em_trainer *t, const char *name, char *buf, size_t size);
/* Monotonic seconds. */
double tr_now(void);

#endif
