/* test_strbuf.c — the string builder: growth, printf (short and longer than the free space),
 * embedded NULs, indentation, clear, take (ownership moves to the caller) and the oom flag. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

/* em_sb_append_int prints what "%lld" prints, the extremes included. */
static void test_append_int(void **state)
{
    (void)state;
    static const long long v[] = {0, 7, -7, 10, -10, 123456789, 4294967296LL, 9223372036854775807LL,
                                  -9223372036854775807LL - 1};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        em_strbuf a, b;
        em_sb_init(&a);
        em_sb_init(&b);
        em_sb_append(&a, "x");
        em_sb_append(&b, "x");
        em_sb_append_int(&a, v[i]);
        em_sb_printf(&b, "%lld", v[i]);
        assert_string_equal(a.data, b.data);
        assert_int_equal(a.len, b.len);
        em_sb_free(&a);
        em_sb_free(&b);
    }
}

static void test_empty(void **state)
{
    em_strbuf sb;
    em_sb_init(&sb);
    assert_non_null(sb.data);
    assert_string_equal(sb.data, "");
    assert_int_equal(sb.len, 0);
    em_sb_clear(&sb);
    char *s = em_sb_take(&sb);
    assert_non_null(s);
    assert_string_equal(s, "");
    free(s);
    em_sb_free(&sb);
}

static void test_growth(void **state)
{
    em_strbuf sb;
    em_sb_init(&sb);
    enum { N = 100000 };
    for (int i = 0; i < N; i++) em_sb_appendc(&sb, (char)('a' + i % 26));
    assert_int_equal(sb.len, N);
    assert_true(sb.cap > N);
    assert_int_equal(strlen(sb.data), N);
    for (int i = 0; i < N; i++) assert_int_equal(sb.data[i], 'a' + i % 26);
    em_sb_append(&sb, "tail");
    assert_string_equal(sb.data + N, "tail");
    em_sb_free(&sb);
    assert_int_equal(sb.len, 0);
    assert_string_equal(sb.data, "");
}

static void test_printf(void **state)
{
    em_strbuf sb;
    em_sb_init(&sb);
    em_sb_printf(&sb, "%d-%s-%.2f", 42, "x", 1.5);
    assert_string_equal(sb.data, "42-x-1.50");
    /* longer than the free space: must grow and format again */
    char big[5000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    em_sb_printf(&sb, "[%s]", big);
    assert_int_equal(sb.len, 9 + 2 + 4999);
    assert_int_equal(sb.data[9], '[');
    assert_int_equal(sb.data[sb.len - 1], ']');
    assert_int_equal(strlen(sb.data), sb.len);
    for (int i = 0; i < 1000; i++) em_sb_printf(&sb, "%d,", i);
    assert_non_null(strstr(sb.data, "]0,1,2,"));
    assert_int_equal(memcmp(sb.data + sb.len - 4, "999,", 4), 0);
    em_sb_printf(&sb, "%s", ""); /* empty output changes nothing */
    assert_int_equal(strlen(sb.data), sb.len);
    em_sb_free(&sb);
}

static void test_appendn_and_indent(void **state)
{
    em_strbuf sb;
    em_sb_init(&sb);
    em_sb_appendn(&sb, "ab\0cd", 5);
    assert_int_equal(sb.len, 5);
    assert_memory_equal(sb.data, "ab\0cd", 6);
    em_sb_clear(&sb);
    assert_int_equal(sb.len, 0);
    assert_string_equal(sb.data, "");
    em_sb_indent(&sb, 2);
    em_sb_append(&sb, "x;");
    em_sb_indent(&sb, 0);
    em_sb_indent(&sb, -3);
    assert_string_equal(sb.data, "        x;");
    em_sb_free(&sb);
}

static void test_take(void **state)
{
    em_strbuf sb;
    em_sb_init(&sb);
    em_sb_append(&sb, "owned");
    char *s = em_sb_take(&sb);
    assert_string_equal(s, "owned");
    assert_int_equal(sb.len, 0);
    assert_int_equal(sb.cap, 0);
    assert_string_equal(sb.data, "");
    em_sb_append(&sb, "again"); /* the builder is reusable and does not touch s */
    assert_string_equal(s, "owned");
    assert_string_equal(sb.data, "again");
    free(s);
    em_sb_free(&sb);
}

static void test_oom_flag(void **state)
{
    em_strbuf sb;
    em_sb_init(&sb);
    em_sb_append(&sb, "before");
    sb.oom = true; /* as after a failed growth */
    em_sb_append(&sb, "ignored");
    em_sb_printf(&sb, "%s", "ignored");
    em_sb_indent(&sb, 3);
    assert_string_equal(sb.data, "before");
    em_clear_error();
    assert_null(em_sb_take(&sb));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_false(sb.oom); /* take resets the builder */
    em_sb_free(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),  cmocka_unit_test(test_append_int),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_printf), cmocka_unit_test(test_appendn_and_indent),
        cmocka_unit_test(test_take),   cmocka_unit_test(test_oom_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
