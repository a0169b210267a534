/* test_error.c — the thread-local last error: setting, clearing, status names, context prefixes,
 * truncation of huge messages (at a UTF-8 boundary), and independence between threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

static void test_set_and_clear(void **state)
{
    em_clear_error();
    assert_string_equal(em_last_error(), "");
    assert_int_equal(em_last_status(), EM_OK);
    assert_int_equal(em_set_error(EM_ERR_IO, "cannot open %s: %d", "x.bin", 7), EM_ERR_IO);
    assert_string_equal(em_last_error(), "cannot open x.bin: 7");
    assert_int_equal(em_last_status(), EM_ERR_IO);
    em_clear_error();
    assert_string_equal(em_last_error(), "");
    assert_int_equal(em_last_status(), EM_OK);
}

static void test_status_names(void **state)
{
    for (int a = EM_OK; a <= EM_ERR_INTERNAL; a++) {
        const char *na = em_status_name((em_status)a);
        assert_non_null(na);
        assert_true(strlen(na) > 0);
        for (int b = a + 1; b <= EM_ERR_INTERNAL; b++)
            assert_string_not_equal(na, em_status_name((em_status)b));
    }
    assert_string_equal(em_status_name(EM_ERR_NOMEM), "out of memory");
    assert_string_equal(em_status_name((em_status)999), "unknown status");
}

static void test_context_prefix(void **state)
{
    em_set_error(EM_ERR_CORRUPT, "bad header");
    assert_int_equal(em_error_context("loading %s", "model.safetensors"), EM_ERR_CORRUPT);
    assert_string_equal(em_last_error(), "loading model.safetensors: bad header");
    em_error_context("step %d", 3);
    assert_string_equal(em_last_error(), "step 3: loading model.safetensors: bad header");
    assert_int_equal(em_last_status(), EM_ERR_CORRUPT);
}

static void test_context_without_error(void **state)
{
    em_clear_error();
    assert_int_equal(em_error_context("only context"), EM_OK);
    assert_string_equal(em_last_error(), "only context");
}

static void test_message_quoting_itself(void **state)
{
    em_set_error(EM_ERR_IO, "inner");
    em_set_error(EM_ERR_INVALID, "outer (%s) [%s]", em_last_error(), em_last_error());
    assert_string_equal(em_last_error(), "outer (inner) [inner]");
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
}

/* True when s is well-formed UTF-8 built from 1- and 2-byte sequences. */
static int valid_utf8_2(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x80) continue;
        if ((*p & 0xE0) != 0xC0 || (p[1] & 0xC0) != 0x80) return 0;
        p++;
    }
    return 1;
}

static void test_truncation(void **state)
{
    static char huge[20000];
    memset(huge, 'x', sizeof huge - 1);
    em_set_error(EM_ERR_INVALID, "start %s end", huge);
    size_t len = strlen(em_last_error());
    assert_true(len < 4096);
    assert_true(len > 4000);
    assert_memory_equal(em_last_error(), "start xxx", 9);
    assert_string_equal(em_last_error() + len - 3, "...");

    /* a cut never splits a multi-byte character, at any alignment */
    for (int shift = 0; shift < 2; shift++) {
        static char accents[9001];
        for (int i = 0; i < 4500; i++) memcpy(accents + 2 * i, "\xc3\xa9", 2); /* é */
        accents[9000] = '\0';
        em_set_error(EM_ERR_INVALID, "%.*s%s", shift, "a", accents);
        assert_true(strlen(em_last_error()) < 4096);
        assert_true(valid_utf8_2(em_last_error()));
    }
}

static void test_context_truncation(void **state)
{
    static char huge[10000];
    memset(huge, 'c', sizeof huge - 1);
    em_set_error(EM_ERR_IO, "root cause");
    em_error_context("%s", huge);
    size_t len = strlen(em_last_error());
    assert_true(len < 4096);
    assert_string_equal(em_last_error() + len - 3, "...");
    assert_int_equal(em_last_status(), EM_ERR_IO);

    /* a long chain of contexts keeps the newest prefix */
    em_set_error(EM_ERR_IO, "root");
    for (int i = 0; i < 1000; i++) em_error_context("level %d", i);
    assert_true(strlen(em_last_error()) < 4096);
    assert_memory_equal(em_last_error(), "level 999: level 998", 20);
}

/* --- thread locality -------------------------------------------------------------------------- */

typedef struct {
    pthread_barrier_t *barrier; /* lines the threads up between set and check */
    int id;                     /* thread number */
    int ok;                     /* result: 1 when the thread saw only its own error */
} thread_arg;

static void *error_thread(void *p)
{
    thread_arg *a = p;
    char want[64];
    snprintf(want, sizeof want, "error from thread %d", a->id);
    int fresh = em_last_error()[0] == '\0' && em_last_status() == EM_OK;
    em_set_error((em_status)(1 + a->id % 9), "error from thread %d", a->id);
    pthread_barrier_wait(a->barrier); /* every thread has set its error */
    em_error_context("ctx %d", a->id);
    pthread_barrier_wait(a->barrier);
    char want_ctx[96];
    snprintf(want_ctx, sizeof want_ctx, "ctx %d: %s", a->id, want);
    a->ok = fresh && strcmp(em_last_error(), want_ctx) == 0 &&
            em_last_status() == (em_status)(1 + a->id % 9);
    return NULL;
}

static void test_thread_local(void **state)
{
    enum { N = 8 };
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, N);
    pthread_t threads[N];
    thread_arg args[N];
    em_set_error(EM_ERR_DEVICE, "main thread error");
    for (int i = 0; i < N; i++) {
        args[i] = (thread_arg){.barrier = &barrier, .id = i, .ok = 0};
        assert_int_equal(pthread_create(&threads[i], NULL, error_thread, &args[i]), 0);
    }
    for (int i = 0; i < N; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < N; i++) assert_int_equal(args[i].ok, 1);
    assert_string_equal(em_last_error(), "main thread error");
    assert_int_equal(em_last_status(), EM_ERR_DEVICE);
    pthread_barrier_destroy(&barrier);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_and_clear),          cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_context_prefix),         cmocka_unit_test(test_context_without_error),
        cmocka_unit_test(test_message_quoting_itself), cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_context_truncation),     cmocka_unit_test(test_thread_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
