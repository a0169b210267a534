/* builtins.c — the table of the kernel language's builtin functions (math, bit counts, memory
 * metadata, synchronization, plane ops, atomics, cooperative matrices, print, capability and type
 * queries, warpgroup MMAs, prefetch and dependency_wait): their names, arities and the IR op each lowers to; and the generic
 * bounds. resolve.c checks calls against this table; lower_call.c (and lower_wgmma.c) lower them. */
#include <string.h>

#include "kernel/lang/internal.h"

#define M1(n, op)                                                                                  \
    {                                                                                              \
        n, BI_MATH1, 1, 1, op, 0                                                                   \
    }

const lang_builtin em_lang_builtins_table[] = {
    M1("exp", EM_OP_EXP),
    M1("exp2", EM_OP_EXP2),
    M1("log", EM_OP_LOG),
    M1("log2", EM_OP_LOG2),
    M1("sqrt", EM_OP_SQRT),
    M1("rsqrt", EM_OP_RSQRT),
    M1("erf", EM_OP_ERF),
    M1("tanh", EM_OP_TANH),
    M1("sin", EM_OP_SIN),
    M1("cos", EM_OP_COS),
    M1("floor", EM_OP_FLOOR),
    M1("ceil", EM_OP_CEIL),
    M1("round", EM_OP_ROUND),
    {"abs", BI_ABS, 1, 1, EM_OP_ABS, 0},
    {"isnan", BI_FLOATPRED, 1, 1, EM_OP_ISNAN, 0},
    {"isinf", BI_FLOATPRED, 1, 1, EM_OP_ISINF, 0},
    {"popcount", BI_BITCOUNT, 1, 1, EM_OP_POPCOUNT, 0},
    {"clz", BI_BITCOUNT, 1, 1, EM_OP_CLZ, 0},
    {"ctz", BI_BITCOUNT, 1, 1, EM_OP_CTZ, 0},
    {"min", BI_MINMAX, 2, 2, EM_OP_MIN, 0},
    {"max", BI_MINMAX, 2, 2, EM_OP_MAX, 0},
    {"pow", BI_POW, 2, 2, EM_OP_POW, 0},
    {"clamp", BI_CLAMP, 3, 3, EM_OP_CLAMP, 0},
    {"fma", BI_FMA, 3, 3, EM_OP_FMA, 0},
    {"select", BI_SELECT, 3, 3, EM_OP_SELECT, 0},
    {"len", BI_LEN, 1, 1, EM_OP_LEN, 0},
    {"shape", BI_SHAPE, 2, 2, EM_OP_SHAPE, 0},
    {"stride", BI_SHAPE, 2, 2, EM_OP_STRIDE, 0},
    {"rank", BI_RANK, 1, 1, 0, 0},
    {"lanes", BI_LANES, 1, 1, 0, 0},
    {"sync_cube", BI_SYNC, 0, 0, EM_OP_SYNC_CUBE, 0},
    {"sync_plane", BI_SYNC, 0, 0, EM_OP_SYNC_PLANE, 0},
    {"fence_cube", BI_SYNC, 0, 0, EM_OP_FENCE, 0},
    {"fence_device", BI_SYNC, 0, 0, EM_OP_FENCE, 1},
    {"plane_sum", BI_PLANE1, 1, 1, EM_OP_PLANE_SUM, 0},
    {"plane_prod", BI_PLANE1, 1, 1, EM_OP_PLANE_PROD, 0},
    {"plane_min", BI_PLANE1, 1, 1, EM_OP_PLANE_MIN, 0},
    {"plane_max", BI_PLANE1, 1, 1, EM_OP_PLANE_MAX, 0},
    {"plane_inclusive_sum", BI_PLANE1, 1, 1, EM_OP_PLANE_INCLUSIVE_SUM, 0},
    {"plane_exclusive_sum", BI_PLANE1, 1, 1, EM_OP_PLANE_EXCLUSIVE_SUM, 0},
    {"plane_all", BI_PLANE_BOOL, 1, 1, EM_OP_PLANE_ALL, 0},
    {"plane_any", BI_PLANE_BOOL, 1, 1, EM_OP_PLANE_ANY, 0},
    {"plane_ballot", BI_PLANE_BOOL, 1, 1, EM_OP_PLANE_BALLOT, 0},
    {"plane_broadcast", BI_PLANE2, 2, 2, EM_OP_PLANE_BROADCAST, 0},
    {"plane_shuffle", BI_PLANE2, 2, 2, EM_OP_PLANE_SHUFFLE, 0},
    {"plane_shuffle_xor", BI_PLANE2, 2, 2, EM_OP_PLANE_SHUFFLE_XOR, 0},
    {"plane_shuffle_up", BI_PLANE2, 2, 2, EM_OP_PLANE_SHUFFLE_UP, 0},
    {"plane_shuffle_down", BI_PLANE2, 2, 2, EM_OP_PLANE_SHUFFLE_DOWN, 0},
    {"atomic_add", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_ADD, 0},
    {"atomic_sub", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_SUB, 0},
    {"atomic_min", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_MIN, 0},
    {"atomic_max", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_MAX, 0},
    {"atomic_and", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_AND, 0},
    {"atomic_or", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_OR, 0},
    {"atomic_xor", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_XOR, 0},
    {"atomic_exchange", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_XCHG, 0},
    {"atomic_compare_exchange", BI_ATOMIC, 4, 4, EM_OP_ATOMIC_CAS, 0},
    {"atomic_load", BI_ATOMIC, 2, 2, EM_OP_ATOMIC_LOAD, 0},
    {"atomic_store", BI_ATOMIC, 3, 3, EM_OP_ATOMIC_STORE, 0},
    {"mat_fill", BI_MAT_FILL, 2, 2, EM_OP_MAT_FILL, 0},
    {"mat_load", BI_MAT_LOAD, 4, 5, EM_OP_MAT_LOAD, 0},
    {"mat_mma", BI_MAT_MMA, 4, 4, EM_OP_MAT_MMA, 0},
    {"mat_store", BI_MAT_STORE, 4, 5, EM_OP_MAT_STORE, 0},
    {"copy_async", BI_COPY_ASYNC, 5, 6, EM_OP_COPY_ASYNC, 0},
    {"copy_async_commit", BI_COPY_SYNC, 0, 0, EM_OP_COPY_COMMIT, 0},
    {"copy_async_wait", BI_COPY_SYNC, 1, 1, EM_OP_COPY_WAIT, 0},
    {"wgmma_fence", BI_WGMMA, 0, 3, 0, WGMMA_FENCE},
    {"wgmma_fence_regs", BI_WGMMA, 0, 3, 0, WGMMA_FENCE_REGS},
    {"wgmma_commit", BI_WGMMA, 0, 0, 0, WGMMA_COMMIT},
    {"wgmma_wait", BI_WGMMA, 2, 2, 0, WGMMA_WAIT},
    {"wgmma_mma", BI_WGMMA, 7, 8, 0, WGMMA_MMA},
    {"wgmma_mma_rs", BI_WGMMA, 6, 7, 0, WGMMA_MMA_RS},
    {"mbarrier_init", BI_MBARRIER, 3, 3, 0, MBAR_INIT},
    {"mbarrier_arrive", BI_MBARRIER, 2, 2, 0, MBAR_ARRIVE},
    {"mbarrier_arrive_tx", BI_MBARRIER, 3, 3, 0, MBAR_ARRIVE_TX},
    {"copy_async_arrive", BI_MBARRIER, 2, 2, 0, MBAR_COPY_ARRIVE},
    {"mbarrier_wait", BI_MBARRIER, 3, 3, 0, MBAR_WAIT},
    {"mbarrier_try_wait", BI_MBARRIER, 3, 3, 0, MBAR_TRY_WAIT},
    {"mbarrier_arrive_cluster", BI_MBARRIER, 3, 3, 0, MBAR_ARRIVE_CLUSTER},
    {"setmaxnreg_inc", BI_MBARRIER, 1, 1, 0, MBAR_SETMAXNREG_INC},
    {"setmaxnreg_dec", BI_MBARRIER, 1, 1, 0, MBAR_SETMAXNREG_DEC},
    {"shared_load_u32", BI_MBARRIER, 2, 2, 0, MBAR_LOAD_U32},
    {"prefetch", BI_PREFETCH, 2, 2, 0, 0},
    {"dependency_wait", BI_DEPWAIT, 0, 0, 0, 0},
    {"tma_load", BI_TMA, 10, 10, 0, TMA_LOAD},
    {"tma_load_multicast", BI_TMA, 11, 11, 0, TMA_LOAD_MULTICAST},
    {"tma_acquire", BI_TMA, 2, 2, 0, TMA_ACQUIRE},
    {"fence_proxy_async", BI_TMA, 0, 0, 0, TMA_FENCE_ASYNC},
    {"tma_reduce_add", BI_TMA, 5, 5, 0, TMA_REDUCE_ADD},
    {"tma_commit", BI_TMA, 0, 0, 0, TMA_COMMIT},
    {"tma_wait_read", BI_TMA, 1, 1, 0, TMA_WAIT_READ},
    {"print", BI_PRINT, 1, 5, EM_OP_PRINT, 0},
    {"has", BI_HAS, 1, 1, 0, 0},
    {"sizeof", BI_SIZEOF, 1, 1, 0, 0},
    {"is_float", BI_TYPEPRED, 1, 1, 0, 0},
    {"is_int", BI_TYPEPRED, 1, 1, 0, 1},
    {"is_signed", BI_TYPEPRED, 1, 1, 0, 2},
};

const size_t em_lang_builtins_count = EM_ARRAY_LEN(em_lang_builtins_table);

int em_lang_builtin_find(const char *name)
{
    for (size_t i = 0; name && i < em_lang_builtins_count; i++)
        if (!strcmp(em_lang_builtins_table[i].name, name)) return (int)i;
    return -1;
}

/* Targets first (has(cuda) is true when compiling for that code generator), then features read
 * from the target's em_caps. */
const char *const em_lang_capabilities[] = {
    "c",         "cuda",   "opencl",           "glsl",  "wgsl",  "msl",      "hip",
    "plane_ops", "matrix", "float_atomic_add", "print", "wgmma", "mbarrier", "tma", NULL,
};

static const char *const bound_names[] = {"any", "num", "float", "int", "sint", "uint"};

const char *em_lang_bound_name(gen_bound b)
{
    return (unsigned)b < EM_ARRAY_LEN(bound_names) ? bound_names[b] : "?";
}

bool em_lang_bound_allows(gen_bound b, em_scalar s)
{
    if ((unsigned)s >= EM_SCALAR_COUNT) return false;
    switch (b) {
    case BOUND_ANY:
        return true;
    case BOUND_NUM:
        return s != EM_BOOL;
    case BOUND_FLOAT:
        return em_scalar_is_float(s);
    case BOUND_INT:
        return em_scalar_is_int(s);
    case BOUND_SINT:
        return em_scalar_is_int(s) && em_scalar_is_signed(s);
    case BOUND_UINT:
        return em_scalar_is_int(s) && !em_scalar_is_signed(s);
    }
    return false;
}

em_scalar em_lang_bound_default(gen_bound b)
{
    switch (b) {
    case BOUND_INT:
    case BOUND_SINT:
        return EM_I32;
    case BOUND_UINT:
        return EM_U32;
    default:
        return EM_F32;
    }
}
