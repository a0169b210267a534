/* matmul_tune.c — picks the configuration a matmul runs with. $EMBER_MATMUL_CONFIG (a config in
 * mm_config_format's text, e.g. "simt 64x64x8 4x4 s1") forces one, for tests and benchmarks;
 * EMBER_AUTOTUNE=off takes the heuristic; otherwise the autotune cache (runtime/autotune.c) is
 * asked for the winner of this (device, dtype, layout, shape bucket) and, on a miss, every
 * candidate runs on the problem itself (a first launch compiles it; then it is timed over enough
 * repetitions to fill a few milliseconds) and the fastest is stored. Problems too small to be
 * worth a benchmark (under 2^24 multiply-adds on GPUs, 2^27 on the CPU; $EMBER_AUTOTUNE_MIN_WORK
 * overrides) take the heuristic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/matmul_internal.h"

/* Seconds per run of c on p, or a negative value when it fails to run. */
static double time_config(const mm_problem *p, const mm_config *c)
{
    if (mm_launch(p, c) != EM_OK || em_device_sync(p->dev) != EM_OK) return -1;
    em_timer t;
    int reps = 1;
    double best = 1e30;
    for (int round = 0; round < 4; round++) {
        if (em_timer_start(&t, p->dev) != EM_OK) return -1;
        for (int i = 0; i < reps; i++)
            if (mm_launch(p, c) != EM_OK) return -1;
        double s = em_timer_stop(&t);
        if (s < 0) return -1;
        if (s / reps < best) best = s / reps;
        if (s > 0.05) break; /* long enough */
        if (s < 0.002) reps = reps * 4 > 64 ? 64 : reps * 4;
    }
    return best;
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

mm_config mm_choose(const mm_problem *p)
{
    mm_config c;
    if (forced(p, &c)) return c;
    em_autotune_mode mode = em_autotune_get_mode();
    bool cpu = p->caps && !strcmp(p->caps->target, "c");
    double work = (double)p->M * (double)p->N * (double)p->K * (double)p->batch;
    const char *mw = getenv("EMBER_AUTOTUNE_MIN_WORK");
    double min_work = mw && *mw ? atof(mw) : cpu ? 134217728.0 : 16777216.0;
    if (mode == EM_AUTOTUNE_OFF || work < min_work) return mm_heuristic(p);
    char key[160], val[64];
    mm_tune_key(p, key, sizeof key);
    if (em_autotune_lookup(p->dev, "matmul", key, val, sizeof val) && mm_config_parse(val, &c) &&
        mm_config_valid(p, &c))
        return c;
    mm_config cand[32];
    int n = mm_candidates(p, mode == EM_AUTOTUNE_FULL, cand, 32);
    mm_config best = mm_heuristic(p);
    double best_s = 1e30;
    for (int i = 0; i < n; i++) {
        double s = time_config(p, &cand[i]);
        if (s < 0) {
            em_clear_error(); /* a candidate that does not run here is skipped */
            continue;
        }
        if (s < best_s) best_s = s, best = cand[i];
    }
    mm_config_format(&best, val, sizeof val);
    if (best_s < 1e30 && em_autotune_store(p->dev, "matmul", key, val) != EM_OK) em_clear_error();
    if (getenv("EMBER_AUTOTUNE_VERBOSE"))
        fprintf(stderr, "ember: autotune %s on %s: %s (%.3f ms)\n", key, em_device_name(p->dev),
                val, best_s * 1e3);
    return best;
}
