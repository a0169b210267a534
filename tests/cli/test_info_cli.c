/* test_info_cli.c — `ember info` as a user runs it: every backend with its devices or why it is
 * missing, each device's capabilities, the kernel cache; `--device NAME` for one device; and a
 * device whose driver crashes (injected with EMBER_INFO_CRASH, as PoCL did on the H200 machine)
 * is reported as a crash while the other devices and the rest of the report still appear, with
 * exit status 1 — in the listing and with --check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "data/data_util.h"

/* Runs `ENV ember ARGS 2>&1`; returns the output, status in *code. */
static char *ember(const char *env, const char *args, int *code)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s '%s' %s 2>&1", env, EMBER_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = read_all(p, NULL);
    int st = pclose(p);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static void expect_in(const char *out, const char *part)
{
    if (!strstr(out, part)) fail_msg("expected \"%s\" in:\n%s", part, out);
}

static void test_listing(void **state)
{
    (void)state;
    int code;
    char *out = ember("", "info", &code);
    assert_int_equal(code, 0);
    expect_in(out, "backends:\n  cpu      1 device");
    expect_in(out, "\ncpu: ");
    expect_in(out, "dtypes: bool");
    expect_in(out, "kernel cache: ");
    assert_null(strstr(out, "crashed"));
    free(out);
    out = ember("", "info --device cpu", &code);
    assert_int_equal(code, 0);
    expect_in(out, "cpu: ");
    assert_null(strstr(out, "backends:"));
    free(out);
    out = ember("", "info --device nosuch:1", &code);
    assert_int_equal(code, 1);
    expect_in(out, "nosuch:1: cannot open: unknown device");
    free(out);
    out = ember("", "info --frobnicate", &code);
    assert_int_equal(code, 2);
    expect_in(out, "usage: ember info");
    free(out);
}

static void test_crashing_driver(void **state)
{
    (void)state;
    int code;
    char *out = ember("EMBER_INFO_CRASH=cpu", "info", &code);
    assert_int_equal(code, 1);
    expect_in(out, "cpu: opening\n");
    expect_in(out, "cpu: its driver crashed while opening the device (Aborted)");
    expect_in(out, "kernel cache: "); /* the report went on */
    assert_null(strstr(out, "backtrace"));
    free(out);
    out = ember("EMBER_INFO_CRASH=cpu", "info --check", &code);
    assert_int_equal(code, 1);
    expect_in(out, "cpu        FAILED: its driver crashed (Aborted)");
    expect_in(out, " passed, 1 failed, "); /* the other devices were still checked */
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listing),
        cmocka_unit_test(test_crashing_driver),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
