/* torch_fixture.h — what nn.torch_fixture and optim.torch_fixture share: the fixture file
 * (tests/fixtures/torch_nn.safetensors, written by tests/fixtures/gen/nn_modules.py, or
 * $EMBER_TORCH_FIXTURE), its JSON metadata, the devices a case runs on (the CPU in f64, and
 * $EMBER_TEST_DEVICE in f32 when it names another device) and the report of kinds the committed
 * fixture fails to cover. Header-only; include after cmocka (tensor/tensor_util.h). */
#ifndef EMBER_TESTS_TORCH_FIXTURE_H
#define EMBER_TESTS_TORCH_FIXTURE_H

#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ember/autodiff.h"
#include "ember/record.h"
#include "tensor/tensor_util.h"

#define FIXTURE "tests/fixtures/torch_nn.safetensors"

/* Where a case runs: the device, the dtype its tensors are loaded in and the tolerance. */
typedef struct fx_target {
    em_device *dev;
    em_scalar dt;
    double tol;
} fx_target;

static em_device *g_cpu;       /* the CPU device (references are always read there in f64) */
static fx_target g_targets[2]; /* CPU f64, then $EMBER_TEST_DEVICE in f32 when it is not the CPU */
static int g_ntargets;

/* Opens the fixture: $EMBER_TORCH_FIXTURE or the committed file. Skips the calling test when the
 * committed file is absent; fails when the file is there but unreadable. *custom tells which. */
static inline em_safetensors *open_fixture(bool *custom)
{
    const char *env = getenv("EMBER_TORCH_FIXTURE");
    *custom = env && *env;
    const char *path = *custom ? env : EMBER_SOURCE_DIR "/" FIXTURE;
    struct stat st;
    if (!*custom && stat(path, &st) != 0) {
        fprintf(stderr,
                "SKIPPED: %s is absent; run tests/fixtures/gen/nn_modules.py where PyTorch exists "
                "and commit the file it writes\n",
                path);
        skip();
    }
    em_safetensors *f = em_safetensors_open(path);
    if (!f) fail_msg("%s", em_last_error());
    return f;
}

/* The metadata value `key` parsed as JSON (the caller deletes it); fails the test otherwise. */
static inline cJSON *meta_json(const em_safetensors *f, const char *key)
{
    const char *s = em_safetensors_metadata(f, key);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    if (!j) fail_msg("fixture: metadata \"%s\" is %s", key, s ? "not valid JSON" : "missing");
    return j;
}

/* Marks the kind of a case's metadata in covered[] (kinds[0..n) are the kinds required). */
static inline void fx_cover(const cJSON *cfg, const char *const *kinds, size_t n, bool *covered)
{
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(cfg, "kind");
    for (size_t k = 0; k < n; k++)
        if (cJSON_IsString(kind) && !strcmp(kind->valuestring, kinds[k])) covered[k] = true;
}

/* Fails the test naming every required kind the committed fixture has no case of (a custom file
 * is not required to cover them). */
static inline void fx_require_kinds(const char *const *kinds, size_t n, const bool *covered,
                                    bool custom, const char *what)
{
    char missing[256] = "";
    for (size_t k = 0; k < n && !custom; k++)
        if (!covered[k]) {
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "", kinds[k]);
        }
    if (*missing) fail_msg("the fixture has no %s case of kind %s", what, missing);
}

/* Appends "name (device)" to the list of failed cases (at most 12 are named). */
static inline void fx_note_failure(char *failed, size_t size, int *nfailed, const char *name,
                                   const fx_target *tg)
{
    if ((*nfailed)++ >= 12) return;
    size_t len = strlen(failed);
    snprintf(failed + len, size - len, "%s%s (%s)", len ? ", " : "", name, em_device_name(tg->dev));
}

static inline int fx_setup(void **state)
{
    (void)state;
    em_autodiff_init();
    g_cpu = em_device_open("cpu");
    if (!g_cpu) return -1;
    g_targets[0] = (fx_target){g_cpu, EM_F64, 1e-10};
    g_ntargets = 1;
    const char *only = getenv("EMBER_TEST_DEVICE");
    if (only && *only && strcmp(only, "cpu") != 0) {
        em_device *d = em_device_open(only);
        if (!d) {
            fprintf(stderr, "[torch] cannot open %s: %s\n", only, em_last_error());
            return -1;
        }
        g_targets[g_ntargets++] = (fx_target){d, EM_F32, 1e-4};
    }
    return 0;
}

static inline int fx_teardown(void **state)
{
    (void)state;
    for (int i = 1; i < g_ntargets; i++) em_device_close(g_targets[i].dev);
    em_device_close(g_cpu);
    g_ntargets = 0;
    return 0;
}

#endif
