/* internal.h — what the GPT model's files share: the model struct (a module tree in Hugging Face
 * GPT-2 naming plus typed pointers into it), the per-layer KV cache, and the batched decoder's
 * slots and step plan (batch.c, batch_step.c). */
#ifndef EM_GPT_INTERNAL_H
#define EM_GPT_INTERNAL_H

#include "ember/gpt.h"

struct em_gpt {
    em_gpt_config cfg;       /* sizes */
    em_scalar dtype;         /* parameter dtype */
    em_device *dev;          /* where the parameters live (borrowed) */
    em_module *root;         /* the tree: wte, wpe, h.<i>, ln_f (and lm_head when untied) */
    em_embedding_mod *wte;   /* token embeddings [vocab, n_embd] (borrowed from root) */
    em_embedding_mod *wpe;   /* position embeddings [block_size, n_embd] */
    em_block **h;            /* n_layer blocks (borrowed from root's "h" child) */
    em_layer_norm_mod *ln_f; /* final norm */
    em_linear *lm_head;      /* NULL when tied to wte */
    em_rng rng;              /* dropout draws */
};

struct em_gpt_cache {
    em_gpt *g;              /* the model it belongs to (borrowed) */
    em_kv_cache **layers;   /* one per block */
    int64_t n;              /* number of layers */
    int64_t batch, max_len; /* sizes */
};

/* An uninitialized model: the module tree built with random init from seed (em_gpt_new then
 * applies GPT-2's init). NULL with the error set. */
em_gpt *gpt_build(em_device *dev, em_scalar dtype, const em_gpt_config *cfg, uint64_t seed);

/* The LM head (model.c): f32 logits of hidden states x [B, T, C] after ln_f, through lm_head or
 * the tied embedding; moved to the enclosing scope. NULL with the error set. */
em_tensor *gpt_head(em_gpt *g, const em_tensor *x);

/* ---- batched decoding (batch.c) ------------------------------------------------------------- */

/* A step attends a number of keys rounded up to a multiple of this (capped at max_len), so that
 * its kernels' arguments stay the same from step to step while the longest slot grows inside one
 * bucket: a captured step replays for every step of the bucket. */
#define GPT_STEP_KEYS_BUCKET 64

struct em_gpt_batch {
    em_gpt *g;             /* the model (borrowed) */
    em_tensor **kv;        /* one per block: keys and values [slots, 2, heads, max_len, head_dim] */
    em_kv_cache **layers;  /* one per block: k, v [slots, heads, max_len, head_dim], views of kv */
    em_tensor *inputs;     /* i64 [2, slots] on the device: a step's token (row 0) and position
                            * (row 1) per slot, written once per step; max_len: slot not listed */
    em_tensor *counters;   /* i32 [slots * heads] zeros, left zero by every step: the split
                            * counters of em_attention_decode_append, shared by the layers */
    int64_t *len;          /* positions held by each slot */
    int64_t slots;         /* number of slots */
    int64_t max_len;       /* positions per slot */
    int64_t *ids;          /* a step's host scratch [2 * slots], laid out as inputs */
    uint8_t *listed;       /* a step's scratch [slots]: the row's slot is listed */
    int64_t *next;         /* a greedy step's scratch [slots]: each row's next token */
    struct gpt_graph *graphs; /* recorded steps by (rows, keys, greedy), GPT_STEP_GRAPHS at most */
    int ngraphs;
    uint64_t clock;        /* steps run: the graphs' last use, for eviction */
};

/* Recorded steps kept per batch (the least recently used goes first). */
#define GPT_STEP_GRAPHS 32

/* A step recorded as a runtime graph (docs/graphs.md): replayed for every later step of the same
 * (rows, keys, greedy), whose inputs differ only in b->inputs' contents. */
typedef struct gpt_graph {
    int64_t rows, keys;
    bool greedy;
    int seen;         /* eager runs so far (the first compiles and tunes; the second records) */
    bool failed;      /* recording failed: this key runs eagerly */
    em_graph *g;      /* the recording, or NULL */
    em_tensor *out;   /* its result, written by every replay (owned) */
    uint64_t used;    /* b->clock at the last use */
} gpt_graph;

/* One decode step's shape (batch.c): with the batch's tensors, all the forward pass reads. */
typedef struct gpt_step {
    em_gpt_batch *b; /* the batch */
    int64_t rows;    /* rows of the pass: highest listed slot + 1 */
    int64_t keys;    /* keys attended: the longest listed slot after the step, rounded up to a
                      * multiple of GPT_STEP_KEYS_BUCKET, at most max_len */
    bool greedy;     /* end in each row's first largest logit instead of the logits */
} gpt_step;

/* The forward pass of one decode step (batch_step.c), shape-static: every kernel it launches, and
 * every argument of those kernels (buffers, offsets, shapes, scalars), depends only on
 * (rows, keys, greedy) and the batch, never on the step's tokens or positions, so the call can be
 * captured once per such key and replayed. It reads:
 *   - the device inputs b->inputs (tokens and positions of rows [0, rows): written by the caller
 *     before the call; a row at position max_len is not listed and writes nothing);
 *   - the weights (wte, wpe, the blocks, ln_f, the head);
 *   - b->kv: each layer's keys/values of rows [0, rows) and positions [0, keys), after writing
 *     each listed row's new key and value at its position (em_scatter_rows_, in place).
 * It returns (moved to the enclosing scope) the logits f32 [1, rows, vocab], or with greedy the
 * first largest logit's index per row, i64 [1, rows]; every kernel of the pass has been launched
 * (pending fused work realized) when it returns. It never reads the device back nor waits for it:
 * the caller reads the result. Unlisted rows compute throw-away values. NULL with the error set. */
em_tensor *gpt_step_forward_static(const gpt_step *s);

#endif
