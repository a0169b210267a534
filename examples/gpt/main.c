/* examples/gpt/main.c — a GPT built from ember's modules, trained on text, sampled with a KV cache.
 *
 * Defines GPT-2's architecture in user code from the modules of ember/nn.h: token and position
 * embeddings, a stack of pre-norm transformer blocks (attention and MLP), a final LayerNorm and
 * an LM head tied to the token embeddings. The parameters carry Hugging Face's GPT-2 names, as in
 * the model `ember train` builds (wte.weight, h.0.attn.c_attn.weight, ..., ln_f.weight). Trains
 * it on the first characters of a text file (by default the King James Bible that scripts/corpus
 * makes) with AdamW and cross-entropy in the PyTorch loop shape, then samples from it through one
 * key/value cache per block: the prompt is fed once, then one token at a time. --check-cache also
 * runs the full forward at every sampled token and exits 1 unless both give the same logits.
 * Uses only the public headers; walked through in docs/tutorial.md.
 *
 *   gpt [--device NAME] [--data PATH] [--chars N] [--steps N] [--batch B] [--seq T] [--layers L]
 *       [--dim D] [--heads H] [--lr LR] [--seed S] [--prompt TEXT] [--tokens N]
 *       [--temperature T] [--top-k K] [--max-loss X] [--check-cache] [--save DIR] */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/ember.h"
#include "ember/train.h" /* em_train_best_device, for --device auto */

#ifndef KJV_PATH /* set by examples/CMakeLists.txt: where scripts/corpus puts the corpus */
#define KJV_PATH ".cache/data/kjv.txt"
#endif

/* ---- the model ------------------------------------------------------------------------------- */

typedef struct gpt {
    em_module base;              /* first: the parameter tree (wte.weight, h.0.ln_1.weight, ...) */
    em_gpt_config cfg;           /* sizes: vocab, context (block_size), layers, heads, width */
    em_embedding_mod *wte, *wpe; /* token and position embeddings: [vocab, dim], [context, dim] */
    em_module *h;                /* the blocks: children "0", "1", ... of a ModuleList */
    em_layer_norm_mod *ln_f;     /* the final LayerNorm */
} gpt;

static em_block *block(gpt *m, int i) { return (em_block *)m->h->children[i]; }

static bool ends_with(const char *s, const char *x)
{
    size_t n = strlen(s), k = strlen(x);
    return n >= k && strcmp(s + n - k, x) == 0;
}

/* GPT-2's initialization by name, as `ember train` does it: weights normal(0, 0.02), residual
 * projections (c_proj) normal(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1. Weight
 * decay stays on the linear weights: the embeddings leave the decay group. */
typedef struct init_ctx {
    em_rng *rng;
    int n_layer;
    em_status st; /* the first failure */
} init_ctx;
static bool gpt2_init(const char *name, em_module_entry *e, void *user)
{
    init_ctx *c = user;
    if (ends_with(name, ".bias")) c->st = em_init_constant(e->t, 0.0);
    else if (strstr(name, "ln_")) c->st = em_init_constant(e->t, 1.0);
    else if (ends_with(name, "c_proj.weight"))
        c->st = em_init_gpt2_residual(e->t, c->n_layer, c->rng);
    else c->st = em_init_normal(e->t, 0.0, 0.02, c->rng);
    if (!strcmp(name, "wte.weight") || !strcmp(name, "wpe.weight")) e->decay = false;
    return c->st == EM_OK;
}

static gpt *gpt_new(em_device *dev, const em_gpt_config *c, em_rng *rng)
{
    gpt *m = (gpt *)em_module_new("GPT", dev, sizeof(gpt));
    if (!m) return NULL;
    m->cfg = *c;
    m->wte = (em_embedding_mod *)em_module_add(
        &m->base, "wte", (em_module *)em_embedding_new(dev, EM_F32, c->vocab_size, c->n_embd, rng));
    m->wpe = (em_embedding_mod *)em_module_add(
        &m->base, "wpe", (em_module *)em_embedding_new(dev, EM_F32, c->block_size, c->n_embd, rng));
    m->h = em_module_add(&m->base, "h", em_module_new("ModuleList", dev, sizeof(em_module)));
    /* GPT-2's block: a GELU (tanh form) MLP 4x as wide, biases, LayerNorm eps 1e-5, and weights
     * in the [in, out] layout of Hugging Face's Conv1D, so its checkpoints load as they are. */
    em_block_config bc = {.dim = c->n_embd, .heads = c->n_head, .hidden = 4 * c->n_embd,
                          .bias = true, .p_dropout = 0.0, .eps = 1e-5, .act = EM_ACT_GELU_TANH,
                          .weight_in_out = true};
    bool ok = m->wte && m->wpe && m->h;
    for (int i = 0; ok && i < c->n_layer; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        ok = em_module_add(m->h, name, (em_module *)em_block_new(dev, EM_F32, &bc, rng)) != NULL;
    }
    if (ok)
        m->ln_f = (em_layer_norm_mod *)em_module_add(
            &m->base, "ln_f",
            (em_module *)em_layer_norm_new(dev, EM_F32, c->n_embd, 1e-5, true, true));
    init_ctx init = {rng, (int)c->n_layer, EM_OK};
    if (m->ln_f) em_module_visit(&m->base, gpt2_init, &init);
    if (!m->ln_f || init.st != EM_OK) {
        em_module_free(&m->base);
        return NULL;
    }
    return m;
}

/* ids [B, T] -> logits [B, T, vocab]. With caches (one per block), ids holds only the positions
 * after those cached: their keys and values are appended to the caches. */
static em_tensor *gpt_forward(gpt *m, const em_tensor *ids, em_kv_cache **caches)
{
    if (!ids) return NULL;
    int64_t start = caches ? caches[0]->len : 0, T = em_dim(ids, 1);
    em_scope_begin();
    em_tensor *pos = em_arange(m->base.dev, EM_I64, (double)start, (double)(start + T), 1);
    em_tensor *x = em_add(em_embedding_forward(m->wte, ids), em_embedding_forward(m->wpe, pos));
    for (int i = 0; i < m->cfg.n_layer; i++)
        x = em_block_forward(block(m, i), x, NULL, caches ? caches[i] : NULL, NULL);
    x = em_layer_norm_forward(m->ln_f, x);
    em_tensor *logits = em_matmul(x, em_transpose(m->wte->weight, 0, 1)); /* the tied head */
    em_scope_end(&logits, 1); /* releases the temporaries, keeps logits */
    return logits;
}

/* ---- the data: characters of a text file ----------------------------------------------------- */

/* The first max bytes of the file (cut before a split UTF-8 character), malloc'd; NULL with
 * errno set when it cannot be read. */
static char *read_text(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = f ? malloc(max + 1) : NULL;
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    if (f && ferror(f)) { /* a directory, say: errno says what */
        free(buf);
        buf = NULL;
    }
    if (f) fclose(f);
    if (n > max) /* byte max is the first one left out: back off to where its character starts */
        for (n = max; n > 0 && ((unsigned char)buf[n] & 0xc0) == 0x80; n--) {}
    *len = n;
    return buf;
}

/* B windows of T + 1 tokens at random offsets (splitmix64 on the host): inputs x [B, T] and
 * targets y, the same tokens shifted by one. */
static void random_batch(const em_tokens *data, int B, int T, uint64_t *rng, int32_t *x, int32_t *y)
{
    for (int b = 0; b < B; b++) {
        uint64_t z = (*rng += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        size_t at = (z ^ (z >> 31)) % (data->len - (size_t)T);
        for (int t = 0; t < T; t++) {
            x[b * T + t] = (int32_t)data->ids[at + t];
            y[b * T + t] = (int32_t)data->ids[at + t + 1];
        }
    }
}

/* ---- the options ----------------------------------------------------------------------------- */

typedef struct options {
    const char *device, *data, *prompt, *save;
    long chars, steps, batch, seq, layers, dim, heads, tokens, top_k;
    double lr, temperature, max_loss;
    uint64_t seed;
    bool check_cache;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: gpt [--device NAME] [--data PATH] [--chars N] [--steps N] [--batch B]\n"
               "           [--seq T] [--layers L] [--dim D] [--heads H] [--lr LR] [--seed S]\n"
               "           [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
               "           [--max-loss X] [--check-cache] [--save DIR]\n"
               "  Trains a character-level GPT on the first N characters of PATH, then samples\n"
               "  from it. Defaults: --device auto (the best present) --data %s\n"
               "  --chars 200000 --steps 300 --batch 8 --seq 64 --layers 2 --dim 64 --heads 4\n"
               "  --lr 3e-3 --seed 1337 --prompt 'And God said' --tokens 300 --temperature 0.8\n"
               "  --max-loss X: exit 1 unless the mean loss of the last 10 steps is below X\n"
               "  --check-cache: also run the full forward at each sampled token; exit 1 on a\n"
               "  difference. --save DIR: write DIR/model.safetensors and DIR/tokenizer.json,\n"
               "  which `ember sample --checkpoint DIR` reads\n",
            KJV_PATH);
}

/* Returns 0 and fills *o, or prints why not and returns 2 (1 for --help, which is no error). */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){"auto", KJV_PATH, "And God said", NULL, 200000, 300, 8, 64, 2, 64, 4, 300, 0,
                   3e-3, 0.8, INFINITY, 1337, false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *num = !strcmp(a, "--chars") ? &o->chars : !strcmp(a, "--steps") ? &o->steps
                  : !strcmp(a, "--batch") ? &o->batch : !strcmp(a, "--seq") ? &o->seq
                  : !strcmp(a, "--layers") ? &o->layers : !strcmp(a, "--dim") ? &o->dim
                  : !strcmp(a, "--heads") ? &o->heads : !strcmp(a, "--tokens") ? &o->tokens
                  : !strcmp(a, "--top-k") ? &o->top_k : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 1; }
        else if (!strcmp(a, "--check-cache")) o->check_cache = true;
        else if (num && v) { *num = atol(v); i++; }
        else if (!strcmp(a, "--device") && v) { o->device = v; i++; }
        else if (!strcmp(a, "--data") && v) { o->data = v; i++; }
        else if (!strcmp(a, "--prompt") && v) { o->prompt = v; i++; }
        else if (!strcmp(a, "--save") && v) { o->save = v; i++; }
        else if (!strcmp(a, "--lr") && v) { o->lr = atof(v); i++; }
        else if (!strcmp(a, "--temperature") && v) { o->temperature = atof(v); i++; }
        else if (!strcmp(a, "--max-loss") && v) { o->max_loss = atof(v); i++; }
        else if (!strcmp(a, "--seed") && v) { o->seed = strtoull(v, NULL, 10); i++; }
        else { fprintf(stderr, "gpt: bad argument '%s'\n", a); usage(stderr); return 2; }
    }
    if (o->steps < 1 || o->batch < 1 || o->seq < 2 || o->chars < 2 * o->seq || o->tokens < 1 ||
        !*o->prompt || !(o->lr > 0)) {
        fprintf(stderr, "gpt: --steps, --batch and --tokens must be >= 1, --seq >= 2, --chars >="
                        " 2 x --seq, --lr > 0, and the prompt not empty\n");
        return 2;
    }
    return 0;
}

/* ---- training -------------------------------------------------------------------------------- */

/* The PyTorch loop: forward, loss, zero gradients, backward, step; the learning rate warms up
 * then decays along a cosine, and gradients are clipped at norm 1 (as `ember train` does).
 * Returns 0 and the mean loss of the last (up to) 10 steps in *final_loss, or 1. */
static int train(gpt *model, em_optimizer *opt, const em_tokens *data, const options *o,
                 double *final_loss)
{
    em_lr_schedule sched = {.kind = EM_LR_COSINE, .base = o->lr, .min_lr = o->lr / 10,
                            .warmup = o->steps / 10, .total_steps = o->steps};
    int32_t *hx = malloc(sizeof(int32_t) * o->batch * o->seq);
    int32_t *hy = malloc(sizeof(int32_t) * o->batch * o->seq);
    uint64_t batch_rng = o->seed;
    double recent[10] = {0};
    int rc = hx && hy ? 0 : 1;
    for (long step = 1; !rc && step <= o->steps; step++) {
        em_scope_begin(); /* releases the step's temporaries at the end */
        random_batch(data, (int)o->batch, (int)o->seq, &batch_rng, hx, hy);
        em_tensor *x = em_from_host(model->base.dev, EM_I32, EM_SHAPE(o->batch, o->seq), hx);
        em_tensor *y = em_from_host(model->base.dev, EM_I32, EM_SHAPE(o->batch, o->seq), hy);
        em_tensor *logits = gpt_forward(model, x, NULL);                             /* forward */
        em_tensor *loss = em_cross_entropy(em_reshape(logits, EM_SHAPE(-1, model->cfg.vocab_size)),
                                           em_reshape(y, EM_SHAPE(-1)), -100, 0.0,
                                           EM_REDUCE_MEAN);                          /* loss */
        em_optimizer_zero_grad(opt);                                                 /* zero */
        em_optimizer_set_lr(opt, em_lr_at(&sched, step));
        if (!loss || em_backward(loss, NULL) != EM_OK ||                             /* backward */
            em_clip_grad_norm(opt, 1.0, NULL) != EM_OK ||                            /* clip */
            em_optimizer_step(opt) != EM_OK) {                                       /* step */
            fprintf(stderr, "gpt: step %ld: %s\n", step, em_last_error());
            rc = 1;
        } else {
            recent[step % 10] = em_item(loss);
            if (step == 1 || step % 50 == 0 || step == o->steps)
                printf("step %4ld  loss %.4f  lr %.2e\n", step, recent[step % 10],
                       em_optimizer_lr(opt));
        }
        em_scope_end(NULL, 0);
    }
    free(hx);
    free(hy);
    int last = o->steps < 10 ? (int)o->steps : 10;
    *final_loss = 0;
    for (int i = 0; i < last; i++) *final_loss += recent[(o->steps - i) % 10] / last;
    if (!rc) printf("final loss %.4f (mean of the last %d steps)\n", *final_loss, last);
    return rc;
}

/* ---- sampling with the KV cache -------------------------------------------------------------- */

/* The logits of the last of ids[0, n) on the host (vocab floats): through the caches, which then
 * hold these positions too, or (caches NULL) from a full forward over ids alone. */
static em_status last_logits(gpt *m, em_kv_cache **caches, const int64_t *ids, int64_t n,
                             float *out)
{
    em_scope_begin();
    em_tensor *x = em_from_host(m->base.dev, EM_I64, EM_SHAPE(1, n), ids);
    em_tensor *last = em_select(em_select(gpt_forward(m, x, caches), 0, 0), 0, n - 1);
    em_status st = last ? em_to_host(last, out, (size_t)m->cfg.vocab_size * sizeof(float))
                        : em_last_status();
    em_scope_end(NULL, 0);
    return st;
}

typedef struct check_result {
    double max_diff; /* largest |cached - full| logit */
    int64_t tokens;  /* tokens checked */
    int64_t differ;  /* of which the full forward's logits would have sampled another token */
} check_result;

/* Prints n_new tokens sampled after the prompt hist[0, np) as they come (hist has room for them).
 * When the context is full, the caches restart from the last half of the text: positions are
 * learned, so the window cannot slide by one. With check, each step's logits are compared with a
 * full forward over the same window. */
static em_status generate(gpt *m, const em_tokenizer *tok, int64_t *hist, int64_t np, int64_t n_new,
                          const em_sample_config *sc, check_result *check)
{
    const em_gpt_config *c = &m->cfg;
    int64_t V = c->vocab_size, ctx = c->block_size, n = np, start = np > ctx ? np - ctx : 0;
    em_kv_cache **caches = calloc((size_t)c->n_layer, sizeof *caches);
    float *logits = malloc((size_t)V * sizeof(float)), *full = malloc((size_t)V * sizeof(float));
    em_status st = caches && logits && full ? EM_OK : EM_ERR_NOMEM;
    for (int i = 0; st == EM_OK && i < c->n_layer; i++) {
        caches[i] = em_kv_cache_new(m->base.dev, EM_F32, 1, c->n_head, ctx, c->n_embd / c->n_head);
        if (!caches[i]) st = em_last_status();
    }
    uint64_t rng = sc->seed;
    if (st == EM_OK) st = last_logits(m, caches, hist + start, n - start, logits); /* the prompt */
    for (int64_t k = 0; st == EM_OK && k < n_new; k++) {
        if (check && (st = last_logits(m, NULL, hist + start, n - start, full)) == EM_OK) {
            for (int64_t v = 0; v < V; v++)
                check->max_diff = fmax(check->max_diff, fabs((double)logits[v] - full[v]));
            uint64_t r1 = rng, r2 = rng; /* both draws with the same random numbers */
            check->tokens++;
            check->differ += em_sample_token(full, V, hist, n, sc, &r1) !=
                             em_sample_token(logits, V, hist, n, sc, &r2);
        }
        int64_t next = st == EM_OK ? em_sample_token(logits, V, hist, n, sc, &rng) : -1;
        if (next < 0) break;
        size_t len = 0;
        const uint8_t *bytes = em_tok_token_bytes(tok, (uint32_t)next, &len);
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
        hist[n++] = next;
        if (k + 1 == n_new) break;
        if (caches[0]->len < ctx) { /* the usual step: one new position */
            st = last_logits(m, caches, hist + n - 1, 1, logits);
        } else { /* full: start again from the last half */
            for (int i = 0; i < c->n_layer; i++) em_kv_cache_reset(caches[i]);
            start = n - ctx / 2;
            st = last_logits(m, caches, hist + start, n - start, logits);
        }
    }
    printf("\n");
    for (int i = 0; caches && i < c->n_layer; i++) em_kv_cache_free(caches[i]);
    free(caches);
    free(logits);
    free(full);
    return st;
}

/* ---- saving, in the form `ember sample --checkpoint DIR` reads ------------------------------ */

static bool add_tensor(const char *name, em_module_entry *e, void *w)
{
    return em_safetensors_add(w, name, e->t) == EM_OK;
}

/* dir/model.safetensors (the parameters by name, the config in the "ember.config" metadata, as
 * ember's checkpoints) and dir/tokenizer.json. */
static em_status save(gpt *m, const em_tokenizer *tok, const char *dir)
{
    char path[4096], *json = em_gpt_config_to_json(&m->cfg);
    em_safetensors_writer *w = em_safetensors_writer_new();
    mkdir(dir, 0777); /* may exist already */
    em_clear_error();
    em_status st = w && json ? em_safetensors_add_metadata(w, "ember.config", json) : EM_ERR_NOMEM;
    if (st == EM_OK) em_module_visit(&m->base, add_tensor, w);
    if (st == EM_OK) st = em_last_status(); /* a failed add stopped the visit */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == EM_OK) st = em_safetensors_write(w, path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (st == EM_OK) st = em_tok_save(tok, path);
    em_safetensors_writer_free(w);
    free(json);
    return st;
}

/* ---- main ------------------------------------------------------------------------------------ */

/* Builds the model, trains it, saves it when asked, samples from it. Returns the exit status. */
static int run(const options *o, const em_tokenizer *tok, const em_tokens *data,
               const em_tokens *prompt)
{
    em_device *dev = strcmp(o->device, "auto") ? em_device_open(o->device) : em_train_best_device();
    em_gpt_config cfg = {.vocab_size = em_tok_vocab_size(tok), .block_size = o->seq,
                         .n_layer = o->layers, .n_head = o->heads, .n_embd = o->dim,
                         .dropout = 0.0, .bias = true, .tied = true};
    em_rng rng = em_rng_new(o->seed);
    gpt *model = dev && em_gpt_config_check(&cfg) ? gpt_new(dev, &cfg, &rng) : NULL;
    /* AdamW as `ember train` sets it up; the decay group is the entries' `decay` flags. */
    em_adam_config adamw = {.lr = o->lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                            .weight_decay = 0.1, .decoupled = true};
    em_optimizer *opt = model ? em_adam_new(&model->base, &adamw) : NULL;
    int64_t *hist = malloc(sizeof(int64_t) * (prompt->len + (size_t)o->tokens));
    double final_loss = 0;
    int rc = 1;
    if (!opt || !hist) {
        fprintf(stderr, "gpt: %s\n", em_last_error());
    } else {
        printf("gpt: %zu characters of %s (%u distinct); %ld layers, width %ld, %ld heads, "
               "context %ld: %lld parameters on %s\n", data->len, o->data, em_tok_vocab_size(tok),
               o->layers, o->dim, o->heads, o->seq, (long long)em_module_num_params(&model->base),
               em_device_name(dev));
        rc = train(model, opt, data, o, &final_loss);
    }
    if (!rc && o->save) {
        rc = save(model, tok, o->save) != EM_OK;
        if (rc) fprintf(stderr, "gpt: saving to %s: %s\n", o->save, em_last_error());
        else printf("saved %s/model.safetensors and %s/tokenizer.json\n", o->save, o->save);
    }
    check_result check = {0};
    if (!rc) { /* sampling: eval mode, nothing recorded for autodiff */
        for (size_t i = 0; i < prompt->len; i++) hist[i] = prompt->ids[i];
        em_sample_config sc = {.temperature = o->temperature, .top_k = o->top_k, .top_p = 1.0,
                               .repetition_penalty = 1.0, .seed = o->seed};
        em_module_train(&model->base, false);
        em_no_grad_begin();
        printf("---\n%s", o->prompt);
        rc = generate(model, tok, hist, (int64_t)prompt->len, o->tokens, &sc,
                      o->check_cache ? &check : NULL) != EM_OK;
        printf("---\n");
        em_no_grad_end();
        if (rc) fprintf(stderr, "gpt: sampling: %s\n", em_last_error());
    }
    if (!rc && o->check_cache) {
        printf("cache check: %lld tokens, max |cached - full| logit %.2e, %lld sampled otherwise\n",
               (long long)check.tokens, check.max_diff, (long long)check.differ);
        rc = !(check.max_diff < 1e-4) || check.differ > 0;
    }
    if (!rc && !(final_loss < o->max_loss)) {
        printf("gpt: final loss %.4f is not below %.4f\n", final_loss, o->max_loss);
        rc = 1;
    }
    free(hist);
    em_optimizer_free(opt);
    em_module_free((em_module *)model);
    em_device_close(dev);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;

    /* The data: a character tokenizer over the text, and the text as token ids. */
    size_t len = 0;
    char *text = read_text(o.data, (size_t)o.chars, &len);
    if (!text) {
        fprintf(stderr, "gpt: cannot read %s: %s\n", o.data, strerror(errno));
        if (errno != ENOENT) return 1;
        fprintf(stderr, "gpt: run scripts/corpus to make the default corpus, or give --data FILE"
                        " (exit 77: nothing to train on)\n");
        return 77;
    }
    em_tokenizer *tok = em_tok_char_from_text(text, len, NULL, 0);
    em_tokens data = {0}, prompt = {0};
    rc = 1;
    if (!tok || em_tok_encode(tok, text, len, false, &data) != EM_OK)
        fprintf(stderr, "gpt: %s: %s\n", o.data, em_last_error());
    else if (data.len <= (size_t)o.seq)
        fprintf(stderr, "gpt: %s holds %zu characters, fewer than --seq + 1\n", o.data, data.len);
    else if (em_tok_encode(tok, o.prompt, strlen(o.prompt), false, &prompt) != EM_OK)
        fprintf(stderr, "gpt: the prompt: %s\n", em_last_error());
    else
        rc = run(&o, tok, &data, &prompt);
    free(text);
    em_tokens_free(&data);
    em_tokens_free(&prompt);
    em_tok_free(tok);
    return rc;
}
