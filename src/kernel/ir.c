/* ir.c — building and reading IR kernels: the builder API of ember/kernel.h (values, memory,
 * instructions, structured control flow), the accessors, and deep copies. The builder records
 * whatever it is given; em_ir_verify (verify.c) judges it. */
#include <stdlib.h>
#include <string.h>

#include "kernel/ir_internal.h"

static void remember_const(em_ir_kernel *k, em_ir_val id);

#define PUSH_OR_OOM(k, vec, x) (EM_VEC_PUSH(&(k)->vec, (x)) ? true : ((k)->oom = true, false))

static void builder_misuse(em_ir_kernel *k, const char *what)
{
    if (!k->build_error[0]) {
        size_t n = strlen(what);
        if (n >= sizeof(k->build_error)) n = sizeof(k->build_error) - 1;
        memcpy(k->build_error, what, n);
        k->build_error[n] = 0;
    }
}

static const char *intern(em_ir_kernel *k, const char *s)
{
    if (!s || !*s) return NULL;
    char *copy = em_arena_strdup(&k->strings, s);
    if (!copy) k->oom = true;
    return copy;
}

em_ir_kernel *em_ir_kernel_new(const char *name)
{
    em_ir_kernel *k = calloc(1, sizeof(*k));
    if (!k) {
        em_set_error(EM_ERR_NOMEM, "out of memory creating kernel");
        return NULL;
    }
    k->name = strdup(name && *name ? name : "kernel");
    em_arena_init(&k->strings, 4096);
    em_map_init(&k->consts);
    /* slot 0 of values, memories and blocks is reserved for "none" */
    em_ir_value none_value = {0};
    em_ir_memory none_mem = {0};
    em_ir_block none_block = {0};
    bool ok = k->name && EM_VEC_PUSH(&k->values, none_value) && EM_VEC_PUSH(&k->mems, none_mem) &&
              EM_VEC_PUSH(&k->blocks, none_block) && EM_VEC_PUSH(&k->blocks, none_block);
    if (!ok) {
        em_ir_kernel_free(k);
        em_set_error(EM_ERR_NOMEM, "out of memory creating kernel");
        return NULL;
    }
    return k;
}

void em_ir_kernel_free(em_ir_kernel *k)
{
    if (!k) return;
    for (size_t i = 0; i < k->blocks.len; i++) free(k->blocks.items[i].items);
    free(k->blocks.items);
    free(k->values.items);
    free(k->mems.items);
    free(k->insts.items);
    free(k->params.items);
    em_arena_free(&k->strings);
    em_map_free(&k->consts);
    free(k->name);
    free(k);
}

static const char *reintern(em_ir_kernel *dst, const char *s) { return s ? intern(dst, s) : NULL; }

em_ir_kernel *em_ir_kernel_clone(const em_ir_kernel *k)
{
    if (!k) return NULL;
    em_ir_kernel *c = em_ir_kernel_new(k->name);
    if (!c) return NULL;
    c->values.len = c->mems.len = c->blocks.len = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < k->values.len; i++) {
        em_ir_value v = k->values.items[i];
        v.name = reintern(c, v.name);
        ok = EM_VEC_PUSH(&c->values, v);
        if (ok && i > 0 && v.kind == EM_VAL_CONST) remember_const(c, (em_ir_val)i);
    }
    for (size_t i = 0; ok && i < k->mems.len; i++) {
        em_ir_memory m = k->mems.items[i];
        m.name = reintern(c, m.name);
        ok = EM_VEC_PUSH(&c->mems, m);
    }
    for (size_t i = 0; ok && i < k->insts.len; i++) {
        em_ir_inst in = k->insts.items[i];
        in.str = reintern(c, in.str);
        ok = EM_VEC_PUSH(&c->insts, in);
    }
    for (size_t i = 0; ok && i < k->blocks.len; i++) {
        em_ir_block b = {0};
        if (k->blocks.items[i].len) {
            b.items = malloc(k->blocks.items[i].len * sizeof(uint32_t));
            ok = b.items != NULL;
            if (ok) {
                memcpy(b.items, k->blocks.items[i].items, k->blocks.items[i].len * sizeof(uint32_t));
                b.len = b.cap = k->blocks.items[i].len;
            }
        }
        if (ok) ok = EM_VEC_PUSH(&c->blocks, b);
        if (!ok) free(b.items);
    }
    for (size_t i = 0; ok && i < k->params.len; i++) ok = EM_VEC_PUSH(&c->params, k->params.items[i]);
    if (!ok || c->oom) {
        em_ir_kernel_free(c);
        em_set_error(EM_ERR_NOMEM, "out of memory copying kernel");
        return NULL;
    }
    memcpy(c->cube_dim, k->cube_dim, sizeof(c->cube_dim));
    c->cluster_dim = k->cluster_dim;
    memcpy(c->open, k->open, sizeof(c->open));
    c->depth = k->depth;
    memcpy(c->build_error, k->build_error, sizeof(c->build_error));
    return c;
}

void em_ir_set_cube_dim(em_ir_kernel *k, uint32_t x, uint32_t y, uint32_t z)
{
    if (!k) return;
    k->cube_dim[0] = x;
    k->cube_dim[1] = y;
    k->cube_dim[2] = z;
}

void em_ir_set_cluster_dim(em_ir_kernel *k, uint32_t x)
{
    if (k) k->cluster_dim = x;
}

void em_ir_set_loc(em_ir_kernel *k, uint32_t line, uint32_t col)
{
    if (!k) return;
    k->line = line;
    k->col = col;
}

/* ---- slots ---------------------------------------------------------------------------------- */

em_ir_val em_ir_new_value(em_ir_kernel *k, em_ir_value v)
{
    if (!PUSH_OR_OOM(k, values, v)) return EM_IR_NONE;
    return (em_ir_val)(k->values.len - 1);
}

uint32_t em_ir_new_block(em_ir_kernel *k)
{
    em_ir_block b = {0};
    if (!PUSH_OR_OOM(k, blocks, b)) return 0;
    return (uint32_t)(k->blocks.len - 1);
}

bool em_ir_block_push(em_ir_kernel *k, uint32_t block, uint32_t inst)
{
    if (block == 0 || block >= k->blocks.len) return false;
    em_ir_block *b = &k->blocks.items[block];
    if (!EM_VEC_PUSH(b, inst)) {
        k->oom = true;
        return false;
    }
    return true;
}

static uint32_t current_block(const em_ir_kernel *k)
{
    return k->depth ? k->open[k->depth - 1].block : 1;
}

static em_ir_mem new_mem(em_ir_kernel *k, em_ir_memory m)
{
    if (!PUSH_OR_OOM(k, mems, m)) return 0;
    return (em_ir_mem)(k->mems.len - 1);
}

/* ---- parameters, memory, values ------------------------------------------------------------- */

em_ir_mem em_ir_param_buffer(em_ir_kernel *k, const char *name, em_type elem, em_mem_access access,
                             unsigned rank)
{
    if (!k) return 0;
    em_ir_memory m = {.elem = elem, .space = EM_MEM_GLOBAL, .access = (uint8_t)access,
                      .rank = (uint8_t)(rank > 255 ? 255 : rank), .param = (uint32_t)k->params.len,
                      .name = intern(k, name)};
    em_ir_mem id = new_mem(k, m);
    em_ir_param p = {EM_PARAM_BUFFER, id};
    if (id) PUSH_OR_OOM(k, params, p);
    return id;
}

em_ir_val em_ir_param_scalar(em_ir_kernel *k, const char *name, em_type type)
{
    if (!k) return 0;
    em_ir_value v = {.type = type, .kind = EM_VAL_PARAM, .param = (uint32_t)k->params.len,
                     .name = intern(k, name)};
    em_ir_val id = em_ir_new_value(k, v);
    em_ir_param p = {EM_PARAM_SCALAR, id};
    if (id) PUSH_OR_OOM(k, params, p);
    return id;
}

static em_ir_mem block_memory(em_ir_kernel *k, em_mem_space space, const char *name, em_type elem,
                              uint32_t length)
{
    if (!k) return 0;
    em_ir_memory m = {.elem = elem, .space = (uint8_t)space, .access = EM_READ_WRITE,
                      .length = length, .name = intern(k, name)};
    return new_mem(k, m);
}

em_ir_mem em_ir_shared(em_ir_kernel *k, const char *name, em_type elem, uint32_t length)
{
    return block_memory(k, EM_MEM_SHARED, name, elem, length);
}

em_ir_mem em_ir_local(em_ir_kernel *k, const char *name, em_type elem, uint32_t length)
{
    return block_memory(k, EM_MEM_LOCAL, name, elem, length);
}

/* The key under which a constant is remembered: its type and payload bits. */
static void const_key(em_type type, em_ir_const c, unsigned char key[10])
{
    key[0] = type.scalar;
    key[1] = type.lanes;
    memcpy(key + 2, &c.u, 8);
}

static void remember_const(em_ir_kernel *k, em_ir_val id)
{
    unsigned char key[10];
    const em_ir_value *v = &k->values.items[id];
    const_key(v->type, v->c, key);
    if (!em_map_put(&k->consts, key, sizeof key, (void *)(uintptr_t)id)) k->oom = true;
}

static em_ir_val new_const(em_ir_kernel *k, em_type type, em_ir_const c)
{
    if (!k) return 0;
    /* reuse an identical constant so that printing and hashing stay compact */
    unsigned char key[10];
    const_key(type, c, key);
    void *found = em_map_get(&k->consts, key, sizeof key);
    if (found) return (em_ir_val)(uintptr_t)found;
    em_ir_value v = {.type = type, .kind = EM_VAL_CONST, .c = c};
    em_ir_val id = em_ir_new_value(k, v);
    if (id) remember_const(k, id);
    return id;
}

em_ir_val em_ir_const_int(em_ir_kernel *k, em_type type, int64_t v)
{
    em_ir_const c = {.i = v};
    if (em_scalar_is_float(type.scalar)) c.f = (double)v;
    return new_const(k, type, c);
}

em_ir_val em_ir_const_uint(em_ir_kernel *k, em_type type, uint64_t v)
{
    em_ir_const c = {.u = v};
    if (em_scalar_is_float(type.scalar)) c.f = (double)v;
    return new_const(k, type, c);
}

em_ir_val em_ir_const_float(em_ir_kernel *k, em_type type, double v)
{
    em_ir_const c = {.f = v};
    if (!em_scalar_is_float(type.scalar)) {
        if (em_scalar_is_signed(type.scalar) || type.scalar == EM_BOOL)
            c.i = (int64_t)v;
        else
            c.u = (uint64_t)v;
    }
    return new_const(k, type, c);
}

em_ir_val em_ir_const_bool(em_ir_kernel *k, bool v)
{
    em_ir_const c = {.i = v ? 1 : 0};
    return new_const(k, em_ty(EM_BOOL), c);
}

em_ir_val em_ir_var(em_ir_kernel *k, em_type type, const char *name)
{
    if (!k) return 0;
    em_ir_value v = {.type = type, .kind = EM_VAL_VAR, .name = intern(k, name)};
    return em_ir_new_value(k, v);
}

em_ir_val em_ir_matrix(em_ir_kernel *k, em_mat_role role, em_scalar elem, unsigned m, unsigned n,
                       unsigned kdim, em_mat_layout layout, const char *name)
{
    if (!k) return 0;
    em_ir_value v = {.type = em_ty(elem), .kind = EM_VAL_MATRIX, .mat_role = (uint8_t)role,
                     .mat_layout = (uint8_t)layout, .mat_m = (uint16_t)m, .mat_n = (uint16_t)n,
                     .mat_k = (uint16_t)kdim, .name = intern(k, name)};
    return em_ir_new_value(k, v);
}

/* ---- instructions --------------------------------------------------------------------------- */

static uint32_t append(em_ir_kernel *k, em_ir_inst in)
{
    in.line = k->line;
    in.col = k->col;
    if (!PUSH_OR_OOM(k, insts, in)) return UINT32_MAX;
    uint32_t idx = (uint32_t)(k->insts.len - 1);
    em_ir_block_push(k, current_block(k), idx);
    return idx;
}

em_ir_val em_ir_emit(em_ir_kernel *k, em_ir_op op, em_type dst_type, em_ir_val a, em_ir_val b,
                     em_ir_val c, em_ir_val d, em_ir_mem mem, int32_t imm)
{
    if (!k) return EM_IR_NONE;
    em_ir_inst in = {.op = (uint16_t)op, .args = {a, b, c, d}, .mem = mem, .imm = imm};
    if (dst_type.lanes > 0) {
        em_ir_value t = {.type = dst_type, .kind = EM_VAL_TEMP};
        in.dst = em_ir_new_value(k, t);
        if (!in.dst) return EM_IR_NONE;
    }
    append(k, in);
    return in.dst;
}

static em_type type_of(const em_ir_kernel *k, em_ir_val v)
{
    if (v == 0 || v >= k->values.len) return em_ty(EM_I32); /* the verifier reports the bad id */
    return k->values.items[v].type;
}

static em_type broadcast(const em_ir_kernel *k, em_ir_val a, em_ir_val b)
{
    em_type ta = type_of(k, a), tb = type_of(k, b);
    if (ta.lanes == 1 && tb.lanes > 1) ta.lanes = tb.lanes;
    return ta;
}

em_ir_val em_ir_binary(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b)
{
    if (!k) return 0;
    em_type t = broadcast(k, a, b);
    const em_op_info *info = em_ir_op_info(op);
    if (info && info->cls == EM_OPC_COMPARE) t.scalar = EM_BOOL;
    return em_ir_emit(k, op, t, a, b, 0, 0, 0, 0);
}

em_ir_val em_ir_unary(em_ir_kernel *k, em_ir_op op, em_ir_val a)
{
    if (!k) return 0;
    em_type t = type_of(k, a);
    if (op == EM_OP_ISNAN || op == EM_OP_ISINF) t.scalar = EM_BOOL;
    if (op == EM_OP_POPCOUNT || op == EM_OP_CLZ || op == EM_OP_CTZ) t.scalar = EM_U32;
    return em_ir_emit(k, op, t, a, 0, 0, 0, 0, 0);
}

em_ir_val em_ir_ternary(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b, em_ir_val c)
{
    if (!k) return 0;
    em_type t = op == EM_OP_SELECT ? broadcast(k, b, c) : broadcast(k, a, b);
    if (op != EM_OP_SELECT && type_of(k, c).lanes > t.lanes) t.lanes = type_of(k, c).lanes;
    if (op == EM_OP_SELECT && type_of(k, a).lanes > t.lanes) t.lanes = type_of(k, a).lanes;
    return em_ir_emit(k, op, t, a, b, c, 0, 0, 0);
}

em_ir_val em_ir_cast(em_ir_kernel *k, em_type to, em_ir_val a)
{
    return em_ir_emit(k, EM_OP_CAST, to, a, 0, 0, 0, 0, 0);
}

em_ir_val em_ir_bitcast(em_ir_kernel *k, em_type to, em_ir_val a)
{
    return em_ir_emit(k, EM_OP_BITCAST, to, a, 0, 0, 0, 0, 0);
}

em_ir_val em_ir_extract(em_ir_kernel *k, em_ir_val line, em_ir_val lane)
{
    if (!k) return 0;
    em_type t = type_of(k, line);
    t.lanes = 1;
    return em_ir_emit(k, EM_OP_EXTRACT, t, line, lane, 0, 0, 0, 0);
}

em_ir_val em_ir_insert(em_ir_kernel *k, em_ir_val line, em_ir_val lane, em_ir_val v)
{
    if (!k) return 0;
    return em_ir_emit(k, EM_OP_INSERT, type_of(k, line), line, lane, v, 0, 0, 0);
}

static em_type mem_elem(const em_ir_kernel *k, em_ir_mem m)
{
    if (m == 0 || m >= k->mems.len) return em_ty(EM_I32);
    return k->mems.items[m].elem;
}

em_ir_val em_ir_load(em_ir_kernel *k, em_ir_mem mem, em_ir_val index)
{
    if (!k) return 0;
    return em_ir_emit(k, EM_OP_LOAD, mem_elem(k, mem), index, 0, 0, 0, mem, 0);
}

void em_ir_store(em_ir_kernel *k, em_ir_mem mem, em_ir_val index, em_ir_val value)
{
    em_ir_emit(k, EM_OP_STORE, (em_type){0, 0}, index, value, 0, 0, mem, 0);
}

em_ir_val em_ir_len(em_ir_kernel *k, em_ir_mem mem)
{
    return em_ir_emit(k, EM_OP_LEN, em_ty(EM_U32), 0, 0, 0, 0, mem, 0);
}

em_ir_val em_ir_shape(em_ir_kernel *k, em_ir_mem mem, unsigned dim)
{
    return em_ir_emit(k, EM_OP_SHAPE, em_ty(EM_U32), 0, 0, 0, 0, mem, (int32_t)dim);
}

em_ir_val em_ir_stride(em_ir_kernel *k, em_ir_mem mem, unsigned dim)
{
    return em_ir_emit(k, EM_OP_STRIDE, em_ty(EM_U32), 0, 0, 0, 0, mem, (int32_t)dim);
}

em_ir_val em_ir_builtin(em_ir_kernel *k, em_builtin b)
{
    return em_ir_emit(k, EM_OP_BUILTIN, em_ty(EM_U32), 0, 0, 0, 0, 0, (int32_t)b);
}

void em_ir_sync_cube(em_ir_kernel *k) { em_ir_emit(k, EM_OP_SYNC_CUBE, (em_type){0, 0}, 0, 0, 0, 0, 0, 0); }
void em_ir_sync_plane(em_ir_kernel *k) { em_ir_emit(k, EM_OP_SYNC_PLANE, (em_type){0, 0}, 0, 0, 0, 0, 0, 0); }
void em_ir_fence(em_ir_kernel *k, int device_scope)
{
    em_ir_emit(k, EM_OP_FENCE, (em_type){0, 0}, 0, 0, 0, 0, 0, device_scope ? 1 : 0);
}

em_ir_val em_ir_plane(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b)
{
    if (!k) return 0;
    em_type t = type_of(k, a);
    if (op == EM_OP_PLANE_BALLOT) t = em_ty(EM_U32);
    if (op == EM_OP_PLANE_ALL || op == EM_OP_PLANE_ANY) t = em_ty(EM_BOOL);
    return em_ir_emit(k, op, t, a, b, 0, 0, 0, 0);
}

em_ir_val em_ir_atomic(em_ir_kernel *k, em_ir_op op, em_ir_mem mem, em_ir_val index, em_ir_val v,
                       em_ir_val v2)
{
    if (!k) return 0;
    em_type t = op == EM_OP_ATOMIC_STORE ? (em_type){0, 0} : mem_elem(k, mem);
    return em_ir_emit(k, op, t, index, v, v2, 0, mem, 0);
}

void em_ir_mat_fill(em_ir_kernel *k, em_ir_val frag, em_ir_val value)
{
    em_ir_emit(k, EM_OP_MAT_FILL, (em_type){0, 0}, frag, value, 0, 0, 0, 0);
}

void em_ir_mat_load(em_ir_kernel *k, em_ir_val frag, em_ir_mem mem, em_ir_val offset,
                    em_ir_val stride, em_mat_layout layout)
{
    em_ir_emit(k, EM_OP_MAT_LOAD, (em_type){0, 0}, frag, offset, stride, 0, mem, (int32_t)layout);
}

void em_ir_mat_mma(em_ir_kernel *k, em_ir_val d, em_ir_val a, em_ir_val b, em_ir_val c)
{
    em_ir_emit(k, EM_OP_MAT_MMA, (em_type){0, 0}, d, a, b, c, 0, 0);
}

void em_ir_mat_store(em_ir_kernel *k, em_ir_mem mem, em_ir_val offset, em_ir_val stride,
                     em_ir_val frag, em_mat_layout layout)
{
    em_ir_emit(k, EM_OP_MAT_STORE, (em_type){0, 0}, offset, stride, frag, 0, mem, (int32_t)layout);
}

void em_ir_copy_async(em_ir_kernel *k, em_ir_mem dst, em_ir_val dst_index, em_ir_mem src,
                      em_ir_val src_index, unsigned count, em_ir_val valid)
{
    if (!k) return;
    em_ir_emit(k, EM_OP_COPY_ASYNC, (em_type){0, 0}, dst_index, src_index, em_ir_u32(k, count),
               valid, dst, (int32_t)src);
}

void em_ir_copy_commit(em_ir_kernel *k)
{
    em_ir_emit(k, EM_OP_COPY_COMMIT, (em_type){0, 0}, 0, 0, 0, 0, 0, 0);
}

void em_ir_copy_wait(em_ir_kernel *k, unsigned pending)
{
    em_ir_emit(k, EM_OP_COPY_WAIT, (em_type){0, 0}, 0, 0, 0, 0, 0, (int32_t)pending);
}

static void emit_with_args(em_ir_kernel *k, em_ir_op op, const char *str, em_type dst_type,
                           const em_ir_val *args, unsigned nargs, em_ir_val *dst)
{
    em_ir_val a[EM_IR_MAX_ARGS] = {0};
    for (unsigned i = 0; args && i < nargs && i < EM_IR_MAX_ARGS; i++) a[i] = args[i];
    if (nargs > EM_IR_MAX_ARGS) builder_misuse(k, "print/intrinsic takes at most 4 arguments");
    em_ir_val r = em_ir_emit(k, op, dst_type, a[0], a[1], a[2], a[3], 0, (int32_t)nargs);
    if (k->insts.len) k->insts.items[k->insts.len - 1].str = intern(k, str ? str : "");
    if (dst) *dst = r;
}

void em_ir_print(em_ir_kernel *k, const char *fmt, const em_ir_val *args, unsigned nargs)
{
    if (!k) return;
    emit_with_args(k, EM_OP_PRINT, fmt, (em_type){0, 0}, args, nargs, NULL);
}

em_ir_val em_ir_intrinsic(em_ir_kernel *k, const char *name, em_type dst_type, const em_ir_val *args,
                          unsigned nargs)
{
    if (!k) return 0;
    em_ir_val r = 0;
    emit_with_args(k, EM_OP_INTRINSIC, name, dst_type, args, nargs, &r);
    return r;
}

em_ir_val em_ir_intrinsic_mem(em_ir_kernel *k, const char *name, em_type dst_type, em_ir_mem mem,
                              const em_ir_val *args, unsigned nargs)
{
    if (!k) return 0;
    em_ir_val r = 0;
    emit_with_args(k, EM_OP_INTRINSIC, name, dst_type, args, nargs, &r);
    if (k->insts.len) k->insts.items[k->insts.len - 1].mem = mem;
    return r;
}

/* ---- control flow --------------------------------------------------------------------------- */

static void open_block(em_ir_kernel *k, em_ir_inst in)
{
    if (k->depth >= EM_IR_MAX_DEPTH) {
        builder_misuse(k, "control flow nested deeper than 256 levels");
        return;
    }
    uint32_t body = em_ir_new_block(k);
    in.blocks[0] = body;
    uint32_t idx = append(k, in);
    if (idx == UINT32_MAX || !body) return;
    k->open[k->depth].inst = idx;
    k->open[k->depth].block = body;
    k->depth++;
}

void em_ir_if_begin(em_ir_kernel *k, em_ir_val cond)
{
    if (!k) return;
    em_ir_inst in = {.op = EM_OP_IF, .args = {cond}};
    open_block(k, in);
}

void em_ir_else(em_ir_kernel *k)
{
    if (!k) return;
    if (!k->depth || k->insts.items[k->open[k->depth - 1].inst].op != EM_OP_IF) {
        builder_misuse(k, "em_ir_else without an open if");
        return;
    }
    em_ir_inst *in = &k->insts.items[k->open[k->depth - 1].inst];
    if (in->blocks[1]) {
        builder_misuse(k, "em_ir_else called twice for one if");
        return;
    }
    in->blocks[1] = em_ir_new_block(k);
    uint32_t b = in->blocks[1];
    k->open[k->depth - 1].block = b;
}

void em_ir_range_begin(em_ir_kernel *k, em_ir_val var, em_ir_val start, em_ir_val end,
                       em_ir_val step, bool unroll)
{
    if (!k) return;
    em_ir_inst in = {.op = EM_OP_RANGE, .args = {var, start, end, step}, .imm = unroll ? 1 : 0};
    open_block(k, in);
}

void em_ir_loop_begin(em_ir_kernel *k)
{
    if (!k) return;
    em_ir_inst in = {.op = EM_OP_LOOP};
    open_block(k, in);
}

void em_ir_end(em_ir_kernel *k)
{
    if (!k) return;
    if (!k->depth) {
        builder_misuse(k, "em_ir_end without an open if, range or loop");
        return;
    }
    k->depth--;
}

static void simple(em_ir_kernel *k, em_ir_op op)
{
    if (!k) return;
    em_ir_inst in = {.op = (uint16_t)op};
    append(k, in);
}

void em_ir_break(em_ir_kernel *k) { simple(k, EM_OP_BREAK); }
void em_ir_continue(em_ir_kernel *k) { simple(k, EM_OP_CONTINUE); }
void em_ir_return(em_ir_kernel *k) { simple(k, EM_OP_RETURN); }

void em_ir_assign(em_ir_kernel *k, em_ir_val var, em_ir_val value)
{
    if (!k) return;
    em_ir_inst in = {.op = EM_OP_ASSIGN, .dst = var, .args = {value}};
    append(k, in);
}

/* ---- reading -------------------------------------------------------------------------------- */

const char *em_ir_kernel_name(const em_ir_kernel *k) { return k ? k->name : NULL; }

void em_ir_cube_dim(const em_ir_kernel *k, uint32_t dim[3])
{
    for (int i = 0; i < 3; i++) dim[i] = k ? k->cube_dim[i] : 0;
}

uint32_t em_ir_cluster_dim(const em_ir_kernel *k)
{
    return k && k->cluster_dim > 1 ? k->cluster_dim : 1;
}

size_t em_ir_param_count(const em_ir_kernel *k) { return k ? k->params.len : 0; }

const em_ir_param *em_ir_param_at(const em_ir_kernel *k, size_t i)
{
    return k && i < k->params.len ? &k->params.items[i] : NULL;
}

size_t em_ir_value_count(const em_ir_kernel *k) { return k ? k->values.len - 1 : 0; }

const em_ir_value *em_ir_value_at(const em_ir_kernel *k, em_ir_val v)
{
    return k && v > 0 && v < k->values.len ? &k->values.items[v] : NULL;
}

size_t em_ir_mem_count(const em_ir_kernel *k) { return k ? k->mems.len - 1 : 0; }

const em_ir_memory *em_ir_mem_at(const em_ir_kernel *k, em_ir_mem m)
{
    return k && m > 0 && m < k->mems.len ? &k->mems.items[m] : NULL;
}

size_t em_ir_inst_count(const em_ir_kernel *k) { return k ? k->insts.len : 0; }

const em_ir_inst *em_ir_inst_at(const em_ir_kernel *k, uint32_t i)
{
    return k && i < k->insts.len ? &k->insts.items[i] : NULL;
}

uint32_t em_ir_body(const em_ir_kernel *k) { return k ? 1 : 0; }

const em_ir_block *em_ir_block_at(const em_ir_kernel *k, uint32_t b)
{
    return k && b > 0 && b < k->blocks.len ? &k->blocks.items[b] : NULL;
}

static bool has_barrier(const em_ir_kernel *k, uint32_t b, unsigned depth)
{
    const em_ir_block *blk = em_ir_block_at(k, b);
    if (!blk || depth > EM_IR_MAX_DEPTH) return false;
    for (size_t i = 0; i < blk->len; i++) {
        const em_ir_inst *in = em_ir_inst_at(k, blk->items[i]);
        if (!in) continue;
        if (in->op == EM_OP_SYNC_CUBE) return true;
        if ((in->op == EM_OP_IF || in->op == EM_OP_RANGE || in->op == EM_OP_LOOP) &&
            (has_barrier(k, in->blocks[0], depth + 1) || has_barrier(k, in->blocks[1], depth + 1)))
            return true;
    }
    return false;
}

bool em_ir_block_has_barrier(const em_ir_kernel *k, uint32_t b) { return has_barrier(k, b, 0); }

bool em_ir_is_const(const em_ir_kernel *k, em_ir_val v)
{
    const em_ir_value *val = em_ir_value_at(k, v);
    return val && val->kind == EM_VAL_CONST;
}
