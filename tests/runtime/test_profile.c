/* test_profile.c — the launch profiler (src/runtime/profile.c) on the CPU: launches counted per
 * kernel name with host and device time, failed launches and launches while it is off not
 * counted, allocations / copies / syncs counted, reset, the report (rows sorted by device time,
 * totals, counts), and EMBER_PROFILE=1 printing the report at exit in a child process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/rt_util.h"

static em_device *dev;
static char cache_dir[1024];
static em_kernel *small_k, *big_k;

enum { SMALL_N = 64, BIG_N = 1 << 21 };

static int setup(void **state)
{
    (void)state;
    rt_fresh_dir("profile", cache_dir, sizeof(cache_dir));
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
    dev = em_device_open("cpu");
    if (!dev) return -1;
    em_ir_kernel *a = rt_kernel_axpb("prof_small", 2.0), *b = rt_kernel_axpb("prof_big", 3.0);
    small_k = em_kernel_compile(dev, a);
    big_k = em_kernel_compile(dev, b);
    em_ir_kernel_free(a);
    em_ir_kernel_free(b);
    return small_k && big_k ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_profile_enable(false);
    em_device_close(dev);
    em_remove_tree(cache_dir);
    return 0;
}

/* Launches kern over three buffers of n floats (allocated by the caller). */
static em_status launch_n(em_kernel *kern, em_buffer *const bufs[3], uint32_t n)
{
    em_arg args[3] = {em_arg_buffer(bufs[0], n), em_arg_buffer(bufs[1], n),
                      em_arg_buffer(bufs[2], n)};
    uint32_t dim[3] = {64, 1, 1}, count[3] = {(n + 63) / 64, 1, 1};
    return em_launch(kern, count, dim, args, 3);
}

static void alloc3(em_buffer *bufs[3], uint32_t n)
{
    for (int i = 0; i < 3; i++) {
        bufs[i] = em_buffer_alloc(dev, (size_t)n * sizeof(float));
        assert_non_null(bufs[i]);
    }
}

static void free3(em_buffer *bufs[3])
{
    for (int i = 0; i < 3; i++) em_buffer_free(bufs[i]);
}

static void test_counts(void **state)
{
    (void)state;
    em_buffer *s[3], *b[3];
    alloc3(s, SMALL_N); /* before profiling: not counted */
    em_profile_reset();
    em_profile_enable(true);
    assert_true(em_profile_enabled());
    alloc3(b, BIG_N);
    for (int i = 0; i < 5; i++) assert_int_equal(launch_n(small_k, s, SMALL_N), EM_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(launch_n(big_k, b, BIG_N), EM_OK);
    /* a failed launch (too few arguments) is not counted */
    uint32_t dim[3] = {64, 1, 1}, count[3] = {1, 1, 1};
    assert_int_not_equal(em_launch(small_k, count, dim, NULL, 0), EM_OK);
    float host[SMALL_N] = {0};
    assert_int_equal(em_buffer_write(s[0], 0, host, sizeof host), EM_OK);
    assert_int_equal(em_buffer_read(s[2], 0, host, sizeof host), EM_OK);
    assert_int_equal(em_buffer_read(s[2], 0, host, 16), EM_OK);
    assert_int_equal(em_buffer_copy(s[1], 0, s[0], 0, 128), EM_OK);
    assert_int_equal(em_device_sync(dev), EM_OK);
    assert_int_equal(em_device_sync(dev), EM_OK);
    free3(b);

    em_profile_counts c;
    em_profile_get(&c);
    assert_int_equal(c.launches, 8);
    assert_int_equal(c.kernels, 2);
    assert_int_equal(c.allocs, 3);
    assert_int_equal(c.frees, 3);
    assert_int_equal(c.writes, 1);
    assert_int_equal(c.write_bytes, sizeof host);
    assert_int_equal(c.reads, 2);
    assert_int_equal(c.read_bytes, sizeof host + 16);
    assert_int_equal(c.copies, 1);
    assert_int_equal(c.copy_bytes, 128);
    assert_int_equal(c.syncs, 2);
    assert_true(c.launch_host_s > 0 && c.launch_device_s >= c.launch_host_s);
    assert_true(c.wall_s >= c.launch_device_s);

    em_profile_kernel ks, kb;
    assert_true(em_profile_kernel_get("prof_small", &ks));
    assert_true(em_profile_kernel_get("prof_big", &kb));
    assert_int_equal(ks.launches, 5);
    assert_int_equal(kb.launches, 3);
    assert_true(ks.host_s > 0 && ks.device_s > 0);
    /* three passes over 2^21 floats take longer than five over 64 */
    assert_true(kb.device_s > ks.device_s);
    assert_true(fabs(ks.host_s + kb.host_s - c.launch_host_s) < 1e-9);
    assert_false(em_profile_kernel_get("no_such_kernel", &ks));
    assert_int_equal(ks.launches, 0);

    /* off: nothing more is counted */
    em_profile_enable(false);
    assert_int_equal(launch_n(small_k, s, SMALL_N), EM_OK);
    em_buffer_free(em_buffer_alloc(dev, 64));
    em_profile_counts c2;
    em_profile_get(&c2);
    assert_int_equal(c2.launches, 8);
    assert_int_equal(c2.allocs, 3);

    /* reset forgets everything */
    em_profile_reset();
    em_profile_get(&c2);
    assert_int_equal(c2.launches, 0);
    assert_int_equal(c2.kernels, 0);
    assert_int_equal(c2.reads, 0);
    assert_false(em_profile_kernel_get("prof_small", &ks));
    free3(s);
}

static void test_report(void **state)
{
    (void)state;
    em_buffer *s[3], *b[3];
    alloc3(s, SMALL_N);
    alloc3(b, BIG_N);
    em_profile_reset();
    em_profile_enable(true);
    for (int i = 0; i < 4; i++) assert_int_equal(launch_n(small_k, s, SMALL_N), EM_OK);
    for (int i = 0; i < 2; i++) assert_int_equal(launch_n(big_k, b, BIG_N), EM_OK);
    em_profile_enable(false);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    em_profile_report(out);
    fclose(out);
    const char *big = strstr(text, "\nprof_big "), *small = strstr(text, "\nprof_small ");
    const char *total = strstr(text, "\ntotal ");
    if (!big || !small || !total || !(big < small && small < total))
        fail_msg("rows missing or out of order:\n%s", text);
    unsigned long long n = 0;
    assert_int_equal(sscanf(small + 1, "prof_small %llu", &n), 1);
    assert_int_equal(n, 4);
    assert_int_equal(sscanf(big + 1, "prof_big %llu", &n), 1);
    assert_int_equal(n, 2);
    assert_int_equal(sscanf(total + 1, "total %llu", &n), 1);
    assert_int_equal(n, 6);
    assert_non_null(strstr(text, "6 launches of 2 kernels"));
    assert_non_null(strstr(text, "buffers: 0 allocs")); /* made before the reset */
    free(text);
    free3(s);
    free3(b);
}

/* The child: EMBER_PROFILE is set; three launches, no report of its own. */
static int child_main(void)
{
    em_device *d = em_device_open("cpu");
    if (!d) return 10;
    em_ir_kernel *k = rt_kernel_axpb("prof_child", 5.0);
    em_kernel *kern = em_kernel_compile(d, k);
    em_ir_kernel_free(k);
    if (!kern) return 11;
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) rc = rt_run_axpb(d, kern, 5.0, 100) == 0 ? 0 : 12;
    em_device_close(d);
    return rc;
}

static void test_env_reports_at_exit(void **state)
{
    (void)state;
    setenv("EMBER_PROFILE", "1", 1);
    rt_capture cap;
    rt_stderr_begin(&cap);
    const char *args[] = {"--child", NULL};
    pid_t pid = rt_spawn_self(args, false);
    int rc = pid > 0 ? rt_wait(pid) : -1;
    char *err = rt_stderr_end(&cap);
    unsetenv("EMBER_PROFILE");
    if (rc != 0) fail_msg("child exited with %d:\n%s", rc, err);
    const char *row = strstr(err, "\nprof_child ");
    unsigned long long n = 0;
    if (!strstr(err, "ember profile:") || !row || sscanf(row + 1, "prof_child %llu", &n) != 1 ||
        n != 3)
        fail_msg("no report of 3 launches of prof_child at exit:\n%s", err);
    /* each rt_run_axpb: 3 allocs, 2 writes + 1 fill, 1 read */
    if (!strstr(err, "9 allocs") || !strstr(err, "9 host->device") ||
        !strstr(err, "3 device->host"))
        fail_msg("wrong counts:\n%s", err);
    free(err);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--child") == 0) return child_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_report),
        cmocka_unit_test(test_env_reports_at_exit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
