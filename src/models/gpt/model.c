/* model.c — the GPT (GPT-2 family) as a module tree in Hugging Face naming: token and position
 * embeddings, n_layer pre-norm transformer blocks (Conv1D weight layout, GELU-tanh MLP), a final
 * LayerNorm and an LM head tied to the token embeddings. Forward with or without a KV cache,
 * the next-token cross-entropy, and GPT-2's initialization. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "models/gpt/internal.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool set_decay(const char *name, em_module_entry *e, void *user);

em_gpt *gpt_build(em_device *dev, em_scalar dtype, const em_gpt_config *cfg, uint64_t seed)
{
    if (!dev || !cfg) {
        em_set_error(EM_ERR_INVALID, "em_gpt_new: NULL device or config");
        return NULL;
    }
    if (!em_gpt_config_check(cfg)) return NULL;
    if (dtype != EM_F32 && dtype != EM_F64 && dtype != EM_BF16 && dtype != EM_F16) {
        em_set_error(EM_ERR_INVALID, "em_gpt_new: parameters need a floating-point dtype");
        return NULL;
    }
    em_gpt *g = calloc(1, sizeof *g);
    em_block **h = calloc((size_t)cfg->n_layer, sizeof *h);
    em_module *root = em_module_new("GPT", dev, sizeof(em_module));
    em_module *list = em_module_new("ModuleList", dev, sizeof(em_module));
    if (!g || !h || !root || !list) {
        free(g);
        free(h);
        em_module_free(root);
        em_module_free(list);
        em_set_error(EM_ERR_NOMEM, "em_gpt_new: out of memory");
        return NULL;
    }
    g->cfg = *cfg;
    g->dtype = dtype;
    g->dev = dev;
    g->root = root;
    g->h = h;
    g->rng = em_rng_new(seed ^ 0x5eedd20b0u);
    em_rng rng = em_rng_new(seed);
    bool ok = true;
    g->wte = (em_embedding_mod *)em_module_add(
        root, "wte", (em_module *)em_embedding_new(dev, dtype, cfg->vocab_size, cfg->n_embd, &rng));
    g->wpe = (em_embedding_mod *)em_module_add(
        root, "wpe", (em_module *)em_embedding_new(dev, dtype, cfg->block_size, cfg->n_embd, &rng));
    ok = g->wte && g->wpe && em_module_add(root, "h", list);
    em_block_config bc = {
        .dim = cfg->n_embd,
        .heads = cfg->n_head,
        .hidden = 4 * cfg->n_embd,
        .bias = cfg->bias,
        .p_dropout = cfg->dropout,
        .eps = 1e-5,
        .act = EM_ACT_GELU_TANH,
        .weight_in_out = true,
    };
    for (int64_t i = 0; ok && i < cfg->n_layer; i++) {
        char name[32];
        snprintf(name, sizeof name, "%lld", (long long)i);
        h[i] =
            (em_block *)em_module_add(list, name, (em_module *)em_block_new(dev, dtype, &bc, &rng));
        ok = h[i] != NULL;
    }
    if (ok) {
        g->ln_f = (em_layer_norm_mod *)em_module_add(
            root, "ln_f",
            (em_module *)em_layer_norm_new(dev, dtype, cfg->n_embd, 1e-5, true, cfg->bias));
        ok = g->ln_f != NULL;
    }
    if (ok && !cfg->tied) {
        /* PyTorch Linear layout [vocab, n_embd], as Hugging Face's lm_head.weight. */
        g->lm_head = (em_linear *)em_module_add(root, "lm_head",
                                                (em_module *)em_linear_new(dev, dtype, cfg->n_embd,
                                                                           cfg->vocab_size, false,
                                                                           false, &rng));
        ok = g->lm_head != NULL;
    }
    if (!ok) {
        em_error_context("em_gpt_new");
        em_gpt_free(g);
        return NULL;
    }
    em_module_visit(root, set_decay, NULL);
    return g;
}

typedef struct init_ctx {
    em_rng *rng;  /* draws */
    int n_layer;  /* for the residual scaling */
    em_status st; /* first failure */
} init_ctx;

/* Weight decay as GPT-2 training applies it: the linear weights only (not biases, norms or the
 * embeddings). */
static bool set_decay(const char *name, em_module_entry *e, void *user)
{
    (void)user;
    bool linear = ends_with(name, "c_attn.weight") || ends_with(name, "c_proj.weight") ||
                  ends_with(name, "c_fc.weight") || strcmp(name, "lm_head.weight") == 0;
    e->decay = e->is_param && linear;
    return true;
}

/* GPT-2's init by name: linear and embedding weights normal(0, 0.02), residual projections
 * (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 n_layer)), biases zero, norms one. */
static bool init_one(const char *name, em_module_entry *e, void *user)
{
    init_ctx *c = user;
    if (!e->is_param) return true;
    em_status st;
    if (ends_with(name, ".bias"))
        st = em_init_constant(e->t, 0.0);
    else if (strstr(name, "ln_"))
        st = em_init_constant(e->t, 1.0);
    else if (ends_with(name, "c_proj.weight"))
        st = em_init_gpt2_residual(e->t, c->n_layer, c->rng);
    else
        st = em_init_normal(e->t, 0.0, 0.02, c->rng);
    if (st != EM_OK) {
        c->st = st;
        em_error_context("initializing %s", name);
        return false;
    }
    return true;
}

em_gpt *em_gpt_new(em_device *dev, em_scalar dtype, const em_gpt_config *cfg, uint64_t seed)
{
    em_gpt *g = gpt_build(dev, dtype, cfg, seed);
    if (!g) return NULL;
    em_rng rng = em_rng_new(seed + 1);
    init_ctx c = {&rng, (int)cfg->n_layer, EM_OK};
    em_module_visit(g->root, init_one, &c);
    if (c.st != EM_OK) {
        em_gpt_free(g);
        return NULL;
    }
    return g;
}

void em_gpt_free(em_gpt *g)
{
    if (!g) return;
    em_module_free(g->root);
    free(g->h);
    free(g);
}

const em_gpt_config *em_gpt_config_of(const em_gpt *g)
{
    return g ? &g->cfg : NULL;
}
em_module *em_gpt_module(em_gpt *g)
{
    return g ? g->root : NULL;
}
em_device *em_gpt_device(const em_gpt *g)
{
    return g ? g->dev : NULL;
}
em_rng *em_gpt_rng(em_gpt *g)
{
    return g ? &g->rng : NULL;
}

/* ---- KV cache -------------------------------------------------------------------------------- */

em_gpt_cache *em_gpt_cache_new(em_gpt *g, int64_t batch, int64_t max_len)
{
    if (!g || batch <= 0) {
        em_set_error(EM_ERR_INVALID, "em_gpt_cache_new: no model or batch <= 0");
        return NULL;
    }
    if (max_len <= 0 || max_len > g->cfg.block_size) max_len = g->cfg.block_size;
    em_gpt_cache *c = calloc(1, sizeof *c);
    if (c) c->layers = calloc((size_t)g->cfg.n_layer, sizeof *c->layers);
    if (!c || !c->layers) {
        free(c);
        em_set_error(EM_ERR_NOMEM, "em_gpt_cache_new: out of memory");
        return NULL;
    }
    c->g = g;
    c->n = g->cfg.n_layer;
    c->batch = batch;
    c->max_len = max_len;
    int64_t hd = g->cfg.n_embd / g->cfg.n_head;
    for (int64_t i = 0; i < c->n; i++) {
        c->layers[i] = em_kv_cache_new(g->dev, g->dtype, batch, g->cfg.n_head, max_len, hd);
        if (!c->layers[i]) {
            em_gpt_cache_free(c);
            return NULL;
        }
    }
    return c;
}

void em_gpt_cache_free(em_gpt_cache *c)
{
    if (!c) return;
    for (int64_t i = 0; i < c->n; i++) em_kv_cache_free(c->layers[i]);
    free(c->layers);
    free(c);
}

void em_gpt_cache_reset(em_gpt_cache *c)
{
    if (!c) return;
    for (int64_t i = 0; i < c->n; i++) em_kv_cache_reset(c->layers[i]);
}

int64_t em_gpt_cache_len(const em_gpt_cache *c)
{
    return c && c->n > 0 ? c->layers[0]->len : 0;
}

/* ---- forward --------------------------------------------------------------------------------- */

/* The hidden states after ln_f: [B, T, n_embd]. */
static em_tensor *hidden(em_gpt *g, const em_tensor *ids, em_gpt_cache *cache)
{
    char buf[64];
    if (em_rank(ids) != 2 || (em_dtype(ids) != EM_I32 && em_dtype(ids) != EM_I64)) {
        em_set_error(EM_ERR_INVALID, "em_gpt_forward: ids must be i32/i64 [B, T], got %s",
                     em_describe(ids, buf, sizeof buf));
        return NULL;
    }
    int64_t B = em_dim(ids, 0), T = em_dim(ids, 1);
    int64_t start = cache ? em_gpt_cache_len(cache) : 0;
    if (cache && (cache->g != g || cache->batch != B)) {
        em_set_error(EM_ERR_INVALID,
                     "em_gpt_forward: the cache was made for another model or batch (%lld, ids "
                     "have %lld rows)",
                     (long long)cache->batch, (long long)B);
        return NULL;
    }
    int64_t limit = cache ? cache->max_len : g->cfg.block_size;
    if (T <= 0 || start + T > limit) {
        em_set_error(EM_ERR_INVALID,
                     "em_gpt_forward: %lld positions (%lld cached + %lld new) exceed the context "
                     "of %lld",
                     (long long)(start + T), (long long)start, (long long)T, (long long)limit);
        return NULL;
    }
    em_scope_begin();
    em_tensor *pos = em_arange(g->dev, EM_I64, (double)start, (double)(start + T), 1);
    em_tensor *x = em_add(em_embedding_forward(g->wte, ids), em_embedding_forward(g->wpe, pos));
    bool training = g->root->training;
    x = em_dropout(x, g->cfg.dropout, training, &g->rng);
    for (int64_t i = 0; x && i < g->cfg.n_layer; i++)
        x = em_block_forward(g->h[i], x, NULL, cache ? cache->layers[i] : NULL, &g->rng);
    x = em_layer_norm_forward(g->ln_f, x);
    if (x) em_keep(x);
    em_scope_end(NULL, 0);
    return x;
}

/* The logits of hidden states x in the model's dtype (em_gpt_loss's cross-entropy reads bf16
 * logits itself, computing in f32). */
static em_tensor *head_logits(em_gpt *g, const em_tensor *x)
{
    if (g->lm_head) return em_linear_forward(g->lm_head, x);
    return em_matmul(x, em_transpose(g->wte->weight, 0, 1));
}

/* The head's weight as [V, C] (the tied embedding, or lm_head's), or NULL when the head has a
 * bias (the fused loss has none). */
static const em_tensor *head_weight(em_gpt *g)
{
    if (!g->lm_head) return g->wte->weight;
    if (g->lm_head->bias) return NULL;
    if (!g->lm_head->weight_in_out) return g->lm_head->weight;
    return NULL; /* [C, V]: the loss takes the logits' path */
}

/* Whether em_gpt_loss runs the head and the loss as em_linear_cross_entropy (EMBER_FUSED_HEAD=0:
 * the logits, then the fused classifier, as before); EMBER_FUSED_HEAD=N above 1 sets its rows per
 * chunk (*chunk_rows; 0: the op's own choice), for measuring. Any other value is warned about
 * once and the fused head runs with its own chunks. */
static bool fused_head(int64_t *chunk_rows)
{
    const char *v = getenv("EMBER_FUSED_HEAD");
    *chunk_rows = 0;
    if (!v) return true;
    char *end = NULL;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || n < 0) {
        static atomic_bool warned; /* read at every step: say it once */
        if (!atomic_exchange(&warned, true))
            em_log(EM_LOG_WARN,
                   "EMBER_FUSED_HEAD='%s' is not 0 (off), 1 (on) or a count of rows per chunk; "
                   "using the fused head with its own chunks",
                   v);
        return true;
    }
    if (n > 1) *chunk_rows = (int64_t)n;
    return n != 0;
}

em_tensor *gpt_head(em_gpt *g, const em_tensor *x)
{
    em_scope_begin();
    em_tensor *logits = head_logits(g, x);
    if (logits && em_dtype(logits) != EM_F32) logits = em_cast(em_take(logits), EM_F32);
    if (logits) em_keep(logits);
    em_scope_end(NULL, 0);
    return logits;
}

em_tensor *em_gpt_forward(em_gpt *g, const em_tensor *ids, em_gpt_cache *cache)
{
    if (!g || !ids) {
        if (!g) em_set_error(EM_ERR_INVALID, "em_gpt_forward: no model");
        return NULL;
    }
    em_tensor *x = hidden(g, ids, cache);
    if (!x) return NULL;
    em_tensor *logits = gpt_head(g, x);
    em_release(x);
    if (!logits) em_error_context("em_gpt_forward");
    return logits;
}

em_tensor *em_gpt_loss(em_gpt *g, const em_tensor *ids, const em_tensor *targets)
{
    if (!g || !ids || !targets) {
        if (!g) em_set_error(EM_ERR_INVALID, "em_gpt_loss: no model");
        return NULL;
    }
    char a[64], b[64];
    em_shape si = em_shape_of(ids), st = em_shape_of(targets);
    if (si.rank != 2 || st.rank != 2 || si.d[0] != st.d[0] || si.d[1] != st.d[1]) {
        em_set_error(EM_ERR_INVALID, "em_gpt_loss: ids %s and targets %s must both be [B, T]",
                     em_describe(ids, a, sizeof a), em_describe(targets, b, sizeof b));
        return NULL;
    }
    em_tensor *x = hidden(g, ids, NULL);
    const em_tensor *w = head_weight(g);
    int64_t chunk_rows = 0;
    if (x && w && fused_head(&chunk_rows)) {
        /* the classifier over the head's rows in chunks: no [B T, V] logits (docs/gpt.md) */
        em_scope_begin();
        int64_t C = g->cfg.n_embd;
        em_tensor *loss = em_linear_cross_entropy(
            em_reshape(x, EM_SHAPE(-1, C)), w, em_reshape(targets, EM_SHAPE(-1)), -100, chunk_rows);
        if (loss) em_keep(loss);
        em_scope_end(NULL, 0);
        em_release(x);
        if (!loss) em_error_context("em_gpt_loss");
        return loss;
    }
    /* the logits stay in the model's dtype: the fused classifier reads bf16 logits, computes in
     * f32, returns an f32 loss and writes the gradient in bf16 (no f32 copy of [B T, V]) */
    em_scope_begin();
    em_tensor *logits = x ? head_logits(g, x) : NULL;
    if (logits) em_keep(logits);
    em_scope_end(NULL, 0);
    em_release(x);
    if (!logits) {
        em_error_context("em_gpt_loss");
        return NULL;
    }
    em_scope_begin();
    int64_t V = g->cfg.vocab_size;
    em_tensor *loss =
        em_cross_entropy(em_reshape(logits, EM_SHAPE(-1, V)), em_reshape(targets, EM_SHAPE(-1)),
                         -100, 0.0, EM_REDUCE_MEAN);
    if (loss) em_keep(loss);
    em_scope_end(NULL, 0);
    em_release(logits);
    if (!loss) em_error_context("em_gpt_loss");
    return loss;
}
