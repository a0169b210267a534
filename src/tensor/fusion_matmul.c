/* fusion_matmul.c — pending matmuls and the epilogues they absorb (docs/fusion.md, "Matmul
 * epilogues").
 *
 * With fusion on, em_matmul and em_matmul_ex check their operands at the call and record a fresh
 * result as a pending node (fu_node.mm) instead of launching: the node keeps copies of the
 * operand views, and its leaves hold their storages (retained, counted as readers), so
 * fu_before_write, em_flush, freeing and every sync point treat it as they treat a pending tree.
 * An elementwise op recorded in place on the donated result (fu_record's hook) extends the
 * epilogue act(a x b + bias) + residual when it fits the epilogue's fixed order: an add of a row
 * vector [N] -> bias, then ReLU (integers) / GELU / GELU-tanh -> act, then an add of a tensor that
 * broadcasts to the result -> residual; or, after the bias, GELU's backward with the result as its
 * gradient (em_gelu_backward(y, x): the input-gradient matmul of the layer after a GELU) -> the
 * result times gelu'(x), x read as the residual (opt-in: EMBER_MATMUL_GELU_GRAD=1). Anything else
 * runs the matmul first and is recorded on its buffer as before. Realizing launches the matmul
 * (mm_execute: autotuning, the kernel choice) into the storage's buffer, allocated then.
 *
 * Order of realization, so that nothing recurses deeper than one level: an operand (a, b, a bias
 * or residual) that is itself a pending matmul is run when this node is recorded or absorbs it.
 * A node's operands are therefore realized buffers or pending elementwise trees, whose leaves
 * are never pending; realizing the node realizes those trees (tn_launch binds them) and nothing
 * more. The result's storage is unlinked from its node while the matmul launches, so binding it
 * does not realize it again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion_internal.h"
#include "tensor/matmul_internal.h"

typedef struct fu_matmul {
    mm_problem p;        /* as checked at the call; a, b and out point to the views below, the
                          * epilogue fields are filled at launch from those below */
    em_tensor a, b;      /* the operands' views (copies; their storages are the node's leaves) */
    em_tensor out;       /* the result's view (on the node's own storage) */
    em_tensor bias, res; /* the epilogue's tensors, when has_bias / has_res (leaves too) */
    bool has_bias, has_res;
    int act;   /* em_matmul_act */
    bool tf32; /* f32 may run as tf32 (the call's epilogue or EMBER_ALLOW_TF32) */
    int rr;    /* the result's rank and shape */
    int64_t rsh[EM_MAX_RANK];
    int absorbed; /* elementwise ops absorbed into the epilogue */
    em_tensor act_out; /* with pre_act: the activated result's view (fu_mm_act_pre), where the
                        * matmul writes act(result) while its own storage gets the result */
    int pre_act;
} fu_matmul;


/* Runs t's storage's pending matmul, if it has one (the order above). EM_OK or the error set. */
static em_status settle_operand(const em_tensor *t)
{
    fu_node *p = t ? t->st->pending : NULL;
    return p && p->mm ? fu_realize(t->st) : EM_OK;
}

/* Holds t's storage as a leaf of nd (retained, counted as a reader). */
static void hold(fu_node *nd, const em_tensor *t)
{
    fu_leaf *l = &nd->leaves[nd->nleaves++];
    memset(l, 0, sizeof *l);
    l->st = t->st;
    l->dtype = t->dtype;
    l->offset = t->offset;
    tn_storage_retain(t->st);
    atomic_fetch_add(&t->st->readers, 1);
}

int fu_mm_record(const mm_problem *p, int rr, const int64_t *rsh)
{
    if (!fu_enabled()) return 0;
    const em_tensor *ops[4] = {p->a, p->b, p->bias, p->res};
    fu_node *nd = calloc(1, sizeof *nd);
    fu_matmul *m = calloc(1, sizeof *m);
    if (!nd || !m) {
        free(nd);
        free(m);
        return 0; /* run it now */
    }
    pthread_mutex_lock(&fu_lock);
    for (int i = 0; i < 4; i++) {
        if (settle_operand(ops[i]) != EM_OK) {
            pthread_mutex_unlock(&fu_lock);
            free(nd);
            free(m);
            em_error_context("matmul");
            return -1;
        }
    }
    m->p = *p;
    fu_copy_view(&m->a, p->a);
    fu_copy_view(&m->b, p->b);
    fu_copy_view(&m->out, p->out);
    m->p.a = &m->a;
    m->p.b = &m->b;
    m->p.out = &m->out;
    m->p.bias = m->p.res = NULL;
    m->has_bias = p->bias != NULL;
    m->has_res = p->res != NULL;
    if (p->bias) fu_copy_view(&m->bias, p->bias);
    if (p->res) fu_copy_view(&m->res, p->res);
    m->act = p->act;
    m->tf32 = p->tf32;
    m->rr = rr;
    memcpy(m->rsh, rsh, sizeof(int64_t) * (size_t)rr);
    nd->st = p->out->st;
    nd->rank = rr;
    memcpy(nd->shape, rsh, sizeof(int64_t) * (size_t)rr);
    nd->dtype = p->dt;
    nd->mm = m;
    for (int i = 0; i < 4; i++)
        if (ops[i]) hold(nd, ops[i]);
    fu_link(nd);
    pthread_mutex_unlock(&fu_lock);
    return 1;
}

/* The epilogue activation op d computes on a result of m's dtype, or -1 when d is none of them
 * or its math differs from the epilogue's: the elementwise ReLU keeps a NaN (select(v < 0, 0,
 * v)) where the epilogue's max(v, 0) gives 0, so on floats it is not absorbed; GELUs compute in
 * the compute type (not f32 math for f64 on a target without f64 math). */
static int act_of(const fu_matmul *m, const fu_desc *d)
{
    if (d->kind != FU_UNARY || d->C != m->p.ct || d->M != d->C) return -1;
    if (d->code == TN_U_RELU) return em_scalar_is_float(m->p.dt) ? -1 : EM_MATMUL_ACT_RELU;
    if (d->code == TN_U_GELU) return EM_MATMUL_ACT_GELU;
    if (d->code == TN_U_GELU_TANH) return EM_MATMUL_ACT_GELU_TANH;
    return -1;
}

/* The epilogue code of op d when it is GELU's or GELU-tanh's backward whose gradient operand
 * (input 0) is m's result (self): em_gelu_backward(dy Wt, x) = (dy Wt) gelu'(x), x (the
 * activation's input) then the epilogue's residual operand; 0 otherwise. The math runs in the
 * compute type, as the op's. Opt-in (EMBER_MATMUL_GELU_GRAD=1): on an H100 the GPT-2 step was
 * 2 ms slower with it in session 21 and still 0.8 ms slower in session 24, with x staged through
 * shared memory on the lines of 4 and the derivative in its logistic form (docs/benchmarks.md):
 * the per-element epilogue in the consumers of a K = 768 product costs more than the pass it
 * saves. */
static int act_grad_of(const fu_matmul *m, const fu_desc *d, int self)
{
    if (d->kind != FU_BINARY || self != 0 || d->C != m->p.ct || d->M != d->C) return 0;
    if (d->code != TN_B_GELU_GRAD && d->code != TN_B_GELU_TANH_GRAD) return 0;
    const char *env = getenv("EMBER_MATMUL_GELU_GRAD");
    if (!env || strcmp(env, "1") != 0) return 0;
    return d->code == TN_B_GELU_GRAD ? MM_ACT_GELU_GRAD : MM_ACT_GELU_TANH_GRAD;
}

/* Whether t is a row vector of the op's result `out` (a whole view of m's result, maybe
 * reshaped): [N], or [1, ..., N], where N is out's last dim and b's columns (b is not 1-D). */
static bool is_row(const fu_matmul *m, const em_tensor *t, const em_tensor *out)
{
    if (m->b.rank < 2 || t->rank < 1 || t->rank > out->rank ||
        out->shape[out->rank - 1] != m->p.N || t->shape[t->rank - 1] != m->p.N)
        return false;
    for (int i = 0; i + 1 < t->rank; i++)
        if (t->shape[i] != 1) return false;
    return true;
}

/* Strides of the view (rank, shape, stride) re-read as (nrank, nshape), the same number of
 * elements, without a copy (size-1 dims get stride 0): false when its layout does not allow it.
 * Dims are matched in groups of equal products; a group's source dims must be nested (each
 * stride the next one's times its size; all 0 for a broadcast). */
static bool restride(int rank, const int64_t *shape, const int64_t *stride, int nrank,
                     const int64_t *nshape, int64_t *out)
{
    int i = 0, j = 0;
    while (i < rank || j < nrank) {
        if (i < rank && shape[i] == 1) {
            i++;
            continue;
        }
        if (j < nrank && nshape[j] == 1) {
            out[j++] = 0;
            continue;
        }
        if (i >= rank || j >= nrank) return false;
        int i0 = i, j0 = j;
        int64_t pa = shape[i++], pb = nshape[j++];
        while (pa != pb) {
            if (pa < pb && i < rank)
                pa *= shape[i++];
            else if (pb < pa && j < nrank)
                pb *= nshape[j++];
            else
                return false;
        }
        int64_t base = 0, expect = -1;
        for (int k = i - 1; k >= i0; k--) {
            if (shape[k] == 1) continue;
            if (expect >= 0 && stride[k] != expect) return false;
            if (expect < 0) base = stride[k];
            expect = stride[k] * shape[k];
        }
        for (int k = j - 1; k >= j0; k--) {
            out[k] = nshape[k] == 1 ? 0 : base;
            base *= nshape[k];
        }
    }
    return true;
}

/* What op d of in[0..nin) on in[self] (a whole view of m's result, seen as `out`) is to m's
 * epilogue: 1 its bias, 2 its activation (*act), 3 its residual (*rst: the other operand's
 * strides over m's result), 4 an activation's backward (*act) whose input is the other operand,
 * read as the residual is (*rst), 0 none of them. No side effects. */
static int classify(const fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin,
                    int self, const em_tensor *out, int *act, int64_t *rst)
{
    const fu_matmul *m = nd->mm;
    const em_tensor *o = nin == 2 && self >= 0 ? in[1 - self] : NULL;
    int kind = 0;
    if (self < 0 || out->dtype != nd->dtype) return 0;
    if (nin == 1 && !m->act && !m->has_res && (*act = act_of(m, d)) > 0) {
        kind = 2;
    } else if (o && d->kind == FU_BINARY && d->code == 0 /* add */ && d->C == m->p.ct &&
               o->st != nd->st && o->st != in[self]->st && o->dtype == nd->dtype &&
               o->st->dev == nd->st->dev) {
        if (!m->has_bias && !m->act && !m->has_res && is_row(m, o, out))
            kind = 1;
        else if (!m->has_res)
            kind = 3; /* fu_record saw o broadcast to out's shape */
    } else if (o && !m->act && !m->has_res && (*act = act_grad_of(m, d, self)) > 0 &&
               o->st != nd->st && o->st != in[self]->st && o->dtype == nd->dtype &&
               o->st->dev == nd->st->dev) {
        kind = 4; /* after a bias, as the op would read m's result */
    }
    if (kind == 3 || kind == 4) { /* a residual over out's shape, then m's result's */
        int64_t ost[EM_MAX_RANK];
        tn_expand_geom(o, out->rank, out->shape, ost);
        if (!restride(out->rank, out->shape, ost, m->rr, m->rsh, rst)) kind = 0;
    }
    return kind;
}

/* Extends nd's epilogue by what classify found (kind > 0). 1, or -1 with the error set. */
static int absorb(fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin, int self,
                  int kind, int act, const int64_t *rst)
{
    fu_matmul *m = nd->mm;
    const em_tensor *o = nin == 2 ? in[1 - self] : NULL;
    if (o && settle_operand(o) != EM_OK) {
        em_error_context("%s", d->name);
        return -1;
    }
    if (kind == 1) { /* as [N] */
        fu_copy_view(&m->bias, o);
        m->bias.rank = 1;
        m->bias.shape[0] = m->p.N;
        m->bias.stride[0] = o->stride[o->rank - 1];
        m->has_bias = true;
    } else if (kind == 2) {
        m->act = act;
    } else { /* 3, or 4 with the activation's input as the residual */
        if (kind == 4) m->act = act;
        fu_copy_view(&m->res, o); /* as a view of m's result's shape (strides 0 where broadcast) */
        m->res.rank = m->rr;
        memcpy(m->res.shape, m->rsh, sizeof(int64_t) * (size_t)m->rr);
        memcpy(m->res.stride, rst, sizeof(int64_t) * (size_t)m->rr);
        m->has_res = true;
    }
    if (o) hold(nd, o);
    m->absorbed++;
    return 1;
}

int fu_mm_absorb(fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin,
                 const em_tensor *out)
{
    int self = -1, act = -1;
    for (int k = nin - 1; k >= 0; k--)
        if (in[k]->st == nd->st) self = k;
    int64_t rst[EM_MAX_RANK];
    int kind = classify(nd, d, in, nin, self, out, &act, rst);
    if (kind == 0) { /* not an epilogue: the matmul runs, the op reads its result */
        if (fu_realize(nd->st) == EM_OK) return 0;
        em_error_context("%s", d->name);
        return -1;
    }
    return absorb(nd, d, in, nin, self, kind, act, rst);
}

int fu_mm_take(fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin, int self,
               const em_tensor *out)
{
    int act = -1;
    int64_t rst[EM_MAX_RANK];
    int kind = classify(nd, d, in, nin, self, out, &act, rst);
    if (kind == 0) return 0;
    const em_tensor *o = nin == 2 ? in[1 - self] : NULL;
    if (o && settle_operand(o) != EM_OK) { /* before the move: a failure changes nothing */
        em_error_context("%s", d->name);
        return -1;
    }
    /* the node now fills out's storage; in[self]'s is left deferred and empty (its only holder
     * was donated to this op and is released when it returns) */
    nd->st->pending = NULL;
    nd->st = out->st;
    nd->mm->out.st = out->st;
    out->st->pending = nd;
    return absorb(nd, d, in, nin, self, kind, act, rst);
}

/* "matmul f32[7, 33] x f32[33, 257] + bias, gelu_tanh, residual" into sb. */
static void describe(const fu_matmul *m, em_strbuf *sb)
{
    static const char *const acts[] = {"",          "relu",          "gelu",
                                       "gelu_tanh", "gelu backward", "gelu_tanh backward"};
    char sa[128], sb2[128];
    tn_describe_shape(m->a.dtype, m->a.rank, m->a.shape, sa, sizeof sa);
    tn_describe_shape(m->b.dtype, m->b.rank, m->b.shape, sb2, sizeof sb2);
    em_sb_printf(sb, "matmul %s x %s", sa, sb2);
    const char *sep = " + ";
    if (m->has_bias) em_sb_printf(sb, "%sbias", sep), sep = ", ";
    if (m->act > 0 && m->act <= MM_ACT_GELU_TANH_GRAD)
        em_sb_printf(sb, "%s%s", sep, acts[m->act]), sep = ", ";
    if (m->has_res && m->act < MM_ACT_GELU_GRAD) em_sb_printf(sb, "%sresidual", sep);
}

em_status fu_mm_launch(fu_node *nd)
{
    fu_matmul *m = nd->mm;
    bool grad = m->act >= MM_ACT_GELU_GRAD; /* no public code: checked as none, then set */
    em_matmul_epilogue ep = {.bias = m->has_bias ? &m->bias : NULL,
                             .act = grad ? EM_MATMUL_ACT_NONE : (em_matmul_act)m->act,
                             .residual = m->has_res ? &m->res : NULL,
                             .allow_tf32 = m->tf32};
    mm_problem p = m->p;
    if (!mm_setup_epilogue(&p, &ep, m->rr, m->rsh)) return em_last_status();
    p.act = m->act;
    if (m->pre_act) p.pre = p.out, p.out = &m->act_out, p.act = m->pre_act;
    if (fu_debug_on()) {
        em_strbuf sb;
        em_sb_init(&sb);
        describe(m, &sb);
        fprintf(stderr, "ember fusion: %s (%d ops absorbed)\n", sb.data ? sb.data : "matmul",
                m->absorbed);
        em_sb_free(&sb);
    }
    nd->st->pending = NULL; /* binding the result (tn_launch) must not realize it again */
    em_status s = mm_execute(&p);
    nd->st->pending = nd;
    if (s == EM_OK && m->absorbed) fu_count_fused(m->absorbed);
    return s;
}

em_status fu_mm_launch_into(fu_node *nd, const em_tensor *dst)
{
    fu_matmul *m = nd->mm;
    tn_storage *own = m->out.st;
    int64_t off = m->out.offset;
    /* out's shape and strides stay: dst is contiguous with the same elements (the caller's
     * check), so the kernel's geometry is unchanged, only its buffer and first element */
    m->out.st = dst->st;
    m->out.offset = dst->offset;
    em_status s = fu_mm_launch(nd);
    m->out.st = own;
    m->out.offset = off;
    return s;
}

em_status fu_mm_colsum_into(const em_tensor *t, em_tensor *out, bool *taken)
{
    *taken = false;
    fu_node *nd = t->st->pending;
    if (!nd || !nd->mm || t->rank < 2 || out->st == t->st) return EM_OK;
    const char *env = getenv("EMBER_MATMUL_COLSUM"); /* opt-in: "1" */
    if (!env || strcmp(env, "1") != 0) return EM_OK;
    fu_matmul *m = nd->mm;
    int64_t n = m->rsh[m->rr - 1];
    if (!em_is_contiguous(t) || t->offset != m->out.offset || t->shape[t->rank - 1] != n ||
        tn_numel(t->rank, t->shape) != tn_numel(m->rr, m->rsh) || !em_is_contiguous(out) ||
        tn_numel(out->rank, out->shape) != n || !em_scalar_is_float(out->dtype))
        return EM_OK;
    /* (out itself is written by the column-sum launch, which settles its storage first) */
    m->p.colsum = out;
    em_status st = fu_realize(t->st);
    if (t->st->pending == nd) m->p.colsum = NULL; /* still pending (it failed): no sums next time */
    *taken = st == EM_OK;
    return st;
}

int fu_mm_act_pre(const fu_desc *d, const em_tensor *in, em_tensor *out)
{
    const char *env = getenv("EMBER_MATMUL_PRE"); /* opt-in: "1" */
    fu_node *nd = in->st->pending;
    if (!env || strcmp(env, "1") != 0 || !nd || !nd->mm || out->st->pending || out->st->buf)
        return 0;
    fu_matmul *m = nd->mm;
    int act = act_of(m, d);
    if (act <= 0 || m->act || m->has_res || m->pre_act || in->dtype != nd->dtype ||
        out->dtype != nd->dtype || !em_is_contiguous(in) || in->offset != m->out.offset ||
        tn_numel(in->rank, in->shape) != tn_numel(m->rr, m->rsh) || !em_is_contiguous(out) ||
        out->offset != 0 || tn_numel(out->rank, out->shape) != tn_numel(m->rr, m->rsh))
        return 0;
    /* the input kept: not donated, held by another reference, or to be saved by the recorder
     * (autodiff's tape keeps a GELU's input for its backward) */
    em_tensor_op top = act == EM_MATMUL_ACT_RELU   ? EM_TOP_RELU
                       : act == EM_MATMUL_ACT_GELU ? EM_TOP_GELU
                                                   : EM_TOP_GELU_TANH;
    bool kept = !in->taken || atomic_load(&in->refs) > 1 || atomic_load(&in->st->refs) > 1 ||
                (tn_recording(&in, 1) && tn_record_keeps_input(top, 0));
    if (!kept) return 0;
    m->act_out = m->out; /* the result's geometry (contiguous) on out's storage */
    m->act_out.st = out->st;
    m->act_out.offset = 0;
    m->pre_act = act;
    em_status st = tn_realize(out) == EM_OK ? fu_realize(in->st) : em_last_status();
    if (in->st->pending == nd) m->pre_act = 0; /* still pending (it failed) */
    if (st != EM_OK) {
        em_error_context("%s", d->name);
        return -1;
    }
    fu_count_fused(1);
    return 1;
}

void fu_mm_error(const fu_node *nd)
{
    em_strbuf sb;
    em_sb_init(&sb);
    describe(nd->mm, &sb);
    em_error_context("%s (EMBER_FUSION=0 runs it at once)", sb.data ? sb.data : "matmul");
    em_sb_free(&sb);
}

void fu_mm_free(fu_node *nd)
{
    free(nd->mm);
    nd->mm = NULL;
}
