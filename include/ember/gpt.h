/* ember/gpt.h — the GPT model (GPT-2 family), text generation with a KV cache, and loading
 * Hugging Face GPT-2 weights.
 *
 * Parameter names follow Hugging Face's GPT2LMHeadModel without the "transformer." prefix:
 * wte.weight, wpe.weight, h.<i>.ln_1.weight, h.<i>.attn.c_attn.weight ([dim, 3 dim], Conv1D
 * layout), ..., ln_f.weight; the LM head is tied to wte (no lm_head.weight of its own when tied).
 * A checkpoint is a safetensors file whose metadata holds the config as JSON under "ember.config"
 * (and, for training checkpoints, the optimizer state and step). */
#ifndef EMBER_GPT_H
#define EMBER_GPT_H

#include "ember/data.h"
#include "ember/nn.h"
#include "ember/optim.h"
#include "ember/record.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_gpt_config {
    int64_t vocab_size;   /* 50257 for GPT-2's tokenizer */
    int64_t block_size;   /* context length */
    int64_t n_layer, n_head, n_embd;
    double dropout;
    bool bias;            /* biases in Linear and LayerNorm (GPT-2: true) */
    bool tied;            /* LM head shares wte (GPT-2: true) */
} em_gpt_config;

/* Presets: "tiny" (trains on a 2-core CPU in minutes), "gpt2" (124M), "gpt2-medium",
 * "gpt2-large". false with the error set for an unknown name. */
bool em_gpt_preset(const char *name, em_gpt_config *out);
/* The config as JSON (malloc'd) and back. */
char *em_gpt_config_to_json(const em_gpt_config *c);
bool em_gpt_config_from_json(const char *json, em_gpt_config *out);
/* True when the sizes make a model (positive, n_head dividing n_embd, dropout in [0, 1));
 * false with the error naming the bad value. */
bool em_gpt_config_check(const em_gpt_config *c);

typedef struct em_gpt em_gpt;

/* A freshly initialized model (GPT-2's init: normal(0, 0.02), scaled residual projections) with
 * parameters of dtype on dev. */
em_gpt *em_gpt_new(em_device *dev, em_scalar dtype, const em_gpt_config *cfg, uint64_t seed);
void em_gpt_free(em_gpt *g);
const em_gpt_config *em_gpt_config_of(const em_gpt *g);
em_module *em_gpt_module(em_gpt *g); /* the parameter tree, for optimizers and records */
em_device *em_gpt_device(const em_gpt *g);
/* The generator dropout draws from (borrowed; training checkpoints save and restore it). */
em_rng *em_gpt_rng(em_gpt *g);

/* ids [B, T] (i32/i64, T <= block_size) -> logits [B, T, vocab] (f32). With a cache (one per
 * layer, made by em_gpt_cache_new), ids holds only the new positions. */
typedef struct em_gpt_cache em_gpt_cache;
em_gpt_cache *em_gpt_cache_new(em_gpt *g, int64_t batch, int64_t max_len);
void em_gpt_cache_free(em_gpt_cache *c);
void em_gpt_cache_reset(em_gpt_cache *c);
int64_t em_gpt_cache_len(const em_gpt_cache *c);
em_tensor *em_gpt_forward(em_gpt *g, const em_tensor *ids, em_gpt_cache *cache);
/* Mean cross-entropy of the next-token predictions: logits from ids [B, T] against targets
 * [B, T]. */
em_tensor *em_gpt_loss(em_gpt *g, const em_tensor *ids, const em_tensor *targets);

/* Saves / loads a model with its config (see above). em_gpt_load also reads Hugging Face's
 * GPT-2 model.safetensors (names with or without "transformer.", config from the shapes, or
 * from config.json beside it when present). dtype EM_SCALAR_COUNT keeps the file's dtype.
 * Training checkpoints load too (their "optim." entries are skipped). */
em_status em_gpt_save(em_gpt *g, const char *path);
em_gpt *em_gpt_load(const char *path, em_device *dev, em_scalar dtype);
/* Adds the parameters and the config metadata to a writer (training checkpoints add the
 * optimizer state beside them). */
em_status em_gpt_add_to_writer(em_gpt *g, em_safetensors_writer *w);
/* Writes dir/model.safetensors and dir/config.json in the form transformers'
 * GPT2LMHeadModel.from_pretrained(dir) reads (needs bias = true). */
em_status em_gpt_export_hf(em_gpt *g, const char *dir);

/* ---- sampling and generation ----------------------------------------------------------------- */

typedef struct em_sample_config {
    double temperature;         /* 0: greedy */
    int64_t top_k;              /* 0: off */
    double top_p;               /* 1: off */
    double repetition_penalty;  /* 1: off (CTRL-style: divide positive logits, multiply negative) */
    uint64_t seed;
} em_sample_config;
/* Picks the next token from one row of logits (host f32 [vocab]) given the ids so far (for the
 * repetition penalty); rng_state advances. */
int64_t em_sample_token(const float *logits, int64_t vocab, const int64_t *history, int64_t nhist,
                        const em_sample_config *cfg, uint64_t *rng_state);

/* Streams tokens: called with each new token id; return false to stop. */
typedef bool (*em_token_fn)(int64_t token, void *user);
/* Generates up to max_new tokens after prompt (ids), feeding the prompt once and then one token
 * at a time through the KV cache (the window slides when the context is full). Stops early at
 * stop_token (>= 0) or when fn returns false. Writes the count generated to *n_out. */
em_status em_gpt_generate(em_gpt *g, const int64_t *prompt, int64_t nprompt, int64_t max_new,
                          const em_sample_config *cfg, int64_t stop_token, em_token_fn fn,
                          void *user, int64_t *n_out);

/* ---- batched decoding (continuous batching; src/models/gpt/batch.c) ------------------------- */

/* `slots` independent sequences that decode together, for a server's continuous batching. Each
 * slot has its own rows of the KV cache and its own length, so sequences of different lengths join
 * (em_gpt_batch_prefill) and leave (em_gpt_batch_clear) while the others go on, and one
 * em_gpt_batch_step is one batched forward pass over any subset of the slots: new tokens [n, 1],
 * each at its own slot's position (the position embeddings per row, the attention masked per row
 * to the slot's own keys). Greedy decoding gives the tokens of em_gpt_generate. Runs in eval mode
 * under no-grad; one thread at a time per batch (and per model). */
typedef struct em_gpt_batch em_gpt_batch;
/* A batch of `slots` empty slots of max_len positions each (max_len <= 0 or > block_size: the
 * block size). NULL with the error set. Free with em_gpt_batch_free (before the model). */
em_gpt_batch *em_gpt_batch_new(em_gpt *g, int64_t slots, int64_t max_len);
void em_gpt_batch_free(em_gpt_batch *b);
int64_t em_gpt_batch_slots(const em_gpt_batch *b);
int64_t em_gpt_batch_max_len(const em_gpt_batch *b);
/* Positions a slot holds (0 when empty or out of range). */
int64_t em_gpt_batch_len(const em_gpt_batch *b, int64_t slot);
/* Empties `slot` and feeds ids[0, n) (1 <= n <= max_len, ids inside the vocabulary) into it in one
 * pass; the last position's logits go to `logits` (host f32 [vocab], may be NULL). On failure
 * the slot is left empty. */
em_status em_gpt_batch_prefill(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n,
                               float *logits);
/* One decode step for n distinct slots: tokens[i] is appended to slots[i] (which must hold at
 * least one position and have room for one more) and row i of `logits` (host f32 [n, vocab],
 * may be NULL) gets the next-token logits of slots[i]. Other slots are untouched; on failure the
 * listed slots are left empty. */
em_status em_gpt_batch_step(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens,
                            int64_t n, float *logits);
/* em_gpt_batch_prefill, but instead of the logits *next receives the last position's greedy
 * next token: the first largest logit (em_argmax on the device; what em_sample_token picks at
 * temperature 0 when no logit is NaN). */
em_status em_gpt_batch_prefill_greedy(em_gpt_batch *b, int64_t slot, const int64_t *ids, int64_t n,
                                      int64_t *next);
/* em_gpt_batch_step, but instead of logits next[i] receives slots[i]'s greedy next token (as
 * em_gpt_batch_prefill_greedy): one i64 per row comes back from the device. next may be
 * tokens (each token is replaced by its successor). */
em_status em_gpt_batch_step_greedy(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens,
                                   int64_t n, int64_t *next);
/* `steps` greedy steps of the same n slots in a row (each must have room for `steps` more
 * positions): step 0 feeds tokens, step k > 0 each slot's token of step k - 1, and
 * next[k * n + i] receives slots[i]'s token of step k. The tokens are em_gpt_batch_step_greedy's
 * over `steps` calls, but they are fed on the device and come back together in one read, so the
 * host queues every step before it waits (no host round trip between steps). tokens are read
 * before next is written, so next may be tokens (with room for steps * n). On failure the listed
 * slots are left empty; a slot without room is an error before anything runs. */
em_status em_gpt_batch_steps_greedy(em_gpt_batch *b, const int64_t *slots, const int64_t *tokens,
                                    int64_t n, int64_t steps, int64_t *next);

/* Empties a slot (its sequence left the batch). */
void em_gpt_batch_clear(em_gpt_batch *b, int64_t slot);

#ifdef __cplusplus
}
#endif
#endif
