/* hf_load.c — saving and loading GPT weights as safetensors, in Hugging Face GPT-2 naming:
 * ember's own checkpoints (config in the "ember.config" metadata), Hugging Face's
 * model.safetensors (names with or without "transformer.", the attention-mask buffers
 * "attn.bias" / "attn.masked_bias" ignored, the LM head tied to wte; config from config.json
 * beside the file, else inferred from the shapes with GPT-2's head width of 64), and exporting a
 * folder that transformers' GPT2LMHeadModel.from_pretrained reads (model.safetensors +
 * config.json). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "models/gpt/internal.h"

static bool starts_with(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}
static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ---- saving ---------------------------------------------------------------------------------- */

typedef struct add_ctx {
    em_safetensors_writer *w; /* where to */
    em_status st;             /* first failure */
} add_ctx;

static bool add_entry(const char *name, em_module_entry *e, void *user)
{
    add_ctx *c = user;
    c->st = em_safetensors_add(c->w, name, e->t);
    return c->st == EM_OK;
}

em_status em_gpt_add_to_writer(em_gpt *g, em_safetensors_writer *w)
{
    if (!g || !w) return em_set_error(EM_ERR_INVALID, "em_gpt_add_to_writer: NULL argument");
    add_ctx c = {w, EM_OK};
    em_module_visit(g->root, add_entry, &c);
    if (c.st != EM_OK) return c.st;
    char *json = em_gpt_config_to_json(&g->cfg);
    if (!json) return em_last_status();
    em_status st = em_safetensors_add_metadata(w, "ember.config", json);
    free(json);
    if (st == EM_OK) st = em_safetensors_add_metadata(w, "format", "pt");
    return st;
}

em_status em_gpt_save(em_gpt *g, const char *path)
{
    if (!g || !path) return em_set_error(EM_ERR_INVALID, "em_gpt_save: NULL argument");
    em_safetensors_writer *w = em_safetensors_writer_new();
    if (!w) return em_last_status();
    em_status st = em_gpt_add_to_writer(g, w);
    if (st == EM_OK) st = em_safetensors_write(w, path);
    em_safetensors_writer_free(w);
    if (st != EM_OK) em_error_context("saving %s", path);
    return st;
}

em_status em_gpt_export_hf(em_gpt *g, const char *dir)
{
    if (!g || !dir) return em_set_error(EM_ERR_INVALID, "em_gpt_export_hf: NULL argument");
    if (!g->cfg.bias)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "em_gpt_export_hf: Hugging Face GPT-2 always has biases; this model "
                            "has none");
    em_status st = em_mkdir_p(dir);
    if (st != EM_OK) return st;
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) return em_set_error(EM_ERR_NOMEM, "em_gpt_export_hf: out of memory");
    snprintf(path, n, "%s/model.safetensors", dir);
    st = em_gpt_save(g, path);
    if (st == EM_OK) {
        const em_gpt_config *c = &g->cfg;
        char json[1024];
        int len = snprintf(
            json, sizeof json,
            "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n  \"n_ctx\": %lld,\n"
            "  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n"
            "  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n"
            "  \"layer_norm_epsilon\": 1e-05,\n  \"resid_pdrop\": %g,\n  \"embd_pdrop\": %g,\n"
            "  \"attn_pdrop\": %g,\n  \"initializer_range\": 0.02,\n"
            "  \"tie_word_embeddings\": %s\n}\n",
            (long long)c->vocab_size, (long long)c->block_size, (long long)c->block_size,
            (long long)c->n_embd, (long long)c->n_layer, (long long)c->n_head, c->dropout,
            c->dropout, c->dropout, c->tied ? "true" : "false");
        snprintf(path, n, "%s/config.json", dir);
        st = em_file_write_atomic(path, json, (size_t)len);
    }
    free(path);
    return st;
}

/* ---- loading --------------------------------------------------------------------------------- */

/* The file's name for a model name: as is, or with "transformer." (NULL when neither exists). */
static const char *file_name(const em_safetensors *f, const char *name, char *buf, size_t size)
{
    em_scalar dt;
    em_shape sh;
    if (em_safetensors_info(f, name, &dt, &sh)) return name;
    snprintf(buf, size, "transformer.%s", name);
    if (em_safetensors_info(f, buf, &dt, &sh)) return buf;
    return NULL;
}

/* The config from the shapes alone: n_head from GPT-2's head width of 64. */
static bool infer_config(const em_safetensors *f, em_gpt_config *c)
{
    char buf[256];
    em_scalar dt;
    em_shape wte, wpe;
    const char *n1 = file_name(f, "wte.weight", buf, sizeof buf);
    if (!n1 || !em_safetensors_info(f, n1, &dt, &wte) || wte.rank != 2) {
        em_set_error(EM_ERR_INVALID, "not a GPT-2 checkpoint: no wte.weight [vocab, n_embd]");
        return false;
    }
    const char *n2 = file_name(f, "wpe.weight", buf, sizeof buf);
    if (!n2 || !em_safetensors_info(f, n2, &dt, &wpe) || wpe.rank != 2) {
        em_set_error(EM_ERR_INVALID, "not a GPT-2 checkpoint: no wpe.weight [positions, n_embd]");
        return false;
    }
    int64_t layers = 0;
    for (int i = 0; i < em_safetensors_count(f); i++) {
        const char *nm = em_safetensors_name(f, i);
        if (starts_with(nm, "transformer.")) nm += strlen("transformer.");
        long long k;
        if (sscanf(nm, "h.%lld.", &k) == 1 && k + 1 > layers) layers = k + 1;
    }
    c->vocab_size = wte.d[0];
    c->n_embd = wte.d[1];
    c->block_size = wpe.d[0];
    c->n_layer = layers;
    c->n_head = c->n_embd % 64 == 0 ? c->n_embd / 64 : 1;
    c->dropout = 0;
    c->bias = file_name(f, "h.0.attn.c_attn.bias", buf, sizeof buf) != NULL;
    c->tied = !em_safetensors_info(f, "lm_head.weight", &dt, &wte);
    EM_LOGW("no config for the checkpoint: inferred %lld layers, n_embd %lld, %lld heads "
            "(head width 64)",
            (long long)c->n_layer, (long long)c->n_embd, (long long)c->n_head);
    return em_gpt_config_check(c);
}

/* config.json in the checkpoint's folder, or NULL. malloc'd. */
static char *read_config_json(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 1;
    char *cpath = malloc(dlen + 16);
    if (!cpath) return NULL;
    if (slash)
        snprintf(cpath, dlen + 16, "%.*s/config.json", (int)dlen, path);
    else
        snprintf(cpath, dlen + 16, "config.json");
    char *json = em_file_exists(cpath) ? em_file_read(cpath, NULL) : NULL;
    free(cpath);
    return json;
}

static const char *rename_hf(const char *name, char *buf, size_t size, void *user)
{
    const em_gpt_config *c = user;
    if (starts_with(name, "optim.") || starts_with(name, "train."))
        return NULL; /* training state */
    if (starts_with(name, "transformer.")) name += strlen("transformer.");
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return NULL;
    if (c->tied && strcmp(name, "lm_head.weight") == 0) return NULL;
    snprintf(buf, size, "%s", name);
    return buf;
}

em_gpt *em_gpt_load(const char *path, em_device *dev, em_scalar dtype)
{
    if (!path || !dev) {
        em_set_error(EM_ERR_INVALID, "em_gpt_load: NULL path or device");
        return NULL;
    }
    em_safetensors *f = em_safetensors_open(path);
    if (!f) return NULL;
    em_gpt_config cfg;
    bool ok;
    const char *meta = em_safetensors_metadata(f, "ember.config");
    char *json = meta ? NULL : read_config_json(path);
    if (meta)
        ok = em_gpt_config_from_json(meta, &cfg);
    else if (json)
        ok = em_gpt_config_from_json(json, &cfg);
    else
        ok = infer_config(f, &cfg);
    free(json);
    if (ok && dtype == EM_SCALAR_COUNT) {
        char buf[256];
        em_shape sh;
        const char *n = file_name(f, "wte.weight", buf, sizeof buf);
        if (!n || !em_safetensors_info(f, n, &dtype, &sh)) dtype = EM_F32;
    }
    em_safetensors_close(f);
    if (!ok) {
        em_error_context("loading %s", path);
        return NULL;
    }
    em_gpt *g = gpt_build(dev, dtype, &cfg, 0);
    if (!g) return NULL;
    if (em_module_load(g->root, path, true, rename_hf, &g->cfg) != EM_OK) {
        em_error_context("loading %s", path);
        em_gpt_free(g);
        return NULL;
    }
    return g;
}
