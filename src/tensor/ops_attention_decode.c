/* ops_attention_decode.c — em_attention_decode: one query per (row, head) against cached keys
 * whose visible length each row reads from device memory (tensor_attention_decode.ek). A decode
 * step built on it keeps one shape however long its sequences grow, so it can be recorded once
 * and replayed (docs/graphs.md), and it is one launch (two where the keys are split over several
 * cubes: flash-decoding, docs/attention.md) where q k^T, the mask, the softmax and the product
 * with v were four. em_attention_decode_append also stores the rows' new keys and values into
 * the cache in that launch, and with a counter buffer merges the splits there too (the last cube
 * of each (row, head) to finish does it), where the target's atomics and fences make that safe. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/internal.h"

/* Units per cube on GPUs (a multiple of their planes) and on the CPU (one pool thread loops over
 * them); key/value lines of at most 16 bytes; a split takes at least DEC_SPLIT_KEYS keys, and
 * there are at most DEC_SPLIT_MAX splits. */
enum {
    DEC_CUBE = 128,
    DEC_CUBE_CPU = 16,
    DEC_LINE_BYTES = 16,
    DEC_SPLIT_KEYS = 32,
    DEC_SPLIT_MAX = 64
};

/* How the kernel runs for one shape on one device (nothing here depends on pos's values, so a
 * recorded step replays for every position). */
typedef struct dec_plan {
    unsigned v;      /* lanes of the key/value lines (LINE_WIDTH) */
    unsigned kl;     /* units reading one key row together (a power of two inside a plane) */
    unsigned uk;     /* key runs a step, their loads in flight together */
    unsigned cube;   /* units per cube */
    unsigned splits; /* cubes per (row, head): S, the partials merged (if > 1) by the last cube
                      * or by a second launch */
    uint32_t chunk;  /* keys per split */
} dec_plan;

/* The widest line (at most 16 bytes) that divides D, k's and v's strides and offsets, else 1. */
static unsigned dec_lanes(const em_tensor *k, const em_tensor *v, int64_t D)
{
    unsigned w = DEC_LINE_BYTES / (unsigned)em_scalar_size(k->dtype);
    for (; w > 1; w /= 2) {
        bool ok = D % w == 0 && k->offset % w == 0 && v->offset % w == 0;
        for (int d = 0; d < 3 && ok; d++) ok = k->stride[d] % w == 0 && v->stride[d] % w == 0;
        if (ok) return w;
    }
    return 1;
}

/* Splits of tk keys for bh (row, head) pairs: enough cubes for about two per compute unit, each
 * split DEC_SPLIT_KEYS keys or more; 1 when the pairs alone fill the device or the keys are few.
 * EMBER_ATTENTION_DECODE_SPLIT=S forces S (tests). */
static unsigned dec_splits(const em_caps *caps, int64_t bh, int64_t tk)
{
    const char *env = getenv("EMBER_ATTENTION_DECODE_SPLIT");
    int64_t s = env && *env ? atoll(env) : 0;
    if (s <= 0) {
        int64_t cus = caps->compute_units ? caps->compute_units : 1;
        if (bh >= cus || tk < 2 * DEC_SPLIT_KEYS) return 1;
        s = (2 * cus + bh - 1) / bh;
        if (s > tk / DEC_SPLIT_KEYS) s = tk / DEC_SPLIT_KEYS;
    }
    if (s > DEC_SPLIT_MAX) s = DEC_SPLIT_MAX;
    if (s > tk) s = tk;
    return s < 1 ? 1 : (unsigned)s;
}

static dec_plan dec_plan_of(em_device *dev, const em_tensor *k, const em_tensor *v, int64_t D,
                            int64_t bh)
{
    const em_caps *caps = em_device_caps(dev);
    bool cpu = !strcmp(caps->target, "c");
    dec_plan pl;
    pl.v = dec_lanes(k, v, D);
    pl.kl = 1;
    unsigned P = caps->plane_ops ? caps->plane_dim : 1, rowlines = (unsigned)D / pl.v;
    if (P >= 2 && P <= 64 && !(P & (P - 1)))
        while (pl.kl < P && pl.kl < rowlines) pl.kl *= 2;
    pl.uk = cpu ? 1 : 4;
    pl.cube = cpu ? DEC_CUBE_CPU : DEC_CUBE;
    /* whole planes where the groups shuffle */
    unsigned lo = pl.kl > 1 ? P : 1;
    if (pl.cube < lo) pl.cube = lo;
    size_t cs = em_scalar_size(tn_compute_type(k->dtype));
    /* the groups' statistics and accumulators in shared memory, within the device's limits */
    while (pl.cube > lo && (pl.cube > caps->max_cube_units ||
                            (pl.cube / pl.kl) * ((size_t)D + 2) * cs > caps->max_shared))
        pl.cube /= 2;
    int64_t tk = k->shape[2];
    pl.splits = dec_splits(caps, bh, tk);
    pl.chunk = (uint32_t)((tk + pl.splits - 1) / pl.splits);
    if (pl.chunk) pl.splits = (unsigned)((tk + pl.chunk - 1) / pl.chunk); /* no split past tk */
    return pl;
}

static bool dec_check(const char *op, const em_tensor *q, const em_tensor *k, const em_tensor *v,
                      const em_tensor *pos, double scale)
{
    char a[96], b[96], c[96], d[96];
    bool ok = q->rank == 4 && k->rank == 4 && v->rank == 4 && pos->rank == 1 &&
              em_scalar_is_float(q->dtype) && k->dtype == q->dtype && v->dtype == q->dtype &&
              pos->dtype == EM_I64 && q->shape[2] == 1 && pos->shape[0] == q->shape[0];
    for (int i = 0; ok && i < 4; i++)
        ok = (i == 2 || (k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i])) &&
             (i != 2 || v->shape[2] == k->shape[2]);
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: q %s, k %s, v %s and pos %s do not match (expected q [R, H, 1, D], k and "
                     "v [R, H, Tk, D] of q's float dtype, pos i64 [R])",
                     op, em_describe(q, a, sizeof a), em_describe(k, b, sizeof b),
                     em_describe(v, c, sizeof c), em_describe(pos, d, sizeof d));
        return false;
    }
    if (!tn_same_device(op, q, k) || !tn_same_device(op, q, v) || !tn_same_device(op, q, pos))
        return false;
    int64_t D = q->shape[3], bh = q->shape[0] * q->shape[1];
    if (D < 1 || D > EM_ATTENTION_MAX_HEAD_DIM) {
        em_set_error(EM_ERR_INVALID, "%s: head size %lld is not in 1..%d", op, (long long)D,
                     EM_ATTENTION_MAX_HEAD_DIM);
        return false;
    }
    if (!isfinite(scale)) {
        em_set_error(EM_ERR_INVALID, "%s: scale must be finite, got %g", op, scale);
        return false;
    }
    if (bh > 65535 || bh * D > (int64_t)INT32_MAX || k->shape[2] > (int64_t)INT32_MAX) {
        em_set_error(EM_ERR_INVALID, "%s: q %s and k %s are too large for one launch", op,
                     em_describe(q, a, sizeof a), em_describe(k, b, sizeof b));
        return false;
    }
    return true;
}

/* Whether the last cube of a (row, head) may merge the splits in the same launch on this
 * device: where a device-scope fence makes one cube's stores visible to the cube that sees its
 * atomic count (CUDA, and the CPU, whose cubes are threads of one process). OpenCL and Vulkan
 * keep the second launch: their plain global stores need not be visible to another cube inside
 * one launch. EMBER_ATTENTION_DECODE_COMBINE=launch forces the second launch, =last the merge
 * by the last cube on any target (tests on PoCL and lavapipe, whose cubes are CPU threads). */
static bool dec_last_ok(const em_caps *caps)
{
    const char *env = getenv("EMBER_ATTENTION_DECODE_COMBINE");
    if (env && !strcmp(env, "launch")) return false;
    if (env && !strcmp(env, "last")) return true;
    return !strcmp(caps->target, "c") || !strcmp(caps->target, "cuda");
}

/* What one launch reads and writes besides q, k, v, pos and out: the new keys and values to
 * append (NULL: none) and the split counters (NULL: a second launch merges). */
typedef struct dec_extra {
    const em_tensor *k_new, *v_new; /* [R, H, 1, D] for key position pos[r], or NULL */
    const em_tensor *counters;      /* u32/i32, R H zeros left zero, or NULL */
} dec_extra;

/* The launches: the partials kernel (writing out itself when there is one split, or when its
 * last cube per (row, head) merges), then, if needed, the combine kernel over a workspace of S
 * partials per (row, head). */
static em_status dec_launch(const char *op, em_device *dev, const em_tensor *q, const em_tensor *k,
                            const em_tensor *v, const em_tensor *pos, em_tensor *out, double scale,
                            const dec_extra *x)
{
    int64_t D = q->shape[3], bh = q->shape[0] * q->shape[1];
    dec_plan pl = dec_plan_of(dev, k, v, D, bh);
    em_scalar ct = tn_compute_type(q->dtype), mt = tn_math_type(dev, ct);
    /* the partials (one element, unused, for one split: the kernel takes a buffer of C) */
    bool split = pl.splits > 1, append = x->k_new != NULL;
    bool last = split && x->counters && dec_last_ok(em_device_caps(dev));
    int64_t n = split ? bh * pl.splits * (D + 2) : 1;
    em_tensor *part = tn_new(dev, ct, 1, &n);
    if (!part) return em_last_status();
    /* the cache's first keys and values before the dependency wait where it is settled (a decode
     * step's: only this kernel writes it, at pos); EMBER_ATTENTION_DECODE_PRELOAD=0 / 1 */
    const em_tensor *kv[2] = {k, v};
    em_lang_bind bind[11] = {
        em_lang_bind_type("T", q->dtype),
        em_lang_bind_type("C", ct),
        em_lang_bind_type("M", mt),
        em_lang_bind_int("D", D),
        em_lang_bind_int("KL", pl.kl),
        em_lang_bind_int("UK", pl.uk),
        em_lang_bind_int("CUBE", pl.cube),
        em_lang_bind_bool("SPLIT", split),
        em_lang_bind_bool("APPEND", append),
        em_lang_bind_bool("LAST", last),
        em_lang_bind_bool("PRE", tn_preload_ok(dev, "EMBER_ATTENTION_DECODE_PRELOAD", kv, 2))};
    /* without them, kn and vn are q and count is part: bound, never read */
    tn_arg args[11] = {tn_arg_t(q),
                       tn_arg_t(k),
                       tn_arg_t(v),
                       tn_arg_flat(out),
                       tn_arg_flat(part),
                       tn_arg_flat(pos),
                       tn_arg_s(tn_scalar_arg(ct, scale)),
                       tn_arg_s(em_arg_u32(pl.chunk)),
                       tn_arg_t(append ? x->k_new : q),
                       tn_arg_t(append ? x->v_new : q),
                       tn_arg_flat(last ? x->counters : part)};
    args[0].lanes = args[3].lanes = args[4].lanes = args[5].lanes = 1;
    args[8].lanes = args[9].lanes = args[10].lanes = 1;
    uint32_t cubes[3] = {(uint32_t)bh, pl.splits, 1}, units[3] = {pl.cube, 1, 1};
    em_status st =
        tn_launch(op, dev, "tensor_attention_decode", bind, 11, pl.v, cubes, units, args, 11);
    if (st == EM_OK && split && !last) {
        unsigned cu = D < 32 ? 32 : (unsigned)(D + 31) / 32 * 32;
        em_lang_bind cb[4] = {bind[0], bind[1], bind[2], bind[3]};
        tn_arg ca[3] = {tn_arg_flat(part), tn_arg_flat(out), tn_arg_s(em_arg_u32(pl.splits))};
        uint32_t cc[3] = {(uint32_t)bh, 1, 1}, cun[3] = {cu > 256 ? 256 : cu, 1, 1};
        st = tn_launch(op, dev, "tensor_attention_decode_combine", cb, 4, 1, cc, cun, ca, 3);
    }
    em_release(part);
    return st;
}

/* The checked op: the kernel's views of the inputs (k_new and v_new too for the appending form,
 * else NULL), the launches, the result; NULL with the error set. */
static em_tensor *dec_run(const char *op, const em_tensor *q, const em_tensor *k,
                          const em_tensor *v, const em_tensor *pos, double scale,
                          const em_tensor *k_new, const em_tensor *v_new, const em_tensor *counters)
{
    em_device *dev = q->st->dev;
    em_tensor *out = tn_new(dev, q->dtype, 4, q->shape);
    em_tensor *qc = out ? tn_attn_view(q) : NULL, *kc = qc ? tn_attn_view(k) : NULL;
    em_tensor *vc = kc ? tn_attn_view(v) : NULL, *pc = vc ? tn_contig(pos) : NULL;
    em_tensor *knc = pc && k_new ? tn_attn_view(k_new) : NULL;
    em_tensor *vnc = knc ? tn_attn_view(v_new) : NULL;
    em_status st = pc && (!k_new || vnc) ? EM_OK : em_last_status();
    dec_extra x = {knc, vnc, counters}; /* the launch realizes a pending counters tensor */
    if (st == EM_OK) st = dec_launch(op, dev, qc, kc, vc, pc, out, scale, &x);
    em_release(qc);
    em_release(kc);
    em_release(vc);
    em_release(pc);
    em_release(knc);
    em_release(vnc);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em_attention_decode(const em_tensor *q, const em_tensor *k, const em_tensor *v,
                               const em_tensor *pos, double scale)
{
    const char *op = "attention_decode";
    if (!q || !k || !v || !pos) {
        if (em_last_status() == EM_OK) em_set_error(EM_ERR_INVALID, "%s: NULL input", op);
        return NULL;
    }
    if (!dec_check(op, q, k, v, pos, scale)) return NULL;
    return dec_run(op, q, k, v, pos, scale, NULL, NULL, NULL);
}

/* Whether t (a cache k or v) can be written in place by the kernel: its last dim contiguous (or
 * of size 1) and every element index of its storage within u32; else the error, naming it. */
static bool dec_writable(const char *op, const char *what, const em_tensor *t)
{
    char a[96];
    size_t elems = t->st->bytes / em_scalar_size(t->dtype);
    if ((t->stride[3] == 1 || t->shape[3] == 1) && elems <= UINT32_MAX)
        return tn_check_write(t, op) == EM_OK;
    em_set_error(EM_ERR_INVALID,
                 "%s: %s %s cannot be written in place (it needs a contiguous last dim and at "
                 "most 2^32 elements in its buffer)",
                 op, what, em_describe(t, a, sizeof a));
    return false;
}

/* The appending form's own inputs: k_new and v_new like q, counters NULL or u32/i32 [n >= R H]
 * contiguous, all on q's device; k and v writable in place. */
static bool dec_check_append(const char *op, const em_tensor *q, const em_tensor *kn,
                             const em_tensor *vn, const em_tensor *k, const em_tensor *v,
                             const em_tensor *counters)
{
    char a[96], b[96], c[96];
    bool ok = kn->rank == 4 && vn->rank == 4 && kn->dtype == q->dtype && vn->dtype == q->dtype;
    for (int i = 0; ok && i < 4; i++)
        ok = kn->shape[i] == q->shape[i] && vn->shape[i] == q->shape[i];
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: k_new %s and v_new %s must have q's shape and dtype (q %s)", op,
                     em_describe(kn, a, sizeof a), em_describe(vn, b, sizeof b),
                     em_describe(q, c, sizeof c));
        return false;
    }
    if (!tn_same_device(op, q, kn) || !tn_same_device(op, q, vn)) return false;
    if (counters) {
        int64_t bh = q->shape[0] * q->shape[1];
        if (counters->rank != 1 || counters->stride[0] != 1 || counters->shape[0] < bh ||
            (counters->dtype != EM_U32 && counters->dtype != EM_I32)) {
            em_set_error(EM_ERR_INVALID,
                         "%s: counters %s must be u32 or i32 [n], contiguous, n >= R H = %lld", op,
                         em_describe(counters, a, sizeof a), (long long)bh);
            return false;
        }
        if (!tn_same_device(op, q, counters) || tn_check_write(counters, op) != EM_OK) return false;
    }
    return dec_writable(op, "k", k) && dec_writable(op, "v", v);
}

em_tensor *em_attention_decode_append(const em_tensor *q, const em_tensor *k_new,
                                      const em_tensor *v_new, em_tensor *k, em_tensor *v,
                                      const em_tensor *pos, em_tensor *counters, double scale)
{
    const char *op = "attention_decode_append";
    if (!q || !k_new || !v_new || !k || !v || !pos) {
        if (em_last_status() == EM_OK) em_set_error(EM_ERR_INVALID, "%s: NULL input", op);
        return NULL;
    }
    if (!dec_check(op, q, k, v, pos, scale) ||
        !dec_check_append(op, q, k_new, v_new, k, v, counters))
        return NULL;
    return dec_run(op, q, k, v, pos, scale, k_new, v_new, counters);
}
