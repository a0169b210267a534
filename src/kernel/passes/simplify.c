/* simplify.c — em_ir_simplify: constant folding, removal of constant branches, unrolling of
 * loops marked for it, and dead-code removal, repeated until nothing changes. Instructions that a
 * pass drops stay in the kernel's instruction array but leave every block. */
#include <stdlib.h>
#include <string.h>

#include "kernel/passes/passes.h"

#define MAX_UNROLL 4096  /* most iterations a loop may be unrolled into */
#define MAX_ROUNDS 16

typedef struct simplifier {
    em_ir_kernel *k;
    em_ir_val *subst; /* value -> replacement (0 = none) */
    size_t subst_cap;
    bool changed;
} simplifier;

static em_ir_val resolve(simplifier *s, em_ir_val v)
{
    while (v < s->subst_cap && s->subst[v]) v = s->subst[v];
    return v;
}

static bool grow_subst(simplifier *s)
{
    size_t need = s->k->values.len;
    if (need <= s->subst_cap) return true;
    em_ir_val *n = realloc(s->subst, need * sizeof(em_ir_val));
    if (!n) return false;
    memset(n + s->subst_cap, 0, (need - s->subst_cap) * sizeof(em_ir_val));
    s->subst = n;
    s->subst_cap = need;
    return true;
}

static bool is_container(const em_ir_inst *in)
{
    return in->op == EM_OP_IF || in->op == EM_OP_RANGE || in->op == EM_OP_LOOP;
}

/* ---- folding and constant branches ---------------------------------------------------------- */

static void fold_block(simplifier *s, uint32_t b);

/* Replaces block b's items with `items` (n entries), taking ownership of the array. */
static void set_block(em_ir_kernel *k, uint32_t b, uint32_t *items, size_t n)
{
    em_ir_block *blk = &k->blocks.items[b];
    free(blk->items);
    blk->items = items;
    blk->len = blk->cap = n;
}

static void fold_block(simplifier *s, uint32_t b)
{
    em_ir_kernel *k = s->k;
    em_ir_block *blk = &k->blocks.items[b];
    size_t n = blk->len;
    uint32_t *out = malloc((n + 1) * sizeof(uint32_t));
    if (!out) return;
    size_t m = 0;
    uint32_t *items = blk->items; /* stable: set_block below replaces it only at the end */
    for (size_t i = 0; i < n; i++) {
        uint32_t idx = items[i];
        em_ir_inst *in = &k->insts.items[idx];
        for (int a = 0; a < EM_IR_MAX_ARGS; a++) in->args[a] = resolve(s, in->args[a]);
        em_type t;
        em_ir_const c;
        if (em_ir_fold_inst(k, in, &t, &c)) {
            em_ir_val cv = 0;
            if (em_scalar_is_float((em_scalar)t.scalar))
                cv = em_ir_const_float(k, t, c.f);
            else if (em_scalar_is_signed((em_scalar)t.scalar) || t.scalar == EM_BOOL)
                cv = em_ir_const_int(k, t, c.i);
            else
                cv = em_ir_const_uint(k, t, c.u);
            if (cv && grow_subst(s)) {
                s->subst[k->insts.items[idx].dst] = cv;
                s->changed = true;
                continue; /* drop the instruction */
            }
        }
        in = &k->insts.items[idx];
        if (in->op == EM_OP_IF && em_ir_is_const(k, in->args[0])) {
            /* splice the taken branch in place of the if */
            const em_ir_value *cond = em_ir_value_at(k, in->args[0]);
            uint32_t taken = cond->c.i ? in->blocks[0] : in->blocks[1];
            s->changed = true;
            if (taken) {
                fold_block(s, taken);
                em_ir_block *tb = &k->blocks.items[taken];
                uint32_t *bigger = realloc(out, (m + tb->len + (n - i)) * sizeof(uint32_t));
                if (!bigger) break;
                out = bigger;
                if (tb->len) memcpy(out + m, tb->items, tb->len * sizeof(uint32_t));
                m += tb->len;
                tb->len = 0;
            }
            continue;
        }
        if (is_container(in)) {
            uint32_t b0 = in->blocks[0], b1 = in->blocks[1];
            if (b0) fold_block(s, b0);
            if (b1) fold_block(s, b1);
        }
        out[m++] = idx;
    }
    set_block(k, b, out, m);
}

/* ---- unrolling ------------------------------------------------------------------------------ */

/* True when block b contains a BREAK/CONTINUE that targets the loop owning b (not a nested one),
 * or an assignment to `var`. */
static bool blocks_unroll(const em_ir_kernel *k, uint32_t b, em_ir_val var, bool nested_loop)
{
    const em_ir_block *blk = em_ir_block_at(k, b);
    for (size_t i = 0; blk && i < blk->len; i++) {
        const em_ir_inst *in = &k->insts.items[blk->items[i]];
        if (!nested_loop && (in->op == EM_OP_BREAK || in->op == EM_OP_CONTINUE)) return true;
        if (in->dst == var) return true;
        if (in->op == EM_OP_RANGE && in->args[0] == var) return true;
        if (is_container(in)) {
            bool inner = nested_loop || in->op != EM_OP_IF;
            if (blocks_unroll(k, in->blocks[0], var, inner) || blocks_unroll(k, in->blocks[1], var, inner))
                return true;
        }
    }
    return false;
}

typedef struct cloner {
    simplifier *s;
    em_ir_val *map; /* old temp -> new temp for this copy */
    size_t map_cap;
    em_ir_val var, value; /* loop counter and the constant it stands for */
} cloner;

static em_ir_val clone_val(cloner *c, em_ir_val v)
{
    if (v == c->var) return c->value;
    if (v < c->map_cap && c->map[v]) return c->map[v];
    return v;
}

static uint32_t clone_block(cloner *c, uint32_t b);

static uint32_t clone_inst(cloner *c, uint32_t idx)
{
    em_ir_kernel *k = c->s->k;
    em_ir_inst in = k->insts.items[idx];
    for (int a = 0; a < EM_IR_MAX_ARGS; a++) in.args[a] = clone_val(c, in.args[a]);
    const em_ir_value *d = em_ir_value_at(k, in.dst);
    if (d && d->kind == EM_VAL_TEMP) {
        em_ir_value t = *d;
        em_ir_val nv = em_ir_new_value(k, t);
        if (!nv) return UINT32_MAX;
        if (in.dst < c->map_cap) c->map[in.dst] = nv;
        in.dst = nv;
    }
    for (int i = 0; i < 2; i++)
        if (in.blocks[i]) {
            in.blocks[i] = clone_block(c, in.blocks[i]);
            if (!in.blocks[i]) return UINT32_MAX;
        }
    if (!EM_VEC_PUSH(&k->insts, in)) return UINT32_MAX;
    return (uint32_t)(k->insts.len - 1);
}

static uint32_t clone_block(cloner *c, uint32_t b)
{
    em_ir_kernel *k = c->s->k;
    uint32_t nb = em_ir_new_block(k);
    if (!nb) return 0;
    size_t n = k->blocks.items[b].len;
    for (size_t i = 0; i < n; i++) {
        uint32_t ni = clone_inst(c, k->blocks.items[b].items[i]);
        if (ni == UINT32_MAX || !em_ir_block_push(k, nb, ni)) return 0;
    }
    return nb;
}

static int64_t trip_count(const em_ir_value *start, const em_ir_value *end, const em_ir_value *step)
{
    bool sg = em_scalar_is_signed((em_scalar)start->type.scalar);
    if (sg) {
        if (step->c.i <= 0 || end->c.i <= start->c.i) return 0;
        return (end->c.i - start->c.i + step->c.i - 1) / step->c.i;
    }
    if (step->c.u == 0 || end->c.u <= start->c.u) return 0;
    return (int64_t)((end->c.u - start->c.u + step->c.u - 1) / step->c.u);
}

/* Unrolls one RANGE instruction into `out` (the instructions replacing it). Returns false to keep
 * the loop as it is. */
static bool unroll(simplifier *s, uint32_t idx, uint32_t **out, size_t *m, size_t *cap)
{
    em_ir_kernel *k = s->k;
    em_ir_inst in = k->insts.items[idx];
    const em_ir_value *v = em_ir_value_at(k, in.args[0]);
    const em_ir_value *st = em_ir_value_at(k, in.args[1]);
    const em_ir_value *en = em_ir_value_at(k, in.args[2]);
    const em_ir_value *sp = em_ir_value_at(k, in.args[3]);
    if (!v || !st || !en || !sp || st->kind != EM_VAL_CONST || en->kind != EM_VAL_CONST ||
        sp->kind != EM_VAL_CONST)
        return false;
    em_type t = v->type;
    int64_t trips = trip_count(st, en, sp);
    if (trips > MAX_UNROLL || blocks_unroll(k, in.blocks[0], in.args[0], false)) return false;
    em_ir_const start = st->c, step = sp->c;
    em_ir_val var = in.args[0];
    cloner c = {.s = s, .var = var};
    c.map_cap = k->values.len;
    c.map = calloc(c.map_cap, sizeof(em_ir_val));
    if (!c.map) return false;
    bool ok = true;
    for (int64_t i = 0; ok && i <= trips; i++) {
        uint64_t cur = start.u + (uint64_t)i * step.u;
        c.value = em_ir_const_uint(k, t, cur);
        if (i == trips) { /* the counter's value after the loop, for any later reader */
            em_ir_inst set = {.op = EM_OP_ASSIGN, .dst = var, .args = {c.value}, .line = in.line, .col = in.col};
            ok = EM_VEC_PUSH(&k->insts, set);
            uint32_t ni = (uint32_t)(k->insts.len - 1);
            if (ok && *m + 1 > *cap) ok = em_vec_grow((void **)out, cap, *m + 1, sizeof(uint32_t));
            if (ok) (*out)[(*m)++] = ni;
            break;
        }
        memset(c.map, 0, c.map_cap * sizeof(em_ir_val));
        uint32_t body = k->insts.items[idx].blocks[0];
        uint32_t copy = clone_block(&c, body);
        if (!copy) {
            ok = false;
            break;
        }
        em_ir_block *cb = &k->blocks.items[copy];
        if (*m + cb->len > *cap) ok = em_vec_grow((void **)out, cap, *m + cb->len, sizeof(uint32_t));
        if (ok) {
            if (cb->len) memcpy(*out + *m, cb->items, cb->len * sizeof(uint32_t));
            *m += cb->len;
        }
        cb->len = 0;
    }
    free(c.map);
    return ok;
}

static void unroll_block(simplifier *s, uint32_t b)
{
    em_ir_kernel *k = s->k;
    size_t n = k->blocks.items[b].len;
    size_t cap = n + 1, m = 0;
    uint32_t *items = malloc(n * sizeof(uint32_t) + 1);
    uint32_t *out = malloc(cap * sizeof(uint32_t));
    if (!items || !out) {
        free(items);
        free(out);
        return;
    }
    if (n) memcpy(items, k->blocks.items[b].items, n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t idx = items[i];
        em_ir_inst *in = &k->insts.items[idx];
        if (is_container(in)) {
            uint32_t b0 = in->blocks[0], b1 = in->blocks[1];
            if (b0) unroll_block(s, b0); /* innermost first */
            if (b1) unroll_block(s, b1);
            in = &k->insts.items[idx];
        }
        size_t before = m;
        if (in->op == EM_OP_RANGE && in->imm && unroll(s, idx, &out, &m, &cap)) {
            s->changed = true;
            continue;
        }
        m = before;
        if (m + 1 > cap && !em_vec_grow((void **)&out, &cap, m + 1, sizeof(uint32_t))) break;
        out[m++] = idx;
    }
    free(items);
    set_block(k, b, out, m);
}

/* ---- repeated reads ------------------------------------------------------------------------ */

/* Position and metadata reads (BUILTIN, LEN, SHAPE, STRIDE) take no operands and have no side
 * effects, so a second identical read in the same block can use the first one's value. Reads are
 * not moved across blocks or barriers: keeping values short-lived across barriers matters to
 * targets that split kernels at barriers (the C target, and PoCL, which miscompiles a position
 * computed before a barrier loop and used inside it). */
typedef struct read_key {
    uint16_t op;   /* the read */
    uint32_t mem;  /* its memory (metadata reads) */
    int32_t imm;   /* its built-in or dimension */
    em_ir_val val; /* the temporary that holds it */
} read_key;

static bool is_invariant_read(const em_ir_kernel *k, const em_ir_inst *in)
{
    if (in->op != EM_OP_BUILTIN && in->op != EM_OP_LEN && in->op != EM_OP_SHAPE &&
        in->op != EM_OP_STRIDE)
        return false;
    const em_ir_value *d = em_ir_value_at(k, in->dst);
    return d && d->kind == EM_VAL_TEMP;
}

static void merge_reads(simplifier *s, uint32_t b)
{
    em_ir_kernel *k = s->k;
    read_key keys[32];
    size_t nkeys = 0, m = 0;
    em_ir_block *blk = &k->blocks.items[b];
    for (size_t i = 0; i < blk->len; i++) {
        uint32_t idx = blk->items[i];
        const em_ir_inst *in = &k->insts.items[idx];
        if (in->op == EM_OP_SYNC_CUBE) nkeys = 0;
        if (is_container(in)) {
            uint32_t b0 = in->blocks[0], b1 = in->blocks[1];
            if (em_ir_block_has_barrier(k, b0) || em_ir_block_has_barrier(k, b1)) nkeys = 0;
            if (b0) merge_reads(s, b0);
            if (b1) merge_reads(s, b1);
            blk = &k->blocks.items[b];
        }
        if (is_invariant_read(k, in)) {
            const read_key *found = NULL;
            for (size_t j = 0; j < nkeys && !found; j++)
                if (keys[j].op == in->op && keys[j].mem == in->mem && keys[j].imm == in->imm)
                    found = &keys[j];
            if (found) {
                s->subst[in->dst] = found->val;
                s->changed = true;
                continue; /* drop the repeated read */
            }
            if (nkeys < sizeof keys / sizeof keys[0])
                keys[nkeys++] = (read_key){in->op, in->mem, in->imm, in->dst};
        }
        blk->items[m++] = idx;
    }
    blk->len = m;
}

/* ---- dead code ------------------------------------------------------------------------------ */

static void count_uses(const em_ir_kernel *k, uint32_t b, uint32_t *uses)
{
    const em_ir_block *blk = em_ir_block_at(k, b);
    for (size_t i = 0; blk && i < blk->len; i++) {
        const em_ir_inst *in = &k->insts.items[blk->items[i]];
        for (int a = 0; a < EM_IR_MAX_ARGS; a++)
            if (in->args[a] < k->values.len) uses[in->args[a]]++;
        if (is_container(in)) {
            count_uses(k, in->blocks[0], uses);
            count_uses(k, in->blocks[1], uses);
        }
    }
}

static void sweep(simplifier *s, uint32_t b, const uint32_t *uses)
{
    em_ir_kernel *k = s->k;
    em_ir_block *blk = &k->blocks.items[b];
    size_t m = 0;
    for (size_t i = 0; i < blk->len; i++) {
        uint32_t idx = blk->items[i];
        const em_ir_inst *in = &k->insts.items[idx];
        const em_op_info *info = em_ir_op_info(in->op);
        const em_ir_value *d = em_ir_value_at(k, in->dst);
        bool dead = info && !info->side_effects && d && uses[in->dst] == 0 &&
                    (d->kind == EM_VAL_TEMP || d->kind == EM_VAL_VAR);
        if (dead) {
            s->changed = true;
            continue;
        }
        if (is_container(in)) {
            uint32_t b0 = in->blocks[0], b1 = in->blocks[1];
            if (b0) sweep(s, b0, uses);
            if (b1) sweep(s, b1, uses);
            blk = &k->blocks.items[b];
        }
        blk->items[m++] = idx;
    }
    blk->len = m;
}

static bool remove_dead(simplifier *s)
{
    uint32_t *uses = calloc(s->k->values.len, sizeof(uint32_t));
    if (!uses) return false;
    count_uses(s->k, 1, uses);
    sweep(s, 1, uses);
    free(uses);
    return true;
}

em_status em_ir_simplify(em_ir_kernel *k)
{
    if (!k) return em_set_error(EM_ERR_INVALID, "em_ir_simplify: no kernel");
    em_status st = em_ir_verify(k, 0);
    if (st != EM_OK) return st;
    simplifier s = {.k = k};
    if (!grow_subst(&s)) return em_set_error(EM_ERR_NOMEM, "out of memory simplifying %s", k->name);
    for (int round = 0; round < MAX_ROUNDS; round++) {
        s.changed = false;
        unroll_block(&s, 1);
        if (!grow_subst(&s)) break;
        fold_block(&s, 1);
        remove_dead(&s);
        if (!s.changed) break;
    }
    if (grow_subst(&s)) {
        merge_reads(&s, em_ir_body(k));
        fold_block(&s, 1); /* rewrites the uses of the reads that were merged */
        remove_dead(&s);
    }
    free(s.subst);
    if (k->oom) return em_set_error(EM_ERR_NOMEM, "out of memory simplifying %s", k->name);
    return em_ir_verify(k, 0);
}
