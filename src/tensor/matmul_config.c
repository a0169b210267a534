/* matmul_config.c — matmul kernel configurations: which are valid on a device, the heuristic
 * default (EMBER_AUTOTUNE=off), the candidate lists that autotuning benchmarks, their text form
 * (what the autotune cache stores) and the autotune key (dtype, layout, shape bucket).
 *
 * Heuristics: on devices with matrix units (caps.matrix: CUDA) f16/bf16 — and f32 when tf32 is
 * allowed — take the tensor-core kernel with 128 x 128 tiles (64 x 128 when the grid would not
 * fill the device); everything else takes the SIMT kernel, 64 x 64 tiles of 4 x 4 per unit on
 * GPUs (32 x 32 for small outputs). On the CPU (plane size 1, one cube per pool thread, the
 * units of a cube looped over inside it) bigger per-unit blocks and fewer units per cube win:
 * 32 x 64 tiles of 4 x 8 per unit (see docs/matmul.md for the measurements). Split-K is chosen
 * when the output tiles cannot occupy the device (M * N small) and K is long. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/matmul_internal.h"

static bool is_cpu(const mm_problem *p)
{
    return p->caps && !strcmp(p->caps->target, "c");
}

static bool mma_dtype_ok(const mm_problem *p)
{
    /* CUDA only for now: the fragment shapes are WMMA's (other targets' cooperative matrices
     * may offer other shapes; there the SIMT kernel runs) */
    if (!p->caps || !p->caps->matrix || strcmp(p->caps->target, "cuda") != 0) return false;
    if (p->dt == EM_F16 || p->dt == EM_BF16) return true;
    return p->dt == EM_F32 && p->tf32;
}

bool mm_config_valid(const mm_problem *p, const mm_config *c)
{
    const em_caps *caps = p->caps;
    int split = c->split < 1 ? 1 : c->split;
    if (p->batch * split > 65535 || split > 64) return false;
    if (split > 1 && p->K < (int64_t)split * c->bk) return false;
    if (c->kind == MM_SIMPLE) return split == 1 && !p->bias && !p->res && !p->act;
    if (c->bk <= 0 || c->bm <= 0 || c->bn <= 0 || c->tm <= 0 || c->tn <= 0) return false;
    size_t es = em_scalar_size(p->dt), cs = em_scalar_size(p->ct);
    if (c->kind == MM_MMA) {
        if (!mma_dtype_ok(p) && !getenv("EMBER_MATMUL_CONFIG")) return false;
        if (p->dt != EM_F16 && p->dt != EM_BF16 && p->dt != EM_F32) return false;
        if (c->bm != 32 * c->tm || c->bn != 64 * c->tn || c->bk % 16) return false;
        uint32_t plane = caps && caps->plane_dim ? caps->plane_dim : 1;
        uint32_t units = (uint32_t)(c->tm * c->tn) * plane;
        if (caps && units > caps->max_cube_units) return false;
        size_t pad = 16 / es;
        size_t smem = (size_t)c->bm * (c->bk + pad) * es + (size_t)c->bk * (c->bn + pad) * es +
                      (size_t)c->tm * c->tn * 256 * 4;
        return !caps || smem <= caps->max_shared;
    }
    if (c->bm % c->tm || c->bn % c->tn) return false;
    uint32_t units = (uint32_t)((c->bm / c->tm) * (c->bn / c->tn));
    if (caps && (units > caps->max_cube_units || units > caps->max_cube_dim[0])) return false;
    size_t smem = (size_t)c->bk * (c->bm + c->bn) * cs;
    (void)es;
    return !caps || smem <= caps->max_shared;
}

static mm_config simt(int bm, int bn, int bk, int tm, int tn, int split)
{
    return (mm_config){MM_SIMT, bm, bn, bk, tm, tn, split};
}

static mm_config mma(int wm, int wn, int bk, int split)
{
    return (mm_config){MM_MMA, 32 * wm, 64 * wn, bk, wm, wn, split};
}

/* The split-K factor that lets tiles_mn output tiles (per batch) fill the device. */
static int pick_split(const mm_problem *p, int64_t tiles, int bk)
{
    int64_t cus = p->caps && p->caps->compute_units ? p->caps->compute_units : 1;
    int64_t want = is_cpu(p) ? cus : 2 * cus;
    int64_t cubes = tiles * p->batch;
    if (cubes >= want || p->K < 4 * (int64_t)bk * 4) return 1;
    int64_t s = (want + cubes - 1) / cubes;
    int64_t kmax = p->K / (4 * (int64_t)bk); /* keep at least 4 K steps per split */
    if (s > kmax) s = kmax;
    if (s > 16) s = 16;
    return s < 2 ? 1 : (int)s;
}

mm_config mm_heuristic(const mm_problem *p)
{
    mm_config c;
    int64_t big = p->M * p->N;
    if (mma_dtype_ok(p) && p->K > 0) {
        int64_t tiles = ((p->M + 127) / 128) * ((p->N + 127) / 128) * p->batch;
        int64_t cus = p->caps->compute_units ? p->caps->compute_units : 1;
        c = tiles >= cus ? mma(4, 2, 32, 1) : mma(2, 2, 32, 1);
    } else if (is_cpu(p)) {
        c = simt(32, 64, 16, 32, 64, 1);
        if (p->M <= 8) c = simt(8, 64, 16, 8, 64, 1);
    } else if (big >= 256 * 256) {
        c = simt(64, 64, 8, 4, 4, 1);
    } else {
        c = simt(32, 32, 8, 2, 2, 1);
    }
    if (p->K > 0) {
        int64_t tiles = ((p->M + c.bm - 1) / c.bm) * ((p->N + c.bn - 1) / c.bn);
        c.split = pick_split(p, tiles, c.bk);
    }
    if (!mm_config_valid(p, &c)) c = simt(16, 16, 8, 1, 1, 1);
    return c;
}

int mm_candidates(const mm_problem *p, bool full, mm_config *out, int max)
{
    mm_config all[48];
    int n = 0;
    all[n++] = mm_heuristic(p);
    if (mma_dtype_ok(p)) {
        static const int wt[][2] = {{4, 2}, {2, 2}, {2, 4}, {4, 4}, {2, 1}, {1, 2}};
        int nw = full ? 6 : 3;
        for (int i = 0; i < nw; i++) {
            all[n++] = mma(wt[i][0], wt[i][1], 32, 1);
            if (full) all[n++] = mma(wt[i][0], wt[i][1], 64, 1);
        }
    } else if (is_cpu(p)) {
        all[n++] = simt(32, 64, 16, 32, 64, 1);
        all[n++] = simt(64, 64, 16, 64, 64, 1);
        all[n++] = simt(16, 128, 32, 16, 128, 1);
        if (full) all[n++] = simt(64, 64, 32, 16, 64, 1), all[n++] = simt(32, 32, 16, 32, 32, 1);
    } else {
        all[n++] = simt(64, 64, 8, 4, 4, 1);
        all[n++] = simt(128, 128, 8, 8, 8, 1);
        all[n++] = simt(128, 64, 8, 8, 4, 1);
        all[n++] = simt(32, 32, 8, 2, 2, 1);
        if (full) {
            all[n++] = simt(64, 64, 16, 4, 4, 1);
            all[n++] = simt(64, 128, 8, 4, 8, 1);
            all[n++] = simt(32, 64, 8, 2, 4, 1);
        }
    }
    /* split-K variants of every candidate for skinny shapes */
    int base = n;
    for (int i = 0; i < base && n + 2 <= 48; i++) {
        if (all[i].split > 1) continue;
        int64_t tiles = ((p->M + all[i].bm - 1) / all[i].bm) * ((p->N + all[i].bn - 1) / all[i].bn);
        int s = pick_split(p, tiles, all[i].bk);
        if (s > 1) {
            all[n] = all[i], all[n++].split = s;
            if (full && s >= 4) all[n] = all[i], all[n++].split = s / 2;
        }
    }
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        if (!mm_config_valid(p, &all[i])) continue;
        bool dup = false;
        for (int j = 0; j < k && !dup; j++) dup = !memcmp(&out[j], &all[i], sizeof all[i]);
        if (!dup) out[k++] = all[i];
    }
    return k;
}

void mm_config_format(const mm_config *c, char *buf, size_t size)
{
    static const char *const names[] = {"simple", "simt", "mma"};
    snprintf(buf, size, "%s %dx%dx%d %dx%d s%d", names[c->kind < 3 && c->kind >= 0 ? c->kind : 0],
             c->bm, c->bn, c->bk, c->tm, c->tn, c->split);
}

bool mm_config_parse(const char *text, mm_config *c)
{
    char kind[16];
    mm_config r;
    memset(&r, 0, sizeof r);
    if (!text || sscanf(text, "%15s %dx%dx%d %dx%d s%d", kind, &r.bm, &r.bn, &r.bk, &r.tm, &r.tn,
                        &r.split) != 7)
        return false;
    if (!strcmp(kind, "simple"))
        r.kind = MM_SIMPLE;
    else if (!strcmp(kind, "simt"))
        r.kind = MM_SIMT;
    else if (!strcmp(kind, "mma"))
        r.kind = MM_MMA;
    else
        return false;
    *c = r;
    return true;
}

/* Sizes to buckets: powers of two (a size goes to the next one up), so nearby shapes share. */
static long long bucket(int64_t v)
{
    long long b = 1;
    while (b < v && b < (1LL << 40)) b <<= 1;
    return b;
}

void mm_tune_key(const mm_problem *p, char *buf, size_t size)
{
    int R = p->R;
    char la = p->ast[R - 1] == 1 ? 'n' : p->ast[R - 2] == 1 ? 't' : 's';
    char lb = p->bst[R - 1] == 1 ? 'n' : p->bst[R - 2] == 1 ? 't' : 's';
    snprintf(buf, size, "matmul-v1 %s%s %c%c m%lld n%lld k%lld b%lld e%d%d%d",
             em_scalar_name(p->dt), p->tf32 && p->dt == EM_F32 ? "+tf32" : "", la, lb, bucket(p->M),
             bucket(p->N), bucket(p->K), bucket(p->batch), p->bias != NULL, p->act, p->res != NULL);
}
