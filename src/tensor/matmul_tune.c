/* matmul_tune.c — picks the configuration a matmul runs with. $EMBER_MATMUL_CONFIG (a config in
 * mm_config_format's text, e.g. "simt 64x64x8 4x4 s1") forces one, for tests and benchmarks;
 * EMBER_AUTOTUNE=off takes the heuristic; otherwise the autotune cache (runtime/autotune.c) is
 * asked for the winner of this (device, dtype, layout, shape bucket) and, on a miss, every
 * candidate runs on the problem itself (a first launch compiles it; then it is timed over enough
 * repetitions to fill a few milliseconds) and the fastest is stored. Each candidate's result is
 * checked against the heuristic's on a sample of whole rows spread over it (first tiles, middle,
 * end): one that differs beyond rounding is not picked and is logged as a warning, so a kernel
 * form with a device-specific bug cannot win on speed. Problems too small to be
 * worth a benchmark (under 2^24 multiply-adds on GPUs, 2^27 on the CPU; $EMBER_AUTOTUNE_MIN_WORK
 * overrides) take the heuristic. With EMBER_LOG=debug the kernel and configuration chosen are
 * logged once per device and shape bucket. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "tensor/internal.h" /* the result's buffer, host dtype conversions */
#include "tensor/matmul_internal.h"

/* Runs c on p; with `zero` (the fault EMBER_AUTOTUNE_FAULT=zero injects, for tests) it writes
 * zeros instead: a wrong kernel faster than any right one. */
static em_status run_config(const mm_problem *p, const mm_config *c, bool zero)
{
    if (!zero) return mm_launch(p, c);
    em_status st = tn_realize(p->out);
    return st == EM_OK ? em_buffer_fill_zero(p->out->st->buf) : st;
}

/* Seconds per run of c on p, or a negative value when it fails to run. */
static double time_config(const mm_problem *p, const mm_config *c, bool zero)
{
    if (run_config(p, c, zero) != EM_OK || em_device_sync(p->dev) != EM_OK) return -1;
    em_timer t;
    int reps = 1;
    double best = 1e30;
    for (int round = 0; round < 4; round++) {
        if (em_timer_start(&t, p->dev) != EM_OK) return -1;
        for (int i = 0; i < reps; i++)
            if (run_config(p, c, zero) != EM_OK) return -1;
        double s = em_timer_stop(&t);
        if (s < 0) return -1;
        if (s / reps < best) best = s / reps;
        if (s > 0.05) break; /* long enough */
        if (s < 0.002) reps = reps * 4 > 64 ? 64 : reps * 4;
    }
    return best;
}

/* ---- the result check ---- */

enum { SAMPLE_ROWS = 12 };

/* Rows of p's result (batch entries flattened: row r is row r % M of entry r / M) sampled:
 * up to SAMPLE_ROWS, the edges of the first tiles, the middle and the end. */
typedef struct mm_sample {
    int64_t rows[SAMPLE_ROWS];
    int n;
    double *want; /* the heuristic's values, n rows of N */
    double *got;  /* a candidate's */
    double rms;   /* the root mean square of want's finite values (sample_scale) */
} mm_sample;

static bool sample_new(const mm_problem *p, mm_sample *s)
{
    int64_t total = p->M * p->batch, mid = total / 2;
    const int64_t pick[SAMPLE_ROWS] = {0,         1,         63,        64,
                                       127,       128,       257,       mid,
                                       mid + 129, total - 129, total - 2, total - 1};
    s->n = 0;
    for (int i = 0; i < SAMPLE_ROWS; i++) {
        bool dup = pick[i] < 0 || pick[i] >= total;
        for (int j = 0; j < s->n && !dup; j++) dup = s->rows[j] == pick[i];
        if (!dup) s->rows[s->n++] = pick[i];
    }
    size_t n = (size_t)s->n * (size_t)p->N;
    s->want = malloc(n * sizeof *s->want);
    s->got = malloc(n * sizeof *s->got);
    return s->n > 0 && s->want && s->got;
}

static void sample_free(mm_sample *s)
{
    free(s->want);
    free(s->got);
}

/* The sampled rows of p's result now, as doubles into dst. */
static bool sample_read(const mm_problem *p, const mm_sample *s, double *dst)
{
    const em_tensor *out = p->out;
    size_t es = em_scalar_size(p->dt), row = (size_t)p->N * es;
    unsigned char *tmp = malloc(row);
    bool ok = tmp && tn_realize(out) == EM_OK && out->st && out->st->buf;
    for (int i = 0; ok && i < s->n; i++) {
        size_t off = ((size_t)out->offset + (size_t)s->rows[i] * (size_t)p->N) * es;
        ok = em_buffer_read(out->st->buf, off, tmp, row) == EM_OK;
        for (int64_t j = 0; ok && j < p->N; j++)
            dst[(size_t)i * (size_t)p->N + (size_t)j] = tn_host_get(p->dt, tmp, (size_t)j);
    }
    free(tmp);
    return ok;
}

/* Sets s->rms from want (once, after the reference is read). */
static void sample_scale(const mm_problem *p, mm_sample *s)
{
    size_t n = (size_t)s->n * (size_t)p->N, fin = 0;
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(s->want[i])) ss += s->want[i] * s->want[i], fin++;
    s->rms = fin ? sqrt(ss / (double)fin) : 0;
}

/* Whether got matches want up to rounding: integers exactly; floats within 1 % of the value
 * plus the sample's root mean square (accumulation order, tf32, a 2-byte result's last bit),
 * NaN where want has NaN. Else the first difference goes to *at. */
static bool sample_same(const mm_problem *p, const mm_sample *s, size_t *at)
{
    size_t n = (size_t)s->n * (size_t)p->N;
    bool fl = em_scalar_is_float(p->dt);
    double rms = s->rms;
    for (size_t i = 0; i < n; i++) {
        double w = s->want[i], g = s->got[i];
        bool ok = !fl                ? w == g
                  : isnan(w)         ? isnan(g)
                  : !isfinite(w)     ? w == g
                                     : isfinite(g) && fabs(g - w) <= 0.01 * (fabs(w) + rms);
        if (!ok) {
            *at = i;
            return false;
        }
    }
    return true;
}

/* An idle GPU runs at a fraction of its clock for a while (an H200's multiprocessors idle at 345
 * MHz), so the first candidates timed after a pause read slow: unless the device was kept busy by
 * a warm-up in the last second, about 0.1 s of c runs first. */
static double g_busy_until; /* when the last warm-up or autotune ended (any device: a hint) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void warm_up(const mm_problem *p, const mm_config *c)
{
    double now = now_s();
    if (now - g_busy_until > 1.0) {
        for (double t0 = now; now_s() - t0 < 0.1;)
            if (mm_launch(p, c) != EM_OK || em_device_sync(p->dev) != EM_OK) break;
        em_clear_error();
    }
}

static bool forced(const mm_problem *p, mm_config *c)
{
    const char *f = getenv("EMBER_MATMUL_CONFIG");
    if (!f || !*f || !mm_config_parse(f, c)) return false;
    if (mm_config_valid(p, c)) return true;
    /* the forced split may not fit this shape: keep the rest */
    c->split = 1;
    return mm_config_valid(p, c);
}

/* The buckets already logged (a registry guarded for threads; once full, nothing more is
 * logged). */
static pthread_mutex_t g_logged_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_logged[512];
static size_t g_nlogged;

/* Logs at debug level the kernel and configuration c chosen (`how`) for p's bucket, once. */
static void log_choice(const mm_problem *p, const mm_config *c, const char *how)
{
    if (!em_log_enabled(EM_LOG_DEBUG)) return;
    char key[160], val[64], plan[128] = "";
    mm_tune_key(p, key, sizeof key);
    mm_config_format(c, val, sizeof val);
    const char *dev = em_device_name(p->dev);
    uint64_t h = em_hash64(key, strlen(key), em_hash64(dev, strlen(dev), 0)) ^
                 em_hash64(val, strlen(val), 1);
    bool fresh = true;
    pthread_mutex_lock(&g_logged_lock);
    for (size_t i = 0; i < g_nlogged && fresh; i++) fresh = g_logged[i] != h;
    if (fresh && g_nlogged < sizeof g_logged / sizeof g_logged[0])
        g_logged[g_nlogged++] = h;
    else
        fresh = false;
    pthread_mutex_unlock(&g_logged_lock);
    if (!fresh) return;
    mm_mma_plan q;
    if (c->kind == MM_MMA && mm_mma_plan_of(p, c, &q))
        snprintf(plan, sizeof plan, " [%dx%d fragments a plane, %d stages, a %s %s, b %s %s]", q.fm,
                 q.fn, q.stages, q.at ? "k-major" : "m-major",
                 q.va > 1 ? "16-byte async copies" : "element-wise", q.bt ? "n-major" : "k-major",
                 q.vb > 1 ? "16-byte async copies" : "element-wise");
    mm_wgmma_plan wq;
    if (c->kind == MM_WGMMA && mm_wgmma_plan_of(p, c, &wq))
        snprintf(plan, sizeof plan, " [%d warpgroups of 64x%d, %d stages, a %s, b %s]", c->tm,
                 c->bn, wq.stages, wq.at ? "MN-major" : "K-major", wq.bt ? "K-major" : "MN-major");
    mm_skinny_plan sq;
    if (c->kind == MM_SKINNY && mm_skinny_plan_of(p, c, &sq))
        snprintf(plan, sizeof plan, " [%s b in lines of %d, %lld rows%s, %d columns a cube]",
                 sq.bt ? "transposed" : "row-major", sq.v, (long long)sq.rows,
                 sq.fold ? " (batches folded)" : "", sq.nout);
    static const char *const kernels[] = {"tensor_matmul", "matmul_simt",  "matmul_mma",
                                          "matmul_cpu",    "matmul_wgmma", "matmul_skinny"};
    const char *kernel = c->kind >= 0 && c->kind < 6 ? kernels[c->kind] : "?";
    em_log(EM_LOG_DEBUG, "matmul %s on %s: %s \"%s\" (%s)%s", key, dev, kernel, val, how, plan);
}

static mm_config choose(const mm_problem *p, const char **how);

/* This thread's last choice (mm_last_config formats it: not on every launch). */
static _Thread_local mm_config g_last;
static _Thread_local bool g_chose;

mm_config mm_choose(const mm_problem *p)
{
    const char *how = "heuristic";
    mm_config c = choose(p, &how);
    log_choice(p, &c, how);
    g_last = c, g_chose = true;
    return c;
}

const char *mm_last_config(void)
{
    static _Thread_local char text[64];
    text[0] = 0;
    if (g_chose) mm_config_format(&g_last, text, sizeof text);
    return text;
}

static mm_config choose(const mm_problem *p, const char **how)
{
    mm_config c;
    *how = "forced by EMBER_MATMUL_CONFIG";
    if (forced(p, &c)) return c;
    *how = "heuristic";
    em_autotune_mode mode = em_autotune_get_mode();
    bool cpu = p->caps && !strcmp(p->caps->target, "c");
    double work = (double)p->M * (double)p->N * (double)p->K * (double)p->batch;
    const char *mw = getenv("EMBER_AUTOTUNE_MIN_WORK");
    double min_work = mw && *mw ? atof(mw) : cpu ? 134217728.0 : 16777216.0;
    if (mode == EM_AUTOTUNE_OFF || work < min_work) return mm_heuristic(p);
    char key[160], val[64];
    mm_tune_key(p, key, sizeof key);
    *how = "autotune cache";
    if (em_autotune_lookup(p->dev, "matmul", key, val, sizeof val) && mm_config_parse(val, &c) &&
        mm_config_valid(p, &c))
        return c;
    /* timing candidates needs the device to run them: not while a graph records (warm up first) */
    *how = "heuristic (recording a graph)";
    if (em_device_recording(p->dev)) return mm_heuristic(p);
    *how = "autotuned now";
    mm_config cand[96]; /* mm_candidates' most: 64, and stream-K's (opt-in) past them */
    int n = mm_candidates(p, mode == EM_AUTOTUNE_FULL, cand, 96);
    mm_config best = mm_heuristic(p);
    if (!cpu) warm_up(p, &best);
    /* the heuristic's result, the reference each candidate's is checked against */
    mm_sample smp;
    bool check = sample_new(p, &smp) && mm_launch(p, &best) == EM_OK &&
                 sample_read(p, &smp, smp.want);
    if (check) sample_scale(p, &smp);
    if (!check) em_clear_error();
    const char *fault = getenv("EMBER_AUTOTUNE_FAULT");
    bool zeros = fault && !strcmp(fault, "zero"); /* every candidate but the heuristic */
    const mm_config heur = best;
    double best_s = 1e30;
    for (int i = 0; i < n; i++) {
        double s = time_config(p, &cand[i], zeros && memcmp(&cand[i], &heur, sizeof heur) != 0);
        if (s < 0) {
            em_clear_error(); /* a candidate that does not run here is skipped */
            continue;
        }
        if (check && !sample_read(p, &smp, smp.got)) {
            em_clear_error(); /* as one that does not run */
            continue;
        }
        size_t at = 0;
        if (check && !sample_same(p, &smp, &at)) {
            char text[64];
            mm_config_format(&cand[i], text, sizeof text);
            size_t N = (size_t)p->N;
            em_log(EM_LOG_WARN,
                   "matmul %lldx%lldx%lld (batch %lld) on %s: candidate \"%s\" left out: row %lld, "
                   "column %zu is %g where the heuristic's result has %g",
                   (long long)p->M, (long long)p->N, (long long)p->K, (long long)p->batch,
                   em_device_name(p->dev), text, (long long)smp.rows[at / N], at % N,
                   smp.got[at], smp.want[at]);
            em_clear_error();
            continue;
        }
        if (s < best_s) best_s = s, best = cand[i];
    }
    sample_free(&smp);
    if (!cpu) g_busy_until = now_s();
    mm_config_format(&best, val, sizeof val);
    if (best_s < 1e30 && em_autotune_store(p->dev, "matmul", key, val) != EM_OK) em_clear_error();
    if (getenv("EMBER_AUTOTUNE_VERBOSE"))
        fprintf(stderr, "ember: autotune %s on %s: %s (%.3f ms)\n", key, em_device_name(p->dev),
                val, best_s * 1e3);
    return best;
}
