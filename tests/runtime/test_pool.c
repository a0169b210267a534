/* test_pool.c — the device memory pool: size classes, reuse of freed blocks, statistics, trim,
 * out-of-memory handling (empty the cache, retry, then EM_ERR_NOMEM without aborting; exercised
 * with $EMBER_CPU_MEMORY_LIMIT), and many threads allocating and freeing at once (also run under
 * ThreadSanitizer), and where the peak was (its blocks by size, the kernel launched next). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include "runtime/rt.h"
#include "runtime/rt_util.h"

static void test_size_classes(void **state)
{
    (void)state;
    unsigned cls, prev_cls = 0;
    size_t cap, prev_cap = 0;
    assert_true(em_rt_size_class(0, &cls, &cap));
    assert_int_equal(cls, 0);
    assert_int_equal(cap, 256);
    assert_true(em_rt_size_class(257, &cls, &cap));
    assert_int_equal(cap, 320);
    assert_true(em_rt_size_class(512, &cls, &cap));
    assert_int_equal(cap, 512);
    assert_true(em_rt_size_class(513, &cls, &cap));
    assert_int_equal(cap, 640);
    for (size_t s = 1; s < ((size_t)1 << 40); s = s * 9 / 8 + 1) {
        assert_true(em_rt_size_class(s, &cls, &cap));
        assert_true(cap >= s);
        assert_true(s <= 256 || cap - s <= s / 4 + 1); /* at most a quarter wasted */
        assert_true(cls < EM_RT_POOL_CLASSES);
        if (prev_cap) {
            assert_true(cap >= prev_cap && cls >= prev_cls);
            assert_true((cap == prev_cap) == (cls == prev_cls)); /* one capacity per class */
        }
        prev_cap = cap;
        prev_cls = cls;
    }
    assert_true(em_rt_size_class((size_t)1 << 62, &cls, &cap));
    assert_true(cls < EM_RT_POOL_CLASSES);
    assert_false(em_rt_size_class(((size_t)1 << 62) + 1, &cls, &cap));
}

static void test_reuse_and_stats(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    em_pool_stats st;
    em_buffer *a = em_buffer_alloc(dev, 1000); /* class of 1024 bytes */
    em_buffer *b = em_buffer_alloc(dev, 100);  /* 256 */
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.allocs, 2);
    assert_int_equal(st.device_allocs, 2);
    assert_int_equal(st.bytes_in_use, 1024 + 256);
    assert_int_equal(st.peak_in_use, 1024 + 256);
    assert_int_equal(st.requested_in_use, 1000 + 100); /* before rounding to classes */
    assert_int_equal(st.peak_requested, 1000 + 100);
    em_buffer_free(a);
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.frees, 1);
    assert_int_equal(st.bytes_in_use, 256);
    assert_int_equal(st.bytes_cached, 1024);
    em_buffer *c = em_buffer_alloc(dev, 900); /* same class: reused, no driver call */
    assert_non_null(c);
    assert_int_equal(em_buffer_size(c), 900);
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.reuses, 1);
    assert_int_equal(st.device_allocs, 2);
    assert_int_equal(st.bytes_cached, 0);
    assert_int_equal(st.bytes_in_use, 1024 + 256);
    em_buffer *d = em_buffer_alloc(dev, 2000); /* another class: a new block */
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.device_allocs, 3);
    assert_int_equal(st.peak_in_use, 1024 + 256 + 2048);
    assert_int_equal(st.requested_in_use, 100 + 900 + 2000);
    assert_int_equal(st.peak_requested, 100 + 900 + 2000);
    em_buffer_free(b);
    em_buffer_free(c);
    em_buffer_free(d);
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.bytes_in_use, 0);
    assert_int_equal(st.requested_in_use, 0);
    assert_int_equal(st.bytes_cached, 1024 + 256 + 2048);
    assert_int_equal(st.allocs, st.frees);
    em_device_pool_trim(dev);
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.bytes_cached, 0);
    assert_int_equal(st.peak_in_use, 1024 + 256 + 2048);
    em_device_pool_stats(NULL, &st);
    assert_int_equal(st.allocs, 0);
    em_device_close(dev);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    setenv("EMBER_CPU_MEMORY_LIMIT", "1M", 1);
    em_device *dev = em_device_open("cpu");
    unsetenv("EMBER_CPU_MEMORY_LIMIT");
    assert_non_null(dev);
    assert_int_equal(em_device_caps(dev)->memory_total, 1u << 20);
    em_pool_stats st;
    em_buffer *a = em_buffer_alloc(dev, 600 * 1024); /* a 640 KiB block */
    assert_non_null(a);
    em_buffer_free(a); /* cached */
    em_buffer *b = em_buffer_alloc(dev, 700 * 1024); /* 768 KiB: fits only once the cache is emptied */
    assert_non_null(b);
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.oom_retries, 1);
    assert_int_equal(st.bytes_cached, 0);
    em_clear_error();
    em_buffer *c = em_buffer_alloc(dev, 512 * 1024); /* cannot fit: nothing cached to release */
    assert_null(c);
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_non_null(strstr(em_last_error(), "out of memory"));
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.oom_retries, 1);
    assert_int_equal(st.allocs, 2);
    /* absurd sizes fail cleanly too */
    assert_null(em_buffer_alloc(dev, SIZE_MAX));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_null(em_buffer_alloc(dev, (size_t)1 << 61));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    em_buffer_free(b);
    c = em_buffer_alloc(dev, 512 * 1024); /* fits now (after emptying the cache again) */
    assert_non_null(c);
    em_buffer_free(c);
    em_device_close(dev);
}

#define THREADS 8
#define ITERS 3000

typedef struct worker_arg {
    em_device *dev; /* shared device */
    unsigned seed;  /* per-thread random sequence */
    int failures;   /* data or allocation errors seen */
} worker_arg;

static void *pool_worker(void *p)
{
    worker_arg *w = p;
    em_buffer *held[8] = {0};
    unsigned char buf[4096], back[4096];
    for (int it = 0; it < ITERS; it++) {
        w->seed = w->seed * 1103515245u + 12345u;
        unsigned slot = (w->seed >> 8) % 8;
        size_t size = 1 + (w->seed >> 12) % 4096;
        if (held[slot]) {
            size_t n = em_buffer_size(held[slot]);
            if (em_buffer_read(held[slot], 0, back, n) != EM_OK)
                w->failures++;
            for (size_t i = 0; i < n; i++)
                if (back[i] != (unsigned char)(slot + n + i))
                    w->failures++;
            em_buffer_free(held[slot]);
            held[slot] = NULL;
        } else {
            held[slot] = em_buffer_alloc(w->dev, size);
            if (!held[slot]) {
                w->failures++;
                continue;
            }
            for (size_t i = 0; i < size; i++)
                buf[i] = (unsigned char)(slot + size + i);
            if (em_buffer_write(held[slot], 0, buf, size) != EM_OK)
                w->failures++;
        }
    }
    for (int i = 0; i < 8; i++)
        em_buffer_free(held[i]);
    return NULL;
}

static void test_concurrent_alloc_free(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    pthread_t t[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){dev, (unsigned)i * 7919u + 1, 0};
        assert_int_equal(pthread_create(&t[i], NULL, pool_worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    em_pool_stats st;
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.allocs, st.frees);
    assert_int_equal(st.bytes_in_use, 0);
    assert_true(st.reuses > 0);
    assert_true(st.device_allocs < st.allocs);
    assert_int_equal(st.reuses + st.device_allocs, st.allocs);
    assert_true(st.peak_in_use > 0 && st.peak_in_use <= (uint64_t)THREADS * 8 * 5120);
    em_device_close(dev);
}

/* Where the peak was: the live blocks by size at the peak and the kernel launched next. */
static void test_peak_location(void **state)
{
    (void)state;
    char dir[1024];
    rt_fresh_dir("pool_peak", dir, sizeof(dir));
    setenv("EMBER_CACHE_DIR", dir, 1);
    em_device *dev = em_device_open("cpu");
    em_ir_kernel *ir = rt_kernel_axpb("peak_axpb", 2.0);
    em_kernel *k = em_kernel_compile(dev, ir);
    em_ir_kernel_free(ir);
    assert_non_null(k);
    em_buffer *small[3];
    for (int i = 0; i < 3; i++) small[i] = em_buffer_alloc(dev, 1000); /* 1024: bucket 2^10 */
    em_device_pool_reset_peak(dev);
    em_buffer *big = em_buffer_alloc(dev, 5000); /* 5120: bucket 2^12; the peak */
    em_buffer_free(big);
    em_buffer *a = em_buffer_alloc(dev, 256); /* below the peak: changes nothing */
    uint32_t one[3] = {1, 1, 1};
    em_arg args[3] = {em_arg_buffer(small[0], 64), em_arg_buffer(small[1], 64),
                      em_arg_buffer(small[2], 64)};
    assert_int_equal(em_launch(k, one, one, args, 3), EM_OK);
    em_pool_stats st;
    em_device_pool_stats(dev, &st);
    assert_int_equal(st.peak_in_use, 3 * 1024 + 5120);
    assert_string_equal(st.peak_kernel, "peak_axpb");
    assert_int_equal(st.peak_launch, 0);
    em_pool_bucket b[8];
    assert_int_equal(st.peak_largest[0], 5000);
    assert_int_equal(st.peak_largest[1], 1000);
    assert_int_equal(st.peak_largest[3], 1000);
    assert_int_equal(st.peak_largest[4], 0);
    assert_int_equal(em_device_pool_peak_buckets(dev, b, 8), 2);
    assert_int_equal(b[0].min_bytes, 4096);
    assert_int_equal(b[0].count, 1);
    assert_int_equal(b[0].bytes, 5120);
    assert_int_equal(b[1].min_bytes, 1024);
    assert_int_equal(b[1].count, 3);
    assert_int_equal(b[1].bytes, 3 * 1024);
    em_buffer_free(a);
    for (int i = 0; i < 3; i++) em_buffer_free(small[i]);
    em_device_close(dev);
    em_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_classes),
        cmocka_unit_test(test_reuse_and_stats),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_concurrent_alloc_free),
        cmocka_unit_test(test_peak_location),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
