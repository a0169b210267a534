/* test_device.c — the device registry: opening by name, reference counting (also from several
 * threads), canonical names, capabilities, the backend list with reasons for missing backends,
 * clear errors for unknown, malformed and unavailable names, timers, and closing a device that
 * still has buffers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include "runtime/rt.h"
#include "runtime/rt_util.h"

static void test_open_same_device_refcounted(void **state)
{
    (void)state;
    em_device *a = em_device_open("cpu");
    assert_non_null(a);
    em_device *b = em_device_open("cpu");
    em_device *c = em_device_open("cpu:0");
    assert_ptr_equal(a, b);
    assert_ptr_equal(a, c);
    assert_string_equal(em_device_name(c), "cpu");
    em_device_close(b);
    em_device_close(c);
    /* still open through a: usable */
    em_buffer *buf = em_buffer_alloc(a, 64);
    assert_non_null(buf);
    em_buffer_free(buf);
    em_device_close(a);
    /* after the last close a new open gives a working device again */
    em_device *d = em_device_open("cpu");
    assert_non_null(d);
    em_pool_stats st;
    em_device_pool_stats(d, &st);
    assert_int_equal(st.allocs, 0); /* a fresh device, fresh pool */
    em_device_close(d);
    em_device_close(NULL); /* ignored */
}

static void test_caps(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    assert_non_null(dev);
    const em_caps *caps = em_device_caps(dev);
    assert_non_null(caps);
    assert_string_equal(caps->target, "c");
    assert_true(strlen(caps->arch) > 0);
    assert_true(strlen(caps->device_name) > 0);
    assert_int_equal(caps->plane_dim, 1);
    assert_int_equal(caps->max_cube_units, 1024);
    assert_int_equal(caps->max_shared, 1u << 20);
    assert_true(caps->compute_units >= 1);
    for (int s = 0; s < EM_SCALAR_COUNT; s++)
        assert_true(caps->dtype[s]);
    assert_true(caps->float_atomic_add);
    assert_true(caps->plane_ops);
    assert_false(caps->matrix);
    assert_true(caps->print);
    assert_int_equal(em_device_sync(dev), EM_OK);
    em_device_close(dev);
    assert_null(em_device_caps(NULL));
}

static void expect_open_error(const char *name, em_status status, const char *needle)
{
    em_clear_error();
    assert_null(em_device_open(name));
    assert_int_equal(em_last_status(), status);
    if (!strstr(em_last_error(), needle))
        fail_msg("opening '%s': message \"%s\" lacks \"%s\"", name ? name : "(null)",
                 em_last_error(), needle);
}

static void test_bad_names(void **state)
{
    (void)state;
    expect_open_error("gpu", EM_ERR_NOT_FOUND, "unknown device 'gpu'");
    expect_open_error("gpu", EM_ERR_NOT_FOUND, "cpu, cuda, opencl, vulkan");
    expect_open_error("", EM_ERR_NOT_FOUND, "unknown device ''");
    expect_open_error("cpux", EM_ERR_NOT_FOUND, "unknown device");
    expect_open_error("cpu:1", EM_ERR_NOT_FOUND, "does not exist");
    expect_open_error("cpu:abc", EM_ERR_INVALID, "must be a number");
    expect_open_error("cpu:", EM_ERR_INVALID, "must be a number");
    expect_open_error("cpu:-1", EM_ERR_INVALID, "must be a number");
    expect_open_error(NULL, EM_ERR_INVALID, "no device name");
}

static void test_unavailable_backends(void **state)
{
    (void)state;
    em_backend_info info[8];
    size_t n = em_backend_list(info, 8);
    assert_int_equal(n, 4);
    assert_string_equal(info[0].name, "cpu");
    assert_int_equal(info[0].device_count, 1);
    const char *libs[] = {NULL, "libcuda.so.1", "libOpenCL.so.1", "libvulkan.so.1"};
    for (size_t i = 1; i < n; i++) {
        if (info[i].device_count > 0)
            continue; /* a machine with this backend */
        assert_true(strlen(info[i].why) > 0);
        assert_non_null(strstr(info[i].why, libs[i]));
        char name[32];
        snprintf(name, sizeof(name), "%s:0", info[i].name);
        expect_open_error(name, EM_ERR_UNSUPPORTED, "is unavailable");
        expect_open_error(name, EM_ERR_UNSUPPORTED, libs[i]);
    }
    /* fewer slots than backends: still the full count */
    assert_int_equal(em_backend_list(info, 1), 4);
    assert_int_equal(em_backend_list(NULL, 0), 4);
}

static em_device *shared_dev;

static void *open_close_many(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        em_device *d = em_device_open("cpu");
        if (d != shared_dev)
            return (void *)1;
        em_device_close(d);
    }
    return NULL;
}

static void test_refcount_threads(void **state)
{
    (void)state;
    shared_dev = em_device_open("cpu");
    assert_non_null(shared_dev);
    pthread_t t[6];
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, open_close_many, NULL), 0);
    for (int i = 0; i < 6; i++) {
        void *r;
        pthread_join(t[i], &r);
        assert_null(r);
    }
    assert_int_equal(shared_dev->refs, 1);
    em_device_close(shared_dev);
}

static void test_close_with_live_buffers(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    assert_non_null(dev);
    assert_non_null(em_buffer_alloc(dev, 1000));
    assert_non_null(em_buffer_alloc(dev, 5000));
    em_buffer_free(em_buffer_alloc(dev, 300)); /* cached */
    rt_capture cap;
    em_log_set_level(EM_LOG_WARN);
    rt_stderr_begin(&cap);
    em_device_close(dev); /* frees both live buffers (ASan checks for leaks) and warns */
    char *err = rt_stderr_end(&cap);
    assert_non_null(strstr(err, "2 buffers still allocated"));
    free(err);
}

static void test_timer(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    em_timer t;
    assert_int_equal(em_timer_start(&t, dev), EM_OK);
    usleep(2000);
    double s = em_timer_stop(&t);
    assert_true(s >= 0.0015 && s < 5.0);
    assert_int_not_equal(em_timer_start(&t, NULL), EM_OK);
    em_timer never = {0};
    assert_true(em_timer_stop(&never) < 0);
    em_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_same_device_refcounted),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_bad_names),
        cmocka_unit_test(test_unavailable_backends),
        cmocka_unit_test(test_refcount_threads),
        cmocka_unit_test(test_close_with_live_buffers),
        cmocka_unit_test(test_timer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
