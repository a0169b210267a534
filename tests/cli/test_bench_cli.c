/* test_bench_cli.c — `ember bench decode`, `train-gpt2` and `attention` as a user runs them: on
 * the CPU with the tiny preset each prints one JSON line with its reference's fields (decode:
 * workload, impl, dtype, batch, new_tokens, tokens_per_s; train-gpt2: those of
 * ../shared/anchors/gpt2_train.py) and its own (device, ...), the figures positive and consistent
 * with each other; --dtype bf16 is reported in the reference's spelling; bad arguments get a
 * usage message and exit status 2; `ember bench matmul --bt --at --graph` says what it timed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "data/data_util.h"

/* Runs `ember ARGS` with stderr as `err` says ("2>&1", "2>/dev/null"); returns the output,
 * status in *code. */
static char *ember(const char *args, const char *err, int *code)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s %s", EMBER_CLI_PATH, args, err);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = read_all(p, NULL);
    int st = pclose(p);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static double number(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v)) fail_msg("field '%s' is missing or not a number", name);
    return v->valuedouble;
}

static const char *string(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(v)) fail_msg("field '%s' is missing or not a string", name);
    return v->valuestring;
}

/* Runs the benchmark and returns its one JSON line, parsed. */
static cJSON *bench_json(const char *args)
{
    int code;
    char *out = ember(args, "2>/dev/null", &code);
    if (code != 0) fail_msg("`ember %s`: status %d, output:\n%s", args, code, out);
    fprintf(stderr, "[ember %s] %s", args, out);
    char *nl = strchr(out, '\n');
    if (!nl || nl[1]) fail_msg("`ember %s` did not print one line:\n%s", args, out);
    cJSON *o = cJSON_Parse(out);
    if (!cJSON_IsObject(o)) fail_msg("`ember %s` did not print a JSON object:\n%s", args, out);
    free(out);
    return o;
}

static cJSON *decode(const char *args) { return bench_json(args); }

static void test_decode_json(void **state)
{
    (void)state;
    cJSON *o = decode("bench decode --device cpu --preset tiny --batch 2 --new 8");
    assert_string_equal(string(o, "workload"), "gpt2_decode");
    assert_string_equal(string(o, "impl"), "ember");
    assert_string_equal(string(o, "dtype"), "fp32");
    assert_string_equal(string(o, "device"), "cpu");
    assert_string_equal(string(o, "preset"), "tiny");
    assert_true(number(o, "batch") == 2);
    assert_true(number(o, "new_tokens") == 8);
    assert_true(number(o, "prompt_tokens") == 16);
    double tps = number(o, "tokens_per_s"), pre = number(o, "prefill_ms"),
           step = number(o, "ms_per_step");
    assert_true(tps > 0);
    assert_true(pre > 0);
    assert_true(step > 0);
    /* 2 x 8 tokens over the prefills and 7 steps (the figures are rounded when printed). */
    double want = 16.0 / ((pre + 7 * step) * 1e-3);
    if (tps < want * 0.99 - 0.1 || tps > want * 1.01 + 0.1)
        fail_msg("tokens_per_s %g, but 16 tokens in %g + 7 x %g ms make %g", tps, pre, step, want);
    cJSON_Delete(o);
    o = decode("bench decode --device cpu --preset tiny --dtype bf16 --prompt 3 --new 2 --seed 5");
    assert_string_equal(string(o, "dtype"), "bf16");
    assert_true(number(o, "batch") == 1);
    assert_true(number(o, "new_tokens") == 2);
    assert_true(number(o, "prompt_tokens") == 3);
    assert_true(number(o, "tokens_per_s") > 0);
    assert_true(number(o, "steps_per_sync") == 1);
    cJSON_Delete(o);
    /* 9 steps 4 at a time: chunks of 4, 4 and 1 */
    o = decode("bench decode --device cpu --preset tiny --batch 2 --new 10 --steps-per-sync 4");
    assert_true(number(o, "steps_per_sync") == 4);
    assert_true(number(o, "new_tokens") == 10);
    assert_true(number(o, "ms_per_step") > 0);
    cJSON_Delete(o);
}

/* Training speed: the reference's fields, tokens/s consistent with ms per step, the model the
 * options asked for, a loss near ln(vocabulary) (random tokens teach nothing in three steps). */
static void test_train_json(void **state)
{
    (void)state;
    cJSON *o = bench_json("bench train-gpt2 --device cpu --preset tiny --batch 2 --seq 32 "
                          "--steps 2 --warmup 1");
    assert_string_equal(string(o, "workload"), "gpt2_train");
    assert_string_equal(string(o, "impl"), "ember");
    assert_string_equal(string(o, "device"), "cpu");
    assert_int_equal((int)number(o, "batch"), 2);
    assert_int_equal((int)number(o, "seq"), 32);
    assert_int_equal((int)number(o, "layers"), 4);
    assert_int_equal((int)number(o, "dim"), 128);
    double ms = number(o, "ms_per_step"), tps = number(o, "tokens_per_s");
    assert_true(ms > 0 && tps > 0);
    assert_true(fabs(tps - 64.0 / (ms / 1000.0)) <= 0.02 * tps + 1);
    assert_true(number(o, "params") > 100000);
    assert_true(number(o, "peak_mem_gib") >= 0 && number(o, "model_tflops") >= 0);
    double loss = number(o, "loss"), vocab_ln = log(256.0); /* tiny: a vocabulary of 256 */
    if (!(fabs(loss - vocab_ln) < 1.5)) fail_msg("loss %g, expected near ln 256 = %g", loss, vocab_ln);
    double params = number(o, "params");
    /* ember's own fields: fusion on unless EMBER_FUSION=0, launches and bytes per step */
    const char *fu = getenv("EMBER_FUSION");
    bool fused = !(fu && !strcmp(fu, "0"));
    cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "fusion");
    assert_true(cJSON_IsBool(f) && cJSON_IsTrue(f) == fused);
    double launches = number(o, "launches_per_step"), flaunches = number(o, "fused_launches_per_step");
    assert_true(launches > 0 && flaunches <= launches && (flaunches > 0) == fused);
    assert_true(number(o, "gib_read_per_step") > 0 && number(o, "gib_written_per_step") > 0);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "recompute")));
    /* the warm-up's peak is reported apart from the timed steps' (reset after the warm-up) */
    assert_true(number(o, "peak_mem_warmup_gib") > 0);
    /* the bytes asked for never exceed the blocks the pool holds for them */
    assert_true(number(o, "peak_mem_requested_gib") > 0 &&
                number(o, "peak_mem_requested_gib") <= number(o, "peak_mem_gib"));
    cJSON_Delete(o);
    /* recomputing in the backward trains the same model: the same loss after the same steps */
    o = bench_json("bench train-gpt2 --device cpu --preset tiny --batch 2 --seq 32 --steps 2 "
                   "--warmup 1 --recompute");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "recompute")));
    if (number(o, "loss") != loss)
        fail_msg("loss %.6g with --recompute, %.6g without", number(o, "loss"), loss);
    cJSON_Delete(o);
    o = bench_json("bench train-gpt2 --device cpu --preset tiny --batch 1 --seq 16 --steps 1 "
                   "--warmup 1 --layers 2 --dim 64 --heads 2 --fp32");
    assert_int_equal((int)number(o, "layers"), 2);
    assert_int_equal((int)number(o, "dim"), 64);
    assert_string_equal(string(o, "dtype"), "fp32");
    assert_true(number(o, "params") < params / 2);
    cJSON_Delete(o);
}

/* `ember bench matmul --graph` (the timed matmuls replayed as one graph), `--bt` and `--cold`
 * on the CPU: one JSON line per shape saying so, with a positive time; a bad shape list is an
 * error. */
static void test_matmul_graph_json(void **state)
{
    (void)state;
    for (int graph = 0; graph < 2; graph++) {
        /* --at with the graph only: both layouts' flags reported */
        cJSON *o = bench_json(graph ? "bench matmul --device cpu --shapes 3x40x24 --bt --at --graph"
                                    : "bench matmul --device cpu --shapes 3x40x24 --bt");
        assert_string_equal(string(o, "bench"), "matmul");
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "graph");
        const cJSON *bt = cJSON_GetObjectItemCaseSensitive(o, "bt");
        const cJSON *at = cJSON_GetObjectItemCaseSensitive(o, "at");
        assert_true(cJSON_IsBool(g) && cJSON_IsBool(bt) && cJSON_IsBool(at));
        assert_int_equal(cJSON_IsTrue(g), graph);
        assert_int_equal(cJSON_IsTrue(at), graph);
        assert_true(cJSON_IsTrue(bt));
        /* the configuration that ran, in EMBER_MATMUL_CONFIG's form */
        assert_true(strlen(string(o, "config")) > 0 && strchr(string(o, "config"), 'x'));
        assert_true(number(o, "ember_ms") > 0);
        cJSON_Delete(o);
    }
    /* --cold: b rotated through copies exceeding the cache (256 MiB / 3.75 KiB: the cap, 64),
     * at least one timed matmul per copy, and no reference timed on other data */
    cJSON *o = bench_json("bench matmul --device cpu --shapes 3x40x24 --graph --cold --iters 2");
    assert_int_equal((int)number(o, "cold_copies"), 64);
    assert_true(number(o, "iters") >= 64);
    assert_true(number(o, "ember_ms") > 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "ref")));
    cJSON_Delete(o);
    o = bench_json("bench matmul --device cpu --shapes 3x40x24");
    assert_int_equal((int)number(o, "cold_copies"), 0);
    assert_int_equal((int)number(o, "rounds"), 1); /* timed rounds: one on the CPU */
    cJSON_Delete(o);
    int code;
    char *out = ember("bench matmul --device cpu --shapes 3x40 --graph", "2>&1", &code);
    if (code == 0 || !strstr(out, "bad shape list"))
        fail_msg("a bad shape list: status %d, output:\n%s", code, out);
    free(out);
}

/* `ember bench attention` on the CPU: one JSON line with the shape asked for, positive times, and
 * TFLOP/s that are the model's work over those times (4 B H T(T+1)/2 D causal, 2.5 times that
 * backward); the tiles it names are those in effect (EMBER_ATTENTION_TILES', or the defaults for
 * the head size, with a warning naming a bad value); a head size past 256 is an error (status 1)
 * naming it. */
static void test_attention_json(void **state)
{
    (void)state;
    cJSON *o = bench_json("bench attention --device cpu --batch 2 --heads 3 --seq 40 --dim 64 "
                          "--iters 1");
    assert_string_equal(string(o, "bench"), "attention");
    assert_string_equal(string(o, "dtype"), "bf16");
    assert_int_equal((int)number(o, "batch"), 2);
    assert_int_equal((int)number(o, "heads"), 3);
    assert_int_equal((int)number(o, "seq"), 40);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "causal")));
    assert_string_equal(string(o, "tiles"), "1:64:1:48:1:64"); /* the defaults at D 64 */
    double fwd = number(o, "fwd_ms"), bwd = number(o, "bwd_ms");
    assert_true(fwd > 0 && bwd > 0);
    double flop = 4.0 * 2 * 3 * (40.0 * 41 / 2) * 64;
    double want = flop / (fwd * 1e-3) * 1e-12;
    assert_true(fabs(number(o, "fwd_tflops") - want) <= 1e-4 + 1e-3 * want);
    want = 2.5 * flop / (bwd * 1e-3) * 1e-12;
    assert_true(fabs(number(o, "bwd_tflops") - want) <= 1e-4 + 1e-3 * want);
    cJSON_Delete(o);
    setenv("EMBER_ATTENTION_TILES", "1:64:1:32:1:32", 1);
    o = bench_json("bench attention --device cpu --batch 1 --heads 1 --seq 16 --dim 8 --dtype f32 "
                   "--no-causal --iters 1");
    unsetenv("EMBER_ATTENTION_TILES");
    assert_false(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "causal")));
    assert_string_equal(string(o, "dtype"), "f32");
    assert_string_equal(string(o, "tiles"), "1:64:1:32:1:32");
    cJSON_Delete(o);
    /* at D 128 the defaults take two warpgroups a cube */
    o = bench_json("bench attention --device cpu --batch 1 --heads 1 --seq 16 --dim 128 --iters 1");
    assert_string_equal(string(o, "tiles"), "2:128:2:64:2:64");
    cJSON_Delete(o);
    /* tiles out of range or malformed: a warning naming the value, and the defaults run */
    static const char *const bad_tiles[] = {"2:100:2:64:2:64", "5:128:2:64:2:64", "2:128:2:64",
                                            "junk"};
    int code;
    for (size_t i = 0; i < sizeof bad_tiles / sizeof bad_tiles[0]; i++) {
        char warning[64];
        setenv("EMBER_ATTENTION_TILES", bad_tiles[i], 1);
        char *out = ember("bench attention --device cpu --batch 1 --heads 1 --seq 16 --dim 8 "
                          "--iters 1",
                          "2>&1", &code);
        unsetenv("EMBER_ATTENTION_TILES");
        snprintf(warning, sizeof warning, "EMBER_ATTENTION_TILES='%s' is not", bad_tiles[i]);
        if (code != 0 || !strstr(out, warning) || !strstr(out, "\"tiles\":\"1:64:1:48:1:64\""))
            fail_msg("EMBER_ATTENTION_TILES=%s: status %d, output:\n%s", bad_tiles[i], code, out);
        free(out);
    }
    char *out =
        ember("bench attention --device cpu --seq 8 --dim 300 --batch 1 --heads 1", "2>&1", &code);
    if (code != 1 || !strstr(out, "head size 300"))
        fail_msg("head size 300: status %d, output:\n%s", code, out);
    free(out);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "bench",
        "bench frobnicate",
        "bench decode --batch 0",
        "bench decode --batch two",
        "bench decode --new -4",
        "bench decode --prompt",
        "bench decode --dtype f64",
        "bench decode --preset gpt7",
        "bench decode --preset tiny --prompt 100 --new 100", /* past the context of 128 */
        "bench decode --seed -1",
        "bench decode --frobnicate 1",
        "bench decode --steps-per-sync 0",
        "bench decode --steps-per-sync 4 --greedy host",
        "bench train-gpt2 --steps 0",
        "bench train-gpt2 --batch two",
        "bench train-gpt2 --seq",
        "bench train-gpt2 --preset gpt7",
        "bench train-gpt2 --seed -1",
        "bench train-gpt2 --frobnicate 1",
        "bench attention --seq 0",
        "bench attention --dtype int8",
        "bench attention --heads",
        "bench attention --causal",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code;
        char *out = ember(bad[i], "2>&1", &code);
        if (code != 2 || !strstr(out, "usage:"))
            fail_msg("`ember %s`: status %d, output:\n%s", bad[i], code, out);
        free(out);
    }
    /* A device that does not exist is an error (status 1), not a usage. */
    int code;
    char *out = ember("bench decode --device nosuch:3 --preset tiny --new 2", "2>&1", &code);
    if (code != 1) fail_msg("an unknown device: status %d, output:\n%s", code, out);
    free(out);
    out = ember("bench decode --help", "2>&1", &code);
    assert_int_equal(code, 0);
    assert_non_null(strstr(out, "--prompt"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),  cmocka_unit_test(test_decode_json),
        cmocka_unit_test(test_train_json),     cmocka_unit_test(test_matmul_graph_json),
        cmocka_unit_test(test_attention_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
