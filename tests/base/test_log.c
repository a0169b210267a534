/* test_log.c — logging: EMBER_LOG read on first use, level-name parsing, the level filter, the
 * "ember: <level>: ..." format of a line, long lines, errno preserved, and whole lines (one write
 * per message) from several threads at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

static void test_env_read_on_first_use(void **state)
{
    setenv("EMBER_LOG", "DeBuG", 1); /* this test runs first: nothing has read the level yet */
    assert_int_equal(em_log_get_level(), EM_LOG_DEBUG);
    setenv("EMBER_LOG", "error", 1); /* read once only */
    assert_int_equal(em_log_get_level(), EM_LOG_DEBUG);
}

static void test_parse(void **state)
{
    static const struct {
        const char *name;   /* input */
        em_log_level level; /* expected */
    } ok[] = {{"error", EM_LOG_ERROR}, {"warn", EM_LOG_WARN},   {"WARNING", EM_LOG_WARN},
              {"info", EM_LOG_INFO},   {"Debug", EM_LOG_DEBUG}, {"TRACE", EM_LOG_TRACE}};
    for (size_t i = 0; i < EM_ARRAY_LEN(ok); i++) {
        em_log_level level = (em_log_level)99;
        assert_int_equal(em_log_parse_level(ok[i].name, &level), 0);
        assert_int_equal(level, ok[i].level);
    }
    static const char *bad[] = {"", "verbose", "warn ", " info", "3", "errors", "debu"};
    for (size_t i = 0; i < EM_ARRAY_LEN(bad); i++) {
        em_log_level level = EM_LOG_INFO;
        assert_int_equal(em_log_parse_level(bad[i], &level), -1);
        assert_int_equal(level, EM_LOG_INFO); /* untouched */
    }
    em_log_level level = EM_LOG_INFO;
    assert_int_equal(em_log_parse_level(NULL, &level), -1);
    assert_string_equal(em_log_level_name(EM_LOG_WARN), "warn");
    assert_string_equal(em_log_level_name(EM_LOG_TRACE), "trace");
}

static void test_enabled(void **state)
{
    em_log_set_level(EM_LOG_INFO);
    assert_int_equal(em_log_get_level(), EM_LOG_INFO);
    assert_true(em_log_enabled(EM_LOG_ERROR));
    assert_true(em_log_enabled(EM_LOG_WARN));
    assert_true(em_log_enabled(EM_LOG_INFO));
    assert_false(em_log_enabled(EM_LOG_DEBUG));
    assert_false(em_log_enabled(EM_LOG_TRACE));
    em_log_set_level(EM_LOG_ERROR);
    assert_false(em_log_enabled(EM_LOG_WARN));
    em_log_set_level(EM_LOG_TRACE);
    assert_true(em_log_enabled(EM_LOG_TRACE));
}

/* --- captured output -------------------------------------------------------------------------- */

static char capture_path[PATH_MAX];
static int saved_stderr = -1;

/* Sends stderr to a fresh file (appending, so that writes from several threads all land). */
static void capture_begin(void)
{
    assert_int_equal(em_mkdir_p(EMBER_TEST_TMP), EM_OK);
    snprintf(capture_path, sizeof capture_path, "%s/log-capture-%d.txt", EMBER_TEST_TMP,
             (int)getpid());
    int fd = open(capture_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    assert_true(fd >= 0);
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    assert_true(saved_stderr >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    close(fd);
}

/* Restores stderr and returns what was written (caller frees). */
static char *capture_end(void)
{
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    char *text = em_file_read(capture_path, NULL);
    assert_non_null(text);
    unlink(capture_path);
    return text;
}

static void test_format_and_filter(void **state)
{
    em_log_set_level(EM_LOG_WARN);
    capture_begin();
    em_log(EM_LOG_WARN, "hello %d %s", 42, "world");
    EM_LOGE("broken: %s", "x");
    EM_LOGI("not shown");
    EM_LOGD("not shown either");
    char *text = capture_end();
    assert_string_equal(text, "ember: warn: hello 42 world\nember: error: broken: x\n");
    free(text);
}

static void test_long_message(void **state)
{
    em_log_set_level(EM_LOG_INFO);
    static char body[20001];
    memset(body, 'q', sizeof body - 1);
    capture_begin();
    EM_LOGI("<%s>", body);
    char *text = capture_end();
    assert_int_equal(strlen(text), strlen("ember: info: <>\n") + 20000);
    assert_memory_equal(text, "ember: info: <qqq", 17);
    assert_string_equal(text + strlen(text) - 3, "q>\n");
    free(text);
}

static void test_errno_preserved(void **state)
{
    em_log_set_level(EM_LOG_INFO);
    capture_begin();
    errno = ENOSPC;
    EM_LOGI("keeps errno");
    int after = errno;
    char *text = capture_end();
    assert_int_equal(after, ENOSPC);
    free(text);
}

enum { LOG_THREADS = 4, LOG_LINES = 300 };

static void *log_thread(void *p)
{
    int id = (int)(intptr_t)p;
    char pad[200];
    memset(pad, 'a' + id, sizeof pad - 1);
    pad[sizeof pad - 1] = '\0';
    for (int i = 0; i < LOG_LINES; i++) EM_LOGW("thread %d line %d %s end", id, i, pad);
    return NULL;
}

static void test_lines_from_threads_stay_whole(void **state)
{
    em_log_set_level(EM_LOG_WARN);
    capture_begin();
    pthread_t t[LOG_THREADS];
    for (int i = 0; i < LOG_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, log_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < LOG_THREADS; i++) pthread_join(t[i], NULL);
    char *text = capture_end();
    int lines = 0;
    static int seen[LOG_THREADS][LOG_LINES];
    memset(seen, 0, sizeof seen);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int id = -1, n = -1, consumed = 0;
        assert_int_equal(sscanf(line, "ember: warn: thread %d line %d %n", &id, &n, &consumed), 2);
        assert_true(id >= 0 && id < LOG_THREADS && n >= 0 && n < LOG_LINES);
        const char *rest = line + consumed;
        assert_int_equal(strlen(rest), 199 + 4);
        for (int k = 0; k < 199; k++) assert_int_equal(rest[k], 'a' + id);
        assert_string_equal(rest + 199, " end");
        seen[id][n]++;
        lines++;
    }
    assert_int_equal(lines, LOG_THREADS * LOG_LINES);
    for (int i = 0; i < LOG_THREADS; i++)
        for (int k = 0; k < LOG_LINES; k++) assert_int_equal(seen[i][k], 1);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_read_on_first_use), /* must stay first */
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_enabled),
        cmocka_unit_test(test_format_and_filter),
        cmocka_unit_test(test_long_message),
        cmocka_unit_test(test_errno_preserved),
        cmocka_unit_test(test_lines_from_threads_stay_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
