/* test_map.c — the hash map: put/get/replace/remove, tombstone reuse, churn without growth,
 * 100k keys, binary keys (embedded NULs, empty key), iteration, and the load-factor bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define V(i) ((void *)(uintptr_t)(i))

static void test_basic(void **state)
{
    em_map m;
    em_map_init(&m);
    assert_null(em_map_gets(&m, "missing"));
    assert_null(em_map_remove(&m, "missing", 7));
    assert_true(em_map_puts(&m, "one", V(1)));
    assert_true(em_map_puts(&m, "two", V(2)));
    assert_ptr_equal(em_map_gets(&m, "one"), V(1));
    assert_ptr_equal(em_map_gets(&m, "two"), V(2));
    assert_true(em_map_puts(&m, "one", V(11))); /* replace */
    assert_ptr_equal(em_map_gets(&m, "one"), V(11));
    assert_int_equal(m.count, 2);
    assert_ptr_equal(em_map_remove(&m, "one", 3), V(11));
    assert_null(em_map_gets(&m, "one"));
    assert_null(em_map_remove(&m, "one", 3));
    assert_int_equal(m.count, 1);
    em_map_free(&m);
    assert_int_equal(m.count, 0);
    assert_null(em_map_gets(&m, "two"));
}

static void test_key_is_copied(void **state)
{
    em_map m;
    em_map_init(&m);
    char key[16] = "volatile";
    em_map_puts(&m, key, V(5));
    strcpy(key, "changed!");
    assert_ptr_equal(em_map_gets(&m, "volatile"), V(5));
    assert_null(em_map_gets(&m, "changed!"));
    em_map_free(&m);
}

static void test_tombstone_reuse(void **state)
{
    em_map m;
    em_map_init(&m);
    char key[32];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "k%d", i);
        em_map_puts(&m, key, V(i + 1));
    }
    size_t used = m.used, cap = m.cap;
    assert_ptr_equal(em_map_gets(&m, "k5"), V(6));
    em_map_remove(&m, "k5", 2);
    assert_int_equal(m.count, 9);
    assert_int_equal(m.used, used); /* the slot is a tombstone, still counted */
    for (int i = 0; i < 10; i++) {  /* probe chains through the tombstone still work */
        snprintf(key, sizeof key, "k%d", i);
        assert_ptr_equal(em_map_gets(&m, key), i == 5 ? NULL : V(i + 1));
    }
    em_map_puts(&m, "k5", V(99));
    assert_int_equal(m.count, 10);
    assert_int_equal(m.used, used); /* the tombstone was reused */
    assert_int_equal(m.cap, cap);
    assert_ptr_equal(em_map_gets(&m, "k5"), V(99));
    em_map_free(&m);
}

static void test_churn_keeps_size(void **state)
{
    em_map m;
    em_map_init(&m);
    char key[32];
    for (int i = 0; i < 100000; i++) {
        snprintf(key, sizeof key, "churn-%d", i);
        assert_true(em_map_puts(&m, key, V(i + 1)));
        if (i >= 8) {
            snprintf(key, sizeof key, "churn-%d", i - 8);
            assert_ptr_equal(em_map_remove(&m, key, strlen(key)), V(i - 7));
        }
        assert_true(m.used * 10 <= m.cap * 7);
    }
    assert_int_equal(m.count, 8);
    assert_true(m.cap <= 64); /* tombstones are swept, not grown over */
    em_map_free(&m);
}

static void test_100k_keys(void **state)
{
    em_map m;
    em_map_init(&m);
    enum { N = 100000 };
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_true(em_map_puts(&m, key, V(i + 1)));
        assert_true(m.used * 10 <= m.cap * 7);
    }
    assert_int_equal(m.count, N);
    assert_int_equal(m.cap & (m.cap - 1), 0); /* power of two */
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_ptr_equal(em_map_gets(&m, key), V(i + 1));
    }
    for (int i = 0; i < N; i += 2) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_ptr_equal(em_map_remove(&m, key, strlen(key)), V(i + 1));
    }
    assert_int_equal(m.count, N / 2);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_ptr_equal(em_map_gets(&m, key), i % 2 ? V(i + 1) : NULL);
    }
    assert_null(em_map_gets(&m, "key-100000"));
    em_map_free(&m);
}

static void test_binary_keys(void **state)
{
    em_map m;
    em_map_init(&m);
    assert_true(em_map_put(&m, "a\0b", 3, V(1)));
    assert_true(em_map_put(&m, "a\0c", 3, V(2)));
    assert_true(em_map_put(&m, "a", 1, V(3)));
    assert_true(em_map_put(&m, "", 0, V(4)));
    assert_true(em_map_put(&m, "\0\0\0\0", 4, V(5)));
    assert_true(em_map_put(&m, "\0\0\0", 3, V(6)));
    assert_int_equal(m.count, 6);
    assert_ptr_equal(em_map_get(&m, "a\0b", 3), V(1));
    assert_ptr_equal(em_map_get(&m, "a\0c", 3), V(2));
    assert_ptr_equal(em_map_get(&m, "a", 1), V(3));
    assert_ptr_equal(em_map_gets(&m, "a"), V(3));
    assert_ptr_equal(em_map_get(&m, "", 0), V(4));
    assert_ptr_equal(em_map_gets(&m, ""), V(4));
    assert_ptr_equal(em_map_get(&m, "\0\0\0\0", 4), V(5));
    assert_ptr_equal(em_map_get(&m, "\0\0\0", 3), V(6));
    assert_null(em_map_get(&m, "\0\0", 2));
    assert_ptr_equal(em_map_remove(&m, "", 0), V(4));
    assert_null(em_map_get(&m, "", 0));
    /* all 256 single-byte keys and 8-byte integer keys */
    for (int i = 0; i < 256; i++) {
        unsigned char c = (unsigned char)i;
        em_map_put(&m, &c, 1, V(1000 + i));
    }
    for (uint64_t i = 0; i < 5000; i++) em_map_put(&m, &i, sizeof i, V(10000 + i));
    for (int i = 0; i < 256; i++) {
        unsigned char c = (unsigned char)i;
        assert_ptr_equal(em_map_get(&m, &c, 1), V(1000 + i));
    }
    for (uint64_t i = 0; i < 5000; i++)
        assert_ptr_equal(em_map_get(&m, &i, sizeof i), V(10000 + i));
    em_map_free(&m);
}

static void test_iteration(void **state)
{
    em_map m;
    em_map_init(&m);
    size_t iter = 0;
    assert_false(em_map_next(&m, &iter, NULL, NULL, NULL));
    enum { N = 1000 };
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "it%d", i);
        em_map_puts(&m, key, V(i + 1));
    }
    for (int i = 0; i < N; i += 3) {
        snprintf(key, sizeof key, "it%d", i);
        em_map_remove(&m, key, strlen(key));
    }
    static int seen[N];
    memset(seen, 0, sizeof seen);
    const char *k;
    size_t klen;
    void *v;
    size_t visits = 0;
    iter = 0;
    while (em_map_next(&m, &iter, &k, &klen, &v)) {
        int i = (int)(uintptr_t)v - 1;
        assert_true(i >= 0 && i < N);
        snprintf(key, sizeof key, "it%d", i);
        assert_int_equal(klen, strlen(key));
        assert_memory_equal(k, key, klen);
        seen[i]++;
        visits++;
    }
    assert_int_equal(visits, m.count);
    for (int i = 0; i < N; i++) assert_int_equal(seen[i], i % 3 ? 1 : 0);
    assert_false(em_map_next(&m, &iter, &k, &klen, &v)); /* stays done */
    em_map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),           cmocka_unit_test(test_key_is_copied),
        cmocka_unit_test(test_tombstone_reuse), cmocka_unit_test(test_churn_keeps_size),
        cmocka_unit_test(test_100k_keys),       cmocka_unit_test(test_binary_keys),
        cmocka_unit_test(test_iteration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
