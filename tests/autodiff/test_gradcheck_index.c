/* test_gradcheck_index.c — finite-difference checks (float64, CPU) of the backward rules of the
 * indexing ops: index_select (repeated indices accumulate), gather, scatter (target and src),
 * scatter_add, embedding; plus the gradient of an embedding against known counts, and an f32
 * check of a few cases on every device against the CPU f64 gradient. */
#include "autodiff/gradcheck.h"

static em_tensor *f_index_select0(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const int64_t idx[4] = {2, 0, 2, 1};
    return gc_wsum(em_sin(em_index_select(in[0], 0, gc_index(in[0], EM_SHAPE(4), idx))));
}

static em_tensor *f_index_select_neg(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const int64_t idx[3] = {3, 3, 0};
    return gc_wsum(em_exp(em_index_select(in[0], -1, gc_index(in[0], EM_SHAPE(3), idx))));
}

/* x [3, 4], index [3, 2] along dim 1 (with a repeat in row 1) */
static em_tensor *f_gather(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const int64_t idx[6] = {0, 3, 1, 1, 2, 0};
    return gc_wsum(em_sin(em_gather(in[0], 1, gc_index(in[0], EM_SHAPE(3, 2), idx))));
}

/* along dim 0: index [2, 4] into x [3, 4] */
static em_tensor *f_gather0(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const int64_t idx[8] = {2, 0, 1, 2, 0, 0, 2, 1};
    return gc_wsum(em_exp(em_gather(in[0], 0, gc_index(in[0], EM_SHAPE(2, 4), idx))));
}

/* t [3, 4] <- src [3, 3] at index [3, 2] along dim 1 (no repeats within a row) */
static const int64_t scatter_idx[6] = {1, 3, 0, 2, 3, 0};

static em_tensor *f_scatter(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *idx = gc_index(in[0], EM_SHAPE(3, 2), scatter_idx);
    return gc_wsum(em_sin(em_scatter(in[0], 1, idx, em_exp(in[1]))));
}

static em_tensor *f_scatter_add(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const int64_t idx[6] = {1, 1, 0, 2, 3, 3}; /* repeats accumulate */
    em_tensor *i = gc_index(in[0], EM_SHAPE(3, 2), idx);
    return gc_wsum(em_sin(em_scatter_add(in[0], 1, i, em_exp(in[1]))));
}

/* weight [5, 3], ids [2, 3] with repeats */
static em_tensor *f_embedding(em_tensor *const *in, const void *arg)
{
    (void)arg;
    static const int64_t ids[6] = {4, 0, 4, 2, 2, 4};
    return gc_wsum(em_tanh(em_embedding(in[0], gc_index(in[0], EM_SHAPE(2, 3), ids))));
}

static const gc_case cases[] = {
    {.name = "index_select0",
     .f = f_index_select0,
     .nin = 1,
     .shape = {EM_SHAPE(3, 2)},
     .device = true},
    {.name = "index_select_neg", .f = f_index_select_neg, .nin = 1, .shape = {EM_SHAPE(2, 4)}},
    {.name = "gather", .f = f_gather, .nin = 1, .shape = {EM_SHAPE(3, 4)}, .device = true},
    {.name = "gather0", .f = f_gather0, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "scatter",
     .f = f_scatter,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(3, 3)},
     .device = true},
    {.name = "scatter_add",
     .f = f_scatter_add,
     .nin = 2,
     .shape = {EM_SHAPE(3, 4), EM_SHAPE(3, 2)},
     .device = true},
    {.name = "embedding", .f = f_embedding, .nin = 1, .shape = {EM_SHAPE(5, 3)}, .device = true},
};

GC_STANDARD_TESTS(cases)

/* sum(embedding(w, ids)) gives each row of w the number of times its id occurs. */
static void test_embedding_counts(void **state)
{
    (void)state;
    em_device *cpu = cpu_dev();
    double wv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    em_tensor *w = tu_tensor(cpu, EM_F64, EM_SHAPE(4, 2), wv);
    assert_int_equal(em_set_requires_grad(w, true), EM_OK);
    static const int64_t ids[5] = {3, 1, 3, 3, 0};
    em_scope_begin();
    em_tensor *e = em_embedding(w, gc_index(w, EM_SHAPE(5), ids));
    em_tensor *loss = em_sum(e, NULL, 0, false);
    assert_int_equal(em_backward(loss, NULL), EM_OK);
    em_scope_end(NULL, 0);
    tu_check("embedding counts", em_grad(w), EM_SHAPE(4, 2), (double[]){1, 1, 1, 1, 0, 0, 3, 3},
             1e-12);
    em_release(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_embedding_counts),
        cmocka_unit_test(test_devices),
    };
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
