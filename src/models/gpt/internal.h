/* internal.h — what the GPT model's files share: the model struct (a module tree in Hugging Face
 * GPT-2 naming plus typed pointers into it) and the per-layer KV cache. */
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
    em_kv_cache **layers;  /* one per block: k, v [slots, heads, max_len, head_dim] */
    int64_t *len;          /* positions held by each slot */
    int64_t slots;         /* number of slots */
    int64_t max_len;       /* positions per slot */
};

#endif
