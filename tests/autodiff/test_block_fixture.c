/* test_block_fixture.c — a pre-norm GPT-2 block (ln_1, causal self-attention with c_attn and
 * c_proj, ln_2, MLP with c_fc, gelu_tanh and c_proj; B=2, T=5, C=8, 2 heads) built from tensor ops
 * in float64 on the CPU, differentiated by the tape (em_backward of loss = sum(out * R)):
 *   - test_fixture: out, the loss and the gradient of every parameter and of x against PyTorch's
 *     (tests/fixtures/transformer_block.json, written by tests/fixtures/gen/transformer_block.py),
 *     normalized error 1e-9; SKIPPED, with the reason printed, when the JSON is absent;
 *   - test_finite_differences: always runs: the same block's gradients (own seeded parameters)
 *     against central finite differences of the loss on a sample of elements of every tensor. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "ember/autodiff.h"
#include "ember/tensor.h"

enum { B = 2, T = 5, C = 8, NH = 2, NT = 13 /* 12 parameters and x */ };
static const double EPS = 1e-5;

/* Hugging Face GPT-2 names of the block's parameters, then the input; the order of p[] below. */
static const char *const names[NT] = {
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
    "x",
};
enum {
    LN1_W,
    LN1_B,
    ATTN_W,
    ATTN_B,
    APROJ_W,
    APROJ_B,
    LN2_W,
    LN2_B,
    FC_W,
    FC_B,
    MPROJ_W,
    MPROJ_B,
    X
};

static em_shape shape_of(int i)
{
    static const em_shape s[NT] = {
        EM_SHAPE(C),        EM_SHAPE(C), EM_SHAPE(C, 3 * C), EM_SHAPE(3 * C),    EM_SHAPE(C, C),
        EM_SHAPE(C),        EM_SHAPE(C), EM_SHAPE(C),        EM_SHAPE(C, 4 * C), EM_SHAPE(4 * C),
        EM_SHAPE(4 * C, C), EM_SHAPE(C), EM_SHAPE(B, T, C),
    };
    return s[i];
}

static size_t numel(em_shape s)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    return n;
}

static em_device *g_cpu;

/* x @ w + b (w [in, out], as GPT-2's Conv1D). */
static em_tensor *linear(const em_tensor *x, const em_tensor *w, const em_tensor *b)
{
    return em_add(em_matmul(x, w), b);
}

/* [B, T, C] -> [B, NH, T, C / NH] */
static em_tensor *heads(const em_tensor *t)
{
    return em_transpose(em_reshape(t, EM_SHAPE(B, T, NH, C / NH)), 1, 2);
}

/* The block's output [B, T, C]; every temporary belongs to the caller's scope. */
static em_tensor *block(em_tensor *const *p)
{
    bool causal[T * T];
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) causal[i * T + j] = j > i;
    em_tensor *mask = em_from_host(g_cpu, EM_BOOL, EM_SHAPE(T, T), causal);
    em_tensor *a = em_layer_norm(p[X], 1, p[LN1_W], p[LN1_B], EPS);
    em_tensor *qkv = linear(a, p[ATTN_W], p[ATTN_B]);
    em_tensor *part[3] = {0};
    if (em_split(qkv, C, 2, part, 3) != 3) return NULL;
    em_tensor *q = heads(part[0]), *k = heads(part[1]), *v = heads(part[2]);
    em_tensor *att =
        em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt((double)(C / NH)));
    att = em_softmax(em_masked_fill(att, mask, -INFINITY), -1);
    em_tensor *y = em_reshape(em_transpose(em_matmul(att, v), 1, 2), EM_SHAPE(B, T, C));
    em_tensor *h = em_add(p[X], linear(y, p[APROJ_W], p[APROJ_B]));
    em_tensor *m = em_layer_norm(h, 1, p[LN2_W], p[LN2_B], EPS);
    m = em_gelu_tanh(linear(m, p[FC_W], p[FC_B]));
    return em_add(h, linear(m, p[MPROJ_W], p[MPROJ_B]));
}

/* loss = sum(block(vals) * r). With out_vals, copies out; with grads, backpropagates and copies
 * every leaf's gradient. */
static double run(double *const *vals, const double *r, double *out_vals, double **grads)
{
    em_scope_begin();
    em_tensor *p[NT];
    for (int i = 0; i < NT; i++) {
        p[i] = em_from_host(g_cpu, EM_F64, shape_of(i), vals[i]);
        assert_non_null(p[i]);
        if (grads) assert_int_equal(em_set_requires_grad(p[i], true), EM_OK);
    }
    em_tensor *out = block(p);
    if (!out) fprintf(stderr, "block: %s\n", em_last_error());
    assert_non_null(out);
    em_tensor *rt = em_from_host(g_cpu, EM_F64, EM_SHAPE(B, T, C), r);
    em_tensor *loss = em_sum(em_mul(out, rt), NULL, 0, false);
    assert_non_null(loss);
    double lv = em_item(loss);
    if (out_vals) assert_int_equal(em_to_host(out, out_vals, B * T * C * sizeof(double)), EM_OK);
    if (grads) {
        em_status st = em_backward(loss, NULL);
        if (st != EM_OK) fprintf(stderr, "backward: %s\n", em_last_error());
        assert_int_equal(st, EM_OK);
        for (int i = 0; i < NT; i++) {
            em_tensor *g = em_grad(p[i]);
            if (!g) fprintf(stderr, "no gradient for %s\n", names[i]);
            assert_non_null(g);
            assert_int_equal(em_to_host(g, grads[i], numel(shape_of(i)) * sizeof(double)), EM_OK);
        }
    }
    em_scope_end(NULL, 0);
    return lv;
}

static void alloc_all(double **v, double **g)
{
    for (int i = 0; i < NT; i++) {
        v[i] = calloc(numel(shape_of(i)), sizeof(double));
        if (g) g[i] = calloc(numel(shape_of(i)), sizeof(double));
    }
}

static void free_all(double **v, double **g)
{
    for (int i = 0; i < NT; i++) {
        free(v[i]);
        if (g) free(g[i]);
    }
}

/* Normalized error |got - ref| / max(1, |ref|) within tol for all n; prints the first miss. */
static bool close_n(const char *what, const double *got, const double *ref, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= tol * (fabs(ref[i]) > 1 ? fabs(ref[i]) : 1))) {
            fprintf(stderr, "%s: element %zu is %.17g, expected %.17g\n", what, i, got[i], ref[i]);
            return false;
        }
    return true;
}

/* ---- the PyTorch fixture --------------------------------------------------------------------- */

/* Reads entry `name` of group `grp` ({"shape": [...], "data": [...]}) into v, checking the shape.
 */
static bool json_tensor(const cJSON *grp, const char *name, em_shape want, double *v)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(grp, name);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(e, "data");
    if (!cJSON_IsArray(sh) || !cJSON_IsArray(data) || cJSON_GetArraySize(sh) != want.rank ||
        (size_t)cJSON_GetArraySize(data) != numel(want)) {
        fprintf(stderr, "fixture: entry %s is missing or has the wrong shape\n", name);
        return false;
    }
    for (int i = 0; i < want.rank; i++)
        if (cJSON_GetArrayItem(sh, i)->valuedouble != (double)want.d[i]) {
            fprintf(stderr, "fixture: entry %s has the wrong shape\n", name);
            return false;
        }
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, data) v[i++] = it->valuedouble;
    return true;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static void test_fixture(void **state)
{
    (void)state;
    const char *path = EMBER_SOURCE_DIR "/tests/fixtures/transformer_block.json";
    char *text = read_text(path);
    if (!text) {
        fprintf(stderr,
                "SKIPPED: %s is absent; run tests/fixtures/gen/transformer_block.py where "
                "PyTorch exists and commit the JSON it writes\n",
                path);
        skip();
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    if (!doc) fail_msg("%s: not valid JSON", path);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(doc, "config");
    const cJSON *tens = cJSON_GetObjectItemCaseSensitive(doc, "tensors");
    const cJSON *grd = cJSON_GetObjectItemCaseSensitive(doc, "grads");
    static const struct {
        const char *key;
        double v;
    } want[] = {{"B", B}, {"T", T}, {"C", C}, {"n_head", NH}, {"eps", 1e-5}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(cfg, want[i].key);
        if (!cJSON_IsNumber(c) || c->valuedouble != want[i].v)
            fail_msg("fixture: config %s is not %g", want[i].key, want[i].v);
    }
    double *vals[NT], *ref_grads[NT], *grads[NT], r[B * T * C], ref_out[B * T * C], out[B * T * C];
    alloc_all(vals, ref_grads);
    alloc_all(grads, NULL);
    bool ok = true;
    for (int i = 0; i < NT; i++) {
        ok &= json_tensor(tens, names[i], shape_of(i), vals[i]);
        ok &= json_tensor(grd, names[i], shape_of(i), ref_grads[i]);
    }
    ok &= json_tensor(tens, "R", EM_SHAPE(B, T, C), r);
    ok &= json_tensor(tens, "out", EM_SHAPE(B, T, C), ref_out);
    const cJSON *jl = cJSON_GetObjectItemCaseSensitive(doc, "loss");
    double ref_loss = cJSON_IsNumber(jl) ? jl->valuedouble : NAN;
    cJSON_Delete(doc);
    if (!ok) fail_msg("fixture: %s is incomplete", path);

    double loss = run(vals, r, out, grads);
    ok = close_n("out", out, ref_out, B * T * C, 1e-9);
    ok &= close_n("loss", &loss, &ref_loss, 1, 1e-9);
    for (int i = 0; i < NT; i++) {
        char what[64];
        snprintf(what, sizeof what, "d loss / d %s", names[i]);
        ok &= close_n(what, grads[i], ref_grads[i], numel(shape_of(i)), 1e-9);
    }
    free_all(vals, ref_grads);
    free_all(grads, NULL);
    if (!ok) fail_msg("the block differs from PyTorch's (%s)", path);
}

/* ---- finite differences ---------------------------------------------------------------------- */

static void fill(double *v, size_t n, double lo, double hi, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 7u;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v[i] = lo + (hi - lo) * (double)(s % 1000003u) / 1000003.0;
    }
}

static void test_finite_differences(void **state)
{
    (void)state;
    double *vals[NT], *grads[NT], r[B * T * C];
    alloc_all(vals, grads);
    for (int i = 0; i < NT; i++) {
        size_t n = numel(shape_of(i));
        bool ln_w = i == LN1_W || i == LN2_W;
        fill(vals[i], n, ln_w ? 0.8 : -0.5, ln_w ? 1.2 : 0.5, (uint32_t)(i + 1));
        if (i == X) fill(vals[i], n, -2, 2, 101);
    }
    fill(r, B * T * C, -1, 1, 202);
    run(vals, r, NULL, grads);
    const double h = 1e-6;
    int bad = 0, checked = 0;
    for (int i = 0; i < NT; i++) {
        size_t n = numel(shape_of(i)), step = n > 6 ? n / 6 : 1;
        for (size_t j = (size_t)i % step; j < n; j += step) {
            double keep = vals[i][j];
            vals[i][j] = keep + h;
            double lp = run(vals, r, NULL, NULL);
            vals[i][j] = keep - h;
            double lm = run(vals, r, NULL, NULL);
            vals[i][j] = keep;
            double fd = (lp - lm) / (2 * h);
            checked++;
            if (fabs(grads[i][j] - fd) > 1e-6 * (fabs(fd) > 1 ? fabs(fd) : 1) && bad++ < 8)
                fprintf(stderr, "d loss / d %s [%zu] is %.12g, finite differences say %.12g\n",
                        names[i], j, grads[i][j], fd);
        }
    }
    free_all(vals, grads);
    fprintf(stderr, "[autodiff] %d gradient elements checked against finite differences\n",
            checked);
    if (bad) fail_msg("%d gradient elements of the block disagree with finite differences", bad);
}

static int setup(void **state)
{
    (void)state;
    em_autodiff_init();
    g_cpu = em_device_open("cpu");
    return g_cpu ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(g_cpu);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_fixture),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
