/* matmul_config.c — matmul kernel configurations: which are valid on a device, the heuristic
 * default (EMBER_AUTOTUNE=off), the candidate lists that autotuning benchmarks, their text form
 * (what the autotune cache stores) and the autotune key (dtype, layout, shape bucket).
 *
 * Heuristics: on devices with matrix units that run the kernel's fragments (CUDA's WMMA, or a
 * Vulkan device listing the combination in caps.matrix_shapes) f16/bf16 — and f32 when tf32 is
 * allowed — take the tensor-core kernel with 128 x 128 tiles (64 x 128 when the grid would not
 * fill the device); other GPUs take the SIMT kernel, 64 x 64 tiles of 4 x 4 per unit (32 x 32
 * for small outputs). The CPU takes its own kernel (matmul_cpu.ek: packed panels, one unit per
 * cube, an MR x NR micro-kernel on lines) with the micro-kernel sized for the host's vector
 * registers (see docs/matmul.md for the measurements). Split-K is chosen when the output tiles
 * cannot occupy the device (M * N small) and K is long. Before all of these, at most 16 rows
 * (once batches that share b fold into rows: decoding) take the skinny kernel on every device
 * (matmul_skinny.ek: b read once in 16-byte lines, partial sums in registers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/matmul_internal.h"

static bool is_cpu(const mm_problem *p)
{
    return p->caps && !strcmp(p->caps->target, "c");
}

/* Whether the caps list the combination of the mma kernel's fragments: 16 x 16 x fk with a and b
 * of dtype t, accumulating in f32. */
static bool mma_shape_listed(const em_caps *c, em_scalar t, unsigned fk)
{
    for (uint32_t i = 0; i < c->matrix_shape_count && i < EM_CAPS_MATRIX_SHAPES; i++) {
        const em_matrix_shape *x = &c->matrix_shapes[i];
        if (x->m == 16 && x->n == 16 && x->k == fk && x->a == t && x->b == t && x->c == EM_F32 &&
            x->d == EM_F32)
            return true;
    }
    return false;
}

/* Whether the device's matrix units run the mma kernel for p's dtype: where the caps list their
 * combinations (Vulkan's cooperative matrices), only a listed one (so no tf32 there, and bf16
 * only where listed); where they list none and name no API (CUDA), WMMA's f16, bf16 and tf32. */
static bool mma_dtype_ok(const mm_problem *p)
{
    const em_caps *c = p->caps;
    if (!c || !c->matrix) return false;
    bool f32 = p->dt == EM_F32 && p->tf32;
    if (p->dt != EM_F16 && p->dt != EM_BF16 && !f32) return false;
    if (c->matrix_shape_count || c->matrix_api[0]) return mma_shape_listed(c, p->dt, f32 ? 8 : 16);
    return !strcmp(c->target, "cuda");
}

/* Whether operand t (strides st in the kernel's rank-R geometry, contiguous dim `fast` of length
 * len) can be copied in aligned chunks of v elements: unit stride along `fast`, len, every other
 * stride and the offset multiples of v (device buffers start aligned). */
static bool mma_chunks_ok(const em_tensor *t, int R, const int64_t *st, int fast, int64_t len,
                          int v)
{
    if (st[fast] != 1 || len % v || t->offset % v) return false;
    for (int d = 0; d < R; d++)
        if (d != fast && st[d] % v) return false;
    return true;
}

bool mm_mma_plan_of(const mm_problem *p, const mm_config *c, mm_mma_plan *out)
{
    mm_mma_plan q;
    memset(&q, 0, sizeof q);
    if (c->tm <= 0 || c->tn <= 0 || c->bk <= 0 || c->bk % 16 || c->bm % (16 * c->tm) ||
        c->bn % (16 * c->tn))
        return false;
    q.fm = c->bm / (16 * c->tm), q.fn = c->bn / (16 * c->tn);
    if (q.fm < 1 || q.fm > 4 || q.fn < 1 || q.fn > 4) return false;
    size_t es = em_scalar_size(p->dt);
    int R = p->R, v = (int)(16 / es);
    const int64_t *as = p->ast, *bs = p->bst;
    q.at = as[R - 1] != 1 && as[R - 2] == 1; /* a transposed: its M is contiguous */
    q.bt = bs[R - 1] != 1 && bs[R - 2] == 1; /* b transposed: its K is contiguous */
    q.va = mma_chunks_ok(p->a, R, as, q.at ? R - 2 : R - 1, q.at ? p->M : p->K, v) ? v : 1;
    q.vb = mma_chunks_ok(p->b, R, bs, q.bt ? R - 2 : R - 1, q.bt ? p->K : p->N, v) ? v : 1;
    /* a ring of buffers holding about 160 of K (2 to 4 stages), within half the device's shared
     * memory so that two cubes share a multiprocessor */
    size_t lda = (size_t)(q.at ? c->bm : c->bk) + (size_t)v;
    size_t ldb = (size_t)(q.bt ? c->bk : c->bn) + (size_t)v;
    size_t stage =
        ((size_t)(q.at ? c->bk : c->bm) * lda + (size_t)(q.bt ? c->bn : c->bk) * ldb) * es;
    size_t sc = (size_t)c->tm * c->tn * 256 * 4;
    size_t budget = p->caps && p->caps->max_shared ? p->caps->max_shared / 2 : (size_t)-1;
    int stages = 160 / c->bk;
    stages = stages < 2 ? 2 : stages > 4 ? 4 : stages;
    while (stages > 2 && stages * stage + sc > budget) stages--;
    q.stages = stages;
    q.smem = (size_t)stages * stage + sc;
    *out = q;
    return true;
}

bool mm_wgmma_native(const em_caps *caps)
{
    return caps && !strcmp(caps->target, "cuda") && !strcmp(caps->arch, "sm_90a");
}

/* Whether p's device runs the wgmma kernel natively (mm_wgmma_native). */
static bool wgmma_device(const mm_problem *p)
{
    return mm_wgmma_native(p->caps);
}

/* The TMA map of an operand with shape sh and strides st (rank R) whose contiguous dim is `fast`
 * (R - 1 or R - 2): dims and strides innermost first (contiguous dim, the other, the flattened
 * batch); *z receives whether the batch coordinate is the batch index (false: broadcast, one
 * batch entry). Strides of dims of size 1 (any value in the view) become the span below them,
 * as the hardware wants 16-byte multiples there. false when the batch dims do not flatten to
 * one stride or rows overlap. */
static bool tma_map_of(const int64_t *sh, const int64_t *st, int R, int fast, int64_t *dim,
                       int64_t *str, bool *z)
{
    int other = fast == R - 1 ? R - 2 : R - 1;
    dim[0] = sh[fast], str[0] = 1;
    dim[1] = sh[other], str[1] = st[other];
    int64_t bs = -1, span = 1;
    bool bcast = true;
    for (int d = R - 3; d >= 0; d--) {
        if (sh[d] == 1) continue;
        if (st[d] != 0) bcast = false;
        if (bs < 0)
            bs = st[d], span = sh[d];
        else if (st[d] != bs * span)
            return false;
        else
            span *= sh[d];
    }
    *z = !bcast;
    dim[2] = bcast ? 1 : span, str[2] = bcast || bs < 0 ? 0 : bs;
    if (!bcast && bs == 0) return false;
    /* size-1 dims: the span below, rounded to 8 elements (16 bytes) */
    if (dim[1] == 1) str[1] = (dim[0] + 7) / 8 * 8;
    if (dim[2] == 1) str[2] = (dim[1] * str[1] + 7) / 8 * 8;
    return str[1] >= dim[0] && (dim[2] == 1 || str[2] >= dim[1] * str[1]);
}

bool mm_res_rows16(const mm_problem *p)
{
    /* the epilogue's residual or GELU-tanh's backward's input (ACT 5), not erf's (ACT 4) */
    const em_tensor *r = p->res;
    if (!r || p->act == MM_ACT_GELU_GRAD || em_scalar_size(p->dt) != 2 || p->N % 8 != 0 ||
        p->rst[p->R - 1] != 1 || r->offset % 8 != 0)
        return false;
    for (int d = 0; d < p->R - 1; d++)
        if (p->rst[d] % 8 != 0) return false;
    return true;
}

bool mm_wgmma_plan_of(const mm_problem *p, const mm_config *c, mm_wgmma_plan *out)
{
    if (p->dt != EM_F16 && p->dt != EM_BF16) return false;
    /* ping-pong (lanes 6): two consumers, each a tile of bm (64 or 128) x bn of its own, at most
     * 192 f32 accumulators a unit (64 x 256, 128 x 128 or 128 x 192: ptxas fits 192 into the
     * consumers' 232 registers without spills, tests/kernel/test_tma.c) */
    bool ping = c->lanes == 6 || c->lanes == 7; /* 7: with the epilogue from the registers */
    if (ping && (c->tm != 2 || (c->bm != 64 && c->bm != 128) || c->bm * c->bn > 128 * 192))
        return false;
    /* the cooperative 256-row tile (lanes 5, tm 2, bm 256): each consumer 128 x bn as two
     * accumulator sets, bn f32 accumulators a unit (bn 64 to 192: ptxas fits 192 into the
     * consumers' 232 registers without spills) */
    bool coop2 = (c->lanes == 5 || c->lanes == 8) && c->tm == 2 && c->bm == 256;
    if (coop2 && c->bn > 192) return false;
    /* tn: cubes of a cluster along M (2: the persistent TMA forms, b's tile multicast in whole
     * 64-column boxes shared out between the cubes when b is N-major, in halves of its rows when
     * K-major) */
    bool cl_ok = c->tn == 1 || (c->tn == 2 && c->lanes >= 5 && c->bn / 64 >= 2);
    if (c->tm < 1 || c->tm > 3 || !cl_ok || (!ping && !coop2 && c->bm != 64 * c->tm) ||
        c->bk != 64 ||
        c->bn < 64 || c->bn > 256 || c->bn % 64 || c->lanes < 0 || c->lanes > 8 ||
        (c->lanes == 2 && c->tm != 2))
        return false;
    int R = p->R;
    const int64_t *as = p->ast, *bs = p->bst;
    mm_wgmma_plan q;
    memset(&q, 0, sizeof q);
    q.at = as[R - 1] != 1 && as[R - 2] == 1;
    q.bt = bs[R - 1] != 1 && bs[R - 2] == 1;
    q.ws = c->lanes >= 1;
    q.units = 128 * (c->tm + (q.ws ? 1 : 0));
    /* every copy moves 16 bytes (8 elements) along the operand's contiguous dim */
    if (!mma_chunks_ok(p->a, R, as, q.at ? R - 2 : R - 1, q.at ? p->M : p->K, 8) ||
        !mma_chunks_ok(p->b, R, bs, q.bt ? R - 2 : R - 1, q.bt ? p->K : p->N, 8))
        return false;
    /* as many stages as fit (3 to 6), with the 1 KiB the kernel spends aligning its buffers; the
     * warp-specialized kernel's two barrier arrays take a 1 KiB-aligned slot each */
    size_t stage = (size_t)(c->bm + c->bn) * 64 * 2;
    size_t extra = q.ws ? 3072 : 1024;
    q.tma = c->lanes >= 3;
    q.persist = c->lanes >= 5;
    q.ping = ping;
    q.mw = ping ? c->bm / 64 : c->bm / (64 * c->tm);
    q.cluster = c->tn;
    q.multicast = q.cluster > 1 && wgmma_device(p); /* CUDA sm_90a: the kernel's MC */
    /* the TMA kernel's 16-byte epilogue: out row-major, lines of 8 aligned, not the partials */
    bool parts = c->split >= 2 || c->sk; /* partial sums out (split-K, stream-K) */
    q.sepi = c->lanes >= 4 && !parts && p->ost[R - 1] == 1;
    for (int d = 0; d < R - 1 && q.sepi; d++) q.sepi = p->ost[d] % 8 == 0 || p->osh[d] == 1;
    /* lanes 7 (ping-pong) and 8 (the persistent cooperative form): that epilogue's results as
     * lines of 2 straight from the registers instead (no staging buffer): the ping-pong
     * consumers' epilogues then leave the shared memory to the other consumer's MMAs, and the
     * cooperative form has no staging slot, so its ring may take that room */
    if (q.sepi && (c->lanes == 7 || c->lanes == 8)) q.sepi = false, q.pairs = true;
    /* their split-K partials likewise, as lines of 2 of f32 into the contiguous workspace (rows
     * of N, even); element-wise 4-byte stores had made a weight gradient's split slower than
     * none (session 18) */
    if (parts && (c->lanes == 7 || c->lanes == 8)) q.pairs = p->N % 2 == 0;
    /* lines of 4 by a swap between neighbouring units (plane shuffles on CUDA, shared memory
     * on the C target): whole 32-byte sectors per store where lines of 2 wrote each in two
     * halves (the partials' rows: N a multiple of 4); EMBER_MATMUL_QUADS=0 keeps lines of 2 */
    const char *qv = getenv("EMBER_MATMUL_QUADS");
    q.quads = q.pairs && (!parts || p->N % 4 == 0) && !(qv && !strcmp(qv, "0"));
    /* the TMA kernel's staging slot (1 KiB-aligned): f32 64 x 36 per consumer with sepi */
    if (q.tma) extra += 1024 + (q.sepi ? (size_t)c->tm * 64 * 36 * 4 : 0);
    /* and the lines of 4's tile of bias (f32, BN per consumer; the kernel's SB), not on split-K's
     * partials, which take no bias */
    if (q.tma && q.quads && p->bias && !parts) extra += 1024 + (size_t)c->tm * c->bn * 4;
    /* and its residual operand's two chunks of 64 x 32 per consumer (the kernel's SR), where
     * its rows are 16-byte aligned (RV) */
    q.rv = q.tma && q.quads && !parts && mm_res_rows16(p);
    if (q.rv) extra += 1024 + (size_t)c->tm * 2 * 64 * 32 * 2;
    /* and the column sums' rows (f32, BN per plane of each consumer; the kernel's CS) */
    q.cs = q.tma && q.quads && !parts && p->colsum;
    if (q.cs) extra += 1024 + (size_t)c->tm * 4 * c->bn * 4;
    q.pre = q.tma && q.quads && !parts && p->pre && p->N % 4 == 0 && !p->res &&
            p->act >= EM_MATMUL_ACT_RELU && p->act <= EM_MATMUL_ACT_GELU_TANH;
    q.bs = q.tma && q.ws && !q.bt && !q.cs && p->bsum && p->batch == 1;
    size_t have = p->caps && p->caps->max_shared ? p->caps->max_shared : (size_t)232448;
    int stages = have > extra ? (int)((have - extra) / stage) : 0;
    if (stages > 6) stages = 6;
    if (stages < 3) return false;
    q.stages = stages;
    q.smem = (size_t)stages * stage + extra;
    /* setmaxnreg (two consumers only: 384 units launched at 168 registers, 65536 / 384) */
    q.regs = c->lanes == 2 || (q.tma && c->tm == 2);
    if (q.tma && (!tma_map_of(p->ash, as, R, q.at ? R - 2 : R - 1, q.adim, q.astr, &q.az) ||
                  !tma_map_of(p->bsh, bs, R, q.bt ? R - 2 : R - 1, q.bdim, q.bstr, &q.bz)))
        return false;
    *out = q;
    return true;
}

/* Whether stream-K (c->sk) takes p under plan q: the persistent forms that put their results out
 * from the registers (pairs, lanes 7 and 8), no split, an unbatched plain product (no epilogue
 * or column sums of the result: the pieces' sum is the result) into a row-major out whose lines
 * are aligned, with a k step or more for every cube. b's column sums (BS) may come along. */
bool mm_sk_fits(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q)
{
    int R = p->R, w = q->quads ? 4 : 2;
    if (c->kind != MM_WGMMA || (c->lanes != 7 && c->lanes != 8) || c->split > 1 || !q->tma ||
        !q->persist || !q->pairs || p->batch != 1 || p->bias || p->res || p->act || p->colsum ||
        p->pre || p->ln)
        return false;
    if (p->ost[R - 1] != 1 || p->ost[R - 2] % w || (p->out ? p->out->offset : 0) % w) return false;
    int64_t cl = q->cluster > 1 ? q->cluster : 1;
    int64_t ty = (p->M + c->bm - 1) / c->bm;
    int64_t tiles = (p->N + c->bn - 1) / c->bn * ((ty + cl - 1) / cl);
    int64_t steps = tiles * ((p->K + c->bk - 1) / c->bk);
    return steps <= INT32_MAX && steps >= mm_sk_workers(p, c, q);
}

/* Stream-K's workers: one a cluster of compute units (EMBER_MATMUL_SK_CUBES, for tests, sets
 * another count of cubes). */
int64_t mm_sk_workers(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q)
{
    (void)c;
    int64_t cl = q->cluster > 1 ? q->cluster : 1;
    int64_t cus = p->caps && p->caps->compute_units ? p->caps->compute_units : 1;
    const char *env = getenv("EMBER_MATMUL_SK_CUBES");
    if (env && atoi(env) > 0) cus = atoi(env);
    return cus / cl > 0 ? cus / cl : 1;
}

bool mm_config_valid(const mm_problem *p, const mm_config *c)
{
    const em_caps *caps = p->caps;
    int split = c->split < 1 ? 1 : c->split;
    if (p->batch * split > 65535 || split > 64) return false;
    if (split > 1 && p->K < (int64_t)split * c->bk) return false;
    if (p->ln && c->kind != MM_SKINNY) return false; /* only it normalizes a's rows itself */
    if (c->kind == MM_SIMPLE) return split == 1 && !p->bias && !p->res && !p->act;
    if (c->kind == MM_SKINNY) {
        mm_skinny_plan q;
        return mm_skinny_plan_of(p, c, &q);
    }
    if (c->kind == MM_WGMMA) {
        /* natively on sm_90a; forced (tests) also on the CPU, which emulates warpgroup MMAs */
        bool forced_cpu = is_cpu(p) && getenv("EMBER_MATMUL_CONFIG");
        mm_wgmma_plan q;
        if ((!wgmma_device(p) && !forced_cpu) || !mm_wgmma_plan_of(p, c, &q)) return false;
        if (c->sk && !mm_sk_fits(p, c, &q)) return false;
        return !caps || (uint32_t)q.units <= caps->max_cube_units;
    }
    if (c->bk <= 0 || c->bm <= 0 || c->bn <= 0 || c->tm <= 0 || c->tn <= 0) return false;
    size_t es = em_scalar_size(p->dt), cs = em_scalar_size(p->ct);
    if (c->kind == MM_MMA) {
        if (!mma_dtype_ok(p) && !getenv("EMBER_MATMUL_CONFIG")) return false;
        if (p->dt != EM_F16 && p->dt != EM_BF16 && p->dt != EM_F32) return false;
        mm_mma_plan q;
        if (!mm_mma_plan_of(p, c, &q)) return false;
        uint32_t plane = caps && caps->plane_dim ? caps->plane_dim : 1;
        uint32_t units = (uint32_t)(c->tm * c->tn) * plane;
        if (caps && units > caps->max_cube_units) return false;
        return !caps || q.smem <= caps->max_shared;
    }
    if (c->bm % c->tm || c->bn % c->tn) return false;
    if (c->kind == MM_CPU) {
        /* lines of 1 to 16 lanes, at most 8 per micro-kernel row, at most 16 rows */
        int w = c->lanes;
        if (w < 1 || w > 16 || c->tn % w || c->tm > 16 || c->tn / w > 8) return false;
        size_t smem = ((size_t)c->bm * c->bk + (size_t)c->bk * c->bn + (size_t)c->bm * c->bn) * cs;
        return !caps || smem <= caps->max_shared;
    }
    uint32_t units = (uint32_t)((c->bm / c->tm) * (c->bn / c->tn));
    if (caps && (units > caps->max_cube_units || units > caps->max_cube_dim[0])) return false;
    size_t smem = (size_t)c->bk * (c->bm + c->bn) * cs;
    (void)es;
    return !caps || smem <= caps->max_shared;
}

static mm_config simt(int bm, int bn, int bk, int tm, int tn, int split)
{
    return (mm_config){MM_SIMT, bm, bn, bk, tm, tn, split, 0, 0};
}

/* wm x wn planes, each fm x fn fragments of 16 x 16. */
static mm_config mma(int wm, int wn, int fm, int fn, int bk, int split)
{
    return (mm_config){MM_MMA, 16 * fm * wm, 16 * fn * wn, bk, wm, wn, split, 0, 0};
}

/* `wg` warpgroups of 64 x bn each (a 64 wg x bn tile), K steps of 64. */
static mm_config wgmma(int wg, int bn, int split)
{
    return (mm_config){MM_WGMMA, 64 * wg, bn, 64, wg, 1, split, 0, 0};
}

/* The warp-specialized kernel: `wg` consumer warpgroups of 64 x bn and a producer. */
static mm_config wgmma_ws(int wg, int bn, int split)
{
    return (mm_config){MM_WGMMA, 64 * wg, bn, 64, wg, 1, split, 1, 0};
}

/* The TMA-fed warp-specialized wgmma kernel (matmul_wgmma_tma.ek): `wg` consumers of 64 x bn. */
static mm_config wgmma_tma(int wg, int bn, int split)
{
    return (mm_config){MM_WGMMA, 64 * wg, bn, 64, wg, 1, split, 3, 0};
}

/* The ping-pong form (lanes 6): two consumers taking turns, each a tile of bm x bn. */
static mm_config wgmma_tma_pp(int bm, int bn)
{
    return (mm_config){MM_WGMMA, bm, bn, 64, 2, 1, 1, 6, 0};
}

/* It with the epilogue in 16-byte lines (lanes 4) and persistent cubes (lanes 5). */
static mm_config wgmma_tma_lanes(int wg, int bn, int lanes)
{
    return (mm_config){MM_WGMMA, 64 * wg, bn, 64, wg, 1, 1, lanes, 0};
}

/* The wgmma kernel's tile for p: 128 x 256 (two warpgroups of 64 x 256) when those tiles fill
 * the device, else 128 x 128. */
static mm_config wgmma_default(const mm_problem *p)
{
    int64_t cus = p->caps->compute_units ? p->caps->compute_units : 1;
    int64_t tiles = ((p->M + 127) / 128) * ((p->N + 255) / 256) * p->batch;
    return tiles >= cus ? wgmma(2, 256, 1) : wgmma(2, 128, 1);
}

/* A CPU-kernel configuration stated for 4-byte accumulators: NR and the lanes halve for 8-byte
 * ones (f64, i64), so that a line still fills the same registers. */
static mm_config cpu(const mm_problem *p, int bm, int bn, int bk, int mr, int nr, int lanes)
{
    int wide = em_scalar_size(p->ct) >= 8 ? 2 : 1;
    return (mm_config){MM_CPU, bm, bn, bk, mr, nr / wide, 1, lanes / wide, 0};
}

/* Bytes in one of the host's vector registers: the CPU driver compiles with -march=native, so a
 * line of that many bytes is one register. */
static int host_vector_bytes(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 64;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 32;
#endif
    return 16;
}

bool mm_cpu_fma(void)
{
#if defined(__aarch64__)
    return true; /* FMA is part of the base instruction set */
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const char *f = getenv("EMBER_CFLAGS");
    bool flags = !f || !*f || strstr(f, "native") || strstr(f, "fma");
    __builtin_cpu_init();
    return flags && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

/* The CPU default: the micro-kernel that measured best for the host's registers (gcc 12,
 * docs/matmul.md): with AVX-512's 32 registers 6 x 24 in lines of 8 (18 accumulators of 32
 * bytes), with AVX2's 16 registers 4 x 16 in lines of 8, else 4 x 8 in lines of 4. K steps of 128
 * keep a strip of packed b (128 x NR) in L1 while the strips of a stream past it. Problems
 * under CPU_SMALL multiply-adds take the SIMT kernel instead: it compiles in a tenth of a second
 * where this one takes one to five, and there the difference in run time is under a
 * millisecond. */
#define CPU_SMALL (1 << 21)

static bool cpu_small(const mm_problem *p)
{
    return (double)p->M * (double)p->N * (double)p->K * (double)p->batch < CPU_SMALL;
}

static mm_config cpu_default(const mm_problem *p)
{
    int vb = host_vector_bytes();
    if (vb >= 64) return cpu(p, 192, 240, 128, 6, 24, 8);
    if (vb >= 32) return cpu(p, 128, 256, 128, 4, 16, 8);
    return cpu(p, 128, 256, 128, 4, 8, 4);
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

/* The split-K for a persistent form of `tiles` output tiles that wastes least: the cubes run
 * ceil(tiles * s / cus) rounds of a 1 / s share of K each, so the time goes as that over s
 * (in rounds of whole tiles), plus the partials' traffic, s planes of M x N f32 written and
 * read, against the multiply-adds: on an H100 / H200, about 650 TFLOP/s against 3 TB/s, each
 * split costs about 866 / K of the product's time without waste (tiles / cus rounds). Where few
 * tiles meet a long K (a weight gradient's 768 x 3072 x 16384: 96 tiles of 128 x 192 on 132 compute
 * units), pick_split's two waves of cubes (3 splits: 288 tiles) leave most of a third round idle;
 * this picks 4 there (three rounds of a quarter of K). 1 when no split is cheaper than none. */
static int pick_split_rounds(const mm_problem *p, int64_t tiles, int bk)
{
    int64_t cus = p->caps && p->caps->compute_units ? p->caps->compute_units : 1;
    int64_t units = tiles * p->batch;
    if (units <= 0 || p->K < 8 * (int64_t)bk) return 1;
    double best = -1, ideal = (double)units / (double)cus, alpha = 866.0 / (double)p->K;
    int pick = 1;
    for (int s = 1; s <= 16 && (int64_t)s * 4 * bk <= p->K; s++) {
        double rounds = (double)((units * s + cus - 1) / cus);
        double cost = rounds / s + (s > 1 ? alpha * s * ideal : 0);
        if (best < 0 || cost < best - 1e-9) best = cost, pick = s;
    }
    return pick;
}

/* Whether stream-K is a candidate for c, whose tiles (tiles, unclustered) run in rounds on the
 * compute units: opt-in with EMBER_MATMUL_SK=1 (until a GPU call has run it), where whole
 * tiles would leave a tenth or more of their last round's compute units idle. */
static bool sk_wanted(const mm_problem *p, const mm_config *c, int64_t tiles)
{
    const char *env = getenv("EMBER_MATMUL_SK");
    if (!env || strcmp(env, "1") != 0 || c->split > 1 || p->batch != 1) return false;
    int64_t cus = p->caps && p->caps->compute_units ? p->caps->compute_units : 1;
    int64_t cl = c->tn > 1 ? c->tn : 1, units = cus / cl > 0 ? cus / cl : 1;
    int64_t ty = (p->M + c->bm - 1) / c->bm, ct = tiles / ty * ((ty + cl - 1) / cl);
    int64_t rounds = (ct + units - 1) / units;
    return ct * 10 < rounds * units * 9;
}

/* ---- the skinny kernel (matmul_skinny.ek): few rows, b streamed once ---- */

/* Whether b is the same matrix for every batch (its batch strides are 0), so that the batch
 * and M dims fold into one run of rows. */
static bool skinny_fold(const mm_problem *p)
{
    for (int d = 0; d < p->R - 2; d++)
        if (p->bst[d] != 0) return false;
    return true;
}

static int64_t skinny_rows(const mm_problem *p)
{
    return skinny_fold(p) ? p->batch * p->M : p->M;
}

/* Whether b's K is its contiguous dim (x W^T): the kernel then reads lines along K. */
static bool skinny_bt(const mm_problem *p)
{
    int R = p->R;
    return p->bst[R - 2] == 1 && p->bst[R - 1] != 1;
}

/* Lanes of b's lines: the widest power of two up to `bytes` worth of elements (at most 16) such
 * that the contiguous dim has unit stride and a length, and every other stride and the offset,
 * that are multiples of it (so a line never straddles a row or the matrix's end); else 1. */
static int skinny_lanes(const mm_problem *p, bool bt, int bytes)
{
    int R = p->R, fast = bt ? R - 2 : R - 1;
    int64_t len = bt ? p->K : p->N;
    int v = bytes / (int)em_scalar_size(p->dt);
    if (v > 16) v = 16;
    for (; v > 1; v /= 2) {
        if (p->bst[fast] != 1 || len % v || p->b->offset % v) continue;
        bool ok = true;
        for (int d = 0; d < R && ok; d++)
            if (d != fast) ok = p->bst[d] % v == 0;
        if (ok) return v;
    }
    return 1;
}

bool mm_skinny_plan_of(const mm_problem *p, const mm_config *c, mm_skinny_plan *out)
{
    const em_caps *caps = p->caps;
    int mr = c->bm, nu = c->bn, ks = c->tm, pk = c->tn, nl = c->lanes;
    if (mr < 1 || mr > 16 || nu < 1 || ks < 1 || ks > 64 || (ks & (ks - 1)) || pk < 1 || nl < 1 ||
        nl > 8 || c->bk != 16)
        return false;
    mm_skinny_plan q;
    memset(&q, 0, sizeof q);
    q.bt = skinny_bt(p);
    q.fold = skinny_fold(p);
    q.rows = skinny_rows(p);
    q.v = skinny_lanes(p, q.bt, is_cpu(p) ? host_vector_bytes() : 16);
    q.uk = is_cpu(p) ? 1 : q.bt ? 2 : 4;
    q.nout = q.bt ? nu * nl : nu * nl * q.v;
    int64_t units = (int64_t)pk * ks * nu;
    size_t ln_sums = p->ln ? (size_t)(2 * mr * units) : 0; /* LN: sums of d and d * d a row */
    q.smem = ((size_t)pk * (size_t)mr * (size_t)q.nout + ln_sums) * em_scalar_size(p->ct);
    if ((q.rows + mr - 1) / mr > 65535 || units > 1024) return false;
    if (ks > 1 &&
        (!caps || !caps->plane_ops || !caps->plane_dim || caps->plane_dim % (uint32_t)(nu * ks)))
        return false; /* the butterfly needs the KS units of a group inside one plane */
    if (caps && ((uint32_t)units > caps->max_cube_units ||
                 (uint32_t)units > caps->max_cube_dim[0] || q.smem > caps->max_shared))
        return false;
    *out = q;
    return true;
}

/* The skinny kernel's cubes for p with nout output columns and mr rows a cube. */
static int64_t skinny_cubes(const mm_problem *p, int64_t nout, int mr)
{
    int64_t rows = skinny_rows(p);
    return (p->N + nout - 1) / nout * ((rows + mr - 1) / mr) * (skinny_fold(p) ? 1 : p->batch);
}

static mm_config skinny(int mr, int nu, int ks, int pk, int nl, int split)
{
    return (mm_config){MM_SKINNY, mr, nu, 16, ks, pk, split, nl, 0};
}

/* The skinny kernel's default for p (at most 16 rows once folded). MR: the rows rounded up to a
 * power of two. The CPU: one unit per cube holding NL lines (4 of 16 f32 lanes with AVX-512 for
 * one row: 64 columns). GPUs with plane ops, a plane per group: row-major b takes NU units of one
 * line side by side (32 bytes: a whole memory sector per k) and the rest of the plane along K;
 * transposed b a plane (or part of one, for short K) along K per column. PK groups along K fill
 * the device with units (below), so each unit has a few lines to read. Split-K across cubes only when the
 * cubes are far fewer than the multiprocessors and K is long (it costs a second launch). */
static mm_config skinny_default(const mm_problem *p)
{
    int64_t rows = skinny_rows(p);
    int mr = 1;
    while (mr < rows && mr < 16) mr *= 2;
    bool bt = skinny_bt(p);
    if (is_cpu(p)) {
        int nl = bt ? 8 : 4;
        while (nl > 1 && mr * nl > 16) nl /= 2;
        return skinny(mr, 1, 1, 1, nl, 1);
    }
    const em_caps *caps = p->caps;
    int P = caps && caps->plane_ops ? (int)caps->plane_dim : 1;
    bool planes = P >= 4 && P <= 64 && !(P & (P - 1));
    int es = (int)em_scalar_size(p->dt);
    int v = skinny_lanes(p, bt, 16);
    int nu, ks, nl;
    int64_t steps; /* lines along K per column */
    if (bt) {
        steps = (p->K + v - 1) / v;
        ks = 1;
        while (planes && ks < P && ks * 2 <= (steps + 1) / 2) ks *= 2;
        nu = planes ? P / ks : 32;
        nl = mr <= 2 ? 2 : 1;
    } else {
        steps = p->K;
        nu = 32 / (v * es);
        if (nu < 1) nu = 1;
        if (planes && nu > P) nu = P;
        ks = planes ? P / nu : 1;
        if (!planes) nu = 32;
        nl = 1;
    }
    /* b streams from memory once, so the time is a few rounds of load latency: the more of K's
     * lines are in flight at once the better. PK takes the units left when the cubes share
     * 768 units a multiprocessor (so that the cubes of the next launch fit beside them and load
     * their first lines of b while these run out: the preload, PRE), at least 2
     * groups' worth of a plane, at most 1024 a cube (256 from 4 rows up) and one line a unit. Measured on the H200
     * with b cold (`ember bench matmul --graph --cold`, docs/benchmarks.md): 2 to 4 lines a unit
     * took 1x768x768 from 6.1 to 3.6 us and 1x768x3072 from 14.8 to 6.3. */
    int64_t nout = bt ? nu * nl : nu * nl * v;
    int64_t cubes = skinny_cubes(p, nout, mr);
    int64_t cus = caps && caps->compute_units ? caps->compute_units : 1;
    /* 2-byte row-major b with fewer cubes than multiprocessors (a 768-wide bf16 weight: 48 cubes
     * of 16 columns): one line a k per group instead of a whole 32-byte sector, twice the cubes,
     * so that more multiprocessors stream b (the two halves of a sector meet in L2). Measured on
     * the H200 (session 12, call 9): bf16 decode 2103 -> 2323 tokens/s; f32 lost by it (2536 ->
     * 2403: 96 cubes of 8 columns are enough there), so not for 4-byte types.
     * EMBER_SKINNY_NARROW=0 turns it off, =1 on for every type (measurements). */
    const char *narrow = getenv("EMBER_SKINNY_NARROW");
    bool narrow_on = narrow ? strcmp(narrow, "0") != 0 : es < 4;
    if (!bt && planes && nu > 1 && cubes < cus && narrow_on) {
        nu /= 2;
        ks = P / nu;
        nout = nu * nl * v;
        cubes = skinny_cubes(p, nout, mr);
    }
    const char *env = getenv("EMBER_SKINNY_ROOM"); /* units a multiprocessor (measurements) */
    int64_t per = env && atoll(env) >= 32 ? atoll(env) : 768;
    int64_t room = cus * per / (cubes > 0 ? cubes : 1), most = mr <= 2 ? 1024 : 256;
    if (room > most) room = most; /* more rows, more registers a unit: measured for 1 row */
    if (room < 2 * nu * ks) room = 2 * nu * ks;
    int64_t pk = room / (nu * ks), pkmax = (steps + ks - 1) / ks;
    if (pk > pkmax) pk = pkmax;
    if (pk < 1) pk = 1;
    mm_config c = skinny(mr, nu, ks, (int)pk, nl, 1);
    mm_skinny_plan q;
    while (c.tn > 1 && !mm_skinny_plan_of(p, &c, &q)) c.tn /= 2; /* a device's cube limits */
    if (cubes * 2 < cus && p->K >= 2048) {
        int64_t s = (cus + cubes - 1) / cubes, kmax = p->K / 1024;
        if (s > kmax) s = kmax;
        if (s > 16) s = 16;
        c.split = s < 2 ? 1 : (int)s;
    }
    return c;
}

mm_config mm_heuristic(const mm_problem *p)
{
    mm_config c;
    if (p->K > 0 && skinny_rows(p) <= 16) {
        c = skinny_default(p);
        if (mm_config_valid(p, &c)) return c;
    }
    int64_t big = p->M * p->N;
    mm_config w = {0};
    if (wgmma_device(p)) w = wgmma_default(p);
    if (w.kind == MM_WGMMA && p->K > 0 && mm_config_valid(p, &w)) {
        c = w;
    } else if (mma_dtype_ok(p) && p->K > 0) {
        int64_t tiles = ((p->M + 127) / 128) * ((p->N + 127) / 128) * p->batch;
        int64_t cus = p->caps->compute_units ? p->caps->compute_units : 1;
        c = tiles >= cus ? mma(4, 2, 2, 4, 32, 1) : mma(2, 2, 2, 4, 32, 1);
    } else if (is_cpu(p) && !cpu_small(p)) {
        c = cpu_default(p);
    } else if (is_cpu(p)) {
        /* one unit per cube: a cube is one pool thread looping over its units */
        c = p->M <= 8 ? simt(8, 64, 16, 8, 64, 1) : simt(32, 64, 16, 32, 64, 1);
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
    mm_config all[96];
    int n = 0;
    all[n++] = mm_heuristic(p);
    if (p->K > 0 && skinny_rows(p) <= 16) {
        /* the skinny default with half and twice the groups along K, and twice the columns a
         * unit owns; the other kernels follow */
        mm_config s = skinny_default(p);
        s.split = 1;
        all[n++] = s;
        if (s.tn > 1) all[n] = s, all[n++].tn = s.tn / 2;
        all[n] = s, all[n++].tn = s.tn * 2;
        if (s.lanes * s.bm <= 8) all[n] = s, all[n++].lanes = s.lanes * 2;
    }
    if (wgmma_device(p)) {
        /* warpgroups x BN: 2 x 256 (128 accumulators a unit), 2 x 128, 2 x 192, 3 x 128 (three
         * warpgroups of 64 x 128); full adds 1 x 256 and 1 x 128 for small grids. The mma kernel's
         * candidates follow, so a problem the wgmma kernel does badly keeps the old kernel. */
        static const int wt[][2] = {{2, 256}, {2, 128}, {2, 192}, {3, 128}, {1, 256}, {1, 128}};
        for (int i = 0; i < (full ? 6 : 4); i++) all[n++] = wgmma(wt[i][0], wt[i][1], 1);
        /* the warp-specialized kernel (its barriers with phases exist where warpgroup MMAs do:
         * sm_90a), only in the full search: measured slower than the kernel above at every shape
         * (docs/matmul.md: its cp.async producer cannot feed two consumers; TMA next), so the
         * default search does not spend compile and tuning time on it. 2 consumers x 256, x 128,
         * x 192 and 3 x 128. Its setmaxnreg variant (lanes 2) runs only when forced. */
        static const int ws[][2] = {{2, 256}, {2, 128}, {2, 192}, {3, 128}};
        for (int i = 0; full && i < 4; i++) all[n++] = wgmma_ws(ws[i][0], ws[i][1], 1);
        /* the TMA-fed warp-specialized kernel (one producer unit, setmaxnreg with 2 consumers):
         * 2 x 256 and 2 x 128 in the default search, the ws shapes in the full one */
        for (int i = 0; i < (full ? 4 : 2); i++) all[n++] = wgmma_tma(ws[i][0], ws[i][1], 1);
        /* its persistent form with the 16-byte epilogue (2 x 256 and 2 x 128; the full search
         * also the one-tile form with that epilogue) */
        for (int i = 0; i < 2; i++) all[n++] = wgmma_tma_lanes(ws[i][0], ws[i][1], 5);
        for (int i = 0; full && i < 2; i++) all[n++] = wgmma_tma_lanes(ws[i][0], ws[i][1], 4);
        /* its ping-pong form: a consumer's tile of 128 x 128 (two accumulator sets) or 64 x 256 */
        all[n++] = wgmma_tma_pp(128, 128);
        all[n++] = wgmma_tma_pp(64, 256);
        /* the cooperative persistent 256 x 128 tile: two consumers of 128 x 128 (cuBLAS's
         * choice for the K = 768 GPT-2 shapes on the H200) */
        all[n++] = (mm_config){MM_WGMMA, 256, 128, 64, 2, 1, 1, 5, 0};
        /* the persistent forms in clusters of two cubes on two row tiles, which load b's tile
         * once between them (multicast: less traffic from L2 a multiply-add, what limited the
         * K = 768 shapes) */
        all[n++] = (mm_config){MM_WGMMA, 64, 256, 64, 2, 2, 1, 6, 0};
        all[n++] = (mm_config){MM_WGMMA, 128, 128, 64, 2, 2, 1, 6, 0};
        all[n++] = (mm_config){MM_WGMMA, 128, 256, 64, 2, 2, 1, 5, 0};
        all[n++] = (mm_config){MM_WGMMA, 256, 128, 64, 2, 2, 1, 5, 0};
        /* the ping-pong form with the epilogue from the registers, in clusters (measured, session
         * 12: the fastest at three of the four K = 768 GPT-2 shapes) */
        all[n++] = (mm_config){MM_WGMMA, 128, 128, 64, 2, 2, 1, 7, 0};
        all[n++] = (mm_config){MM_WGMMA, 64, 256, 64, 2, 2, 1, 7, 0};
        all[n++] = (mm_config){MM_WGMMA, 128, 128, 64, 2, 1, 1, 7, 0};
        /* 192 columns a consumer (192 accumulators a unit, 5 stages): 38.4 multiply-adds per
         * byte a k step brings in where 128 x 128 has 32, so each multiprocessor takes a sixth
         * fewer bytes from L2 per multiply-add (the K = 768 GPT-2 shapes' N of 768, 2304, 3072
         * and 50304 are all multiples of 192). Measured (session 18, H100): 2-5 % faster than
         * the autotuner's other picks at N = 2304 and 3072, 5 % slower at 768 */
        all[n++] = (mm_config){MM_WGMMA, 128, 192, 64, 2, 1, 1, 7, 0};
        all[n++] = (mm_config){MM_WGMMA, 128, 192, 64, 2, 2, 1, 7, 0};
        /* the cooperative persistent forms with the epilogue from the registers (cuBLAS's
         * 256 x 128 tile in clusters of two: a quarter fewer bytes from L2 a multiply-add than
         * the ping-pong 128 x 128 tiles, its epilogue without staging), in the full search only:
         * `p 128x256 2x1` lost 5-12 % with this epilogue (session 12, call 5), as both consumers
         * store while the tensor cores idle; 256 x 128 is not measured yet; 256 x 192, 3
         * stages, ran 0.58-0.80x cuBLAS on the GPT-2 shapes, session 18, H100) */
        for (int i = 0; full && i < 3; i++)
            all[n++] =
                (mm_config){MM_WGMMA, 256 >> (i / 2), 128 << (i / 2), 64, 2, 2 - i % 2, 1, 8, 0};
        if (full) all[n++] = (mm_config){MM_WGMMA, 256, 192, 64, 2, 1, 1, 8, 0};
    }
    if (mma_dtype_ok(p)) {
        /* planes x fragments per plane: 128 x 128 tiles of 8 planes of 32 x 64 (about 128
         * registers a unit: two cubes per multiprocessor) or of 4 planes of 64 x 64 (fewer
         * shared-memory reads per multiply-add, about 250 registers), 128 x 256 of 8 such
         * planes, 64 x 128 for small grids; then other shapes and BK = 64 */
        static const int wt[][4] = {{4, 2, 2, 4}, {2, 2, 4, 4}, {2, 4, 4, 4},
                                    {2, 2, 2, 4}, {4, 4, 2, 4}, {4, 2, 4, 4},
                                    {2, 4, 2, 2}, {2, 1, 2, 4}, {1, 2, 2, 4}};
        int nw = full ? 9 : 4;
        for (int i = 0; i < nw; i++) {
            all[n++] = mma(wt[i][0], wt[i][1], wt[i][2], wt[i][3], 32, 1);
            if (full && i < 4) all[n++] = mma(wt[i][0], wt[i][1], wt[i][2], wt[i][3], 64, 1);
        }
    } else if (is_cpu(p) && cpu_small(p)) {
        /* as the heuristic: the SIMT kernel's binaries compile ten times faster */
        all[n++] = simt(32, 64, 16, 32, 64, 1);
        all[n++] = simt(64, 64, 16, 64, 64, 1);
        all[n++] = simt(16, 128, 32, 16, 128, 1);
    } else if (is_cpu(p)) {
        /* micro-kernels that won on one host or another (gcc's vectorizer decides much; MR = 4
         * meets a pathology of its AVX-512 cost model, 20x slower) */
        int vb = host_vector_bytes();
        all[n++] = cpu(p, 192, 240, 128, 6, 24, 8);
        all[n++] = cpu(p, 128, 256, 128, 8, 32, 16);
        all[n++] = cpu(p, 96, 240, 128, 6, 24, 8);
        if (vb < 64) all[n++] = cpu(p, 128, 256, 128, 4, 16, 8);
        if (vb < 64) all[n++] = cpu(p, 128, 256, 128, 4, 16, 16);
        if (vb < 32) all[n++] = cpu(p, 128, 256, 128, 4, 8, 4);
        if (full) {
            all[n++] = cpu(p, 192, 256, 128, 6, 16, 8);
            all[n++] = cpu(p, 96, 256, 128, 6, 16, 8);
            all[n++] = cpu(p, 192, 480, 128, 6, 24, 8);
            all[n++] = cpu(p, 128, 256, 256, 8, 32, 16);
            all[n++] = cpu(p, 64, 256, 256, 8, 32, 16);
        }
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
    for (int i = 0; i < base && n + 2 <= 64; i++) {
        if (all[i].split > 1 || all[i].kind == MM_SKINNY) continue;
        int64_t tiles = ((p->M + all[i].bm - 1) / all[i].bm) * ((p->N + all[i].bn - 1) / all[i].bn);
        int s = pick_split(p, tiles, all[i].bk);
        if (s > 1) {
            all[n] = all[i], all[n++].split = s;
            if (full && s >= 4) all[n] = all[i], all[n++].split = s / 2;
        }
        /* the persistent TMA forms: also the split that wastes the fewest rounds */
        int r = all[i].kind == MM_WGMMA && all[i].lanes >= 5 && n < 64
                    ? pick_split_rounds(p, tiles, all[i].bk)
                    : 1;
        if (r > 1 && r != s) all[n] = all[i], all[n++].split = r;
    }
    /* and stream-K where whole tiles leave a tenth or more of the last round idle (opt-in: in
     * places of their own past the 64 the others may fill, so they crowd none out) */
    for (int i = 0; i < base && n < 96; i++) {
        int64_t tiles = ((p->M + all[i].bm - 1) / all[i].bm) * ((p->N + all[i].bn - 1) / all[i].bn);
        if (all[i].kind == MM_WGMMA && (all[i].lanes == 7 || all[i].lanes == 8) &&
            sk_wanted(p, &all[i], tiles))
            all[n] = all[i], all[n++].sk = 1;
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
    static const char *const names[] = {"simple", "simt", "mma", "cpu", "wgmma", "skinny"};
    const char *name = names[c->kind < 6 && c->kind >= 0 ? c->kind : 0];
    if (c->kind == MM_WGMMA && c->lanes >= 1)
        name = c->lanes == 8   ? "wgmma-tma-pr"
               : c->lanes == 7 ? "wgmma-tma-ppr"
               : c->lanes == 6 ? "wgmma-tma-pp"
               : c->lanes == 5 ? "wgmma-tma-p"
               : c->lanes == 4 ? "wgmma-tma-se"
               : c->lanes == 3 ? "wgmma-tma"
               : c->lanes == 2 ? "wgmma-ws-regs"
                               : "wgmma-ws";
    if (c->kind == MM_CPU || c->kind == MM_SKINNY)
        snprintf(buf, size, "%s %dx%dx%d %dx%dx%d s%d", name, c->bm, c->bn, c->bk, c->tm, c->tn,
                 c->lanes, c->split);
    else
        snprintf(buf, size, "%s %dx%dx%d %dx%d s%d%s", name, c->bm, c->bn, c->bk, c->tm, c->tn,
                 c->split, c->sk ? " sk" : "");
}

bool mm_config_parse(const char *text, mm_config *c)
{
    char kind[16];
    mm_config r;
    memset(&r, 0, sizeof r);
    if (!text || sscanf(text, "%15s", kind) != 1) return false;
    if (!strcmp(kind, "simple"))
        r.kind = MM_SIMPLE;
    else if (!strcmp(kind, "simt"))
        r.kind = MM_SIMT;
    else if (!strcmp(kind, "mma"))
        r.kind = MM_MMA;
    else if (!strcmp(kind, "cpu"))
        r.kind = MM_CPU;
    else if (!strcmp(kind, "wgmma"))
        r.kind = MM_WGMMA;
    else if (!strcmp(kind, "wgmma-ws"))
        r.kind = MM_WGMMA, r.lanes = 1;
    else if (!strcmp(kind, "wgmma-ws-regs"))
        r.kind = MM_WGMMA, r.lanes = 2;
    else if (!strcmp(kind, "wgmma-tma"))
        r.kind = MM_WGMMA, r.lanes = 3;
    else if (!strcmp(kind, "wgmma-tma-se"))
        r.kind = MM_WGMMA, r.lanes = 4;
    else if (!strcmp(kind, "wgmma-tma-p"))
        r.kind = MM_WGMMA, r.lanes = 5;
    else if (!strcmp(kind, "wgmma-tma-pp"))
        r.kind = MM_WGMMA, r.lanes = 6;
    else if (!strcmp(kind, "wgmma-tma-ppr"))
        r.kind = MM_WGMMA, r.lanes = 7;
    else if (!strcmp(kind, "wgmma-tma-pr"))
        r.kind = MM_WGMMA, r.lanes = 8;
    else if (!strcmp(kind, "skinny"))
        r.kind = MM_SKINNY;
    else
        return false;
    bool ok = r.kind == MM_CPU || r.kind == MM_SKINNY
                  ? sscanf(text, "%15s %dx%dx%d %dx%dx%d s%d", kind, &r.bm, &r.bn, &r.bk, &r.tm,
                           &r.tn, &r.lanes, &r.split) == 8
                  : sscanf(text, "%15s %dx%dx%d %dx%d s%d", kind, &r.bm, &r.bn, &r.bk, &r.tm, &r.tn,
                           &r.split) == 7;
    if (!ok) return false;
    const char *sk = strstr(text, " sk");
    r.sk = sk && (sk[3] == 0 || sk[3] == ' ' || sk[3] == '\n');
    *c = r;
    return true;
}

/* Sizes to buckets, so nearby shapes share: four a doubling from 8 on (2^k times 1, 1.25, 1.5,
 * 1.75; a size goes to the next one up). With powers of two alone a weight gradient's N of 2304
 * and 3072 shared a bucket, and the winner tuned on 2304 ran 3072 at 0.61 of cuBLAS where its
 * own reached 0.78 (session 18, H100). */
static long long bucket(int64_t v)
{
    long long b = 1;
    while (b < v && b < (1LL << 40)) b <<= 1;
    if (b >= 8)
        for (long long q = b / 8, c = b / 2 + q; c < b; c += q)
            if (c >= v) return c;
    return b;
}

void mm_tune_key(const mm_problem *p, char *buf, size_t size)
{
    int R = p->R;
    char la = p->ast[R - 1] == 1 ? 'n' : p->ast[R - 2] == 1 ? 't' : 's';
    char lb = p->bst[R - 1] == 1 ? 'n' : p->bst[R - 2] == 1 ? 't' : 's';
    /* split-K summed in the kernel (EMBER_MATMUL_SKL=1) changes what a split costs: its
     * winners are kept apart */
    const char *skl = getenv("EMBER_MATMUL_SKL"), *sk = getenv("EMBER_MATMUL_SK");
    snprintf(buf, size, "matmul-v14 %s%s %c%c m%lld n%lld k%lld b%lld e%d%d%d%s%s%s%s%s%s",
             em_scalar_name(p->dt), p->tf32 && p->dt == EM_F32 ? "+tf32" : "", la, lb, bucket(p->M),
             bucket(p->N), bucket(p->K), bucket(p->batch), p->bias != NULL, p->act, p->res != NULL,
             p->ln ? " ln" : "", p->colsum ? " cs" : "", p->pre ? " pre" : "", p->bsum ? " bs" : "",
             skl && !strcmp(skl, "1") ? " skl" : "", sk && !strcmp(sk, "1") ? " sk" : "");
}
