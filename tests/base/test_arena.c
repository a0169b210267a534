/* test_arena.c — the bump allocator: alignment, zeroed memory, separation of allocations, big
 * requests, many blocks, string copies, and the error on an impossible size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "base/base.h"

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static void test_alignment_and_zero(void **state)
{
    em_arena a;
    em_arena_init(&a, 0);
    unsigned char *prev = NULL;
    for (size_t size = 0; size < 300; size++) {
        unsigned char *p = em_arena_alloc(&a, size);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        assert_true(all_zero(p, size));
        assert_ptr_not_equal(p, prev); /* even size 0 gives a fresh pointer */
        memset(p, 0xAB, size);
        prev = p;
    }
    em_arena_free(&a);
}

static void test_allocations_do_not_overlap(void **state)
{
    em_arena a;
    em_arena_init(&a, 1024);
    enum { N = 2000 };
    unsigned char *ptrs[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)(i * 37 % 200) + 1;
        ptrs[i] = em_arena_alloc(&a, sizes[i]);
        assert_non_null(ptrs[i]);
        memset(ptrs[i], i & 0xFF, sizes[i]);
    }
    for (int i = 0; i < N; i++)
        for (size_t j = 0; j < sizes[i]; j++) assert_int_equal(ptrs[i][j], i & 0xFF);
    em_arena_free(&a);
}

static void test_big_allocations(void **state)
{
    em_arena a;
    em_arena_init(&a, 4096);
    unsigned char *small1 = em_arena_alloc(&a, 16);
    unsigned char *big = em_arena_alloc(&a, 10u << 20);
    assert_non_null(big);
    assert_int_equal((uintptr_t)big % 16, 0);
    assert_true(all_zero(big, 10u << 20));
    memset(big, 0xEE, 10u << 20);
    /* the current block keeps serving small requests after a dedicated big one */
    unsigned char *small2 = em_arena_alloc(&a, 16);
    assert_ptr_equal(small2, small1 + 16);
    unsigned char *big2 = em_arena_alloc(&a, 3000); /* > block/4: its own block too */
    assert_non_null(big2);
    assert_true(all_zero(big2, 3000));
    assert_int_equal(a.total, 16 + (10u << 20) + 16 + 3000);
    em_arena_free(&a);
    assert_null(a.head);
    assert_int_equal(a.total, 0);
}

static void test_many_blocks(void **state)
{
    em_arena a;
    em_arena_init(&a, 256);
    enum { N = 20000 };
    static char *strs[N];
    for (int i = 0; i < N; i++) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "string-%d", i);
        strs[i] = em_arena_strdup(&a, tmp);
        assert_non_null(strs[i]);
    }
    for (int i = 0; i < N; i++) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "string-%d", i);
        assert_string_equal(strs[i], tmp);
    }
    assert_int_equal(a.total, 20000 * 7 + (10 + 90 * 2 + 900 * 3 + 9000 * 4 + 10000 * 5) + N);
    em_arena_free(&a);
    /* reusable after free */
    assert_non_null(em_arena_alloc(&a, 10));
    em_arena_free(&a);
}

static void test_strndup(void **state)
{
    em_arena a;
    em_arena_init(&a, 0);
    char *s = em_arena_strndup(&a, "hello world", 5);
    assert_string_equal(s, "hello");
    char *e = em_arena_strdup(&a, "");
    assert_string_equal(e, "");
    char bin[4] = {'a', 0, 'b', 'c'};
    char *b = em_arena_strndup(&a, bin, 4);
    assert_memory_equal(b, bin, 4);
    assert_int_equal(b[4], 0);
    em_arena_free(&a);
}

static void test_impossible_size(void **state)
{
    em_arena a;
    em_arena_init(&a, 0);
    em_clear_error();
    assert_null(em_arena_alloc(&a, SIZE_MAX - 3));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_non_null(strstr(em_last_error(), "arena"));
    assert_null(em_arena_strndup(&a, "x", SIZE_MAX));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_non_null(em_arena_alloc(&a, 8)); /* still usable */
    em_arena_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_and_zero),
        cmocka_unit_test(test_allocations_do_not_overlap),
        cmocka_unit_test(test_big_allocations),
        cmocka_unit_test(test_many_blocks),
        cmocka_unit_test(test_strndup),
        cmocka_unit_test(test_impossible_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
