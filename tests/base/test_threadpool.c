/* test_threadpool.c — parallel_for: correct sums over 1e6 indices, every index exactly once for
 * many grains, worker ids in range and exclusive to one thread at a time, several threads
 * submitting at once, nested calls, pools without workers, and the EMBER_THREADS global pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

#define MAX_IDS 64 /* worker ids the tests track */

typedef struct {
    uint64_t partial[MAX_IDS][8]; /* per-worker sums, padded apart */
    atomic_int bad_worker;        /* calls with a worker id out of range */
    unsigned size;                /* pool size */
} sum_ctx;

static void sum_fn(void *p, size_t index, unsigned worker)
{
    sum_ctx *c = p;
    if (worker >= c->size || worker >= MAX_IDS) {
        atomic_fetch_add(&c->bad_worker, 1);
        return;
    }
    c->partial[worker][0] += index;
}

static uint64_t run_sum(em_threadpool *pool, size_t n, size_t grain)
{
    static sum_ctx c;
    memset(&c, 0, sizeof c);
    c.size = em_threadpool_size(pool);
    em_threadpool_parallel_for(pool, n, grain, sum_fn, &c);
    assert_int_equal(atomic_load(&c.bad_worker), 0);
    uint64_t total = 0;
    for (int i = 0; i < MAX_IDS; i++) total += c.partial[i][0];
    return total;
}

static void test_sum_million(void **state)
{
    em_threadpool *pool = em_threadpool_create_workers(4);
    assert_non_null(pool);
    assert_int_equal(em_threadpool_size(pool), 5);
    const uint64_t n = 1000000;
    for (int rep = 0; rep < 20; rep++) assert_int_equal(run_sum(pool, n, 0), n * (n - 1) / 2);
    assert_int_equal(run_sum(pool, n, 1), n * (n - 1) / 2);
    assert_int_equal(run_sum(pool, n, 999983), n * (n - 1) / 2);
    em_threadpool_destroy(pool);
}

typedef struct {
    atomic_uchar *visits; /* per index */
    size_t count;         /* indices */
    atomic_int bad;       /* out-of-range indices */
} visit_ctx;

static void visit_fn(void *p, size_t index, unsigned worker)
{
    visit_ctx *c = p;
    if (index >= c->count) {
        atomic_fetch_add(&c->bad, 1);
        return;
    }
    atomic_fetch_add(&c->visits[index], 1);
}

static void check_each_once(em_threadpool *pool, size_t count, size_t grain)
{
    visit_ctx c = {.visits = calloc(count ? count : 1, 1), .count = count};
    assert_non_null(c.visits);
    atomic_init(&c.bad, 0);
    em_threadpool_parallel_for(pool, count, grain, visit_fn, &c);
    assert_int_equal(atomic_load(&c.bad), 0);
    for (size_t i = 0; i < count; i++) assert_int_equal(atomic_load(&c.visits[i]), 1);
    free(c.visits);
}

static void test_each_index_once(void **state)
{
    em_threadpool *pool = em_threadpool_create_workers(3);
    assert_non_null(pool);
    static const size_t counts[] = {0, 1, 2, 3, 5, 17, 100, 1000, 65537, 1000000};
    static const size_t grains[] = {0, 1, 2, 7, 64, 1000, 5000000};
    for (size_t i = 0; i < EM_ARRAY_LEN(counts); i++)
        for (size_t g = 0; g < EM_ARRAY_LEN(grains); g++)
            check_each_once(pool, counts[i], grains[g]);
    em_threadpool_destroy(pool);
}

/* --- exclusive worker ids, and several submitting threads ------------------------------------- */

typedef struct {
    _Atomic(void *) *owner; /* per worker id: the job using it right now */
    atomic_int *clashes;    /* a worker id seen in use by another call */
    atomic_long *done;      /* indices run, over all jobs */
    unsigned size;          /* pool size */
} owner_ctx;

static void owner_fn(void *p, size_t index, unsigned worker)
{
    owner_ctx *c = p;
    if (worker >= c->size) {
        atomic_fetch_add(c->clashes, 1000);
        return;
    }
    void *prev = atomic_exchange(&c->owner[worker], p);
    if (prev != NULL) atomic_fetch_add(c->clashes, 1);
    for (volatile int spin = 0; spin < 50; spin++) {
    }
    atomic_store(&c->owner[worker], NULL);
    atomic_fetch_add(c->done, 1);
}

typedef struct {
    em_threadpool *pool;    /* shared by every submitter */
    _Atomic(void *) *owner; /* shared owner table */
    atomic_int *clashes;    /* shared clash count */
    atomic_long *done;      /* shared count of indices run */
    int jobs;               /* jobs this submitter runs */
} submitter_arg;

static void *submitter(void *p)
{
    submitter_arg *a = p;
    for (int j = 0; j < a->jobs; j++) {
        owner_ctx c = {.owner = a->owner,
                       .clashes = a->clashes,
                       .done = a->done,
                       .size = em_threadpool_size(a->pool)};
        em_threadpool_parallel_for(a->pool, 500 + (size_t)j, (size_t)(j % 5), owner_fn, &c);
    }
    return NULL;
}

static void test_concurrent_submitters(void **state)
{
    em_threadpool *pool = em_threadpool_create_workers(3);
    assert_non_null(pool);
    enum { THREADS = 4, JOBS = 100 };
    static _Atomic(void *) owner[MAX_IDS];
    atomic_int clashes;
    atomic_long done;
    atomic_init(&clashes, 0);
    atomic_init(&done, 0);
    for (int i = 0; i < MAX_IDS; i++) atomic_init(&owner[i], NULL);
    pthread_t t[THREADS];
    submitter_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (submitter_arg){
            .pool = pool, .owner = owner, .clashes = &clashes, .done = &done, .jobs = JOBS};
        assert_int_equal(pthread_create(&t[i], NULL, submitter, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&clashes), 0);
    long want = 0;
    for (int j = 0; j < JOBS; j++) want += 500 + j;
    assert_int_equal(atomic_load(&done), want * THREADS);
    em_threadpool_destroy(pool);
}

/* --- workers take part, ids are in range ------------------------------------------------------ */

typedef struct {
    atomic_int used[MAX_IDS]; /* calls per worker id */
    atomic_int out_of_range;  /* calls with a bad id */
    unsigned size;            /* pool size */
} ids_ctx;

static void ids_fn(void *p, size_t index, unsigned worker)
{
    ids_ctx *c = p;
    if (worker >= c->size) {
        atomic_fetch_add(&c->out_of_range, 1);
        return;
    }
    atomic_fetch_add(&c->used[worker], 1);
    struct timespec ts = {0, 200000}; /* 0.2 ms: long enough for every worker to join */
    nanosleep(&ts, NULL);
}

static void test_worker_ids(void **state)
{
    em_threadpool *pool = em_threadpool_create_workers(4);
    assert_non_null(pool);
    static ids_ctx c;
    memset(&c, 0, sizeof c);
    c.size = em_threadpool_size(pool);
    em_threadpool_parallel_for(pool, 200, 1, ids_fn, &c);
    assert_int_equal(atomic_load(&c.out_of_range), 0);
    int distinct = 0, total = 0;
    for (unsigned i = 0; i < c.size; i++) {
        distinct += atomic_load(&c.used[i]) > 0;
        total += atomic_load(&c.used[i]);
    }
    assert_int_equal(total, 200);
    assert_true(distinct >= 3);               /* the work really was spread */
    assert_true(atomic_load(&c.used[0]) > 0); /* the caller took part */
    em_threadpool_destroy(pool);
}

/* --- no workers: the caller does everything --------------------------------------------------- */

typedef struct {
    pthread_t caller;   /* the submitting thread */
    atomic_int foreign; /* calls on another thread or with worker != 0 */
    atomic_long calls;  /* calls */
} solo_ctx;

static void solo_fn(void *p, size_t index, unsigned worker)
{
    solo_ctx *c = p;
    if (worker != 0 || !pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->foreign, 1);
    atomic_fetch_add(&c->calls, 1);
}

static void test_zero_workers(void **state)
{
    em_threadpool *pool = em_threadpool_create_workers(0);
    assert_non_null(pool);
    assert_int_equal(em_threadpool_size(pool), 1);
    solo_ctx c = {.caller = pthread_self()};
    atomic_init(&c.foreign, 0);
    atomic_init(&c.calls, 0);
    em_threadpool_parallel_for(pool, 100000, 0, solo_fn, &c);
    em_threadpool_parallel_for(pool, 777, 3, solo_fn, &c);
    assert_int_equal(atomic_load(&c.foreign), 0);
    assert_int_equal(atomic_load(&c.calls), 100777);
    assert_int_equal(run_sum(pool, 1000000, 0), 1000000ull * 999999 / 2);
    em_threadpool_destroy(pool);
}

/* --- nested parallel_for on the same pool runs inline ----------------------------------------- */

typedef struct {
    em_threadpool *pool; /* the pool both levels use */
    atomic_long inner;   /* inner calls */
    atomic_int mismatch; /* inner calls with another worker id than their outer call */
} nest_ctx;

typedef struct {
    nest_ctx *nest;  /* shared */
    unsigned worker; /* the outer call's worker id */
} inner_arg;

static void inner_fn(void *p, size_t index, unsigned worker)
{
    inner_arg *a = p;
    if (worker != a->worker) atomic_fetch_add(&a->nest->mismatch, 1);
    atomic_fetch_add(&a->nest->inner, 1);
}

static void outer_fn(void *p, size_t index, unsigned worker)
{
    nest_ctx *c = p;
    inner_arg a = {.nest = c, .worker = worker};
    em_threadpool_parallel_for(c->pool, 10, 1, inner_fn, &a);
}

static void test_nested(void **state)
{
    nest_ctx c = {.pool = em_threadpool_create_workers(2)};
    assert_non_null(c.pool);
    atomic_init(&c.inner, 0);
    atomic_init(&c.mismatch, 0);
    em_threadpool_parallel_for(c.pool, 100, 1, outer_fn, &c);
    assert_int_equal(atomic_load(&c.inner), 1000);
    assert_int_equal(atomic_load(&c.mismatch), 0);
    em_threadpool_destroy(c.pool);
}

static void test_create_destroy(void **state)
{
    for (int i = 0; i < 30; i++) {
        em_threadpool *pool = em_threadpool_create_workers((unsigned)(i % 5));
        assert_non_null(pool);
        if (i % 2) assert_int_equal(run_sum(pool, 1000, 1), 1000 * 999 / 2);
        em_threadpool_destroy(pool);
    }
    em_threadpool *pool = em_threadpool_create(0); /* cores - 1 workers */
    assert_non_null(pool);
    assert_true(em_threadpool_size(pool) >= 1);
    assert_int_equal(run_sum(pool, 100000, 0), 100000ull * 99999 / 2);
    em_threadpool_destroy(pool);
    em_threadpool_destroy(NULL);
}

static void test_global_pool(void **state)
{
    setenv("EMBER_THREADS", "2", 1); /* read on first use, which is this one */
    em_threadpool *pool = em_threadpool_global();
    assert_non_null(pool);
    assert_ptr_equal(em_threadpool_global(), pool);
    assert_int_equal(em_threadpool_size(pool), 3);
    assert_int_equal(run_sum(pool, 1000000, 0), 1000000ull * 999999 / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_global_pool), /* first: before anything creates the global pool */
        cmocka_unit_test(test_sum_million),           cmocka_unit_test(test_each_index_once),
        cmocka_unit_test(test_concurrent_submitters), cmocka_unit_test(test_worker_ids),
        cmocka_unit_test(test_zero_workers),          cmocka_unit_test(test_nested),
        cmocka_unit_test(test_create_destroy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
