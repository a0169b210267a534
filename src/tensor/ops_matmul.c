/* ops_matmul.c — em_matmul and em_matmul_ex: batched, broadcast matrix multiply with
 * torch.matmul's promotion of 1-D operands, and an optional fused epilogue (bias, activation,
 * residual). This file checks the operands and builds the problem in the kernels' rank-R
 * geometry: operands are read through their strides (a transposed weight needs no copy), batch
 * dims broadcast by stride 0. Which kernel and configuration runs is matmul_tune.c's choice
 * (matmul_config.c has the heuristics); matmul_launch.c launches it. With fusion on, a result is
 * not launched at the call but recorded as a pending matmul (fusion_matmul.c): the checks run
 * here, the launch when the result is needed, with the epilogue in-place elementwise ops on the
 * result added meanwhile (docs/fusion.md, "Matmul epilogues"). The epilogue's layer-norm
 * prologue runs inside the skinny kernel where the heuristic picks that kernel (such a matmul is
 * launched at the call, never recorded as pending), else as em_layer_norm before the product. */
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion.h"
#include "tensor/matmul_internal.h"

/* Checks a and b and fills p's operand geometry and result (an empty result or K == 0 is the
 * caller's, *zero_fill set for the latter). With `defer`, a result that will need a launch is
 * created without a buffer (tn_new_deferred: fusion may record the matmul); `given` (checked by
 * the caller: contiguous, of the product's shape and a's dtype) is the result instead, retained.
 * false with the error set. */
static bool mm_setup(mm_problem *p, const em_tensor *a, const em_tensor *b, em_tensor **out,
                     bool *zero_fill, int *rr_out, int64_t *rsh, bool defer, em_tensor *given)
{
    char sa[128], sb[128];
    memset(p, 0, sizeof *p);
    *out = NULL;
    *zero_fill = false;
    if (!tn_same_device("matmul", a, b)) return false;
    if (a->dtype != b->dtype) {
        em_set_error(EM_ERR_INVALID, "matmul: dtypes %s and %s differ (cast one first)",
                     em_scalar_name(a->dtype), em_scalar_name(b->dtype));
        return false;
    }
    if (a->dtype == EM_BOOL || a->rank == 0 || b->rank == 0) {
        em_set_error(EM_ERR_INVALID,
                     "matmul: needs numeric tensors of rank 1 or more, got %s and %s",
                     em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb));
        return false;
    }
    /* Promote 1-D operands to matrices: a [K] -> [1, K], b [K] -> [K, 1]. */
    int ra = a->rank == 1 ? 2 : a->rank, rb = b->rank == 1 ? 2 : b->rank;
    int64_t ash[EM_MAX_RANK], ast[EM_MAX_RANK], bsh[EM_MAX_RANK], bst[EM_MAX_RANK];
    if (a->rank == 1) {
        ash[0] = 1, ast[0] = 0, ash[1] = a->shape[0], ast[1] = a->stride[0];
    } else {
        memcpy(ash, a->shape, sizeof ash), memcpy(ast, a->stride, sizeof ast);
    }
    if (b->rank == 1) {
        bsh[0] = b->shape[0], bst[0] = b->stride[0], bsh[1] = 1, bst[1] = 0;
    } else {
        memcpy(bsh, b->shape, sizeof bsh), memcpy(bst, b->stride, sizeof bst);
    }
    int64_t M = ash[ra - 2], K = ash[ra - 1], N = bsh[rb - 1];
    if (bsh[rb - 2] != K) {
        em_set_error(EM_ERR_INVALID,
                     "matmul: shapes %s and %s do not match (inner dims %lld and %lld)",
                     em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb), (long long)K,
                     (long long)bsh[rb - 2]);
        return false;
    }
    /* Broadcast the batch dims. */
    int ba = ra - 2, bb = rb - 2, br = ba > bb ? ba : bb;
    for (int i = 0; i < br; i++) {
        int ia = i - (br - ba), ib = i - (br - bb);
        int64_t da = ia >= 0 ? ash[ia] : 1, db = ib >= 0 ? bsh[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            em_set_error(EM_ERR_INVALID, "matmul: batch dims of %s and %s cannot be broadcast",
                         em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb));
            return false;
        }
        p->osh[i] = da == 1 ? db : da;
        p->ast[i] = ia >= 0 && ash[ia] != 1 ? ast[ia] : 0;
        p->bst[i] = ib >= 0 && bsh[ib] != 1 ? bst[ib] : 0;
    }
    p->R = br + 2;
    memcpy(p->ash, p->osh, sizeof p->osh);
    memcpy(p->bsh, p->osh, sizeof p->osh);
    p->ash[br] = M, p->ash[br + 1] = K, p->ast[br] = ast[ra - 2], p->ast[br + 1] = ast[ra - 1];
    p->bsh[br] = K, p->bsh[br + 1] = N, p->bst[br] = bst[rb - 2], p->bst[br + 1] = bst[rb - 1];
    p->osh[br] = M, p->osh[br + 1] = N;
    /* The result's shape drops the promoted dims. */
    int rr = 0;
    for (int i = 0; i < br; i++) rsh[rr++] = p->osh[i];
    if (a->rank > 1) rsh[rr++] = M;
    if (b->rank > 1) rsh[rr++] = N;
    *rr_out = rr;
    p->dev = a->st->dev;
    p->caps = em_device_caps(p->dev);
    p->dt = a->dtype;
    p->ct = em_scalar_is_float(a->dtype) ? tn_compute_type(a->dtype)
            : a->dtype == EM_I64         ? EM_I64
                                         : EM_I32;
    p->M = M, p->N = N, p->K = K, p->a = a, p->b = b;
    p->batch = tn_numel(br, p->osh);
    tn_contig_strides(p->R, p->osh, p->ost);
    defer = defer && M * N * p->batch != 0 && K != 0 && p->batch <= 65535;
    if (given)
        *out = em_retain(given);
    else
        *out =
            defer ? tn_new_deferred(p->dev, a->dtype, rr, rsh) : tn_new(p->dev, a->dtype, rr, rsh);
    if (!*out) return false;
    p->out = *out;
    if (M * N * p->batch == 0) return true;
    if (K == 0) {
        *zero_fill = true;
        return true;
    }
    if (p->batch > 65535) {
        em_set_error(EM_ERR_UNSUPPORTED, "matmul: %lld batches is more than the 65535 supported",
                     (long long)p->batch);
        return false;
    }
    return true;
}

bool mm_setup_epilogue(mm_problem *p, const em_matmul_epilogue *ep, int rr, const int64_t *rsh)
{
    char s1[128], s2[128];
    if (!ep) return true;
    p->act = (int)ep->act;
    p->tf32 = ep->allow_tf32;
    if ((unsigned)ep->act > EM_MATMUL_ACT_GELU_TANH) {
        em_set_error(EM_ERR_INVALID, "matmul: unknown epilogue activation %d", (int)ep->act);
        return false;
    }
    if (ep->act > EM_MATMUL_ACT_RELU && !em_scalar_is_float(p->dt)) {
        em_set_error(EM_ERR_INVALID, "matmul: GELU epilogue needs floating-point operands, got %s",
                     em_scalar_name(p->dt));
        return false;
    }
    const em_tensor *t = ep->bias;
    if (t) {
        tn_describe_shape(p->dt, rr, rsh, s2, sizeof s2);
        bool ok =
            t->rank >= 1 && t->shape[t->rank - 1] == p->N && tn_same_device("matmul", p->a, t);
        for (int i = 0; ok && i + 1 < t->rank; i++) ok = t->shape[i] == 1;
        if (!ok || t->dtype != p->dt) {
            if (ok || t->st->dev == p->dev)
                em_set_error(
                    EM_ERR_INVALID, "matmul: bias %s does not fit result %s (needs %s[%lld])",
                    em_describe(t, s1, sizeof s1), s2, em_scalar_name(p->dt), (long long)p->N);
            return false;
        }
        p->bias = t;
        p->bias_stride = t->stride[t->rank - 1];
        p->bias_off = t->offset;
    }
    t = ep->residual;
    if (t) {
        tn_describe_shape(p->dt, rr, rsh, s2, sizeof s2);
        if (!tn_same_device("matmul", p->a, t)) return false;
        bool ok = t->dtype == p->dt && t->rank <= rr;
        for (int i = 0; ok && i < t->rank; i++) {
            int64_t d = t->shape[t->rank - 1 - i];
            ok = d == 1 || d == rsh[rr - 1 - i];
        }
        if (!ok) {
            em_set_error(EM_ERR_INVALID, "matmul: residual %s does not broadcast to result %s",
                         em_describe(t, s1, sizeof s1), s2);
            return false;
        }
        int64_t rs[EM_MAX_RANK];
        tn_expand_geom(t, rr, rsh, rs);
        /* result dims -> kernel dims: batch dims, then M (absent for a 1-D a), then N */
        int br = p->R - 2, k = 0;
        for (int i = 0; i < br; i++) p->rst[i] = rs[k++];
        p->rst[br] = p->a->rank > 1 ? rs[k++] : 0;
        p->rst[br + 1] = p->b->rank > 1 ? rs[k++] : 0;
        p->res = t;
    }
    return true;
}

bool mm_tma_maps(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q, tn_arg out[2],
                 em_tensor **own)
{
    *own = NULL;
    if (fu_realize(p->a->st) != EM_OK || fu_realize(p->b->st) != EM_OK) return false;
    uint64_t words[2 * EM_TENSOR_MAP_WORDS];
    size_t es = em_scalar_size(p->dt);
    /* a K-major operand is one box of 64 x (its tile's rows) a stage, an MN-major one boxes of
     * 64 x 64 (matmul_wgmma_tma.ek); a multicast K-major b a cube's share of its rows */
    const em_tensor *ops[2] = {p->a, p->b};
    const int64_t *dims[2] = {q->adim, q->bdim}, *strs[2] = {q->astr, q->bstr};
    uint32_t rows[2] = {q->at ? 64u : (uint32_t)c->bm,
                        q->bt ? (uint32_t)(c->bn / (q->multicast ? q->cluster : 1)) : 64u};
    for (int i = 0; i < 2; i++) {
        em_tensor_map_desc d = {p->dt, 3, {0}, {0}, {64, rows[i], 1}, 128};
        for (int j = 0; j < 3; j++)
            d.dims[j] = (uint64_t)dims[i][j], d.strides[j] = (uint64_t)strs[i][j];
        if (em_tensor_map_encode(ops[i]->st->buf, (size_t)ops[i]->offset * es, &d,
                                 words + i * EM_TENSOR_MAP_WORDS) != EM_OK) {
            em_error_context("matmul: the tensor map of %s (%lld x %lld x %lld)", i ? "b" : "a",
                             (long long)dims[i][0], (long long)dims[i][1], (long long)dims[i][2]);
            return false;
        }
    }
    int64_t len = 2 * EM_TENSOR_MAP_WORDS, one = 1;
    em_buffer *buf = NULL;
    size_t at = 0;
    /* the device's constants: the same maps (the same operands' places and shapes: a training
     * step's or a benchmark's repeats) are written once, not queued before every launch */
    if (!em_device_recording(p->dev)) {
        if (em_device_constant(p->dev, words, sizeof words, &buf, &at) == EM_OK) {
            out[0] = tn_arg_s(em_arg_tensor(buf, at, (uint64_t)len, 1, &len, &one));
            out[1] = tn_arg_s(em_arg_u32(0));
            return true;
        }
        em_clear_error(); /* no slot (out of memory): a tensor of their own, as below */
    }
    /* while recording (a replay may outlive a constant's slot): the graph's own copy */
    em_tensor *maps = tn_new(p->dev, EM_I64, 1, &len); /* tensors hold no u64: the same bits */
    if (!maps) return false;
    if (em_buffer_write(maps->st->buf, 0, words, sizeof words) != EM_OK) {
        em_release(maps);
        return false;
    }
    *own = maps;
    out[0] = tn_arg_s(em_arg_tensor(maps->st->buf, 0, (uint64_t)len, 1, &len, &one));
    out[1] = tn_arg_s(em_arg_u32(0));
    return true;
}

em_status mm_execute(const mm_problem *p)
{
    mm_config c = mm_choose(p);
    return mm_launch(p, &c);
}

/* The product with the epilogue; inputs borrowed (never consumed). With fusion on, a result that
 * needs a launch is recorded as a pending matmul instead (fusion_matmul.c). */
static em_tensor *mm_run(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep)
{
    mm_problem p;
    em_tensor *out = NULL;
    bool zero_fill;
    int rr = 0;
    int64_t rsh[EM_MAX_RANK];
    if (!mm_setup(&p, a, b, &out, &zero_fill, &rr, rsh, fu_enabled(), NULL)) goto fail;
    if (!mm_setup_epilogue(&p, ep, rr, rsh)) goto fail;
    const char *tf = getenv("EMBER_ALLOW_TF32");
    if (tf && !strcmp(tf, "1")) p.tf32 = true;
    if (p.M * p.N * p.batch == 0) return out;
    if (!out->st->buf) { /* deferred by mm_setup: record it, or allocate and run it now */
        int r = fu_mm_record(&p, rr, rsh);
        if (r > 0) return out;
        if (r < 0 || tn_realize(out) != EM_OK) goto fail;
    }
    mm_config c;
    if (zero_fill) {
        /* K == 0: the product is zero; the epilogue still applies (through the SIMT kernel) */
        if (tn_fill(out, 0) != EM_OK) goto fail;
        if (!p.bias && !p.res) return out;
        p.K = 0;
        c = mm_heuristic(&p);
    } else {
        c = mm_choose(&p);
    }
    if (mm_launch(&p, &c) != EM_OK) goto fail;
    return out;
fail:
    em_release(out);
    return NULL;
}

/* Records out (a x b, or NULL) as a matmul for autodiff and lets go of the operands. Returns out.
 */
static em_tensor *matmul_done(const em_tensor *a, const em_tensor *b, em_tensor *out)
{
    if (out) {
        const em_tensor *ins[2] = {a, b};
        tn_record(EM_TOP_MATMUL, NULL, ins, 2, out);
    }
    tn_done(a);
    if (b != a) tn_done(b);
    return out;
}

em_tensor *em_matmul(const em_tensor *a, const em_tensor *b)
{
    return matmul_done(a, b, a && b ? mm_run(a, b, NULL) : NULL);
}

/* em_matmul_sum_b's product and sums: the checks, then the launch with mm_problem.bsum. */
static em_tensor *mm_sum_b(const em_tensor *a, const em_tensor *b, em_tensor *sums, em_tensor *into)
{
    const char *op = "matmul_sum_b";
    char sa[128], sb[128], ss[128];
    if (a->rank != 2 || b->rank != 2) {
        em_set_error(EM_ERR_INVALID, "%s: needs 2-D operands, got %s and %s", op,
                     em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb));
        return NULL;
    }
    int64_t ns = tn_numel(sums->rank, sums->shape);
    /* the sums and the result may be slots of one buffer (a flat gradient's), never overlapping */
    bool overlap = into && sums->st == into->st && em_is_contiguous(into) &&
                   (size_t)sums->offset * em_scalar_size(sums->dtype) <
                       (size_t)(into->offset + tn_numel(into->rank, into->shape)) *
                           em_scalar_size(into->dtype) &&
                   (size_t)into->offset * em_scalar_size(into->dtype) <
                       (size_t)(sums->offset + ns) * em_scalar_size(sums->dtype);
    if (!em_scalar_is_float(b->dtype) || !em_scalar_is_float(sums->dtype) ||
        !em_is_contiguous(sums) || ns != b->shape[1] || sums->st == b->st || sums->st == a->st ||
        overlap) {
        em_set_error(
            EM_ERR_INVALID,
            "%s: the column sums %s do not fit %s (contiguous floats, one per column of b, "
            "apart from the operands and the result)",
            op, em_describe(sums, ss, sizeof ss), em_describe(b, sb, sizeof sb));
        return NULL;
    }
    if (!tn_same_device(op, sums, b) || (into && !tn_same_device(op, into, a)) ||
        tn_check_write(sums, op) != EM_OK || (into && tn_check_write(into, op) != EM_OK))
        return NULL;
    if (into &&
        (into->rank != 2 || into->shape[0] != a->shape[0] || into->shape[1] != b->shape[1] ||
         into->dtype != a->dtype || !em_is_contiguous(into))) {
        em_set_error(
            EM_ERR_INVALID,
            "%s: the result %s does not fit %s x %s (contiguous, of the product's shape and "
            "dtype)",
            op, em_describe(into, ss, sizeof ss), em_describe(a, sa, sizeof sa),
            em_describe(b, sb, sizeof sb));
        return NULL;
    }
    if (into && (into->st == a->st || into->st == b->st)) {
        em_set_error(EM_ERR_INVALID, "%s: the result %s shares an operand's buffer", op,
                     em_describe(into, ss, sizeof ss));
        return NULL;
    }
    /* the kernels' 16-byte lines want the result's first element aligned: elsewhere the product
     * goes to a tensor of its own and is copied in */
    if (into && ((size_t)into->offset * em_scalar_size(into->dtype)) % 256 != 0) {
        em_tensor *t = mm_sum_b(a, b, sums, NULL);
        em_status st = t ? em_copy_(into, t) : em_last_status();
        em_release(t);
        return st == EM_OK ? em_retain(into) : NULL;
    }
    mm_problem p;
    em_tensor *out = NULL;
    bool zero_fill;
    int rr = 0;
    int64_t rsh[EM_MAX_RANK];
    if (!mm_setup(&p, a, b, &out, &zero_fill, &rr, rsh, false, into)) goto fail;
    /* into's pending value and the nodes that read it run first; then it is written */
    if (into && (tn_realize(into) != EM_OK || fu_before_write(into->st) != EM_OK)) goto fail;
    if (p.M * p.N == 0 || zero_fill) {
        if (p.M * p.N > 0 && tn_fill(out, 0) != EM_OK) goto fail;
        if (tn_sum_leading_into(op, b, sums) != EM_OK) goto fail;
        return out;
    }
    p.bsum = sums;
    mm_config c = mm_choose(&p);
    if (mm_launch(&p, &c) != EM_OK) goto fail;
    return out;
fail:
    em_error_context("%s", op);
    em_release(out);
    return NULL;
}

/* The NULL checks of em_matmul_sum_b(_into): false with the error set (donated inputs released). */
static bool sum_b_args(const em_tensor *a, const em_tensor *b, const em_tensor *b_sums)
{
    if (a && b && b_sums) return true;
    if (!a || !b)
        em_error_context("matmul_sum_b"); /* the failed op's error */
    else
        em_set_error(EM_ERR_INVALID, "matmul_sum_b: no tensor for the column sums");
    tn_done(a);
    if (b != a) tn_done(b);
    return false;
}

em_tensor *em_matmul_sum_b(const em_tensor *a, const em_tensor *b, em_tensor *b_sums)
{
    if (!sum_b_args(a, b, b_sums)) return NULL;
    return matmul_done(a, b, mm_sum_b(a, b, b_sums, NULL));
}

em_status em_matmul_sum_b_into(em_tensor *into, const em_tensor *a, const em_tensor *b,
                               em_tensor *b_sums)
{
    if (!sum_b_args(a, b, b_sums)) return em_last_status();
    if (!into) {
        tn_done(a);
        if (b != a) tn_done(b);
        return em_set_error(EM_ERR_INVALID, "matmul_sum_b_into: no tensor for the result");
    }
    em_tensor *out = mm_sum_b(a, b, b_sums, into);
    em_status st = out ? EM_OK : em_last_status();
    em_release(out); /* into itself (the caller's) */
    tn_done(a);
    if (b != a) tn_done(b);
    return st;
}

/* With recording inputs (autodiff) the epilogue is composed from recorded ops instead. */
static em_tensor *mm_composed(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep)
{
    em_scope_begin();
    em_tensor *y = em_matmul(a, b);
    if (y && ep->bias) y = em_add(y, ep->bias);
    if (y && ep->act == EM_MATMUL_ACT_RELU) y = em_relu(y);
    if (y && ep->act == EM_MATMUL_ACT_GELU) y = em_gelu(y);
    if (y && ep->act == EM_MATMUL_ACT_GELU_TANH) y = em_gelu_tanh(y);
    if (y && ep->residual) y = em_add(y, ep->residual);
    em_scope_end(y ? &y : NULL, y ? 1 : 0);
    return y;
}

/* Checks ep's layer-norm prologue against a: a floating-point a of rank 1 or more, ln_weight and
 * ln_bias NULL or [K] of a's dtype on a's device. false with the error set (naming the shapes). */
static bool ln_check(const em_tensor *a, const em_matmul_epilogue *ep)
{
    char sa[128], st[128];
    if (!em_scalar_is_float(a->dtype) || a->rank == 0) {
        em_set_error(EM_ERR_INVALID,
                     "matmul: the layer-norm prologue needs a floating-point a of rank 1 or "
                     "more, got %s",
                     em_describe(a, sa, sizeof sa));
        return false;
    }
    int64_t K = a->shape[a->rank - 1];
    const em_tensor *ts[2] = {ep->ln_weight, ep->ln_bias};
    static const char *const what[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        const em_tensor *t = ts[i];
        if (!t) continue;
        if (!tn_same_device("matmul", a, t)) return false;
        if (t->rank != 1 || t->shape[0] != K || t->dtype != a->dtype) {
            em_set_error(EM_ERR_INVALID,
                         "matmul: layer-norm %s %s does not fit a %s (needs %s[%lld])", what[i],
                         em_describe(t, st, sizeof st), em_describe(a, sa, sizeof sa),
                         em_scalar_name(a->dtype), (long long)K);
            return false;
        }
    }
    return true;
}

/* The product with ep's layer-norm prologue inside the skinny kernel, launched now: 1 with *out
 * the result, 0 when the heuristic would not take the skinny kernel for it (nothing done: the
 * caller normalizes first), -1 with the error set. Inputs borrowed. */
static int mm_run_ln(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep,
                     em_tensor **out)
{
    mm_problem p;
    bool zero_fill;
    int rr = 0;
    int64_t rsh[EM_MAX_RANK];
    /* deferred: the buffer comes only once the skinny kernel is known to take it */
    if (!mm_setup(&p, a, b, out, &zero_fill, &rr, rsh, true, NULL) ||
        !mm_setup_epilogue(&p, ep, rr, rsh))
        goto fail;
    const char *tf = getenv("EMBER_ALLOW_TF32");
    if (tf && !strcmp(tf, "1")) p.tf32 = true;
    p.ln = true;
    p.ln_w = ep->ln_weight;
    p.ln_b = ep->ln_bias;
    p.ln_eps = ep->ln_eps;
    mm_config c = mm_heuristic(&p);
    /* every cube reads its rows of a twice for the statistics: worth it while those reads stay
     * below half of b's elements (decoding's one row into c_attn or c_fc); past that (many
     * cubes: the LM head; several rows) a separate layer norm costs less. H200, GPT-2 b8: the
     * fused LM head and blocks took a step from 1.08 to 1.61 ms. */
    mm_skinny_plan q;
    bool cheap = c.kind == MM_SKINNY && mm_skinny_plan_of(&p, &c, &q) && q.nout > 0 &&
                 (p.N + q.nout - 1) / q.nout * (int64_t)c.bm * c.split * 4 <= p.N;
    if (zero_fill || p.M * p.N * p.batch == 0 || !cheap || !mm_config_valid(&p, &c)) {
        em_release(*out);
        *out = NULL;
        return 0;
    }
    if (!(*out)->st->buf && tn_realize(*out) != EM_OK) goto fail;
    c = mm_choose(&p); /* a skinny configuration: mm_config_valid allows no other with ln */
    if (mm_launch(&p, &c) != EM_OK) goto fail;
    return 1;
fail:
    em_release(*out);
    *out = NULL;
    return -1;
}

/* em_matmul_ex with the layer-norm prologue (ep->ln): in the skinny kernel where it runs the
 * product, else (and with recording inputs) em_layer_norm and then the product. */
static em_tensor *mm_ex_ln(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep)
{
    em_tensor *out = NULL;
    if (a && b && ln_check(a, ep)) {
        const em_tensor *all[6] = {a, b, ep->bias, ep->residual, ep->ln_weight, ep->ln_bias};
        const em_tensor *ins[6];
        int n = 0;
        for (int i = 0; i < 6; i++)
            if (all[i]) ins[n++] = all[i];
        int r = tn_recording(ins, n) ? 0 : mm_run_ln(a, b, ep, &out);
        if (r == 0) {
            em_matmul_epilogue rest = *ep;
            rest.ln = false;
            rest.ln_weight = rest.ln_bias = NULL;
            /* both consume donated inputs: a here, b in the product */
            em_tensor *x = em_layer_norm(a, 1, ep->ln_weight, ep->ln_bias, ep->ln_eps);
            if (!x) em_error_context("matmul: layer-norm prologue");
            return em_matmul_ex(em_take(x), b, &rest);
        }
    }
    tn_done(a);
    if (b != a) tn_done(b);
    return out;
}

em_tensor *em_matmul_ex(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep)
{
    if (!ep) return em_matmul(a, b);
    if (ep->ln) return mm_ex_ln(a, b, ep);
    em_tensor *out = NULL;
    if (a && b && (!ep->bias || ep->bias->dtype == a->dtype) &&
        (!ep->residual || ep->residual->dtype == a->dtype)) {
        const em_tensor *ins[4] = {a, b, ep->bias, ep->residual};
        int n = 2;
        if (ep->bias) ins[n++] = ep->bias;
        if (ep->residual) ins[n++] = ep->residual;
        /* em_matmul (recorded) consumes donated a and b itself */
        if (tn_recording(ins, n) && (unsigned)ep->act <= EM_MATMUL_ACT_GELU_TANH)
            return mm_composed(a, b, ep);
    }
    if (a && b) out = mm_run(a, b, ep);
    tn_done(a);
    if (b != a) tn_done(b);
    return out;
}
