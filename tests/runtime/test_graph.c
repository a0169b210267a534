/* test_graph.c — recorded graphs (src/runtime/graph.c): launches and writes recorded, not run, and
 * replayed by em_graph_launch (natively on CUDA); what cannot be recorded (reads, syncs, timers)
 * fails and fails the recording; the pool's rules (buffers freed while recording are reused by
 * that recording only and return to the pool when the graph is freed). On the CPU by default,
 * on $EMBER_TEST_DEVICE when set (cuda:0 on the GPU machine: then the graph must be native). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/rt.h"
#include "runtime/rt_util.h"
#include "runtime/graph_internal.h"

enum { N = 1000 };

static em_device *dev;
static char cache_dir[1024];
static em_kernel *acc;   /* out[i] += x[i] * 2 */
static em_kernel *scale; /* out[i] = a[i] * 3 + b[i] */

/* out[i] = out[i] + x[i] * 2 for i < len(out) */
static em_ir_kernel *acc_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("graph_acc");
    em_ir_mem x = em_ir_param_buffer(k, "x", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_READ_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val two = em_ir_const_float(k, em_ty(EM_F32), 2.0);
    em_ir_val v = em_ir_binary(k, EM_OP_ADD, em_ir_load(k, out, i),
                               em_ir_binary(k, EM_OP_MUL, em_ir_load(k, x, i), two));
    em_ir_store(k, out, i, v);
    em_ir_end(k);
    return k;
}

static em_kernel *compile(em_ir_kernel *k)
{
    em_kernel *kern = k ? em_kernel_compile(dev, k) : NULL;
    if (!kern)
        fail_msg("compile: %s", em_last_error());
    em_ir_kernel_free(k);
    return kern;
}

static int setup(void **state)
{
    (void)state;
    rt_fresh_dir("graph", cache_dir, sizeof(cache_dir));
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
    const char *name = getenv("EMBER_TEST_DEVICE");
    dev = em_device_open(name && *name ? name : "cpu");
    if (!dev)
        return -1;
    acc = compile(acc_kernel());
    scale = compile(rt_kernel_axpb("graph_scale", 3.0));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    em_remove_tree(cache_dir);
    return 0;
}

static const uint32_t DIM[3] = {128, 1, 1};
static const uint32_t CUBES[3] = {(N + 127) / 128, 1, 1};

static em_buffer *filled(float v0, float step)
{
    float h[N];
    for (int i = 0; i < N; i++) h[i] = v0 + step * (float)i;
    em_buffer *b = em_buffer_alloc(dev, sizeof(h));
    assert_non_null(b);
    assert_int_equal(em_buffer_write(b, 0, h, sizeof(h)), EM_OK);
    return b;
}

static void read_all(const em_buffer *b, float *h)
{
    assert_int_equal(em_buffer_read(b, 0, h, N * sizeof(float)), EM_OK);
}

static void launch_acc(em_buffer *x, em_buffer *out)
{
    em_arg args[2] = {em_arg_buffer(x, N), em_arg_buffer(out, N)};
    assert_int_equal(em_launch(acc, CUBES, DIM, args, 2), EM_OK);
}

static void launch_scale(em_buffer *a, em_buffer *b, em_buffer *out)
{
    em_arg args[3] = {em_arg_buffer(a, N), em_arg_buffer(b, N), em_arg_buffer(out, N)};
    assert_int_equal(em_launch(scale, CUBES, DIM, args, 3), EM_OK);
}

/* Recorded launches do not run; each replay runs all of them, on the inputs' current contents. */
static void test_record_and_replay(void **state)
{
    (void)state;
    em_buffer *x = filled(1, 1), *out = filled(0, 0);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_true(em_device_recording(dev));
    launch_acc(x, out);
    launch_acc(x, out);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    assert_non_null(g);
    assert_false(em_device_recording(dev));
    assert_int_equal(em_graph_ops(g), 2);
    if (!strncmp(em_device_name(dev), "cuda", 4))
        assert_true(em_graph_native(g)); /* a CUDA graph, not a call-by-call replay */
    float h[N];
    read_all(out, h);
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 0.0f, 0.0f); /* nothing ran yet */
    for (int r = 0; r < 5; r++) assert_int_equal(em_graph_launch(g), EM_OK);
    read_all(out, h);
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 5 * 2 * 2 * (1.0f + (float)i), 0.0f);
    /* new input contents between replays: the graph reads them */
    float x2[N];
    for (int i = 0; i < N; i++) x2[i] = -0.5f * (float)i;
    assert_int_equal(em_buffer_write(x, 0, x2, sizeof(x2)), EM_OK);
    assert_int_equal(em_buffer_fill_zero(out), EM_OK);
    assert_int_equal(em_graph_launch(g), EM_OK);
    read_all(out, h);
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 2 * 2 * x2[i], 0.0f);
    em_graph_free(g);
    em_buffer_free(x);
    em_buffer_free(out);
}

/* A write while recording is part of the graph: every replay writes the recorded bytes again. */
static void test_recorded_write(void **state)
{
    (void)state;
    em_buffer *x = filled(0, 0), *out = filled(0, 0);
    float src[N];
    for (int i = 0; i < N; i++) src[i] = (float)(i % 7);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_int_equal(em_buffer_write(x, 0, src, sizeof(src)), EM_OK);
    for (int i = 0; i < N; i++) src[i] = 99; /* the graph kept its own copy */
    launch_acc(x, out);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    assert_int_equal(em_graph_ops(g), 2);
    float h[N];
    assert_int_equal(em_buffer_write(x, 0, src, sizeof(src)), EM_OK); /* overwritten by replay */
    assert_int_equal(em_graph_launch(g), EM_OK);
    assert_int_equal(em_graph_launch(g), EM_OK);
    read_all(out, h);
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 2 * 2 * (float)(i % 7), 0.0f);
    em_graph_free(g);
    em_buffer_free(x);
    em_buffer_free(out);
}

/* Reads, syncs and timers cannot be recorded: they fail, and so does em_graph_end. */
static void test_refused(void **state)
{
    (void)state;
    em_buffer *x = filled(1, 0);
    float h[N];
    for (int which = 0; which < 3; which++) {
        assert_int_equal(em_graph_begin(dev), EM_OK);
        em_status st;
        if (which == 0) {
            st = em_buffer_read(x, 0, h, sizeof(h));
        } else if (which == 1) {
            st = em_device_sync(dev);
        } else {
            em_timer t;
            st = em_timer_start(&t, dev);
        }
        assert_int_equal(st, EM_ERR_INVALID);
        assert_non_null(strstr(em_last_error(), "recording a graph"));
        launch_acc(x, x); /* recording goes on */
        em_graph *g = (em_graph *)&g;
        assert_int_equal(em_graph_end(dev, &g), EM_ERR_INVALID);
        assert_null(g);
        assert_non_null(strstr(em_last_error(), "failed"));
        assert_false(em_device_recording(dev));
    }
    read_all(x, h); /* nothing ran */
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 1.0f, 0.0f);
    em_buffer_free(x);
}

/* EMBER_GRAPH_MAX_OPS bounds a recording: the operation past it fails, and so does the
 * recording, naming the limit; nothing ran. */
static void test_max_ops(void **state)
{
    (void)state;
    em_buffer *x = filled(1, 0);
    setenv("EMBER_GRAPH_MAX_OPS", "2", 1);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    unsetenv("EMBER_GRAPH_MAX_OPS"); /* read at em_graph_begin */
    launch_acc(x, x);
    launch_acc(x, x);
    em_graph *g = NULL;
    float h[N];
    assert_int_equal(em_buffer_write(x, 0, h, sizeof(float)), EM_ERR_INVALID); /* the third */
    assert_non_null(strstr(em_last_error(), "EMBER_GRAPH_MAX_OPS = 2"));
    assert_int_equal(em_graph_end(dev, &g), EM_ERR_INVALID);
    assert_null(g);
    assert_non_null(strstr(em_last_error(), "EMBER_GRAPH_MAX_OPS"));
    assert_false(em_device_recording(dev));
    read_all(x, h); /* nothing ran */
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 1.0f, 0.0f);
    em_buffer_free(x);
}

static void test_misuse(void **state)
{
    (void)state;
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_ERR_INVALID); /* not recording */
    assert_int_equal(em_graph_launch(NULL), EM_ERR_INVALID);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_int_equal(em_graph_begin(dev), EM_ERR_INVALID); /* already */
    assert_non_null(strstr(em_last_error(), "already recording"));
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    assert_int_equal(em_graph_ops(g), 0);
    em_graph *g2 = NULL;
    assert_int_equal(em_graph_begin(dev), EM_OK);
    assert_int_equal(em_graph_launch(g), EM_ERR_INVALID); /* not while recording */
    assert_int_equal(em_graph_end(dev, &g2), EM_OK);
    assert_int_equal(em_graph_launch(g), EM_OK); /* empty: nothing to do */
    em_graph_free(g);
    em_graph_free(g2);
    em_graph_free(NULL);
}

/* The pool: a temporary freed while recording serves the recording's next allocation of its size
 * class; after em_graph_end it is still the graph's (a new allocation gets another block), and
 * em_graph_free returns it to the pool. A buffer allocated while recording and freed by the
 * caller after it stays the graph's too. Such buffers count in bytes_in_graphs and the peak. */
static void test_pool_rules(void **state)
{
    (void)state;
    em_buffer *x = filled(1, 1), *out = filled(0, 0);
    em_buffer *before = em_buffer_alloc(dev, N * sizeof(float)); /* freed while recording */
    assert_non_null(before);
    assert_int_equal(em_graph_begin(dev), EM_OK);
    em_buffer *t1 = em_buffer_alloc(dev, N * sizeof(float));
    assert_non_null(t1);
    launch_scale(x, x, t1); /* t1 = 4 x */
    em_buffer_free(before);
    em_buffer *t2 = em_buffer_alloc(dev, N * sizeof(float));
    assert_ptr_equal(t2, before); /* reused within the recording */
    launch_acc(t1, t2);
    em_buffer_free(t1);
    em_buffer *t3 = em_buffer_alloc(dev, N * sizeof(float));
    assert_ptr_equal(t3, t1);
    launch_scale(t2, t2, t3);
    launch_acc(t3, out);
    em_buffer_free(t3);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    em_buffer_free(t2); /* after the recording: still the graph's */
    em_buffer *other[3];
    for (int i = 0; i < 3; i++) {
        other[i] = em_buffer_alloc(dev, N * sizeof(float));
        assert_non_null(other[i]);
        assert_true(other[i] != t1 && other[i] != t2);
    }
    for (int i = 0; i < 3; i++) em_buffer_free(other[i]);
    em_pool_stats ps;
    em_device_pool_stats(dev, &ps);
    uint64_t in_use = ps.bytes_in_use, cap = t1->capacity;
    /* t1 and t2 freed by the caller, held by the graph: counted, and in the peak */
    assert_int_equal(ps.bytes_in_graphs, 2 * cap);
    assert_int_equal(ps.requested_in_graphs, 2 * N * sizeof(float));
    uint64_t asked = ps.requested_in_use;
    em_device_pool_reset_peak(dev);
    em_device_pool_stats(dev, &ps);
    assert_int_equal(ps.peak_in_use, in_use + 2 * cap);
    assert_int_equal(ps.peak_requested, asked + 2 * N * sizeof(float));
    em_graph_free(g); /* t1 (= t3) and t2 go back to the pool */
    em_device_pool_stats(dev, &ps);
    assert_int_equal(ps.bytes_in_use, in_use);
    assert_int_equal(ps.bytes_in_graphs, 0);
    assert_int_equal(ps.requested_in_graphs, 0);
    em_buffer *back[2] = {em_buffer_alloc(dev, N * sizeof(float)),
                          em_buffer_alloc(dev, N * sizeof(float))};
    assert_true((back[0] == t1 || back[0] == t2) && (back[1] == t1 || back[1] == t2));
    em_buffer_free(back[0]);
    em_buffer_free(back[1]);
    em_buffer_free(x);
    em_buffer_free(out);
}

/* A block freed while recording also serves a later, smaller allocation of the recording (up to
 * four size classes down: half its size), not a much smaller one; bytes_in_use follows the
 * block's own capacity. */
static void test_pool_reuse_across_classes(void **state)
{
    (void)state;
    size_t big = 64 * 1024;
    assert_int_equal(em_graph_begin(dev), EM_OK);
    em_buffer *a = em_buffer_alloc(dev, big);
    assert_non_null(a);
    em_buffer_free(a);
    em_buffer *tiny = em_buffer_alloc(dev, big / 8); /* too small for a's block */
    assert_true(tiny != a);
    em_pool_stats before;
    em_device_pool_stats(dev, &before);
    em_buffer *b = em_buffer_alloc(dev, big * 3 / 4);
    assert_ptr_equal(b, a);
    em_pool_stats after;
    em_device_pool_stats(dev, &after);
    assert_int_equal(after.bytes_in_use - before.bytes_in_use, a->capacity);
    em_buffer_free(b);
    em_buffer_free(tiny);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    em_graph_free(g);
    em_device_pool_stats(dev, &after);
    assert_int_equal(after.bytes_in_graphs, 0);
}

/* The values of such a chain with reused temporaries (t2 zeroed by a recorded write), replayed
 * three times. */
static void test_chain_values(void **state)
{
    (void)state;
    em_buffer *x = filled(1, 1), *out = filled(0, 0);
    float zeros[N] = {0};
    assert_int_equal(em_graph_begin(dev), EM_OK);
    em_buffer *t1 = em_buffer_alloc(dev, N * sizeof(float));
    em_buffer *t2 = em_buffer_alloc(dev, N * sizeof(float));
    assert_int_equal(em_buffer_write(t2, 0, zeros, sizeof(zeros)), EM_OK);
    launch_scale(x, x, t1); /* 4x */
    launch_acc(t1, t2);     /* 8x */
    em_buffer_free(t1);
    em_buffer *t3 = em_buffer_alloc(dev, N * sizeof(float)); /* t1's block */
    launch_scale(t2, t2, t3); /* 32x */
    launch_acc(t3, out);      /* out += 64x */
    em_buffer_free(t2);
    em_buffer_free(t3);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    for (int r = 0; r < 3; r++) assert_int_equal(em_graph_launch(g), EM_OK);
    float h[N];
    read_all(out, h);
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 3 * 64 * (1.0f + (float)i), 0.0f);
    em_graph_free(g);
    em_buffer_free(x);
    em_buffer_free(out);
}

/* Records t1 = 4x (64 KiB), t2 = 8x (32 KiB, live with t1), t3 = 32x (192 KiB, too large for
 * t1's block, live with t2), out += 64x, each freed after its last use; t1's block marked as one
 * whose address went out when fix_t1, a launch reading t1 after its free when late_use. Returns
 * the graph after checking two replays' values (out += 128x). */
static em_graph *record_three(bool fix_t1, bool late_use)
{
    em_buffer *x = filled(1, 1), *out = filled(0, 0), *late = late_use ? filled(0, 0) : NULL;
    float zeros[N] = {0};
    assert_int_equal(em_graph_begin(dev), EM_OK);
    em_buffer *t1 = em_buffer_alloc(dev, 64 << 10);
    assert_non_null(t1);
    if (fix_t1)
        t1->addr_fixed = true;
    launch_scale(x, x, t1);
    em_buffer *t2 = em_buffer_alloc(dev, 32 << 10);
    assert_non_null(t2);
    assert_int_equal(em_buffer_write(t2, 0, zeros, sizeof(zeros)), EM_OK);
    launch_acc(t1, t2);
    em_buffer_free(t1);
    em_buffer *t3 = em_buffer_alloc(dev, 192 << 10);
    assert_true(t3 && t3 != t1 && t3 != t2);
    launch_scale(t2, t2, t3);
    em_buffer_free(t2);
    launch_acc(t3, out);
    em_buffer_free(t3);
    if (late_use) /* reads t1's block after its free: the plan must leave the graph alone */
        launch_acc(t1, late);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    for (int r = 0; r < 2; r++) assert_int_equal(em_graph_launch(g), EM_OK);
    float h[N];
    read_all(out, h);
    for (int i = 0; i < N; i++) assert_float_equal(h[i], 128 * (1.0f + (float)i), 0.0f);
    em_buffer_free(x);
    em_buffer_free(out);
    em_buffer_free(late);
    return g;
}

/* The graph's memory plan (graph_plan.c): the three temporaries above, whose blocks the graph
 * would hold at 64 + 32 + 192 KiB, share one arena of 224 KiB (t3 and t2 live together; t1 and
 * t3 never); the arena goes when the graph does. Not with EMBER_GRAPH_PLAN=0, nor when t1's
 * address went out (a tensor map holds it: t1 cannot move, so the arena would not be smaller),
 * nor when a recorded op names t1 after its free; the values are the same every way. */
static void test_planned_arena(void **state)
{
    (void)state;
    em_pool_stats ps;
    size_t unplanned = (64 << 10) + (32 << 10) + (192 << 10), planned = (32 << 10) + (192 << 10);
    for (int way = 0; way < 4; way++) {
        if (way == 1)
            setenv("EMBER_GRAPH_PLAN", "0", 1);
        em_graph *g = record_three(way == 2, way == 3);
        unsetenv("EMBER_GRAPH_PLAN");
        em_device_pool_stats(dev, &ps);
        if (ps.bytes_in_graphs != (way == 0 ? planned : unplanned))
            fail_msg("way %d: the graph holds %llu bytes, not %zu", way,
                     (unsigned long long)ps.bytes_in_graphs, way == 0 ? planned : unplanned);
        em_graph_free(g);
        em_device_pool_stats(dev, &ps);
        assert_int_equal(ps.bytes_in_graphs, 0);
        assert_int_equal(ps.requested_in_graphs, 0);
    }
}

/* The arena's grain: 256 bytes, or the device's buffer offset alignment where larger (NVIDIA's
 * OpenCL: 512, where a 256-byte grain put a recorded index_select's argument at offset 381696
 * and the replay's sub-buffer was refused), rounded up to a multiple of 256; this device's grain
 * is a multiple of its own alignment. */
static void test_plan_align(void **state)
{
    (void)state;
    static const struct {
        uint32_t align;
        size_t grain;
    } cases[] = {{0, 256}, {16, 256}, {128, 256}, {256, 256}, {512, 512}, {600, 768}, {4096, 4096}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_caps caps = {.buffer_align = cases[i].align};
        assert_int_equal(em_rt_graph_plan_align(&caps), cases[i].grain);
    }
    assert_int_equal(em_rt_graph_plan_align(NULL), 256);
    const em_caps *c = em_device_caps(dev);
    size_t g = em_rt_graph_plan_align(c);
    assert_true(g % 256 == 0 && (c->buffer_align == 0 || g % c->buffer_align == 0));
}

/* em_buffer_settled: after a sync a buffer written by host writes only is settled; a launch that may write it
 * (a writable argument) unsettles it until the device syncs, one that only reads it does not; a
 * graph's replay unsettles what its launches write until the next sync, and nothing else. */
static void test_settled(void **state)
{
    (void)state;
    em_buffer *x = filled(1, 1), *out = filled(0, 0), *other = filled(2, 0);
    assert_int_equal(em_device_sync(dev), EM_OK); /* the pool's blocks keep their last writers */
    assert_true(em_buffer_settled(x) && em_buffer_settled(out));
    launch_acc(x, out);
    assert_true(em_buffer_settled(x)); /* read only */
    assert_false(em_buffer_settled(out));
    assert_int_equal(em_device_sync(dev), EM_OK);
    assert_true(em_buffer_settled(out));
    assert_int_equal(em_graph_begin(dev), EM_OK);
    launch_acc(x, out);
    em_graph *g = NULL;
    assert_int_equal(em_graph_end(dev, &g), EM_OK);
    assert_int_equal(em_device_sync(dev), EM_OK);
    assert_true(em_buffer_settled(out)); /* recorded, not run */
    assert_int_equal(em_graph_launch(g), EM_OK);
    assert_false(em_buffer_settled(out));
    assert_true(em_buffer_settled(x) && em_buffer_settled(other));
    float h[N];
    read_all(other, h); /* a blocking read waits for the replay too */
    assert_true(em_buffer_settled(out));
    assert_false(em_buffer_settled(NULL));
    em_graph_free(g);
    em_buffer_free(x);
    em_buffer_free(out);
    em_buffer_free(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_and_replay),
        cmocka_unit_test(test_recorded_write),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_max_ops),
        cmocka_unit_test(test_pool_rules),
        cmocka_unit_test(test_pool_reuse_across_classes),
        cmocka_unit_test(test_chain_values),
        cmocka_unit_test(test_planned_arena),
        cmocka_unit_test(test_plan_align),
        cmocka_unit_test(test_settled),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
