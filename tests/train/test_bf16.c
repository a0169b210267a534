/* test_bf16.c — bf16 mixed precision in the training loop (on the CPU, which computes bf16 like
 * any device): from the same initialization and data, a bf16 run's losses follow the f32 run's
 * within bf16 rounding, the masters stay f32 (the checkpoint holds f32 weights), and the run
 * learns. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data/data_util.h"
#include "ember/train.h"

typedef struct record {
    double loss[32];
    int n;
} record;

static void on_step(void *user, const em_train_metrics *m)
{
    record *r = user;
    if (r->n < 32) r->loss[r->n++] = m->loss;
}

static void run(const char *text, const char *out, bool bf16, record *r)
{
    em_train_config c;
    em_train_config_default(&c);
    c.model = (em_gpt_config){0, 16, 1, 2, 32, 0.0, true, true};
    c.data = text;
    c.out_dir = out;
    c.device = "cpu";
    c.batch = 4;
    c.max_steps = 8;
    c.lr = (em_lr_schedule){.kind = EM_LR_CONSTANT, .base = 1e-2};
    c.eval_every = 0;
    c.sample_every = -1;
    c.bf16 = bf16;
    c.seed = 3;
    em_trainer *t = em_trainer_new(&c);
    if (!t) fail_msg("trainer: %s", em_last_error());
    em_train_observer o = {0};
    o.step = on_step;
    o.user = r;
    if (em_trainer_run(t, &o) != EM_OK) fail_msg("run: %s", em_last_error());
    em_trainer_free(t);
}

static void test_bf16_follows_f32(void **state)
{
    (void)state;
    char dir[512], text[700], a[700], b[700], ck[800];
    scratch_dir("train-bf16", dir, sizeof dir);
    snprintf(text, sizeof text, "%s/t.txt", dir);
    FILE *f = fopen(text, "w");
    for (int i = 0; i < 60; i++) fputs("abc abd abe bcd bce. ", f);
    fclose(f);
    snprintf(a, sizeof a, "%s/f32", dir);
    snprintf(b, sizeof b, "%s/bf16", dir);
    record r32 = {{0}, 0}, r16 = {{0}, 0};
    run(text, a, false, &r32);
    run(text, b, true, &r16);
    assert_int_equal(r16.n, 8);
    bool differ = false; /* bf16 really computed: not bit-identical to f32 */
    for (int i = 0; i < 8; i++) {
        differ |= r32.loss[i] != r16.loss[i];
        fprintf(stderr, "[bf16] step %d: f32 %.4f bf16 %.4f\n", i + 1, r32.loss[i], r16.loss[i]);
        assert_true(fabs(r32.loss[i] - r16.loss[i]) < 0.05 * (1 + r32.loss[i]));
    }
    assert_true(differ);
    assert_true(r16.loss[7] < r16.loss[0] - 0.3);
    snprintf(ck, sizeof ck, "%s/ckpt.safetensors", b);
    em_safetensors *s = em_safetensors_open(ck);
    assert_non_null(s);
    em_scalar dt;
    em_shape sh;
    assert_true(em_safetensors_info(s, "h.0.attn.c_attn.weight", &dt, &sh));
    assert_int_equal(dt, EM_F32);
    em_safetensors_close(s);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bf16_follows_f32)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
