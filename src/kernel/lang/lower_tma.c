/* lower_tma.c — the tensor memory accelerator builtins (docs/kernel-language.md "Tensor memory
 * accelerator"): one unit copies a whole box of a tensor into shared memory, completing on a
 * shared-memory barrier.
 *
 *   tma_load(dst, di, bar, bi, map, mi, src, x, y, z)
 *       copies the box of map mi at coordinates (x, y, z) (elements, innermost first) into the
 *       shared array dst from element di on, and counts its bytes as transactions of barrier
 *       bar[bi] (which some unit armed with mbarrier_arrive_tx). map is a u64 tensor of maps made
 *       on the host (em_tensor_map_encode; map mi at words 16 mi ..), src the tensor map mi
 *       describes, of dst's element type. Elements outside the map's dims arrive as zeros. With
 *       a 128-byte swizzle the box lands in the layout warpgroup MMAs read (dst + di 1024-byte
 *       aligned): its 128-byte rows one after another, 16-byte chunk c of row r at c ^ (r % 8).
 *   tma_load_multicast(dst, di, bar, bi, map, mi, src, x, y, z, mask)
 *       the same box into dst at element di of every cube of the cluster whose rank is a bit of
 *       mask (comptime or not), each counting the bytes on its own bar[bi] (cluster_dim).
 *   tma_acquire(map, mi)
 *       makes map mi, written by the host, safe to use by this unit (once, before its loads).
 *   fence_proxy_async()
 *       makes this unit's earlier shared-memory writes visible to the copy engine (the async
 *       proxy): after mbarrier_init, before the barriers are handed to tma_load, and after
 *       writing what tma_reduce_add reads.
 *   tma_reduce_add(dst, di, src, si, n)
 *       adds n f32 elements of the shared array src from element si to the f32 tensor dst from
 *       element di, by the copy engine (dst[di + e] += src[si + e], each element atomically, in
 *       the L2 cache), asynchronously: the unit's bulk group, closed by tma_commit, and
 *       tma_wait_read(N) (N comptime) waits until at most N of its groups still read their
 *       shared memory, which may then be written again. n, di and si must be multiples of 4
 *       (16 bytes; the shared array 16-byte aligned, as every one is).
 *
 * On CUDA for sm_90a they become intrinsics that codegen/cuda_tma.c writes as PTX
 * ("cuda.tma.load:DST,BAR,MAP@DST" with (di, bi << 32 | mi, y << 32 | x, z), the
 * packing because an IR instruction has four operands: cp.async.bulk.tensor.3d;
 * "cuda.tma.load_mc:DST,BAR,MAP@DST" with (mask << 32 | di, ...): its .multicast::cluster form;
 * "cuda.tma.acquire:MAP@MAP" with (mi): fence.proxy.tensormap::generic.acquire;
 * "cuda.tma.fence_async": fence.proxy.async.shared::cta; "cuda.tma.reduce_add:DST,SRC@DST"
 * with (di, si, n): cp.reduce.async.bulk .add.f32; "cuda.tma.commit", "cuda.tma.wait_read:N":
 * cp.async.bulk.commit_group and .wait_group.read N); the map's
 * address is all the instruction needs, and src is not read. On the C target (and without a
 * target) the copy happens at once (a multicast one into the cube's own array only: cubes there
 * are clusters of one), in loops that read src with the geometry of the CPU form
 * of the map (tma.h), zero-fill outside its dims and apply the same swizzle; the barrier is
 * left alone (as every barrier op there: lower_mbarrier.c), and the fences do nothing; a
 * reduction happens at once too, as atomic adds, and its commit and wait do nothing.
 * Other targets reject them all. */
#include <stdio.h>
#include <string.h>

#include "kernel/lang/lower.h"
#include "kernel/lang/tma.h"

static bool emulated(const lower *L)
{
    return !L->b->caps || !strcmp(L->b->caps->target, "c");
}

static lpos apos(const ast_expr *e, unsigned i)
{
    return e->args[i]->pos;
}

static em_ir_val bin(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b)
{
    return em_ir_binary(k, op, a, b);
}

static em_ir_val u32c(em_ir_kernel *k, uint32_t v)
{
    return em_ir_u32(k, v);
}

/* hi << 32 | lo as a u64 (u32 halves). */
static em_ir_val pack(em_ir_kernel *k, em_ir_val hi, em_ir_val lo)
{
    em_type t = em_ty(EM_U64);
    /* one instruction a statement: the IR's order must not depend on the C compiler's order of
     * a call's arguments */
    em_ir_val h = em_ir_cast(k, t, hi);
    h = bin(k, EM_OP_SHL, h, em_ir_const_uint(k, t, 32));
    em_ir_val l = em_ir_cast(k, t, lo);
    return bin(k, EM_OP_OR, h, l);
}

/* Argument i as a u32 index value. */
static bool index_arg(lower *L, const ast_expr *e, lv *a, unsigned i, const char *what,
                      em_ir_val *out)
{
    lv x = em_lang_to_index(L, a[i], apos(e, i), what);
    if (x.kind == V_ERR) return false;
    *out = em_lang_materialize(L, &x);
    return true;
}

/* Argument i must be memory of `space` (elements of type want when set). */
static bool mem_of(lower *L, const ast_expr *e, const lv *x, unsigned i, em_mem_space space,
                   em_scalar want, const char *fn, const char *what)
{
    bool ok = x->kind == V_MEM && x->space == space && x->ty.lanes == 1 &&
              x->ty.scalar != EM_BOOL && (want == EM_SCALAR_COUNT || x->ty.scalar == want);
    if (!ok)
        em_lang_lerr(L, apos(e, i), NULL, "'%s' needs %s", fn, what);
    return ok;
}

/* Word w of map mi (a u64 tensor) as u32. */
static em_ir_val map_word(em_ir_kernel *k, em_ir_mem map, em_ir_val base, unsigned w)
{
    return em_ir_cast(k, em_ty(EM_U32), em_ir_load(k, map, bin(k, EM_OP_ADD, base, u32c(k, w))));
}

/* The CPU meaning of tma_load: the box copied at once (see the top of the file). */
static bool emulate_load(lower *L, const ast_expr *e, const lv *dst, em_ir_val di, em_ir_mem map,
                         em_ir_val mi, const lv *src, const em_ir_val c[3])
{
    em_ir_kernel *k = L->k;
    em_scalar t = (em_scalar)dst->ty.scalar;
    uint32_t es = (uint32_t)em_scalar_size(t);
    em_ir_val base = em_ir_var(k, em_ty(EM_U32), "tma_w");
    em_ir_assign(k, base, bin(k, EM_OP_MUL, mi, u32c(k, EM_TMA_WORDS)));
    em_ir_val dim[3], box[3];
    for (unsigned i = 0; i < 3; i++) {
        dim[i] = map_word(k, map, base, EM_TMA_W_DIM + i);
        box[i] = map_word(k, map, base, EM_TMA_W_BOX + i);
    }
    em_ir_val s1 = map_word(k, map, base, EM_TMA_W_STRIDE);
    em_ir_val s2 = map_word(k, map, base, EM_TMA_W_STRIDE + 1);
    /* 1 under a 128-byte swizzle, else 0 */
    em_ir_val sw = bin(k, EM_OP_SHR, map_word(k, map, base, EM_TMA_W_SWIZZLE), u32c(k, 7));
    em_ir_val off = map_word(k, map, base, EM_TMA_W_OFFSET);
    em_ir_val v[3];
    static const char *const names[3] = {"tma_x", "tma_y", "tma_z"};
    for (unsigned i = 0; i < 3; i++) v[i] = em_ir_var(k, em_ty(EM_U32), names[i]);
    for (int i = 2; i >= 0; i--) {
        if (!em_lang_ir_open(L, e->op_pos)) return false;
        em_ir_range_begin(k, v[i], u32c(k, 0), box[i], u32c(k, 1), false);
    }
    /* the box's element (z b1 + y) b0 + x, its byte in dst (swizzled), its source */
    em_ir_val el = bin(k, EM_OP_ADD,
                       bin(k, EM_OP_MUL,
                           bin(k, EM_OP_ADD, bin(k, EM_OP_MUL, v[2], box[1]), v[1]), box[0]),
                       v[0]);
    em_ir_val byte = bin(k, EM_OP_MUL, bin(k, EM_OP_ADD, di, el), u32c(k, es));
    em_ir_val chunk = bin(k, EM_OP_SHL,
                          bin(k, EM_OP_AND, bin(k, EM_OP_SHR, byte, u32c(k, 7)), u32c(k, 7)),
                          u32c(k, 4));
    byte = bin(k, EM_OP_XOR, byte, bin(k, EM_OP_MUL, chunk, sw));
    em_ir_val at = bin(k, EM_OP_DIV, byte, u32c(k, es));
    em_ir_val g[3], in = 0;
    for (unsigned i = 0; i < 3; i++) {
        g[i] = bin(k, EM_OP_ADD, c[i], v[i]);
        em_ir_val ok = bin(k, EM_OP_LT, g[i], dim[i]);
        in = i ? bin(k, EM_OP_AND, in, ok) : ok;
    }
    if (!em_lang_ir_open(L, e->op_pos)) return false;
    em_ir_if_begin(k, in);
    em_ir_val from = bin(k, EM_OP_MUL, g[1], s1), f2 = bin(k, EM_OP_MUL, g[2], s2);
    from = bin(k, EM_OP_ADD, from, f2);
    from = bin(k, EM_OP_ADD, g[0], from);
    from = bin(k, EM_OP_ADD, off, from);
    em_ir_store(k, dst->mem, at, em_ir_load(k, src->mem, from));
    em_ir_else(k);
    em_ir_store(k, dst->mem, at,
                em_scalar_is_float(t) ? em_ir_const_float(k, em_ty(t), 0.0)
                                      : em_ir_const_int(k, em_ty(t), 0));
    em_lang_ir_close(L);
    for (unsigned i = 0; i < 3; i++) em_lang_ir_close(L);
    return true;
}

static lv load(lower *L, const ast_expr *e, lv *a, bool multicast)
{
    const char *fn = multicast ? "tma_load_multicast" : "tma_load";
    if (!mem_of(L, e, &a[0], 0, EM_MEM_SHARED, EM_SCALAR_COUNT, fn,
                "a shared array of numbers as its destination") ||
        !mem_of(L, e, &a[2], 2, EM_MEM_SHARED, EM_U64, fn,
                "a shared array of u64 as its barriers ('shared u64 bar[N];')") ||
        !mem_of(L, e, &a[4], 4, EM_MEM_GLOBAL, EM_U64, fn,
                "a u64 tensor parameter holding the tensor maps") ||
        !mem_of(L, e, &a[6], 6, EM_MEM_GLOBAL, (em_scalar)a[0].ty.scalar, fn,
                "the tensor the map describes: a tensor parameter of the destination's type"))
        return em_lang_lv_err();
    static const char *const what[] = {NULL,
                                       "the destination index",
                                       NULL,
                                       "the barrier's index",
                                       NULL,
                                       "the map's index",
                                       NULL,
                                       "the x coordinate",
                                       "the y coordinate",
                                       "the z coordinate",
                                       "the mask of destination cubes"};
    em_ir_val v[11] = {0};
    for (unsigned i = 1; i < (multicast ? 11u : 10u); i++)
        if (what[i] && !index_arg(L, e, a, i, what[i], &v[i])) return em_lang_lv_err();
    em_ir_val c[3] = {v[7], v[8], v[9]};
    if (emulated(L)) {
        if (!emulate_load(L, e, &a[0], v[1], a[4].mem, v[5], &a[6], c)) return em_lang_lv_err();
        return em_lang_lv_void();
    }
    char name[80];
    snprintf(name, sizeof name, "cuda.tma.%s:%u,%u,%u@%u", multicast ? "load_mc" : "load",
             (unsigned)a[0].mem, (unsigned)a[2].mem, (unsigned)a[4].mem, (unsigned)a[0].mem);
    /* an instruction has four operands: (di, bi << 32 | mi, y << 32 | x, z); multicast: the
     * mask above di */
    em_ir_kernel *k = L->k;
    em_ir_val args[4] = {multicast ? pack(k, v[10], v[1]) : v[1], pack(k, v[3], v[5]),
                         pack(k, c[1], c[0]), c[2]};
    em_ir_intrinsic_mem(k, name, (em_type){0, 0}, a[0].mem, args, 4);
    return em_lang_lv_void();
}

/* tma_reduce_add (the top of the file). */
static lv reduce_add(lower *L, const ast_expr *e, lv *a)
{
    const char *fn = "tma_reduce_add";
    if (!mem_of(L, e, &a[0], 0, EM_MEM_GLOBAL, EM_F32, fn,
                "an f32 tensor parameter as its destination") ||
        !mem_of(L, e, &a[2], 2, EM_MEM_SHARED, EM_F32, fn, "a shared array of f32 as its source"))
        return em_lang_lv_err();
    if (!a[0].writable)
        return em_lang_lerr(L, apos(e, 0), NULL, "cannot write to read-only tensor '%s'",
                            a[0].name ? a[0].name : "?");
    static const char *const what[] = {NULL, "the destination index", NULL, "the source index",
                                       "the element count"};
    em_ir_val v[5] = {0};
    for (unsigned i = 1; i < 5; i++)
        if (what[i] && !index_arg(L, e, a, i, what[i], &v[i])) return em_lang_lv_err();
    em_ir_kernel *k = L->k;
    if (emulated(L)) {
        em_ir_val x = em_ir_var(k, em_ty(EM_U32), "tma_e");
        if (!em_lang_ir_open(L, e->op_pos)) return em_lang_lv_err();
        em_ir_range_begin(k, x, u32c(k, 0), v[4], u32c(k, 1), false);
        em_ir_val from = em_ir_load(k, a[2].mem, bin(k, EM_OP_ADD, v[3], x));
        em_ir_atomic(k, EM_OP_ATOMIC_ADD, a[0].mem, bin(k, EM_OP_ADD, v[1], x), from, EM_IR_NONE);
        em_lang_ir_close(L);
        return em_lang_lv_void();
    }
    char name[64];
    snprintf(name, sizeof name, "cuda.tma.reduce_add:%u,%u@%u", (unsigned)a[0].mem,
             (unsigned)a[2].mem, (unsigned)a[0].mem);
    em_ir_val args[3] = {v[1], v[3], v[4]};
    em_ir_intrinsic_mem(k, name, (em_type){0, 0}, a[0].mem, args, 3);
    return em_lang_lv_void();
}

lv em_lang_lower_tma(lower *L, const ast_expr *e, const lang_builtin *b, lv *a)
{
    if (!em_lang_hopper_target(L, e, b->name, "tma", "the tensor memory accelerator"))
        return em_lang_lv_err();
    if (b->imm == TMA_LOAD || b->imm == TMA_LOAD_MULTICAST)
        return load(L, e, a, b->imm == TMA_LOAD_MULTICAST);
    if (b->imm == TMA_REDUCE_ADD) return reduce_add(L, e, a);
    if (b->imm == TMA_COMMIT) {
        if (!emulated(L)) em_ir_intrinsic(L->k, "cuda.tma.commit", (em_type){0, 0}, NULL, 0);
        return em_lang_lv_void();
    }
    if (b->imm == TMA_WAIT_READ) {
        int64_t n = 0;
        if (!em_lang_comptime_int(L, &a[0], apos(e, 0), "the groups left reading", &n))
            return em_lang_lv_err();
        if (n < 0 || n > 7)
            return em_lang_lerr(L, apos(e, 0), "0 to 7", "'%s' of %lld groups", b->name,
                                (long long)n);
        if (!emulated(L)) {
            char name[40];
            snprintf(name, sizeof name, "cuda.tma.wait_read:%lld", (long long)n);
            em_ir_intrinsic(L->k, name, (em_type){0, 0}, NULL, 0);
        }
        return em_lang_lv_void();
    }
    if (b->imm == TMA_FENCE_ASYNC) {
        if (!emulated(L)) em_ir_intrinsic(L->k, "cuda.tma.fence_async", (em_type){0, 0}, NULL, 0);
        return em_lang_lv_void();
    }
    if (!mem_of(L, e, &a[0], 0, EM_MEM_GLOBAL, EM_U64, b->name,
                "a u64 tensor parameter holding the tensor maps"))
        return em_lang_lv_err();
    em_ir_val mi = 0;
    if (!index_arg(L, e, a, 1, "the map's index", &mi)) return em_lang_lv_err();
    if (!emulated(L)) {
        char name[48];
        snprintf(name, sizeof name, "cuda.tma.acquire:%u@%u", (unsigned)a[0].mem,
                 (unsigned)a[0].mem);
        em_ir_intrinsic_mem(L->k, name, (em_type){0, 0}, a[0].mem, &mi, 1);
    }
    return em_lang_lv_void();
}
