/* test_torch_fixture.c — every nn module, forward and backward, against PyTorch: the fixture
 * tests/fixtures/torch_nn.safetensors, written by tests/fixtures/gen/nn_modules.py with Python's
 * safetensors library (so reading it is also the test of such a file), holds for each case the
 * module's hyper-parameters (metadata, JSON), its parameters in ember's names and layouts, the
 * inputs, an upstream gradient R, the output and d sum(out * R) / d (input and every parameter).
 * Each case is built with ember (em_linear_new, em_mha_new, em_cross_entropy, ...), its parameters
 * set from the fixture, run forward and backward, and the output and every gradient compared:
 *   - on the CPU device in f64, normalized error |got - ref| / max(1, |ref|) within 1e-10;
 *   - also, when $EMBER_TEST_DEVICE names another device, on that device in f32 (within 1e-4).
 * SKIPPED (cmocka skip(), and a line "SKIPPED: ... is absent" for CTest) when the fixture is
 * absent. $EMBER_TORCH_FIXTURE=path reads another file of the same layout instead (for debugging
 * the test with a hand-made file; the check that every module kind is covered is then off). */
#include "ember/nn.h"
#include "nn/torch_fixture.h"

/* The module kinds the committed fixture must cover (the "kind" of each case's metadata). */
static const char *const KINDS[] = {
    "linear", "embedding", "layer_norm", "rms_norm",   "activation",    "mha", "mlp",
    "block",  "conv2d",    "max_pool2d", "avg_pool2d", "cross_entropy", "mse", "bce_with_logits",
};

/* One case being run. */
typedef struct run {
    const em_safetensors *f;
    const fx_target *tg;
    const char *name; /* the case */
    const cJSON *cfg; /* its metadata */
    double worst;     /* the largest normalized error seen */
    int failures;     /* mismatches and errors */
} run;

/* ---- the fixture file ------------------------------------------------------------------------ */

static bool has(const run *r, const char *what)
{
    char full[256];
    snprintf(full, sizeof full, "%s/%s", r->name, what);
    return em_safetensors_info(r->f, full, NULL, NULL);
}

/* Fixture tensor "<case>/<what>" on the run's device: float entries converted to the run's dtype,
 * others (ids, targets, masks) as stored. Counts a failure and returns NULL when absent. */
static em_tensor *load(run *r, const char *what)
{
    char full[256];
    snprintf(full, sizeof full, "%s/%s", r->name, what);
    em_scalar dt;
    em_shape sh;
    if (!em_safetensors_info(r->f, full, &dt, &sh)) {
        fprintf(stderr, "[torch] %s: the fixture has no tensor %s\n", r->name, full);
        r->failures++;
        return NULL;
    }
    em_tensor *t = em_safetensors_load(r->f, full, r->tg->dev,
                                       em_scalar_is_float(dt) ? r->tg->dt : EM_SCALAR_COUNT);
    if (!t) {
        fprintf(stderr, "[torch] %s: %s\n", r->name, em_last_error());
        r->failures++;
    }
    return t;
}

/* A float input that is differentiated. */
static em_tensor *load_leaf(run *r, const char *what)
{
    em_tensor *t = load(r, what);
    if (t && em_set_requires_grad(t, true) != EM_OK) {
        fprintf(stderr, "[torch] %s: %s: %s\n", r->name, what, em_last_error());
        r->failures++;
        return NULL;
    }
    return t;
}

/* Compares got (any dtype, any device) with the fixture's f64 "<case>/<what>": shape, then every
 * element with the normalized error |got - ref| / max(1, |ref|) (NaN and Inf must agree). */
static void check(run *r, const char *what, const em_tensor *got)
{
    char full[256];
    snprintf(full, sizeof full, "%s/%s", r->name, what);
    if (!got) {
        fprintf(stderr, "[torch] %s: %s: no tensor to compare (%s)\n", r->name, what,
                em_last_error());
        r->failures++;
        return;
    }
    em_tensor *ref = em_safetensors_load(r->f, full, g_cpu, EM_F64);
    if (!ref) {
        fprintf(stderr, "[torch] %s: %s\n", r->name, em_last_error());
        r->failures++;
        return;
    }
    em_shape gs = em_shape_of(got), rs = em_shape_of(ref);
    bool same = gs.rank == rs.rank;
    for (int i = 0; same && i < gs.rank; i++) same = gs.d[i] == rs.d[i];
    if (!same) {
        char b1[128], b2[128];
        fprintf(stderr, "[torch] %s: %s is %s, PyTorch's is %s\n", r->name, what,
                em_describe(got, b1, sizeof b1), em_describe(ref, b2, sizeof b2));
        r->failures++;
        em_release(ref);
        return;
    }
    double *g = tu_read(got), *e = tu_read(ref);
    size_t n = (size_t)em_numel(ref), worst_i = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err;
        if (isnan(e[i]) || isnan(g[i]))
            err = isnan(e[i]) && isnan(g[i]) ? 0 : INFINITY;
        else if (isinf(e[i]) || isinf(g[i]))
            err = g[i] == e[i] ? 0 : INFINITY;
        else
            err = fabs(g[i] - e[i]) / (fabs(e[i]) > 1 ? fabs(e[i]) : 1);
        if (!(err <= worst)) {
            worst = err;
            worst_i = i;
        }
    }
    if (worst > r->worst) r->worst = worst;
    if (!(worst <= r->tg->tol)) {
        fprintf(stderr,
                "[torch] %s: %s differs: element %zu of %zu is %.17g, PyTorch's %.17g (normalized "
                "error %.3g > %.3g)\n",
                r->name, what, worst_i, n, g[worst_i], e[worst_i], worst, r->tg->tol);
        r->failures++;
    }
    free(g);
    free(e);
    em_release(ref);
}

/* ---- the case's configuration ---------------------------------------------------------------- */

static const cJSON *cfg_item(run *r, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(r->cfg, key);
    if (!j) {
        fprintf(stderr, "[torch] %s: the case's metadata has no \"%s\"\n", r->name, key);
        r->failures++;
    }
    return j;
}

static double num(run *r, const char *key)
{
    const cJSON *j = cfg_item(r, key);
    return cJSON_IsNumber(j) ? j->valuedouble : 0;
}

static bool flag(run *r, const char *key)
{
    return cJSON_IsTrue(cfg_item(r, key));
}

static const char *str(run *r, const char *key)
{
    const cJSON *j = cfg_item(r, key);
    return cJSON_IsString(j) ? j->valuestring : "";
}

static em_activation act(run *r)
{
    em_clear_error();
    em_activation a = em_activation_parse(str(r, "act"));
    if (a == EM_ACT_NONE) {
        fprintf(stderr, "[torch] %s: %s\n", r->name, em_last_error());
        r->failures++;
    }
    return a;
}

static em_reduction reduction(run *r)
{
    const char *s = str(r, "reduction");
    if (!strcmp(s, "sum")) return EM_REDUCE_SUM;
    if (!strcmp(s, "none")) return EM_REDUCE_NONE;
    if (strcmp(s, "mean")) {
        fprintf(stderr, "[torch] %s: unknown reduction \"%s\"\n", r->name, s);
        r->failures++;
    }
    return EM_REDUCE_MEAN;
}

/* ---- modules --------------------------------------------------------------------------------- */

/* The module of a case, built on the run's device and dtype; NULL for the functional kinds
 * (activations and losses), and NULL with a failure counted when construction fails. */
static em_module *build(run *r, const char *kind, bool *functional)
{
    em_device *dev = r->tg->dev;
    em_scalar dt = r->tg->dt;
    em_rng rng = em_rng_new(1); /* the initial values are replaced by the fixture's */
    em_module *m = NULL;
    *functional = false;
    if (!strcmp(kind, "linear"))
        m = (em_module *)em_linear_new(dev, dt, (int64_t)num(r, "in"), (int64_t)num(r, "out"),
                                       flag(r, "bias"), flag(r, "weight_in_out"), &rng);
    else if (!strcmp(kind, "embedding"))
        m = (em_module *)em_embedding_new(dev, dt, (int64_t)num(r, "num"), (int64_t)num(r, "dim"),
                                          &rng);
    else if (!strcmp(kind, "layer_norm"))
        m = (em_module *)em_layer_norm_new(dev, dt, (int64_t)num(r, "dim"), num(r, "eps"),
                                           flag(r, "affine"), flag(r, "bias"));
    else if (!strcmp(kind, "rms_norm"))
        m = (em_module *)em_rms_norm_new(dev, dt, (int64_t)num(r, "dim"), num(r, "eps"));
    else if (!strcmp(kind, "mha"))
        m = (em_module *)em_mha_new(dev, dt, (int64_t)num(r, "dim"), (int64_t)num(r, "heads"),
                                    flag(r, "causal"), flag(r, "bias"), 0.0,
                                    flag(r, "weight_in_out"), &rng);
    else if (!strcmp(kind, "mlp"))
        m = (em_module *)em_mlp_new(dev, dt, (int64_t)num(r, "dim"), (int64_t)num(r, "hidden"),
                                    act(r), flag(r, "bias"), 0.0, flag(r, "weight_in_out"), &rng);
    else if (!strcmp(kind, "block")) {
        em_block_config c = {.dim = (int64_t)num(r, "dim"),
                             .heads = (int64_t)num(r, "heads"),
                             .hidden = (int64_t)num(r, "hidden"),
                             .bias = flag(r, "bias"),
                             .p_dropout = 0.0,
                             .eps = num(r, "eps"),
                             .act = act(r),
                             .weight_in_out = flag(r, "weight_in_out")};
        m = (em_module *)em_block_new(dev, dt, &c, &rng);
    } else if (!strcmp(kind, "conv2d"))
        m = (em_module *)em_conv2d_new(dev, dt, (int64_t)num(r, "in"), (int64_t)num(r, "out"),
                                       (int)num(r, "kernel"), (int)num(r, "stride"),
                                       (int)num(r, "padding"), (int)num(r, "dilation"),
                                       (int)num(r, "groups"), flag(r, "bias"), &rng);
    else if (!strcmp(kind, "max_pool2d") || !strcmp(kind, "avg_pool2d"))
        m = (em_module *)em_pool2d_new(dev, !strcmp(kind, "max_pool2d"), (int)num(r, "kernel"),
                                       (int)num(r, "stride"), (int)num(r, "padding"));
    else {
        *functional = true;
        return NULL;
    }
    if (!m) {
        fprintf(stderr, "[torch] %s: building the %s module: %s\n", r->name, kind, em_last_error());
        r->failures++;
        return NULL;
    }
    em_module_train(m, false);
    return m;
}

typedef struct param_visit {
    run *r;
    int n; /* parameters seen */
} param_visit;

/* Sets one parameter from "<case>/param/<name>" (shapes must agree). */
static bool set_param(const char *name, em_module_entry *e, void *user)
{
    param_visit *pv = user;
    run *r = pv->r;
    if (!e->is_param) return true;
    pv->n++;
    char what[200];
    snprintf(what, sizeof what, "param/%s", name);
    em_tensor *v = load(r, what);
    if (!v) return true;
    em_shape a = em_shape_of(v), b = em_shape_of(e->t);
    bool same = a.rank == b.rank;
    for (int i = 0; same && i < a.rank; i++) same = a.d[i] == b.d[i];
    em_status st = EM_ERR_INVALID;
    if (same) {
        em_no_grad_begin();
        st = em_copy_(e->t, v);
        em_no_grad_end();
    }
    if (st != EM_OK) {
        char b1[128], b2[128];
        fprintf(stderr, "[torch] %s: parameter %s is %s in ember, %s in the fixture%s%s\n", r->name,
                name, em_describe(e->t, b1, sizeof b1), em_describe(v, b2, sizeof b2),
                same ? ": " : "", same ? em_last_error() : "");
        r->failures++;
    }
    em_release(v);
    return true;
}

/* Compares the gradient of each parameter with "<case>/grad/<name>". */
static bool check_param_grad(const char *name, em_module_entry *e, void *user)
{
    run *r = user;
    if (!e->is_param) return true;
    char what[200];
    snprintf(what, sizeof what, "grad/%s", name);
    if (!em_grad(e->t)) {
        fprintf(stderr, "[torch] %s: parameter %s got no gradient\n", r->name, name);
        r->failures++;
        return true;
    }
    check(r, what, em_grad(e->t));
    return true;
}

/* Counts the fixture's entries named "<case>/<prefix>...". */
static int count_prefixed(const run *r, const char *prefix)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", r->name, prefix);
    size_t n = strlen(p);
    int c = 0;
    for (int i = 0; i < em_safetensors_count(r->f); i++)
        if (!strncmp(em_safetensors_name(r->f, i), p, n)) c++;
    return c;
}

/* The forward of one case: out from the module m (or the functional kind) and the inputs. */
static em_tensor *forward(run *r, const char *kind, em_module *m, em_tensor *x, em_tensor *target)
{
    if (!strcmp(kind, "linear")) return em_linear_forward((em_linear *)m, x);
    if (!strcmp(kind, "embedding")) {
        em_tensor *ids = load(r, "ids");
        return ids ? em_embedding_forward((em_embedding_mod *)m, ids) : NULL;
    }
    if (!strcmp(kind, "layer_norm")) return em_layer_norm_forward((em_layer_norm_mod *)m, x);
    if (!strcmp(kind, "rms_norm")) return em_rms_norm_forward((em_rms_norm_mod *)m, x);
    if (!strcmp(kind, "activation")) return em_activate(x, act(r));
    em_tensor *pad = has(r, "pad_mask") ? load(r, "pad_mask") : NULL;
    if (!strcmp(kind, "mha")) return em_mha_forward((em_mha *)m, x, pad, NULL, NULL);
    if (!strcmp(kind, "mlp")) return em_mlp_forward((em_mlp *)m, x, NULL);
    if (!strcmp(kind, "block")) return em_block_forward((em_block *)m, x, pad, NULL, NULL);
    if (!strcmp(kind, "conv2d")) return em_conv2d_forward((em_conv2d_mod *)m, x);
    if (!strcmp(kind, "max_pool2d") || !strcmp(kind, "avg_pool2d"))
        return em_pool2d_forward((em_pool2d_mod *)m, x);
    if (!strcmp(kind, "cross_entropy"))
        return em_cross_entropy(x, target, (int64_t)num(r, "ignore_index"),
                                num(r, "label_smoothing"), reduction(r));
    if (!strcmp(kind, "mse")) return em_mse_loss(x, target, reduction(r));
    if (!strcmp(kind, "bce_with_logits")) {
        em_tensor *pw = has(r, "pos_weight") ? load(r, "pos_weight") : NULL;
        return em_bce_with_logits(x, target, pw, reduction(r));
    }
    fprintf(stderr, "[torch] %s: unknown kind \"%s\"\n", r->name, kind);
    r->failures++;
    return NULL;
}

/* Runs one case on one target; returns the number of failures. */
static int run_case(const em_safetensors *f, const fx_target *tg, const char *name,
                    const cJSON *cfg)
{
    run r = {.f = f, .tg = tg, .name = name, .cfg = cfg};
    const char *kind = str(&r, "kind");
    bool functional;
    em_module *m = build(&r, kind, &functional);
    em_scope_begin();
    if (m) {
        param_visit pv = {&r, 0};
        em_module_visit(m, set_param, &pv);
        int in_file = count_prefixed(&r, "param/");
        if (in_file != pv.n) {
            fprintf(stderr, "[torch] %s: the module has %d parameters, the fixture %d\n", name,
                    pv.n, in_file);
            r.failures++;
        }
    }
    bool losses =
        !strcmp(kind, "cross_entropy") || !strcmp(kind, "mse") || !strcmp(kind, "bce_with_logits");
    em_tensor *x = strcmp(kind, "embedding") ? load_leaf(&r, "in") : NULL;
    em_tensor *target = NULL;
    if (losses)
        target = !strcmp(kind, "cross_entropy") ? load(&r, "target") : load_leaf(&r, "target");
    em_tensor *out = (m || functional) && !r.failures ? forward(&r, kind, m, x, target) : NULL;
    if (out) {
        check(&r, "out", out);
        em_tensor *R = load(&r, "R");
        em_tensor *loss = em_sum(em_mul(out, R), NULL, 0, false);
        em_status st = loss ? em_backward(loss, NULL) : EM_ERR_INVALID;
        if (st != EM_OK) {
            fprintf(stderr, "[torch] %s: backward: %s\n", name, em_last_error());
            r.failures++;
        } else {
            if (x) check(&r, "grad/in", em_grad(x));
            if (target && has(&r, "grad/target")) check(&r, "grad/target", em_grad(target));
            if (m) em_module_visit(m, check_param_grad, &r);
        }
    } else if (!r.failures) {
        fprintf(stderr, "[torch] %s: forward: %s\n", name, em_last_error());
        r.failures++;
    }
    em_scope_end(NULL, 0);
    em_module_free(m);
    fprintf(stderr, "[torch] %-30s %s %s: %s (worst normalized error %.2g)\n", name,
            em_device_name(tg->dev), em_scalar_name(tg->dt), r.failures ? "FAILED" : "ok", r.worst);
    return r.failures;
}

static void test_modules(void **state)
{
    (void)state;
    bool custom;
    em_safetensors *f = open_fixture(&custom);
    cJSON *cases = meta_json(f, "cases");
    if (!cJSON_IsArray(cases) || cJSON_GetArraySize(cases) == 0)
        fail_msg("fixture: metadata \"cases\" is not a list of case names");
    const char *tv = em_safetensors_metadata(f, "torch_version");
    fprintf(stderr, "[torch] %d module cases from PyTorch %s\n", cJSON_GetArraySize(cases),
            tv ? tv : "(unknown)");
    bool covered[EM_ARRAY_LEN(KINDS)] = {0};
    char failed[1024] = "";
    int nfailed = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cases)
    {
        if (!cJSON_IsString(it)) fail_msg("fixture: a case name is not a string");
        const char *name = it->valuestring;
        cJSON *cfg = meta_json(f, name);
        fx_cover(cfg, KINDS, EM_ARRAY_LEN(KINDS), covered);
        for (int t = 0; t < g_ntargets; t++)
            if (run_case(f, &g_targets[t], name, cfg))
                fx_note_failure(failed, sizeof failed, &nfailed, name, &g_targets[t]);
        cJSON_Delete(cfg);
    }
    cJSON_Delete(cases);
    em_safetensors_close(f);
    if (nfailed) fail_msg("%d module cases differ from PyTorch's: %s", nfailed, failed);
    fx_require_kinds(KINDS, EM_ARRAY_LEN(KINDS), covered, custom, "module");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modules),
    };
    return cmocka_run_group_tests(tests, fx_setup, fx_teardown);
}
