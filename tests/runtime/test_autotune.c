/* test_autotune.c — the autotune cache (runtime/autotune.c): EMBER_AUTOTUNE modes; store and
 * lookup in memory and from disk (after forgetting the memory, as a new process would); keys kept
 * apart per op, key and device; overwrite; a value that is not one line refused; a corrupt or
 * foreign entry reads as a miss; concurrent writers (threads) never leave a torn entry. Then the
 * matmul's use of it: with EMBER_AUTOTUNE=on a first matmul of a shape benchmarks the candidates
 * and stores a winner that a second process-equivalent lookup finds, and the result is right. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/file.h"
#include "ember/tensor.h"

static char g_dir[512];
static em_device *g_cpu;

static int setup(void **state)
{
    (void)state;
    if (em_temp_dir("ember-autotune", g_dir, sizeof g_dir) != EM_OK) return -1;
    setenv("EMBER_CACHE_DIR", g_dir, 1);
    g_cpu = em_device_open("cpu");
    return g_cpu ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(g_cpu);
    em_autotune_forget_memory();
    em_remove_tree(g_dir);
    return 0;
}

static void test_modes(void **state)
{
    (void)state;
    setenv("EMBER_AUTOTUNE", "off", 1);
    assert_int_equal(em_autotune_get_mode(), EM_AUTOTUNE_OFF);
    setenv("EMBER_AUTOTUNE", "full", 1);
    assert_int_equal(em_autotune_get_mode(), EM_AUTOTUNE_FULL);
    setenv("EMBER_AUTOTUNE", "on", 1);
    assert_int_equal(em_autotune_get_mode(), EM_AUTOTUNE_ON);
    unsetenv("EMBER_AUTOTUNE");
    assert_int_equal(em_autotune_get_mode(), EM_AUTOTUNE_ON);
}

static int count_entries(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/autotune", g_dir);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void test_store_lookup(void **state)
{
    (void)state;
    char v[64];
    assert_false(em_autotune_lookup(g_cpu, "op", "k1", v, sizeof v));
    assert_int_equal(em_autotune_store(g_cpu, "op", "k1", "config A"), EM_OK);
    assert_int_equal(em_autotune_store(g_cpu, "op", "k2", "config B"), EM_OK);
    assert_int_equal(em_autotune_store(g_cpu, "other", "k1", "config C"), EM_OK);
    assert_true(em_autotune_lookup(g_cpu, "op", "k1", v, sizeof v));
    assert_string_equal(v, "config A");
    /* from disk, as another process would see it */
    em_autotune_forget_memory();
    assert_true(em_autotune_lookup(g_cpu, "op", "k1", v, sizeof v));
    assert_string_equal(v, "config A");
    assert_true(em_autotune_lookup(g_cpu, "op", "k2", v, sizeof v));
    assert_string_equal(v, "config B");
    assert_true(em_autotune_lookup(g_cpu, "other", "k1", v, sizeof v));
    assert_string_equal(v, "config C");
    assert_int_equal(count_entries(), 3);
    /* overwrite */
    assert_int_equal(em_autotune_store(g_cpu, "op", "k1", "config D"), EM_OK);
    em_autotune_forget_memory();
    assert_true(em_autotune_lookup(g_cpu, "op", "k1", v, sizeof v));
    assert_string_equal(v, "config D");
    /* too small a buffer is a miss, not a truncation */
    char tiny[4];
    assert_false(em_autotune_lookup(g_cpu, "op", "k1", tiny, sizeof tiny));
    /* bad values */
    assert_int_not_equal(em_autotune_store(g_cpu, "op", "k3", "two\nlines"), EM_OK);
    assert_non_null(strstr(em_last_error(), "one-line value"));
    assert_int_not_equal(em_autotune_store(g_cpu, "op", "k3", ""), EM_OK);
    assert_false(em_autotune_lookup(g_cpu, "op", "k3", v, sizeof v));
}

/* Every entry file rewritten with a different key reads as a miss (a hash collision or a foreign
 * file never gives a wrong configuration). */
static void test_foreign_entry(void **state)
{
    (void)state;
    char v[64];
    assert_int_equal(em_autotune_store(g_cpu, "op", "kx", "config X"), EM_OK);
    char path[600];
    snprintf(path, sizeof path, "%s/autotune", g_dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char f[1200];
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        assert_int_equal(em_file_write_atomic(f, "garbage\nvalue\n", 14), EM_OK);
    }
    closedir(d);
    em_autotune_forget_memory();
    assert_false(em_autotune_lookup(g_cpu, "op", "kx", v, sizeof v));
    assert_false(em_autotune_lookup(g_cpu, "op", "k1", v, sizeof v));
}

static void *writer(void *arg)
{
    const char *val = arg;
    for (int i = 0; i < 50; i++)
        if (em_autotune_store(g_cpu, "race", "key", val) != EM_OK) return (void *)1;
    return NULL;
}

static void test_concurrent_writers(void **state)
{
    (void)state;
    pthread_t t[4];
    static const char *vals[] = {"value one", "value two", "value three", "value four"};
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, writer, (void *)vals[i]);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        assert_null(r);
    }
    em_autotune_forget_memory();
    char v[64];
    assert_true(em_autotune_lookup(g_cpu, "race", "key", v, sizeof v));
    bool known = false;
    for (int i = 0; i < 4; i++) known |= !strcmp(v, vals[i]);
    assert_true(known);
}

/* The matmul tunes once per shape bucket and finds its winner again. */
static void test_matmul_tunes(void **state)
{
    (void)state;
    setenv("EMBER_AUTOTUNE", "on", 1);
    setenv("EMBER_AUTOTUNE_MIN_WORK", "1", 1); /* tune even this small shape */
    int before = count_entries();
    em_scope_begin();
    em_rng rng = em_rng_new(3);
    em_tensor *a = em_rand(g_cpu, EM_F32, EM_SHAPE(40, 48), &rng);
    em_tensor *b = em_rand(g_cpu, EM_F32, EM_SHAPE(48, 36), &rng);
    em_tensor *y = em_matmul(a, b);
    assert_non_null(y);
    /* with fusion on the matmul is pending (docs/fusion.md): it chooses its kernel when it runs */
    assert_int_equal(em_realize(y), EM_OK);
    assert_int_equal(count_entries(), before + 1);
    float ha[40 * 48], hb[48 * 36], hy[40 * 36];
    assert_int_equal(em_to_host(a, ha, sizeof ha), EM_OK);
    assert_int_equal(em_to_host(b, hb, sizeof hb), EM_OK);
    assert_int_equal(em_to_host(y, hy, sizeof hy), EM_OK);
    for (int m = 0; m < 40; m++)
        for (int n = 0; n < 36; n++) {
            double s = 0;
            for (int k = 0; k < 48; k++) s += (double)ha[m * 48 + k] * hb[k * 36 + n];
            assert_true(fabs(s - hy[m * 36 + n]) < 1e-4 * (1 + fabs(s)));
        }
    /* a nearby shape (same bucket: 36 and 40 rows go to 40) reuses the entry */
    em_autotune_forget_memory();
    em_tensor *y2 = em_matmul(em_rand(g_cpu, EM_F32, EM_SHAPE(36, 48), &rng), b);
    assert_non_null(y2);
    assert_int_equal(em_realize(y2), EM_OK);
    assert_int_equal(count_entries(), before + 1);
    em_scope_end(NULL, 0);
    unsetenv("EMBER_AUTOTUNE_MIN_WORK");
}

/* A candidate whose result is wrong is never picked, however fast: with EMBER_AUTOTUNE_FAULT=zero
 * every candidate but the heuristic writes zeros instead of computing (faster than any matmul);
 * each is left out with a warning naming it, and the result is right. */
static void test_matmul_check_rejects_wrong_results(void **state)
{
    (void)state;
    setenv("EMBER_AUTOTUNE", "on", 1);
    setenv("EMBER_AUTOTUNE_MIN_WORK", "1", 1);
    setenv("EMBER_AUTOTUNE_FAULT", "zero", 1);
    char log[600];
    snprintf(log, sizeof log, "%s/stderr.txt", g_dir);
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    int before = count_entries();
    em_scope_begin();
    em_rng rng = em_rng_new(9);
    enum { M = 100, N = 130, K = 70 };
    em_tensor *a = em_rand(g_cpu, EM_F32, EM_SHAPE(M, K), &rng);
    em_tensor *b = em_rand(g_cpu, EM_F32, EM_SHAPE(K, N), &rng);
    em_tensor *y = em_matmul(a, b);
    em_status st = y ? em_realize(y) : EM_ERR_INTERNAL;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    unsetenv("EMBER_AUTOTUNE_FAULT");
    unsetenv("EMBER_AUTOTUNE_MIN_WORK");
    assert_int_equal(st, EM_OK);
    assert_int_equal(count_entries(), before + 1);
    static float ha[M * K], hb[K * N], hy[M * N];
    assert_int_equal(em_to_host(a, ha, sizeof ha), EM_OK);
    assert_int_equal(em_to_host(b, hb, sizeof hb), EM_OK);
    assert_int_equal(em_to_host(y, hy, sizeof hy), EM_OK);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)ha[m * K + k] * hb[k * N + n];
            assert_true(fabs(s - hy[m * N + n]) < 1e-4 * (1 + fabs(s)));
        }
    em_scope_end(NULL, 0);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[1024];
    int left = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "matmul 100x130x70") && strstr(line, "left out") && strstr(line, "is 0 where"))
            left++;
    fclose(f);
    if (left < 1) fail_msg("no candidate was left out for its zeros");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),         cmocka_unit_test(test_store_lookup),
        cmocka_unit_test(test_foreign_entry), cmocka_unit_test(test_concurrent_writers),
        cmocka_unit_test(test_matmul_tunes),
        cmocka_unit_test(test_matmul_check_rejects_wrong_results),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
