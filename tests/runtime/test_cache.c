/* test_cache.c — the kernel cache, in memory and on disk, across processes.
 *
 * Each test points $EMBER_CACHE_DIR at a fresh directory and reopens the device (closing it drops
 * the in-memory level). Tests that need another process start this binary again with a mode
 * argument (see main): "load" compiles the standard kernel set and must find all of it on disk
 * with zero compiler runs; "compile" compiles and checks it (two run at once); "slow" compiles
 * with a compiler that hangs, and is killed with SIGKILL. Compiler stand-ins are small shell
 * scripts. Counts come from em_cache_stats. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <time.h>
#include "runtime/rt_util.h"

/* ---- the standard kernel set: 3 singles and a batch of 4 -------------------------------------- */

#define SINGLES 3
#define BATCH 4

static double set_scale(int i) { return 1.5 + i; }

static void set_name(int i, char *out, size_t size) { snprintf(out, size, "axpb_%d", i); }

/* Compiles the set (singles one by one, then the batch at once) and runs every kernel. Returns 0
 * when all ran right. */
static int compile_and_run_set(em_device *dev)
{
    em_ir_kernel *ks[SINGLES + BATCH];
    em_kernel *out[SINGLES + BATCH];
    int rc = 0;
    for (int i = 0; i < SINGLES + BATCH; i++) {
        char name[32];
        set_name(i, name, sizeof(name));
        ks[i] = rt_kernel_axpb(name, set_scale(i));
    }
    for (int i = 0; i < SINGLES; i++)
        if (!(out[i] = em_kernel_compile(dev, ks[i]))) {
            fprintf(stderr, "compile %d: %s\n", i, em_last_error());
            rc = -1;
        }
    if (em_kernel_compile_batch(dev, (const em_ir_kernel *const *)ks + SINGLES, BATCH,
                                out + SINGLES) != EM_OK) {
        fprintf(stderr, "batch: %s\n", em_last_error());
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < SINGLES + BATCH; i++)
        rc = rt_run_axpb(dev, out[i], set_scale(i), 1000 + (uint32_t)i * 37);
    for (int i = 0; i < SINGLES + BATCH; i++)
        em_ir_kernel_free(ks[i]);
    return rc;
}

static em_cache_stats stats_now(void)
{
    em_cache_stats s;
    em_cache_stats_get(&s);
    return s;
}

/* ---- child processes ---------------------------------------------------------------------------- */

static int child_main(const char *mode)
{
    em_device *dev = em_device_open("cpu");
    if (!dev) {
        fprintf(stderr, "child: %s\n", em_last_error());
        return 10;
    }
    if (strcmp(mode, "slow") == 0) {
        em_ir_kernel *k = rt_kernel_axpb("axpb_0", set_scale(0));
        em_kernel_compile(dev, k); /* hangs in the compiler until killed */
        em_ir_kernel_free(k);
        em_device_close(dev);
        return 11;
    }
    int rc = compile_and_run_set(dev) == 0 ? 0 : 12;
    em_cache_stats s = stats_now();
    printf("child %s: memory_hits=%llu disk_hits=%llu compiles=%llu kernels_built=%llu\n", mode,
           (unsigned long long)s.memory_hits, (unsigned long long)s.disk_hits,
           (unsigned long long)s.compiles, (unsigned long long)s.kernels_built);
    if (rc == 0 && strcmp(mode, "load") == 0 &&
        (s.compiles != 0 || s.disk_hits != SINGLES + BATCH))
        rc = 13;
    em_device_close(dev);
    return rc;
}

static int run_child(const char *mode)
{
    const char *args[] = {"--child", mode, NULL};
    pid_t pid = rt_spawn_self(args, false);
    return pid > 0 ? rt_wait(pid) : -1;
}

/* ---- fixtures ----------------------------------------------------------------------------------- */

static char dir[1024];      /* this test's cache directory */
static char kernels[1100];  /* dir/kernels */

static void fresh_cache(const char *what)
{
    rt_fresh_dir(what, dir, sizeof(dir));
    assert_true(dir[0] != '\0');
    setenv("EMBER_CACHE_DIR", dir, 1);
    snprintf(kernels, sizeof(kernels), "%s/kernels", dir);
}

static int teardown(void **state)
{
    (void)state;
    unsetenv("EMBER_CC");
    unsetenv("EMBER_CFLAGS");
    if (dir[0])
        em_remove_tree(dir);
    dir[0] = '\0';
    return 0;
}

/* ---- tests -------------------------------------------------------------------------------------- */

static void test_second_process_hits_disk(void **state)
{
    (void)state;
    fresh_cache("cache-disk");
    em_cache_stats s0 = stats_now();
    em_device *dev = em_device_open("cpu");
    assert_int_equal(compile_and_run_set(dev), 0);
    em_cache_stats s1 = stats_now();
    assert_int_equal(s1.compiles - s0.compiles, SINGLES + 1); /* the batch is one run */
    assert_int_equal(s1.kernels_built - s0.kernels_built, SINGLES + BATCH);
    assert_int_equal(s1.disk_hits - s0.disk_hits, 0);
    assert_string_equal(em_cache_dir(), dir);
    /* the same kernels again: memory */
    assert_int_equal(compile_and_run_set(dev), 0);
    em_cache_stats s2 = stats_now();
    assert_int_equal(s2.memory_hits - s1.memory_hits, SINGLES + BATCH);
    assert_int_equal(s2.compiles, s1.compiles);
    em_device_close(dev);
    assert_int_equal(rt_count_files(kernels, ".idx"), SINGLES + BATCH);
    assert_int_equal(rt_count_files(kernels, ".so"), SINGLES + 1);
    /* another process: everything from disk, no compiler run (checked in the child) */
    assert_int_equal(run_child("load"), 0);
    /* this process after a reopen: disk as well */
    dev = em_device_open("cpu");
    assert_int_equal(compile_and_run_set(dev), 0);
    em_cache_stats s3 = stats_now();
    assert_int_equal(s3.disk_hits - s2.disk_hits, SINGLES + BATCH);
    assert_int_equal(s3.compiles, s2.compiles);
    em_device_close(dev);
}

static void test_batch_is_one_compiler_run(void **state)
{
    (void)state;
    fresh_cache("cache-batch");
    em_device *dev = em_device_open("cpu");
    em_ir_kernel *ks[8];
    em_kernel *out[8];
    for (int i = 0; i < 8; i++) {
        char name[32];
        snprintf(name, sizeof(name), "batch8_%d", i);
        ks[i] = rt_kernel_axpb(name, 0.25 * i);
    }
    em_cache_stats s0 = stats_now();
    assert_int_equal(em_kernel_compile_batch(dev, (const em_ir_kernel *const *)ks, 8, out), EM_OK);
    em_cache_stats s1 = stats_now();
    assert_int_equal(s1.compiles - s0.compiles, 1);
    assert_int_equal(s1.kernels_built - s0.kernels_built, 8);
    for (int i = 0; i < 8; i++) {
        assert_non_null(out[i]);
        assert_string_equal(em_kernel_name(out[i]), em_ir_kernel_name(ks[i]));
        assert_int_equal(rt_run_axpb(dev, out[i], 0.25 * i, 300), 0);
    }
    assert_int_equal(rt_count_files(kernels, ".so"), 1);
    assert_int_equal(rt_count_files(kernels, ".idx"), 8);
    em_device_close(dev);
    /* each kernel is found by its own key, alone */
    dev = em_device_open("cpu");
    for (int i = 7; i >= 0; i--) {
        em_kernel *k = em_kernel_compile(dev, ks[i]);
        assert_non_null(k);
        assert_int_equal(rt_run_axpb(dev, k, 0.25 * i, 100), 0);
    }
    em_cache_stats s2 = stats_now();
    assert_int_equal(s2.disk_hits - s1.disk_hits, 8);
    assert_int_equal(s2.compiles, s1.compiles);
    em_device_close(dev);
    for (int i = 0; i < 8; i++)
        em_ir_kernel_free(ks[i]);
}

static void test_batch_duplicates(void **state)
{
    (void)state;
    fresh_cache("cache-dup");
    em_device *dev = em_device_open("cpu");
    /* two different kernels of one name cannot share a binary: two runs; the same kernel twice
     * is built once */
    em_ir_kernel *ks[4] = {rt_kernel_axpb("dup", 2.0), rt_kernel_axpb("dup", 3.0),
                           rt_kernel_axpb("other", 4.0), rt_kernel_axpb("dup", 2.0)};
    em_kernel *out[4];
    em_cache_stats s0 = stats_now();
    assert_int_equal(em_kernel_compile_batch(dev, (const em_ir_kernel *const *)ks, 4, out), EM_OK);
    em_cache_stats s1 = stats_now();
    assert_int_equal(s1.compiles - s0.compiles, 2);
    assert_int_equal(s1.kernels_built - s0.kernels_built, 3);
    assert_ptr_equal(out[0], out[3]);
    assert_ptr_not_equal(out[0], out[1]);
    assert_int_equal(rt_run_axpb(dev, out[0], 2.0, 77), 0);
    assert_int_equal(rt_run_axpb(dev, out[1], 3.0, 77), 0);
    assert_int_equal(rt_run_axpb(dev, out[2], 4.0, 77), 0);
    /* an empty batch, and a NULL kernel */
    assert_int_equal(em_kernel_compile_batch(dev, NULL, 0, NULL), EM_OK);
    const em_ir_kernel *bad[2] = {ks[0], NULL};
    assert_int_equal(em_kernel_compile_batch(dev, bad, 2, out), EM_ERR_INVALID);
    assert_null(out[0]);
    em_device_close(dev);
    for (int i = 0; i < 4; i++)
        em_ir_kernel_free(ks[i]);
}

static void test_concurrent_processes(void **state)
{
    (void)state;
    fresh_cache("cache-race");
    /* a compiler that waits a little, so both processes are compiling at once */
    char cc[1200];
    snprintf(cc, sizeof(cc), "%s/slowish-cc", dir);
    rt_write_script(cc, "#!/bin/sh\n"
                        "case \"$1\" in --version) exec cc --version;; esac\n"
                        "sleep 0.3\nexec cc \"$@\"\n");
    setenv("EMBER_CC", cc, 1);
    const char *args[] = {"--child", "compile", NULL};
    pid_t a = rt_spawn_self(args, false), b = rt_spawn_self(args, false);
    assert_true(a > 0 && b > 0);
    assert_int_equal(rt_wait(a), 0);
    assert_int_equal(rt_wait(b), 0);
    /* the cache they left is whole: a third process finds everything on disk */
    assert_int_equal(run_child("load"), 0);
    assert_int_equal(rt_count_files(kernels, ".idx"), SINGLES + BATCH);
}

static bool wait_for_file(const char *path, double seconds)
{
    for (double t = 0; t < seconds; t += 0.02) {
        if (access(path, F_OK) == 0)
            return true;
        usleep(20000);
    }
    return false;
}

static void test_killed_compile_leaves_no_entry(void **state)
{
    (void)state;
    fresh_cache("cache-kill");
    /* While DIR/slow exists the compiler writes half an output file, says so, and hangs;
     * without it, it is the real compiler. Its identity is the same in both modes. */
    char cc[1200], slow[1200], started[1200], script[4096];
    snprintf(cc, sizeof(cc), "%s/hang-cc", dir);
    snprintf(slow, sizeof(slow), "%s/slow", dir);
    snprintf(started, sizeof(started), "%s/started", dir);
    snprintf(script, sizeof(script),
             "#!/bin/sh\n"
             "case \"$1\" in --version) exec cc --version;; esac\n"
             "if [ -e '%s' ]; then\n"
             "  out=; prev=\n"
             "  for a in \"$@\"; do [ \"$prev\" = -o ] && out=$a; prev=$a; done\n"
             "  printf '\\177ELF-half-written' > \"$out\"\n"
             "  touch '%s'\n"
             "  sleep 60\n"
             "fi\n"
             "exec cc \"$@\"\n",
             slow, started);
    rt_write_script(cc, script);
    rt_write_script(slow, "");
    setenv("EMBER_CC", cc, 1);
    const char *args[] = {"--child", "slow", NULL};
    pid_t pid = rt_spawn_self(args, true);
    assert_true(pid > 0);
    bool began = wait_for_file(started, 30);
    kill(-pid, SIGKILL); /* the child and its compiler */
    assert_int_equal(rt_wait(pid), 128 + SIGKILL);
    assert_true(began);
    /* nothing half-made is visible as a cache entry */
    assert_int_equal(rt_count_files(kernels, ".idx"), 0);
    assert_int_equal(rt_count_files(kernels, ".so"), 0);
    char tmp[1200];
    snprintf(tmp, sizeof(tmp), "%s/tmp", dir);
    assert_true(rt_count_files(tmp, ".so") >= 1); /* its temp output is still there... */
    /* ...until a process opens the directory: the same kernel then compiles normally */
    unlink(slow);
    em_device *dev = em_device_open("cpu");
    em_ir_kernel *k = rt_kernel_axpb("axpb_0", set_scale(0));
    em_cache_stats s0 = stats_now();
    em_kernel *kern = em_kernel_compile(dev, k);
    assert_non_null(kern);
    em_cache_stats s1 = stats_now();
    assert_int_equal(s1.compiles - s0.compiles, 1);
    assert_int_equal(rt_run_axpb(dev, kern, set_scale(0), 500), 0);
    assert_int_equal(rt_count_files(tmp, ".so"), 0); /* the dead process's temp files are gone */
    assert_int_equal(rt_count_files(kernels, ".idx"), 1);
    em_device_close(dev);
    em_ir_kernel_free(k);
}

/* Compiles axpb_0 on a fresh device and checks it: returns the stats difference. */
static em_cache_stats compile_fresh(double scale)
{
    em_cache_stats s0 = stats_now();
    em_device *dev = em_device_open("cpu");
    em_ir_kernel *k = rt_kernel_axpb("axpb_0", scale);
    em_kernel *kern = em_kernel_compile(dev, k);
    if (!kern)
        fail_msg("compile: %s", em_last_error());
    assert_int_equal(rt_run_axpb(dev, kern, scale, 1000), 0);
    em_device_close(dev);
    em_ir_kernel_free(k);
    em_cache_stats s1 = stats_now();
    return (em_cache_stats){s1.memory_hits - s0.memory_hits, s1.disk_hits - s0.disk_hits,
                            s1.compiles - s0.compiles, s1.kernels_built - s0.kernels_built};
}

/* The one file in kernels/ ending in suffix. */
static void find_entry(const char *suffix, char *out, size_t size)
{
    out[0] = '\0';
    DIR *d = opendir(kernels);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name), m = strlen(suffix);
        if (n > m && strcmp(e->d_name + n - m, suffix) == 0)
            snprintf(out, size, "%s/%s", kernels, e->d_name);
    }
    closedir(d);
    assert_true(out[0] != '\0');
}

static void test_corrupt_entries_are_rebuilt(void **state)
{
    (void)state;
    fresh_cache("cache-corrupt");
    em_cache_stats d = compile_fresh(2.5);
    assert_int_equal(d.compiles, 1);
    d = compile_fresh(2.5);
    assert_int_equal(d.disk_hits, 1);
    assert_int_equal(d.compiles, 0);

    char so[2048], idx[2048];
    em_log_set_level(EM_LOG_ERROR); /* the warnings about broken entries are expected */
    /* 1. a truncated binary */
    find_entry(".so", so, sizeof(so));
    struct stat st;
    assert_int_equal(stat(so, &st), 0);
    assert_int_equal(truncate(so, st.st_size / 2), 0);
    d = compile_fresh(2.5);
    assert_int_equal(d.disk_hits, 0);
    assert_int_equal(d.compiles, 1);
    d = compile_fresh(2.5); /* healthy again */
    assert_int_equal(d.disk_hits, 1);
    /* 2. bytes changed in the middle, size unchanged */
    find_entry(".so", so, sizeof(so));
    FILE *f = fopen(so, "r+b");
    assert_non_null(f);
    fseek(f, 200, SEEK_SET);
    fwrite("\xde\xad\xbe\xef", 1, 4, f);
    fclose(f);
    d = compile_fresh(2.5);
    assert_int_equal(d.disk_hits, 0);
    assert_int_equal(d.compiles, 1);
    /* 3. garbage in the index entry */
    find_entry(".idx", idx, sizeof(idx));
    rt_write_script(idx, "not an index\n");
    d = compile_fresh(2.5);
    assert_int_equal(d.compiles, 1);
    /* 4. the binary deleted */
    find_entry(".so", so, sizeof(so));
    unlink(so);
    d = compile_fresh(2.5);
    assert_int_equal(d.compiles, 1);
    /* 5. an index pointing outside the cache */
    find_entry(".idx", idx, sizeof(idx));
    rt_write_script(idx, "ember-kernel-index 1\nbinary ../../../etc/passwd\nname axpb_0\n"
                         "size 10\nhash 00000000000000000000000000000000\n");
    d = compile_fresh(2.5);
    assert_int_equal(d.compiles, 1);
    d = compile_fresh(2.5);
    assert_int_equal(d.disk_hits, 1);
    /* builds are deterministic and corrupt binaries are deleted: no stray binaries pile up */
    assert_int_equal(rt_count_files(kernels, ".so"), 1);
    em_log_set_level(EM_LOG_WARN);
}

static void test_unwritable_dir_falls_back(void **state)
{
    (void)state;
    fresh_cache("cache-ro");
    /* a path below a regular file cannot be created, even by root */
    char file[1200], bad[1300];
    snprintf(file, sizeof(file), "%s/a-file", dir);
    rt_write_script(file, "");
    snprintf(bad, sizeof(bad), "%s/cache", file);
    setenv("EMBER_CACHE_DIR", bad, 1);
    em_log_set_level(EM_LOG_WARN);
    rt_capture cap;
    rt_stderr_begin(&cap);
    const char *used = em_cache_dir();
    char *err = rt_stderr_end(&cap);
    assert_non_null(used);
    assert_string_not_equal(used, bad);
    if (!strstr(err, "not writable") || !strstr(err, bad))
        fail_msg("expected a warning naming %s, got: %s", bad, err);
    free(err);
    /* and kernels still compile and run, cached in the fallback */
    em_cache_stats d = compile_fresh(7.0);
    assert_int_equal(d.compiles + d.disk_hits, 1);
    assert_ptr_equal(em_cache_dir(), used);
}

static void test_missing_compiler(void **state)
{
    (void)state;
    fresh_cache("cache-nocc");
    setenv("EMBER_CC", "/nonexistent/ember-cc", 1);
    em_device *dev = em_device_open("cpu");
    em_ir_kernel *k = rt_kernel_axpb("axpb_nocc", 1.0);
    em_clear_error();
    assert_null(em_kernel_compile(dev, k));
    assert_int_equal(em_last_status(), EM_ERR_COMPILE);
    if (!strstr(em_last_error(), "/nonexistent/ember-cc") || !strstr(em_last_error(), "EMBER_CC"))
        fail_msg("message does not name the compiler: %s", em_last_error());
    em_device_close(dev);
    em_ir_kernel_free(k);
    assert_int_equal(rt_count_files(kernels, ".idx"), 0);
}

static void test_failing_compiler_shows_output(void **state)
{
    (void)state;
    fresh_cache("cache-badcc");
    char cc[1200];
    snprintf(cc, sizeof(cc), "%s/bad-cc", dir);
    rt_write_script(cc, "#!/bin/sh\n"
                        "case \"$1\" in --version) echo 'bad-cc 1.0'; exit 0;; esac\n"
                        "echo 'bad-cc: synthetic failure: boom' >&2\nexit 3\n");
    setenv("EMBER_CC", cc, 1);
    em_device *dev = em_device_open("cpu");
    em_ir_kernel *k = rt_kernel_axpb("axpb_badcc", 1.0);
    assert_null(em_kernel_compile(dev, k));
    assert_int_equal(em_last_status(), EM_ERR_COMPILE);
    const char *msg = em_last_error();
    if (!strstr(msg, "synthetic failure: boom") || !strstr(msg, "exited with status 3") ||
        !strstr(msg, "bad-cc"))
        fail_msg("message lacks the compiler's name, status or output: %s", msg);
    /* a real compiler given a bad flag: its own complaint is shown */
    unsetenv("EMBER_CC");
    setenv("EMBER_CFLAGS", "-O2 -fno-such-flag-for-ember", 1);
    assert_null(em_kernel_compile(dev, k));
    assert_int_equal(em_last_status(), EM_ERR_COMPILE);
    if (!strstr(em_last_error(), "no-such-flag-for-ember"))
        fail_msg("message lacks the compiler's output: %s", em_last_error());
    /* back to normal: it compiles (nothing broken was cached) */
    unsetenv("EMBER_CFLAGS");
    em_kernel *kern = em_kernel_compile(dev, k);
    assert_non_null(kern);
    assert_int_equal(rt_run_axpb(dev, kern, 1.0, 10), 0);
    em_device_close(dev);
    em_ir_kernel_free(k);
}

static void test_invalid_ir_and_source(void **state)
{
    (void)state;
    fresh_cache("cache-ir");
    em_device *dev = em_device_open("cpu");
    /* a store of an f64 into an f32 buffer: the verifier names the instruction */
    em_ir_kernel *bad = em_ir_kernel_new("bad_kernel");
    em_ir_mem out = em_ir_param_buffer(bad, "out", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_store(bad, out, em_ir_builtin(bad, EM_ABSOLUTE_POS),
                em_ir_const_float(bad, em_ty(EM_F64), 1.0));
    em_cache_stats s0 = stats_now();
    assert_null(em_kernel_compile(dev, bad));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "bad_kernel"));
    assert_int_equal(stats_now().compiles, s0.compiles);
    assert_null(em_kernel_source(bad, "c"));
    assert_null(em_kernel_compile(NULL, bad));
    assert_null(em_kernel_compile(dev, NULL));

    em_ir_kernel *k = rt_kernel_axpb("axpb_src", 1.0);
    char *src = em_kernel_source(k, "c");
    assert_non_null(src);
    assert_non_null(strstr(src, "emk_axpb_src"));
    free(src);
    assert_null(em_kernel_source(k, "no-such-target"));
    assert_int_not_equal(em_last_status(), EM_OK);
    em_device_close(dev);
    em_ir_kernel_free(bad);
    em_ir_kernel_free(k);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_second_process_hits_disk, teardown),
        cmocka_unit_test_teardown(test_batch_is_one_compiler_run, teardown),
        cmocka_unit_test_teardown(test_batch_duplicates, teardown),
        cmocka_unit_test_teardown(test_concurrent_processes, teardown),
        cmocka_unit_test_teardown(test_killed_compile_leaves_no_entry, teardown),
        cmocka_unit_test_teardown(test_corrupt_entries_are_rebuilt, teardown),
        cmocka_unit_test_teardown(test_unwritable_dir_falls_back, teardown),
        cmocka_unit_test_teardown(test_missing_compiler, teardown),
        cmocka_unit_test_teardown(test_failing_compiler_shows_output, teardown),
        cmocka_unit_test_teardown(test_invalid_ir_and_source, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
