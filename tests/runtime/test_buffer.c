/* test_buffer.c — buffers: write/read round trips of many sizes and offsets, copies within and
 * between buffers (overlapping too), zero fill, and rejection (with a clear message, never a
 * crash) of every out-of-range offset, size and NULL argument. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/rt_util.h"

static em_device *dev;

static int setup(void **state)
{
    (void)state;
    dev = em_device_open("cpu");
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    return 0;
}

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 131u + seed * 7u) >> 3);
}

static void test_round_trips(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 1, 3, 255, 256, 257, 4096, 100003, (1u << 20) + 3};
    for (size_t s = 0; s < EM_ARRAY_LEN(sizes); s++) {
        size_t n = sizes[s];
        unsigned char *src = malloc(n + 1), *dst = malloc(n + 1);
        fill_pattern(src, n, (unsigned)s);
        em_buffer *b = em_buffer_alloc(dev, n);
        assert_non_null(b);
        assert_int_equal(em_buffer_size(b), n);
        assert_ptr_equal(em_buffer_device(b), dev);
        assert_int_equal(em_buffer_write(b, 0, src, n), EM_OK);
        memset(dst, 0xEE, n + 1);
        assert_int_equal(em_buffer_read(b, 0, dst, n), EM_OK);
        assert_memory_equal(src, dst, n);
        assert_int_equal(dst[n], 0xEE); /* nothing beyond */
        em_buffer_free(b);
        free(src);
        free(dst);
    }
}

static void test_offsets(void **state)
{
    (void)state;
    unsigned char data[1000], back[1000];
    fill_pattern(data, sizeof(data), 9);
    em_buffer *b = em_buffer_alloc(dev, 1000);
    assert_int_equal(em_buffer_fill_zero(b), EM_OK);
    assert_int_equal(em_buffer_write(b, 100, data, 50), EM_OK);
    assert_int_equal(em_buffer_write(b, 990, data + 500, 10), EM_OK); /* up to the end exactly */
    assert_int_equal(em_buffer_read(b, 0, back, 1000), EM_OK);
    for (size_t i = 0; i < 1000; i++) {
        unsigned char want = i >= 100 && i < 150 ? data[i - 100] : i >= 990 ? data[500 + i - 990] : 0;
        assert_int_equal(back[i], want);
    }
    unsigned char part[7];
    assert_int_equal(em_buffer_read(b, 103, part, 7), EM_OK);
    assert_memory_equal(part, data + 3, 7);
    assert_int_equal(em_buffer_read(b, 1000, part, 0), EM_OK); /* empty range at the end */
    em_buffer_free(b);
}

static void test_copies(void **state)
{
    (void)state;
    unsigned char data[4096], back[4096];
    fill_pattern(data, sizeof(data), 3);
    em_buffer *a = em_buffer_alloc(dev, 4096), *b = em_buffer_alloc(dev, 3000);
    assert_int_equal(em_buffer_write(a, 0, data, 4096), EM_OK);
    assert_int_equal(em_buffer_fill_zero(b), EM_OK);
    assert_int_equal(em_buffer_copy(b, 10, a, 1000, 2000), EM_OK);
    assert_int_equal(em_buffer_read(b, 0, back, 3000), EM_OK);
    for (size_t i = 0; i < 3000; i++)
        assert_int_equal(back[i], i >= 10 && i < 2010 ? data[1000 + i - 10] : 0);
    /* overlapping copy within one buffer behaves like memmove */
    unsigned char expect[4096];
    memcpy(expect, data, 4096);
    memmove(expect + 100, expect, 3000);
    assert_int_equal(em_buffer_copy(a, 100, a, 0, 3000), EM_OK);
    assert_int_equal(em_buffer_read(a, 0, back, 4096), EM_OK);
    assert_memory_equal(back, expect, 4096);
    assert_int_equal(em_buffer_copy(a, 0, b, 0, 0), EM_OK);
    em_buffer_free(a);
    em_buffer_free(b);
}

static void expect_invalid(em_status st, const char *needle)
{
    assert_int_equal(st, EM_ERR_INVALID);
    if (!strstr(em_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", em_last_error(), needle);
}

static void test_out_of_range(void **state)
{
    (void)state;
    unsigned char tmp[64] = {0};
    em_buffer *b = em_buffer_alloc(dev, 100), *c = em_buffer_alloc(dev, 50);
    expect_invalid(em_buffer_write(b, 101, tmp, 0), "outside the buffer of 100 bytes");
    expect_invalid(em_buffer_write(b, 90, tmp, 11), "outside the buffer of 100 bytes");
    expect_invalid(em_buffer_write(b, SIZE_MAX, tmp, 2), "outside");
    expect_invalid(em_buffer_write(b, 2, tmp, SIZE_MAX), "outside");
    expect_invalid(em_buffer_read(b, 99, tmp, 2), "em_buffer_read");
    expect_invalid(em_buffer_read(b, SIZE_MAX - 1, tmp, 4), "outside");
    expect_invalid(em_buffer_copy(c, 0, b, 0, 51), "destination");
    expect_invalid(em_buffer_copy(b, 0, c, 10, 41), "source");
    expect_invalid(em_buffer_copy(b, SIZE_MAX, c, 0, 1), "outside");
    expect_invalid(em_buffer_write(NULL, 0, tmp, 1), "no buffer");
    expect_invalid(em_buffer_write(b, 0, NULL, 1), "no source");
    expect_invalid(em_buffer_read(b, 0, NULL, 1), "no destination");
    expect_invalid(em_buffer_copy(NULL, 0, b, 0, 1), "no source or destination");
    expect_invalid(em_buffer_fill_zero(NULL), "no buffer");
    /* the buffer is untouched by the rejected calls */
    assert_int_equal(em_buffer_write(b, 0, tmp, 64), EM_OK);
    assert_int_equal(em_buffer_size(NULL), 0);
    assert_null(em_buffer_device(NULL));
    assert_null(em_buffer_alloc(NULL, 10));
    em_buffer_free(NULL);
    em_buffer_free(b);
    em_buffer_free(c);
}

static void test_fill_zero_large(void **state)
{
    (void)state;
    size_t n = (3u << 20) + 17;
    em_buffer *b = em_buffer_alloc(dev, n);
    unsigned char *p = malloc(n);
    memset(p, 0xAB, n);
    assert_int_equal(em_buffer_write(b, 0, p, n), EM_OK);
    assert_int_equal(em_buffer_fill_zero(b), EM_OK);
    assert_int_equal(em_buffer_read(b, 0, p, n), EM_OK);
    for (size_t i = 0; i < n; i++)
        if (p[i])
            fail_msg("byte %zu not zeroed", i);
    free(p);
    em_buffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),  cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_copies),       cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_fill_zero_large),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
