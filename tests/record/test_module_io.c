/* test_module_io.c — saving and loading a module tree by name: a round trip into a fresh tree,
 * the file's names and dtypes, strict loading (the error lists the missing, unexpected and
 * mis-shaped names), lenient loading, a name mapping callback, dtype conversion on load, and that
 * a failed load leaves the module untouched. The trees are assembled here with em_module_new /
 * em_module_param / em_module_buffer / em_module_add (no layer of nn needed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/file.h"
#include "ember/record.h"
#include "tensor/tensor_util.h"

static char g_dir[512];
static em_device *g_cpu;

static int setup(void **state)
{
    (void)state;
    if (em_temp_dir("ember-mio", g_dir, sizeof g_dir) != EM_OK) return -1;
    g_cpu = em_device_open("cpu");
    return g_cpu ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_remove_tree(g_dir);
    em_device_close(g_cpu);
    return 0;
}

/* A tree: "fc.weight" [3, 2], "fc.bias" [3] (no decay), "scale" [1] and a buffer "steps" [2]
 * (f64), values base + position. With `extra`, one more parameter "fc.extra" [4]; with `wide`,
 * fc.weight is [3, 5] instead. */
static em_module *make_tree(em_scalar dt, double base, bool extra, bool wide)
{
    em_module *root = em_module_new("Root", g_cpu, sizeof(em_module));
    em_module *fc = em_module_new("Linear", g_cpu, sizeof(em_module));
    assert_non_null(root);
    assert_non_null(fc);
    double w[15], b[3], s[1], st[2];
    for (int i = 0; i < 15; i++) w[i] = base + i;
    for (int i = 0; i < 3; i++) b[i] = base - i;
    s[0] = base * 2;
    st[0] = base + 100, st[1] = base + 200;
    assert_non_null(em_module_param(
        fc, "weight", tu_tensor(g_cpu, dt, wide ? EM_SHAPE(3, 5) : EM_SHAPE(3, 2), w), true));
    assert_non_null(em_module_param(fc, "bias", tu_tensor(g_cpu, dt, EM_SHAPE(3), b), false));
    if (extra)
        assert_non_null(em_module_param(fc, "extra", em_zeros(g_cpu, dt, EM_SHAPE(4)), true));
    assert_non_null(em_module_add(root, "fc", fc));
    assert_non_null(em_module_param(root, "scale", tu_tensor(g_cpu, dt, EM_SHAPE(1), s), true));
    assert_non_null(em_module_buffer(root, "steps", tu_tensor(g_cpu, EM_F64, EM_SHAPE(2), st)));
    return root;
}

static void check_entry(em_module *m, const char *name, em_shape shape, const double *ref)
{
    em_module_entry *e = em_module_find(m, name);
    if (!e) fail_msg("no entry %s", name);
    tu_check(name, e->t, shape, ref, tu_tol(em_dtype(e->t)));
}

static void check_tree(em_module *m, double base)
{
    double w[6], b[3], s[1] = {base * 2}, st[2] = {base + 100, base + 200};
    for (int i = 0; i < 6; i++) w[i] = base + i;
    for (int i = 0; i < 3; i++) b[i] = base - i;
    check_entry(m, "fc.weight", EM_SHAPE(3, 2), w);
    check_entry(m, "fc.bias", EM_SHAPE(3), b);
    check_entry(m, "scale", EM_SHAPE(1), s);
    check_entry(m, "steps", EM_SHAPE(2), st);
}

static void path_of(const char *name, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", g_dir, name);
}

static void test_roundtrip(void **state)
{
    (void)state;
    char path[600];
    path_of("tree.safetensors", path, sizeof path);
    em_module *a = make_tree(EM_F32, 1.0, false, false);
    assert_int_equal(em_module_save(a, path), EM_OK);
    /* the file holds the full names and dtypes, in visit order */
    em_safetensors *f = em_safetensors_open(path);
    assert_non_null(f);
    assert_int_equal(em_safetensors_count(f), 4);
    const char *names[] = {"fc.weight", "fc.bias", "scale", "steps"};
    bool seen[4] = {false};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++)
            if (!strcmp(em_safetensors_name(f, i), names[k])) seen[k] = true;
    for (int k = 0; k < 4; k++) assert_true(seen[k]);
    em_scalar dt;
    assert_true(em_safetensors_info(f, "steps", &dt, NULL));
    assert_int_equal(dt, EM_F64);
    em_safetensors_close(f);

    em_module *b = make_tree(EM_F32, 50.0, false, false);
    em_tensor *w_before = em_module_find(b, "fc.weight")->t;
    assert_int_equal(em_module_load(b, path, true, NULL, NULL), EM_OK);
    assert_ptr_equal(em_module_find(b, "fc.weight")->t, w_before); /* loaded in place */
    check_tree(b, 1.0);
    em_module_free(a);
    em_module_free(b);
}

static void test_load_converts_dtype(void **state)
{
    (void)state;
    char path[600];
    path_of("f32.safetensors", path, sizeof path);
    em_module *a = make_tree(EM_F32, 0.25, false, false);
    assert_int_equal(em_module_save(a, path), EM_OK);
    static const em_scalar dts[] = {EM_F64, EM_F16, EM_BF16};
    for (int k = 0; k < 3; k++) {
        em_module *b = make_tree(dts[k], 9.0, false, false);
        if (em_module_load(b, path, true, NULL, NULL) != EM_OK)
            fail_msg("load into %s: %s", em_scalar_name(dts[k]), em_last_error());
        assert_int_equal(em_dtype(em_module_find(b, "fc.weight")->t), dts[k]);
        check_tree(b, 0.25);
        em_module_free(b);
    }
    em_module_free(a);
}

static void test_strict_errors(void **state)
{
    (void)state;
    char path[600];
    path_of("strict.safetensors", path, sizeof path);
    em_module *a = make_tree(EM_F32, 1.0, true, false); /* has fc.extra */
    assert_int_equal(em_module_save(a, path), EM_OK);
    em_module_free(a);

    /* file has fc.extra (unexpected here); fc.weight is [3, 2] in the file, [3, 5] here */
    em_module *b = make_tree(EM_F32, 5.0, false, true);
    assert_int_equal(em_module_param(b, "lost", em_zeros(g_cpu, EM_F32, EM_SHAPE(1)), true) != NULL,
                     1);
    assert_int_equal(em_module_load(b, path, true, NULL, NULL), EM_ERR_INVALID);
    const char *msg = em_last_error();
    fprintf(stderr, "message: %s\n", msg);
    assert_non_null(strstr(msg, "1 missing: lost"));
    assert_non_null(strstr(msg, "1 unexpected: fc.extra"));
    assert_non_null(strstr(msg, "1 mis-shaped: fc.weight (file [3, 2] vs model [3, 5])"));
    assert_non_null(strstr(msg, path));
    /* nothing was loaded: bias still holds 5, 4, 3 */
    check_entry(b, "fc.bias", EM_SHAPE(3), (double[]){5, 4, 3});

    /* lenient: mis-shaped still fails ... */
    assert_int_equal(em_module_load(b, path, false, NULL, NULL), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "mis-shaped: fc.weight"));
    em_module_free(b);
    /* ... missing and unexpected do not */
    em_module *c = make_tree(EM_F32, 5.0, false, false);
    em_module_param(c, "lost", em_zeros(g_cpu, EM_F32, EM_SHAPE(1)), true);
    assert_int_equal(em_module_load(c, path, true, NULL, NULL), EM_ERR_INVALID);
    assert_int_equal(em_module_load(c, path, false, NULL, NULL), EM_OK);
    check_tree(c, 1.0);
    em_module_free(c);
}

/* Drops a "transformer." prefix and skips "lm_head.*". */
static const char *strip_prefix(const char *file_name, char *buf, size_t size, void *user)
{
    int *calls = user;
    (*calls)++;
    if (!strncmp(file_name, "lm_head.", 8)) return NULL;
    const char *p = "transformer.";
    if (!strncmp(file_name, p, strlen(p))) {
        snprintf(buf, size, "%s", file_name + strlen(p));
        return buf;
    }
    return file_name;
}

static void test_name_mapping(void **state)
{
    (void)state;
    char path[600];
    path_of("hf.safetensors", path, sizeof path);
    /* a file with Hugging Face-style prefixed names, written tensor by tensor */
    em_safetensors_writer *w = em_safetensors_writer_new();
    double wv[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {7, 8, 9}, sv[1] = {10}, stv[2] = {11, 12};
    em_tensor *ts[5] = {
        tu_tensor(g_cpu, EM_F32, EM_SHAPE(3, 2), wv), tu_tensor(g_cpu, EM_F32, EM_SHAPE(3), bv),
        tu_tensor(g_cpu, EM_F32, EM_SHAPE(1), sv), tu_tensor(g_cpu, EM_F64, EM_SHAPE(2), stv),
        em_zeros(g_cpu, EM_F32, EM_SHAPE(7))};
    const char *names[5] = {"transformer.fc.weight", "transformer.fc.bias", "transformer.scale",
                            "steps", "lm_head.weight"};
    for (int i = 0; i < 5; i++) assert_int_equal(em_safetensors_add(w, names[i], ts[i]), EM_OK);
    assert_int_equal(em_safetensors_write(w, path), EM_OK);
    em_safetensors_writer_free(w);
    for (int i = 0; i < 5; i++) em_release(ts[i]);

    em_module *m = make_tree(EM_F32, 0.0, false, false);
    assert_int_equal(em_module_load(m, path, true, NULL, NULL), EM_ERR_INVALID);
    int calls = 0;
    if (em_module_load(m, path, true, strip_prefix, &calls) != EM_OK)
        fail_msg("mapped load: %s", em_last_error());
    assert_int_equal(calls, 5);
    check_entry(m, "fc.weight", EM_SHAPE(3, 2), wv);
    check_entry(m, "fc.bias", EM_SHAPE(3), bv);
    check_entry(m, "scale", EM_SHAPE(1), sv);
    check_entry(m, "steps", EM_SHAPE(2), stv);
    em_module_free(m);
}

/* A file tensor ember cannot hold (I8) fails the load before anything is copied. */
static void test_unsupported_dtype(void **state)
{
    (void)state;
    char path[600];
    path_of("i8.safetensors", path, sizeof path);
    const char *json = "{\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
                       "\"fc.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,36]},"
                       "\"steps\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[40,56]},"
                       "\"scale\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[36,37]}}";
    uint8_t file[8 + 512 + 56] = {0};
    size_t hl = strlen(json);
    for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(file + 8, json, hl);
    assert_int_equal(em_file_write_atomic(path, file, 8 + hl + 56), EM_OK);
    em_module *m = make_tree(EM_F32, 4.0, false, false);
    assert_int_equal(em_module_load(m, path, false, NULL, NULL), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "scale (dtype I8 not supported)"));
    check_tree(m, 4.0); /* untouched: the zeros of the file were not copied */
    em_module_free(m);
}

static void test_misuse(void **state)
{
    (void)state;
    em_module *m = make_tree(EM_F32, 0.0, false, false);
    char path[600];
    path_of("absent.safetensors", path, sizeof path);
    assert_int_equal(em_module_load(m, path, true, NULL, NULL), EM_ERR_NOT_FOUND);
    assert_int_equal(em_module_save(NULL, path), EM_ERR_INVALID);
    assert_int_equal(em_module_load(m, NULL, true, NULL, NULL), EM_ERR_INVALID);
    em_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),         cmocka_unit_test(test_load_converts_dtype),
        cmocka_unit_test(test_strict_errors),     cmocka_unit_test(test_name_mapping),
        cmocka_unit_test(test_unsupported_dtype), cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
