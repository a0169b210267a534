/* test_vec.c — growable arrays: EM_VEC_PUSH over many elements, em_vec_grow's no-op and doubling,
 * and the error on an impossible size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

typedef struct {
    double x; /* payload */
    int tag;  /* payload */
} item;

typedef struct {
    item *items; /* elements */
    size_t len;  /* used */
    size_t cap;  /* allocated */
} item_vec;

static void test_push_many(void **state)
{
    item_vec v = {0};
    for (int i = 0; i < 100000; i++) assert_true(EM_VEC_PUSH(&v, ((item){.x = i * 0.5, .tag = i})));
    assert_int_equal(v.len, 100000);
    assert_true(v.cap >= v.len);
    for (int i = 0; i < 100000; i++) {
        assert_int_equal(v.items[i].tag, i);
        assert_true(v.items[i].x == i * 0.5);
    }
    free(v.items);
}

static void test_grow(void **state)
{
    int *items = NULL;
    size_t cap = 0;
    assert_true(em_vec_grow((void **)&items, &cap, 1, sizeof *items));
    assert_int_equal(cap, 8);
    int *before = items;
    assert_true(em_vec_grow((void **)&items, &cap, 8, sizeof *items)); /* fits: no change */
    assert_ptr_equal(items, before);
    assert_int_equal(cap, 8);
    assert_true(em_vec_grow((void **)&items, &cap, 9, sizeof *items));
    assert_int_equal(cap, 16);
    assert_true(em_vec_grow((void **)&items, &cap, 1000, sizeof *items));
    assert_int_equal(cap, 1024);
    items[999] = 5;
    free(items);
}

static void test_too_large(void **state)
{
    int *items = NULL;
    size_t cap = 0;
    em_clear_error();
    assert_false(em_vec_grow((void **)&items, &cap, SIZE_MAX / 2, 16));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_null(items);
    assert_int_equal(cap, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_many),
        cmocka_unit_test(test_grow),
        cmocka_unit_test(test_too_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
