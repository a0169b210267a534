/* matmul_launch.c — runs one matmul configuration (matmul_internal.h) on a problem: binds the
 * operands, the epilogue tensors (or placeholders the kernel never reads, since its comptime
 * flags are off) and, for split-K, a contiguous workspace of partial sums in the accumulation
 * type that matmul_splitk_reduce adds up and finishes with the epilogue. */
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion.h"
#include "tensor/matmul_internal.h"

/* The bias argument: [N] with its stride, or a one-element placeholder on a. */
static tn_arg bias_arg(const mm_problem *p)
{
    int64_t shape = p->bias ? p->N : 1, stride = p->bias ? p->bias_stride : 0;
    return p->bias ? tn_arg_geom(p->bias, 1, &shape, &stride, p->bias_off)
                   : tn_arg_geom(p->a, 1, &shape, &stride, p->a->offset);
}

/* The residual argument in out's geometry, or a placeholder on a (strides 0). */
static tn_arg res_arg(const mm_problem *p)
{
    static const int64_t zeros[EM_MAX_RANK];
    return p->res ? tn_arg_geom(p->res, p->R, p->osh, p->rst, p->res->offset)
                  : tn_arg_geom(p->a, p->R, p->osh, zeros, p->a->offset);
}

static em_status launch_simple(const mm_problem *p)
{
    em_lang_bind bd[4] = {em_lang_bind_type("T", p->dt), em_lang_bind_type("C", p->ct),
                          em_lang_bind_int("R", p->R), em_lang_bind_int("TILE", 16)};
    tn_arg args[3] = {tn_arg_geom(p->a, p->R, p->ash, p->ast, p->a->offset),
                      tn_arg_geom(p->b, p->R, p->bsh, p->bst, p->b->offset),
                      tn_arg_geom(p->out, p->R, p->osh, p->ost, p->out->offset)};
    uint32_t cubes[3] = {(uint32_t)((p->N + 15) / 16), (uint32_t)((p->M + 15) / 16),
                         (uint32_t)p->batch};
    uint32_t units[3] = {16, 16, 1};
    return tn_launch("matmul", p->dev, "tensor_matmul", bd, 4, 1, cubes, units, args, 3);
}

/* Adds the split partial sums in part ([batch * split, M, N]) into p->out with the epilogue. */
static em_status launch_reduce(const mm_problem *p, em_tensor *part, int split)
{
    em_lang_bind rb[6] = {
        em_lang_bind_type("T", p->dt),   em_lang_bind_type("C", p->ct),
        em_lang_bind_int("R", p->R),     em_lang_bind_bool("BIAS", p->bias != NULL),
        em_lang_bind_int("ACT", p->act), em_lang_bind_bool("RES", p->res != NULL)};
    tn_arg ra[5] = {tn_arg_t(part), tn_arg_geom(p->out, p->R, p->osh, p->ost, p->out->offset), bias_arg(p),
                    res_arg(p), tn_arg_s(em_arg_u32((uint32_t)split))};
    uint32_t rc[3], ru[3];
    tn_grid_1d((uint64_t)(p->batch * p->M * p->N), rc, ru);
    return tn_launch("matmul", p->dev, "matmul_splitk_reduce", rb, 6, 1, rc, ru, ra, 5);
}

/* The layer-norm prologue's weight or bias argument (t [K], or a placeholder on a when NULL). */
static tn_arg ln_arg(const mm_problem *p, const em_tensor *t)
{
    int64_t shape = t ? p->K : 1, stride = t ? t->stride[0] : 0;
    return tn_arg_geom(t ? t : p->a, 1, &shape, &stride, t ? t->offset : p->a->offset);
}

/* The skinny kernel (matmul_skinny.ek) with b read in lines of the plan's width; outa is out or
 * the split's partial-sum workspace; with p->ln it layer-normalizes a's rows as it reads them. */
static em_status launch_skinny(const mm_problem *p, const mm_config *c, tn_arg outa,
                               uint32_t kchunk, int split)
{
    mm_skinny_plan q;
    if (!mm_skinny_plan_of(p, c, &q))
        return em_set_error(EM_ERR_INVALID, "matmul: no skinny plan for this configuration");
    em_lang_bind bd[20];
    size_t nb = 0;
    bd[nb++] = em_lang_bind_type("T", p->dt);
    bd[nb++] = em_lang_bind_type("C", p->ct);
    bd[nb++] = em_lang_bind_type("O", split > 1 ? p->ct : p->dt);
    bd[nb++] = em_lang_bind_int("R", p->R);
    bd[nb++] = em_lang_bind_int("MR", c->bm);
    bd[nb++] = em_lang_bind_int("NU", c->bn);
    bd[nb++] = em_lang_bind_int("KS", c->tm);
    bd[nb++] = em_lang_bind_int("PK", c->tn);
    bd[nb++] = em_lang_bind_int("NL", c->lanes);
    bd[nb++] = em_lang_bind_int("UK", q.uk);
    bd[nb++] = em_lang_bind_bool("BT", q.bt);
    bd[nb++] = em_lang_bind_bool("RAW", split > 1);
    bd[nb++] = em_lang_bind_bool("BIAS", p->bias != NULL);
    bd[nb++] = em_lang_bind_int("ACT", p->act);
    bd[nb++] = em_lang_bind_bool("RES", p->res != NULL);
    bd[nb++] = em_lang_bind_bool("LN", p->ln);
    bd[nb++] = em_lang_bind_bool("LNW", p->ln && p->ln_w);
    bd[nb++] = em_lang_bind_bool("LNB", p->ln && p->ln_b);
    /* b's first lines before the dependency wait where it is settled (a model's weights while
     * decoding); EMBER_SKINNY_PRELOAD=0 / 1 */
    bd[nb++] = em_lang_bind_bool("PRE", tn_preload_ok(p->dev, "EMBER_SKINNY_PRELOAD", &p->b, 1));
    tn_arg ts[7] = {tn_arg_geom(p->a, p->R, p->ash, p->ast, p->a->offset),
                    tn_arg_geom(p->b, p->R, p->bsh, p->bst, p->b->offset),
                    outa,
                    bias_arg(p),
                    res_arg(p),
                    ln_arg(p, p->ln ? p->ln_w : NULL),
                    ln_arg(p, p->ln ? p->ln_b : NULL)};
    /* b is a tensor of lines (the launch's width, q.v) and the rest tensors of scalars */
    for (int i = 0; i < 7; i++)
        if (i != 1) ts[i].lanes = 1;
    tn_arg args[11] = {ts[0],
                       ts[1],
                       ts[2],
                       ts[3],
                       ts[4],
                       tn_arg_s(em_arg_u32(kchunk)),
                       tn_arg_s(em_arg_u32((uint32_t)split)),
                       tn_arg_s(em_arg_u32(q.fold ? 1u : 0u)),
                       ts[5],
                       ts[6],
                       tn_arg_s(tn_scalar_arg(p->dt, p->ln ? p->ln_eps : 0.0))};
    int64_t zb = q.fold ? 1 : p->batch;
    uint32_t cubes[3] = {(uint32_t)((p->N + q.nout - 1) / q.nout),
                         (uint32_t)((q.rows + c->bm - 1) / c->bm), (uint32_t)(zb * split)};
    uint32_t units[3] = {(uint32_t)(c->tn * c->tm * c->bn), 1, 1};
    return tn_launch("matmul", p->dev, "matmul_skinny", bd, nb, (unsigned)q.v, cubes, units, args,
                     11);
}

static em_status launch_labeled(const mm_problem *p, const mm_config *c, bool *cs, bool *bs);

/* Whether the TMA kernel's BS form adds its partial rows up itself (LAST: the last plane of each
 * column tile, tma_bs_last) instead of a tensor_cols_sum after it (the default since session 27's
 * A/B on an H100: 0.15 ms a GPT-2 b16 step; EMBER_MATMUL_BS_LAST=0 for the second launch), for
 * b_sums in b's dtype and where the device's counters (em_device_counters, *cnt) are enough for
 * the column tiles' planes (3 a tile on CUDA, whose planes are 32 units; 96 on the C target). */
static bool bs_last(const mm_problem *p, const mm_config *c, uint32_t plane, em_buffer **cnt)
{
    const char *env = getenv("EMBER_MATMUL_BS_LAST");
    if (env && !strcmp(env, "0")) return false;
    int64_t tiles = (p->N + c->bn - 1) / c->bn;
    if (p->bsum->dtype != p->dt || tiles * (plane >= 32 ? 3 : 96) > EM_DEVICE_COUNTERS)
        return false;
    if (em_device_counters(p->dev, cnt) == EM_OK) return true;
    em_clear_error(); /* recording a graph before the counters were made: the second launch */
    return false;
}

/* SKL's rows of consumer tiles: the kernel's rows of tiles, its clusters' rows included */
static int64_t skl_rows(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q)
{
    int64_t ty = (p->M + c->bm - 1) / c->bm, cl = q->cluster > 1 ? q->cluster : 1;
    return (ty + cl - 1) / cl * cl * c->bm;
}

/* Whether the TMA kernel adds c's split-K partials up itself (its SKL: each tile's last split
 * sums them into out in split order, no matmul_splitk_reduce after it; opt-in with
 * EMBER_MATMUL_SKL=1 until a GPU call has run it: docs/benchmarks.md, session 28): for the
 * persistent forms whose results go out from the registers (pairs), an unbatched plain product
 * (no epilogue, column sums or kept input) into a row-major out whose lines (of 4 with quads,
 * else 2) are aligned, where the device's counters are enough for the consumers' tiles beside
 * BS's LAST (`last`). *cnt: the counters. */
static bool skl_on(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q, bool last,
                   uint32_t plane, em_buffer **cnt)
{
    const char *env = getenv("EMBER_MATMUL_SKL");
    /* (a split's plan has no CS or PRE, its pairs N even, and a kept input never reaches a split
     * launch: launch_with_extras runs the product alone then); stream-K always sums so */
    if (!c->sk && (!env || strcmp(env, "1") != 0 || c->split < 2)) return false;
    if (!q->tma || !q->persist || !q->pairs || p->batch != 1 || p->bias || p->res || p->act ||
        p->colsum)
        return false;
    int R = p->R, w = q->quads ? 4 : 2;
    if (p->ost[R - 1] != 1 || p->ost[R - 2] % w || p->out->offset % w) return false;
    int64_t tx = (p->N + c->bn - 1) / c->bn;
    int64_t need = skl_rows(p, c, q) / (64 * q->mw) * tx + (last ? tx * (plane >= 32 ? 3 : 96) : 0);
    if (need > EM_DEVICE_COUNTERS) return false;
    if (em_device_counters(p->dev, cnt) == EM_OK) return true;
    em_clear_error(); /* recording a graph before the counters were made: the reduction after */
    return false;
}

/* Stream-K's shares (matmul_wgmma_tma.ek's sk_lo): W workers on T k steps, the first T % W
 * taking one more; the worker whose share holds step i. */
static int64_t sk_worker(int64_t i, int64_t T, int64_t W)
{
    int64_t q = T / W, r = T % W, big = r * (q + 1);
    return i < big ? i / (q + 1) : r + (i - big) / q;
}

/* Stream-K's P: the most pieces (workers) any of the tiles' k steps are shared among. */
static int sk_pieces(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q)
{
    int64_t cl = q->cluster > 1 ? q->cluster : 1, ty = (p->M + c->bm - 1) / c->bm;
    int64_t tiles = (p->N + c->bn - 1) / c->bn * ((ty + cl - 1) / cl);
    int64_t kt = (p->K + c->bk - 1) / c->bk, T = tiles * kt, W = mm_sk_workers(p, c, q), most = 1;
    for (int64_t t = 0; t < tiles; t++) {
        int64_t n = sk_worker(t * kt + kt - 1, T, W) - sk_worker(t * kt, T, W) + 1;
        if (n > most) most = n;
    }
    return (int)most;
}

/* Whether c's kernel writes p->pre itself (the TMA kernel's PRE). */
static bool does_pre(const mm_problem *p, const mm_config *c)
{
    mm_wgmma_plan q;
    return c->kind == MM_WGMMA && mm_wgmma_plan_of(p, c, &q) && q.tma && q.pre;
}

/* The launches of c on p, and p->colsum where the kernel did not write it (its CS): a column
 * sum of the result after it; with p->pre where the kernel does not write it (its PRE): the
 * product without the activation into pre, then the activation from pre into out. */
static em_status launch_with_extras(const mm_problem *p, const mm_config *c)
{
    bool cs = false, bs = false;
    em_status st;
    if (p->pre && !does_pre(p, c)) {
        static const int codes[] = {[EM_MATMUL_ACT_RELU] = TN_U_RELU,
                                    [EM_MATMUL_ACT_GELU] = TN_U_GELU,
                                    [EM_MATMUL_ACT_GELU_TANH] = TN_U_GELU_TANH};
        mm_problem q = *p;
        q.out = p->pre, q.pre = NULL, q.act = EM_MATMUL_ACT_NONE;
        st = launch_labeled(&q, c, &cs, &bs);
        if (st == EM_OK) st = tn_unary_run("matmul", p->pre, p->out, codes[p->act]);
    } else {
        st = launch_labeled(p, c, &cs, &bs);
    }
    if (st == EM_OK && p->colsum && !cs) st = tn_sum_leading_into("matmul", p->out, p->colsum);
    if (st == EM_OK && p->bsum && !bs) st = tn_sum_leading_into("matmul", p->b, p->bsum);
    return st;
}

/* mm_launch's launches under a profiler label (EMBER_PROFILE=shapes): the layout of a and b (n
 * where the last dim is contiguous), M x N x K, the batch, and the epilogue (bias, act, res). */
em_status mm_launch(const mm_problem *p, const mm_config *c)
{
    if (!em_profile_labels_on()) return launch_with_extras(p, c);
    /* pending operands run first, under their own names */
    if (tn_realize(p->a) != EM_OK || tn_realize(p->b) != EM_OK || tn_realize(p->bias) != EM_OK ||
        tn_realize(p->res) != EM_OK)
        return em_error_context("matmul");
    char label[96];
    snprintf(label, sizeof label, "%c%c %lldx%lldx%lld b%lld e%d%d%d",
             p->ast[p->R - 1] == 1 ? 'n' : 't', p->bst[p->R - 1] == 1 ? 'n' : 't', (long long)p->M,
             (long long)p->N, (long long)p->K, (long long)p->batch, p->bias != NULL, p->act,
             p->res != NULL);
    em_profile_label(label);
    em_status st = launch_with_extras(p, c);
    em_profile_label(NULL);
    return st;
}

static em_status launch_labeled(const mm_problem *p, const mm_config *c, bool *cs, bool *bs)
{
    *cs = *bs = false;
    if (c->kind == MM_SIMPLE && !p->bias && !p->res && !p->act) return launch_simple(p);
    bool mma = c->kind == MM_MMA, wg = c->kind == MM_WGMMA;
    int split = c->split > 1 ? c->split : 1;
    mm_wgmma_plan wgq = {0};
    if (wg && !mm_wgmma_plan_of(p, c, &wgq))
        return em_set_error(EM_ERR_INVALID, "matmul: no wgmma plan for this configuration");
    bool sk = wg && c->sk;
    if (sk) split = sk_pieces(p, c, &wgq); /* the partials' planes: a tile's pieces at most */
    int64_t kchunk = (p->K + split - 1) / split;
    kchunk = (kchunk + c->bk - 1) / c->bk * c->bk; /* chunks start on a BK boundary */
    if (kchunk == 0) kchunk = 1;
    em_tensor *part = NULL;
    tn_arg outa = tn_arg_geom(p->out, p->R, p->osh, p->ost, p->out->offset);
    uint32_t plane = p->caps && p->caps->plane_dim ? p->caps->plane_dim : 1;
    /* the TMA kernel's BS with LAST, and SKL: both count in the device's counters (cnt) */
    em_buffer *cnt = NULL;
    bool last = false, skl = false;
    if (wg) {
        last = wgq.bs && wgq.tma && bs_last(p, c, plane, &cnt);
        skl = (split > 1 || sk) && skl_on(p, c, &wgq, last, plane, &cnt);
    }
    if (sk && !skl) {
        /* no counters (a graph recorded before they were made): the same tiles unshared */
        mm_config whole = *c;
        whole.sk = 0;
        return launch_labeled(p, &whole, cs, bs);
    }
    em_scalar ot = split > 1 && !skl ? p->ct : p->dt; /* the kernel's O: partials or results */
    if (split > 1) {
        /* SKL's partials: whole consumer tiles (64 mw x bn) in each unit's order */
        int64_t psh[3] = {p->batch * split, skl ? skl_rows(p, c, &wgq) : p->M,
                          skl ? (p->N + c->bn - 1) / c->bn * c->bn : p->N};
        part = tn_new(p->dev, p->ct, 3, psh);
        if (!part) return em_error_context("matmul");
        int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
        for (int i = 0; i < p->R; i++) sh[i] = 1, st[i] = 0;
        sh[p->R - 2] = p->M, sh[p->R - 1] = p->N, st[p->R - 2] = p->N, st[p->R - 1] = 1;
        if (!skl) outa = tn_arg_geom(part, p->R, sh, st, 0);
    }
    if (c->kind == MM_SKINNY) {
        em_status st = launch_skinny(p, c, outa, (uint32_t)kchunk, split);
        if (st == EM_OK && split > 1) st = launch_reduce(p, part, split);
        em_release(part);
        return st;
    }
    const int64_t *ast = p->ast, *bst = p->bst;
    bool akfast = ast[p->R - 1] == 1 || ast[p->R - 2] != 1;
    bool bnfast = bst[p->R - 1] == 1 || bst[p->R - 2] != 1;
    em_lang_bind bd[32];
    size_t nb = 0;
    bd[nb++] = em_lang_bind_type("T", p->dt);
    if (!mma && !wg) bd[nb++] = em_lang_bind_type("C", p->ct);
    bd[nb++] = em_lang_bind_type("O", ot);
    bd[nb++] = em_lang_bind_int("R", p->R);
    bd[nb++] = em_lang_bind_int("BK", c->bk);
    bd[nb++] = em_lang_bind_bool("RAW", split > 1 && !skl);
    bd[nb++] = em_lang_bind_bool("BIAS", p->bias != NULL);
    bd[nb++] = em_lang_bind_int("ACT", p->act);
    bd[nb++] = em_lang_bind_bool("RES", p->res != NULL);
    uint32_t units[3] = {1, 1, 1};
    if (mma) {
        bd[nb++] = em_lang_bind_int("WARPS_M", c->tm);
        bd[nb++] = em_lang_bind_int("WARPS_N", c->tn);
        bd[nb++] = em_lang_bind_int("PLANE", plane);
        bd[nb++] = em_lang_bind_bool("LOOPS", !p->caps || strcmp(p->caps->target, "cuda") != 0);
        mm_mma_plan q;
        if (!mm_mma_plan_of(p, c, &q)) {
            em_release(part);
            return em_set_error(EM_ERR_INVALID, "matmul: no mma plan for this configuration");
        }
        bd[nb++] = em_lang_bind_int("FM", q.fm);
        bd[nb++] = em_lang_bind_int("FN", q.fn);
        bd[nb++] = em_lang_bind_int("STAGES", q.stages);
        bd[nb++] = em_lang_bind_bool("AT", q.at);
        bd[nb++] = em_lang_bind_bool("BT", q.bt);
        bd[nb++] = em_lang_bind_int("VA", q.va);
        bd[nb++] = em_lang_bind_int("VB", q.vb);
        units[0] = (uint32_t)(c->tm * c->tn) * plane;
    } else if (wg) {
        mm_wgmma_plan q = wgq;
        bd[nb++] = em_lang_bind_int("WG", c->tm);
        bd[nb++] = em_lang_bind_int("BN", c->bn);
        bd[nb++] = em_lang_bind_int("STAGES", q.stages);
        bd[nb++] = em_lang_bind_bool("AT", q.at);
        bd[nb++] = em_lang_bind_bool("BT", q.bt);
        bd[nb++] = em_lang_bind_bool("LOOPS", !p->caps || strcmp(p->caps->target, "cuda") != 0);
        /* the TMA producer keeps 40 registers a unit, 56 with b's column sums (BS: their loop
         * spilled at 40; the consumers' 224 then still hold 192 accumulators without spills) */
        if (q.ws) bd[nb++] = em_lang_bind_int("PREGS", q.regs ? (q.tma && !q.bs ? 40 : 56) : 0);
        if (q.tma) bd[nb++] = em_lang_bind_bool("AZ", q.az);
        if (q.tma) bd[nb++] = em_lang_bind_bool("BZ", q.bz);
        if (q.tma) bd[nb++] = em_lang_bind_bool("SEPI", q.sepi);
        if (q.tma) bd[nb++] = em_lang_bind_bool("PERSIST", q.persist);
        if (q.tma) bd[nb++] = em_lang_bind_bool("PING", q.ping);
        if (q.ping || q.mw > 1) bd[nb++] = em_lang_bind_int("MW", q.mw);
        if (q.cluster > 1) bd[nb++] = em_lang_bind_int("CL", q.cluster);
        if (q.pairs) {
            bd[nb++] = em_lang_bind_bool("PAIRS", true);
            bd[nb++] = em_lang_bind_int("OW", q.quads ? 4 : 2); /* outv as lines of 2 or 4 */
            if (q.rv) bd[nb++] = em_lang_bind_bool("RV", true);
            if (q.cs) bd[nb++] = em_lang_bind_bool("CS", true);
            if (q.pre) bd[nb++] = em_lang_bind_bool("PRE", true);
        }
        if (q.bs) bd[nb++] = em_lang_bind_bool("BS", true);
        if (last) bd[nb++] = em_lang_bind_bool("LAST", true);
        if (skl) bd[nb++] = em_lang_bind_bool("SKL", true);
        if (sk) bd[nb++] = em_lang_bind_bool("SK", true);
        units[0] = (uint32_t)q.units;
    } else if (c->kind == MM_CPU) {
        bd[nb++] = em_lang_bind_int("BM", c->bm);
        bd[nb++] = em_lang_bind_int("BN", c->bn);
        bd[nb++] = em_lang_bind_int("MR", c->tm);
        bd[nb++] = em_lang_bind_int("NR", c->tn);
        bd[nb++] = em_lang_bind_int("W", c->lanes);
        bd[nb++] = em_lang_bind_bool("FMA", em_scalar_is_float(p->ct) && mm_cpu_fma());
    } else {
        bd[nb++] = em_lang_bind_int("BM", c->bm);
        bd[nb++] = em_lang_bind_int("BN", c->bn);
        bd[nb++] = em_lang_bind_int("TM", c->tm);
        bd[nb++] = em_lang_bind_int("TN", c->tn);
        /* unrolled register blocking for CUDA; loops the compiler vectorizes elsewhere */
        bd[nb++] = em_lang_bind_bool("LOOPS", !p->caps || strcmp(p->caps->target, "cuda") != 0);
        units[0] = (uint32_t)((c->bm / c->tm) * (c->bn / c->tn));
    }
    em_tensor *maps = NULL; /* the maps' own tensor while recording */
    tn_arg mapa[2];
    bool tma = wg && wgq.tma;
    if (tma && !mm_tma_maps(p, c, &wgq, mapa, &maps)) {
        em_release(part);
        return em_error_context("matmul");
    }
    /* the TMA kernel's 16-byte stores: out's (or the partials') buffer as lines of 8 (of 2 or 4
     * for its pairs) */
    tn_arg outv = tn_arg_flat(outa.t);
    outv.lanes = wgq.quads ? 4 : wgq.pairs ? 2 : 8;
    outv.offset = 0;
    /* the kernel's csum, out's buffer standing in without: CS, the result's column sums'
     * partials, f32 [batch ceil(M / 64 mw), N]; BS, b's, f32 [split ceil(M / tile rows), N] (a
     * consumer's rows, a cube's tile's rows; the two never together) */
    em_tensor *csp = NULL;
    if (tma && (wgq.cs || wgq.bs)) {
        int64_t rows = 64 * (int64_t)wgq.mw * (wgq.cs || wgq.ping ? 1 : c->tm);
        int64_t csh[2] = {(wgq.cs ? p->batch : split) * ((p->M + rows - 1) / rows), p->N};
        csp = tn_new(p->dev, EM_F32, 2, csh);
        if (!csp) {
            em_release(part);
            em_release(maps);
            return em_error_context("matmul");
        }
    }
    /* PRE: the value before the activation, as lines of 4 (out's buffer stands in without) */
    const em_tensor *pre = tma && wgq.pre ? p->pre : outa.t;
    tn_arg args[20] = {
        tn_arg_geom(p->a, p->R, p->ash, p->ast, p->a->offset),
        tn_arg_geom(p->b, p->R, p->bsh, p->bst, p->b->offset), outa, bias_arg(p), res_arg(p),
        tn_arg_s(em_arg_u32((uint32_t)kchunk)), tn_arg_s(em_arg_u32((uint32_t)split)),
        tn_arg_s(em_arg_u32((akfast ? 1u : 0u) | (bnfast ? 2u : 0u))),
        tma ? mapa[0] : tn_arg_s(em_arg_u32(0)), tma ? mapa[1] : tn_arg_s(em_arg_u32(0)), outv,
        tn_arg_s(tn_flat_buffer(csp ? csp : outa.t, EM_F32, 1)), tn_arg_s(em_arg_u32(0)),
        tn_arg_s(tn_flat_buffer(pre, ot, 4)), tn_arg_s(em_arg_u32((uint32_t)pre->offset)),
        /* LAST and SKL: the counters; LAST: b_sums; SKL: the partials (out's buffer standing in
         * without) */
        tn_arg_s(cnt ? em_arg_buffer(cnt, EM_DEVICE_COUNTERS) : tn_flat_buffer(outa.t, EM_U32, 1)),
        tn_arg_s(em_arg_u32(0)), tn_arg_flat(last ? p->bsum : outa.t),
        tn_arg_s(tn_flat_buffer(skl ? part : outa.t, EM_F32, 4)), tn_arg_s(em_arg_u32(0))};
    uint32_t cubes[3] = {(uint32_t)((p->N + c->bn - 1) / c->bn),
                         (uint32_t)((p->M + c->bm - 1) / c->bm), (uint32_t)(p->batch * split)};
    if (wg && wgq.persist) {
        /* persistent: one cube per compute unit (at most one per tile), looping over tiles; with
         * clusters of cl cubes on cl row tiles, one cluster per cl compute units */
        uint64_t cl = (uint64_t)wgq.cluster;
        uint64_t tiles = (uint64_t)cubes[0] * ((cubes[1] + cl - 1) / cl) * cubes[2];
        uint64_t cus = p->caps && p->caps->compute_units ? p->caps->compute_units : 1;
        uint64_t most = cus / cl ? cus / cl : 1;
        cubes[0] = (uint32_t)((tiles < most ? tiles : most) * cl);
        /* stream-K: every worker, each with its share of all tiles' k steps */
        if (sk) cubes[0] = (uint32_t)(mm_sk_workers(p, c, &wgq) * (int64_t)cl);
        cubes[1] = cubes[2] = 1;
    }
    const char *kname = mma                 ? "matmul_mma"
                        : tma               ? "matmul_wgmma_tma"
                        : wg && wgq.ws      ? "matmul_wgmma_ws"
                        : wg                ? "matmul_wgmma"
                        : c->kind == MM_CPU ? "matmul_cpu"
                                            : "matmul_simt";
    em_status st = tn_launch("matmul", p->dev, kname, bd, nb, 1, cubes, units, args, tma ? 20 : 8);
    if (st == EM_OK && split > 1 && !skl) st = launch_reduce(p, part, split);
    if (st == EM_OK && csp && !last)
        st = tn_cols_sum_rows("matmul", csp, wgq.bs ? p->bsum : p->colsum);
    *cs = csp && !wgq.bs;
    *bs = csp && wgq.bs;
    em_release(csp);
    em_release(part);
    em_release(maps);
    return st;
}
