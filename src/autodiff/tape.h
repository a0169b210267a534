/* tape.h — the tape's own structures, shared by tape.c (recording, nodes, leaves, the user API on
 * tensors), backward.c (the reverse walk), recompute.c (saved tensors and their recomputation)
 * and grad_mode.c (per-thread recording state). The backward rules never see these: they get an
 * ad_ctx (internal.h). */
#ifndef EM_AUTODIFF_TAPE_H
#define EM_AUTODIFF_TAPE_H

#include <stdatomic.h>

#include "autodiff/internal.h"

/* A tensor a node keeps for its backward rule: either held (a detached alias of the tensor's
 * storage), or, under EM_RECOMPUTE_ELEMENTWISE, a recipe: the op that produced it, its params and
 * its own inputs (held or recipes, recursively), replayed when a rule needs the tensor.
 * Reference-counted: a recipe is shared by every node that saves the same tensor. */
typedef struct ad_saved {
    atomic_int refs;                        /* holders (nodes, recipes) */
    em_tensor *t;                           /* the held tensor, or NULL for a recipe */
    em_tensor_op op;                        /* recipe: the op to replay */
    em_top_params p;                        /* recipe: its params */
    int nin;                                /* recipe: its inputs */
    struct ad_saved *in[EM_TOP_MAX_INPUTS]; /* recipe: the inputs (NULL when absent) */
    em_scalar dtype;                        /* the tensor's dtype (casts replay to it) */
    em_shape shape;                         /* recipe: the tensor's shape (reshapes replay to it) */
    int64_t bytes;                          /* device bytes counted for t in the tape stats */
} ad_saved;

/* A node of the tape: one recorded op (or a leaf). Held by the output tensor's annotation and by
 * every consumer node's edge. */
typedef struct ad_node {
    atomic_int refs;    /* annotation + consumer edges + walks */
    bool leaf;          /* a leaf (a tensor not made by a recorded op) */
    bool requires_grad; /* leaf: marked; op node: true */
    bool freed;         /* op node: its backward state was freed */
    bool broken;        /* op node: recording failed (out of memory) */
    em_tensor *grad;    /* leaf: the accumulated gradient (owned) */
    em_tensor *dest;    /* leaf: where its gradient is to be written (em_set_grad_into; owned) */
    /* op nodes */
    em_tensor_op op;                         /* the op recorded */
    em_top_params p;                         /* its params */
    int nin;                                 /* its inputs */
    struct ad_node *edge[EM_TOP_MAX_INPUTS]; /* the node of each input wanting a gradient */
    ad_saved *saved_in[EM_TOP_MAX_INPUTS];   /* inputs the rule reads */
    ad_saved *saved_out;                     /* the output, when the rule reads it */
    ad_saved *recipe;                        /* how to recompute the output, for consumers */
    em_shape in_shape[EM_TOP_MAX_INPUTS];    /* each input's shape */
    em_scalar in_dtype[EM_TOP_MAX_INPUTS];   /* each input's dtype */
    bool in_present[EM_TOP_MAX_INPUTS];      /* false for absent optional inputs */
    em_shape out_shape;                      /* the output's shape */
    em_scalar out_dtype;                     /* the output's dtype */
    /* walk state (backward.c) */
    em_tensor *acc; /* gradient accumulated for the output */
    uint64_t mark;  /* the walk that last visited it */
    /* a matmul's node: a bias's gradient handed to it (ad_defer_colsum), cs_g's sums over its
     * leading dims for cs_leaf's destination, taken by its rule into the weight gradient's
     * product (ad_take_colsum) or run after it (cs_flush); both held. A leaf: the node holding
     * its pending sums (not held), which run before anything adds to its gradient. */
    em_tensor *cs_g;
    struct ad_node *cs_leaf;
    struct ad_node *cs_by;
} ad_node;

/* ---- tape.c ---- */
ad_node *ad_node_retain(ad_node *n);
void ad_node_release(ad_node *n);
/* Frees what a node holds for its backward (saved tensors, edges); counts it out of the stats. */
void ad_node_free_state(ad_node *n);
/* Whether gradients flow into the tensor n annotates (a marked leaf, a live op node). */
bool ad_node_wants(const ad_node *n);
/* The node annotating t (NULL when none). */
ad_node *ad_node_of(const em_tensor *t);
/* Stats counters. */
void ad_stats_nodes(int64_t delta);
void ad_stats_bytes(int64_t delta);

/* ---- backward.c ---- */
/* Drops n's pending column sums (a request not run: an error's path). */
void ad_cs_drop(ad_node *n);

/* ---- recompute.c ---- */
/* A held alias of t (counted in the stats); NULL on error. */
ad_saved *ad_saved_hold(const em_tensor *t);
ad_saved *ad_saved_retain(ad_saved *s);
void ad_saved_release(ad_saved *s);
/* The tensor s stands for, as a new reference (recomputed under no-grad for a recipe). */
em_tensor *ad_saved_get(const ad_saved *s);
/* True for ops whose outputs EM_RECOMPUTE_ELEMENTWISE recomputes. */
bool ad_recomputable(em_tensor_op op);
/* Runs the public op of a recorded (op, params) on inputs (no-grad is the caller's business). */
em_tensor *ad_replay(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
                     em_scalar out_dtype);

#endif
