/* test_launch.c — launching kernels on the CPU: results over 1-D and 3-D grids (split over the
 * thread pool), scalar and tensor arguments, line elements, launches from several threads, and
 * every argument check of em_launch with a message naming the parameter. Also the line-width
 * helper em_pick_line_width. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include "runtime/rt_util.h"

static em_device *dev;
static char cache_dir[1024];

static int setup(void **state)
{
    (void)state;
    rt_fresh_dir("launch", cache_dir, sizeof(cache_dir));
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
    dev = em_device_open("cpu");
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    em_remove_tree(cache_dir);
    return 0;
}

static em_kernel *compile_or_fail(em_ir_kernel *k)
{
    em_kernel *kern = em_kernel_compile(dev, k);
    if (!kern)
        fail_msg("compile %s: %s", em_ir_kernel_name(k), em_last_error());
    em_ir_kernel_free(k);
    return kern;
}

static const uint32_t DIM64[3] = {64, 1, 1};

/* out[i] = x[i] * s for i < n (s: f32, n: u32) */
static em_kernel *scale_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("scale");
    em_ir_mem x = em_ir_param_buffer(k, "x", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val s = em_ir_param_scalar(k, "s", em_ty(EM_F32));
    em_ir_val n = em_ir_param_scalar(k, "n", em_ty(EM_U32));
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, n));
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_MUL, em_ir_load(k, x, i), s));
    em_ir_end(k);
    return compile_or_fail(k);
}

/* out[i] = in[r, c] with r = i / shape[1], c = i % shape[1], through in's strides */
static em_kernel *gather2d_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("gather2d");
    em_ir_mem in = em_ir_param_buffer(k, "in", em_ty(EM_F32), EM_READ, 2);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val cols = em_ir_shape(k, in, 1);
    em_ir_val r = em_ir_binary(k, EM_OP_DIV, i, cols);
    em_ir_val c = em_ir_binary(k, EM_OP_REM, i, cols);
    em_ir_val at = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, r, em_ir_stride(k, in, 0)),
                                em_ir_binary(k, EM_OP_MUL, c, em_ir_stride(k, in, 1)));
    em_ir_store(k, out, i, em_ir_load(k, in, at));
    em_ir_end(k);
    return compile_or_fail(k);
}

/* out[ABSOLUTE_POS] = CUBE_POS * 1000 + UNIT_POS */
static em_kernel *positions_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("positions");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_val v = em_ir_binary(k, EM_OP_ADD,
                               em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_POS),
                                            em_ir_u32(k, 1000)),
                               em_ir_builtin(k, EM_UNIT_POS));
    em_ir_store(k, out, em_ir_builtin(k, EM_ABSOLUTE_POS), v);
    return compile_or_fail(k);
}

static void test_axpb_results(void **state)
{
    (void)state;
    em_kernel *k = compile_or_fail(rt_kernel_axpb("launch_axpb", 3.0));
    assert_int_equal(rt_run_axpb(dev, k, 3.0, 1), 0);
    assert_int_equal(rt_run_axpb(dev, k, 3.0, 1000), 0);
    assert_int_equal(rt_run_axpb(dev, k, 3.0, 100000), 0); /* 1563 cubes over the pool */
}

static void test_3d_grid(void **state)
{
    (void)state;
    em_kernel *k = positions_kernel();
    uint32_t count[3] = {5, 3, 2}, dim[3] = {4, 2, 3};
    uint32_t units = 4 * 2 * 3, cubes = 5 * 3 * 2, n = units * cubes;
    em_buffer *out = em_buffer_alloc(dev, n * 4);
    em_arg arg = em_arg_buffer(out, n);
    assert_int_equal(em_launch(k, count, dim, &arg, 1), EM_OK);
    uint32_t *h = malloc(n * 4);
    em_buffer_read(out, 0, h, n * 4);
    for (uint32_t c = 0; c < cubes; c++)
        for (uint32_t u = 0; u < units; u++)
            assert_int_equal(h[c * units + u], c * 1000 + u);
    free(h);
    em_buffer_free(out);
}

static void test_scalars(void **state)
{
    (void)state;
    em_kernel *k = scale_kernel();
    float x[100], y[100];
    for (int i = 0; i < 100; i++)
        x[i] = (float)i;
    em_buffer *bx = em_buffer_alloc(dev, sizeof(x)), *by = em_buffer_alloc(dev, sizeof(y));
    em_buffer_write(bx, 0, x, sizeof(x));
    em_buffer_fill_zero(by);
    uint32_t count[3] = {2, 1, 1};
    em_arg args[4] = {em_arg_buffer(bx, 100), em_arg_buffer(by, 100), em_arg_f32(2.5f),
                      em_arg_u32(90)};
    assert_int_equal(em_launch(k, count, DIM64, args, 4), EM_OK);
    em_buffer_read(by, 0, y, sizeof(y));
    for (int i = 0; i < 100; i++)
        assert_float_equal(y[i], i < 90 ? 2.5f * i : 0.0f, 1e-6);
    /* an integer for a float parameter is converted; f64 helper for an f32 parameter too */
    args[2] = em_arg_i32(-2);
    args[3] = em_arg_i32(10); /* signed helper for an unsigned parameter: same bits */
    assert_int_equal(em_launch(k, count, DIM64, args, 4), EM_OK);
    em_buffer_read(by, 0, y, sizeof(y));
    for (int i = 0; i < 10; i++)
        assert_float_equal(y[i], -2.0f * i, 1e-6);
    assert_float_equal(y[10], 2.5f * 10, 1e-6);
    args[2] = em_arg_f64(0.5);
    assert_int_equal(em_launch(k, count, DIM64, args, 4), EM_OK);
    em_buffer_read(by, 0, y, sizeof(y));
    assert_float_equal(y[9], 4.5f, 1e-6);
    /* hand-written: read as the parameter's own type */
    em_arg raw;
    memset(&raw, 0, sizeof(raw));
    raw.kind = EM_PARAM_SCALAR;
    raw.value.f = 4.0;
    args[2] = raw;
    assert_int_equal(em_launch(k, count, DIM64, args, 4), EM_OK);
    em_buffer_read(by, 0, y, sizeof(y));
    assert_float_equal(y[3], 12.0f, 1e-6);
    em_buffer_free(bx);
    em_buffer_free(by);
}

static void test_tensor_strides(void **state)
{
    (void)state;
    em_kernel *k = gather2d_kernel();
    /* a 4x3 row-major matrix m; its transpose (3x4) is the view shape {3,4}, stride {1,3} */
    float m[12], out[12];
    for (int i = 0; i < 12; i++)
        m[i] = (float)i;
    em_buffer *bm = em_buffer_alloc(dev, sizeof(m) + 8), *bo = em_buffer_alloc(dev, sizeof(out));
    em_buffer_write(bm, 8, m, sizeof(m)); /* at an offset of two floats */
    int64_t shape[2] = {3, 4}, stride[2] = {1, 3};
    em_arg args[2] = {em_arg_tensor(bm, 8, 12, 2, shape, stride), em_arg_buffer(bo, 12)};
    uint32_t count[3] = {1, 1, 1};
    assert_int_equal(em_launch(k, count, DIM64, args, 2), EM_OK);
    em_buffer_read(bo, 0, out, sizeof(out));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++)
            assert_float_equal(out[r * 4 + c], m[c * 3 + r], 0);
    /* a broadcast view (stride 0) is fine */
    int64_t bshape[2] = {3, 4}, bstride[2] = {0, 1};
    args[0] = em_arg_tensor(bm, 8, 4, 2, bshape, bstride);
    assert_int_equal(em_launch(k, count, DIM64, args, 2), EM_OK);
    em_buffer_read(bo, 0, out, sizeof(out));
    assert_float_equal(out[9], m[1], 0);
    em_buffer_free(bm);
    em_buffer_free(bo);
}

static void test_line_elements(void **state)
{
    (void)state;
    em_ir_kernel *ir = em_ir_kernel_new("double4");
    em_ir_mem a = em_ir_param_buffer(ir, "a", em_line(EM_F32, 4), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(ir, "out", em_line(EM_F32, 4), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(ir, EM_ABSOLUTE_POS);
    em_ir_if_begin(ir, em_ir_binary(ir, EM_OP_LT, i, em_ir_len(ir, out)));
    em_ir_val v = em_ir_load(ir, a, i);
    em_ir_store(ir, out, i, em_ir_binary(ir, EM_OP_ADD, v, v));
    em_ir_end(ir);
    em_kernel *k = compile_or_fail(ir);
    float h[64], o[64];
    for (int j = 0; j < 64; j++)
        h[j] = (float)j;
    em_buffer *ba = em_buffer_alloc(dev, sizeof(h)), *bo = em_buffer_alloc(dev, sizeof(o));
    em_buffer_write(ba, 0, h, sizeof(h));
    em_arg args[2] = {em_arg_buffer(ba, 16), em_arg_buffer(bo, 16)}; /* 16 lines of 4 */
    uint32_t count[3] = {1, 1, 1};
    assert_int_equal(em_launch(k, count, DIM64, args, 2), EM_OK);
    em_buffer_read(bo, 0, o, sizeof(o));
    for (int j = 0; j < 64; j++)
        assert_float_equal(o[j], 2.0f * j, 0);
    args[0] = em_arg_buffer(ba, 17); /* 17 lines = 272 bytes > 256 */
    assert_int_equal(em_launch(k, count, DIM64, args, 2), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "17 elements of 16 bytes"));
    em_buffer_free(ba);
    em_buffer_free(bo);
}

typedef struct thread_arg {
    em_kernel *k; /* the kernel this thread compiled */
    int failures; /* wrong results */
} thread_arg;

static void *compile_and_launch(void *p)
{
    thread_arg *t = p;
    em_ir_kernel *ir = rt_kernel_axpb("threads_axpb", 1.25); /* each thread its own copy */
    t->k = em_kernel_compile(dev, ir);
    em_ir_kernel_free(ir);
    if (!t->k) {
        t->failures++;
        return NULL;
    }
    for (int i = 0; i < 40; i++)
        if (rt_run_axpb(dev, t->k, 1.25, 5000 + (uint32_t)i) != 0)
            t->failures++;
    return NULL;
}

static void test_compile_and_launch_from_threads(void **state)
{
    (void)state;
    pthread_t t[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){NULL, 0};
        assert_int_equal(pthread_create(&t[i], NULL, compile_and_launch, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].failures, 0);
        assert_ptr_equal(args[i].k, args[0].k); /* one kernel, however many asked at once */
    }
}

static void expect_launch_error(em_kernel *k, const uint32_t count[3], const uint32_t dim[3],
                                const em_arg *args, size_t n, const char *needle)
{
    em_clear_error();
    assert_int_equal(em_launch(k, count, dim, args, n), EM_ERR_INVALID);
    if (!strstr(em_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", em_last_error(), needle);
}

static void test_argument_checks(void **state)
{
    (void)state;
    em_kernel *k = scale_kernel();
    em_kernel *g = gather2d_kernel();
    em_buffer *b = em_buffer_alloc(dev, 400), *small = em_buffer_alloc(dev, 40);
    uint32_t one[3] = {1, 1, 1};
    em_arg ok[4] = {em_arg_buffer(b, 100), em_arg_buffer(b, 100), em_arg_f32(1), em_arg_u32(4)};
    assert_int_equal(em_launch(k, one, DIM64, ok, 4), EM_OK);

    expect_launch_error(k, one, DIM64, ok, 3, "expects 4 arguments (x, out, s, n), got 3");
    expect_launch_error(k, one, DIM64, NULL, 4, "expects 4 arguments");
    em_arg a[4];
    memcpy(a, ok, sizeof(a));
    a[0] = em_arg_u32(3);
    expect_launch_error(k, one, DIM64, a, 4, "argument 0 ('x'): expects a buffer, got a scalar");
    memcpy(a, ok, sizeof(a));
    a[2] = em_arg_buffer(b, 1);
    expect_launch_error(k, one, DIM64, a, 4, "('s'): expects a scalar f32, got a buffer");
    memcpy(a, ok, sizeof(a));
    a[3] = em_arg_f32(4.0f);
    expect_launch_error(k, one, DIM64, a, 4, "('n'): expects an integer (u32), got a float");
    memcpy(a, ok, sizeof(a));
    a[1] = em_arg_buffer(NULL, 10);
    expect_launch_error(k, one, DIM64, a, 4, "('out'): no buffer given");
    memcpy(a, ok, sizeof(a));
    a[1] = em_arg_buffer(small, 11); /* 44 bytes > 40 */
    expect_launch_error(k, one, DIM64, a, 4, "('out'): 11 elements of 4 bytes at offset 0 need "
                                             "44 bytes, but the buffer has 40");
    a[1] = em_arg_tensor(small, 8, 9, 0, NULL, NULL); /* 8 + 36 > 40 */
    expect_launch_error(k, one, DIM64, a, 4, "need 44 bytes");
    a[1] = em_arg_tensor(small, 48, 0, 0, NULL, NULL); /* offset beyond the end */
    expect_launch_error(k, one, DIM64, a, 4, "at offset 48");
    a[1] = em_arg_tensor(small, 2, 1, 0, NULL, NULL);
    expect_launch_error(k, one, DIM64, a, 4, "offset 2 is not a multiple of the f32 size");
    a[1] = em_arg_tensor(small, 36, 1, 0, NULL, NULL); /* the last element exactly: fine */
    assert_int_equal(em_launch(k, one, DIM64, a, 4), EM_OK);

    /* tensors */
    int64_t shape[2] = {2, 5}, stride[2] = {5, 1};
    em_arg t[2] = {em_arg_tensor(b, 0, 10, 2, shape, stride), em_arg_buffer(b, 10)};
    assert_int_equal(em_launch(g, one, DIM64, t, 2), EM_OK);
    t[0] = em_arg_buffer(b, 10);
    expect_launch_error(g, one, DIM64, t, 2, "('in'): expects a rank-2 tensor, got rank 0");
    int64_t shape3[3] = {1, 2, 5}, stride3[3] = {10, 5, 1};
    t[0] = em_arg_tensor(b, 0, 10, 3, shape3, stride3);
    expect_launch_error(g, one, DIM64, t, 2, "expects a rank-2 tensor, got rank 3");
    int64_t neg[2] = {-5, 1};
    t[0] = em_arg_tensor(b, 0, 10, 2, shape, neg);
    expect_launch_error(g, one, DIM64, t, 2, "both must be >= 0");
    int64_t far[2] = {6, 1}; /* reaches scalar 1*6 + 4 = 10 of only 10 */
    t[0] = em_arg_tensor(b, 0, 10, 2, shape, far);
    expect_launch_error(g, one, DIM64, t, 2, "reach scalar 10, beyond the 10 scalars");
    int64_t wrap_shape[2] = {5, 5}, wrap[2] = {INT64_MAX / 2 + 1, 1}; /* 4 * 2^62 wraps to 0 */
    t[0] = em_arg_tensor(b, 0, 10, 2, wrap_shape, wrap);
    expect_launch_error(g, one, DIM64, t, 2, "beyond the 10 scalars");
    int64_t empty[2] = {0, 5};
    t[0] = em_arg_tensor(b, 0, 0, 2, empty, far); /* an empty tensor reaches nothing */
    assert_int_equal(em_launch(g, one, DIM64, t, 2), EM_OK);

    /* grids */
    uint32_t zero_dim[3] = {0, 1, 1}, wide[3] = {2048, 1, 1}, fat[3] = {64, 32, 1},
             tall[3] = {1, 1, 65};
    expect_launch_error(k, one, zero_dim, ok, 4, "cube_dim[0] = 0 is outside 1..1024");
    expect_launch_error(k, one, wide, ok, 4, "cube_dim[0] = 2048");
    expect_launch_error(k, one, tall, ok, 4, "cube_dim[2] = 65 is outside 1..64");
    expect_launch_error(k, one, fat, ok, 4, "2048 units exceeds the 1024 units per cube");
    uint32_t huge[3] = {65536, 65536, 1};
    expect_launch_error(k, huge, DIM64, ok, 4, "exceeds 2^32 units");
    uint32_t none[3] = {0, 1, 1};
    assert_int_equal(em_launch(k, none, DIM64, ok, 4), EM_OK); /* nothing to do */
    assert_int_equal(em_launch(NULL, one, DIM64, ok, 4), EM_ERR_INVALID);
    assert_int_equal(em_launch(k, NULL, DIM64, ok, 4), EM_ERR_INVALID);

    /* a kernel built for fixed cube dimensions */
    em_ir_kernel *fx = rt_kernel_axpb("fixed_dim", 1.0);
    em_ir_set_cube_dim(fx, 32, 1, 1);
    em_kernel *f = compile_or_fail(fx);
    em_arg fa[3] = {em_arg_buffer(b, 32), em_arg_buffer(b, 32), em_arg_buffer(b, 32)};
    expect_launch_error(f, one, DIM64, fa, 3, "was built for cubes of 32 x 1 x 1 units");
    uint32_t d32[3] = {32, 1, 1};
    assert_int_equal(em_launch(f, one, d32, fa, 3), EM_OK);

    em_buffer_free(b);
    em_buffer_free(small);
}

static void test_pick_line_width(void **state)
{
    (void)state;
    const unsigned cands[] = {8, 4, 2, 1};
    int64_t shape[3] = {4, 6, 8}, stride[3] = {48, 8, 1};
    assert_int_equal(em_pick_line_width(3, shape, stride, 0, cands, 4), 8);
    assert_int_equal(em_pick_line_width(3, shape, stride, 4, cands, 4), 4); /* offset 4 */
    assert_int_equal(em_pick_line_width(3, shape, stride, 2, cands, 4), 2);
    assert_int_equal(em_pick_line_width(3, shape, stride, 3, cands, 4), 1);
    int64_t shape2[2] = {5, 12}, stride2[2] = {12, 1};
    assert_int_equal(em_pick_line_width(2, shape2, stride2, 0, cands, 4), 4); /* 12 % 8 != 0 */
    int64_t stride3[2] = {14, 1}; /* padded rows: 14 % 4 != 0 */
    assert_int_equal(em_pick_line_width(2, shape2, stride3, 0, cands, 4), 2);
    int64_t strideT[2] = {1, 5}; /* transposed: innermost stride not 1 */
    assert_int_equal(em_pick_line_width(2, shape2, strideT, 0, cands, 4), 1);
    int64_t shape1[2] = {1, 16}, stride1[2] = {3, 1}; /* a dim of size 1: its stride is moot */
    assert_int_equal(em_pick_line_width(2, shape1, stride1, 0, cands, 4), 8);
    const unsigned only[] = {2, 16, 4};
    int64_t s16[1] = {64}, st16[1] = {1};
    assert_int_equal(em_pick_line_width(1, s16, st16, 0, only, 3), 16); /* widest, any order */
    const unsigned silly[] = {0, 3, 32};
    assert_int_equal(em_pick_line_width(1, s16, st16, 0, silly, 3), 1);
    assert_int_equal(em_pick_line_width(0, NULL, NULL, 0, cands, 4), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_axpb_results),       cmocka_unit_test(test_3d_grid),
        cmocka_unit_test(test_scalars),            cmocka_unit_test(test_tensor_strides),
        cmocka_unit_test(test_line_elements),      cmocka_unit_test(test_compile_and_launch_from_threads),
        cmocka_unit_test(test_argument_checks),    cmocka_unit_test(test_pick_line_width),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
