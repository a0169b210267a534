/* lower_mbarrier.c — the Hopper pipeline builtins (docs/kernel-language.md "Memory barriers and
 * register reallocation"): shared-memory barriers with phases (PTX mbarrier) between a producer
 * and consumers in one cube, and setmaxnreg:
 *
 *   mbarrier_init(bar, i, count)        bar[i] expects `count` arrivals per phase (one unit)
 *   mbarrier_arrive(bar, i)             one arrival (release)
 *   mbarrier_arrive_tx(bar, i, bytes)   one arrival that also expects `bytes` of transactions
 *   copy_async_arrive(bar, i)           one arrival once this unit's copy_async copies are done
 *                                       (cp.async.mbarrier.arrive.noinc: counted in `count`)
 *   mbarrier_wait(bar, i, parity)       waits until the phase of that parity completed (acquire)
 *   mbarrier_try_wait(bar, i, parity)   true when it has (waits a bounded time first)
 *   mbarrier_arrive_cluster(bar, i, c)  one arrival (a CTA-scope release) on bar[i] of cube c
 *                                       of the cluster (its rank: cluster_dim; the same
 *                                       shared-memory offset in that cube)
 *   setmaxnreg_inc(n)  setmaxnreg_dec(n)  the warpgroup's registers per unit become n (comptime)
 *   shared_load_u32(a, i)               the 4 bytes of shared array a from element i as a u32
 *                                       (one 4-byte load for two 2-byte elements: i even); CUDA
 *                                       only, with no emulation: guard it with has(mbarrier)
 *
 * bar is a shared array of u64, i its index. On CUDA for sm_90a they become intrinsics that
 * codegen/cuda_mbarrier.c writes as PTX ("cuda.mbar.OP@MEM", the index and operands as
 * arguments; "cuda.setmaxnreg:inc,N"). On the C target (and without a target) a cube's units run
 * one after another between cube barriers and copy_async copies at once, so no unit could ever
 * wait for another: there every one of them does nothing and mbarrier_try_wait is true. A kernel
 * is then correct on both when its producer and consumers take their turns in one loop that all
 * units run, with a sync_cube() per turn under `comptime if (has(c))` (src/kernels/
 * matmul_wgmma_ws.ek). OpenCL and Vulkan have no such barriers: has(mbarrier) is false there and
 * the builtins are rejected. */
#include <stdio.h>
#include <string.h>

#include "kernel/lang/lower.h"

bool em_lang_mbarrier_native(const em_caps *caps)
{
    /* try_wait.parity and setmaxnreg: sm_90a, the architecture the CUDA driver publishes for
     * compute capability 9.0 (as for warpgroup MMAs) */
    return em_lang_wgmma_native(caps);
}

static bool emulated(const lower *L)
{
    return !L->b->caps || !strcmp(L->b->caps->target, "c");
}

static lpos apos(const ast_expr *e, unsigned i)
{
    return e->args[i]->pos;
}

/* Argument 0 must be a shared array of u64: the barriers. */
static bool barrier_arg(lower *L, const ast_expr *e, const lv *x, const char *fn)
{
    if (x->kind != V_MEM || x->space != EM_MEM_SHARED || x->ty.scalar != EM_U64 ||
        x->ty.lanes != 1) {
        em_lang_lerr(L, apos(e, 0), "declare them as 'shared u64 bar[N];'",
                     "'%s' needs a shared array of u64 as its barriers", fn);
        return false;
    }
    return true;
}

/* Argument i as a u32 value (an index, a count, a parity, bytes). */
static bool u32_arg(lower *L, const ast_expr *e, lv *a, unsigned i, const char *what,
                    em_ir_val *out)
{
    lv x = em_lang_to_index(L, a[i], apos(e, i), what);
    if (x.kind == V_ERR) return false;
    *out = em_lang_materialize(L, &x);
    return true;
}

static lv setmaxnreg(lower *L, const ast_expr *e, const lang_builtin *b, lv *a)
{
    int64_t n = 0;
    if (!em_lang_comptime_int(L, &a[0], apos(e, 0), "the registers per unit", &n))
        return em_lang_lv_err();
    if (n < 24 || n > 256 || n % 8)
        return em_lang_lerr(L, apos(e, 0), "a multiple of 8 from 24 to 256",
                            "'%s' of %lld registers per unit", b->name, (long long)n);
    if (!emulated(L)) {
        char name[48];
        snprintf(name, sizeof name, "cuda.setmaxnreg:%s,%lld",
                 b->imm == MBAR_SETMAXNREG_INC ? "inc" : "dec", (long long)n);
        em_ir_intrinsic(L->k, name, (em_type){0, 0}, NULL, 0);
    }
    return em_lang_lv_void();
}

static const char *const op_names[] = {
    [MBAR_INIT] = "init",           [MBAR_ARRIVE] = "arrive",
    [MBAR_ARRIVE_TX] = "arrive_tx", [MBAR_COPY_ARRIVE] = "copy_arrive",
    [MBAR_WAIT] = "wait",           [MBAR_TRY_WAIT] = "try_wait",
    [MBAR_ARRIVE_CLUSTER] = "arrive_cluster",
};

/* shared_load_u32(a, i): "cuda.mbar.lds32@MEM" (i). */
static lv load_u32(lower *L, const ast_expr *e, const lang_builtin *b, lv *a)
{
    if (emulated(L))
        return em_lang_lerr(
            L, e->op_pos,
            "guard it with 'comptime if (has(mbarrier))' and give the kernel another path",
            "'%s' has no emulation on the %s target", b->name,
            L->b->caps ? L->b->caps->target : "portable");
    const lv *x = &a[0];
    size_t es = x->kind == V_MEM ? em_scalar_size(x->ty.scalar) : 0;
    if (x->kind != V_MEM || x->space != EM_MEM_SHARED || x->ty.lanes != 1 || (es != 2 && es != 4))
        return em_lang_lerr(L, apos(e, 0), NULL,
                            "'%s' reads a shared array of 2- or 4-byte scalars", b->name);
    em_ir_val idx;
    if (!u32_arg(L, e, a, 1, "the element's index", &idx)) return em_lang_lv_err();
    char name[48];
    snprintf(name, sizeof name, "cuda.mbar.lds32@%u", (unsigned)x->mem);
    em_ir_val r = em_ir_intrinsic_mem(L->k, name, em_ty(EM_U32), x->mem, &idx, 1);
    return em_lang_lv_rt(em_ty(EM_U32), r);
}

lv em_lang_lower_mbarrier(lower *L, const ast_expr *e, const lang_builtin *b, lv *a)
{
    if (!em_lang_hopper_target(L, e, b->name, "mbarrier", "shared-memory barriers with phases"))
        return em_lang_lv_err();
    if (b->imm == MBAR_LOAD_U32) return load_u32(L, e, b, a);
    if (b->imm == MBAR_SETMAXNREG_INC || b->imm == MBAR_SETMAXNREG_DEC)
        return setmaxnreg(L, e, b, a);
    if (!barrier_arg(L, e, &a[0], b->name)) return em_lang_lv_err();
    em_ir_val args[2] = {0, 0};
    unsigned nargs = 1;
    if (!u32_arg(L, e, a, 1, "the barrier's index", &args[0])) return em_lang_lv_err();
    if (b->max_args > 2) {
        static const char *const what[] = {[MBAR_INIT] = "the arrival count",
                                           [MBAR_ARRIVE_TX] = "the transaction bytes",
                                           [MBAR_WAIT] = "the phase parity",
                                           [MBAR_TRY_WAIT] = "the phase parity",
                                           [MBAR_ARRIVE_CLUSTER] = "the cube's rank"};
        if (!u32_arg(L, e, a, 2, what[b->imm], &args[1])) return em_lang_lv_err();
        nargs = 2;
    }
    bool result = b->imm == MBAR_TRY_WAIT;
    if (emulated(L)) return result ? em_lang_lv_const_bool(true) : em_lang_lv_void();
    char name[48];
    snprintf(name, sizeof name, "cuda.mbar.%s@%u", op_names[b->imm], (unsigned)a[0].mem);
    em_ir_val r = em_ir_intrinsic_mem(L->k, name, result ? em_ty(EM_BOOL) : (em_type){0, 0},
                                      a[0].mem, args, nargs);
    return result ? em_lang_lv_rt(em_ty(EM_BOOL), r) : em_lang_lv_void();
}
