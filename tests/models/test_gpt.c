/* test_gpt.c — the GPT model: presets and config JSON; the forward pass against a plain float64
 * loop implementation of GPT-2 written here (embeddings, LayerNorm, causal multi-head attention,
 * GELU-tanh MLP, tied head); the KV cache (incremental logits equal full recomputation; greedy
 * generation with the cache gives exactly the tokens of full recomputation); the loss's head under
 * EMBER_FUSED_HEAD (chunks, off, a malformed value); sampling on
 * hand-made logits (greedy, temperature, top-k, top-p, repetition penalty, seeds); saving and
 * loading, Hugging Face naming ("transformer." prefix, attn.bias buffers, config.json or shapes),
 * export, corrupt files; and, when the fixture made by tests/fixtures/gen/gpt2_tiny.py is
 * present, logits against Hugging Face transformers. On the CPU, or on $EMBER_TEST_DEVICE: the
 * ops themselves are covered per device by the tensor and nn suites. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/file.h"
#include "data/data_util.h"
#include "ember/gpt.h"

static em_device *dev;

static int setup(void **state)
{
    (void)state;
    /* The CPU, or $EMBER_TEST_DEVICE (e.g. cuda:0 on the GPU machine). */
    const char *name = getenv("EMBER_TEST_DEVICE");
    dev = em_device_open(name && *name ? name : "cpu");
    if (!dev) fprintf(stderr, "[gpt] cannot open %s: %s\n", name, em_last_error());
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    return 0;
}

static void expect_error(const char *what)
{
    if (!strstr(em_last_error(), what))
        fail_msg("error '%s' does not mention '%s'", em_last_error(), what);
}

/* ---- config ---------------------------------------------------------------------------------- */

static void test_presets_and_json(void **state)
{
    (void)state;
    em_gpt_config c;
    assert_true(em_gpt_preset("gpt2", &c));
    assert_int_equal(c.vocab_size, 50257);
    assert_int_equal(c.block_size, 1024);
    assert_int_equal(c.n_layer, 12);
    assert_int_equal(c.n_head, 12);
    assert_int_equal(c.n_embd, 768);
    assert_true(c.bias && c.tied);
    assert_true(em_gpt_preset("gpt2-medium", &c));
    assert_int_equal(c.n_layer, 24);
    assert_int_equal(c.n_embd, 1024);
    assert_true(em_gpt_preset("gpt2-large", &c));
    assert_int_equal(c.n_layer, 36);
    assert_int_equal(c.n_head, 20);
    assert_int_equal(c.n_embd, 1280);
    assert_true(em_gpt_preset("tiny", &c));
    assert_false(em_gpt_preset("gpt5", &c));
    expect_error("gpt5");

    em_gpt_config a = {123, 77, 3, 5, 40, 0.25, false, false}, b;
    char *json = em_gpt_config_to_json(&a);
    assert_non_null(json);
    assert_true(em_gpt_config_from_json(json, &b));
    free(json);
    assert_int_equal(b.vocab_size, 123);
    assert_int_equal(b.block_size, 77);
    assert_int_equal(b.n_layer, 3);
    assert_int_equal(b.n_head, 5);
    assert_int_equal(b.n_embd, 40);
    assert_true(b.dropout == 0.25);
    assert_false(b.bias);
    assert_false(b.tied);
    /* Hugging Face's config.json keys. */
    assert_true(em_gpt_config_from_json("{\"vocab_size\": 64, \"n_positions\": 32, \"n_ctx\": 32, "
                                        "\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 16, "
                                        "\"resid_pdrop\": 0.1, \"tie_word_embeddings\": true}",
                                        &b));
    assert_int_equal(b.block_size, 32);
    assert_true(b.dropout == 0.1);
    assert_true(b.tied && b.bias);
    assert_false(em_gpt_config_from_json("{\"vocab_size\": 64, \"block_size\": 32, \"n_layer\": 2,"
                                         " \"n_head\": 3, \"n_embd\": 16}",
                                         &b));
    expect_error("n_head 3");
    assert_false(em_gpt_config_from_json("{\"vocab_size\": 64}", &b));
    expect_error("block_size");
    assert_false(em_gpt_config_from_json("not json", &b));
}

/* ---- the float64 reference ------------------------------------------------------------------- */

/* A parameter read to host doubles (malloc'd). */
static double *param(em_gpt *g, const char *name, int64_t *n)
{
    em_module_entry *e = em_module_find(em_gpt_module(g), name);
    if (!e) fail_msg("no parameter %s", name);
    em_tensor *t64 = em_cast(e->t, EM_F64);
    assert_non_null(t64);
    int64_t k = em_numel(t64);
    double *v = malloc((size_t)k * sizeof *v);
    assert_int_equal(em_to_host(t64, v, (size_t)k * sizeof *v), EM_OK);
    em_release(t64);
    if (n) *n = k;
    return v;
}

static void ref_layer_norm(const double *x, double *y, const double *w, const double *b, int64_t C)
{
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; c++) mean += x[c];
    mean /= C;
    for (int64_t c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
    var /= C;
    for (int64_t c = 0; c < C; c++) y[c] = (x[c] - mean) / sqrt(var + 1e-5) * w[c] + (b ? b[c] : 0);
}

/* y[T, out] = x[T, in] W[in, out] + b */
static void ref_linear(const double *x, double *y, const double *w, const double *b, int64_t T,
                       int64_t in, int64_t out)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int64_t i = 0; i < in; i++) s += x[t * in + i] * w[i * out + o];
            y[t * out + o] = s;
        }
}

static double gelu_tanh(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Logits [T, V] of one sequence, computed with loops in float64 from the model's parameters. */
static double *ref_forward(em_gpt *g, const int64_t *ids, int64_t T)
{
    const em_gpt_config *c = em_gpt_config_of(g);
    int64_t C = c->n_embd, V = c->vocab_size, H = c->n_head, D = C / H;
    double *wte = param(g, "wte.weight", NULL), *wpe = param(g, "wpe.weight", NULL);
    double *x = calloc((size_t)(T * C), sizeof *x), *h = calloc((size_t)(T * C), sizeof *h);
    double *qkv = calloc((size_t)(T * 3 * C), sizeof *qkv), *y = calloc((size_t)(T * C), sizeof *y);
    double *f = calloc((size_t)(T * 4 * C), sizeof *f), *o = calloc((size_t)(T * C), sizeof *o);
    double *att = calloc((size_t)T, sizeof *att);
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < C; k++) x[t * C + k] = wte[ids[t] * C + k] + wpe[t * C + k];
    for (int64_t l = 0; l < c->n_layer; l++) {
        char nm[128];
#define P(s) (snprintf(nm, sizeof nm, "h.%lld." s, (long long)l), param(g, nm, NULL))
        double *ln1w = P("ln_1.weight"), *ln1b = P("ln_1.bias"), *aw = P("attn.c_attn.weight"),
               *ab = P("attn.c_attn.bias"), *pw = P("attn.c_proj.weight"),
               *pb = P("attn.c_proj.bias"), *ln2w = P("ln_2.weight"), *ln2b = P("ln_2.bias"),
               *fw = P("mlp.c_fc.weight"), *fb = P("mlp.c_fc.bias"), *mw = P("mlp.c_proj.weight"),
               *mb = P("mlp.c_proj.bias");
#undef P
        for (int64_t t = 0; t < T; t++) ref_layer_norm(x + t * C, h + t * C, ln1w, ln1b, C);
        ref_linear(h, qkv, aw, ab, T, C, 3 * C);
        for (int64_t hd = 0; hd < H; hd++)
            for (int64_t t = 0; t < T; t++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t s = 0; s <= t; s++) {
                    double d = 0;
                    for (int64_t k = 0; k < D; k++)
                        d += qkv[t * 3 * C + hd * D + k] * qkv[s * 3 * C + C + hd * D + k];
                    att[s] = d / sqrt((double)D);
                    mx = fmax(mx, att[s]);
                }
                for (int64_t s = 0; s <= t; s++) sum += att[s] = exp(att[s] - mx);
                for (int64_t k = 0; k < D; k++) {
                    double acc = 0;
                    for (int64_t s = 0; s <= t; s++)
                        acc += att[s] / sum * qkv[s * 3 * C + 2 * C + hd * D + k];
                    y[t * C + hd * D + k] = acc;
                }
            }
        ref_linear(y, o, pw, pb, T, C, C);
        for (int64_t i = 0; i < T * C; i++) x[i] += o[i];
        for (int64_t t = 0; t < T; t++) ref_layer_norm(x + t * C, h + t * C, ln2w, ln2b, C);
        ref_linear(h, f, fw, fb, T, C, 4 * C);
        for (int64_t i = 0; i < T * 4 * C; i++) f[i] = gelu_tanh(f[i]);
        ref_linear(f, o, mw, mb, T, 4 * C, C);
        for (int64_t i = 0; i < T * C; i++) x[i] += o[i];
        free(ln1w), free(ln1b), free(aw), free(ab), free(pw), free(pb);
        free(ln2w), free(ln2b), free(fw), free(fb), free(mw), free(mb);
    }
    double *lnw = param(g, "ln_f.weight", NULL), *lnb = param(g, "ln_f.bias", NULL);
    for (int64_t t = 0; t < T; t++) ref_layer_norm(x + t * C, h + t * C, lnw, lnb, C);
    double *logits = calloc((size_t)(T * V), sizeof *logits);
    for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < V; v++) {
            double s = 0;
            for (int64_t k = 0; k < C; k++) s += h[t * C + k] * wte[v * C + k];
            logits[t * V + v] = s;
        }
    free(wte), free(wpe), free(x), free(h), free(qkv), free(y), free(f), free(o), free(att);
    free(lnw), free(lnb);
    return logits;
}

static const em_gpt_config SMALL = {13, 16, 2, 2, 8, 0.0, true, true};

/* Logits of ids [B, T] as host floats (malloc'd). */
static float *logits_of(em_gpt *g, const int64_t *ids, int64_t B, int64_t T, em_gpt_cache *cache)
{
    em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(B, T), ids);
    em_tensor *l = em_gpt_forward(g, x, cache);
    if (!l) fail_msg("forward: %s", em_last_error());
    int64_t n = em_numel(l);
    float *out = malloc((size_t)n * sizeof *out);
    assert_int_equal(em_to_host(l, out, (size_t)n * sizeof *out), EM_OK);
    em_release(l);
    em_release(x);
    return out;
}

static void test_forward_matches_reference(void **state)
{
    (void)state;
    em_gpt *g = em_gpt_new(dev, EM_F32, &SMALL, 7);
    if (!g) fail_msg("em_gpt_new: %s", em_last_error());
    /* Parameter count: wte 13*8 + wpe 16*8 + 2 * (2*8 + 8*24+24 + 8*8+8 + 2*8 + 8*32+32 + 32*8+8)
     * + ln_f 16. */
    int64_t per_layer = 16 + (8 * 24 + 24) + (64 + 8) + 16 + (8 * 32 + 32) + (32 * 8 + 8);
    assert_int_equal(em_module_num_params(em_gpt_module(g)), 13 * 8 + 16 * 8 + 2 * per_layer + 16);
    int64_t ids[2][10] = {{1, 5, 12, 0, 3, 3, 7, 9, 2, 11}, {4, 4, 4, 8, 1, 0, 6, 10, 12, 2}};
    float *got = logits_of(g, &ids[0][0], 2, 10, NULL);
    for (int b = 0; b < 2; b++) {
        double *want = ref_forward(g, ids[b], 10);
        for (int i = 0; i < 10 * 13; i++)
            if (fabs(got[b * 130 + i] - want[i]) > 1e-4 * (1 + fabs(want[i])))
                fail_msg("row %d logit %d: got %g, want %g", b, i, got[b * 130 + i], want[i]);
        free(want);
    }
    free(got);
    /* The loss is the mean cross-entropy of those logits (computed here from the reference). */
    int64_t tg[2][10];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 10; t++) tg[b][t] = (ids[b][t] * 3 + 1) % 13;
    double want = 0;
    for (int b = 0; b < 2; b++) {
        double *lg = ref_forward(g, ids[b], 10);
        for (int t = 0; t < 10; t++) {
            double mx = -INFINITY, s = 0;
            for (int v = 0; v < 13; v++) mx = fmax(mx, lg[t * 13 + v]);
            for (int v = 0; v < 13; v++) s += exp(lg[t * 13 + v] - mx);
            want += mx + log(s) - lg[t * 13 + tg[b][t]];
        }
        free(lg);
    }
    want /= 20;
    em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(2, 10), ids);
    em_tensor *y = em_from_host(dev, EM_I64, EM_SHAPE(2, 10), tg);
    em_tensor *loss = em_gpt_loss(g, x, y);
    assert_non_null(loss);
    assert_true(fabs(em_item(loss) - want) < 1e-5);
    em_release(loss);
    /* Errors: targets of another shape; float ids; too long a sequence. */
    em_tensor *y2 = em_from_host(dev, EM_I64, EM_SHAPE(2, 5), tg);
    assert_null(em_gpt_loss(g, x, y2));
    expect_error("i64[2, 10]");
    expect_error("i64[2, 5]");
    em_tensor *xf = em_zeros(dev, EM_F32, EM_SHAPE(1, 4));
    assert_null(em_gpt_forward(g, xf, NULL));
    expect_error("i32/i64");
    em_tensor *xl = em_zeros(dev, EM_I64, EM_SHAPE(1, 17));
    assert_null(em_gpt_forward(g, xl, NULL));
    expect_error("context of 16");
    em_release(xl), em_release(xf), em_release(y2), em_release(x), em_release(y);
    em_gpt_free(g);
    /* Bad configs. */
    em_gpt_config bad = SMALL;
    bad.n_head = 3;
    assert_null(em_gpt_new(dev, EM_F32, &bad, 1));
    expect_error("n_head 3");
}

/* The loss under EMBER_FUSED_HEAD (em_gpt_loss's head): with N > 1 the fused head runs in chunks
 * of N rows (one classifier launch per chunk: 20 rows in 4 chunks of 6), with 0 the logits'
 * path; both give the loss of the default. A malformed value gets a warning naming it, and the
 * default's chunks run. */
static double head_loss(em_gpt *g, const em_tensor *x, const em_tensor *y, const char *env,
                        uint64_t *xent_launches)
{
    if (env)
        setenv("EMBER_FUSED_HEAD", env, 1);
    else
        unsetenv("EMBER_FUSED_HEAD");
    em_profile_reset();
    em_profile_enable(true);
    em_tensor *loss = em_gpt_loss(g, x, y);
    if (!loss) fail_msg("EMBER_FUSED_HEAD=%s: %s", env ? env : "(unset)", em_last_error());
    double v = em_item(loss);
    em_profile_enable(false);
    /* the classifier's launches: one a chunk, tensor_xent_backward where the fused head computes
     * the losses with the gradient (the parameters record it), else tensor_xent */
    em_profile_kernel pk = {0}, pb = {0};
    *xent_launches = (em_profile_kernel_get("tensor_xent", &pk) ? pk.launches : 0) +
                     (em_profile_kernel_get("tensor_xent_backward", &pb) ? pb.launches : 0);
    em_release(loss);
    unsetenv("EMBER_FUSED_HEAD");
    return v;
}

static void test_fused_head_chunks(void **state)
{
    (void)state;
    em_gpt *g = em_gpt_new(dev, EM_F32, &SMALL, 7);
    if (!g) fail_msg("em_gpt_new: %s", em_last_error());
    int64_t ids[2][10], tg[2][10];
    for (int i = 0; i < 20; i++)
        ids[i / 10][i % 10] = (i * 5 + 2) % 13, tg[i / 10][i % 10] = (i * 7 + 1) % 13;
    em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(2, 10), ids);
    em_tensor *y = em_from_host(dev, EM_I64, EM_SHAPE(2, 10), tg);
    uint64_t n_default, n6, n0, n_bad;
    double want = head_loss(g, x, y, NULL, &n_default);
    assert_int_equal(n_default, 1); /* 20 rows of 13 logits: one chunk */
    double l6 = head_loss(g, x, y, "6", &n6);
    assert_int_equal(n6, 4);
    assert_true(fabs(l6 - want) < 1e-5);
    double l0 = head_loss(g, x, y, "0", &n0);
    assert_int_equal(n0, 1);
    assert_true(fabs(l0 - want) < 1e-5);
    /* a malformed value: the warning on stderr, and the default's chunks */
    char path[] = "/tmp/ember_fused_head_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    double lbad = head_loss(g, x, y, "six", &n_bad);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    size_t len = 0;
    char *text = em_file_read(path, &len);
    unlink(path);
    if (!text || !strstr(text, "EMBER_FUSED_HEAD='six' is not"))
        fail_msg("no warning naming EMBER_FUSED_HEAD='six'; stderr: %s", text ? text : "(none)");
    free(text);
    assert_int_equal(n_bad, n_default);
    assert_true(fabs(lbad - want) < 1e-5);
    em_release(x), em_release(y);
    em_gpt_free(g);
}

static void test_untied_no_bias_forward(void **state)
{
    (void)state;
    em_gpt_config c = SMALL;
    c.tied = false;
    c.bias = false;
    em_gpt *g = em_gpt_new(dev, EM_F32, &c, 3);
    assert_non_null(g);
    assert_non_null(em_module_find(em_gpt_module(g), "lm_head.weight"));
    assert_null(em_module_find(em_gpt_module(g), "h.0.attn.c_attn.bias"));
    /* Weight decay: linear weights only. */
    assert_true(em_module_find(em_gpt_module(g), "h.1.mlp.c_fc.weight")->decay);
    assert_false(em_module_find(em_gpt_module(g), "wte.weight")->decay);
    assert_false(em_module_find(em_gpt_module(g), "ln_f.weight")->decay);
    int64_t ids[5] = {1, 2, 3, 4, 5};
    float *got = logits_of(g, ids, 1, 5, NULL);
    /* The reference with the LM head: ln_f(x) lm_head^T; check one row by hand through the tied
     * reference's pieces is awkward, so compare against a full recomputation with the cache. */
    em_gpt_cache *cache = em_gpt_cache_new(g, 1, 0);
    float *inc = NULL;
    for (int t = 0; t < 5; t++) {
        free(inc);
        inc = logits_of(g, ids + t, 1, 1, cache);
    }
    for (int v = 0; v < 13; v++) assert_true(fabs(inc[v] - got[4 * 13 + v]) < 1e-5);
    free(inc), free(got);
    em_gpt_cache_free(cache);
    em_gpt_free(g);
}

/* ---- the cache and generation ---------------------------------------------------------------- */

static void test_cache_equals_full(void **state)
{
    (void)state;
    em_gpt *g = em_gpt_new(dev, EM_F32, &SMALL, 11);
    assert_non_null(g);
    int64_t ids[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    float *full = logits_of(g, ids, 1, 12, NULL);
    em_gpt_cache *cache = em_gpt_cache_new(g, 1, 16);
    assert_non_null(cache);
    /* Prompt of 5, then one at a time. */
    float *part = logits_of(g, ids, 1, 5, cache);
    assert_int_equal(em_gpt_cache_len(cache), 5);
    for (int i = 0; i < 5 * 13; i++) assert_true(fabs(part[i] - full[i]) < 1e-5);
    free(part);
    for (int t = 5; t < 12; t++) {
        float *one = logits_of(g, ids + t, 1, 1, cache);
        for (int v = 0; v < 13; v++)
            if (fabs(one[v] - full[t * 13 + v]) > 1e-5)
                fail_msg("position %d logit %d: cached %g, full %g", t, v, one[v],
                         full[t * 13 + v]);
        free(one);
    }
    assert_int_equal(em_gpt_cache_len(cache), 12);
    /* Past the cache's length: an error, not a crash. */
    em_tensor *x = em_zeros(dev, EM_I64, EM_SHAPE(1, 5));
    assert_null(em_gpt_forward(g, x, cache));
    expect_error("exceed");
    em_release(x);
    em_gpt_cache_reset(cache);
    assert_int_equal(em_gpt_cache_len(cache), 0);
    em_gpt_cache_free(cache);
    free(full);
    em_gpt_free(g);
}

typedef struct collected {
    int64_t ids[64];
    int n;
} collected;

static bool collect(int64_t tok, void *user)
{
    collected *c = user;
    c->ids[c->n++] = tok;
    return true;
}

static void test_greedy_cache_equals_recompute(void **state)
{
    (void)state;
    em_gpt_config cfg = {13, 24, 2, 2, 8, 0.0, true, true};
    em_gpt *g = em_gpt_new(dev, EM_F32, &cfg, 5);
    assert_non_null(g);
    int64_t prompt[3] = {2, 7, 1};
    em_sample_config greedy = {0.0, 0, 1.0, 1.0, 0};
    collected got = {{0}, 0};
    int64_t n = 0;
    assert_int_equal(em_gpt_generate(g, prompt, 3, 20, &greedy, -1, collect, &got, &n), EM_OK);
    assert_int_equal(n, 20);
    assert_int_equal(got.n, 20);
    /* Full recomputation: the whole sequence each step, argmax of the last row. */
    int64_t seq[32];
    memcpy(seq, prompt, sizeof prompt);
    int len = 3;
    for (int s = 0; s < 20; s++) {
        float *l = logits_of(g, seq, 1, len, NULL);
        int best = 0;
        for (int v = 1; v < 13; v++)
            if (l[(len - 1) * 13 + v] > l[(len - 1) * 13 + best]) best = v;
        free(l);
        seq[len++] = best;
        if (got.ids[s] != best)
            fail_msg("token %d: cache gives %lld, recompute %d", s, (long long)got.ids[s], best);
    }
    /* A stop token ends generation after emitting it; a callback returning false too. */
    collected c2 = {{0}, 0};
    int first = 0;
    while (got.ids[first] != got.ids[2]) first++;
    assert_int_equal(em_gpt_generate(g, prompt, 3, 20, &greedy, got.ids[2], collect, &c2, &n),
                     EM_OK);
    assert_int_equal(n, first + 1);
    /* Sliding past the context (24) works and keeps going. */
    collected c3 = {{0}, 0};
    assert_int_equal(em_gpt_generate(g, prompt, 3, 40, &greedy, -1, collect, &c3, &n), EM_OK);
    assert_int_equal(n, 40);
    /* Errors. */
    assert_int_not_equal(em_gpt_generate(g, prompt, 0, 5, &greedy, -1, NULL, NULL, &n), EM_OK);
    expect_error("empty");
    int64_t badp[1] = {13};
    assert_int_not_equal(em_gpt_generate(g, badp, 1, 5, &greedy, -1, NULL, NULL, &n), EM_OK);
    expect_error("vocabulary");
    em_gpt_free(g);
}

/* ---- sampling -------------------------------------------------------------------------------- */

static void counts(const float *logits, int V, const int64_t *hist, int nh, em_sample_config cfg,
                   int draws, int *out)
{
    memset(out, 0, (size_t)V * sizeof *out);
    uint64_t rng = cfg.seed;
    for (int i = 0; i < draws; i++) {
        int64_t t = em_sample_token(logits, V, hist, nh, &cfg, &rng);
        assert_true(t >= 0 && t < V);
        out[t]++;
    }
}

static void test_sampling(void **state)
{
    (void)state;
    const float logits[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
    uint64_t rng = 1;
    em_sample_config greedy = {0, 0, 1, 1, 0};
    assert_int_equal(em_sample_token(logits, 6, NULL, 0, &greedy, &rng), 1); /* first of equals */
    int c[6];
    /* Temperature 1: frequencies follow the softmax (20000 draws, 4 sigma). */
    em_sample_config t1 = {1.0, 0, 1.0, 1.0, 42};
    counts(logits, 6, NULL, 0, t1, 20000, c);
    double z = 0, p[6];
    for (int i = 0; i < 6; i++) z += exp(logits[i]);
    for (int i = 0; i < 6; i++) {
        p[i] = exp(logits[i]) / z;
        double sd = sqrt(20000 * p[i] * (1 - p[i]));
        if (fabs(c[i] - 20000 * p[i]) > 4 * sd + 1)
            fail_msg("token %d: %d draws, expected %.0f", i, c[i], 20000 * p[i]);
    }
    /* Temperature 0.5 sharpens: softmax(logits / 0.5). */
    em_sample_config t5 = {0.5, 0, 1.0, 1.0, 43};
    counts(logits, 6, NULL, 0, t5, 20000, c);
    z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[i] / 0.5);
    for (int i = 0; i < 6; i++) {
        double q = exp(logits[i] / 0.5) / z, sd = sqrt(20000 * q * (1 - q));
        if (fabs(c[i] - 20000 * q) > 4 * sd + 1) fail_msg("T=0.5 token %d: %d draws", i, c[i]);
    }
    /* top-k 3: only tokens 1, 3, 2 (logits 3, 3, 2), in proportion e^3 : e^3 : e^2. */
    em_sample_config k3 = {1.0, 3, 1.0, 1.0, 44};
    counts(logits, 6, NULL, 0, k3, 20000, c);
    assert_int_equal(c[0] + c[4] + c[5], 0);
    double zk = 2 * exp(3.0) + exp(2.0), q2 = exp(2.0) / zk;
    assert_true(fabs(c[2] - 20000 * q2) < 4 * sqrt(20000 * q2 * (1 - q2)) + 1);
    /* top-k over a large vocabulary with many ties (the partial selection): logits (37 i) mod 50
     * put 20 tokens at each of 49, 48, 47, ...; k = 45 keeps the 40 tokens of 49 and 48 and the 5
     * lowest ids of those at 47, and every one of them is drawn. */
    {
        enum { BIGV = 1000, K = 45, DRAWS = 20000 };
        float *big = malloc(BIGV * sizeof *big);
        int *seen = calloc(BIGV, sizeof *seen);
        assert_non_null(big);
        assert_non_null(seen);
        for (int i = 0; i < BIGV; i++) big[i] = (float)((37 * i) % 50);
        bool keep[BIGV] = {false};
        int at47 = 0;
        for (int i = 0; i < BIGV; i++) {
            if (big[i] >= 48) keep[i] = true;
            if (big[i] == 47 && at47 < 5) keep[i] = true, at47++;
        }
        em_sample_config kb = {1.0, K, 1.0, 1.0, 0};
        uint64_t rk = 49;
        for (int d = 0; d < DRAWS; d++) {
            int64_t t = em_sample_token(big, BIGV, NULL, 0, &kb, &rk);
            assert_true(t >= 0 && t < BIGV);
            seen[t]++;
        }
        for (int i = 0; i < BIGV; i++) {
            if (!keep[i] && seen[i]) fail_msg("top-k 45: token %d (logit %g) drawn", i, big[i]);
            if (keep[i] && !seen[i]) fail_msg("top-k 45: token %d (logit %g) never drawn", i, big[i]);
        }
        free(big);
        free(seen);
    }
    /* top-p: probabilities of the sorted tokens are 0.384, 0.384, 0.141, 0.052, ...: p = 0.5
     * keeps two tokens, p = 0.8 three, p = 0.2 one (the first of the equals in id order). */
    em_sample_config p5 = {1.0, 0, 0.5, 1.0, 45};
    counts(logits, 6, NULL, 0, p5, 5000, c);
    assert_int_equal(c[0] + c[2] + c[4] + c[5], 0);
    assert_true(c[1] > 2000 && c[3] > 2000);
    em_sample_config p75 = {1.0, 0, 0.8, 1.0, 46};
    counts(logits, 6, NULL, 0, p75, 5000, c);
    assert_int_equal(c[0] + c[4] + c[5], 0);
    assert_true(c[2] > 0);
    em_sample_config p2 = {1.0, 0, 0.2, 1.0, 47};
    counts(logits, 6, NULL, 0, p2, 1000, c);
    assert_int_equal(c[1], 1000);
    /* Repetition penalty 2: seen token 1 (logit 3 -> 1.5) loses to 3; a negative logit doubles. */
    int64_t hist[3] = {1, 1, 4};
    em_sample_config rp = {0, 0, 1, 2.0, 0};
    assert_int_equal(em_sample_token(logits, 6, hist, 3, &rp, &rng), 3);
    int64_t hist2[2] = {1, 3};
    assert_int_equal(em_sample_token(logits, 6, hist2, 2, &rp, &rng), 2); /* 1.5, 1.5 < 2 */
    /* With penalty 1.2 and sampling: token 4's probability shrinks (logit -1 -> -1.2). */
    em_sample_config rps = {1.0, 0, 1, 1.2, 48};
    counts(logits, 6, hist, 3, rps, 20000, c);
    double l[6];
    for (int i = 0; i < 6; i++) l[i] = logits[i];
    l[1] = 3.0 / 1.2, l[4] = -1.2;
    z = 0;
    for (int i = 0; i < 6; i++) z += exp(l[i]);
    for (int i = 0; i < 6; i++) {
        double q = exp(l[i]) / z, sd = sqrt(20000 * q * (1 - q));
        if (fabs(c[i] - 20000 * q) > 4 * sd + 1) fail_msg("penalty token %d: %d draws", i, c[i]);
    }
    /* Seeds: the same seed gives the same tokens, another seed others. */
    int64_t a[50], b[50], d[50];
    uint64_t ra = 99, rb = 99, rd = 100;
    for (int i = 0; i < 50; i++) {
        a[i] = em_sample_token(logits, 6, NULL, 0, &t1, &ra);
        b[i] = em_sample_token(logits, 6, NULL, 0, &t1, &rb);
        d[i] = em_sample_token(logits, 6, NULL, 0, &t1, &rd);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, d, sizeof a);
}

static void test_generate_seeded(void **state)
{
    (void)state;
    em_gpt *g = em_gpt_new(dev, EM_F32, &SMALL, 9);
    int64_t prompt[1] = {0};
    em_sample_config s = {1.0, 5, 0.9, 1.1, 123};
    collected a = {{0}, 0}, b = {{0}, 0}, c = {{0}, 0};
    assert_int_equal(em_gpt_generate(g, prompt, 1, 30, &s, -1, collect, &a, NULL), EM_OK);
    assert_int_equal(em_gpt_generate(g, prompt, 1, 30, &s, -1, collect, &b, NULL), EM_OK);
    s.seed = 124;
    assert_int_equal(em_gpt_generate(g, prompt, 1, 30, &s, -1, collect, &c, NULL), EM_OK);
    assert_memory_equal(a.ids, b.ids, sizeof a.ids);
    assert_memory_not_equal(a.ids, c.ids, 30 * sizeof(int64_t));
    em_gpt_free(g);
}

/* ---- saving, loading, Hugging Face ----------------------------------------------------------- */

static void assert_same_logits(em_gpt *a, em_gpt *b, double tol)
{
    int64_t ids[6] = {1, 2, 3, 5, 8, 12};
    const em_gpt_config *c = em_gpt_config_of(a);
    for (int i = 0; i < 6; i++) ids[i] %= c->vocab_size;
    float *la = logits_of(a, ids, 1, 6, NULL), *lb = logits_of(b, ids, 1, 6, NULL);
    for (int64_t i = 0; i < 6 * c->vocab_size; i++)
        if (fabs(la[i] - lb[i]) > tol) fail_msg("logit %lld: %g vs %g", (long long)i, la[i], lb[i]);
    free(la), free(lb);
}

/* The fields of two configs are equal (not their bytes: the struct's padding is unspecified). */
static void assert_same_config(const em_gpt_config *a, const em_gpt_config *b)
{
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->block_size, b->block_size);
    assert_int_equal(a->n_layer, b->n_layer);
    assert_int_equal(a->n_head, b->n_head);
    assert_int_equal(a->n_embd, b->n_embd);
    assert_true(a->dropout == b->dropout);
    assert_int_equal(a->bias, b->bias);
    assert_int_equal(a->tied, b->tied);
}

static void test_save_load(void **state)
{
    (void)state;
    char dir[512], path[1024];
    scratch_dir("gpt-save", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    em_gpt *g = em_gpt_new(dev, EM_F32, &SMALL, 21);
    assert_int_equal(em_gpt_save(g, path), EM_OK);
    em_gpt *h = em_gpt_load(path, dev, EM_F32);
    if (!h) fail_msg("load: %s", em_last_error());
    assert_same_config(em_gpt_config_of(h), em_gpt_config_of(g));
    assert_same_logits(g, h, 0);
    em_gpt_free(h);
    /* Corrupt: truncated, and not a safetensors file at all. */
    size_t len;
    char *bytes = em_file_read(path, &len);
    assert_non_null(bytes);
    char bad[1100];
    snprintf(bad, sizeof bad, "%s/truncated.safetensors", dir);
    assert_int_equal(write_file(bad, bytes, len / 2), 0);
    assert_null(em_gpt_load(bad, dev, EM_F32));
    expect_error("truncated.safetensors");
    snprintf(bad, sizeof bad, "%s/garbage.safetensors", dir);
    assert_int_equal(write_file(bad, "hello, world, not a model", 25), 0);
    assert_null(em_gpt_load(bad, dev, EM_F32));
    expect_error("garbage.safetensors");
    free(bytes);
    snprintf(bad, sizeof bad, "%s/missing.safetensors", dir);
    assert_null(em_gpt_load(bad, dev, EM_F32));
    /* Export for transformers: model.safetensors + config.json. */
    char hf[600];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    assert_int_equal(em_gpt_export_hf(g, hf), EM_OK);
    snprintf(path, sizeof path, "%s/hf/config.json", dir);
    char *cj = em_file_read(path, NULL);
    assert_non_null(cj);
    cJSON *o = cJSON_Parse(cj);
    assert_non_null(o);
    assert_int_equal(cJSON_GetObjectItem(o, "n_embd")->valueint, 8);
    assert_int_equal(cJSON_GetObjectItem(o, "n_positions")->valueint, 16);
    assert_string_equal(cJSON_GetObjectItem(o, "activation_function")->valuestring, "gelu_new");
    cJSON_Delete(o);
    free(cj);
    em_gpt_free(g);
    remove_dir(dir);
}

typedef struct hf_ctx {
    em_safetensors_writer *w;
    const char *prefix;
} hf_ctx;

static bool add_hf(const char *name, em_module_entry *e, void *user)
{
    hf_ctx *c = user;
    char full[256];
    snprintf(full, sizeof full, "%s%s", c->prefix, name);
    assert_int_equal(em_safetensors_add(c->w, full, e->t), EM_OK);
    return true;
}

/* A Hugging Face style file of g's weights: names with `prefix`, the attention-mask buffers,
 * no ember metadata; lm_head.weight too when `with_head`. */
static void write_hf(em_gpt *g, const char *path, const char *prefix, bool with_head)
{
    em_safetensors_writer *w = em_safetensors_writer_new();
    hf_ctx c = {w, prefix};
    em_module_visit(em_gpt_module(g), add_hf, &c);
    const em_gpt_config *cfg = em_gpt_config_of(g);
    em_tensor *ones = em_ones(dev, EM_F32, EM_SHAPE(1, 1, cfg->block_size, cfg->block_size));
    em_tensor *mask = em_tril(ones, 0);
    em_release(ones);
    for (int64_t l = 0; l < cfg->n_layer; l++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%sh.%lld.attn.bias", prefix, (long long)l);
        assert_int_equal(em_safetensors_add(w, nm, mask), EM_OK);
    }
    if (with_head)
        assert_int_equal(em_safetensors_add(w, "lm_head.weight",
                                            em_module_find(em_gpt_module(g), "wte.weight")->t),
                         EM_OK);
    assert_int_equal(em_safetensors_add_metadata(w, "format", "pt"), EM_OK);
    assert_int_equal(em_safetensors_write(w, path), EM_OK);
    em_safetensors_writer_free(w);
    em_release(mask);
}

static void test_hf_names(void **state)
{
    (void)state;
    char dir[512], path[1024], cfgp[1024];
    scratch_dir("gpt-hf", dir, sizeof dir);
    /* With "transformer." and config.json beside it (n_head 2 cannot come from the shapes). */
    em_gpt *g = em_gpt_new(dev, EM_F32, &SMALL, 33);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_hf(g, path, "transformer.", true);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    const char *cj = "{\"model_type\": \"gpt2\", \"vocab_size\": 13, \"n_positions\": 16, "
                     "\"n_ctx\": 16, \"n_embd\": 8, \"n_layer\": 2, \"n_head\": 2}";
    assert_int_equal(write_file(cfgp, cj, strlen(cj)), 0);
    em_gpt *h = em_gpt_load(path, dev, EM_F32);
    if (!h) fail_msg("load HF: %s", em_last_error());
    assert_int_equal(em_gpt_config_of(h)->n_head, 2);
    assert_same_logits(g, h, 0);
    em_gpt_free(h);
    em_gpt_free(g);
    /* Without prefix or config: the shapes say 2 layers, width 64 -> one head of 64. */
    remove_dir(dir);
    scratch_dir("gpt-hf", dir, sizeof dir);
    em_gpt_config c64 = {10, 8, 2, 1, 64, 0.0, true, true};
    g = em_gpt_new(dev, EM_F32, &c64, 34);
    write_hf(g, path, "", false);
    h = em_gpt_load(path, dev, EM_F32);
    if (!h) fail_msg("load HF without config: %s", em_last_error());
    assert_int_equal(em_gpt_config_of(h)->n_layer, 2);
    assert_int_equal(em_gpt_config_of(h)->n_head, 1);
    assert_int_equal(em_gpt_config_of(h)->block_size, 8);
    assert_same_logits(g, h, 0);
    em_gpt_free(h);
    em_gpt_free(g);
    remove_dir(dir);
}

/* ---- the transformers fixture ---------------------------------------------------------------- */

/* Loads DIR/model.safetensors (with DIR/config.json) and compares its logits for the ids of
 * DIR/<expected> ({"ids": [B][T], "logits": [B][T][V]}, written by transformers) against them.
 * Skips when the fixture is absent (both are made on the GPU machine: scripts/gpu-interop.sh). */
static void check_transformers_logits(const char *dir, const char *expected, const char *what)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, expected);
    char *exp = em_file_read(path, NULL);
    if (!exp) {
        em_clear_error();
        skip();
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    em_gpt *g = em_gpt_load(path, dev, EM_F32);
    if (!g) fail_msg("load %s: %s", path, em_last_error());
    cJSON *o = cJSON_Parse(exp);
    assert_non_null(o);
    cJSON *ids = cJSON_GetObjectItem(o, "ids"), *logits = cJSON_GetObjectItem(o, "logits");
    assert_true(cJSON_IsArray(ids) && cJSON_IsArray(logits));
    int B = cJSON_GetArraySize(ids), T = cJSON_GetArraySize(cJSON_GetArrayItem(ids, 0));
    int64_t *h = malloc((size_t)(B * T) * sizeof *h);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            h[b * T + t] = cJSON_GetArrayItem(cJSON_GetArrayItem(ids, b), t)->valueint;
    float *got = logits_of(g, h, B, T, NULL);
    int64_t V = em_gpt_config_of(g)->vocab_size;
    double maxerr = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            cJSON *row = cJSON_GetArrayItem(cJSON_GetArrayItem(logits, b), t);
            assert_int_equal(cJSON_GetArraySize(row), V);
            for (int64_t v = 0; v < V; v++) {
                double want = cJSON_GetArrayItem(row, (int)v)->valuedouble;
                maxerr = fmax(maxerr, fabs(got[(b * T + t) * V + v] - want) / (1 + fabs(want)));
            }
        }
    fprintf(stderr, "[gpt] %s: max normalized logit error %.3g\n", what, maxerr);
    assert_true(maxerr < 1e-4);
    free(got), free(h), free(exp);
    cJSON_Delete(o);
    em_gpt_free(g);
}

/* A Hugging Face GPT-2 made by transformers (tests/fixtures/gen/gpt2_tiny.py): ember loads it and
 * computes transformers' logits. */
static void test_hf_fixture(void **state)
{
    (void)state;
    check_transformers_logits(EMBER_SOURCE_DIR "/tests/fixtures/gpt2_tiny", "expected.json",
                              "transformers fixture");
}

/* A GPT trained by ember and exported with em_gpt_export_hf: transformers loaded the export and
 * computed these logits, which ember's own forward must match. */
static void test_export_loaded_by_transformers(void **state)
{
    (void)state;
    check_transformers_logits(EMBER_SOURCE_DIR "/tests/fixtures/gpt2_ember_export",
                              "transformers_logits.json", "ember export read by transformers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_and_json),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_fused_head_chunks),
        cmocka_unit_test(test_untied_no_bias_forward),
        cmocka_unit_test(test_cache_equals_full),
        cmocka_unit_test(test_greedy_cache_equals_recompute),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_generate_seeded),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_hf_names),
        cmocka_unit_test(test_hf_fixture),
        cmocka_unit_test(test_export_loaded_by_transformers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
