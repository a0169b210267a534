/* threadpool.h — a persistent pool of worker threads running parallel-for jobs. The CPU driver
 * runs one cube per task on it. One job runs at a time per pool (callers serialize on the pool's
 * lock); the calling thread takes part in the work, so a pool of N threads uses N+1 cores. */
#ifndef EM_BASE_THREADPOOL_H
#define EM_BASE_THREADPOOL_H
#include <stddef.h>
#include <stdint.h>

typedef struct em_threadpool em_threadpool;

/* fn(ctx, index, worker) is called once for every index in [0, count); worker is in
 * [0, em_threadpool_size(pool)] and identifies the thread (0 = the calling thread), so callers can
 * keep per-worker scratch memory. */
typedef void (*em_parallel_fn)(void *ctx, size_t index, unsigned worker);

/* Creates a pool with `threads` workers (0 = number of usable cores - 1, which may itself be 0).
 * NULL (error set) on failure. */
em_threadpool *em_threadpool_create(unsigned threads);
/* Creates a pool with exactly `workers` worker threads; 0 gives a pool in which the calling thread
 * does all the work. NULL (error set) on failure. */
em_threadpool *em_threadpool_create_workers(unsigned workers);
/* Joins and frees the workers. */
void em_threadpool_destroy(em_threadpool *pool);
/* Number of workers plus the caller: the number of distinct `worker` values. */
unsigned em_threadpool_size(const em_threadpool *pool);
/* Runs fn over [0, count) and returns when every call has returned. Indices are handed out in
 * chunks of `grain` (0 = automatic). Safe to call from several threads at once (jobs serialize). */
void em_threadpool_parallel_for(em_threadpool *pool, size_t count, size_t grain, em_parallel_fn fn,
                                void *ctx);
/* The process-wide shared pool, created on first use. EMBER_THREADS gives its number of worker
 * threads (0 = the caller does everything); unset, it is the number of usable cores - 1. Never NULL
 * unless thread creation failed (error set). Nested calls (fn itself calling parallel_for on the
 * same pool) run inline on the calling worker. */
em_threadpool *em_threadpool_global(void);

#endif
