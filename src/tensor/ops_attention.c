/* ops_attention.c — fused scaled-dot-product attention (issue #13): em_attention and its gradient
 * em_attention_backward, through src/kernels/tensor_attention.ek. The forward keeps no scores or
 * probabilities: it writes the output and one log-sum-exp per query row (f32, f64 for f64 inputs),
 * which the op records as a fourth, non-differentiable input so that the backward can recompute
 * the probabilities tile by tile (in the SIMT kernels, or on the matrix units where the forward
 * runs there; EMBER_ATTENTION_BWD=matmul recomputes them instead as one [Tq, Tk] block through
 * tensor-core matmuls, for comparison). The kernels read [B, H, T, D] views with any
 * strides whose last dim is contiguous (as GPT's heads are: views of the fused qkv projection), so
 * nothing is copied then; other views are made contiguous first. docs/attention.md says more. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/tensor_grad.h"
#include "tensor/internal.h"
#include "tensor/matmul_internal.h"

enum {
    ATTN_MAX_D = EM_ATTENTION_MAX_HEAD_DIM, /* the largest head size the kernels take */
    ATTN_CUBE = 64,                         /* units (rows) per cube */
    ATTN_SHARED = 16384 /* bytes of shared memory the staged tiles of one kernel may take */
};

/* The comptime size of the per-unit row arrays for head size d: 64, 128 or 256. */
static unsigned attn_dmax(int64_t d)
{
    return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

/* Rows of the other side staged at once: two tiles of TILE x DMAX elements in ATTN_SHARED. */
static unsigned attn_tile(em_scalar dt, unsigned dmax)
{
    unsigned t = ATTN_SHARED / (2 * dmax * (unsigned)em_scalar_size(dt));
    return t > 64 ? 64 : t < 4 ? 4 : t;
}

/* Checks q [B, H, Tq, D], k and v [B, H, Tk, D]: float, one dtype and device, D <= ATTN_MAX_D,
 * Tk >= 1, Tq <= Tk when causal, sizes that fit the kernels' u32 indexing. */
static bool check_qkv(const char *op, const em_tensor *q, const em_tensor *k, const em_tensor *v,
                      bool causal, double scale)
{
    char a[96], b[96], c[96];
    em_describe(q, a, sizeof a);
    em_describe(k, b, sizeof b);
    em_describe(v, c, sizeof c);
    if (q->rank != 4 || k->rank != 4 || v->rank != 4 || !em_scalar_is_float(q->dtype) ||
        k->dtype != q->dtype || v->dtype != q->dtype) {
        em_set_error(EM_ERR_INVALID,
                     "%s: q %s, k %s and v %s do not match (expected float tensors of one dtype, "
                     "q [B, H, Tq, D], k and v [B, H, Tk, D])",
                     op, a, b, c);
        return false;
    }
    bool same = k->shape[0] == q->shape[0] && k->shape[1] == q->shape[1] &&
                k->shape[3] == q->shape[3] && v->shape[0] == q->shape[0] &&
                v->shape[1] == q->shape[1] && v->shape[2] == k->shape[2] &&
                v->shape[3] == q->shape[3];
    if (!same) {
        em_set_error(EM_ERR_INVALID,
                     "%s: q %s, k %s and v %s do not match (expected q [B, H, Tq, D], k and v "
                     "[B, H, Tk, D])",
                     op, a, b, c);
        return false;
    }
    if (!tn_same_device(op, q, k) || !tn_same_device(op, q, v)) return false;
    int64_t D = q->shape[3], Tq = q->shape[2], Tk = k->shape[2];
    if (D < 1 || D > ATTN_MAX_D) {
        em_set_error(EM_ERR_INVALID, "%s: head size %lld of q %s is outside 1..%d", op,
                     (long long)D, a, ATTN_MAX_D);
        return false;
    }
    if (Tk < 1) {
        em_set_error(EM_ERR_INVALID, "%s: k %s has no keys (q %s)", op, b, a);
        return false;
    }
    if (causal && Tq > Tk) {
        em_set_error(EM_ERR_INVALID,
                     "%s: causal attention needs no more queries than keys, got q %s and k %s", op,
                     a, b);
        return false;
    }
    if (!isfinite(scale)) {
        em_set_error(EM_ERR_INVALID, "%s: scale must be finite, got %g", op, scale);
        return false;
    }
    int64_t bh = q->shape[0] * q->shape[1], big = Tq > Tk ? Tq : Tk;
    if (bh > 65535 || big * bh * D > (int64_t)INT32_MAX) {
        em_set_error(EM_ERR_INVALID, "%s: q %s and k %s are too large for one launch", op, a, b);
        return false;
    }
    return true;
}

em_tensor *tn_attn_view(const em_tensor *t)
{
    size_t elems = t->st->bytes / em_scalar_size(t->dtype);
    if ((t->stride[3] == 1 || t->shape[3] == 1) && elems <= UINT32_MAX) {
        em_tensor *v = tn_view(t, t->rank, t->shape, t->stride, t->offset);
        if (v && tn_realize(v) != EM_OK) {
            em_release(v);
            return NULL;
        }
        return v;
    }
    return tn_contig(t);
}

/* The bindings every attention kernel takes (the delta kernel only the first two). */
static size_t attn_binds(em_device *dev, em_scalar dt, int64_t D, em_lang_bind *bind)
{
    em_scalar ct = tn_compute_type(dt);
    unsigned dmax = attn_dmax(D);
    bind[0] = em_lang_bind_type("T", dt);
    bind[1] = em_lang_bind_type("C", ct);
    bind[2] = em_lang_bind_type("M", tn_math_type(dev, ct));
    bind[3] = em_lang_bind_int("DMAX", dmax);
    bind[4] = em_lang_bind_int("TILE", attn_tile(dt, dmax));
    bind[5] = em_lang_bind_int("CUBE", ATTN_CUBE);
    return 6;
}

/* The grid of a kernel with a unit per row of n rows in each of bh heads. */
static void attn_grid(int64_t n, int64_t bh, uint32_t cubes[3], uint32_t units[3])
{
    cubes[0] = (uint32_t)((n + ATTN_CUBE - 1) / ATTN_CUBE);
    cubes[1] = (uint32_t)bh;
    cubes[2] = 1;
    units[0] = ATTN_CUBE;
    units[1] = units[2] = 1;
}

/* The kernels a forward and backward run: the SIMT ones (every dtype, D and target), the
 * matrix-op ones (tensor_attention_*_mma: WMMA fragments) or the warpgroup-MMA ones
 * (tensor_attention_wgmma.ek: Hopper's wgmma). */
typedef enum attn_path { ATTN_SIMT, ATTN_MMA, ATTN_WGMMA } attn_path;

/* The tiles of the wgmma kernels: per kernel the warpgroups of a cube (64 rows each: queries for
 * the forward and dq, keys for dk/dv) and the keys (forward, dq) or queries (dk/dv) per streamed
 * tile. EMBER_ATTENTION_TILES="FWD_WG:FWD_BK:KV_WG:KV_BQ:Q_WG:Q_BK" replaces them (benchmarks;
 * warpgroups 1 to 4, tiles multiples of 16 up to 256 for the forward and 128 otherwise). */
typedef struct attn_tiles {
    int fwd_wg, fwd_bk, kv_wg, kv_bq, q_wg, q_bk;
} attn_tiles;

static attn_tiles attn_tiles_get(int64_t D)
{
    /* head size 64: one warpgroup a cube (on an H100 in session 16 the forward ran 1.24x and the
     * backward 1.07x faster than with two, docs/benchmarks.md: more cubes hide each other's
     * softmax), key tiles of 64 for the forward (96 registers and 41 KiB a cube, where 128 took
     * 128 and 73 KiB) and query tiles of 48 for dk/dv (150 registers: three cubes a
     * multiprocessor where 64 took 180 and two): on an H100 in session 23 the forward 0.119
     * against 0.127 ms and the backward 0.388 against 0.401 (GPT-2's b16 x 12 x 1024 x 64);
     * 128: two, since one warpgroup's dk/dv at 255 registers spills */
    attn_tiles t = D <= 64 ? (attn_tiles){1, 64, 1, 48, 1, 64} : (attn_tiles){2, 128, 2, 64, 2, 64};
    const char *env = getenv("EMBER_ATTENTION_TILES");
    attn_tiles e;
    if (env && sscanf(env, "%d:%d:%d:%d:%d:%d", &e.fwd_wg, &e.fwd_bk, &e.kv_wg, &e.kv_bq, &e.q_wg,
                      &e.q_bk) == 6) {
        int wg[3] = {e.fwd_wg, e.kv_wg, e.q_wg}, tile[3] = {e.fwd_bk, e.kv_bq, e.q_bk};
        bool ok = true;
        for (int i = 0; i < 3; i++)
            ok = ok && wg[i] >= 1 && wg[i] <= 4 && tile[i] >= 16 && tile[i] % 16 == 0 &&
                 tile[i] <= (i == 0 ? 256 : 128);
        if (ok) return e;
    }
    static atomic_bool warned; /* read at every launch: say it once */
    if (env && !atomic_exchange(&warned, true))
        em_log(EM_LOG_WARN,
               "EMBER_ATTENTION_TILES='%s' is not FWD_WG:FWD_BK:KV_WG:KV_BQ:Q_WG:Q_BK with 1 to 4 "
               "warpgroups and tiles that are multiples of 16 up to 256 (forward) or 128; using "
               "the defaults",
               env);
    return t;
}

void tn_attention_tiles(int64_t D, char *out, size_t size)
{
    attn_tiles t = attn_tiles_get(D);
    snprintf(out, size, "%d:%d:%d:%d:%d:%d", t.fwd_wg, t.fwd_bk, t.kv_wg, t.kv_bq, t.q_wg, t.q_bk);
}

/* Whether the wgmma backward takes one fused pass (tensor_attention_bwd_kv_wgmma with DQ: dq
 * summed in f32 by the copy engine's bulk reductions, then rounded by tensor_attention_dq_finish)
 * instead of a second pass for dq: with EMBER_ATTENTION_FUSED_BWD=1, where both dq and dk / dv
 * are wanted and the dk/dv cubes are one warpgroup with query tiles of 64. Off by default: on an
 * H100 (session 23, docs/benchmarks.md) the fused backward of GPT-2's attention took 0.478 ms
 * against the two passes' 0.407, and the training step 38.01 ms against 37.80. */
static bool attn_fused_bwd(const attn_tiles *t)
{
    const char *env = getenv("EMBER_ATTENTION_FUSED_BWD");
    return env && !strcmp(env, "1") && t->kv_bq == 64 && t->kv_wg == 1;
}

/* Bytes of shared memory the largest of the wgmma kernels takes for head size d (2-byte
 * elements), with up to 1 KiB per shared array that the CUDA generator spends aligning them.
 * Forward: Q, two stages of K and V, the row-reduction scratch. dk/dv: K, V, two stages of Q and
 * dO, two stages of lse and delta, and where the fused backward runs dS^T and dQ. dq: Q, dO, two
 * stages of K and V. (P, P^T and dS stay in registers as the A operands of the next MMA.) */
static size_t attn_wgmma_smem(int64_t d, const attn_tiles *t)
{
    size_t e = 2, dd = (size_t)d;
    size_t fwd = (64 * (size_t)t->fwd_wg * dd + 4 * (size_t)t->fwd_bk * dd) * e +
                 128 * (size_t)t->fwd_wg * 4 + 4 * 1024;
    size_t kv = (2 * 64 * (size_t)t->kv_wg * dd + 4 * (size_t)t->kv_bq * dd) * e +
                4 * (size_t)t->kv_bq * 4 + 6 * 1024;
    /* the fused backward's dS^T and f32 dQ tile (rows of D + 8), where it runs */
    if (attn_fused_bwd(t))
        kv += 64 * ((size_t)t->kv_wg * (size_t)t->kv_bq * e + (dd + 8) * 4) + 2 * 1024;
    size_t dq = (2 * 64 * (size_t)t->q_wg * dd + 4 * (size_t)t->q_bk * dd) * e + 4 * 1024;
    size_t most = fwd > kv ? fwd : kv;
    return most > dq ? most : dq;
}

/* Which kernels run for dtype dt and head size D on dev. f16/bf16 at D 64 or 128 take the
 * warpgroup-MMA kernels where the device runs them natively (mm_wgmma_native: CUDA on sm_90a) and
 * their shared memory fits, the matrix-op kernels elsewhere on CUDA, SIMT otherwise and for other
 * dtypes and head sizes. EMBER_ATTENTION=wgmma forces the wgmma kernels also on the CPU (which
 * emulates them: tests), EMBER_ATTENTION=mma the matrix-op kernels wherever the device has matrix
 * ops or planes of one unit (the CPU and PoCL run the fragments as loops), EMBER_ATTENTION=simt
 * the SIMT kernels. */
static attn_path attn_pick(em_device *dev, em_scalar dt, int64_t D)
{
    if ((dt != EM_F16 && dt != EM_BF16) || (D != 64 && D != 128)) return ATTN_SIMT;
    const char *env = getenv("EMBER_ATTENTION");
    const em_caps *c = em_device_caps(dev);
    if (!c || (env && !strcmp(env, "simt"))) return ATTN_SIMT;
    attn_tiles t = attn_tiles_get(D);
    int wg = t.fwd_wg > t.kv_wg ? t.fwd_wg : t.kv_wg;
    wg = wg > t.q_wg ? wg : t.q_wg;
    bool fits = attn_wgmma_smem(D, &t) <= c->max_shared && 128u * (unsigned)wg <= c->max_cube_units;
    bool wg_ok = fits && (mm_wgmma_native(c) || !strcmp(c->target, "c"));
    if (env && !strcmp(env, "wgmma") && wg_ok) return ATTN_WGMMA;
    /* fragments run as loops only where a plane is one unit */
    if (env && !strcmp(env, "mma")) return c->matrix || c->plane_dim <= 1 ? ATTN_MMA : ATTN_SIMT;
    if (fits && mm_wgmma_native(c)) return ATTN_WGMMA;
    return c->matrix && !strcmp(c->target, "cuda") ? ATTN_MMA : ATTN_SIMT;
}

bool tn_attention_fast(em_device *dev, em_scalar dt, int64_t D)
{
    const char *env = getenv("EMBER_ATTENTION");
    if (env && !strcmp(env, "fused")) return true; /* tests: layers always take the op */
    return attn_pick(dev, dt, D) != ATTN_SIMT;
}

bool em_attention_fast(const em_tensor *q)
{
    return q && q->rank == 4 && tn_attention_fast(q->st->dev, q->dtype, q->shape[3]);
}

static bool attn_rows_aligned(const em_tensor *t, int64_t v);

/* Forward into out (q's shape: contiguous, or any view whose last dim is) and lse ([B, H, Tq] in
 * the compute type). */
static em_status attn_forward(const char *op, const em_tensor *q, const em_tensor *k,
                              const em_tensor *v, bool causal, double scale, em_tensor *out,
                              em_tensor *lse)
{
    em_device *dev = q->st->dev;
    int64_t Tq = q->shape[2], D = q->shape[3], bh = q->shape[0] * q->shape[1];
    em_tensor *qc = tn_attn_view(q), *kc = qc ? tn_attn_view(k) : NULL;
    em_tensor *vc = kc ? tn_attn_view(v) : NULL;
    em_status st = em_last_status();
    if (vc) {
        attn_path path = attn_pick(dev, q->dtype, D);
        bool mma = path != ATTN_SIMT;
        const char *name = path == ATTN_WGMMA ? "tensor_attention_fwd_wgmma"
                           : mma              ? "tensor_attention_fwd_mma"
                                              : "tensor_attention_fwd";
        em_scalar ct = mma ? EM_F32 : tn_compute_type(q->dtype); /* the scale's type */
        tn_arg args[7] = {tn_arg_t(qc),
                          tn_arg_t(kc),
                          tn_arg_t(vc),
                          tn_arg_t(out),
                          tn_arg_flat(lse),
                          tn_arg_s(em_arg_u32(causal)),
                          tn_arg_s(tn_scalar_arg(ct, scale))};
        em_lang_bind bind[8];
        size_t nb;
        uint32_t cubes[3], units[3];
        if (path == ATTN_WGMMA) {
            const em_caps *caps = em_device_caps(dev);
            attn_tiles t = attn_tiles_get(D);
            bool vec = attn_rows_aligned(qc, 8) && attn_rows_aligned(kc, 8) &&
                       attn_rows_aligned(vc, 8); /* 16-byte tile copies */
            bind[0] = em_lang_bind_type("T", q->dtype);
            bind[1] = em_lang_bind_type("M", tn_math_type(dev, EM_F32));
            bind[2] = em_lang_bind_int("D", (int64_t)D);
            bind[3] = em_lang_bind_int("WG", t.fwd_wg);
            bind[4] = em_lang_bind_int("BK", t.fwd_bk);
            bind[5] = em_lang_bind_int("PLANE", caps && caps->plane_dim ? caps->plane_dim : 1);
            bind[6] = em_lang_bind_int("V", vec ? 8 : 1);
            /* tile j + 1's scores before tile j's P V (EMBER_ATTENTION_FWD_PIPE=1: opt-in; 2 %
             * slower than the default on an H100 in session 27, docs/benchmarks.md) */
            const char *pipe = getenv("EMBER_ATTENTION_FWD_PIPE");
            bind[7] = em_lang_bind_bool("PIPE", pipe && !strcmp(pipe, "1"));
            nb = 8;
            cubes[0] = (uint32_t)((Tq + 64 * t.fwd_wg - 1) / (64 * t.fwd_wg));
            cubes[1] = (uint32_t)bh, cubes[2] = 1;
            units[0] = 128 * (uint32_t)t.fwd_wg, units[1] = units[2] = 1;
        } else if (mma) {
            const em_caps *caps = em_device_caps(dev);
            unsigned plane = caps && caps->plane_dim ? caps->plane_dim : 1;
            bind[0] = em_lang_bind_type("T", q->dtype);
            bind[1] = em_lang_bind_type("S", q->dtype);
            bind[2] = em_lang_bind_type("M", tn_math_type(dev, EM_F32));
            bind[3] = em_lang_bind_int("D", (int64_t)D);
            bind[4] = em_lang_bind_int("PLANE", plane);
            bool vec = attn_rows_aligned(qc, 8) && attn_rows_aligned(kc, 8) &&
                       attn_rows_aligned(vc, 8); /* 16-byte tile copies */
            bind[5] = em_lang_bind_int("V", vec ? 8 : 1);
            nb = 6;
            cubes[0] = (uint32_t)((Tq + 63) / 64), cubes[1] = (uint32_t)bh, cubes[2] = 1;
            units[0] = 4 * plane, units[1] = units[2] = 1;
        } else {
            nb = attn_binds(dev, q->dtype, D, bind);
            attn_grid(Tq, bh, cubes, units);
        }
        st = tn_launch(op, dev, name, bind, nb, 1, cubes, units, args, 7);
    }
    em_release(qc);
    em_release(kc);
    em_release(vc);
    return st;
}

em_tensor *em_attention(const em_tensor *q, const em_tensor *k, const em_tensor *v, bool causal,
                        double scale)
{
    const char *op = "attention";
    em_tensor *out = NULL, *lse = NULL;
    if (!q || !k || !v) goto done;
    if (!check_qkv(op, q, k, v, causal, scale)) goto done;
    out = tn_new(q->st->dev, q->dtype, 4, q->shape);
    lse = out ? tn_new(q->st->dev, tn_compute_type(q->dtype), 3, q->shape) : NULL;
    if (!lse) {
        em_release(out);
        out = NULL;
        goto done;
    }
    if (em_numel(out) == 0) goto done;
    if (attn_forward(op, q, k, v, causal, scale, out, lse) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) {
        em_top_params p = {0};
        p.f[0] = scale;
        p.flag = causal;
        const em_tensor *in[4] = {q, k, v, lse};
        tn_record(EM_TOP_ATTENTION, &p, in, 4, out);
    }
    em_release(lse);
    tn_done(q);
    tn_done(k);
    tn_done(v);
    return out;
}

/* Whether every row of the [B, H, T, D] view t starts on a multiple of v elements, so that the
 * matrix-op backward may copy its tiles in chunks of v (device buffers start aligned). */
static bool attn_rows_aligned(const em_tensor *t, int64_t v)
{
    return t->stride[3] == 1 && t->shape[3] % v == 0 && t->offset % v == 0 &&
           t->stride[0] % v == 0 && t->stride[1] % v == 0 && t->stride[2] % v == 0;
}

/* tensor_attention_delta_lines into stats: 16-byte lines of do (g) and o, DL = D / lines units a
 * row, where the plane holds whole rows and every row starts on a line. EM_ERR_UNSUPPORTED
 * (nothing launched, no error set) where it cannot run: the plane kernel does. */
static em_status delta_lines(const char *op, em_device *dev, const em_tensor *g, const em_tensor *o,
                             const em_tensor *lse, em_tensor *stats)
{
    const em_caps *caps = em_device_caps(dev);
    const char *env = getenv("EMBER_ATTENTION_DELTA_LINES"); /* 0: the plane kernel (A/B) */
    bool off = env && strcmp(env, "0") == 0;
    int64_t esz = (int64_t)em_scalar_size(g->dtype), lw = 16 / esz, D = g->shape[3];
    int64_t dl = D % lw == 0 ? D / lw : 0, rows = g->shape[0] * g->shape[1] * g->shape[2];
    bool ok = caps->plane_ops && dl >= 1 && !(dl & (dl - 1)) && dl <= caps->plane_dim &&
              caps->plane_dim <= 64 && g->dtype == o->dtype && lw > 1 && !off &&
              rows * dl <= (int64_t)UINT32_MAX && attn_rows_aligned(g, lw) &&
              attn_rows_aligned(o, lw);
    if (!ok) return EM_ERR_UNSUPPORTED;
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)(rows * dl), cubes, units);
    uint32_t P = caps->plane_dim;
    if (units[0] % P) units[0] = (units[0] + P - 1) / P * P; /* whole planes, so whole rows */
    cubes[0] = (uint32_t)(((uint64_t)(rows * dl) + units[0] - 1) / units[0]);
    tn_arg args[4] = {tn_arg_t(g), tn_arg_t(o), tn_arg_flat(lse), tn_arg_flat(stats)};
    args[2].lanes = args[3].lanes = 1; /* scalars beside the lines */
    em_lang_bind b[3] = {em_lang_bind_type("T", g->dtype), em_lang_bind_type("C", em_dtype(stats)),
                         em_lang_bind_int("DL", (int64_t)dl)};
    return tn_launch(op, dev, "tensor_attention_delta_lines", b, 3, (unsigned)lw, cubes, units,
                     args, 4);
}

/* dq = dqa scale rounded to dq's dtype (tensor_attention_dq_finish), 16-byte lines of dq where its
 * rows allow them. */
static em_status attn_dq_finish(const char *op, em_device *dev, const em_tensor *dqa, em_tensor *gq,
                                double scale)
{
    int64_t lw = 16 / (int64_t)em_scalar_size(gq->dtype);
    if (!attn_rows_aligned(gq, lw)) lw = 1;
    uint64_t lines = (uint64_t)(em_numel(gq) / lw);
    uint32_t cubes[3], units[3];
    tn_grid_1d(lines, cubes, units);
    tn_arg args[3] = {tn_arg_flat(dqa), tn_arg_t(gq), tn_arg_s(em_arg_f32((float)scale))};
    em_lang_bind b[1] = {em_lang_bind_type("T", gq->dtype)};
    return tn_launch(op, dev, "tensor_attention_dq_finish", b, 1, (unsigned)lw, cubes, units, args,
                     3);
}

/* The tiled tensor-core backward (after tensor_attention_delta has filled stats): the
 * matrix-op kernels (tensor_attention_bwd_kv_mma for dk and dv, tensor_attention_bwd_q_mma for
 * dq: a cube of 4 planes per 64 keys or queries), or with wg the warpgroup-MMA ones
 * (tensor_attention_bwd_kv_wgmma, _bwd_q_wgmma: attn_tiles_get's warpgroups, 64 keys or queries
 * each). Copies the tiles 16 bytes at a time where q, k, v and dout allow it. */
static em_status attn_backward_mma(const char *op, em_tensor *const views[4], em_tensor *stats,
                                   bool causal, double scale, em_tensor *gq, em_tensor *gk,
                                   em_tensor *gv, bool wg)
{
    const em_tensor *q = views[0], *k = views[1];
    em_device *dev = q->st->dev;
    const em_caps *caps = em_device_caps(dev);
    unsigned plane = caps && caps->plane_dim ? caps->plane_dim : 1;
    bool vec = true;
    for (int i = 0; i < 4; i++) vec = vec && attn_rows_aligned(views[i], 8);
    em_lang_bind bind[6] = {em_lang_bind_type("T", q->dtype),
                            em_lang_bind_type("S", q->dtype),
                            em_lang_bind_type("M", tn_math_type(dev, EM_F32)),
                            em_lang_bind_int("D", q->shape[3]),
                            em_lang_bind_int("PLANE", plane),
                            em_lang_bind_int("V", vec ? 8 : 1)};
    attn_tiles t = attn_tiles_get(q->shape[3]);
    bool fused = wg && gq && gk && attn_fused_bwd(&t);
    em_lang_bind wbind[7] = {
        em_lang_bind_type("T", q->dtype),   em_lang_bind_type("M", tn_math_type(dev, EM_F32)),
        em_lang_bind_int("D", q->shape[3]), em_lang_bind_int("WG", t.kv_wg),
        em_lang_bind_int("BQ", t.kv_bq),    em_lang_bind_int("V", vec ? 8 : 1),
        em_lang_bind_bool("DQ", fused)};
    int64_t bh = q->shape[0] * q->shape[1], rows = wg ? 64 * t.kv_wg : 64;
    uint32_t cubes[3] = {0, (uint32_t)bh, 1};
    uint32_t units[3] = {wg ? 128 * (uint32_t)t.kv_wg : 4 * plane, 1, 1};
    tn_arg flag = tn_arg_s(em_arg_u32(causal)), sc = tn_arg_s(em_arg_f32((float)scale));
    tn_arg in[5] = {tn_arg_t(views[0]), tn_arg_t(views[1]), tn_arg_t(views[2]), tn_arg_t(views[3]),
                    tn_arg_flat(stats)};
    if (gk) {
        /* the fused pass's dq sums: f32 [B H, Tq, D], zeroed (without the fused pass the
         * kernel's dqa argument is stats, which it then does not touch) */
        int64_t dshape[1] = {bh * q->shape[2] * q->shape[3]};
        em_tensor *dqa = fused ? tn_new(dev, EM_F32, 1, dshape) : NULL;
        if (fused && (!dqa || tn_fill(dqa, 0) != EM_OK)) {
            em_release(dqa);
            return em_last_status();
        }
        /* the matrix-op kernel has no dqa: its arguments are the first 7 and the last 2 */
        tn_arg args[10] = {in[0], in[1], in[2], in[3], in[4], tn_arg_t(gk), tn_arg_t(gv)};
        if (wg) args[7] = tn_arg_flat(fused ? dqa : stats);
        args[wg ? 8 : 7] = flag;
        args[wg ? 9 : 8] = sc;
        cubes[0] = (uint32_t)((k->shape[2] + rows - 1) / rows);
        em_status st =
            tn_launch(op, dev, wg ? "tensor_attention_bwd_kv_wgmma" : "tensor_attention_bwd_kv_mma",
                      wg ? wbind : bind, wg ? 7 : 6, 1, cubes, units, args, wg ? 10 : 9);
        if (st == EM_OK && fused) st = attn_dq_finish(op, dev, dqa, gq, scale);
        em_release(dqa);
        if (st != EM_OK || fused) return st;
    }
    if (gq) {
        tn_arg args[8] = {in[0], in[1], in[2], in[3], in[4], tn_arg_t(gq), flag, sc};
        if (wg) {
            rows = 64 * t.q_wg;
            units[0] = 128 * (uint32_t)t.q_wg;
            wbind[3] = em_lang_bind_int("WG", t.q_wg);
            wbind[4] = em_lang_bind_int("BK", t.q_bk);
        }
        cubes[0] = (uint32_t)((q->shape[2] + rows - 1) / rows);
        return tn_launch(op, dev,
                         wg ? "tensor_attention_bwd_q_wgmma" : "tensor_attention_bwd_q_mma",
                         wg ? wbind : bind, 6, 1, cubes, units, args, 8);
    }
    return EM_OK;
}

/* Checks the backward's extra inputs against q (already checked with k and v). */
static bool check_backward(const char *op, const em_tensor *g, const em_tensor *q,
                           const em_tensor *out, const em_tensor *lse)
{
    char a[96], b[96], c[96], e[96];
    bool ok = g->rank == 4 && out->rank == 4 && lse->rank == 3 && g->dtype == q->dtype &&
              out->dtype == q->dtype && lse->dtype == tn_compute_type(q->dtype);
    for (int i = 0; ok && i < 4; i++)
        ok = g->shape[i] == q->shape[i] && out->shape[i] == q->shape[i] &&
             (i == 3 || lse->shape[i] == q->shape[i]);
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: grad %s, out %s and lse %s do not match q %s (expected the grad and out "
                     "of q's shape and dtype, lse [B, H, Tq] in f32, f64 for f64)",
                     op, em_describe(g, a, sizeof a), em_describe(out, b, sizeof b),
                     em_describe(lse, c, sizeof c), em_describe(q, e, sizeof e));
        return false;
    }
    return tn_same_device(op, q, g) && tn_same_device(op, q, out) && tn_same_device(op, q, lse);
}

/* The backward through public ops (EMBER_ATTENTION_BWD=matmul where the forward uses the matrix
 * units; kept to measure the tiled kernels against): the probabilities of the whole [Tq, Tk]
 * block are recomputed from q, k and lse with public ops (matmuls on the tensor cores, the
 * elementwise steps fused) and dropped at the end, so only this layer's backward holds them, for
 * a moment: p = exp(q k^T scale - lse) (0 where masked), dv = p^T do,
 * ds = p (do v^T - delta) scale with delta = rowsum(do o), dq = ds k, dk = ds^T q. */
static em_status attn_backward_matmul(const char *op, const em_tensor *g, const em_tensor *q,
                                      const em_tensor *k, const em_tensor *v, const em_tensor *out,
                                      const em_tensor *lse, bool causal, double scale,
                                      em_tensor **dq, em_tensor **dk, em_tensor **dv)
{
    em_device *dev = q->st->dev;
    int64_t Tq = q->shape[2], Tk = k->shape[2];
    em_scalar dt = q->dtype, ct = lse->dtype;
    em_tensor *res[3] = {NULL, NULL, NULL};
    em_scope_begin();
    em_tensor *s = em_matmul(q, em_transpose(k, 2, 3)); /* [B, H, Tq, Tk] */
    em_tensor *x = em_sub(em_mul_scalar(em_cast(s, ct), scale), em_unsqueeze(lse, -1));
    em_tensor *p = em_exp(x);
    if (causal && p) { /* key j is hidden from query i when j > i + Tk - Tq */
        em_tensor *rows =
            em_reshape(em_arange(dev, EM_I64, (double)(Tk - Tq), (double)Tk, 1), EM_SHAPE(Tq, 1));
        p = em_masked_fill(p, em_gt(em_arange(dev, EM_I64, 0, (double)Tk, 1), rows), 0);
    }
    em_tensor *pt = em_cast(p, dt);
    em_tensor *delta = em_sum(em_mul(em_cast(g, ct), em_cast(out, ct)), (const int[]){3}, 1, true);
    em_tensor *dp = em_cast(em_matmul(g, em_transpose(v, 2, 3)), ct);
    em_tensor *ds = em_cast(em_mul_scalar(em_mul(p, em_sub(dp, delta)), scale), dt);
    if (dq) res[0] = em_matmul(ds, k);
    if (dk) res[1] = em_matmul(em_transpose(ds, 2, 3), q);
    if (dv) res[2] = em_matmul(em_transpose(pt, 2, 3), g);
    bool ok = (!dq || res[0]) && (!dk || res[1]) && (!dv || res[2]);
    em_scope_end(res, 3);
    if (!ok) {
        for (int i = 0; i < 3; i++) em_release(res[i]);
        return em_error_context("%s", op);
    }
    if (dq) *dq = res[0];
    if (dk) *dk = res[1];
    if (dv) *dv = res[2];
    return EM_OK;
}

/* em_attention_backward; with `into` (three views of q's, k's and v's shapes), the gradients are
 * written into those instead of new tensors, and *dq, *dk, *dv receive new references to them. */
static em_status attn_backward(const char *op, const em_tensor *grad_out, const em_tensor *q,
                               const em_tensor *k, const em_tensor *v, const em_tensor *out,
                               const em_tensor *lse, bool causal, double scale,
                               em_tensor *const *into, em_tensor **dq, em_tensor **dk, em_tensor **dv)
{
    if (dq) *dq = NULL;
    if (dk) *dk = NULL;
    if (dv) *dv = NULL;
    if (!grad_out || !q || !k || !v || !out || !lse) {
        if (em_last_status() == EM_OK) em_set_error(EM_ERR_INVALID, "%s: NULL input", op);
        return em_last_status();
    }
    if (!check_qkv(op, q, k, v, causal, scale) || !check_backward(op, grad_out, q, out, lse))
        return em_last_status();
    em_device *dev = q->st->dev;
    em_scalar dt = q->dtype, ct = tn_compute_type(dt);
    attn_path path = attn_pick(dev, dt, q->shape[3]);
    bool mma = path != ATTN_SIMT;
    const char *bwd = getenv("EMBER_ATTENTION_BWD");
    if (mma && bwd && !strcmp(bwd, "matmul") && q->shape[2] > 0 && q->shape[0] * q->shape[1] > 0) {
        em_status ms = attn_backward_matmul(op, grad_out, q, k, v, out, lse, causal, scale, dq, dk, dv);
        em_tensor **res[3] = {dq, dk, dv};
        for (int i = 0; into && ms == EM_OK && i < 3; i++) /* copied into the views asked for */
            if (res[i] && *res[i]) {
                ms = tn_copy_into(op, into[i], *res[i]);
                em_release(*res[i]);
                *res[i] = ms == EM_OK ? em_retain(into[i]) : NULL;
            }
        return ms;
    }
    int64_t B = q->shape[0], H = q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3];
    int64_t bh = B * H;
    em_tensor *gq = dq ? (into ? em_retain(into[0]) : tn_new(dev, dt, 4, q->shape)) : NULL;
    em_tensor *gk = dk || dv ? (into ? em_retain(into[1]) : tn_new(dev, dt, 4, k->shape)) : NULL;
    em_tensor *gv = dk || dv ? (into ? em_retain(into[2]) : tn_new(dev, dt, 4, v->shape)) : NULL;
    int64_t sshape[4] = {B, H, Tq, 2};
    em_tensor *stats = tn_new(dev, ct, 4, sshape); /* lse and delta of each query row */
    em_tensor *qc = NULL, *kc = NULL, *vc = NULL, *gc = NULL, *oc = NULL, *lc = NULL;
    em_status st;
    if ((dq && !gq) || ((dk || dv) && (!gk || !gv)) || !stats) goto fail;
    if (bh * Tq == 0) goto zero; /* no queries: every gradient is zero */
    qc = tn_attn_view(q);
    kc = qc ? tn_attn_view(k) : NULL;
    vc = kc ? tn_attn_view(v) : NULL;
    gc = vc ? tn_attn_view(grad_out) : NULL;
    oc = gc ? tn_attn_view(out) : NULL;
    lc = oc ? tn_contig(lse) : NULL;
    if (!lc) goto fail;
    em_lang_bind bind[6];
    size_t nb = attn_binds(dev, dt, D, bind);
    uint32_t cubes[3], units[3];
    st = delta_lines(op, dev, gc, oc, lc, stats);
    if (st != EM_OK && st != EM_ERR_UNSUPPORTED) goto fail;
    if (st == EM_ERR_UNSUPPORTED) {
        /* a plane per query row where plane ops exist (coalesced reads), else a unit per row */
        const em_caps *caps = em_device_caps(dev);
        uint32_t P = caps->plane_ops && caps->plane_dim >= 4 && caps->plane_dim <= 64 &&
                             !(caps->plane_dim & (caps->plane_dim - 1))
                         ? caps->plane_dim
                         : 0;
        tn_arg args[4] = {tn_arg_t(gc), tn_arg_t(oc), tn_arg_flat(lc), tn_arg_flat(stats)};
        tn_grid_1d((uint64_t)(bh * Tq) * (P ? P : 1), cubes, units);
        if (P && units[0] % P) units[0] = (units[0] + P - 1) / P * P; /* whole planes */
        cubes[0] = (uint32_t)(((uint64_t)(bh * Tq) * (P ? P : 1) + units[0] - 1) / units[0]);
        em_lang_bind dbind[3] = {bind[0], bind[1], em_lang_bind_int("P", P)};
        st = tn_launch(op, dev, "tensor_attention_delta", dbind, 3, 1, cubes, units, args, 4);
        if (st != EM_OK) goto fail;
    }
    if (mma) {
        em_tensor *views[4] = {qc, kc, vc, gc};
        if (attn_backward_mma(op, views, stats, causal, scale, gq, gk, gv, path == ATTN_WGMMA) !=
            EM_OK)
            goto fail;
        goto finish;
    }
    tn_arg flag = tn_arg_s(em_arg_u32(causal)), sc = tn_arg_s(tn_scalar_arg(ct, scale));
    if (gk) {
        tn_arg args[9] = {tn_arg_t(qc),
                          tn_arg_t(kc),
                          tn_arg_t(vc),
                          tn_arg_t(gc),
                          tn_arg_flat(stats),
                          tn_arg_t(gk),
                          tn_arg_t(gv),
                          flag,
                          sc};
        attn_grid(Tk, bh, cubes, units);
        st = tn_launch(op, dev, "tensor_attention_bwd_kv", bind, nb, 1, cubes, units, args, 9);
        if (st != EM_OK) goto fail;
    }
    if (gq) {
        tn_arg args[8] = {tn_arg_t(qc),       tn_arg_t(kc), tn_arg_t(vc), tn_arg_t(gc),
                          tn_arg_flat(stats), tn_arg_t(gq), flag,         sc};
        attn_grid(Tq, bh, cubes, units);
        st = tn_launch(op, dev, "tensor_attention_bwd_q", bind, nb, 1, cubes, units, args, 8);
        if (st != EM_OK) goto fail;
    }
    goto finish;
zero:
    if ((gk && tn_fill(gk, 0) != EM_OK) || (gv && tn_fill(gv, 0) != EM_OK)) goto fail;
finish:
    st = EM_OK;
    if (dq) *dq = gq, gq = NULL;
    if (dk) *dk = gk, gk = NULL;
    if (dv) *dv = gv, gv = NULL;
    goto release;
fail:
    st = em_last_status() != EM_OK ? em_last_status()
                                   : em_set_error(EM_ERR_INTERNAL, "%s: failed", op);
release: /* the temporaries, and the gradients not handed out */
    em_release(qc);
    em_release(kc);
    em_release(vc);
    em_release(gc);
    em_release(oc);
    em_release(lc);
    em_release(stats);
    em_release(gq);
    em_release(gk);
    em_release(gv);
    return st;
}

em_status em_attention_backward(const em_tensor *grad_out, const em_tensor *q, const em_tensor *k,
                                const em_tensor *v, const em_tensor *out, const em_tensor *lse,
                                bool causal, double scale, em_tensor **dq, em_tensor **dk,
                                em_tensor **dv)
{
    return attn_backward("attention backward", grad_out, q, k, v, out, lse, causal, scale, NULL, dq, dk, dv);
}

em_status tn_attention_backward_into(const char *op, const em_tensor *grad_out, const em_tensor *q,
                                     const em_tensor *k, const em_tensor *v, const em_tensor *out,
                                     const em_tensor *lse, bool causal, double scale, em_tensor *dq,
                                     em_tensor *dk, em_tensor *dv)
{
    em_tensor *into[3] = {dq, dk, dv}, *r[3] = {NULL, NULL, NULL};
    em_status st = attn_backward(op, grad_out, q, k, v, out, lse, causal, scale, into, &r[0], &r[1], &r[2]);
    for (int i = 0; i < 3; i++) em_release(r[i]);
    return st;
}

em_status tn_attention_forward_into(const char *op, const em_tensor *q, const em_tensor *k,
                                    const em_tensor *v, bool causal, double scale, em_tensor *out,
                                    em_tensor *lse)
{
    if (!check_qkv(op, q, k, v, causal, scale)) return em_last_status();
    if (em_numel(out) == 0) return EM_OK;
    return attn_forward(op, q, k, v, causal, scale, out, lse);
}
