/* test_train_cli.c — `ember train`, `ember sample` and `ember chat` as a user runs them: a tiny
 * model trained from a text file in a temporary folder writes its checkpoint, tokenizer, metrics
 * (JSON lines) and loss curve, with plain log lines when stdout is not a terminal; `ember sample`
 * streams text from it, the same seed giving the same text and --stop cutting it; `ember chat`
 * answers lines from standard input; bad arguments get a usage message and exit status 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "base/file.h"
#include "data/data_util.h"

static char dir[512];

/* Runs `ember ARGS` (stderr folded into stdout); returns the output, status in *code. */
static char *ember(const char *args, int *code)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", EMBER_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = read_all(p, NULL);
    int st = pclose(p);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static int setup(void **state)
{
    (void)state;
    scratch_dir("cli-train", dir, sizeof dir);
    char path[700];
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < 150; i++) fputs("to be or not to be, that is the question.\n", f);
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_dir(dir);
    return 0;
}

static void test_train_then_sample(void **state)
{
    (void)state;
    char args[2048];
    int code;
    snprintf(args, sizeof args,
             "train --data %s/text.txt --out %s/run --device cpu --n-layer 1 --n-head 2 "
             "--n-embd 32 --block-size 32 --batch 4 --steps 15 --lr 1e-2 --warmup 2 --no-shuffle "
             "--eval-every 5 --eval-batches 1 --sample-every 10 --sample-tokens 20",
             dir, dir);
    char *out = ember(args, &code);
    if (code != 0) fail_msg("ember train failed (%d):\n%s", code, out);
    /* Plain lines (stdout is a pipe here). */
    assert_non_null(strstr(out, "step     15/15"));
    assert_non_null(strstr(out, "validation loss"));
    assert_non_null(strstr(out, "sample at step 10"));
    free(out);
    const char *files[] = {"ckpt.safetensors", "tokenizer.json", "metrics.jsonl", "loss.svg"};
    for (int i = 0; i < 4; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/run/%s", dir, files[i]);
        if (!em_file_exists(p)) fail_msg("missing %s", p);
    }
    char p[800];
    snprintf(p, sizeof p, "%s/run/metrics.jsonl", dir);
    char *log = em_file_read(p, NULL);
    int lines = 0;
    for (char *s = log; (s = strstr(s, "\"loss\"")); s++) lines++;
    assert_int_equal(lines, 15);
    free(log);
    /* Sampling: seeded text, reproducible, streaming to stdout. */
    snprintf(args, sizeof args,
             "sample --checkpoint %s/run --device cpu --prompt 'to be' --max-tokens 30 --seed 7",
             dir);
    char *a = ember(args, &code);
    assert_int_equal(code, 0);
    char *b = ember(args, &code);
    assert_int_equal(code, 0);
    assert_string_equal(a, b);
    assert_true(strncmp(a, "to be", 5) == 0);
    assert_true(strlen(a) > 20);
    fprintf(stderr, "[cli] sample: %s", a);
    free(b);
    /* --stop: the text ends before the stop string. */
    snprintf(args, sizeof args,
             "sample --checkpoint %s/run/ckpt.safetensors --device cpu --prompt 'to' "
             "--max-tokens 60 --temperature 0 --stop ' ' --no-echo",
             dir);
    char *s = ember(args, &code);
    assert_int_equal(code, 0);
    assert_null(strchr(s, ' '));
    free(s);
    free(a);
    /* Chat: two lines in, two replies out, /quit ends. */
    snprintf(args, sizeof args,
             "chat --checkpoint %s/run --device cpu --max-tokens 10 --seed 3 "
             "< /dev/null",
             dir);
    char *c = ember(args, &code);
    assert_int_equal(code, 0);
    free(c);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "printf 'to be\\n/reset\\nquestion\\n/quit\\n' | '%s' chat --checkpoint %s/run "
             "--device cpu --max-tokens 10",
             EMBER_CLI_PATH, dir);
    FILE *pp = popen(cmd, "r");
    char *reply = read_all(pp, NULL);
    assert_int_equal(pclose(pp), 0);
    assert_non_null(strstr(reply, "(conversation reset)"));
    free(reply);
    /* Resume continues to more steps. */
    snprintf(args, sizeof args,
             "train --data %s/text.txt --out %s/run --device cpu --n-layer 1 --n-head 2 "
             "--n-embd 32 --block-size 32 --batch 4 --steps 18 --resume --sample-every -1 --no-shuffle",
             dir, dir);
    out = ember(args, &code);
    if (code != 0) fail_msg("ember train --resume failed (%d):\n%s", code, out);
    assert_non_null(strstr(out, "step     18/18"));
    assert_null(strstr(out, "step      1/18"));
    free(out);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "train",
        "train --data",
        "train --data x --batch zero",
        "train --data x --preset gpt7",
        "train --data x --frobnicate",
        "train --data x --schedule wiggly",
        "train --data x --dashboard fancy",
        "train --data x --n-embd 30 --n-head 4",
        "sample",
        "sample --checkpoint x --top-p 1.5",
        "sample --checkpoint x --temperature -1",
        "sample --checkpoint x --max-tokens many",
        "chat --checkpoint x --top-k -2",
        "chat --bogus",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code;
        char *out = ember(bad[i], &code);
        if (code != 2 || !strstr(out, "usage:"))
            fail_msg("`ember %s`: status %d, output:\n%s", bad[i], code, out);
        free(out);
    }
    /* A missing checkpoint is an error (status 1) naming it. */
    int code;
    char *out = ember("sample --checkpoint /nonexistent/ckpt.safetensors --device cpu", &code);
    assert_int_equal(code, 1);
    assert_non_null(strstr(out, "/nonexistent/ckpt.safetensors"));
    free(out);
    /* AdamW's eps: a negative or non-finite one is named */
    static const char *const eps[] = {"train --data x --eps -1", "train --data x --eps inf"};
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        out = ember(eps[i], &code);
        if (code != 2 || !strstr(out, "--eps must be a finite number"))
            fail_msg("`ember %s`: status %d, output:\n%s", eps[i], code, out);
        free(out);
    }
    out = ember("train --help", &code);
    assert_int_equal(code, 0);
    assert_non_null(strstr(out, "--grad-accum"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_train_then_sample),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
