/* bench_tensor.c — issue #6's benchmark: the tensor ops of a GPT-2 step, timed on one device.
 *
 *   softmax               over rows of 1024 (attention rows: B*H*T = 16*12*1024 rows x 1024), f32
 *   layer_norm            B*T = 16384 x C = 768, with weight and bias (eps 1e-5)
 *   gelu_tanh, gelu_erf   16384 x 3072 (em_gelu_tanh, em_gelu)
 *   sum_last              16384 x 768, summed over the last dim
 *   transpose_contiguous  16384 x 768 -> 768 x 16384 (em_contiguous(em_transpose(x, 0, 1)))
 *
 * Each op runs once and a few sample rows of its result are checked against a double-precision
 * host computation (WRONG, and no timing, on a mismatch); then it is warmed up and timed: the
 * median of N runs, each timed with em_timer (device events on GPUs, a device sync included).
 * The output tensor is allocated inside the timed region, as an eager call does. GB/s counts the
 * bytes read + written once. --small shrinks every shape (B*T = 2048, 2048 softmax rows) and is
 * the default on every device but CUDA; --full forces the GPT-2 shapes.
 *
 * A human table goes to stdout, or to stderr with --json, which prints one JSON line whose keys
 * match bench/reference/torch_tensor_ops.py (scripts/gpu-bench.sh prints the ratios). Exit 1 when
 * the device cannot be opened or any op failed or was WRONG.
 *
 *   ember_bench_tensor [--device NAME] [--json] [--small | --full] [--repeats N]
 *                                                                        (default device: cpu) */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/file.h"
#include "ember/runtime.h"
#include "ember/tensor.h"

#define WARMUP 3      /* untimed runs before timing */
#define SAMPLE_ROWS 4 /* rows checked per window (three windows: start, middle, end) */
#define LN_EPS 1e-5

typedef struct sizes {
    int64_t attn_rows, attn_cols; /* softmax */
    int64_t bt, c, c4;            /* B*T, C, 4C */
} sizes;

typedef struct ctx {
    em_device *dev;
    em_tensor *x_attn;  /* [attn_rows, attn_cols] */
    em_tensor *x_c;     /* [bt, c] */
    em_tensor *x_c4;    /* [bt, c4] */
    em_tensor *w, *b;   /* [c] */
} ctx;

typedef enum op_kind { OP_SOFTMAX, OP_LAYER_NORM, OP_GELU_TANH, OP_GELU_ERF, OP_SUM, OP_TRANSPOSE } op_kind;

static const char *const OP_NAMES[] = {"softmax",  "layer_norm", "gelu_tanh",
                                       "gelu_erf", "sum_last",   "transpose_contiguous"};

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

static double sig(double x, int digits)
{
    if (x == 0 || !isfinite(x))
        return x;
    double scale = pow(10.0, digits - 1 - (int)floor(log10(fabs(x))));
    return round(x * scale) / scale;
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

/* The op's input (the first one for layer_norm). */
static const em_tensor *op_input(const ctx *c, op_kind op)
{
    switch (op) {
    case OP_SOFTMAX:
        return c->x_attn;
    case OP_GELU_TANH:
    case OP_GELU_ERF:
        return c->x_c4;
    default:
        return c->x_c;
    }
}

/* Calls the op once; a new tensor (maybe still pending under fusion), or NULL with the error
 * set. */
static em_tensor *op_call(const ctx *c, op_kind op)
{
    int last = -1;
    em_tensor *v, *r;
    switch (op) {
    case OP_SOFTMAX:
        return em_softmax(c->x_attn, -1);
    case OP_LAYER_NORM:
        return em_layer_norm(c->x_c, 1, c->w, c->b, LN_EPS);
    case OP_GELU_TANH:
        return em_gelu_tanh(c->x_c4);
    case OP_GELU_ERF:
        return em_gelu(c->x_c4);
    case OP_SUM:
        return em_sum(c->x_c, &last, 1, false);
    case OP_TRANSPOSE:
        v = em_transpose(c->x_c, 0, 1);
        r = em_contiguous(v);
        em_release(v);
        return r;
    }
    return NULL;
}

/* Runs the op once: with fusion on an elementwise op only records its result, so the result is
 * realized here (em_realize), inside the timed region. A new tensor, or NULL with the error set. */
static em_tensor *op_run(const ctx *c, op_kind op)
{
    em_tensor *r = op_call(c, op);
    if (r && em_realize(r) != EM_OK) {
        em_release(r);
        r = NULL;
    }
    return r;
}

/* Bytes read + written once. */
static double op_bytes(const ctx *c, op_kind op)
{
    double n = (double)em_numel(op_input(c, op));
    switch (op) {
    case OP_LAYER_NORM:
        return 8.0 * n + 8.0 * (double)em_numel(c->w);
    case OP_SUM:
        return 4.0 * n + 4.0 * (double)em_dim(c->x_c, 0);
    default:
        return 8.0 * n;
    }
}

/* Checks rows [r0, r0 + k) of the op's result against the host; returns the worst error divided
 * by its tolerance (<= 1 passes), -1 with the error set when reading fails. */
static double check_rows(const ctx *c, op_kind op, const em_tensor *out, int64_t r0, int64_t k,
                         double *max_err)
{
    const em_tensor *in = op_input(c, op);
    int64_t cols = em_dim(in, 1);
    size_t n = (size_t)(k * cols);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    float *w = malloc((size_t)cols * sizeof(float)), *bias = malloc((size_t)cols * sizeof(float));
    em_tensor *xin = em_narrow(in, 0, r0, k);
    /* the output rows that belong to input rows r0..: columns r0.. for the transpose */
    em_tensor *yout = op == OP_TRANSPOSE ? em_narrow(out, 1, r0, k) : em_narrow(out, 0, r0, k);
    double worst = -1;
    size_t ny = op == OP_SUM ? (size_t)k : n;
    if (!x || !y || !w || !bias) {
        em_set_error(EM_ERR_NOMEM, "host verification buffers");
        goto done;
    }
    if (!xin || !yout || em_to_host(xin, x, n * sizeof(float)) != EM_OK ||
        em_to_host(yout, y, ny * sizeof(float)) != EM_OK)
        goto done;
    if (op == OP_LAYER_NORM && (em_to_host(c->w, w, (size_t)cols * sizeof(float)) != EM_OK ||
                                em_to_host(c->b, bias, (size_t)cols * sizeof(float)) != EM_OK))
        goto done;
    worst = 0;
    *max_err = 0;
    for (int64_t r = 0; r < k; r++) {
        const float *xr = x + r * cols;
        double mx = -INFINITY, s = 0, sa = 0, mean = 0, var = 0;
        for (int64_t j = 0; j < cols; j++) {
            mx = xr[j] > mx ? xr[j] : mx;
            s += xr[j];
            sa += fabs(xr[j]);
        }
        mean = s / (double)cols;
        for (int64_t j = 0; j < cols; j++)
            var += (xr[j] - mean) * (xr[j] - mean);
        var /= (double)cols;
        double se = 0;
        for (int64_t j = 0; j < cols; j++)
            se += exp(xr[j] - mx);
        for (int64_t j = 0; j < (op == OP_SUM ? 1 : cols); j++) {
            double xv = xr[j], ref = 0, got = 0, tol = 0;
            switch (op) {
            case OP_SOFTMAX:
                ref = exp(xv - mx) / se, got = y[r * cols + j], tol = 1e-7 + 1e-4 * fabs(ref);
                break;
            case OP_LAYER_NORM:
                ref = (xv - mean) / sqrt(var + LN_EPS) * w[j] + bias[j], got = y[r * cols + j];
                tol = 1e-4 + 1e-4 * fabs(ref);
                break;
            case OP_GELU_TANH:
                ref = 0.5 * xv * (1.0 + tanh(0.7978845608028654 * (xv + 0.044715 * xv * xv * xv)));
                got = y[r * cols + j], tol = 1e-5 + 1e-4 * fabs(ref);
                break;
            case OP_GELU_ERF:
                ref = 0.5 * xv * (1.0 + erf(xv / sqrt(2.0))), got = y[r * cols + j];
                tol = 1e-5 + 1e-4 * fabs(ref);
                break;
            case OP_SUM:
                ref = s, got = y[r], tol = 1e-4 + 1e-5 * sa;
                break;
            case OP_TRANSPOSE:
                /* yout is [cols, k]: element (j, r) is x[r][j] */
                ref = xv, got = y[j * k + r], tol = 0;
                break;
            }
            double err = fabs(got - ref);
            if (!(err <= tol)) { /* NaN fails too */
                worst = 2;
                *max_err = isfinite(err) ? (err > *max_err ? err : *max_err) : err;
                continue;
            }
            *max_err = err > *max_err ? err : *max_err;
            if (tol > 0 && err / tol > worst)
                worst = err / tol;
        }
    }
done:
    em_release(xin);
    em_release(yout);
    free(x);
    free(y);
    free(w);
    free(bias);
    return worst;
}

/* Verifies then times one op; adds its entry to `ops`. Returns 0, or 1 after printing why. */
static int bench_op(const ctx *c, op_kind op, int repeats, FILE *tab, cJSON *ops)
{
    const char *name = OP_NAMES[op];
    const em_tensor *in = op_input(c, op);
    em_tensor *out = op_run(c, op);
    double max_err = 0, worst = -1;
    if (out && em_device_sync(c->dev) == EM_OK) {
        int64_t rows = em_dim(in, 0), k = rows < SAMPLE_ROWS ? rows : SAMPLE_ROWS;
        int64_t starts[3] = {0, rows / 2 < rows - k ? rows / 2 : rows - k, rows - k};
        for (int i = 0; i < 3; i++) {
            double e = 0, wv = check_rows(c, op, out, starts[i], k, &e);
            if (wv < 0) {
                worst = -1;
                break;
            }
            worst = wv > worst ? wv : worst;
            max_err = e > max_err ? e : max_err;
        }
    }
    em_release(out);
    if (worst < 0) {
        fprintf(stderr, "ember_bench_tensor: %s: %s\n", name, em_last_error());
        fprintf(tab, "%-22s FAILED: %s\n", name, em_last_error());
        return 1;
    }
    if (worst > 1) {
        fprintf(stderr, "ember_bench_tensor: %s: WRONG (max abs error %.3g against the host)\n",
                name, max_err);
        fprintf(tab, "%-22s WRONG (max abs error %.3g), not timed\n", name, max_err);
        cJSON *o = cJSON_AddObjectToObject(ops, name);
        cJSON_AddBoolToObject(o, "verified", 0);
        cJSON_AddNumberToObject(o, "max_abs_err", sig(max_err, 3));
        return 1;
    }
    double *t = malloc((size_t)repeats * sizeof(double));
    if (!t) {
        fprintf(stderr, "ember_bench_tensor: %s: out of host memory\n", name);
        return 1;
    }
    for (int i = 0; i < WARMUP + repeats; i++) {
        em_timer tm;
        if (em_flush() != EM_OK || em_timer_start(&tm, c->dev) != EM_OK) {
            out = NULL;
        } else {
            out = op_run(c, op);
            double s = out ? em_timer_stop(&tm) : -1;
            if (s >= 0 && i >= WARMUP)
                t[i - WARMUP] = s;
            if (s < 0) {
                em_release(out);
                out = NULL;
            }
        }
        if (!out) {
            fprintf(stderr, "ember_bench_tensor: %s: timed run: %s\n", name, em_last_error());
            fprintf(tab, "%-22s FAILED: %s\n", name, em_last_error());
            free(t);
            return 1;
        }
        em_release(out);
    }
    double lo = t[0];
    for (int i = 1; i < repeats; i++)
        lo = t[i] < lo ? t[i] : lo;
    double med = median(t, (size_t)repeats), bytes = op_bytes(c, op), gbps = bytes / med / 1e9;
    free(t);
    char shape[64];
    snprintf(shape, sizeof(shape), "%lld x %lld", (long long)em_dim(in, 0), (long long)em_dim(in, 1));
    fprintf(tab, "%-22s %-14s %10.4f ms %9.2f GB/s  (min %.4f ms, max err %.2g)\n", name, shape,
            med * 1e3, gbps, lo * 1e3, max_err);
    cJSON *o = cJSON_AddObjectToObject(ops, name);
    cJSON *sh = cJSON_AddArrayToObject(o, "shape");
    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)em_dim(in, 0)));
    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)em_dim(in, 1)));
    cJSON_AddNumberToObject(o, "bytes_moved", bytes);
    cJSON_AddNumberToObject(o, "median_ms", sig(med * 1e3, 5));
    cJSON_AddNumberToObject(o, "min_ms", sig(lo * 1e3, 5));
    cJSON_AddNumberToObject(o, "gbps", sig(gbps, 5));
    cJSON_AddBoolToObject(o, "verified", 1);
    cJSON_AddNumberToObject(o, "max_abs_err", sig(max_err, 3));
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: ember_bench_tensor [--device NAME] [--json] [--small | --full] "
                    "[--repeats N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    int json = 0, small = -1, repeats = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--small") == 0)
            small = 1;
        else if (strcmp(argv[i], "--full") == 0)
            small = 0;
        else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
            repeats = atoi(argv[++i]);
        else
            return usage();
    }
    FILE *tab = json ? stderr : stdout;

    char cache[4096];
    if (!getenv("EMBER_CACHE_DIR") || !*getenv("EMBER_CACHE_DIR")) {
        /* keep the user's cache when set; otherwise a private one, removed at the end */
        if (em_temp_dir("ember-bench-tensor", cache, sizeof(cache)) != EM_OK) {
            fprintf(stderr, "ember_bench_tensor: temporary cache directory: %s\n", em_last_error());
            return 1;
        }
        setenv("EMBER_CACHE_DIR", cache, 1);
    } else {
        cache[0] = '\0';
    }
    ctx c;
    memset(&c, 0, sizeof(c));
    c.dev = em_device_open(device);
    if (!c.dev) {
        fprintf(stderr, "ember_bench_tensor: cannot open device %s: %s\n", device, em_last_error());
        if (cache[0])
            em_remove_tree(cache);
        return 1;
    }
    const char *dev_name = em_device_name(c.dev);
    const em_caps *caps = em_device_caps(c.dev);
    int is_cuda = strcmp(caps->target, "cuda") == 0;
    if (small < 0)
        small = !is_cuda;
    if (!repeats)
        repeats = is_cuda ? 50 : 10;
    sizes s = small ? (sizes){2048, 1024, 2048, 768, 3072} : (sizes){16 * 12 * 1024, 1024, 16384, 768, 3072};

    char date[32], rev[64];
    time_t tt = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&tt));
    commit(rev, sizeof(rev));
    fprintf(tab, "ember tensor-op benchmark: %s (%s, target %s), %s, commit %s\n", dev_name,
            caps->device_name, caps->target, date, rev);
    fprintf(tab, "%s shapes, f32, median of %d runs after %d warm-up (timed with %s)\n\n",
            small ? "small" : "GPT-2", repeats, WARMUP,
            strcmp(caps->target, "c") == 0 ? "the host clock" : "device events");

    em_rng rng = em_rng_new(1234);
    c.x_attn = em_randn(c.dev, EM_F32, EM_SHAPE(s.attn_rows, s.attn_cols), &rng);
    c.x_c = c.x_attn ? em_randn(c.dev, EM_F32, EM_SHAPE(s.bt, s.c), &rng) : NULL;
    c.x_c4 = c.x_c ? em_randn(c.dev, EM_F32, EM_SHAPE(s.bt, s.c4), &rng) : NULL;
    c.w = c.x_c4 ? em_randn(c.dev, EM_F32, EM_SHAPE(s.c), &rng) : NULL;
    c.b = c.w ? em_randn(c.dev, EM_F32, EM_SHAPE(s.c), &rng) : NULL;
    int failed = 0;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "tensor");
    cJSON_AddStringToObject(root, "impl", "ember");
    cJSON_AddStringToObject(root, "date", date);
    cJSON_AddStringToObject(root, "commit", rev);
    cJSON_AddStringToObject(root, "device", dev_name);
    cJSON_AddStringToObject(root, "device_name", caps->device_name);
    cJSON_AddStringToObject(root, "target", caps->target);
    cJSON_AddBoolToObject(root, "small", small);
    cJSON_AddNumberToObject(root, "repeats", repeats);
    cJSON *ops = cJSON_AddObjectToObject(root, "ops");
    if (!c.b) {
        fprintf(stderr, "ember_bench_tensor: creating the inputs: %s\n", em_last_error());
        failed = 1;
    } else {
        for (int op = OP_SOFTMAX; op <= OP_TRANSPOSE; op++)
            failed |= bench_op(&c, (op_kind)op, repeats, tab, ops);
    }
    cJSON_AddBoolToObject(root, "ok", !failed);
    if (json) {
        char *line = cJSON_PrintUnformatted(root);
        if (line) {
            printf("%s\n", line);
            free(line);
        } else {
            fprintf(stderr, "ember_bench_tensor: could not format the JSON\n");
            failed = 1;
        }
    }
    cJSON_Delete(root);
    em_release(c.x_attn);
    em_release(c.x_c);
    em_release(c.x_c4);
    em_release(c.w);
    em_release(c.b);
    em_device_close(c.dev);
    if (cache[0])
        em_remove_tree(cache);
    return failed;
}
