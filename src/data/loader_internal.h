/* loader_internal.h — the loader's state, shared by loader.c (planning, prefetch, batches) and
 * loader_tensor.c (batches as tensors on a device). */
#ifndef EM_DATA_LOADER_INTERNAL_H
#define EM_DATA_LOADER_INTERNAL_H

#include <pthread.h>

#include "ember/data.h"

#define LOADER_RING 3 /* batches the prefetch thread may hold ready */

typedef enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_READY } slot_state;

typedef struct loader_slot {
    int32_t *inputs;   /* B*T ids */
    int32_t *targets;  /* B*T ids */
    em_loader_pos pos; /* which batch it holds (when READY) */
    slot_state state;  /* free, being filled, or ready */
} loader_slot;

struct em_loader {
    em_loader_opts o;    /* options (world >= 1; path points to `path`) */
    char *path;          /* owned copy of the path */
    em_shard *shards;    /* the mapped shards, sorted by path */
    size_t nshards;      /* how many */
    uint64_t *first;     /* nshards+1: index of each shard's first sample */
    uint64_t nsamples;   /* samples in all shards */
    uint64_t tokens;     /* tokens in all shards */
    uint64_t per_epoch;  /* batches per epoch for each rank */
    uint64_t *perm;      /* the epoch's sample order (shuffle only); the filler's alone */
    uint64_t perm_epoch; /* the epoch perm was drawn for */
    em_loader_pos pos;   /* the consumer's next batch */
    /* prefetch */
    bool thread_started;           /* the prefetch thread runs */
    bool sync_init;                /* mu and cv are initialized */
    pthread_t thread;              /* the prefetch thread */
    pthread_mutex_t mu;            /* guards everything below and pos */
    pthread_cond_t cv;             /* signalled on every slot change */
    loader_slot ring[LOADER_RING]; /* prefetched batches */
    em_loader_pos prod_pos;        /* the next batch the thread fills */
    uint64_t gen;                  /* bumped by seek: fills of an older generation are dropped */
    bool stop;                     /* tells the thread to exit */
    uint64_t waits;                /* times the consumer had to wait (statistics) */
};

/* Fills one batch at pos (the caller is the only filler). */
void loader_fill(em_loader *l, em_loader_pos pos, int32_t *inputs, int32_t *targets);

#endif
