/* bench_backend.c — one device's raw figures, for any backend (cpu, cuda:N, opencl:N, vulkan:N):
 *
 *   1. device-to-device copy bandwidth: em_buffer_copy of one large buffer into another, bytes
 *      read + written, the median of many repeats timed with em_timer (device events on GPUs);
 *   2. a large elementwise kernel: the exact GELU, x * (1 + erf(x / sqrt 2)) / 2, written once in
 *      the kernel language (KERNELS below), in f32 and in bf16 (stored as 16-bit, computed in f32),
 *      with the line width picked by em_pick_line_width among the widths em_line_lanes prefers (or
 *      up to --line-bytes); reported in GB/s (bytes read + written)
 *      and as a percentage of the copy bandwidth of the same run. The output is checked against a
 *      host reference (double precision) on samples before anything is timed. Devices without
 *      bf16 run the bf16 case on 16-bit integers converted by hand (same memory traffic);
 *   3. launch overhead: 1,000 launches of a tiny kernel and one sync, per launch (median of 5);
 *   4. compile time per kernel: cold (a fresh cache directory, kernels never seen before: a
 *      comptime constant varies), warm from the disk cache (a freshly opened device and a freshly
 *      loaded module, what a second process pays) and warm from memory (the same device again).
 *
 * Prints a short table; with --json the table goes to stderr and one JSON line with every figure
 * to stdout (scripts/gpu-bench.sh puts it beside PyTorch's, from bench/reference/
 * torch_elementwise.py). Buffers are 1 GiB by default, 64 MiB on CPU-like devices (the CPU
 * itself, PoCL, lavapipe). A section that fails is reported (and named in the JSON "errors") while
 * the others still run; the exit status is then 1.
 *
 *   ember_bench_backend [--device NAME] [--bytes N] [--repeats N] [--cube N] [--line-bytes N]
 *                       [--sweep] [--json]                               (default device: cpu) */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/base.h"
#include "base/file.h"
#include "ember/lang.h"
#include "ember/runtime.h"

/* The kernels, in the kernel language. gelu_f32 is the one formula; bench_gelu runs it over lines
 * of F (f32, or bf16 widened to f32 and rounded back once); bench_gelu_bf16bits does the same
 * on bf16 bit patterns held in u16, for devices without a bf16 type; bench_tiny is the launch
 * probe; bench_compile is gelu plus a comptime constant, so that each SALT is a new kernel. */
static const char KERNELS[] =
    "/* bench_backend.ek: the kernels of bench/bench_backend.c */\n"
    "inline line(f32) gelu_f32(line(f32) x)\n"
    "{\n"
    "    return x * (erf(x * 0.7071067811865476) + 1.0) * 0.5;\n"
    "}\n"
    "\n"
    "kernel<F: float> void bench_gelu(const tensor(line(F)) input, tensor(line(F)) output)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(input)) {\n"
    "        output[i] = line(F)(gelu_f32(line(f32)(input[i])));\n"
    "    }\n"
    "}\n"
    "\n"
    "kernel void bench_gelu_bf16bits(const tensor(line(u16)) input, tensor(line(u16)) output)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(input)) {\n"
    "        line(f32) x = bitcast<line(f32)>(line(u32)(input[i]) << 16);\n"
    "        line(u32) u = bitcast<line(u32)>(gelu_f32(x));\n"
    "        output[i] = line(u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "    }\n"
    "}\n"
    "\n"
    "kernel void bench_tiny(tensor(u32) out)\n"
    "{\n"
    "    if (ABSOLUTE_POS == 0) {\n"
    "        out[0] = 1;\n"
    "    }\n"
    "}\n"
    "\n"
    "kernel<F: float> void bench_compile(const tensor(line(F)) input, tensor(line(F)) output,\n"
    "                                    comptime u32 SALT = 0)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(input)) {\n"
    "        output[i] = line(F)(gelu_f32(line(f32)(input[i])) + f32(SALT));\n"
    "    }\n"
    "}\n";

#define LAUNCHES 1000      /* launches per launch-overhead sample */
#define LAUNCH_SAMPLES 5   /* samples; the figure is their median */
#define COMPILE_KERNELS 5  /* distinct kernels timed per compile figure */
#define WINDOW 4096        /* elements per verification window */

typedef struct config {
    const char *device;  /* device name */
    size_t bytes;        /* bytes per buffer (0 = by device) */
    int repeats;         /* timed repeats (0 = by device) */
    unsigned cube;       /* units per cube for GELU */
    unsigned line_bytes; /* widest line in bytes offered to em_pick_line_width; 0: em_line_lanes */
    int sweep;           /* also time GELU over line widths x cube sizes */
    int json;            /* one JSON line on stdout, the table on stderr */
} config;

typedef struct bench {
    config cfg;          /* the command line */
    em_device *dev;      /* the device measured */
    em_lang_module *mod; /* KERNELS */
    em_buffer *in, *out; /* cfg.bytes each */
    double copy_gbps;    /* from section 1, for the percentages */
    FILE *tab;           /* where the human table goes */
    cJSON *root;         /* the JSON line */
    cJSON *errors;       /* root's "errors" array */
    int failed;          /* a section failed */
    int used_bits;       /* bf16 ran as u16 bits (the device has no bf16) */
} bench;

/* ---- small helpers ---------------------------------------------------------------------------- */

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

/* The median of v[0..n) (sorts v). */
static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* x rounded to `digits` significant digits, so the JSON stays readable. */
static double sig(double x, int digits)
{
    if (x == 0 || !isfinite(x))
        return x;
    double scale = pow(10.0, digits - 1 - (int)floor(log10(fabs(x))));
    return round(x * scale) / scale;
}

/* Records a failed section: prints what failed with the runtime's message, adds it to "errors". */
static void section_error(bench *b, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    char line[1024];
    snprintf(line, sizeof(line), "%s: %s", what, em_last_error());
    fprintf(stderr, "ember_bench_backend: %s\n", line);
    cJSON_AddItemToArray(b->errors, cJSON_CreateString(line));
    b->failed = 1;
}

static void commit(char *out, size_t size)
{
    const char *env = getenv("EMBER_COMMIT");
    snprintf(out, size, "%s", env && *env ? env : "unknown");
    if (env && *env)
        return;
    FILE *p = popen("git -C '" EMBER_SOURCE_DIR "' rev-parse --short HEAD 2>/dev/null", "r");
    if (!p)
        return;
    if (fgets(out, (int)size, p))
        out[strcspn(out, "\n")] = '\0';
    if (!*out)
        snprintf(out, size, "unknown");
    pclose(p);
}

/* bf16 <-> f32 on the host: round to nearest even, as the kernels do. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* True for devices that are really the host CPU (the CPU driver, PoCL, lavapipe/llvmpipe):
 * they get the smaller default size. */
static int cpu_like(const em_device *dev)
{
    const em_caps *c = em_device_caps(dev);
    if (strcmp(c->target, "c") == 0)
        return 1;
    if (strcmp(c->target, "cuda") == 0)
        return 0;
    const char *marks[] = {"llvmpipe", "lavapipe", "pthread", "pocl", "cpu", "CPU"};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        if (strstr(c->device_name, marks[i]))
            return 1;
    return 0;
}

/* ---- input data ------------------------------------------------------------------------------- */

/* Fills b->in with n pseudo-random values in [-6, 6) as f32 or bf16 (16 MiB at a time). */
static em_status fill_input(bench *b, int is_bf16, size_t n)
{
    const size_t chunk = (16u << 20) / 4;
    size_t esize = is_bf16 ? 2 : 4;
    unsigned char *host = malloc(chunk * 4);
    if (!host)
        return em_set_error(EM_ERR_NOMEM, "host staging buffer");
    uint64_t state = 0x9e3779b97f4a7c15ull;
    em_status st = EM_OK;
    for (size_t done = 0; done < n && st == EM_OK; done += chunk) {
        size_t m = n - done < chunk ? n - done : chunk;
        for (size_t i = 0; i < m; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            float v = (float)((double)(state >> 40) / (double)(1u << 24) * 12.0 - 6.0);
            if (is_bf16) {
                uint16_t h = f32_to_bf16(v);
                memcpy(host + i * 2, &h, 2);
            } else {
                memcpy(host + i * 4, &v, 4);
            }
        }
        st = em_buffer_write(b->in, done * esize, host, m * esize);
    }
    free(host);
    return st;
}

/* ---- 1. copy bandwidth ------------------------------------------------------------------------ */

static void bench_copy(bench *b)
{
    size_t bytes = b->cfg.bytes;
    int reps = b->cfg.repeats;
    double *t = malloc((size_t)reps * sizeof(double));
    cJSON *o = cJSON_AddObjectToObject(b->root, "copy");
    if (!t) {
        section_error(b, "copy: out of host memory");
        return;
    }
    for (int i = 0; i < 3; i++) /* warm up */
        if (em_buffer_copy(b->out, 0, b->in, 0, bytes) != EM_OK) {
            section_error(b, "copy: em_buffer_copy");
            free(t);
            return;
        }
    for (int i = 0; i < reps; i++) {
        em_timer tm;
        if (em_timer_start(&tm, b->dev) != EM_OK || em_buffer_copy(b->out, 0, b->in, 0, bytes) != EM_OK ||
            (t[i] = em_timer_stop(&tm)) < 0) {
            section_error(b, "copy: timed em_buffer_copy");
            free(t);
            return;
        }
    }
    double lo = t[0];
    for (int i = 1; i < reps; i++)
        lo = t[i] < lo ? t[i] : lo;
    double med = median(t, (size_t)reps);
    free(t);
    b->copy_gbps = 2.0 * (double)bytes / med / 1e9;
    cJSON_AddNumberToObject(o, "bytes_moved", 2.0 * (double)bytes);
    cJSON_AddNumberToObject(o, "median_ms", sig(med * 1e3, 5));
    cJSON_AddNumberToObject(o, "min_ms", sig(lo * 1e3, 5));
    cJSON_AddNumberToObject(o, "gbps", sig(b->copy_gbps, 5));
    cJSON_AddNumberToObject(o, "best_gbps", sig(2.0 * (double)bytes / lo / 1e9, 5));
    fprintf(b->tab, "D2D copy, em_buffer_copy (read+write)     %9.2f GB/s  (%.3f ms median)\n",
            b->copy_gbps, med * 1e3);
}

/* ---- 2. GELU ---------------------------------------------------------------------------------- */

/* One GELU variant: the kernel compiled for a dtype, line width and cube size. */
typedef struct gelu_run {
    int is_bf16;       /* bf16 (else f32) */
    int bits;          /* bf16 held in u16 (the device has no bf16) */
    unsigned lw;       /* line width */
    unsigned cube;     /* units per cube */
    size_t n;          /* elements */
    em_kernel *kernel; /* compiled */
} gelu_run;

static em_kernel *gelu_compile(bench *b, gelu_run *g)
{
    em_lang_bind bind = em_lang_bind_type("F", g->is_bf16 ? EM_BF16 : EM_F32);
    em_lang_spec spec = {&bind, g->bits ? 0 : 1, g->lw, NULL};
    return em_lang_compile(b->dev, b->mod, g->bits ? "bench_gelu_bf16bits" : "bench_gelu", &spec);
}

static em_status gelu_launch(bench *b, const gelu_run *g)
{
    uint64_t lines = g->n / g->lw;
    uint64_t cubes = (lines + g->cube - 1) / g->cube;
    uint32_t count[3] = {(uint32_t)cubes, 1, 1}, dim[3] = {g->cube, 1, 1};
    /* Vulkan dispatches at most 65535 cubes per axis (and cannot split a kernel that reads the
     * grid size, as the linear ABSOLUTE_POS does): fold larger grids into a second axis; the
     * cubes past the end find nothing to do. CUDA's x axis takes 2^31 - 1. */
    if (cubes > 65535 && strcmp(em_device_caps(b->dev)->target, "cuda") != 0) {
        uint64_t y = (cubes + 65534) / 65535;
        count[1] = (uint32_t)y;
        count[0] = (uint32_t)((cubes + y - 1) / y);
    }
    em_arg args[2] = {em_arg_buffer(b->in, lines), em_arg_buffer(b->out, lines)};
    return em_launch(g->kernel, count, dim, args, 2);
}

/* Checks three windows of the output (start, middle, end) against the host reference; returns
 * the largest error relative to the tolerance (<= 1 passes) or -1 with the error set. */
static double gelu_verify(bench *b, const gelu_run *g, double *max_abs)
{
    size_t esize = g->is_bf16 ? 2 : 4, w = g->n < WINDOW ? g->n : WINDOW;
    size_t starts[3] = {0, (g->n / 2) & ~(size_t)15, g->n - w};
    unsigned char *x = malloc(w * esize), *y = malloc(w * esize);
    double worst = 0;
    *max_abs = 0;
    if (!x || !y) {
        free(x);
        free(y);
        em_set_error(EM_ERR_NOMEM, "host verification buffers");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        if (starts[k] + w > g->n)
            starts[k] = g->n - w;
        if (em_buffer_read(b->in, starts[k] * esize, x, w * esize) != EM_OK ||
            em_buffer_read(b->out, starts[k] * esize, y, w * esize) != EM_OK) {
            worst = -1;
            break;
        }
        for (size_t i = 0; i < w; i++) {
            double xi, yi, tol;
            if (g->is_bf16) {
                uint16_t hx, hy;
                memcpy(&hx, x + 2 * i, 2);
                memcpy(&hy, y + 2 * i, 2);
                xi = bf16_to_f32(hx);
                yi = bf16_to_f32(hy);
            } else {
                float fx, fy;
                memcpy(&fx, x + 4 * i, 4);
                memcpy(&fy, y + 4 * i, 4);
                xi = fx;
                yi = fy;
            }
            double ref = gelu_ref(xi), err = fabs(yi - ref);
            /* f32: a few ulp, plus 1 + erf cancelling for x << 0; bf16: its half-ulp (2^-9) x 4 */
            tol = g->is_bf16 ? 1e-3 + 8e-3 * fabs(ref) : 2e-6 + 1e-5 * fabs(ref);
            if (isnan(err))
                err = INFINITY;
            if (err > *max_abs)
                *max_abs = err;
            if (err / tol > worst) {
                worst = err / tol;
                if (worst > 1)
                    fprintf(stderr, "ember_bench_backend: gelu %s mismatch at %zu: x %.9g -> %.9g, "
                            "expected %.9g\n", g->is_bf16 ? "bf16" : "f32", starts[k] + i, xi, yi, ref);
            }
            if (worst > 1)
                break;
        }
        if (worst > 1)
            break;
    }
    free(x);
    free(y);
    return worst;
}

/* Median seconds of `reps` timed launches of g (after one warm-up), or -1 with the error set. */
static double gelu_time(bench *b, const gelu_run *g, int reps, double *best)
{
    double *t = malloc((size_t)reps * sizeof(double));
    if (!t) {
        em_set_error(EM_ERR_NOMEM, "host timing buffer");
        return -1;
    }
    if (gelu_launch(b, g) != EM_OK || em_device_sync(b->dev) != EM_OK) {
        free(t);
        return -1;
    }
    for (int i = 0; i < reps; i++) {
        em_timer tm;
        if (em_timer_start(&tm, b->dev) != EM_OK || gelu_launch(b, g) != EM_OK ||
            (t[i] = em_timer_stop(&tm)) < 0) {
            free(t);
            return -1;
        }
    }
    *best = t[0];
    for (int i = 1; i < reps; i++)
        *best = t[i] < *best ? t[i] : *best;
    double med = median(t, (size_t)reps);
    free(t);
    return med;
}

/* Compiles, verifies (after zeroing the output) and times one variant. Returns the median GB/s,
 * or -1 after recording the error. */
static double gelu_measure(bench *b, gelu_run *g, int reps, cJSON *o, const char *dtype)
{
    g->kernel = gelu_compile(b, g);
    if (!g->kernel) {
        section_error(b, "gelu %s: compile (line %u)", dtype, g->lw);
        return -1;
    }
    double max_abs = 0, worst;
    if (em_buffer_fill_zero(b->out) != EM_OK || gelu_launch(b, g) != EM_OK ||
        em_device_sync(b->dev) != EM_OK) {
        section_error(b, "gelu %s: launch (line %u, cube %u)", dtype, g->lw, g->cube);
        return -1;
    }
    worst = gelu_verify(b, g, &max_abs);
    if (worst < 0) {
        section_error(b, "gelu %s: reading back", dtype);
        return -1;
    }
    if (worst > 1) {
        em_set_error(EM_ERR_INVALID, "max abs error %.3g exceeds the tolerance", max_abs);
        section_error(b, "gelu %s: WRONG RESULTS (line %u, cube %u)", dtype, g->lw, g->cube);
        return -1;
    }
    double best = 0, med = gelu_time(b, g, reps, &best);
    if (med < 0) {
        section_error(b, "gelu %s: timed launch", dtype);
        return -1;
    }
    double moved = 2.0 * (double)b->cfg.bytes, gbps = moved / med / 1e9;
    if (o) {
        cJSON_AddStringToObject(o, "dtype", dtype);
        cJSON_AddStringToObject(o, "storage", g->bits ? "u16 bits (no bf16 on device)" : dtype);
        cJSON_AddNumberToObject(o, "line_width", g->lw);
        cJSON_AddNumberToObject(o, "cube_dim", g->cube);
        cJSON_AddNumberToObject(o, "elements", (double)g->n);
        cJSON_AddNumberToObject(o, "bytes_moved", moved);
        cJSON_AddNumberToObject(o, "median_ms", sig(med * 1e3, 5));
        cJSON_AddNumberToObject(o, "min_ms", sig(best * 1e3, 5));
        cJSON_AddNumberToObject(o, "gbps", sig(gbps, 5));
        if (b->copy_gbps > 0)
            cJSON_AddNumberToObject(o, "pct_of_copy", sig(100.0 * gbps / b->copy_gbps, 4));
        cJSON_AddBoolToObject(o, "verified", 1);
        cJSON_AddNumberToObject(o, "max_abs_err", sig(max_abs, 3));
    }
    return gbps;
}

static void bench_gelu(bench *b)
{
    cJSON *arr = cJSON_AddArrayToObject(b->root, "gelu");
    cJSON *sweep = b->cfg.sweep ? cJSON_AddArrayToObject(b->root, "gelu_sweep") : NULL;
    const em_caps *caps = em_device_caps(b->dev);
    for (int is_bf16 = 0; is_bf16 <= 1; is_bf16++) {
        const char *dtype = is_bf16 ? "bf16" : "f32";
        size_t esize = is_bf16 ? 2 : 4, n = b->cfg.bytes / esize;
        gelu_run g = {is_bf16, is_bf16 && !caps->dtype[EM_BF16], 1, b->cfg.cube, n, NULL};
        unsigned cands[5];
        size_t nc = 0;
        for (unsigned w = 16; w >= 1; w /= 2)
            if (b->cfg.line_bytes ? w * esize <= b->cfg.line_bytes : w <= em_line_lanes(caps, (unsigned)esize))
                cands[nc++] = w;
        int64_t shape[1] = {(int64_t)n}, stride[1] = {1};
        g.lw = em_pick_line_width(1, shape, stride, 0, cands, nc);
        if (fill_input(b, is_bf16, n) != EM_OK) {
            section_error(b, "gelu %s: writing the input", dtype);
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        double gbps = gelu_measure(b, &g, b->cfg.repeats, o, dtype);
        if (gbps < 0) {
            cJSON_Delete(o);
            continue;
        }
        cJSON_AddItemToArray(arr, o);
        b->used_bits |= g.bits;
        fprintf(b->tab, "GELU %-4s (line %2u, cube %4u)%s          %9.2f GB/s  (%.1f%% of copy)\n",
                dtype, g.lw, g.cube, g.bits ? "*" : " ", gbps,
                b->copy_gbps > 0 ? 100.0 * gbps / b->copy_gbps : 0.0);
        if (!sweep)
            continue;
        /* the sweep: every line width up to 32 bytes x cube sizes, fewer repeats */
        const unsigned cubes[] = {64, 128, 256, 512, 1024};
        double best_gbps = 0;
        unsigned best_lw = 0, best_cube = 0;
        for (unsigned w = 1; w * esize <= 32; w *= 2) {
            if (n % w)
                continue;
            for (size_t c = 0; c < sizeof(cubes) / sizeof(cubes[0]); c++) {
                if (cubes[c] > caps->max_cube_units || cubes[c] > caps->max_cube_dim[0])
                    continue;
                gelu_run s = g;
                s.lw = w;
                s.cube = cubes[c];
                int reps = b->cfg.repeats / 4 > 5 ? b->cfg.repeats / 4 : 5;
                double r = gelu_measure(b, &s, reps, NULL, dtype);
                if (r < 0)
                    continue;
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "dtype", dtype);
                cJSON_AddNumberToObject(e, "line_width", w);
                cJSON_AddNumberToObject(e, "cube_dim", cubes[c]);
                cJSON_AddNumberToObject(e, "gbps", sig(r, 5));
                if (b->copy_gbps > 0)
                    cJSON_AddNumberToObject(e, "pct_of_copy", sig(100.0 * r / b->copy_gbps, 4));
                cJSON_AddItemToArray(sweep, e);
                if (r > best_gbps) {
                    best_gbps = r;
                    best_lw = w;
                    best_cube = cubes[c];
                }
            }
        }
        if (best_gbps > 0)
            fprintf(b->tab, "  sweep best: line %2u, cube %4u           %9.2f GB/s  (%.1f%% of copy)\n",
                    best_lw, best_cube, best_gbps,
                    b->copy_gbps > 0 ? 100.0 * best_gbps / b->copy_gbps : 0.0);
    }
}

/* ---- 3. launch overhead ----------------------------------------------------------------------- */

static void bench_launch(bench *b)
{
    em_lang_spec spec = {NULL, 0, 1, NULL};
    em_kernel *k = em_lang_compile(b->dev, b->mod, "bench_tiny", &spec);
    em_buffer *flag = em_buffer_alloc(b->dev, 256);
    if (!k || !flag) {
        section_error(b, "launch: %s", k ? "alloc" : "compile bench_tiny");
        em_buffer_free(flag);
        return;
    }
    uint32_t count[3] = {1, 1, 1}, dim[3] = {1, 1, 1};
    em_arg arg = em_arg_buffer(flag, 1);
    double t[LAUNCH_SAMPLES];
    for (int i = 0; i < 100; i++) /* warm up */
        if (em_launch(k, count, dim, &arg, 1) != EM_OK) {
            section_error(b, "launch: em_launch");
            em_buffer_free(flag);
            return;
        }
    for (int s = 0; s < LAUNCH_SAMPLES; s++) {
        if (em_device_sync(b->dev) != EM_OK) {
            section_error(b, "launch: sync");
            em_buffer_free(flag);
            return;
        }
        double t0 = now();
        for (int i = 0; i < LAUNCHES; i++)
            if (em_launch(k, count, dim, &arg, 1) != EM_OK) {
                section_error(b, "launch: em_launch");
                em_buffer_free(flag);
                return;
            }
        if (em_device_sync(b->dev) != EM_OK) {
            section_error(b, "launch: sync");
            em_buffer_free(flag);
            return;
        }
        t[s] = (now() - t0) / LAUNCHES;
    }
    em_buffer_free(flag);
    double lo = t[0];
    for (int s = 1; s < LAUNCH_SAMPLES; s++)
        lo = t[s] < lo ? t[s] : lo;
    double med = median(t, LAUNCH_SAMPLES);
    cJSON *o = cJSON_AddObjectToObject(b->root, "launch");
    cJSON_AddNumberToObject(o, "launches", LAUNCHES);
    cJSON_AddNumberToObject(o, "samples", LAUNCH_SAMPLES);
    cJSON_AddNumberToObject(o, "median_us", sig(med * 1e6, 4));
    cJSON_AddNumberToObject(o, "min_us", sig(lo * 1e6, 4));
    fprintf(b->tab, "launch overhead (%d launches + 1 sync)  %9.2f us per launch (median of %d)\n",
            LAUNCHES, med * 1e6, LAUNCH_SAMPLES);
}

/* ---- 4. compile time -------------------------------------------------------------------------- */

/* Compiles bench_compile with SALT = salt; the seconds taken, or -1 with the error set. */
static double compile_once(em_device *dev, const em_lang_module *m, int salt, unsigned lw)
{
    em_lang_bind binds[2] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("SALT", salt)};
    em_lang_spec spec = {binds, 2, lw, NULL};
    double t0 = now();
    if (!em_lang_compile(dev, m, "bench_compile", &spec))
        return -1;
    return now() - t0;
}

static void add_counters(cJSON *o, const char *name, const em_cache_stats *a,
                         const em_cache_stats *z)
{
    cJSON *c = cJSON_AddObjectToObject(o, name);
    cJSON_AddNumberToObject(c, "compiles", (double)(z->compiles - a->compiles));
    cJSON_AddNumberToObject(c, "disk_hits", (double)(z->disk_hits - a->disk_hits));
    cJSON_AddNumberToObject(c, "memory_hits", (double)(z->memory_hits - a->memory_hits));
}

/* Runs last: it closes and reopens the device (b->dev is the reopened one afterwards, or NULL). */
static void bench_compile(bench *b)
{
    const unsigned lw = 4;
    const int salt0 = 1000 + (int)(time(NULL) % 100000) * 10; /* never seen before, anywhere */
    double cold[COMPILE_KERNELS], disk[COMPILE_KERNELS], mem[COMPILE_KERNELS];
    em_cache_stats s0, s1, s2, s3;
    cJSON *o = cJSON_AddObjectToObject(b->root, "compile");
    cJSON_AddStringToObject(o, "kernel", "bench_compile (gelu + comptime SALT), f32, line 4");
    cJSON_AddNumberToObject(o, "kernels", COMPILE_KERNELS);

    em_cache_stats_get(&s0);
    for (int i = 0; i < COMPILE_KERNELS; i++)
        if ((cold[i] = compile_once(b->dev, b->mod, salt0 + i, lw)) < 0) {
            section_error(b, "compile: cold");
            return;
        }
    em_cache_stats_get(&s1);
    for (int i = 0; i < COMPILE_KERNELS; i++)
        if ((mem[i] = compile_once(b->dev, b->mod, salt0 + i, lw)) < 0) {
            section_error(b, "compile: memory hit");
            return;
        }
    em_cache_stats_get(&s2);
    double cold_med = median(cold, COMPILE_KERNELS), mem_med = median(mem, COMPILE_KERNELS);
    cJSON_AddNumberToObject(o, "cold_ms", sig(cold_med * 1e3, 4));
    cJSON_AddNumberToObject(o, "memory_hit_us", sig(mem_med * 1e6, 4));
    add_counters(o, "cold_counters", &s0, &s1);
    add_counters(o, "memory_counters", &s1, &s2);
    fprintf(b->tab, "compile, cold (median of %d kernels)     %9.2f ms per kernel\n",
            COMPILE_KERNELS, cold_med * 1e3);
    fprintf(b->tab, "compile, warm memory hit (same device)   %9.2f us\n", mem_med * 1e6);

    /* a second process's view: a fresh device (empty memory level) and a freshly loaded module */
    em_buffer_free(b->in);
    em_buffer_free(b->out);
    b->in = b->out = NULL;
    em_device_close(b->dev);
    b->dev = em_device_open(b->cfg.device);
    em_lang_module *fresh = em_lang_module_from_string("bench_backend.ek", KERNELS, NULL);
    if (!b->dev || !fresh) {
        section_error(b, "compile: %s", b->dev ? "reloading the kernels" : "reopening the device");
        em_lang_module_free(fresh);
        return;
    }
    for (int i = 0; i < COMPILE_KERNELS; i++)
        if ((disk[i] = compile_once(b->dev, fresh, salt0 + i, lw)) < 0) {
            section_error(b, "compile: disk hit");
            em_lang_module_free(fresh);
            return;
        }
    em_cache_stats_get(&s3);
    em_lang_module_free(fresh);
    double disk_med = median(disk, COMPILE_KERNELS);
    cJSON_AddNumberToObject(o, "disk_hit_ms", sig(disk_med * 1e3, 4));
    add_counters(o, "disk_counters", &s2, &s3);
    fprintf(b->tab, "compile, warm disk hit (fresh device)    %9.3f ms\n", disk_med * 1e3);
    if (s1.compiles - s0.compiles < COMPILE_KERNELS || s3.disk_hits - s2.disk_hits < COMPILE_KERNELS)
        fprintf(b->tab, "  (cache counters disagree: see the JSON's *_counters)\n");
}

/* ---- main ------------------------------------------------------------------------------------- */

static int usage(void)
{
    fprintf(stderr, "usage: ember_bench_backend [--device NAME] [--bytes N] [--repeats N] [--cube N]\n"
                    "                           [--line-bytes N] [--sweep] [--json]\n");
    return 2;
}

static int parse_args(int argc, char **argv, config *c)
{
    *c = (config){"cpu", 0, 0, 256, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--device") == 0 && has) {
            c->device = argv[++i];
        } else if (strcmp(a, "--bytes") == 0 && has) {
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end == 'K' || *end == 'k')
                v *= 1024.0, end++;
            else if (*end == 'M' || *end == 'm')
                v *= 1048576.0, end++;
            else if (*end == 'G' || *end == 'g')
                v *= 1073741824.0, end++;
            if (*end || v < 65536.0 || v > 8.0 * 1073741824.0) {
                fprintf(stderr, "ember_bench_backend: --bytes takes 64K to 8G (suffixes K, M, G)\n");
                return 2;
            }
            c->bytes = (size_t)v;
        } else if (strcmp(a, "--repeats") == 0 && has) {
            c->repeats = atoi(argv[++i]);
            if (c->repeats < 1)
                return usage();
        } else if (strcmp(a, "--cube") == 0 && has) {
            c->cube = (unsigned)atoi(argv[++i]);
            if (c->cube < 1)
                return usage();
        } else if (strcmp(a, "--line-bytes") == 0 && has) {
            c->line_bytes = (unsigned)atoi(argv[++i]);
            if (c->line_bytes < 4 || c->line_bytes > 64)
                return usage();
        } else if (strcmp(a, "--sweep") == 0) {
            c->sweep = 1;
        } else if (strcmp(a, "--json") == 0) {
            c->json = 1;
        } else {
            return usage();
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof(b));
    int rc = parse_args(argc, argv, &b.cfg);
    if (rc)
        return rc;
    b.tab = b.cfg.json ? stderr : stdout;

    char cache[4096];
    if (em_temp_dir("ember-bench-backend", cache, sizeof(cache)) != EM_OK) {
        fprintf(stderr, "ember_bench_backend: temporary cache directory: %s\n", em_last_error());
        return 1;
    }
    setenv("EMBER_CACHE_DIR", cache, 1);
    if (!em_cache_dir()) {
        fprintf(stderr, "ember_bench_backend: kernel cache: %s\n", em_last_error());
        em_remove_tree(cache);
        return 1;
    }
    b.dev = em_device_open(b.cfg.device);
    if (!b.dev) {
        fprintf(stderr, "ember_bench_backend: cannot open device %s: %s\n", b.cfg.device,
                em_last_error());
        em_remove_tree(cache);
        return 1;
    }
    b.mod = em_lang_module_from_string("bench_backend.ek", KERNELS, NULL);
    if (!b.mod) {
        fprintf(stderr, "ember_bench_backend: the benchmark's kernels: %s\n", em_last_error());
        em_device_close(b.dev);
        em_remove_tree(cache);
        return 1;
    }
    const em_caps *caps = em_device_caps(b.dev);
    int small = cpu_like(b.dev);
    if (!b.cfg.bytes)
        b.cfg.bytes = small ? (64u << 20) : (1u << 30);
    b.cfg.bytes &= ~(size_t)0xffff; /* whole 64 KiB: every line width divides it */
    if (!b.cfg.repeats)
        b.cfg.repeats = small ? 10 : 50;
    if (b.cfg.cube > caps->max_cube_units)
        b.cfg.cube = caps->max_cube_units;

    char date[32], rev[64];
    time_t tt = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&tt));
    commit(rev, sizeof(rev));
    b.root = cJSON_CreateObject();
    cJSON_AddStringToObject(b.root, "bench", "backend");
    cJSON_AddStringToObject(b.root, "impl", "ember");
    cJSON_AddStringToObject(b.root, "date", date);
    cJSON_AddStringToObject(b.root, "commit", rev);
    cJSON_AddStringToObject(b.root, "device", em_device_name(b.dev));
    cJSON_AddStringToObject(b.root, "device_name", caps->device_name);
    cJSON_AddStringToObject(b.root, "target", caps->target);
    cJSON_AddStringToObject(b.root, "arch", caps->arch);
    cJSON_AddNumberToObject(b.root, "bytes", (double)b.cfg.bytes);
    cJSON_AddNumberToObject(b.root, "repeats", b.cfg.repeats);
    b.errors = cJSON_AddArrayToObject(b.root, "errors");

    fprintf(b.tab, "ember backend benchmark: %s (%s, target %s), %s, commit %s\n",
            em_device_name(b.dev), caps->device_name, caps->target, date, rev);
    fprintf(b.tab, "buffers of %.0f MiB, median of %d repeats (timed with %s)\n\n",
            (double)b.cfg.bytes / 1048576.0, b.cfg.repeats,
            strcmp(caps->target, "c") == 0 ? "the host clock" : "device events");

    b.in = em_buffer_alloc(b.dev, b.cfg.bytes);
    b.out = b.in ? em_buffer_alloc(b.dev, b.cfg.bytes) : NULL;
    if (!b.in || !b.out) {
        section_error(&b, "allocating 2 x %zu bytes", b.cfg.bytes);
    } else if (fill_input(&b, 0, b.cfg.bytes / 4) != EM_OK) {
        section_error(&b, "writing the input");
    } else {
        bench_copy(&b);
        bench_gelu(&b);
    }
    bench_launch(&b);
    bench_compile(&b);
    if (b.used_bits)
        fprintf(b.tab, "\n* bf16 held in u16 and converted in the kernel (the device has no bf16)\n");

    if (b.cfg.json) {
        char *line = cJSON_PrintUnformatted(b.root);
        if (line) {
            printf("%s\n", line);
            free(line);
        }
    }
    cJSON_Delete(b.root);
    em_buffer_free(b.in);
    em_buffer_free(b.out);
    em_lang_module_free(b.mod);
    if (b.dev)
        em_device_close(b.dev);
    em_remove_tree(cache);
    return b.failed ? 1 : 0;
}
