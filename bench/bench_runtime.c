/* bench_runtime.c — the CPU runtime's fixed costs: compiling a kernel cold (one compiler run per
 * kernel), compiling a batch of 8 in one run, loading kernels from the disk cache in a fresh
 * device (what a second process pays), finding a kernel already in memory, and launching a
 * nearly empty kernel (one cube of one unit, and 64 cubes over the thread pool): the median over
 * samples of 100 back-to-back launches. It uses a private temporary cache directory, so every "cold" figure
 * is really cold. Prints one line per figure and the markdown rows for docs/benchmarks.md.
 *
 *   ember_bench_runtime [--launches N]   (default 20000) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include "base/base.h"
#include "ember/runtime.h"

#define KERNELS 8

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* out[i] = a[i] * scale + b[i]: distinct names and scales give distinct kernels. */
static em_ir_kernel *axpb(const char *name, double scale)
{
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val v = em_ir_binary(k, EM_OP_MUL, em_ir_load(k, a, i),
                               em_ir_const_float(k, em_ty(EM_F32), scale));
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_ADD, v, em_ir_load(k, b, i)));
    em_ir_end(k);
    return k;
}

/* if (ABSOLUTE_POS == 0) out[0] = 1: a launch that does (almost) nothing. */
static em_ir_kernel *nearly_empty(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bench_noop");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, i, em_ir_u32(k, 0)));
    em_ir_store(k, out, i, em_ir_u32(k, 1));
    em_ir_end(k);
    return k;
}

static void die(const char *what)
{
    fprintf(stderr, "ember_bench_runtime: %s: %s\n", what, em_last_error());
    exit(1);
}

#define PER_SAMPLE 100

/* Median seconds per launch of k over `cubes` cubes of one unit: launches are timed in samples of
 * PER_SAMPLE back-to-back launches (the clock's own cost is then negligible). */
static double launch_median(em_kernel *k, em_buffer *out, uint32_t cubes, int launches)
{
    int samples = launches / PER_SAMPLE > 0 ? launches / PER_SAMPLE : 1;
    double *t = malloc((size_t)samples * sizeof(double));
    uint32_t count[3] = {cubes, 1, 1}, dim[3] = {1, 1, 1};
    em_arg arg = em_arg_buffer(out, 1);
    for (int i = 0; i < 200; i++) /* warm up: pool threads awake, caches hot */
        em_launch(k, count, dim, &arg, 1);
    for (int s = 0; s < samples; s++) {
        double t0 = now();
        for (int i = 0; i < PER_SAMPLE; i++)
            if (em_launch(k, count, dim, &arg, 1) != EM_OK)
                die("launch");
        t[s] = (now() - t0) / PER_SAMPLE;
    }
    double m = median(t, (size_t)samples);
    free(t);
    return m;
}

static void commit(char *out, size_t size)
{
    snprintf(out, size, "unknown");
    FILE *p = popen("git -C '" EMBER_SOURCE_DIR "' rev-parse --short HEAD 2>/dev/null", "r");
    if (!p)
        return;
    if (fgets(out, (int)size, p))
        out[strcspn(out, "\n")] = '\0';
    pclose(p);
}

int main(int argc, char **argv)
{
    int launches = 20000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--launches") == 0 && i + 1 < argc) {
            launches = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: ember_bench_runtime [--launches N]\n");
            return 2;
        }
    }
    if (launches < 1)
        launches = 1;
    char cache[4096];
    if (em_temp_dir("ember-bench-cache", cache, sizeof(cache)) != EM_OK)
        die("temp dir");
    setenv("EMBER_CACHE_DIR", cache, 1);

    em_ir_kernel *singles[KERNELS], *batch[KERNELS];
    for (int i = 0; i < KERNELS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "single_%d", i);
        singles[i] = axpb(name, 1.0 + i);
        snprintf(name, sizeof(name), "batched_%d", i);
        batch[i] = axpb(name, 100.0 + i);
    }
    em_kernel *out[KERNELS];
    double cold[KERNELS], disk[KERNELS], mem[KERNELS];

    em_device *dev = em_device_open("cpu");
    if (!dev)
        die("open cpu");
    em_cache_dir(); /* resolve (and create) the directory outside the timings */
    for (int i = 0; i < KERNELS; i++) {
        double t0 = now();
        if (!em_kernel_compile(dev, singles[i]))
            die("compile");
        cold[i] = now() - t0;
    }
    double t0 = now();
    if (em_kernel_compile_batch(dev, (const em_ir_kernel *const *)batch, KERNELS, out) != EM_OK)
        die("compile batch");
    double batch_cold = now() - t0;
    for (int i = 0; i < KERNELS; i++) {
        double t1 = now();
        em_kernel_compile(dev, singles[i]);
        mem[i] = now() - t1;
    }
    em_device_close(dev);

    dev = em_device_open("cpu"); /* a fresh device: the memory level is empty */
    for (int i = 0; i < KERNELS; i++) {
        double t1 = now();
        if (!em_kernel_compile(dev, singles[i]))
            die("compile from disk");
        disk[i] = now() - t1;
    }
    t0 = now();
    if (em_kernel_compile_batch(dev, (const em_ir_kernel *const *)batch, KERNELS, out) != EM_OK)
        die("batch from disk");
    double batch_disk = now() - t0;
    em_cache_stats stats;
    em_cache_stats_get(&stats);

    em_ir_kernel *noop_ir = nearly_empty();
    em_kernel *noop = em_kernel_compile(dev, noop_ir);
    em_buffer *flag = em_buffer_alloc(dev, 4);
    if (!noop || !flag)
        die("noop kernel");
    double launch1 = launch_median(noop, flag, 1, launches);
    double launch64 = launch_median(noop, flag, 64, launches);
    em_threadpool *pool = em_threadpool_global();
    unsigned threads = pool ? em_threadpool_size(pool) : 1;

    double cold_med = median(cold, KERNELS), disk_med = median(disk, KERNELS);
    double mem_med = median(mem, KERNELS);
    const char *cc = getenv("EMBER_CC"), *cflags = getenv("EMBER_CFLAGS");
    char date[32], rev[64];
    time_t tt = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d", localtime(&tt));
    commit(rev, sizeof(rev));
    struct utsname u;
    uname(&u);
    const em_caps *caps = em_device_caps(dev);

    printf("ember CPU runtime benchmark — %s, commit %s\n", date, rev);
    printf("machine: %s, %s %s, %u pool threads (incl. caller)\n", caps->device_name, u.sysname,
           u.machine, threads);
    printf("compiler: %s %s\n", cc ? cc : "cc", cflags ? cflags : "-O2");
    printf("cache counters: compiles %llu, kernels built %llu, disk hits %llu, memory hits %llu\n\n",
           (unsigned long long)stats.compiles, (unsigned long long)stats.kernels_built,
           (unsigned long long)stats.disk_hits, (unsigned long long)stats.memory_hits);
    printf("cold compile, one kernel per compiler run (median of %d)   %8.1f ms\n", KERNELS,
           cold_med * 1e3);
    printf("cold compile, batch of %d in one run                       %8.1f ms (%.1f ms per kernel)\n",
           KERNELS, batch_cold * 1e3, batch_cold * 1e3 / KERNELS);
    printf("warm disk-cache load, fresh device (median of %d)          %8.3f ms\n", KERNELS,
           disk_med * 1e3);
    printf("warm disk-cache load, batch of %d                          %8.3f ms\n", KERNELS,
           batch_disk * 1e3);
    printf("memory-cache hit (median of %d)                            %8.2f us\n", KERNELS,
           mem_med * 1e6);
    printf("launch overhead, 1 cube x 1 unit (%d launches)             %8.3f us\n", launches,
           launch1 * 1e6);
    printf("launch overhead, 64 cubes x 1 unit over the pool          %8.3f us\n\n",
           launch64 * 1e6);

    printf("markdown rows:\n");
    printf("| cold compile, 1 kernel per `cc` run (median of %d) | %.1f ms |\n", KERNELS,
           cold_med * 1e3);
    printf("| cold compile, batch of %d in one `cc` run | %.1f ms (%.1f ms per kernel) |\n",
           KERNELS, batch_cold * 1e3, batch_cold * 1e3 / KERNELS);
    printf("| disk-cache load, fresh device (median of %d) | %.3f ms |\n", KERNELS,
           disk_med * 1e3);
    printf("| disk-cache load, batch of %d | %.3f ms |\n", KERNELS, batch_disk * 1e3);
    printf("| memory-cache hit | %.2f µs |\n", mem_med * 1e6);
    printf("| launch, 1 cube × 1 unit (median over %d launches) | %.3f µs |\n", launches,
           launch1 * 1e6);
    printf("| launch, 64 cubes × 1 unit over the pool (median over %d launches) | %.3f µs |\n",
           launches, launch64 * 1e6);

    em_buffer_free(flag);
    em_ir_kernel_free(noop_ir);
    for (int i = 0; i < KERNELS; i++) {
        em_ir_kernel_free(singles[i]);
        em_ir_kernel_free(batch[i]);
    }
    em_device_close(dev);
    em_remove_tree(cache);
    return 0;
}
