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

struct em_gpt_batch {
    em_gpt *g;             /* the model (borrowed) */
    em_tensor **kv;        /* one per block: keys and values [slots, 2, heads, max_len, head_dim] */
    em_kv_cache **layers;  /* one per block: k, v [slots, heads, max_len, head_dim], views of kv */
    int64_t *len;          /* positions held by each slot */
    int64_t slots;         /* number of slots */
    int64_t max_len;       /* positions per slot */
    int64_t *ids;          /* a step's scratch [2 * slots]: each row's token, then its position */
    uint8_t *listed;       /* a step's scratch [slots]: the row's slot is listed */
    int64_t *next;         /* a greedy step's scratch [slots]: each row's next token */
};

/* One decode step's plan (batch.c), read by the forward pass (batch_step.c). */
typedef struct gpt_step {
    em_gpt_batch *b;       /* the batch */
    int64_t rows;          /* rows of the pass: highest listed slot + 1 */
    int64_t tk;            /* keys attended: the longest listed slot after this step */
    const uint8_t *listed; /* per row: its slot is listed */
    const int64_t *pos;    /* per listed row: the position its new key goes to */
    em_tensor *mask;       /* bool [rows, 1, 1, tk]: true = masked; NULL when none is */
} gpt_step;

/* The step's pass over the rows' tokens ids[rows] at positions pos[rows]: the logits [1, rows,
 * vocab] (f32), or with greedy the first largest logit's index per row, i64 [1, rows]; moved to
 * the enclosing scope. NULL with the error set. */
em_tensor *gpt_step_forward(const gpt_step *s, const int64_t *ids, const int64_t *pos,
                            bool greedy);

#endif
