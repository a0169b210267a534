/* test_gradcheck_layout.c — finite-difference checks (float64, CPU) of the backward rules of the
 * layout ops (reshape, view, flatten, squeeze/unsqueeze, permute/transpose, expand, slice with
 * steps, narrow, select, flip, cat/stack, split/chunk, tril/triu, pad) and an f32 check of a few
 * cases on every device against the CPU f64 gradient. */
#include "autodiff/gradcheck.h"

#define LAY(name, expr)                                                                            \
    static em_tensor *f_##name(em_tensor *const *in, const void *arg)                              \
    {                                                                                              \
        (void)arg;                                                                                 \
        const em_tensor *x = in[0];                                                                \
        return gc_wsum(expr);                                                                      \
    }

static const int perm201[3] = {2, 0, 1};
static const int flip02[2] = {0, -1};
static const int64_t pads[4] = {1, 2, 0, 1};

/* the ops are followed by a nonlinear op so that the gradient reaching them is not constant */
LAY(reshape, em_sin(em_reshape(x, EM_SHAPE(4, -1))))
LAY(reshape_t, em_sin(em_reshape(em_transpose(x, 0, 1), EM_SHAPE(12))))
LAY(flatten, em_sin(em_flatten(x)))
LAY(squeeze_unsqueeze, em_sin(em_unsqueeze(em_squeeze(x, 1), 0)))
LAY(permute, em_sin(em_permute(x, perm201, 3)))
LAY(transpose, em_exp(em_transpose(x, -1, 0)))
LAY(expand, em_sin(em_expand(x, EM_SHAPE(2, 3, 4))))
LAY(expand_new, em_sin(em_expand(x, EM_SHAPE(5, 3, 4))))
LAY(slice, em_sin(em_slice(x, 1, 1, 4, 1)))
LAY(slice_step, em_sin(em_slice(x, 1, 1, 6, 2)))
LAY(slice_step_neg, em_sin(em_slice(x, -1, -6, 7, 3)))
LAY(narrow, em_sin(em_narrow(x, 0, 1, 2)))
LAY(select, em_sin(em_select(x, 1, 2)))
LAY(select_neg, em_sin(em_select(x, -1, -1)))
LAY(flip, em_sin(em_flip(x, flip02, 2)))
LAY(tril, em_sin(em_tril(x, 0)))
LAY(tril_k, em_sin(em_tril(x, -1)))
LAY(triu_k, em_sin(em_triu(x, 1)))
LAY(pad, em_sin(em_pad(x, pads, 4, 0.5)))
LAY(slice_of_slice, em_sin(em_slice(em_slice(x, 0, 1, 4, 1), 0, 0, 3, 2)))

static em_tensor *f_cat(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *parts[3] = {in[0], em_sin(in[1]), in[2]};
    return gc_wsum(em_exp(em_cat(parts, 3, 1)));
}

static em_tensor *f_cat_neg(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *parts[2] = {in[0], em_transpose(in[1], 0, 1)};
    return gc_wsum(em_sin(em_cat(parts, 2, -2)));
}

static em_tensor *f_stack(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *parts[2] = {in[0], in[1]};
    return gc_wsum(em_sin(em_stack(parts, 2, 1)));
}

static em_tensor *f_split(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *p[4] = {0};
    int n = em_split(in[0], 2, 1, p, 4); /* [3, 5] -> [3, 2], [3, 2], [3, 1] */
    if (n != 3) return NULL;
    return gc_wsum(em_add(em_mul(p[0], em_sin(p[1])), p[2]));
}

static em_tensor *f_chunk(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *p[4] = {0};
    int n = em_chunk(in[0], 2, 0, p, 4); /* [4, 3] -> [2, 3] x 2 */
    if (n != 2) return NULL;
    return gc_wsum(em_mul(p[0], p[1]));
}

static em_tensor *f_unbind_select(em_tensor *const *in, const void *arg)
{
    (void)arg;
    em_tensor *a = em_select(in[0], 0, 0), *b = em_select(in[0], 0, 1);
    return gc_wsum(em_mul(a, em_exp(b)));
}

static const gc_case cases[] = {
    {.name = "reshape", .f = f_reshape, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "reshape_t", .f = f_reshape_t, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "flatten", .f = f_flatten, .nin = 1, .shape = {EM_SHAPE(2, 3, 2)}},
    {.name = "squeeze_unsqueeze", .f = f_squeeze_unsqueeze, .nin = 1, .shape = {EM_SHAPE(3, 1, 4)}},
    {.name = "permute", .f = f_permute, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "transpose", .f = f_transpose, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}},
    {.name = "expand", .f = f_expand, .nin = 1, .shape = {EM_SHAPE(3, 1)}, .device = true},
    {.name = "expand_new", .f = f_expand_new, .nin = 1, .shape = {EM_SHAPE(1, 4)}},
    {.name = "slice", .f = f_slice, .nin = 1, .shape = {EM_SHAPE(3, 5)}, .device = true},
    {.name = "slice_step", .f = f_slice_step, .nin = 1, .shape = {EM_SHAPE(2, 7)}, .device = true},
    {.name = "slice_step_neg", .f = f_slice_step_neg, .nin = 1, .shape = {EM_SHAPE(2, 8)}},
    {.name = "narrow", .f = f_narrow, .nin = 1, .shape = {EM_SHAPE(4, 3)}},
    {.name = "select", .f = f_select, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "select_neg", .f = f_select_neg, .nin = 1, .shape = {EM_SHAPE(3, 4)}},
    {.name = "flip", .f = f_flip, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "tril", .f = f_tril, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "tril_k", .f = f_tril_k, .nin = 1, .shape = {EM_SHAPE(4, 4)}},
    {.name = "triu_k", .f = f_triu_k, .nin = 1, .shape = {EM_SHAPE(3, 5)}},
    {.name = "pad", .f = f_pad, .nin = 1, .shape = {EM_SHAPE(2, 3, 4)}, .device = true},
    {.name = "slice_of_slice", .f = f_slice_of_slice, .nin = 1, .shape = {EM_SHAPE(5, 2)}},
    {.name = "cat",
     .f = f_cat,
     .nin = 3,
     .shape = {EM_SHAPE(2, 1, 3), EM_SHAPE(2, 2, 3), EM_SHAPE(2, 3, 3)},
     .device = true},
    {.name = "cat_neg", .f = f_cat_neg, .nin = 2, .shape = {EM_SHAPE(2, 3), EM_SHAPE(3, 4)}},
    {.name = "stack", .f = f_stack, .nin = 2, .shape = {EM_SHAPE(3, 2), EM_SHAPE(3, 2)}},
    {.name = "split", .f = f_split, .nin = 1, .shape = {EM_SHAPE(3, 5)}},
    {.name = "chunk", .f = f_chunk, .nin = 1, .shape = {EM_SHAPE(4, 3)}},
    {.name = "select_twice", .f = f_unbind_select, .nin = 1, .shape = {EM_SHAPE(2, 3)}},
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
