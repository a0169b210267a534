/* lower_wgmma.c — the warpgroup MMA builtins (Hopper's wgmma.mma_async, docs/kernel-language.md
 * "Warpgroup matrix multiply-accumulate"):
 *
 *   wgmma_mma(acc, a, a_off, a_mn, b, b_off, b_mn[, add])  acc (64 x N, f32) += A (64 x 16) * B
 *                                                        (16 x N); with add false, acc = A * B
 *   wgmma_mma_rs(acc, a, a_off, b, b_off, b_mn[, add])    the same with A from registers
 *   wgmma_fence([r...])  wgmma_fence_regs([r...])  wgmma_commit()  wgmma_wait(acc, pending)
 *
 * acc is a local f32 array of N/2 elements (N = 8 .. 256, a multiple of 8) holding the unit's
 * part of the warpgroup's accumulator (wgmma.h: em_wgmma_d_coord); a and b are shared arrays of
 * f16 or bf16 in the 128-byte swizzled layouts of wgmma.h, read from element a_off (b_off) on;
 * a_mn (b_mn) is comptime: 0 for a K-major operand, else the operand is MN-major and a_mn is the
 * distance in elements between its 64-row atoms. wgmma_mma_rs takes A from the registers of the
 * warpgroup instead: a is a local u32 array whose elements a_off .. a_off + 3 (a_off comptime)
 * hold the unit's A fragment as pairs of 16-bit values of B's type (low half first), in the
 * order of the accumulator's registers (wgmma.h: em_wgmma_a_coord), so that an f32 accumulator
 * tile packed pairwise is the A operand of the next product. The fences' optional arguments are
 * such register arrays (up to three): their writes are kept before the fence. add (a bool, true
 * when left out) is the instruction's scale-d predicate: false starts the accumulator from the
 * product, so a chain's first MMA needs no zeroed accumulator (whose writes between the fence
 * and the MMA make ptxas insert a warpgroup.arrive).
 *
 * On CUDA for compute capability 9.0 they become intrinsics that codegen/cuda.c writes as PTX
 * ("cuda.wgmma.desc:LBO@MEM" -> the u64 descriptor of a shared array at an offset,
 * "cuda.wgmma.mma:N,TYPE,TA,TB@MEM", "cuda.wgmma.fence", "cuda.wgmma.fence_regs",
 * "cuda.wgmma.commit", "cuda.wgmma.wait:N@MEM"; MEM, the memory's id, is also the instruction's
 * memory, and is in the name so that the IR's text form and hash tell kernels apart by it). On the
 * C target and without a target they are emulated: wgmma_mma becomes loops in which each unit
 * computes its own accumulator elements from the shared operands, addressed as the hardware
 * addresses them (wgmma.h: em_wgmma_byte), and the others do nothing. An emulated wgmma_mma_rs
 * reads other units' registers: each unit stores its fragment in a shared scratch array between two
 * cube barriers, so there every unit of the cube must reach the call (cube-level control flow).
 * Other targets reject them. */
#include <stdio.h>
#include <string.h>

#include "kernel/lang/lower.h"
#include "kernel/lang/wgmma.h"

bool em_lang_wgmma_native(const em_caps *caps)
{
    /* the CUDA driver publishes sm_90a for compute capability 9.0 and compiles for it */
    return caps && !strcmp(caps->target, "cuda") && !strcmp(caps->arch, "sm_90a");
}

/* Whether this target emulates the ops with loops (the C target, or no target at all). */
static bool emulated(const lower *L)
{
    return !L->b->caps || !strcmp(L->b->caps->target, "c");
}

static lpos apos(const ast_expr *e, unsigned i)
{
    return e->args[i]->pos;
}

/* Argument i must be a local f32 array of 4 .. 128 elements: an accumulator. */
static bool acc_arg(lower *L, const ast_expr *e, const lv *x, unsigned i, const char *fn)
{
    if (x->kind != V_MEM || x->space != EM_MEM_LOCAL || x->ty.scalar != EM_F32 ||
        x->ty.lanes != 1) {
        em_lang_lerr(L, apos(e, i), "declare it as 'f32 acc[N / 2];' in the kernel",
                     "'%s' needs a local f32 array as its accumulator", fn);
        return false;
    }
    if (x->length < 4 || x->length > 128 || x->length % 4) {
        em_lang_lerr(L, apos(e, i), "N (twice its length) is a multiple of 8 from 8 to 256",
                     "'%s': an accumulator of %u elements is no 64 x N tile", fn, x->length);
        return false;
    }
    return true;
}

/* Argument i must be a shared array of f16 or bf16 (all of type *t when set). */
static bool operand_arg(lower *L, const ast_expr *e, const lv *x, unsigned i, em_scalar *t)
{
    em_scalar s = (em_scalar)x->ty.scalar;
    if (x->kind != V_MEM || x->space != EM_MEM_SHARED || x->ty.lanes != 1 ||
        (s != EM_F16 && s != EM_BF16)) {
        em_lang_lerr(L, apos(e, i), NULL,
                     "'wgmma_mma' reads its operands from shared arrays of f16 or bf16");
        return false;
    }
    if (*t != EM_SCALAR_COUNT && *t != s) {
        em_lang_lerr(L, apos(e, i), NULL,
                     "'wgmma_mma' needs both operands of one type, got %s and %s",
                     em_scalar_name(*t), em_scalar_name(s));
        return false;
    }
    *t = s;
    return true;
}

/* Argument i: a comptime layout (0: K-major; else MN-major, atoms that many elements apart). */
static bool layout_arg(lower *L, const ast_expr *e, const lv *x, unsigned i, uint32_t *out)
{
    int64_t v = 0;
    if (!em_lang_comptime_int(L, x, apos(e, i),
                              "the operand layout (0: K-major, else the MN atom stride)", &v))
        return false;
    if (v < 0 || v % 512 || v > 65536) {
        em_lang_lerr(L, apos(e, i), "whole 1024-byte swizzle atoms: a multiple of 512 elements",
                     "'wgmma_mma': an MN-major atom stride of %lld elements", (long long)v);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

static em_ir_val u32c(em_ir_kernel *k, uint32_t v)
{
    return em_ir_u32(k, v);
}

static em_ir_val bin(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b)
{
    return em_ir_binary(k, op, a, b);
}

/* The element index (of a 16-bit array) of operand element (r, k), as em_wgmma_byte computes its
 * byte address from the start off * 2. */
static em_ir_val emulated_index(em_ir_kernel *k, em_ir_val off, uint32_t lbo_bytes, em_ir_val r,
                                em_ir_val kk)
{
    /* one instruction a statement: C leaves the order of a call's arguments open, and the IR's
     * order (so the generated source and the kernel cache's key) must not depend on the compiler
     * that built ember */
    em_ir_val x = bin(k, EM_OP_MUL, off, u32c(k, 2));
    em_ir_val t, u;
    if (lbo_bytes == 0) {
        t = bin(k, EM_OP_DIV, r, u32c(k, 8));
        t = bin(k, EM_OP_MUL, t, u32c(k, EM_WGMMA_SBO));
        u = bin(k, EM_OP_REM, r, u32c(k, 8));
        u = bin(k, EM_OP_MUL, u, u32c(k, 128));
        t = bin(k, EM_OP_ADD, t, u);
        u = bin(k, EM_OP_MUL, kk, u32c(k, 2));
        t = bin(k, EM_OP_ADD, t, u);
    } else {
        t = bin(k, EM_OP_DIV, r, u32c(k, 64));
        t = bin(k, EM_OP_MUL, t, u32c(k, lbo_bytes));
        u = bin(k, EM_OP_DIV, kk, u32c(k, 8));
        u = bin(k, EM_OP_MUL, u, u32c(k, EM_WGMMA_SBO));
        t = bin(k, EM_OP_ADD, t, u);
        u = bin(k, EM_OP_REM, kk, u32c(k, 8));
        u = bin(k, EM_OP_MUL, u, u32c(k, 128));
        t = bin(k, EM_OP_ADD, t, u);
        u = bin(k, EM_OP_REM, r, u32c(k, 64));
        u = bin(k, EM_OP_MUL, u, u32c(k, 2));
        t = bin(k, EM_OP_ADD, t, u);
    }
    x = bin(k, EM_OP_ADD, x, t);
    em_ir_val sw = bin(k, EM_OP_SHR, x, u32c(k, 7));
    sw = bin(k, EM_OP_AND, sw, u32c(k, 7));
    sw = bin(k, EM_OP_SHL, sw, u32c(k, 4));
    x = bin(k, EM_OP_XOR, x, sw);
    return bin(k, EM_OP_DIV, x, u32c(k, 2));
}

/* Where an emulated MMA reads A: a shared operand (a from element off on, layout lay), or the
 * fragments the warpgroup's units stored in the shared scratch (wgmma_mma_rs: 4 u32 per unit,
 * the warpgroup's first unit g0, elements of type t). */
typedef struct a_source {
    const lv *a;
    em_ir_val off;
    uint32_t lay;
    bool regs;
    em_ir_mem scratch;
    em_ir_val g0;
    em_scalar t;
} a_source;

/* A(row, kk) as f32. A fragment's element is in the unit of the row's warp with lane
 * (row % 8) 4 + (kk % 8) / 2, register (kk / 8) 2 + (row % 16) / 8, half kk % 2 (wgmma.h:
 * em_wgmma_a_coord inverted). */
static em_ir_val a_element(em_ir_kernel *k, const a_source *src, em_ir_val row, em_ir_val kk)
{
    if (!src->regs)
        return em_ir_cast(
            k, em_ty(EM_F32),
            em_ir_load(k, src->a->mem, emulated_index(k, src->off, src->lay * 2, row, kk)));
    em_ir_val rr = bin(k, EM_OP_REM, row, u32c(k, 16));
    em_ir_val lane = bin(k, EM_OP_REM, rr, u32c(k, 8));
    lane = bin(k, EM_OP_MUL, lane, u32c(k, 4));
    em_ir_val t = bin(k, EM_OP_REM, kk, u32c(k, 8));
    t = bin(k, EM_OP_DIV, t, u32c(k, 2));
    lane = bin(k, EM_OP_ADD, lane, t);
    em_ir_val unit = bin(k, EM_OP_DIV, row, u32c(k, 16));
    unit = bin(k, EM_OP_MUL, unit, u32c(k, 32));
    unit = bin(k, EM_OP_ADD, unit, lane);
    unit = bin(k, EM_OP_ADD, src->g0, unit);
    em_ir_val reg = bin(k, EM_OP_DIV, kk, u32c(k, 8));
    reg = bin(k, EM_OP_MUL, reg, u32c(k, 2));
    t = bin(k, EM_OP_DIV, rr, u32c(k, 8));
    reg = bin(k, EM_OP_ADD, reg, t);
    em_ir_val at = bin(k, EM_OP_MUL, unit, u32c(k, 4));
    at = bin(k, EM_OP_ADD, at, reg);
    em_ir_val word = em_ir_load(k, src->scratch, at);
    em_ir_val shift = bin(k, EM_OP_REM, kk, u32c(k, 2));
    shift = bin(k, EM_OP_MUL, shift, u32c(k, 16));
    em_ir_val half = bin(k, EM_OP_SHR, word, shift);
    half = bin(k, EM_OP_AND, half, u32c(k, 0xffff));
    return em_ir_cast(k, em_ty(EM_F32),
                      em_ir_bitcast(k, em_ty(src->t), em_ir_cast(k, em_ty(EM_U16), half)));
}

/* acc[i] += sum over k < 16 of A(row, k) B(k, col) for each register i of this unit (acc[i] =
 * the sum where the bool `add` is false). */
static bool emulate_mma(lower *L, const ast_expr *e, const lv *acc, const a_source *src,
                        const lv *b, em_ir_val boff, uint32_t blay, em_ir_val add)
{
    em_ir_kernel *k = L->k;
    em_ir_val t = bin(k, EM_OP_REM, em_ir_builtin(k, EM_UNIT_POS), u32c(k, EM_WGMMA_UNITS));
    em_ir_val warp = bin(k, EM_OP_DIV, t, u32c(k, 32)), lane = bin(k, EM_OP_REM, t, u32c(k, 32));
    em_ir_val rbase = bin(k, EM_OP_MUL, warp, u32c(k, 16));
    em_ir_val v = bin(k, EM_OP_DIV, lane, u32c(k, 4));
    rbase = bin(k, EM_OP_ADD, rbase, v);
    em_ir_val cbase = bin(k, EM_OP_REM, lane, u32c(k, 4));
    cbase = bin(k, EM_OP_MUL, cbase, u32c(k, 2));
    em_ir_val i = em_ir_var(k, em_ty(EM_U32), "wg_i");
    if (!em_lang_ir_open(L, e->op_pos)) return false;
    em_ir_range_begin(k, i, u32c(k, 0), u32c(k, acc->length), u32c(k, 1), false);
    /* row = 16 warp + lane / 4 + 8 ((i / 2) % 2), col = 8 (i / 4) + 2 (lane % 4) + i % 2 */
    em_ir_val row = bin(k, EM_OP_DIV, i, u32c(k, 2));
    row = bin(k, EM_OP_REM, row, u32c(k, 2));
    row = bin(k, EM_OP_MUL, row, u32c(k, 8));
    row = bin(k, EM_OP_ADD, rbase, row);
    em_ir_val col = bin(k, EM_OP_DIV, i, u32c(k, 4));
    col = bin(k, EM_OP_MUL, col, u32c(k, 8));
    v = bin(k, EM_OP_REM, i, u32c(k, 2));
    v = bin(k, EM_OP_ADD, cbase, v);
    col = bin(k, EM_OP_ADD, col, v);
    em_ir_val s = em_ir_var(k, em_ty(EM_F32), "wg_s");
    em_ir_assign(k, s,
                 em_ir_ternary(k, EM_OP_SELECT, add, em_ir_load(k, acc->mem, i),
                               em_ir_const_float(k, em_ty(EM_F32), 0.0)));
    em_ir_val kk = em_ir_var(k, em_ty(EM_U32), "wg_k");
    if (!em_lang_ir_open(L, e->op_pos)) return false;
    em_ir_range_begin(k, kk, u32c(k, 0), u32c(k, EM_WGMMA_K), u32c(k, 1), false);
    em_ir_val x = a_element(k, src, row, kk);
    em_ir_val y = em_ir_cast(k, em_ty(EM_F32),
                             em_ir_load(k, b->mem, emulated_index(k, boff, blay * 2, col, kk)));
    em_ir_val xy = bin(k, EM_OP_MUL, x, y);
    em_ir_assign(k, s, bin(k, EM_OP_ADD, s, xy));
    em_lang_ir_close(L);
    em_ir_store(k, acc->mem, i, s);
    em_lang_ir_close(L);
    return true;
}

/* "cuda.wgmma.desc:LBO@MEM": the descriptor of shared array m from element off on. */
static em_ir_val descriptor(em_ir_kernel *k, em_ir_mem m, em_ir_val off, uint32_t lbo_bytes)
{
    char name[64];
    snprintf(name, sizeof name, "cuda.wgmma.desc:%u@%u", lbo_bytes, (unsigned)m);
    return em_ir_intrinsic_mem(k, name, em_ty(EM_U64), m, &off, 1);
}

/* The optional `add` argument i (a bool; true when left out) as a value. */
static bool add_arg(lower *L, const ast_expr *e, lv *a, unsigned i, em_ir_val *out)
{
    if (e->nargs <= i) {
        *out = em_ir_const_bool(L->k, true);
        return true;
    }
    lv x = em_lang_coerce(L, a[i], em_ty(EM_BOOL), apos(e, i), "add (whether to add to acc)");
    if (x.kind == V_ERR) return false;
    *out = em_lang_materialize(L, &x);
    return true;
}

static lv mma(lower *L, const ast_expr *e, lv *a)
{
    em_scalar t = EM_SCALAR_COUNT;
    uint32_t alay = 0, blay = 0;
    if (!acc_arg(L, e, &a[0], 0, "wgmma_mma") || !operand_arg(L, e, &a[1], 1, &t) ||
        !operand_arg(L, e, &a[4], 4, &t) || !layout_arg(L, e, &a[3], 3, &alay) ||
        !layout_arg(L, e, &a[6], 6, &blay))
        return em_lang_lv_err();
    lv ai = em_lang_to_index(L, a[2], apos(e, 2), "the offset of a");
    lv bi = em_lang_to_index(L, a[5], apos(e, 5), "the offset of b");
    if (ai.kind == V_ERR || bi.kind == V_ERR) return em_lang_lv_err();
    em_ir_val aoff = em_lang_materialize(L, &ai), boff = em_lang_materialize(L, &bi);
    em_ir_val add = 0;
    if (!add_arg(L, e, a, 7, &add)) return em_lang_lv_err();
    em_ir_kernel *k = L->k;
    if (emulated(L)) {
        a_source src = {.a = &a[1], .off = aoff, .lay = alay};
        if (!emulate_mma(L, e, &a[0], &src, &a[4], boff, blay, add)) return em_lang_lv_err();
        return em_lang_lv_void();
    }
    em_ir_val d[3] = {descriptor(k, a[1].mem, aoff, alay * 2),
                      descriptor(k, a[4].mem, boff, blay * 2), em_ir_cast(k, em_ty(EM_U32), add)};
    char name[96];
    snprintf(name, sizeof name, "cuda.wgmma.mma:%u,%s,%d,%d@%u", a[0].length * 2, em_scalar_name(t),
             alay != 0, blay != 0, (unsigned)a[0].mem);
    em_ir_intrinsic_mem(k, name, (em_type){0, 0}, a[0].mem, d, 3);
    return em_lang_lv_void();
}

/* Argument i: a local u32 array holding A fragments, read from comptime element *off on. */
static bool fragment_arg(lower *L, const ast_expr *e, const lv *x, const lv *off, uint32_t *out)
{
    if (x->kind != V_MEM || x->space != EM_MEM_LOCAL || x->ty.scalar != EM_U32 ||
        x->ty.lanes != 1) {
        em_lang_lerr(L, apos(e, 1), "declare it as 'u32 a[...];' holding pairs of 16-bit values",
                     "'wgmma_mma_rs' takes its A fragment from a local u32 array");
        return false;
    }
    int64_t v = 0;
    if (!em_lang_comptime_int(L, off, apos(e, 2), "the fragment's first register", &v))
        return false;
    if (v < 0 || v % 4 || (uint64_t)v + 4 > x->length) {
        em_lang_lerr(L, apos(e, 2), "a fragment is 4 registers: a multiple of 4 inside the array",
                     "'wgmma_mma_rs': registers %lld .. %lld of an array of %u", (long long)v,
                     (long long)v + 3, x->length);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

/* The shared scratch through which emulated units read each other's A fragments: 4 u32 per unit
 * of the largest cube. */
static em_ir_mem wg_scratch(lower *L)
{
    if (!L->wg_scratch_made) {
        L->wg_scratch = em_ir_shared(L->k, "wg_frag", em_ty(EM_U32), 1024 * 4);
        L->wg_scratch_made = true;
    }
    return L->wg_scratch;
}

/* wgmma_mma_rs emulated: each unit stores its fragment in the scratch, then reads the others'. */
static bool emulate_mma_rs(lower *L, const ast_expr *e, const lv *acc, const lv *a, uint32_t aoff,
                           em_scalar t, const lv *b, em_ir_val boff, uint32_t blay, em_ir_val add)
{
    em_ir_kernel *k = L->k;
    em_ir_mem scratch = wg_scratch(L);
    em_ir_val unit = em_ir_builtin(k, EM_UNIT_POS);
    for (uint32_t r = 0; r < 4; r++) {
        em_ir_val at = bin(k, EM_OP_MUL, unit, u32c(k, 4));
        at = bin(k, EM_OP_ADD, at, u32c(k, r));
        em_ir_store(k, scratch, at, em_ir_load(k, a->mem, u32c(k, aoff + r)));
    }
    em_ir_sync_cube(k);
    a_source src = {.regs = true,
                    .scratch = scratch,
                    .t = t,
                    .g0 =
                        bin(k, EM_OP_SUB, unit, bin(k, EM_OP_REM, unit, u32c(k, EM_WGMMA_UNITS)))};
    if (!emulate_mma(L, e, acc, &src, b, boff, blay, add)) return false;
    em_ir_sync_cube(k); /* every unit has read the fragments before they are stored again */
    return true;
}

static lv mma_rs(lower *L, const ast_expr *e, lv *a)
{
    em_scalar t = EM_SCALAR_COUNT;
    uint32_t aoff = 0, blay = 0;
    if (!acc_arg(L, e, &a[0], 0, "wgmma_mma_rs") || !fragment_arg(L, e, &a[1], &a[2], &aoff) ||
        !operand_arg(L, e, &a[3], 3, &t) || !layout_arg(L, e, &a[5], 5, &blay))
        return em_lang_lv_err();
    lv bi = em_lang_to_index(L, a[4], apos(e, 4), "the offset of b");
    if (bi.kind == V_ERR) return em_lang_lv_err();
    em_ir_val boff = em_lang_materialize(L, &bi);
    em_ir_val add = 0;
    if (!add_arg(L, e, a, 6, &add)) return em_lang_lv_err();
    em_ir_kernel *k = L->k;
    if (emulated(L)) {
        if (!emulate_mma_rs(L, e, &a[0], &a[1], aoff, t, &a[3], boff, blay, add))
            return em_lang_lv_err();
        return em_lang_lv_void();
    }
    em_ir_val d[2] = {descriptor(k, a[3].mem, boff, blay * 2), em_ir_cast(k, em_ty(EM_U32), add)};
    char name[96];
    snprintf(name, sizeof name, "cuda.wgmma.mma_rs:%u,%s,%d,%u,%u@%u", a[0].length * 2,
             em_scalar_name(t), blay != 0, (unsigned)a[1].mem, aoff, (unsigned)a[0].mem);
    em_ir_intrinsic_mem(k, name, (em_type){0, 0}, a[0].mem, d, 2);
    return em_lang_lv_void();
}

/* The fences' arguments: local arrays of 32-bit elements whose registers the fence pins
 * ("cuda.wgmma.pin@MEM": their writes stay before it). */
static bool pin_args(lower *L, const ast_expr *e, lv *a)
{
    for (uint32_t i = 0; i < e->nargs; i++) {
        em_scalar s = (em_scalar)a[i].ty.scalar;
        if (a[i].kind != V_MEM || a[i].space != EM_MEM_LOCAL || a[i].ty.lanes != 1 ||
            (s != EM_U32 && s != EM_I32 && s != EM_F32)) {
            em_lang_lerr(L, apos(e, i), NULL,
                         "a wgmma fence pins local arrays of u32, i32 or f32 (MMA operands)");
            return false;
        }
    }
    if (emulated(L)) return true;
    for (uint32_t i = 0; i < e->nargs; i++) {
        char name[48];
        snprintf(name, sizeof name, "cuda.wgmma.pin@%u", (unsigned)a[i].mem);
        em_ir_intrinsic_mem(L->k, name, (em_type){0, 0}, a[i].mem, NULL, 0);
    }
    return true;
}

bool em_lang_hopper_target(lower *L, const ast_expr *e, const char *builtin, const char *feature,
                           const char *needs)
{
    const em_caps *caps = L->b->caps;
    if (emulated(L) || em_lang_wgmma_native(caps)) return true;
    bool cuda = !strcmp(caps->target, "cuda");
    char hint[96];
    snprintf(hint, sizeof hint, "guard it with 'comptime if (has(%s))' and give the kernel another path",
             feature);
    em_lang_lerr(L, e->op_pos, hint,
                 "'%s' needs %s (CUDA on compute capability 9.0: arch sm_90a); %s%s%s has none",
                 builtin, needs, cuda ? "this CUDA device (" : "the ",
                 cuda ? (caps->arch[0] ? caps->arch : "architecture unknown") : caps->target,
                 cuda ? ")" : " target");
    return false;
}

lv em_lang_lower_wgmma(lower *L, const ast_expr *e, const lang_builtin *b, lv *a)
{
    if (!em_lang_hopper_target(L, e, b->name, "wgmma", "warpgroup MMAs")) return em_lang_lv_err();
    em_ir_kernel *k = L->k;
    switch (b->imm) {
    case WGMMA_MMA:
        return mma(L, e, a);
    case WGMMA_MMA_RS:
        return mma_rs(L, e, a);
    case WGMMA_WAIT: {
        int64_t n = 0;
        if (!acc_arg(L, e, &a[0], 0, "wgmma_wait") ||
            !em_lang_comptime_int(L, &a[1], apos(e, 1), "the number of pending groups", &n))
            return em_lang_lv_err();
        if (n < 0 || n > 7)
            return em_lang_lerr(L, apos(e, 1), NULL,
                                "wgmma_wait takes 0 to 7 pending groups, got %lld", (long long)n);
        if (!emulated(L)) {
            char name[64];
            snprintf(name, sizeof name, "cuda.wgmma.wait:%d@%u", (int)n, (unsigned)a[0].mem);
            em_ir_intrinsic_mem(k, name, (em_type){0, 0}, a[0].mem, NULL, 0);
        }
        return em_lang_lv_void();
    }
    default:
        if ((b->imm == WGMMA_FENCE || b->imm == WGMMA_FENCE_REGS) && !pin_args(L, e, a))
            return em_lang_lv_err();
        if (!emulated(L))
            em_ir_intrinsic(k,
                            b->imm == WGMMA_FENCE        ? "cuda.wgmma.fence"
                            : b->imm == WGMMA_FENCE_REGS ? "cuda.wgmma.fence_regs"
                                                         : "cuda.wgmma.commit",
                            (em_type){0, 0}, NULL, 0);
        return em_lang_lv_void();
    }
}
