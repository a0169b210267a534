/* test_torch_fixture.c — SGD, Adam and AdamW against torch.optim over 10 steps: the fixture
 * tests/fixtures/torch_nn.safetensors (written by tests/fixtures/gen/nn_modules.py with Python's
 * safetensors library) holds, for each optimizer case, its settings (metadata, JSON), the data x, y
 * and the initial parameters W [3, 4] (weight-decay group) and b [3] (not), and PyTorch's loss,
 * gradients (and clip_grad_norm_'s norm) at every step and the parameters after it, for
 *
 *     loss = sum((x W^T + b - y)^2) / n + quartic * sum(W^4).
 *
 * ember runs the same loop — zero_grad, the loss from tensor ops, em_backward, em_clip_grad_norm
 * (clipping cases), em_optimizer_step — and every step's loss, gradients, norm and parameters are
 * compared (normalized error |got - ref| / max(1, |ref|)): on the CPU device in f64 within 1e-10,
 * and, when $EMBER_TEST_DEVICE names another device, on that device in f32 within 1e-4. A case
 * stops at its first differing step (later steps only repeat the difference).
 * SKIPPED (cmocka skip(), and a line "SKIPPED: ... is absent" for CTest) when the fixture is
 * absent; $EMBER_TORCH_FIXTURE=path reads another file of the same layout instead. */
#include "ember/optim.h"
#include "nn/torch_fixture.h"

/* The optimizer kinds the committed fixture must cover. */
static const char *const KINDS[] = {"sgd", "adam", "adamw"};

/* One case being run. */
typedef struct run {
    const em_safetensors *f;
    const fx_target *tg;
    const char *name; /* the case */
    double worst;     /* the largest normalized error seen */
    int failures;
} run;

static double cfg_num(const cJSON *cfg, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!cJSON_IsNumber(j)) fail_msg("fixture: optimizer setting \"%s\" is missing", key);
    return j->valuedouble;
}

/* Fixture tensor `full` on the run's device in the run's dtype (NULL, a failure counted, when
 * absent). */
static em_tensor *load(run *r, const char *full)
{
    em_tensor *t = em_safetensors_load(r->f, full, r->tg->dev, r->tg->dt);
    if (!t) {
        fprintf(stderr, "[torch] %s: %s\n", r->name, em_last_error());
        r->failures++;
    }
    return t;
}

/* Normalized error of got against ref, NaN and Inf agreeing exactly. */
static double nerr(double got, double ref)
{
    if (isnan(ref) || isnan(got)) return isnan(ref) && isnan(got) ? 0 : INFINITY;
    if (isinf(ref) || isinf(got)) return got == ref ? 0 : INFINITY;
    return fabs(got - ref) / (fabs(ref) > 1 ? fabs(ref) : 1);
}

/* Compares got with the fixture's "<case>/<what>" (shape and every element). */
static void check(run *r, const char *what, const em_tensor *got)
{
    char full[256];
    snprintf(full, sizeof full, "%s/%s", r->name, what);
    if (!got) {
        fprintf(stderr, "[torch] %s: %s: nothing to compare (%s)\n", r->name, what,
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
    size_t n = (size_t)em_numel(ref), wi = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err = nerr(g[i], e[i]);
        if (!(err <= worst)) {
            worst = err;
            wi = i;
        }
    }
    if (worst > r->worst) r->worst = worst;
    if (!(worst <= r->tg->tol)) {
        fprintf(stderr,
                "[torch] %s: %s differs: element %zu is %.17g, PyTorch's %.17g (normalized error "
                "%.3g > %.3g)\n",
                r->name, what, wi, g[wi], e[wi], worst, r->tg->tol);
        r->failures++;
    }
    free(g);
    free(e);
    em_release(ref);
}

/* Compares one value with element i of the fixture's f64 vector "<case>/<what>". */
static void check_value(run *r, const char *what, int i, double got)
{
    char full[256];
    snprintf(full, sizeof full, "%s/%s", r->name, what);
    em_tensor *ref = em_safetensors_load(r->f, full, g_cpu, EM_F64);
    if (!ref || em_rank(ref) != 1 || i >= em_dim(ref, 0)) {
        fprintf(stderr, "[torch] %s: %s: no element %d in the fixture\n", r->name, what, i);
        r->failures++;
        em_release(ref);
        return;
    }
    double *e = tu_read(ref), err = nerr(got, e[i]);
    if (err > r->worst) r->worst = err;
    if (!(err <= r->tg->tol)) {
        fprintf(stderr,
                "[torch] %s: %s at step %d is %.17g, PyTorch's %.17g (normalized error "
                "%.3g > %.3g)\n",
                r->name, what, i + 1, got, e[i], err, r->tg->tol);
        r->failures++;
    }
    free(e);
    em_release(ref);
}

/* sum((x W^T + b - y)^2) / n + quartic * sum(W^4), in the caller's scope. */
static em_tensor *loss_of(em_tensor *w, em_tensor *b, em_tensor *x, em_tensor *y, double quartic)
{
    em_tensor *d = em_sub(em_add(em_matmul(x, em_transpose(w, 0, 1)), b), y);
    em_tensor *fit =
        em_mul_scalar(em_sum(em_mul(d, d), NULL, 0, false), 1.0 / (double)em_dim(x, 0));
    em_tensor *w2 = em_mul(w, w);
    return em_add(fit, em_mul_scalar(em_sum(em_mul(w2, w2), NULL, 0, false), quartic));
}

/* The optimizer of a case over W (decay group) and b (not). */
static em_optimizer *make_optimizer(run *r, const cJSON *cfg, em_tensor *w, em_tensor *b)
{
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(cfg, "kind");
    const char *k = cJSON_IsString(kind) ? kind->valuestring : "";
    em_param_ref refs[2] = {{"weight", w, true}, {"bias", b, false}};
    em_optimizer *o = NULL;
    if (!strcmp(k, "sgd")) {
        em_sgd_config c = {.lr = cfg_num(cfg, "lr"),
                           .momentum = cfg_num(cfg, "momentum"),
                           .dampening = cfg_num(cfg, "dampening"),
                           .weight_decay = cfg_num(cfg, "weight_decay"),
                           .nesterov =
                               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "nesterov"))};
        o = em_sgd_new_params(refs, 2, &c);
    } else if (!strcmp(k, "adam") || !strcmp(k, "adamw")) {
        em_adam_config c = {.lr = cfg_num(cfg, "lr"),
                            .beta1 = cfg_num(cfg, "beta1"),
                            .beta2 = cfg_num(cfg, "beta2"),
                            .eps = cfg_num(cfg, "eps"),
                            .weight_decay = cfg_num(cfg, "weight_decay"),
                            .decoupled = !strcmp(k, "adamw")};
        o = em_adam_new_params(refs, 2, &c);
    } else {
        em_set_error(EM_ERR_INVALID, "unknown optimizer kind \"%s\"", k);
    }
    if (!o) {
        fprintf(stderr, "[torch] %s: %s\n", r->name, em_last_error());
        r->failures++;
    }
    return o;
}

/* Runs one case on one target; returns the number of failures. */
static int run_case(const em_safetensors *f, const fx_target *tg, const char *name,
                    const cJSON *cfg, double quartic)
{
    run r = {.f = f, .tg = tg, .name = name};
    int steps = (int)cfg_num(cfg, "steps");
    double clip = cfg_num(cfg, "clip");
    em_tensor *x = load(&r, "optim/x"), *y = load(&r, "optim/y");
    em_tensor *w = load(&r, "optim/init/weight"), *b = load(&r, "optim/init/bias");
    em_optimizer *o = NULL;
    if (w && b && em_set_requires_grad(w, true) == EM_OK && em_set_requires_grad(b, true) == EM_OK)
        o = make_optimizer(&r, cfg, w, b);
    int step = 1;
    for (; o && x && y && step <= steps && !r.failures; step++) {
        em_optimizer_zero_grad(o);
        em_scope_begin();
        char what[64];
        em_tensor *loss = loss_of(w, b, x, y, quartic);
        if (loss) check_value(&r, "loss", step - 1, em_item(loss));
        em_status st = loss ? em_backward(loss, NULL) : EM_ERR_INVALID;
        if (st != EM_OK) {
            fprintf(stderr, "[torch] %s step %d: loss or backward: %s\n", name, step,
                    em_last_error());
            r.failures++;
        } else {
            snprintf(what, sizeof what, "grad/%d/weight", step);
            check(&r, what, em_grad(w));
            snprintf(what, sizeof what, "grad/%d/bias", step);
            check(&r, what, em_grad(b));
            if (clip > 0) {
                double norm = NAN;
                if (em_clip_grad_norm(o, clip, &norm) != EM_OK) {
                    fprintf(stderr, "[torch] %s step %d: clip: %s\n", name, step, em_last_error());
                    r.failures++;
                }
                check_value(&r, "norm", step - 1, norm);
            }
            if (em_optimizer_step(o) != EM_OK) {
                fprintf(stderr, "[torch] %s step %d: %s\n", name, step, em_last_error());
                r.failures++;
            }
            snprintf(what, sizeof what, "step/%d/weight", step);
            check(&r, what, w);
            snprintf(what, sizeof what, "step/%d/bias", step);
            check(&r, what, b);
        }
        em_scope_end(NULL, 0);
    }
    if (r.failures && step > 1)
        fprintf(stderr, "[torch] %s: first difference at step %d\n", name, step - 1);
    em_optimizer_free(o);
    em_release(x);
    em_release(y);
    em_release(w);
    em_release(b);
    fprintf(stderr, "[torch] %-26s %s %s: %s (%d steps, worst normalized error %.2g)\n", name,
            em_device_name(tg->dev), em_scalar_name(tg->dt), r.failures ? "FAILED" : "ok", steps,
            r.worst);
    return r.failures;
}

static void test_optimizers(void **state)
{
    (void)state;
    bool custom;
    em_safetensors *f = open_fixture(&custom);
    cJSON *cases = meta_json(f, "optim_cases");
    cJSON *lossj = meta_json(f, "optim_loss");
    if (!cJSON_IsArray(cases) || cJSON_GetArraySize(cases) == 0)
        fail_msg("fixture: metadata \"optim_cases\" is not a list of case names");
    double quartic = cfg_num(lossj, "quartic");
    bool covered[EM_ARRAY_LEN(KINDS)] = {0};
    char failed[1024] = "";
    int nfailed = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cases)
    {
        if (!cJSON_IsString(it)) fail_msg("fixture: an optimizer case name is not a string");
        cJSON *cfg = meta_json(f, it->valuestring);
        fx_cover(cfg, KINDS, EM_ARRAY_LEN(KINDS), covered);
        for (int t = 0; t < g_ntargets; t++)
            if (run_case(f, &g_targets[t], it->valuestring, cfg, quartic))
                fx_note_failure(failed, sizeof failed, &nfailed, it->valuestring, &g_targets[t]);
        cJSON_Delete(cfg);
    }
    cJSON_Delete(cases);
    cJSON_Delete(lossj);
    em_safetensors_close(f);
    if (nfailed) fail_msg("%d optimizer cases differ from torch.optim's: %s", nfailed, failed);
    fx_require_kinds(KINDS, EM_ARRAY_LEN(KINDS), covered, custom, "optimizer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizers),
    };
    return cmocka_run_group_tests(tests, fx_setup, fx_teardown);
}
