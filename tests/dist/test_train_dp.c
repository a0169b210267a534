/* test_train_dp.c — data-parallel `ember train` gives the run of one process with the combined
 * batch: `mpirun -np 2 ember train --batch 4` (with and without --zero1) and `ember train --batch
 * 8` (a tiny GPT, dropout 0, on the CPU, from the same text) must log the same training and
 * validation losses, gradient norms and token counts in metrics.jsonl, step by step, within
 * floating-point tolerance (the ranks' gradients are averaged in another order than one process
 * sums them). Only rank 0 reports and writes; the ZeRO-1 checkpoint holds the whole optimizer
 * state, so one process resumes from it exactly as from its own. Skipped when mpirun is missing
 * (tests/dist/mpirun.sh exits 77). The kernels are those of the train tests (the shared test
 * cache); autotuning is off so both runs pick the same kernels whatever the timing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/file.h"
#include "data/data_util.h"

#define MPIRUN EMBER_SOURCE_DIR "/tests/dist/mpirun.sh"

static char dir[512];

/* Runs a shell command (stderr folded in); returns its exit status, output in *out. */
static int sh(const char *cmd, char **out)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    *out = read_all(p, NULL);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Fails (showing the output) unless the command succeeded; frees the output either way. */
static void expect_ok(int code, char *out, const char *what)
{
    if (code != 0) fprintf(stderr, "%s failed (%d):\n%s\n", what, code, out);
    free(out);
    if (code != 0) fail_msg("%s failed", what);
}

static int setup(void **state)
{
    (void)state;
    scratch_dir("dist-train", dir, sizeof dir);
    char path[700];
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and"};
    uint32_t x = 12345;
    for (int i = 0; i < 5000; i++) {
        x = x * 1103515245u + 12345u;
        fprintf(f, "%s%c", words[(x >> 16) % 9], i % 12 == 11 ? '\n' : ' ');
    }
    fclose(f);
    setenv("EMBER_AUTOTUNE", "off", 1);
    /* Sanitizer builds: Open MPI's allocations at exit are suppressed by library name
     * (tests/lsan.supp), which needs whole stacks — its plugins have no frame pointers. */
    const char *lsan = getenv("LSAN_OPTIONS");
    char opts[2048];
    snprintf(opts, sizeof opts, "%s%sfast_unwind_on_malloc=0", lsan ? lsan : "",
             lsan && *lsan ? ":" : "");
    setenv("LSAN_OPTIONS", opts, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_dir(dir);
    return 0;
}

/* One metrics line: a train step (loss set) or a validation (val_loss set). */
typedef struct point {
    int step;
    double loss, val_loss, grad_norm, tokens;
} point;

static int read_metrics(const char *path, point *pts, int max)
{
    char *text = em_file_read(path, NULL);
    if (!text) fail_msg("cannot read %s", path);
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
        cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
        cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "val_loss");
        cJSON *norm = cJSON_GetObjectItemCaseSensitive(o, "grad_norm");
        cJSON *tok = cJSON_GetObjectItemCaseSensitive(o, "tokens");
        pts[n] = (point){step ? step->valueint : -1, loss ? loss->valuedouble : NAN,
                         val ? val->valuedouble : NAN, norm ? norm->valuedouble : NAN,
                         tok ? tok->valuedouble : NAN};
        n++;
        cJSON_Delete(o);
    }
    free(text);
    return n;
}

static void same(double a, double b, const char *what, int step)
{
    if (isnan(a) && isnan(b)) return;
    if (!(fabs(a - b) <= 1e-4 * fmax(1, fabs(a))))
        fail_msg("step %d: %s %.7g (one process) vs %.7g (2 ranks)", step, what, a, b);
}

static void test_two_ranks_match_one_process(void **state)
{
    (void)state;
    char *out;
    if (sh(MPIRUN " 1 true", &out) == 77) {
        free(out);
        skip();
    }
    free(out);
    const char *args = "train --data %s/text.txt --device cpu --n-layer 1 --n-head 2 --n-embd 32 "
                       "--block-size 32 --seq 32 --steps 5 --dropout 0 --lr 1e-2 --warmup 1 "
                       "--eval-every 2 --eval-batches 2 --sample-every -1 --dashboard plain "
                       "--batch %d --out %s/%s %s";
    char fmt[1024], cmd[4096];
    snprintf(fmt, sizeof fmt, "'%s' %s", EMBER_CLI_PATH, args);
    snprintf(cmd, sizeof cmd, fmt, dir, 8, dir, "one", "");
    int code = sh(cmd, &out);
    expect_ok(code, out, "ember train");
    snprintf(fmt, sizeof fmt, "'%s' 2 '%s' %s", MPIRUN, EMBER_CLI_PATH, args);
    const char *runs[] = {"two", "zero"};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, fmt, dir, 4, dir, runs[k], k ? "--zero1" : "");
        code = sh(cmd, &out);
        /* Rank 0 reports, once, and says how many ranks there are. */
        char *first = strstr(out, "step      5/5");
        bool once = strstr(out, "2 ranks (mpi)") && first && !strstr(first + 1, "step      5/5");
        expect_ok(code, out, k ? "mpirun -np 2 ember train --zero1" : "mpirun -np 2 ember train");
        assert_true(once);
    }
    /* One process continues the ZeRO-1 run from its checkpoint as it continues its own. */
    snprintf(fmt, sizeof fmt, "'%s' %s", EMBER_CLI_PATH, args);
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, fmt, dir, 8, dir, k ? "zero" : "one", "--resume --steps 7");
        code = sh(cmd, &out);
        expect_ok(code, out, "ember train --resume");
    }

    point a[32], b[32];
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/one/metrics.jsonl", dir);
    int na = read_metrics(pa, a, 32);
    /* steps 1-5 with validations at 2, 4 and 5; resumed: steps 6 and 7 with validations */
    assert_int_equal(na, 5 + 3 + 4);
    assert_true(a[6].loss < a[0].loss - 0.1); /* training happened: step 5 is below step 1 */
    for (int k = 0; k < 2; k++) {
        snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, runs[k]);
        int nb = read_metrics(pb, b, 32);
        assert_int_equal(nb, k ? na : 5 + 3);
        for (int i = 0; i < nb; i++) {
            assert_int_equal(a[i].step, b[i].step);
            same(a[i].loss, b[i].loss, "loss", a[i].step);
            same(a[i].val_loss, b[i].val_loss, "validation loss", a[i].step);
            same(a[i].grad_norm, b[i].grad_norm, "gradient norm", a[i].step);
            same(a[i].tokens, b[i].tokens, "tokens", a[i].step);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_match_one_process),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
