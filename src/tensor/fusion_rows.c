/* fusion_rows.c — pending row-wise reductions and the epilogues they absorb (docs/fusion.md,
 * "Reductions with an epilogue").
 *
 * With fusion on, the row-wise reductions of ops_reduce.c (softmax, log_softmax, layer_norm,
 * rms_norm through tensor_rows; float sum and mean over the last dims through tensor_rows_sum)
 * check their operands at the call and record their fresh result
 * as a pending node (fu_node.rows) instead of launching: the node keeps copies of the views
 * (fu_rows_call), and its leaves hold the input's, weight's and bias's storages (retained,
 * counted as readers), so fu_before_write, em_flush, freeing and every sync point treat it as a
 * pending tree. It is marked `inplace` (its value is its own storage's), so an elementwise
 * consumer never inlines it: it realizes it and reads its buffer.
 *
 * An elementwise op that consumes the donated result — in place (em_mul_scalar(em_take(y), 2)),
 * or as a donated input of an op whose fresh output has the result's shape
 * (em_cast(em_take(y), EM_BF16): the node moves to the output's storage, and a copy of it stays
 * on the donated one, dropped unrun when the op frees it) — extends the node's epilogue: an
 * elementwise tree (epi, a fu_node used for generation only) over the result's shape whose
 * reduction value is the FU_LEAF op with leaf index -1, and whose other leaves are realized buffers
 * read through strides (held by the node's leaves too). Anything else runs the reduction first and
 * is recorded on its buffer as before.
 *
 * Cross-entropy's per-row loss (ops_xent.c, tensor_xent) is recorded the same way (kind 2).
 *
 * Realizing calls back into ops_reduce.c (tn_rows_run), which launches the row-wise kernel once:
 * with the input's pending tree in its loads when it takes one (fusion_reduce.c) and with the
 * epilogue in its stores, by substitution in the kernel's own text (fu_epi_instantiate): the
 * output parameter `tensor(line(T)) out, ` becomes `tensor(line(E)) out, ` (E: the epilogue's
 * dtype) followed by `comptime u32 RE = 1, ` and the epilogue's leaves and scalars (names
 * fex<i>, fex<i>_off, fes<j>), and each store `out[<i>] = line(T)(<v>);` becomes
 * `fu_store(out, <i>, <v>, RE, <leaves>, <scalars>);`, a generated helper that rounds v to T as
 * the store did, evaluates the tree at line <i> of the (contiguous) result and stores the root.
 * tensor_rows_sum stores scalars (`tensor(T) out,`, `out[<i>] = T(<v>);`): its fu_store reads
 * the leaves as scalars and evaluates the tree on lines whose lanes all hold element <i>.
 *
 * Operands that are themselves pending matmuls or reductions run when the node is recorded or
 * absorbs them, so a node's operands are realized buffers or pending elementwise trees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion_internal.h"

typedef struct fu_rows {
    fu_rows_call call; /* what ops_reduce.c runs; call.out on the node's storage */
    int kscalars;      /* the plain kernel's scalar arguments (FU_MAX_SCALARS counts them) */
    fu_node epi;       /* the epilogue (nops 0: none); epi.st is the node's storage */
    int absorbed;      /* elementwise ops absorbed */
} fu_rows;


/* Runs the pending matmul or reduction of st, if it has one. EM_OK or the error set. */
static em_status settle(tn_storage *st)
{
    fu_node *p = st->pending;
    return p && (p->mm || p->rows) ? fu_realize(st) : EM_OK;
}

/* Holds st as a leaf of nd (retained, counted as a reader). */
static void hold(fu_node *nd, tn_storage *st)
{
    fu_leaf *l = &nd->leaves[nd->nleaves++];
    memset(l, 0, sizeof *l);
    l->st = st;
    tn_storage_retain(st);
    atomic_fetch_add(&st->readers, 1);
}

int fu_rows_record(const fu_rows_call *c)
{
    if (!fu_enabled()) return 0;
    fu_node *nd = calloc(1, sizeof *nd);
    fu_rows *r = calloc(1, sizeof *r);
    if (!nd || !r) {
        free(nd);
        free(r);
        return 0; /* run it now */
    }
    pthread_mutex_lock(&fu_lock);
    if (settle(c->x.st) != EM_OK || (c->has_w && settle(c->w.st) != EM_OK) ||
        (c->has_b && settle(c->b.st) != EM_OK)) {
        pthread_mutex_unlock(&fu_lock);
        free(nd);
        free(r);
        em_error_context("%s", c->op);
        return -1;
    }
    /* a pending input tree now has one more consumer (the reduction computes it in its loads or
     * realizes it when it runs), as when the reduction ran at once: on the CPU a second consumer
     * then realizes a transcendental tree instead of recomputing it (fusion.c, costly_to_share) */
    if (c->x.st->pending) c->x.st->pending->inlined++;
    r->call = *c;
    fu_copy_view(&r->call.x, &c->x);
    if (c->has_w) fu_copy_view(&r->call.w, &c->w);
    if (c->has_b) fu_copy_view(&r->call.b, &c->b);
    fu_copy_view(&r->call.out, &c->out);
    /* tensor_rows: 4 offsets, rows, nl, 2 row strides, eps, op, affine; tensor_rows_sum: 2
     * offsets, rows, nl, the row stride, scale */
    r->kscalars = c->kind == 1 ? 6 : c->kind == 2 ? 7 : 11;
    nd->st = c->out.st;
    nd->rank = c->out.rank;
    memcpy(nd->shape, c->out.shape, sizeof nd->shape);
    nd->dtype = c->out.dtype;
    nd->inplace = true; /* never inlined into a consumer (fusion.c's add_input realizes it) */
    nd->rows = r;
    hold(nd, c->x.st);
    if (c->has_w) hold(nd, c->w.st);
    if (c->has_b) hold(nd, c->b.st);
    r->epi.st = nd->st;
    fu_link(nd);
    pthread_mutex_unlock(&fu_lock);
    return 1;
}

/* Whether stride (over shape) reads a contiguous tensor of that shape element by element. */
static bool contiguous_over(int rank, const int64_t *shape, const int64_t *stride)
{
    int64_t want = 1;
    for (int i = rank - 1; i >= 0; i--) {
        if (shape[i] == 1) continue;
        if (stride[i] != want) return false;
        want *= shape[i];
    }
    return true;
}

/* The pending reduction whose donated result op's inputs consume (*self: the input), or NULL:
 * in place (an input on out's own storage), else a donated whole input of out's shape when out
 * is a fresh storage no other input reads (then *moved). */
static fu_node *consumed(const em_tensor *const *in, int nin, int64_t (*strides)[EM_MAX_RANK],
                         const em_tensor *out, int *self, bool *moved)
{
    *moved = false;
    for (int k = 0; k < nin; k++) {
        fu_node *p = in[k]->st->pending;
        if (p && p->rows && in[k]->st == out->st) {
            *self = k;
            return p;
        }
    }
    if (out->st->pending) return NULL;
    for (int k = 0; k < nin; k++) {
        fu_node *p = in[k]->st->pending;
        if (!p || !p->rows || !tn_reusable(in[k]) || in[k]->dtype != p->dtype ||
            tn_numel(in[k]->rank, in[k]->shape) != tn_numel(out->rank, out->shape) ||
            !contiguous_over(out->rank, out->shape, strides[k]))
            continue;
        for (int j = 0; j < nin; j++)
            if (in[j]->st == out->st || (in[j]->st == in[k]->st && in[j] != in[k])) return NULL;
        *self = k;
        *moved = true;
        return p;
    }
    return NULL;
}

/* The epilogue's leaf op reading view t through stride (over epi's shape), added unless epi has
 * it; -1 when there is no room (the node's leaves hold every new one). */
static int epi_leaf(fu_node *nd, const em_tensor *t, const int64_t *stride)
{
    fu_node *e = &nd->rows->epi;
    for (int j = 0; j < e->nops; j++) {
        const fu_op *o = &e->ops[j];
        if (o->kind != FU_LEAF || o->a < 0) continue;
        const fu_leaf *l = &e->leaves[o->a];
        if (l->st == t->st && l->dtype == t->dtype && l->offset == t->offset &&
            !memcmp(l->stride, stride, sizeof(int64_t) * (size_t)e->rank))
            return j;
    }
    if (e->nleaves >= FU_WALK_MAX - 1 || nd->nleaves >= FU_MAX_LEAVES || e->nops >= FU_MAX_OPS)
        return -1;
    fu_leaf *l = &e->leaves[e->nleaves];
    memset(l, 0, sizeof *l);
    l->st = t->st;
    l->dtype = t->dtype;
    memcpy(l->stride, stride, sizeof(int64_t) * (size_t)e->rank);
    l->offset = t->offset;
    fu_op *o = &e->ops[e->nops];
    memset(o, 0, sizeof *o);
    o->kind = FU_LEAF;
    o->U = t->dtype;
    o->a = (int8_t)e->nleaves++;
    o->b = o->c = o->p = -1;
    o->name = "input";
    hold(nd, t->st);
    return e->nops++;
}

/* Extends nd's epilogue with op d (the inputs on nd's storage are its value; the others are
 * realized); false, nd unchanged, when it does not fit. */
static bool extend(fu_node *nd, const fu_desc *d, const em_tensor *const *in, int nin,
                   int64_t (*strides)[EM_MAX_RANK], const em_tensor *out)
{
    fu_rows *r = nd->rows;
    fu_node *e = &r->epi;
    int np = fu_desc_params(d);
    int nnew = 0;
    for (int k = 0; k < nin; k++) nnew += in[k]->st != nd->st;
    if (e->nops + nnew + 2 > FU_MAX_OPS || e->ncompute + 1 > FU_MAX_COMPUTE ||
        e->nparams + np > FU_MAX_PARAMS ||
        r->kscalars + e->nleaves + nnew + e->nparams + np > FU_MAX_SCALARS)
        return false;
    if (e->nops > 0 &&
        (e->rank != out->rank || memcmp(e->shape, out->shape, sizeof(int64_t) * (size_t)out->rank)))
        return false;
    int nops0 = e->nops, eleaves0 = e->nleaves, leaves0 = nd->nleaves;
    if (e->nops == 0) { /* the reduction's value: the FU_LEAF op with leaf index -1 */
        e->rank = out->rank;
        memcpy(e->shape, out->shape, sizeof e->shape);
        fu_op *o = &e->ops[0];
        memset(o, 0, sizeof *o);
        o->kind = FU_LEAF;
        o->U = nd->dtype;
        o->a = o->b = o->c = o->p = -1;
        o->name = "reduction";
        e->nops = 1;
    }
    int root = e->nops - 1, child[3] = {-1, -1, -1};
    for (int k = 0; k < nin; k++) {
        child[k] = in[k]->st == nd->st ? root : epi_leaf(nd, in[k], strides[k]);
        if (child[k] < 0) { /* no room: undone */
            for (int i = leaves0; i < nd->nleaves; i++) {
                atomic_fetch_sub(&nd->leaves[i].st->readers, 1);
                tn_storage_release(nd->leaves[i].st);
            }
            nd->nleaves = leaves0;
            e->nleaves = eleaves0;
            e->nops = nops0;
            return false;
        }
    }
    fu_push_op(e, d, out->dtype, child);
    e->dtype = out->dtype;
    nd->dtype = out->dtype;
    r->absorbed++;
    return true;
}

/* A copy of nd (its reduction and epilogue so far) left pending on nd's storage when nd moves to
 * another: the donated storage keeps its value, computed only if something still reads it (the
 * op normally frees it unread, and the copy is dropped). NULL when out of memory. */
static fu_node *snapshot(const fu_node *nd)
{
    fu_node *c = malloc(sizeof *c);
    fu_rows *r = malloc(sizeof *r);
    if (!c || !r) {
        free(c);
        free(r);
        return NULL;
    }
    *c = *nd;
    *r = *nd->rows;
    c->rows = r;
    c->prev = c->next = NULL;
    return c;
}

int fu_rows_absorb(const fu_desc *d, const em_tensor *const *in, int nin,
                   int64_t (*strides)[EM_MAX_RANK], const em_tensor *out)
{
    bool any = false; /* the common case: no input is pending */
    for (int k = 0; k < nin; k++) any |= in[k]->st->pending != NULL;
    if (!any) return 0;
    pthread_mutex_lock(&fu_lock);
    int self = -1;
    bool moved = false;
    fu_node *nd = consumed(in, nin, strides, out, &self, &moved);
    if (nd) { /* the other inputs are read as realized leaves */
        for (int k = 0; k < nin; k++) {
            if (in[k]->st == nd->st || !in[k]->st->pending) continue;
            if (fu_realize(in[k]->st) != EM_OK) {
                pthread_mutex_unlock(&fu_lock);
                em_error_context("%s", d->name);
                return -1;
            }
        }
        nd = consumed(in, nin, strides, out, &self, &moved); /* (realizing may have run it) */
    }
    if (!nd) {
        /* an input that is a pending reduction, not consumed as a value, runs now, before
         * fu_record inlines the other inputs' trees: running it may run (and free) one of them,
         * the one it reads (its own input), and with it the leaves the new tree would read */
        for (int k = 0; k < nin; k++) {
            fu_node *p = in[k]->st->pending;
            if (p && p->rows && fu_realize(in[k]->st) != EM_OK) {
                pthread_mutex_unlock(&fu_lock);
                em_error_context("%s", d->name);
                return -1;
            }
        }
        pthread_mutex_unlock(&fu_lock);
        return 0;
    }
    fu_node *keep = moved ? snapshot(nd) : NULL;
    if ((moved && !keep) || !extend(nd, d, in, nin, strides, out)) {
        /* not an epilogue: the reduction runs, the op reads its buffer */
        free(keep ? keep->rows : NULL);
        free(keep);
        em_status s = fu_realize(nd->st);
        pthread_mutex_unlock(&fu_lock);
        if (s == EM_OK) return 0;
        em_error_context("%s", d->name);
        return -1;
    }
    if (moved) {
        for (int i = 0; i < keep->nleaves; i++) {
            tn_storage_retain(keep->leaves[i].st);
            atomic_fetch_add(&keep->leaves[i].st->readers, 1);
        }
        nd->st->pending = NULL;
        fu_link(keep); /* on the donated storage */
        nd->st = out->st;
        out->st->pending = nd;
        nd->rows->epi.st = nd->st;
    }
    nd->rows->call.out.st = nd->st;
    nd->rows->call.out.dtype = nd->dtype;
    pthread_mutex_unlock(&fu_lock);
    return 1;
}

/* "softmax f32[3, 33] + mul_scalar, cast" into sb. */
static void describe(const fu_node *nd, em_strbuf *sb)
{
    const fu_rows *r = nd->rows;
    char d[128];
    tn_describe_shape(r->call.x.dtype, r->call.x.rank, r->call.x.shape, d, sizeof d);
    em_sb_printf(sb, "%s %s", r->call.op, d);
    if (r->epi.nops) {
        em_sb_append(sb, " + ");
        fu_op_list(&r->epi, sb);
    }
}

em_status fu_rows_launch(fu_node *nd)
{
    fu_rows *r = nd->rows;
    r->call.out.st = nd->st;
    r->call.out.dtype = nd->dtype;
    r->epi.st = nd->st;
    if (fu_debug_on()) {
        em_strbuf sb;
        em_sb_init(&sb);
        describe(nd, &sb);
        fprintf(stderr, "ember fusion: %s (%d ops absorbed)\n", sb.data ? sb.data : "reduction",
                r->absorbed);
        em_sb_free(&sb);
    }
    nd->st->pending = NULL; /* a sync point reached while it launches must not run it again */
    em_status s = tn_rows_run(&r->call, r->epi.nops ? &r->epi : NULL);
    nd->st->pending = nd;
    return s;
}

void fu_rows_error(const fu_node *nd)
{
    em_strbuf sb;
    em_sb_init(&sb);
    describe(nd, &sb);
    em_error_context("%s (EMBER_FUSION=0 runs it at once)", sb.data ? sb.data : "reduction");
    em_sb_free(&sb);
}

void fu_rows_free(fu_node *nd)
{
    free(nd->rows);
    nd->rows = NULL;
}

/* ---- kernel text ----------------------------------------------------------------------------- */

/* The epilogue's leaves and scalars: declarations for the kernel (`const tensor(line(L), RE)
 * fex<i>, u32 fex<i>_off, ... C fes<j>, `; kernel), for the helper (`const tensor(line(L))
 * fx<i>, u32 fx<i>_off, ... C fs<j>, `; !kernel && decl) or the names the kernel passes
 * (`fex<i>, fex<i>_off, ... fes<j>, `; !decl). */
static void epi_list(const fu_node *e, em_strbuf *sb, bool decl, bool kernel, bool scalar)
{
    const char *p = kernel || !decl ? "fe" : "f";
    for (int i = 0; i < e->nleaves; i++) {
        const char *L = em_scalar_name(e->leaves[i].dtype);
        if (decl && scalar)
            em_sb_printf(sb, "const tensor(%s%s) %sx%d, u32 %sx%d_off, ", L, kernel ? ", RE" : "",
                         p, i, p, i);
        else if (decl)
            em_sb_printf(sb, "const tensor(line(%s)%s) %sx%d, u32 %sx%d_off, ", L,
                         kernel ? ", RE" : "", p, i, p, i);
        else
            em_sb_printf(sb, "%sx%d, %sx%d_off, ", p, i, p, i);
    }
    for (int j = 0; j < e->nops; j++) {
        const fu_op *o = &e->ops[j];
        for (int i = 0; i < o->np; i++) {
            if (decl)
                em_sb_printf(sb, "%s %ss%d, ", em_scalar_name(o->C), p, o->p + i);
            else
                em_sb_printf(sb, "%ss%d, ", p, o->p + i);
        }
    }
}

/* Appends text to sb with every `from` replaced by `to`. */
static void replace_all(em_strbuf *sb, const char *text, const char *from, const char *to)
{
    for (const char *f; (f = strstr(text, from)) != NULL; text = f + strlen(from)) {
        em_sb_appendn(sb, text, (size_t)(f - text));
        em_sb_append(sb, to);
    }
    em_sb_append(sb, text);
}

/* fu_store: the store `out[at] = line(T)(fy0)` with the epilogue applied to the rounded value.
 * With `scalar` (an output of scalars: tensor_rows_sum), `out[at] = T(fy0)` instead: the tree is
 * evaluated on lines whose lanes all hold element `at` (the leaves are tensors of scalars, read
 * once and broadcast; LINE_WIDTH reads 1 in the index code), and lane 0 is stored. */
static bool gen_store(const fu_node *e, em_strbuf *sb, bool scalar)
{
    const char *T = em_scalar_name(e->ops[0].U), *E = em_scalar_name(e->dtype);
    em_sb_append(sb, "/* generated by src/tensor/fusion_rows.c */\n");
    if (scalar)
        em_sb_printf(
            sb, "inline<C: float> void fu_store(tensor(%s) fo, u32 at, C fy0, comptime u32 R, ", E);
    else
        em_sb_printf(sb,
                     "inline<C: float> void fu_store(tensor(line(%s)) fo, u32 at, line(C) fy0, "
                     "comptime u32 R, ",
                     E);
    epi_list(e, sb, true, false, scalar);
    em_sb_append(sb, "comptime u32 FU_END = 0)\n{\n");
    if (scalar)
        em_sb_printf(sb, "    line(%s) fy = line(%s)(%s(fy0));\n", T, T, T);
    else
        em_sb_printf(sb, "    line(%s) fy = line(%s)(fy0);\n", T, T);
    em_strbuf body;
    em_sb_init(&body);
    if (e->nleaves > 0) fu_gen_index(e, &body, scalar ? "at" : "at * LINE_WIDTH", "fx0", "    ");
    fu_gen_ops(e, &body, "    ");
    /* the value's leaf op (index -1) reads fy */
    static const char VALUE[] = "fx-1[fi-1 / LINE_WIDTH]";
    const char *v = body.data ? strstr(body.data, VALUE) : NULL;
    bool ok = v && !strstr(v + 1, VALUE) && !body.oom;
    if (ok) {
        em_strbuf t;
        em_sb_init(&t);
        em_sb_appendn(&t, body.data, (size_t)(v - body.data));
        em_sb_append(&t, "fy");
        em_sb_append(&t, v + strlen(VALUE));
        if (!scalar) {
            em_sb_append(sb, t.data);
            em_sb_printf(sb, "    fo[at] = fv%d;\n}\n\n", e->nops - 1);
        } else {
            /* the leaves' loads broadcast, then every other LINE_WIDTH is 1 */
            em_strbuf u;
            em_sb_init(&u);
            const char *q = t.data;
            for (int i = 0; i < e->nleaves; i++) {
                char from[48], to[64];
                snprintf(from, sizeof from, "= fx%d[fi%d / LINE_WIDTH];", i, i);
                snprintf(to, sizeof to, "= line(%s)(fx%d[fi%d]);",
                         em_scalar_name(e->leaves[i].dtype), i, i);
                em_sb_free(&u);
                em_sb_init(&u);
                replace_all(&u, q, from, to);
                em_sb_free(&t);
                t = u;
                em_sb_init(&u);
                q = t.data;
            }
            replace_all(sb, q, "LINE_WIDTH", "1u");
            em_sb_free(&u);
            em_sb_printf(sb, "    fo[at] = fv%d[0];\n}\n\n", e->nops - 1);
        }
        em_sb_free(&t);
    }
    em_sb_free(&body);
    return ok;
}

/* The scalar output parameter `tensor(N) out,` of text, N a type parameter's name (T for
 * tensor_rows_sum, O for tensor_xent): its position, N copied into name (at most 15 chars). */
static const char *scalar_out_param(const char *text, char *name, size_t *len)
{
    static const char HEAD[] = "tensor(", TAIL[] = ") out,";
    for (const char *p = strstr(text, TAIL); p; p = strstr(p + 1, TAIL)) {
        const char *q = p;
        while (q > text && ((q[-1] >= 'A' && q[-1] <= 'Z') || (q[-1] >= 'a' && q[-1] <= 'z') ||
                            (q[-1] >= '0' && q[-1] <= '9') || q[-1] == '_'))
            q--;
        size_t n = (size_t)(p - q);
        if (n == 0 || n > 15 || q - text < (ptrdiff_t)strlen(HEAD) ||
            strncmp(q - strlen(HEAD), HEAD, strlen(HEAD)) != 0)
            continue;
        memcpy(name, q, n);
        name[n] = 0;
        *len = strlen(HEAD) + n + strlen(TAIL);
        return q - strlen(HEAD);
    }
    return NULL;
}

bool fu_epi_instantiate(const fu_node *e, const char *text, em_strbuf *sb)
{
    /* an output of lines (tensor_rows) or of scalars (tensor_rows_sum: `tensor(T) out,`,
     * tensor_xent: `tensor(O) out,`) */
    static const char OUT_LINES[] = "tensor(line(T)) out,";
    static const char STORE[] = "out[", END[] = ");";
    bool scalar = strstr(text, OUT_LINES) == NULL;
    char tname[16] = "T", CAST[32];
    size_t plen = strlen(OUT_LINES);
    const char *op = scalar ? scalar_out_param(text, tname, &plen) : strstr(text, OUT_LINES);
    snprintf(CAST, sizeof CAST, scalar ? "] = %s(" : "] = line(%s)(", tname);
    if (!op || (scalar ? scalar_out_param(op + plen, tname, &plen) != NULL
                       : strstr(op + 1, OUT_LINES) != NULL) ||
        !gen_store(e, sb, scalar))
        return false;
    em_sb_appendn(sb, text, (size_t)(op - text));
    if (scalar)
        em_sb_printf(sb, "tensor(%s) out, comptime u32 RE = 1, ", em_scalar_name(e->dtype));
    else
        em_sb_printf(sb, "tensor(line(%s)) out, comptime u32 RE = 1, ", em_scalar_name(e->dtype));
    epi_list(e, sb, true, true, scalar);
    const char *q = op + plen;
    int stores = 0;
    for (const char *s; (s = strstr(q, STORE)) != NULL;) {
        /* out[<i>] = line(T)(<v>); -> fu_store(out, <i>, <v>, RE, ...); ("out[" inside another
         * name, such as "about[", is not a store) */
        char before = s > q ? s[-1] : ' ';
        if (before == '_' || (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z') ||
            (before >= '0' && before <= '9')) {
            em_sb_appendn(sb, q, (size_t)(s + 1 - q));
            q = s + 1;
            continue;
        }
        const char *c = strstr(s, CAST), *end = c ? strstr(c, END) : NULL, *semi = strchr(s, ';');
        if (!c || !end || !semi || end + 1 != semi) return false;
        em_sb_appendn(sb, q, (size_t)(s - q));
        em_sb_append(sb, "fu_store(out, ");
        em_sb_appendn(sb, s + strlen(STORE), (size_t)(c - s - strlen(STORE)));
        em_sb_append(sb, ", ");
        em_sb_appendn(sb, c + strlen(CAST), (size_t)(end - c - strlen(CAST)));
        em_sb_append(sb, ", RE, ");
        epi_list(e, sb, false, true, scalar);
        em_sb_append(sb, "0);");
        q = end + strlen(END);
        stores++;
    }
    em_sb_append(sb, q);
    return stores > 0 && !sb->oom;
}

size_t fu_epi_args(const fu_node *e, const fu_walk *w, unsigned lw, em_arg *args, uint64_t *read)
{
    size_t na = 0;
    for (int i = 0; i < e->nleaves; i++) {
        const fu_leaf *l = &e->leaves[i];
        if (fu_ensure_buffer(l->st) != EM_OK) return SIZE_MAX;
        args[na++] = fu_operand_arg(l->st, l->dtype, lw, w, i);
        args[na++] = em_arg_u32((uint32_t)l->offset);
        *read += tn_view_bytes(l->dtype, e->rank, e->shape, l->stride);
    }
    for (int i = 0; i < e->nparams; i++) args[na++] = e->params[i];
    return na;
}
