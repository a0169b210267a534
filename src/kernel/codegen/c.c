/* c.c — the C code generator for the CPU target (em_codegen_c): IR kernels become one C11
 * translation unit that exports emk_NAME per kernel (calling convention: c_abi.h).
 *
 * A cube runs on one thread. The kernel body is cut at SYNC_CUBE barriers into regions, each a
 * loop over the cube's units; control flow that contains a barrier stays outside the unit loops
 * ("cube level") and must be uniform: its condition or bounds are read from the first unit that
 * still runs. Units that leave early (return, or break/continue out of a cube-level loop) get a
 * state byte that later regions check. Values that cross regions live in per-unit arrays in the
 * cube's scratch memory, next to shared memory; all others are locals of the unit loop.
 *
 * The work is split in three steps over each kernel: analysis (regions, which instructions are
 * needed, where each value lives, names), then the body (cube-level code and regions, with
 * c_ops.c writing single instructions), then the function around it (positions, parameters,
 * scratch layout, the loop over cubes). Helpers the body needs are collected and emitted once in
 * the prelude (c_prelude.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/c_internal.h"
#include "kernel/codegen/codegen.h"

#define LOCAL_LIMIT 4096 /* bytes: larger local arrays and fragments go to the heap scratch */

/* ---- small utilities ------------------------------------------------------------------------ */

const em_ir_value *cg_val(const cg *g, em_ir_val v)
{
    return em_ir_value_at(g->k, v);
}
const em_ir_memory *cg_mem_at(const cg *g, em_ir_mem m)
{
    return em_ir_mem_at(g->k, m);
}

void cg_fail(cg *g, em_status st, uint32_t inst, const char *fmt, ...)
{
    if (g->err) return;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    g->err = st;
    if (inst != UINT32_MAX && em_ir_inst_at(g->k, inst)) {
        char *text = em_ir_print_inst(g->k, inst);
        em_set_error(st, "kernel %s: inst %u `%s`: %s", em_ir_kernel_name(g->k), inst,
                     text ? text : "?", what);
        free(text);
    } else {
        em_set_error(st, "kernel %s: %s", em_ir_kernel_name(g->k), what);
    }
}

void cg_line(cg *g, const char *fmt, ...)
{
    em_sb_indent(g->sb, g->indent);
    va_list ap;
    va_start(ap, fmt);
    em_sb_vprintf(g->sb, fmt, ap);
    va_end(ap);
    em_sb_appendc(g->sb, '\n');
}

static bool ids_push(cg *g, cg_ids *l, uint32_t id)
{
    if (!EM_VEC_PUSH(l, id)) {
        cg_fail(g, EM_ERR_NOMEM, UINT32_MAX, "out of memory generating C");
        return false;
    }
    return true;
}

static bool is_control(uint16_t op)
{
    return op == EM_OP_IF || op == EM_OP_RANGE || op == EM_OP_LOOP;
}

/* ---- barriers and regions ------------------------------------------------------------------- */

static bool block_barrier(cg *g, uint32_t b, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(g->k, b);
    if (!blk || depth > 1000) return false;
    if (g->barrier[b]) return g->barrier[b] == 1;
    bool found = false;
    for (size_t i = 0; i < blk->len; i++) {
        const em_ir_inst *in = em_ir_inst_at(g->k, blk->items[i]);
        if (!in) continue;
        if (in->op == EM_OP_SYNC_CUBE) found = true;
        if (is_control(in->op)) {
            bool a = block_barrier(g, in->blocks[0], depth + 1);
            bool c = in->op == EM_OP_IF && block_barrier(g, in->blocks[1], depth + 1);
            found = found || a || c;
        }
    }
    g->barrier[b] = found ? 1 : 2;
    return found;
}

static bool inst_barrier(cg *g, const em_ir_inst *in)
{
    if (in->op == EM_OP_SYNC_CUBE) return true;
    if (!is_control(in->op)) return false;
    return block_barrier(g, in->blocks[0], 0) ||
           (in->op == EM_OP_IF && block_barrier(g, in->blocks[1], 0));
}

/* Cube-level instructions: barriers, control flow around barriers, and (in kernels with barriers)
 * break / continue / return that every running unit reaches together. */
static bool is_cube_inst(cg *g, const em_ir_inst *in)
{
    if (inst_barrier(g, in)) return true;
    return g->has_barrier &&
           (in->op == EM_OP_BREAK || in->op == EM_OP_CONTINUE || in->op == EM_OP_RETURN);
}

static int32_t new_region(cg *g, bool in_loop)
{
    if (!em_vec_grow((void **)&g->regions, &g->capregions, g->nregions + 1, sizeof(cg_region))) {
        cg_fail(g, EM_ERR_NOMEM, UINT32_MAX, "out of memory generating C");
        return -1;
    }
    cg_region *r = &g->regions[g->nregions];
    memset(r, 0, sizeof *r);
    r->in_loop = in_loop;
    return (int32_t)g->nregions++;
}

static void walk_unit(cg *g, uint32_t idx, int32_t r, unsigned depth)
{
    const em_ir_inst *in = em_ir_inst_at(g->k, idx);
    if (!in || g->region_of[idx] != -3 || depth > 1000) return;
    g->region_of[idx] = r;
    if (!is_control(in->op)) return;
    for (int i = 0; i < 2; i++) {
        const em_ir_block *blk = em_ir_block_at(g->k, in->blocks[i]);
        for (size_t j = 0; blk && j < blk->len; j++) walk_unit(g, blk->items[j], r, depth + 1);
    }
}

static void walk_cube(cg *g, uint32_t b, bool in_loop, unsigned cube_loops, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(g->k, b);
    if (!blk || depth > 1000) return;
    int32_t cur = -1;
    for (size_t i = 0; i < blk->len && !g->err; i++) {
        uint32_t idx = blk->items[i];
        const em_ir_inst *in = em_ir_inst_at(g->k, idx);
        if (!in || g->region_of[idx] != -3) continue;
        if (!is_cube_inst(g, in)) {
            if (cur < 0) cur = new_region(g, in_loop);
            if (cur < 0) return;
            walk_unit(g, idx, cur, depth);
            continue;
        }
        g->region_of[idx] = -1;
        cur = -1;
        if (!is_control(in->op)) continue;
        bool loop = in->op != EM_OP_IF;
        if (loop && cube_loops + 1 > CG_MAX_CUBE_LOOPS) {
            cg_fail(g, EM_ERR_UNSUPPORTED, idx, "more than %d nested loops contain barriers",
                    CG_MAX_CUBE_LOOPS);
            return;
        }
        walk_cube(g, in->blocks[0], in_loop || loop, cube_loops + loop, depth + 1);
        if (in->op == EM_OP_IF) walk_cube(g, in->blocks[1], in_loop, cube_loops, depth + 1);
    }
}

/* ---- liveness: which instructions the generated code needs ------------------------------- */

static bool is_root(uint16_t op)
{
    switch (op) {
    case EM_OP_STORE:
    case EM_OP_SYNC_CUBE:
    case EM_OP_SYNC_PLANE:
    case EM_OP_FENCE:
    case EM_OP_MAT_STORE:
    case EM_OP_IF:
    case EM_OP_RANGE:
    case EM_OP_LOOP:
    case EM_OP_BREAK:
    case EM_OP_CONTINUE:
    case EM_OP_RETURN:
    case EM_OP_PRINT:
    case EM_OP_INTRINSIC:
        return true;
    default:
        return op >= EM_OP_ATOMIC_ADD && op <= EM_OP_ATOMIC_STORE;
    }
}

/* A store to local memory: needed only when something loads that memory. */
static bool local_store(cg *g, const em_ir_inst *in)
{
    const em_ir_memory *m = in->op == EM_OP_STORE ? cg_mem_at(g, in->mem) : NULL;
    return m && m->space == EM_MEM_LOCAL;
}

/* The variable, matrix or temporary an instruction writes (0 when none). */
static em_ir_val written(const em_ir_inst *in)
{
    em_ir_val w = cg_writes(in);
    return w ? w : in->dst;
}

static bool liveness(cg *g)
{
    size_t nv = g->nvals, ni = g->ninsts;
    uint32_t *start = calloc(nv + 2, sizeof(uint32_t));
    uint32_t *list = calloc(ni + 1, sizeof(uint32_t));
    uint32_t *work = calloc(ni + 1, sizeof(uint32_t));
    bool ok = start && list && work;
    if (ok) {
        /* writers of each value, as compressed lists */
        for (uint32_t i = 0; i < ni; i++) {
            const em_ir_inst *in = em_ir_inst_at(g->k, i);
            em_ir_val w = in && g->region_of[i] != -3 ? written(in) : 0;
            if (w && w < nv) start[w + 1]++;
        }
        for (size_t v = 1; v <= nv; v++) start[v] += start[v - 1];
        uint32_t *fill = calloc(nv + 1, sizeof(uint32_t));
        ok = fill != NULL;
        for (uint32_t i = 0; ok && i < ni; i++) {
            const em_ir_inst *in = em_ir_inst_at(g->k, i);
            em_ir_val w = in && g->region_of[i] != -3 ? written(in) : 0;
            if (w && w < nv) list[start[w] + fill[w]++] = i;
        }
        free(fill);
    }
    if (ok) {
        size_t top = 0;
        for (uint32_t i = 0; i < ni; i++) {
            const em_ir_inst *in = em_ir_inst_at(g->k, i);
            if (in && g->region_of[i] != -3 && is_root(in->op) && !local_store(g, in)) {
                g->needed[i] = 1;
                work[top++] = i;
            }
        }
        while (top) {
            const em_ir_inst *in = em_ir_inst_at(g->k, work[--top]);
            const em_ir_memory *mem = in->op == EM_OP_LOAD ? cg_mem_at(g, in->mem) : NULL;
            if (mem && mem->space == EM_MEM_LOCAL && !g->mems[in->mem].loaded) {
                /* local memory that is read: its stores matter */
                g->mems[in->mem].loaded = true;
                for (uint32_t i = 0; i < ni; i++) {
                    const em_ir_inst *st = em_ir_inst_at(g->k, i);
                    if (st && st->op == EM_OP_STORE && st->mem == in->mem &&
                        g->region_of[i] != -3 && !g->needed[i]) {
                        g->needed[i] = 1;
                        work[top++] = i;
                    }
                }
            }
            em_ir_val reads[EM_IR_MAX_ARGS];
            unsigned n = cg_reads(in, reads);
            for (unsigned r = 0; r < n; r++) {
                em_ir_val v = reads[r];
                if (!v || v >= nv || g->vals[v].read) continue;
                g->vals[v].read = true;
                for (uint32_t j = start[v]; j < start[v + 1]; j++) {
                    if (g->needed[list[j]]) continue;
                    g->needed[list[j]] = 1;
                    work[top++] = list[j];
                }
            }
        }
    } else {
        cg_fail(g, EM_ERR_NOMEM, UINT32_MAX, "out of memory generating C");
    }
    free(start);
    free(list);
    free(work);
    return ok;
}

/* ---- where values live ---------------------------------------------------------------------- */

static bool uses_mem_pointer(uint16_t op)
{
    return op == EM_OP_LOAD || op == EM_OP_STORE || op == EM_OP_MAT_LOAD || op == EM_OP_MAT_STORE ||
           (op >= EM_OP_ATOMIC_ADD && op <= EM_OP_ATOMIC_STORE);
}

/* Records an access to v in region r; `top_write` when it overwrites v at the top level of the
 * region (so that the value need not survive from an earlier run of the region). */
static void access_val(cg *g, em_ir_val v, int32_t r, bool top_write)
{
    const em_ir_value *x = cg_val(g, v);
    if (!x || x->kind == EM_VAL_CONST || x->kind == EM_VAL_PARAM) return;
    cg_value *c = &g->vals[v];
    if (!c->first) c->first = top_write ? 1 : 2;
    if (c->region == -1)
        c->region = r;
    else if (c->region != r)
        c->region = -2;
    c->loop_region |= g->regions[r].in_loop;
}

static void access_mem(cg *g, em_ir_mem m, int32_t r)
{
    if (!cg_mem_at(g, m)) return;
    cg_mem *c = &g->mems[m];
    c->used = true;
    if (c->region == -1)
        c->region = r;
    else if (c->region != r)
        c->region = -2;
    c->loop_region |= g->regions[r].in_loop;
}

/* Whether the instruction overwrites the whole variable or fragment it writes. */
static bool overwrites(uint16_t op)
{
    return op == EM_OP_ASSIGN || op == EM_OP_MAT_FILL || op == EM_OP_MAT_LOAD ||
           op == EM_OP_MAT_MMA;
}

/* Pass 0 records accesses (and whether unit states are needed); pass 1 fills the per-region
 * declaration lists once storage is decided. `top`: b's items are the top level of regions. */
static void visit(cg *g, uint32_t b, int pass, bool top, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(g->k, b);
    if (!blk || depth > 1000) return;
    for (size_t i = 0; i < blk->len && !g->err; i++) {
        uint32_t idx = blk->items[i];
        const em_ir_inst *in = em_ir_inst_at(g->k, idx);
        if (!in || !g->needed[idx]) continue;
        int32_t r = g->region_of[idx];
        if (r == -1) { /* cube level */
            if (pass == 0 && in->op == EM_OP_IF && in->args[0] < g->nvals)
                g->vals[in->args[0]].cube_read = true;
            if (pass == 0 && in->op == EM_OP_RANGE) {
                if (in->args[0] < g->nvals) g->vals[in->args[0]].cube_counter = true;
                for (int a = 1; a < 4; a++)
                    if (in->args[a] < g->nvals) g->vals[in->args[a]].cube_read = true;
            }
        } else if (r >= 0 && pass == 0) {
            em_ir_val reads[EM_IR_MAX_ARGS];
            unsigned n = cg_reads(in, reads);
            if (in->op == EM_OP_RANGE)
                access_val(g, in->args[0], r, top); /* start is written first */
            for (unsigned a = 0; a < n; a++) access_val(g, reads[a], r, false);
            access_val(g, written(in), r, top && overwrites(in->op));
            if (uses_mem_pointer(in->op)) access_mem(g, in->mem, r);
            if (in->op == EM_OP_RETURN && g->has_barrier) g->state = true;
            if ((in->op == EM_OP_BREAK || in->op == EM_OP_CONTINUE) && g->nloops &&
                g->loops[g->nloops - 1].cube)
                g->state = true;
        } else if (r >= 0) {
            em_ir_val ids[EM_IR_MAX_ARGS + 1];
            unsigned n = cg_reads(in, ids);
            ids[n++] = written(in);
            for (unsigned a = 0; a < n; a++) {
                const em_ir_value *x = cg_val(g, ids[a]);
                if (!x) continue;
                cg_value *c = &g->vals[ids[a]];
                if (c->store == CG_LOCAL && (x->kind == EM_VAL_VAR || x->kind == EM_VAL_MATRIX) &&
                    !c->listed) {
                    c->listed = true;
                    ids_push(g, &g->regions[r].vals, ids[a]);
                } else if (c->store == CG_UNIT && x->kind == EM_VAL_MATRIX && c->setup_in != r) {
                    c->setup_in = r;
                    ids_push(g, &g->regions[r].uvals, ids[a]);
                }
            }
            const em_ir_memory *m = cg_mem_at(g, in->mem);
            if (m && m->space == EM_MEM_LOCAL && uses_mem_pointer(in->op)) {
                cg_mem *c = &g->mems[in->mem];
                if (c->store == CG_LOCAL && !c->listed) {
                    c->listed = true;
                    ids_push(g, &g->regions[r].mems, in->mem);
                } else if (c->store == CG_UNIT && c->setup_in != r) {
                    c->setup_in = r;
                    ids_push(g, &g->regions[r].umems, in->mem);
                }
            }
        }
        if (is_control(in->op)) {
            bool loop = in->op != EM_OP_IF;
            if (loop && g->nloops < CG_MAX_DEPTH)
                g->loops[g->nloops++] = (cg_loop){.cube = r == -1};
            visit(g, in->blocks[0], pass, r == -1, depth + 1);
            if (in->op == EM_OP_IF) visit(g, in->blocks[1], pass, r == -1, depth + 1);
            if (loop && g->nloops) g->nloops--;
        }
    }
}

static size_t frag_elems(const em_ir_value *x)
{
    switch (x->mat_role) {
    case EM_MAT_A:
        return (size_t)x->mat_m * x->mat_k;
    case EM_MAT_B:
        return (size_t)x->mat_k * x->mat_n;
    default:
        return (size_t)x->mat_m * x->mat_n;
    }
}

#define REMAT_MAX_NODES 12 /* largest expression written out at each use */

static bool int_scalar(const em_ir_value *x)
{
    return x && x->type.lanes == 1 &&
           (x->type.scalar == EM_BOOL || em_scalar_is_int((em_scalar)x->type.scalar));
}

/* Whether temporary v can be recomputed where used, and from how many nodes (memoized in
 * vals[v].remat: 1 no, 2 + n yes). */
static unsigned remat_nodes(cg *g, em_ir_val v, unsigned depth)
{
    const em_ir_value *x = cg_val(g, v);
    if (!x || x->kind == EM_VAL_CONST || x->kind == EM_VAL_PARAM) return 0;
    cg_value *c = &g->vals[v];
    if (c->remat) return c->remat >= 2 ? c->remat - 2u : UINT32_MAX;
    c->remat = 1;
    const em_ir_inst *in = em_ir_inst_at(g->k, c->def);
    if (depth > REMAT_MAX_NODES) { /* too deep from here: undecided, the node may be tried again */
        c->remat = 0;
        return UINT32_MAX;
    }
    if (x->kind != EM_VAL_TEMP || !in || in->dst != v || !cg_rematerializable(in->op) ||
        !int_scalar(x))
        return UINT32_MAX;
    em_ir_val reads[EM_IR_MAX_ARGS];
    unsigned n = cg_reads(in, reads), total = 1;
    for (unsigned i = 0; i < n && total <= REMAT_MAX_NODES; i++) {
        if (!int_scalar(cg_val(g, reads[i]))) return UINT32_MAX;
        unsigned sub = remat_nodes(g, reads[i], depth + 1);
        if (sub == UINT32_MAX) {
            c->remat = depth ? 0 : 1; /* a deep failure may only be a matter of depth */
            return UINT32_MAX;
        }
        total += sub;
    }
    if (total > REMAT_MAX_NODES) return UINT32_MAX;
    c->remat = (uint8_t)(2 + total);
    return total;
}

static void find_remat(cg *g)
{
    for (em_ir_val v = 1; v < g->nvals; v++)
        if (g->vals[v].read) remat_nodes(g, v, 0);
    for (uint32_t i = 0; i < g->ninsts; i++) {
        const em_ir_inst *in = em_ir_inst_at(g->k, i);
        if (!in || !g->needed[i] || !in->dst || in->dst >= g->nvals || g->vals[in->dst].remat < 2)
            continue;
        em_ir_val reads[EM_IR_MAX_ARGS];
        unsigned n = cg_reads(in, reads);
        for (unsigned r = 0; r < n; r++)
            if (reads[r] < g->nvals) g->vals[reads[r]].read_by_remat = true;
    }
}

static void decide_storage(cg *g)
{
    find_remat(g);
    for (em_ir_val v = 1; v < g->nvals; v++) {
        const em_ir_value *x = cg_val(g, v);
        cg_value *c = &g->vals[v];
        if (!x) continue;
        bool crosses = c->cube_read || c->region == -2;
        switch (x->kind) {
        case EM_VAL_CONST:
            c->store = CG_CONST;
            break;
        case EM_VAL_PARAM:
            c->store = c->read ? CG_PARAM : CG_NONE;
            break;
        case EM_VAL_TEMP:
            /* small index arithmetic is written out where used; a named one used only by name in
             * its own region keeps its name */
            if (!c->read)
                c->store = CG_NONE;
            else if (c->remat >= 2 && (crosses || !x->name || c->read_by_remat))
                c->store = CG_REMAT;
            else
                c->store = crosses ? CG_UNIT : CG_LOCAL;
            break;
        case EM_VAL_VAR:
            if (c->cube_counter)
                c->store = CG_CUBE;
            else if (!c->read)
                c->store = CG_NONE;
            else
                c->store = crosses || (c->loop_region && c->first != 1) ? CG_UNIT : CG_LOCAL;
            break;
        case EM_VAL_MATRIX: {
            size_t bytes = frag_elems(x) * em_scalar_size((em_scalar)x->type.scalar);
            if (!c->read)
                c->store = CG_NONE;
            else
                c->store = crosses || (c->loop_region && c->first != 1) || bytes > LOCAL_LIMIT
                               ? CG_UNIT
                               : CG_LOCAL;
            break;
        }
        default:
            c->store = CG_NONE;
            break;
        }
    }
    for (em_ir_mem m = 1; m < g->nmems; m++) {
        const em_ir_memory *x = cg_mem_at(g, m);
        cg_mem *c = &g->mems[m];
        if (!x || !c->used) continue;
        size_t bytes =
            (size_t)x->length * x->elem.lanes * em_scalar_size((em_scalar)x->elem.scalar);
        if (x->space == EM_MEM_GLOBAL)
            c->store = CG_GLOBAL;
        else if (x->space == EM_MEM_SHARED)
            c->store = CG_SHARED;
        else
            c->store =
                c->region == -2 || c->loop_region || bytes > LOCAL_LIMIT ? CG_UNIT : CG_LOCAL;
    }
}

/* ---- names ---------------------------------------------------------------------------------- */

static const char *const reserved[] = {
    "auto",       "break",     "case",       "char",
    "const",      "continue",  "default",    "do",
    "double",     "else",      "enum",       "extern",
    "float",      "for",       "goto",       "if",
    "inline",     "int",       "long",       "register",
    "restrict",   "return",    "short",      "signed",
    "sizeof",     "static",    "struct",     "switch",
    "typedef",    "union",     "unsigned",   "void",
    "volatile",   "while",     "bool",       "true",
    "false",      "main",      "NULL",       "stderr",
    "fprintf",    "printf",    "memcpy",     "memset",
    "malloc",     "calloc",    "free",       "size_t",
    "int8_t",     "int16_t",   "int32_t",    "int64_t",
    "uint8_t",    "uint16_t",  "uint32_t",   "uint64_t",
    "INFINITY",   "NAN",       "isnan",      "isinf",
    "exp",        "expf",      "exp2",       "exp2f",
    "log",        "logf",      "log2",       "log2f",
    "sqrt",       "sqrtf",     "erf",        "erff",
    "tanh",       "tanhf",     "sin",        "sinf",
    "cos",        "cosf",      "floor",      "floorf",
    "ceil",       "ceilf",     "rint",       "rintf",
    "fabs",       "fabsf",     "fmin",       "fminf",
    "fmax",       "fmaxf",     "fma",        "fmaf",
    "pow",        "powf",      "fmod",       "fmodf",
    "ldexp",      "INT8_MIN",  "INT8_MAX",   "INT16_MIN",
    "INT16_MAX",  "INT32_MIN", "INT32_MAX",  "INT64_MIN",
    "INT64_MAX",  "UINT8_MAX", "UINT16_MAX", "UINT32_MAX",
    "UINT64_MAX", "INT64_C",   "UINT64_C",   "math_errhandling",
    "asm",        "fortran",   "errno",      "signbit",
    "abs",
};

static bool is_reserved(const char *s)
{
    if (strncmp(s, "__", 2) == 0) return true;
    /* names in capitals may be macros of the standard headers (EOF, M_PI, HUGE_VAL...) */
    bool caps = s[0] && s[1];
    for (const char *c = s; *c && caps; c++)
        caps = (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_';
    if (caps) return true;
    for (size_t i = 0; i < EM_ARRAY_LEN(reserved); i++)
        if (strcmp(s, reserved[i]) == 0) return true;
    return false;
}

/* A C identifier made from a user name: [A-Za-z][A-Za-z0-9_]*, never ending in '_' and never
 * starting with "em" (both are kept for names of the generator's own). */
static void sanitize(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    if (!name || !*name) {
        out[0] = 0;
        return;
    }
    if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z')) ||
        strncmp(name, "em", 2) == 0)
        out[n++] = 'v';
    for (const char *s = name; *s && n + 2 < cap; s++) {
        char c = *s;
        bool ok =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        out[n++] = ok ? c : '_';
    }
    if (out[n - 1] == '_') out[n++] = 'v';
    out[n] = 0;
}

static char *claim_name(cg *g, em_map *used, const char *base, uint32_t id)
{
    char buf[96];
    snprintf(buf, sizeof buf, "%s", base);
    /* suffixed names (NAME_ID) are no keyword, library name or macro of the standard headers */
    for (unsigned k = 0; (k == 0 && is_reserved(buf)) || em_map_gets(used, buf); k++) {
        if (k == 0)
            snprintf(buf, sizeof buf, "%s_%u", base, id);
        else
            snprintf(buf, sizeof buf, "%s_%u_%u", base, id, k);
    }
    char *s = strdup(buf);
    if (!s || !em_map_puts(used, s, s)) {
        free(s);
        cg_fail(g, EM_ERR_NOMEM, UINT32_MAX, "out of memory generating C");
        return NULL;
    }
    return s;
}

static void assign_names(cg *g)
{
    em_map used;
    em_map_init(&used);
    char base[64];
    for (em_ir_val v = 1; v < g->nvals && !g->err; v++) {
        const em_ir_value *x = cg_val(g, v);
        cg_value *c = &g->vals[v];
        if (!x || c->store == CG_NONE || c->store == CG_CONST || c->store == CG_REMAT) continue;
        sanitize(x->name, base, sizeof base);
        if (!base[0]) {
            const char *p = x->kind == EM_VAL_TEMP ? "t" : x->kind == EM_VAL_MATRIX ? "frag" : "v";
            snprintf(base, sizeof base, "%s%u", p, v);
        }
        c->name = claim_name(g, &used, base, v);
    }
    for (em_ir_mem m = 1; m < g->nmems && !g->err; m++) {
        const em_ir_memory *x = cg_mem_at(g, m);
        cg_mem *c = &g->mems[m];
        if (!x || c->store == CG_NONE) continue;
        sanitize(x->name, base, sizeof base);
        if (!base[0]) snprintf(base, sizeof base, "mem%u", m);
        c->name = claim_name(g, &used, base, m);
    }
    em_map_free(&used); /* the names themselves are owned by vals/mems */
}

/* ---- cube-level and unit-level code --------------------------------------------------------- */

static void emit_unit_block(cg *g, uint32_t b);
static void emit_cube_block(cg *g, uint32_t b);

static uint8_t brk_state(unsigned d)
{
    return (uint8_t)(2 * d);
}
static uint8_t cont_state(unsigned d)
{
    return (uint8_t)(2 * d + 1);
}

static bool push_loop(cg *g, bool cube, uint32_t idx)
{
    if (g->nloops >= CG_MAX_DEPTH) {
        cg_fail(g, EM_ERR_UNSUPPORTED, idx, "loops nested too deeply");
        return false;
    }
    g->loops[g->nloops++] = (cg_loop){.cube = cube, .depth = (uint8_t)g->cube_depth};
    return true;
}

/* The operand as a string (caller frees with em_sb_free). */
static em_strbuf opnd(cg *g, em_ir_val v)
{
    em_strbuf s;
    em_sb_init(&s);
    cg_operand(g, &s, v, false);
    return s;
}

static bool is_kind(cg *g, em_ir_val v, em_ir_val_kind kind)
{
    const em_ir_value *x = cg_val(g, v);
    return x && x->kind == kind;
}

/* True when the block (or a block inside it) has a break, continue or return: compilers drop the
 * unroll annotation of such loops, with a warning, when they see they end at once. */
static bool block_leaves(cg *g, uint32_t b, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(g->k, b);
    for (size_t i = 0; blk && i < blk->len && depth < 1000; i++) {
        const em_ir_inst *in = em_ir_inst_at(g->k, blk->items[i]);
        if (!in) continue;
        if (in->op == EM_OP_BREAK || in->op == EM_OP_CONTINUE || in->op == EM_OP_RETURN)
            return true;
        if (is_control(in->op) && (block_leaves(g, in->blocks[0], depth + 1) ||
                                   block_leaves(g, in->blocks[1], depth + 1)))
            return true;
    }
    return false;
}

/* The increment of a range counter: counter += step, wrapping without undefined behaviour. */
static void range_step(cg *g, em_strbuf *out, em_scalar s, const char *ctr, const char *step)
{
    (void)g;
    if (s == EM_U32 || s == EM_U64)
        em_sb_printf(out, "%s += %s", ctr, step);
    else
        em_sb_printf(out, "%s = (%s)((%s)%s + (%s)%s)", ctr, cg_ctype(s),
                     em_scalar_size(s) == 8 ? "uint64_t" : "uint32_t", ctr,
                     em_scalar_size(s) == 8 ? "uint64_t" : "uint32_t", step);
}

/* Emits `for (ctr = start; ctr < end; ctr += step) {` with end and step copied to locals when
 * they could change, and a guard when the step is not a constant. Returns the number of blocks
 * opened before the loop (to close after it). */
static int open_range(cg *g, uint32_t idx, const em_ir_inst *in, bool hoist_all)
{
    const em_ir_value *cv = cg_val(g, in->args[0]);
    em_scalar s = cv ? (em_scalar)cv->type.scalar : EM_I32;
    const char *t = cg_ctype(s);
    em_strbuf ctr = opnd(g, in->args[0]), v[3];
    char names[3][48];
    static const char *const pre[3] = {"lo", "hi", "st"};
    int opened = 0;
    for (int i = 0; i < 3; i++) {
        em_ir_val a = in->args[1 + i];
        v[i] = opnd(g, a);
        snprintf(names[i], sizeof names[i], "%s", v[i].data ? v[i].data : "0");
        /* the start is read once; the end and step every iteration, so copy them when they could
         * change (variables, or per-unit values read at lead_ from cube level) */
        bool copy =
            i > 0 && (is_kind(g, a, EM_VAL_VAR) ||
                      (hoist_all && !is_kind(g, a, EM_VAL_CONST) && !is_kind(g, a, EM_VAL_PARAM)));
        copy = copy || (v[i].data && strlen(v[i].data) >= sizeof names[i]); /* too long to inline */
        if (copy) {
            if (!opened) {
                cg_line(g, "{");
                g->indent++;
                opened = 1;
            }
            snprintf(names[i], sizeof names[i], "%s%u_", pre[i], idx);
            cg_line(g, "const %s %s = %s;", t, names[i], v[i].data);
        }
    }
    if (!is_kind(g, in->args[3], EM_VAL_CONST)) {
        cg_line(g, "if (%s > 0) {", names[2]);
        g->indent++;
        opened++;
    }
    if (in->imm && !hoist_all && !block_leaves(g, in->blocks[0], 0)) cg_line(g, "EM_UNROLL");
    em_strbuf inc;
    em_sb_init(&inc);
    range_step(g, &inc, s, ctr.data, names[2]);
    cg_line(g, "for (%s = %s; %s < %s; %s) {", ctr.data, names[0], ctr.data, names[1], inc.data);
    em_sb_free(&inc);
    em_sb_free(&ctr);
    for (int i = 0; i < 3; i++) em_sb_free(&v[i]);
    return opened;
}

static void close_blocks(cg *g, int n)
{
    for (int i = 0; i < n; i++) {
        g->indent--;
        cg_line(g, "}");
    }
}

static void emit_unit_inst(cg *g, uint32_t idx)
{
    const em_ir_inst *in = em_ir_inst_at(g->k, idx);
    if (!in || !g->needed[idx] || g->err) return;
    g->cur_inst = idx;
    switch (in->op) {
    case EM_OP_IF: {
        em_strbuf c = opnd(g, in->args[0]);
        if (c.data) cg_strip_parens(c.data);
        cg_line(g, "if (%s) {", c.data);
        em_sb_free(&c);
        g->indent++;
        emit_unit_block(g, in->blocks[0]);
        g->indent--;
        if (in->blocks[1] && em_ir_block_at(g->k, in->blocks[1])->len) {
            cg_line(g, "} else {");
            g->indent++;
            emit_unit_block(g, in->blocks[1]);
            g->indent--;
        }
        cg_line(g, "}");
        return;
    }
    case EM_OP_RANGE: {
        int opened = open_range(g, idx, in, false);
        if (!push_loop(g, false, idx)) return;
        g->indent++;
        emit_unit_block(g, in->blocks[0]);
        g->indent--;
        g->nloops--;
        cg_line(g, "}");
        close_blocks(g, opened);
        return;
    }
    case EM_OP_LOOP:
        if (!push_loop(g, false, idx)) return;
        cg_line(g, "for (;;) {");
        g->indent++;
        emit_unit_block(g, in->blocks[0]);
        g->indent--;
        g->nloops--;
        cg_line(g, "}");
        return;
    case EM_OP_BREAK:
    case EM_OP_CONTINUE: {
        bool brk = in->op == EM_OP_BREAK;
        if (!g->nloops) {
            cg_fail(g, EM_ERR_INVALID, idx, "%s outside a loop", brk ? "break" : "continue");
            return;
        }
        const cg_loop *l = &g->loops[g->nloops - 1];
        if (!l->cube) {
            cg_line(g, brk ? "break;" : "continue;");
            return;
        }
        /* leaves a cube-level loop: the unit waits in its state until the loop moves on */
        cg_line(g, "state_[u_] = %u; /* %s */", brk ? brk_state(l->depth) : cont_state(l->depth),
                brk ? "break" : "continue");
        cg_line(g, "goto next_unit_%d_;", g->cur_region);
        g->next_used = true;
        return;
    }
    case EM_OP_RETURN:
        if (g->state) cg_line(g, "state_[u_] = 1; /* returned */");
        cg_line(g, "goto next_unit_%d_;", g->cur_region);
        g->next_used = true;
        return;
    default:
        cg_emit_op(g, idx, in);
        return;
    }
}

static void emit_unit_block(cg *g, uint32_t b)
{
    const em_ir_block *blk = em_ir_block_at(g->k, b);
    for (size_t i = 0; blk && i < blk->len && !g->err; i++) emit_unit_inst(g, blk->items[i]);
}

static void declare_local(cg *g, em_ir_val v)
{
    const em_ir_value *x = cg_val(g, v);
    const cg_value *c = &g->vals[v];
    char tb[32];
    if (x->kind == EM_VAL_MATRIX)
        cg_line(g, "%s %s[%zu] = {0};", cg_ctype((em_scalar)x->type.scalar), c->name,
                frag_elems(x));
    else if (x->type.lanes > 1)
        cg_line(g, "%s %s = {{0}};", cg_vtype(g, x->type, tb), c->name);
    else
        cg_line(g, "%s %s = 0;", cg_ctype((em_scalar)x->type.scalar), c->name);
}

static void emit_region(cg *g, int32_t r, const em_ir_block *blk, size_t from, size_t to)
{
    cg_region *reg = &g->regions[r];
    if (!reg->needed) return;
    bool saved = g->at_cube;
    g->at_cube = false;
    g->cur_region = r;
    g->next_used = false;
    if (g->has_barrier) cg_line(g, "/* region %d: every unit, up to the next barrier */", r);
    cg_line(g, "for (uint32_t u_ = 0; u_ < units_; u_++) {");
    g->indent++;
    if (g->state) cg_line(g, "if (state_[u_]) continue; /* left early */");
    for (size_t i = 0; i < reg->uvals.len; i++) {
        const em_ir_value *x = cg_val(g, reg->uvals.items[i]);
        const char *n = g->vals[reg->uvals.items[i]].name;
        cg_line(g, "%s *const %s = %s_all_ + (size_t)u_ * %zu;",
                cg_ctype((em_scalar)x->type.scalar), n, n, frag_elems(x));
    }
    for (size_t i = 0; i < reg->umems.len; i++) {
        const em_ir_memory *m = cg_mem_at(g, reg->umems.items[i]);
        const char *n = g->mems[reg->umems.items[i]].name;
        cg_line(g, "%s *const %s = %s_all_ + (size_t)u_ * %zu;",
                cg_mtype((em_scalar)m->elem.scalar), n, n, (size_t)m->length * m->elem.lanes);
    }
    for (size_t i = 0; i < reg->vals.len; i++) declare_local(g, reg->vals.items[i]);
    for (size_t i = 0; i < reg->mems.len; i++) {
        const em_ir_memory *m = cg_mem_at(g, reg->mems.items[i]);
        cg_line(g, "%s %s[%zu] = {0};", cg_mtype((em_scalar)m->elem.scalar),
                g->mems[reg->mems.items[i]].name, (size_t)m->length * m->elem.lanes);
    }
    for (size_t i = from; i < to && !g->err; i++) emit_unit_inst(g, blk->items[i]);
    if (g->next_used) {
        g->indent--;
        cg_line(g, "next_unit_%d_:;", r);
        g->indent++;
    }
    g->indent--;
    cg_line(g, "}");
    g->at_cube = saved;
}

/* True when reading the value at cube level needs the first running unit (lead_). */
static bool per_unit(cg *g, em_ir_val v)
{
    return v < g->nvals && (g->vals[v].store == CG_UNIT || g->vals[v].store == CG_REMAT);
}

static void cube_loop_top(cg *g, unsigned d)
{
    if (g->state)
        cg_line(g, "em_resume(state_, units_, %u, %u); /* units that continued run again */",
                cont_state(d), cont_state(d));
}

static void cube_loop_bottom(cg *g, unsigned d)
{
    if (g->state) cg_line(g, "if (!em_any_running(state_, units_, %u)) break;", cont_state(d));
}

static void cube_loop_after(cg *g, unsigned d)
{
    if (g->state)
        cg_line(g, "em_resume(state_, units_, %u, %u); /* the loop is over for everyone */",
                brk_state(d), cont_state(d));
}

static void emit_cube_inst(cg *g, uint32_t idx)
{
    const em_ir_inst *in = em_ir_inst_at(g->k, idx);
    if (!in || g->err) return;
    g->cur_inst = idx;
    switch (in->op) {
    case EM_OP_SYNC_CUBE:
        cg_line(g, "/* sync_cube */");
        return;
    case EM_OP_IF: {
        em_strbuf c = opnd(g, in->args[0]);
        bool lead = per_unit(g, in->args[0]) && g->state;
        if (c.data && !lead) cg_strip_parens(c.data); /* with lead_ it follows && */
        if (lead) {
            g->lead = true;
            cg_line(g, "lead_ = em_lead(state_, units_);");
            cg_line(g, "if (lead_ < units_ && %s) { /* uniform: the first running unit decides */",
                    c.data);
        } else {
            cg_line(g, "if (%s) { /* uniform */", c.data);
        }
        em_sb_free(&c);
        g->indent++;
        emit_cube_block(g, in->blocks[0]);
        g->indent--;
        if (in->blocks[1] && em_ir_block_at(g->k, in->blocks[1])->len) {
            cg_line(g, "} else {");
            g->indent++;
            emit_cube_block(g, in->blocks[1]);
            g->indent--;
        }
        cg_line(g, "}");
        return;
    }
    case EM_OP_RANGE:
    case EM_OP_LOOP: {
        int opened = 0;
        if (in->op == EM_OP_RANGE) {
            bool pu =
                per_unit(g, in->args[1]) || per_unit(g, in->args[2]) || per_unit(g, in->args[3]);
            if (pu && g->state) {
                g->lead = true;
                cg_line(g, "lead_ = em_lead(state_, units_);");
                cg_line(g, "if (lead_ < units_) { /* uniform bounds: the first running unit's */");
                g->indent++;
                opened = 1;
            }
        }
        unsigned d = ++g->cube_depth;
        if (!push_loop(g, true, idx)) return;
        if (in->op == EM_OP_RANGE)
            opened += open_range(g, idx, in, true);
        else
            cg_line(g, "for (;;) {");
        g->indent++;
        cube_loop_top(g, d);
        emit_cube_block(g, in->blocks[0]);
        cube_loop_bottom(g, d);
        g->indent--;
        cg_line(g, "}");
        cube_loop_after(g, d);
        close_blocks(g, opened);
        g->nloops--;
        g->cube_depth--;
        return;
    }
    case EM_OP_BREAK:
        cg_line(g, "break;");
        return;
    case EM_OP_CONTINUE:
        cg_line(g, "continue;");
        return;
    case EM_OP_RETURN:
        cg_line(g, "goto cube_done_; /* every unit returns */");
        g->done_used = true;
        return;
    default:
        return;
    }
}

static void emit_cube_block(cg *g, uint32_t b)
{
    const em_ir_block *blk = em_ir_block_at(g->k, b);
    size_t i = 0;
    while (blk && i < blk->len && !g->err) {
        uint32_t idx = blk->items[i];
        int32_t r = idx < g->ninsts ? g->region_of[idx] : -3;
        if (r >= 0) {
            size_t j = i;
            while (j < blk->len && blk->items[j] < g->ninsts && g->region_of[blk->items[j]] == r)
                j++;
            emit_region(g, r, blk, i, j);
            i = j;
            continue;
        }
        if (r == -1 && g->needed[idx]) emit_cube_inst(g, idx);
        i++;
    }
}

/* ---- the kernel function -------------------------------------------------------------------- */

static void emit_params(cg *g)
{
    const em_ir_kernel *k = g->k;
    for (size_t i = 0; i < em_ir_param_count(k); i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind == EM_PARAM_BUFFER) {
            const em_ir_memory *m = cg_mem_at(g, p->id);
            if (!m || g->mems[p->id].store != CG_GLOBAL) continue;
            const char *t = cg_mtype((em_scalar)m->elem.scalar);
            bool ro = m->access == EM_READ;
            cg_line(g, "%s%s *const %s = (%s%s *)launch_->bufs[%zu].data;", ro ? "const " : "", t,
                    g->mems[p->id].name, ro ? "const " : "", t, i);
        } else {
            const em_ir_value *x = cg_val(g, p->id);
            if (!x || g->vals[p->id].store != CG_PARAM) continue;
            em_scalar s = (em_scalar)x->type.scalar;
            const char *t = cg_ctype(s), *n = g->vals[p->id].name;
            if (s == EM_BOOL)
                cg_line(g, "const bool %s = launch_->scalars[%zu].i != 0;", n, i);
            else if (em_scalar_is_int(s))
                cg_line(g, "const %s %s = (%s)launch_->scalars[%zu].%c;", t, n, t, i,
                        em_scalar_is_signed(s) ? 'i' : 'u');
            else if (s == EM_F16 || s == EM_BF16) {
                if (s == EM_F16)
                    g->needs->d2h = true;
                else
                    g->needs->d2b = true;
                cg_line(g, "const %s %s = em_d2%c(launch_->scalars[%zu].f);", t, n,
                        s == EM_F16 ? 'h' : 'b', i);
            } else
                cg_line(g, "const %s %s = (%s)launch_->scalars[%zu].f;", t, n, t, i);
        }
    }
}

/* One entry of the cube scratch: shared memory, per-unit values, per-unit arrays, unit states. */
typedef struct scratch_item {
    const char *name; /* pointer name (per-unit arrays: the base, NAME_all_) */
    char type[32];    /* element type */
    size_t count;     /* elements (times units_ when per_unit) */
    bool per_unit;    /* one slice per unit */
    bool all;         /* the pointer is NAME_all_ */
} scratch_item;

static void emit_scratch(cg *g, scratch_item *items, size_t n)
{
    if (!n) return;
    g->needs->scratch = true;
    cg_line(g, "/* cube scratch: shared memory and what each unit keeps across barriers */");
    char prev[112] = "";
    for (size_t i = 0; i < n; i++) {
        char at[112];
        snprintf(at, sizeof at, "%s%s_at_", items[i].name, items[i].all ? "_all" : "");
        if (!i)
            cg_line(g, "const size_t %s = 0;", at);
        else
            cg_line(g, "const size_t %s = %s + em_pad(sizeof(%s) * %zu%s);", at, prev,
                    items[i - 1].type, items[i - 1].count,
                    items[i - 1].per_unit ? " * units_" : "");
        snprintf(prev, sizeof prev, "%s", at);
    }
    cg_line(g, "const size_t scratch_size_ = %s + em_pad(sizeof(%s) * %zu%s);", prev,
            items[n - 1].type, items[n - 1].count, items[n - 1].per_unit ? " * units_" : "");
    cg_line(g, "unsigned char *const scratch_ = (unsigned char *)calloc(1, scratch_size_);");
    cg_line(g, "if (!scratch_) {");
    cg_line(
        g,
        "    fprintf(stderr, \"ember: kernel %s: cannot allocate %%zu bytes of cube scratch\\n\", "
        "scratch_size_);",
        em_ir_kernel_name(g->k));
    cg_line(g, "    return;");
    cg_line(g, "}");
    for (size_t i = 0; i < n; i++) {
        const char *suffix = items[i].all ? "_all_" : "";
        cg_line(g, "%s *const %s%s = (%s *)(scratch_ + %s%s_at_);", items[i].type, items[i].name,
                suffix, items[i].type, items[i].name, items[i].all ? "_all" : "");
    }
}

static bool gather_scratch(cg *g, scratch_item **out, size_t *n)
{
    size_t cap = g->nvals + g->nmems + 2;
    scratch_item *it = calloc(cap, sizeof *it);
    if (!it) {
        cg_fail(g, EM_ERR_NOMEM, UINT32_MAX, "out of memory generating C");
        return false;
    }
    size_t k = 0;
    for (em_ir_mem m = 1; m < g->nmems; m++) {
        const em_ir_memory *x = cg_mem_at(g, m);
        const cg_mem *c = &g->mems[m];
        if (!x || (c->store != CG_SHARED && c->store != CG_UNIT)) continue;
        scratch_item *s = &it[k++];
        s->name = c->name;
        snprintf(s->type, sizeof s->type, "%s", cg_mtype((em_scalar)x->elem.scalar));
        s->count = (size_t)x->length * x->elem.lanes;
        s->per_unit = s->all = c->store == CG_UNIT;
    }
    for (em_ir_val v = 1; v < g->nvals; v++) {
        const em_ir_value *x = cg_val(g, v);
        const cg_value *c = &g->vals[v];
        if (!x || c->store != CG_UNIT) continue;
        scratch_item *s = &it[k++];
        s->name = c->name;
        s->per_unit = true;
        if (x->kind == EM_VAL_MATRIX) {
            snprintf(s->type, sizeof s->type, "%s", cg_ctype((em_scalar)x->type.scalar));
            s->count = frag_elems(x);
            s->all = true;
        } else {
            char tb[32];
            snprintf(s->type, sizeof s->type, "%s", cg_vtype(g, x->type, tb));
            s->count = 1;
        }
    }
    if (g->state) {
        scratch_item *s = &it[k++];
        s->name = "state_";
        snprintf(s->type, sizeof s->type, "uint8_t");
        s->count = 1;
        s->per_unit = true;
    }
    *out = it;
    *n = k;
    return true;
}

static void emit_function(cg *g, em_strbuf *out)
{
    em_strbuf body;
    em_sb_init(&body);
    g->sb = &body;
    g->indent = 2;
    g->at_cube = true;
    emit_cube_block(g, em_ir_body(g->k));
    if (g->err) {
        em_sb_free(&body);
        return;
    }
    g->sb = out;
    g->indent = 0;
    const char *name = em_ir_kernel_name(g->k);
    em_sb_appendc(out, '\n');
    cg_line(g, "/* kernel %s: %zu region%s%s */", name, g->nregions, g->nregions == 1 ? "" : "s",
            g->state ? ", units may leave early" : "");
    cg_line(g, "void emk_%s(const em_cpu_launch *launch_, uint64_t first_, uint64_t count_);",
            name);
    cg_line(g, "void emk_%s(const em_cpu_launch *launch_, uint64_t first_, uint64_t count_)", name);
    cg_line(g, "{");
    g->indent = 1;
    cg_line(g, "if (!launch_) return;");
    cg_line(g, "const uint32_t dim_x_ = launch_->cube_dim[0], dim_y_ = launch_->cube_dim[1], "
               "dim_z_ = launch_->cube_dim[2];");
    cg_line(g, "const uint32_t cnt_x_ = launch_->cube_count[0], cnt_y_ = launch_->cube_count[1], "
               "cnt_z_ = launch_->cube_count[2];");
    cg_line(g, "const uint32_t units_ = dim_x_ * dim_y_ * dim_z_;");
    cg_line(g, "const uint64_t cubes_ = (uint64_t)cnt_x_ * cnt_y_ * cnt_z_;");
    cg_line(g, "if (units_ == 0 || first_ >= cubes_ || count_ == 0) return;");
    cg_line(g, "const uint64_t last_ = count_ < cubes_ - first_ ? first_ + count_ : cubes_;");
    emit_params(g);
    scratch_item *items = NULL;
    size_t nitems = 0;
    if (!gather_scratch(g, &items, &nitems)) {
        em_sb_free(&body);
        return;
    }
    emit_scratch(g, items, nitems);
    free(items);
    for (em_ir_val v = 1; v < g->nvals; v++) {
        const em_ir_value *x = cg_val(g, v);
        if (x && g->vals[v].store == CG_CUBE)
            cg_line(g, "%s %s = 0; /* counter of a loop with barriers */",
                    cg_ctype((em_scalar)x->type.scalar), g->vals[v].name);
    }
    if (g->lead) cg_line(g, "uint32_t lead_ = 0;");
    if (g->state) g->needs->state = true;
    cg_line(g, "for (uint64_t cube_ = first_; cube_ < last_; cube_++) {");
    g->indent = 2;
    if (g->state) cg_line(g, "memset(state_, 0, units_);");
    em_sb_appendn(out, body.data, body.len);
    em_sb_free(&body);
    if (g->done_used) {
        g->indent = 1;
        cg_line(g, "cube_done_:;");
    }
    g->indent = 1;
    cg_line(g, "}");
    if (nitems) cg_line(g, "free(scratch_);");
    g->indent = 0;
    cg_line(g, "}");
}

/* ---- one kernel ----------------------------------------------------------------------------- */

static void cg_free(cg *g)
{
    for (size_t v = 0; g->vals && v < g->nvals; v++) free(g->vals[v].name);
    for (size_t m = 0; g->mems && m < g->nmems; m++) free(g->mems[m].name);
    for (size_t r = 0; r < g->nregions; r++) {
        free(g->regions[r].vals.items);
        free(g->regions[r].mems.items);
        free(g->regions[r].uvals.items);
        free(g->regions[r].umems.items);
    }
    free(g->regions);
    free(g->vals);
    free(g->mems);
    free(g->region_of);
    free(g->needed);
    free(g->barrier);
}

static bool valid_identifier(const char *s)
{
    if (!s || !*s || strlen(s) > 200) return false;
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

static em_status gen_kernel(const em_ir_kernel *k, const em_caps *caps, cg_needs *needs,
                            em_strbuf *out)
{
    cg g = {.k = k, .caps = caps, .needs = needs};
    g.nvals = em_ir_value_count(k) + 1;
    g.nmems = em_ir_mem_count(k) + 1;
    g.ninsts = em_ir_inst_count(k);
    g.nblocks = 1;
    while (em_ir_block_at(k, (uint32_t)g.nblocks)) g.nblocks++;
    g.vals = calloc(g.nvals, sizeof *g.vals);
    g.mems = calloc(g.nmems, sizeof *g.mems);
    g.region_of = malloc((g.ninsts + 1) * sizeof *g.region_of);
    g.needed = calloc(g.ninsts + 1, 1);
    g.barrier = calloc(g.nblocks + 1, 1);
    if (!g.vals || !g.mems || !g.region_of || !g.needed || !g.barrier) {
        cg_free(&g);
        return em_set_error(EM_ERR_NOMEM, "out of memory generating C for kernel %s",
                            em_ir_kernel_name(k));
    }
    for (size_t i = 0; i <= g.ninsts; i++) g.region_of[i] = -3;
    for (size_t v = 0; v < g.nvals; v++) g.vals[v].region = -1, g.vals[v].setup_in = -1;
    for (size_t m = 0; m < g.nmems; m++) g.mems[m].region = -1, g.mems[m].setup_in = -1;

    g.has_barrier = block_barrier(&g, em_ir_body(k), 0);
    walk_cube(&g, em_ir_body(k), false, 0, 0);
    for (uint32_t i = 0; i < g.ninsts; i++) {
        const em_ir_inst *in = em_ir_inst_at(k, i);
        if (in && g.region_of[i] != -3 && in->dst && in->dst < g.nvals) g.vals[in->dst].def = i;
    }
    if (!g.err) liveness(&g);
    for (size_t i = 0; !g.err && i < g.ninsts; i++)
        if (g.needed[i] && g.region_of[i] >= 0) g.regions[g.region_of[i]].needed = true;
    if (!g.err) visit(&g, em_ir_body(k), 0, true, 0);
    if (!g.err) decide_storage(&g);
    if (!g.err) visit(&g, em_ir_body(k), 1, true, 0);
    if (!g.err) assign_names(&g);
    if (!g.err) emit_function(&g, out);
    em_status st = g.err;
    cg_free(&g);
    return st;
}

char *em_codegen_c(const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    if (!ks && n) {
        em_set_error(EM_ERR_INVALID, "em_codegen_c: no kernels");
        return NULL;
    }
    cg_needs *needs = calloc(1, sizeof *needs);
    if (!needs) {
        em_set_error(EM_ERR_NOMEM, "out of memory generating C");
        return NULL;
    }
    em_strbuf body;
    em_sb_init(&body);
    em_status st = EM_OK;
    for (size_t i = 0; i < n && st == EM_OK; i++) {
        const em_ir_kernel *k = ks[i];
        if (!k) {
            st = em_set_error(EM_ERR_INVALID, "em_codegen_c: kernel %zu is NULL", i);
            break;
        }
        const char *name = em_ir_kernel_name(k);
        if (!valid_identifier(name)) {
            st = em_set_error(EM_ERR_INVALID, "kernel name '%s' is not a C identifier",
                              name ? name : "");
            break;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(em_ir_kernel_name(ks[j]), name) == 0)
                st = em_set_error(EM_ERR_INVALID,
                                  "two kernels named '%s' in one C translation unit", name);
        if (st) break;
        st = em_ir_verify(k, 0);
        if (st) {
            em_error_context("C target");
            break;
        }
        st = gen_kernel(k, caps, needs, &body);
    }
    char *result = NULL;
    if (st == EM_OK) {
        em_strbuf all;
        em_sb_init(&all);
        cg_prelude(&all, needs, n);
        em_sb_appendn(&all, body.data, body.len);
        result = em_sb_take(&all);
        if (!result) em_set_error(EM_ERR_NOMEM, "out of memory generating C");
    }
    em_sb_free(&body);
    free(needs);
    return result;
}
