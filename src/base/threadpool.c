/* threadpool.c — persistent worker threads running one parallel-for job at a time.
 *
 * A job is split into chunks of `grain` indices; every participant (the submitting thread as
 * worker 0, and workers 1..helpers) takes the next chunk number from one atomic counter until none
 * are left. Submitters serialize on `submit`; the job itself is published under `lock` by bumping
 * `generation`, and the submitter waits on `idle` until every helper has finished, so each job's
 * effects are visible to the submitter when parallel_for returns. A job that fits in one chunk, or
 * a pool without workers, runs on the submitting thread alone. */
#include "base/threadpool.h"
#include "base/log.h"
#include "ember/base.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOL_MAX_WORKERS 1024
#define CHUNKS_PER_THREAD 8 /* automatic grain: about this many chunks per participant */

typedef struct job {
    em_parallel_fn fn; /* the body */
    void *ctx;         /* its context */
    size_t count;      /* indices [0, count) */
    size_t grain;      /* indices per chunk */
    size_t chunks;     /* number of chunks */
} job;

typedef struct worker {
    em_threadpool *pool; /* the pool it serves */
    unsigned id;         /* 1..workers */
    pthread_t thread;    /* its thread */
} worker;

struct em_threadpool {
    pthread_mutex_t submit;   /* held for a whole job: jobs from several threads serialize */
    pthread_mutex_t lock;     /* guards the fields below, except next_chunk */
    pthread_cond_t wake;      /* workers wait here for a new generation or stop */
    pthread_cond_t idle;      /* the submitter waits here for pending to reach 0 */
    worker *workers;          /* the worker threads */
    unsigned nworkers;        /* how many */
    uint64_t generation;      /* bumped for every job handed to workers */
    bool stop;                /* set once by destroy */
    job job;                  /* the current job */
    unsigned helpers;         /* workers 1..helpers take part in the current job */
    unsigned pending;         /* helpers not yet done with it */
    atomic_size_t next_chunk; /* the next chunk number to hand out */
};

/* The pool and worker id of the job the calling thread runs (if any): a nested parallel_for on
 * that pool runs inline instead of deadlocking on `submit`. */
static _Thread_local const em_threadpool *current_pool;
static _Thread_local unsigned current_worker;

static void run_chunks(em_threadpool *pool, const job *j, unsigned id)
{
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&pool->next_chunk, 1, memory_order_relaxed);
        if (c >= j->chunks) return;
        size_t start = c * j->grain;
        size_t end = j->count - start < j->grain ? j->count : start + j->grain;
        for (size_t i = start; i < end; i++) j->fn(j->ctx, i, id);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    em_threadpool *pool = w->pool;
    current_pool = pool;
    current_worker = w->id;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) break;
        seen = pool->generation;
        if (w->id > pool->helpers) continue; /* not needed for this one */
        job j = pool->job;
        pthread_mutex_unlock(&pool->lock);
        run_chunks(pool, &j, w->id);
        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0) pthread_cond_signal(&pool->idle);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

/* Number of cores this process may run on. */
static unsigned usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return (unsigned)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* Stops and joins the first n workers. */
static void stop_workers(em_threadpool *pool, unsigned n)
{
    pthread_mutex_lock(&pool->lock);
    pool->stop = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < n; i++) pthread_join(pool->workers[i].thread, NULL);
}

/* Starts the workers with every signal blocked, so signals go to the application's threads. */
static bool start_workers(em_threadpool *pool)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    unsigned started = 0;
    int rc = 0;
    for (; started < pool->nworkers; started++) {
        worker *w = &pool->workers[started];
        w->pool = pool;
        w->id = started + 1;
        rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) break;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) return true;
    stop_workers(pool, started);
    em_set_error(EM_ERR_INTERNAL, "thread pool: cannot start worker %u of %u: %s", started + 1,
                 pool->nworkers, strerror(rc));
    return false;
}

em_threadpool *em_threadpool_create_workers(unsigned workers)
{
    if (workers > POOL_MAX_WORKERS) workers = POOL_MAX_WORKERS;
    em_threadpool *pool = calloc(1, sizeof *pool);
    worker *ws = workers ? calloc(workers, sizeof *ws) : NULL;
    if (!pool || (workers && !ws)) {
        free(pool);
        free(ws);
        em_set_error(EM_ERR_NOMEM, "thread pool: out of memory");
        return NULL;
    }
    pool->workers = ws;
    pool->nworkers = workers;
    atomic_init(&pool->next_chunk, 0);
    pthread_mutex_init(&pool->submit, NULL);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->idle, NULL);
    if (!start_workers(pool)) {
        em_threadpool_destroy(pool);
        return NULL;
    }
    return pool;
}

em_threadpool *em_threadpool_create(unsigned threads)
{
    return em_threadpool_create_workers(threads ? threads : usable_cores() - 1);
}

void em_threadpool_destroy(em_threadpool *pool)
{
    if (!pool) return;
    if (!pool->stop) stop_workers(pool, pool->nworkers);
    pthread_cond_destroy(&pool->idle);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->submit);
    free(pool->workers);
    free(pool);
}

unsigned em_threadpool_size(const em_threadpool *pool)
{
    return pool->nworkers + 1;
}

/* Runs every index on the calling thread as `id`. */
static void run_inline(size_t count, em_parallel_fn fn, void *ctx, unsigned id)
{
    for (size_t i = 0; i < count; i++) fn(ctx, i, id);
}

/* Publishes j to `helpers` workers, takes part as worker 0, and waits for the helpers. */
static void run_job(em_threadpool *pool, const job *j, unsigned helpers)
{
    pthread_mutex_lock(&pool->lock);
    pool->job = *j;
    atomic_store_explicit(&pool->next_chunk, 0, memory_order_relaxed);
    pool->helpers = helpers;
    pool->pending = helpers;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    run_chunks(pool, j, 0);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0) pthread_cond_wait(&pool->idle, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}

void em_threadpool_parallel_for(em_threadpool *pool, size_t count, size_t grain, em_parallel_fn fn,
                                void *ctx)
{
    if (count == 0) return;
    if (current_pool == pool) { /* nested inside one of this pool's jobs */
        run_inline(count, fn, ctx, current_worker);
        return;
    }
    size_t threads = (size_t)pool->nworkers + 1;
    if (grain == 0) grain = count / (threads * CHUNKS_PER_THREAD);
    if (grain == 0) grain = 1;
    job j = {.fn = fn, .ctx = ctx, .count = count, .grain = grain};
    j.chunks = count / grain + (count % grain != 0);
    unsigned helpers = (unsigned)(j.chunks - 1 < pool->nworkers ? j.chunks - 1 : pool->nworkers);

    const em_threadpool *outer_pool = current_pool; /* a job of another pool may be running */
    unsigned outer_worker = current_worker;
    pthread_mutex_lock(&pool->submit);
    current_pool = pool;
    current_worker = 0;
    if (helpers == 0)
        run_inline(count, fn, ctx, 0);
    else
        run_job(pool, &j, helpers);
    current_pool = outer_pool;
    current_worker = outer_worker;
    pthread_mutex_unlock(&pool->submit);
}

/* --- the process-wide pool -------------------------------------------------------------------- */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static em_threadpool *global_pool; /* written once under global_once */
static char global_failure[512];   /* why it could not start; written once under global_once */

/* Worker count for the global pool: EMBER_THREADS if it is a valid number, else cores - 1. */
static unsigned global_workers(void)
{
    unsigned fallback = usable_cores() - 1;
    const char *env = getenv("EMBER_THREADS");
    if (!env || !*env) return fallback;
    char *end;
    errno = 0;
    unsigned long n = strtoul(env, &end, 10);
    if (errno || *end != '\0' || env[0] == '-' || n > POOL_MAX_WORKERS) {
        EM_LOGW("EMBER_THREADS=%s is not a worker count in 0..%d; using %u", env, POOL_MAX_WORKERS,
                fallback);
        return fallback;
    }
    return (unsigned)n;
}

static void global_init(void)
{
    global_pool = em_threadpool_create_workers(global_workers());
    if (!global_pool) snprintf(global_failure, sizeof global_failure, "%s", em_last_error());
}

em_threadpool *em_threadpool_global(void)
{
    pthread_once(&global_once, global_init);
    if (!global_pool) em_set_error(EM_ERR_INTERNAL, "global %s", global_failure);
    return global_pool;
}
