/* test_constants.c — em_device_constant (src/runtime/constants.c): the same bytes give the same
 * place and are written once; other bytes another slot, with their contents on the device; after
 * every slot is used the oldest is rewritten; bad arguments, too many bytes and a recording device
 * are refused with a message; em_device_counters' zero block. On the CPU by default, on
 * $EMBER_TEST_DEVICE when set. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "runtime/rt.h"
#include "runtime/rt_util.h"

static em_device *dev;
static char cache_dir[1024];

static int setup(void **state)
{
    (void)state;
    rt_fresh_dir("constants", cache_dir, sizeof(cache_dir));
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
    const char *name = getenv("EMBER_TEST_DEVICE");
    dev = em_device_open(name && *name ? name : "cpu");
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    em_remove_tree(cache_dir);
    return 0;
}

/* n bytes of pattern k */
static void pattern(unsigned char *b, size_t n, unsigned k)
{
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(k * 31 + i * 7 + 1);
}

static void expect_on_device(em_buffer *buf, size_t at, const unsigned char *want, size_t n)
{
    unsigned char got[256];
    assert_int_equal(em_buffer_read(buf, at, got, n), EM_OK);
    assert_memory_equal(got, want, n);
}

static void test_same_bytes_same_place(void **state)
{
    (void)state;
    unsigned char a[256], b[200];
    pattern(a, sizeof a, 1);
    pattern(b, sizeof b, 2);
    em_buffer *ba, *ba2, *bb;
    size_t oa, oa2, ob;
    assert_int_equal(em_device_constant(dev, a, sizeof a, &ba, &oa), EM_OK);
    assert_int_equal(em_device_constant(dev, b, sizeof b, &bb, &ob), EM_OK);
    assert_int_equal(em_device_constant(dev, a, sizeof a, &ba2, &oa2), EM_OK);
    assert_ptr_equal(ba, ba2);
    assert_int_equal(oa, oa2);
    assert_true(oa != ob);
    assert_int_equal(oa % 64, 0); /* tensor maps want 64-byte alignment */
    expect_on_device(ba, oa, a, sizeof a);
    expect_on_device(bb, ob, b, sizeof b);
    /* a prefix of a is other bytes (another length) */
    em_buffer *bp;
    size_t op;
    assert_int_equal(em_device_constant(dev, a, 100, &bp, &op), EM_OK);
    assert_true(op != oa);
    expect_on_device(bp, op, a, 100);
}

/* More distinct constants than slots: each is right when asked for, and the first ones' slots
 * are rewritten (asking again writes them anew, with the right bytes) */
static void test_wraps(void **state)
{
    (void)state;
    unsigned char c[64];
    em_buffer *buf;
    size_t at;
    for (unsigned k = 0; k < EM_RT_CONST_SLOTS + 20; k++) {
        pattern(c, sizeof c, 1000 + k);
        assert_int_equal(em_device_constant(dev, c, sizeof c, &buf, &at), EM_OK);
        if (k % 37 == 0) expect_on_device(buf, at, c, sizeof c);
    }
    pattern(c, sizeof c, 1000);
    assert_int_equal(em_device_constant(dev, c, sizeof c, &buf, &at), EM_OK);
    expect_on_device(buf, at, c, sizeof c);
}

static void test_refused(void **state)
{
    (void)state;
    unsigned char big[300] = {0};
    em_buffer *buf;
    size_t at;
    assert_int_equal(em_device_constant(dev, big, sizeof big, &buf, &at), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "300 bytes"));
    assert_int_equal(em_device_constant(dev, big, 0, &buf, &at), EM_ERR_INVALID);
    assert_int_equal(em_device_constant(NULL, big, 8, &buf, &at), EM_ERR_INVALID);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_int_equal(em_device_constant(dev, big, 8, &buf, &at), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "recording"));
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    em_graph_free(g);
    assert_int_equal(em_device_constant(dev, big, 8, &buf, &at), EM_OK);
}

/* em_device_counters: bad arguments refused; not made while the device records a graph (the
 * zeroing would be recorded), made zero afterwards, then the same block every call, recording or
 * not. */
static void test_counters(void **state)
{
    (void)state;
    em_buffer *buf = NULL, *again = NULL;
    assert_int_equal(em_device_counters(NULL, &buf), EM_ERR_INVALID);
    assert_int_equal(em_device_counters(dev, NULL), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "NULL argument"));
    em_graph *g = NULL;
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_int_equal(em_device_counters(dev, &buf), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "recording"));
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    em_graph_free(g);
    assert_int_equal(em_device_counters(dev, &buf), EM_OK);
    static uint32_t c[EM_DEVICE_COUNTERS];
    memset(c, 0xff, sizeof c);
    assert_int_equal(em_buffer_read(buf, 0, c, sizeof c), EM_OK);
    for (int i = 0; i < EM_DEVICE_COUNTERS; i++) assert_int_equal(c[i], 0);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_int_equal(em_device_counters(dev, &again), EM_OK);
    assert_ptr_equal(again, buf);
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    em_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bytes_same_place),
        cmocka_unit_test(test_wraps),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_counters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
