/* test_schedule.c — learning-rate schedules at chosen steps against values computed by hand (the
 * formulas of optim.h worked out on paper or with a calculator, not by the code under test):
 * warmup, constant, linear, cosine, step and Noam, sequences of schedules, and kind names. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ember/optim.h"

#define CHECK(s, step, want)                                                                       \
    do {                                                                                           \
        double got_ = em_lr_at((s), (step));                                                       \
        if (fabs(got_ - (want)) > 1e-12 * fmax(1.0, fabs(want)))                                   \
            fail_msg("step %lld: lr %.17g, expected %.17g", (long long)(step), got_,               \
                     (double)(want));                                                              \
    } while (0)

static void test_constant_with_warmup(void **state)
{
    (void)state;
    em_lr_schedule s = {.kind = EM_LR_CONSTANT, .base = 0.1, .warmup = 10};
    CHECK(&s, 0, 0.0);  /* warmup starts from 0 */
    CHECK(&s, 5, 0.05); /* halfway */
    CHECK(&s, 9, 0.09);
    CHECK(&s, 10, 0.1);
    CHECK(&s, 1000, 0.1);
    CHECK(&s, -3, 0.0); /* negative steps count as 0 */
    em_lr_schedule nw = {.kind = EM_LR_CONSTANT, .base = 0.3};
    CHECK(&nw, 0, 0.3);
}

static void test_linear(void **state)
{
    (void)state;
    em_lr_schedule s = {
        .kind = EM_LR_LINEAR, .base = 1.0, .min_lr = 0.1, .warmup = 10, .total_steps = 110};
    CHECK(&s, 2, 0.2);
    CHECK(&s, 10, 1.0);
    CHECK(&s, 60, 0.55);  /* halfway through the 100 decay steps: 1 - 0.9 / 2 */
    CHECK(&s, 85, 0.325); /* 3/4: 1 - 0.9 * 0.75 */
    CHECK(&s, 110, 0.1);
    CHECK(&s, 500, 0.1); /* held at min_lr after total_steps */
}

static void test_cosine(void **state)
{
    (void)state;
    em_lr_schedule s = {.kind = EM_LR_COSINE, .base = 1.0, .total_steps = 100};
    CHECK(&s, 0, 1.0);
    CHECK(&s, 25, 0.8535533905932737); /* (1 + cos(pi / 4)) / 2 */
    CHECK(&s, 50, 0.5);
    CHECK(&s, 75, 0.1464466094067262); /* (1 - cos(pi / 4)) / 2 */
    CHECK(&s, 100, 0.0);
    CHECK(&s, 150, 0.0);
    em_lr_schedule w = {
        .kind = EM_LR_COSINE, .base = 6e-4, .min_lr = 6e-5, .warmup = 10, .total_steps = 110};
    CHECK(&w, 1, 6e-5); /* warmup: 6e-4 * 1/10 */
    CHECK(&w, 10, 6e-4);
    CHECK(&w, 60, 3.3e-4); /* 6e-5 + 5.4e-4 / 2 */
    CHECK(&w, 110, 6e-5);
}

static void test_step(void **state)
{
    (void)state;
    em_lr_schedule s = {
        .kind = EM_LR_STEP, .base = 1.0, .gamma = 0.5, .step_size = 10, .warmup = 5};
    CHECK(&s, 1, 0.2);
    CHECK(&s, 5, 1.0);
    CHECK(&s, 14, 1.0);
    CHECK(&s, 15, 0.5);
    CHECK(&s, 34, 0.25);
    CHECK(&s, 35, 0.125);
    em_lr_schedule none = {.kind = EM_LR_STEP, .base = 2.0, .gamma = 0.5};
    CHECK(&none, 100, 2.0); /* step_size 0: no decay */
}

static void test_noam(void **state)
{
    (void)state;
    em_lr_schedule s = {.kind = EM_LR_NOAM, .base = 1.0, .dim = 512, .warmup = 4000};
    CHECK(&s, 1, 1.746928107421711e-07); /* 512^-0.5 * 1 * 4000^-1.5 */
    CHECK(&s, 0, 1.746928107421711e-07); /* step 0 counts as 1 */
    CHECK(&s, 2000, 2000 * 1.746928107421711e-07);
    CHECK(&s, 4000, 0.0006987712429686843);   /* the peak: 512^-0.5 * 4000^-0.5 */
    CHECK(&s, 16000, 0.00034938562148434214); /* 512^-0.5 * 16000^-0.5 */
    em_lr_schedule b = {.kind = EM_LR_NOAM, .base = 2.0, .dim = 512, .warmup = 4000};
    CHECK(&b, 4000, 2 * 0.0006987712429686843);
}

static void test_sequence(void **state)
{
    (void)state;
    em_lr_schedule parts[2] = {
        {.kind = EM_LR_CONSTANT, .base = 0.5, .warmup = 4},
        {.kind = EM_LR_LINEAR, .base = 0.5, .min_lr = 0.0, .total_steps = 10},
    };
    int64_t starts[2] = {0, 20};
    em_lr_sequence q = {parts, starts, 2};
    double cases[][2] = {{0, 0.0},   {2, 0.25}, {19, 0.5}, {20, 0.5},
                         {25, 0.25}, {30, 0.0}, {99, 0.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = em_lr_sequence_at(&q, (int64_t)cases[i][0]);
        if (fabs(got - cases[i][1]) > 1e-12)
            fail_msg("sequence at %g: %g, expected %g", cases[i][0], got, cases[i][1]);
    }
}

static void test_parse(void **state)
{
    (void)state;
    const char *names[] = {"constant", "linear", "cosine", "step", "noam"};
    em_lr_kind kinds[] = {EM_LR_CONSTANT, EM_LR_LINEAR, EM_LR_COSINE, EM_LR_STEP, EM_LR_NOAM};
    for (int i = 0; i < 5; i++) {
        em_lr_kind k = EM_LR_CONSTANT;
        assert_true(em_lr_kind_parse(names[i], &k));
        assert_int_equal(k, kinds[i]);
    }
    em_lr_kind k;
    assert_false(em_lr_kind_parse("cosine-ish", &k));
    assert_non_null(strstr(em_last_error(), "cosine-ish"));
    assert_false(em_lr_kind_parse(NULL, &k));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant_with_warmup),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cosine),
        cmocka_unit_test(test_step),
        cmocka_unit_test(test_noam),
        cmocka_unit_test(test_sequence),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
