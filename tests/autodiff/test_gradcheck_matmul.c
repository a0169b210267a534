/* test_gradcheck_matmul.c — finite-difference checks (float64, CPU) of matmul's backward rule:
 * 2-D, batched, batch broadcasting (also of a missing batch dim or one of size 1, whose
 * gradient folds the batches into one matmul), the 1-D promotions of
 * torch.matmul (vector @ matrix, matrix @ vector, dot, vector @ batch) and transposed operands;
 * and an f32 check on every device against the CPU f64 gradient. */
#include "autodiff/gradcheck.h"

static em_tensor *f_mm(em_tensor *const *in, const void *arg)
{
    (void)arg;
    return gc_wsum(em_matmul(in[0], in[1]));
}

static em_tensor *f_mm_t(em_tensor *const *in, const void *arg)
{
    (void)arg;
    return gc_wsum(em_matmul(em_transpose(in[0], -1, -2), em_transpose(in[1], 0, 1)));
}

/* (a @ b) applied twice with a nonlinearity between: the gradient reaching matmul varies */
static em_tensor *f_mm_chain(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *h = em_tanh(em_matmul(in[0], in[1]));
    return gc_wsum(em_matmul(h, em_transpose(in[1], 0, 1)));
}

static const gc_case cases[] = {
    {.name = "mm", .f = f_mm, .nin = 2, .shape = {EM_SHAPE(3, 4), EM_SHAPE(4, 5)}, .device = true},
    {.name = "bmm",
     .f = f_mm,
     .nin = 2,
     .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(2, 4, 2)},
     .device = true},
    {.name = "batch_broadcast",
     .f = f_mm,
     .nin = 2,
     .shape = {EM_SHAPE(2, 1, 3, 4), EM_SHAPE(3, 4, 2)},
     .device = true},
    {.name = "batch_missing",
     .f = f_mm,
     .nin = 2,
     .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(4, 2)},
     .device = true},
    {.name = "batch_one", .f = f_mm, .nin = 2, .shape = {EM_SHAPE(2, 2, 3, 4), EM_SHAPE(1, 4, 2)}},
    {.name = "vec_mat",
     .f = f_mm,
     .nin = 2,
     .shape = {EM_SHAPE(4), EM_SHAPE(4, 3)},
     .device = true},
    {.name = "mat_vec",
     .f = f_mm,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(4)},
     .device = true},
    {.name = "dot", .f = f_mm, .nin = 2, .shape = {EM_SHAPE(5), EM_SHAPE(5)}},
    {.name = "vec_batch", .f = f_mm, .nin = 2, .shape = {EM_SHAPE(4), EM_SHAPE(2, 4, 3)}},
    {.name = "batch_vec", .f = f_mm, .nin = 2, .shape = {EM_SHAPE(2, 3, 4), EM_SHAPE(4)}},
    {.name = "transposed", .f = f_mm_t, .nin = 2, .shape = {EM_SHAPE(2, 4, 3), EM_SHAPE(2, 4)}},
    {.name = "chain", .f = f_mm_chain, .nin = 2, .shape = {EM_SHAPE(3, 4), EM_SHAPE(4, 5)}},
};

GC_STANDARD_TESTS(cases)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_devices),
    };
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
