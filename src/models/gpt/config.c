/* config.c — GPT configurations: the presets (tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl) and
 * the config's JSON form, which checkpoints keep in their metadata ("ember.config"). The JSON
 * reader also accepts Hugging Face's config.json keys (n_ctx / n_positions, n_embd, ...), so a
 * GPT-2 config.json beside a model.safetensors describes the model. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/gpt.h"

typedef struct preset {
    const char *name;  /* what --preset takes */
    em_gpt_config cfg; /* its sizes */
} preset;

static const preset PRESETS[] = {
    /* A character-level model small enough to train on a 2-core CPU in minutes. vocab_size is
     * replaced by the tokenizer's when training. Its context is 64 characters: on the KJV corpus
     * it reaches a given loss in fewer steps than with 128, each step (of as many sequences)
     * cheaper (docs/gpt.md has the comparison). */
    {"tiny", {256, 64, 4, 4, 128, 0.0, true, true}},
    {"gpt2", {50257, 1024, 12, 12, 768, 0.0, true, true}},
    {"gpt2-medium", {50257, 1024, 24, 16, 1024, 0.0, true, true}},
    {"gpt2-large", {50257, 1024, 36, 20, 1280, 0.0, true, true}},
    {"gpt2-xl", {50257, 1024, 48, 25, 1600, 0.0, true, true}},
};

bool em_gpt_preset(const char *name, em_gpt_config *out)
{
    if (!name || !out) {
        em_set_error(EM_ERR_INVALID, "em_gpt_preset: NULL argument");
        return false;
    }
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) {
        if (strcmp(name, PRESETS[i].name) == 0) {
            *out = PRESETS[i].cfg;
            return true;
        }
    }
    em_set_error(EM_ERR_INVALID,
                 "unknown GPT preset '%s' (known: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl)",
                 name);
    return false;
}

/* Checks that the sizes make a model: positive, and heads dividing the width. */
bool em_gpt_config_check(const em_gpt_config *c)
{
    if (c->vocab_size <= 0 || c->block_size <= 0 || c->n_layer <= 0 || c->n_head <= 0 ||
        c->n_embd <= 0) {
        em_set_error(EM_ERR_INVALID,
                     "GPT config: sizes must be positive (vocab_size %lld, block_size %lld, "
                     "n_layer %lld, n_head %lld, n_embd %lld)",
                     (long long)c->vocab_size, (long long)c->block_size, (long long)c->n_layer,
                     (long long)c->n_head, (long long)c->n_embd);
        return false;
    }
    if (c->n_embd % c->n_head != 0) {
        em_set_error(EM_ERR_INVALID, "GPT config: n_embd %lld is not a multiple of n_head %lld",
                     (long long)c->n_embd, (long long)c->n_head);
        return false;
    }
    if (c->dropout < 0 || c->dropout >= 1) {
        em_set_error(EM_ERR_INVALID, "GPT config: dropout %g is outside [0, 1)", c->dropout);
        return false;
    }
    return true;
}

char *em_gpt_config_to_json(const em_gpt_config *c)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf,
                     "{\"vocab_size\": %lld, \"block_size\": %lld, \"n_layer\": %lld, "
                     "\"n_head\": %lld, \"n_embd\": %lld, \"dropout\": %.17g, \"bias\": %s, "
                     "\"tied\": %s}",
                     (long long)c->vocab_size, (long long)c->block_size, (long long)c->n_layer,
                     (long long)c->n_head, (long long)c->n_embd, c->dropout,
                     c->bias ? "true" : "false", c->tied ? "true" : "false");
    char *s = malloc((size_t)n + 1);
    if (!s) {
        em_set_error(EM_ERR_NOMEM, "em_gpt_config_to_json: out of memory");
        return NULL;
    }
    memcpy(s, buf, (size_t)n + 1);
    return s;
}

/* The first of `keys` present in obj as a number; false when none is. */
static bool get_num(const cJSON *obj, const char *const *keys, double *out)
{
    for (; *keys; keys++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, *keys);
        if (cJSON_IsNumber(v)) {
            *out = v->valuedouble;
            return true;
        }
    }
    return false;
}

static bool get_int(const cJSON *obj, const char *const *keys, int64_t *out, bool required)
{
    double d;
    if (!get_num(obj, keys, &d)) {
        if (required) em_set_error(EM_ERR_INVALID, "GPT config JSON: missing \"%s\"", keys[0]);
        return !required;
    }
    if (d != (double)(int64_t)d) {
        em_set_error(EM_ERR_INVALID, "GPT config JSON: \"%s\" is not an integer", keys[0]);
        return false;
    }
    *out = (int64_t)d;
    return true;
}

bool em_gpt_config_from_json(const char *json, em_gpt_config *out)
{
    if (!json || !out) {
        em_set_error(EM_ERR_INVALID, "em_gpt_config_from_json: NULL argument");
        return false;
    }
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        em_set_error(EM_ERR_CORRUPT, "GPT config: not a JSON object");
        return false;
    }
    em_gpt_config c;
    memset(&c, 0, sizeof c); /* padding too, so that equal configs are equal bytes */
    c.bias = c.tied = true;
    static const char *const k_vocab[] = {"vocab_size", NULL};
    static const char *const k_block[] = {"block_size", "n_positions", "n_ctx", NULL};
    static const char *const k_layer[] = {"n_layer", "num_hidden_layers", NULL};
    static const char *const k_head[] = {"n_head", "num_attention_heads", NULL};
    static const char *const k_embd[] = {"n_embd", "hidden_size", NULL};
    static const char *const k_drop[] = {"dropout", "resid_pdrop", NULL};
    bool ok = get_int(o, k_vocab, &c.vocab_size, true) &&
              get_int(o, k_block, &c.block_size, true) && get_int(o, k_layer, &c.n_layer, true) &&
              get_int(o, k_head, &c.n_head, true) && get_int(o, k_embd, &c.n_embd, true);
    if (ok) {
        double d;
        if (get_num(o, k_drop, &d)) c.dropout = d;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "bias");
        if (cJSON_IsBool(b)) c.bias = cJSON_IsTrue(b);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tied");
        if (!cJSON_IsBool(t)) t = cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings");
        if (cJSON_IsBool(t)) c.tied = cJSON_IsTrue(t);
        ok = em_gpt_config_check(&c);
    }
    cJSON_Delete(o);
    if (ok) *out = c;
    return ok;
}
