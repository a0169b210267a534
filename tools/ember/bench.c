/* bench.c — `ember bench matmul`: ember's matmul throughput per shape, next to a reference run in
 * the same process on the same data: cuBLAS (cublasGemmEx, dlopen'd libcublas.so.13 / .12) on a
 * CUDA device, OpenBLAS (cblas_sgemm, dlopen'd libopenblas.so.0) on the CPU for f32. The
 * references live only here; ember's ops never call them. One JSON line per shape:
 *
 *   {"bench":"matmul","device":"cuda:0","dtype":"bf16","shape":[4096,4096,4096],"at":false,
 *    "config":"wgmma-tma-p 128x256x64 2x1 s1", "ember_tflops":..., "ember_ms":..., "ref":"cublas",
 *    "ref_tflops":..., "ratio":...}
 *
 * --dtype tf32 runs f32 operands with tf32 allowed (ember and cuBLAS alike). The first call of a
 * shape (compilation, autotuning) is not timed; on a GPU 0.3 s of the shape's matmuls warm the
 * clocks up, then ember and the reference take turns for three timed rounds each and each side's
 * best round is reported. --graph times ember's matmuls recorded as one
 * graph and replayed, without the host's cost per launch. --cold rotates the timed matmuls
 * through copies of b that together exceed the device's last-level cache (256 MiB of them, at
 * most 64), so b streams from memory as a decode step's weights do. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "ember/tensor.h"
#include "runtime/rt.h"
#include "tensor/internal.h"
#include "tensor/matmul_internal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- references ------------------------------------------------------------------------------ */

typedef int (*cublas_create_fn)(void **);
typedef int (*cublas_destroy_fn)(void *);
typedef int (*cublas_gemm_ex_fn)(void *, int, int, int, int, int, const void *, const void *, int,
                                 int, const void *, int, int, const void *, void *, int, int, int,
                                 int);
typedef int (*cu_sync_fn)(void);
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);

typedef struct reference {
    const char *name; /* "cublas", "openblas" or NULL when none loaded */
    void *lib, *cuda; /* dlopen handles */
    void *handle;     /* cublasHandle_t */
    cublas_create_fn create;
    cublas_destroy_fn destroy;
    cublas_gemm_ex_fn gemm;
    cu_sync_fn sync; /* cuCtxSynchronize */
    cblas_sgemm_fn sgemm;
    char why[160]; /* why no reference */
} reference;

static void ref_open(reference *r, em_device *dev)
{
    memset(r, 0, sizeof *r);
    const char *target = em_device_caps(dev)->target;
    if (!strcmp(target, "cuda")) {
        static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
        for (size_t i = 0; i < 3 && !r->lib; i++) r->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        r->cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!r->lib || !r->cuda) {
            snprintf(r->why, sizeof r->why, "libcublas could not be loaded");
            return;
        }
        r->create = (cublas_create_fn)dlsym(r->lib, "cublasCreate_v2");
        r->destroy = (cublas_destroy_fn)dlsym(r->lib, "cublasDestroy_v2");
        r->gemm = (cublas_gemm_ex_fn)dlsym(r->lib, "cublasGemmEx");
        r->sync = (cu_sync_fn)dlsym(r->cuda, "cuCtxSynchronize");
        if (!r->create || !r->gemm || !r->sync || r->create(&r->handle) != 0) {
            snprintf(r->why, sizeof r->why, "cublasCreate failed");
            return;
        }
        r->name = "cublas";
    } else if (!strcmp(target, "c")) {
        static const char *const names[] = {
            "libopenblas.so.0", "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
            "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0"};
        for (size_t i = 0; i < 3 && !r->lib; i++) r->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (r->lib) r->sgemm = (cblas_sgemm_fn)dlsym(r->lib, "cblas_sgemm");
        if (r->sgemm)
            r->name = "openblas";
        else
            snprintf(r->why, sizeof r->why, "libopenblas.so.0 not installed");
    } else {
        snprintf(r->why, sizeof r->why, "no reference for %s devices", target);
    }
}

static void ref_close(reference *r)
{
    if (r->handle && r->destroy) r->destroy(r->handle);
    if (r->lib) dlclose(r->lib);
    if (r->cuda) dlclose(r->cuda);
}

/* The device address of t's first element (its pending fused work has run: em_realize). */
static void *dev_ptr(const em_tensor *t)
{
    return (char *)t->st->buf->mem + t->offset * (int64_t)em_scalar_size(t->dtype);
}

/* Seconds per call of the reference on the same operands (row-major C = A B; at / bt: a / b is
 * the transpose of a row-major [K, M] / [N, K], as the bench makes them), or -1. */
static double ref_time(reference *r, const char *dtype, const em_tensor *a, const em_tensor *b,
                       em_tensor *c, int M, int N, int K, bool at, bool bt, int iters)
{
    if (!r->name) return -1;
    if (r->gemm) {
        /* the reference reads a and b and writes c itself */
        if (em_realize(a) != EM_OK || em_realize(b) != EM_OK || em_realize(c) != EM_OK) return -1;
        /* column-major view: C^T [N, M] = B^T [N, K] x A^T [K, M]; a row-major [K, N] b is
         * B^T there (no op, leading dim N), a row-major [N, K] one (bt) is B (op T, K); a
         * likewise (at: op T, leading dim M) */
        int type = !strcmp(dtype, "bf16") ? 14 : !strcmp(dtype, "f16") ? 2 : 0;
        int compute = !strcmp(dtype, "tf32") ? 77 : 68; /* CUBLAS_COMPUTE_32F(_FAST_TF32) */
        float one = 1, zero = 0;
        double t0 = 0;
        for (int i = -2; i < iters; i++) {
            if (i == 0) {
                r->sync();
                t0 = now_s();
            }
            if (r->gemm(r->handle, bt ? 1 : 0, at ? 1 : 0, N, M, K, &one, dev_ptr(b), type,
                        bt ? K : N, dev_ptr(a), type, at ? M : K, &zero, dev_ptr(c), type, N,
                        compute, -1) != 0)
                return -1;
        }
        r->sync();
        return (now_s() - t0) / iters;
    }
    if (strcmp(dtype, "f32") || at || bt) return -1;
    float *ha = malloc((size_t)M * K * 4), *hb = malloc((size_t)K * N * 4),
          *hc = malloc((size_t)M * N * 4);
    double best = -1;
    if (ha && hb && hc && em_to_host(a, ha, (size_t)M * K * 4) == EM_OK &&
        em_to_host(b, hb, (size_t)K * N * 4) == EM_OK) {
        r->sgemm(101, 111, 111, M, N, K, 1, ha, K, hb, N, 0, hc, N); /* warm-up */
        double t0 = now_s();
        for (int i = 0; i < iters; i++) r->sgemm(101, 111, 111, M, N, K, 1, ha, K, hb, N, 0, hc, N);
        best = (now_s() - t0) / iters;
    }
    free(ha), free(hb), free(hc);
    return best;
}

/* ---- ember ------------------------------------------------------------------------------------
 */

static int usage(void)
{
    fprintf(stderr,
            "usage: ember bench matmul [--device D] [--dtype f32|tf32|f16|bf16] "
            "[--shapes MxNxK,...] [--iters N] [--at] [--bt] [--graph] [--cold]\n"
            "  --at: a is the transpose of a row-major [K, M] (a weight gradient's x^T)\n"
            "  --bt: b is the transpose of a row-major [N, K] (as nn.Linear's weight is)\n"
            "  --graph: time the matmuls recorded as one graph and replayed (no per-launch\n"
            "           host cost: the device's time for small shapes)\n"
            "  --cold: rotate through copies of b exceeding the cache (b read from memory)\n");
    return 2;
}

/* Seconds per matmul with n of them recorded as one graph (docs/graphs.md) and replayed: the
 * device's time without the host's per-launch cost, which dominates small shapes (decoding's).
 * The graph is replayed once before the timed replay. -1 with the error set. */
static double time_graph(em_device *dev, const em_tensor *a, em_tensor *const *bs, int nb,
                         const em_matmul_epilogue *ep, int n)
{
    em_graph *g = NULL;
    if (em_tensor_graph_begin(dev) != EM_OK) return -1;
    for (int i = 0; i < n; i++) {
        em_tensor *y = em_matmul_ex(a, bs[i % nb], ep);
        em_status st = y ? em_realize(y) : em_last_status();
        em_release(y);
        if (st != EM_OK) break;
    }
    if (em_tensor_graph_end(dev, &g) != EM_OK) return -1;
    em_timer t;
    double s = -1;
    if (em_tensor_graph_launch(g) == EM_OK && em_device_sync(dev) == EM_OK &&
        em_timer_start(&t, dev) == EM_OK && em_tensor_graph_launch(g) == EM_OK)
        s = em_timer_stop(&t) / n;
    em_graph_free(g);
    return s;
}

/* Seconds per matmul over n of them (rotating through the nb copies of b), eager or (graph)
 * recorded and replayed; -1 with the error set. */
static double time_ember(em_device *dev, const em_tensor *a, em_tensor *const *bs, int nb,
                         const em_matmul_epilogue *ep, int n, bool graph)
{
    if (graph) return time_graph(dev, a, bs, nb, ep, n);
    em_timer t;
    if (em_flush() != EM_OK || em_device_sync(dev) != EM_OK || em_timer_start(&t, dev) != EM_OK)
        return -1;
    for (int i = 0; i < n; i++) {
        em_tensor *y = em_matmul_ex(a, bs[i % nb], ep);
        /* a pending matmul released unread never runs (docs/fusion.md): run each one */
        em_status st = y ? em_realize(y) : em_last_status();
        em_release(y);
        if (st != EM_OK) return -1;
    }
    return em_flush() == EM_OK ? em_timer_stop(&t) / n : -1;
}

/* Timed rounds per side, and the warm-up's seconds on a GPU before them. */
enum { ROUNDS = 3 };
#define WARM_S 0.3

static int bench_matmul(int argc, char **argv)
{
    const char *devname = "cpu", *dtype = "f32", *shapes = NULL;
    int iters = 0;
    bool at = false, bt = false, graph = false, cold = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--at"))
            at = true;
        else if (!strcmp(argv[i], "--bt"))
            bt = true;
        else if (!strcmp(argv[i], "--cold"))
            cold = true;
        else if (!strcmp(argv[i], "--graph"))
            graph = true;
        else if (i + 1 < argc && !strcmp(argv[i], "--device"))
            devname = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--dtype"))
            dtype = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--shapes"))
            shapes = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--iters"))
            iters = atoi(argv[++i]);
        else
            return usage();
    }
    em_scalar dt = !strcmp(dtype, "f16") ? EM_F16 : !strcmp(dtype, "bf16") ? EM_BF16 : EM_F32;
    if (strcmp(dtype, "f32") && strcmp(dtype, "tf32") && strcmp(dtype, "f16") &&
        strcmp(dtype, "bf16"))
        return usage();
    em_device *dev = em_device_open(devname);
    if (!dev) {
        fprintf(stderr, "ember bench: %s\n", em_last_error());
        return 1;
    }
    bool cpu = !strcmp(em_device_caps(dev)->target, "c");
    if (!shapes)
        shapes = cpu ? "256x256x256,512x512x512,1024x1024x1024"
                     : "1024x1024x1024,2048x2048x2048,4096x4096x4096,8192x8192x8192";
    reference ref;
    ref_open(&ref, dev);
    em_matmul_epilogue ep = {.allow_tf32 = !strcmp(dtype, "tf32")};
    int rc = 0;
    const char *p = shapes;
    em_rng rng = em_rng_new(1);
    int rounds = cpu ? 1 : ROUNDS; /* the CPU's figures are steady, and slow to take */
    while (*p) {
        long long M, N, K;
        int used = 0;
        if (sscanf(p, "%lldx%lldx%lld%n", &M, &N, &K, &used) != 3 || M <= 0 || N <= 0 || K <= 0) {
            fprintf(stderr, "ember bench: bad shape list at '%s' (want MxNxK,...)\n", p);
            rc = 2;
            break;
        }
        p += used;
        if (*p == ',') p++;
        em_scope_begin();
        em_tensor *a = at ? em_transpose(em_randn(dev, dt, EM_SHAPE(K, M), &rng), 0, 1)
                          : em_randn(dev, dt, EM_SHAPE(M, K), &rng);
        em_tensor *b = bt ? em_transpose(em_randn(dev, dt, EM_SHAPE(N, K), &rng), 0, 1)
                          : em_randn(dev, dt, EM_SHAPE(K, N), &rng);
        double flop = 2.0 * (double)M * (double)N * (double)K;
        int n = iters > 0 ? iters : flop > 1e12 ? 10 : flop > 1e10 ? 30 : cpu ? 3 : 100;
        if (cpu && iters <= 0 && flop > 1e9) n = 2;
        /* --cold: copies of b (the first is b) that together exceed the cache */
        em_tensor *bs[64] = {b};
        int nb = 1;
        double bbytes = (double)em_scalar_size(dt) * (double)(K * N);
        while (cold && b && nb < 64 && (nb < 2 || nb * bbytes < 256.0 * 1048576.0)) {
            bs[nb] = bt ? em_transpose(em_clone(em_transpose(b, 0, 1)), 0, 1) : em_clone(b);
            if (!bs[nb]) break;
            em_realize(bs[nb++]);
        }
        if (cold && n < nb) n = nb;
        em_tensor *y = a && b ? em_matmul_ex(a, b, &ep) : NULL; /* compile, autotune */
        bool ok = y && em_realize(y) == EM_OK;
        char config[64]; /* what ran: forced, tuned or the heuristic's */
        snprintf(config, sizeof config, "%s", ok ? mm_last_config() : "");
        em_release(y);
        em_tensor *c = ok ? em_zeros(dev, dt, EM_SHAPE(M, N)) : NULL;
        /* warm up (GPUs): an idle GPU runs at a fraction of its clock, and the first shape of a
         * run read low; then ROUNDS rounds of ember's n matmuls and the reference's in turn,
         * each side's best round reported */
        if (ok && !cpu)
            for (double t0 = now_s(); ok && now_s() - t0 < WARM_S;)
                ok = time_ember(dev, a, bs, nb, &ep, 4, false) > 0;
        double s = -1, rs = -1;
        for (int r = 0; ok && c && r < rounds; r++) {
            double e = time_ember(dev, a, bs, nb, &ep, n, graph);
            ok = e > 0;
            if (ok && (s < 0 || e < s)) s = e;
            double q = cold || !ok
                           ? -1
                           : ref_time(&ref, dtype, a, b, c, (int)M, (int)N, (int)K, at, bt, n);
            if (q > 0 && (rs < 0 || q < rs)) rs = q;
        }
        if (!ok) s = -1;
        if (s <= 0) {
            fprintf(stderr, "ember bench: %lldx%lldx%lld: %s\n", M, N, K, em_last_error());
            rc = 1;
            em_scope_end(NULL, 0);
            break;
        }
        double bytes = (double)em_scalar_size(dt) * (double)(M * K + K * N + M * N);
        printf("{\"bench\":\"matmul\",\"device\":\"%s\",\"device_name\":\"%s\",\"dtype\":\"%s\","
               "\"shape\":[%lld,%lld,%lld],\"at\":%s,\"bt\":%s,\"graph\":%s,\"cold_copies\":%d,"
               "\"iters\":%d,"
               "\"rounds\":%d,\"config\":\"%s\","
               "\"ember_ms\":%.4f,\"ember_tflops\":%.4f,\"ember_gbps\":%.1f",
               em_device_name(dev), em_device_caps(dev)->device_name, dtype, M, N, K,
               at ? "true" : "false", bt ? "true" : "false", graph ? "true" : "false",
               cold ? nb : 0, n, rounds, config, s * 1e3, flop / s / 1e12, bytes / s / 1e9);
        if (rs > 0)
            printf(",\"ref\":\"%s\",\"ref_ms\":%.4f,\"ref_tflops\":%.4f,\"ratio\":%.3f", ref.name,
                   rs * 1e3, flop / rs / 1e12, rs / s);
        else
            printf(",\"ref\":null,\"ref_why\":\"%s\"",
                   cold                                  ? "no reference for rotated copies of b"
                   : (at || bt) && ref.name && !ref.gemm ? "no CPU reference for transposes"
                   : ref.name                            ? "reference does not take this dtype"
                                                         : ref.why);
        printf("}\n");
        fflush(stdout);
        em_scope_end(NULL, 0);
    }
    ref_close(&ref);
    em_device_close(dev);
    return rc;
}

int em_cli_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "matmul")) return bench_matmul(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "decode")) return em_cli_bench_decode(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "train-gpt2")) return em_cli_bench_train(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "attention"))
        return em_cli_bench_attention(argc - 1, argv + 1);
    fprintf(stderr, "usage: ember bench matmul|decode|train-gpt2|attention [options]   (see ember "
                    "bench NAME --help)\n");
    return 2;
}
