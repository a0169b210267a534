/* test_exec_common.h — the harness of the execution tests (test_exec_*.c): runs IR kernels on the
 * CPU and gives the cases reference helpers. Every case runs twice (XRUN_BOTH):
 *  - direct: generate C with em_codegen_c, compile it with `cc -std=c11 -O2 -Wall -Werror` into
 *    a shared object, dlopen it and call emk_NAME with a hand-filled em_cpu_launch, the cubes split
 *    over a few threads (as the CPU driver does);
 *  - runtime: the public API (em_device_open("cpu"), buffers, em_kernel_compile_batch, em_launch).
 * Host arrays are copied in before and out after every launch, so a case reads its results from
 * its own arrays either way. Every failure is a cmocka assertion. */
#ifndef TEST_EXEC_COMMON_H
#define TEST_EXEC_COMMON_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ember/kernel.h"
#include "kernel/examples.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "ember/runtime.h"
#include "kernel/codegen/c_abi.h"
#include "kernel/codegen/codegen.h"

#ifndef EMBER_TEST_TMP
#define EMBER_TEST_TMP "/tmp"
#endif

#define XMAX_KERNELS 32
#define XMAX_ARGS 16

/* ---- arguments ------------------------------------------------------------------------------ */

typedef struct xarg {
    uint8_t kind;                /* EM_PARAM_BUFFER or EM_PARAM_SCALAR */
    void *host;                  /* buffers: host memory, copied in and back out */
    size_t bytes;                /* buffers: bytes of host */
    uint64_t len;                /* buffers: elements seen by the kernel */
    unsigned rank;               /* buffers: tensor rank (0 = plain array) */
    int64_t shape[EM_MAX_RANK];  /* buffers: sizes in scalars */
    int64_t stride[EM_MAX_RANK]; /* buffers: strides in scalars */
    em_ir_const value;           /* scalars: in the parameter's class */
} xarg;

static inline xarg xbuf(void *host, size_t bytes, uint64_t len)
{
    xarg a = {.kind = EM_PARAM_BUFFER, .host = host, .bytes = bytes, .len = len};
    return a;
}
static inline xarg xtensor(void *host, size_t bytes, uint64_t len, unsigned rank,
                           const int64_t *shape, const int64_t *stride)
{
    xarg a = xbuf(host, bytes, len);
    a.rank = rank;
    for (unsigned i = 0; i < rank && i < EM_MAX_RANK; i++)
        a.shape[i] = shape[i], a.stride[i] = stride[i];
    return a;
}
static inline xarg xscalar_u(uint64_t v)
{
    xarg a = {.kind = EM_PARAM_SCALAR, .value = {.u = v}};
    return a;
}
static inline xarg xscalar_i(int64_t v)
{
    xarg a = {.kind = EM_PARAM_SCALAR, .value = {.i = v}};
    return a;
}
static inline xarg xscalar_f(double v)
{
    xarg a = {.kind = EM_PARAM_SCALAR, .value = {.f = v}};
    return a;
}

/* ---- compiling and launching ----------------------------------------------------------------- */

enum { XMODE_DIRECT = 0, XMODE_RUNTIME = 1 };
static int xmode; /* how xcompile / xlaunch run kernels (set by each group's setup) */

typedef struct xmod {
    size_t n;                               /* kernels */
    uint8_t rank[XMAX_KERNELS][XMAX_ARGS];  /* buffer parameters: rank */
    uint8_t lanes[XMAX_KERNELS][XMAX_ARGS]; /* buffer parameters: lanes of the element */
    void *so;                               /* direct: the loaded shared object */
    em_cpu_kernel_fn fn[XMAX_KERNELS];      /* direct: emk_NAME per kernel */
    char path[512];                         /* direct: the generated source */
    em_kernel *k[XMAX_KERNELS];             /* runtime: compiled kernels (owned by the device) */
} xmod;

static unsigned xcounter;
static em_device *xdev;

static em_device *xdevice(void)
{
    if (!xdev) {
        xdev = em_device_open("cpu");
        if (!xdev) fail_msg("em_device_open(\"cpu\"): %s", em_last_error());
    }
    return xdev;
}

/* Compiles C with the system compiler into a shared object; 0 on success (output in log). */
static inline int xcc(const char *cc, const char *extra, const char *src, const char *so,
                      const char *log)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s -std=c11 -O2 -Wall -Werror %s -fPIC -shared -o '%s' '%s' -lm > '%s' 2>&1", cc,
             extra, so, src, log);
    return system(cmd);
}

static inline void xdump_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) fputs(line, stderr);
    fclose(f);
}

/* Writes `src` to a fresh file in the test temporary directory; path receives its name. */
static inline void xwrite_source(const char *src, const char *tag, char *path, size_t cap)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", EMBER_TEST_TMP);
    assert_int_equal(system(cmd), 0);
    snprintf(path, cap, "%s/exec_%s_%d_%u.c", EMBER_TEST_TMP, tag, (int)getpid(), xcounter++);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(src, f);
    fclose(f);
}

static inline xmod *xcompile(em_ir_kernel *const *ks, size_t n)
{
    assert_true(n > 0 && n <= XMAX_KERNELS);
    xmod *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->n = n;
    for (size_t i = 0; i < n; i++)
        for (size_t p = 0; p < em_ir_param_count(ks[i]) && p < XMAX_ARGS; p++) {
            const em_ir_param *prm = em_ir_param_at(ks[i], p);
            const em_ir_memory *mem =
                prm->kind == EM_PARAM_BUFFER ? em_ir_mem_at(ks[i], prm->id) : NULL;
            m->rank[i][p] = mem ? mem->rank : 0;
            m->lanes[i][p] = mem ? mem->elem.lanes : 1;
        }
    if (xmode == XMODE_RUNTIME) {
        if (em_kernel_compile_batch(xdevice(), (const em_ir_kernel *const *)ks, n, m->k) != EM_OK)
            fail_msg("em_kernel_compile_batch: %s", em_last_error());
        return m;
    }
    char *src = em_codegen_c((const em_ir_kernel *const *)ks, n, NULL);
    if (!src) fail_msg("em_codegen_c: %s", em_last_error());
    xwrite_source(src, em_ir_kernel_name(ks[0]), m->path, sizeof m->path);
    free(src);
    char so[600], log[600];
    snprintf(so, sizeof so, "%s.so", m->path);
    snprintf(log, sizeof log, "%s.log", m->path);
    if (xcc("cc", "", m->path, so, log) != 0) {
        xdump_file(log);
        fail_msg("the generated C (%s) does not compile warning-free", m->path);
    }
    m->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!m->so) fail_msg("dlopen %s: %s", so, dlerror());
    for (size_t i = 0; i < n; i++) {
        char sym[256];
        snprintf(sym, sizeof sym, "emk_%s", em_ir_kernel_name(ks[i]));
        void *p = dlsym(m->so, sym);
        if (!p) fail_msg("%s not exported by %s", sym, so);
        memcpy(&m->fn[i], &p, sizeof p);
    }
    unlink(so);
    unlink(log);
    return m;
}

static inline void xmod_free(xmod *m)
{
    if (!m) return;
    if (m->so) {
        dlclose(m->so);
        if (!getenv("EXEC_KEEP")) unlink(m->path); /* EXEC_KEEP=1 keeps the generated C */
    }
    free(m);
}

typedef struct xjob {
    em_cpu_kernel_fn fn;
    const em_cpu_launch *launch;
    uint64_t total, chunk;
    atomic_uint_fast64_t next;
} xjob;

static inline void *xworker(void *arg)
{
    xjob *j = arg;
    for (;;) {
        uint64_t first = atomic_fetch_add(&j->next, j->chunk);
        if (first >= j->total) break;
        uint64_t count = j->total - first < j->chunk ? j->total - first : j->chunk;
        j->fn(j->launch, first, count);
    }
    return NULL;
}

/* Direct: the cubes split in chunks over three threads and the caller, like the CPU driver. */
static inline void xlaunch_direct(xmod *m, size_t which, const uint32_t count[3],
                                  const uint32_t dim[3], xarg *args, size_t nargs)
{
    em_cpu_buf bufs[XMAX_ARGS];
    em_cpu_scalar scalars[XMAX_ARGS];
    memset(bufs, 0, sizeof bufs);
    memset(scalars, 0, sizeof scalars);
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].kind == EM_PARAM_BUFFER) {
            bufs[i].data = args[i].host;
            bufs[i].len = args[i].len;
            bufs[i].shape = args[i].rank ? args[i].shape : NULL;
            bufs[i].stride = args[i].rank ? args[i].stride : NULL;
        } else {
            memcpy(&scalars[i], &args[i].value, sizeof scalars[i]);
        }
    }
    em_cpu_launch launch = {.bufs = bufs, .scalars = scalars};
    memcpy(launch.cube_dim, dim, sizeof launch.cube_dim);
    memcpy(launch.cube_count, count, sizeof launch.cube_count);
    uint64_t total = (uint64_t)count[0] * count[1] * count[2];
    xjob job = {.fn = m->fn[which], .launch = &launch, .total = total};
    job.chunk = total / 16 ? total / 16 : 1;
    atomic_init(&job.next, 0);
    enum { THREADS = 3 };
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, xworker, &job), 0);
    xworker(&job);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
}

static inline void xlaunch_runtime(xmod *m, size_t which, const uint32_t count[3],
                                   const uint32_t dim[3], xarg *args, size_t nargs)
{
    em_arg a[XMAX_ARGS];
    em_buffer *bufs[XMAX_ARGS] = {0};
    for (size_t i = 0; i < nargs; i++) {
        memset(&a[i], 0, sizeof a[i]);
        if (args[i].kind == EM_PARAM_BUFFER) {
            bufs[i] = em_buffer_alloc(xdevice(), args[i].bytes ? args[i].bytes : 1);
            if (!bufs[i]) fail_msg("em_buffer_alloc: %s", em_last_error());
            if (args[i].bytes)
                assert_int_equal(em_buffer_write(bufs[i], 0, args[i].host, args[i].bytes), EM_OK);
            a[i] =
                em_arg_tensor(bufs[i], 0, args[i].len, args[i].rank, args[i].shape, args[i].stride);
        } else {
            a[i].kind = EM_PARAM_SCALAR;
            a[i].value_class = EM_ARG_AS_PARAM;
            a[i].value = args[i].value;
        }
    }
    if (em_launch(m->k[which], count, dim, a, nargs) != EM_OK)
        fail_msg("em_launch: %s", em_last_error());
    assert_int_equal(em_device_sync(xdevice()), EM_OK);
    for (size_t i = 0; i < nargs; i++) {
        if (!bufs[i]) continue;
        if (args[i].bytes)
            assert_int_equal(em_buffer_read(bufs[i], 0, args[i].host, args[i].bytes), EM_OK);
        em_buffer_free(bufs[i]);
    }
}

static inline void xlaunch(xmod *m, size_t which, const uint32_t count[3], const uint32_t dim[3],
                           xarg *args, size_t nargs)
{
    assert_true(which < m->n && nargs <= XMAX_ARGS);
    /* a plain array given to a rank-1 tensor parameter is a contiguous vector */
    for (size_t i = 0; i < nargs; i++)
        if (args[i].kind == EM_PARAM_BUFFER && args[i].rank == 0 && m->rank[which][i] == 1) {
            args[i].rank = 1;
            args[i].shape[0] = (int64_t)(args[i].len * m->lanes[which][i]);
            args[i].stride[0] = 1;
        }
    if (xmode == XMODE_RUNTIME)
        xlaunch_runtime(m, which, count, dim, args, nargs);
    else
        xlaunch_direct(m, which, count, dim, args, nargs);
}

static inline int xsetup_direct(void **state)
{
    (void)state;
    xmode = XMODE_DIRECT;
    return 0;
}

static inline int xsetup_runtime(void **state)
{
    (void)state;
    xmode = XMODE_RUNTIME;
    return 0;
}

static inline int xteardown(void **state)
{
    (void)state;
    if (xdev) em_device_close(xdev);
    xdev = NULL;
    return 0;
}

/* Runs the cases twice: generated C called directly, then through the runtime's CPU device. */
#define XRUN_BOTH(tests)                                                                           \
    (cmocka_run_group_tests_name("direct (em_codegen_c + cc + dlopen)", tests, xsetup_direct,      \
                                 xteardown) |                                                      \
     cmocka_run_group_tests_name("runtime (cpu device)", tests, xsetup_runtime, xteardown))

/* Compiles one kernel, launches it once, frees the module (not the kernel). */
static inline void xrun(em_ir_kernel *k, const uint32_t count[3], const uint32_t dim[3], xarg *args,
                        size_t nargs)
{
    xmod *m = xcompile(&k, 1);
    xlaunch(m, 0, count, dim, args, nargs);
    xmod_free(m);
}

#define XGRID(x, y, z) ((const uint32_t[3]){(x), (y), (z)})

/* ---- checks and references ------------------------------------------------------------------ */

static inline uint64_t xrand_state(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform float in [lo, hi). */
static inline float xrandf(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((xrand_state(s) >> 40) * (1.0 / 16777216.0));
}

static inline void xcheck_close(const char *what, size_t i, double got, double want, double tol)
{
    double err = fabs(got - want);
    double scale = fabs(want) > 1 ? fabs(want) : 1;
    if (isnan(want) && isnan(got)) return;
    if (!(err <= tol * scale)) fail_msg("%s[%zu]: got %.9g, want %.9g", what, i, got, want);
}

/* Rounds x to a binary format with `mant` fraction bits, smallest normal exponent emin and largest
 * exponent emax (round to nearest even), and returns its bits (sign, ebits exponent, mant). An
 * independent reference for the generated f16/bf16 conversions. */
static inline uint16_t xref_round(double x, int mant, int emin, int emax)
{
    int ebits = emax == 15 ? 5 : 8, bias = emax;
    uint16_t sign = signbit(x) ? (uint16_t)(1u << 15) : 0;
    uint16_t inf = (uint16_t)(((1u << ebits) - 1) << mant);
    if (isnan(x)) return (uint16_t)(inf | (1u << (mant - 1)));
    double a = fabs(x);
    if (isinf(a)) return sign | inf;
    if (a == 0) return sign;
    int ex;
    frexp(a, &ex);
    int e = ex - 1; /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mant);
    double r = nearbyint(a / q) * q;
    if (r >= ldexp(1.0, emax + 1)) return sign | inf;
    if (r < ldexp(1.0, emin)) return (uint16_t)(sign | (uint16_t)(r / ldexp(1.0, emin - mant)));
    frexp(r, &ex);
    e = ex - 1;
    uint32_t frac = (uint32_t)((r / ldexp(1.0, e) - 1.0) * ldexp(1.0, mant));
    return (uint16_t)(sign | (uint16_t)((uint32_t)(e + bias) << mant) | frac);
}
static inline uint16_t xref_f16(double x)
{
    return xref_round(x, 10, -14, 15);
}
static inline uint16_t xref_bf16(double x)
{
    return xref_round(x, 7, -126, 127);
}

static inline double xref_half_value(uint16_t h, bool bf)
{
    int mant = bf ? 7 : 10, ebits = bf ? 8 : 5, bias = bf ? 127 : 15;
    int e = (h >> mant) & ((1 << ebits) - 1);
    double frac = (double)(h & ((1u << mant) - 1));
    double v;
    if (e == (1 << ebits) - 1)
        v = frac ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(frac, 1 - bias - mant);
    else
        v = ldexp(1.0 + frac / ldexp(1.0, mant), e - bias);
    return (h & 0x8000u) ? -v : v;
}

/* Equal bits, or both NaN. */
static inline void xcheck_half(const char *what, size_t i, uint16_t got, uint16_t want, bool bf)
{
    uint16_t inf = bf ? 0x7f80u : 0x7c00u;
    bool gnan = (got & 0x7fffu) > inf, wnan = (want & 0x7fffu) > inf;
    if (gnan && wnan) return;
    if (got != want)
        fail_msg("%s[%zu]: got 0x%04x (%.9g), want 0x%04x (%.9g)", what, i, got,
                 xref_half_value(got, bf), want, xref_half_value(want, bf));
}

#endif
