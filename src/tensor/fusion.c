/* fusion.c — lazy elementwise fusion (tensor/fusion.h, docs/fusion.md).
 *
 * A pending storage holds a node: a small expression tree in post-order (ops[], the root last)
 * whose leaves are realized buffers read through strides over the node's output shape. Recording
 * an op builds a new node from its inputs: an input that is a whole, contiguous view of a pending
 * storage is inlined (its tree copied, its leaves' strides reshaped and broadcast to the new
 * output shape); any other pending input is realized first, so leaves are never pending and
 * realizing never recurses. An elementwise result's storage has no buffer until its tree runs
 * (tn_new_deferred; fu_realize allocates it), so an intermediate inlined into its consumers and
 * freed unread never takes device memory. Each op's value is rounded to its dtype as if stored,
 * so fused results are those of the ops run one by one. Realizing generates a kernel-language
 * source that calls the op helpers of src/kernels/tensor_elementwise.ek, caches the loaded module
 * by the tree's signature (ops, dtypes, leaf sharing: rank and line width are launch bindings,
 * and scalars are kernel arguments, so a training step compiles nothing the second time), and
 * launches it once, counting the bytes it reads (its leaves) and writes (the output).
 *
 * One recursive lock guards the pending list, the nodes and the cache; realizing holds it while
 * it launches, so another thread never sees a storage half realized. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion_internal.h"

/* A generated kernel: the module holding kernel "fused", with a number for debug output. */
typedef struct fu_kernel {
    em_lang_module *m;
    int id;
} fu_kernel;

pthread_mutex_t fu_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static fu_node *g_pending;        /* every pending node (guarded by fu_lock) */
static em_map g_cache;            /* signature -> fu_kernel (guarded by fu_lock) */
static int g_nkernels;
static atomic_int g_mode = -1;    /* -1: not read yet; 0 off; 1 on */
static atomic_int g_debug = -1;
static _Atomic uint64_t g_launches, g_fused_launches, g_fused_ops, g_recorded, g_compiles;
static _Atomic uint64_t g_bytes_read, g_bytes_written;

/* ---- switches and counters ------------------------------------------------------------------- */

bool fu_enabled(void)
{
    int m = atomic_load(&g_mode);
    if (m < 0) {
        /* on by default; EMBER_FUSION=0 switches it off (docs/fusion.md) */
        const char *e = getenv("EMBER_FUSION");
        m = e && !strcmp(e, "0") ? 0 : 1;
        int expect = -1;
        atomic_compare_exchange_strong(&g_mode, &expect, m);
        m = atomic_load(&g_mode);
    }
    return m == 1;
}

bool fu_debug_on(void)
{
    int d = atomic_load(&g_debug);
    if (d < 0) {
        const char *e = getenv("EMBER_FUSION_DEBUG");
        d = e && *e && strcmp(e, "0") != 0 ? 1 : 0;
        atomic_store(&g_debug, d);
    }
    return d == 1;
}

void em_fusion_set(bool on) { atomic_store(&g_mode, on ? 1 : 0); }
bool em_fusion_enabled(void) { return fu_enabled(); }
void fu_count_launch(const char *kernel, uint64_t read, uint64_t written)
{
    atomic_fetch_add(&g_launches, 1);
    atomic_fetch_add(&g_bytes_read, read);
    atomic_fetch_add(&g_bytes_written, written);
    if (em_profile_enabled()) em_profile_add_bytes(kernel, read, written);
}

void fu_count_fused(int nops)
{
    atomic_fetch_add(&g_fused_launches, 1);
    atomic_fetch_add(&g_fused_ops, (uint64_t)nops);
}

void fu_count_compile(void) { atomic_fetch_add(&g_compiles, 1); }

em_tensor_stats em_tensor_stats_get(void)
{
    em_tensor_stats s = {
        .launches = atomic_load(&g_launches),
        .fused_launches = atomic_load(&g_fused_launches),
        .fused_ops = atomic_load(&g_fused_ops),
        .recorded_ops = atomic_load(&g_recorded),
        .fused_compiles = atomic_load(&g_compiles),
        .bytes_read = atomic_load(&g_bytes_read),
        .bytes_written = atomic_load(&g_bytes_written),
    };
    return s;
}

void em_tensor_stats_reset(void)
{
    atomic_store(&g_launches, 0);
    atomic_store(&g_fused_launches, 0);
    atomic_store(&g_fused_ops, 0);
    atomic_store(&g_recorded, 0);
    atomic_store(&g_compiles, 0);
    atomic_store(&g_bytes_read, 0);
    atomic_store(&g_bytes_written, 0);
}

/* ---- nodes ----------------------------------------------------------------------------------- */

static void unlink_node(fu_node *n)
{
    if (n->prev) n->prev->next = n->next;
    else if (g_pending == n) g_pending = n->next;
    if (n->next) n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

/* Frees a node that is no longer pending: its leaves' buffers are released. */
static void free_node(fu_node *n)
{
    for (int i = 0; i < n->nleaves; i++) {
        if (n->leaves[i].st == n->st) continue; /* its own buffer: not held */
        atomic_fetch_sub(&n->leaves[i].st->readers, 1);
        tn_storage_release(n->leaves[i].st);
    }
    if (n->mm) fu_mm_free(n); /* a pending matmul's own data (fusion_matmul.c) */
    if (n->rows) fu_rows_free(n); /* a pending row-wise reduction's (fusion_rows.c) */
    free(n);
}

void fu_drop(tn_storage *st)
{
    pthread_mutex_lock(&fu_lock);
    fu_node *n = st->pending;
    st->pending = NULL;
    if (n) {
        unlink_node(n);
        free_node(n);
    }
    pthread_mutex_unlock(&fu_lock);
}

void fu_link(fu_node *nd)
{
    nd->st->pending = nd;
    nd->next = g_pending;
    if (g_pending) g_pending->prev = nd;
    g_pending = nd;
}

/* The leaf op reading (st, dtype, stride, offset), added unless the node has it (a new leaf's
 * storage is retained at once: fu_record releases it if the node is dropped). -2 when full. */
static int add_leaf(fu_node *nd, tn_storage *st, em_scalar dt, const int64_t *stride, int64_t offset)
{
    for (int j = 0; j < nd->nops; j++) {
        const fu_op *o = &nd->ops[j];
        if (o->kind != FU_LEAF) continue;
        const fu_leaf *l = &nd->leaves[o->a];
        if (l->st == st && l->dtype == dt && l->offset == offset &&
            !memcmp(l->stride, stride, sizeof(int64_t) * (size_t)nd->rank))
            return j;
    }
    if (nd->nleaves >= FU_MAX_LEAVES || nd->nops >= FU_MAX_OPS) return -2;
    fu_leaf *l = &nd->leaves[nd->nleaves];
    memset(l, 0, sizeof *l);
    l->st = st;
    l->dtype = dt;
    memcpy(l->stride, stride, sizeof(int64_t) * (size_t)nd->rank);
    l->offset = offset;
    if (st == nd->st)
        nd->inplace = true;
    else
        tn_storage_retain(st); /* held from now on: realizing a later input may free its owner */
    fu_op *o = &nd->ops[nd->nops];
    memset(o, 0, sizeof *o);
    o->kind = FU_LEAF;
    o->U = dt;
    o->a = (int8_t)nd->nleaves++;
    o->b = o->c = o->p = -1;
    o->name = "input";
    return nd->nops++;
}

/* Strides of the view of (rank, shape, stride) reshaped to (nrank, nshape) without a copy, as a
 * view reshape does; false when the layout does not allow it. */
static bool reshape_strides(int rank, const int64_t *shape, const int64_t *stride, int nrank,
                            const int64_t *nshape, int64_t *nstride)
{
    int64_t numel = tn_numel(rank, shape);
    if (numel == 0 || numel == 1) {
        tn_contig_strides(nrank, nshape, nstride);
        return true;
    }
    int view_d = nrank - 1;
    int64_t chunk_base_stride = rank ? stride[rank - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int d = rank - 1; d >= 0; d--) {
        tensor_numel *= shape[d];
        if (d == 0 || (shape[d - 1] != 1 && stride[d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || nshape[view_d] == 1)) {
                nstride[view_d] = view_numel * chunk_base_stride;
                view_numel *= nshape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (d > 0) {
                chunk_base_stride = stride[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

/* Copies pending node p, read through view t (a whole contiguous view of p's storage, any shape
 * of the same numel), into nd; the view is broadcast to nd's shape. Returns the root op's index,
 * or -1 when p's leaves cannot be re-strided to t's shape (nd is then unchanged). */
static int inline_node(fu_node *nd, const fu_node *p, const em_tensor *t)
{
    int64_t vstride[FU_MAX_LEAVES][EM_MAX_RANK];
    for (int i = 0; i < p->nleaves; i++)
        if (!reshape_strides(p->rank, p->shape, p->leaves[i].stride, t->rank, t->shape, vstride[i]))
            return -1;
    int map[FU_MAX_OPS];
    int off = nd->rank - t->rank;
    for (int j = 0; j < p->nops; j++) {
        const fu_op *o = &p->ops[j];
        if (o->kind == FU_LEAF) {
            const fu_leaf *l = &p->leaves[o->a];
            int64_t s[EM_MAX_RANK];
            for (int i = 0; i < nd->rank; i++) {
                int k = i - off;
                s[i] = (k < 0 || (t->shape[k] == 1 && nd->shape[i] != 1)) ? 0 : vstride[o->a][k];
            }
            map[j] = add_leaf(nd, l->st, l->dtype, s, l->offset);
            if (map[j] < 0) return -1; /* cannot happen: the caller checked the room */
            continue;
        }
        fu_op *q = &nd->ops[nd->nops];
        *q = *o;
        q->a = o->a >= 0 ? (int8_t)map[o->a] : -1;
        q->b = o->b >= 0 ? (int8_t)map[o->b] : -1;
        q->c = o->c >= 0 ? (int8_t)map[o->c] : -1;
        if (o->np > 0) {
            q->p = (int8_t)nd->nparams;
            for (int i = 0; i < o->np; i++) nd->params[nd->nparams++] = p->params[o->p + i];
        }
        map[j] = nd->nops++;
        nd->ncompute++;
    }
    return map[p->nops - 1];
}

bool fu_node_transcendental(const fu_node *p)
{
    for (int j = 0; j < p->nops; j++) {
        const fu_op *o = &p->ops[j];
        if (o->kind != FU_UNARY) continue;
        if ((o->code >= TN_U_EXP && o->code <= TN_U_EXPM1) ||
            (o->code >= TN_U_SIN && o->code <= TN_U_SIGMOID) ||
            (o->code >= TN_U_GELU && o->code <= TN_U_SOFTPLUS) || o->code == TN_U_POWS)
            return true;
    }
    return false;
}

/* Whether inlining pending node p into one more consumer would cost more than realizing it once
 * and reading it back: on the CPU, where these kernels are bound by arithmetic rather than
 * memory, when p was already inlined into another consumer and holds a transcendental op (exp,
 * log, tanh, erf, the GELUs, ...), which every consumer would compute again. On GPUs recomputing
 * is nearly free and saves a round trip through memory. */
static bool costly_to_share(const fu_node *p, const tn_storage *st)
{
    if (p->inlined == 0) return false;
    const em_caps *c = em_device_caps(st->dev);
    if (!c || strcmp(c->target, "c") != 0) return false;
    return fu_node_transcendental(p);
}

/* The operand op of input t (expanded to nd's shape by stride), inlining t's pending node when
 * it is a whole contiguous view and fits, else realizing it. `later` inputs still to come (each
 * needs room for one leaf). -1 with the error set when realizing failed, -2 when the node is full. */
static int add_input(fu_node *nd, const em_tensor *t, const int64_t *stride, int later)
{
    tn_storage *st = t->st;
    fu_node *p = st->pending;
    if (p && (p->inplace || p->mm) && st != nd->st) { /* a pending matmul is never inlined */
        if (fu_realize(st) != EM_OK) return -1;
        p = NULL;
    }
    if (p) {
        int64_t n = tn_numel(t->rank, t->shape);
        bool whole = t->dtype == p->dtype && t->offset == 0 && em_is_contiguous(t) &&
                     n == tn_numel(p->rank, p->shape);
        bool fits = nd->nops + p->nops + later + 1 <= FU_MAX_OPS &&
                    nd->nleaves + p->nleaves + later <= FU_MAX_LEAVES &&
                    nd->ncompute + p->ncompute + 1 <= FU_MAX_COMPUTE &&
                    nd->nparams + p->nparams + 2 <= FU_MAX_PARAMS &&
                    nd->nleaves + p->nleaves + later + 1 + nd->nparams + p->nparams + 2 <= FU_MAX_SCALARS;
        bool cheap = (n == tn_numel(nd->rank, nd->shape) || p->ncompute <= FU_BCAST_OPS) &&
                     !costly_to_share(p, st);
        if (whole && fits && cheap) {
            int r = inline_node(nd, p, t);
            if (r >= 0) {
                p->inlined++;
                return r;
            }
        }
        if (fu_realize(st) != EM_OK) return -1;
    }
    return add_leaf(nd, st, t->dtype, stride, t->offset);
}

int fu_desc_params(const fu_desc *d)
{
    if (d->kind != FU_UNARY && d->kind != FU_UPRED && d->kind != FU_FILL) return 0;
    if (d->code == TN_U_CLAMP) return 2;
    return d->code == TN_U_POWS || (d->code >= TN_U_ADDS && d->code <= TN_U_DIVS) ? 1 : 0;
}

void fu_push_op(fu_node *nd, const fu_desc *d, em_scalar U, const int *child)
{
    fu_op *o = &nd->ops[nd->nops];
    memset(o, 0, sizeof *o);
    o->kind = (uint8_t)d->kind;
    o->code = (uint8_t)d->code;
    o->C = d->C;
    o->M = d->M;
    o->U = U;
    o->a = (int8_t)child[0];
    o->b = (int8_t)child[1];
    o->c = (int8_t)child[2];
    o->np = (int8_t)fu_desc_params(d);
    o->p = o->np ? (int8_t)nd->nparams : -1;
    o->name = d->name;
    for (int i = 0; i < o->np; i++) nd->params[nd->nparams++] = d->p[i];
    nd->nops++;
    nd->ncompute++;
}

void fu_copy_view(em_tensor *dst, const em_tensor *t)
{
    *dst = *t;
    atomic_init(&dst->refs, 1);
    dst->scope = NULL;
    dst->scope_slot = 0;
    dst->taken = false;
    dst->annotation = NULL;
}

int fu_record(const fu_desc *d, const em_tensor *const *in, int nin, int64_t (*strides)[EM_MAX_RANK],
              em_tensor *out)
{
    if (!fu_enabled()) return 0;
    tn_storage *ost = out->st;
    int64_t numel = tn_numel(out->rank, out->shape);
    if (numel == 0 || atomic_load(&ost->refs) != 1 || out->offset != 0 || !em_is_contiguous(out) ||
        (size_t)numel * em_scalar_size(out->dtype) != ost->bytes || atomic_load(&ost->readers) != 0)
        return 0;
    for (int k = 0; k < nin; k++) {
        /* an input may be the output itself (an op on a donated buffer), not another view of it */
        if (in[k]->st == ost && (in[k]->dtype != out->dtype || in[k]->offset != 0 ||
                                 in[k]->rank != out->rank || !em_is_contiguous(in[k]) ||
                                 memcmp(in[k]->shape, out->shape, sizeof(int64_t) * (size_t)out->rank)))
            return 0;
        if (in[k]->st->dev != ost->dev) return 0;
    }
    if (ost->pending && ost->pending->mm) {
        /* the donated result of a pending matmul: its epilogue absorbs the op, or it runs now and
         * the op reads its buffer (fusion_matmul.c) */
        pthread_mutex_lock(&fu_lock);
        int r = ost->pending && ost->pending->mm ? fu_mm_absorb(ost->pending, d, in, nin, out) : 0;
        if (r > 0) atomic_fetch_add(&g_recorded, 1);
        pthread_mutex_unlock(&fu_lock);
        if (r != 0) return r;
    }
    for (int k = 0; k < nin && d->movable; k++) {
        /* a donated input that is the whole result of a pending matmul, which nothing else holds
         * and no recorder keeps: the matmul may write this op's output instead (its epilogue
         * absorbing the op), as with a donated buffer, while gradients are recorded */
        const em_tensor *t = in[k];
        tn_storage *s = t->st;
        if (!((d->movable >> k) & 1u) || !t->taken || s == ost || !s->pending || !s->pending->mm ||
            atomic_load(&t->refs) != 1 || atomic_load(&s->refs) != 1 ||
            atomic_load(&s->readers) != 0 || t->offset != 0 || !em_is_contiguous(t) ||
            t->dtype != out->dtype || s->bytes != ost->bytes || ost->buf || ost->pending)
            continue;
        pthread_mutex_lock(&fu_lock);
        int r = s->pending && s->pending->mm ? fu_mm_take(s->pending, d, in, nin, k, out) : 0;
        if (r > 0) atomic_fetch_add(&g_recorded, 1);
        pthread_mutex_unlock(&fu_lock);
        if (r != 0) return r;
    }
    if (nin == 1 && d->kind == FU_UNARY && in[0]->st->pending && in[0]->st->pending->mm) {
        /* an activation of a pending matmul's result that is kept (a GELU's input, for its
         * backward): the matmul writes both (fusion_matmul.c) */
        pthread_mutex_lock(&fu_lock);
        int r = fu_mm_act_pre(d, in[0], out);
        pthread_mutex_unlock(&fu_lock);
        if (r != 0) return r;
    }
    /* the donated result of a pending row-wise reduction: its epilogue absorbs the op, or it runs
     * now and the op reads its buffer (fusion_rows.c) */
    int rr = fu_rows_absorb(d, in, nin, strides, out);
    if (rr > 0) atomic_fetch_add(&g_recorded, 1);
    if (rr != 0) return rr;
    fu_node *nd = calloc(1, sizeof *nd);
    if (!nd) return 0; /* run it now */
    nd->rank = out->rank;
    memcpy(nd->shape, out->shape, sizeof nd->shape);
    nd->dtype = out->dtype;
    nd->st = ost;
    pthread_mutex_lock(&fu_lock);
    int child[3] = {-1, -1, -1};
    for (int k = 0; k < nin; k++) {
        child[k] = add_input(nd, in[k], strides[k], nin - 1 - k);
        if (child[k] < 0) {
            pthread_mutex_unlock(&fu_lock);
            for (int i = 0; i < nd->nleaves; i++)
                if (nd->leaves[i].st != ost) tn_storage_release(nd->leaves[i].st);
            free(nd);
            if (child[k] == -2) return 0; /* no room: run it now */
            em_error_context("%s", d->name);
            return -1;
        }
    }
    fu_push_op(nd, d, out->dtype, child);
    /* committed: the leaves (held since added) are read, and the storage's old pending value (if
     * any) is replaced */
    for (int i = 0; i < nd->nleaves; i++) {
        if (nd->leaves[i].st == ost) continue;
        atomic_fetch_add(&nd->leaves[i].st->readers, 1);
    }
    if (ost->pending) {
        fu_node *old = ost->pending;
        unlink_node(old);
        free_node(old);
    }
    ost->pending = nd;
    nd->next = g_pending;
    if (g_pending) g_pending->prev = nd;
    g_pending = nd;
    atomic_fetch_add(&g_recorded, 1);
    pthread_mutex_unlock(&fu_lock);
    return 1;
}

/* ---- kernel generation ----------------------------------------------------------------------- */

typedef struct {
    const char *name;   /* file stem */
    const char *source; /* contents */
} fu_builtin_src;
extern const fu_builtin_src em_builtin_kernel_sources[]; /* generated: the embedded src/kernels */

size_t fu_builtin_count(void)
{
    size_t n = 0;
    while (em_builtin_kernel_sources[n].name) n++;
    return n;
}

void fu_builtin_at(size_t i, const char **stem, const char **source)
{
    *stem = em_builtin_kernel_sources[i].name;
    *source = em_builtin_kernel_sources[i].source;
}

const char *fu_builtin_source(const char *stem)
{
    for (size_t i = 0; em_builtin_kernel_sources[i].name; i++)
        if (!strcmp(em_builtin_kernel_sources[i].name, stem)) return em_builtin_kernel_sources[i].source;
    return NULL;
}

static const char *ty(em_scalar s) { return em_scalar_name(s); }

/* The signature of nd's tree: what its generated source depends on. */
void fu_signature(const fu_node *nd, em_strbuf *sb)
{
    /* built at every realization: integers appended without printf */
    for (int j = 0; j < nd->nops; j++) {
        const fu_op *o = &nd->ops[j];
        const int f[10] = {o->kind, o->code, (int)o->C, (int)o->M, (int)o->U, o->a, o->b, o->c, o->p, o->np};
        for (int i = 0; i < 10; i++) {
            em_sb_append_int(sb, f[i]);
            em_sb_appendc(sb, i < 9 ? '.' : ';');
        }
    }
}

/* The line(U) value of op j from line(C) result r (as the unfused kernels store it). */
static void emit_store(em_strbuf *sb, const fu_op *o, int j, const char *ind)
{
    if (o->U == EM_BOOL)
        em_sb_printf(sb, "%sline(bool) fv%d = fr%d != %s(0);\n", ind, j, j, ty(o->C));
    else
        em_sb_printf(sb, "%sline(%s) fv%d = line(%s)(fr%d);\n", ind, ty(o->U), j, ty(o->U), j);
}

void fu_gen_params(const fu_node *nd, em_strbuf *sb)
{
    for (int i = 0; i < nd->nleaves; i++)
        em_sb_printf(sb, ", const tensor(line(%s), R) fx%d, u32 fx%d_off", ty(nd->leaves[i].dtype), i, i);
}

void fu_gen_params_scalars(const fu_node *nd, em_strbuf *sb)
{
    for (int j = 0; j < nd->nops; j++) {
        const fu_op *o = &nd->ops[j];
        for (int i = 0; i < o->np; i++) em_sb_printf(sb, ", %s fs%d", ty(o->C), o->p + i);
    }
}

void fu_gen_index(const fu_node *nd, em_strbuf *sb, const char *flat, const char *shaped, const char *ind)
{
    em_sb_printf(sb, "%su32 frem = (%s) / LINE_WIDTH;\n", ind, flat);
    for (int i = 0; i < nd->nleaves; i++) em_sb_printf(sb, "%su32 fi%d = fx%d_off;\n", ind, i, i);
    em_sb_printf(sb,
                 "%scomptime for (u32 fk in range(R)) {\n"
                 "%s    comptime u32 fd = R - 1 - fk;\n"
                 "%s    u32 fsz = shape(%s, fd);\n"
                 "%s    comptime if (fk == 0) { fsz = fsz / LINE_WIDTH; }\n"
                 "%s    u32 fc = frem %% fsz;\n"
                 "%s    frem = frem / fsz;\n"
                 "%s    comptime if (fk == 0) { fc = fc * LINE_WIDTH; }\n",
                 ind, ind, ind, shaped, ind, ind, ind, ind);
    for (int i = 0; i < nd->nleaves; i++)
        em_sb_printf(sb, "%s    fi%d += fc * stride(fx%d, fd);\n", ind, i, i);
    em_sb_printf(sb, "%s}\n", ind);
}

void fu_gen_ops(const fu_node *nd, em_strbuf *sb, const char *ind)
{
    for (int j = 0; j < nd->nops; j++) {
        const fu_op *o = &nd->ops[j];
        const char *C = ty(o->C), *M = ty(o->M);
        char p0[32], p1[32]; /* the parameters, or zeros of type C for those the op ignores */
        if (o->np > 0) snprintf(p0, sizeof p0, "fs%d", o->p);
        else snprintf(p0, sizeof p0, "%s(0)", C);
        if (o->np > 1) snprintf(p1, sizeof p1, "fs%d", o->p + 1);
        else snprintf(p1, sizeof p1, "%s(0)", C);
        em_sb_append(sb, ind);
        switch (o->kind) {
        case FU_LEAF:
            em_sb_printf(sb, "line(%s) fv%d = fx%d[fi%d / LINE_WIDTH];\n", ty(o->U), j, o->a, o->a);
            break;
        case FU_UNARY:
            em_sb_printf(sb, "line(%s) fr%d = tn_unary_op(line(%s)(fv%d), %s, %s, %s(0), %d);\n", C, j, C,
                         o->a, p0, p1, M, o->code);
            emit_store(sb, o, j, ind);
            break;
        case FU_FILL:
            em_sb_printf(sb, "line(%s) fr%d = tn_unary_op(line(%s)(%s), %s, %s, %s(0), %d);\n", C, j, C, p0,
                         p0, p1, M, o->code);
            emit_store(sb, o, j, ind);
            break;
        case FU_UPRED:
            em_sb_printf(sb, "line(bool) fv%d = tn_unary_pred(line(%s)(fv%d), %s, %d);\n", j, C, o->a, p0,
                         o->code);
            break;
        case FU_BINARY:
            em_sb_printf(sb, "line(%s) fr%d = tn_binary_op(line(%s)(fv%d), line(%s)(fv%d), %s(0), %d);\n", C,
                         j, C, o->a, C, o->b, M, o->code);
            emit_store(sb, o, j, ind);
            break;
        case FU_BPRED:
            em_sb_printf(sb, "line(bool) fv%d = tn_binary_pred(line(%s)(fv%d), line(%s)(fv%d), %d);\n", j, C,
                         o->a, C, o->b, o->code);
            break;
        default: /* FU_WHERE */
            em_sb_printf(sb, "line(%s) fv%d = select(fv%d, fv%d, fv%d);\n", ty(o->U), j, o->a, o->b, o->c);
            break;
        }
    }
}

/* The kernel-language source of nd's fused kernel "fused": the output's flat index walks the
 * leaves (the output is contiguous, so its index is the flat one). */
static void generate(const fu_node *nd, em_strbuf *sb)
{
    em_sb_append(sb, "/* generated by src/tensor/fusion.c */\nkernel void fused(comptime u32 R = 1");
    fu_gen_params(nd, sb);
    em_sb_printf(sb, ", tensor(line(%s), R) out, u32 out_off", ty(nd->dtype));
    fu_gen_params_scalars(nd, sb);
    em_sb_append(sb, ")\n{\n    if (ABSOLUTE_POS < len(out)) {\n");
    fu_gen_index(nd, sb, "ABSOLUTE_POS * LINE_WIDTH", "out", "        ");
    fu_gen_ops(nd, sb, "        ");
    em_sb_printf(sb, "        out[out_off / LINE_WIDTH + ABSOLUTE_POS] = fv%d;\n    }\n}\n", nd->nops - 1);
}

/* "exp, add, mul" into sb. */
void fu_op_list(const fu_node *nd, em_strbuf *sb)
{
    bool first = true;
    for (int j = 0; j < nd->nops; j++) {
        if (nd->ops[j].kind == FU_LEAF) continue;
        em_sb_printf(sb, "%s%s", first ? "" : ", ", nd->ops[j].name);
        first = false;
    }
}

/* The cached kernel of nd's signature, generated and loaded on a miss. NULL with the error set. */
static fu_kernel *kernel_for(const fu_node *nd)
{
    em_strbuf key;
    em_sb_init(&key);
    fu_signature(nd, &key);
    fu_kernel *k = key.oom ? NULL : em_map_gets(&g_cache, key.data);
    if (k || key.oom) {
        if (!k) em_set_error(EM_ERR_NOMEM, "out of host memory");
        em_sb_free(&key);
        return k;
    }
    const char *ew = fu_builtin_source("tensor_elementwise");
    em_strbuf src;
    em_sb_init(&src);
    generate(nd, &src);
    if (!ew || src.oom) {
        em_set_error(EM_ERR_INTERNAL, "the elementwise kernels are missing");
        em_sb_free(&src);
        em_sb_free(&key);
        return NULL;
    }
    const char *names[2] = {"tensor_elementwise.ek", "fused.ek"};
    const char *srcs[2] = {ew, src.data};
    em_lang_module *m = em_lang_module_from_strings(names, srcs, 2, NULL);
    k = m ? calloc(1, sizeof *k) : NULL;
    if (k) {
        k->m = m;
        k->id = ++g_nkernels;
        if (!em_map_puts(&g_cache, key.data, k)) {
            free(k);
            k = NULL;
        }
    }
    if (!k) em_lang_module_free(m);
    if (k) fu_count_compile();
    if (k && fu_debug_on()) fprintf(stderr, "ember fusion: kernel #%d generated:\n%s", k->id, src.data);
    em_sb_free(&src);
    em_sb_free(&key);
    return k;
}

/* ---- realizing ------------------------------------------------------------------------------- */

/* Allocates st's buffer if it has none yet (a deferred storage: tn_new_deferred). Called with the
 * lock held. EM_OK, or the error set (out of device memory). */
em_status fu_ensure_buffer(tn_storage *st)
{
    if (st->buf) return EM_OK;
    st->buf = em_buffer_alloc(st->dev, st->bytes ? st->bytes : 16);
    return st->buf ? EM_OK : em_last_status();
}

em_arg fu_operand_arg(tn_storage *st, em_scalar dt, unsigned lw, const fu_walk *w, int k)
{
    uint64_t len = (uint64_t)(st->bytes / em_scalar_size(dt)) / lw;
    return em_arg_tensor(st->buf, 0, len ? len : 1, (unsigned)w->rank, w->shape, w->stride[k]);
}

unsigned fu_node_walk(const fu_node *nd, fu_walk *w, em_scalar *dts, int64_t *offs)
{
    int n = nd->nleaves + 1;
    int64_t strides[FU_WALK_MAX][EM_MAX_RANK];
    for (int i = 0; i < nd->nleaves; i++) {
        memcpy(strides[i], nd->leaves[i].stride, sizeof strides[i]);
        offs[i] = nd->leaves[i].offset;
        dts[i] = nd->leaves[i].dtype;
    }
    tn_contig_strides(nd->rank, nd->shape, strides[n - 1]);
    offs[n - 1] = 0;
    dts[n - 1] = nd->dtype;
    fu_walk_build(w, nd->rank, nd->shape, n, strides);
    return fu_walk_width(w, nd->st->dev, dts, n, offs);
}

/* Launches nd's fused kernel (the caller holds the lock). EM_OK or the error set. */
static em_status launch_node(fu_node *nd)
{
    int n = nd->nleaves + 1;
    int64_t offs[FU_WALK_MAX];
    em_scalar dts[FU_WALK_MAX];
    fu_walk w;
    unsigned lw = fu_node_walk(nd, &w, dts, offs);
    fu_kernel *k = kernel_for(nd);
    if (!k) return EM_ERR_INVALID;
    uint64_t read = 0;
    uint64_t written = (uint64_t)tn_numel(nd->rank, nd->shape) * em_scalar_size(nd->dtype);
    for (int i = 0; i < nd->nleaves; i++) {
        if (fu_ensure_buffer(nd->leaves[i].st) != EM_OK) return em_last_status(); /* never deferred */
        read += tn_view_bytes(dts[i], nd->rank, nd->shape, nd->leaves[i].stride);
    }
    em_arg args[2 * FU_WALK_MAX + FU_MAX_PARAMS];
    size_t na = 0;
    for (int i = 0; i < nd->nleaves; i++) {
        args[na++] = fu_operand_arg(nd->leaves[i].st, dts[i], lw, &w, i);
        args[na++] = em_arg_u32((uint32_t)offs[i]);
    }
    args[na++] = fu_operand_arg(nd->st, nd->dtype, lw, &w, n - 1);
    args[na++] = em_arg_u32(0);
    for (int i = 0; i < nd->nparams; i++) args[na++] = nd->params[i];
    em_lang_bind b[1] = {em_lang_bind_int("R", w.rank)};
    em_lang_spec spec = {b, 1, lw, NULL};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)tn_numel(nd->rank, nd->shape) / lw, cubes, units);
    if (fu_debug_on()) {
        em_strbuf sb;
        em_sb_init(&sb);
        fu_op_list(nd, &sb);
        char d[128];
        tn_describe_shape(nd->dtype, nd->rank, nd->shape, d, sizeof d);
        fprintf(stderr, "ember fusion: kernel #%d: %d ops (%s) over %s, %d inputs, line width %u\n", k->id,
                nd->ncompute, sb.data, d, nd->nleaves, lw);
        em_sb_free(&sb);
    }
    em_status st = em_lang_launch(nd->st->dev, k->m, "fused", &spec, cubes, units, args, na);
    if (st == EM_OK) {
        fu_count_launch("fused", read, written);
        fu_count_fused(nd->ncompute);
    }
    return st;
}

em_status fu_realize(tn_storage *st)
{
    if (!st || (!st->pending && st->buf)) return EM_OK;
    pthread_mutex_lock(&fu_lock);
    fu_node *nd = st->pending;
    /* the buffer is allocated when the tree runs (its leaves alive), not when it was recorded */
    em_status s = fu_ensure_buffer(st);
    if (s != EM_OK && !nd) em_error_context("tensor of %zu bytes", st->bytes);
    if (nd) {
        if (s == EM_OK && nd->rows) s = fu_rows_launch(nd); /* fusion_rows.c */
        else if (s == EM_OK) s = nd->mm ? fu_mm_launch(nd) : launch_node(nd);
        if (s == EM_OK) {
            st->pending = NULL;
            unlink_node(nd);
            free_node(nd);
        } else if (nd->rows) {
            fu_rows_error(nd); /* names the reduction and its epilogue */
        } else if (nd->mm) {
            fu_mm_error(nd); /* names the matmul and its epilogue */
        } else {
            em_strbuf sb;
            em_sb_init(&sb);
            fu_op_list(nd, &sb);
            char d[128];
            tn_describe_shape(nd->dtype, nd->rank, nd->shape, d, sizeof d);
            em_error_context("fused kernel of %s (%s; EMBER_FUSION=0 runs the ops one by one)",
                             sb.data, d);
            em_sb_free(&sb);
        }
    }
    pthread_mutex_unlock(&fu_lock);
    return s;
}

em_status tn_realize(const em_tensor *t)
{
    return t ? fu_realize(t->st) : EM_OK;
}

em_status em_realize(const em_tensor *t)
{
    if (!t) return EM_OK;
    em_status s = fu_realize(t->st);
    return s == EM_OK ? fu_before_write(t->st) : s;
}

int fu_run_into(const em_tensor *src, em_tensor *dst)
{
    tn_storage *s = src->st;
    size_t es = em_scalar_size(dst->dtype);
    if (!fu_enabled() || !src->taken || src->annotation || s == dst->st || s->dev != dst->st->dev ||
        src->dtype != dst->dtype || src->rank != dst->rank || src->offset != 0 ||
        memcmp(src->shape, dst->shape, sizeof(int64_t) * (size_t)src->rank) != 0 ||
        !em_is_contiguous(src) || !em_is_contiguous(dst) || ((size_t)dst->offset * es) % 256 != 0 ||
        (size_t)tn_numel(src->rank, src->shape) * es != s->bytes)
        return 0;
    pthread_mutex_lock(&fu_lock);
    fu_node *nd = s->pending;
    if (!nd || !nd->mm || s->buf || atomic_load(&src->refs) != 1 || atomic_load(&s->refs) != 1 ||
        atomic_load(&s->readers) != 0) {
        pthread_mutex_unlock(&fu_lock);
        return 0;
    }
    /* dst's own pending value first (its buffer allocated), then the nodes that read it */
    em_status st = fu_realize(dst->st);
    if (st == EM_OK) st = fu_before_write(dst->st);
    if (st == EM_OK && s->pending == nd) {
        st = fu_mm_launch_into(nd, dst);
        if (st == EM_OK) {
            /* src's storage is left without a buffer: its one holder is released by the caller */
            s->pending = NULL;
            unlink_node(nd);
            free_node(nd);
            pthread_mutex_unlock(&fu_lock);
            return 1;
        }
        fu_mm_error(nd);
    }
    pthread_mutex_unlock(&fu_lock);
    return st == EM_OK ? 0 : -1;
}

em_status fu_before_write(tn_storage *st)
{
    if (atomic_load(&st->readers) == 0) return EM_OK;
    pthread_mutex_lock(&fu_lock);
    em_status s = EM_OK;
    bool again = true;
    while (again && s == EM_OK) {
        again = false;
        for (fu_node *n = g_pending; n; n = n->next) {
            bool reads = false;
            for (int i = 0; i < n->nleaves; i++) reads |= n->leaves[i].st == st;
            if (reads) {
                s = fu_realize(n->st); /* unlinks n: restart the scan */
                again = true;
                break;
            }
        }
    }
    pthread_mutex_unlock(&fu_lock);
    return s;
}

em_status em_flush(void)
{
    pthread_mutex_lock(&fu_lock);
    em_status s = EM_OK;
    while (g_pending && s == EM_OK) s = fu_realize(g_pending->st);
    pthread_mutex_unlock(&fu_lock);
    return s;
}
